//! Notification suppression in both directions: EVENT_IDX (`used_event` / `avail_event`) and,
//! without it, `VRING_AVAIL_F_NO_INTERRUPT` / `VRING_USED_F_NO_NOTIFY`.

use virtio_queue::QueueT;

use crate::virtio::net::metrics::{RxCounters, TxCounters};
use crate::virtio::net::tests::support::{drain, frame, pair, tx_into_full_backend, wire, Ring};
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
