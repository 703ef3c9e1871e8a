//! Copy transmit, kick threshold, kick suppression, tx completion modes.

use std::vec::Vec;

use super::{frame, harness, seq_of, Harness};
use crate::net::TX_QUEUE;
use crate::ring::USED_F_NO_NOTIFY;
use crate::{Config, TxBatch, TxCompletion, TxError, XdpAction};

fn config(kick_threshold: u16, event_idx: bool) -> Config {
    Config {
        kick_threshold,
        event_idx,
        ..Config::default()
    }
}

/// Lazy tx completion (used chains reclaimed on transmit), `tx_queue_size` descriptors, a
/// kick every `kick_threshold` frames.
fn lazy_tx(tx_queue_size: u16, kick_threshold: u16) -> Config {
    Config {
        tx_queue_size,
        kick_threshold,
        tx_completion: TxCompletion::Lazy,
        ..Config::default()
    }
}

fn frames(n: u32) -> Vec<Vec<u8>> {
    (0..n).map(|i| frame(i, 60 + i as usize % 1400)).collect()
}

/// Queues `frames` in one batch; every one must fit.
fn send_all(h: &mut Harness, frames: &[Vec<u8>]) {
    let batch = h.net.transmit_batch(frames.iter().map(Vec::as_slice));
    assert_eq!(batch.sent, frames.len(), "{batch:?}");
}

/// Reclaims the `n` chains the device returned, sends `n` new frames in them and checks that
/// the device gets each intact behind a zero header (`tx_drain` asserts the header).
fn reclaim_and_send_again(h: &mut Harness, n: u32) {
    assert_eq!(h.net.reclaim_tx(), n as usize);
    let again = frames(2 * n)[n as usize..].to_vec();
    send_all(h, &again);
    assert_eq!(device_completes(h), again);
}

/// Has the device drain tx and return every chain.
fn device_completes(h: &mut Harness) -> Vec<Vec<u8>> {
    h.dev.tx_drain()
}

#[test]
fn frames_arrive_intact_behind_a_zero_header() {
    let mut h = harness(Config::default());
    let sent = frames(20);
    let batch = h.net.transmit_batch(sent.iter().map(Vec::as_slice));
    assert_eq!(
        batch,
        TxBatch {
            sent: 20,
            stopped: None
        }
    );
    assert_eq!(device_completes(&mut h), sent);
    let c = h.net.counters();
    assert_eq!(c.tx_frames, 20);
    assert_eq!(c.tx_bytes, sent.iter().map(|f| f.len() as u64).sum::<u64>());

    assert_eq!(h.net.transmit(&[]), Err(TxError::Empty));
    assert_eq!(
        h.net.transmit(&[0; 2037]),
        Err(TxError::TooLarge {
            len: 2037,
            max: 2036
        })
    );
    assert_eq!(h.net.transmit(&[0; 2036]), Ok(()));
}

/// A copy-transmit frame starts on a cache line, its header in the 12 bytes before it, and a
/// header found non-zero when its buffer comes round again (a device wrote to a buffer it may
/// only read) is zeroed before the next frame goes out in it.
#[test]
fn copy_transmit_frames_start_on_a_cache_line_behind_a_header_kept_zero() {
    let mut h = harness(lazy_tx(4, 1));
    let first = frames(4);
    send_all(&mut h, &first);
    let taken = h.dev.tx_take();
    assert_eq!(taken.len(), 4);
    for ((chain, bytes), sent) in taken.iter().zip(&first) {
        let d = &chain.descs[0];
        assert_eq!((d.addr + 12) % 64, 0, "frame at {:#x}", d.addr + 12);
        assert_eq!(d.len as usize, 12 + sent.len());
        assert_eq!(&bytes[12..], &sent[..]);
        h.hal.write(d.addr, &[0xa5; 12]);
        h.dev.tx.push_used(chain.head, 0);
    }
    reclaim_and_send_again(&mut h, 4);
}

