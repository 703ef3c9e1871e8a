//! Transmit: guest tx chains → backend, one `write`/`writev` per frame (or a batch of them in
//! one io_uring submission), no copy.
//!
//! Each chain is the 12-byte `virtio_net_hdr_v1` followed by the Ethernet frame, split across
//! any number of device-readable descriptors. The whole chain goes to the backend as-is (a tap
//! with `IFF_VNET_HDR` consumes the header itself); buffers that follow each other in memory
//! go as one segment. A chain whose frame is empty or longer than [`MAX_FRAME_LEN`] is
//! malformed.

use std::io;

use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, warn};
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

use super::metrics::TxCounters;
use super::rate_limiter::{Limit, QueueLimiter, RateLimiterConfig};
use super::{BurstLog, CountInterrupts, MAX_FRAME_LEN, USED_PUBLISH_BATCH, VNET_HDR_LEN};
use crate::backend::{NetBackend, MAX_TX_BATCH};
use crate::iovec::IovecList;
use crate::virtio::chain::{ChainError, Direction};
use crate::virtio::packed::ChainHead;
use crate::virtio::ring::{AnyRing, InOrder, Ring, RingError};
use crate::virtio::vring::{GuestView, Virtqueue, WalkBudget};

/// Most frames one [`TxQueue::process`] call sends before yielding to other work, unless
/// tuned otherwise ([`TxQueue::set_budget`]).
pub const TX_BUDGET: usize = super::tuning::DEFAULT_TX_BUDGET as usize;

/// Longest tx chain: header + largest frame.
pub const MAX_TX_CHAIN_LEN: u32 = VNET_HDR_LEN as u32 + MAX_FRAME_LEN;

/// Why [`process_tx`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStop {
    /// The driver has nothing more queued (notifications re-enabled, race re-checked).
    Drained,
    /// The driver has nothing more queued and notifications stay disabled ([`TxQueue::poll`]):
    /// the caller busy-polls [`Virtqueue::avail_pending`], then calls [`TxQueue::process`] to
    /// re-enable them before it sleeps.
    Idle,
    /// The backend would block; the unsent chain is still queued. Call again once the backend
    /// is writable.
    BackendFull,
    /// The budget of frames was sent and more may be queued. Call again soon: the driver will
    /// not notify for them (notifications stay disabled).
    Budget,
    /// The rate limiter stops the queue for this long; chains stay queued (notifications stay
    /// disabled). Call again once it has passed.
    Throttled(Duration),
}

/// What [`process_tx`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxOutcome {
    /// Used buffers were returned and the driver wants an interrupt for them.
    pub needs_interrupt: bool,
    /// Used buffers were returned but the driver's `used_event` (EVENT_IDX) said it does not
    /// want an interrupt yet (a device may still send one).
    pub suppressed_by_event_idx: bool,
    /// Why processing stopped.
    pub stop: TxStop,
}

/// A transmit queue for one activation: the ring and the scatter-gather storage reused by
/// every call (the datapath allocates nothing per frame or per call).
#[derive(Debug)]
pub struct TxQueue {
    /// The ring; `None` while the queue is reset (VIRTIO_F_RING_RESET).
    vq: Option<AnyRing>,
    /// VIRTIO_F_IN_ORDER: the chains a call completes go back in one used entry per
    /// publication.
    in_order: bool,
    scratch: Vec<libc::iovec>,
    /// Backend write failures, logged once per burst.
    errors: BurstLog,
    /// The device's name in log lines.
    label: Arc<str>,
    /// The tx rate limiter (disabled: no clock is read).
    limiter: QueueLimiter,
    /// Frames per call.
    budget: usize,
    /// The batch being built for a batching backend (kept across calls: nothing to
    /// initialise per call), on a split ring and on a packed one.
    batch: Box<Pending<u16>>,
    packed_batch: Box<Pending<ChainHead>>,
    /// Buffers the driver may queue past a drained ring before it kicks (kick coalescing;
    /// 0: the next one kicks).
    kick_ahead: u16,
}

