//! Ring arithmetic and the split-ring protocol against the test device's view of the same
//! memory.

use std::vec::Vec;

use super::*;
use crate::testing::{DevQueue, TestHal};

fn ring(size: u16, event_idx: bool) -> (SplitRing<u32>, DevQueue, TestHal) {
    let hal = TestHal::new(4 << 20);
    let region = DmaRegion::alloc(&hal, RingLayout::new(size).bytes).expect("dma");
    let ring = SplitRing::new(0, size, region, event_idx);
    let dev = DevQueue::new(hal.clone(), ring.index(), size, ring.addresses(), event_idx);
    (ring, dev, hal)
}

fn buf(addr: u64, len: u32) -> Buffer {
    Buffer {
        addr,
        len,
        access: Access::DeviceReads,
    }
}

#[test]
fn vring_need_event_table() {
    // (event, new, old, notify?)
    let table: [(u16, u16, u16, bool); 14] = [
        (0, 0, 0, false),         // nothing published
        (0, 1, 0, true),          // event at the first new entry
        (3, 10, 0, true),         // inside [old, new)
        (10, 10, 0, false),       // event == new: not crossed yet
        (100, 10, 0, false),      // far ahead
        (5, 6, 5, true),          // exactly the one new entry
        (4, 6, 5, false),         // already passed before `old`
        (65535, 0, 65534, true),  // window [65534, 0) wraps
        (0, 1, 65535, true),      // window [65535, 1) contains 0 after the wrap
        (1, 1, 65535, false),     // ... but not 1
        (65535, 65535, 0, false), // [0, 65535) does not contain 65535
        (65534, 65535, 0, true),  // ... but contains 65534
        (32768, 40000, 30000, true),
        (29999, 40000, 30000, false),
    ];
    for (event, new, old, expected) in table {
        assert_eq!(
            vring_need_event(event, new, old),
            expected,
            "event {event} new {new} old {old}"
        );
    }
    // Exhaustively over the event index: notify iff (event - old) mod 2^16 < (new - old).
    for old in [0u16, 1, 32767, 65500, 65535] {
        for delta in [0u16, 1, 2, 100, 32768, 65535] {
            let new = old.wrapping_add(delta);
            for event in 0..=u16::MAX {
                assert_eq!(
                    vring_need_event(event, new, old),
                    event.wrapping_sub(old) < delta,
                    "event {event} new {new} old {old}"
                );
            }
        }
    }
}

#[test]
fn layout_matches_the_spec() {
    let l = RingLayout::new(256);
    assert_eq!(l.avail, 4096);
    assert_eq!(l.used, (4096 + 6 + 512usize).next_multiple_of(4));
    assert_eq!(l.bytes, l.used + 6 + 8 * 256);
    let l = RingLayout::new(2);
    assert_eq!((l.avail, l.used % 4), (32, 0));
}

#[test]
fn free_list_hands_out_each_descriptor_once_and_reuses_them() {
    let (mut ring, mut dev, _hal) = ring(8, true);
    for token in 0..8u32 {
        ring.add(&[buf(0x1000 + u64::from(token), 100 + token)], token)
            .expect("room");
    }
    assert_eq!(ring.add(&[buf(0, 1)], 99), Err(RingFull));
    assert_eq!(ring.free_descriptors(), 0);
    assert!(ring.publish());
    let chains: Vec<_> = std::iter::from_fn(|| dev.pop()).collect();
    let mut heads: Vec<u16> = chains.iter().map(|c| c.head).collect();
    heads.sort_unstable();
    assert_eq!(
        heads,
        (0..8).collect::<Vec<_>>(),
        "every descriptor used once"
    );
    // Return them in a scrambled order: tokens follow the ids, not the order.
    for i in [3usize, 0, 7, 1, 6, 2, 5, 4] {
        dev.push_used(chains[i].head, 7);
    }
    let mut tokens = Vec::new();
    while let Some(used) = ring.pop_used().expect("valid") {
        assert_eq!(used.len, 7);
        tokens.push(used.token);
    }
    let expect: Vec<u32> = [3usize, 0, 7, 1, 6, 2, 5, 4]
        .iter()
        .map(|&i| chains[i].descs[0].len - 100)
        .collect();
    assert_eq!(tokens, expect);
    assert_eq!(ring.free_descriptors(), 8);

    // Chains: links and flags as the device reads them; a chain needs all its descriptors.
    let three = [
        buf(0xa000, 1),
        Buffer {
            addr: 0xb000,
            len: 2,
            access: Access::DeviceWrites,
        },
        buf(0xc000, 3),
    ];
    ring.add(&three, 1).expect("room");
    ring.add(&three, 2).expect("room");
    assert_eq!(ring.add(&three, 3), Err(RingFull), "2 descriptors left");
    ring.add(&three[..2], 3).expect("room for two");
    assert_eq!(ring.free_descriptors(), 0);
    ring.publish();
    for expected_len in [3usize, 3, 2] {
        let chain = dev.pop().expect("chain");
        assert_eq!(chain.descs.len(), expected_len);
        let addrs: Vec<u64> = chain.descs.iter().map(|d| d.addr).collect();
        assert_eq!(addrs, [0xa000, 0xb000, 0xc000][..expected_len]);
        let writable: Vec<bool> = chain.descs.iter().map(|d| d.writable()).collect();
        assert_eq!(writable, [false, true, false][..expected_len]);
        dev.push_used(chain.head, 0);
    }
    let mut freed = 0;
    while ring.pop_used().expect("valid").is_some() {
        freed += 1;
    }
    assert_eq!((freed, ring.free_descriptors()), (3, 8));
}

