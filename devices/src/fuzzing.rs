//! Entry points for the fuzzers in `fuzz/` (not an API: hidden, and free to change).
//!
//! Chain walking and the iovec builder are crate-private; this exposes exactly one driver of
//! them, [`walk_avail`], which pops every published head of a queue and walks its chain as the
//! datapath does, reporting what each walk produced; and one driver of the packed ring,
//! [`run_packed`], which runs a sequence of ring operations and reports each.

use std::collections::VecDeque;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

use crate::iovec::IovecList;
pub use crate::virtio::chain::{ChainError, Direction};
use crate::virtio::packed::{ChainHead, PackedVirtqueue, RingOps as PackedRing};
pub use crate::virtio::packed::{PackedLayout, PackedRingError, Position};
use crate::virtio::ring::RingError;
use crate::virtio::vring::{GuestView as PackedGuest, Virtqueue, WalkBudget};
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

/// One step of [`run_packed`].
#[derive(Clone, Copy, Debug)]
pub enum PackedOp {
    /// Pops a chain and walks it in one direction (device-writable when `writes`), up to
    /// `limit` bytes.
    Pop {
        /// Walk as receive (device-writable) rather than transmit.
        writes: bool,
        /// Byte limit of the walk.
        limit: u32,
    },
    /// Pops a chain and walks it control-style (readable, then writable).
    PopSplit,
    /// Pops a run of up to this many lone direct descriptors (the receive fill's pop) and walks
    /// each device-writable.
    PopLone(u8),
    /// Marks the oldest popped chain used with this length.
    Complete(u32),
    /// Marks up to this many of the oldest popped chains used as one batch, the last with the
    /// length.
    CompleteBatch(u8, u32),
    /// Puts the newest popped chain back.
    Unpop,
    /// Closes a burst of used descriptors.
    Publish,
    /// Takes the interrupt decision.
    Decide,
    /// Enables kicks (and re-checks the ring), asking for the next one this many descriptors
    /// past the next (kick coalescing).
    Enable(u16),
    /// Disables kicks.
    Disable,
    /// Hands control to the caller's driver (which may rewrite guest memory).
    Driver(u8),
}

/// A chain [`run_packed`] popped and walked.
#[derive(Debug)]
pub struct PackedChain {
    /// Buffer id, start and descriptors in the ring, as the pop returned them.
    pub id: u16,
    /// Where the chain starts.
    pub start: Position,
    /// Ring descriptors it occupies.
    pub descriptors: u16,
    /// The walk's result (for a control-style walk, the readable and writable byte counts
    /// added up).
    pub result: Result<u32, ChainError>,
    /// The (host address, length) entries the walk produced (none on error).
    pub iovecs: Vec<(usize, usize)>,
    /// Descriptors charged to the walk's budget.
    pub charged: u32,
}

/// What one [`PackedOp`] did, and the ring's positions after it.
#[derive(Debug)]
pub struct PackedStep {
    /// The operation.
    pub op: PackedOp,
    /// The chains a pop took, in order (one at most but for [`PackedOp::PopLone`]).
    pub popped: Vec<PackedChain>,
    /// Ring descriptors the operation marked used.
    pub completed: u32,
    /// Where the next available chain starts.
    pub next_avail: Position,
    /// Where the next used descriptor goes.
    pub next_used: Position,
    /// Ring descriptors popped and not used.
    pub in_flight: u32,
}