/// The driver writes a descriptor or an avail entry only where memory differs from what it
/// needs (a steady stream then leaves those lines clean in the device's cache), so what it
/// needs must be read back from memory, not remembered: after a device scribbled over the
/// whole ring the next frames still go out intact, in the same descriptors and slots.
#[test]
fn descriptors_and_avail_entries_are_rewritten_where_memory_differs() {
    let mut h = harness(lazy_tx(8, 4));
    let first = frames(8);
    send_all(&mut h, &first);
    assert_eq!(device_completes(&mut h), first);
    h.dev.tx.scribble();
    reclaim_and_send_again(&mut h, 8);
}

#[test]
fn kick_threshold_one_kicks_every_frame() {
    let mut h = harness(config(1, false));
    let sent = frames(10);
    h.net.transmit_batch(sent.iter().map(Vec::as_slice));
    assert_eq!(h.kicks(TX_QUEUE), 10);
    let c = h.net.counters();
    assert_eq!((c.kicks, c.tx_publishes, c.kicks_suppressed), (10, 10, 0));
}

#[test]
fn kick_threshold_eight_kicks_at_eight_and_at_the_end_of_the_batch() {
    for event_idx in [false, true] {
        let mut h = harness(config(8, event_idx));
        // A device that drains and re-arms after each kick wants every one of them.
        let mut kicks_at = Vec::new();
        for (i, f) in frames(20).iter().enumerate() {
            h.net.queue_tx(f).expect("room");
            if h.kicks(TX_QUEUE) > kicks_at.len() {
                kicks_at.push(i + 1);
                assert_eq!(
                    h.dev.tx.avail_idx() as usize,
                    i + 1,
                    "published at the kick"
                );
                h.dev.tx_drain();
                assert!(!h.dev.tx.enable_notifications());
            } else {
                assert_eq!(
                    h.dev.tx.avail_idx() as usize,
                    kicks_at.last().copied().unwrap_or(0)
                );
            }
        }
        h.net.flush_tx();
        assert_eq!(h.kicks(TX_QUEUE), 3);
        assert_eq!(kicks_at, [8, 16]);
        assert_eq!(
            h.dev.tx.avail_idx(),
            20,
            "the end of the batch publishes the rest"
        );
        let c = h.net.counters();
        assert_eq!((c.kicks, c.tx_publishes), (3, 3), "event_idx {event_idx}");
        // transmit_batch: same counts.
        let before = h.net.counters().kicks;
        h.dev.tx_drain();
        assert!(!h.dev.tx.enable_notifications());
        h.net.transmit_batch(frames(20).iter().map(Vec::as_slice));
        // Without EVENT_IDX every publish notifies; with it, a device that does not drain
        // during the batch asked only for the first.
        let expected = if event_idx { 1 } else { 3 };
        assert_eq!(h.net.counters().kicks - before, expected);
    }
}

#[test]
fn event_idx_suppresses_kicks_until_avail_event_is_crossed() {
    let mut h = harness(config(1, true));
    h.dev.tx.set_avail_event(5);
    for (i, f) in frames(10).iter().enumerate() {
        h.net.transmit(f).expect("room");
        // Index 5 is crossed by the publish that moves avail.idx from 5 to 6.
        let expected = usize::from(i >= 5);
        assert_eq!(h.kicks(TX_QUEUE), expected, "after frame {}", i + 1);
    }
    let c = h.net.counters();
    assert_eq!(
        (c.kicks, c.kicks_suppressed, c.kicks_suppressed_no_notify),
        (1, 9, 0)
    );
}

