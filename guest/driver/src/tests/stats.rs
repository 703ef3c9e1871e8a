//! Device statistics ([`crate::stats`]): negotiation, QUERY and GET in the spec's layout, and
//! every malformed reply refused.

use std::vec;
use std::vec::Vec;

use super::{harness_with, served_harness, Harness};
use crate::features::*;
use crate::stats::{CvqStats, RxBasic, RxSpeed, StatsReplyError, TxBasic, TxSpeed};
use crate::testing::{CtrlBehaviour, CtrlRecord, Regs};
use crate::{Config, CtrlError, DeviceStats, StatsTypes};

/// A device with a control queue that offers DEVICE_STATS.
fn offer_stats(r: &mut Regs) {
    r.device_features |= NET_F_CTRL_VQ | NET_F_DEVICE_STATS;
    r.queues[2].num_max = 64;
}

fn stats_harness(config: Config) -> Harness {
    harness_with(config, offer_stats)
}

/// The test device's counter `i` of block type `ty` of queue `vq`.
fn value(vq: u16, ty: u64, i: u64) -> u64 {
    u64::from(vq) << 16 | ty << 8 | i
}

#[test]
fn device_stats_is_negotiated_with_the_control_queue_only() {
    let h = stats_harness(Config::default());
    assert_ne!(h.net.features() & NET_F_DEVICE_STATS, 0);
    // Turned off in the configuration.
    let mut h = stats_harness(Config {
        device_stats: false,
        ..Config::default()
    });
    assert_eq!(h.net.features() & NET_F_DEVICE_STATS, 0);
    let not = CtrlError::NotNegotiated("VIRTIO_NET_F_DEVICE_STATS");
    assert_eq!(h.net.query_stats(), Err(not));
    assert_eq!(h.net.get_stats(0, StatsTypes::RX_BASIC), Err(not));
    assert_eq!(h.net.counters().ctrl_commands, 0, "nothing sent");
    // No control queue (turned off, or not offered): not acknowledged.
    let h = stats_harness(Config {
        ctrl_vq: false,
        ..Config::default()
    });
    assert_eq!(h.net.features() & NET_F_DEVICE_STATS, 0);
    let mut h = harness_with(Config::default(), |r| {
        r.device_features |= NET_F_DEVICE_STATS;
    });
    assert_eq!(h.net.features() & NET_F_DEVICE_STATS, 0);
    assert_eq!(h.net.get_stats(1, StatsTypes::TX), Err(not));
    // Offered without stats: the control queue works, statistics do not.
    let mut h = harness_with(Config::default(), |r| {
        r.device_features |= NET_F_CTRL_VQ;
        r.queues[2].num_max = 8;
    });
    assert!(h.net.has_ctrl_vq());
    assert_eq!(h.net.query_stats(), Err(not));
}

