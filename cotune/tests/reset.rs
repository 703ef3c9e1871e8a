//! Co-simulation of per-queue reset (VIRTIO_F_RING_RESET): the guest driver crate resets one
//! queue of the real device model (worker thread, eventfd kicks and interrupts, socketpair
//! backend) while traffic flows on the other, over virtio-mmio and virtio-pci.

use std::time::{Duration, Instant};

#[macro_use]
mod common;

use common::peer_frame;
use cotune::frames::{check_frame, test_frame};
use cotune::rig::Rig;
use cotune::transport::TransportKind;
use devices::backend::PairPeer;
use vnet_driver::features::F_RING_RESET;
use vnet_driver::{Config, QueueId, XdpAction};

const FRAMES: u32 = 3000;
const SIZE: usize = 100;

fn rig_on(transport: TransportKind) -> (Rig, PairPeer) {
    let (rig, peer) = common::rig_on(Config::default(), transport);
    assert_ne!(
        rig.net.features() & F_RING_RESET,
        0,
        "RING_RESET negotiated"
    );
    (rig, peer)
}

/// Waits until the device has returned every tx chain (the peer may see a frame before its
/// used entry is published).
fn drain_tx(rig: &mut Rig) {
    let (_, tx_size) = rig.net.queue_sizes();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.net.tx_free_descriptors() < usize::from(tx_size) {
        assert!(Instant::now() < deadline, "tx chains never came back");
        rig.take_interrupt(1);
        rig.tx_poll();
    }
}

/// Queues test frame `seq`, making room (interrupts, reclaim) while the tx ring is full.
fn send(rig: &mut Rig, seq: u32) {
    while rig.net.transmit(&test_frame(SIZE, seq)).is_err() {
        rig.take_interrupt(1);
        rig.tx_poll();
    }
}

/// The sequence numbers of the tx frames the peer has received so far.
fn collect_tx(peer: &PairPeer, out: &mut Vec<u32>) {
    while let Some(frame) = peer.try_recv_frame().unwrap() {
        let (hdr, eth) = frame.split_at(vnet_driver::VNET_HDR_LEN);
        assert!(hdr.iter().all(|b| *b == 0), "virtio-net header: {hdr:?}");
        assert_eq!(eth.len(), SIZE);
        out.push(check_frame(eth).expect("corrupt tx frame"));
    }
}

/// Polls tx until frame `last` has arrived (`late` says what did not, if it never does), then
/// drains the ring, quiesces the rig and collects the rest: every frame arrived in order, once.
fn finish_tx(rig: &mut Rig, peer: &PairPeer, arrived: &mut Vec<u32>, last: u32, late: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while arrived.last() != Some(&last) {
        assert!(Instant::now() < deadline, "{late}");
        rig.take_interrupt(1);
        rig.tx_poll();
        collect_tx(peer, arrived);
    }
    drain_tx(rig);
    rig.quiesce();
    collect_tx(peer, arrived);
    assert!(
        arrived.windows(2).all(|w| w[0] < w[1]),
        "out of order or twice"
    );
}

/// The rx queue is reset every 150 frames sent while the tx queue carries 3000 frames and the
/// peer sends frames the other way: every tx frame arrives, intact and in order; the received
/// frames are in order (frames the device had written but not polled at a reset are dropped
/// and counted); the device carried out every reset.
fn rx_resets_while_tx_flows(transport: TransportKind) {
    let (mut rig, peer) = rig_on(transport);
    let mut arrived = Vec::new();
    let mut received = Vec::new();
    let (mut sent, mut peer_sent, mut resets) = (0u32, 0u32, 0u64);
    let deadline = Instant::now() + Duration::from_secs(30);
    while arrived.len() < FRAMES as usize {
        assert!(
            Instant::now() < deadline,
            "{} of {FRAMES} tx frames",
            arrived.len()
        );
        while sent < FRAMES {
            if rig.net.transmit(&test_frame(SIZE, sent)).is_err() {
                break;
            }
            sent += 1;
            if sent.is_multiple_of(150) && sent < FRAMES {
                rig.net.reset_queue(QueueId::Rx).expect("rx reset");
                resets += 1;
            }
        }
        if peer_sent < FRAMES {
            peer.send_frame(&peer_frame(SIZE, peer_sent)).unwrap();
            peer_sent += 1;
        }
        rig.take_interrupt(0);
        rig.tx_poll();
        rig.rx_poll(&mut |frame: &mut [u8]| {
            received.push(check_frame(frame).expect("corrupt rx frame"));
            XdpAction::Drop
        });
        collect_tx(&peer, &mut arrived);
    }
    assert_eq!(arrived, (0..FRAMES).collect::<Vec<_>>());
    assert!(received.windows(2).all(|w| w[0] < w[1]), "rx out of order");
    let r = rig.net.reset_counters();
    // One buffer per frame (100 bytes): a frame is received, dropped at a reset, or in flight.
    assert!(received.len() as u64 + r.rx_buffers_dropped_at_reset <= u64::from(peer_sent));
    assert_eq!((r.rx_resets, r.tx_resets, r.failed), (resets, 0, 0));
    assert_eq!(resets, u64::from(FRAMES / 150 - 1));
    assert_eq!(rig.net.counters().device_errors, 0);
    rig.quiesce();
    assert_eq!(rig.metrics.queue_resets.get(), resets);
    assert_eq!(rig.metrics.queue_reenables.get(), resets);
    eprintln!(
        "{transport:?}: {resets} rx resets, {} of {peer_sent} rx frames received, {r:?}",
        received.len()
    );
}