#[test]
fn event_idx_kick_decision_survives_the_u16_wrap() {
    let mut h = harness(lazy_tx(256, 64));
    // Bring avail.idx to 65533 without the device asking for kicks (avail_event stays 0).
    let f = frame(0, 60);
    let mut sent = 0u32;
    while sent < 65533 {
        let n = (65533 - sent).min(200) as usize;
        let batch = h.net.transmit_batch(std::iter::repeat_n(f.as_slice(), n));
        sent += batch.sent as u32;
        h.dev.tx_drain();
        assert_eq!(usize::from(h.net.tx_used_pending()), batch.sent);
        h.net.reclaim_tx();
        assert_eq!(h.net.tx_used_pending(), 0);
    }
    assert_eq!(h.dev.tx.avail_idx(), 65533);
    let kicks_before = h.kicks(TX_QUEUE);
    h.dev.tx.set_avail_event(1); // the entry after the wrap
    for expect_kick in [false, false, false, false, true, false] {
        // avail.idx becomes 65534, 65535, 0, 1, 2, 3: only 1 → 2 crosses avail_event 1.
        let before = h.kicks(TX_QUEUE);
        h.net.transmit(&f).expect("room");
        assert_eq!(
            h.kicks(TX_QUEUE) > before,
            expect_kick,
            "avail.idx {}",
            h.dev.tx.avail_idx()
        );
    }
    assert_eq!(h.kicks(TX_QUEUE), kicks_before + 1);
}

#[test]
fn no_notify_flag_suppresses_kicks_without_event_idx() {
    let mut h = harness(config(1, false));
    h.dev.tx.set_used_flags(USED_F_NO_NOTIFY);
    h.net.transmit_batch(frames(5).iter().map(Vec::as_slice));
    assert_eq!(h.kicks(TX_QUEUE), 0);
    assert_eq!(h.net.counters().kicks_suppressed_no_notify, 5);
    h.dev.tx.set_used_flags(0);
    h.net.transmit(&frame(9, 60)).expect("room");
    assert_eq!(h.kicks(TX_QUEUE), 1);
    assert_eq!(h.dev.tx_drain().len(), 6);
}

#[test]
fn tx_interrupt_mode_keeps_tx_interrupts_armed_and_reclaims_in_a_tx_poll() {
    let mut h = harness(Config::default());
    h.net.transmit_batch(frames(4).iter().map(Vec::as_slice));
    device_completes(&mut h);
    assert!(h.dev.tx.needs_interrupt(), "used_event 0 crossed");
    assert!(h.net.tx_has_used());
    assert_eq!(h.net.reclaim_tx(), 4);
    assert_eq!(h.dev.tx.used_event(), 4, "re-armed for the next completion");
    h.net.transmit(&frame(5, 60)).expect("room");
    device_completes(&mut h);
    assert!(h.dev.tx.needs_interrupt());
    assert_eq!(h.net.reclaim_tx(), 1);
    assert_eq!(h.net.reclaim_tx(), 0);
    let c = h.net.counters();
    assert_eq!((c.tx_reclaimed, c.tx_reclaim_polls), (5, 3));
    assert_eq!(c.reclaimed_per_poll(), 5.0 / 3.0);
}

#[test]
fn clean_from_rx_mode_disables_tx_interrupts_and_reclaims_in_the_rx_poll() {
    for event_idx in [true, false] {
        let mut h = harness(Config {
            tx_completion: TxCompletion::CleanFromRx,
            event_idx,
            ..Config::default()
        });
        if event_idx {
            assert_eq!(h.dev.tx.used_event(), 0x8000, "used_event far ahead");
        } else {
            assert_eq!(h.dev.tx.avail_flags(), 1, "NO_INTERRUPT on the tx ring");
        }
        h.net.transmit_batch(frames(6).iter().map(Vec::as_slice));
        device_completes(&mut h);
        assert!(!h.dev.tx.needs_interrupt(), "no tx interrupt wanted");
        assert_eq!(h.net.counters().tx_reclaimed, 0);
        h.dev.rx_deliver(&frame(100, 60));
        assert_eq!(h.net.poll_rx(64, &mut |_: &[u8]| XdpAction::Pass), 1);
        let c = h.net.counters();
        assert_eq!((c.tx_reclaimed, c.tx_reclaim_polls), (6, 1));
        if event_idx {
            assert_eq!(
                h.dev.tx.used_event(),
                6 + 0x8000,
                "kept ahead of the new position"
            );
        }
        h.net.transmit(&frame(7, 60)).expect("room");
        device_completes(&mut h);
        assert!(!h.dev.tx.needs_interrupt());
    }
}

