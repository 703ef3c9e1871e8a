//! The packed ring against the driver-side writer in `test_utils::packed`: round trips over
//! several wraps, chains across the ring's end, indirect tables, IN_ORDER batches, every hostile
//! layout and chain, and both directions of event suppression at the wrap.

use std::collections::{BTreeSet, VecDeque};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::iovec::IovecList;
use crate::test_utils::packed::{guest_mem, GuestPackedQueue, Used, INDIRECT, MEM_SIZE, NEXT};
use crate::virtio::chain::{ChainError, Direction};
use crate::virtio::vring::WalkBudget;

const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
const IN_ORDER: u64 = 1 << VIRTIO_F_IN_ORDER;

fn device(driver: &GuestPackedQueue, features: u64) -> PackedVirtqueue {
    PackedVirtqueue::new(driver.mem(), &driver.layout(), features).expect("usable ring")
}

/// A packed queue of `size` in fresh guest memory: the driver's side and the device's ring
/// over it with `features`.
fn queue(size: u16, features: u64) -> (GuestPackedQueue, PackedVirtqueue) {
    let driver = GuestPackedQueue::new(&guest_mem(), size);
    let vq = device(&driver, features);
    (driver, vq)
}

fn pos(offset: u16, wrap: bool) -> Position {
    Position { offset, wrap }
}

fn driver_used(driver: &GuestPackedQueue) -> Position {
    let (offset, wrap) = driver.used_position();
    pos(offset, wrap)
}

fn driver_avail(driver: &GuestPackedQueue) -> Position {
    let (offset, wrap) = driver.avail_position();
    pos(offset, wrap)
}

/// Walks `head` device-readable, without a length limit, into `iovs`.
fn walk_reads<'g>(
    ring: &RingOps<'_>,
    guest: &GuestView<'g>,
    head: &ChainHead,
    iovs: &mut IovecList<'g>,
    budget: &mut WalkBudget,
) -> Result<u32, ChainError> {
    ring.walk_chain(guest, head, Direction::DeviceReads, u32::MAX, iovs, budget)
}

/// Pops one chain and walks it device-readable: the head and its bytes.
fn pop_read(vq: &mut PackedVirtqueue) -> Option<(ChainHead, Vec<u8>)> {
    let (guest, mut ring) = vq.split();
    let head = ring.pop_head().expect("no ring error")?;
    let mut iovs = IovecList::new();
    walk_reads(&ring, &guest, &head, &mut iovs, &mut WalkBudget::per_call())
        .expect("well-formed chain");
    let mut bytes = vec![0; iovs.total_bytes()];
    assert!(iovs.as_iovecs().read_at(0, &mut bytes));
    Some((head, bytes))
}

/// Pops one chain and walks it in `direction` (limit `limit`): the head and the walk's result.
fn pop_walk(
    vq: &mut PackedVirtqueue,
    direction: Direction,
    limit: u32,
) -> (ChainHead, Result<u32, ChainError>) {
    let (guest, mut ring) = vq.split();
    let head = ring.pop_head().expect("no ring error").expect("a chain");
    let mut iovs = IovecList::new();
    let mut budget = WalkBudget::per_call();
    let result = ring.walk_chain(&guest, &head, direction, limit, &mut iovs, &mut budget);
    if result.is_err() {
        assert!(iovs.is_empty(), "a refused chain leaves the list as it was");
    }
    (head, result)
}

/// Pops one chain and walks it control-style: the head and the walk's result.
fn pop_walk_split(vq: &mut PackedVirtqueue) -> (ChainHead, Result<(u32, u32), ChainError>) {
    let (guest, mut ring) = vq.split();
    let head = ring.pop_head().expect("no ring error").expect("a chain");
    let (mut readable, mut writable) = (IovecList::new(), IovecList::new());
    let mut budget = WalkBudget::per_call();
    let result = ring.walk_chain_split(
        &guest,
        &head,
        u32::MAX,
        &mut readable,
        &mut writable,
        &mut budget,
    );
    (head, result)
}

fn pop_error(vq: &mut PackedVirtqueue) -> PackedRingError {
    let before = (vq.next_avail(), vq.in_flight());
    let err = vq.split().1.pop_head().expect_err("a ring error");
    assert_eq!(
        (vq.next_avail(), vq.in_flight()),
        before,
        "a refused pop moves nothing"
    );
    err
}

fn add_used(vq: &mut PackedVirtqueue, head: ChainHead, len: u32) {
    let (_, mut ring) = vq.split();
    ring.add_used(head, len);
    ring.publish_used();
}

fn decide(vq: &mut PackedVirtqueue) -> Option<InterruptDecision> {
    vq.split().1.interrupt_decision()
}

fn expected_used_flags(wrap: bool, len: u32) -> u16 {
    let bits = if wrap { DESC_F_AVAIL | DESC_F_USED } else { 0 };
    bits | if len > 0 { WRITE } else { 0 }
}

// ---- construction ----

fn layout(size: u16, desc: u64, driver_event: u64, device_event: u64) -> PackedLayout {
    PackedLayout {
        size,
        desc,
        driver_event,
        device_event,
    }
}

fn refused(mem: &GuestMemoryMmap, layout: PackedLayout) -> PackedRingError {
    PackedVirtqueue::new(mem, &layout, 0).expect_err("a refused layout")
}

#[test]
fn any_size_from_1_to_32768_is_accepted() {
    let mem = guest_mem();
    for size in [1, 2, 3, 5, 255, 256, 1000, 32768] {
        let (_driver, vq) = queue(size, EVENT_IDX | IN_ORDER);
        assert_eq!(vq.size(), size);
        assert!(vq.event_idx() && vq.in_order());
        assert_eq!(
            vq.next_avail(),
            pos(0, true),
            "the avail wrap counter starts at 1"
        );
        assert_eq!(
            vq.next_used(),
            pos(0, true),
            "the used wrap counter starts at 1"
        );
        assert!(!vq.avail_pending());
    }
    for size in [0, 32769, u16::MAX] {
        assert!(matches!(
            refused(&mem, layout(size, 0, 0x90000, 0x90004)),
            PackedRingError::InvalidSize(s) if s == size
        ));
    }
}

#[test]
fn misaligned_parts_are_refused() {
    let mem = guest_mem();
    let cases = [
        (layout(4, 8, 0x1000, 0x1004), PackedPart::DescRing),
        (layout(4, 0, 0x1002, 0x1004), PackedPart::DriverEvent),
        (layout(4, 0, 0x1000, 0x1006), PackedPart::DeviceEvent),
    ];
    for (l, part) in cases {
        assert!(
            matches!(refused(&mem, l), PackedRingError::Misaligned(p) if p == part),
            "{part}"
        );
    }
}