impl TxQueue {
    /// A transmit queue over `vq` (a split [`Virtqueue`] or an [`AnyRing`]).
    pub fn new(vq: impl Into<AnyRing>) -> TxQueue {
        TxQueue {
            vq: Some(vq.into()),
            in_order: false,
            scratch: Vec::with_capacity(64),
            errors: BurstLog::default(),
            label: Arc::from("virtio-net"),
            limiter: QueueLimiter::default(),
            budget: TX_BUDGET,
            batch: Box::new(Pending::new()),
            packed_batch: Box::new(Pending::new()),
            kick_ahead: 0,
        }
    }

    /// VIRTIO_F_IN_ORDER negotiated: each publication returns the chains completed since the
    /// previous one in a single used entry carrying the last buffer's id (split: one used
    /// element, the used index moved past them all; packed: one used descriptor).
    pub fn set_in_order(&mut self, on: bool) {
        self.in_order = on;
    }

    /// Kick coalescing (EVENT_IDX only): when a call drains the ring, the driver may queue
    /// `frames` buffers past it without a kick, the next one kicking (at most the queue size
    /// less one), instead of kicking at the next one. The caller then owes the ring a look of
    /// its own for fewer (a timer); 0, the default, asks for a kick at the next buffer.
    pub fn set_kick_ahead(&mut self, frames: u16) {
        self.kick_ahead = frames;
    }

    /// Frames one call sends at most (at least 1).
    pub fn set_budget(&mut self, frames: usize) {
        self.budget = frames.max(1);
    }

    /// Replaces the rate limiter (full buckets).
    pub fn set_rate_limiter(&mut self, config: &RateLimiterConfig) {
        self.limiter.set(config);
    }

    /// Names the device in this queue's log lines.
    pub fn with_label(mut self, label: Arc<str>) -> TxQueue {
        self.label = label;
        self
    }

    /// The split ring (`None` while detached, or on a packed ring).
    pub fn virtqueue(&self) -> Option<&Virtqueue> {
        self.vq.as_ref().and_then(AnyRing::split_ring)
    }

    /// The ring, of either kind (`None` while detached).
    pub fn ring(&self) -> Option<&AnyRing> {
        self.vq.as_ref()
    }

    /// Whether the driver has queued frames not taken yet (false while detached).
    pub fn avail_pending(&self) -> bool {
        self.vq.as_ref().is_some_and(AnyRing::avail_pending)
    }

    /// Per-queue reset: stops using the ring and forgets its host pointers. Every call
    /// publishes its used entries before it returns, so what was sent is already the driver's;
    /// a chain left queued (backend full) was not sent and goes back to the driver with the
    /// ring. Until [`TxQueue::attach`], [`TxQueue::process`] does nothing. The budget and the
    /// rate limiter (and its bucket levels) stay.
    pub fn detach(&mut self) {
        self.vq = None;
    }

    /// Uses `vq` (the queue enabled again after its reset).
    pub fn attach(&mut self, vq: impl Into<AnyRing>) {
        self.vq = Some(vq.into());
    }

    /// False between [`TxQueue::detach`] and [`TxQueue::attach`].
    pub fn is_attached(&self) -> bool {
        self.vq.is_some()
    }

    /// Sends the frames the driver queued to `backend` (nothing while detached: `Drained`).
    ///
    /// Malformed chains are returned with length 0 and counted; the driver's notifications are
    /// disabled while the queue is drained. Used entries are published every
    /// [`USED_PUBLISH_BATCH`] frames and at the end, with one interrupt decision per call. The
    /// work is bounded by [`TX_BUDGET`] frames and by the descriptors visited. An error means
    /// the ring itself is broken (the device must be marked NEEDS_RESET).
    pub fn process<B: NetBackend>(
        &mut self,
        backend: &mut B,
        counters: &mut TxCounters,
    ) -> Result<TxOutcome, RingError> {
        self.run(backend, counters, false)
    }

    /// As [`TxQueue::process`], but when the ring is empty the driver's notifications stay
    /// disabled and the call returns [`TxStop::Idle`]: for a busy-polling caller, which must
    /// end its polling with a [`TxQueue::process`] call.
    pub fn poll<B: NetBackend>(
        &mut self,
        backend: &mut B,
        counters: &mut TxCounters,
    ) -> Result<TxOutcome, RingError> {
        self.run(backend, counters, true)
    }

