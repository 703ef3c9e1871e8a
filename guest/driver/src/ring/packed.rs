//! The driver side of one packed virtqueue (virtio 1.2 §2.8, VIRTIO_F_RING_PACKED), with the
//! operations and guarantees of the split ring's [`SplitRing`](crate::ring::SplitRing): the
//! same [`Buffer`]s, [`Kick`] decisions and [`Used`] chains, so the queues can be made generic
//! over the two layouts.
//!
//! Layout, in one zeroed DMA region: the descriptor ring (16-byte descriptors
//! `{le64 addr; le32 len; le16 id; le16 flags}` × size) at 0, the driver event suppression
//! structure (`{le16 off_wrap; le16 flags}`, written by the driver) right after it, the device
//! event suppression structure (same shape, written by the device) 4 bytes further. Any size
//! from 1 to 32768 works (not only powers of two).
//!
//! How a chain travels:
//! - [`PackedRing::add`] takes a buffer id from a free-id list, writes the chain into the ring
//!   positions after the last one it wrote (wrapping at the ring end and flipping the driver's
//!   wrap counter there), every descriptor but the first with its final flags, and keeps the
//!   first descriptor's flags back;
//! - [`PackedRing::publish`] writes the held-back first flags (`AVAIL` = the wrap counter at
//!   that position, `USED` = its inverse), after a release fence and the latest chain first, so
//!   the device sees a batch whole: until a chain's first flags change, the device does not
//!   look at it. As with the split ring, nothing the driver adds is visible before the publish;
//! - the device writes one used descriptor per chain (`AVAIL` = `USED` = its wrap counter) at
//!   the next used position, with the chain's buffer id, and skips the chain's other positions;
//!   [`PackedRing::pop_used`] finds it there, reads id and length after an acquire fence, and
//!   skips the same number of positions, which it remembers per id. With VIRTIO_F_IN_ORDER the
//!   device may write one used descriptor for a batch, with the id of its last chain; the ring
//!   then returns every chain added before that one, in order, the earlier ones with the full
//!   length of their device-writable buffers (the spec assumes them used completely).
//!
//! Notifications: the device's structure says whether it wants a kick (ENABLE, DISABLE, or
//! with EVENT_IDX DESC: when the descriptor at `off_wrap` is made available); the driver's says
//! whether it wants an interrupt (ENABLE, DISABLE, or DESC at the next used position it waits
//! for). Between making descriptors available and reading the device's structure, and between
//! writing its own structure and re-reading the ring, the driver puts a full fence (`SeqCst`):
//! each side stores then loads what the other stores (the `virtqueue_kick_prepare` /
//! `virtqueue_enable_cb` races of the split ring, unchanged).
//!
//! The driver never trusts device-writable memory for its bookkeeping: ids, chain lengths and
//! tokens live in private vectors. A used descriptor whose id is out of range or not in flight
//! leaves the driver unable to tell where the next one is, so it marks the ring broken
//! ([`PackedRing::is_broken`]) instead of guessing; a length beyond the chain's device-writable
//! buffers does the same.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::sync::atomic::{fence, AtomicU16, Ordering};

use crate::hal::{DmaRegion, Hal, PhysAddr};
use crate::ring::{vring_need_event, Access, Buffer, Kick, RingFull, Used};

const DESC_SIZE: usize = 16;
/// Descriptor flag: the chain continues in the next ring position.
pub(crate) const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: device-writable buffer; in a used descriptor: `len` is valid.
pub(crate) const DESC_F_WRITE: u16 = 2;
/// Descriptor flag: available when equal to the driver's wrap counter.
pub(crate) const DESC_F_AVAIL: u16 = 1 << 7;
/// Descriptor flag: used when equal to `DESC_F_AVAIL` and the device's wrap counter.
pub(crate) const DESC_F_USED: u16 = 1 << 15;
/// Event suppression flags: notify on every event.
pub(crate) const EVENT_FLAGS_ENABLE: u16 = 0;
/// Event suppression flags: no notifications.
pub(crate) const EVENT_FLAGS_DISABLE: u16 = 1;
/// Event suppression flags: notify when the descriptor at `off_wrap` is reached (EVENT_IDX).
pub(crate) const EVENT_FLAGS_DESC: u16 = 2;
/// The bit of `off_wrap` that holds the wrap counter (the offset is below it).
pub(crate) const EVENT_WRAP_BIT: u16 = 1 << 15;
/// The largest packed ring.
pub(crate) const MAX_SIZE: u16 = 1 << 15;