#[test]
fn parts_outside_guest_memory_are_refused() {
    let mem = guest_mem();
    let cases = [
        (
            layout(2, MEM_SIZE - 16, 0x1000, 0x1004),
            PackedPart::DescRing,
        ),
        (
            layout(2, u64::MAX - 15, 0x1000, 0x1004),
            PackedPart::DescRing,
        ),
        (layout(2, 0, MEM_SIZE, 0x1004), PackedPart::DriverEvent),
        (layout(2, 0, u64::MAX - 3, 0x1004), PackedPart::DriverEvent),
        (layout(2, 0, 0x1000, MEM_SIZE), PackedPart::DeviceEvent),
        (layout(2, 0, 0x1000, u64::MAX - 3), PackedPart::DeviceEvent),
    ];
    for (l, part) in cases {
        assert!(
            matches!(refused(&mem, l), PackedRingError::OutsideMemory(p) if p == part),
            "{l:?}"
        );
    }
    // A ring across two regions is refused too (each part must lie inside one).
    let two =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1000)])
            .expect("guest memory");
    assert!(matches!(
        refused(&two, layout(2, 0xff0, 0x1800, 0x1804)),
        PackedRingError::OutsideMemory(PackedPart::DescRing)
    ));
}

#[test]
fn overlapping_parts_are_refused() {
    let mem = guest_mem();
    let overlap = |l| match refused(&mem, l) {
        PackedRingError::Overlap { written, other } => (written, other),
        e => panic!("not an overlap: {e}"),
    };
    use PackedPart::*;
    // 4 descriptors: the ring is [0, 64).
    assert_eq!(overlap(layout(4, 0, 60, 0x100)), (DescRing, DriverEvent));
    assert_eq!(overlap(layout(4, 0, 0x100, 0)), (DeviceEvent, DescRing));
    assert_eq!(
        overlap(layout(4, 0x40, 0x100, 0x7c)),
        (DeviceEvent, DescRing)
    );
    assert_eq!(
        overlap(layout(4, 0, 0x100, 0x100)),
        (DeviceEvent, DriverEvent)
    );
    // Touching is not overlapping.
    PackedVirtqueue::new(&mem, &layout(4, 0, 64, 68), 0).expect("adjacent parts");
    PackedVirtqueue::new(&mem, &layout(4, 8 + 0x100 - 8, 0xfc, 0xf8), 0).expect("adjacent parts");
}

// ---- pop / walk / used round trips ----

/// Fills the ring with readable chains of 1..=3 descriptors, pops and checks them, completes
/// them (in reverse order every other round: each used descriptor advances by its own chain),
/// and checks what the driver reads back, until the positions have wrapped several times.
fn round_trips(size: u16) {
    let (mut driver, mut vq) = queue(size, 0);
    let mut seq = 0u32;
    let mut done = 0u32;
    let mut round = 0;
    let mut wraps_seen = BTreeSet::new();
    while done < 5 * u32::from(size) + 7 {
        let mut expected = VecDeque::new();
        loop {
            let n = (seq % 3 + 1).min(u32::from(size)) as u16;
            if driver.outstanding() + u32::from(n) > u32::from(size) {
                break;
            }
            let parts: Vec<Vec<u8>> = (0..n)
                .map(|k| vec![(seq as u8) ^ (k as u8); 1 + (seq as usize + usize::from(k)) % 7])
                .collect();
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            let id = driver.push_readable(&refs);
            expected.push_back((id, n, parts.concat()));
            seq += 1;
        }
        assert!(vq.avail_pending());
        let mut heads = Vec::new();
        while let Some((head, bytes)) = pop_read(&mut vq) {
            let (id, n, data) = expected
                .pop_front()
                .expect("no more chains than made available");
            assert_eq!((head.id(), head.descriptors(), bytes), (id, n, data));
            heads.push(head);
        }
        assert!(expected.is_empty(), "every chain made available was popped");
        assert!(!vq.avail_pending());
        assert_eq!(vq.next_avail(), driver_avail(&driver));
        assert_eq!(vq.in_flight(), driver.outstanding());
        if round % 2 == 1 {
            heads.reverse();
        }
        let (_, mut ring) = vq.split();
        let mut writes = Vec::new();
        for head in &heads {
            let len = u32::from(head.id()) * 3 % 5;
            writes.push((head.id(), len));
            ring.add_used(*head, len);
            done += u32::from(head.descriptors());
        }
        ring.publish_used();
        for (id, len) in writes {
            let wrap = driver.used_position().1;
            wraps_seen.insert(wrap);
            let used = driver.take_used().expect("a used descriptor");
            assert_eq!(
                used,
                Used {
                    id,
                    len,
                    flags: expected_used_flags(wrap, len)
                }
            );
        }
        assert_eq!(driver.take_used(), None);
        assert_eq!(vq.next_used(), driver_used(&driver));
        assert_eq!(vq.in_flight(), 0);
        round += 1;
    }
    assert_eq!(
        wraps_seen.len(),
        2,
        "both used wrap counter values were written"
    );
}

#[test]
fn round_trips_size_1() {
    round_trips(1);
}

#[test]
fn round_trips_size_3() {
    round_trips(3);
}

#[test]
fn round_trips_size_256() {
    round_trips(256);
}

#[test]
fn a_chain_wraps_around_the_end_of_the_ring() {
    let (mut driver, mut vq) = queue(3, 0);
    driver.push_readable(&[b"x", b"y"]);
    let (head, _) = pop_read(&mut vq).expect("a chain");
    add_used(&mut vq, head, 0);
    driver.take_used().expect("used");
    assert_eq!(vq.next_avail(), pos(2, true));

    // Three descriptors from offset 2: 2, then 0 and 1 after the wrap; the id is the last's.
    let a = driver.alloc(b"abc");
    let b = driver.alloc(b"de");
    let c = driver.alloc(b"f");
    driver.write_raw(&[(a, 3, 0, NEXT), (b, 2, 1, NEXT), (c, 1, 2, 0)]);
    let (head, bytes) = pop_read(&mut vq).expect("a chain");
    assert_eq!(bytes, b"abcdef");
    assert_eq!(
        (head.id(), head.descriptors(), head.start()),
        (2, 3, pos(2, true))
    );
    assert_eq!(
        vq.next_avail(),
        pos(2, false),
        "past the chain, wrap counter flipped"
    );

    add_used(&mut vq, head, 7);
    // The used descriptor went where the chain started, with the old wrap counter.
    let (_, len, id, flags) = driver.desc(2);
    assert_eq!((id, len, flags), (2, 7, DESC_F_AVAIL | DESC_F_USED | WRITE));
    assert_eq!(vq.next_used(), pos(2, false));
}

#[test]
fn chains_complete_out_of_order_advance_by_their_own_length() {
    let (mut driver, mut vq) = queue(5, 0);
    let first = driver.push_readable(&[b"a"]);
    let second = driver.push_readable(&[b"b", b"c", b"d"]);
    let (h1, _) = pop_read(&mut vq).expect("first");
    let (h2, _) = pop_read(&mut vq).expect("second");
    add_used(&mut vq, h2, 0);
    // The second chain's used descriptor sits at the first chain's start; the driver skips
    // the 3 descriptors of the chain it names.
    assert_eq!(driver.take_used().map(|u| u.id), Some(second));
    assert_eq!(driver.used_position(), (3, true));
    add_used(&mut vq, h1, 0);
    assert_eq!(driver.take_used().map(|u| u.id), Some(first));
    assert_eq!(vq.next_used(), driver_used(&driver));
    assert_eq!(vq.next_used(), pos(4, true));
}