    /// [`TxQueue::process`] (`park` false) or [`TxQueue::poll`] (`park` true); the worker
    /// calls it directly.
    pub(crate) fn run<B: NetBackend>(
        &mut self,
        backend: &mut B,
        counters: &mut TxCounters,
        park: bool,
    ) -> Result<TxOutcome, RingError> {
        let TxQueue {
            vq,
            in_order,
            scratch,
            errors,
            label,
            limiter,
            budget,
            batch,
            packed_batch,
            kick_ahead,
        } = self;
        let Some(vq) = vq.as_mut() else {
            return Ok(TxOutcome {
                needs_interrupt: false,
                suppressed_by_event_idx: false,
                stop: TxStop::Drained,
            });
        };
        let mut out = Sink {
            backend,
            counters,
            errors,
            label,
            limit: limiter.for_call(),
        };
        let mut call = Call {
            budget: WalkBudget::per_call(),
            sent: 0,
            frames: *budget,
            park,
            kick_ahead: *kick_ahead,
        };
        // The ring kind and IN_ORDER are picked once per call; below, each has its own code.
        match vq {
            AnyRing::Split(vq) => {
                let (guest, mut ring) = vq.split();
                if *in_order {
                    let mut ring = InOrder::new(&mut ring);
                    run_on(&guest, &mut ring, scratch, &mut out, batch, &mut call)
                } else {
                    run_on(&guest, &mut ring, scratch, &mut out, batch, &mut call)
                }
            }
            AnyRing::Packed(vq) => {
                let (guest, mut ring) = vq.split();
                if *in_order {
                    let mut ring = InOrder::new(&mut ring);
                    run_on(
                        &guest,
                        &mut ring,
                        scratch,
                        &mut out,
                        packed_batch,
                        &mut call,
                    )
                } else {
                    run_on(
                        &guest,
                        &mut ring,
                        scratch,
                        &mut out,
                        packed_batch,
                        &mut call,
                    )
                }
            }
        }
    }
}

/// One [`TxQueue::run`] call on `ring`: frame by frame, or in batches for a batching backend
/// (`pending`), then one publication and one interrupt decision.
#[inline(always)]
fn run_on<'g, B: NetBackend, R: Ring>(
    guest: &GuestView<'g>,
    ring: &mut R,
    scratch: &mut Vec<libc::iovec>,
    out: &mut Sink<'_, B>,
    pending: &mut Pending<R::Head>,
    call: &mut Call,
) -> Result<TxOutcome, RingError> {
    let mut iovs = IovecList::reuse(std::mem::take(scratch));
    // Batches need the whole batch paid at once; a rate limiter charges frame by frame.
    let batch = if out.limit.is_active() {
        1
    } else {
        out.backend.tx_batch().min(MAX_TX_BATCH)
    };
    let result = if batch > 1 {
        // While fewer frames are queued than a batch is worth, they go one by one
        // (building a batch costs ~30 ns per call); once that many are queued, in batches.
        let min = out.backend.tx_batch_min();
        let handed_over = if !ring.pending_at_least(min) {
            drain::<B, R, false>(guest, ring, &mut iovs, out, call, min)
        } else {
            Ok(None)
        };
        match handed_over {
            Ok(None) => {
                pending.cap = batch;
                drain_batched(guest, ring, &mut iovs, out, pending, call)
            }
            Ok(Some(stop)) => Ok(stop),
            Err(e) => Err(e),
        }
    } else {
        // A limiter pays frame by frame; the path without one carries none of it.
        let (g, i) = (guest, &mut iovs);
        if out.limit.is_active() {
            drain::<B, R, true>(g, ring, i, out, call, usize::MAX)
        } else {
            drain::<B, R, false>(g, ring, i, out, call, usize::MAX)
        }
        .map(|stop| stop.unwrap_or(TxStop::Budget))
    };
    ring.publish_used();
    *scratch = iovs.into_storage();
    let stop = result?;
    let (needs_interrupt, suppressed_by_event_idx) =
        out.counters.count_interrupt(ring.interrupt_decision());
    Ok(TxOutcome {
        needs_interrupt,
        suppressed_by_event_idx,
        stop,
    })
}

/// Where one call's frames go, and what it counts and logs on the way.
struct Sink<'a, B> {
    backend: &'a mut B,
    counters: &'a mut TxCounters,
    errors: &'a mut BurstLog,
    label: &'a str,
    limit: Limit<'a>,
}