/// Byte offsets of the ring parts in the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackedLayout {
    /// The driver event suppression structure (4-aligned).
    pub(crate) driver: usize,
    /// The device event suppression structure (4-aligned).
    pub(crate) device: usize,
    pub(crate) bytes: usize,
}

impl PackedLayout {
    pub(crate) const fn new(size: u16) -> PackedLayout {
        let driver = DESC_SIZE * size as usize;
        PackedLayout {
            driver,
            device: driver + 4,
            bytes: driver + 8,
        }
    }
}

/// A used descriptor the driver could not accept. Each one marks the ring broken: the driver
/// cannot know where the device writes the next used descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PackedUsedError {
    /// A buffer id ≥ the queue size.
    IdOutOfRange(u16),
    /// A buffer id that is not a chain made available to the device and not yet returned.
    NotInFlight(u16),
    /// A written length beyond the chain's device-writable buffers.
    LenOutOfRange {
        /// The chain's buffer id.
        id: u16,
        /// The length the device reported.
        len: u32,
    },
}

/// A ring position and the wrap counter that goes with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pos {
    idx: u16,
    wrap: bool,
}

impl Pos {
    /// Both wrap counters start at 1.
    const START: Pos = Pos { idx: 0, wrap: true };

    /// `n` (≤ `size`) positions further, flipping the wrap counter at the ring end.
    fn advance(self, n: u16, size: u16) -> Pos {
        let idx = u32::from(self.idx) + u32::from(n);
        if idx >= u32::from(size) {
            // n ≤ size and idx < size before: the result is below size again.
            Pos {
                idx: (idx - u32::from(size)) as u16,
                wrap: !self.wrap,
            }
        } else {
            Pos {
                idx: idx as u16,
                wrap: self.wrap,
            }
        }
    }

    /// The event suppression encoding: offset in bits 0..15, wrap counter in bit 15.
    fn off_wrap(self) -> u16 {
        self.idx | if self.wrap { EVENT_WRAP_BIT } else { 0 }
    }

    fn from_off_wrap(off_wrap: u16) -> Pos {
        Pos {
            idx: off_wrap & !EVENT_WRAP_BIT,
            wrap: off_wrap & EVENT_WRAP_BIT != 0,
        }
    }

    /// How many positions `to` lies ahead of `self`, if it does by less than a lap.
    fn distance_to(self, to: Pos, size: u16) -> Option<u16> {
        match (to.wrap == self.wrap, to.idx >= self.idx) {
            (true, true) => Some(to.idx - self.idx),
            // `to` is in the next lap, before where `self` is in this one.
            (false, false) if to.idx < size => Some(size - self.idx + to.idx),
            _ => None,
        }
    }

    /// The `AVAIL` / `USED` bits that make a descriptor at this position available.
    fn avail_flags(self) -> u16 {
        if self.wrap {
            DESC_F_AVAIL
        } else {
            DESC_F_USED
        }
    }
}

/// What the driver keeps per buffer id.
#[derive(Clone, Copy, Debug)]
struct IdState<Tok> {
    /// The chain's token while it is in flight (added and not returned).
    token: Option<Tok>,
    /// Whether the chain was published (the device may return it).
    published: bool,
    /// Ring positions the chain takes.
    descs: u16,
    /// Total length of its device-writable buffers.
    writable: u64,
}

impl<Tok> IdState<Tok> {
    const FREE: IdState<Tok> = IdState {
        token: None,
        published: false,
        descs: 0,
        writable: 0,
    };
}

/// A chain added and not yet published: where its first descriptor is and the flags that will
/// make it available.
#[derive(Clone, Copy, Debug)]
struct Unpublished {
    pos: u16,
    flags: u16,
    id: u16,
}

/// Whether, and when, interrupts for this queue are wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interrupts {
    /// For the next used descriptor.
    Enabled,
    /// EVENT_IDX: once about three quarters of what is in flight is used.
    Delayed,
    Disabled,
}