#[test]
fn query_and_get_round_trip_in_the_spec_layout() {
    let mut h = stats_harness(Config::default());
    let supported = h.net.query_stats().unwrap();
    assert_eq!(supported, StatsTypes(0x1_0009_0009));
    assert_eq!(supported & StatsTypes::PARSED, supported);

    let rx = h.net.get_stats(0, StatsTypes::RX).unwrap();
    let c = |i| value(0, 0, i);
    assert_eq!(
        rx,
        DeviceStats {
            vq_index: 0,
            rx_basic: Some(RxBasic {
                rx_notifications: c(0),
                rx_packets: c(1),
                rx_bytes: c(2),
                rx_interrupts: c(3),
                rx_drops: c(4),
                rx_drop_overruns: c(5),
            }),
            rx_speed: Some(RxSpeed {
                rx_packets_allowance_exceeded: value(0, 3, 0),
                rx_bytes_allowance_exceeded: value(0, 3, 1),
            }),
            ..DeviceStats::default()
        }
    );
    let tx = h.net.get_stats(1, StatsTypes::TX_BASIC).unwrap();
    let c = |i| value(1, 16, i);
    assert_eq!(
        tx.tx_basic,
        Some(TxBasic {
            tx_notifications: c(0),
            tx_packets: c(1),
            tx_bytes: c(2),
            tx_interrupts: c(3),
            tx_drops: c(4),
            tx_drop_malformed: c(5),
        })
    );
    assert_eq!((tx.tx_speed, tx.rx_basic, tx.cvq), (None, None, None));
    let speed = h.net.get_stats(1, StatsTypes::TX_SPEED).unwrap();
    assert_eq!(
        speed.tx_speed,
        Some(TxSpeed {
            tx_packets_allowance_exceeded: value(1, 19, 0),
            tx_bytes_allowance_exceeded: value(1, 19, 1),
        })
    );
    // CVQ: the commands so far, this GET included; the OKs before it.
    let cvq = h.net.get_stats(2, StatsTypes::CVQ).unwrap();
    assert_eq!(
        cvq.cvq,
        Some(CvqStats {
            command_num: 5,
            ok_num: 4
        })
    );
    assert_eq!(h.net.counters().ctrl_commands, 5);

    // The wire: header, 16-byte entry, a reply of exactly the blocks' size, the ack.
    let log = h.dev.ctrl().log.clone();
    let (r, w) = (false, true);
    let entry = |vq: u8, types: u64| {
        let mut e = vec![vq, 0, 0, 0, 0, 0, 0, 0];
        e.extend_from_slice(&types.to_le_bytes());
        e
    };
    let record = |cmd: u8, data: Vec<u8>, layout: &[(u32, bool)]| CtrlRecord {
        class: 8,
        cmd,
        data,
        layout: layout.to_vec(),
    };
    assert_eq!(
        log,
        vec![
            record(0, vec![], &[(2, r), (1, w), (8, w)]),
            record(1, entry(0, 0x9), &[(2, r), (16, r), (1, w), (80, w)]),
            record(1, entry(1, 1 << 16), &[(2, r), (16, r), (1, w), (56, w)]),
            record(1, entry(1, 1 << 19), &[(2, r), (16, r), (1, w), (24, w)]),
            record(1, entry(2, 1 << 32), &[(2, r), (16, r), (1, w), (24, w)]),
        ]
    );
    assert_eq!(h.transport.regs().kicks(2), 5);
    assert_eq!(h.net.counters().interrupts, 0);
}

#[test]
fn types_are_checked_before_anything_is_sent() {
    let mut h = stats_harness(Config::default());
    for types in [
        StatsTypes::empty(),
        StatsTypes::RX_CSUM,
        StatsTypes::RX_BASIC | StatsTypes::RX_GSO,
        StatsTypes::TX_CSUM,
        StatsTypes(1 << 63),
    ] {
        assert_eq!(
            h.net.get_stats(0, types),
            Err(CtrlError::UnsupportedStats(types.bits()))
        );
    }
    assert_eq!(h.net.counters().ctrl_commands, 0);
    // The device refuses types of the wrong queue kind and queues that do not exist.
    assert_eq!(
        h.net.get_stats(1, StatsTypes::RX_BASIC),
        Err(CtrlError::Rejected)
    );
    assert_eq!(h.net.get_stats(2, StatsTypes::TX), Err(CtrlError::Rejected));
    assert_eq!(
        h.net.get_stats(0, StatsTypes::CVQ),
        Err(CtrlError::Rejected)
    );
    assert_eq!(
        h.net.get_stats(7, StatsTypes::TX_BASIC),
        Err(CtrlError::Rejected)
    );
    let c = h.net.counters();
    assert_eq!((c.ctrl_commands, c.ctrl_failed), (4, 4));
    // A device that supports less refuses the rest.
    h.dev.ctrl().stats_supported = 1 << 0;
    assert_eq!(h.net.query_stats(), Ok(StatsTypes::RX_BASIC));
    assert_eq!(h.net.get_stats(0, StatsTypes::RX), Err(CtrlError::Rejected));
    assert!(h.net.get_stats(0, StatsTypes::RX_BASIC).is_ok());
}

#[test]
fn the_queue_kinds_of_the_layout() {
    let h = stats_harness(Config::default());
    assert_eq!(h.net.stats_types_of(0), StatsTypes::RX);
    assert_eq!(h.net.stats_types_of(1), StatsTypes::TX);
    assert_eq!(h.net.stats_types_of(2), StatsTypes::CVQ);
    assert_eq!(h.net.stats_types_of(3), StatsTypes::empty());
}

