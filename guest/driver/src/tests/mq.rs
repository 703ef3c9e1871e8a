//! Multiqueue ([`crate::mq`]): negotiation, the queue layout, VQ_PAIRS_SET, per-pair datapaths
//! and counters, and every bring-up refusal.

use std::vec::Vec;

use super::{frame, poll_seqs, received, seqs, served_harness, Harness, ARENA};
use crate::features::{NET_F_CTRL_VQ, NET_F_MQ};
use crate::testing::TestTransport;
use crate::testing::{serve_ctrl_from_bring_up, CtrlBehaviour, Regs, TestDevice, TestHal};
use crate::{Config, CtrlError, InitError, PairError, VirtioNet};

fn mq_config(pairs: u16) -> Config {
    Config {
        queue_pairs: pairs,
        ..Config::default()
    }
}

/// Brings the driver up against `regs` with the control queue served from the start.
fn try_bring_up(
    config: Config,
    regs: Regs,
    behaviour: CtrlBehaviour,
) -> (
    Result<VirtioNet<TestHal, TestTransport>, InitError>,
    TestHal,
    TestTransport,
) {
    let hal = TestHal::new(ARENA);
    let transport = TestTransport::new(regs);
    let slot = serve_ctrl_from_bring_up(&hal, &transport, behaviour);
    let net = VirtioNet::new(hal.clone(), transport.clone(), config);
    if net.is_ok() {
        // Keep the hook's device: it has served the bring-up commands.
        let dev = TestDevice::attach_with(&hal, &transport, Some(slot));
        drop(dev);
    }
    (net, hal, transport)
}

/// A driver with `pairs` pairs on a device with `device_pairs`.
fn mq_harness(pairs: u16, device_pairs: u16) -> Harness {
    served_harness(mq_config(pairs), |r| r.multiqueue(device_pairs))
}

#[test]
fn two_pairs_are_negotiated_laid_out_and_enabled() {
    let h = mq_harness(2, 4);
    assert_ne!(h.net.features() & NET_F_MQ, 0);
    assert_eq!((h.net.queue_pairs(), h.net.active_queue_pairs()), (2, 2));
    {
        let regs = h.transport.regs();
        // rx0 tx0 rx1 tx1 set up; pairs 2 and 3 untouched; the control queue at 2N = 4.
        for q in 0..4 {
            assert_eq!((regs.queues[q].ready, regs.queues[q].num), (1, 256), "{q}");
        }
        assert!(regs.queues[4..8].iter().all(|q| q.ready == 0));
        assert_eq!(
            regs.queues[8].ready, 1,
            "control queue at 2 * max_virtqueue_pairs"
        );
        // The rings are distinct.
        let descs: Vec<u64> = [0, 1, 2, 3, 8]
            .iter()
            .map(|&q| regs.queues[q].desc)
            .collect();
        let mut unique = descs.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 5, "{descs:x?}");
    }
    assert_eq!(h.net.ctrl_queue_index(), Some(8));
    let ctrl = h.dev.ctrl();
    assert_eq!(ctrl.q.index, 8);
    assert_eq!(ctrl.pairs_set, 2);
    let set = &ctrl.log[0];
    assert_eq!((set.class, set.cmd, &set.data[..]), (4, 0, &[2u8, 0][..]));
    drop(ctrl);
    // Both rx queues have every buffer posted, and each was kicked.
    assert_eq!(h.dev.rx.pending(), 256);
    assert_eq!(h.dev.more[0].0.pending(), 256);
    assert_eq!((h.kicks(0), h.kicks(2), h.kicks(8)), (1, 1, 1));
}

#[test]
fn one_pair_does_not_negotiate_multiqueue() {
    let hal = TestHal::new(ARENA);
    let mut regs = Regs::default();
    regs.multiqueue(2);
    let transport = TestTransport::new(regs);
    let net = VirtioNet::new(hal.clone(), transport.clone(), Config::default()).expect("init");
    assert_eq!(net.features() & NET_F_MQ, 0);
    assert_eq!(net.queue_pairs(), 1);
    assert_eq!(net.ctrl_queue_index(), Some(2));
    let regs = transport.regs();
    // Without MQ the control queue is queue 2 (the device's "rx1" slot here).
    assert_eq!(regs.queues[2].ready, 1);
    assert_eq!(regs.queues[2].num, 8);
    assert_eq!(regs.queues[3].ready, 0);
}