/// The driver side of a packed virtqueue whose chains carry a `Tok` each.
pub(crate) struct PackedRing<Tok> {
    index: u16,
    size: u16,
    layout: PackedLayout,
    region: DmaRegion,
    event_idx: bool,
    in_order: bool,
    /// Free buffer ids (a stack).
    free_ids: Vec<u16>,
    ids: Vec<IdState<Tok>>,
    /// Ring positions not taken by a chain in flight.
    free_descs: u16,
    /// Chains added since the last publish, in ring order.
    unpublished: Vec<Unpublished>,
    /// Positions the unpublished chains take.
    unpublished_descs: u16,
    /// With IN_ORDER: the ids in flight, in the order they were added.
    order: VecDeque<u16>,
    /// The next position to write (and the driver ring wrap counter).
    next_avail: Pos,
    /// The position after the last published descriptor.
    published: Pos,
    /// Positions published since the last kick decision.
    since_kick: u32,
    /// Where the next used descriptor is expected (and the used wrap counter).
    last_used: Pos,
    /// With IN_ORDER: the last id of the batch being returned, and its length.
    batch: Option<(u16, u32)>,
    interrupts: Interrupts,
    /// Last values written to the driver event suppression structure.
    event_off_wrap: u16,
    event_flags: u16,
    broken: bool,
}

impl<Tok: Copy> PackedRing<Tok> {
    /// A ring of `size` (1..=32768) descriptors in `region` (zeroed, at least
    /// `PackedLayout::new(size).bytes` long), for queue `index`. With `in_order` (VIRTIO_F_IN_ORDER
    /// negotiated) a used descriptor also returns every chain added before its own.
    pub(crate) fn new(
        index: u16,
        size: u16,
        region: DmaRegion,
        event_idx: bool,
        in_order: bool,
    ) -> Self {
        let layout = PackedLayout::new(size);
        debug_assert!(region.len() >= layout.bytes && (1..=MAX_SIZE).contains(&size));
        let n = usize::from(size);
        PackedRing {
            index,
            size,
            layout,
            region,
            event_idx,
            in_order,
            // Popped from the end: id 0 first.
            free_ids: (0..size).rev().collect(),
            ids: alloc::vec![IdState::FREE; n],
            free_descs: size,
            unpublished: Vec::with_capacity(n),
            unpublished_descs: 0,
            order: VecDeque::with_capacity(if in_order { n } else { 0 }),
            next_avail: Pos::START,
            published: Pos::START,
            since_kick: 0,
            last_used: Pos::START,
            batch: None,
            interrupts: Interrupts::Enabled,
            // The zeroed structure: ENABLE.
            event_off_wrap: 0,
            event_flags: EVENT_FLAGS_ENABLE,
            broken: false,
        }
    }

    pub(crate) fn index(&self) -> u16 {
        self.index
    }

    pub(crate) fn size(&self) -> u16 {
        self.size
    }

    /// Device addresses of (descriptor ring, driver area, device area).
    pub(crate) fn addresses(&self) -> (PhysAddr, PhysAddr, PhysAddr) {
        let base = self.region.paddr();
        (
            base,
            base + self.layout.driver as u64,
            base + self.layout.device as u64,
        )
    }

    /// Free descriptors (ring positions a new chain can take).
    pub(crate) fn free_descriptors(&self) -> usize {
        usize::from(self.free_descs)
    }

