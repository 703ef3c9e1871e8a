//! The driver on packed rings (VIRTIO_F_RING_PACKED) and with VIRTIO_F_IN_ORDER: negotiation,
//! transmit and receive, kick suppression, the three tx completion modes, XDP_TX, multiqueue,
//! the control queue and a per-queue reset, against the packed test device
//! ([`crate::testing::packed`]) and, for IN_ORDER batches, the split one.

use std::vec::Vec;

use super::{
    frame, harness, harness_with, received, reset_tx_after_two_of_six, seq_of, seqs,
    served_harness, Harness,
};
use crate::features::{
    F_IN_ORDER, F_RING_PACKED, F_RING_RESET, NET_F_CTRL_VQ, NET_F_NOTF_COAL, NET_F_VQ_NOTF_COAL,
};
use crate::net::TX_QUEUE;
use crate::testing::packed::{EV_DESC, EV_DISABLE, EV_ENABLE};
use crate::{Config, QueueId, TxCompletion, XdpAction};

fn packed(config: Config) -> Config {
    Config {
        packed: true,
        ..config
    }
}

/// A driver with `config` on a device that offers packed rings, IN_ORDER and RING_RESET.
fn packed_harness(config: Config) -> Harness {
    harness_with(config, |r| {
        r.device_features |= F_RING_PACKED | F_IN_ORDER | F_RING_RESET;
    })
}

fn frames(n: u32) -> Vec<Vec<u8>> {
    (0..n).map(|i| frame(i, 60 + i as usize % 700)).collect()
}

#[test]
fn packed_rings_are_negotiated_only_when_asked_for_and_offered() {
    let h = packed_harness(packed(Config::default()));
    assert_ne!(h.net.features() & F_RING_PACKED, 0);
    assert_eq!(h.net.features() & F_IN_ORDER, 0, "IN_ORDER not asked for");
    assert!(h.dev.rx.packed.is_some() && h.dev.tx.packed.is_some());
    assert_eq!(h.dev.rx.pending(), 256, "the whole rx ring is posted");

    let h = packed_harness(Config::default());
    assert_eq!(h.net.features() & (F_RING_PACKED | F_IN_ORDER), 0);
    let h = harness(packed(Config {
        in_order: true,
        ..Config::default()
    }));
    assert_eq!(
        h.net.features() & (F_RING_PACKED | F_IN_ORDER),
        0,
        "not offered"
    );
    assert!(h.dev.tx.packed.is_none());
}

#[test]
fn packed_queue_sizes_need_not_be_powers_of_two() {
    let mut h = harness_with(packed(Config::default()), |r| {
        r.device_features |= F_RING_PACKED;
        r.queues[0].num_max = 200;
        r.queues[1].num_max = 100;
    });
    assert_eq!(h.net.queue_sizes(), (200, 100));
    assert_eq!(h.dev.rx.pending(), 200);
    // Three laps of the tx ring.
    for round in 0..3u32 {
        let sent: Vec<Vec<u8>> = (0..90).map(|i| frame(round * 100 + i, 70)).collect();
        assert_eq!(
            h.net.transmit_batch(sent.iter().map(Vec::as_slice)).sent,
            90
        );
        assert_eq!(h.dev.tx_drain(), sent);
        assert_eq!(h.net.reclaim_tx(), 90);
    }
    assert_eq!(h.net.counters().device_errors, 0);
}

#[test]
fn frames_flow_both_ways_on_packed_rings() {
    for event_idx in [true, false] {
        let mut h = packed_harness(packed(Config {
            event_idx,
            ..Config::default()
        }));
        let sent = frames(40);
        assert_eq!(
            h.net.transmit_batch(sent.iter().map(Vec::as_slice)).sent,
            40
        );
        assert_eq!(h.dev.tx_drain(), sent);
        assert_eq!(h.net.reclaim_tx(), 40);
        for seq in 0..300 {
            // More than a lap of the rx ring, re-posted as it goes.
            assert!(h.dev.rx_deliver(&frame(seq, 64 + seq as usize % 3000)));
            if seq % 50 == 49 {
                assert_eq!(received(&mut h.net), (seq - 49..=seq).collect::<Vec<_>>());
            }
        }
        let c = h.net.counters();
        assert_eq!((c.tx_frames, c.rx_frames, c.device_errors), (40, 300, 0));
        assert!(!h.net.is_broken());
    }
}

