//! Receive path: frames land in guest buffers, one chain or several (MRG_RXBUF), with
//! num_buffers right; no buffer means backpressure, never a silent drop.

use std::collections::HashMap;

use virtio_queue::QueueT;

use super::driver::DriverRing;
use crate::test_utils::packed::GuestPackedQueue;

use crate::virtio::net::metrics::RxCounters;
use crate::virtio::net::tests::support::{frame, guest_mem, pair, wire, GuestQueue, Ring};
use crate::virtio::net::{RxMode, RxQueue, RxStop, VNET_HDR_LEN};

/// num_buffers of the header at `addr`.
fn num_buffers(driver: &GuestQueue, addr: u64) -> u16 {
    let b = driver.read(addr + 10, 2);
    u16::from_le_bytes([b[0], b[1]])
}

#[test]
fn frame_lands_in_a_single_chain() {
    let mut ring = Ring::new(16);
    // Header and frame in separate descriptors of one chain.
    let (head, bufs) = ring.driver.push_rx(&[12, 2048]);
    let (mut backend, peer) = pair();
    let payload = frame(1514, 9);
    peer.send_frame(&wire(&payload)).expect("send");
    let mut counters = RxCounters::default();

    let outcome = ring.rx(&mut backend, RxMode::SingleChain, &mut counters);

    assert!(outcome.needs_interrupt);
    // The only buffer is used: stop polling the backend until the driver posts more.
    assert_eq!(outcome.stop, RxStop::NoBuffers);
    assert_eq!(
        ring.driver.used_since(0),
        vec![(u32::from(head), 12 + 1514)]
    );
    assert_eq!(ring.driver.read(bufs[0], 10), wire(&[])[..10]);
    assert_eq!(num_buffers(&ring.driver, bufs[0]), 1);
    assert_eq!(ring.driver.read(bufs[1], 1514), payload);
    assert_eq!((counters.frames, counters.bytes), (1, 1514));
}

#[test]
fn frame_spans_mergeable_chains_with_num_buffers() {
    let mut ring = Ring::new(16);
    let chains: Vec<_> = (0..4).map(|_| ring.driver.push_rx(&[512])).collect();
    let (mut backend, peer) = pair();
    let big = frame(1200, 10);
    peer.send_frame(&wire(&big)).expect("send");
    let mut counters = RxCounters::default();

    ring.rx(&mut backend, RxMode::Mergeable, &mut counters);

    let ids = |i: usize| u32::from(chains[i].0);
    assert_eq!(
        ring.driver.used_since(0),
        vec![(ids(0), 512), (ids(1), 512), (ids(2), 1212 - 1024)]
    );
    assert_eq!(num_buffers(&ring.driver, chains[0].1[0]), 3);
    let mut got = ring.driver.read(chains[0].1[0], 512);
    got.extend(ring.driver.read(chains[1].1[0], 512));
    got.extend(ring.driver.read(chains[2].1[0], 1212 - 1024));
    assert_eq!(got[VNET_HDR_LEN..], big[..]);
    // The fourth chain was gathered but is still the driver's: it goes back on the ring.
    assert_eq!(ring.queue.next_avail(), 3);

    let small = frame(60, 11);
    peer.send_frame(&wire(&small)).expect("send");
    ring.rx(&mut backend, RxMode::Mergeable, &mut counters);
    assert_eq!(ring.driver.used(3), (ids(3), 72));
    assert_eq!(num_buffers(&ring.driver, chains[3].1[0]), 1);
    assert_eq!(ring.driver.read(chains[3].1[0] + 12, 60), small);
    assert_eq!(counters.frames, 2);
}

#[test]
fn consecutive_frames_share_the_gathered_chains() {
    let mut ring = Ring::new(64);
    let chains: Vec<_> = (0..40).map(|_| ring.driver.push_rx(&[1536])).collect();
    let (mut backend, peer) = pair();
    let frames: Vec<_> = (0..30).map(|i| frame(60 + i * 40, i as u8)).collect();
    for f in &frames {
        peer.send_frame(&wire(f)).expect("send");
    }
    let mut counters = RxCounters::default();

    let outcome = ring.rx(&mut backend, RxMode::Mergeable, &mut counters);

    assert_eq!(outcome.stop, RxStop::BackendEmpty);
    assert_eq!(counters.frames, 30);
    assert_eq!(
        ring.queue.next_avail(),
        30,
        "unused chains went back to the driver"
    );
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(
            ring.driver.used(i as u16),
            (u32::from(chains[i].0), f.len() as u32 + 12)
        );
        assert_eq!(ring.driver.read(chains[i].1[0] + 12, f.len()), *f);
    }
}

