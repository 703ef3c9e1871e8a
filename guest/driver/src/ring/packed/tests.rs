//! The packed-ring protocol against the test device's view of the same memory
//! ([`DevPackedQueue`], written from the spec).

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;
use std::vec;
use std::vec::Vec;

use super::*;
use crate::testing::packed::{
    event_in_window, wrap_at, DevPackedQueue, PackedChain, EV_DESC, EV_DISABLE, EV_ENABLE,
};
use crate::testing::TestHal;

fn ring(size: u16, event_idx: bool, in_order: bool) -> (PackedRing<u32>, DevPackedQueue, TestHal) {
    let hal = TestHal::new(4 << 20);
    let region = DmaRegion::alloc(&hal, PackedLayout::new(size).bytes).expect("dma");
    let ring = PackedRing::new(0, size, region, event_idx, in_order);
    let dev = DevPackedQueue::new(hal.clone(), size, ring.addresses(), event_idx);
    (ring, dev, hal)
}

fn rd(addr: u64, len: u32) -> Buffer {
    Buffer {
        addr,
        len,
        access: Access::DeviceReads,
    }
}

fn wr(addr: u64, len: u32) -> Buffer {
    Buffer {
        addr,
        len,
        access: Access::DeviceWrites,
    }
}

/// A chain of `n` buffers for `token`: a device-readable one at `token << 12`, then `n - 1`
/// device-writable ones of 100 bytes.
fn chain(token: u32, n: usize) -> Vec<Buffer> {
    let mut bufs = vec![rd(u64::from(token) << 12, 10)];
    for k in 1..n {
        bufs.push(wr((u64::from(token) << 12) + 0x100 * k as u64, 100));
    }
    bufs
}

/// The token a device-side chain was added with (see [`chain`]).
fn token_of(chain: &PackedChain) -> u32 {
    (chain.descs[0].addr >> 12) as u32
}

/// A small deterministic generator (xorshift32).
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// The used length the device reports for a chain in these tests: some of its writable bytes.
fn used_len(chain: &PackedChain) -> u32 {
    chain.writable().min(token_of(chain) % 150)
}

#[test]
fn layout_matches_the_spec() {
    for size in [1u16, 3, 256, 32768] {
        let l = PackedLayout::new(size);
        let ring_bytes = 16 * usize::from(size);
        assert_eq!(
            (l.driver, l.device, l.bytes),
            (ring_bytes, ring_bytes + 4, ring_bytes + 8)
        );
    }
    let (ring, _dev, hal) = ring(3, true, false);
    assert_eq!((ring.index(), ring.size()), (0, 3));
    let (desc, driver, device) = ring.addresses();
    assert_eq!(
        (desc % 16, driver - desc, device - desc),
        (0, 48, 52),
        "descriptor ring, driver area, device area"
    );
    let live = hal.live_allocations();
    // SAFETY: `hal` allocated the region; the device model is not used again, nor the ring.
    unsafe { ring.dealloc(&hal) };
    assert_eq!(hal.live_allocations(), live - 1);
}

#[test]
fn round_trips_over_several_wraps() {
    for (size, event_idx) in [(1u16, false), (1, true), (3, true), (3, false), (256, true)] {
        let (mut ring, mut dev, _hal) = ring(size, event_idx, false);
        let mut rng = Rng(0x9e37_79b9 ^ u32::from(size));
        let mut next_token = 1u32;
        let mut returned = 0u32;
        // At least five laps of the ring (and of both wrap counters).
        while dev.used_abs < 5 * u64::from(size) + 7 {
            // Chains of 1..=3 descriptors (at most the ring) until one does not fit.
            let mut added = BTreeMap::new();
            loop {
                let n = 1 + rng.below(usize::from(size).min(3));
                let bufs = chain(next_token, n);
                if ring.add(&bufs, next_token).is_err() {
                    assert!(n > ring.free_descriptors(), "refused with room");
                    break;
                }
                added.insert(next_token, n);
                next_token += 1;
                if rng.below(4) == 0 {
                    break;
                }
            }
            assert!(ring.publish());
            let mut chains: Vec<PackedChain> = std::iter::from_fn(|| dev.pop()).collect();
            assert_eq!(
                chains.len(),
                added.len(),
                "the device sees every published chain"
            );
            for c in &chains {
                assert_eq!(c.descs.len(), added[&token_of(c)], "chain length");
                let writable: Vec<bool> = c.descs.iter().map(|d| d.writable()).collect();
                assert!(!writable[0] && writable[1..].iter().all(|&w| w));
            }
            // Completed out of order.
            rng.shuffle(&mut chains);
            for c in &chains {
                dev.push_used(c, used_len(c));
            }
            for c in &chains {
                let used = ring.pop_used().expect("valid").expect("a used chain");
                assert_eq!(used.token, token_of(c), "tokens in completion order");
                assert_eq!(used.len, used_len(c), "length travels with the chain");
                returned += 1;
            }
            assert_eq!(ring.pop_used(), Ok(None));
            assert_eq!(ring.free_descriptors(), usize::from(size));
        }
        assert_eq!(returned, next_token - 1);
        assert_eq!(dev.avail_abs, dev.used_abs, "every descriptor went round");
        assert!(!ring.is_broken());
    }
}

