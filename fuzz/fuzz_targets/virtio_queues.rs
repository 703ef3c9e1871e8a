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
//!   returned anything; a drained call with EVENT_IDX leaves `avail_event` the call's
//!   `kick_ahead` past the next entry (kick coalescing; at most the size less one);
//!
//! The backend is the socket pair, or one of the measurement backends (sink, source of
//! fuzzed frame length, loop), chosen by the input.
//! - kept rx: the chains popped and not returned are exactly the pool's;
//! - no panic (and no sanitizer report).
//!
//! The first input byte picks the ring (0: split, as above): bit 1 VIRTIO_F_IN_ORDER (tx
//! returns each call's chains in one used entry), bit 0 a packed ring, followed by both
//! queues' driver event suppression areas (off_wrap, flags ENABLE/DISABLE/DESC or anything).
//! A packed ring's queues are kept for the whole input, as the worker keeps them; driver-like,
//! a driver makes chains available with its wrap counter (Publish: `n` more chains) and reads
//! used descriptors back; arbitrary, Publish marks `n` descriptors available whatever they
//! hold. Per call, on a packed ring:
//! - it returns within [`CALL_BOUND`]; the device's in-flight descriptors are at most the
//!   size and exactly those between its used and available positions; tx leaves none in
//!   flight, rx only its pool's;
//! - the interrupt decision follows the driver's flags (DISABLE never raises, ENABLE always,
//!   DESC with EVENT_IDX as the driver's off_wrap asks, checked where the ring is clean); a
//!   drained tx leaves notifications enabled in the device's area;
//! - where no patch wrote the ring (driver-like): every used descriptor lies at the driver's
//!   used position with an id it has in flight, the used positions agree, and what the device
//!   holds is whole chains the driver made available.

#![no_main]

mod common;

use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use devices::backend::{
    LoopBackend, NetBackend, PairBackend, PairPeer, SinkBackend, SourceBackend,
};
use devices::virtio::net::metrics::{RxCounters, TxCounters};
use devices::virtio::net::rx::{RX_GATHER_BYTES, RX_GATHER_NO_GSO_BYTES};
use devices::virtio::net::{process_rx, process_tx, RxMode, RxQueue, TxQueue, TxStop};
use devices::virtio::packed::{
    PackedLayout, PackedVirtqueue, Position, EVENT_FLAG_DESC, EVENT_FLAG_DISABLE,
    EVENT_FLAG_ENABLE, EVENT_WRAP_BIT,
};
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
    /// A tx call; on a split ring with EVENT_IDX a drained queue sets `avail_event`
    /// `kick_ahead` entries on (kick coalescing).
    Tx {
        kick_ahead: u16,
    },
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

/// The ring kind, from the input's first byte (0: a split ring without IN_ORDER): bit 0 a
/// packed ring, bit 1 VIRTIO_F_IN_ORDER (tx returns each call's chains in one used entry). A
/// packed ring's driver event suppression areas follow (tx, rx).
#[derive(Debug)]
enum RingKind {
    Split {
        in_order: bool,
    },
    Packed {
        in_order: bool,
        tx_event: DriverEvent,
        rx_event: DriverEvent,
    },
}

impl<'a> Arbitrary<'a> for RingKind {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let kind = u8::arbitrary(u)?;
        let in_order = kind & 2 != 0;
        Ok(if kind & 1 == 0 {
            RingKind::Split { in_order }
        } else {
            RingKind::Packed {
                in_order,
                tx_event: u.arbitrary()?,
                rx_event: u.arbitrary()?,
            }
        })
    }
}

/// A packed ring's driver event suppression area: `desc_event_off_wrap`, `desc_event_flags`.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct DriverEvent {
    off_wrap: u16,
    flags: u16,
}

