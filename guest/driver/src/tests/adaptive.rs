//! [`Config::adaptive`] through the driver: the kick threshold on the real transmit path, the
//! XDP_TX bulk on the real rx poll, and the rx coalescing commands on the control queue.

use std::boxed::Box;
use std::sync::{Arc, Mutex};
use std::vec::Vec;

use super::{frame, harness, harness_with, Harness};
use crate::adapt::{RX_COAL_PROFILES, RX_INTERVAL_POLLS, TX_INTERVAL_FRAMES};
use crate::ctrl::{CLASS_NOTF_COAL, NOTF_COAL_RX_SET, NOTF_COAL_VQ_SET};
use crate::features::{NET_F_CTRL_VQ, NET_F_NOTF_COAL, NET_F_VQ_NOTF_COAL};
use crate::net::TX_QUEUE;
use crate::testing::{CtrlBehaviour, Regs, TestDevice};
use crate::{Config, Counters, TxCompletion, XdpAction};

/// Has a device that never busy-polls serve the tx queue: on every kick it drains the ring,
/// returns the chains and re-arms its notification (EVENT_IDX `avail_event` at the next
/// slot), then sleeps. Returns the number of frames it has received so far.
fn sleeping_tx_device(h: &Harness) -> Arc<Mutex<usize>> {
    let received = Arc::new(Mutex::new(0usize));
    let mut dev = TestDevice::attach(&h.hal, &h.transport);
    let count = Arc::clone(&received);
    h.transport.set_notify_hook(Some(Box::new(move |queue| {
        if queue == TX_QUEUE {
            *count.lock().expect("count lock") += dev.tx_drain().len();
            dev.tx.enable_notifications();
        }
    })));
    received
}

/// Sends `batches` batches of 64 frames; returns the counters and the frames received.
fn send_batches(config: Config, batches: usize) -> (Counters, usize) {
    let mut h = harness(Config {
        tx_completion: TxCompletion::Lazy,
        ..config
    });
    let received = sleeping_tx_device(&h);
    let frames: Vec<Vec<u8>> = (0..64).map(|i| frame(i, 60)).collect();
    for _ in 0..batches {
        let batch = h.net.transmit_batch(frames.iter().map(Vec::as_slice));
        assert_eq!(batch.stopped, None);
    }
    let received = *received.lock().expect("count lock");
    (h.net.counters(), received)
}

#[test]
fn adaptive_kick_threshold_cuts_kicks_per_frame_against_a_device_that_never_busy_polls() {
    let batches = 40;
    let total = 64 * batches;
    let (fixed, received) = send_batches(Config::default(), batches);
    assert_eq!(received, total);
    assert_eq!(fixed.kicks, total as u64 / 8, "a kick every 8 frames");
    assert_eq!(
        (fixed.kick_threshold_now, fixed.kick_threshold_changes),
        (8, 0),
        "not adaptive: the configured threshold throughout"
    );

    let config = Config {
        adaptive: true,
        ..Config::default()
    };
    let (adaptive, received) = send_batches(config, batches);
    assert_eq!(received, total, "every frame still arrives");
    // 8 → 16 → 32 → 64 at the end of each of the first three intervals, then one kick per
    // batch of 64.
    assert_eq!(adaptive.kick_threshold_now, 64);
    assert_eq!(adaptive.kick_threshold_changes, 3);
    let interval = TX_INTERVAL_FRAMES;
    let expected =
        interval / 8 + interval / 16 + interval / 32 + (total as u64 - 3 * interval) / 64;
    assert_eq!(adaptive.kicks, expected);
    assert!(
        adaptive.kicks * 3 < fixed.kicks,
        "kicks per frame: {} adaptive, {} fixed",
        adaptive.kicks as f64 / total as f64,
        fixed.kicks as f64 / total as f64
    );
    assert_eq!(adaptive.kicks_suppressed, 0, "the device wanted every kick");
}

#[test]
fn adaptive_kick_threshold_stays_within_kick_threshold_max_and_half_the_ring() {
    let config = Config {
        adaptive: true,
        kick_threshold_max: 24,
        ..Config::default()
    };
    assert_eq!(send_batches(config, 20).0.kick_threshold_now, 24);
    let config = Config {
        adaptive: true,
        tx_queue_size: 32,
        ..Config::default()
    };
    let (c, received) = send_batches(config, 20);
    assert_eq!((c.kick_threshold_now, received), (16, 20 * 64));
}

