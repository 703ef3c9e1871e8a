//! Ring-level errors: what leaves a queue unusable, so that the device must stop and ask for a
//! reset. The ring itself is accessed through [`super::vring::Virtqueue`].

use vm_memory::GuestMemoryError;

pub use super::vring::{vring_need_event, InterruptDecision, RingPart};

/// An error that leaves the ring unusable: the device must stop and ask for a reset.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The driver published more entries than the ring holds.
    #[error("avail index jumped by more than the queue size")]
    AvailIndexJump,
    /// The driver put a head index ≥ queue size in the avail ring (it cannot be returned).
    #[error("descriptor head index {0} is out of range")]
    HeadOutOfRange(u16),
    /// A ring is not aligned as the spec requires (16 / 2 / 4 bytes).
    #[error("the {0} is misaligned")]
    Misaligned(RingPart),
    /// A ring does not lie inside one guest memory region.
    #[error("the {0} is outside guest memory")]
    OutsideMemory(RingPart),
    /// The used ring overlaps a ring the device reads: every used entry would rewrite the
    /// driver's side.
    #[error("the used ring overlaps the {0}")]
    Overlap(RingPart),
    /// Any other virtio-queue failure (queue not ready, bad size, ...).
    #[error("virtio queue access failed")]
    Queue(#[source] virtio_queue::Error),
    /// Resolving guest memory failed.
    #[error("guest memory access to the ring failed")]
    Memory(#[source] GuestMemoryError),
}
