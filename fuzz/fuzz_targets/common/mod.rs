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

impl ChainSpec {
    /// The chain's buffers (at most 64) inside `[buf_base, buf_base + buf_len)`, as
    /// (address, length, flags): `dir` (0 or F_WRITE), the other way for a wrong-direction one.
    pub fn buffers(&self, buf_base: u64, buf_len: u64, dir: u16) -> Vec<(u64, u32, u16)> {
        self.segs
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
            .collect()
    }
}

/// One chain walk's bounds: it charged 1..=MAX_CHAIN_DESCRIPTORS + 1 descriptors to the call's
/// budget, and every iovec it made is non-empty and inside guest memory (`hosts`).
pub fn check_walk(charged: u32, iovecs: &[(usize, usize)], hosts: &[(usize, usize)]) {
    assert!(
        (1..=devices::fuzzing::MAX_CHAIN_DESCRIPTORS + 1).contains(&charged),
        "charged {charged}"
    );
    for &(addr, len) in iovecs {
        assert!(len > 0, "empty iovec");
        assert!(inside(hosts, addr, len), "iovec outside guest memory");
    }
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
    for chain in chains.iter().take(usize::from(size)) {
        let segs = chain.buffers(buf_base, buf_len, dir);
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
                write_desc(
                    mem,
                    table_top + 16 * i as u64,
                    (addr, len, flags, i as u16 + 1),
                );
            }
            write_desc(
                mem,
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
                    mem,
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

impl Patch {
    /// The guest range `[start, end)` the patch writes (where memory exists).
    pub fn range(&self) -> (u64, u64) {
        let addr = u64::from(self.addr) % (3 * REGION_A);
        (addr, addr + self.bytes.len().min(256) as u64)
    }

    /// True if the patch writes any byte of `[start, start + len)`.
    pub fn touches(&self, start: u64, len: u64) -> bool {
        let (a, b) = self.range();
        a < start + len && start < b
    }
}

/// Packed descriptor flags: the available and used bits.
pub const P_AVAIL: u16 = 1 << 7;
pub const P_USED: u16 = 1 << 15;

/// The AVAIL/USED bits that make a packed descriptor available for wrap counter `wrap`.
pub fn avail_bits(wrap: bool) -> u16 {
    if wrap {
        P_AVAIL
    } else {
        P_USED
    }
}

/// A packed ring position (offset, wrap counter) `n` (≤ size) descriptors further.
pub fn advance(pos: (u16, bool), n: u16, size: u16) -> (u16, bool) {
    let next = u32::from(pos.0) + u32::from(n);
    if next >= u32::from(size) {
        ((next - u32::from(size)) as u16, !pos.1)
    } else {
        (next as u16, pos.1)
    }
}

/// Ring descriptors from `from` forward to `to` (modulo two laps).
pub fn distance(from: (u16, bool), to: (u16, bool), size: u16) -> u32 {
    let linear = |p: (u16, bool)| u32::from(p.0) + if p.1 { 0 } else { u32::from(size) };
    (linear(to) + 2 * u32::from(size) - linear(from)) % (2 * u32::from(size))
}

/// Writes a raw 16-byte descriptor (address, length, next or id, flags) at `at`.
pub fn write_desc(mem: &GuestMemoryMmap, at: u64, d: (u64, u32, u16, u16)) {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&d.0.to_le_bytes());
    raw[8..12].copy_from_slice(&d.1.to_le_bytes());
    raw[12..14].copy_from_slice(&d.2.to_le_bytes());
    raw[14..].copy_from_slice(&d.3.to_le_bytes());
    let _ = mem.write_slice(&raw, GuestAddress(at));
}

/// A chain the packed driver makes available: direct buffers, or one descriptor pointing to
/// an indirect table.
#[derive(Clone, Debug)]
enum PackedChainSpec {
    Direct(Vec<(u64, u32, u16)>),
    Indirect(u64, u32),
}

/// The driver's side of a packed ring, as a well-behaved driver runs it: chains made available
/// from its position with the AVAIL/USED bits of its wrap counter (the head's flags written
/// last), fresh buffer ids below the size, never more descriptors outstanding than the ring
/// holds; used descriptors read back at its used position (with IN_ORDER one may return every
/// chain up to its id).
pub struct PackedDriver {
    pub desc: u64,
    pub size: u16,
    chains: Vec<PackedChainSpec>,
    next_chain: usize,
    pub avail: (u16, bool),
    pub used: (u16, bool),
    /// (id, ring descriptors) of the chains made available and not seen used, in order.
    pub in_flight: std::collections::VecDeque<(u16, u16)>,
    free_ids: std::collections::VecDeque<u16>,
}

impl PackedDriver {
    /// A driver of the ring of `size` at `desc`, cycling through `specs` (buffers in
    /// `[buf_base, buf_base + buf_len)`, indirect tables at the end of that area).
    pub fn new(
        mem: &GuestMemoryMmap,
        desc: u64,
        size: u16,
        device_writes: bool,
        specs: &[ChainSpec],
        buf_base: u64,
        buf_len: u64,
    ) -> PackedDriver {
        let dir = if device_writes { F_WRITE } else { 0 };
        let mut table_top = (buf_base + buf_len) & !15;
        let mut chains = Vec::new();
        for spec in specs.iter().take(64) {
            let segs = spec.buffers(buf_base, buf_len, dir);
            if segs.is_empty() {
                continue;
            }
            let table_len = 16 * segs.len() as u64;
            if spec.indirect && table_len + 0x100 <= table_top.saturating_sub(buf_base) {
                table_top -= table_len;
                for (i, &(addr, len, flags)) in segs.iter().enumerate() {
                    // NEXT inside a packed table is reserved: set on all but the last, as
                    // a split-minded driver would.
                    let next = if i + 1 < segs.len() { F_NEXT } else { 0 };
                    write_desc(mem, table_top + 16 * i as u64, (addr, len, 0, flags | next));
                }
                chains.push(PackedChainSpec::Indirect(table_top, table_len as u32));
            } else if segs.len() <= usize::from(size) {
                chains.push(PackedChainSpec::Direct(segs));
            }
        }
        PackedDriver {
            desc,
            size,
            chains,
            next_chain: 0,
            avail: (0, true),
            used: (0, true),
            in_flight: Default::default(),
            free_ids: (0..size).collect(),
        }
    }

    /// Ring descriptors made available and not seen used.
    pub fn outstanding(&self) -> u32 {
        self.in_flight.iter().map(|&(_, d)| u32::from(d)).sum()
    }

    /// Makes up to `n` more chains available (fewer when the ring is full); returns how many.
    pub fn publish(&mut self, mem: &GuestMemoryMmap, n: u16) -> u16 {
        let mut done = 0;
        while done < n && !self.chains.is_empty() {
            let chain = &self.chains[self.next_chain % self.chains.len()];
            let descs: Vec<(u64, u32, u16)> = match chain {
                PackedChainSpec::Direct(segs) => segs.clone(),
                PackedChainSpec::Indirect(table, len) => vec![(*table, *len, F_INDIRECT)],
            };
            let room = u32::from(self.size) - self.outstanding();
            if descs.len() as u32 > room {
                break;
            }
            let Some(id) = self.free_ids.pop_front() else {
                break;
            };
            let start = self.avail;
            let mut head_flags = 0;
            for (i, &(addr, len, flags)) in descs.iter().enumerate() {
                let next = if i + 1 < descs.len() { F_NEXT } else { 0 };
                let flags = flags | next | avail_bits(self.avail.1);
                let at = self.desc + 16 * u64::from(self.avail.0);
                if i == 0 {
                    // The head's flags go last: the chain is not available before it is whole.
                    head_flags = flags;
                    let old = read_u16(mem, at + 14);
                    write_desc(mem, at, (addr, len, id, old));
                } else {
                    write_desc(mem, at, (addr, len, id, flags));
                }
                self.avail = advance(self.avail, 1, self.size);
            }
            write_u16(mem, self.desc + 16 * u64::from(start.0) + 14, head_flags);
            self.in_flight.push_back((id, descs.len() as u16));
            self.next_chain += 1;
            done += 1;
        }
        done
    }

    /// Reads back every used descriptor the device wrote at the driver's used position, freeing
    /// their chains (with `in_order`, every chain up to the id); an id the driver does not have
    /// in flight is an error. Returns how many chains came back.
    pub fn reap(&mut self, mem: &GuestMemoryMmap, in_order: bool) -> Result<usize, String> {
        let mut chains = 0;
        while !self.in_flight.is_empty() {
            let at = self.desc + 16 * u64::from(self.used.0);
            let flags = read_u16(mem, at + 14);
            let wrap = self.used.1;
            if (flags & P_AVAIL != 0) != wrap || (flags & P_USED != 0) != wrap {
                break;
            }
            let id = read_u16(mem, at + 12);
            let descs: u32 = if in_order {
                let Some(n) = self.in_flight.iter().position(|&(i, _)| i == id) else {
                    return Err(format!("used id {id} at {:?} not in flight", self.used));
                };
                let gone: Vec<_> = self.in_flight.drain(..=n).collect();
                chains += gone.len();
                self.free_ids.extend(gone.iter().map(|&(i, _)| i));
                gone.iter().map(|&(_, d)| u32::from(d)).sum()
            } else {
                let Some(n) = self.in_flight.iter().position(|&(i, _)| i == id) else {
                    return Err(format!("used id {id} at {:?} not in flight", self.used));
                };
                let (i, d) = self.in_flight.remove(n).expect("in flight");
                chains += 1;
                self.free_ids.push_back(i);
                u32::from(d)
            };
            // At most the ring's worth is outstanding.
            self.used = advance(self.used, descs as u16, self.size);
        }
        Ok(chains)
    }
}
