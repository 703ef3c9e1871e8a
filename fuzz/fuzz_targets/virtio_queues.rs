//! tx and rx processing (`process_tx`, `process_rx` in both modes) over arbitrary guest memory.
//!
//! Two modes: driver-like (rings laid out as a driver does, chains made of fuzzed segments,
//! possibly indirect or of the wrong direction, then fuzzed memory patches on top), and
//! arbitrary (ring addresses, sizes and positions from the input, overlaps allowed; memory from
//! patches only). A sequence of operations then runs tx and rx calls, sends frames into the
//! backend, publishes more entries and patches memory between calls. With `kept_rx`, rx runs
//! through one `RxQueue` kept across calls, set up as the worker sets it (its pool of popped
//! chains, with mergeable buffers merged, lives from call to call while memory changes under
//! it; sparse reads on, so calls also stop after one frame).
//!
//! Invariants, per call:
//! - it returns within [`CALL_BOUND`];
//! - the used index advances by no more than the chains popped (exactly as many when the call
//!   succeeds), and the chains popped are no more than the driver published when the call
//!   began (≤ the queue size) unless the device's own writes moved the avail index;
//! - tx: every frame counted as sent reached the backend (the socket pair's peer, or the
//!   sink's, source's or loop's count); the used index in memory is the device's once it
//!   returned anything;
//!
//! The backend is the socket pair, or one of the measurement backends (sink, source of
//! fuzzed frame length, loop), chosen by the input.
//! - kept rx: the chains popped and not returned are exactly the pool's;
//! - no panic (and no sanitizer report).

#![no_main]

mod common;

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use devices::backend::{
    LoopBackend, NetBackend, PairBackend, PairPeer, SinkBackend, SourceBackend,
};
use devices::virtio::net::metrics::{RxCounters, TxCounters};
use devices::virtio::net::rx::{RX_GATHER_BYTES, RX_GATHER_NO_GSO_BYTES};
use devices::virtio::net::{process_rx, process_tx, RxMode, RxQueue};
use devices::virtio::vring::Virtqueue;
use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use common::*;

/// Most one datapath call may take.
const CALL_BOUND: Duration = Duration::from_millis(100);

#[derive(Arbitrary, Debug)]
enum Mode {
    DriverLike {
        size_log2: u8,
        tx_chains: Vec<ChainSpec>,
        rx_chains: Vec<ChainSpec>,
        tx_published: u16,
        rx_published: u16,
        start: u16,
    },
    Arbitrary {
        tx: RawQueue,
        rx: RawQueue,
    },
}

#[derive(Arbitrary, Debug)]
struct RawQueue {
    size: u16,
    desc: u32,
    avail: u32,
    used: u32,
    next_avail: u16,
    next_used: u16,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Tx,
    Rx {
        mergeable: bool,
    },
    /// Frames the peer sends into the backend (lengths; 0 is skipped).
    Send(Vec<u16>),
    /// Moves a queue's avail index forward by `n` (any amount: jumps included).
    Publish {
        rx: bool,
        n: u16,
    },
    Patch(Patch),
    /// Closes the peer: rx then sees end of file, tx a broken pipe.
    ClosePeer,
}

#[derive(Arbitrary, Debug)]
enum BackendChoice {
    Pair,
    Sink,
    /// A source of frames of this length (clamped to what a source takes).
    Source(u16),
    Loop,
}

/// The backend of one input, and what tells how many frames tx handed it.
enum Backend {
    Pair(PairBackend, Option<PairPeer>),
    Sink(SinkBackend),
    Source(SourceBackend),
    Loop(LoopBackend),
}

impl Backend {
    fn new(choice: &BackendChoice) -> Backend {
        match choice {
            BackendChoice::Pair => {
                let (backend, peer) = PairBackend::new().expect("socketpair");
                Backend::Pair(backend, Some(peer))
            }
            BackendChoice::Sink => Backend::Sink(SinkBackend::new().expect("eventfd")),
            BackendChoice::Source(len) => {
                let len = usize::from(*len).clamp(
                    devices::backend::SOURCE_HEADER_LEN,
                    devices::backend::MAX_SOURCE_FRAME,
                );
                Backend::Source(SourceBackend::new([2, 0, 0, 0, 0, 1], len).expect("eventfd"))
            }
            BackendChoice::Loop => Backend::Loop(LoopBackend::new().expect("eventfd")),
        }
    }

    /// Frames transmitted so far as the backend counts them (the pair's peer is drained);
    /// None where that cannot be told (the peer closed).
    fn frames_taken(&mut self, taken: &mut u64, loop_received: u64) -> Option<u64> {
        match self {
            Backend::Pair(_, Some(peer)) => {
                while let Ok(Some(_)) = peer.try_recv_frame() {
                    *taken += 1;
                }
                Some(*taken)
            }
            Backend::Pair(_, None) => None,
            Backend::Sink(sink) => Some(sink.frames()),
            Backend::Source(source) => Some(source.tx_frames()),
            Backend::Loop(lo) => Some(lo.queued() as u64 + loop_received),
        }
    }
}

