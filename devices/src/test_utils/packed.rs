//! The driver's side of a packed virtqueue in guest memory: [`GuestPackedQueue`] lays out the
//! descriptor ring and both event suppression areas, makes chains available with the driver's
//! wrap counter (the first descriptor's flags written last, as Linux does), reads used
//! descriptors back, writes its event suppression area and decides kicks from the device's as
//! Linux's `virtqueue_kick_prepare_packed` does. Chains are written and used descriptors found
//! through the ring's host address, resolved once; [`GuestPackedQueue::write_at`] and
//! [`GuestPackedQueue::used_id_at`] offer those accesses alone to a driver that keeps its own
//! positions (a bench's), and [`advance`] and [`distance`] do the position arithmetic.
//!
//! It plays the guest driver in tests, benches and fuzzers of the device side
//! ([`crate::virtio::packed`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU16, Ordering};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::queue::{guest_data_methods, host_range, HostPtr, DATA_START};
use crate::virtio::packed::{
    PackedLayout, DESC_F_AVAIL, DESC_F_USED, EVENT_FLAG_DESC, EVENT_FLAG_DISABLE, EVENT_WRAP_BIT,
};
use crate::virtio::ring::vring_need_event;

pub use super::queue::{guest_mem, INDIRECT, MEM_SIZE, NEXT, WRITE};

/// A used descriptor as the driver reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Used {
    /// Buffer id.
    pub id: u16,
    /// Length the device wrote.
    pub len: u32,
    /// The descriptor's flags.
    pub flags: u16,
}

/// A ring position (offset, wrap counter) `n ≤ size` descriptors further.
#[inline(always)]
pub fn advance((offset, wrap): (u16, bool), n: u16, size: u16) -> (u16, bool) {
    let next = u32::from(offset) + u32::from(n);
    if next >= u32::from(size) {
        ((next - u32::from(size)) as u16, !wrap)
    } else {
        (next as u16, wrap)
    }
}

/// Ring descriptors from position `from` forward to `to` (modulo two laps).
pub fn distance(from: (u16, bool), to: (u16, bool), size: u16) -> u32 {
    let linear =
        |(offset, wrap): (u16, bool)| u32::from(offset) + if wrap { 0 } else { u32::from(size) };
    (linear(to) + 2 * u32::from(size) - linear(from)) % (2 * u32::from(size))
}

/// The driver's side of one packed queue (it holds a clone of the guest memory handle, which
/// shares the mappings).
///
/// Besides the bookkeeping driver ([`GuestPackedQueue::add_chain`],
/// [`GuestPackedQueue::take_used`]: buffer ids, positions, chains in flight), it offers the
/// ring accesses alone at positions the caller keeps ([`GuestPackedQueue::write_at`],
/// [`GuestPackedQueue::used_id_at`]), through the ring's host address: a driver with its own
/// accounting (a bench's) pays a guest driver's stores and loads, nothing more.
pub struct GuestPackedQueue {
    mem: GuestMemoryMmap,
    layout: PackedLayout,
    /// Host address of the descriptor ring.
    ring_host: HostPtr,
    next_avail: u16,
    avail_wrap: bool,
    last_used: u16,
    used_wrap: bool,
    free_ids: VecDeque<u16>,
    /// (id, ring descriptors) of the chains made available and not yet used, in order.
    in_flight: VecDeque<(u16, u16)>,
    next_data: u64,
}

impl GuestPackedQueue {
    /// A queue of `size` descriptors: the ring at guest address 0, the driver event area right
    /// after it and the device event area after that; buffers from [`DATA_START`].
    pub fn new(mem: &GuestMemoryMmap, size: u16) -> Self {
        let ring = 16 * u64::from(size);
        Self::with_layout(
            mem,
            PackedLayout {
                size,
                desc: 0,
                driver_event: ring,
                device_event: ring + 4,
            },
        )
    }

