//! The driver side of one split virtqueue (virtio 1.2 §2.7).
//!
//! Layout, in one zeroed DMA region: the descriptor table (16 bytes × size) at 0, the avail ring
//! (`flags`, `idx`, `ring[size]`, `used_event`) right after it, the used ring (`flags`, `idx`,
//! `ring[size]` of (id, len), `avail_event`) at the next multiple of 4.
//!
//! Memory ordering with the device, which runs concurrently on another CPU or thread:
//! - the index fields and the event/flags fields are accessed as `AtomicU16`;
//! - descriptors and avail entries are written (volatile), then `fence(Release)`, then
//!   `avail.idx` is stored (Release): the device's Acquire load of the index sees them;
//! - `used.idx` is loaded with Acquire before the used entries below it are read;
//! - between publishing `avail.idx` and reading `avail_event` / `used.flags` for the kick
//!   decision, and between writing `used_event` / `avail.flags` and re-reading `used.idx` when
//!   re-enabling interrupts, there is a full fence (`SeqCst`): each side stores then loads what
//!   the other stores, and without a store→load barrier both can miss each other
//!   (the `virtqueue_kick_prepare` / `virtqueue_enable_cb` races).
//!
//! The driver never trusts device-writable memory for its own bookkeeping: the free list, chain
//! links and per-chain tokens live in private vectors; used ids are checked against them.
//!
//! With VIRTIO_F_IN_ORDER the driver takes descriptors in ring order (descriptor `x` links to
//! `x + 1`, the last one to 0) and the device uses chains in the order they were made
//! available. The device may then return a batch with one used element that carries the head
//! of the batch's last chain and moves `used.idx` on by the batch's size: the ring returns
//! every chain added before that one, in order, the earlier ones with the full length of their
//! device-writable buffers (the spec assumes them used completely).

use alloc::collections::VecDeque;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{fence, AtomicU16, Ordering};

use crate::hal::{DmaRegion, Hal, PhysAddr};

// The packed virtqueue layout beside the split one; `vring` drives either.
pub(crate) mod packed;

const DESC_SIZE: usize = 16;
const USED_ELEM_SIZE: usize = 8;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
/// Avail ring flag: the driver wants no interrupts (EVENT_IDX off).
pub(crate) const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Used ring flag: the device wants no notifications (EVENT_IDX off).
pub(crate) const USED_F_NO_NOTIFY: u16 = 1;
/// How far past the last used index `used_event` is set to keep interrupts off. With queue sizes
/// ≤ 0x8000 and `used_event` refreshed on every reclaim, the device's used index never reaches it.
const USED_EVENT_FAR: u16 = 0x8000;

/// Stores `v` at `p` (volatile) only if `p` holds something else: a ring line the device has
/// read since it was last written then stays clean in both CPUs' caches.
///
/// # Safety
///
/// `p` is valid and aligned for reads and writes of a `T`.
#[inline(always)]
unsafe fn store_if_changed<T: Copy + PartialEq>(p: *mut T, v: T) {
    // SAFETY: the caller's contract.
    unsafe {
        if p.read_volatile() != v {
            p.write_volatile(v);
        }
    }
}

/// The spec's `vring_need_event`: given the other side's event index and that our index moved
/// from `old` to `new`, must we notify? True iff `event_idx` lies in `[old, new)`, modulo 2^16.
pub fn vring_need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Byte offsets of the ring parts in the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingLayout {
    pub(crate) avail: usize,
    pub(crate) used: usize,
    pub(crate) bytes: usize,
}

impl RingLayout {
    pub(crate) const fn new(size: u16) -> RingLayout {
        let n = size as usize;
        let avail = DESC_SIZE * n;
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        RingLayout {
            avail,
            used,
            bytes: used + 6 + USED_ELEM_SIZE * n,
        }
    }
}

/// Who accesses a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    DeviceReads,
    DeviceWrites,
}

/// One buffer of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Buffer {
    pub(crate) addr: PhysAddr,
    pub(crate) len: u32,
    pub(crate) access: Access,
}

/// Not enough free descriptors for the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingFull;

/// What the kick decision after a publish found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kick {
    /// Notify the device.
    Notify,
    /// EVENT_IDX: `avail_event` was not crossed.
    SuppressedByEventIdx,
    /// No EVENT_IDX: the device set NO_NOTIFY.
    SuppressedByFlag,
    /// Nothing was published since the last decision.
    NothingNew,
}

/// A chain returned by the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Used<Tok> {
    pub(crate) token: Tok,
    pub(crate) len: u32,
}

