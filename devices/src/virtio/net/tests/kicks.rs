//! Kick coalescing end to end through the worker, on split and packed rings: a drained tx
//! queue lets the driver queue `max_packets` buffers without a kick, the device sends them
//! itself after `max_usecs`, a look that finds the driver quiet asks for a kick at its next
//! buffer again, and one that finds a broken ring stops the device as a kick would.

use std::time::Duration;

use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use super::driver::{started_rings, DriverRing};
use super::support::{frame, guest_mem, wire, GuestQueue};
use super::tuning::paced_driver;
use super::worker::{kick, Rig, TIMEOUT, VERSION_1};
use crate::test_utils::mmio::wait_until;
use crate::test_utils::packed::GuestPackedQueue;
use crate::virtio::net::{KickCoalescing, NetTuning};

const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;

/// A started rig whose device coalesces kicks (`max_packets` 0: off), EVENT_IDX negotiated.
fn kick_rings<Q: DriverRing>(max_packets: u16, max_usecs: u32) -> (Rig, Q) {
    kick_rings_with(VERSION_1 | EVENT_IDX, max_packets, max_usecs)
}

/// [`kick_rings`] with `features` negotiated.
fn kick_rings_with<Q: DriverRing>(features: u64, max_packets: u16, max_usecs: u32) -> (Rig, Q) {
    let mem = guest_mem();
    let (rig, _rx, tx) = started_rings::<Q>(&mem, features, move |device| {
        device
            .tuning_control()
            .set(NetTuning {
                kick_coalescing: KickCoalescing {
                    max_packets,
                    max_usecs,
                },
                ..NetTuning::default()
            })
            .expect("valid");
    });
    (rig, tx)
}

/// Offers `n` frames back to back, kicking whenever the ring asks for it; waits until the
/// peer has them all (in order, intact) and their buffers are back. Returns the kicks.
fn burst<Q: DriverRing>(rig: &Rig, tx: &mut Q, n: u8, seed: u8) -> u32 {
    let mut kicks = 0;
    let mut sent = Vec::new();
    for i in 0..n {
        let out = wire(&frame(64, seed.wrapping_add(i)));
        let id = tx.offer_tx(&out, &[]);
        if tx.wants_kick(1, true) {
            kick(&rig.transport, 1);
            kicks += 1;
        }
        sent.push((id, out));
    }
    expect_sent(rig, tx, sent);
    kicks
}

/// Waits until the peer has each of `sent`'s frames (in order, intact) and each buffer is
/// back (`(id, frame)` as offered).
fn expect_sent<Q: DriverRing>(rig: &Rig, tx: &mut Q, sent: Vec<(u16, Vec<u8>)>) {
    for (id, out) in sent {
        assert_eq!(rig.peer.recv_frame().expect("frame"), out);
        assert_eq!(tx.spin_used(), (u32::from(id), 0));
    }
}

/// Waits for the device's first look (the one after activation, which finds the ring empty):
/// the driver's next buffer then kicks.
fn wait_for_the_first_look(rig: &Rig) {
    let looks = &rig.metrics.tx.kick_timer_looks;
    assert!(wait_until(TIMEOUT, || looks.get() >= 1), "no look");
}

/// Bursts of 5 frames: with kick coalescing at 8 buffers (looks after 10 ms, far longer than
/// the test takes between bursts even on a loaded machine) they go out without a kick (the
/// device's own look sends them); without it the first frame of every burst kicks.
fn bursts_need_no_kick<Q: DriverRing>() {
    for max_packets in [0, 8] {
        let (rig, mut tx) = kick_rings::<Q>(max_packets, 10_000);
        let kicks: u32 = (0..6)
            .map(|b| {
                // The device publishes a burst's used entries, then moves its event for the
                // next: a driver that queues in between sees the last burst's event and may
                // kick a device that is awake. Queue after it went to sleep.
                std::thread::sleep(Duration::from_millis(2));
                burst(&rig, &mut tx, 5, b * 5)
            })
            .sum();
        let m = &rig.metrics.tx;
        if max_packets == 0 {
            assert!(kicks >= 6, "off: {kicks} kicks for 6 bursts");
            assert_eq!(m.kick_timer_looks.get(), 0, "no look without coalescing");
        } else {
            // A look that outlasts the test's pause between bursts (a loaded machine) may
            // find the ring empty once and ask for one kick.
            assert!(
                kicks <= 2,
                "coalescing 8: {kicks} kicks for 6 bursts, {} looks, {} found frames",
                m.kick_timer_looks.get(),
                m.kick_timer_found.get()
            );
            assert!(
                m.kick_timer_found.get() >= 4,
                "looks that sent frames: {}",
                m.kick_timer_found.get()
            );
        }
        assert_eq!(m.frames.get(), 30);
    }
}

