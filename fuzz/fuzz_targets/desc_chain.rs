//! Descriptor chain walking and the iovec builder (`devices::fuzzing::walk_avail`, which pops
//! every published head and walks its chain into one shared iovec list, as rx's pool does).
//!
//! Invariants:
//! - every iovec produced lies inside guest memory's host mapping;
//! - a successful walk's iovecs add up to the length it returned, which is ≤ the limit; a
//!   failed walk leaves the list as it was; the list's byte count is its entries' sum;
//! - each walk charges 1..=MAX_CHAIN_DESCRIPTORS+1 descriptors to the call's budget, and the
//!   call stops once the budget is spent;
//! - the outcome (success, total length and the iovecs, buffers that follow each other in
//!   host memory joined, or failure) matches a plain reference walker written over
//!   vm-memory's checked accessors;
//! - the whole call returns within 100 ms; no panic.
//!
//! The first input byte picks the ring (0: split): bit 0 a packed ring (`run_packed`, the
//! chains popped and walked one after the other from the ring's start), bit 1 IN_ORDER. On a
//! packed ring the input's descriptors fill the ring (flags with AVAIL/USED bits, `next` as the
//! buffer id), and a reference pop and walk over vm-memory's accessors must agree with each
//! pop (where the chain starts, its descriptors and id, or the ring error) and each walk, with
//! the same iovec and budget checks.

#![no_main]

mod common;

use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use devices::fuzzing::{
    run_packed, walk_avail, Direction, PackedLayout, PackedOp, CALL_DESCRIPTOR_BUDGET,
    MAX_CHAIN_DESCRIPTORS,
};
use devices::iovec::MAX_IOVECS;
use libfuzzer_sys::fuzz_target;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use common::*;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Addr {
    Near(u32),
    Far(u64),
}

impl Addr {
    fn get(self) -> u64 {
        match self {
            Addr::Near(a) => u64::from(a) % (3 * REGION_A),
            Addr::Far(a) => a,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Desc {
    addr: Addr,
    len: u32,
    flags: u16,
    next: u16,
}

/// The ring kind, from the input's first byte: bit 0 packed, bit 1 IN_ORDER.
#[derive(Debug)]
struct RingKind {
    packed: bool,
    in_order: bool,
}

impl<'a> Arbitrary<'a> for RingKind {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let kind = u8::arbitrary(u)?;
        Ok(RingKind {
            packed: kind & 1 != 0,
            in_order: kind & 2 != 0,
        })
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    ring: RingKind,
    layout: Layout,
    size_log2: u8,
    desc: u16,
    avail: u16,
    descs: Vec<Desc>,
    indirect: Vec<(u16, Vec<Desc>)>,
    heads: Vec<u16>,
    next_avail: u16,
    published: u16,
    device_writes: bool,
    limit: Option<u32>,
    patches: Vec<Patch>,
}

fn raw(d: &Desc) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&d.addr.get().to_le_bytes());
    r[8..12].copy_from_slice(&d.len.to_le_bytes());
    // Mostly the meaningful flags, sometimes anything.
    let flags = if d.flags & 0x8000 != 0 {
        d.flags
    } else {
        d.flags & 7
    };
    r[12..14].copy_from_slice(&flags.to_le_bytes());
    r[14..].copy_from_slice(&d.next.to_le_bytes());
    r
}

fuzz_target!(|input: Input| {
    let mem = input.layout.memory();
    if input.ring.packed {
        packed(&input, &mem);
        return;
    }
    let size = 1u16 << (input.size_log2 % 11);
    let n = u64::from(size);
    // Rings in the first region; the used ring at its end, clear of both (the table and avail
    // ring are placed below 0xa000).
    let desc = (u64::from(input.desc) % 0x4000) & !15;
    let avail = 0x4000 + ((u64::from(input.avail) % 0x2000) & !1);
    let used = REGION_A - (6 + 8 * n).div_ceil(4) * 4 - 8;
    for (i, d) in input.descs.iter().take(usize::from(size)).enumerate() {
        let _ = mem.write_slice(&raw(d), GuestAddress(desc + 16 * i as u64));
    }
    for (addr, table) in input.indirect.iter().take(8) {
        let base = u64::from(*addr) % (3 * REGION_A);
        for (i, d) in table.iter().take(256).enumerate() {
            let _ = mem.write_slice(&raw(d), GuestAddress(base + 16 * i as u64));
        }
    }
    for (i, h) in input.heads.iter().take(usize::from(size)).enumerate() {
        let slot = input.next_avail.wrapping_add(i as u16) % size;
        write_u16(&mem, avail + 4 + 2 * u64::from(slot), *h);
    }
    write_u16(
        &mem,
        avail + 2,
        input.next_avail.wrapping_add(input.published),
    );
    for p in input.patches.iter().take(32) {
        p.apply(&mem);
    }
    let q = queue(size, (desc, avail, used), false, input.next_avail, 0);
    let direction = if input.device_writes {
        Direction::DeviceWrites
    } else {
        Direction::DeviceReads
    };
    let limit = input.limit.unwrap_or(u32::MAX);

    let start = Instant::now();
    let report = walk_avail(&q, &mem, direction, limit, usize::MAX);
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_millis(100),
        "walk took {elapsed:?}"
    );
    let Ok(report) = report else {
        return;
    };

    let hosts = host_ranges(&mem);
    let mut charged = 0u32;
    let mut segs = 0usize;
    for chain in &report.chains {
        check_walk(chain.charged, &chain.iovecs, &hosts);
        assert!(
            charged < CALL_DESCRIPTOR_BUDGET,
            "walked past an exhausted budget"
        );
        charged += chain.charged;
        assert_eq!(chain.list_len.0, segs);
        let sum: usize = chain.iovecs.iter().map(|&(_, l)| l).sum();
        let expected = reference(&mem, &q, chain.head, input.device_writes, limit, segs);
        match &chain.result {
            Ok(total) => {
                assert_eq!(sum, *total as usize, "iovecs vs total");
                assert!(*total <= limit);
                assert_eq!(chain.list_len.1, segs + chain.iovecs.len());
                assert_eq!(
                    expected.map(|(t, ranges)| (t, merged(&ranges))),
                    Some((*total, chain.iovecs.clone())),
                    "reference disagrees on chain {}",
                    chain.head
                );
                segs = chain.list_len.1;
            }
            Err(e) => {
                assert!(chain.iovecs.is_empty());
                assert_eq!(
                    chain.list_len.1, chain.list_len.0,
                    "failed walk left entries"
                );
                assert_eq!(
                    expected, None,
                    "reference accepts chain {} refused with {e}",
                    chain.head
                );
            }
        }
    }
    assert_eq!(report.list_bytes, report.list_sum);
});

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