#[test]
fn writable_chains_and_their_length() {
    let (mut driver, mut vq) = queue(4, 0);
    let (id, addrs) = driver.push_writable(&[16, 8]);
    let (guest, mut ring) = vq.split();
    let head = ring.pop_head().expect("ok").expect("a chain");
    let mut iovs = IovecList::new();
    let mut budget = WalkBudget::per_call();
    let len = ring
        .walk_chain(
            &guest,
            &head,
            Direction::DeviceWrites,
            u32::MAX,
            &mut iovs,
            &mut budget,
        )
        .expect("writable chain");
    assert_eq!(len, 24);
    // The two buffers follow each other in memory: one entry.
    assert_eq!(iovs.len(), 1);
    assert!(iovs.as_iovecs().write_at(14, b"hello"));
    drop(iovs);
    ring.add_used(head, 7);
    ring.publish_used();
    assert_eq!(driver.read(addrs[0] + 12, 4), b"\0\0he");
    assert_eq!(driver.read(addrs[1], 3), b"llo");
    let used = driver.take_used().expect("used");
    assert_eq!((used.id, used.len), (id, 7));
    assert_eq!(used.flags & WRITE, WRITE, "a used length comes with WRITE");
}

#[test]
fn unpop_puts_chains_back() {
    let (mut driver, mut vq) = queue(3, 0);
    let a = driver.push_readable(&[b"a", b"b"]);
    let b = driver.push_readable(&[b"c"]);
    let (ha, _) = pop_read(&mut vq).expect("a");
    let (hb, _) = pop_read(&mut vq).expect("b");
    assert_eq!(vq.in_flight(), 3);
    vq.split().1.unpop(&hb);
    assert_eq!((vq.next_avail(), vq.in_flight()), (pos(2, true), 2));
    vq.split().1.unpop(&ha);
    assert_eq!((vq.next_avail(), vq.in_flight()), (pos(0, true), 0));
    let again: Vec<u16> = std::iter::from_fn(|| pop_read(&mut vq).map(|(h, _)| h.id())).collect();
    assert_eq!(again, [a, b]);
    assert_eq!(vq.next_avail(), pos(0, false));
}

/// `pop_lone` into room for `max`: the ids and start positions it popped.
fn pop_lone(vq: &mut PackedVirtqueue, max: usize) -> Vec<(u16, Position)> {
    let mut heads = [ChainHead::default(); 8];
    let popped = vq.split().1.pop_lone(&mut heads[..max]);
    heads[..popped]
        .iter()
        .map(|h| {
            assert_eq!(h.descriptors(), 1);
            (h.id(), h.start())
        })
        .collect()
}

#[test]
fn lone_descriptors_pop_as_a_run_that_stops_at_anything_else() {
    let (mut driver, mut vq) = queue(4, 0);
    let a = driver.push_readable(&[b"a"]);
    let b = driver.push_readable(&[b"bb"]);
    let chain = driver.push_readable(&[b"c", b"d"]);
    // Room for one: one.
    assert_eq!(pop_lone(&mut vq, 1), [(a, pos(0, true))]);
    // The run stops before the two-descriptor chain, which `pop_head` then pops.
    assert_eq!(pop_lone(&mut vq, 8), [(b, pos(1, true))]);
    assert_eq!(vq.next_avail(), pos(2, true));
    assert!(pop_lone(&mut vq, 8).is_empty());
    let (head, bytes) = pop_read(&mut vq).expect("the chain");
    assert_eq!((head.id(), &bytes[..]), (chain, &b"cd"[..]));
    // A full ring pops nothing, whatever the driver writes over a descriptor in flight.
    assert_eq!(vq.in_flight(), 4);
    let x = driver.alloc(b"x");
    driver.write_at((0, false), [(x, 1, 3, 0)]);
    assert!(pop_lone(&mut vq, 8).is_empty());

    // Used and made available again across the wrap, a run continues past the ring's end.
    let (mut driver, mut vq) = queue(3, 0);
    for _ in 0..3 {
        driver.push_readable(&[b"r"]);
    }
    let (_, mut ring) = vq.split();
    let mut heads = [ChainHead::default(); 8];
    assert_eq!(ring.pop_lone(&mut heads), 3);
    ring.add_used(heads[0], 0);
    ring.add_used(heads[1], 0);
    ring.publish_used();
    for _ in 0..2 {
        driver.take_used().expect("used");
    }
    let again = [driver.push_readable(&[b"s"]), driver.push_readable(&[b"t"])];
    assert_eq!(
        pop_lone(&mut vq, 8),
        [(again[0], pos(0, false)), (again[1], pos(1, false))]
    );
    assert_eq!((vq.next_avail(), vq.in_flight()), (pos(2, false), 3));

    // An indirect table and an id out of range are left to `pop_head`.
    let (mut driver, mut vq) = queue(4, 0);
    let t = driver.alloc(b"tt");
    driver.add_indirect(&[(t, 2, 0)]);
    assert!(pop_lone(&mut vq, 8).is_empty());
    assert_eq!(pop_read(&mut vq).expect("the table").1, b"tt");
    driver.write_raw(&[(t, 1, 4, 0)]);
    assert!(pop_lone(&mut vq, 8).is_empty());
    assert!(matches!(
        pop_error(&mut vq),
        PackedRingError::IdOutOfRange(4)
    ));
}

#[test]
fn a_lone_walk_takes_the_buffer_and_charges_one() {
    let (mut driver, mut vq) = queue(4, 0);
    let (id, addrs) = driver.push_writable(&[16]);
    let outside = MEM_SIZE - 4;
    driver.write_raw(&[(outside, 64, 1, WRITE)]);
    let (guest, mut ring) = vq.split();
    let mut heads = [ChainHead::default(); 4];
    assert_eq!(ring.pop_lone(&mut heads), 2);
    assert_eq!(heads[0].id(), id);
    let mut iovs = IovecList::new();
    let mut budget = WalkBudget::per_call();
    let before = budget.remaining();
    let walked = ring.walk_lone(
        &guest,
        &heads[0],
        Direction::DeviceWrites,
        &mut iovs,
        &mut budget,
    );
    assert_eq!(walked, Ok(16));
    assert_eq!(before - budget.remaining(), 1);
    assert_eq!(iovs.len(), 1);
    assert!(iovs.as_iovecs().write_at(0, b"0123456789abcdef"));
    let mut seen = [0u8; 16];
    driver
        .mem()
        .read_slice(&mut seen, GuestAddress(addrs[0]))
        .expect("in memory");
    assert_eq!(&seen, b"0123456789abcdef");
    // Its direction and its range are checked as any buffer's, and a refused one leaves the
    // list as it was.
    let reads = ring.walk_lone(
        &guest,
        &heads[0],
        Direction::DeviceReads,
        &mut iovs,
        &mut budget,
    );
    assert!(reads.is_err());
    let out = ring.walk_lone(
        &guest,
        &heads[1],
        Direction::DeviceWrites,
        &mut iovs,
        &mut budget,
    );
    assert!(out.is_err());
    assert_eq!(iovs.len(), 1);
}

