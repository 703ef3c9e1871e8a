//! The device side of a split virtqueue, over host pointers resolved once per activation.
//!
//! `virtio_queue::Queue` stays the model of a queue's configuration (the transport programs
//! it, validates it and hands a copy to the worker). At activation the worker turns it into a
//! [`Virtqueue`]: the descriptor table, avail ring and used ring are each checked to lie inside
//! one guest memory region, properly aligned, and the used ring (the only part the device
//! writes) to overlap neither the avail ring nor the descriptor table; then their host
//! addresses are kept for the whole run. Every ring access afterwards is one load or store,
//! instead of a region lookup and a slice iterator per field as in vm-memory's `Bytes`.
//!
//! What this adds to virtio-queue, and why it is here:
//! - **Bounded work** (`WalkBudget`): every loop over guest-controlled indices is bounded, per
//!   chain ([`MAX_CHAIN_DESCRIPTORS`]) and per call, by descriptors *visited* (empty ones
//!   included), not by frames delivered. A ring of chains made of thousands of empty
//!   descriptors or huge indirect tables costs a bounded amount per call.
//! - **Batched used-ring publication**: used elements are written as chains complete, the used
//!   index is stored once per burst (`RingOps::publish_used`) and the interrupt decision is
//!   taken once over everything published since the previous decision
//!   (`RingOps::interrupt_decision`), as Linux's vhost does (`signalled_used`).
//! - **Chain errors that say why**: virtio-queue's descriptor iterator ends early on every kind
//!   of malformed chain; `RingOps::walk_chain` reports each.
//!
//! Soundness: the raw pointers stay valid because a [`Virtqueue`] owns a clone of the
//! `GuestMemoryMmap` they were resolved from (the clone shares the mappings, which are unmapped
//! only when the last clone goes), and the pointers are private to this module. Guest memory is
//! shared with the running guest, so every access is volatile or atomic, and nothing read from
//! it is trusted without a check.

use std::num::Wrapping;
use std::ptr;
use std::sync::atomic::{fence, AtomicU16, Ordering};

use virtio_bindings::virtio_ring::{
    VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_USED_F_NO_NOTIFY,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestMemoryError, GuestMemoryMmap};

use super::chain::{ChainError, Direction};
use super::guest::{
    host_regions, read_unaligned_volatile, Buffer, ControlWalk, Directed, HostRegion,
};
pub use super::guest::{
    vring_need_event, InterruptDecision, CALL_DESCRIPTOR_BUDGET, MAX_CHAIN_DESCRIPTORS,
};
pub(crate) use super::guest::{GuestView, WalkBudget};
use super::packed::PackedRingError;
use crate::iovec::{prefetch, IovecList};

/// Size of one descriptor.
const DESC_SIZE: u64 = 16;

/// A raw split-ring descriptor, as the driver lays it out (little endian).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RawDesc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

impl RawDesc {
    /// Its buffer, in native byte order.
    #[inline(always)]
    fn buffer(&self) -> Buffer {
        Buffer {
            addr: u64::from_le(self.addr),
            len: u32::from_le(self.len),
            flags: u16::from_le(self.flags),
        }
    }
}

/// Which part of a ring was refused at activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingPart {
    /// The descriptor table.
    DescTable,
    /// The avail (driver) ring.
    AvailRing,
    /// The used (device) ring.
    UsedRing,
}

impl std::fmt::Display for RingPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingPart::DescTable => "descriptor table",
            RingPart::AvailRing => "avail ring",
            RingPart::UsedRing => "used ring",
        })
    }
}

/// The device side of one split virtqueue for one activation (see the module docs).
#[derive(Debug)]
pub struct Virtqueue {
    /// Keeps every pointer in `ring` valid.
    mem: GuestMemoryMmap,
    regions: Vec<HostRegion>,
    ring: RingState,
}