/// The host ranges (address, length) the guest range takes, one per memory region it
/// crosses, if it is entirely in guest memory.
fn segments(mem: &GuestMemoryMmap, addr: u64, len: u32) -> Option<Vec<(usize, usize)>> {
    let end = addr.checked_add(u64::from(len))?;
    let mut pieces = Vec::new();
    let mut at = addr;
    while at < end {
        let region = mem.find_region(GuestAddress(at))?;
        let region_end = region.start_addr().0 + region.len();
        let host = mem.get_host_address(GuestAddress(at)).ok()? as usize;
        pieces.push((host, (region_end.min(end) - at) as usize));
        at = region_end.min(end);
    }
    Some(pieces)
}

/// `ranges` with each range that starts where the one before it ends joined to it, as the
/// device joins a chain's buffers.
fn merged(ranges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &(addr, len) in ranges {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == addr => last.1 += len,
            _ => out.push((addr, len)),
        }
    }
    out
}

/// The spec's chain walk with this device's limits, over checked accessors: the chain's
/// total length and its buffers' host ranges, one per descriptor and region crossed (the
/// list's limit applies to those, `segs` entries being in it before), or `None` if it must be
/// refused.
fn reference(
    mem: &GuestMemoryMmap,
    q: &virtio_queue::Queue,
    head: u16,
    device_writes: bool,
    limit: u32,
    segs: usize,
) -> Option<(u32, Vec<(usize, usize)>)> {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let read = |addr: u64| -> Option<(u64, u32, u16, u16)> {
        let mut b = [0u8; 16];
        mem.read_slice(&mut b, GuestAddress(addr)).ok()?;
        Some((
            u64::from_le_bytes(b[..8].try_into().ok()?),
            u32::from_le_bytes(b[8..12].try_into().ok()?),
            u16::from_le_bytes(b[12..14].try_into().ok()?),
            u16::from_le_bytes(b[14..].try_into().ok()?),
        ))
    };
    let mut total = 0u32;
    let mut visited = 0u32;
    let push = |(addr, len, flags, _): (u64, u32, u16, u16),
                total: &mut u32,
                ranges: &mut Vec<(usize, usize)>|
     -> Option<()> {
        if (flags & WRITE != 0) != device_writes {
            return None;
        }
        *total = total.checked_add(len).filter(|t| *t <= limit)?;
        ranges.extend(segments(mem, addr, len)?);
        (segs + ranges.len() <= MAX_IOVECS).then_some(())
    };
    let size = q.size();
    let mut index = head;
    let mut ttl = size;
    loop {
        let d = read(q.desc_table() + 16 * u64::from(index))?;
        visited += 1;
        if visited > MAX_CHAIN_DESCRIPTORS {
            return None;
        }
        if d.2 & INDIRECT != 0 {
            let count = d.1 / 16;
            if d.1 % 16 != 0 || count == 0 || count > 65535 {
                return None;
            }
            // The table must lie inside one region.
            let region = mem.find_region(GuestAddress(d.0))?;
            let off = d.0 - region.start_addr().0;
            if u64::from(d.1) > region.len() - off {
                return None;
            }
            let mut i = 0u32;
            let mut ttl = count;
            loop {
                let e = read(d.0 + 16 * u64::from(i))?;
                visited += 1;
                if visited > MAX_CHAIN_DESCRIPTORS || e.2 & INDIRECT != 0 {
                    return None;
                }
                push(e, &mut total, &mut ranges)?;
                if e.2 & NEXT == 0 {
                    return Some((total, ranges));
                }
                ttl -= 1;
                i = u32::from(e.3);
                if ttl == 0 || i >= count {
                    return None;
                }
            }
        }
        push(d, &mut total, &mut ranges)?;
        if d.2 & NEXT == 0 {
            return Some((total, ranges));
        }
        ttl -= 1;
        index = d.3;
        if ttl == 0 || index >= size {
            return None;
        }
    }
}

