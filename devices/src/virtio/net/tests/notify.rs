//! Notification suppression in both directions: EVENT_IDX (`used_event` / `avail_event`) and,
//! without it, `VRING_AVAIL_F_NO_INTERRUPT` / `VRING_USED_F_NO_NOTIFY`.

use virtio_queue::QueueT;

use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use super::driver::DriverRing;
use super::support::{guest_mem, GuestQueue};
use crate::test_utils::packed::GuestPackedQueue;
use crate::test_utils::queue::DATA_START;
use crate::virtio::net::metrics::{RxCounters, TxCounters};
use crate::virtio::net::tests::support::{drain, frame, pair, tx_into_full_backend, wire, Ring};
use crate::virtio::net::TxQueue;
use crate::virtio::net::{RxMode, TxStop};
use crate::virtio::ring::vring_need_event;

/// `event` lies in `[old, new)` on the u16 circle: the plain-words definition of the spec's
/// `vring_need_event`.
fn event_in_window(event: u16, new: u16, old: u16) -> bool {
    event.wrapping_sub(old) < new.wrapping_sub(old)
}

#[test]
fn vring_need_event_reference_matches_the_spec_table() {
    // (used_event, new, old, interrupt?)
    let table: &[(u16, u16, u16, bool)] = &[
        (0, 1, 0, true),
        (1, 1, 0, false),
        (4, 5, 2, true),
        (5, 5, 2, false),
        (1, 5, 2, false),
        (65535, 1, 65534, true),
        (0, 1, 65534, true),
        (1, 1, 65534, false),
        (65533, 1, 65534, false),
        (65534, 0, 65534, true),
        (0, 0, 65534, false),
        (65534, 65535, 65534, true),
    ];
    for &(event, new, old, expected) in table {
        assert_eq!(
            vring_need_event(event, new, old),
            expected,
            "{event} {new} {old}"
        );
    }
    for old in [0u16, 1, 100, 32767, 32768, 65530, 65535] {
        for n in [0u16, 1, 2, 7, 255] {
            let new = old.wrapping_add(n);
            for event in (0..=u16::MAX)
                .step_by(97)
                .chain([old, new, new.wrapping_sub(1)])
            {
                assert_eq!(
                    vring_need_event(event, new, old),
                    event_in_window(event, new, old),
                    "{event} {new} {old}"
                );
            }
        }
    }
}

#[test]
fn event_idx_interrupts_follow_vring_need_event_across_wrap_around() {
    // (index before the batch, frames in the batch, used_event)
    let cases: &[(u16, u16, u16)] = &[
        (0, 1, 0),
        (0, 1, 1),
        (0, 3, 2),
        (0, 3, 3),
        (10, 4, 9),
        (10, 4, 13),
        (65534, 3, 65534),
        (65534, 3, 65535),
        (65534, 3, 0),
        (65534, 3, 1),
        (65534, 3, 65533),
        (65535, 1, 65535),
        (65535, 2, 0),
        (65535, 2, 1),
        (65520, 16, 65535),
        (65520, 16, 0),
    ];
    for &(start, n, used_event) in cases {
        let mut ring = Ring::new(16);
        ring.queue.set_event_idx(true);
        ring.driver.start_at(&mut ring.queue, start);
        for i in 0..n {
            ring.driver.push_tx(&wire(&frame(64, i as u8)), &[]);
        }
        ring.driver.set_used_event(used_event);
        let (mut backend, _peer) = pair();
        let mut counters = TxCounters::default();

        let outcome = ring.tx(&mut backend, &mut counters);

        let new = start.wrapping_add(n);
        let expected = vring_need_event(used_event, new, start);
        let case = format!("start {start}, {n} frames, used_event {used_event}");
        assert_eq!(ring.driver.used_idx(), new, "{case}");
        assert_eq!(outcome.needs_interrupt, expected, "{case}");
        assert_eq!(counters.interrupts_raised, u64::from(expected), "{case}");
        assert_eq!(
            counters.interrupts_suppressed_event_idx,
            u64::from(!expected),
            "{case}"
        );
        // The driver is asked to kick at its next buffer.
        assert_eq!(ring.driver.avail_event(), new, "{case}");
    }
}