#[test]
fn only_published_chains_are_visible() {
    let (mut ring, mut dev, _hal) = ring(4, true, false);
    ring.add(&chain(1, 2), 1).expect("room");
    assert!(dev.pop().is_none(), "added, not published");
    assert!(ring.publish());
    assert!(!ring.publish(), "nothing new");
    ring.add(&chain(2, 1), 2).expect("room");
    let first = dev.pop().expect("published chain");
    assert_eq!((token_of(&first), first.pos), (1, 0));
    assert!(dev.pop().is_none(), "the second is not published yet");
    ring.publish();
    assert_eq!(dev.pop().map(|c| (token_of(&c), c.pos)), Some((2, 2)));
}

#[test]
fn chains_wrap_at_the_ring_end() {
    let (mut ring, mut dev, _hal) = ring(5, true, false);
    // Move the ring to position 3.
    for token in 1..=3 {
        ring.add(&chain(token, 1), token).expect("room");
    }
    ring.publish();
    while let Some(c) = dev.pop() {
        dev.push_used(&c, 0);
    }
    while ring.pop_used().expect("valid").is_some() {}
    // Four descriptors over positions 3, 4 | 0, 1: the last two carry the flipped counter (the
    // device model checks each one against its lap).
    let bufs = [
        rd(0x4000, 10),
        wr(0x5000, 20),
        wr(0x6000, 30),
        wr(0x7000, 40),
    ];
    ring.add(&bufs, 4).expect("room");
    assert_eq!(
        ring.add(&chain(5, 2), 5),
        Err(RingFull),
        "one position left"
    );
    ring.add(&chain(5, 1), 5).expect("the last position");
    assert_eq!(ring.free_descriptors(), 0);
    ring.publish();
    let wrapped = dev.pop().expect("the wrapping chain");
    assert_eq!(wrapped.pos, 3);
    let seen: Vec<(u64, u32, bool)> = wrapped
        .descs
        .iter()
        .map(|d| (d.addr, d.len, d.writable()))
        .collect();
    assert_eq!(
        seen,
        [
            (0x4000, 10, false),
            (0x5000, 20, true),
            (0x6000, 30, true),
            (0x7000, 40, true)
        ]
    );
    let last = dev.pop().expect("the chain after it");
    assert_eq!((last.pos, token_of(&last)), (2, 5));
    assert!(!wrap_at(dev.avail_abs - 1, 5), "in the second lap");
    // Returned: the used descriptor for the wrapping chain goes to position 3, the next one to
    // position 2 of the second lap.
    dev.push_used(&wrapped, 90);
    dev.push_used(&last, 0);
    assert_eq!(ring.pop_used(), Ok(Some(Used { token: 4, len: 90 })));
    assert_eq!(ring.pop_used(), Ok(Some(Used { token: 5, len: 0 })));
    assert_eq!(ring.pop_used(), Ok(None));
    assert_eq!(ring.free_descriptors(), 5);
    // And a chain wrapping the second lap's end (positions 3, 4 | 0) back into the first
    // counter value.
    ring.add(&chain(6, 3), 6).expect("room");
    ring.publish();
    let c = dev.pop().expect("chain");
    assert_eq!((c.pos, c.descs.len()), (3, 3));
    dev.push_used(&c, 200);
    assert_eq!(ring.pop_used(), Ok(Some(Used { token: 6, len: 200 })));
}