/// Ring pointers and positions. Private to this module: the pointers are only valid while the
/// owning [`Virtqueue`]'s memory lives, so the state never leaves it.
#[derive(Debug)]
struct RingState {
    size: u16,
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    event_idx: bool,
    next_avail: Wrapping<u16>,
    /// The avail index as last read (`next_avail..avail_shadow` are known to be published).
    avail_shadow: Wrapping<u16>,
    next_used: Wrapping<u16>,
    /// The used index last stored in the ring.
    published_used: Wrapping<u16>,
    /// The used index at the last interrupt decision (`old` of `vring_need_event`).
    signalled_used: Wrapping<u16>,
    /// What `used.flags` holds (without EVENT_IDX): notifications suppressed or not.
    no_notify: Option<bool>,
    /// A full fence ran after the last used-index store: the interrupt decision needs none.
    fenced: bool,
    /// `avail_event` was last set past the next entry (kick coalescing) and may lie ahead of
    /// what the driver has made available: the next disable takes it back.
    event_ahead: bool,
}

impl RingState {
    /// `avail.idx`, acquire.
    #[inline]
    fn load_avail_idx(&self) -> Wrapping<u16> {
        // SAFETY: `avail` points to a 2-aligned ring of 6 + 2·size bytes inside mapped guest
        // memory (checked in `Virtqueue::new`); offset 2 is the u16 `idx`. Guest memory is
        // plain shared memory, valid for atomic access.
        let idx = unsafe { AtomicU16::from_ptr(self.avail.add(2).cast()) };
        Wrapping(u16::from_le(idx.load(Ordering::Acquire)))
    }
}

// SAFETY: the raw pointers point into guest memory owned (through `mem`) by the value itself;
// nothing in it is tied to the thread that built it.
unsafe impl Send for Virtqueue {}

impl Virtqueue {
    /// Resolves `queue`'s rings in `mem`. Refuses a queue that is not ready, of a size that is
    /// not a power of two, with a ring outside one memory region or misaligned, or whose used
    /// ring overlaps its avail ring or descriptor table (the device would rewrite what it
    /// reads: nonsensical, and a way to make it spin).
    pub fn new(queue: &Queue, mem: &GuestMemoryMmap) -> Result<Virtqueue, RingError> {
        if !queue.ready() {
            return Err(RingError::Queue(virtio_queue::Error::QueueNotReady));
        }
        let size = queue.size();
        if size == 0 || !size.is_power_of_two() || size > 32768 {
            return Err(RingError::Queue(virtio_queue::Error::InvalidSize));
        }
        let n = u64::from(size);
        let parts = [
            (RingPart::DescTable, queue.desc_table(), DESC_SIZE * n, 16),
            (RingPart::AvailRing, queue.avail_ring(), 6 + 2 * n, 2),
            (RingPart::UsedRing, queue.used_ring(), 6 + 8 * n, 4),
        ];
        let regions = host_regions(mem).map_err(RingError::Memory)?;
        let view = GuestView::new(mem, &regions);
        let mut hosts = [ptr::null_mut(); 3];
        for (host, (part, addr, len, align)) in hosts.iter_mut().zip(parts) {
            if !addr.is_multiple_of(align) {
                return Err(RingError::Misaligned(part));
            }
            *host = view
                .host_range(addr, len)
                .ok_or(RingError::OutsideMemory(part))?;
        }
        let used = parts[2];
        for other in [parts[0], parts[1]] {
            if used.1 < other.1 + other.2 && other.1 < used.1 + used.2 {
                return Err(RingError::Overlap(other.0));
            }
        }
        let next_avail = Wrapping(queue.next_avail());
        let next_used = Wrapping(queue.next_used());
        Ok(Virtqueue {
            mem: mem.clone(),
            regions,
            ring: RingState {
                size,
                desc: hosts[0],
                avail: hosts[1],
                used: hosts[2],
                event_idx: queue.event_idx_enabled(),
                next_avail,
                avail_shadow: next_avail,
                next_used,
                published_used: next_used,
                signalled_used: next_used,
                no_notify: None,
                fenced: false,
                event_ahead: false,
            },
        })
    }

    /// Moves the ring to resume at `next_avail` and `next_used` (vhost-user's
    /// SET_VRING_BASE, a restored snapshot): the next avail entry the device pops and the next
    /// used entry it writes. Any pair of indexes is a state the driver could have made; a
    /// distance to `avail.idx` larger than the ring is caught by the pops, as always.
    pub fn set_position(&mut self, next_avail: u16, next_used: u16) {
        let (avail, used) = (Wrapping(next_avail), Wrapping(next_used));
        self.ring.next_avail = avail;
        self.ring.avail_shadow = avail;
        self.ring.next_used = used;
        self.ring.published_used = used;
        self.ring.signalled_used = used;
        self.ring.event_ahead = false;
    }