/// Kick coalescing on the split ring: a drained queue sets `avail_event` `ahead` entries past
/// the next one (across the 16-bit wrap; at most the queue size less one), so the driver's
/// `vring_need_event` asks for no kick until it has queued that many more.
#[test]
fn kick_ahead_moves_avail_event_past_the_next_entry() {
    for (start, ahead, expected) in [
        (0u16, 0u16, 0u16),
        (0, 8, 8),
        (65530, 8, 8),
        (100, 15, 15),
        (100, 16, 15),
        (100, u16::MAX, 15),
    ] {
        let mut ring = Ring::new(16);
        ring.queue.set_event_idx(true);
        ring.driver.start_at(&mut ring.queue, start);
        let mut txq = ring.tx_queue();
        txq.set_kick_ahead(ahead);
        let (mut backend, _peer) = pair();
        let mut counters = TxCounters::default();
        let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
        assert_eq!(outcome.stop, TxStop::Drained);
        let case = format!("start {start}, ahead {ahead}");
        let event = ring.driver.avail_event();
        assert_eq!(event, start.wrapping_add(expected), "{case}");
        // The driver queues `expected` entries without a kick; the next one kicks.
        for n in 1..=expected.wrapping_add(1) {
            let new = start.wrapping_add(n);
            assert_eq!(
                vring_need_event(event, new, new.wrapping_sub(1)),
                n == expected.wrapping_add(1),
                "{case}, entry {n}"
            );
        }
    }
}

/// A device woken before the driver reached a far `avail_event` (by its own look, or because
/// the re-check found entries) takes the event back while it works: the driver's publishes then
/// ask for no kick until the device drains and moves the event on again (a kick to an awake
/// device costs the guest an exit for nothing).
#[test]
fn a_device_at_work_takes_a_far_kick_event_back() {
    let big = wire(&frame(8000, 4));
    let mut ring = Ring::new(256);
    ring.queue.set_event_idx(true);
    let mut txq = ring.tx_queue();
    txq.set_kick_ahead(64);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(ring.driver.avail_event(), 64);
    // Fewer than 64 frames, no kick; the device looks by itself and the backend fills up
    // part-way: it stays awake, notifications off.
    ring.push_copies(&big, 40);
    let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::BackendFull);
    // The driver queues past the old event while the device works: no publish kicks.
    let event = ring.driver.avail_event();
    for _ in 0..100 {
        let old = ring.driver.avail_idx();
        ring.driver.push_tx(&big, &[]);
        let new = ring.driver.avail_idx();
        assert!(
            !vring_need_event(event, new, old),
            "a kick at {new} with avail_event {event} while the device is awake"
        );
    }
    // Drained again, the event is ahead again, counted from where the device stopped.
    loop {
        drain(&peer);
        let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
        if outcome.stop == TxStop::Drained {
            break;
        }
    }
    drain(&peer);
    assert_eq!(counters.frames, 140);
    assert_eq!(ring.driver.avail_event(), 140 + 64);
}

#[test]
fn event_idx_ignores_the_no_interrupt_flag() {
    let mut ring = Ring::new(16);
    ring.queue.set_event_idx(true);
    ring.driver.set_avail_flags(1);
    ring.driver.set_used_event(0);
    ring.driver.push_tx(&wire(&frame(64, 0)), &[]);
    let (mut backend, _peer) = pair();
    let mut counters = TxCounters::default();
    let outcome = ring.tx(&mut backend, &mut counters);
    assert!(outcome.needs_interrupt);
}

#[test]
fn no_interrupt_flag_is_honoured_without_event_idx() {
    let mut ring = Ring::new(16);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();

    ring.driver.set_avail_flags(1);
    ring.driver.push_tx(&wire(&frame(64, 1)), &[]);
    let outcome = ring.tx(&mut backend, &mut counters);
    assert!(!outcome.needs_interrupt);
    assert_eq!(counters.interrupts_suppressed_no_interrupt, 1);
    assert_eq!(counters.interrupts_raised, 0);
    assert_eq!(ring.driver.used_idx(), 1, "the buffer is still returned");

    ring.driver.set_avail_flags(0);
    ring.driver.push_tx(&wire(&frame(64, 2)), &[]);
    let outcome = ring.tx(&mut backend, &mut counters);
    assert!(outcome.needs_interrupt);
    assert_eq!(counters.interrupts_raised, 1);

    // Same on the rx side.
    let mut rx = ring.second();
    rx.driver.push_rx(&[2048]);
    rx.driver.push_rx(&[2048]);
    rx.driver.set_avail_flags(1);
    peer.send_frame(&wire(&frame(100, 3))).expect("send");
    let mut rx_counters = RxCounters::default();
    let outcome = rx.rx(&mut backend, RxMode::Mergeable, &mut rx_counters);
    assert!(!outcome.needs_interrupt);
    assert_eq!(rx_counters.interrupts_suppressed_no_interrupt, 1);
    assert_eq!(rx_counters.frames, 1);
}

