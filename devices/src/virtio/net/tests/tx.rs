//! Transmit path: frames reach the backend intact (header included), in order.

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress};

use crate::backend::{NetBackend, Offloads, MAX_TX_BATCH};
use crate::virtio::net::metrics::TxCounters;
use crate::virtio::net::tests::support::{
    desc_bytes, drain, frame, guest_mem, pair, tx_into_full_backend, wire, GuestQueue, Ring,
    INDIRECT, NEXT,
};
use crate::virtio::net::tx::TX_BUDGET;
use crate::virtio::net::{process_tx, TxStop, VNET_HDR_LEN};

#[test]
fn frame_split_across_descriptors_reaches_backend_with_its_header() {
    let mut ring = Ring::new(16);
    let payload = frame(1500, 1);
    let bytes = wire(&payload);
    // Header split from the frame, and the header itself split in two.
    let head = ring.driver.push_tx(&bytes, &[5, 12, 700]);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);

    assert!(outcome.needs_interrupt);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(peer.recv_frame().expect("frame"), bytes);
    assert_eq!(ring.driver.used_since(0), vec![(u32::from(head), 0)]);
    assert_eq!(counters.frames, 1);
    assert_eq!(counters.bytes, 1500);
    assert_eq!(counters.interrupts_raised, 1);
    assert_eq!(counters.malformed_chains, 0);
}

/// A 16-entry ring with `n` frames of `len` bytes (seeds 0, 1, …) queued for transmission,
/// each in one descriptor: the ring and the frames.
fn ring_with_frames(n: u8, len: usize) -> (Ring, Vec<Vec<u8>>) {
    let mut ring = Ring::new(16);
    let sent: Vec<Vec<u8>> = (0..n).map(|i| wire(&frame(len, i))).collect();
    ring.push_frames(&sent);
    (ring, sent)
}

#[test]
fn frames_leave_in_ring_order_including_indirect_chains() {
    let mut ring = Ring::new(16);
    let first = wire(&frame(60, 2));
    let second = wire(&frame(300, 3));
    ring.driver.push_tx(&first, &[]);
    // An indirect table of two descriptors: header, then frame.
    let hdr = ring.driver.alloc(&second[..12]);
    let body = ring.driver.alloc(&second[12..]);
    let table = [desc_bytes(hdr, 12, 1, 1), desc_bytes(body, 300, 0, 0)].concat();
    let table_addr = ring.driver.alloc(&table);
    let head = ring.driver.write_descs(&[(table_addr, 32, INDIRECT, 0)])[0];
    ring.driver.publish(head);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();

    ring.tx(&mut backend, &mut counters);

    assert_eq!(peer.recv_frame().expect("frame"), first);
    assert_eq!(peer.recv_frame().expect("frame"), second);
    assert_eq!(counters.frames, 2);
    assert_eq!(ring.driver.used_idx(), 2);
}

#[test]
fn full_backend_keeps_the_chain_queued_until_it_drains() {
    let (bytes, mut ring, mut backend, peer, counters) = tx_into_full_backend(200);
    let sent = counters.frames;
    assert!(
        sent > 0 && sent < 200,
        "socket buffer holds some frames: {sent}"
    );
    assert_eq!(
        u64::from(ring.driver.used_idx()),
        sent,
        "the refused chain is not used"
    );
    assert_eq!(u64::from(ring.queue.next_avail()), sent);

    let mut received = 0u64;
    let mut total_frames = sent;
    loop {
        while let Some(got) = peer.try_recv_frame().expect("recv") {
            assert_eq!(got, bytes);
            received += 1;
        }
        let mut counters = TxCounters::default();
        let outcome = ring.tx(&mut backend, &mut counters);
        total_frames += counters.frames;
        if outcome.stop == TxStop::Drained {
            break;
        }
    }
    while let Some(got) = peer.try_recv_frame().expect("recv") {
        assert_eq!(got, bytes);
        received += 1;
    }
    assert_eq!((total_frames, received), (200, 200));
    assert_eq!(ring.driver.used_idx(), 200);
}

#[test]
fn budget_bounds_one_call() {
    let bytes = wire(&frame(20, 5));
    let mut ring = Ring::with_copies(512, &bytes, TX_BUDGET + 10);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::Budget);
    assert_eq!(counters.frames, TX_BUDGET as u64);
    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(counters.frames, TX_BUDGET as u64 + 10);
    assert_eq!(drain(&peer), TX_BUDGET + 10);
}