/// A used-ring entry the driver ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UsedError {
    /// An id ≥ the queue size.
    IdOutOfRange(u32),
    /// An id that is not the head of a chain in flight.
    NotInFlight(u16),
    /// `used.idx` ran more than the queue size ahead: the ring is unusable from now on.
    IndexJump,
    /// Packed ring: a written length beyond the chain's device-writable buffers.
    LenOutOfRange {
        /// The chain's buffer id.
        id: u16,
        /// The length the device reported.
        len: u32,
    },
}

/// Whether interrupts for this queue are wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interrupts {
    Enabled,
    Disabled,
}

/// The driver side of a split virtqueue whose chains carry a `Tok` each.
pub(crate) struct SplitRing<Tok> {
    index: u16,
    size: u16,
    layout: RingLayout,
    region: DmaRegion,
    event_idx: bool,
    /// Free descriptor indexes (a stack).
    free: Vec<u16>,
    /// Private copy of each descriptor's `next` link.
    next: Vec<u16>,
    /// Descriptors in the chain headed by each index.
    chain_len: Vec<u16>,
    /// The token of each chain in flight, by head.
    tokens: Vec<Option<Tok>>,
    /// Next avail slot to fill (entries from `published` to here are written, not published).
    avail_idx: u16,
    /// Last value stored to `avail.idx`.
    published: u16,
    /// `avail.idx` at the last kick decision.
    kicked: u16,
    /// Next used slot to read.
    last_used: u16,
    /// Last `used.idx` loaded.
    used_seen: u16,
    interrupts: Interrupts,
    /// Last value written to `used_event`.
    used_event: u16,
    broken: bool,
    /// VIRTIO_F_IN_ORDER: descriptors in ring order, batches returned with one used element.
    in_order: bool,
    /// With `in_order`: the next descriptor to take.
    next_desc: u16,
    /// With `in_order`: the heads in flight, in the order they were added.
    order: VecDeque<u16>,
    /// With `in_order`: total length of each chain's device-writable buffers, by head.
    writable: Vec<u32>,
    /// With `in_order`: the head of the last chain of the batch being returned, and its length.
    batch: Option<(u16, u32)>,
}

impl<Tok: Copy> SplitRing<Tok> {
    /// A ring of `size` (a power of two ≤ 32768) entries in `region` (zeroed, at least
    /// `RingLayout::new(size).bytes` long), for queue `index`.
    #[cfg(test)]
    pub(crate) fn new(index: u16, size: u16, region: DmaRegion, event_idx: bool) -> Self {
        Self::with_order(index, size, region, event_idx, false)
    }

    /// [`Self::new`]; with `in_order` (VIRTIO_F_IN_ORDER negotiated) descriptors are taken in
    /// ring order and a used element also returns every chain added before its own.
    pub(crate) fn with_order(
        index: u16,
        size: u16,
        region: DmaRegion,
        event_idx: bool,
        in_order: bool,
    ) -> Self {
        let layout = RingLayout::new(size);
        debug_assert!(region.len() >= layout.bytes && size.is_power_of_two());
        SplitRing {
            index,
            size,
            layout,
            region,
            event_idx,
            // Popped from the end: descriptor 0 first.
            free: (0..size).rev().collect(),
            next: vec![0; usize::from(size)],
            chain_len: vec![0; usize::from(size)],
            tokens: vec![None; usize::from(size)],
            avail_idx: 0,
            published: 0,
            kicked: 0,
            last_used: 0,
            used_seen: 0,
            interrupts: Interrupts::Enabled,
            used_event: 0,
            broken: false,
            in_order,
            next_desc: 0,
            order: VecDeque::with_capacity(if in_order { usize::from(size) } else { 0 }),
            writable: vec![0; if in_order { usize::from(size) } else { 0 }],
            batch: None,
        }
    }

    pub(crate) fn index(&self) -> u16 {
        self.index
    }

    pub(crate) fn size(&self) -> u16 {
        self.size
    }

    /// Device addresses of (descriptor table, avail ring, used ring).
    pub(crate) fn addresses(&self) -> (PhysAddr, PhysAddr, PhysAddr) {
        let base = self.region.paddr();
        (
            base,
            base + self.layout.avail as u64,
            base + self.layout.used as u64,
        )
    }

