//! Shared by the device fuzz targets: guest memory layouts, memory patches, queue building and
//! a driver-like ring writer.

#![allow(dead_code)] // each target uses a different part

use arbitrary::Arbitrary;
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

/// Size of the first guest memory region (rings and buffers of the driver-like mode).
pub const REGION_A: u64 = 0x1_0000;
/// Size of the second region, when there is one.
pub const REGION_B: u64 = 0x8000;

/// How guest memory is laid out: one region, two adjacent ones (buffers may cross the
/// boundary) or two with a hole between them.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Layout {
    One,
    Adjacent,
    Gap,
}

impl Layout {
    pub fn memory(self) -> GuestMemoryMmap {
        let ranges: &[(GuestAddress, usize)] = match self {
            Layout::One => &[(GuestAddress(0), REGION_A as usize)],
            Layout::Adjacent => &[
                (GuestAddress(0), REGION_A as usize),
                (GuestAddress(REGION_A), REGION_B as usize),
            ],
            Layout::Gap => &[
                (GuestAddress(0), REGION_A as usize),
                (GuestAddress(2 * REGION_A), REGION_B as usize),
            ],
        };
        GuestMemoryMmap::from_ranges(ranges).expect("guest memory")
    }
}

/// Bytes written into guest memory at `addr` (wherever it lands; outside memory is skipped).
#[derive(Arbitrary, Clone, Debug)]
pub struct Patch {
    pub addr: u32,
    pub bytes: Vec<u8>,
}

impl Patch {
    pub fn apply(&self, mem: &GuestMemoryMmap) {
        // Keep most patches inside the interesting range (two regions and the hole).
        let addr = u64::from(self.addr) % (3 * REGION_A);
        for (i, b) in self.bytes.iter().take(256).enumerate() {
            let _ = mem.write_obj(*b, GuestAddress(addr + i as u64));
        }
    }
}

/// The host ranges backing `mem`, as (start, end) addresses.
pub fn host_ranges(mem: &GuestMemoryMmap) -> Vec<(usize, usize)> {
    mem.iter()
        .map(|r| {
            let host = r
                .get_host_address(MemoryRegionAddress(0))
                .expect("host address") as usize;
            (host, host + r.len() as usize)
        })
        .collect()
}

/// True if the host range `[addr, addr + len)` lies inside one of `ranges`.
pub fn inside(ranges: &[(usize, usize)], addr: usize, len: usize) -> bool {
    ranges
        .iter()
        .any(|&(start, end)| addr >= start && addr.checked_add(len).is_some_and(|e| e <= end))
}

/// A ready queue of `size` (which virtio-queue may refuse: the queue is then left at its
/// maximum size) with its rings at the given addresses (misaligned ones are refused and left at
/// 0) and its positions at `next_avail`/`next_used`.
pub fn queue(
    size: u16,
    (desc, avail, used): (u64, u64, u64),
    event_idx: bool,
    next_avail: u16,
    next_used: u16,
) -> Queue {
    let mut q = Queue::new(32768).expect("queue");
    let _ = q.try_set_size(size);
    let _ = q.try_set_desc_table_address(GuestAddress(desc));
    let _ = q.try_set_avail_ring_address(GuestAddress(avail));
    let _ = q.try_set_used_ring_address(GuestAddress(used));
    q.set_event_idx(event_idx);
    q.set_ready(true);
    q.set_next_avail(next_avail);
    q.set_next_used(next_used);
    q
}

/// Ring placement of a driver-like queue of `size` (≤ 256) at `base`: descriptor table, avail
/// ring right after it, used ring after that (4-aligned); none overlapping.
pub fn driver_rings(base: u64, size: u16) -> (u64, u64, u64) {
    let n = u64::from(size);
    let desc = base;
    let avail = desc + 16 * n;
    let used = (avail + 6 + 2 * n + 3) & !3;
    (desc, avail, used)
}

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;

/// One segment of a driver-like chain.
#[derive(Arbitrary, Clone, Debug)]
pub struct Seg {
    /// Buffer offset (in the buffer area) and length.
    pub offset: u16,
    pub len: u16,
    /// Flips the direction flag of this descriptor (a driver bug).
    pub wrong_direction: bool,
}

