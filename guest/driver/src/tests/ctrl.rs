//! The control queue: negotiation, the commands' wire layout, the device's answers (OK, ERR,
//! none, malformed) and that devices without a control queue are driven as before.

use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};
use std::vec;

use super::{assert_drop_resets_and_frees, frame, harness, harness_with, ARENA};
use crate::ctrl::{CtrlWait, CLASS_NOTF_COAL, NOTF_COAL_TX_SET};
use crate::features::*;
use crate::testing::{CtrlBehaviour, CtrlRecord, Regs, TestHal, TestTransport};
use crate::transport::status;
use crate::{Ack, Coalescing, Config, CtrlError, InitError, VirtioNet, XdpAction};

/// The control features a NOTF_COAL device offers, and its queue 2.
fn offer_ctrl(r: &mut Regs) {
    r.device_features |= NET_F_CTRL_VQ | NET_F_NOTF_COAL | NET_F_VQ_NOTF_COAL | NET_F_CTRL_RX;
    r.queues[2].num_max = 64;
}

fn ctrl_harness(config: Config) -> super::Harness {
    harness_with(config, offer_ctrl)
}

/// Nanoseconds since the first call (a monotonic clock for [`CtrlWait::Clock`]).
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[test]
fn ctrl_vq_is_negotiated_and_queue_2_set_up_when_offered() {
    let h = ctrl_harness(Config::default());
    let regs = h.transport.regs();
    assert_eq!(
        regs.driver_features,
        F_VERSION_1
            | NET_F_MAC
            | NET_F_STATUS
            | RING_F_EVENT_IDX
            | NET_F_MRG_RXBUF
            | NET_F_CTRL_VQ
            | NET_F_NOTF_COAL
            | NET_F_VQ_NOTF_COAL,
        "CTRL_RX offered but off by default"
    );
    let q = regs.queues[2];
    assert_eq!(
        (q.num, q.ready),
        (8, 1),
        "8 entries asked for, device allows 64"
    );
    assert!(q.desc != 0 && q.avail != 0 && q.used != 0 && q.desc.is_multiple_of(16));
    assert_eq!(regs.notifies, [0], "no control kick at bring-up");
    assert!(regs.bad_writes.is_empty());
    drop(regs);
    assert!(h.net.has_ctrl_vq());
    assert_eq!(h.hal.live_allocations(), 6, "ring and command buffer");
    // The control queue's interrupts are off from the start (EVENT_IDX: used_event far away).
    let used_event = h.dev.ctrl().q.used_event();
    assert_eq!(used_event, 0x8000);

    // The control queue is not left running on a device the driver was dropped from.
    assert_drop_resets_and_frees(h);
}

#[test]
fn devices_without_ctrl_vq_or_with_it_turned_off_are_driven_as_before() {
    // The default test device offers no CTRL_VQ: nothing about queue 2, 4 allocations.
    let mut h = harness(Config::default());
    assert!(!h.net.has_ctrl_vq());
    assert_eq!(h.hal.live_allocations(), 4);
    assert_eq!(h.transport.regs().queues[2].ready, 0);
    assert!(h.dev.ctrl.is_none());
    let e = h.net.set_tx_coalescing(64, 500).unwrap_err();
    assert_eq!(e, CtrlError::NotNegotiated("VIRTIO_NET_F_NOTF_COAL"));
    assert_eq!(
        h.net
            .control(CLASS_NOTF_COAL, NOTF_COAL_TX_SET, &[0; 8], &mut []),
        Err(CtrlError::NotNegotiated("VIRTIO_NET_F_CTRL_VQ"))
    );
    let c = h.net.counters();
    assert_eq!((c.ctrl_commands, c.ctrl_failed, c.ctrl_timeouts), (0, 0, 0));
    assert_eq!(h.transport.regs().kicks(2), 0);

    // Offered, but `ctrl_vq: false`: none of the control features is acknowledged.
    let mut h = ctrl_harness(Config {
        ctrl_vq: false,
        ctrl_rx: true,
        ..Config::default()
    });
    assert_eq!(
        h.transport.regs().driver_features,
        F_VERSION_1 | NET_F_MAC | NET_F_STATUS | RING_F_EVENT_IDX | NET_F_MRG_RXBUF
    );
    assert_eq!(h.transport.regs().queues[2].ready, 0);
    assert_eq!(h.net.ctrl_queue_index(), None);
    assert_eq!(h.hal.live_allocations(), 4);
    assert_eq!(
        h.net.get_vq_coalescing(0),
        Err(CtrlError::NotNegotiated("VIRTIO_NET_F_VQ_NOTF_COAL"))
    );

    // NOTF_COAL offered without CTRL_VQ (a device breaking the dependency): not acknowledged.
    let h = harness_with(Config::default(), |r| {
        r.device_features |= NET_F_NOTF_COAL | NET_F_VQ_NOTF_COAL | NET_F_CTRL_RX;
    });
    assert_eq!(h.net.features() & (NET_F_NOTF_COAL | NET_F_VQ_NOTF_COAL), 0);
}

