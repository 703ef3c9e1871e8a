//! Per-queue reset ([`crate::reset`]) against the in-crate test device.

use std::vec::Vec;

use super::{frame, harness, harness_with, received, reset_tx_after_two_of_six, seq_of, Harness};
use crate::features::F_RING_RESET;
use crate::transport::regs;
use crate::{Config, QueueId, QueueResetError, QueueResetReport, ResetCounters};

/// A driver on a device that offers RING_RESET; QueueReset reads 1 `busy` times per reset.
fn resettable(busy: u32) -> Harness {
    harness_with(Config::default(), |r| {
        r.device_features |= F_RING_RESET;
        r.reset_busy_reads = busy;
    })
}

#[test]
fn without_the_feature_nothing_is_written() {
    let mut h = harness(Config::default());
    assert_eq!(h.net.features() & F_RING_RESET, 0);
    assert_eq!(
        h.net.reset_queue(QueueId::Tx),
        Err(QueueResetError::NotNegotiated)
    );
    assert!(!h.net.is_broken());
    let regs = h.transport.regs();
    assert!(regs.queue_resets.is_empty());
    assert!(regs.bad_writes.is_empty());
    assert_eq!(regs.queues[1].ready, 1);
}

#[test]
fn tx_reset_forgets_unsent_frames_and_later_frames_flow() {
    let mut h = resettable(3);
    assert_ne!(
        h.net.features() & F_RING_RESET,
        0,
        "negotiated when offered"
    );
    let (_, tx_size) = h.net.queue_sizes();
    // The device sends frames 0 and 1, pops 2 and 3 without sending (backend refused them),
    // and never sees 4 and 5.
    let report = reset_tx_after_two_of_six(&mut h);
    assert_eq!(report, QueueResetReport { used: 2, unused: 4 });
    {
        let regs = h.transport.regs();
        assert_eq!(regs.queue_resets, [1]);
        assert_eq!(regs.reset_reads_left, 0, "polled through the busy reads");
        assert!(regs.bad_writes.is_empty());
        assert_eq!(regs.queues[1].ready, 1, "re-enabled");
        assert_eq!(regs.queues[1].num, u32::from(tx_size));
    }
    assert_eq!(h.net.tx_free_descriptors(), usize::from(tx_size));
    h.dev.reattach(1);
    assert_eq!(h.dev.tx.pending(), 0, "nothing re-posted");
    for seq in 6..9 {
        h.net.transmit(&frame(seq, 60)).expect("queued");
    }
    let seqs: Vec<u32> = h.dev.tx_drain().iter().map(|f| seq_of(f)).collect();
    assert_eq!(seqs, [6, 7, 8]);
    // The forgotten chains are never completed, the new ones once each.
    assert_eq!(h.net.reclaim_tx(), 3);
    assert_eq!(h.net.reclaim_tx(), 0);
    let c = h.net.counters();
    assert_eq!((c.tx_frames, c.tx_reclaimed), (9, 5));
    assert_eq!(
        h.net.reset_counters(),
        ResetCounters {
            tx_resets: 1,
            tx_frames_not_sent: 4,
            tx_completed_at_reset: 2,
            ..ResetCounters::default()
        }
    );
    // A whole ring's worth still fits: every descriptor and buffer came back.
    for seq in 0..u32::from(tx_size) {
        h.net.queue_tx(&frame(seq, 60)).expect("room");
    }
    h.net.flush_tx();
    assert_eq!(h.dev.tx_drain().len(), usize::from(tx_size));
}