    /// A queue laid out as `layout`; the ring and both areas start zeroed.
    pub fn with_layout(mem: &GuestMemoryMmap, layout: PackedLayout) -> Self {
        mem.write_slice(
            &vec![0u8; 16 * usize::from(layout.size)],
            GuestAddress(layout.desc),
        )
        .expect("descriptor ring in memory");
        for area in [layout.driver_event, layout.device_event] {
            mem.write_slice(&[0u8; 4], GuestAddress(area))
                .expect("event area in memory");
        }
        Self::over_layout(mem, layout)
    }

    /// A queue laid out as `layout` over the ring and areas as they are in memory (a driver
    /// taking over memory a test wrote or patched), from the start position. The descriptor
    /// ring must be 16-aligned, inside one memory region.
    pub fn over_layout(mem: &GuestMemoryMmap, layout: PackedLayout) -> Self {
        assert_eq!(layout.desc % 16, 0, "descriptor ring 16-aligned");
        GuestPackedQueue {
            mem: mem.clone(),
            layout,
            ring_host: host_range(mem, layout.desc, 16 * usize::from(layout.size)),
            next_avail: 0,
            avail_wrap: true,
            last_used: 0,
            used_wrap: true,
            free_ids: (0..layout.size).collect(),
            in_flight: VecDeque::new(),
            next_data: DATA_START,
        }
    }

    /// This queue with its buffers allocated from `addr` on (another queue's buffers in the
    /// same memory start at [`DATA_START`]).
    pub fn with_data_at(mut self, addr: u64) -> Self {
        self.next_data = addr;
        self
    }

    /// The three addresses to program (descriptor ring, driver area, device area).
    pub fn ring_addrs(&self) -> (u64, u64, u64) {
        (
            self.layout.desc,
            self.layout.driver_event,
            self.layout.device_event,
        )
    }

    /// The layout to give the device.
    pub fn layout(&self) -> PackedLayout {
        self.layout
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// The guest memory the queue lives in.
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Where the driver makes the next descriptor available: (offset, wrap counter).
    pub fn avail_position(&self) -> (u16, bool) {
        (self.next_avail, self.avail_wrap)
    }

    /// Where the driver expects the next used descriptor: (offset, wrap counter).
    pub fn used_position(&self) -> (u16, bool) {
        (self.last_used, self.used_wrap)
    }

    /// Ring descriptors the driver has made available and not seen used.
    pub fn outstanding(&self) -> u32 {
        self.in_flight.iter().map(|&(_, d)| u32::from(d)).sum()
    }

    /// The chains made available and not seen used, oldest first: (id, ring descriptors).
    pub fn in_flight(&self) -> &VecDeque<(u16, u16)> {
        &self.in_flight
    }

    /// Gives up on the chains in flight (the device broke the ring): the used position moves
    /// to the avail position; their ids stay taken, as the device may still hold them.
    pub fn abandon_in_flight(&mut self) {
        (self.last_used, self.used_wrap) = (self.next_avail, self.avail_wrap);
        self.in_flight.clear();
    }

    /// The AVAIL/USED bits that make a descriptor available for wrap counter `wrap`.
    pub fn avail_bits(wrap: bool) -> u16 {
        if wrap {
            DESC_F_AVAIL
        } else {
            DESC_F_USED
        }
    }

    /// Makes a chain of `bufs` (address, length, flags: 0 or WRITE) available with a fresh
    /// id (written in every descriptor); NEXT is added to all but the last. Returns the id.
    pub fn add_chain(&mut self, bufs: &[(u64, u32, u16)]) -> u16 {
        let id = self.free_ids.pop_front().expect("a free buffer id");
        let descs: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| {
                let next = if i + 1 < bufs.len() { NEXT } else { 0 };
                (addr, len, id, flags | next)
            })
            .collect();
        self.write_raw(&descs);
        self.in_flight.push_back((id, bufs.len() as u16));
        id
    }

