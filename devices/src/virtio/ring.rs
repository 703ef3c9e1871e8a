//! The ring layer as the datapath sees it: the public vocabulary (errors, the interrupt
//! decision), a queue's ring of either kind ([`AnyRing`]: split, [`super::vring`], or packed,
//! [`super::packed`], as the driver negotiated VIRTIO_F_RING_PACKED), and the one interface
//! the transmit, receive and control paths run on (`Ring`).
//!
//! The datapath picks the ring kind once per call (one `match` on [`AnyRing`]) and runs
//! functions generic over `Ring` below it: each kind gets its own monomorphized copy, with
//! no `dyn` and nothing added to the split ring's code. A chain is named by the ring's own
//! `Ring::Head` (a `u16` head index on the split ring, a `ChainHead` on the packed one).
//!
//! This module depends on both rings, never the other way round.

use std::fmt::Debug;

use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::chain::{ChainError, Direction};
use super::guest::{GuestView, WalkBudget};
use super::packed::{self, ChainHead, PackedLayout, PackedVirtqueue};
use super::vring::{self, Virtqueue};
use crate::iovec::IovecList;

pub use super::vring::{vring_need_event, InterruptDecision, RingError, RingPart};

/// Where a ring stands: the next avail entry the device pops and the next used entry it
/// writes. What a paused device reports for each queue, and what an activation may resume
/// from (vhost-user's GET_VRING_BASE and SET_VRING_BASE, a snapshot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingPosition {
    /// A split ring's free-running indexes.
    Split {
        /// The next avail ring entry (`last_avail_idx`).
        next_avail: u16,
        /// The used index the device writes next.
        next_used: u16,
    },
    /// A packed ring's positions, each with its wrap counter.
    Packed {
        /// Where the driver's next chain starts (driver's wrap counter).
        next_avail: packed::Position,
        /// Where the device's next used descriptor goes (device's wrap counter).
        next_used: packed::Position,
    },
}

impl RingPosition {
    /// A ring's first position: indexes 0 (split), offset 0 with wrap counters 1 (packed).
    pub fn start(packed: bool) -> RingPosition {
        if packed {
            let start = packed::Position {
                offset: 0,
                wrap: true,
            };
            RingPosition::Packed {
                next_avail: start,
                next_used: start,
            }
        } else {
            RingPosition::Split {
                next_avail: 0,
                next_used: 0,
            }
        }
    }
}

/// One queue's ring for one activation, of the kind the driver negotiated.
#[derive(Debug)]
pub enum AnyRing {
    /// A split ring (the default).
    Split(Virtqueue),
    /// A packed ring (VIRTIO_F_RING_PACKED).
    Packed(PackedVirtqueue),
}

impl From<Virtqueue> for AnyRing {
    fn from(vq: Virtqueue) -> AnyRing {
        AnyRing::Split(vq)
    }
}

impl From<PackedVirtqueue> for AnyRing {
    fn from(vq: PackedVirtqueue) -> AnyRing {
        AnyRing::Packed(vq)
    }
}

impl AnyRing {
    /// Resolves `queue`'s rings in `mem` for the negotiated features `acked`: a packed ring
    /// when VIRTIO_F_RING_PACKED is among them (its layout from the three programmed addresses,
    /// [`packed_layout`]; EVENT_IDX and IN_ORDER from `acked`), else a split ring (EVENT_IDX from
    /// `queue`). Each gets its kind's checks; a refused layout is a [`RingError`].
    pub fn new(queue: &Queue, mem: &GuestMemoryMmap, acked: u64) -> Result<AnyRing, RingError> {
        if acked & (1 << VIRTIO_F_RING_PACKED) == 0 {
            return Virtqueue::new(queue, mem).map(AnyRing::Split);
        }
        if !queue.ready() {
            return Err(RingError::Queue(virtio_queue::Error::QueueNotReady));
        }
        Ok(AnyRing::Packed(PackedVirtqueue::new(
            mem,
            &packed_layout(queue),
            acked,
        )?))
    }