#[test]
fn each_pair_sends_and_receives_on_its_own_queues() {
    let mut h = mq_harness(2, 2);
    // Pair 0: 3 frames, pair 1: 5 frames.
    for seq in 0..3 {
        h.net.on_pair(0).unwrap().transmit(&frame(seq, 60)).unwrap();
    }
    for seq in 100..105 {
        h.net.on_pair(1).unwrap().transmit(&frame(seq, 80)).unwrap();
    }
    let on0 = seqs(&h.dev.tx_drain());
    let on1 = seqs(&h.dev.on_pair(1, |d| d.tx_drain()));
    assert_eq!(on0, [0, 1, 2]);
    assert_eq!(on1, [100, 101, 102, 103, 104]);
    // Rx: two frames for pair 1, one for pair 0.
    assert!(h.dev.on_pair(1, |d| d.rx_deliver(&frame(7, 64))));
    assert!(h.dev.on_pair(1, |d| d.rx_deliver(&frame(8, 64))));
    assert!(h.dev.rx_deliver(&frame(9, 64)));
    let (n1, got) = poll_seqs(h.net.on_pair(1).unwrap());
    assert_eq!((n1, &got[..]), (2, &[7, 8][..]));
    let (n0, got) = poll_seqs(h.net.on_pair(0).unwrap());
    assert_eq!((n0, &got[..]), (1, &[9][..]));
    // Reclaim on each pair frees only its own chains.
    assert_eq!(h.net.on_pair(1).unwrap().reclaim_tx(), 5);
    assert_eq!(h.net.on_pair(0).unwrap().reclaim_tx(), 3);

    let (p0, p1) = (
        h.net.pair_counters(0).unwrap(),
        h.net.pair_counters(1).unwrap(),
    );
    assert_eq!((p0.tx_frames, p0.rx_frames, p0.tx_reclaimed), (3, 1, 3));
    assert_eq!((p1.tx_frames, p1.rx_frames, p1.tx_reclaimed), (5, 2, 5));
    assert_eq!(p0.tx_bytes, 3 * 60);
    assert_eq!(p1.tx_bytes, 5 * 80);
    // Kicks as the device saw them, per queue.
    assert_eq!(p0.kicks as usize, h.kicks(1));
    assert_eq!(p1.kicks as usize, h.kicks(3));
    assert_eq!(p0.rx_kicks as usize, h.kicks(0));
    assert_eq!(p1.rx_kicks as usize, h.kicks(2));
    assert!(p1.kicks > 0 && p1.rx_kicks > 0);
    // The device-wide counters are the sums.
    let c = h.net.counters();
    assert_eq!((c.tx_frames, c.rx_frames), (8, 3));
    assert_eq!(c.kicks, p0.kicks + p1.kicks);
    assert_eq!(c.rx_kicks, p0.rx_kicks + p1.rx_kicks);
    assert_eq!(c.tx_reclaimed, 8);
    assert_eq!(h.net.current_pair(), 0);
    assert_eq!(h.net.pair_counters(2), Err(PairError { pair: 2, pairs: 2 }));
    assert!(h.net.on_pair(2).is_err());
    assert_eq!(h.net.pair_queue_sizes(1), Ok((256, 256)));
}

#[test]
fn the_shared_interrupt_is_counted_against_the_pairs_with_work() {
    let mut h = mq_harness(2, 2);
    assert!(h.dev.on_pair(1, |d| d.rx_deliver(&frame(1, 64))));
    h.dev.interrupt();
    assert!(h.net.handle_interrupt().used_buffers);
    let (p0, p1) = (
        h.net.pair_counters(0).unwrap(),
        h.net.pair_counters(1).unwrap(),
    );
    assert_eq!((p0.interrupts, p1.interrupts), (0, 1));
    // Both pairs with used buffers (pair 1's rx still unpolled, pair 0's tx returned).
    h.net.on_pair(0).unwrap().transmit(&frame(2, 64)).unwrap();
    h.dev.tx_drain();
    h.dev.interrupt();
    h.net.handle_interrupt();
    let (p0, p1) = (
        h.net.pair_counters(0).unwrap(),
        h.net.pair_counters(1).unwrap(),
    );
    assert_eq!((p0.interrupts, p1.interrupts), (1, 2));
    assert_eq!(h.net.counters().interrupts, 2);
}

#[test]
fn fewer_pairs_can_be_set_and_bad_counts_are_refused() {
    let mut h = mq_harness(3, 3);
    assert_eq!(h.dev.ctrl().pairs_set, 3);
    h.net.set_queue_pairs(1).unwrap();
    assert_eq!((h.dev.ctrl().pairs_set, h.net.active_queue_pairs()), (1, 1));
    for bad in [0, 4] {
        assert_eq!(
            h.net.set_queue_pairs(bad),
            Err(CtrlError::QueuePairs {
                wanted: bad,
                pairs: 3
            })
        );
    }
    assert_eq!(
        h.dev.ctrl().log.len(),
        2,
        "refused counts never reach the device"
    );
    // Without MQ negotiated the command is refused before it is sent.
    let mut single = super::harness_with(Config::default(), |r| r.multiqueue(2));
    assert_eq!(
        single.net.set_queue_pairs(1),
        Err(CtrlError::NotNegotiated("VIRTIO_NET_F_MQ"))
    );
}