#[test]
fn rx_reset_reposts_every_buffer_and_leaves_tx_in_flight() {
    let mut h = resettable(0);
    let (rx_size, _) = h.net.queue_sizes();
    assert_eq!(h.dev.rx.pending(), rx_size);
    // Two frames arrive and are not polled; two tx frames are in flight, one popped.
    assert!(h.dev.rx_deliver(&frame(1, 80)));
    assert!(h.dev.rx_deliver(&frame(2, 80)));
    h.net.transmit(&frame(100, 60)).expect("queued");
    h.net.transmit(&frame(101, 60)).expect("queued");
    let first = h.dev.tx.pop().expect("tx chain");
    let report = h.net.reset_queue(QueueId::Rx).expect("reset");
    assert_eq!(
        report,
        QueueResetReport {
            used: 2,
            unused: usize::from(rx_size) - 2
        }
    );
    assert_eq!(h.transport.regs().queue_resets, [0]);
    h.dev.reattach(0);
    assert_eq!(h.dev.rx.pending(), rx_size, "a full ring posted again");
    assert_eq!(
        received(&mut h.net),
        Vec::<u32>::new(),
        "dropped, not delivered"
    );
    assert!(h.dev.rx_deliver(&frame(3, 80)));
    assert_eq!(received(&mut h.net), [3]);
    // The tx queue did not notice.
    h.dev.tx.push_used(first.head, 0);
    let rest: Vec<u32> = h.dev.tx_drain().iter().map(|f| seq_of(f)).collect();
    assert_eq!(rest, [101]);
    assert_eq!(h.net.reclaim_tx(), 2);
    assert_eq!(
        h.net.reset_counters(),
        ResetCounters {
            rx_resets: 1,
            rx_buffers_reclaimed: u64::from(rx_size) - 2,
            rx_buffers_dropped_at_reset: 2,
            ..ResetCounters::default()
        }
    );
}

#[test]
fn repeated_rx_resets_while_tx_flows_lose_no_tx_frame() {
    let mut h = resettable(1);
    let mut sent = Vec::new();
    for round in 0..20u32 {
        for k in 0..7 {
            let seq = round * 7 + k;
            h.net.transmit(&frame(seq, 64)).expect("queued");
        }
        // Half of the round goes out before the reset, the rest after.
        for (chain, bytes) in h.dev.tx_take().into_iter().take(3) {
            sent.push(seq_of(&bytes[12..]));
            h.dev.tx.push_used(chain.head, 0);
        }
        h.net.reset_queue(QueueId::Rx).expect("rx reset");
        h.dev.reattach(0);
        assert!(h.dev.rx_deliver(&frame(round, 64)));
        assert_eq!(received(&mut h.net), [round]);
        // The device pops the rest (it had popped them already: put them back first).
        h.dev.tx.next_avail = h.dev.tx.next_avail.wrapping_sub(4);
        sent.extend(h.dev.tx_drain().iter().map(|f| seq_of(f)));
        h.net.reclaim_tx();
    }
    assert_eq!(sent, (0..140).collect::<Vec<u32>>());
    let c = h.net.reset_counters();
    assert_eq!((c.rx_resets, c.tx_resets, c.failed), (20, 0, 0));
}

#[test]
fn a_reset_that_never_completes_times_out_and_is_counted() {
    let mut h = resettable(u32::MAX);
    assert_eq!(
        h.net.reset_queue(QueueId::Tx),
        Err(QueueResetError::Timeout)
    );
    assert_eq!(h.net.reset_counters().failed, 1);
    assert_eq!(h.net.reset_counters().tx_resets, 0);
    assert_eq!(h.transport.regs().queues[1].ready, 0, "left reset");
    assert!(h.net.is_broken());
}

#[test]
fn needs_reset_after_reenable_is_reported() {
    let mut h = resettable(0);
    // The device refuses the rings it is given back.
    h.transport.regs().status |= crate::transport::status::DEVICE_NEEDS_RESET;
    assert_eq!(
        h.net.reset_queue(QueueId::Rx),
        Err(QueueResetError::DeviceNeedsReset)
    );
    assert!(h.net.is_broken());
    assert_eq!(h.net.reset_counters().failed, 1);
    assert!(h
        .transport
        .regs()
        .bad_writes
        .iter()
        .all(|&(o, _)| o != regs::QUEUE_RESET));
}