#[test]
fn frame_too_big_for_the_chain_is_dropped_and_counted() {
    let mut ring = Ring::new(16);
    let (head, bufs) = ring.driver.push_rx(&[12 + 100]);
    let (mut backend, peer) = pair();
    peer.send_frame(&wire(&frame(101, 1))).expect("send");
    peer.send_frame(&wire(&frame(100, 2))).expect("send");
    let mut counters = RxCounters::default();

    ring.rx(&mut backend, RxMode::SingleChain, &mut counters);

    assert_eq!(counters.dropped_no_buffer, 1);
    assert_eq!(counters.frames, 1);
    assert_eq!(ring.driver.used_since(0), vec![(u32::from(head), 112)]);
    assert_eq!(ring.driver.read(bufs[0] + 12, 100), frame(100, 2));
}

#[test]
fn no_buffers_means_backpressure_not_loss() {
    let mut ring = Ring::new(16);
    let (mut backend, peer) = pair();
    let payload = frame(300, 3);
    peer.send_frame(&wire(&payload)).expect("send");
    let mut counters = RxCounters::default();

    let outcome = ring.rx(&mut backend, RxMode::Mergeable, &mut counters);
    assert_eq!(outcome.stop, RxStop::NoBuffers);
    assert!(!outcome.needs_interrupt);
    assert_eq!(counters.no_buffer_stalls, 1);
    assert_eq!(counters.dropped_no_buffer, 0);
    assert_eq!(
        ring.driver.used_flags(),
        0,
        "driver notifications enabled while we wait"
    );

    let (_, bufs) = ring.driver.push_rx(&[2048]);
    ring.driver.push_rx(&[2048]);
    let outcome = ring.rx(&mut backend, RxMode::Mergeable, &mut counters);
    assert_eq!(outcome.stop, RxStop::BackendEmpty);
    assert_eq!(ring.driver.read(bufs[0] + 12, 300), payload);
    assert_eq!(
        ring.driver.used_flags(),
        1,
        "no kicks wanted while buffers remain"
    );
}

#[test]
fn closed_backend_is_reported() {
    let mut ring = Ring::new(16);
    ring.driver.push_rx(&[2048]);
    let (mut backend, peer) = pair();
    drop(peer);
    let mut counters = RxCounters::default();
    let outcome = ring.rx(&mut backend, RxMode::Mergeable, &mut counters);
    assert_eq!(outcome.stop, RxStop::BackendClosed);
    assert_eq!(ring.queue.next_avail(), 0, "the buffer stays the driver's");
}

/// The worker's pool across calls in mergeable mode, over buffers that partly follow each
/// other in memory (merged into one iovec) and partly do not: every frame lands whole, in
/// order, in the chains the used ring names, with num_buffers right, call after call.
#[test]
fn a_kept_pool_delivers_frames_across_merged_and_separate_buffers() {
    let mut ring = Ring::new(64);
    // 512 and 1536 are multiples of 16 (the allocator's alignment): such buffers follow each
    // other; a 700-byte one leaves a gap after it.
    let mut chains: HashMap<u16, (u64, u32)> = HashMap::new();
    for i in 0..64 {
        let len = [512, 1536, 700, 512][i % 4];
        let (head, bufs) = ring.driver.push_rx(&[len]);
        chains.insert(head, (bufs[0], len));
    }
    let mut rxq = ring.rx_queue(RxMode::Mergeable);
    let (mut backend, peer) = pair();
    let mut counters = RxCounters::default();
    let mut seen = 0u16;
    let mut seed = 7u32;
    for call in 0..60 {
        let frames: Vec<Vec<u8>> = (0..1 + call % 5)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                frame(60 + (seed >> 8) as usize % 2900, call as u8)
            })
            .collect();
        for f in &frames {
            peer.send_frame(&wire(f)).expect("send");
        }
        let outcome = rxq.process(&mut backend, &mut counters).expect("ring ok");
        assert_eq!(outcome.stop, RxStop::BackendEmpty, "call {call}");
        let mut returned = Vec::new();
        for f in &frames {
            let (first, _) = ring.driver.used(seen);
            let (addr, _) = chains[&(first as u16)];
            let count = num_buffers(&ring.driver, addr);
            let mut got = Vec::new();
            for k in 0..count {
                let (id, len) = ring.driver.used(seen.wrapping_add(k));
                let (addr, cap) = chains[&(id as u16)];
                assert!(len <= cap, "call {call}: used length within the chain");
                got.extend(ring.driver.read(addr, len as usize));
                returned.push(id as u16);
            }
            seen = seen.wrapping_add(count);
            assert_eq!(got[VNET_HDR_LEN..], f[..], "call {call}: frame intact");
        }
        assert_eq!(
            ring.driver.used_idx(),
            seen,
            "call {call}: nothing else used"
        );
        // The driver posts the returned buffers again.
        ring.driver.publish_all(returned);
    }
    assert_eq!(counters.frames, (0..60).map(|c| 1 + c % 5).sum::<u64>());
    assert_eq!(counters.dropped_no_buffer + counters.backend_errors, 0);
}