over_both_transports!(rx_resets_while_tx_flows);

/// The tx queue is reset with frames in flight (no drain first): every frame is either
/// received by the peer or counted as not sent, none twice; frames after each reset flow.
fn tx_resets_mid_flight(transport: TransportKind) {
    let (mut rig, peer) = rig_on(transport);
    let mut arrived = Vec::new();
    let mut resets = 0u64;
    for round in 0..20u32 {
        for k in 0..100 {
            let seq = round * 100 + k;
            send(&mut rig, seq);
        }
        rig.tx_poll();
        rig.net.reset_queue(QueueId::Tx).expect("tx reset");
        resets += 1;
        collect_tx(&peer, &mut arrived);
    }
    // The last round's frames after the last reset: none (each round ends in a reset), so send
    // one more round and wait for all of it.
    for seq in 2000..2100 {
        send(&mut rig, seq);
    }
    finish_tx(
        &mut rig,
        &peer,
        &mut arrived,
        2099,
        "the last round did not arrive",
    );
    let r = rig.net.reset_counters();
    let c = rig.net.counters();
    assert_eq!((r.tx_resets, r.failed), (resets, 0));
    assert_eq!(c.tx_frames, 2100);
    // Every frame once: arrived, or reported not sent; completions never exceed what went out.
    assert_eq!(arrived.len() as u64 + r.tx_frames_not_sent, 2100, "{r:?}");
    assert_eq!(c.tx_reclaimed, arrived.len() as u64, "{r:?}");
    assert_eq!(rig.metrics.queue_resets.get(), resets);
    eprintln!(
        "{transport:?}: {resets} tx resets, {} frames arrived, {r:?}",
        arrived.len()
    );
}

over_both_transports!(tx_resets_mid_flight);

/// The peer stops reading, so the device's backend refuses frames (EAGAIN) and the tx ring
/// fills with chains the device cannot send; a tx reset then hands them back as not sent.
/// Once the peer reads again, frames queued after the reset flow: every frame either arrived
/// (in order, once) or was reported not sent.
fn tx_reset_with_a_stalled_backend(transport: TransportKind) {
    let (mut rig, peer) = rig_on(transport);
    let (_, tx_size) = rig.net.queue_sizes();
    let mut seq = 0u32;
    // Fill the socket and then the ring: stop when the ring stays full.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "the ring never stayed full");
        if rig.net.transmit(&test_frame(SIZE, seq)).is_ok() {
            seq += 1;
            continue;
        }
        std::thread::sleep(Duration::from_millis(20));
        rig.take_interrupt(0);
        rig.tx_poll();
        if rig.net.tx_free_descriptors() == 0 {
            break;
        }
    }
    let report = rig.net.reset_queue(QueueId::Tx).expect("tx reset");
    assert_eq!(
        report.unused,
        usize::from(tx_size),
        "the whole ring was stuck"
    );
    assert_eq!(rig.net.tx_free_descriptors(), usize::from(tx_size));
    let stuck = seq;
    let mut arrived = Vec::new();
    for s in stuck..stuck + 500 {
        loop {
            collect_tx(&peer, &mut arrived);
            if rig.net.transmit(&test_frame(SIZE, s)).is_ok() {
                break;
            }
            rig.take_interrupt(1);
            rig.tx_poll();
        }
    }
    let last = stuck + 499;
    finish_tx(
        &mut rig,
        &peer,
        &mut arrived,
        last,
        "frames after the reset did not arrive",
    );
    let r = rig.net.reset_counters();
    let c = rig.net.counters();
    let total = u64::from(stuck + 500);
    assert_eq!(r.tx_frames_not_sent, u64::from(tx_size), "{r:?}");
    assert_eq!(arrived.len() as u64 + r.tx_frames_not_sent, total, "{r:?}");
    assert_eq!(c.tx_reclaimed, arrived.len() as u64, "{r:?}");
    // The frames not sent are exactly the ones the ring held when it stalled.
    let lost: Vec<u32> = (0..stuck + 500)
        .filter(|s| arrived.binary_search(s).is_err())
        .collect();
    assert_eq!(
        lost,
        (stuck - u32::from(tx_size)..stuck).collect::<Vec<_>>()
    );
    eprintln!("{transport:?}: {stuck} queued before the stall, {r:?}");
}

over_both_transports!(tx_reset_with_a_stalled_backend);