#[test]
fn lazy_mode_reclaims_on_transmit_when_the_ring_runs_low() {
    let mut h = harness(lazy_tx(16, 1));
    assert_eq!(h.dev.tx.used_event(), 0x8000);
    for (i, f) in frames(12).iter().enumerate() {
        h.net.transmit(f).expect("room");
        device_completes(&mut h);
        assert_eq!(
            h.net.counters().tx_reclaim_polls,
            0,
            "frame {i}: 4+ free, no reclaim"
        );
    }
    assert!(!h.dev.tx.needs_interrupt());
    assert_eq!(h.net.tx_free_descriptors(), 4);
    h.net.transmit(&frame(12, 60)).expect("room"); // 4 free: still not below a quarter
    assert_eq!(h.net.counters().tx_reclaim_polls, 0);
    h.net.transmit(&frame(13, 60)).expect("room"); // 3 free < 4: reclaim first
    let c = h.net.counters();
    assert_eq!(
        (c.tx_reclaim_polls, c.tx_reclaimed),
        (1, 12),
        "the 13th is not used yet"
    );
    assert_eq!(h.net.tx_free_descriptors(), 14);
}

#[test]
fn a_full_ring_is_counted_and_what_is_pending_gets_published() {
    let mut h = harness(Config {
        tx_queue_size: 8,
        kick_threshold: 8,
        event_idx: false,
        ..Config::default()
    });
    for f in frames(7).iter() {
        h.net.queue_tx(f).expect("room");
    }
    assert_eq!(h.dev.tx.avail_idx(), 0, "below the threshold: unpublished");
    h.net.queue_tx(&frame(7, 60)).expect("room");
    assert_eq!(h.dev.tx.avail_idx(), 8);
    assert_eq!(h.net.queue_tx(&frame(8, 60)), Err(TxError::RingFull));
    let batch = h.net.transmit_batch([frame(9, 60).as_slice()]);
    assert_eq!(batch.stopped, Some(TxError::RingFull));
    assert_eq!(batch.sent, 0);
    assert_eq!(h.net.counters().ring_full, 2);
    let got = device_completes(&mut h);
    assert_eq!(
        got.iter().map(|f| seq_of(f)).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    h.net.reclaim_tx();
    assert_eq!(h.net.transmit(&frame(10, 60)), Ok(()));
}

#[test]
fn many_cycles_with_out_of_order_completions() {
    let mut h = harness(lazy_tx(4, 3));
    let total = 70_000u32;
    let mut next = 0u32;
    let mut expect = 0u32;
    while expect < total {
        let burst: Vec<Vec<u8>> = (next..total.min(next + 1 + next % 5))
            .map(|i| frame(i, 60 + (i % 7) as usize))
            .collect();
        next += h.net.transmit_batch(burst.iter().map(Vec::as_slice)).sent as u32;
        // The device returns the chains of this round in reverse order.
        let mut taken = h.dev.tx_take();
        for (_, bytes) in &taken {
            assert_eq!(seq_of(&bytes[12..]), expect);
            assert_eq!(bytes.len(), 12 + 60 + (expect % 7) as usize);
            expect += 1;
        }
        taken.reverse();
        for (chain, _) in taken {
            h.dev.tx.push_used(chain.head, 0);
        }
        if next.is_multiple_of(3) {
            h.net.reclaim_tx();
        }
    }
    h.net.reclaim_tx();
    let c = h.net.counters();
    assert_eq!(
        (c.tx_frames, c.tx_reclaimed, c.device_errors),
        (70_000, 70_000, 0)
    );
    assert_eq!(h.dev.tx.next_avail, 70_000u32 as u16, "indexes wrapped");
    assert_eq!(h.net.tx_free_descriptors(), 4);
}