    /// [`GuestPackedQueue::add_chain`] as a well-behaved driver does it: none (`None`) when the
    /// chain does not fit next to the descriptors outstanding or no buffer id is free.
    pub fn try_add_chain(&mut self, bufs: &[(u64, u32, u16)]) -> Option<u16> {
        let room = u32::from(self.layout.size) - self.outstanding();
        if bufs.len() as u32 > room || self.free_ids.is_empty() {
            return None;
        }
        Some(self.add_chain(bufs))
    }

    /// Makes a device-readable chain carrying `parts` available; returns the id.
    pub fn push_readable(&mut self, parts: &[&[u8]]) -> u16 {
        let bufs: Vec<_> = parts
            .iter()
            .map(|p| (self.alloc(p), p.len() as u32, 0))
            .collect();
        self.add_chain(&bufs)
    }

    /// Makes a device-writable chain of buffers of the given lengths available; returns the id
    /// and the buffer addresses.
    pub fn push_writable(&mut self, lens: &[u32]) -> (u16, Vec<u64>) {
        let bufs: Vec<_> = lens
            .iter()
            .map(|&len| (self.alloc_zeroed(len as usize), len, WRITE))
            .collect();
        let id = self.add_chain(&bufs);
        (id, bufs.iter().map(|b| b.0).collect())
    }

    /// Writes `entries` (address, length, flags) as an indirect table in fresh memory and
    /// makes one descriptor pointing to it available; returns the id.
    pub fn add_indirect(&mut self, entries: &[(u64, u32, u16)]) -> u16 {
        let table = self.write_table(entries);
        let id = self.free_ids.pop_front().expect("a free buffer id");
        self.write_raw(&[(table, (16 * entries.len()) as u32, id, INDIRECT)]);
        self.in_flight.push_back((id, 1));
        id
    }

    /// Writes `entries` (address, length, flags) as a descriptor table in fresh memory (ids 0);
    /// returns its address.
    pub fn write_table(&mut self, entries: &[(u64, u32, u16)]) -> u64 {
        let table = self.alloc_zeroed(16 * entries.len());
        self.write_table_at(table, entries);
        table
    }

    /// Writes `entries` (address, length, flags, as they are) as a descriptor table at guest
    /// address `table` (ids 0).
    pub fn write_table_at(&self, table: u64, entries: &[(u64, u32, u16)]) {
        let bytes: Vec<u8> = entries
            .iter()
            .flat_map(|&(addr, len, flags)| raw_desc(addr, len, 0, flags))
            .collect();
        self.mem
            .write_slice(&bytes, GuestAddress(table))
            .expect("table in memory");
    }

    /// Writes raw descriptors (address, length, id, flags) from the next available position,
    /// each with the AVAIL/USED bits of its wrap counter added and the first one's flags
    /// written last (release); tracks no id (hostile drivers, hand-made chains). Returns the
    /// position it started at.
    pub fn write_raw(&mut self, descs: &[(u64, u32, u16, u16)]) -> (u16, bool) {
        let start = (self.next_avail, self.avail_wrap);
        (self.next_avail, self.avail_wrap) = self.write_at(start, descs.iter().copied());
        start
    }