    /// [`AnyRing::new`], resuming at `position` (of the ring's own kind) rather than at the
    /// queue's indexes or a packed ring's start.
    pub fn resume(
        queue: &Queue,
        mem: &GuestMemoryMmap,
        acked: u64,
        position: Option<RingPosition>,
    ) -> Result<AnyRing, RingError> {
        let mut ring = AnyRing::new(queue, mem, acked)?;
        if let Some(position) = position {
            ring.set_position(position)?;
        }
        Ok(ring)
    }

    /// Where the ring stands (see [`RingPosition`]).
    pub fn position(&self) -> RingPosition {
        match self {
            AnyRing::Split(vq) => RingPosition::Split {
                next_avail: vq.next_avail(),
                next_used: vq.next_used(),
            },
            AnyRing::Packed(vq) => RingPosition::Packed {
                next_avail: vq.next_avail(),
                next_used: vq.next_used(),
            },
        }
    }

    /// Moves the ring to `position`. A position of the other ring kind, or a packed one out of
    /// the ring, is refused.
    pub fn set_position(&mut self, position: RingPosition) -> Result<(), RingError> {
        match (self, position) {
            (
                AnyRing::Split(vq),
                RingPosition::Split {
                    next_avail,
                    next_used,
                },
            ) => {
                vq.set_position(next_avail, next_used);
                Ok(())
            }
            (
                AnyRing::Packed(vq),
                RingPosition::Packed {
                    next_avail,
                    next_used,
                },
            ) => Ok(vq.set_position(next_avail, next_used)?),
            _ => Err(RingError::PositionKind),
        }
    }

    /// Whether the driver has made buffers available that the device has not taken yet: one
    /// load, no state change (the busy-poll's probe).
    #[inline]
    pub fn avail_pending(&self) -> bool {
        match self {
            AnyRing::Split(vq) => vq.avail_pending(),
            AnyRing::Packed(vq) => vq.avail_pending(),
        }
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        match self {
            AnyRing::Split(vq) => vq.size(),
            AnyRing::Packed(vq) => vq.size(),
        }
    }

    /// Whether this is a packed ring.
    pub fn is_packed(&self) -> bool {
        matches!(self, AnyRing::Packed(_))
    }

    /// The split ring, if this is one.
    pub fn split_ring(&self) -> Option<&Virtqueue> {
        match self {
            AnyRing::Split(vq) => Some(vq),
            AnyRing::Packed(_) => None,
        }
    }

    /// The packed ring, if this is one.
    pub fn packed_ring(&self) -> Option<&PackedVirtqueue> {
        match self {
            AnyRing::Split(_) => None,
            AnyRing::Packed(vq) => Some(vq),
        }
    }

    /// [`Ring::interrupt_decision`] over this ring (off the datapath: the control queue).
    pub(crate) fn interrupt_decision(&mut self) -> Option<InterruptDecision> {
        match self {
            AnyRing::Split(vq) => vq.split().1.interrupt_decision(),
            AnyRing::Packed(vq) => vq.split().1.interrupt_decision(),
        }
    }
}

/// A packed queue's layout from the addresses the driver programmed in a queue's
/// configuration: the descriptor ring (QueueDesc), the driver event suppression area (the
/// "avail"/driver address, QueueDriver) and the device event suppression area (the
/// "used"/device address, QueueDevice).
pub fn packed_layout(queue: &Queue) -> PackedLayout {
    PackedLayout {
        size: queue.size(),
        desc: queue.desc_table(),
        driver_event: queue.avail_ring(),
        device_event: queue.used_ring(),
    }
}

/// What the datapath does with a ring, whatever its kind (see the module docs). Every method
/// is the ring's own of the same name; the split ring's are `#[inline]` wrappers, so a path
/// generic over this trait compiles to the same code as one written for the split ring.
pub(crate) trait Ring {
    /// What names a popped chain until it is used (or put back).
    type Head: Copy + Default + Debug;

    /// Pops the next available chain, or `None` when the driver has made no more available.
    fn pop_head(&mut self) -> Result<Option<Self::Head>, RingError>;