/// Sparse reads (the worker's setting): after a call that found one frame, calls read one
/// frame and stop without the read that finds the backend empty; every SPARSE_PROBE_EVERY-th
/// call reads until empty, and one that finds a burst ends the mode. No frame is lost or
/// reordered whichever way a call ends, and without the setting every call drains.
#[test]
fn sparse_reads_skip_the_empty_read_until_a_burst_comes() {
    sparse_reads::<GuestQueue>();
}

#[test]
fn sparse_reads_skip_the_empty_read_on_a_packed_ring() {
    sparse_reads::<GuestPackedQueue>();
}

fn sparse_reads<Q: DriverRing>() {
    use crate::test_utils::queue::DATA_START;
    use crate::virtio::net::rx::{RX_GATHER_NO_GSO_BYTES, SPARSE_PROBE_EVERY};

    let mem = guest_mem();
    let mut driver = Q::at(&mem, 0, 256, DATA_START);
    let bufs: HashMap<u32, u64> = (0..255)
        .map(|_| {
            let (id, addrs) = driver.offer_rx(&[1536]);
            (u32::from(id), addrs[0])
        })
        .collect();
    let mut rxq = RxQueue::new(
        driver.device_ring(0),
        RxMode::SingleChain,
        RX_GATHER_NO_GSO_BYTES,
    );
    let (mut backend, peer) = pair();
    let mut counters = RxCounters::default();
    let mut sent = 0u8;
    let mut delivered = 0u16;
    let mut send = |n: usize| {
        for _ in 0..n {
            peer.send_frame(&wire(&frame(60, sent))).expect("send");
            sent += 1;
        }
    };
    // Runs one call; checks the frames it delivered are the next ones, in order.
    let mut call = |rxq: &mut RxQueue, counters: &mut RxCounters| {
        let before = counters.frames;
        let stop = rxq.process(&mut backend, counters).expect("ring ok").stop;
        for _ in before..counters.frames {
            let (id, len) = driver.next_used().expect("a used entry per frame");
            assert_eq!(len as usize, VNET_HDR_LEN + 60);
            let got = driver.peek(bufs[&id] + VNET_HDR_LEN as u64, 60);
            assert_eq!(
                got,
                frame(60, delivered as u8),
                "frame {delivered} in order"
            );
            delivered += 1;
        }
        (stop, counters.frames - before)
    };

    // Off (the default): a call drains whatever is queued.
    send(1);
    assert_eq!(call(&mut rxq, &mut counters), (RxStop::BackendEmpty, 1));
    send(3);
    assert_eq!(call(&mut rxq, &mut counters), (RxStop::BackendEmpty, 3));

    rxq.set_sparse_reads(true);
    // One frame then an empty read: the traffic looks sparse.
    send(1);
    assert_eq!(call(&mut rxq, &mut counters), (RxStop::BackendEmpty, 1));
    // Now a call reads one frame and stops, whatever else is queued.
    send(3);
    for _ in 0..3 {
        assert_eq!(call(&mut rxq, &mut counters), (RxStop::Yielded, 1));
    }
    // A call that finds nothing ends as before (and keeps the mode).
    assert_eq!(call(&mut rxq, &mut counters), (RxStop::BackendEmpty, 0));
    // A burst: the mode's SPARSE_PROBE_EVERY-th call drains it and ends the mode.
    let probe_every = usize::from(SPARSE_PROBE_EVERY);
    send(40);
    let mut yielded = 0;
    loop {
        match call(&mut rxq, &mut counters) {
            (RxStop::Yielded, 1) => yielded += 1,
            (RxStop::BackendEmpty, n) => {
                assert_eq!(yielded + n as usize, 40, "the draining call takes the rest");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Calls so far in the mode: 3 yielded + 1 empty, then the burst's.
    assert_eq!(
        4 + yielded + 1,
        probe_every,
        "drained at the mode's probing call"
    );
    // Out of the mode: calls drain again.
    send(2);
    assert_eq!(call(&mut rxq, &mut counters), (RxStop::BackendEmpty, 2));
    assert_eq!(counters.frames, u64::from(sent));
    assert!(
        driver.next_used().is_none(),
        "{delivered} delivered, no more"
    );
}

/// A 256-entry ring of `Q`'s kind with three rx chains of one 1536-byte buffer made available,
/// the middle one device-readable (the device refuses it), and a receive queue over it in
/// `mode`: the driver, the three ids, the first and third chains' buffers, and the queue.
fn refused_between<Q: DriverRing>(mode: RxMode) -> (Q, [u16; 3], [u64; 2], RxQueue) {
    use crate::test_utils::queue::DATA_START;
    use crate::virtio::net::rx::RX_GATHER_BYTES;

    let mut driver = Q::at(&guest_mem(), 0, 256, DATA_START);
    let (first, first_bufs) = driver.offer_rx(&[1536]);
    let readable = driver.reserve(1536);
    let refused = driver.offer(&[(readable, 1536, 0)]);
    let (third, third_bufs) = driver.offer_rx(&[1536]);
    let rxq = RxQueue::new(driver.device_ring(0), mode, RX_GATHER_BYTES);
    (
        driver,
        [first, refused, third],
        [first_bufs[0], third_bufs[0]],
        rxq,
    )
}

#[test]
fn a_refused_rx_chain_among_pooled_ones_is_returned_at_once() {
    for mode in [RxMode::SingleChain, RxMode::Mergeable] {
        refused_chain_returned_at_once::<GuestQueue>(mode);
        refused_chain_returned_at_once::<GuestPackedQueue>(mode);
    }
}

/// Without IN_ORDER a chain the device refuses goes back at once, empty, and the chains
/// popped with it (on a packed ring one chain per frame: in the same run) take the frames.
fn refused_chain_returned_at_once<Q: DriverRing>(mode: RxMode) {
    let (mut driver, [first, refused, third], [first_buf, third_buf], mut rxq) =
        refused_between::<Q>(mode);
    let (mut backend, peer) = pair();
    let mut counters = RxCounters::default();
    rxq.process(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(
        driver.next_used(),
        Some((u32::from(refused), 0)),
        "{mode:?}"
    );
    assert_eq!(counters.malformed_chains, 1);
    assert_eq!(rxq.pooled_chains(), 2, "{mode:?}");
    let sent = [wire(&frame(60, 1)), wire(&frame(61, 2))];
    for f in &sent {
        peer.send_frame(f).expect("send");
    }
    rxq.process(&mut backend, &mut counters).expect("ring ok");
    for (id, buf, f) in [(first, first_buf, &sent[0]), (third, third_buf, &sent[1])] {
        assert_eq!(driver.next_used(), Some((u32::from(id), f.len() as u32)));
        let mut got = driver.peek(buf, f.len());
        // `num_buffers` is the device's to write.
        got[10..12].copy_from_slice(&f[10..12]);
        assert_eq!(&got, f, "{mode:?}");
    }
    assert_eq!(counters.frames, 2);
}

#[test]
fn in_order_returns_a_refused_rx_chain_after_the_pooled_ones_on_a_split_ring() {
    in_order_keeps_a_refused_chain_in_order::<GuestQueue>(RxMode::Mergeable);
    in_order_keeps_a_refused_chain_in_order::<GuestQueue>(RxMode::SingleChain);
}

#[test]
fn in_order_returns_a_refused_rx_chain_after_the_pooled_ones_on_a_packed_ring() {
    in_order_keeps_a_refused_chain_in_order::<GuestPackedQueue>(RxMode::Mergeable);
    // One chain per frame the packed ring pops the three lone descriptors as one run: the
    // refused one is put back with the one after it.
    in_order_keeps_a_refused_chain_in_order::<GuestPackedQueue>(RxMode::SingleChain);
}

/// With VIRTIO_F_IN_ORDER a driver reads a used entry as returning every chain made available
/// before it. A chain the device refuses (here device-readable: it cannot take a frame),
/// popped while a chain before it still waits in the pool for a frame, is returned only after
/// that one, so the used entries come in the order the chains were made available.
fn in_order_keeps_a_refused_chain_in_order<Q: DriverRing>(mode: RxMode) {
    // Mergeable mode pools chains until a maximal frame fits, one chain per frame pools up
    // to 32: either pops all three at once.
    let (mut driver, [first, refused, third], _, mut rxq) = refused_between::<Q>(mode);
    rxq.set_in_order(true);
    let (mut backend, peer) = pair();
    let mut counters = RxCounters::default();
    rxq.process(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(
        driver.next_used(),
        None,
        "the refused chain waits behind the pooled one"
    );
    let sent = wire(&frame(60, 1));
    peer.send_frame(&sent).expect("send");
    rxq.process(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(counters.frames, 1);
    assert_eq!(
        driver.next_used(),
        Some((u32::from(first), sent.len() as u32)),
        "the frame in the first chain"
    );
    assert_eq!(
        driver.next_used(),
        Some((u32::from(refused), 0)),
        "then the refused chain, empty"
    );
    assert_eq!(counters.malformed_chains, 1);
    assert_eq!(driver.next_used(), None, "the third chain is still pooled");
    peer.send_frame(&sent).expect("send");
    rxq.process(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(
        driver.next_used(),
        Some((u32::from(third), sent.len() as u32))
    );
}
