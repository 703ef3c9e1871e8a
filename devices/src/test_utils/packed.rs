//! The driver's side of a packed virtqueue in guest memory: [`GuestPackedQueue`] lays out the
//! descriptor ring and both event suppression areas, makes chains available with the driver's
//! wrap counter (the first descriptor's flags written last, as Linux does), reads used
//! descriptors back, writes its event suppression area and decides kicks from the device's as
//! Linux's `virtqueue_kick_prepare_packed` does.
//!
//! It plays the guest driver in tests of the device side ([`crate::virtio::packed`]).

use std::collections::VecDeque;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::queue::{guest_data_methods, DATA_START};
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

/// The driver's side of one packed queue (it holds a clone of the guest memory handle, which
/// shares the mappings).
pub struct GuestPackedQueue {
    mem: GuestMemoryMmap,
    layout: PackedLayout,
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
        GuestPackedQueue {
            mem: mem.clone(),
            layout,
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
        let bytes: Vec<u8> = entries
            .iter()
            .flat_map(|&(addr, len, flags)| raw_desc(addr, len, 0, flags))
            .collect();
        self.alloc(&bytes)
    }

    /// Writes raw descriptors (address, length, id, flags) from the next available position,
    /// each with the AVAIL/USED bits of its wrap counter added and the first one's flags
    /// written last (release); tracks no id (hostile drivers, hand-made chains). Returns the
    /// position it started at.
    pub fn write_raw(&mut self, descs: &[(u64, u32, u16, u16)]) -> (u16, bool) {
        let start = (self.next_avail, self.avail_wrap);
        let mut head_flags = 0;
        for (i, &(addr, len, id, flags)) in descs.iter().enumerate() {
            let flags = flags | Self::avail_bits(self.avail_wrap);
            let at = self.desc_addr(self.next_avail);
            let mut raw = raw_desc(addr, len, id, flags);
            if i == 0 {
                head_flags = flags;
                raw[14..].copy_from_slice(&self.load_u16(at + 14).to_le_bytes());
            }
            self.mem
                .write_slice(&raw, GuestAddress(at))
                .expect("descriptor in ring");
            self.next_avail += 1;
            if self.next_avail == self.layout.size {
                self.next_avail = 0;
                self.avail_wrap = !self.avail_wrap;
            }
        }
        if !descs.is_empty() {
            self.store_u16(self.desc_addr(start.0) + 14, head_flags);
        }
        start
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
        let (_, _, id, flags) = self.desc(self.last_used);
        let avail = flags & DESC_F_AVAIL != 0;
        let used = flags & DESC_F_USED != 0;
        if avail != self.used_wrap || used != self.used_wrap {
            return None;
        }
        let (_, len, _, _) = self.desc(self.last_used);
        Some(Used { id, len, flags })
    }

    /// Takes the next used descriptor: frees its id and moves past the descriptors its chain
    /// occupied. Panics on an id the driver does not have in flight.
    pub fn take_used(&mut self) -> Option<Used> {
        let used = self.peek_used()?;
        let at = self
            .in_flight
            .iter()
            .position(|&(id, _)| id == used.id)
            .expect("used id in flight");
        let (id, descs) = self.in_flight.remove(at).expect("in flight");
        self.free_ids.push_back(id);
        self.advance_used(descs);
        Some(used)
    }

    /// Takes the next used descriptor under IN_ORDER: every chain made available up to the
    /// one with its id is returned; moves past all their descriptors. Returns the descriptor
    /// and how many chains it returned.
    pub fn take_used_in_order(&mut self) -> Option<(Used, usize)> {
        let used = self.peek_used()?;
        let mut chains = 0;
        let mut descs = 0u32;
        loop {
            let (id, d) = self.in_flight.pop_front().expect("used id in flight");
            self.free_ids.push_back(id);
            chains += 1;
            descs += u32::from(d);
            if id == used.id {
                break;
            }
        }
        while descs > 0 {
            let step = descs.min(u32::from(self.layout.size)) as u16;
            self.advance_used(step);
            descs -= u32::from(step);
        }
        Some((used, chains))
    }

    fn advance_used(&mut self, descs: u16) {
        let next = u32::from(self.last_used) + u32::from(descs);
        let size = u32::from(self.layout.size);
        if next >= size {
            self.last_used = (next - size) as u16;
            self.used_wrap = !self.used_wrap;
        } else {
            self.last_used = next as u16;
        }
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
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&addr.to_le_bytes());
    raw[8..12].copy_from_slice(&len.to_le_bytes());
    raw[12..14].copy_from_slice(&id.to_le_bytes());
    raw[14..].copy_from_slice(&flags.to_le_bytes());
    raw
}