#[test]
fn tuned_budget_and_parking() {
    let bytes = wire(&frame(20, 5));
    let mut ring = Ring::with_copies(16, &bytes, 10);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    let mut txq = ring.tx_queue();
    txq.set_budget(4);
    for sent in [4, 8] {
        let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
        assert_eq!(outcome.stop, TxStop::Budget);
        assert_eq!(counters.frames, sent);
    }
    // Parked: drained, and notifications stay off (no EVENT_IDX: the NO_NOTIFY flag).
    let outcome = txq.poll(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::Idle);
    assert_eq!(counters.frames, 10);
    assert_eq!(ring.driver.used_idx(), 10, "used entries published");
    assert_eq!(ring.driver.used_flags() & 1, 1, "notifications still off");
    assert!(!txq.avail_pending());
    ring.driver.push_tx(&bytes, &[]);
    assert!(txq.avail_pending());
    let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(ring.driver.used_flags() & 1, 0, "notifications back on");
    assert_eq!(drain(&peer), 11);
}

#[test]
fn backend_errors_drop_the_frame_and_move_on() {
    let mut ring = Ring::new(16);
    ring.driver.push_tx(&wire(&frame(100, 6)), &[]);
    ring.driver.push_tx(&wire(&frame(100, 7)), &[]);
    let (mut backend, peer) = pair();
    drop(peer); // writes now fail with EPIPE
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(counters.backend_errors, 2);
    assert_eq!(counters.frames, 0);
    assert_eq!(ring.driver.used_idx(), 2, "the guest gets its buffers back");
}

/// A backend that takes frames in batches ([`NetBackend::write_frames`]) and answers each
/// frame from a script: `None` takes it, `Some(kind)` fails it with that error. Unscripted
/// frames are taken.
struct Batching {
    fd: std::fs::File,
    script: std::collections::VecDeque<Option<std::io::ErrorKind>>,
    /// Frames taken, in the order the backend took them.
    taken: Vec<Vec<u8>>,
    /// The segments (iovecs) each frame taken came in.
    segments: Vec<usize>,
    /// `write_frames` calls and their sizes; `write_frame` calls.
    batches: Vec<usize>,
    singles: usize,
    /// `tx_batch_min`.
    min: usize,
    /// Runs before the first `write_frame` (e.g. the driver queues more meanwhile).
    on_first_single: Option<Box<dyn FnOnce() + Send>>,
}

impl Batching {
    fn new(script: &[Option<std::io::ErrorKind>]) -> Batching {
        Batching {
            fd: std::fs::File::open("/dev/null").expect("/dev/null"),
            script: script.iter().copied().collect(),
            taken: Vec::new(),
            segments: Vec::new(),
            batches: Vec::new(),
            singles: 0,
            min: 2,
            on_first_single: None,
        }
    }

    fn take(&mut self, iovs: crate::iovec::Iovecs<'_>) -> std::io::Result<usize> {
        if let Some(Some(kind)) = self.script.pop_front() {
            return Err(kind.into());
        }
        let mut bytes = vec![0; iovs.total_bytes()];
        assert!(iovs.read_at(0, &mut bytes));
        self.taken.push(bytes);
        self.segments.push(iovs.as_raw().len());
        Ok(iovs.total_bytes())
    }
}