#[test]
fn in_order_batches_return_every_earlier_chain() {
    for size in [1u16, 3, 7, 256] {
        let (mut ring, mut dev, _hal) = ring(size, true, true);
        let mut rng = Rng(0x2545_f491 ^ u32::from(size));
        let mut next_token = 1u32;
        let mut expect_token = 1u32;
        while dev.used_abs < 6 * u64::from(size) + 5 {
            loop {
                let n = 1 + rng.below(usize::from(size).min(3));
                if ring.add(&chain(next_token, n), next_token).is_err() {
                    break;
                }
                next_token += 1;
                if rng.below(3) == 0 {
                    break;
                }
            }
            ring.publish();
            let chains: Vec<PackedChain> = std::iter::from_fn(|| dev.pop()).collect();
            // Returned in batches of 1..=4 chains with one used descriptor each.
            let mut rest = &chains[..];
            while !rest.is_empty() {
                let k = 1 + rng.below(rest.len().min(4));
                let (batch, tail) = rest.split_at(k);
                let last = &batch[k - 1];
                dev.push_used_batch(batch, used_len(last));
                assert_eq!(
                    ring.used_pending(),
                    k as u16,
                    "the batch counts as all its chains"
                );
                for c in batch {
                    let used = ring.pop_used().expect("valid").expect("chain");
                    assert_eq!(used.token, expect_token, "in order");
                    let len = if std::ptr::eq(c, last) {
                        used_len(c)
                    } else {
                        c.writable()
                    };
                    assert_eq!(used.len, len, "skipped chains count as used completely");
                    expect_token += 1;
                }
                rest = tail;
            }
            assert_eq!(ring.pop_used(), Ok(None));
            assert_eq!(ring.free_descriptors(), usize::from(size));
        }
        assert_eq!(expect_token, next_token);
        assert!(!ring.is_broken());
    }
}

#[test]
fn in_order_batch_can_end_before_what_is_in_flight() {
    let (mut ring, mut dev, _hal) = ring(8, true, true);
    for token in 1..=5 {
        ring.add(&chain(token, 1 + token as usize % 2), token)
            .expect("room");
    }
    ring.publish();
    let chains: Vec<PackedChain> = std::iter::from_fn(|| dev.pop()).collect();
    dev.push_used_batch(&chains[..2], 0);
    assert!(ring.has_used());
    assert_eq!(ring.used_pending(), 2);
    assert_eq!(ring.pop_used().expect("valid").map(|u| u.token), Some(1));
    assert_eq!(ring.used_pending(), 1, "the rest of the batch");
    assert_eq!(ring.pop_used().expect("valid").map(|u| u.token), Some(2));
    assert_eq!(ring.pop_used(), Ok(None), "3..=5 are still with the device");
    dev.push_used_batch(&chains[2..3], 0);
    dev.push_used_batch(&chains[3..], 100);
    assert_eq!(ring.used_pending(), 3, "two used descriptors, three chains");
    let rest: Vec<(u32, u32)> = std::iter::from_fn(|| ring.pop_used().expect("valid"))
        .map(|u| (u.token, u.len))
        .collect();
    // Chains 3 and 5 have two descriptors (one writable: 100 bytes), 4 has one.
    assert_eq!(rest, [(3, 0), (4, 0), (5, 100)]);
}

#[test]
fn used_pending_walks_out_of_order_returns() {
    let (mut ring, mut dev, _hal) = ring(6, true, false);
    for token in 1..=3 {
        ring.add(&chain(token, 2), token).expect("room");
    }
    ring.publish();
    let chains: Vec<PackedChain> = std::iter::from_fn(|| dev.pop()).collect();
    assert_eq!(ring.used_pending(), 0);
    assert!(!ring.has_used());
    dev.push_used(&chains[2], 1);
    dev.push_used(&chains[0], 1);
    assert_eq!(ring.used_pending(), 2);
    assert!(ring.has_used());
    assert_eq!(ring.pop_used().expect("valid").map(|u| u.token), Some(3));
    assert_eq!(ring.used_pending(), 1);
    dev.push_used(&chains[1], 1);
    assert_eq!(ring.used_pending(), 2);
}

/// Publishes `n` one-descriptor chains and returns them used, so the ring's positions move on.
fn cycle(ring: &mut PackedRing<u32>, dev: &mut DevPackedQueue, n: u16) {
    for token in 0..u32::from(n) {
        ring.add(&chain(token, 1), token).expect("room");
    }
    ring.publish();
    ring.kick_decision();
    while let Some(c) = dev.pop() {
        dev.push_used(&c, 0);
    }
    while ring.pop_used().expect("valid").is_some() {}
}