    /// Copies the ring positions back into `queue` (for callers that keep a `Queue`).
    pub fn sync_to(&self, queue: &mut Queue) {
        queue.set_next_avail(self.ring.next_avail.0);
        queue.set_next_used(self.ring.next_used.0);
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.ring.size
    }

    /// Whether EVENT_IDX was negotiated.
    pub fn event_idx(&self) -> bool {
        self.ring.event_idx
    }

    /// The next avail entry the device will pop.
    pub fn next_avail(&self) -> u16 {
        self.ring.next_avail.0
    }

    /// The next used entry the device will write.
    pub fn next_used(&self) -> u16 {
        self.ring.next_used.0
    }

    /// Whether the driver has published avail entries the device has not popped yet: one load
    /// of `avail.idx` and no state change (the busy-poll's probe).
    #[inline]
    pub fn avail_pending(&self) -> bool {
        self.ring.load_avail_idx() != self.ring.next_avail
    }

    /// Guest memory and ring, borrowed apart: iovecs into the former while the latter moves.
    pub(crate) fn split(&mut self) -> (GuestView<'_>, RingOps<'_>) {
        (
            GuestView::new(&self.mem, &self.regions),
            RingOps {
                ring: &mut self.ring,
            },
        )
    }
}

/// The ring half of a split [`Virtqueue`] borrow: pops, walks chains, adds used entries.
#[derive(Debug)]
pub(crate) struct RingOps<'m> {
    ring: &'m mut RingState,
}