impl std::os::fd::AsRawFd for Batching {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

impl NetBackend for Batching {
    fn read_frame(&mut self, _: crate::iovec::Iovecs<'_>) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::WouldBlock.into())
    }
    fn write_frame(&mut self, iovs: crate::iovec::Iovecs<'_>) -> std::io::Result<usize> {
        if let Some(hook) = self.on_first_single.take() {
            hook();
        }
        self.singles += 1;
        self.take(iovs)
    }
    fn tx_batch(&self) -> usize {
        MAX_TX_BATCH
    }
    fn tx_batch_min(&self) -> usize {
        self.min
    }
    fn write_frames(
        &mut self,
        frames: &crate::iovec::IovecList<'_>,
        ends: &[usize],
        results: &mut [std::io::Result<usize>],
    ) {
        assert!(ends.len() <= MAX_TX_BATCH);
        self.batches.push(ends.len());
        let mut start = 0;
        for (&end, result) in ends.iter().zip(results.iter_mut()) {
            *result = self.take(frames.range(start, end));
            start = end;
        }
    }
    fn supported_offloads(&self) -> Offloads {
        Offloads::NONE
    }
    fn set_offloads(&mut self, _: Offloads) -> std::io::Result<()> {
        Ok(())
    }
    fn set_vnet_hdr_size(&mut self, _: u32) -> std::io::Result<()> {
        Ok(())
    }
}

const WOULD_BLOCK: Option<std::io::ErrorKind> = Some(std::io::ErrorKind::WouldBlock);

#[test]
fn a_batching_backend_gets_whole_batches_in_ring_order() {
    let mut ring = Ring::new(128);
    let sent: Vec<Vec<u8>> = (0..70).map(|i| wire(&frame(60 + i, i as u8))).collect();
    for (i, bytes) in sent.iter().enumerate() {
        // Some frames split header and data, as Linux does.
        ring.driver
            .push_tx(bytes, if i % 3 == 0 { &[12] } else { &[] });
    }
    let mut backend = Batching::new(&[]);
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);

    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(backend.taken, sent);
    assert_eq!(backend.batches, vec![32, 32, 6]);
    assert_eq!(backend.singles, 0);
    assert_eq!(counters.batched_writes, 3);
    assert_eq!(ring.driver.used_idx(), 70);
    assert_eq!(counters.frames, 70);
    assert_eq!(
        counters.interrupts_raised, 1,
        "one interrupt decision per call"
    );
}

/// A header in its own descriptor right before its frame reaches the backend as one segment
/// (a tap then sends it with `write`); buffers apart stay apart; a chain never merges into the
/// one before it, even where the buffers touch.
#[test]
fn buffers_that_follow_each_other_become_one_segment() {
    let mut ring = Ring::new(16);
    let sent: Vec<Vec<u8>> = (0..3).map(|i| wire(&frame(60, i))).collect();
    let hdr = VNET_HDR_LEN as u32;
    let rest = sent[0].len() as u32 - hdr;
    // Chain 0: header and frame back to back; chain 1: the frame 64 bytes after the header.
    let at = ring
        .driver
        .alloc(&[sent[0].clone(), sent[2].clone()].concat());
    let apart = ring.driver.alloc_zeroed(sent[1].len() + 64);
    ring.mem
        .write_slice(&sent[1][..VNET_HDR_LEN], GuestAddress(apart))
        .expect("header");
    ring.mem
        .write_slice(
            &sent[1][VNET_HDR_LEN..],
            GuestAddress(apart + 64 + u64::from(hdr)),
        )
        .expect("frame");
    let heads = [
        ring.driver
            .write_descs(&[(at, hdr, NEXT, 1), (at + u64::from(hdr), rest, 0, 0)])[0],
        ring.driver.write_descs(&[
            (apart, hdr, NEXT, 3),
            (apart + 64 + u64::from(hdr), rest, 0, 0),
        ])[0],
        // Chain 2 starts where chain 0 ends.
        ring.driver
            .write_descs(&[(at + sent[0].len() as u64, sent[2].len() as u32, 0, 0)])[0],
    ];
    ring.driver.publish_all([heads[0], heads[2], heads[1]]);
    let mut backend = Batching::new(&[]);
    backend.min = 4;
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);

    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(
        backend.taken,
        [sent[0].clone(), sent[2].clone(), sent[1].clone()]
    );
    assert_eq!(backend.segments, [1, 1, 2]);
    assert_eq!(counters.frames, 3);
}

#[test]
fn fewer_frames_than_a_batch_is_worth_go_one_by_one() {
    let (mut ring, sent) = ring_with_frames(3, 70);
    let mut backend = Batching::new(&[]);
    backend.min = 4;
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);

    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(backend.taken, sent);
    assert_eq!((backend.singles, backend.batches.len()), (3, 0));
    assert_eq!(counters.batched_writes, 0);
    assert_eq!(ring.driver.used_idx(), 3);
}