/// One call's limits and progress, shared by [`drain`] and [`drain_batched`] when the first
/// hands over to the second.
struct Call {
    budget: WalkBudget,
    /// Chains returned so far.
    sent: usize,
    /// Most chains the call returns.
    frames: usize,
    park: bool,
    /// [`TxQueue::set_kick_ahead`].
    kick_ahead: u16,
}

/// Sends frame by frame. `Ok(None)`: `hand_over` frames are known to be queued (the caller
/// goes on in batches); else why the call stops. `LIMITED`: the call has a rate limiter to
/// consult and charge (a constant, so that the path without one carries none of it).
fn drain<'g, B: NetBackend, R: Ring, const LIMITED: bool>(
    guest: &GuestView<'g>,
    ring: &mut R,
    iovs: &mut IovecList<'g>,
    out: &mut Sink<'_, B>,
    call: &mut Call,
    hand_over: usize,
) -> Result<Option<TxStop>, RingError> {
    let Sink {
        backend,
        counters,
        errors,
        label,
        limit,
    } = out;
    let budget = &mut call.budget;
    ring.disable_notification();
    loop {
        if call.sent == call.frames || budget.exhausted() {
            return Ok(Some(TxStop::Budget));
        }
        if LIMITED {
            if let Some(blocked) = limit.blocked() {
                counters.throttled(blocked);
                return Ok(Some(TxStop::Throttled(blocked.wait)));
            }
        }
        let Some(head) = ring.pop_head()? else {
            match ran_dry(ring, budget, call.park, call.kick_ahead) {
                Some(stop) => return Ok(Some(stop)),
                None => continue,
            }
        };
        if ring.known_pending_at_least(hand_over.saturating_sub(1)) {
            // A batch's worth is queued (counting this one): batches from here on.
            ring.unpop(&head, 1);
            return Ok(None);
        }
        iovs.clear();
        match ring.walk_chain(
            guest,
            &head,
            Direction::DeviceReads,
            MAX_TX_CHAIN_LEN,
            iovs,
            budget,
        ) {
            Ok(len) if len as usize > VNET_HDR_LEN => {
                // The next frame's lines, for a backend that copies them: warming them for one
                // that does not only takes them from the driver's cache, which then writes them
                // again a ring's lap later.
                if B::READS_PAYLOAD {
                    ring.prefetch_ahead(guest);
                }
                match backend.write_frame(iovs.as_iovecs()) {
                    Ok(_) => {
                        let bytes = u64::from(len) - VNET_HDR_LEN as u64;
                        count_sent(counters, bytes);
                        if LIMITED && limit.charge(bytes) {
                            counters.rate_limiter_bytes += bytes;
                            counters.rate_limiter_frames += 1;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        ring.unpop(&head, 1);
                        counters.backend_full += 1;
                        return Ok(Some(TxStop::BackendFull));
                    }
                    Err(e) => count_refused(counters, errors, label, &e),
                }
            }
            walked => malformed(counters, label, head, walked),
        }
        ring.add_used(head, 0);
        call.sent += 1;
        if call.sent.is_multiple_of(USED_PUBLISH_BATCH) {
            ring.publish_used();
        }
    }
}

/// The frames walked but not yet handed to the backend: chain heads and where each frame's
/// iovecs end in the call's list.
#[derive(Debug)]
struct Pending<H> {
    heads: [H; MAX_TX_BATCH],
    ends: [usize; MAX_TX_BATCH],
    bytes: [u64; MAX_TX_BATCH],
    /// The backend's answer per frame.
    results: [io::Result<usize>; MAX_TX_BATCH],
    len: usize,
    /// Frames per batch (2..=MAX_TX_BATCH).
    cap: usize,
}

impl<H: Copy + Default> Pending<H> {
    /// Adds a walked frame: its chain, where its iovecs end, its Ethernet bytes.
    #[inline(always)]
    fn push(&mut self, head: H, end: usize, bytes: u64) {
        let i = self.len;
        self.heads[i] = head;
        self.ends[i] = end;
        self.bytes[i] = bytes;
        self.len += 1;
    }

    fn new() -> Pending<H> {
        Pending {
            heads: [H::default(); MAX_TX_BATCH],
            ends: [0; MAX_TX_BATCH],
            bytes: [0; MAX_TX_BATCH],
            results: std::array::from_fn(|_| Ok(0)),
            len: 0,
            cap: MAX_TX_BATCH,
        }
    }
}

/// [`drain`] for a backend that writes several frames per call ([`NetBackend::tx_batch`]):
/// chains are walked into one list and handed over `pending.cap` frames at a time (and
/// whenever the ring runs dry, the budget ends or a malformed chain comes). Same results as
/// [`drain`]: every frame sent or counted in order, and a backend that would block gets the unsent frames
/// back in the ring, in order. Used entries are published after each batch.
fn drain_batched<'g, B: NetBackend, R: Ring>(
    guest: &GuestView<'g>,
    ring: &mut R,
    iovs: &mut IovecList<'g>,
    out: &mut Sink<'_, B>,
    pending: &mut Pending<R::Head>,
    call: &mut Call,
) -> Result<TxStop, RingError> {
    let (budget, sent) = (&mut call.budget, &mut call.sent);
    pending.len = 0;
    iovs.clear();
    ring.disable_notification();
    loop {
        if *sent + pending.len == call.frames || budget.exhausted() {
            if let Some(stop) = flush(ring, iovs, pending, out, sent) {
                return Ok(stop);
            }
            return Ok(TxStop::Budget);
        }
        if pending.len == 0 {
            // A new batch: its descriptors' lines are requested together.
            ring.prefetch_descriptors(pending.cap as u16);
        }
        let Some(head) = ring.pop_head()? else {
            if pending.len > 0 {
                if let Some(stop) = flush(ring, iovs, pending, out, sent) {
                    return Ok(stop);
                }
                // More may have come while the batch was written.
                continue;
            }
            match ran_dry(ring, budget, call.park, call.kick_ahead) {
                Some(stop) => return Ok(stop),
                None => continue,
            }
        };
        let walked = ring.walk_chain(
            guest,
            &head,
            Direction::DeviceReads,
            MAX_TX_CHAIN_LEN,
            iovs,
            budget,
        );
        match walked {
            Ok(len) if len as usize > VNET_HDR_LEN => {
                let i = pending.len;
                // The kernel copies the frame once the batch is submitted, a few µs from now:
                // its lines (the driver's CPU wrote them) are requested now.
                iovs.prefetch_from(if i == 0 { 0 } else { pending.ends[i - 1] });
                pending.push(head, iovs.len(), u64::from(len) - VNET_HDR_LEN as u64);
                // Keep the list well inside MAX_IOVECS so that a long chain never fails for
                // the frames before it.
                if pending.len == pending.cap || iovs.len() > crate::iovec::MAX_IOVECS / 2 {
                    if let Some(stop) = flush(ring, iovs, pending, out, sent) {
                        return Ok(stop);
                    }
                }
            }
            _ if pending.len > 0 => {
                // Judge this chain alone, as `drain` would, once the frames before it are out
                // (it may only have failed for their iovecs); it stays the last popped head,
                // so a backend that blocks can put every unsent frame back in order.
                iovs.truncate(pending.ends[pending.len - 1]);
                ring.unpop(&head, 1);
                if let Some(stop) = flush(ring, iovs, pending, out, sent) {
                    return Ok(stop);
                }
            }
            walked => {
                // Nothing is pending: the list holds only what this chain's walk left.
                malformed(out.counters, out.label, head, walked);
                iovs.clear();
                ring.add_used(head, 0);
                *sent += 1;
            }
        }
    }
}

