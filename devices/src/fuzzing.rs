//! Entry points for the fuzzers in `fuzz/` (not an API: hidden, and free to change).
//!
//! Chain walking and the iovec builder are crate-private; this exposes exactly one driver of
//! them, [`walk_avail`], which pops every published head of a queue and walks its chain as the
//! datapath does, reporting what each walk produced.

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

use crate::iovec::IovecList;
pub use crate::virtio::chain::{ChainError, Direction};
use crate::virtio::ring::RingError;
use crate::virtio::vring::{Virtqueue, WalkBudget};
pub use crate::virtio::vring::{CALL_DESCRIPTOR_BUDGET, MAX_CHAIN_DESCRIPTORS};

/// One walked chain.
#[derive(Debug)]
pub struct WalkedChain {
    /// The head popped.
    pub head: u16,
    /// What the walk returned (the chain's total length on success).
    pub result: Result<u32, ChainError>,
    /// The (host address, length) entries the walk appended to the shared list (none on error).
    pub iovecs: Vec<(usize, usize)>,
    /// Entries in the shared list before the walk and after it.
    pub list_len: (usize, usize),
    /// Descriptors charged to the call's budget by this walk.
    pub charged: u32,
}

/// What [`walk_avail`] did.
#[derive(Debug)]
pub struct WalkReport {
    /// Every chain walked, in pop order.
    pub chains: Vec<WalkedChain>,
    /// The ring error that ended the pops, if any.
    pub ring_error: Option<RingError>,
    /// Total bytes the shared list covered at the end.
    pub list_bytes: usize,
    /// Sum of the entries' lengths at the end (must equal `list_bytes`).
    pub list_sum: usize,
}

/// Pops up to `max_chains` heads of `queue` (over `mem`) and walks each chain in `direction`
/// with `limit`, appending every chain to one shared list (as rx's pool does), until the
/// driver has published no more, a ring error, or the per-call budget is spent. The queue's
/// positions are not written back.
pub fn walk_avail(
    queue: &Queue,
    mem: &GuestMemoryMmap,
    direction: Direction,
    limit: u32,
    max_chains: usize,
) -> Result<WalkReport, RingError> {
    let mut vq = Virtqueue::new(queue, mem)?;
    let (guest, mut ring) = vq.split();
    let mut list = IovecList::new();
    let mut budget = WalkBudget::per_call();
    let mut chains = Vec::new();
    let mut ring_error = None;
    while chains.len() < max_chains && !budget.exhausted() {
        let head = match ring.pop_head() {
            Ok(Some(head)) => head,
            Ok(None) => break,
            Err(e) => {
                ring_error = Some(e);
                break;
            }
        };
        let before = list.len();
        let left = budget.remaining();
        let result = ring.walk_chain(&guest, head, direction, limit, &mut list, &mut budget);
        let after = list.len();
        let iovecs = list
            .range(before, after)
            .as_raw()
            .iter()
            .map(|iov| (iov.iov_base as usize, iov.iov_len))
            .collect();
        chains.push(WalkedChain {
            head,
            result,
            iovecs,
            list_len: (before, after),
            charged: left - budget.remaining(),
        });
    }
    let list_sum = list
        .as_iovecs()
        .as_raw()
        .iter()
        .map(|iov| iov.iov_len)
        .sum();
    Ok(WalkReport {
        chains,
        ring_error,
        list_bytes: list.total_bytes(),
        list_sum,
    })
}