#[test]
fn a_backlog_that_builds_during_a_call_goes_out_in_batches() {
    let mem = guest_mem();
    let driver = std::sync::Arc::new(std::sync::Mutex::new(GuestQueue::new(&mem, 64)));
    let mut queue = driver.lock().unwrap().queue();
    let sent: Vec<Vec<u8>> = (0..21).map(|i| wire(&frame(70, i))).collect();
    driver.lock().unwrap().push_tx(&sent[0], &[]);
    let mut backend = Batching::new(&[]);
    backend.min = 4;
    // While the first frame is written, the driver queues twenty more.
    let later = sent[1..].to_vec();
    let shared = std::sync::Arc::clone(&driver);
    backend.on_first_single = Some(Box::new(move || {
        let mut driver = shared.lock().unwrap();
        for bytes in &later {
            driver.push_tx(bytes, &[]);
        }
    }));
    let mut counters = TxCounters::default();

    let outcome = process_tx(&mut queue, &mem, &mut backend, &mut counters).expect("ring ok");

    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(backend.taken, sent, "every frame once, in order");
    assert_eq!(
        backend.singles, 1,
        "only the frame queued alone went by itself"
    );
    assert_eq!(backend.batches, vec![20]);
    assert_eq!(counters.batched_writes, 1);
    assert_eq!(driver.lock().unwrap().used_idx(), 21);
    assert_eq!(counters.frames, 21);
}

#[test]
fn a_full_backend_gets_the_rest_of_a_batch_back_in_order_on_the_next_call() {
    let (mut ring, sent) = ring_with_frames(10, 80);
    let mut script = vec![None; 4];
    script.extend([WOULD_BLOCK; 6]);
    let mut backend = Batching::new(&script);
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::BackendFull);
    assert_eq!(backend.taken, sent[..4]);
    assert_eq!(
        ring.driver.used_idx(),
        4,
        "the unsent chains stay with the device"
    );
    assert_eq!(counters.frames, 4);
    assert_eq!(counters.backend_errors, 0);

    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(backend.taken, sent, "every frame once, in order");
    assert_eq!(ring.driver.used_idx(), 10);
    assert_eq!(counters.frames, 10);
}

#[test]
fn a_frame_that_blocked_before_one_that_went_is_tried_again_alone() {
    let (mut ring, sent) = ring_with_frames(4, 80);
    // Frame 1 would block but frame 2 goes: the backend had room again. Frame 1 is retried
    // on its own (and taken: the script has no more failures).
    let mut backend = Batching::new(&[None, WOULD_BLOCK, None, None]);
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(
        backend.taken,
        vec![
            sent[0].clone(),
            sent[2].clone(),
            sent[3].clone(),
            sent[1].clone()
        ]
    );
    assert_eq!(backend.singles, 1);
    assert_eq!(ring.driver.used_idx(), 4);
    assert_eq!(counters.frames, 4);
    assert_eq!(counters.backend_full, 1);

    // Blocked again on its retry: dropped and counted, the others still go.
    ring.push_frames(&sent);
    let mut backend = Batching::new(&[WOULD_BLOCK, None, None, None, WOULD_BLOCK]);
    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(backend.taken, sent[1..]);
    assert_eq!(ring.driver.used_idx(), 8);
    assert_eq!(counters.backend_errors, 1);
}

#[test]
fn a_malformed_chain_in_a_batch_is_judged_alone_and_the_rest_still_go_in_order() {
    let mut ring = Ring::new(16);
    let a = wire(&frame(80, 1));
    let b = wire(&frame(80, 2));
    // A header without a frame between them.
    ring.push_frames(&[a.clone(), vnet_hdr_only(), b.clone()]);
    let mut backend = Batching::new(&[]);
    let mut counters = TxCounters::default();

    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(backend.taken, vec![a, b]);
    assert_eq!(counters.malformed_chains, 1);
    assert_eq!(counters.frames, 2);
    assert_eq!(ring.driver.used_idx(), 3);
}

fn vnet_hdr_only() -> Vec<u8> {
    crate::virtio::net::tests::support::vnet_hdr().to_vec()
}

#[test]
fn frames_longer_than_an_mtu_frame_are_counted_as_large() {
    let mut ring = Ring::new(16);
    for len in [1514, 1515, 9000] {
        ring.driver.push_tx(&wire(&frame(len, 3)), &[]);
    }
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    ring.tx(&mut backend, &mut counters);
    for _ in 0..3 {
        peer.recv_frame().expect("frame");
    }
    assert_eq!((counters.frames, counters.large_frames), (3, 2));
}