#[test]
fn kick_coalescing_sends_bursts_shorter_than_max_packets_without_a_kick_split() {
    bursts_need_no_kick::<GuestQueue>();
}

#[test]
fn kick_coalescing_sends_bursts_shorter_than_max_packets_without_a_kick_packed() {
    bursts_need_no_kick::<GuestPackedQueue>();
}

/// A burst of more than `max_packets` frames: the driver queues that many past the drained
/// ring without a kick, and the next one kicks; the device then sends them all.
fn the_buffer_after_max_packets_kicks<Q: DriverRing>() {
    // The look (10 ms) is far behind the burst: what moves the frames is the kick.
    let (rig, mut tx) = kick_rings::<Q>(8, 10_000);
    wait_for_the_first_look(&rig);
    assert_eq!(burst(&rig, &mut tx, 1, 0), 1, "a quiet device wants a kick");
    let mut kicked_at = None;
    let mut sent = Vec::new();
    for i in 0..9u8 {
        let out = wire(&frame(64, 100 + i));
        sent.push((tx.offer_tx(&out, &[]), out));
        if tx.wants_kick(1, true) {
            kicked_at = Some(i);
            kick(&rig.transport, 1);
            break;
        }
    }
    assert_eq!(
        kicked_at,
        Some(8),
        "8 buffers queued without a kick, the 9th kicks"
    );
    expect_sent(&rig, &mut tx, sent);
}

#[test]
fn the_buffer_after_max_packets_kicks_split() {
    the_buffer_after_max_packets_kicks::<GuestQueue>();
}

#[test]
fn the_buffer_after_max_packets_kicks_packed() {
    the_buffer_after_max_packets_kicks::<GuestPackedQueue>();
}

/// The driver goes quiet for longer than `max_usecs`: the device's look finds nothing and asks
/// for a kick at the next buffer, so a lone frame after the pause kicks and is sent at once;
/// turning the knob off at run time asks for every kick again.
#[test]
fn a_quiet_driver_kicks_its_next_frame_and_the_knob_turns_off_at_run_time() {
    let (rig, mut tx) = kick_rings::<GuestQueue>(64, 200);
    for b in 0..3u8 {
        std::thread::sleep(Duration::from_millis(20));
        let found = rig.metrics.tx.kick_timer_found.get();
        assert_eq!(
            burst(&rig, &mut tx, 1, b),
            1,
            "pause {b}: the lone frame kicks"
        );
        assert_eq!(rig.metrics.tx.kick_timer_found.get(), found);
    }
    assert!(rig.metrics.tx.kick_timer_looks.get() >= 3);
    rig.tuning.set(NetTuning::default()).expect("valid");
    std::thread::sleep(Duration::from_millis(20));
    let looks = rig.metrics.tx.kick_timer_looks.get();
    let kicks: u32 = (0..4).map(|b| burst(&rig, &mut tx, 3, 10 + b * 3)).sum();
    assert!(kicks >= 4, "off: {kicks} kicks for 4 bursts");
    assert_eq!(
        rig.metrics.tx.kick_timer_looks.get(),
        looks,
        "no looks once off"
    );
}

/// A driver that publishes a broken avail index and never kicks: the device's own look finds
/// it and stops the device (DEVICE_NEEDS_RESET), as a kick would have; the VMM goes on.
#[test]
fn a_look_that_finds_a_broken_ring_sets_needs_reset() {
    let (rig, mut tx) = kick_rings::<GuestQueue>(64, 200);
    // One frame sent after the first look puts the device back into coalescing (its next
    // look is due 200 µs after it sleeps).
    wait_for_the_first_look(&rig);
    assert_eq!(burst(&rig, &mut tx, 1, 0), 1);
    let looks = rig.metrics.tx.kick_timer_looks.get();
    tx.set_avail_idx(tx.avail_idx().wrapping_add(1000));
    let t = &rig.transport;
    assert!(wait_until(TIMEOUT, || t.status()
        & VIRTIO_CONFIG_S_NEEDS_RESET
        != 0));
    assert!(
        rig.metrics.tx.kick_timer_looks.get() > looks,
        "found by a look"
    );
    assert_eq!(rig.metrics.needs_reset_events.get(), 1);
}

/// Without EVENT_IDX the driver cannot be asked to kick later: every frame of a paced driver
/// kicks a sleeping device, and the device owes the ring no look.
#[test]
fn without_event_idx_kick_coalescing_changes_nothing() {
    let (rig, mut tx) = kick_rings_with::<GuestQueue>(VERSION_1, 8, 200);
    let kicks = paced_driver(&rig, &mut tx, false, 10, Duration::from_millis(1));
    assert_eq!(kicks, 10);
    assert_eq!(rig.metrics.tx.kick_timer_looks.get(), 0);
}