#[test]
fn kick_threshold_batches_and_the_device_event_suppresses_kicks() {
    let mut h = packed_harness(packed(Config {
        kick_threshold: 8,
        ..Config::default()
    }));
    // The device wants a kick only when the descriptor at position 12 is made available.
    h.dev
        .tx
        .packed
        .as_ref()
        .unwrap()
        .q
        .set_event(EV_DESC, 0x8000 | 12);
    for f in frames(20).iter() {
        h.net.queue_tx(f).expect("room");
    }
    h.net.flush_tx();
    // Publishes at 8 (positions 0..8: no), 16 (8..16 holds 12: kick), 20 (no).
    assert_eq!(h.kicks(TX_QUEUE), 1);
    let c = h.net.counters();
    assert_eq!((c.tx_publishes, c.kicks, c.kicks_suppressed), (3, 1, 2));
    // DISABLE: no kicks at all; ENABLE: every publish.
    h.dev.tx.packed.as_ref().unwrap().q.set_event(EV_DISABLE, 0);
    h.net.transmit_batch(frames(8).iter().map(Vec::as_slice));
    assert_eq!(h.net.counters().kicks_suppressed_no_notify, 1);
    h.dev.tx.packed.as_ref().unwrap().q.set_event(EV_ENABLE, 0);
    h.net.transmit_batch(frames(16).iter().map(Vec::as_slice));
    assert_eq!(h.kicks(TX_QUEUE), 3);
    assert_eq!(h.dev.tx_drain().len(), 44);
}

#[test]
fn tx_interrupt_mode_asks_for_tx_interrupts_and_reclaims_in_a_tx_poll() {
    let mut h = packed_harness(packed(Config::default()));
    h.net.transmit_batch(frames(4).iter().map(Vec::as_slice));
    h.dev.tx_drain();
    assert!(
        h.dev.tx.needs_interrupt(),
        "the event at position 0 crossed"
    );
    assert!(h.net.tx_has_used());
    assert_eq!(h.net.tx_used_pending(), 4);
    assert_eq!(h.net.reclaim_tx(), 4);
    let event = h.dev.tx.packed.as_ref().unwrap().q.driver_event();
    assert_eq!(
        event,
        (EV_DESC, 0x8000 | 4),
        "re-armed at the next used position"
    );
    h.net.transmit(&frame(5, 60)).expect("room");
    h.dev.tx_drain();
    assert!(h.dev.tx.needs_interrupt());
    assert_eq!(h.net.reclaim_tx(), 1);
}

#[test]
fn clean_from_rx_and_lazy_modes_keep_tx_interrupts_off() {
    for mode in [TxCompletion::CleanFromRx, TxCompletion::Lazy] {
        let mut h = packed_harness(packed(Config {
            tx_queue_size: 16,
            kick_threshold: 1,
            tx_completion: mode,
            ..Config::default()
        }));
        let event = h.dev.tx.packed.as_ref().unwrap().q.driver_event();
        assert_eq!(event.0, EV_DISABLE, "{mode:?}");
        for f in frames(12).iter() {
            h.net.transmit(f).expect("room");
            h.dev.tx_drain();
            assert!(!h.dev.tx.needs_interrupt(), "{mode:?}");
        }
        assert_eq!(h.net.counters().tx_reclaimed, 0, "{mode:?}");
        match mode {
            TxCompletion::CleanFromRx => {
                h.dev.rx_deliver(&frame(100, 60));
                assert_eq!(received(&mut h.net), [100]);
                assert_eq!(h.net.counters().tx_reclaimed, 12);
            }
            _ => {
                // 4 free: not below a quarter; then 3 free: reclaim first.
                h.net.transmit(&frame(12, 60)).expect("room");
                assert_eq!(h.net.counters().tx_reclaim_polls, 0);
                h.net.transmit(&frame(13, 60)).expect("room");
                let c = h.net.counters();
                assert_eq!((c.tx_reclaim_polls, c.tx_reclaimed), (1, 12));
                assert_eq!(h.net.tx_free_descriptors(), 14);
            }
        }
    }
}

