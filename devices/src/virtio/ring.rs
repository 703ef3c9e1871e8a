//! Ring-level helpers over `virtio_queue::Queue` that add what virtio-queue leaves out:
//! a typed error for the avail-index jump, and `VRING_AVAIL_F_NO_INTERRUPT` without EVENT_IDX.

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// An error that leaves the ring unusable: the device must stop and ask for a reset.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The driver published more entries than the ring holds.
    #[error("avail index jumped by more than the queue size")]
    AvailIndexJump,
    /// The driver put a head index ≥ queue size in the avail ring (it cannot be returned).
    #[error("descriptor head index {0} is out of range")]
    HeadOutOfRange(u16),
    /// Any other virtio-queue failure (queue not ready, ring outside memory, ...).
    #[error("virtio queue access failed")]
    Queue(#[source] virtio_queue::Error),
    /// Reading or writing a ring field in guest memory failed.
    #[error("guest memory access to the ring failed")]
    Memory(#[source] GuestMemoryError),
}

impl From<virtio_queue::Error> for RingError {
    fn from(e: virtio_queue::Error) -> Self {
        match e {
            virtio_queue::Error::InvalidAvailRingIndex => RingError::AvailIndexJump,
            e => RingError::Queue(e),
        }
    }
}

/// A descriptor chain borrowed from guest memory.
pub type Chain<'m> = DescriptorChain<&'m GuestMemoryMmap>;

/// Pops the next available chain, or `None` when the driver has published no more.
///
/// An avail index more than `queue.size()` ahead of the device's position is an error
/// ([`RingError::AvailIndexJump`]) rather than the silent "nothing available" of
/// `Queue::pop_descriptor_chain`.
pub fn pop_chain<'m>(
    queue: &mut Queue,
    mem: &'m GuestMemoryMmap,
) -> Result<Option<Chain<'m>>, RingError> {
    Ok(queue.iter(mem)?.next())
}

/// Puts `n` popped-but-unused chains back (they must be the last `n` popped).
pub fn unpop_chains(queue: &mut Queue, n: u16) {
    queue.set_next_avail(queue.next_avail().wrapping_sub(n));
}

/// Returns chain `head` to the driver with `len` bytes written.
pub fn add_used(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    head: u16,
    len: u32,
) -> Result<(), RingError> {
    if head >= queue.size() {
        return Err(RingError::HeadOutOfRange(head));
    }
    queue.add_used(mem, head, len).map_err(RingError::from)
}

/// Whether to interrupt the driver after adding used entries, and if not, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterruptDecision {
    /// Interrupt the driver.
    Raise,
    /// EVENT_IDX: `used_event` says the driver does not want one yet.
    SuppressedByEventIdx,
    /// No EVENT_IDX: the driver set `VRING_AVAIL_F_NO_INTERRUPT`.
    SuppressedByFlag,
}

/// Decides whether the used entries added since the last call warrant an interrupt.
///
/// With EVENT_IDX this is the spec's `vring_need_event(used_event, new, old)` (virtio-queue's
/// `needs_notification`, which is wrap-around safe). Without it, virtio-queue always says yes;
/// here the driver's `VRING_AVAIL_F_NO_INTERRUPT` flag is honoured.
pub fn interrupt_decision(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
) -> Result<InterruptDecision, RingError> {
    if queue.event_idx_enabled() {
        return Ok(if queue.needs_notification(mem)? {
            InterruptDecision::Raise
        } else {
            InterruptDecision::SuppressedByEventIdx
        });
    }
    // The used index store must be visible before we read the driver's flags (the driver
    // writes flags, then reads the used index): a store→load barrier.
    fence(Ordering::SeqCst);
    let flags: u16 = mem
        .load(GuestAddress(queue.avail_ring()), Ordering::Acquire)
        .map(u16::from_le)
        .map_err(RingError::Memory)?;
    Ok(if flags & VRING_AVAIL_F_NO_INTERRUPT as u16 != 0 {
        InterruptDecision::SuppressedByFlag
    } else {
        InterruptDecision::Raise
    })
}

/// The spec's `vring_need_event`: should the device notify, given the other side's event index
/// and that the index moved from `old` to `new`? Wrap-around safe. (Reference for tests; the
/// datapath goes through virtio-queue, which implements the same arithmetic.)
pub fn vring_need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}