#[test]
fn coalescing_commands_reach_the_device_in_linux_layout() {
    let mut h = ctrl_harness(Config::default());
    h.net.set_tx_coalescing(64, 500).unwrap();
    h.net.set_rx_coalescing(16, 20).unwrap();
    assert_eq!(h.dev.ctrl().coal, [(16, 20), (64, 500)]);
    h.net.set_vq_coalescing(0, 3, 0x1_0000).unwrap();
    assert_eq!(
        h.net.get_vq_coalescing(0).unwrap(),
        Coalescing {
            max_packets: 3,
            usecs: 0x1_0000
        }
    );
    assert_eq!(
        h.net.get_vq_coalescing(1).unwrap(),
        Coalescing {
            max_packets: 64,
            usecs: 500
        }
    );
    let log = h.dev.ctrl().log.clone();
    let record = |cmd: u8, data: &[u8], layout: &[(u32, bool)]| CtrlRecord {
        class: 6,
        cmd,
        data: data.to_vec(),
        layout: layout.to_vec(),
    };
    let (r, w) = (false, true);
    assert_eq!(
        log,
        vec![
            record(0, &[64, 0, 0, 0, 0xf4, 1, 0, 0], &[(2, r), (8, r), (1, w)]),
            record(1, &[16, 0, 0, 0, 20, 0, 0, 0], &[(2, r), (8, r), (1, w)]),
            record(
                2,
                &[0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 1, 0],
                &[(2, r), (12, r), (1, w)]
            ),
            record(3, &[0, 0, 0, 0], &[(2, r), (4, r), (1, w), (8, w)]),
            record(3, &[1, 0, 0, 0], &[(2, r), (4, r), (1, w), (8, w)]),
        ]
    );
    // One kick per command.
    assert_eq!(h.transport.regs().kicks(2), 5);
    let c = h.net.counters();
    assert_eq!((c.ctrl_commands, c.ctrl_failed, c.ctrl_timeouts), (5, 0, 0));
    assert_eq!((c.interrupts, c.device_errors), (0, 0));
    // The control queue never asked for an interrupt.
    assert!(!h.dev.ctrl().q.needs_interrupt());
    // The datapath is untouched: a frame each way.
    h.net.transmit(&frame(1, 60)).unwrap();
    assert_eq!(h.dev.tx_drain(), vec![frame(1, 60)]);
    assert!(h.dev.rx_deliver(&frame(2, 60)));
    let mut got = vec![];
    h.net.poll_rx(8, &mut |f: &[u8]| {
        got.push(f.to_vec());
        XdpAction::Pass
    });
    assert_eq!(got, vec![frame(2, 60)]);
}

#[test]
fn commands_work_without_event_idx() {
    let mut h = ctrl_harness(Config {
        event_idx: false,
        ..Config::default()
    });
    for n in 1..=20u32 {
        h.net.set_tx_coalescing(n, n * 10).unwrap();
        assert_eq!(h.dev.ctrl().coal[1], (n, n * 10));
    }
    assert_eq!(h.transport.regs().kicks(2), 20);
    assert!(!h.dev.ctrl().q.needs_interrupt(), "NO_INTERRUPT set");
    // More commands than the ring has entries, with EVENT_IDX: the ring wraps.
    let mut h = ctrl_harness(Config::default());
    for n in 0..40u32 {
        h.net.set_vq_coalescing((n % 2) as u16, n, 0).unwrap();
    }
    assert_eq!(h.dev.ctrl().coal, [(38, 0), (39, 0)]);
    assert_eq!(h.net.counters().ctrl_commands, 40);
}

#[test]
fn commands_are_kicked_even_when_the_device_suppresses_notifications() {
    // A device that never re-enables notifications on the control queue after the first
    // command (`avail_event` stays 0, or NO_NOTIFY set): each command is still kicked.
    for event_idx in [true, false] {
        let mut h = ctrl_harness(Config {
            event_idx,
            ..Config::default()
        });
        h.net.set_tx_coalescing(1, 1).unwrap();
        h.dev.ctrl().q.set_avail_event(0);
        h.dev.ctrl().q.set_used_flags(1);
        h.dev.ctrl().suppress = true;
        h.net.set_ctrl_wait(CtrlWait::Polls(1000));
        for n in 2..6u32 {
            h.net.set_tx_coalescing(n, 0).unwrap();
            assert_eq!(h.dev.ctrl().coal[1], (n, 0));
        }
        assert_eq!(h.transport.regs().kicks(2), 5, "event_idx {event_idx}");
    }
}