/// A packed descriptor: mostly the meaningful flags (NEXT, WRITE, INDIRECT, AVAIL, USED),
/// sometimes anything; `next` is the buffer id.
fn raw_packed(d: &Desc) -> [u8; 16] {
    let mut r = raw(d);
    let flags = if d.flags & 0x4000 != 0 {
        d.flags
    } else {
        d.flags & 0x8087
    };
    r[12..14].copy_from_slice(&d.next.to_le_bytes());
    r[14..].copy_from_slice(&flags.to_le_bytes());
    r
}

/// The packed path: the ring filled with the input's descriptors, every chain popped and
/// walked from the start, each checked against [`reference_pop`] and [`reference_packed`].
fn packed(input: &Input, mem: &GuestMemoryMmap) {
    let size = if input.size_log2 & 0x80 != 0 {
        1u16 << (input.size_log2 % 11)
    } else {
        u16::from(input.size_log2 % 64) + 1
    };
    let layout = PackedLayout {
        size,
        desc: (u64::from(input.desc) % 0x4000) & !15,
        driver_event: 0x4000 + ((u64::from(input.avail) % 0x2000) & !3),
        device_event: REGION_A - 8,
    };
    for (i, d) in input.descs.iter().take(usize::from(size)).enumerate() {
        let _ = mem.write_slice(&raw_packed(d), GuestAddress(layout.desc + 16 * i as u64));
    }
    for (addr, table) in input.indirect.iter().take(8) {
        let base = u64::from(*addr) % (3 * REGION_A);
        for (i, d) in table.iter().take(256).enumerate() {
            let _ = mem.write_slice(&raw_packed(d), GuestAddress(base + 16 * i as u64));
        }
    }
    for p in input.patches.iter().take(32) {
        p.apply(mem);
    }
    let features = u64::from(input.ring.in_order) << 35;
    let limit = input.limit.unwrap_or(u32::MAX);
    let ops = vec![
        PackedOp::Pop {
            writes: input.device_writes,
            limit,
        };
        usize::from(size) + 1
    ];
    let start = Instant::now();
    let result = run_packed(mem, &layout, features, &ops, |_| {});
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_millis(100), "run took {elapsed:?}");
    let Ok((steps, ring_error)) = result else {
        return;
    };
    // Pops write nothing: memory is what every pop and walk read.
    let hosts = host_ranges(mem);
    let mut at = (0u16, true);
    let mut room = u32::from(size);
    for step in &steps {
        let expected = reference_pop(mem, &layout, at, room);
        let Some(chain) = step.popped.first() else {
            assert_eq!(expected, Ok(None), "pop found nothing at {at:?}");
            continue;
        };
        assert_eq!(
            expected,
            Ok(Some((chain.descriptors, chain.id))),
            "pop at {at:?}"
        );
        assert_eq!((chain.start.offset, chain.start.wrap), at);
        check_walk(chain.charged, &chain.iovecs, &hosts);
        let walked = reference_packed(
            mem,
            &layout,
            at,
            chain.descriptors,
            input.device_writes,
            limit,
        );
        match &chain.result {
            Ok(total) => {
                let sum: usize = chain.iovecs.iter().map(|&(_, l)| l).sum();
                assert_eq!(sum, *total as usize, "iovecs vs total");
                assert!(*total <= limit);
                assert_eq!(
                    walked.map(|(t, ranges)| (t, merged(&ranges))),
                    Some((*total, chain.iovecs.clone())),
                    "reference disagrees on the chain at {at:?}"
                );
            }
            Err(e) => {
                assert!(chain.iovecs.is_empty());
                assert_eq!(
                    walked, None,
                    "reference accepts the chain at {at:?} refused with {e}"
                );
            }
        }
        at = advance(at, chain.descriptors, size);
        room -= u32::from(chain.descriptors);
    }
    if ring_error.is_some() {
        assert!(
            reference_pop(mem, &layout, at, room).is_err(),
            "ring error {ring_error:?} at {at:?}"
        );
    }
}