impl DriverEvent {
    /// Writes the area at `at` for a ring of `size`: mostly an offset inside the ring and
    /// flags ENABLE, DISABLE, DESC or the reserved value; sometimes anything.
    fn write(self, mem: &GuestMemoryMmap, at: u64, size: u16) {
        let off_wrap = if self.off_wrap & 0x4000 != 0 {
            self.off_wrap
        } else {
            ((self.off_wrap & 0x7fff) % size.max(1)) | (self.off_wrap & EVENT_WRAP_BIT)
        };
        let flags = if self.flags & 0x8000 != 0 {
            self.flags
        } else {
            self.flags & 3
        };
        write_u16(mem, at, off_wrap);
        write_u16(mem, at + 2, flags);
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    ring: RingKind,
    layout: Layout,
    backend: BackendChoice,
    event_idx: bool,
    /// rx through one kept `RxQueue` (mode and gather from the first rx op; a packed ring's rx
    /// always runs so).
    kept_rx: bool,
    mode: Mode,
    patches: Vec<Patch>,
    ops: Vec<Op>,
}

/// The queues of one input, of either kind.
enum Rings {
    Split {
        tx: Queue,
        rx: Queue,
        in_order: bool,
        kept: Kept,
    },
    Packed(Box<PackedRings>),
}

impl Rings {
    fn new(input: &Input, mem: &GuestMemoryMmap) -> Rings {
        match input.ring {
            RingKind::Split { in_order } => {
                let (tx, rx) = split_queues(input, mem);
                Rings::Split {
                    tx,
                    rx,
                    in_order,
                    kept: Kept::NotYet,
                }
            }
            RingKind::Packed {
                in_order,
                tx_event,
                rx_event,
            } => Rings::Packed(Box::new(PackedRings::new(
                input,
                mem,
                in_order,
                (tx_event, rx_event),
            ))),
        }
    }