    /// Pops up to `heads.len()` chains of one direct descriptor each, in order, into the front
    /// of `heads`, and returns how many: it stops at the first chain that is anything else
    /// (or not available, or wrong), which [`Ring::pop_head`] then pops or reports. A walk of
    /// each visits exactly one descriptor. Where the ring cannot tell a chain's shape without
    /// walking it (the split ring), none: the caller pops with [`Ring::pop_head`].
    #[inline(always)]
    fn pop_lone(&mut self, heads: &mut [Self::Head]) -> usize {
        let _ = heads;
        0
    }

    /// Whether at least `n` more chains are (probably) available, reading the ring: exact on
    /// the split ring; on the packed ring, whether the descriptor `n − 1` slots ahead is
    /// available (a hint: chains may span several descriptors).
    fn pending_at_least(&mut self, n: usize) -> bool;

    /// As [`Ring::pending_at_least`], from what is already known where the ring can tell
    /// (the split ring's last index read); the packed ring reads one descriptor's flags.
    fn known_pending_at_least(&self, n: usize) -> bool;

    /// Walks `head`'s buffers into `iovs`, returns their total length (see the rings).
    fn walk_chain<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &Self::Head,
        direction: Direction,
        limit: u32,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError>;

    /// [`Ring::walk_chain`] for a head [`Ring::pop_lone`] returned (one direct descriptor).
    #[inline(always)]
    fn walk_lone<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &Self::Head,
        direction: Direction,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        self.walk_chain(guest, head, direction, u32::MAX, iovs, budget)
    }

    /// Walks a control-style chain (readable buffers, then writable ones).
    fn walk_chain_split<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &Self::Head,
        limit: u32,
        readable: &mut IovecList<'g>,
        writable: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<(u32, u32), ChainError>;

    /// Marks `head` used with `len` bytes written.
    fn add_used(&mut self, head: Self::Head, len: u32);

    /// Marks a batch of chains used in one entry (VIRTIO_F_IN_ORDER): the last one's id and
    /// `len`, the position moved past all of them.
    fn add_used_batch(&mut self, heads: &[Self::Head], len: u32);

    /// Closes a burst: makes the used entries written so far what the next interrupt decision
    /// covers, and hands them to the driver where the ring holds them back until then (the
    /// split ring's used index; a packed ring's used descriptors are visible once written).
    fn publish_used(&mut self);

    /// Whether what was published since the last decision warrants an interrupt.
    fn interrupt_decision(&mut self) -> Option<InterruptDecision>;

    /// Asks the driver not to notify.
    fn disable_notification(&mut self);

    /// Asks the driver to notify, then re-checks the race: true if buffers came meanwhile.
    #[inline(always)]
    fn enable_notification(&mut self) -> bool {
        self.enable_notification_ahead(0)
    }

    /// [`Ring::enable_notification`], the notification asked for only once `ahead` more
    /// buffers are available (EVENT_IDX; kick coalescing, see the rings).
    fn enable_notification_ahead(&mut self, ahead: u16) -> bool;

    /// Warms the caches for the next chain's buffer.
    fn prefetch_ahead(&self, guest: &GuestView<'_>);

    /// Prefetches the descriptors of the next `n` chains.
    fn prefetch_descriptors(&self, n: u16);

    /// Puts back the last `count` popped chains, the first of which is `first` (they are
    /// popped again next time).
    fn unpop(&mut self, first: &Self::Head, count: u16);
}

