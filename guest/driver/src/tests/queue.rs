//! The per-queue split: [`crate::Counters`] is assembled from the queues' counters.

use super::{harness, harness_with};
use crate::ctrl::CtrlStats;
use crate::features::{NET_F_CTRL_VQ, NET_F_NOTF_COAL};
use crate::queue::{ReceiveStats, SendStats};
use crate::{Config, Counters};

#[test]
fn counters_report_each_queue_counter_in_its_field() {
    let mut h = harness(Config::default());
    h.net.sq.stats = SendStats {
        frames: 1,
        bytes: 2,
        kicks: 3,
        kicks_suppressed: 4,
        kicks_suppressed_no_notify: 5,
        publishes: 6,
        reclaimed: 7,
        reclaim_polls: 8,
        ring_full: 9,
        xdp_tx: 10,
        xdp_tx_errors: 11,
        xdp_flushes: 12,
        xsk_invalid_descs: 13,
        device_errors: 14,
    };
    h.net.rq.stats = ReceiveStats {
        frames: 101,
        bytes: 102,
        kicks: 103,
        kicks_suppressed: 104,
        xdp_pass: 105,
        xdp_drop: 106,
        device_errors: 107,
    };
    h.net.interrupts = 200;
    assert_eq!(
        h.net.counters(),
        Counters {
            tx_frames: 1,
            tx_bytes: 2,
            rx_frames: 101,
            rx_bytes: 102,
            kicks: 3,
            kicks_suppressed: 4,
            kicks_suppressed_no_notify: 5,
            tx_publishes: 6,
            rx_kicks: 103,
            rx_kicks_suppressed: 104,
            interrupts: 200,
            tx_reclaimed: 7,
            tx_reclaim_polls: 8,
            ring_full: 9,
            xdp_tx: 10,
            xdp_tx_errors: 11,
            xdp_flushes: 12,
            xdp_drop: 106,
            xdp_pass: 105,
            xsk_invalid_descs: 13,
            device_errors: 14 + 107,
            ctrl_commands: 0,
            ctrl_failed: 0,
            ctrl_timeouts: 0,
            // Adaptive off: the configured values, no changes.
            kick_threshold_now: 8,
            xdp_bulk_now: 16,
            rx_coal_level: 0,
            kick_threshold_changes: 0,
            xdp_bulk_changes: 0,
            rx_coal_changes: 0,
            rx_coal_errors: 0,
        }
    );
}

#[test]
fn counters_report_the_control_queue_counters() {
    let mut h = harness_with(Config::default(), |r| {
        r.device_features |= NET_F_CTRL_VQ | NET_F_NOTF_COAL;
        r.queues[2].num_max = 8;
    });
    h.net.sq.stats.device_errors = 1;
    h.net.rq.stats.device_errors = 2;
    h.net.cq.as_mut().expect("control queue").stats = CtrlStats {
        commands: 301,
        failed: 302,
        timeouts: 303,
        device_errors: 304,
    };
    let c = h.net.counters();
    assert_eq!(
        (
            c.ctrl_commands,
            c.ctrl_failed,
            c.ctrl_timeouts,
            c.device_errors
        ),
        (301, 302, 303, 1 + 2 + 304)
    );
}