    /// True once the device returned a used descriptor the driver could not accept.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// A pointer into the ring region at `offset` (which must leave room for `len` bytes).
    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        match self.region.ptr_at(offset, len) {
            Some(p) => p,
            // Offsets come from `layout` and positions below `size`: always inside.
            None => unreachable!("ring offset {offset} outside its region"),
        }
    }

    /// The 16-bit ring field at `offset`, for atomic access.
    fn atomic16(&self, offset: usize) -> &AtomicU16 {
        debug_assert!(offset.is_multiple_of(2));
        let p = self.at(offset, 2).cast::<u16>();
        // SAFETY: `p` is inside the region (checked by `at`), 2-aligned (the region is page
        // aligned and every field offset is even), and valid while `self` owns the region. Flags
        // and event suppression fields are accessed only atomically by both sides.
        unsafe { AtomicU16::from_ptr(p) }
    }

    /// The descriptor flags at ring position `idx`.
    fn desc_flags(&self, idx: u16) -> &AtomicU16 {
        self.atomic16(DESC_SIZE * usize::from(idx) + 14)
    }

    fn driver_off_wrap(&self) -> &AtomicU16 {
        self.atomic16(self.layout.driver)
    }

    fn driver_flags(&self) -> &AtomicU16 {
        self.atomic16(self.layout.driver + 2)
    }

    fn device_off_wrap(&self) -> &AtomicU16 {
        self.atomic16(self.layout.device)
    }

    fn device_flags(&self) -> &AtomicU16 {
        self.atomic16(self.layout.device + 2)
    }

    /// Writes address, length and id of the descriptor at `idx` (not its flags).
    fn write_desc(&mut self, idx: u16, buf: &Buffer, id: u16) {
        let p = self.at(DESC_SIZE * usize::from(idx), DESC_SIZE);
        // SAFETY: `p` is a 16-aligned, 16-byte descriptor inside the region. Position `idx` is
        // free: the device returned the chain that took it last (or never had it), and its
        // flags do not make it available in the current lap, so the device does not read it.
        unsafe {
            p.cast::<u64>().write_volatile(buf.addr.to_le());
            p.add(8).cast::<u32>().write_volatile(buf.len.to_le());
            p.add(12).cast::<u16>().write_volatile(id.to_le());
        }
    }

    /// Writes the chain `bufs` into the ring, unpublished. `bufs` must not be empty.
    pub(crate) fn add(&mut self, bufs: &[Buffer], token: Tok) -> Result<(), RingFull> {
        let n = bufs.len();
        if n == 0 || n > usize::from(self.free_descs) {
            return Err(RingFull);
        }
        // At most one chain per free descriptor: an id is free whenever a descriptor is.
        let Some(id) = self.free_ids.pop() else {
            return Err(RingFull);
        };
        let head = self.next_avail;
        let mut pos = head;
        let mut head_flags = 0;
        let mut writable = 0u64;
        for (k, buf) in bufs.iter().enumerate() {
            let mut flags = pos.avail_flags();
            if buf.access == Access::DeviceWrites {
                flags |= DESC_F_WRITE;
                writable += u64::from(buf.len);
            }
            if k + 1 < n {
                flags |= DESC_F_NEXT;
            }
            // The id belongs in the last descriptor; every one carries it.
            self.write_desc(pos.idx, buf, id);
            if k == 0 {
                head_flags = flags;
            } else {
                // Not yet reachable: the device reads the chain only once the first
                // descriptor is available, after the release fence in `publish`.
                self.desc_flags(pos.idx)
                    .store(flags.to_le(), Ordering::Relaxed);
            }
            pos = pos.advance(1, self.size);
        }
        self.next_avail = pos;
        // n ≤ free_descs ≤ size ≤ 32768.
        let n = n as u16;
        self.free_descs -= n;
        self.ids[usize::from(id)] = IdState {
            token: Some(token),
            published: false,
            descs: n,
            writable,
        };
        self.unpublished.push(Unpublished {
            pos: head.idx,
            flags: head_flags,
            id,
        });
        self.unpublished_descs += n;
        if self.in_order {
            self.order.push_back(id);
        }
        Ok(())
    }

    /// Makes the chains added since the last publish available to the device. False if there
    /// were none.
    pub(crate) fn publish(&mut self) -> bool {
        if self.unpublished.is_empty() {
            return false;
        }
        // Every descriptor written by `add` before the first flags that expose it.
        fence(Ordering::Release);
        let unpublished = core::mem::take(&mut self.unpublished);
        // The latest chain first: the device, which polls the earliest, sees the batch whole.
        for chain in unpublished.iter().rev() {
            self.desc_flags(chain.pos)
                .store(chain.flags.to_le(), Ordering::Release);
            self.ids[usize::from(chain.id)].published = true;
        }
        self.unpublished = unpublished;
        self.unpublished.clear();
        self.since_kick = self
            .since_kick
            .saturating_add(u32::from(self.unpublished_descs));
        self.unpublished_descs = 0;
        self.published = self.next_avail;
        true
    }

    /// Whether the device must be notified of what was published since the last decision
    /// (Linux's `virtqueue_kick_prepare_packed`).
    pub(crate) fn kick_decision(&mut self) -> Kick {
        let added = self.since_kick;
        if added == 0 {
            return Kick::NothingNew;
        }
        self.since_kick = 0;
        // Store→load barrier: the first flags stored by `publish` must be visible before we read
        // the device's event structure. The device stores that structure, fences, then re-reads
        // the ring; without this fence both sides could read stale values and the device would
        // sleep on a ring with buffers in it.
        fence(Ordering::SeqCst);
        // The flags first: the device writes the offset before the flags that make it count,
        // so the offset read after them is at least as new.
        let flags = u16::from_le(self.device_flags().load(Ordering::Acquire)) & 3;
        let off_wrap = u16::from_le(self.device_off_wrap().load(Ordering::Acquire));
        match flags {
            EVENT_FLAGS_DISABLE => Kick::SuppressedByFlag,
            EVENT_FLAGS_DESC if self.event_idx => {
                // Published positions since the last decision: [old, new) in the ring, `new`
                // being the next position to publish. More than a lap passed every event.
                let Ok(added) = u16::try_from(added) else {
                    return Kick::Notify;
                };
                if added > self.size {
                    return Kick::Notify;
                }
                let new = self.published;
                let old = new.idx.wrapping_sub(added);
                let target = Pos::from_off_wrap(off_wrap);
                // An event in the previous lap lies `size` before its offset.
                let event = if target.wrap == new.wrap {
                    target.idx
                } else {
                    target.idx.wrapping_sub(self.size)
                };
                if vring_need_event(event, new.idx, old) {
                    Kick::Notify
                } else {
                    Kick::SuppressedByEventIdx
                }
            }
            // ENABLE, DESC without EVENT_IDX (not allowed) and the reserved value: notify.
            _ => Kick::Notify,
        }
    }

    /// The flags of the descriptor at `pos` if the device marked it used in `pos`'s lap.
    fn used_flags_at(&self, pos: Pos) -> Option<u16> {
        let flags = u16::from_le(self.desc_flags(pos.idx).load(Ordering::Acquire));
        let avail = flags & DESC_F_AVAIL != 0;
        let used = flags & DESC_F_USED != 0;
        (avail == used && used == pos.wrap).then_some(flags)
    }

    /// True if the device returned chains not yet popped.
    pub(crate) fn has_used(&mut self) -> bool {
        !self.broken && (self.batch.is_some() || self.used_flags_at(self.last_used).is_some())
    }

    /// Chains the device returned and the driver has not popped (0 on a broken ring). Walks the
    /// used descriptors; stops at one the driver would refuse (popping it breaks the ring).
    pub(crate) fn used_pending(&mut self) -> u16 {
        if self.broken {
            return 0;
        }
        let mut count = 0u16;
        let mut pos = self.last_used;
        // With IN_ORDER: how many of `order` are counted already.
        let mut ordered = 0usize;
        if let Some((last, _)) = self.batch {
            for &id in &self.order {
                count += 1;
                ordered += 1;
                pos = pos.advance(self.ids[usize::from(id)].descs, self.size);
                if id == last {
                    break;
                }
            }
        }
        // Every chain in flight at most once: bounded by the ring size.
        while count < self.size {
            if self.used_flags_at(pos).is_none() {
                break;
            }
            fence(Ordering::Acquire);
            let id = self.read_used(pos.idx).0;
            let Some(state) = self.ids.get(usize::from(id)) else {
                break;
            };
            if state.token.is_none() || !state.published {
                break;
            }
            if self.in_order {
                let Some(k) = self.order.iter().skip(ordered).position(|&o| o == id) else {
                    break;
                };
                for &o in self.order.iter().skip(ordered).take(k + 1) {
                    pos = pos.advance(self.ids[usize::from(o)].descs, self.size);
                }
                ordered += k + 1;
                count = count.saturating_add(k as u16 + 1);
            } else {
                pos = pos.advance(state.descs, self.size);
                count += 1;
            }
        }
        count
    }

    /// The id and length of the used descriptor at `idx`.
    fn read_used(&self, idx: u16) -> (u16, u32) {
        let p = self.at(DESC_SIZE * usize::from(idx), DESC_SIZE);
        // SAFETY: a 16-aligned descriptor inside the region whose flags the caller found used
        // (then fenced with Acquire): the device wrote id and length before those flags and does
        // not write this position again until the driver makes it available anew.
        unsafe {
            (
                u16::from_le(p.add(12).cast::<u16>().read_volatile()),
                u32::from_le(p.add(8).cast::<u32>().read_volatile()),
            )
        }
    }

    /// Pops the next used chain. `Ok(None)` when there is none; with interrupts enabled that
    /// also means the driver event structure asks for an interrupt at the next used descriptor.
    /// An error marks the ring broken (see [`PackedUsedError`]); it returns `Ok(None)` from then
    /// on, and the chains still in flight come back from [`Self::reinit`].
    pub(crate) fn pop_used(&mut self) -> Result<Option<Used<Tok>>, PackedUsedError> {
        if self.broken {
            return Ok(None);
        }
        if let Some((last, len)) = self.batch {
            return Ok(self.pop_in_order(last, len));
        }
        let flags = loop {
            if let Some(flags) = self.used_flags_at(self.last_used) {
                break flags;
            }
            if !self.rearm() {
                return Ok(None);
            }
        };
        // Id and length after the flags that say they are written.
        fence(Ordering::Acquire);
        let (id, len) = self.read_used(self.last_used.idx);
        // Without WRITE the length is reserved: nothing was written.
        let len = if flags & DESC_F_WRITE != 0 { len } else { 0 };
        if let Err(error) = self.check_used(id, len) {
            self.broken = true;
            return Err(error);
        }
        if self.in_order {
            self.batch = Some((id, len));
            return Ok(self.pop_in_order(id, len));
        }
        Ok(self.release(id).map(|token| Used { token, len }))
    }

    /// Whether a used descriptor's id and length are acceptable.
    fn check_used(&self, id: u16, len: u32) -> Result<(), PackedUsedError> {
        let Some(state) = self.ids.get(usize::from(id)) else {
            return Err(PackedUsedError::IdOutOfRange(id));
        };
        if state.token.is_none() || !state.published {
            return Err(PackedUsedError::NotInFlight(id));
        }
        if u64::from(len) > state.writable {
            return Err(PackedUsedError::LenOutOfRange { id, len });
        }
        Ok(())
    }

    /// With IN_ORDER, during the batch ending with chain `last` (returned with `len`): returns
    /// the earliest chain in flight.
    fn pop_in_order(&mut self, last: u16, len: u32) -> Option<Used<Tok>> {
        let Some(id) = self.order.pop_front() else {
            // `last` is in flight, so `order` holds it: not reached.
            self.broken = true;
            return None;
        };
        let len = if id == last {
            self.batch = None;
            len
        } else {
            // Skipped chains count as used completely.
            u32::try_from(self.ids[usize::from(id)].writable).unwrap_or(u32::MAX)
        };
        self.release(id).map(|token| Used { token, len })
    }

    /// Frees the chain `id` (in flight): its positions, its id; takes its token.
    fn release(&mut self, id: u16) -> Option<Tok> {
        let state = core::mem::replace(&mut self.ids[usize::from(id)], IdState::FREE);
        self.free_descs += state.descs;
        self.last_used = self.last_used.advance(state.descs, self.size);
        self.free_ids.push(id);
        state.token
    }

    /// Called when the ring looks empty: moves the event offset to where it must be now.
    /// Returns true if, after arming, a used descriptor turned out to be there.
    fn rearm(&mut self) -> bool {
        if !self.event_idx {
            return false;
        }
        match self.interrupts {
            Interrupts::Disabled => false,
            Interrupts::Delayed if self.delayed_event_ahead() => false,
            Interrupts::Enabled | Interrupts::Delayed => {
                self.interrupts = Interrupts::Enabled;
                let target = self.last_used.off_wrap();
                if self.event_flags == EVENT_FLAGS_DESC && self.event_off_wrap == target {
                    return false;
                }
                self.write_event(target, EVENT_FLAGS_DESC);
                // Store→load: the device marks descriptors used, fences, reads our structure.
                fence(Ordering::SeqCst);
                self.used_flags_at(self.last_used).is_some()
            }
        }
    }

    /// With a delayed event armed: whether it still lies ahead of the next used position, on
    /// a descriptor in flight (the device crosses it by the time it has used them all).
    fn delayed_event_ahead(&self) -> bool {
        let in_flight = self.size - self.free_descs - self.unpublished_descs;
        let event = Pos::from_off_wrap(self.event_off_wrap);
        matches!(self.last_used.distance_to(event, self.size), Some(d) if d > 0 && d < in_flight)
    }

    /// Writes the driver event structure: the offset first, then the flags that make the
    /// device look at it.
    fn write_event(&mut self, off_wrap: u16, flags: u16) {
        if self.event_off_wrap != off_wrap {
            self.event_off_wrap = off_wrap;
            self.driver_off_wrap()
                .store(off_wrap.to_le(), Ordering::Relaxed);
        }
        if self.event_flags != flags {
            self.event_flags = flags;
            self.driver_flags().store(flags.to_le(), Ordering::Release);
        }
    }

    /// Asks for an interrupt at the next used descriptor. Returns true if used chains are
    /// already pending (the caller should poll again rather than wait).
    pub(crate) fn enable_interrupts(&mut self) -> bool {
        self.interrupts = Interrupts::Enabled;
        if self.event_idx {
            self.write_event(self.last_used.off_wrap(), EVENT_FLAGS_DESC);
        } else {
            self.write_event(self.event_off_wrap, EVENT_FLAGS_ENABLE);
        }
        // Store→load: as in `rearm`.
        fence(Ordering::SeqCst);
        self.has_used()
    }

    /// Asks for an interrupt once about three quarters of the descriptors in flight are used
    /// (Linux's `virtqueue_enable_cb_delayed`, for transmit completions); without EVENT_IDX the
    /// same as [`Self::enable_interrupts`]. Returns true if used chains are already pending
    /// (the caller should poll again rather than wait: the device may have passed the event
    /// before it was written).
    pub(crate) fn enable_interrupts_delayed(&mut self) -> bool {
        if !self.event_idx {
            return self.enable_interrupts();
        }
        self.interrupts = Interrupts::Delayed;
        let in_flight = self.size - self.free_descs - self.unpublished_descs;
        // in_flight ≤ 32768: no overflow.
        let ahead = (u32::from(in_flight) * 3 / 4) as u16;
        let event = self.last_used.advance(ahead, self.size);
        self.write_event(event.off_wrap(), EVENT_FLAGS_DESC);
        // Store→load: as in `rearm`. If nothing is used at the next used position the device
        // has not reached it, so it reads the new event before it crosses it.
        fence(Ordering::SeqCst);
        self.has_used()
    }

    /// Asks for no interrupts (best effort: the device may already be raising one).
    pub(crate) fn disable_interrupts(&mut self) {
        self.interrupts = Interrupts::Disabled;
        self.write_event(self.event_off_wrap, EVENT_FLAGS_DISABLE);
    }

    /// After a per-queue reset of this ring's queue (the device no longer accesses it): takes
    /// the token of every chain still in flight (added, published or not, and not returned
    /// used) into `out`, zeroes the ring memory and starts over as [`Self::new`] left it, with
    /// the interrupt suppression mode kept (written again into the zeroed ring). The caller
    /// pops what the device did return used *before* calling this.
    pub(crate) fn reinit(&mut self, out: &mut Vec<Tok>) {
        out.extend(self.ids.iter_mut().filter_map(|state| state.token.take()));
        let p = self.at(0, self.layout.bytes);
        // SAFETY: `p` is valid for the ring's `layout.bytes` bytes (checked by `at`); the queue
        // was reset, so the device does not read or write the region until it is enabled again.
        unsafe { p.write_bytes(0, self.layout.bytes) };
        self.free_ids.clear();
        self.free_ids.extend((0..self.size).rev());
        self.ids.fill(IdState::FREE);
        self.free_descs = self.size;
        self.unpublished.clear();
        self.unpublished_descs = 0;
        self.order.clear();
        self.next_avail = Pos::START;
        self.published = Pos::START;
        self.since_kick = 0;
        self.last_used = Pos::START;
        self.batch = None;
        self.event_off_wrap = 0;
        self.event_flags = EVENT_FLAGS_ENABLE;
        self.broken = false;
        match self.interrupts {
            Interrupts::Enabled => {
                self.enable_interrupts();
            }
            Interrupts::Delayed => {
                self.enable_interrupts_delayed();
            }
            Interrupts::Disabled => self.disable_interrupts(),
        }
    }

    /// Frees the region. Only for the driver's teardown, after the device is reset.
    ///
    /// # Safety
    ///
    /// `hal` allocated the region, the device no longer accesses it, and the ring is not used
    /// afterwards.
    pub(crate) unsafe fn dealloc<H: Hal>(&self, hal: &H) {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.region.dealloc(hal) };
    }
}

#[cfg(test)]
mod tests;