#[test]
fn adaptive_xdp_bulk_follows_the_bounces_per_poll() {
    let mut h = harness(Config {
        adaptive: true,
        ..Config::default()
    });
    // A device that sleeps as soon as it has drained what a kick brought: every flush is a
    // kick.
    let received = sleeping_tx_device(&h);
    let mut bounce = |_: &[u8]| XdpAction::Tx;
    // 16 polls bouncing 3 frames each: the bulk stays at the configured 16 (never below).
    for poll in 0..16u32 {
        for i in 0..3 {
            assert!(h.dev.rx_deliver(&frame(poll * 3 + i, 60)));
        }
        assert_eq!(h.net.poll_rx(64, &mut bounce), 3);
        assert_eq!(
            *received.lock().expect("count lock"),
            3 * (poll as usize + 1)
        );
    }
    let c = h.net.counters();
    assert_eq!((c.xdp_bulk_now, c.xdp_bulk_changes, c.xdp_tx), (16, 0, 48));
    assert_eq!(c.xdp_flushes, 16, "one flush per poll");
    // Two intervals of 16 polls bouncing 40: up to 64 (a raise needs two intervals in a row
    // that ask for it), one flush per poll again.
    let flushes = c.xdp_flushes;
    for poll in 0..32u32 {
        for i in 0..40 {
            assert!(h.dev.rx_deliver(&frame(poll * 40 + i, 60)));
        }
        h.net.poll_rx(64, &mut bounce);
        h.net.reclaim_tx();
    }
    let c = h.net.counters();
    assert_eq!((c.xdp_bulk_now, c.xdp_bulk_changes), (64, 1));
    // At a bulk of 16, the 32 polls of 40 flushed 3 times each (16 + 16 + 8), each a kick.
    assert_eq!(c.xdp_flushes - flushes, 32 * 3);
    assert_eq!(c.xdp_tx_errors, 0);
}

/// 64 rx polls of 40 frames, every one bounced; the device drains the tx queue after each poll
/// and, if `rearm`, re-enables its notification (it sleeps until the next poll's first kick).
fn bounce_polls_of_40(h: &mut Harness, rearm: bool) {
    let mut bounce = |_: &[u8]| XdpAction::Tx;
    for poll in 0..64u32 {
        for i in 0..40 {
            assert!(h.dev.rx_deliver(&frame(poll * 40 + i, 60)));
        }
        h.net.poll_rx(64, &mut bounce);
        h.dev.tx_drain();
        if rearm {
            h.dev.tx.enable_notifications();
        }
        h.net.reclaim_tx();
    }
}

#[test]
fn xdp_bulk_stays_configured_when_only_the_first_flush_of_a_poll_kicks() {
    let mut h = harness(Config {
        adaptive: true,
        ..Config::default()
    });
    // The device sleeps between polls (it re-arms its notification after draining) but not
    // between the flushes of one poll: one kick a poll for three publishes, whatever the bulk,
    // so a larger bulk would save no kick and only hold frames back.
    bounce_polls_of_40(&mut h, true);
    let c = h.net.counters();
    assert_eq!((c.xdp_bulk_now, c.xdp_bulk_changes), (16, 0));
    assert_eq!(c.kicks, 64, "one kick a poll");
}

/// A device with a control queue offering `features` (and CTRL_VQ).
fn ctrl_harness(features: u64) -> Harness {
    harness_with(
        Config {
            adaptive: true,
            ..Config::default()
        },
        |r: &mut Regs| {
            r.device_features |= NET_F_CTRL_VQ | features;
            r.queues[2].num_max = 64;
        },
    )
}

/// One rx adaptation interval with `per_poll` frames received in each poll.
fn rx_interval(h: &mut Harness, per_poll: u32) {
    for poll in 0..RX_INTERVAL_POLLS {
        for i in 0..per_poll {
            assert!(h.dev.rx_deliver(&frame(poll * per_poll + i, 60)));
        }
        // One interrupt per poll: `per_poll` frames each.
        h.dev.interrupt();
        h.net.handle_interrupt();
        assert_eq!(
            h.net.poll_rx(64, &mut |_| XdpAction::Pass),
            per_poll as usize
        );
    }
}

/// `{le32 max_packets; le32 usecs}` of rx coalescing level `level`.
fn coal_bytes(level: usize) -> Vec<u8> {
    let c = RX_COAL_PROFILES[level];
    let mut b = c.max_packets.to_le_bytes().to_vec();
    b.extend_from_slice(&c.usecs.to_le_bytes());
    b
}