#[test]
fn two_descriptor_chains_join_adjacent_buffers_and_wrap() {
    let (mut driver, mut vq) = queue(3, 0);
    let frame = driver.alloc(b"headerframe");
    let apart = driver.alloc(b"xyz");
    // Adjacent buffers become one entry; apart ones two, in order. The second chain starts at
    // the ring's last offset, its second descriptor at offset 0 after the wrap.
    for (second, expected, entries, start, after) in [
        (
            frame + 6,
            &b"headerframe"[..],
            1,
            pos(0, true),
            pos(2, true),
        ),
        (apart, &b"headerxyz"[..], 2, pos(2, true), pos(1, false)),
    ] {
        let len = expected.len() as u32 - 6;
        driver.write_raw(&[(frame, 6, 0, NEXT), (second, len, 1, 0)]);
        let (guest, mut ring) = vq.split();
        let head = ring.pop_head().expect("ok").expect("a chain");
        assert_eq!((head.id(), head.descriptors(), head.start()), (1, 2, start));
        let mut iovs = IovecList::new();
        let mut budget = WalkBudget::per_call();
        let before = budget.remaining();
        let walked = walk_reads(&ring, &guest, &head, &mut iovs, &mut budget);
        assert_eq!(walked, Ok(expected.len() as u32));
        assert_eq!(before - budget.remaining(), 2, "both descriptors charged");
        assert_eq!(iovs.len(), entries);
        let mut bytes = vec![0; iovs.total_bytes()];
        assert!(iovs.as_iovecs().read_at(0, &mut bytes));
        assert_eq!(bytes, expected);
        add_used(&mut vq, head, 0);
        assert_eq!(vq.next_avail(), after);
    }
}

#[test]
fn walks_charge_every_descriptor_visited() {
    let (mut driver, mut vq) = queue(8, 0);
    driver.push_readable(&[b"a", b"b", b"c"]);
    let x = driver.alloc(b"xyzw");
    driver.add_indirect(&[(x, 1, 0), (x + 1, 1, 0), (x + 2, 1, 0), (x + 3, 1, 0)]);
    let (guest, mut ring) = vq.split();
    let mut budget = WalkBudget::per_call();
    let start = budget.remaining();
    let mut iovs = IovecList::new();
    for expected in [3, 5] {
        let before = budget.remaining();
        let head = ring.pop_head().expect("ok").expect("a chain");
        walk_reads(&ring, &guest, &head, &mut iovs, &mut budget).expect("good chain");
        assert_eq!(before - budget.remaining(), expected);
    }
    assert_eq!(start - budget.remaining(), 8);
}

// ---- indirect ----

#[test]
fn indirect_chains_occupy_one_descriptor() {
    let (mut driver, mut vq) = queue(3, 0);
    for round in 0..4u8 {
        let r1 = driver.alloc(&[round; 3]);
        let r2 = driver.alloc(b"zz");
        let w = driver.alloc_zeroed(16);
        // NEXT inside a table is reserved and ignored: entries are read in order.
        let id = driver.add_indirect(&[(r1, 3, NEXT), (r2, 2, 0), (w, 16, WRITE)]);
        let (head, walked) = pop_walk_split(&mut vq);
        assert_eq!(walked, Ok((5, 16)));
        assert_eq!((head.id(), head.descriptors()), (id, 1));
        add_used(&mut vq, head, 16);
        assert_eq!(driver.take_used().map(|u| (u.id, u.len)), Some((id, 16)));
        assert_eq!(vq.next_used(), driver_used(&driver));
    }
    assert_eq!(
        vq.next_used(),
        pos(1, false),
        "4 indirect chains: 4 descriptors"
    );

    let a = driver.alloc(b"hello ");
    let b = driver.alloc(b"world");
    driver.add_indirect(&[(a, 6, 0), (b, 5, 0)]);
    let (_, bytes) = pop_read(&mut vq).expect("indirect chain");
    assert_eq!(bytes, b"hello world");
}

#[test]
fn bad_indirect_tables_are_refused_and_returned() {
    let (mut driver, mut vq) = queue(4, 0);
    let buf = driver.alloc(b"data");
    let good = driver.write_table(&[(buf, 4, 0)]);
    let nested = driver.write_table(&[(good, 16, INDIRECT)]);
    let cases: [(u64, u32, u16, ChainError); 6] = [
        // A table of length 0.
        (good, 0, INDIRECT, ChainError::BadIndirectTable),
        // Not a whole number of descriptors.
        (good, 24, INDIRECT, ChainError::BadIndirectTable),
        // Outside guest memory, or across its end.
        (MEM_SIZE, 16, INDIRECT, ChainError::BadIndirectTable),
        (MEM_SIZE - 8, 16, INDIRECT, ChainError::BadIndirectTable),
        // An indirect table inside an indirect table.
        (nested, 16, INDIRECT, ChainError::BadIndirectTable),
        // INDIRECT together with NEXT (a table inside a NEXT list).
        (good, 16, INDIRECT | NEXT, ChainError::BadIndirectTable),
    ];
    for (addr, len, flags, error) in cases {
        let mut descs = vec![(addr, len, 0, flags)];
        if flags & NEXT != 0 {
            descs.push((buf, 4, 0, 0));
        }
        driver.write_raw(&descs);
        let (head, walked) = pop_walk(&mut vq, Direction::DeviceReads, u32::MAX);
        assert_eq!(walked, Err(error), "{addr:#x} {len} {flags:#x}");
        assert_eq!(head.descriptors() as usize, descs.len());
        // Returned with length 0; the queue goes on.
        add_used(&mut vq, head, 0);
        assert_eq!(vq.in_flight(), 0);
    }
    // An INDIRECT descriptor after a direct one in a NEXT list.
    driver.write_raw(&[(buf, 4, 0, NEXT), (good, 16, 0, INDIRECT)]);
    let (head, walked) = pop_walk(&mut vq, Direction::DeviceReads, u32::MAX);
    assert_eq!(walked, Err(ChainError::BadIndirectTable));
    assert_eq!(head.descriptors(), 2);
    add_used(&mut vq, head, 0);
    // Still usable.
    driver.write_raw(&[(good, 16, 1, INDIRECT)]);
    let (head, walked) = pop_walk(&mut vq, Direction::DeviceReads, u32::MAX);
    assert_eq!((walked, head.id()), (Ok(4), 1));
}

#[test]
fn indirect_tables_are_bounded() {
    let (mut driver, mut vq) = queue(4, 0);
    let buf = driver.alloc(&[7u8; 2048]);
    let max = MAX_CHAIN_DESCRIPTORS as usize - 1;
    for (entries, ok) in [(max, true), (max + 1, false), (40_000, false)] {
        let table: Vec<_> = (0..entries as u64)
            .map(|i| (buf + 2 * i % 2048, 1, 0))
            .collect();
        let id = driver.add_indirect(&table);
        let (head, walked) = pop_walk(&mut vq, Direction::DeviceReads, u32::MAX);
        if ok {
            assert_eq!(walked, Ok(entries as u32));
        } else {
            assert_eq!(walked, Err(ChainError::TooManyDescriptors), "{entries}");
        }
        add_used(&mut vq, head, 0);
        assert_eq!(driver.take_used().map(|u| u.id), Some(id));
    }
}

// ---- hostile chains ----

#[test]
fn endless_chains_are_ring_errors() {
    for size in [1, 3, 256] {
        let (mut driver, mut vq) = queue(size, 0);
        let buf = driver.alloc(b"x");
        // NEXT on every descriptor: the chain loops through the ring forever.
        let descs: Vec<_> = (0..size).map(|_| (buf, 1, 0, NEXT)).collect();
        driver.write_raw(&descs);
        assert!(
            matches!(pop_error(&mut vq), PackedRingError::ChainTooLong(n) if n == u32::from(size)),
            "size {size}"
        );
    }
}