#[test]
fn device_err_is_reported() {
    let mut h = ctrl_harness(Config::default());
    // The model refuses a queue that is not rx or tx, and malformed data.
    assert_eq!(h.net.set_vq_coalescing(2, 1, 1), Err(CtrlError::Rejected));
    assert_eq!(h.net.get_vq_coalescing(7), Err(CtrlError::Rejected));
    let mut reply = [0xaa; 8];
    assert_eq!(
        h.net
            .control(CLASS_NOTF_COAL, NOTF_COAL_TX_SET, &[1, 2, 3], &mut reply),
        Ok(Ack::Err)
    );
    assert_eq!(reply, [0; 8], "no reply on ERR");
    h.dev.ctrl().behaviour = CtrlBehaviour::AlwaysErr;
    assert_eq!(h.net.set_tx_coalescing(1, 1), Err(CtrlError::Rejected));
    assert_eq!(h.dev.ctrl().coal, [(0, 0); 2], "nothing applied");
    let c = h.net.counters();
    assert_eq!((c.ctrl_commands, c.ctrl_failed, c.ctrl_timeouts), (4, 4, 0));
    // The queue still works afterwards.
    h.dev.ctrl().behaviour = CtrlBehaviour::Model;
    h.net.set_tx_coalescing(2, 3).unwrap();
    assert_eq!(h.net.counters().ctrl_failed, 4);
}

#[test]
fn unanswered_command_times_out_without_hanging_and_recovers() {
    let mut h = ctrl_harness(Config::default());
    h.dev.ctrl().behaviour = CtrlBehaviour::Silent;
    h.net.set_ctrl_wait(CtrlWait::Polls(1000));
    let start = Instant::now();
    assert_eq!(h.net.set_tx_coalescing(64, 500), Err(CtrlError::Timeout));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(h.dev.ctrl().held.len(), 1);
    // The device still holds the buffers: the next command is not sent.
    assert_eq!(h.net.set_rx_coalescing(1, 1), Err(CtrlError::Busy));
    let c = h.net.counters();
    assert_eq!((c.ctrl_commands, c.ctrl_failed, c.ctrl_timeouts), (1, 1, 1));
    assert_eq!(h.transport.regs().kicks(2), 1);
    // The device answers late: the stale answer is collected and the queue goes on.
    h.dev.ctrl().release();
    assert_eq!(
        h.dev.ctrl().coal[1],
        (64, 500),
        "the late command took effect"
    );
    h.net.set_rx_coalescing(8, 9).unwrap();
    assert_eq!(h.dev.ctrl().coal[0], (8, 9));
    let c = h.net.counters();
    assert_eq!((c.ctrl_commands, c.ctrl_failed, c.ctrl_timeouts), (2, 1, 1));

    // A clock bound times out too (1 ms of a nanosecond clock).
    h.dev.ctrl().behaviour = CtrlBehaviour::Silent;
    h.net.set_ctrl_wait(CtrlWait::Clock {
        now: now_ns,
        ticks: 1_000_000,
    });
    let start = Instant::now();
    assert_eq!(h.net.set_tx_coalescing(1, 2), Err(CtrlError::Timeout));
    assert!(start.elapsed() >= Duration::from_millis(1));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(h.net.counters().ctrl_timeouts, 2);
}

#[test]
fn the_driver_spins_until_a_slow_device_answers() {
    let mut h = ctrl_harness(Config::default());
    let ctrl = h.dev.ctrl.clone().expect("control queue");
    ctrl.lock().unwrap().behaviour = CtrlBehaviour::Silent;
    // The device thread answers 30 ms after the command arrives.
    let device = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while ctrl.lock().unwrap().held.is_empty() {
            assert!(Instant::now() < deadline, "no command arrived");
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(30));
        ctrl.lock().unwrap().release();
    });
    h.net.set_ctrl_wait(CtrlWait::Clock {
        now: now_ns,
        ticks: 10_000_000_000,
    });
    let start = Instant::now();
    assert_eq!(
        h.net.get_vq_coalescing(1),
        Ok(Coalescing {
            max_packets: 0,
            usecs: 0
        })
    );
    assert!(start.elapsed() >= Duration::from_millis(30));
    device.join().unwrap();
    let c = h.net.counters();
    assert_eq!((c.ctrl_commands, c.ctrl_failed), (1, 0));
}