impl Ring for vring::RingOps<'_> {
    type Head = u16;

    #[inline(always)]
    fn pop_head(&mut self) -> Result<Option<u16>, RingError> {
        vring::RingOps::pop_head(self)
    }

    #[inline(always)]
    fn pending_at_least(&mut self, n: usize) -> bool {
        usize::from(self.published()) >= n
    }

    #[inline(always)]
    fn known_pending_at_least(&self, n: usize) -> bool {
        usize::from(self.known_pending()) >= n
    }

    #[inline(always)]
    fn walk_chain<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &u16,
        direction: Direction,
        limit: u32,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        vring::RingOps::walk_chain(self, guest, *head, direction, limit, iovs, budget)
    }

    #[inline(always)]
    fn walk_chain_split<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &u16,
        limit: u32,
        readable: &mut IovecList<'g>,
        writable: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<(u32, u32), ChainError> {
        vring::RingOps::walk_chain_split(self, guest, *head, limit, readable, writable, budget)
    }

    #[inline(always)]
    fn add_used(&mut self, head: u16, len: u32) {
        vring::RingOps::add_used(self, head, len);
    }

    #[inline(always)]
    fn add_used_batch(&mut self, heads: &[u16], len: u32) {
        vring::RingOps::add_used_in_order(self, heads, len);
    }

    #[inline(always)]
    fn publish_used(&mut self) {
        vring::RingOps::publish_used(self);
    }

    #[inline(always)]
    fn interrupt_decision(&mut self) -> Option<InterruptDecision> {
        vring::RingOps::interrupt_decision(self)
    }

    #[inline(always)]
    fn disable_notification(&mut self) {
        vring::RingOps::disable_notification(self);
    }

    #[inline(always)]
    fn enable_notification_ahead(&mut self, ahead: u16) -> bool {
        vring::RingOps::enable_notification(self, ahead)
    }

    #[inline(always)]
    fn prefetch_ahead(&self, guest: &GuestView<'_>) {
        vring::RingOps::prefetch_ahead(self, guest);
    }

    #[inline(always)]
    fn prefetch_descriptors(&self, n: u16) {
        vring::RingOps::prefetch_descriptors(self, n);
    }

    #[inline(always)]
    fn unpop(&mut self, _first: &u16, count: u16) {
        vring::RingOps::unpop(self, count);
    }
}

impl Ring for packed::RingOps<'_> {
    type Head = ChainHead;

    #[inline(always)]
    fn pop_head(&mut self) -> Result<Option<ChainHead>, RingError> {
        Ok(packed::RingOps::pop_head(self)?)
    }

    #[inline(always)]
    fn pop_lone(&mut self, heads: &mut [ChainHead]) -> usize {
        packed::RingOps::pop_lone(self, heads)
    }

    #[inline(always)]
    fn walk_lone<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &ChainHead,
        direction: Direction,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        packed::RingOps::walk_lone(self, guest, head, direction, iovs, budget)
    }

    #[inline(always)]
    fn pending_at_least(&mut self, n: usize) -> bool {
        packed::RingOps::pending_at_least(self, n)
    }

    #[inline(always)]
    fn known_pending_at_least(&self, n: usize) -> bool {
        packed::RingOps::pending_at_least(self, n)
    }

    #[inline(always)]
    fn walk_chain<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &ChainHead,
        direction: Direction,
        limit: u32,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        packed::RingOps::walk_chain(self, guest, head, direction, limit, iovs, budget)
    }

    #[inline(always)]
    fn walk_chain_split<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &ChainHead,
        limit: u32,
        readable: &mut IovecList<'g>,
        writable: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<(u32, u32), ChainError> {
        packed::RingOps::walk_chain_split(self, guest, head, limit, readable, writable, budget)
    }

    #[inline(always)]
    fn add_used(&mut self, head: ChainHead, len: u32) {
        packed::RingOps::add_used(self, head, len);
    }

    #[inline(always)]
    fn add_used_batch(&mut self, heads: &[ChainHead], len: u32) {
        packed::RingOps::add_used_batch(self, heads, len);
    }

    #[inline(always)]
    fn publish_used(&mut self) {
        packed::RingOps::publish_used(self);
    }

    #[inline(always)]
    fn interrupt_decision(&mut self) -> Option<InterruptDecision> {
        packed::RingOps::interrupt_decision(self)
    }

    #[inline(always)]
    fn disable_notification(&mut self) {
        packed::RingOps::disable_notification(self);
    }

    #[inline(always)]
    fn enable_notification_ahead(&mut self, ahead: u16) -> bool {
        packed::RingOps::enable_notification(self, ahead)
    }

    #[inline(always)]
    fn prefetch_ahead(&self, guest: &GuestView<'_>) {
        packed::RingOps::prefetch_ahead(self, guest);
    }

    #[inline(always)]
    fn prefetch_descriptors(&self, n: u16) {
        packed::RingOps::prefetch_descriptors(self, n);
    }

    #[inline(always)]
    fn unpop(&mut self, first: &ChainHead, _count: u16) {
        packed::RingOps::unpop(self, first);
    }
}