#[test]
fn chains_longer_than_the_device_accepts_are_ring_errors() {
    let (mut driver, mut vq) = queue(2048, 0);
    let buf = driver.alloc(b"x");
    let n = MAX_CHAIN_DESCRIPTORS as usize + 1;
    let descs: Vec<_> = (0..n)
        .map(|i| (buf, 1, 0, if i + 1 < n { NEXT } else { 0 }))
        .collect();
    driver.write_raw(&descs);
    assert!(matches!(
        pop_error(&mut vq),
        PackedRingError::ChainTooLong(MAX_CHAIN_DESCRIPTORS)
    ));

    // One descriptor fewer is a long but acceptable chain (one of them empty: a list holds
    // at most MAX_IOVECS segments).
    let (mut driver, mut vq) = queue(2048, 0);
    let buf = driver.alloc(b"x");
    let n = MAX_CHAIN_DESCRIPTORS as usize;
    let descs: Vec<_> = (0..n)
        .map(|i| (buf, u32::from(i > 0), 5, if i + 1 < n { NEXT } else { 0 }))
        .collect();
    driver.write_raw(&descs);
    let (head, walked) = pop_walk(&mut vq, Direction::DeviceReads, u32::MAX);
    assert_eq!(
        (walked, head.descriptors(), head.id()),
        (Ok(n as u32 - 1), n as u16, 5)
    );
}

#[test]
fn more_descriptors_than_the_ring_holds_is_an_overrun() {
    let (mut driver, mut vq) = queue(3, 0);
    driver.push_readable(&[b"a"]);
    pop_read(&mut vq).expect("a chain");
    // Three more descriptors while one is still the device's: the last would overwrite it.
    let buf = driver.alloc(b"x");
    driver.write_raw(&[(buf, 1, 1, NEXT), (buf, 1, 1, NEXT), (buf, 1, 1, 0)]);
    assert!(matches!(pop_error(&mut vq), PackedRingError::Overrun));

    // A full ring in flight pops nothing, whatever the driver writes over it.
    let (mut driver, mut vq) = queue(2, 0);
    driver.push_readable(&[b"a"]);
    driver.push_readable(&[b"b"]);
    pop_read(&mut vq).expect("a");
    pop_read(&mut vq).expect("b");
    driver.write_raw(&[(buf, 1, 0, 0)]);
    assert!(!vq.avail_pending());
    assert!(vq.split().1.pop_head().expect("no error").is_none());
}

#[test]
fn ids_out_of_range_are_ring_errors() {
    for (size, id) in [(3u16, 3u16), (3, u16::MAX), (256, 256)] {
        let (mut driver, mut vq) = queue(size, 0);
        let buf = driver.alloc(b"x");
        driver.write_raw(&[(buf, 1, id, 0)]);
        assert!(matches!(pop_error(&mut vq), PackedRingError::IdOutOfRange(i) if i == id));
    }
    // The id is the last descriptor's: a good first id does not help.
    let (mut driver, mut vq) = queue(4, 0);
    let buf = driver.alloc(b"x");
    driver.write_raw(&[(buf, 1, 0, NEXT), (buf, 1, 9, 0)]);
    assert!(matches!(
        pop_error(&mut vq),
        PackedRingError::IdOutOfRange(9)
    ));
}

#[test]
fn directions_are_enforced() {
    let (mut driver, mut vq) = queue(8, 0);
    let r = driver.alloc(b"read");
    let w = driver.alloc_zeroed(4);

    // Control style: a readable buffer after a writable one.
    driver.write_raw(&[(r, 4, 0, NEXT), (w, 4, 0, WRITE | NEXT), (r, 4, 0, 0)]);
    let (head, walked) = pop_walk_split(&mut vq);
    assert_eq!(walked, Err(ChainError::WrongDirection { addr: r }));
    add_used(&mut vq, head, 0);
    // The same inside an indirect table.
    driver.add_indirect(&[(w, 4, WRITE), (r, 4, 0)]);
    let (head, walked) = pop_walk_split(&mut vq);
    assert_eq!(walked, Err(ChainError::WrongDirection { addr: r }));
    add_used(&mut vq, head, 0);
    // Readable then writable is fine.
    driver.write_raw(&[(r, 4, 0, NEXT), (w, 4, 0, WRITE)]);
    let (head, walked) = pop_walk_split(&mut vq);
    assert_eq!(walked, Ok((4, 4)));
    add_used(&mut vq, head, 4);

    // One-direction walks.
    driver.write_raw(&[(r, 4, 0, NEXT), (w, 4, 0, WRITE)]);
    let (head, walked) = pop_walk(&mut vq, Direction::DeviceReads, u32::MAX);
    assert_eq!(walked, Err(ChainError::WrongDirection { addr: w }));
    add_used(&mut vq, head, 0);
    driver.write_raw(&[(w, 4, 0, WRITE | NEXT), (r, 4, 0, 0)]);
    let (head, walked) = pop_walk(&mut vq, Direction::DeviceWrites, u32::MAX);
    assert_eq!(walked, Err(ChainError::WrongDirection { addr: r }));
    add_used(&mut vq, head, 0);
}

#[test]
fn buffers_outside_memory_and_over_the_limit_are_refused() {
    let (mut driver, mut vq) = queue(4, 0);
    let r = driver.alloc(b"abcd");
    driver.write_raw(&[(r, 4, 0, NEXT), (MEM_SIZE - 4, 8, 0, 0)]);
    let (head, walked) = pop_walk(&mut vq, Direction::DeviceReads, u32::MAX);
    assert!(matches!(walked, Err(ChainError::Buffer(_))));
    add_used(&mut vq, head, 0);
    driver.write_raw(&[(r, 4, 0, NEXT), (r, 4, 0, 0)]);
    let (head, walked) = pop_walk(&mut vq, Direction::DeviceReads, 7);
    assert_eq!(walked, Err(ChainError::TooLong { limit: 7 }));
    add_used(&mut vq, head, 0);
    driver.write_raw(&[(r, u32::MAX, 0, NEXT), (r, 2, 0, 0)]);
    let (_, walked) = pop_walk(&mut vq, Direction::DeviceReads, u32::MAX);
    assert!(walked.is_err());
}

#[test]
fn probes_and_prefetches_are_harmless() {
    for size in [1, 3, 256] {
        let (mut driver, mut vq) = queue(size, 0);
        driver.write_raw(&[(u64::MAX - 3, u32::MAX, 0, 0)]);
        let (guest, ring) = vq.split();
        ring.prefetch_ahead(&guest);
        ring.prefetch_descriptors(u16::MAX);
        ring.prefetch_descriptors(5);
        assert!(vq.avail_pending());
    }
}

// ---- IN_ORDER ----