#[test]
fn kick_decision_in_the_three_flag_modes() {
    for event_idx in [false, true] {
        let (mut ring, dev, _hal) = ring(8, event_idx, false);
        assert_eq!(ring.kick_decision(), Kick::NothingNew);
        dev.set_event(EV_ENABLE, 0);
        ring.add(&chain(1, 1), 1).expect("room");
        ring.publish();
        assert_eq!(ring.kick_decision(), Kick::Notify);
        assert_eq!(ring.kick_decision(), Kick::NothingNew, "nothing new since");
        dev.set_event(EV_DISABLE, 0);
        ring.add(&chain(2, 1), 2).expect("room");
        ring.publish();
        assert_eq!(ring.kick_decision(), Kick::SuppressedByFlag);
        ring.add(&chain(3, 1), 3).expect("room");
        assert_eq!(
            ring.kick_decision(),
            Kick::NothingNew,
            "added, not published"
        );
        // DESC for position 4 of the first lap: published positions so far 0..=1, then 2..=3.
        dev.set_event(EV_DESC, 4 | 0x8000);
        ring.publish();
        let expect = if event_idx {
            Kick::SuppressedByEventIdx
        } else {
            Kick::Notify // DESC is only valid with EVENT_IDX: notify
        };
        assert_eq!(ring.kick_decision(), expect);
        ring.add(&chain(4, 2), 4).expect("room");
        ring.publish();
        assert_eq!(
            ring.kick_decision(),
            Kick::Notify,
            "position 4 made available"
        );
        ring.add(&chain(5, 1), 5).expect("room");
        ring.publish();
        let expect = if event_idx {
            Kick::SuppressedByEventIdx
        } else {
            Kick::Notify
        };
        assert_eq!(ring.kick_decision(), expect, "already past 4");
    }
}

#[test]
fn kick_decision_after_more_than_a_lap_notifies() {
    // Published twice without a decision in between, the device returning everything: more
    // than a lap of positions since the last decision, which passed every possible event.
    let (mut ring, mut dev, _hal) = ring(4, true, false);
    for off_wrap in [0, 3, 0x8000, 0x8003] {
        dev.set_event(EV_DESC, off_wrap);
        for _ in 0..2 {
            for token in 0..3 {
                ring.add(&chain(token, 1), token).expect("room");
            }
            ring.publish();
            while let Some(c) = dev.pop() {
                dev.push_used(&c, 0);
            }
            while ring.pop_used().expect("valid").is_some() {}
        }
        assert_eq!(
            ring.kick_decision(),
            Kick::Notify,
            "off_wrap {off_wrap:#06x}"
        );
    }
}

#[test]
fn kick_decision_at_the_wrap() {
    // Ring of 4; a batch of 2 one-descriptor chains published from position 3 covers position
    // 3 of one lap and position 0 of the next.
    for first_wrap in [true, false] {
        let (mut ring, mut dev, _hal) = ring(4, true, false);
        if !first_wrap {
            // One lap on: the batch crosses from the second lap (wrap 0) into the third (1).
            cycle(&mut ring, &mut dev, 4);
        }
        cycle(&mut ring, &mut dev, 3);
        let w = |wrap: bool| if wrap { 0x8000u16 } else { 0 };
        let cases = [
            // (off_wrap, notify?)
            (2 | w(first_wrap), false),  // before the batch
            (3 | w(first_wrap), true),   // just before the wrap
            (w(!first_wrap), true),      // just after the wrap (offset 0)
            (1 | w(!first_wrap), false), // not reached yet
            (3 | w(!first_wrap), false), // position 3 of the next lap
            (w(first_wrap), false),      // offset 0 of this lap: long past
        ];
        for (off_wrap, notify) in cases {
            dev.set_event(EV_DESC, off_wrap);
            for token in [10, 11] {
                ring.add(&chain(token, 1), token).expect("room");
            }
            ring.publish();
            let expect = if notify {
                Kick::Notify
            } else {
                Kick::SuppressedByEventIdx
            };
            assert_eq!(
                ring.kick_decision(),
                expect,
                "off_wrap {off_wrap:#06x} first wrap {first_wrap}"
            );
            // Back to position 3 of the same lap: give them back, then go round once.
            while let Some(c) = dev.pop() {
                dev.push_used(&c, 0);
            }
            while ring.pop_used().expect("valid").is_some() {}
            cycle(&mut ring, &mut dev, 2);
            cycle(&mut ring, &mut dev, 4);
            assert_eq!(dev.avail_abs % 8, if first_wrap { 3 } else { 7 });
        }
    }
}