/// Runs `$body` with `$b` bound to the concrete backend (no `dyn`: as the worker).
macro_rules! with_backend {
    ($backend:expr, $b:ident => $body:expr) => {
        match $backend {
            Backend::Pair($b, _) => $body,
            Backend::Sink($b) => $body,
            Backend::Source($b) => $body,
            Backend::Loop($b) => $body,
        }
    };
}

#[derive(Arbitrary, Debug)]
struct Input {
    layout: Layout,
    backend: BackendChoice,
    event_idx: bool,
    /// rx through one kept `RxQueue` (mode and gather from the first rx op).
    kept_rx: bool,
    mode: Mode,
    patches: Vec<Patch>,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let mem = input.layout.memory();
    let (mut tx, mut rx) = match &input.mode {
        Mode::DriverLike {
            size_log2,
            tx_chains,
            rx_chains,
            tx_published,
            rx_published,
            start,
        } => {
            let size = 1u16 << (size_log2 % 9);
            let tx_rings = driver_rings(0, size);
            let rx_rings = driver_rings(0x4000, size);
            write_driver_chains(
                &mem,
                tx_rings,
                size,
                false,
                tx_chains,
                0x8000,
                0x4000,
                *start,
                tx_published % (size + 1),
            );
            write_driver_chains(
                &mem,
                rx_rings,
                size,
                true,
                rx_chains,
                0xc000,
                // Up to the end of memory: in the two-region layouts buffers may cross.
                0x4000
                    + if matches!(input.layout, Layout::Adjacent) {
                        0x2000
                    } else {
                        0
                    },
                *start,
                rx_published % (size + 1),
            );
            (
                queue(size, tx_rings, input.event_idx, *start, *start),
                queue(size, rx_rings, input.event_idx, *start, *start),
            )
        }
        Mode::Arbitrary { tx, rx } => {
            let q = |r: &RawQueue| {
                queue(
                    r.size,
                    (
                        u64::from(r.desc) % (3 * REGION_A),
                        u64::from(r.avail) % (3 * REGION_A),
                        u64::from(r.used) % (3 * REGION_A),
                    ),
                    input.event_idx,
                    r.next_avail,
                    r.next_used,
                )
            };
            (q(tx), q(rx))
        }
    };
    for patch in input.patches.iter().take(64) {
        patch.apply(&mem);
    }
    let mut backend = Backend::new(&input.backend);
    let mut tx_counters = TxCounters::default();
    let mut rx_counters = RxCounters::default();
    let mut kept = Kept::NotYet;
    // Frames the pair's peer received; frames rx read from a loop.
    let (mut peer_taken, mut loop_received) = (0u64, 0u64);
    for op in input.ops.iter().take(64) {
        match op {
            Op::Tx => {
                with_backend!(&mut backend, b => run_tx(&mem, &mut tx, b, &mut tx_counters));
                if let Some(taken) = backend.frames_taken(&mut peer_taken, loop_received) {
                    assert_eq!(taken, tx_counters.frames, "tx frames counted vs taken");
                }
            }
            Op::Rx { mergeable } => {
                let mode = if *mergeable {
                    RxMode::Mergeable
                } else {
                    RxMode::SingleChain
                };
                let queued_before = match &backend {
                    Backend::Loop(lo) => lo.queued() as u64,
                    _ => 0,
                };
                with_backend!(&mut backend, b => if input.kept_rx {
                    run_rx_kept(&mem, &rx, &mut kept, b, mode, &mut rx_counters);
                } else {
                    run_rx(&mem, &mut rx, b, mode, &mut rx_counters);
                });
                if let Backend::Loop(lo) = &backend {
                    // What rx took out of the loop (delivered or dropped) left it.
                    loop_received += queued_before - lo.queued() as u64;
                }
            }
            Op::Send(lens) => {
                if let Backend::Pair(_, Some(peer)) = &backend {
                    for &len in lens.iter().take(32) {
                        let frame = vec![0x5a; usize::from(len).max(1)];
                        if peer.try_send_frame(&frame).is_err() {
                            break;
                        }
                    }
                }
            }
            Op::Publish { rx: is_rx, n } => {
                let q = if *is_rx { &rx } else { &tx };
                let at = q.avail_ring() + 2;
                write_u16(&mem, at, read_u16(&mem, at).wrapping_add(*n));
            }
            Op::Patch(patch) => patch.apply(&mem),
            Op::ClosePeer => {
                if let Backend::Pair(_, peer) = &mut backend {
                    *peer = None;
                }
            }
        }
    }
});

/// Avail index in memory, positions before a call.
fn snapshot(mem: &GuestMemoryMmap, q: &Queue) -> (u16, u16, u16) {
    (
        read_u16(mem, q.avail_ring() + 2),
        q.next_avail(),
        q.next_used(),
    )
}