#[test]
fn xdp_tx_bulk_lends_rx_buffers_to_the_packed_tx_ring() {
    let mut h = packed_harness(packed(Config {
        xdp_bulk: 4,
        ..Config::default()
    }));
    for seq in 0..10 {
        assert!(h.dev.rx_deliver(&frame(seq, 90)));
    }
    let n = h.net.poll_rx(64, &mut |_: &[u8]| XdpAction::Tx);
    assert_eq!(n, 10);
    let sent = h.dev.tx_drain();
    assert_eq!(
        sent.iter().map(|f| seq_of(f)).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    let c = h.net.counters();
    assert_eq!((c.xdp_tx, c.xdp_flushes), (10, 3));
    assert_eq!(h.net.reclaim_tx(), 10);
    assert_eq!(h.dev.rx.pending(), 256, "lent buffers back on the rx ring");
}

/// In-order batches on either layout: the device returns a batch with one used entry carrying
/// the last chain, and the driver reclaims every earlier one in order.
#[test]
fn in_order_batches_are_returned_with_one_used_entry() {
    for layout_packed in [false, true] {
        let config = Config {
            packed: layout_packed,
            in_order: true,
            tx_completion: TxCompletion::Lazy,
            ..Config::default()
        };
        let mut h = packed_harness(config);
        assert_ne!(h.net.features() & F_IN_ORDER, 0);
        let mut next = 0u32;
        for round in 0..40u32 {
            let n = 1 + round % 9;
            let batch: Vec<Vec<u8>> = (next..next + n).map(|i| frame(i, 60)).collect();
            next += n;
            assert_eq!(
                h.net.transmit_batch(batch.iter().map(Vec::as_slice)).sent,
                n as usize
            );
            let taken = h.dev.tx_take();
            let heads: Vec<u16> = taken.iter().map(|(c, _)| c.head).collect();
            if !layout_packed {
                // Split: descriptors taken in ring order.
                let first = (next - n) as u16 % 256;
                let expected: Vec<u16> = (0..n as u16).map(|k| (first + k) % 256).collect();
                assert_eq!(heads, expected);
            }
            h.dev.tx.push_used_batch(&heads, 0);
            assert_eq!(usize::from(h.net.tx_used_pending()), heads.len());
            assert_eq!(h.net.reclaim_tx(), heads.len(), "packed {layout_packed}");
        }
        // Rx: a batch of frames returned with one used entry; the earlier buffers count as
        // written completely, the last with its length.
        let mut heads = Vec::new();
        let mut last_len = 0;
        for seq in 0..5 {
            let used = h.dev.rx_fill(&frame(seq, 2048 - 12)).expect("buffers");
            heads.extend(used.iter().map(|u| u.0));
            last_len = used.last().unwrap().1;
        }
        h.dev.rx.push_used_batch(&heads, last_len);
        assert_eq!(received(&mut h.net), [0, 1, 2, 3, 4]);
        let c = h.net.counters();
        assert_eq!((c.tx_reclaimed, c.device_errors), (u64::from(next), 0));
        assert_eq!(h.net.tx_free_descriptors(), 256);
    }
}

#[test]
fn the_control_queue_runs_on_a_packed_ring() {
    let mut h = harness_with(packed(Config::default()), |r| {
        r.device_features |= F_RING_PACKED | NET_F_CTRL_VQ | NET_F_NOTF_COAL | NET_F_VQ_NOTF_COAL;
        // Not a power of two.
        r.queues[2].num_max = 24;
    });
    assert!(h.dev.ctrl().q.packed.is_some());
    for n in 0..60u32 {
        // More than two laps of the control ring.
        h.net.set_tx_coalescing(n, n * 10).unwrap();
    }
    assert_eq!(h.dev.ctrl().coal[1], (59, 590));
    h.net.set_vq_coalescing(0, 3, 7).unwrap();
    assert_eq!(h.net.get_vq_coalescing(0).unwrap().max_packets, 3);
    assert_eq!(h.net.counters().ctrl_failed, 0);
}

#[test]
fn two_pairs_send_and_receive_on_packed_rings() {
    let config = packed(Config {
        queue_pairs: 2,
        ..Config::default()
    });
    let super::Harness {
        mut net, mut dev, ..
    } = served_harness(config, |r| {
        r.multiqueue(2);
        r.device_features |= F_RING_PACKED;
    });
    assert_eq!(
        dev.ctrl().pairs_set,
        2,
        "VQ_PAIRS_SET over the packed control ring"
    );
    assert!(dev.more[0].1.packed.is_some());
    for seq in 0..3 {
        net.on_pair(0).unwrap().transmit(&frame(seq, 60)).unwrap();
    }
    for seq in 100..105 {
        net.on_pair(1).unwrap().transmit(&frame(seq, 80)).unwrap();
    }
    let on0 = seqs(&dev.tx_drain());
    let on1 = seqs(&dev.on_pair(1, |d| d.tx_drain()));
    assert_eq!((on0, on1), ((0..3).collect(), (100..105).collect()));
    assert!(dev.on_pair(1, |d| d.rx_deliver(&frame(7, 64))));
    assert_eq!(received(net.on_pair(1).unwrap()), [7]);
    assert_eq!(net.on_pair(1).unwrap().reclaim_tx(), 5);
}

#[test]
fn a_packed_tx_queue_is_reset_and_runs_again() {
    let mut h = packed_harness(packed(Config::default()));
    // The device sends frames 0 and 1 and never returns the others.
    let report = reset_tx_after_two_of_six(&mut h);
    assert_eq!((report.used, report.unused), (2, 4));
    h.dev.reattach(1);
    assert_eq!(h.dev.tx.pending(), 0, "nothing re-posted");
    for seq in 10..300 {
        // Past the ring's first lap from its fresh start.
        h.net.transmit(&frame(seq, 60)).expect("room");
        let got = h.dev.tx_drain();
        assert_eq!(got.iter().map(|f| seq_of(f)).collect::<Vec<_>>(), [seq]);
        h.net.reclaim_tx();
    }
    assert_eq!(h.net.tx_free_descriptors(), 256);
    // And the rx queue.
    let report = h.net.reset_queue(QueueId::Rx).expect("reset");
    assert_eq!(report.unused, 256);
    h.dev.reattach(0);
    assert_eq!(h.dev.rx.pending(), 256, "a full ring posted again");
    assert!(h.dev.rx_deliver(&frame(42, 60)));
    assert_eq!(received(&mut h.net), [42]);
    assert!(!h.net.is_broken());
}
