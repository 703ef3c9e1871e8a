//! XDP verdicts: zero-copy XDP_TX, the bulk queue's flush counts, buffer lending and return.

use std::vec::Vec;

use super::{frame, frame_over_small_buffers, harness, seq_of};
use crate::net::TX_QUEUE;
use crate::xdp::swap_macs;
use crate::{Config, TxCompletion, XdpAction};

#[test]
fn xdp_tx_sends_from_the_rx_buffer_and_reposts_it_after_tx_completion() {
    let mut h = harness(Config {
        event_idx: false,
        ..Config::default()
    });
    let original = frame(5, 80);
    let used = h.dev.rx_fill(&original).expect("buffers");
    let rx_addr = h.dev.rx.read_desc(used[0].0).0.addr;
    h.dev.rx.push_used(used[0].0, used[0].1);

    let n = h.net.poll_rx_mut(64, &mut |f: &mut [u8]| {
        swap_macs(f);
        XdpAction::Tx
    });
    assert_eq!(n, 1);
    let sent = h.dev.tx_take();
    assert_eq!(sent.len(), 1);
    let (chain, bytes) = &sent[0];
    assert_eq!(chain.descs.len(), 1);
    assert_eq!(
        chain.descs[0].addr, rx_addr,
        "no copy: the rx buffer itself"
    );
    assert_eq!(
        &bytes[..12],
        &[0u8; 12],
        "rx header zeroed into a tx header"
    );
    let mut expected = original.clone();
    swap_macs(&mut expected);
    assert_eq!(&bytes[12..], &expected[..]);
    let c = h.net.counters();
    assert_eq!((c.xdp_tx, c.xdp_flushes, c.kicks), (1, 1, 1));
    assert_eq!(
        h.dev.rx.pending(),
        256,
        "a spare buffer keeps the rx ring full"
    );

    // The lent buffer returns to the rx pool when the tx chain is reclaimed (tx poll).
    let free_while_lent = h.net.rq.pool.free_count();
    h.dev.tx.push_used(chain.head, 0);
    assert_eq!(h.net.reclaim_tx(), 1);
    assert_eq!(h.net.rq.pool.free_count(), free_while_lent + 1);
    assert_eq!(h.dev.rx.pending(), 256);
}

#[test]
fn xdp_bulk_flush_counts() {
    for (bulk, flushes) in [(16u16, 3u64), (1, 40), (64, 1)] {
        let mut h = harness(Config {
            xdp_bulk: bulk,
            event_idx: false,
            tx_completion: TxCompletion::CleanFromRx,
            ..Config::default()
        });
        for i in 0..40 {
            assert!(h.dev.rx_deliver(&frame(i, 60)));
        }
        let n = h.net.poll_rx(64, &mut |_: &[u8]| XdpAction::Tx);
        let c = h.net.counters();
        // 40 bounced frames: flushes at every `bulk` and at the end of the poll.
        assert_eq!(n, 40);
        assert_eq!(c.xdp_tx, 40);
        assert_eq!(
            (c.xdp_flushes, c.tx_publishes, c.kicks),
            (flushes, flushes, flushes),
            "bulk {bulk}"
        );
        assert_eq!(h.kicks(TX_QUEUE) as u64, flushes);
        let out = h.dev.tx_drain();
        assert_eq!(
            out.iter().map(|f| seq_of(f)).collect::<Vec<_>>(),
            (0..40).collect::<Vec<_>>()
        );
    }
}

#[test]
fn xdp_tx_of_a_multi_buffer_frame_chains_its_rx_buffers() {
    let (mut h, big, used) = frame_over_small_buffers(3, 600);
    let rx_addrs: Vec<u64> = used
        .iter()
        .map(|&(head, _)| h.dev.rx.read_desc(head).0.addr)
        .collect();
    for (head, len) in used {
        h.dev.rx.push_used(head, len);
    }
    h.net.poll_rx_mut(64, &mut |f: &mut [u8]| {
        assert_eq!(f.len(), 600);
        swap_macs(f);
        XdpAction::Tx
    });
    let sent = h.dev.tx_take();
    let (chain, bytes) = &sent[0];
    let tx_addrs: Vec<u64> = chain.descs.iter().map(|d| d.addr).collect();
    assert_eq!(tx_addrs, rx_addrs, "the frame's own buffers, in order");
    let mut expected = std::vec![0u8; 12];
    let mut swapped = big.clone();
    swap_macs(&mut swapped);
    expected.extend(swapped);
    assert_eq!(
        bytes, &expected,
        "the program's rewrite reached the buffers"
    );
    h.dev.tx.push_used(chain.head, 0);
    assert_eq!(h.net.reclaim_tx(), 1);
}

#[test]
fn drop_and_pass_recycle_and_count() {
    let mut h = harness(Config::default());
    for i in 0..6 {
        assert!(h.dev.rx_deliver(&frame(i, 60)));
    }
    let mut i = 0;
    h.net.poll_rx(64, &mut |_: &[u8]| {
        i += 1;
        if i % 2 == 0 {
            XdpAction::Drop
        } else {
            XdpAction::Pass
        }
    });
    let c = h.net.counters();
    assert_eq!(
        (c.xdp_pass, c.xdp_drop, c.xdp_tx, c.rx_frames),
        (3, 3, 0, 6)
    );
    assert_eq!(h.dev.rx.pending(), 256);
    assert!(h.dev.tx_take().is_empty());
}

/// A driver whose tx ring holds one XDP_TX bulk: 8 descriptors, bulks of 8, tx-interrupt
/// completion.
fn one_bulk_of_tx_room() -> super::Harness {
    harness(Config {
        tx_queue_size: 8,
        xdp_bulk: 8,
        tx_completion: TxCompletion::TxInterrupt,
        ..Config::default()
    })
}

#[test]
fn bounced_frames_without_tx_room_are_dropped_and_their_buffers_kept() {
    let mut h = one_bulk_of_tx_room();
    for i in 0..12 {
        assert!(h.dev.rx_deliver(&frame(i, 60)));
    }
    assert_eq!(h.net.poll_rx(64, &mut |_: &[u8]| XdpAction::Tx), 12);
    let c = h.net.counters();
    assert_eq!((c.xdp_tx, c.xdp_tx_errors, c.ring_full), (8, 4, 4));
    assert_eq!(h.dev.rx.pending(), 256, "dropped frames' buffers re-posted");
    assert_eq!(h.dev.tx_drain().len(), 8);
    assert_eq!(h.net.reclaim_tx(), 8);
}

#[test]
fn a_flush_reclaims_returned_tx_chains_before_dropping_a_bounce_in_tx_interrupt_mode() {
    // A forwarding loop in tx-interrupt mode: the device has returned every tx chain of the
    // last bulk, but the tx poll has not run yet when the next frames are bounced. The flush
    // takes them back instead of dropping the frames (which would shrink the window for good).
    let mut h = one_bulk_of_tx_room();
    for round in 0..3u32 {
        for i in 0..8 {
            assert!(h.dev.rx_deliver(&frame(round * 8 + i, 60)));
        }
        assert_eq!(h.net.poll_rx(64, &mut |_: &[u8]| XdpAction::Tx), 8);
        assert_eq!(
            h.dev.tx_drain().len(),
            8,
            "round {round}: the whole bulk sent"
        );
    }
    let c = h.net.counters();
    assert_eq!((c.xdp_tx, c.xdp_tx_errors, c.ring_full), (24, 0, 0));
    assert_eq!(h.dev.rx.pending(), 256, "the lent rx buffers came back");
}