/// Moves the ring `total` positions on with one-descriptor chains returned in order.
fn advance(ring: &mut PackedRing<u32>, dev: &mut DevPackedQueue, mut total: u64) {
    while total > 0 {
        let n = total.min(u64::from(ring.size()));
        cycle(ring, dev, n as u16);
        total -= n;
    }
}

#[test]
fn kick_decision_matches_the_event_window_everywhere() {
    // Every event offset and wrap counter, against batch windows all over two laps and more
    // (sizes that are and are not powers of two), compared with the device model's scan.
    for size in [1u16, 3, 4, 5] {
        let (mut ring, mut dev, _hal) = ring(size, true, false);
        let mut rng = Rng(0x1357_9bdf ^ u32::from(size));
        let lap = u64::from(size);
        for _ in 0..24 {
            let n = 1 + rng.below(usize::from(size)) as u64;
            for off in 0..size {
                for wrap in [false, true] {
                    let at = dev.avail_abs;
                    let off_wrap = off | if wrap { 0x8000 } else { 0 };
                    dev.set_event(EV_DESC, off_wrap);
                    for token in 0..n as u32 {
                        ring.add(&chain(token, 1), token).expect("room");
                    }
                    ring.publish();
                    let expect = if event_in_window(off_wrap, at, at + n, size) {
                        Kick::Notify
                    } else {
                        Kick::SuppressedByEventIdx
                    };
                    assert_eq!(
                        ring.kick_decision(),
                        expect,
                        "size {size} window {at}..{} off {off} wrap {wrap}",
                        at + n
                    );
                    while let Some(c) = dev.pop() {
                        dev.push_used(&c, 0);
                    }
                    while ring.pop_used().expect("valid").is_some() {}
                    // Two laps on from `at`: the same position and wrap counter.
                    dev.set_event(EV_ENABLE, 0);
                    advance(&mut ring, &mut dev, 2 * lap - n);
                    assert_eq!(dev.avail_abs, at + 2 * lap);
                }
            }
            let step = 1 + rng.below(usize::from(size)) as u64;
            advance(&mut ring, &mut dev, step);
        }
    }
}

#[test]
fn interrupt_suppression_flags_without_event_idx() {
    let (mut ring, mut dev, _hal) = ring(4, false, false);
    assert_eq!(dev.driver_event().0, EV_ENABLE);
    ring.disable_interrupts();
    assert_eq!(dev.driver_event().0, EV_DISABLE);
    cycle(&mut ring, &mut dev, 1);
    assert!(!dev.needs_interrupt(), "disabled");
    assert!(!ring.enable_interrupts());
    assert_eq!(dev.driver_event().0, EV_ENABLE);
    ring.add(&chain(1, 1), 1).expect("room");
    ring.publish();
    let c = dev.pop().expect("chain");
    dev.push_used(&c, 0);
    assert!(dev.needs_interrupt(), "enabled");
    ring.disable_interrupts();
    assert!(ring.enable_interrupts(), "a used chain is pending");
}

#[test]
fn interrupt_suppression_with_event_idx_across_the_wrap() {
    let (mut ring, mut dev, _hal) = ring(3, true, false);
    assert!(!ring.enable_interrupts());
    assert_eq!(
        dev.driver_event(),
        (EV_DESC, 0x8000),
        "next used: position 0, wrap 1"
    );
    let mut expected_pos = Pos::START;
    // Several laps one chain at a time: the event follows the next used position, wrap
    // counter included, and every chain raises an interrupt.
    for token in 0..10u32 {
        ring.add(&chain(token, 1 + token as usize % 2), token)
            .expect("room");
        ring.publish();
        let c = dev.pop().expect("chain");
        dev.push_used(&c, 0);
        assert!(dev.needs_interrupt(), "the event at the next used position");
        assert!(ring.pop_used().expect("valid").is_some());
        expected_pos = expected_pos.advance(c.descs.len() as u16, 3);
        assert_eq!(ring.pop_used(), Ok(None));
        assert_eq!(
            dev.driver_event(),
            (EV_DESC, expected_pos.off_wrap()),
            "re-armed when found empty"
        );
    }
    // Disabled: no interrupt, whatever the device returns; enabling reports it pending.
    ring.disable_interrupts();
    assert_eq!(dev.driver_event().0, EV_DISABLE);
    ring.add(&chain(20, 1), 20).expect("room");
    ring.publish();
    let c = dev.pop().expect("chain");
    dev.push_used(&c, 0);
    assert!(!dev.needs_interrupt());
    assert_eq!(ring.pop_used().expect("valid").map(|u| u.token), Some(20));
    assert_eq!(ring.pop_used(), Ok(None));
    assert_eq!(
        dev.driver_event().0,
        EV_DISABLE,
        "popping keeps them disabled"
    );
    ring.add(&chain(21, 1), 21).expect("room");
    ring.publish();
    let c = dev.pop().expect("chain");
    dev.push_used(&c, 0);
    assert!(ring.enable_interrupts(), "a used chain is already pending");
}

