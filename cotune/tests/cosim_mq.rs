//! Co-simulation with two queue pairs: the driver crate with `queue_pairs: 2` against the real
//! device model with one socketpair backend per pair (VIRTIO_NET_F_MQ, one worker thread per
//! pair; one shared interrupt eventfd on virtio-mmio, one MSI-X vector per queue on virtio-pci). Each pair's frames reach only its own backend and come
//! back only on its own rx queue, intact and in order, and the driver's per-pair counters equal
//! the device's `queues[i]` metrics.

use std::time::{Duration, Instant};

mod common;

use common::{peer_frame, pump};

use cotune::frames::{check_frame, test_frame};
use cotune::rig::Rig;
use cotune::transport::TransportKind;
use devices::backend::PairPeer;
use vnet_driver::{Config, QueueId, XdpAction};

const FRAMES: u32 = 1000;
const PAIRS: u16 = 2;
const SIZE: usize = 200;
/// Sequence numbers of pair `p`'s frames start at `p * SEQ_BASE`.
const SEQ_BASE: u32 = 100_000;

fn rig(transport: TransportKind) -> (Rig, Vec<PairPeer>) {
    let driver = Config {
        queue_pairs: PAIRS,
        ..Config::default()
    };
    common::rig_with_peers(driver, transport)
}

/// Pair `pair` transmits FRAMES frames; its peer gets every one in order, the others none.
fn transmit_on(rig: &mut Rig, peers: &[PairPeer], pair: u16) {
    let base = u32::from(pair) * SEQ_BASE;
    let (mut sent, mut arrived) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while arrived < FRAMES {
        assert!(Instant::now() < deadline, "pair {pair}: {arrived} arrived");
        while sent < FRAMES {
            let net = rig.net.on_pair(pair).expect("pair");
            if net.transmit(&test_frame(SIZE, base + sent)).is_err() {
                break;
            }
            sent += 1;
        }
        // The interrupt is shared: service every pair's tx.
        if rig.take_interrupt(0) || rig.net.tx_free_descriptors() == 0 {
            for p in 0..PAIRS {
                rig.net.select_pair(p).expect("pair");
                rig.tx_poll();
            }
        }
        while let Some(frame) = peers[usize::from(pair)].try_recv_frame().unwrap() {
            let eth = &frame[vnet_driver::VNET_HDR_LEN..];
            assert_eq!(check_frame(eth), Some(base + arrived), "pair {pair} tx");
            arrived += 1;
        }
        for (other, peer) in peers.iter().enumerate() {
            if other != usize::from(pair) {
                assert_eq!(
                    peer.try_recv_frame().unwrap(),
                    None,
                    "pair {pair}'s frame on {other}"
                );
            }
        }
    }
}

/// Pair `pair`'s peer sends FRAMES frames; they arrive on that pair's rx queue only.
fn receive_on(rig: &mut Rig, peers: &[PairPeer], pair: u16) {
    let base = u32::from(pair) * SEQ_BASE;
    let mut received = 0u32;
    pump(
        FRAMES,
        64,
        |seq| {
            let f = peer_frame(SIZE, base + seq);
            peers[usize::from(pair)].send_frame(&f).unwrap();
        },
        || {
            rig.take_interrupt(1);
            for p in 0..PAIRS {
                let net = rig.net.on_pair(p).expect("pair");
                net.poll_rx(64, &mut |frame: &[u8]| {
                    assert_eq!(p, pair, "a frame of pair {pair} on pair {p}");
                    assert_eq!(check_frame(frame), Some(base + received), "pair {pair} rx");
                    received += 1;
                    XdpAction::Drop
                });
                let _ = net.enable_interrupts(QueueId::Rx);
            }
            received
        },
        |received| format!("pair {pair}: {received} received"),
    );
}

#[test]
fn two_pairs_carry_their_own_frames_and_counters_match_the_device() {
    two_pairs_on(TransportKind::Mmio);
}

/// The same over virtio-pci: one MSI-X vector per queue (pair 1's on vectors 3 and 4).
#[test]
fn two_pairs_over_virtio_pci_with_a_vector_per_queue() {
    two_pairs_on(TransportKind::Pci);
}

fn two_pairs_on(transport: TransportKind) {
    let (mut rig, peers) = rig(transport);
    assert_eq!(
        (rig.net.queue_pairs(), rig.net.active_queue_pairs()),
        (2, 2)
    );
    for pair in 0..PAIRS {
        transmit_on(&mut rig, &peers, pair);
        receive_on(&mut rig, &peers, pair);
    }
    rig.quiesce();
    let m = &rig.metrics;
    assert_eq!(m.ctrl.mq_pairs_sets.get(), 1);
    assert_eq!(m.queues.len(), 2);
    for pair in 0..PAIRS {
        let c = rig.net.pair_counters(pair).expect("pair");
        let q = &m.queues[usize::from(pair)];
        assert_eq!(c.tx_frames, u64::from(FRAMES), "pair {pair}");
        assert_eq!(c.rx_frames, u64::from(FRAMES), "pair {pair}");
        assert_eq!(c.tx_frames, q.tx.frames.get(), "pair {pair} tx frames");
        assert_eq!(c.rx_frames, q.rx.frames.get(), "pair {pair} rx frames");
        assert_eq!(c.kicks, q.tx.kicks.get(), "pair {pair} tx kicks");
        assert_eq!(c.rx_kicks, q.rx.kicks.get(), "pair {pair} rx kicks");
        assert!(c.interrupts > 0, "pair {pair}: {c:?}");
    }
    let total = rig.net.counters();
    assert_eq!(total.tx_frames, m.tx.frames.get());
    assert_eq!(total.rx_frames, m.rx.frames.get());
    assert_eq!(total.device_errors, 0);
}