    fn patched(&mut self, patch: &Patch) {
        if let Rings::Packed(p) = self {
            p.tx.patched(patch);
            p.rx.patched(patch);
        }
    }
}

fuzz_target!(|input: Input| {
    let mem = input.layout.memory();
    let mut rings = Rings::new(&input, &mem);
    for patch in input.patches.iter().take(64) {
        patch.apply(&mem);
        rings.patched(patch);
    }
    if let Rings::Packed(p) = &mut rings {
        p.activate(&mem, input.event_idx);
    }
    let mut backend = Backend::new(&input.backend);
    let mut tx_counters = TxCounters::default();
    let mut rx_counters = RxCounters::default();
    // Frames the pair's peer received; frames rx read from a loop.
    let (mut peer_taken, mut loop_received) = (0u64, 0u64);
    for op in input.ops.iter().take(64) {
        match op {
            Op::Tx { kick_ahead } => {
                with_backend!(&mut backend, b => match &mut rings {
                    Rings::Split { tx, in_order, .. } =>
                        run_tx(&mem, tx, *in_order, *kick_ahead, b, &mut tx_counters),
                    Rings::Packed(p) => p.tx(&mem, b, &mut tx_counters),
                });
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
                with_backend!(&mut backend, b => match &mut rings {
                    Rings::Split { rx, kept, .. } => if input.kept_rx {
                        run_rx_kept(&mem, rx, kept, b, mode, &mut rx_counters);
                    } else {
                        run_rx(&mem, rx, b, mode, &mut rx_counters);
                    },
                    Rings::Packed(p) => p.rx(&mem, b, mode, &mut rx_counters),
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
            Op::Publish { rx: is_rx, n } => match &mut rings {
                Rings::Split { tx, rx, .. } => {
                    let q = if *is_rx { rx } else { tx };
                    let at = q.avail_ring() + 2;
                    write_u16(&mem, at, read_u16(&mem, at).wrapping_add(*n));
                }
                Rings::Packed(p) => {
                    let side = if *is_rx { &mut p.rx } else { &mut p.tx };
                    side.publish(&mem, *n);
                }
            },
            Op::Patch(patch) => {
                patch.apply(&mem);
                rings.patched(patch);
            }
            Op::ClosePeer => {
                if let Backend::Pair(_, peer) = &mut backend {
                    *peer = None;
                }
            }
        }
    }
});

/// The split queues of an input, laid out as its mode says.
fn split_queues(input: &Input, mem: &GuestMemoryMmap) -> (Queue, Queue) {
    match &input.mode {
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
                mem,
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
                mem,
                rx_rings,
                size,
                true,
                rx_chains,
                0xc000,
                rx_buffer_len(input.layout),
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
    }
}

/// Length of the driver-like rx buffer area at 0xc000: up to the end of memory (in the
/// two-region layouts buffers may cross).
fn rx_buffer_len(layout: Layout) -> u64 {
    0x4000
        + if matches!(layout, Layout::Adjacent) {
            0x2000
        } else {
            0
        }
}

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
    in_order: bool,
    kick_ahead: u16,
    backend: &mut B,
    counters: &mut TxCounters,
) {
    let before = snapshot(mem, q);
    let start = Instant::now();
    let result = if in_order || kick_ahead > 0 {
        // As `process_tx`, with IN_ORDER negotiated and kick coalescing.
        Virtqueue::new(q, mem).and_then(|vq| {
            let mut txq = TxQueue::new(vq);
            txq.set_in_order(in_order);
            txq.set_kick_ahead(kick_ahead);
            let result = txq.process(backend, counters);
            txq.virtqueue().expect("attached").sync_to(q);
            result
        })
    } else {
        process_tx(q, mem, backend, counters)
    };
    let elapsed = start.elapsed();
    assert!(elapsed < CALL_BOUND, "process_tx took {elapsed:?}");
    if let Err(devices::virtio::ring::RingError::Overlap(_)) = &result {
        return;
    }
    let used = check_positions(mem, q, before, result.is_ok(), "tx");
    if q.event_idx_enabled() && matches!(&result, Ok(o) if o.stop == TxStop::Drained) {
        // The used ring overlaps nothing (checked when the queue was built): its `avail_event`
        // is the device's, `kick_ahead` past the next entry (at most the size less one).
        let size = q.size();
        let event = read_u16(mem, q.used_ring() + 4 + 8 * u64::from(size));
        assert_eq!(
            event,
            q.next_avail()
                .wrapping_add(kick_ahead.min(size.saturating_sub(1))),
            "tx avail_event after a drained call, kick_ahead {kick_ahead}"
        );
    }
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
                let gather = if mode == RxMode::Mergeable && q.size().is_multiple_of(2) {
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

/// The packed queues of one input: each side's layout and driver, and the device's queues,
/// kept for the whole input (a packed ring's positions live in the device, as in the worker).
struct PackedRings {
    in_order: bool,
    event_idx: bool,
    tx: PackedSide,
    rx: PackedSide,
    txq: Option<TxQueue>,
    rxq: Option<RxQueue>,
    /// The rx ring (until the first rx call builds `rxq` with its mode).
    rx_ring: Option<PackedVirtqueue>,
}

/// One packed queue as the driver sees it.
struct PackedSide {
    layout: PackedLayout,
    /// Driver-like mode: the driver making chains available and reading used ones back.
    driver: Option<PackedDriver>,
    /// Arbitrary mode: where the next descriptor is made available.
    cursor: (u16, bool),
    /// No patch wrote the descriptor ring or the device event area, and the driver is
    /// well-behaved: the driver's view and the device's must agree exactly.
    clean: bool,
    /// No patch wrote the device event area (what the device last wrote there is there).
    device_area_clean: bool,
    /// The ring was refused or broke: the device does not use it again (NEEDS_RESET).
    broken: bool,
    /// The driver reads used descriptors as IN_ORDER lets it (one may return every chain up
    /// to its id), on rx too: a chain rx refuses waits behind the chains still in its pool.
    in_order: bool,
}

impl PackedRings {
    fn new(
        input: &Input,
        mem: &GuestMemoryMmap,
        in_order: bool,
        events: (DriverEvent, DriverEvent),
    ) -> PackedRings {
        let (tx, rx) = match &input.mode {
            Mode::DriverLike {
                size_log2,
                tx_chains,
                rx_chains,
                tx_published,
                rx_published,
                start: _,
            } => {
                // Mostly small rings of any size (wraps happen), sometimes a power of two up
                // to 256.
                let size = if size_log2 & 0x80 != 0 {
                    1u16 << (size_log2 % 9)
                } else {
                    u16::from(size_log2 % 32) + 1
                };
                let side = |base: u64, writes: bool, chains: &[ChainSpec], buf: (u64, u64)| {
                    let layout = packed_layout(base, size);
                    let mut driver = PackedDriver::new(mem, layout, writes, chains, buf.0, buf.1);
                    let published = if writes { rx_published } else { tx_published };
                    driver.publish(published % (size + 1));
                    PackedSide::new(layout, Some(driver))
                };
                (
                    side(0, false, tx_chains, (0x8000, 0x4000)),
                    side(
                        0x4000,
                        true,
                        rx_chains,
                        (0xc000, rx_buffer_len(input.layout)),
                    ),
                )
            }
            Mode::Arbitrary { tx, rx } => {
                let layout = |r: &RawQueue| PackedLayout {
                    size: r.size % 1024,
                    desc: (u64::from(r.desc) % (3 * REGION_A)) & !15,
                    driver_event: (u64::from(r.avail) % (3 * REGION_A)) & !3,
                    device_event: (u64::from(r.used) % (3 * REGION_A)) & !3,
                };
                (
                    PackedSide::new(layout(tx), None),
                    PackedSide::new(layout(rx), None),
                )
            }
        };
        events.0.write(mem, tx.layout.driver_event, tx.layout.size);
        events.1.write(mem, rx.layout.driver_event, rx.layout.size);
        let (mut tx, mut rx) = (tx, rx);
        tx.in_order = in_order;
        rx.in_order = in_order;
        PackedRings {
            in_order,
            event_idx: false,
            tx,
            rx,
            txq: None,
            rxq: None,
            rx_ring: None,
        }
    }

    /// Builds the device's rings (after the input's first patches, as the driver programs
    /// the queue and then sets DRIVER_OK).
    fn activate(&mut self, mem: &GuestMemoryMmap, event_idx: bool) {
        self.event_idx = event_idx;
        let features = (u64::from(event_idx) << 29) | (u64::from(self.in_order) << 35);
        match PackedVirtqueue::new(mem, &self.tx.layout, features) {
            Ok(vq) => {
                let mut txq = TxQueue::new(vq);
                txq.set_in_order(self.in_order);
                self.txq = Some(txq);
            }
            Err(_) => self.tx.broken = true,
        }
        match PackedVirtqueue::new(mem, &self.rx.layout, features) {
            Ok(vq) => self.rx_ring = Some(vq),
            Err(_) => self.rx.broken = true,
        }
    }

    fn tx<B: NetBackend>(
        &mut self,
        mem: &GuestMemoryMmap,
        backend: &mut B,
        counters: &mut TxCounters,
    ) {
        if self.tx.broken {
            return;
        }
        let txq = self.txq.as_mut().expect("tx ring");
        let ring = |txq: &TxQueue| {
            let ring = txq.ring().and_then(|r| r.packed_ring()).expect("packed");
            snap(ring)
        };
        let before = ring(txq);
        let irqs = interrupts(
            counters.interrupts_raised,
            counters.interrupts_suppressed_event_idx,
            counters.interrupts_suppressed_no_interrupt,
        );
        let start = Instant::now();
        let result = txq.process(backend, counters);
        let elapsed = start.elapsed();
        assert!(elapsed < CALL_BOUND, "packed tx took {elapsed:?}");
        let after = ring(txq);
        let irqs = irqs.delta(
            counters.interrupts_raised,
            counters.interrupts_suppressed_event_idx,
            counters.interrupts_suppressed_no_interrupt,
        );
        let Ok(outcome) = result else {
            self.tx.check_positions(&after, "tx");
            self.tx.broken = true;
            return;
        };
        assert_eq!(after.in_flight, 0, "tx kept chains in flight: {after:?}");
        // tx writes no buffer: the driver's area is what the device read.
        self.tx
            .check_call(mem, &before, &after, irqs, self.event_idx, 0, "tx");
        if outcome.stop == TxStop::Drained && self.tx.device_area_clean {
            // Notifications re-enabled: ENABLE, or DESC at the next available position.
            let at = self.tx.layout.device_event;
            let flags = read_u16(mem, at + 2);
            if self.event_idx {
                assert_eq!(flags, EVENT_FLAG_DESC, "tx drained, device flags");
                assert_eq!(
                    read_u16(mem, at),
                    after.next_avail.off_wrap(),
                    "tx off_wrap"
                );
            } else {
                assert_eq!(flags, EVENT_FLAG_ENABLE, "tx drained, device flags");
            }
        }
    }

    fn rx<B: NetBackend>(
        &mut self,
        mem: &GuestMemoryMmap,
        backend: &mut B,
        mode: RxMode,
        counters: &mut RxCounters,
    ) {
        if self.rx.broken {
            return;
        }
        if let Some(vq) = self.rx_ring.take() {
            let gather = if mode == RxMode::Mergeable && vq.size() % 2 == 0 {
                RX_GATHER_BYTES
            } else {
                RX_GATHER_NO_GSO_BYTES
            };
            let mut rxq = RxQueue::new(vq, mode, gather);
            rxq.set_sparse_reads(true);
            rxq.set_in_order(self.in_order);
            self.rxq = Some(rxq);
        }
        let rxq = self.rxq.as_mut().expect("rx ring");
        let ring = |rxq: &RxQueue| {
            let ring = rxq.ring().and_then(|r| r.packed_ring()).expect("packed");
            snap(ring)
        };
        let before = ring(rxq);
        let irqs = interrupts(
            counters.interrupts_raised,
            counters.interrupts_suppressed_event_idx,
            counters.interrupts_suppressed_no_interrupt,
        );
        let start = Instant::now();
        let result = rxq.process(backend, counters);
        let elapsed = start.elapsed();
        assert!(elapsed < CALL_BOUND, "packed rx took {elapsed:?}");
        let after = ring(rxq);
        let irqs = irqs.delta(
            counters.interrupts_raised,
            counters.interrupts_suppressed_event_idx,
            counters.interrupts_suppressed_no_interrupt,
        );
        self.rx.check_positions(&after, "rx");
        if result.is_err() {
            self.rx.broken = true;
            return;
        }
        let pooled = rxq.pooled_chains();
        assert!(
            pooled as u32 <= after.in_flight && (pooled == 0) == (after.in_flight == 0),
            "rx: {pooled} chains pooled, {after:?}"
        );
        // rx writes buffers, which only a driver-like ring keeps clear of the driver's area.
        if self.rx.clean {
            self.rx
                .check_call(mem, &before, &after, irqs, self.event_idx, pooled, "rx");
        }
    }
}

/// A packed layout at `base`: the ring, then the driver event area, then the device's.
fn packed_layout(base: u64, size: u16) -> PackedLayout {
    let ring = 16 * u64::from(size);
    PackedLayout {
        size,
        desc: base,
        driver_event: base + ring,
        device_event: base + ring + 4,
    }
}

/// The device's positions on a packed ring.
#[derive(Debug)]
struct Snap {
    size: u16,
    next_avail: Position,
    next_used: Position,
    in_flight: u32,
}

fn snap(ring: &PackedVirtqueue) -> Snap {
    Snap {
        size: ring.size(),
        next_avail: ring.next_avail(),
        next_used: ring.next_used(),
        in_flight: ring.in_flight(),
    }
}

fn pos(p: Position) -> (u16, bool) {
    (p.offset, p.wrap)
}

/// Interrupt decisions counted: raised, suppressed by EVENT_IDX, suppressed by the flag.
#[derive(Clone, Copy, Debug)]
struct Interrupts(u64, u64, u64);

fn interrupts(raised: u64, event_idx: u64, flag: u64) -> Interrupts {
    Interrupts(raised, event_idx, flag)
}

impl Interrupts {
    fn delta(self, raised: u64, event_idx: u64, flag: u64) -> Interrupts {
        Interrupts(raised - self.0, event_idx - self.1, flag - self.2)
    }
}

impl PackedSide {
    fn new(layout: PackedLayout, driver: Option<PackedDriver>) -> PackedSide {
        PackedSide {
            layout,
            clean: driver.is_some(),
            driver,
            cursor: (0, true),
            device_area_clean: true,
            broken: false,
            in_order: false,
        }
    }

    fn patched(&mut self, patch: &Patch) {
        let ring = 16 * u64::from(self.layout.size);
        if patch.touches(self.layout.device_event, 4) {
            self.device_area_clean = false;
            self.clean = false;
        }
        if patch.touches(self.layout.desc, ring) {
            self.clean = false;
        }
    }

    /// The driver makes `n` more chains available (driver-like), or marks `n` descriptors
    /// available whatever they hold (arbitrary).
    fn publish(&mut self, mem: &GuestMemoryMmap, n: u16) {
        let size = self.layout.size;
        if size == 0 {
            return;
        }
        match &mut self.driver {
            Some(driver) => {
                if let Err(e) = driver.reap(self.in_order) {
                    assert!(!self.clean, "{e}");
                    // A hostile ring: the driver starts over where it is.
                    driver.q.abandon_in_flight();
                }
                driver.publish(n % (size + 1));
            }
            None => {
                for _ in 0..n % (size + 1) {
                    let at = self.layout.desc + 16 * u64::from(self.cursor.0) + 14;
                    let flags = read_u16(mem, at) & !(DESC_F_AVAIL | DESC_F_USED);
                    write_u16(mem, at, flags | GuestPackedQueue::avail_bits(self.cursor.1));
                    self.cursor = advance(self.cursor, 1, size);
                }
            }
        }
    }

    /// The device's positions agree with each other: at most the ring in flight, exactly the
    /// descriptors between the used and the available position.
    fn check_positions(&self, s: &Snap, what: &str) {
        assert!(s.in_flight <= u32::from(s.size), "{what}: {s:?}");
        assert_eq!(
            distance(pos(s.next_used), pos(s.next_avail), s.size),
            s.in_flight % (2 * u32::from(s.size)),
            "{what}: {s:?}"
        );
    }

    /// Checks one successful call: positions, the interrupt decision against the driver's
    /// event area, and (clean ring) the driver's view: every used descriptor at its used
    /// position with an id it has in flight, its used position the device's, the device's
    /// in-flight descriptors whole chains the driver made available (`pooled` of them).
    #[allow(clippy::too_many_arguments)]
    fn check_call(
        &mut self,
        mem: &GuestMemoryMmap,
        before: &Snap,
        after: &Snap,
        irqs: Interrupts,
        event_idx: bool,
        pooled: usize,
        what: &str,
    ) {
        self.check_positions(after, what);
        let size = after.size;
        let Interrupts(raised, by_event_idx, by_flag) = irqs;
        assert!(raised + by_event_idx + by_flag <= 1, "{what}: {irqs:?}");
        let flags = read_u16(mem, self.layout.driver_event + 2) & 3;
        match flags {
            EVENT_FLAG_DISABLE => assert_eq!(raised + by_event_idx, 0, "{what}: DISABLE"),
            EVENT_FLAG_DESC if event_idx => assert_eq!(by_flag, 0, "{what}: DESC"),
            _ => assert_eq!(by_event_idx + by_flag, 0, "{what}: ENABLE: {irqs:?}"),
        }
        if !self.clean {
            return;
        }
        let driver = self.driver.as_mut().expect("driver");
        if let Err(e) = driver.reap(self.in_order) {
            panic!("{what}: {e}");
        }
        assert_eq!(
            driver.used(),
            pos(after.next_used),
            "{what}: used positions"
        );
        // The device's in-flight descriptors: the driver's oldest outstanding chains.
        let (mut chains, mut descs) = (0, 0u32);
        for &(_, d) in driver.q.in_flight() {
            if descs + u32::from(d) > after.in_flight {
                break;
            }
            chains += 1;
            descs += u32::from(d);
        }
        assert_eq!(
            (chains, descs),
            (pooled, after.in_flight),
            "{what}: device in flight {after:?} vs the driver's {:?}",
            driver.q.in_flight()
        );
        // Clean ring: this call used at most what was outstanding, less than two laps.
        let used = distance(pos(before.next_used), pos(after.next_used), size);
        if used > 0 {
            assert_eq!(raised + by_event_idx + by_flag, 1, "{what}: no decision");
        }
        if used > 0 && flags == EVENT_FLAG_DESC && event_idx {
            let off_wrap = read_u16(mem, self.layout.driver_event);
            let event = (off_wrap & !EVENT_WRAP_BIT, off_wrap & EVENT_WRAP_BIT != 0);
            if event.0 < size {
                // The driver asked for an interrupt when the used descriptor at `event` is
                // written: the call's used descriptors span [before, after) (a whole ring of
                // them each offset once; more always raises).
                let want =
                    used > u32::from(size) || distance(pos(before.next_used), event, size) < used;
                assert_eq!(
                    raised == 1,
                    want,
                    "{what}: DESC at {event:?}, {before:?} -> {after:?}"
                );
            }
        }
    }
}