#[test]
fn adaptive_rx_coalescing_goes_out_as_rx_set_and_a_refusal_stops_it() {
    let mut h = ctrl_harness(NET_F_NOTF_COAL | NET_F_VQ_NOTF_COAL);
    assert!(h.dev.ctrl().log.is_empty(), "nothing sent at bring-up");
    rx_interval(&mut h, 2);
    let log = h.dev.ctrl().log.clone();
    assert_eq!(log.len(), 1, "the first interval tries level 1");
    assert_eq!(
        (log[0].class, log[0].cmd, log[0].data.clone()),
        (CLASS_NOTF_COAL, NOTF_COAL_RX_SET, coal_bytes(1))
    );
    let c1 = RX_COAL_PROFILES[1];
    assert_eq!(h.dev.ctrl().coal[0], (c1.max_packets, c1.usecs));
    let c = h.net.counters();
    assert_eq!(
        (c.rx_coal_level, c.rx_coal_changes, c.rx_coal_errors),
        (1, 1, 0)
    );

    // Twice the rate at level 1 (two frames per interrupt, then four): better, so level 2 — which the device now refuses.
    h.dev.ctrl().behaviour = CtrlBehaviour::AlwaysErr;
    rx_interval(&mut h, 4);
    let log = h.dev.ctrl().log.clone();
    assert_eq!(log.len(), 2);
    assert_eq!(log[1].data, coal_bytes(2));
    let c = h.net.counters();
    assert_eq!(
        (c.rx_coal_level, c.rx_coal_changes, c.rx_coal_errors),
        (1, 1, 1),
        "the device's level stays the accepted one"
    );
    assert_eq!(c.ctrl_failed, 1);
    // Rx adaptation has stopped: whatever the traffic does, no more commands.
    for per_poll in [8, 1, 8] {
        rx_interval(&mut h, per_poll);
    }
    assert_eq!(h.dev.ctrl().log.len(), 2);
    assert_eq!(h.net.counters().rx_coal_errors, 1);
    assert!(!h.net.is_broken());
}

#[test]
fn adaptive_rx_coalescing_uses_vq_set_with_vq_notf_coal_alone() {
    let mut h = ctrl_harness(NET_F_VQ_NOTF_COAL);
    rx_interval(&mut h, 2);
    let log = h.dev.ctrl().log.clone();
    assert_eq!(log.len(), 1);
    let mut data = std::vec![0u8, 0, 0, 0];
    data.extend_from_slice(&coal_bytes(1));
    assert_eq!(
        (log[0].class, log[0].cmd, log[0].data.clone()),
        (CLASS_NOTF_COAL, NOTF_COAL_VQ_SET, data),
        "VQ_SET on rx queue 0"
    );
    assert_eq!(h.net.counters().rx_coal_level, 1);
}

#[test]
fn adaptive_rx_coalescing_stays_off_without_a_coalescing_feature() {
    // A control queue but no NOTF_COAL or VQ_NOTF_COAL: no command ever.
    let mut h = ctrl_harness(0);
    for per_poll in [1, 2, 4] {
        rx_interval(&mut h, per_poll);
    }
    assert!(h.dev.ctrl().log.is_empty());
    let c = h.net.counters();
    assert_eq!(
        (c.rx_coal_level, c.rx_coal_changes, c.rx_coal_errors),
        (0, 0, 0)
    );
}

/// The fake clock of [`adaptive_rx_rates_are_per_tick_with_a_clock`].
static NOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn fake_now() -> u64 {
    NOW.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn adaptive_rx_rates_are_per_tick_with_a_clock() {
    use std::sync::atomic::Ordering::Relaxed;
    // Without a clock, the same frames per interval of polls is the same rate: level 1 parks.
    let mut h = ctrl_harness(NET_F_NOTF_COAL);
    rx_interval(&mut h, 2);
    rx_interval(&mut h, 2);
    assert_eq!(h.dev.ctrl().log.len(), 1);
    assert_eq!(h.net.counters().rx_coal_level, 1);

    // With one, the same frames over twice the ticks is half the rate: worse, back to 0.
    let mut h = ctrl_harness(NET_F_NOTF_COAL);
    h.net.set_adapt_clock(Some(fake_now));
    NOW.fetch_add(1_000, Relaxed);
    rx_interval(&mut h, 2);
    NOW.fetch_add(2_000, Relaxed);
    rx_interval(&mut h, 2);
    let log = h.dev.ctrl().log.clone();
    assert_eq!(log.len(), 2);
    assert_eq!(log[1].data, coal_bytes(0));
    let c = h.net.counters();
    assert_eq!((c.rx_coal_level, c.rx_coal_changes), (0, 2));
}

#[test]
fn xdp_bulk_stays_configured_while_the_device_polls() {
    let mut h = harness(Config {
        adaptive: true,
        ..Config::default()
    });
    // The device never re-enables notifications after draining (it polls the ring): the
    // polls send no kick, and 40 bounces per poll leave the bulk at the configured 16.
    bounce_polls_of_40(&mut h, false);
    let c = h.net.counters();
    assert_eq!((c.xdp_bulk_now, c.xdp_bulk_changes), (16, 0));
    assert!(c.kicks <= 2, "{} kicks", c.kicks);
}