#[test]
fn in_order_batches_use_one_descriptor() {
    let (mut driver, mut vq) = queue(5, IN_ORDER);
    let mut batches = 0;
    let mut lens = [2u16, 1, 3, 1, 1, 2].iter().cycle();
    let mut wraps = BTreeSet::new();
    while batches < 12 {
        let mut ids = Vec::new();
        loop {
            let n = *lens.next().expect("cycle");
            if driver.outstanding() + u32::from(n) > 5 {
                break;
            }
            let parts = vec![&b"p"[..]; usize::from(n)];
            ids.push(driver.push_readable(&parts));
        }
        let heads: Vec<ChainHead> =
            std::iter::from_fn(|| pop_read(&mut vq).map(|(h, _)| h)).collect();
        assert_eq!(heads.iter().map(ChainHead::id).collect::<Vec<_>>(), ids);
        let start = vq.next_used();
        wraps.insert(start.wrap);
        {
            let (_, mut ring) = vq.split();
            ring.add_used_batch(&heads, 9);
            ring.publish_used();
        }
        // One used descriptor, where the batch started, naming its last buffer.
        let (_, len, id, flags) = driver.desc(start.offset);
        assert_eq!(
            (id, len, flags),
            (
                *ids.last().expect("ids"),
                9,
                expected_used_flags(start.wrap, 9)
            )
        );
        let (used, chains) = driver.take_used_in_order().expect("used");
        assert_eq!((used.id, chains), (*ids.last().expect("ids"), ids.len()));
        assert_eq!(driver.take_used_in_order(), None);
        assert_eq!(vq.next_used(), driver_used(&driver));
        assert_eq!(vq.in_flight(), 0);
        batches += 1;
    }
    assert_eq!(wraps.len(), 2);
}

#[test]
fn batches_without_in_order_use_a_descriptor_each() {
    let (mut driver, mut vq) = queue(5, 0);
    let ids = [
        driver.push_readable(&[b"a", b"b"]),
        driver.push_readable(&[b"c"]),
        driver.push_readable(&[b"d"]),
    ];
    let heads: Vec<ChainHead> = std::iter::from_fn(|| pop_read(&mut vq).map(|(h, _)| h)).collect();
    let (_, mut ring) = vq.split();
    ring.add_used_batch(&heads, 6);
    ring.publish_used();
    let used: Vec<_> = std::iter::from_fn(|| driver.take_used().map(|u| (u.id, u.len))).collect();
    assert_eq!(used, [(ids[0], 0), (ids[1], 0), (ids[2], 6)]);
    assert_eq!(vq.next_used(), driver_used(&driver));
}

/// Each used descriptor is whole (id, length, flags) the moment it is written, across the
/// ring's end too: nothing waits for the publication.
#[test]
fn each_used_descriptor_reaches_the_driver_whole_as_written() {
    let mem = guest_mem();
    // Size 4, the batch of three starting at offset 2: it crosses the end of the ring, so its
    // descriptors carry both wrap counters.
    let mut driver = GuestPackedQueue::new(&mem, 4);
    let mut vq = device(&driver, 0);
    for _ in 0..2 {
        driver.push_readable(&[b"x"]);
        let (head, _) = pop_read(&mut vq).expect("a chain");
        add_used(&mut vq, head, 0);
        driver.take_used().expect("used");
    }
    let ids: Vec<u16> = (0..3).map(|_| driver.push_writable(&[8]).0).collect();
    let heads: Vec<ChainHead> = (0..3)
        .map(|_| pop_walk(&mut vq, Direction::DeviceWrites, u32::MAX).0)
        .collect();
    let (_, mut ring) = vq.split();
    for ((head, len), id) in heads.iter().zip([3, 0, 5]).zip(&ids) {
        assert!(driver.peek_used().is_none(), "not before it is written");
        ring.add_used(*head, len);
        let used = driver.take_used().expect("visible once written");
        assert_eq!(
            (used.id, used.len, used.flags & WRITE != 0),
            (*id, len, len > 0)
        );
    }
    ring.publish_used();
    assert!(driver.peek_used().is_none(), "the publication adds nothing");
    assert_eq!(vq.next_used(), driver_used(&driver));
}

// ---- interrupts (driver event suppression) ----

/// Makes `n` one-descriptor chains available, pops and uses them all, publishing each (the
/// driver takes it back before it makes the next one available).
fn use_chains(driver: &mut GuestPackedQueue, vq: &mut PackedVirtqueue, n: u16) {
    for _ in 0..n {
        driver.push_readable(&[b"z"]);
        let (head, _) = pop_read(vq).expect("a chain");
        let (_, mut ring) = vq.split();
        ring.add_used(head, 0);
        ring.publish_used();
        driver.take_used().expect("used");
    }
}

#[test]
fn interrupt_flags_enable_and_disable() {
    for features in [0, EVENT_IDX] {
        let (mut driver, mut vq) = queue(4, features);
        assert_eq!(decide(&mut vq), None, "nothing used");
        driver.set_driver_event(0, EVENT_FLAG_ENABLE);
        use_chains(&mut driver, &mut vq, 1);
        assert_eq!(decide(&mut vq), Some(InterruptDecision::Raise));
        assert_eq!(decide(&mut vq), None, "nothing new since the last decision");
        driver.set_driver_event(0, EVENT_FLAG_DISABLE);
        use_chains(&mut driver, &mut vq, 2);
        assert_eq!(decide(&mut vq), Some(InterruptDecision::SuppressedByFlag));
        // Used but not published yet: not covered.
        driver.set_driver_event(0, EVENT_FLAG_ENABLE);
        driver.push_readable(&[b"q"]);
        let (head, _) = pop_read(&mut vq).expect("chain");
        vq.split().1.add_used(head, 0);
        assert_eq!(decide(&mut vq), None);
        vq.split().1.publish_used();
        assert_eq!(decide(&mut vq), Some(InterruptDecision::Raise));
        // The reserved value raises.
        driver.set_driver_event(0, 3);
        use_chains(&mut driver, &mut vq, 1);
        assert_eq!(decide(&mut vq), Some(InterruptDecision::Raise));
    }
    // DESC without EVENT_IDX negotiated: treated as ENABLE.
    let (mut driver, mut vq) = queue(4, 0);
    driver.set_driver_event(3 | EVENT_WRAP_BIT, EVENT_FLAG_DESC);
    use_chains(&mut driver, &mut vq, 1);
    assert_eq!(decide(&mut vq), Some(InterruptDecision::Raise));
}

/// A used descriptor is whole as soon as it is written, so a polling driver may take it and
/// make its slot available again before the device publishes: the device may then use more
/// than a ring's worth between two publications, and the interrupt decision must still cover
/// them all (positions alone would say nothing moved after a whole lap).
#[test]
fn descriptors_recycled_before_the_publication_are_all_covered() {
    let (mut driver, mut vq) = queue(2, EVENT_IDX);
    driver.want_next_used();
    for lap in 0..2 {
        for _ in 0..2 {
            driver.push_readable(&[b"r"]);
        }
        for _ in 0..2 {
            let (head, _) = pop_read(&mut vq).expect("a chain");
            vq.split().1.add_used(head, 0);
        }
        for _ in 0..2 {
            assert!(
                driver.take_used().is_some(),
                "lap {lap}: used, not published yet"
            );
        }
    }
    assert_eq!(
        vq.next_used(),
        pos(0, true),
        "two laps: back where it started"
    );
    vq.split().1.publish_used();
    assert_eq!(decide(&mut vq), Some(InterruptDecision::Raise));
    assert_eq!(decide(&mut vq), None);
}