#[test]
fn multiqueue_stats_name_each_pair_and_the_control_queue_at_2n() {
    let config = Config {
        queue_pairs: 2,
        ..Config::default()
    };
    let Harness {
        mut net, dev: _dev, ..
    } = served_harness(config, |r| {
        r.multiqueue(4);
        r.device_features |= NET_F_DEVICE_STATS;
    });
    assert_eq!(net.ctrl_queue_index(), Some(8));
    assert_eq!(net.stats_types_of(2), StatsTypes::RX);
    assert_eq!(net.stats_types_of(3), StatsTypes::TX);
    assert_eq!(
        net.stats_types_of(4),
        StatsTypes::empty(),
        "pair not set up"
    );
    assert_eq!(net.stats_types_of(8), StatsTypes::CVQ);
    let tx = net.get_stats(3, StatsTypes::TX_BASIC).unwrap();
    assert_eq!(tx.tx_basic.unwrap().tx_packets, value(3, 16, 1));
    // VQ_PAIRS_SET at bring-up, then this GET.
    let cvq = net.get_stats(8, StatsTypes::CVQ).unwrap().cvq.unwrap();
    assert_eq!((cvq.command_num, cvq.ok_num), (3, 2));
    assert_eq!(net.get_stats(2, StatsTypes::CVQ), Err(CtrlError::Rejected));
}

#[test]
fn malformed_replies_are_refused() {
    let mut h = stats_harness(Config::default());
    type Tamper = fn(&mut Vec<u8>);
    let cases: [(Tamper, StatsReplyError); 7] = [
        // The first block's size 0.
        (
            |r| r[6..8].copy_from_slice(&0u16.to_le_bytes()),
            StatsReplyError::Size {
                offset: 0,
                ty: 0,
                expected: 56,
                found: 0,
            },
        ),
        // A size past the reply.
        (
            |r| r[6..8].copy_from_slice(&0xffffu16.to_le_bytes()),
            StatsReplyError::Size {
                offset: 0,
                ty: 0,
                expected: 56,
                found: 0xffff,
            },
        ),
        // A size inside the reply but not the type's (the second block would be misread).
        (
            |r| r[6..8].copy_from_slice(&24u16.to_le_bytes()),
            StatsReplyError::Size {
                offset: 0,
                ty: 0,
                expected: 56,
                found: 24,
            },
        ),
        // The second block's size.
        (
            |r| r[56 + 6..56 + 8].copy_from_slice(&56u16.to_le_bytes()),
            StatsReplyError::Size {
                offset: 56,
                ty: 3,
                expected: 24,
                found: 56,
            },
        ),
        // The wrong type first (blocks out of order).
        (
            |r| r[0] = 3,
            StatsReplyError::Type {
                offset: 0,
                expected: 0,
                found: 3,
            },
        ),
        // The wrong type second.
        (
            |r| r[56] = 16,
            StatsReplyError::Type {
                offset: 56,
                expected: 3,
                found: 16,
            },
        ),
        // Another queue's block.
        (
            |r| r[56 + 2] = 1,
            StatsReplyError::VqIndex {
                offset: 56,
                expected: 0,
                found: 1,
            },
        ),
    ];
    for (tamper, error) in cases {
        h.dev.ctrl().stats_tamper = Some(tamper);
        assert_eq!(
            h.net.get_stats(0, StatsTypes::RX),
            Err(CtrlError::BadStatsReply(error))
        );
    }
    // The error says what was wrong.
    let e = CtrlError::BadStatsReply(StatsReplyError::VqIndex {
        offset: 56,
        expected: 0,
        found: 1,
    });
    assert_eq!(
        std::format!("{e}"),
        "malformed device statistics: block at byte 56 is for queue 1 (asked for 0)"
    );
    // A used length that does not cover the reply.
    h.dev.ctrl().stats_tamper = None;
    h.dev.ctrl().behaviour = CtrlBehaviour::ShortLen;
    assert_eq!(
        h.net.get_stats(1, StatsTypes::TX),
        Err(CtrlError::ShortReply {
            len: 1,
            expected: 81
        })
    );
    // The queue goes on afterwards.
    h.dev.ctrl().behaviour = CtrlBehaviour::Model;
    assert!(h.net.get_stats(1, StatsTypes::TX).is_ok());
    assert!(!h.net.is_broken());
}