impl RingOps<'_> {
    #[inline]
    fn mask(&self) -> u16 {
        self.ring.size - 1
    }

    /// `avail.idx`, acquire.
    #[inline]
    fn load_avail_idx(&self) -> Wrapping<u16> {
        self.ring.load_avail_idx()
    }

    /// Pops the next available head, or `None` when the driver has published no more.
    #[inline]
    pub(crate) fn pop_head(&mut self) -> Result<Option<u16>, RingError> {
        if self.ring.next_avail == self.ring.avail_shadow {
            let idx = self.load_avail_idx();
            if (idx - self.ring.next_avail).0 > self.ring.size {
                return Err(RingError::AvailIndexJump);
            }
            self.ring.avail_shadow = idx;
            if idx == self.ring.next_avail {
                return Ok(None);
            }
        }
        let slot = usize::from(self.ring.next_avail.0 & self.mask());
        // SAFETY: `slot < size`, so `4 + 2·slot` is inside the avail ring (see load_avail_idx);
        // 2-aligned. The entry was published before `idx`, which was loaded with acquire.
        let head = u16::from_le(unsafe {
            ptr::read_volatile(self.ring.avail.add(4 + 2 * slot).cast::<u16>())
        });
        self.ring.next_avail += 1;
        if head >= self.ring.size {
            return Err(RingError::HeadOutOfRange(head));
        }
        Ok(Some(head))
    }

    /// How many heads the driver has published and the device not popped yet (at most the
    /// ring size; a driver that claims more is caught by the next [`RingOps::pop_head`]).
    #[inline]
    pub(crate) fn published(&mut self) -> u16 {
        let idx = self.load_avail_idx();
        let n = (idx - self.ring.next_avail).0;
        if n <= self.ring.size {
            self.ring.avail_shadow = idx;
            n
        } else {
            0
        }
    }

    /// How many heads are known to be published and not popped yet, without reading the
    /// avail index (as of the last read).
    #[inline]
    pub(crate) fn known_pending(&self) -> u16 {
        (self.ring.avail_shadow - self.ring.next_avail).0
    }

    /// Warms the caches for the chains after the current one while the current frame is in
    /// the backend's system call: the next chain's buffer (its descriptor was warmed one frame
    /// ago) and the descriptors of the one after. A device on another core than the driver
    /// otherwise misses on each of these every frame. Reads only what the next pops read anyway,
    /// and only within the avail entries already known to be published.
    #[inline]
    pub(crate) fn prefetch_ahead(&self, guest: &GuestView<'_>) {
        let pending = (self.ring.avail_shadow - self.ring.next_avail).0;
        if pending == 0 {
            return;
        }
        let head = self.peek_head(0);
        if head < self.ring.size {
            let desc = self.read_desc(head);
            let len = u64::from(u32::from_le(desc.len)).min(128);
            if let Some(p) = guest.host_range(u64::from_le(desc.addr), len.max(1)) {
                prefetch(p);
                if len > 64 {
                    prefetch(p.wrapping_add(64));
                }
            }
        }
        if pending >= 2 {
            let head = self.peek_head(1);
            if head < self.ring.size {
                // SAFETY: `head < size`: inside the descriptor table (checked in `new`).
                prefetch(unsafe { self.ring.desc.add(usize::from(head) * 16) });
            }
        }
    }

    /// Prefetches the descriptors of the next `n` chains known to be published (a batch's
    /// worth, read from the avail entries the last index read covers): the walks that follow
    /// then find them arriving together, instead of each waiting in turn for the driver's core
    /// to hand its line over.
    #[inline]
    pub(crate) fn prefetch_descriptors(&self, n: u16) {
        let n = n.min((self.ring.avail_shadow - self.ring.next_avail).0);
        for ahead in 0..n {
            let head = self.peek_head(ahead);
            if head < self.ring.size {
                // SAFETY: `head < size`: inside the descriptor table (checked in `new`).
                prefetch(unsafe { self.ring.desc.add(usize::from(head) * 16) });
            }
        }
    }

    /// The head `ahead` entries after `next_avail` (which must be published).
    #[inline]
    fn peek_head(&self, ahead: u16) -> u16 {
        let slot = usize::from((self.ring.next_avail.0.wrapping_add(ahead)) & self.mask());
        // SAFETY: `slot < size`, so `4 + 2·slot` is inside the avail ring (checked in `new`).
        u16::from_le(unsafe { ptr::read_volatile(self.ring.avail.add(4 + 2 * slot).cast::<u16>()) })
    }

    /// Puts back the last `n` popped heads (they are popped again next time).
    #[inline]
    pub(crate) fn unpop(&mut self, n: u16) {
        self.ring.next_avail -= n;
    }

    /// Reads descriptor `index` of the queue's own table (`index < size`).
    #[inline]
    fn read_desc(&self, index: u16) -> RawDesc {
        debug_assert!(index < self.ring.size);
        // SAFETY: `index < size` (callers check), the table is 16-aligned and 16·size bytes
        // inside mapped guest memory (checked in `Virtqueue::new`).
        unsafe {
            ptr::read_volatile(
                self.ring
                    .desc
                    .add(usize::from(index) * 16)
                    .cast::<RawDesc>(),
            )
        }
    }

    /// Walks the chain at `head`, appending its buffers to `iovs` (those that follow each
    /// other in memory as one entry), and returns their total length. On error `iovs` is left
    /// as it was. Every descriptor visited is charged to `budget` (the walk itself is bounded
    /// by [`MAX_CHAIN_DESCRIPTORS`]).
    ///
    /// The direct descriptors (every chain's path) are walked in one short loop; a chain that
    /// ends in an indirect table continues out of line ([`walk_indirect`]).
    #[inline(always)]
    pub(crate) fn walk_chain<'g>(
        &self,
        guest: &GuestView<'g>,
        head: u16,
        direction: Direction,
        limit: u32,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        let rule = Directed::new(direction, limit);
        let start = iovs.len();
        let mut visited = 0u32;
        let mut total = 0u32;
        let mut index = head;
        let result = loop {
            let desc = self.read_desc(index);
            visited += 1;
            let buf = desc.buffer();
            if buf.flags & VRING_DESC_F_INDIRECT as u16 != 0 {
                break walk_indirect(guest, desc, rule, total, iovs, &mut visited);
            }
            match rule.push(guest, buf, total, iovs) {
                Ok(t) => total = t,
                Err(e) => break Err(e),
            }
            if buf.flags & VRING_DESC_F_NEXT as u16 == 0 {
                break Ok(total);
            }
            index = u16::from_le(desc.next);
            // A chain of `size` direct descriptors has revisited one: a loop.
            if index >= self.ring.size || visited >= u32::from(self.ring.size) {
                break Err(ChainError::Truncated);
            }
            if visited == MAX_CHAIN_DESCRIPTORS {
                break Err(ChainError::TooManyDescriptors);
            }
        };
        budget.charge(visited);
        match result {
            // Buffers that follow each other in memory (a header in its own descriptor just
            // before the frame, say) become one entry: a frame in one segment is one `write`.
            Ok(_) if iovs.len() > start + 1 => iovs.merge_from(start + 1, start),
            Ok(_) => {}
            Err(_) => iovs.truncate(start),
        }
        result
    }

    /// Walks a control-style chain at `head`: device-readable buffers first (appended to
    /// `readable`), then device-writable ones (appended to `writable`); a readable buffer after
    /// a writable one is refused, as are loops, bad indirect tables, buffers outside guest
    /// memory and chains of more than [`MAX_CHAIN_DESCRIPTORS`] descriptors or `limit` bytes
    /// per part. Returns the (readable, writable) byte counts. Off the datapath (the control
    /// queue); on error both lists are left as they were. Every descriptor visited is charged
    /// to `budget`.
    pub(crate) fn walk_chain_split<'g>(
        &self,
        guest: &GuestView<'g>,
        head: u16,
        limit: u32,
        readable: &mut IovecList<'g>,
        writable: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<(u32, u32), ChainError> {
        let mut visited = 0u32;
        let mut walk = ControlWalk::new(guest, limit, readable, writable);
        let traversed = self.traverse(guest, head, &mut visited, &mut |desc: &RawDesc| {
            walk.push(desc.buffer())
        });
        budget.charge(visited.max(1));
        walk.finish(traversed)
    }

    /// Visits the descriptors of the chain at `head` (direct, then an indirect table if the
    /// chain ends in one) with the same limits as the datapath's walk, calling `visit` on each.
    /// Generic rather than `dyn`, so that the datapath's walk inlines its visitor.
    #[inline]
    fn traverse<F: FnMut(&RawDesc) -> Result<(), ChainError>>(
        &self,
        guest: &GuestView<'_>,
        head: u16,
        visited: &mut u32,
        visit: &mut F,
    ) -> Result<(), ChainError> {
        let mut index = head;
        let mut ttl = self.ring.size;
        loop {
            let desc = self.read_desc(index);
            *visited += 1;
            if *visited > MAX_CHAIN_DESCRIPTORS {
                return Err(ChainError::TooManyDescriptors);
            }
            let flags = u16::from_le(desc.flags);
            if flags & VRING_DESC_F_INDIRECT as u16 != 0 {
                return traverse_indirect(guest, desc, visited, visit);
            }
            visit(&desc)?;
            if flags & VRING_DESC_F_NEXT as u16 == 0 {
                return Ok(());
            }
            ttl -= 1;
            index = u16::from_le(desc.next);
            if ttl == 0 || index >= self.ring.size {
                return Err(ChainError::Truncated);
            }
        }
    }

    /// Writes used element (`head`, `len`) at the next used slot (not yet published).
    #[inline]
    pub(crate) fn add_used(&mut self, head: u16, len: u32) {
        let slot = usize::from(self.ring.next_used.0 & self.mask());
        // SAFETY: `slot < size`, so bytes 4 + 8·slot .. +8 are inside the used ring (6 + 8·size
        // bytes, 4-aligned, mapped; checked in `Virtqueue::new`).
        unsafe {
            let elem = self.ring.used.add(4 + 8 * slot).cast::<u32>();
            ptr::write_volatile(elem, u32::from(head).to_le());
            ptr::write_volatile(elem.add(1), len.to_le());
        }
        self.ring.next_used += 1;
    }

    /// Marks the chains `heads` (popped in this order, the first at the next used slot) used
    /// with one used element (VIRTIO_F_IN_ORDER, virtio 1.3 §2.7.9): the last head with `len`,
    /// written at the batch's first slot, where the driver reads next (as Linux's and DPDK's
    /// in-order drivers and vhost do); the used index moves past every buffer of the batch.
    #[inline]
    pub(crate) fn add_used_in_order(&mut self, heads: &[u16], len: u32) {
        let Some((&last, rest)) = heads.split_last() else {
            return;
        };
        self.add_used(last, len);
        // At most the chains popped and not used: fewer than the ring size.
        self.ring.next_used += rest.len() as u16;
    }

    /// Makes every used element written so far visible to the driver (one release store).
    #[inline]
    pub(crate) fn publish_used(&mut self) {
        if self.ring.published_used == self.ring.next_used {
            return;
        }
        // SAFETY: offset 2 of the used ring is its u16 `idx` (ring checked in `new`); guest
        // memory is valid for atomic access.
        let idx = unsafe { AtomicU16::from_ptr(self.ring.used.add(2).cast()) };
        idx.store(self.ring.next_used.0.to_le(), Ordering::Release);
        self.ring.published_used = self.ring.next_used;
        self.ring.fenced = false;
    }

    /// Decides whether the used entries published since the last decision warrant an
    /// interrupt (publish first). With EVENT_IDX this is the spec's `vring_need_event` over the
    /// whole range published since the last decision; without it, the driver's
    /// `VRING_AVAIL_F_NO_INTERRUPT` flag is honoured. `None` when nothing was published.
    pub(crate) fn interrupt_decision(&mut self) -> Option<InterruptDecision> {
        let new = self.ring.published_used;
        let old = std::mem::replace(&mut self.ring.signalled_used, new);
        if new == old {
            return None;
        }
        // The used index store must be visible before we read the driver's event index or flags
        // (the driver writes those, then reads the used index): a store→load barrier, unless
        // one already ran after that store (`enable_notification` after `publish_used`).
        if !std::mem::replace(&mut self.ring.fenced, false) {
            fence(Ordering::SeqCst);
        }
        if self.ring.event_idx {
            let offset = 4 + 2 * usize::from(self.ring.size);
            // SAFETY: `used_event` is the u16 after the avail ring's `size` entries, inside the
            // 6 + 2·size bytes checked in `new`; 2-aligned.
            let event = unsafe { AtomicU16::from_ptr(self.ring.avail.add(offset).cast()) };
            let event = u16::from_le(event.load(Ordering::Relaxed));
            return Some(if vring_need_event(event, new.0, old.0) {
                InterruptDecision::Raise
            } else {
                InterruptDecision::SuppressedByEventIdx
            });
        }
        // SAFETY: offset 0 of the avail ring is its u16 `flags` (ring checked in `new`).
        let flags = unsafe { AtomicU16::from_ptr(self.ring.avail.cast()) };
        let flags = u16::from_le(flags.load(Ordering::Relaxed));
        Some(if flags & VRING_AVAIL_F_NO_INTERRUPT as u16 != 0 {
            InterruptDecision::SuppressedByFlag
        } else {
            InterruptDecision::Raise
        })
    }

    /// Asks the driver not to notify. With EVENT_IDX notifications stop by themselves once the
    /// driver passed `avail_event`, so this is a no-op, unless the last enable set the event
    /// ahead (kick coalescing): the driver would then still kick when it reaches it, waking a
    /// device that is already awake (a guest exit for nothing). The event is moved behind the
    /// next entry instead, where no publish can cross it until the next enable moves it on.
    #[inline]
    pub(crate) fn disable_notification(&mut self) {
        if self.ring.event_idx {
            if self.ring.event_ahead {
                self.store_avail_event(self.ring.next_avail - Wrapping(1));
                self.ring.event_ahead = false;
            }
        } else if self.ring.no_notify != Some(true) {
            self.store_used_flags(VRING_USED_F_NO_NOTIFY as u16);
            self.ring.no_notify = Some(true);
        }
    }

    /// Stores `avail_event` (relaxed: the fence of the next enable or the driver's own
    /// ordering covers it; a stale read by the driver costs at most one kick).
    fn store_avail_event(&mut self, event: Wrapping<u16>) {
        let offset = 4 + 8 * usize::from(self.ring.size);
        // SAFETY: `avail_event` is the u16 after the used ring's `size` elements, inside the
        // 6 + 8·size bytes checked in `new`; 2-aligned (the ring is 4-aligned). Guest memory
        // is plain shared memory, valid for atomic access.
        let slot = unsafe { AtomicU16::from_ptr(self.ring.used.add(offset).cast()) };
        slot.store(event.0.to_le(), Ordering::Relaxed);
    }

    /// Asks the driver to notify for new entries, then re-checks the avail index (the standard
    /// race). Returns true if entries arrived meanwhile: keep processing.
    ///
    /// With EVENT_IDX, `ahead` entries (at most the queue size less one) may be made available
    /// before the driver notifies: `avail_event` is set that far past the next entry, and the
    /// device must look at the ring by itself for fewer (kick coalescing). Without EVENT_IDX
    /// the driver's flag cannot say it: `ahead` is ignored.
    pub(crate) fn enable_notification(&mut self, ahead: u16) -> bool {
        if self.ring.event_idx {
            let ahead = ahead.min(self.ring.size - 1);
            self.store_avail_event(self.ring.next_avail + Wrapping(ahead));
            self.ring.event_ahead = ahead > 0;
        } else if self.ring.no_notify != Some(false) {
            self.store_used_flags(0);
            self.ring.no_notify = Some(false);
        }
        // The enable must be visible before we re-read the driver's index (store→load); the
        // same fence orders a used-index store made before it.
        fence(Ordering::SeqCst);
        self.ring.fenced = true;
        let idx = self.load_avail_idx();
        self.ring.avail_shadow = if (idx - self.ring.next_avail).0 > self.ring.size {
            // Reported by the next pop.
            self.ring.next_avail
        } else {
            idx
        };
        idx != self.ring.next_avail
    }

    fn store_used_flags(&mut self, flags: u16) {
        // SAFETY: offset 0 of the used ring is its u16 `flags` (ring checked in `new`).
        let word = unsafe { AtomicU16::from_ptr(self.ring.used.cast()) };
        word.store(flags.to_le(), Ordering::Relaxed);
    }
}