/// The spec's pop with this device's limits: at `at` with `room` descriptors free, the next
/// chain's ring descriptors and buffer id (that of its last descriptor), none when the
/// descriptor there is not available, or an error for a chain that cannot be returned (NEXT
/// running past the room or MAX_CHAIN_DESCRIPTORS, an id not below the size).
fn reference_pop(
    mem: &GuestMemoryMmap,
    layout: &PackedLayout,
    at: (u16, bool),
    room: u32,
) -> Result<Option<(u16, u16)>, ()> {
    let flags = |offset: u16| read_u16(mem, layout.desc + 16 * u64::from(offset) + 14);
    let head = flags(at.0);
    let available = (head & DESC_F_AVAIL != 0) == at.1 && (head & DESC_F_USED != 0) != at.1;
    if room == 0 || !available {
        return Ok(None);
    }
    let mut offset = at.0;
    let mut descs = 1u32;
    while flags(offset) & NEXT != 0 {
        if descs == room.min(MAX_CHAIN_DESCRIPTORS) {
            return Err(());
        }
        offset = (offset + 1) % layout.size;
        descs += 1;
    }
    let id = read_u16(mem, layout.desc + 16 * u64::from(offset) + 12);
    if id >= layout.size {
        return Err(());
    }
    Ok(Some((descs as u16, id)))
}

/// The spec's packed chain walk with this device's limits, over checked accessors: the
/// chain's `descs` ring descriptors from `at`, or the table its lone INDIRECT descriptor
/// points to (a whole, non-zero number of entries inside one region, none INDIRECT, NEXT
/// ignored); the total length and the buffers' host ranges, or `None` if it must be refused.
fn reference_packed(
    mem: &GuestMemoryMmap,
    layout: &PackedLayout,
    at: (u16, bool),
    descs: u16,
    device_writes: bool,
    limit: u32,
) -> Option<(u32, Vec<(usize, usize)>)> {
    let read = |addr: u64| -> Option<(u64, u32, u16)> {
        let mut b = [0u8; 16];
        mem.read_slice(&mut b, GuestAddress(addr)).ok()?;
        Some((
            u64::from_le_bytes(b[..8].try_into().ok()?),
            u32::from_le_bytes(b[8..12].try_into().ok()?),
            u16::from_le_bytes(b[14..].try_into().ok()?),
        ))
    };
    let mut total = 0u32;
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut push = |(addr, len, flags): (u64, u32, u16)| -> Option<()> {
        if (flags & WRITE != 0) != device_writes {
            return None;
        }
        total = total.checked_add(len).filter(|t| *t <= limit)?;
        ranges.extend(segments(mem, addr, len)?);
        (ranges.len() <= MAX_IOVECS).then_some(())
    };
    let mut offset = at.0;
    for i in 0..descs {
        if i > 0 {
            offset = (offset + 1) % layout.size;
        }
        let d = read(layout.desc + 16 * u64::from(offset))?;
        if d.2 & INDIRECT != 0 {
            let count = d.1 / 16;
            if descs != 1 || d.1 % 16 != 0 || count == 0 || count > MAX_CHAIN_DESCRIPTORS - 1 {
                return None;
            }
            let region = mem.find_region(GuestAddress(d.0))?;
            let off = d.0 - region.start_addr().0;
            if u64::from(d.1) > region.len() - off {
                return None;
            }
            for e in 0..u64::from(count) {
                let e = read(d.0 + 16 * e)?;
                if e.2 & INDIRECT != 0 {
                    return None;
                }
                push(e)?;
            }
            return Some((total, ranges));
        }
        push(d)?;
    }
    Some((total, ranges))
}