    /// Writes `descs` (address, length, id, flags) into the ring from position `start` (the
    /// AVAIL/USED bits of the wrap counter there added to each one's flags), the first one's
    /// flags last with a release store, through the ring's host address; returns the position
    /// after them. The queue's own positions and bookkeeping do not move.
    #[inline]
    pub fn write_at(
        &self,
        start: (u16, bool),
        descs: impl IntoIterator<Item = (u64, u32, u16, u16)>,
    ) -> (u16, bool) {
        let size = self.layout.size;
        assert!(start.0 < size, "position inside the ring");
        let (mut at, mut head, mut head_flags) = (start, true, 0);
        for (addr, len, id, flags) in descs {
            let flags = (flags | Self::avail_bits(at.1)).to_le();
            let p = self.ring_host.0.wrapping_add(16 * usize::from(at.0));
            // SAFETY: `p` is descriptor `at.0 < size` (asserted for `start`, kept by `advance`)
            // of the 16·size-byte ring, 16-aligned (`over_layout`), inside one region of the
            // memory `self.mem` keeps mapped (`host_range`). Guest memory is shared with the
            // device, hence the volatile stores.
            unsafe {
                std::ptr::write_volatile(p.cast::<u64>(), addr.to_le());
                std::ptr::write_volatile(p.add(8).cast::<u32>(), len.to_le());
                std::ptr::write_volatile(p.add(12).cast::<u16>(), id.to_le());
                if head {
                    head_flags = flags;
                } else {
                    std::ptr::write_volatile(p.add(14).cast::<u16>(), flags);
                }
            }
            head = false;
            at = advance(at, 1, size);
        }
        if !head {
            let p = self
                .ring_host
                .0
                .wrapping_add(16 * usize::from(start.0) + 14);
            // SAFETY: the head's 2-aligned flags, inside the ring as above; guest memory is
            // plain shared memory, valid for atomic access.
            unsafe { AtomicU16::from_ptr(p.cast()) }.store(head_flags, Ordering::Release);
        }
        at
    }

    /// The buffer id of the used descriptor at position `at`, if the device wrote it there
    /// (AVAIL and USED both equal to the wrap counter): its flags loaded with acquire, then
    /// the id, through the ring's host address.
    #[inline(always)]
    pub fn used_id_at(&self, at: (u16, bool)) -> Option<u16> {
        assert!(at.0 < self.layout.size, "position inside the ring");
        let p = self.ring_host.0.wrapping_add(16 * usize::from(at.0));
        let bits = if at.1 { DESC_F_AVAIL | DESC_F_USED } else { 0 };
        // SAFETY: the 2-aligned flags of descriptor `at.0 < size`, inside the ring (see
        // `write_at`); guest memory is plain shared memory, valid for atomic access.
        let flags = unsafe { AtomicU16::from_ptr(p.add(14).cast()) }.load(Ordering::Acquire);
        if u16::from_le(flags) & (DESC_F_AVAIL | DESC_F_USED) != bits {
            return None;
        }
        // SAFETY: the descriptor's 2-aligned id, inside the ring; the device wrote it before
        // the flags loaded with acquire above.
        Some(u16::from_le(unsafe {
            std::ptr::read_volatile(p.add(12).cast::<u16>())
        }))
    }

    /// Reads descriptor `offset` of the ring: (address, length, id, flags).
    pub fn desc(&self, offset: u16) -> (u64, u32, u16, u16) {
        let at = self.desc_addr(offset);
        let addr: u64 = self.mem.read_obj(GuestAddress(at)).expect("ring");
        let len: u32 = self.mem.read_obj(GuestAddress(at + 8)).expect("ring");
        let id: u16 = self.mem.read_obj(GuestAddress(at + 12)).expect("ring");
        (
            u64::from_le(addr),
            u32::from_le(len),
            u16::from_le(id),
            self.load_u16(at + 14),
        )
    }

    /// The used descriptor at the driver's used position, if the device wrote it (AVAIL and
    /// USED both equal to the driver's used wrap counter); nothing moves.
    pub fn peek_used(&self) -> Option<Used> {
        let id = self.used_id_at((self.last_used, self.used_wrap))?;
        let (_, len, _, flags) = self.desc(self.last_used);
        Some(Used { id, len, flags })
    }

    /// Takes the next used descriptor: frees its id and moves past the descriptors its chain
    /// occupied. Panics on an id the driver does not have in flight.
    pub fn take_used(&mut self) -> Option<Used> {
        let taken = self.try_take_used(false).expect("used id in flight");
        taken.map(|(used, _)| used)
    }