#[test]
fn driver_notifications_are_off_while_the_device_is_busy() {
    // The backend fills up mid-drain: the device will come back by itself, no kick wanted.
    let (_, mut ring, mut backend, peer, mut counters) = tx_into_full_backend(100);
    assert_eq!(
        ring.driver.used_flags(),
        1,
        "VRING_USED_F_NO_NOTIFY while busy"
    );

    drain(&peer);
    loop {
        let outcome = ring.tx(&mut backend, &mut counters);
        drain(&peer);
        if outcome.stop == TxStop::Drained {
            break;
        }
    }
    assert_eq!(
        ring.driver.used_flags(),
        0,
        "notifications back on once drained"
    );
    assert_eq!(counters.frames, 100);
}

#[test]
fn interrupts_are_never_missed_nor_sent_against_the_drivers_wish_across_the_wrap() {
    for event_idx in [true, false] {
        interrupts_across_the_wrap::<GuestQueue>(event_idx);
        interrupts_across_the_wrap::<GuestPackedQueue>(event_idx);
    }
}

/// 60 batches of 1..=4 frames through a 4-entry ring: the packed ring's wrap counter flips every
/// lap, the split ring's indexes start 5 before their 16-bit wrap. Before each batch the driver
/// asks for an interrupt at its first used entry, its last, one just past it, one in between,
/// or none at all (DISABLE, NO_INTERRUPT, or `used_event` behind). Every batch that reaches the
/// entry asked for (any batch, with interrupts merely enabled) must raise, and no other: the
/// missed and the unwanted interrupts are counted, and both must be 0.
fn interrupts_across_the_wrap<Q: DriverRing>(event_idx: bool) {
    let mem = guest_mem();
    let mut driver = Q::at(&mem, 0, 4, DATA_START);
    driver.start_at_index(65531);
    let features = if event_idx {
        1 << VIRTIO_RING_F_EVENT_IDX
    } else {
        0
    };
    let mut txq = TxQueue::new(driver.device_ring(features));
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    let (mut raised, mut quiet, mut missed, mut unwanted) = (0, 0, Vec::new(), Vec::new());
    for round in 0..60u16 {
        let n = round % 4 + 1;
        let at = match round % 5 {
            0 => None,
            1 => Some(0),
            2 => Some(n - 1),
            3 => Some(n),
            _ => Some(round % n),
        };
        driver.want_interrupt_at(at, event_idx);
        let sent: Vec<Vec<u8>> = (0..n)
            .map(|i| wire(&frame(64, (round + i) as u8)))
            .collect();
        for f in &sent {
            driver.offer_tx(f, &[]);
        }
        let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
        for f in &sent {
            assert_eq!(driver.next_used().map(|u| u.1), Some(0), "round {round}");
            assert_eq!(&peer.recv_frame().expect("frame"), f);
        }
        let wanted = at.is_some_and(|k| !event_idx || k < n);
        match (wanted, outcome.needs_interrupt) {
            (true, true) => raised += 1,
            (false, false) => quiet += 1,
            (true, false) => missed.push((round, at)),
            (false, true) => unwanted.push((round, at)),
        }
    }
    let ring = std::any::type_name::<Q>();
    assert_eq!(missed, [], "{ring}, event_idx {event_idx}: missed");
    assert_eq!(unwanted, [], "{ring}, event_idx {event_idx}: unwanted");
    assert!(
        raised >= 20 && quiet >= 12,
        "{raised} raised, {quiet} quiet"
    );
    assert_eq!(counters.frames, 150);
}