/// Counts and logs a chain that holds no frame (`Ok`: its length) or that the walk refused.
#[cold]
fn malformed<H: std::fmt::Debug>(
    counters: &mut TxCounters,
    label: &str,
    head: H,
    walked: Result<u32, ChainError>,
) {
    match walked {
        Ok(len) => debug!("virtio-net {label} tx: chain {head:?} of {len} bytes holds no frame"),
        Err(e) => debug!("virtio-net {label} tx: chain {head:?} refused: {e}"),
    }
    counters.malformed_chains += 1;
}

/// Hands the pending frames to the backend, returns their chains (publishing them), and
/// counts. `Some(BackendFull)` when the backend would block: the frames from the first one
/// that would block on are put back in the ring, unless a later one was taken (the backend
/// had room again), in which case each blocked frame is tried once more on its own and
/// dropped (counted as a backend error) if it still would block.
fn flush<B: NetBackend, R: Ring>(
    ring: &mut R,
    iovs: &mut IovecList<'_>,
    pending: &mut Pending<R::Head>,
    out: &mut Sink<'_, B>,
    sent: &mut usize,
) -> Option<TxStop> {
    let n = std::mem::take(&mut pending.len);
    if n == 0 {
        return None;
    }
    let results = &mut pending.results;
    if n == 1 {
        // A lone frame (the ring ran dry after it): no batch to build.
        results[0] = out.backend.write_frame(iovs.as_iovecs());
    } else {
        out.backend
            .write_frames(iovs, &pending.ends[..n], &mut results[..n]);
        out.counters.batched_writes += 1;
    }
    let would_block = |r: &io::Result<usize>| {
        r.as_ref()
            .is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock)
    };
    // Frames `..keep` are done (sent or dropped); `keep..n` go back to the ring.
    let keep = match results[..n].iter().position(would_block) {
        Some(j) if results[j..n].iter().all(would_block) => j,
        _ => n,
    };
    let mut start = 0;
    for (i, slot) in results[..keep].iter_mut().enumerate() {
        let mut result = std::mem::replace(slot, Ok(0));
        if would_block(&result) {
            out.counters.backend_full += 1;
            result = out.backend.write_frame(iovs.range(start, pending.ends[i]));
        }
        start = pending.ends[i];
        match result {
            Ok(_) => count_sent(out.counters, pending.bytes[i]),
            Err(e) => count_refused(out.counters, out.errors, out.label, &e),
        }
        ring.add_used(pending.heads[i], 0);
    }
    *sent += keep;
    ring.publish_used();
    iovs.clear();
    if keep < n {
        // `keep..n` are the last heads popped (nothing is popped after a batch is pending).
        ring.unpop(&pending.heads[keep], (n - keep) as u16);
        out.counters.backend_full += 1;
        return Some(TxStop::BackendFull);
    }
    None
}