#[test]
fn malformed_answers_are_errors() {
    let mut h = ctrl_harness(Config::default());
    h.dev.ctrl().behaviour = CtrlBehaviour::RawAck(7);
    assert_eq!(h.net.set_tx_coalescing(1, 1), Err(CtrlError::BadAck(7)));
    // The chain came back without an ack written: the driver's 0xff is still there.
    h.dev.ctrl().behaviour = CtrlBehaviour::RawAck(0xff);
    assert_eq!(h.net.set_tx_coalescing(1, 1), Err(CtrlError::BadAck(0xff)));
    // OK with a used length that does not cover the reply.
    h.dev.ctrl().behaviour = CtrlBehaviour::ShortLen;
    assert_eq!(
        h.net.get_vq_coalescing(0),
        Err(CtrlError::ShortReply {
            len: 1,
            expected: 9
        })
    );
    // Without a reply the used length is not checked (Linux does not either).
    h.net.set_tx_coalescing(5, 6).unwrap();
    let c = h.net.counters();
    assert_eq!((c.ctrl_commands, c.ctrl_failed, c.device_errors), (4, 3, 0));
    // A used entry for a chain that is not in flight.
    h.dev.ctrl().behaviour = CtrlBehaviour::Silent;
    h.net.set_ctrl_wait(CtrlWait::Polls(100));
    assert_eq!(h.net.set_tx_coalescing(1, 1), Err(CtrlError::Timeout));
    h.dev.ctrl().q.push_used_raw(7, 1);
    assert_eq!(h.net.set_tx_coalescing(1, 1), Err(CtrlError::Device));
    assert_eq!(h.net.counters().device_errors, 1);
    // The real answer still frees the queue.
    h.dev.ctrl().release();
    h.net.set_tx_coalescing(9, 9).unwrap();
    assert!(!h.net.is_broken());
    // Over-long commands are refused before anything is sent.
    let sent = h.net.counters().ctrl_commands;
    let big = vec![0u8; crate::ctrl::DATA_MAX + 1];
    assert_eq!(h.net.control(6, 0, &big, &mut []), Err(CtrlError::TooLarge));
    let mut reply = vec![0u8; crate::ctrl::REPLY_MAX + 1];
    assert_eq!(
        h.net.control(6, 3, &[0; 4], &mut reply),
        Err(CtrlError::TooLarge)
    );
    assert_eq!(h.net.counters().ctrl_commands, sent);
}

#[test]
fn promisc_needs_ctrl_rx() {
    let mut h = ctrl_harness(Config::default());
    assert_eq!(
        h.net.set_promisc(true),
        Err(CtrlError::NotNegotiated("VIRTIO_NET_F_CTRL_RX"))
    );
    let mut h = ctrl_harness(Config {
        ctrl_rx: true,
        ..Config::default()
    });
    assert_ne!(h.net.features() & NET_F_CTRL_RX, 0);
    h.net.set_promisc(true).unwrap();
    assert!(h.dev.ctrl().promisc);
    h.net.set_promisc(false).unwrap();
    assert!(!h.dev.ctrl().promisc);
    // ALLMULTI is not in the model: refused.
    assert_eq!(h.net.set_allmulti(true), Err(CtrlError::Rejected));
    let log = h.dev.ctrl().log.clone();
    assert_eq!(
        (log[0].class, log[0].cmd, log[0].data.as_slice()),
        (0, 0, &[1u8][..])
    );
    assert_eq!((log[2].class, log[2].cmd), (0, 1));
}

#[test]
fn control_queue_problems_at_bring_up_fail_it_cleanly() {
    for num_max in [0, 2, 3] {
        let hal = TestHal::new(ARENA);
        let mut regs = Regs::default();
        offer_ctrl(&mut regs);
        regs.queues[2].num_max = num_max;
        let transport = TestTransport::new(regs);
        let result = VirtioNet::new(hal.clone(), transport.clone(), Config::default());
        assert_eq!(
            result.err(),
            Some(InitError::QueueUnavailable(2)),
            "{num_max}"
        );
        assert_ne!(transport.regs().status & status::FAILED, 0);
        assert_eq!(hal.live_allocations(), 0);
    }
    // Smallest usable control queue: 4 entries (header, data, reply, ack).
    let h = harness_with(Config::default(), |r| {
        offer_ctrl(r);
        r.queues[2].num_max = 7;
    });
    assert_eq!(h.transport.regs().queues[2].num, 4);
    // DMA exhausted by the control queue's allocations: everything freed.
    for budget in [4, 5] {
        let hal = TestHal::new(ARENA);
        hal.fail_after(budget);
        let mut regs = Regs::default();
        offer_ctrl(&mut regs);
        let transport = TestTransport::new(regs);
        let result = VirtioNet::new(hal.clone(), transport.clone(), Config::default());
        assert_eq!(result.err(), Some(InitError::DmaAlloc));
        assert_eq!(hal.live_allocations(), 0, "budget {budget}");
        assert_ne!(transport.regs().status & status::FAILED, 0);
    }
}