#[test]
fn bring_up_refusals_are_clear_errors() {
    // The device offers no MQ.
    let (net, ..) = try_bring_up(mq_config(2), Regs::default(), CtrlBehaviour::Model);
    assert_eq!(net.err(), Some(InitError::MqUnavailable { wanted: 2 }));
    // MQ offered but no control queue: MQ cannot be negotiated.
    let mut regs = Regs::default();
    regs.multiqueue(2);
    regs.device_features &= !NET_F_CTRL_VQ;
    let (net, ..) = try_bring_up(mq_config(2), regs, CtrlBehaviour::Model);
    assert_eq!(net.err(), Some(InitError::MqUnavailable { wanted: 2 }));
    // More pairs than max_virtqueue_pairs.
    let mut regs = Regs::default();
    regs.multiqueue(2);
    let (net, ..) = try_bring_up(mq_config(3), regs, CtrlBehaviour::Model);
    assert_eq!(
        net.err(),
        Some(InitError::TooManyQueuePairs { wanted: 3, max: 2 })
    );
    // A queue of pair 1 missing.
    let mut regs = Regs::default();
    regs.multiqueue(2);
    regs.queues[3].num_max = 0;
    let (net, hal, transport) = try_bring_up(mq_config(2), regs, CtrlBehaviour::Model);
    assert_eq!(net.err(), Some(InitError::QueueUnavailable(3)));
    assert_eq!(transport.regs().status, 0, "reset after the failure");
    assert_eq!(hal.live_allocations(), 0, "everything freed");
    // The device refuses VQ_PAIRS_SET.
    let mut regs = Regs::default();
    regs.multiqueue(2);
    let (net, hal, _) = try_bring_up(mq_config(2), regs, CtrlBehaviour::AlwaysErr);
    assert_eq!(
        net.err(),
        Some(InitError::QueuePairsSet {
            wanted: 2,
            error: CtrlError::Rejected
        })
    );
    assert_eq!(hal.live_allocations(), 0);
    // Without ctrl_vq more than one pair is a configuration error.
    let (net, ..) = try_bring_up(
        Config {
            ctrl_vq: false,
            ..mq_config(2)
        },
        Regs::default(),
        CtrlBehaviour::Model,
    );
    assert!(matches!(net.err(), Some(InitError::Config(_))));
    let text = std::format!("{}", InitError::TooManyQueuePairs { wanted: 3, max: 2 });
    assert!(text.contains("at most 2"), "{text}");
}

/// A per-queue reset acts on the current pair's queue: pair 1's rx reset resets virtqueue 2
/// and programs it again with pair 1's own ring, pair 1's tx reset virtqueue 3; pair 0's queues
/// are not touched and both pairs keep working.
#[test]
fn a_queue_reset_acts_on_the_current_pairs_queues() {
    use crate::features::F_RING_RESET;
    use crate::{QueueId, QueueResetReport};

    let mut h = served_harness(mq_config(2), |r| {
        r.multiqueue(2);
        r.device_features |= F_RING_RESET;
    });
    let before: Vec<_> = h.transport.regs().queues.clone();
    // A frame for pair 1, not polled: the reset finds it used and drops it.
    assert!(h.dev.on_pair(1, |d| d.rx_deliver(&frame(7, 64))));
    let (rx_size, _) = h.net.pair_queue_sizes(1).unwrap();
    let report = h
        .net
        .on_pair(1)
        .unwrap()
        .reset_queue(QueueId::Rx)
        .expect("rx reset");
    assert_eq!(
        report,
        QueueResetReport {
            used: 1,
            unused: usize::from(rx_size) - 1
        }
    );
    h.net.on_pair(1).unwrap().transmit(&frame(50, 60)).unwrap();
    h.dev.on_pair(1, |d| d.tx_drain());
    h.net
        .on_pair(1)
        .unwrap()
        .reset_queue(QueueId::Tx)
        .expect("tx reset");
    {
        let regs = h.transport.regs();
        assert_eq!(regs.queue_resets, [2, 3], "pair 1's queues, by index");
        for (q, (was, now)) in before.iter().zip(&regs.queues).take(4).enumerate() {
            assert_eq!(now.ready, 1, "queue {q} enabled");
            assert_eq!(
                (now.num, now.desc, now.avail, now.used),
                (was.num, was.desc, was.avail, was.used),
                "queue {q} keeps its own rings"
            );
        }
        assert!(regs.bad_writes.is_empty());
    }
    h.dev.on_pair(1, |d| {
        d.reattach(2);
        d.reattach(3);
    });
    // Both pairs still send and receive on their own queues.
    assert!(h.dev.on_pair(1, |d| d.rx_deliver(&frame(8, 64))));
    assert!(h.dev.rx_deliver(&frame(9, 64)));
    for (pair, seq) in [(1u16, 8u32), (0, 9)] {
        let got = received(h.net.on_pair(pair).unwrap());
        assert_eq!(got, [seq], "pair {pair}");
    }
    h.net.on_pair(1).unwrap().transmit(&frame(60, 60)).unwrap();
    h.net.on_pair(0).unwrap().transmit(&frame(61, 60)).unwrap();
    let on1 = seqs(&h.dev.on_pair(1, |d| d.tx_drain()));
    let on0 = seqs(&h.dev.tx_drain());
    assert_eq!((on0, on1), (std::vec![61], std::vec![60]));
}