/// The ring had nothing more: with `park` the notifications stay off ([`TxStop::Idle`]);
/// else publish, re-enable them and re-check the standard race (the driver may have queued
/// more just before): `None` when it did (notifications off again, go on), else
/// [`TxStop::Drained`]. Publishing first lets the enable's fence also order the used-index
/// store before the interrupt decision reads `used_event`: one fence per call instead of two.
fn ran_dry<R: Ring>(
    ring: &mut R,
    budget: &mut WalkBudget,
    park: bool,
    kick_ahead: u16,
) -> Option<TxStop> {
    if park {
        // The decision fences itself.
        ring.publish_used();
        return Some(TxStop::Idle);
    }
    budget.charge(1);
    ring.publish_used();
    if ring.enable_notification_ahead(kick_ahead) {
        ring.disable_notification();
        return None;
    }
    Some(TxStop::Drained)
}

/// A frame of `bytes` (Ethernet, header excluded) went to the backend.
fn count_sent(counters: &mut TxCounters, bytes: u64) {
    counters.frames += 1;
    counters.bytes += bytes;
    counters.large_frames += u64::from(bytes > super::MTU_FRAME_LEN);
}

/// The backend refused a frame: it is dropped, counted, and logged once per burst.
fn count_refused(counters: &mut TxCounters, errors: &mut BurstLog, label: &str, e: &io::Error) {
    if let Some(more) = errors.failure(Instant::now()) {
        warn!(
            "virtio-net {label} tx: the backend refused a frame: {e} ({more} more since the last \
             report; frames are dropped until it recovers)"
        );
    }
    counters.backend_errors += 1;
}

/// Sends the frames the driver queued on `queue` to `backend`: one [`TxQueue::process`] call
/// on a queue built for it, with the ring positions written back to `queue`. For tests,
/// fuzzers and one-off callers; the worker keeps a [`TxQueue`] for the whole activation.
pub fn process_tx<B: NetBackend>(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    backend: &mut B,
    counters: &mut TxCounters,
) -> Result<TxOutcome, RingError> {
    let mut txq = TxQueue::new(Virtqueue::new(queue, mem)?);
    let result = txq.process(backend, counters);
    if let Some(AnyRing::Split(vq)) = &txq.vq {
        vq.sync_to(queue);
    }
    result
}