/// Most completions [`InOrder`] holds before it writes them.
const IN_ORDER_BATCH: usize = 32;

/// A ring whose completions are written in batches (VIRTIO_F_IN_ORDER, transmit only): the
/// chains marked used are held and written as one used entry carrying the last id when the
/// ring publishes (or when [`IN_ORDER_BATCH`] are held). Every length but the last is lost, so
/// it suits transmit (length 0) only. Everything else goes straight to the ring.
pub(crate) struct InOrder<'a, R: Ring> {
    ring: &'a mut R,
    heads: [R::Head; IN_ORDER_BATCH],
    held: usize,
    len: u32,
}

impl<'a, R: Ring> InOrder<'a, R> {
    /// Batches `ring`'s completions.
    pub(crate) fn new(ring: &'a mut R) -> Self {
        InOrder {
            ring,
            heads: [R::Head::default(); IN_ORDER_BATCH],
            held: 0,
            len: 0,
        }
    }

    /// Writes the held completions as one used entry.
    #[inline]
    fn write_held(&mut self) {
        if self.held > 0 {
            self.ring.add_used_batch(&self.heads[..self.held], self.len);
            self.held = 0;
        }
    }
}

impl<R: Ring> Ring for InOrder<'_, R> {
    type Head = R::Head;

    #[inline(always)]
    fn pop_head(&mut self) -> Result<Option<R::Head>, RingError> {
        self.ring.pop_head()
    }

    #[inline(always)]
    fn pop_lone(&mut self, heads: &mut [R::Head]) -> usize {
        self.ring.pop_lone(heads)
    }

    #[inline(always)]
    fn walk_lone<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &R::Head,
        direction: Direction,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        self.ring.walk_lone(guest, head, direction, iovs, budget)
    }

    #[inline]
    fn pending_at_least(&mut self, n: usize) -> bool {
        self.ring.pending_at_least(n)
    }

    #[inline(always)]
    fn known_pending_at_least(&self, n: usize) -> bool {
        self.ring.known_pending_at_least(n)
    }

    #[inline(always)]
    fn walk_chain<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &R::Head,
        direction: Direction,
        limit: u32,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        self.ring
            .walk_chain(guest, head, direction, limit, iovs, budget)
    }

    #[inline]
    fn walk_chain_split<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &R::Head,
        limit: u32,
        readable: &mut IovecList<'g>,
        writable: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<(u32, u32), ChainError> {
        self.ring
            .walk_chain_split(guest, head, limit, readable, writable, budget)
    }

    #[inline(always)]
    fn add_used(&mut self, head: R::Head, len: u32) {
        if self.held == IN_ORDER_BATCH {
            self.write_held();
        }
        self.heads[self.held] = head;
        self.held += 1;
        self.len = len;
    }

    #[inline]
    fn add_used_batch(&mut self, heads: &[R::Head], len: u32) {
        self.write_held();
        self.ring.add_used_batch(heads, len);
    }

    #[inline]
    fn publish_used(&mut self) {
        self.write_held();
        self.ring.publish_used();
    }

    #[inline]
    fn interrupt_decision(&mut self) -> Option<InterruptDecision> {
        self.ring.interrupt_decision()
    }

    #[inline]
    fn disable_notification(&mut self) {
        self.ring.disable_notification();
    }

    #[inline]
    fn enable_notification_ahead(&mut self, ahead: u16) -> bool {
        self.ring.enable_notification_ahead(ahead)
    }

    #[inline(always)]
    fn prefetch_ahead(&self, guest: &GuestView<'_>) {
        self.ring.prefetch_ahead(guest);
    }

    #[inline]
    fn prefetch_descriptors(&self, n: u16) {
        self.ring.prefetch_descriptors(n);
    }

    #[inline]
    fn unpop(&mut self, first: &R::Head, count: u16) {
        self.ring.unpop(first, count);
    }
}