/// Size 4. Brings the used position to offset 2 of a lap with counter `w` (after `lap`
/// laps), asks for an interrupt at `event`, uses `n` more descriptors and decides.
fn decide_at_wrap(lap: u16, event: (u16, bool), n: u16) -> InterruptDecision {
    let (mut driver, mut vq) = queue(4, EVENT_IDX);
    driver.set_driver_event(0, EVENT_FLAG_DISABLE);
    use_chains(&mut driver, &mut vq, 4 * lap + 2);
    decide(&mut vq);
    assert_eq!(vq.next_used(), pos(2, lap.is_multiple_of(2)));
    let off_wrap = event.0 | if event.1 { EVENT_WRAP_BIT } else { 0 };
    driver.set_driver_event(off_wrap, EVENT_FLAG_DESC);
    use_chains(&mut driver, &mut vq, n);
    decide(&mut vq).expect("a decision")
}

#[test]
fn event_idx_interrupts_at_the_wrap() {
    use InterruptDecision::{Raise, SuppressedByEventIdx as Quiet};
    // Both wrap counter values: lap 0 runs with counter 1, lap 1 with counter 0.
    for lap in [0u16, 1, 2] {
        let w = lap.is_multiple_of(2);
        // Used 2, 3 (counter w) then 0 (counter !w): the range crosses the wrap.
        let cases = [
            ((3, w), Raise),  // just before the wrap
            ((0, !w), Raise), // just after the wrap
            ((2, w), Raise),  // the first one used in the range
            ((1, !w), Quiet), // the next to be used: not yet
            ((2, !w), Quiet), // next lap
            ((1, w), Quiet),  // passed before the range
            ((0, w), Quiet),  // passed before the range
        ];
        for (event, expected) in cases {
            assert_eq!(
                decide_at_wrap(lap, event, 3),
                expected,
                "lap {lap} event {event:?}"
            );
        }
        // The range ends exactly at the wrap (used 2 and 3).
        let cases = [
            ((3, w), Raise),
            ((2, w), Raise),
            ((0, !w), Quiet),
            ((1, w), Quiet),
        ];
        for (event, expected) in cases {
            assert_eq!(
                decide_at_wrap(lap, event, 2),
                expected,
                "lap {lap} event {event:?}"
            );
        }
        // A whole ring used (2, 3 with counter w, 0, 1 with !w): each offset once, with its
        // counter, so decided exactly; the next to be used (2 with !w) is not reached.
        let cases = [
            ((2, w), Raise),
            ((1, !w), Raise),
            ((3, w), Raise),
            ((2, !w), Quiet),
            ((1, w), Quiet),
            ((3, !w), Quiet),
        ];
        for (event, expected) in cases {
            assert_eq!(
                decide_at_wrap(lap, event, 4),
                expected,
                "lap {lap} event {event:?}"
            );
        }
        // More than a ring between two decisions: whatever the event says, raise.
        for event in [(1, w), (2, !w), (3, !w), (0x7fff, w)] {
            assert_eq!(
                decide_at_wrap(lap, event, 5),
                Raise,
                "lap {lap} event {event:?}"
            );
        }
    }
}

#[test]
fn event_idx_range_starting_at_the_wrap() {
    use InterruptDecision::{Raise, SuppressedByEventIdx as Quiet};
    for lap in [0u16, 1] {
        let (mut driver, mut vq) = queue(3, EVENT_IDX);
        use_chains(&mut driver, &mut vq, 3 * (lap + 1));
        decide(&mut vq);
        let w = vq.next_used().wrap;
        assert_eq!(vq.next_used().offset, 0);
        for (event, expected) in [((0, w), Raise), ((2, !w), Quiet), ((1, w), Quiet)] {
            let off_wrap = event.0 | if event.1 { EVENT_WRAP_BIT } else { 0 };
            driver.set_driver_event(off_wrap, EVENT_FLAG_DESC);
            // Use one, decide, then come back round to offset 0 of the next lap but one.
            use_chains(&mut driver, &mut vq, 1);
            assert_eq!(decide(&mut vq), Some(expected), "lap {lap} {event:?}");
            driver.set_driver_event(0, EVENT_FLAG_DISABLE);
            use_chains(&mut driver, &mut vq, 5);
            decide(&mut vq);
            assert_eq!(vq.next_used(), pos(0, w));
        }
    }
}

#[test]
fn driver_asking_for_its_next_used_is_interrupted_once() {
    let (mut driver, mut vq) = queue(3, EVENT_IDX);
    for round in 0..10u16 {
        driver.want_next_used();
        let n = round % 3 + 1;
        use_chains(&mut driver, &mut vq, n);
        assert_eq!(
            decide(&mut vq),
            Some(InterruptDecision::Raise),
            "round {round}"
        );
        // The driver did not re-arm: nothing more until it does.
        use_chains(&mut driver, &mut vq, 1);
        assert_eq!(
            decide(&mut vq),
            Some(InterruptDecision::SuppressedByEventIdx),
            "round {round}"
        );
    }
}

/// The decision against a plain model: a linear used counter, and the driver's (offset, wrap)
/// reached when a descriptor at that offset with that counter was used in the range.
#[test]
fn packed_need_event_matches_a_linear_model() {
    for size in [1u16, 2, 3, 4, 5, 7, 32768] {
        let n = u32::from(size);
        let laps = if size > 100 { 1 } else { 4 };
        let news: Vec<u32> = if size > 100 {
            vec![
                0,
                1,
                n - 1,
                n,
                n + 1,
                2 * n - 1,
                2 * n,
                2 * n + 1,
                3 * n - 2,
            ]
        } else {
            (0..laps * n).collect()
        };
        for new_linear in news {
            let new = pos((new_linear % n) as u16, (new_linear / n).is_multiple_of(2));
            let deltas: Vec<u32> = if size > 100 {
                vec![1, 2, n / 2, n - 1, n, n + 3]
            } else {
                (1..=n + 1).collect()
            };
            for delta in deltas {
                let offs: Vec<u16> = if size > 100 {
                    vec![
                        0,
                        1,
                        new.offset,
                        new.offset.wrapping_sub(1) % size,
                        size - 1,
                    ]
                } else {
                    (0..size).collect()
                };
                for off in offs {
                    for wrap in [false, true] {
                        let off_wrap = off | if wrap { EVENT_WRAP_BIT } else { 0 };
                        let got = packed_need_event(off_wrap, new, delta, size);
                        // Shifted by whole pairs of laps so that the range starts
                        // at or after 0; the counter alternates the same way.
                        let hi = new_linear + 2 * n * (delta / (2 * n) + 1);
                        let model = delta > n
                            || (hi - delta..hi).any(|e| {
                                e % n == u32::from(off) && ((e / n).is_multiple_of(2)) == wrap
                            });
                        assert_eq!(
                            got, model,
                            "size {size} new {new:?} delta {delta} off {off} wrap {wrap}"
                        );
                    }
                }
            }
        }
    }
    // Offsets past the ring (a confused driver) never panic.
    for off_wrap in [0x7fff, 0xffff, 0x8000 | 300] {
        let _ = packed_need_event(off_wrap, pos(1, true), 1, 256);
    }
}

// ---- kicks (device event suppression) ----