#[test]
fn indexes_wrap_around_over_many_cycles() {
    for (size, event_idx) in [(2u16, false), (4, true), (256, true)] {
        let (mut ring, mut dev, _hal) = ring(size, event_idx);
        let mut next_token = 0u32;
        let mut expect_token = 0u32;
        // Well past two wraps of the 16-bit indexes.
        let total = 3 * 65536 + 5;
        let mut round = 0u32;
        while expect_token < total {
            round += 1;
            let batch = 1 + (round % u32::from(size));
            for _ in 0..batch {
                if next_token < total && ring.add(&[buf(0x2000, next_token)], next_token).is_ok() {
                    next_token += 1;
                }
            }
            ring.publish();
            // The device takes what is there, returns it in order.
            while let Some(chain) = dev.pop() {
                dev.push_used(chain.head, chain.descs[0].len);
            }
            while let Some(used) = ring.pop_used().expect("valid") {
                assert_eq!(used.token, expect_token);
                assert_eq!(used.len, expect_token, "length travels with the chain");
                expect_token += 1;
            }
            assert_eq!(ring.free_descriptors(), usize::from(size));
        }
        assert_eq!(dev.next_avail, total as u16);
        assert_eq!(dev.used_idx, total as u16);
        assert_eq!(ring.last_used, total as u16);
    }
}

#[test]
fn event_idx_kick_decision_follows_avail_event() {
    let (mut ring, dev, _hal) = ring(8, true);
    assert_eq!(ring.kick_decision(), Kick::NothingNew);
    dev.set_avail_event(2);
    let mut decisions = Vec::new();
    for i in 0..5u32 {
        ring.add(&[buf(0, 1)], i).expect("room");
        ring.publish();
        decisions.push(ring.kick_decision());
    }
    // Published 1..=5; only the publish crossing index 2 (old 2 → new 3) notifies.
    use Kick::*;
    assert_eq!(
        decisions,
        [
            SuppressedByEventIdx,
            SuppressedByEventIdx,
            Notify,
            SuppressedByEventIdx,
            SuppressedByEventIdx
        ]
    );
    assert_eq!(ring.kick_decision(), NothingNew, "nothing new since");
}

#[test]
fn no_notify_flag_suppresses_kicks_without_event_idx() {
    let (mut ring, dev, _hal) = ring(8, false);
    dev.set_avail_event(0); // ignored without EVENT_IDX
    ring.add(&[buf(0, 1)], 0).expect("room");
    ring.publish();
    assert_eq!(ring.kick_decision(), Kick::Notify);
    dev.set_used_flags(USED_F_NO_NOTIFY);
    ring.add(&[buf(0, 1)], 1).expect("room");
    ring.publish();
    assert_eq!(ring.kick_decision(), Kick::SuppressedByFlag);
    dev.set_used_flags(0);
    ring.add(&[buf(0, 1)], 2).expect("room");
    ring.publish();
    assert_eq!(ring.kick_decision(), Kick::Notify);
}

#[test]
fn interrupt_suppression_fields() {
    // EVENT_IDX: used_event tracks the next used index while enabled, far ahead while not.
    let (mut ring, mut dev, _hal) = ring(8, true);
    assert!(!ring.enable_interrupts());
    assert_eq!(dev.used_event(), 0);
    for i in 0..3 {
        ring.add(&[buf(0, 1)], i).expect("room");
    }
    ring.publish();
    while let Some(chain) = dev.pop() {
        dev.push_used(chain.head, 0);
    }
    assert!(dev.needs_interrupt(), "used_event 0 crossed");
    while ring.pop_used().expect("valid").is_some() {}
    assert_eq!(
        dev.used_event(),
        3,
        "re-armed for the next entry when found empty"
    );
    ring.disable_interrupts();
    assert_eq!(dev.used_event(), 3 + 0x8000);
    ring.add(&[buf(0, 1)], 9).expect("room");
    ring.publish();
    let chain = dev.pop().expect("chain");
    dev.push_used(chain.head, 0);
    assert!(!dev.needs_interrupt());
    assert!(ring.enable_interrupts(), "a used entry is already pending");
    assert_eq!(dev.used_event(), 3);

    // Flags form.
    let (mut ring, dev, _hal) = super::tests::ring(8, false);
    ring.disable_interrupts();
    assert_eq!(dev.avail_flags(), AVAIL_F_NO_INTERRUPT);
    assert!(!ring.enable_interrupts());
    assert_eq!(dev.avail_flags(), 0);
}

#[test]
fn bad_used_entries_are_refused_without_ub() {
    let (mut ring, mut dev, _hal) = ring(4, true);
    ring.add(&[buf(0, 1)], 7).expect("room");
    ring.publish();
    let chain = dev.pop().expect("chain");
    dev.push_used_raw(4, 0); // id = size
    dev.push_used_raw(u32::MAX, 0);
    dev.push_used(chain.head, 5);
    dev.push_used(chain.head, 5); // returned twice
    assert_eq!(ring.pop_used(), Err(UsedError::IdOutOfRange(4)));
    assert_eq!(ring.pop_used(), Err(UsedError::IdOutOfRange(u32::MAX)));
    assert_eq!(ring.pop_used(), Ok(Some(Used { token: 7, len: 5 })));
    assert_eq!(ring.pop_used(), Err(UsedError::NotInFlight(chain.head)));
    assert_eq!(ring.pop_used(), Ok(None));
    assert_eq!(
        ring.free_descriptors(),
        4,
        "the double return freed nothing twice"
    );

    dev.force_used_idx(dev.used_idx.wrapping_add(5)); // more than the ring holds
    assert_eq!(ring.pop_used(), Err(UsedError::IndexJump));
    assert!(ring.is_broken());
    assert_eq!(ring.pop_used(), Ok(None));
    assert!(!ring.has_used());
}