/// Runs `ops` on a packed queue laid out as `layout` in `mem`, with the negotiated
/// `features`, completing chains oldest first; stops at the first ring error, which it returns
/// with the steps made before it.
pub fn run_packed(
    mem: &GuestMemoryMmap,
    layout: &PackedLayout,
    features: u64,
    ops: &[PackedOp],
    mut driver: impl FnMut(u8),
) -> Result<(Vec<PackedStep>, Option<PackedRingError>), PackedRingError> {
    let mut vq = PackedVirtqueue::new(mem, layout, features)?;
    let mut popped: VecDeque<ChainHead> = VecDeque::new();
    let mut steps = Vec::new();
    for &op in ops {
        let (guest, mut ring) = vq.split();
        let mut chains = Vec::new();
        let mut completed = 0;
        match op {
            PackedOp::Pop { .. } | PackedOp::PopSplit => {
                let head = match ring.pop_head() {
                    Ok(Some(head)) => head,
                    Ok(None) => {
                        steps.push(step(&vq, op, chains, 0));
                        continue;
                    }
                    Err(e) => return Ok((steps, Some(e))),
                };
                chains.push(walk_packed(&guest, &ring, &head, op));
                popped.push_back(head);
            }
            PackedOp::PopLone(n) => {
                let mut heads = [ChainHead::default(); u8::MAX as usize];
                let n = ring.pop_lone(&mut heads[..usize::from(n)]);
                for head in &heads[..n] {
                    chains.push(walk_packed(&guest, &ring, head, op));
                    popped.push_back(*head);
                }
            }
            PackedOp::Complete(len) => {
                if let Some(head) = popped.pop_front() {
                    completed = u32::from(head.descriptors());
                    ring.add_used(head, len);
                }
            }
            PackedOp::CompleteBatch(n, len) => {
                let n = usize::from(n).min(popped.len());
                let batch: Vec<ChainHead> = popped.drain(..n).collect();
                completed = batch.iter().map(|h| u32::from(h.descriptors())).sum();
                ring.add_used_batch(&batch, len);
            }
            PackedOp::Unpop => {
                if let Some(head) = popped.pop_back() {
                    ring.unpop(&head);
                }
            }
            PackedOp::Publish => ring.publish_used(),
            PackedOp::Decide => {
                ring.interrupt_decision();
            }
            PackedOp::Enable(ahead) => {
                ring.enable_notification(ahead);
            }
            PackedOp::Disable => ring.disable_notification(),
            PackedOp::Driver(n) => driver(n),
        }
        steps.push(step(&vq, op, chains, completed));
    }
    Ok((steps, None))
}

/// Walks a popped chain as `op` says (one direction, or control-style).
fn walk_packed(
    guest: &PackedGuest<'_>,
    ring: &PackedRing<'_>,
    head: &ChainHead,
    op: PackedOp,
) -> PackedChain {
    let mut budget = WalkBudget::per_call();
    let left = budget.remaining();
    let mut list = IovecList::new();
    let mut second = IovecList::new();
    let result = match op {
        PackedOp::Pop { writes, limit } => {
            let direction = if writes {
                Direction::DeviceWrites
            } else {
                Direction::DeviceReads
            };
            ring.walk_chain(guest, head, direction, limit, &mut list, &mut budget)
        }
        PackedOp::PopLone(_) => {
            ring.walk_lone(guest, head, Direction::DeviceWrites, &mut list, &mut budget)
        }
        _ => ring
            .walk_chain_split(guest, head, u32::MAX, &mut list, &mut second, &mut budget)
            .map(|(r, w)| r.saturating_add(w)),
    };
    let iovecs = list
        .as_iovecs()
        .as_raw()
        .iter()
        .chain(second.as_iovecs().as_raw())
        .map(|iov| (iov.iov_base as usize, iov.iov_len))
        .collect();
    PackedChain {
        id: head.id(),
        start: head.start(),
        descriptors: head.descriptors(),
        result,
        iovecs,
        charged: left - budget.remaining(),
    }
}

fn step(
    vq: &PackedVirtqueue,
    op: PackedOp,
    popped: Vec<PackedChain>,
    completed: u32,
) -> PackedStep {
    PackedStep {
        op,
        popped,
        completed,
        next_avail: vq.next_avail(),
        next_used: vq.next_used(),
        in_flight: vq.in_flight(),
    }
}
