//! [`Vring`]: one queue's ring, whichever virtqueue layout the device and driver negotiated.
//!
//! The send, receive and control queues hold a `Vring`, never a layout directly. It is an enum
//! over the layouts, not a trait object: every operation is a `match` on the variant that calls
//! the layout's own (inlined) method, so the datapath makes no indirect calls and a queue on
//! the split layout runs the split ring's code as it is.

use alloc::vec::Vec;

use crate::features::{F_IN_ORDER, F_RING_PACKED, RING_F_EVENT_IDX};
use crate::hal::{DmaRegion, Hal, PhysAddr};
use crate::ring::packed::{PackedLayout, PackedRing, PackedUsedError};
use crate::ring::{Buffer, Kick, RingFull, RingLayout, SplitRing, Used, UsedError};

/// How the rings of a device are laid out and driven, from the negotiated features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingMode {
    /// VIRTIO_RING_F_EVENT_IDX.
    pub(crate) event_idx: bool,
    /// VIRTIO_F_RING_PACKED: packed rings instead of split ones.
    pub(crate) packed: bool,
    /// VIRTIO_F_IN_ORDER.
    pub(crate) in_order: bool,
}

impl RingMode {
    /// The mode the negotiated `features` select.
    pub(crate) fn of(features: u64) -> RingMode {
        RingMode {
            event_idx: features & RING_F_EVENT_IDX != 0,
            packed: features & F_RING_PACKED != 0,
            in_order: features & F_IN_ORDER != 0,
        }
    }

    /// Bytes of ring memory a queue of `size` entries needs.
    pub(crate) const fn bytes(self, size: u16) -> usize {
        if self.packed {
            PackedLayout::new(size).bytes
        } else {
            RingLayout::new(size).bytes
        }
    }
}

/// The driver side of one virtqueue whose chains carry a `Tok` each.
pub(crate) enum Vring<Tok> {
    /// The split layout (virtio 1.2 §2.7).
    Split(SplitRing<Tok>),
    /// The packed layout (virtio 1.2 §2.8).
    Packed(PackedRing<Tok>),
}

/// Runs `$body` with `$ring` bound to the layout's ring.
macro_rules! on_ring {
    ($self:expr, $ring:ident => $body:expr) => {
        match $self {
            Vring::Split($ring) => $body,
            Vring::Packed($ring) => $body,
        }
    };
}

impl<Tok: Copy> Vring<Tok> {
    /// A ring for queue `index` of `size` entries in `region` (zeroed, at least
    /// `mode.bytes(size)` long).
    pub(crate) fn new(mode: RingMode, index: u16, size: u16, region: DmaRegion) -> Self {
        let RingMode {
            event_idx,
            packed,
            in_order,
        } = mode;
        if packed {
            Vring::Packed(PackedRing::new(index, size, region, event_idx, in_order))
        } else {
            Vring::Split(SplitRing::with_order(
                index, size, region, event_idx, in_order,
            ))
        }
    }

    /// The queue's index.
    #[inline]
    pub(crate) fn index(&self) -> u16 {
        on_ring!(self, r => r.index())
    }

    /// The queue's size.
    #[inline]
    pub(crate) fn size(&self) -> u16 {
        on_ring!(self, r => r.size())
    }

    /// Device addresses of the three ring parts, in the order the transport programs them
    /// (descriptor area, driver area, device area).
    pub(crate) fn addresses(&self) -> (PhysAddr, PhysAddr, PhysAddr) {
        on_ring!(self, r => r.addresses())
    }

    /// Free descriptors.
    #[inline]
    pub(crate) fn free_descriptors(&self) -> usize {
        on_ring!(self, r => r.free_descriptors())
    }

    /// True once the device broke the ring.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
        on_ring!(self, r => r.is_broken())
    }

    /// Writes a chain of `bufs` (not empty), unpublished.
    #[inline]
    pub(crate) fn add(&mut self, bufs: &[Buffer], token: Tok) -> Result<(), RingFull> {
        on_ring!(self, r => r.add(bufs, token))
    }

    /// Makes the chains added since the last publish visible to the device. False if there
    /// were none.
    #[inline]
    pub(crate) fn publish(&mut self) -> bool {
        on_ring!(self, r => r.publish())
    }

    /// Whether the device must be notified of what was published since the last decision.
    #[inline]
    pub(crate) fn kick_decision(&mut self) -> Kick {
        on_ring!(self, r => r.kick_decision())
    }

    /// True if the device returned chains not yet popped.
    #[inline]
    pub(crate) fn has_used(&mut self) -> bool {
        on_ring!(self, r => r.has_used())
    }

    /// Chains the device returned and the driver has not popped.
    #[inline]
    pub(crate) fn used_pending(&mut self) -> u16 {
        on_ring!(self, r => r.used_pending())
    }

    /// Pops the next used chain (`Ok(None)`: none, and interrupts re-armed if enabled).
    #[inline]
    pub(crate) fn pop_used(&mut self) -> Result<Option<Used<Tok>>, UsedError> {
        match self {
            Vring::Split(r) => r.pop_used(),
            Vring::Packed(r) => r.pop_used().map_err(UsedError::from),
        }
    }

    /// Asks for interrupts; true if used chains are already pending.
    #[inline]
    pub(crate) fn enable_interrupts(&mut self) -> bool {
        on_ring!(self, r => r.enable_interrupts())
    }

    /// Asks for no interrupts (best effort).
    #[inline]
    pub(crate) fn disable_interrupts(&mut self) {
        on_ring!(self, r => r.disable_interrupts())
    }

    /// After a per-queue reset: takes the tokens still in flight into `out` and starts over.
    pub(crate) fn reinit(&mut self, out: &mut Vec<Tok>) {
        on_ring!(self, r => r.reinit(out))
    }

    /// Frees the region.
    ///
    /// # Safety
    ///
    /// As [`SplitRing::dealloc`]: `hal` allocated the region, the device no longer accesses
    /// it, and the ring is not used afterwards.
    pub(crate) unsafe fn dealloc<H: Hal>(&self, hal: &H) {
        // SAFETY: forwarded from this function's contract.
        on_ring!(self, r => unsafe { r.dealloc(hal) })
    }
}

impl From<PackedUsedError> for UsedError {
    fn from(error: PackedUsedError) -> UsedError {
        match error {
            PackedUsedError::IdOutOfRange(id) => UsedError::IdOutOfRange(u32::from(id)),
            PackedUsedError::NotInFlight(id) => UsedError::NotInFlight(id),
            PackedUsedError::LenOutOfRange { id, len } => UsedError::LenOutOfRange { id, len },
        }
    }
}