    /// Takes the next used descriptor under IN_ORDER: every chain made available up to the
    /// one with its id is returned; moves past all their descriptors. Returns the descriptor
    /// and how many chains it returned.
    pub fn take_used_in_order(&mut self) -> Option<(Used, usize)> {
        self.try_take_used(true).expect("used id in flight")
    }

    /// Takes the next used descriptor, if the device wrote one: the chain with its id, or
    /// under IN_ORDER (`in_order`) every chain made available up to that one, is returned
    /// (ids freed, the used position past their descriptors). Returns the descriptor and how
    /// many chains it returned; an id the driver does not have in flight is an error (`Err`
    /// with the id; nothing moves).
    pub fn try_take_used(&mut self, in_order: bool) -> Result<Option<(Used, usize)>, u16> {
        let Some(used) = self.peek_used() else {
            return Ok(None);
        };
        let Some(at) = self.in_flight.iter().position(|&(id, _)| id == used.id) else {
            return Err(used.id);
        };
        let gone: Vec<_> = if in_order {
            self.in_flight.drain(..=at).collect()
        } else {
            self.in_flight.remove(at).into_iter().collect()
        };
        self.free_ids.extend(gone.iter().map(|&(id, _)| id));
        let mut descs: u32 = gone.iter().map(|&(_, d)| u32::from(d)).sum();
        let size = self.layout.size;
        while descs > 0 {
            let step = descs.min(u32::from(size)) as u16;
            let pos = advance((self.last_used, self.used_wrap), step, size);
            (self.last_used, self.used_wrap) = pos;
            descs -= u32::from(step);
        }
        Ok(Some((used, gone.len())))
    }

    /// Writes the driver event suppression area: off_wrap first, then the flags.
    pub fn set_driver_event(&self, off_wrap: u16, flags: u16) {
        self.store_u16(self.layout.driver_event, off_wrap);
        self.store_u16(self.layout.driver_event + 2, flags);
    }

    /// Asks for an interrupt at the next used descriptor, as Linux's
    /// `virtqueue_enable_cb_prepare_packed` does with EVENT_IDX (DESC at its used position).
    pub fn want_next_used(&self) {
        let off_wrap = self.last_used | if self.used_wrap { EVENT_WRAP_BIT } else { 0 };
        self.set_driver_event(off_wrap, EVENT_FLAG_DESC);
    }

    /// The device event suppression area: (off_wrap, flags).
    pub fn device_event(&self) -> (u16, u16) {
        (
            self.load_u16(self.layout.device_event),
            self.load_u16(self.layout.device_event + 2),
        )
    }

    /// Whether the driver must kick after making `added` descriptors available (the last
    /// ones written), from the device event area, as Linux's `virtqueue_kick_prepare_packed`
    /// decides: DISABLE never, DESC when the added range passes off_wrap (a wrap bit other
    /// than the driver's puts the offset a ring earlier), anything else always.
    pub fn kick_needed(&self, added: u16) -> bool {
        let (off_wrap, flags) = self.device_event();
        if flags == EVENT_FLAG_DESC {
            let new = self.next_avail;
            let old = new.wrapping_sub(added);
            let mut event = off_wrap & !EVENT_WRAP_BIT;
            if (off_wrap & EVENT_WRAP_BIT != 0) != self.avail_wrap {
                event = event.wrapping_sub(self.layout.size);
            }
            vring_need_event(event, new, old)
        } else {
            flags != EVENT_FLAG_DISABLE
        }
    }

    fn desc_addr(&self, offset: u16) -> u64 {
        self.layout.desc + 16 * u64::from(offset)
    }

    guest_data_methods!();
}

/// A packed descriptor's 16 bytes.
pub fn raw_desc(addr: u64, len: u32, id: u16, flags: u16) -> [u8; 16] {
    super::queue::desc_bytes(addr, len, id, flags)
}