/// Checks the ring invariants of one call. Returns the chains used.
fn check_positions(
    mem: &GuestMemoryMmap,
    q: &Queue,
    (avail_before, avail_pos, used_pos): (u16, u16, u16),
    ok: bool,
    what: &str,
) -> u16 {
    let popped = q.next_avail().wrapping_sub(avail_pos);
    let used = q.next_used().wrapping_sub(used_pos);
    if ok {
        assert_eq!(used, popped, "{what}: used {used} != popped {popped}");
    } else {
        // A ring error may leave the popped-but-refused head unreturned.
        assert!(used <= popped, "{what}: used {used} > popped {popped}");
    }
    let published = avail_before.wrapping_sub(avail_pos);
    let avail_after = read_u16(mem, q.avail_ring() + 2);
    if avail_after == avail_before && published <= q.size() {
        assert!(
            popped <= published,
            "{what}: popped {popped} > published {published}"
        );
    }
    used
}

fn run_tx<B: NetBackend>(
    mem: &GuestMemoryMmap,
    q: &mut Queue,
    backend: &mut B,
    counters: &mut TxCounters,
) {
    let before = snapshot(mem, q);
    let start = Instant::now();
    let result = process_tx(q, mem, backend, counters);
    let elapsed = start.elapsed();
    assert!(elapsed < CALL_BOUND, "process_tx took {elapsed:?}");
    if let Err(devices::virtio::ring::RingError::Overlap(_)) = &result {
        return;
    }
    let used = check_positions(mem, q, before, result.is_ok(), "tx");
    if used > 0 {
        // tx writes nothing but the used ring, which overlaps nothing the driver owns, so the
        // index stored there is the device's.
        assert_eq!(
            read_u16(mem, q.used_ring() + 2),
            q.next_used(),
            "tx used idx"
        );
    }
}

fn run_rx<B: NetBackend>(
    mem: &GuestMemoryMmap,
    q: &mut Queue,
    backend: &mut B,
    mode: RxMode,
    counters: &mut RxCounters,
) {
    let before = snapshot(mem, q);
    let start = Instant::now();
    let result = process_rx(q, mem, backend, mode, counters);
    let elapsed = start.elapsed();
    assert!(elapsed < CALL_BOUND, "process_rx took {elapsed:?}");
    if let Err(devices::virtio::ring::RingError::Overlap(_)) = &result {
        return;
    }
    check_positions(mem, q, before, result.is_ok(), "rx");
}

/// The kept receive queue of a `kept_rx` input.
enum Kept {
    NotYet,
    /// The ring was refused (or broke): rx stops, as the worker's does.
    Refused,
    Queue {
        rxq: Box<RxQueue>,
        /// Chains popped and chains used since it was built.
        popped: u64,
        used: u64,
    },
}

fn run_rx_kept<B: NetBackend>(
    mem: &GuestMemoryMmap,
    q: &Queue,
    kept: &mut Kept,
    backend: &mut B,
    mode: RxMode,
    counters: &mut RxCounters,
) {
    if let Kept::NotYet = kept {
        *kept = match Virtqueue::new(q, mem) {
            Ok(vq) => {
                // Mergeable with the GSO gather too (64 KiB per read).
                let gather = if mode == RxMode::Mergeable && q.size() % 2 == 0 {
                    RX_GATHER_BYTES
                } else {
                    RX_GATHER_NO_GSO_BYTES
                };
                let mut rxq = Box::new(RxQueue::new(vq, mode, gather));
                // The worker's default (`NetTuning::rx_sparse_reads`).
                rxq.set_sparse_reads(true);
                Kept::Queue {
                    rxq,
                    popped: 0,
                    used: 0,
                }
            }
            Err(_) => Kept::Refused,
        };
    }
    let Kept::Queue { rxq, popped, used } = kept else {
        return;
    };
    let vq = rxq.virtqueue().expect("attached");
    let (avail_pos, used_pos) = (vq.next_avail(), vq.next_used());
    let start = Instant::now();
    let result = rxq.process(backend, counters);
    let elapsed = start.elapsed();
    assert!(elapsed < CALL_BOUND, "kept rx took {elapsed:?}");
    let vq = rxq.virtqueue().expect("attached");
    let popped_now = vq.next_avail().wrapping_sub(avail_pos);
    let used_now = vq.next_used().wrapping_sub(used_pos);
    *popped += u64::from(popped_now);
    *used += u64::from(used_now);
    if result.is_err() {
        // NEEDS_RESET in the worker: the queue is not used again.
        *kept = Kept::Refused;
        return;
    }
    assert!(*used <= *popped, "kept rx: used {used} > popped {popped}");
    assert_eq!(
        *popped - *used,
        rxq.pooled_chains() as u64,
        "kept rx: the chains held are the pool's"
    );
}