/// One driver-like chain: direct descriptors, or an indirect table holding them.
#[derive(Arbitrary, Clone, Debug)]
pub struct ChainSpec {
    pub segs: Vec<Seg>,
    pub indirect: bool,
}

/// Writes chains the way a driver does: descriptors in the table (or in indirect tables in the
/// buffer area), heads in the avail ring, cycling through the chains over every avail slot, and
/// `avail.idx = next_avail + published`. Buffers live in `[buf_base, buf_base + buf_len)`.
/// Returns how many descriptors were used.
#[allow(clippy::too_many_arguments)]
pub fn write_driver_chains(
    mem: &GuestMemoryMmap,
    rings: (u64, u64, u64),
    size: u16,
    device_writes: bool,
    chains: &[ChainSpec],
    buf_base: u64,
    buf_len: u64,
    next_avail: u16,
    published: u16,
) {
    let (desc, avail, _) = rings;
    let dir = if device_writes { F_WRITE } else { 0 };
    let mut slot: u16 = 0;
    let mut heads = Vec::new();
    // Indirect tables go at the end of the buffer area, 16-aligned, growing down.
    let mut table_top = (buf_base + buf_len) & !15;
    let write_desc = |addr: u64, d: (u64, u32, u16, u16)| {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&d.0.to_le_bytes());
        raw[8..12].copy_from_slice(&d.1.to_le_bytes());
        raw[12..14].copy_from_slice(&d.2.to_le_bytes());
        raw[14..].copy_from_slice(&d.3.to_le_bytes());
        let _ = mem.write_slice(&raw, GuestAddress(addr));
    };
    for chain in chains.iter().take(usize::from(size)) {
        let segs: Vec<(u64, u32, u16)> = chain
            .segs
            .iter()
            .take(64)
            .map(|s| {
                let off = u64::from(s.offset) % buf_len.max(1);
                let len = u64::from(s.len).min(buf_len - off) as u32;
                let flags = if s.wrong_direction {
                    dir ^ F_WRITE
                } else {
                    dir
                };
                (buf_base + off, len, flags)
            })
            .collect();
        if segs.is_empty() {
            continue;
        }
        if chain.indirect {
            if slot >= size {
                break;
            }
            let table_len = 16 * segs.len() as u64;
            if table_len + 0x100 > table_top.saturating_sub(buf_base) {
                continue;
            }
            table_top -= table_len;
            for (i, &(addr, len, flags)) in segs.iter().enumerate() {
                let last = i + 1 == segs.len();
                let flags = if last { flags } else { flags | F_NEXT };
                write_desc(table_top + 16 * i as u64, (addr, len, flags, i as u16 + 1));
            }
            write_desc(
                desc + 16 * u64::from(slot),
                (table_top, table_len as u32, F_INDIRECT, 0),
            );
            heads.push(slot);
            slot += 1;
        } else {
            if usize::from(size - slot) < segs.len() {
                break;
            }
            let head = slot;
            for (i, &(addr, len, flags)) in segs.iter().enumerate() {
                let last = i + 1 == segs.len();
                let flags = if last { flags } else { flags | F_NEXT };
                write_desc(
                    desc + 16 * u64::from(slot),
                    (addr, len, flags, slot.wrapping_add(1)),
                );
                slot += 1;
            }
            heads.push(head);
        }
    }
    if heads.is_empty() {
        heads.push(0);
    }
    for i in 0..size {
        let entry = next_avail.wrapping_add(i) % size;
        let head = heads[usize::from(i) % heads.len()];
        let _ = mem.write_obj(head.to_le(), GuestAddress(avail + 4 + 2 * u64::from(entry)));
    }
    let _ = mem.write_obj(
        next_avail.wrapping_add(published).to_le(),
        GuestAddress(avail + 2),
    );
}

/// Reads a little-endian u16 of guest memory (0 outside it).
pub fn read_u16(mem: &GuestMemoryMmap, addr: u64) -> u16 {
    mem.read_obj::<u16>(GuestAddress(addr))
        .map(u16::from_le)
        .unwrap_or(0)
}

/// Sets a u16 of guest memory (little endian; nothing outside it).
pub fn write_u16(mem: &GuestMemoryMmap, addr: u64, value: u16) {
    let _ = mem.write_obj(value.to_le(), GuestAddress(addr));
}