#[test]
fn kick_flags_without_event_idx() {
    let (mut driver, mut vq) = queue(4, 0);
    vq.split().1.disable_notification();
    assert_eq!(driver.device_event().1, EVENT_FLAG_DISABLE);
    driver.push_readable(&[b"a"]);
    assert!(!driver.kick_needed(1));
    // Enabling finds the chain made available meanwhile.
    assert!(vq.split().1.enable_notification(0));
    assert_eq!(driver.device_event().1, EVENT_FLAG_ENABLE);
    let (head, _) = pop_read(&mut vq).expect("chain");
    add_used(&mut vq, head, 0);
    assert!(!vq.split().1.enable_notification(0), "nothing new");
    driver.push_readable(&[b"b"]);
    assert!(driver.kick_needed(1));
    assert!(vq.avail_pending());
}

#[test]
fn enable_writes_the_next_avail_position_with_event_idx() {
    let (mut driver, mut vq) = queue(3, EVENT_IDX);
    assert!(!vq.split().1.enable_notification(0));
    assert_eq!(driver.device_event(), (EVENT_WRAP_BIT, EVENT_FLAG_DESC));
    vq.split().1.disable_notification();
    assert_eq!(driver.device_event().1, EVENT_FLAG_DISABLE);
    driver.push_readable(&[b"a", b"b"]);
    let (head, _) = pop_read(&mut vq).expect("chain");
    add_used(&mut vq, head, 0);
    driver.take_used().expect("used");
    // Offsets 2 and 0 (after the wrap), made available before the device enables.
    driver.push_readable(&[b"c", b"d"]);
    assert_eq!(vq.next_avail(), pos(2, true));
    assert!(
        vq.split().1.enable_notification(0),
        "a chain arrived meanwhile"
    );
    assert_eq!(driver.device_event(), (2 | EVENT_WRAP_BIT, EVENT_FLAG_DESC));
    pop_read(&mut vq).expect("chain");
    assert!(!vq.split().1.enable_notification(0));
    assert_eq!(
        driver.device_event(),
        (1, EVENT_FLAG_DESC),
        "offset 1 after the wrap"
    );
}

/// Kick coalescing: the event is `ahead` descriptors past the next position, across the wrap
/// (with the other wrap counter), and never a whole lap or more away.
#[test]
fn enable_ahead_asks_for_a_later_kick_across_the_wrap() {
    let (mut driver, mut vq) = queue(4, EVENT_IDX);
    assert!(!vq.split().1.enable_notification(2));
    assert_eq!(driver.device_event(), (2 | EVENT_WRAP_BIT, EVENT_FLAG_DESC));
    assert!(!vq.split().1.enable_notification(u16::MAX));
    assert_eq!(
        driver.device_event(),
        (3 | EVENT_WRAP_BIT, EVENT_FLAG_DESC),
        "at most a lap less one"
    );
    for b in [b"a", b"b", b"c"] {
        driver.push_readable(&[b]);
        assert!(!driver.kick_needed(1), "within the coalesced buffers");
        let (head, _) = pop_read(&mut vq).expect("chain");
        add_used(&mut vq, head, 0);
        driver.take_used().expect("used");
    }
    assert_eq!(vq.next_avail(), pos(3, true));
    assert!(!vq.split().1.enable_notification(2));
    assert_eq!(
        driver.device_event(),
        (1, EVENT_FLAG_DESC),
        "offset 1 after the wrap"
    );
    driver.push_readable(&[b"d"]);
    driver.push_readable(&[b"e"]);
    assert!(!driver.kick_needed(1));
    driver.push_readable(&[b"f"]);
    assert!(
        driver.kick_needed(1),
        "the third buffer past the drained ring kicks"
    );
}

/// The device sleeps with notifications enabled at its next position; the driver makes chains
/// available and kicks when Linux's rule says so. Exactly the first chain after each enable
/// kicks, at every offset (the ones just before and after the wrap included) and with both
/// wrap counter values.
fn kick_protocol(size: u16) {
    let (mut driver, mut vq) = queue(size, EVENT_IDX);
    assert!(!vq.split().1.enable_notification(0));
    let mut armed_at = BTreeSet::new();
    let lens = [1u16, 2, 1, 3, 2];
    for round in 0..(8 * size + 10) {
        let armed = vq.next_avail();
        armed_at.insert((armed.offset, armed.wrap));
        assert_eq!(driver.device_event(), (armed.off_wrap(), EVENT_FLAG_DESC));
        // The first chain crosses the armed position: kick.
        let n = lens[usize::from(round) % 5].min(size);
        let parts = vec![&b"k"[..]; usize::from(n)];
        driver.push_readable(&parts);
        assert!(
            driver.kick_needed(n),
            "round {round}: first chain after the enable"
        );
        // Another before the device runs: no kick (the device is already awake).
        let m = lens[usize::from(round + 2) % 5].min(size);
        if !round.is_multiple_of(3) && driver.outstanding() + u32::from(m) <= u32::from(size) {
            let parts = vec![&b"l"[..]; usize::from(m)];
            driver.push_readable(&parts);
            assert!(!driver.kick_needed(m), "round {round}: second chain");
        }
        // The device wakes, drains with notifications off, and sleeps again.
        vq.split().1.disable_notification();
        assert!(!driver.kick_needed(1));
        loop {
            while let Some((head, _)) = pop_read(&mut vq) {
                add_used(&mut vq, head, 0);
            }
            if !vq.split().1.enable_notification(0) {
                break;
            }
        }
        while driver.take_used().is_some() {}
    }
    for offset in [0, size - 1] {
        for wrap in [false, true] {
            assert!(
                armed_at.contains(&(offset, wrap)),
                "size {size}: never armed at offset {offset} with counter {wrap}"
            );
        }
    }
}

#[test]
fn kick_protocol_size_1() {
    kick_protocol(1);
}

#[test]
fn kick_protocol_size_3() {
    kick_protocol(3);
}

#[test]
fn kick_protocol_size_4() {
    kick_protocol(4);
}

#[test]
fn kick_protocol_size_5() {
    kick_protocol(5);
}

#[test]
fn kick_suppression_at_the_wrap() {
    // The device arms just before the wrap (offset 3 of 4) and just after it (offset 0), with
    // both counter values; the chain that reaches the armed position kicks (also when it
    // crosses the wrap), the next one does not.
    for (advance, armed, chain) in [
        (3u16, 3 | EVENT_WRAP_BIT, 1u16),
        (3, 3 | EVENT_WRAP_BIT, 2),
        (4, 0, 1),
        (4, 0, 3),
        (7, 3, 1),
        (7, 3, 2),
        (8, EVENT_WRAP_BIT, 1),
        (8, EVENT_WRAP_BIT, 2),
    ] {
        let (mut driver, mut vq) = queue(4, EVENT_IDX);
        for _ in 0..advance {
            driver.push_readable(&[b"a"]);
            let (head, _) = pop_read(&mut vq).expect("chain");
            add_used(&mut vq, head, 0);
            driver.take_used().expect("used");
        }
        assert!(!vq.split().1.enable_notification(0));
        assert_eq!(driver.device_event(), (armed, EVENT_FLAG_DESC));
        let parts = vec![&b"c"[..]; usize::from(chain)];
        driver.push_readable(&parts);
        assert!(driver.kick_needed(chain), "advance {advance} chain {chain}");
        driver.push_readable(&[b"d"]);
        assert!(
            !driver.kick_needed(1),
            "advance {advance} chain {chain}: past it"
        );
    }
}
