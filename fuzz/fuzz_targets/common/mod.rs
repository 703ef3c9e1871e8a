//! Shared by the device fuzz targets: guest memory layouts, memory patches, queue building and
//! the driver-like rings, written from fuzzed chain specs through the `devices` crate's test
//! driver rings ([`GuestQueue`], [`GuestPackedQueue`]).

#![allow(dead_code, unused_imports)] // each target uses a different part

use arbitrary::Arbitrary;
use devices::test_utils::queue::{GuestQueue, INDIRECT, NEXT, WRITE};
use devices::virtio::packed::PackedLayout;
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

pub use devices::test_utils::packed::{advance, distance, GuestPackedQueue};
pub use devices::test_utils::queue::split_rings as driver_rings;
pub use devices::virtio::packed::{DESC_F_AVAIL, DESC_F_USED};

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
    /// (address, length, flags): `dir` (0 or WRITE), the other way for a wrong-direction one.
    pub fn buffers(&self, buf_base: u64, buf_len: u64, dir: u16) -> Vec<(u64, u32, u16)> {
        self.segs
            .iter()
            .take(64)
            .map(|s| {
                let off = u64::from(s.offset) % buf_len.max(1);
                let len = u64::from(s.len).min(buf_len - off) as u32;
                let flags = if s.wrong_direction { dir ^ WRITE } else { dir };
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
    // Over the rings as they are: patches written before stay.
    let mut q = GuestQueue::over_rings(mem, size, rings, buf_base);
    let dir = if device_writes { WRITE } else { 0 };
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
            heads.push(q.write_indirect(table_top, &segs));
            slot += 1;
        } else {
            if usize::from(size - slot) < segs.len() {
                break;
            }
            heads.push(q.write_chain(&segs));
            slot += segs.len() as u16;
        }
    }
    if heads.is_empty() {
        heads.push(0);
    }
    q.set_avail_idx(next_avail);
    q.publish_all((0..usize::from(size)).map(|i| heads[i % heads.len()]));
    q.set_avail_idx(next_avail.wrapping_add(published));
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

/// The driver's side of a packed ring, as a well-behaved driver runs it
/// ([`GuestPackedQueue::try_add_chain`]): chains made available from its position with the
/// AVAIL/USED bits of its wrap counter (the head's flags written last), fresh buffer ids below
/// the size, never more descriptors outstanding than the ring holds; used descriptors read
/// back at its used position (with IN_ORDER one may return every chain up to its id).
pub struct PackedDriver {
    pub q: GuestPackedQueue,
    /// The chains it cycles through: direct buffers, or one descriptor pointing to an
    /// indirect table.
    chains: Vec<Vec<(u64, u32, u16)>>,
    next_chain: usize,
}

impl PackedDriver {
    /// A driver of the ring laid out as `layout` (taken over as it is in memory), cycling
    /// through `specs` (buffers in `[buf_base, buf_base + buf_len)`, indirect tables at the end
    /// of that area).
    pub fn new(
        mem: &GuestMemoryMmap,
        layout: PackedLayout,
        device_writes: bool,
        specs: &[ChainSpec],
        buf_base: u64,
        buf_len: u64,
    ) -> PackedDriver {
        let q = GuestPackedQueue::over_layout(mem, layout);
        let dir = if device_writes { WRITE } else { 0 };
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
                // NEXT inside a packed table is reserved: set on all but the last, as a
                // split-minded driver would.
                let entries: Vec<_> = (1..=segs.len())
                    .zip(&segs)
                    .map(|(i, &(addr, len, flags))| {
                        let next = if i < segs.len() { NEXT } else { 0 };
                        (addr, len, flags | next)
                    })
                    .collect();
                q.write_table_at(table_top, &entries);
                chains.push(vec![(table_top, table_len as u32, INDIRECT)]);
            } else if segs.len() <= usize::from(layout.size) {
                chains.push(segs);
            }
        }
        PackedDriver {
            q,
            chains,
            next_chain: 0,
        }
    }

    /// Where the driver expects the next used descriptor.
    pub fn used(&self) -> (u16, bool) {
        self.q.used_position()
    }

    /// Makes up to `n` more chains available (fewer when the ring is full); returns how many.
    pub fn publish(&mut self, n: u16) -> u16 {
        let mut done = 0;
        while done < n && !self.chains.is_empty() {
            let chain = &self.chains[self.next_chain % self.chains.len()];
            if self.q.try_add_chain(chain).is_none() {
                break;
            }
            self.next_chain += 1;
            done += 1;
        }
        done
    }

    /// Reads back every used descriptor the device wrote at the driver's used position, freeing
    /// their chains (with `in_order`, every chain up to the id); an id the driver does not have
    /// in flight is an error. Returns how many chains came back.
    pub fn reap(&mut self, in_order: bool) -> Result<usize, String> {
        let mut chains = 0;
        while !self.q.in_flight().is_empty() {
            match self.q.try_take_used(in_order) {
                Ok(Some((_, n))) => chains += n,
                Ok(None) => break,
                Err(id) => {
                    let at = self.q.used_position();
                    return Err(format!("used id {id} at {at:?} not in flight"));
                }
            }
        }
        Ok(chains)
    }
}