#[test]
fn interrupt_event_just_before_and_after_the_wrap() {
    // Ring of 4, one-descriptor chains: the next used position goes 3 (wrap 1) → 0 (wrap 0).
    let (mut ring, mut dev, _hal) = ring(4, true, false);
    cycle(&mut ring, &mut dev, 3);
    assert!(!ring.enable_interrupts());
    assert_eq!(dev.driver_event(), (EV_DESC, 3 | 0x8000));
    dev.needs_interrupt(); // the device's decision point after the cycles
    for token in [1, 2] {
        ring.add(&chain(token, 1), token).expect("room");
    }
    ring.publish();
    let a = dev.pop().expect("chain");
    let b = dev.pop().expect("chain");
    dev.push_used(&a, 0);
    assert!(dev.needs_interrupt(), "position 3 of the first lap used");
    dev.push_used(&b, 0);
    assert!(!dev.needs_interrupt(), "event already passed");
    assert!(ring.pop_used().expect("valid").is_some());
    assert!(ring.pop_used().expect("valid").is_some());
    assert_eq!(ring.pop_used(), Ok(None));
    assert_eq!(
        dev.driver_event(),
        (EV_DESC, 1),
        "position 1 of the second lap"
    );
    // Wrap counter 0 now; the third lap starts with wrap 1 again.
    cycle(&mut ring, &mut dev, 3);
    dev.needs_interrupt();
    assert_eq!(
        dev.driver_event(),
        (EV_DESC, 0x8000),
        "position 0 of the third lap"
    );
}

#[test]
fn delayed_interrupts_wait_for_three_quarters() {
    let (mut ring, mut dev, _hal) = ring(16, true, false);
    cycle(&mut ring, &mut dev, 14);
    dev.needs_interrupt();
    for token in 0..8 {
        ring.add(&chain(token, 1), token).expect("room");
    }
    ring.publish();
    // 8 in flight from position 14 (wrap 1): the event 6 on, position 4 of the next lap.
    assert!(!ring.enable_interrupts_delayed());
    assert_eq!(dev.driver_event(), (EV_DESC, 4));
    let chains: Vec<PackedChain> = std::iter::from_fn(|| dev.pop()).collect();
    for c in &chains[..6] {
        dev.push_used(c, 0);
        assert!(!dev.needs_interrupt(), "not yet three quarters");
    }
    // The driver polls meanwhile: the delayed event stays where it is.
    assert!(ring.pop_used().expect("valid").is_some());
    assert_eq!(dev.driver_event(), (EV_DESC, 4));
    dev.push_used(&chains[6], 0);
    assert!(dev.needs_interrupt(), "the seventh crosses position 4");
    dev.push_used(&chains[7], 0);
    while ring.pop_used().expect("valid").is_some() {}
    assert_eq!(
        dev.driver_event(),
        (EV_DESC, 6),
        "past the delayed event: armed at the next used position"
    );
    // Nothing in flight: the same as enabling.
    assert!(!ring.enable_interrupts_delayed());
    assert_eq!(dev.driver_event(), (EV_DESC, 6));
    // Something already used: reported, so the caller polls.
    ring.add(&chain(9, 1), 9).expect("room");
    ring.publish();
    let c = dev.pop().expect("chain");
    dev.push_used(&c, 0);
    assert!(ring.enable_interrupts_delayed());
}