/// The rest of [`RingOps::walk_chain`] for a chain that ends in the indirect table `table`:
/// its descriptors appended as the direct ones are, after `total` bytes; returns the new total.
// Out of line: keeps the direct-descriptor walk (every chain's path) short in the cache.
#[inline(never)]
fn walk_indirect<'g>(
    guest: &GuestView<'g>,
    table: RawDesc,
    rule: Directed,
    mut total: u32,
    iovs: &mut IovecList<'g>,
    visited: &mut u32,
) -> Result<u32, ChainError> {
    traverse_indirect(guest, table, visited, &mut |desc: &RawDesc| {
        total = rule.push(guest, desc.buffer(), total, iovs)?;
        Ok(())
    })?;
    Ok(total)
}

/// Visits the descriptors of an indirect table (the rest of a chain): at most `count` links,
/// no nested indirect table, every index inside the table.
// Out of line: keeps the direct-descriptor walk (every chain's path) short in the cache.
#[inline(never)]
fn traverse_indirect<F: FnMut(&RawDesc) -> Result<(), ChainError>>(
    guest: &GuestView<'_>,
    table: RawDesc,
    visited: &mut u32,
    visit: &mut F,
) -> Result<(), ChainError> {
    let table_len = u32::from_le(table.len);
    let count = table_len / DESC_SIZE as u32;
    if !table_len.is_multiple_of(DESC_SIZE as u32) || count == 0 || count > u32::from(u16::MAX) {
        return Err(ChainError::BadIndirectTable);
    }
    let base = guest
        .host_range(u64::from_le(table.addr), u64::from(table_len))
        .ok_or(ChainError::BadIndirectTable)?;
    let mut index: u32 = 0;
    let mut ttl = count;
    loop {
        // SAFETY: `index < count`, so the 16 bytes are inside the table, which lies inside one
        // mapped region (host_range above).
        let desc = unsafe { read_unaligned_volatile::<RawDesc>(base.add(index as usize * 16)) };
        *visited += 1;
        if *visited > MAX_CHAIN_DESCRIPTORS {
            return Err(ChainError::TooManyDescriptors);
        }
        let flags = u16::from_le(desc.flags);
        if flags & VRING_DESC_F_INDIRECT as u16 != 0 {
            return Err(ChainError::BadIndirectTable);
        }
        visit(&desc)?;
        if flags & VRING_DESC_F_NEXT as u16 == 0 {
            return Ok(());
        }
        ttl -= 1;
        index = u32::from(u16::from_le(desc.next));
        if ttl == 0 || index >= count {
            return Err(ChainError::Truncated);
        }
    }
}

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
    /// A resume position of the other ring kind (a split ring's indexes for a packed ring,
    /// or the reverse).
    #[error("the resume position is of the other ring kind")]
    PositionKind,
    /// A packed ring (VIRTIO_F_RING_PACKED) refused at activation or broken by the driver.
    #[error("packed ring: {0}")]
    Packed(#[from] PackedRingError),
}
