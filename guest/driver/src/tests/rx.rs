//! Receive: single and mergeable buffers, partial frames, budget, hostile used entries, the
//! NAPI-style interrupt controls.

use std::vec::Vec;

use super::{frame, frame_over_small_buffers, harness, seqs};
use crate::net::RX_QUEUE;
use crate::{Config, QueueId, Rearm, XdpAction};

fn collect(
    net: &mut crate::VirtioNet<crate::testing::TestHal, crate::testing::TestTransport>,
    budget: usize,
) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    net.poll_rx(budget, &mut |f: &[u8]| {
        got.push(f.to_vec());
        XdpAction::Pass
    });
    got
}

#[test]
fn single_buffer_frames_without_mrg_rxbuf() {
    let mut h = harness(Config {
        mrg_rxbuf: false,
        ..Config::default()
    });
    let sent: Vec<Vec<u8>> = (0..3).map(|i| frame(i, 60 + 700 * i as usize)).collect();
    for f in &sent {
        assert!(h.dev.rx_deliver(f));
    }
    assert!(h.net.rx_has_used());
    assert_eq!(h.net.rx_used_pending(), 3);
    assert_eq!(collect(&mut h.net, 64), sent);
    assert_eq!(h.net.rx_used_pending(), 0);
    let c = h.net.counters();
    assert_eq!((c.rx_frames, c.xdp_pass), (3, 3));
    assert_eq!(c.rx_bytes, sent.iter().map(|f| f.len() as u64).sum::<u64>());
    assert_eq!(h.dev.rx.pending(), 256, "buffers re-posted");
    // The device never re-armed avail_event (still 0): the refill needs no kick.
    assert_eq!(h.kicks(RX_QUEUE), 1, "the initial post only");
    assert_eq!((c.rx_kicks, c.rx_kicks_suppressed), (1, 1));
    // A device asking to hear about anything past what is published now.
    h.dev.rx.set_avail_event(h.dev.rx.avail_idx());
    assert!(h.dev.rx_deliver(&frame(9, 60)));
    collect(&mut h.net, 64);
    assert_eq!(h.kicks(RX_QUEUE), 2, "re-armed: the refill kicks");
}

#[test]
fn mergeable_frame_spans_buffers() {
    // 612 bytes with the header: 3 buffers of 256.
    let (mut h, big, used) = frame_over_small_buffers(7, 600);
    let small = frame(8, 100);
    assert_eq!(used.len(), 3);
    for (head, len) in used {
        h.dev.rx.push_used(head, len);
    }
    assert!(h.dev.rx_deliver(&small));
    assert_eq!(collect(&mut h.net, 64), [big, small]);
    assert_eq!(h.net.counters().rx_frames, 2);
    assert_eq!(h.dev.rx.pending(), 256);
}

#[test]
fn mergeable_frame_completes_across_polls() {
    let (mut h, big, used) = frame_over_small_buffers(9, 700);
    assert_eq!(used.len(), 3);
    for (i, &(head, len)) in used.iter().enumerate() {
        h.dev.rx.push_used(head, len);
        let got = collect(&mut h.net, 64);
        if i < 2 {
            assert!(got.is_empty(), "incomplete after {} buffers", i + 1);
        } else {
            assert_eq!(got, std::slice::from_ref(&big));
        }
    }
    assert_eq!(h.net.counters().device_errors, 0);
}

#[test]
fn budget_limits_frames_per_poll() {
    let mut h = harness(Config::default());
    for i in 0..10 {
        assert!(h.dev.rx_deliver(&frame(i, 64)));
    }
    assert_eq!(seqs(&collect(&mut h.net, 4)), [0, 1, 2, 3]);
    assert_eq!(seqs(&collect(&mut h.net, 4)), [4, 5, 6, 7]);
    assert_eq!(seqs(&collect(&mut h.net, 4)), [8, 9]);
    assert!(!h.net.rx_has_used());
}

#[test]
fn hostile_used_entries_are_counted_and_ignored() {
    // An id out of range, an id returned twice, a length past the buffer, a header-only
    // buffer, num_buffers = 0: each counted, none delivered, nothing leaked.
    let (mut h, _, used) = frame_over_small_buffers(1, 60);
    let (head, len) = used[0];
    h.dev.rx.push_used_raw(60_000, 64);
    h.dev.rx.push_used(head, len);
    h.dev.rx.push_used(head, len);
    let too_long = h.dev.rx.pop().expect("chain");
    h.dev.rx.push_used(too_long.head, 257);
    let header_only = h.dev.rx.pop().expect("chain");
    h.dev.rx.push_used(header_only.head, 12);
    let zero_bufs = h.dev.rx_fill(&frame(2, 60)).expect("buffers");
    let addr = h.dev.rx.read_desc(zero_bufs[0].0).0.addr;
    h.hal.write(addr + 10, &0u16.to_le_bytes());
    h.dev.rx.push_used(zero_bufs[0].0, zero_bufs[0].1);
    let got = collect(&mut h.net, 64);
    assert_eq!(got, [frame(1, 60)]);
    let c = h.net.counters();
    assert_eq!((c.device_errors, c.rx_frames), (5, 1));
    // Every buffer whose id was valid is back on the ring; the device still works.
    assert_eq!(h.dev.rx.pending(), 256);
    assert!(h.dev.rx_deliver(&frame(3, 60)));
    assert_eq!(collect(&mut h.net, 64), [frame(3, 60)]);
}

#[test]
fn a_used_index_jump_breaks_the_ring_without_ub() {
    let mut h = harness(Config::default());
    let jumped = h.dev.rx.used_idx.wrapping_add(1000);
    h.dev.rx.force_used_idx(jumped);
    assert_eq!(collect(&mut h.net, 64), Vec::<Vec<u8>>::new());
    assert_eq!(h.net.counters().device_errors, 1);
    assert!(h.net.is_broken());
    assert_eq!(collect(&mut h.net, 64), Vec::<Vec<u8>>::new());
    assert!(!h.net.rx_has_used());
}

#[test]
fn napi_style_interrupt_controls() {
    for event_idx in [true, false] {
        let mut h = harness(Config {
            event_idx,
            ..Config::default()
        });
        h.net.disable_interrupts(QueueId::Rx);
        assert!(h.dev.rx_deliver(&frame(0, 60)));
        assert!(!h.dev.rx.needs_interrupt(), "disabled");
        assert_eq!(collect(&mut h.net, 64).len(), 1);
        assert_eq!(h.net.enable_interrupts(QueueId::Rx), Rearm::Armed);
        // A frame that lands between the last poll and the re-enable is reported.
        h.net.disable_interrupts(QueueId::Rx);
        assert!(h.dev.rx_deliver(&frame(1, 60)));
        assert_eq!(h.net.enable_interrupts(QueueId::Rx), Rearm::UsedPending);
        assert_eq!(collect(&mut h.net, 64).len(), 1);
        assert_eq!(h.net.enable_interrupts(QueueId::Rx), Rearm::Armed);
        // Armed: the next frame interrupts.
        assert!(h.dev.rx_deliver(&frame(2, 60)));
        assert!(h.dev.rx.needs_interrupt(), "event_idx {event_idx}");
    }
}