#[test]
fn hostile_used_descriptors_break_the_ring() {
    // (what the device writes after one published chain of 3 descriptors and one unpublished
    // chain, the error)
    type Attack = fn(&mut DevPackedQueue, &PackedChain, u16) -> PackedUsedError;
    let attacks: [Attack; 6] = [
        |dev, _, _| {
            dev.push_used_raw(8, 0, false, 1);
            PackedUsedError::IdOutOfRange(8)
        },
        |dev, _, _| {
            dev.push_used_raw(u16::MAX, 0, false, 1);
            PackedUsedError::IdOutOfRange(u16::MAX)
        },
        |dev, _, _| {
            dev.push_used_raw(5, 0, false, 1); // never handed out
            PackedUsedError::NotInFlight(5)
        },
        |dev, _, unpublished| {
            dev.push_used_raw(unpublished, 0, false, 1);
            PackedUsedError::NotInFlight(unpublished)
        },
        |dev, c, _| {
            dev.push_used(c, 201); // 2 × 100 writable bytes
            PackedUsedError::LenOutOfRange { id: c.id, len: 201 }
        },
        |dev, c, _| {
            dev.push_used(c, 0);
            dev.push_used(c, 0); // returned twice
            PackedUsedError::NotInFlight(c.id)
        },
    ];
    for (i, attack) in attacks.into_iter().enumerate() {
        let (mut ring, mut dev, hal) = ring(8, true, i % 2 == 0);
        ring.add(&chain(1, 3), 1).expect("room");
        ring.publish();
        ring.add(&chain(2, 1), 2).expect("room");
        let unpublished = 1; // the second id handed out
        let c = dev.pop().expect("chain");
        let error = attack(&mut dev, &c, unpublished);
        let mut results = Vec::new();
        loop {
            match ring.pop_used() {
                Ok(Some(used)) => results.push(used.token),
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(e, error, "attack {i}");
                    break;
                }
            }
        }
        assert!(ring.is_broken(), "attack {i}");
        assert_eq!(ring.pop_used(), Ok(None), "nothing more from a broken ring");
        assert!(!ring.has_used());
        assert_eq!(ring.used_pending(), 0);
        // A per-queue reset hands back what is still in flight and starts over.
        let mut out = Vec::new();
        ring.reinit(&mut out);
        results.extend(out);
        results.sort_unstable();
        assert_eq!(results, [1, 2], "attack {i}: every token exactly once");
        assert!(!ring.is_broken());
        assert_eq!(ring.free_descriptors(), 8);
        let mut dev = DevPackedQueue::new(hal.clone(), 8, ring.addresses(), true);
        ring.add(&chain(3, 2), 3).expect("room");
        ring.publish();
        let c = dev.pop().expect("chain after reinit");
        assert_eq!(c.pos, 0);
        dev.push_used(&c, 7);
        assert_eq!(ring.pop_used(), Ok(Some(Used { token: 3, len: 7 })));
    }
}

#[test]
fn written_length_without_the_write_flag_is_ignored() {
    let (mut ring, mut dev, _hal) = ring(4, false, false);
    ring.add(&chain(1, 1), 1).expect("room");
    ring.add(&chain(2, 2), 2).expect("room");
    ring.publish();
    let a = dev.pop().expect("chain");
    let b = dev.pop().expect("chain");
    dev.push_used_raw(a.id, 60, false, 1); // a transmit chain: the length is reserved
    dev.push_used_raw(b.id, 1000, false, 2);
    assert_eq!(ring.pop_used(), Ok(Some(Used { token: 1, len: 0 })));
    assert_eq!(ring.pop_used(), Ok(Some(Used { token: 2, len: 0 })));
    // WRITE on a chain without device-writable buffers claims bytes it cannot hold.
    ring.add(&chain(3, 1), 3).expect("room");
    ring.publish();
    let c = dev.pop().expect("chain");
    dev.push_used_raw(c.id, 1, true, 1);
    assert_eq!(
        ring.pop_used(),
        Err(PackedUsedError::LenOutOfRange { id: c.id, len: 1 })
    );
    assert!(ring.is_broken());
}

#[test]
fn reinit_keeps_the_interrupt_mode_and_returns_tokens() {
    for disabled in [false, true] {
        let (mut ring, mut dev, hal) = ring(5, true, false);
        cycle(&mut ring, &mut dev, 4);
        if disabled {
            ring.disable_interrupts();
        } else {
            ring.enable_interrupts();
        }
        ring.add(&chain(1, 2), 1).expect("room");
        ring.publish();
        ring.add(&chain(2, 2), 2).expect("room");
        let mut out = Vec::new();
        ring.reinit(&mut out);
        out.sort_unstable();
        assert_eq!(out, [1, 2]);
        let dev = DevPackedQueue::new(hal.clone(), 5, ring.addresses(), true);
        let expect = if disabled {
            (EV_DISABLE, 0)
        } else {
            (EV_DESC, 0x8000)
        };
        assert_eq!(dev.driver_event(), expect);
        assert_eq!(ring.kick_decision(), Kick::NothingNew);
        assert_eq!((ring.free_descriptors(), ring.used_pending()), (5, 0));
    }
}