    /// Free descriptors.
    pub(crate) fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// True once the device broke the used ring (see [`UsedError::IndexJump`]).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// A pointer into the ring region at `offset` (which must leave room for `len` bytes).
    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        match self.region.ptr_at(offset, len) {
            Some(p) => p,
            // Offsets come from `layout` and slots masked by `size - 1`: always inside.
            None => unreachable!("ring offset {offset} outside its region"),
        }
    }

    /// The 16-bit ring field at `offset`, for atomic access.
    fn atomic(&self, offset: usize) -> &AtomicU16 {
        debug_assert!(offset.is_multiple_of(2));
        let p = self.at(offset, 2).cast::<u16>();
        // SAFETY: `p` is inside the region (checked by `at`), 2-aligned (the region is page
        // aligned and every field offset is even), and valid while `self` owns the region. The
        // driver and the device access these fields only atomically once the queue is live.
        unsafe { AtomicU16::from_ptr(p) }
    }

    fn avail_flags(&self) -> &AtomicU16 {
        self.atomic(self.layout.avail)
    }

    fn avail_idx_field(&self) -> &AtomicU16 {
        self.atomic(self.layout.avail + 2)
    }

    fn used_event_field(&self) -> &AtomicU16 {
        self.atomic(self.layout.avail + 4 + 2 * usize::from(self.size))
    }

    fn used_flags(&self) -> &AtomicU16 {
        self.atomic(self.layout.used)
    }

    fn used_idx_field(&self) -> &AtomicU16 {
        self.atomic(self.layout.used + 2)
    }

    fn avail_event_field(&self) -> &AtomicU16 {
        self.atomic(self.layout.used + 4 + USED_ELEM_SIZE * usize::from(self.size))
    }

    fn slot(&self, idx: u16) -> usize {
        usize::from(idx & (self.size - 1))
    }

    /// Makes descriptor `i` describe `buf`, writing only the halves that differ: a descriptor
    /// that comes back for the same buffer of the same length (a steady stream) is then not
    /// written at all, and its cache line stays clean in the device's CPU instead of being
    /// taken from it and fetched back every time. What is in memory is read, never
    /// remembered, so a device that wrote there is overwritten.
    fn write_desc(&mut self, i: u16, buf: &Buffer, flags: u16, next: u16) {
        let p = self.at(DESC_SIZE * usize::from(i), DESC_SIZE);
        // SAFETY: `p` is a 16-aligned, 16-byte descriptor inside the region. Descriptor `i` is
        // free: not reachable from any published chain, so the device does not read it now.
        // Bytes 8..16 are `len` (u32), `flags` and `next` (u16), little-endian, as one u64.
        unsafe {
            let tail = u64::from(buf.len) | u64::from(flags) << 32 | u64::from(next) << 48;
            store_if_changed(p.cast::<u64>(), buf.addr.to_le());
            store_if_changed(p.add(8).cast::<u64>(), tail.to_le());
        }
    }

    /// Writes a chain of `bufs` and puts its head in the next avail slot, unpublished. `bufs`
    /// must not be empty.
    pub(crate) fn add(&mut self, bufs: &[Buffer], token: Tok) -> Result<(), RingFull> {
        let n = bufs.len();
        if n == 0 || n > self.free.len() {
            return Err(RingFull);
        }
        let start = self.free.len() - n;
        if self.in_order {
            self.take_in_ring_order(start, bufs);
        }
        let mut next = 0u16;
        // Last buffer first, so each descriptor can link to the one already written.
        for k in (0..n).rev() {
            let d = self.free[start + k];
            let mut flags = match bufs[k].access {
                Access::DeviceReads => 0,
                Access::DeviceWrites => DESC_F_WRITE,
            };
            if k + 1 < n {
                flags |= DESC_F_NEXT;
            }
            self.write_desc(d, &bufs[k], flags, next);
            self.next[usize::from(d)] = next;
            next = d;
        }
        self.free.truncate(start);
        let head = next;
        // n ≤ the free count ≤ size ≤ 32768.
        self.chain_len[usize::from(head)] = n as u16;
        self.tokens[usize::from(head)] = Some(token);
        if self.in_order {
            self.order.push_back(head);
        }
        let entry = self
            .at(self.layout.avail + 4 + 2 * self.slot(self.avail_idx), 2)
            .cast::<u16>();
        // SAFETY: a 2-aligned avail ring entry inside the region. Its slot is not in the published
        // window (at most `size` chains are in flight, one descriptor each at least, and the
        // device consumed this slot `size` publications ago), so the device does not read it.
        // Written only if it differs, as descriptors are.
        unsafe { store_if_changed(entry, head.to_le()) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
        Ok(())
    }

    /// With IN_ORDER: puts the next `bufs.len()` descriptors in ring order where `add` takes
    /// its descriptors from (the free list above `start`; with IN_ORDER only its length
    /// counts), and notes the chain's device-writable length.
    fn take_in_ring_order(&mut self, start: usize, bufs: &[Buffer]) {
        let mut writable = 0u32;
        for (k, buf) in bufs.iter().enumerate() {
            self.free[start + k] = self.next_desc & (self.size - 1);
            self.next_desc = self.next_desc.wrapping_add(1);
            if buf.access == Access::DeviceWrites {
                writable = writable.saturating_add(buf.len);
            }
        }
        // The chain's head is the first descriptor taken.
        self.writable[usize::from(self.free[start])] = writable;
    }

    /// Makes the chains added since the last publish visible to the device. False if there
    /// were none.
    pub(crate) fn publish(&mut self) -> bool {
        if self.avail_idx == self.published {
            return false;
        }
        // Descriptors and avail entries before the index that exposes them.
        fence(Ordering::Release);
        self.avail_idx_field()
            .store(self.avail_idx.to_le(), Ordering::Release);
        self.published = self.avail_idx;
        true
    }

    /// Whether the device must be notified of what was published since the last decision.
    pub(crate) fn kick_decision(&mut self) -> Kick {
        let (old, new) = (self.kicked, self.published);
        if old == new {
            return Kick::NothingNew;
        }
        self.kicked = new;
        // Store→load barrier: our `avail.idx` store must be visible before we read the device's
        // `avail_event` / `used.flags`. The device stores those, fences, then re-reads
        // `avail.idx`; without this fence both sides could read stale values and the device
        // would sleep on a ring with buffers in it.
        fence(Ordering::SeqCst);
        if self.event_idx {
            let event = u16::from_le(self.avail_event_field().load(Ordering::Acquire));
            if vring_need_event(event, new, old) {
                Kick::Notify
            } else {
                Kick::SuppressedByEventIdx
            }
        } else if u16::from_le(self.used_flags().load(Ordering::Acquire)) & USED_F_NO_NOTIFY != 0 {
            Kick::SuppressedByFlag
        } else {
            Kick::Notify
        }
    }

    fn load_used_idx(&mut self) -> u16 {
        self.used_seen = u16::from_le(self.used_idx_field().load(Ordering::Acquire));
        self.used_seen
    }

    /// True if the device returned chains not yet popped.
    pub(crate) fn has_used(&mut self) -> bool {
        !self.broken && self.load_used_idx() != self.last_used
    }

    /// Used entries the device returned and the driver has not popped (0 on a broken ring; a
    /// device that moved the used index past the ring is caught when they are popped).
    pub(crate) fn used_pending(&mut self) -> u16 {
        if self.broken {
            return 0;
        }
        self.load_used_idx().wrapping_sub(self.last_used)
    }

    /// Pops the next used chain. `Ok(None)` when there is none; with interrupts enabled that
    /// also means `used_event` is armed for the next entry.
    pub(crate) fn pop_used(&mut self) -> Result<Option<Used<Tok>>, UsedError> {
        if self.broken {
            return Ok(None);
        }
        if let Some((last, len)) = self.batch {
            return Ok(self.pop_in_order(last, len));
        }
        if self.used_seen == self.last_used
            && self.load_used_idx() == self.last_used
            && !self.rearm_used_event()
        {
            return Ok(None);
        }
        if self.used_seen.wrapping_sub(self.last_used) > self.size {
            self.broken = true;
            return Err(UsedError::IndexJump);
        }
        let elem = self.at(
            self.layout.used + 4 + USED_ELEM_SIZE * self.slot(self.last_used),
            USED_ELEM_SIZE,
        );
        // SAFETY: an 8-aligned used element inside the region, below the `used.idx` loaded with
        // Acquire: the device wrote it before publishing that index and will not rewrite it
        // until we hand the slot back by publishing more buffers.
        let (id, len) = unsafe {
            (
                u32::from_le(elem.cast::<u32>().read_volatile()),
                u32::from_le(elem.add(4).cast::<u32>().read_volatile()),
            )
        };
        let head = match u16::try_from(id) {
            Ok(head) if head < self.size => head,
            _ => {
                self.last_used = self.last_used.wrapping_add(1);
                return Err(UsedError::IdOutOfRange(id));
            }
        };
        if self.in_order && self.tokens[usize::from(head)].is_some() {
            self.batch = Some((head, len));
            return Ok(self.pop_in_order(head, len));
        }
        self.last_used = self.last_used.wrapping_add(1);
        let Some(token) = self.tokens[usize::from(head)].take() else {
            return Err(UsedError::NotInFlight(head));
        };
        let mut d = head;
        for _ in 0..self.chain_len[usize::from(head)] {
            self.free.push(d);
            d = self.next[usize::from(d)];
        }
        Ok(Some(Used { token, len }))
    }

    /// With IN_ORDER, during the batch ending with the chain headed by `last` (returned with
    /// `len`): returns the earliest chain in flight, which takes one used index.
    fn pop_in_order(&mut self, last: u16, len: u32) -> Option<Used<Tok>> {
        let Some(head) = self.order.pop_front() else {
            // `last` is in flight, so `order` holds it: not reached.
            self.batch = None;
            return None;
        };
        self.last_used = self.last_used.wrapping_add(1);
        let len = if head == last {
            self.batch = None;
            len
        } else {
            // Chains before the last of a batch count as used completely.
            self.writable[usize::from(head)]
        };
        let token = self.tokens[usize::from(head)].take()?;
        for _ in 0..self.chain_len[usize::from(head)] {
            // With IN_ORDER only the free list's length counts.
            self.free.push(head);
        }
        Some(Used { token, len })
    }

    /// Called when the used ring looks empty: moves `used_event` to where it must be now.
    /// Returns true if, after arming, more used entries turned out to be there.
    fn rearm_used_event(&mut self) -> bool {
        if !self.event_idx {
            return false;
        }
        match self.interrupts {
            Interrupts::Enabled => {
                if self.used_event == self.last_used {
                    return false;
                }
                self.write_used_event(self.last_used);
                // Store→load: the device stores `used.idx`, fences, reads `used_event`.
                fence(Ordering::SeqCst);
                self.load_used_idx() != self.last_used
            }
            Interrupts::Disabled => {
                let far = self.last_used.wrapping_add(USED_EVENT_FAR);
                if self.used_event != far {
                    self.write_used_event(far);
                }
                false
            }
        }
    }

    fn write_used_event(&mut self, value: u16) {
        self.used_event = value;
        self.used_event_field()
            .store(value.to_le(), Ordering::Relaxed);
    }

    /// Asks for interrupts when chains are used. Returns true if used chains are already
    /// pending (the caller should poll again rather than wait).
    pub(crate) fn enable_interrupts(&mut self) -> bool {
        self.interrupts = Interrupts::Enabled;
        if self.event_idx {
            self.write_used_event(self.last_used);
        } else {
            self.avail_flags().store(0, Ordering::Relaxed);
        }
        // Store→load: as in `rearm_used_event`.
        fence(Ordering::SeqCst);
        self.has_used()
    }

    /// Asks for no interrupts (best effort: the device may already be raising one).
    pub(crate) fn disable_interrupts(&mut self) {
        self.interrupts = Interrupts::Disabled;
        if self.event_idx {
            self.write_used_event(self.last_used.wrapping_add(USED_EVENT_FAR));
        } else {
            self.avail_flags()
                .store(AVAIL_F_NO_INTERRUPT.to_le(), Ordering::Relaxed);
        }
    }

    /// After a per-queue reset of this ring's queue (the device no longer accesses it): takes
    /// the token of every chain still in flight (added, published or not, and not returned
    /// used) into `out`, zeroes the ring memory and starts over as [`Self::new`] left it, with
    /// the interrupt suppression mode kept (written again into the zeroed ring). The caller
    /// pops what the device did return used *before* calling this.
    pub(crate) fn reinit(&mut self, out: &mut Vec<Tok>) {
        out.extend(self.tokens.iter_mut().filter_map(Option::take));
        let p = self.at(0, self.layout.bytes);
        // SAFETY: `p` is valid for the ring's `layout.bytes` bytes (checked by `at`); the queue
        // was reset, so the device does not read or write the region until it is enabled again.
        unsafe { p.write_bytes(0, self.layout.bytes) };
        self.free = (0..self.size).rev().collect();
        self.chain_len.fill(0);
        self.next.fill(0);
        self.avail_idx = 0;
        self.published = 0;
        self.kicked = 0;
        self.last_used = 0;
        self.used_seen = 0;
        self.used_event = 0;
        self.broken = false;
        self.next_desc = 0;
        self.order.clear();
        self.batch = None;
        match self.interrupts {
            Interrupts::Enabled => {
                self.enable_interrupts();
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