#[test]
fn ids_and_descriptors_are_accounted_per_chain() {
    let (mut ring, mut dev, _hal) = ring(3, false, false);
    assert_eq!(ring.add(&[], 0), Err(RingFull), "empty chain");
    assert_eq!(
        ring.add(&chain(1, 4), 1),
        Err(RingFull),
        "longer than the ring"
    );
    ring.add(&chain(1, 3), 1).expect("the whole ring");
    assert_eq!(ring.add(&chain(2, 1), 2), Err(RingFull));
    ring.publish();
    let c = dev.pop().expect("chain");
    assert_eq!(c.descs.len(), 3);
    dev.push_used(&c, 0);
    assert_eq!(ring.pop_used().expect("valid").map(|u| u.token), Some(1));
    // Three one-descriptor chains need three ids.
    for token in 2..=4 {
        ring.add(&chain(token, 1), token).expect("room");
    }
    ring.publish();
    let mut ids: Vec<u16> = std::iter::from_fn(|| dev.pop()).map(|c| c.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2]);
}

/// How long either side waits for a notification before calling it lost.
const LOST: Duration = Duration::from_secs(10);

#[test]
fn a_concurrent_device_sees_every_kick_and_the_driver_every_interrupt() {
    // The device on its own thread: it takes what is available, returns it in random batches
    // (out of order unless IN_ORDER), raises an interrupt when the driver's structure asks for
    // one, and sleeps until a kick once the ring is empty, after re-enabling kicks. The driver
    // publishes, kicks when the device's structure asks for it, reaps, and sleeps until an
    // interrupt once nothing is used, after re-enabling interrupts. A suppressed notification
    // that was needed leaves one side asleep: the test fails on the timeout.
    const TOTAL: u32 = 20_000;
    for (event_idx, in_order) in [(true, false), (false, false), (true, true), (false, true)] {
        let (mut ring, mut dev, _hal) = ring(7, event_idx, in_order);
        let (kick_tx, kick_rx) = mpsc::channel::<()>();
        let (irq_tx, irq_rx) = mpsc::channel::<()>();
        let device = std::thread::spawn(move || {
            let mut rng = Rng(0x0bad_5eed);
            let mut held: Vec<PackedChain> = Vec::new();
            let mut returned = 0u32;
            dev.disable_notifications();
            while returned < TOTAL {
                while let Some(c) = dev.pop() {
                    held.push(c);
                }
                if !held.is_empty() {
                    let k = 1 + rng.below(held.len());
                    let batch: Vec<PackedChain> = held.drain(..k).collect();
                    if in_order {
                        dev.push_used_batch(&batch, 0);
                    } else {
                        for c in batch.iter().rev() {
                            dev.push_used(c, 0);
                        }
                    }
                    returned += k as u32;
                    if dev.needs_interrupt() {
                        irq_tx.send(()).expect("driver alive");
                    }
                    continue;
                }
                if dev.enable_notifications() {
                    dev.disable_notifications();
                    continue;
                }
                kick_rx.recv_timeout(LOST).expect("a kick was lost");
                dev.disable_notifications();
            }
        });
        let mut rng = Rng(0x5eed_0bad);
        let (mut sent, mut got) = (0u32, Vec::new());
        ring.enable_interrupts();
        while got.len() < TOTAL as usize {
            while sent < TOTAL {
                let n = 1 + rng.below(2);
                if ring.add(&chain(sent, n), sent).is_err() {
                    break;
                }
                sent += 1;
                if rng.below(3) == 0 {
                    break;
                }
            }
            ring.publish();
            if ring.kick_decision() == Kick::Notify {
                kick_tx.send(()).expect("device alive");
            }
            while let Some(used) = ring.pop_used().expect("valid") {
                got.push(used.token);
            }
            let can_add = sent < TOTAL && ring.free_descriptors() >= 2;
            if !can_add && got.len() < TOTAL as usize && !ring.enable_interrupts() {
                irq_rx.recv_timeout(LOST).expect("an interrupt was lost");
            }
        }
        device.join().expect("device thread");
        if in_order {
            assert!(got.windows(2).all(|w| w[0] + 1 == w[1]), "in order");
        }
        got.sort_unstable();
        assert!(got.iter().copied().eq(0..TOTAL), "every token once");
        assert!(!ring.is_broken());
        assert_eq!(ring.free_descriptors(), 7);
    }
}
