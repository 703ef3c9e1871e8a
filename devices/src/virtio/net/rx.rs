//! Receive: backend → guest rx buffers, one `readv` per frame straight into guest memory.
//!
//! The backend cannot tell a frame's length before it is read, so the buffers must be in place
//! first. [`process_rx`] keeps a small pool of popped, validated rx chains:
//! - without MRG_RXBUF ([`RxMode::SingleChain`]) a frame is read into the first chain alone;
//! - with MRG_RXBUF ([`RxMode::Mergeable`]) it is read across as many chains as are needed
//!   (the pool holds up to one maximal frame's worth), `num_buffers` says how many were used,
//!   and the chains left over stay in the pool for the next frame.
//!
//! The worker's [`RxQueue`] keeps the pool across calls: the device holds a frame's worth of
//! buffers ahead (as vhost-net and hardware NICs do) and a call that delivers one frame pops
//! about one chain. The one-shot [`process_rx`] hands the chains still pooled back to the avail
//! ring (un-popped) at the end, so nothing is lost and nothing is kept. A frame larger than the
//! buffers offered is truncated by the backend: it is dropped and counted, and the buffers are
//! reused.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use log::debug;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

use super::metrics::RxCounters;
use super::rate_limiter::{Limit, QueueLimiter, RateLimiterConfig};
use super::{CountInterrupts, MAX_FRAME_LEN, USED_PUBLISH_BATCH, VNET_HDR_LEN};
use crate::backend::NetBackend;
use crate::iovec::{IovecList, Iovecs, MAX_IOVECS};
use crate::virtio::chain::Direction;
use crate::virtio::packed::ChainHead;
use crate::virtio::ring::{AnyRing, InterruptDecision, Ring, RingError};
use crate::virtio::vring::{GuestView, Virtqueue, WalkBudget};

/// Most frames one [`RxQueue::process`] call reads before yielding to other work.
pub const RX_BUDGET: usize = 256;

/// Chains a fill pops at most in one-chain-per-frame mode.
const RX_FILL_CHAINS: usize = 32;

/// Buffer space gathered before each read in mergeable mode: header + the largest frame a
/// backend hands over (64 KiB GSO payload plus Ethernet and VLAN headers).
pub const RX_GATHER_BYTES: u64 = VNET_HDR_LEN as u64 + MAX_FRAME_LEN as u64 + 18;

/// Buffer space gathered before each read in mergeable mode when the guest accepts no GSO
/// frames: header + a jumbo frame (9216-byte MTU, Ethernet and VLAN headers).
pub const RX_GATHER_NO_GSO_BYTES: u64 = VNET_HDR_LEN as u64 + 9216 + 18;

/// In sparse-read mode, one call in this many still reads until the backend is empty, so that
/// a burst is noticed (and the mode left) within this many frames.
pub const SPARSE_PROBE_EVERY: u8 = 32;

/// Offset of `num_buffers` in `virtio_net_hdr_v1`.
const NUM_BUFFERS_OFFSET: usize = 10;

/// How a received frame may use rx buffers (from VIRTIO_NET_F_MRG_RXBUF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxMode {
    /// MRG_RXBUF negotiated: a frame may span several chains.
    Mergeable,
    /// One chain per frame; the driver posts chains big enough for any frame.
    SingleChain,
}

impl RxMode {
    /// The mode the negotiated features call for.
    pub fn from_features(acked: u64) -> RxMode {
        if acked & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0 {
            RxMode::Mergeable
        } else {
            RxMode::SingleChain
        }
    }
}

/// Why [`process_rx`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxStop {
    /// The backend has no frame pending.
    BackendEmpty,
    /// The driver has no rx buffer posted. Guest notifications are enabled: stop polling the
    /// backend until the driver kicks the rx queue.
    NoBuffers,
    /// The driver has no rx buffer posted and its notifications stay off (a busy-polling
    /// caller's `park`): the caller watches the avail ring itself, and ends its polling with a
    /// call without `park` (which re-enables them, re-checking the race).
    Parked,
    /// [`RX_BUDGET`] frames were read; the backend may have more.
    Budget,
    /// One frame was read and the call stopped without the read that would find the backend
    /// empty (sparse traffic, see [`RxQueue::set_sparse_reads`]); the backend may have more,
    /// which a level-triggered poll of its fd reports.
    Yielded,
    /// The backend reached end of file (its peer went away).
    BackendClosed,
    /// Reading the backend failed (counted in `backend_errors`).
    BackendFailed,
    /// The rate limiter stops the queue for this long: stop reading the backend (the kernel
    /// holds or drops per its queue) until it has passed.
    Throttled(Duration),
}

/// What [`process_rx`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxOutcome {
    /// Used buffers were returned and the driver wants an interrupt for them.
    pub needs_interrupt: bool,
    /// Used buffers were returned but the driver's `used_event` (EVENT_IDX) said it does not
    /// want an interrupt yet (a device may still send one).
    pub suppressed_by_event_idx: bool,
    /// Why processing stopped.
    pub stop: RxStop,
}

/// A receive queue for one activation: the ring and the pool of rx chains popped ahead of the
/// frames, kept across calls.
#[derive(Debug)]
pub struct RxQueue {
    /// The ring; `None` while the queue is reset (VIRTIO_F_RING_RESET).
    vq: Option<AnyRing>,
    mode: RxMode,
    /// Buffer bytes gathered before a read in mergeable mode: what one frame can need.
    gather: u64,
    /// The pool on a split ring, and on a packed one (the other stays empty).
    pool: PoolState<u16>,
    packed_pool: PoolState<ChainHead>,
    /// The device's name in log lines.
    label: Arc<str>,
    /// The rx rate limiter (disabled: no clock is read).
    limiter: QueueLimiter,
    sparse: SparseReads,
    /// VIRTIO_F_IN_ORDER negotiated: chains are returned in the order they were popped, a
    /// refused one included.
    in_order: bool,
}

/// Whether a call may stop after one frame instead of reading again to find the backend empty.
///
/// Draining a backend until `EAGAIN` costs one failed system call per call (~370 ns on a tap,
/// `docs/benchmarks.md`): nothing next to a burst, but as much as the frame's own read when
/// frames come one per wake-up, as in request/response traffic. When the last call that read
/// until empty found exactly one frame, the calls that follow read one frame and stop
/// ([`RxStop::Yielded`]); a level-triggered poll of the backend fd brings the worker back if
/// more is queued. Every [`SPARSE_PROBE_EVERY`]th call still reads until empty: one that finds
/// more than one frame (or spends its budget) ends the mode.
#[derive(Debug, Default)]
struct SparseReads {
    /// The caller polls the backend level-triggered (off: every call reads until empty).
    enabled: bool,
    /// The last call that read until empty found one frame.
    sparse: bool,
    /// Calls made in the mode, modulo [`SPARSE_PROBE_EVERY`].
    calls: u8,
}

impl SparseReads {
    /// Whether this call stops after its first frame.
    fn skip_probe(&mut self) -> bool {
        if !self.sparse {
            return false;
        }
        self.calls += 1;
        if self.calls == SPARSE_PROBE_EVERY {
            self.calls = 0;
            return false;
        }
        true
    }

    /// Learns from a call that made `reads` backend reads (the last one included).
    fn after(&mut self, stop: RxStop, reads: usize) {
        match stop {
            // One frame, then the read that found the backend empty.
            RxStop::BackendEmpty if reads == 2 => self.sparse = self.enabled,
            // A burst: drain it whole from now on.
            RxStop::BackendEmpty if reads > 2 => self.sparse = false,
            RxStop::Budget => self.sparse = false,
            _ => {}
        }
    }
}

impl RxQueue {
    /// A receive queue over `vq`. In mergeable mode a read is posted over at least
    /// `max_frame` bytes of buffers (header included) when the driver has them: the largest
    /// frame the backend can hand over for the negotiated offloads.
    pub fn new(vq: impl Into<AnyRing>, mode: RxMode, max_frame: u64) -> RxQueue {
        RxQueue {
            vq: Some(vq.into()),
            mode,
            gather: max_frame,
            pool: PoolState::default(),
            packed_pool: PoolState::default(),
            label: Arc::from("virtio-net"),
            limiter: QueueLimiter::default(),
            sparse: SparseReads::default(),
            in_order: false,
        }
    }

    /// VIRTIO_F_IN_ORDER negotiated (or not): a driver then reads a used entry as returning
    /// every chain made available before it, so a chain refused while chains popped before it
    /// are still pooled waits until they are used (otherwise it is returned at once).
    pub fn set_in_order(&mut self, on: bool) {
        self.in_order = on;
    }

    /// Lets calls stop after one frame when traffic comes one frame at a time, skipping the
    /// read that would find the backend empty: after a call that read until empty and found
    /// exactly one frame, calls read one frame and return [`RxStop::Yielded`]; every
    /// [`SPARSE_PROBE_EVERY`]th call still reads until empty, and one that finds more than one
    /// frame ends the mode. Only for a caller that polls the backend fd level-triggered (as the
    /// worker does), so that a frame left queued is reported; without it (the default) every
    /// call reads until the backend is empty.
    /// Setting the value in force changes nothing.
    pub fn set_sparse_reads(&mut self, enabled: bool) {
        if self.sparse.enabled == enabled {
            return;
        }
        self.sparse = SparseReads {
            enabled,
            ..SparseReads::default()
        };
    }

    /// Replaces the rate limiter (full buckets).
    pub fn set_rate_limiter(&mut self, config: &RateLimiterConfig) {
        self.limiter.set(config);
    }

    /// Names the device in this queue's log lines.
    pub fn with_label(mut self, label: Arc<str>) -> RxQueue {
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

    /// Whether the driver has posted buffers not taken yet (false while detached).
    pub fn avail_pending(&self) -> bool {
        self.vq.as_ref().is_some_and(AnyRing::avail_pending)
    }

    /// Per-queue reset: stops using the ring, drops the pool and forgets the ring's host
    /// pointers. Every call publishes its used entries before it returns, so each frame
    /// delivered is already the driver's; the pooled chains are dropped without a used entry
    /// (the reset hands every buffer of the ring back to the driver), so none is ever filled
    /// once the queue is reset. Until [`RxQueue::attach`], [`RxQueue::process`] does nothing.
    /// The rate limiter (and its bucket levels) stays. Returns how many chains were pooled.
    pub fn detach(&mut self) -> usize {
        let pooled = self.pooled_chains();
        self.pool = PoolState::default();
        self.packed_pool = PoolState::default();
        self.vq = None;
        pooled
    }

    /// Hands the chains pooled ahead of frames back to the avail ring, so that the ring's
    /// position is where the driver's next unfilled buffer is (a pause: vhost-user's
    /// GET_VRING_BASE, a snapshot). Returns how many chains went back.
    pub fn give_back(&mut self) -> usize {
        let pooled = self.pooled_chains();
        let count = u16::try_from(pooled).unwrap_or(u16::MAX);
        match self.vq.as_mut() {
            Some(AnyRing::Split(vq)) => {
                if let Some(first) = self.pool.chains.get(self.pool.first) {
                    Ring::unpop(&mut vq.split().1, &first.head, count);
                }
            }
            Some(AnyRing::Packed(vq)) => {
                if let Some(first) = self.packed_pool.chains.get(self.packed_pool.first) {
                    Ring::unpop(&mut vq.split().1, &first.head, count);
                }
            }
            None => {}
        }
        self.pool = PoolState::default();
        self.packed_pool = PoolState::default();
        pooled
    }

    /// Uses `vq` (the queue enabled again after its reset), with an empty pool.
    pub fn attach(&mut self, vq: impl Into<AnyRing>) {
        self.pool = PoolState::default();
        self.packed_pool = PoolState::default();
        self.vq = Some(vq.into());
    }

    /// False between [`RxQueue::detach`] and [`RxQueue::attach`].
    pub fn is_attached(&self) -> bool {
        self.vq.is_some()
    }

    /// Chains popped and waiting for frames.
    pub fn pooled_chains(&self) -> usize {
        self.pool.unused() + self.packed_pool.unused()
    }

    /// Moves frames from `backend` into the rx buffers the driver posted (nothing while
    /// detached: `NoBuffers`).
    ///
    /// Chains are popped ahead of the frames and kept in a pool across calls, so a call that
    /// delivers one frame pops about one chain. Used entries are published every
    /// [`USED_PUBLISH_BATCH`] frames and at the end, with one interrupt decision per call. The
    /// work is bounded by [`RX_BUDGET`] reads and by the descriptors visited. An error means the
    /// ring itself is broken (the device must be marked NEEDS_RESET).
    pub fn process<B: NetBackend>(
        &mut self,
        backend: &mut B,
        counters: &mut RxCounters,
    ) -> Result<RxOutcome, RingError> {
        self.run::<B, false>(backend, counters, false)
    }

    /// [`RxQueue::process`] with `GIVE_BACK` false; the worker calls it directly. `GIVE_BACK`:
    /// hand the chains still pooled back to the avail ring at the end (the one-shot
    /// [`process_rx`]); a constant, so the worker's path carries none of it. `park`: out of
    /// buffers, leave the driver's notifications off ([`RxStop::Parked`]).
    pub(crate) fn run<B: NetBackend, const GIVE_BACK: bool>(
        &mut self,
        backend: &mut B,
        counters: &mut RxCounters,
        park: bool,
    ) -> Result<RxOutcome, RingError> {
        let Some(vq) = self.vq.as_mut() else {
            return Ok(RxOutcome {
                needs_interrupt: false,
                suppressed_by_event_idx: false,
                stop: RxStop::NoBuffers,
            });
        };
        let mut limit = self.limiter.for_call();
        let skip_probe = self.sparse.skip_probe();
        let mut reads = 0;
        let sides = Sides {
            mode: self.mode,
            gather: self.gather,
            keep_order: GIVE_BACK || self.in_order,
            backend,
            counters,
            label: &self.label,
            limit: &mut limit,
            skip_probe,
            park,
            reads: &mut reads,
        };
        // The ring kind is picked once per call; below, each has its own code.
        let result = match vq {
            AnyRing::Split(vq) => {
                let (guest, mut ring) = vq.split();
                sides.run::<_, GIVE_BACK>(&guest, &mut ring, &mut self.pool)
            }
            AnyRing::Packed(vq) => {
                let (guest, mut ring) = vq.split();
                sides.run::<_, GIVE_BACK>(&guest, &mut ring, &mut self.packed_pool)
            }
        };
        let (stop, decision) = result?;
        self.sparse.after(stop, reads);
        let (needs_interrupt, suppressed_by_event_idx) = counters.count_interrupt(decision);
        Ok(RxOutcome {
            needs_interrupt,
            suppressed_by_event_idx,
            stop,
        })
    }
}

/// What one [`RxQueue::run`] call needs besides the ring and its pool.
struct Sides<'c, 'l, B> {
    mode: RxMode,
    gather: u64,
    /// The pool's chains stay the tail of what was popped (see `RxPool::refuse`).
    keep_order: bool,
    backend: &'c mut B,
    counters: &'c mut RxCounters,
    label: &'c str,
    limit: &'c mut Limit<'l>,
    skip_probe: bool,
    park: bool,
    reads: &'c mut usize,
}

impl<'c, B: NetBackend> Sides<'c, '_, B> {
    /// The call on `ring` with its pool `state`: the loop for the mode and limiter, then one
    /// publication and the interrupt decision.
    #[inline(always)]
    fn run<R: Ring, const GIVE_BACK: bool>(
        self,
        guest: &GuestView<'_>,
        ring: &mut R,
        state: &mut PoolState<R::Head>,
    ) -> Result<(RxStop, Option<InterruptDecision>), RingError> {
        // The mode and whether a limiter is configured are constants of the loop below, so
        // that each case carries only its own code.
        let mut call = Call {
            guest,
            state,
            gather: self.gather,
            keep_order: self.keep_order,
            backend: self.backend,
            counters: self.counters,
            label: self.label,
            limit: self.limit,
            skip_probe: self.skip_probe,
            park: self.park,
            reads: self.reads,
        };
        let result = match (self.mode, call.limit.is_active()) {
            (RxMode::SingleChain, false) => call.run::<false, false, GIVE_BACK>(ring),
            (RxMode::SingleChain, true) => call.run::<false, true, GIVE_BACK>(ring),
            (RxMode::Mergeable, false) => call.run::<true, false, GIVE_BACK>(ring),
            (RxMode::Mergeable, true) => call.run::<true, true, GIVE_BACK>(ring),
        };
        ring.publish_used();
        let stop = result?;
        Ok((stop, ring.interrupt_decision()))
    }
}

/// One call's borrows of an [`RxQueue`] and its ring.
struct Call<'c, 'g, 'l, B, R: Ring> {
    guest: &'c GuestView<'g>,
    state: &'c mut PoolState<R::Head>,
    gather: u64,
    keep_order: bool,
    backend: &'c mut B,
    counters: &'c mut RxCounters,
    label: &'c str,
    limit: &'c mut Limit<'l>,
    skip_probe: bool,
    /// Out of buffers, leave the driver's notifications off ([`RxStop::Parked`]).
    park: bool,
    /// Backend reads made (the last one included).
    reads: &'c mut usize,
}

impl<'g, B: NetBackend, R: Ring> Call<'_, 'g, '_, B, R> {
    /// Takes the pool out of the queue, runs the loop, and puts the pool back (`GIVE_BACK`:
    /// with the chains it still holds handed back to the avail ring first).
    #[inline]
    fn run<const MRG: bool, const LIMITED: bool, const GIVE_BACK: bool>(
        &mut self,
        ring: &mut R,
    ) -> Result<RxStop, RingError> {
        // SAFETY: every entry in the pool's storage was appended by `RingOps::walk_chain`
        // through this queue's own guest view, i.e. points into the queue's memory (`attach`
        // empties the pool when the ring changes), which the split borrow behind `guest`
        // keeps mapped for as long as `pool` lives; or it is the rest of such an entry
        // (`consume_front`) or two of them joined where one ends at the other's start
        // (`merge_from`), which covers the same mapped bytes.
        let mut pool: RxPool<'g, R::Head, MRG> =
            unsafe { RxPool::resume(self.state, self.gather, self.keep_order) };
        let result = self.receive::<MRG, LIMITED>(ring, &mut pool);
        if GIVE_BACK {
            if let Some(first) = pool.chains.get(pool.first) {
                let count = u16::try_from(pool.unused()).unwrap_or(u16::MAX);
                ring.unpop(&first.head, count);
            }
            pool.clear();
        }
        pool.suspend(self.state);
        result
    }

    /// One call's loop; with `skip_probe` it stops after its first frame ([`SparseReads`]).
    /// `MRG`: the pool is mergeable; `LIMITED`: a rate limiter is consulted and charged
    /// (constants, so that each case carries none of the others' code).
    ///
    /// `ring` is a parameter rather than a field of the call, so that the compiler knows
    /// nothing else changes it: its fields stay in registers through the loop.
    fn receive<const MRG: bool, const LIMITED: bool>(
        &mut self,
        ring: &mut R,
        pool: &mut RxPool<'g, R::Head, MRG>,
    ) -> Result<RxStop, RingError> {
        let (guest, counters) = (self.guest, &mut *self.counters);
        let mut budget = WalkBudget::per_call();
        let mut unpublished = 0usize;
        ring.disable_notification();
        loop {
            if *self.reads == RX_BUDGET || budget.exhausted() {
                return Ok(RxStop::Budget);
            }
            // Every read that did not end the call delivered (or dropped) a frame.
            if self.skip_probe && *self.reads == 1 {
                return Ok(RxStop::Yielded);
            }
            if !pool.has_enough() {
                pool.fill(guest, ring, counters, &mut budget)?;
                if pool.is_empty() {
                    if budget.exhausted() {
                        return Ok(RxStop::Budget);
                    }
                    if self.park {
                        return Ok(RxStop::Parked);
                    }
                    // The standard race: the driver may have posted buffers just before we
                    // re-enabled.
                    budget.charge(1);
                    if ring.enable_notification() {
                        ring.disable_notification();
                        continue;
                    }
                    counters.no_buffer_stalls += 1;
                    return Ok(RxStop::NoBuffers);
                }
            }
            if LIMITED {
                if let Some(blocked) = self.limit.blocked() {
                    counters.throttled(blocked);
                    return Ok(RxStop::Throttled(blocked.wait));
                }
            }
            let window = pool.window();
            let capacity = window.total_bytes();
            *self.reads += 1;
            match self.backend.read_frame(window) {
                Ok(n) if n >= VNET_HDR_LEN && n <= capacity => {
                    unpublished += pool.complete_frame(ring, n);
                    let bytes = (n - VNET_HDR_LEN) as u64;
                    counters.frames += 1;
                    counters.bytes += bytes;
                    counters.large_frames += u64::from(bytes > super::MTU_FRAME_LEN);
                    if LIMITED && self.limit.charge(bytes) {
                        counters.rate_limiter_bytes += bytes;
                        counters.rate_limiter_frames += 1;
                    }
                    if unpublished >= USED_PUBLISH_BATCH {
                        ring.publish_used();
                        unpublished = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(RxStop::BackendEmpty),
                Err(e) => {
                    log_read_failed(self.label, &e);
                    counters.backend_errors += 1;
                    return Ok(RxStop::BackendFailed);
                }
                Ok(0) => return Ok(RxStop::BackendClosed),
                Ok(n) if n < VNET_HDR_LEN => counters.backend_errors += 1,
                Ok(_) => counters.dropped_no_buffer += 1,
            }
        }
    }
}

/// Moves frames from `backend` into the rx buffers the driver posted on `queue`: one
/// [`RxQueue::process`] call on a queue built for it, gathering up to [`RX_GATHER_BYTES`] in
/// mergeable mode, with the chains left unused handed back to the avail ring and the ring
/// positions written back to `queue`. For tests, fuzzers and one-off callers; the worker keeps
/// an [`RxQueue`] (and its pool) for the whole activation.
pub fn process_rx<B: NetBackend>(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    backend: &mut B,
    mode: RxMode,
    counters: &mut RxCounters,
) -> Result<RxOutcome, RingError> {
    let mut rxq = RxQueue::new(Virtqueue::new(queue, mem)?, mode, RX_GATHER_BYTES);
    let result = rxq.run::<B, true>(backend, counters, false);
    if let Some(AnyRing::Split(vq)) = &rxq.vq {
        vq.sync_to(queue);
    }
    result
}

#[cold]
#[inline(never)]
fn log_short_chain<H: std::fmt::Debug>(head: H, len: u32) {
    debug!("virtio-net rx: chain {head:?} of {len} bytes cannot hold a header");
}

#[cold]
#[inline(never)]
fn log_refused_chain<H: std::fmt::Debug>(head: H, e: &crate::virtio::chain::ChainError) {
    debug!("virtio-net rx: chain {head:?} refused: {e}");
}

#[cold]
#[inline(never)]
fn log_read_failed(label: &str, e: &io::Error) {
    debug!("virtio-net {label} rx: backend read failed: {e}");
}

/// A popped, validated rx chain waiting for a frame.
#[derive(Clone, Copy, Debug)]
struct PooledChain<H> {
    head: H,
    len: u32,
    /// Its iovecs (single-chain mode; in mergeable mode the pool's iovecs are merged across
    /// chains and this counts only the entries the chain added).
    iov_count: usize,
}

/// The pool between calls: chains `first..` are unused; their iovecs are `iovecs[first_iov..]`.
#[derive(Debug)]
struct PoolState<H> {
    chains: Vec<PooledChain<H>>,
    first: usize,
    iovecs: Vec<libc::iovec>,
    iov_bytes: usize,
    first_iov: usize,
    free_bytes: u64,
}

// SAFETY: the iovecs point into the guest memory of the `RxQueue` that owns this state (see
// `RxQueue::run`); they are only dereferenced by the kernel during a call on that queue.
unsafe impl<H: Send> Send for PoolState<H> {}

impl<H> Default for PoolState<H> {
    fn default() -> Self {
        PoolState {
            chains: Vec::new(),
            first: 0,
            iovecs: Vec::new(),
            iov_bytes: 0,
            first_iov: 0,
            free_bytes: 0,
        }
    }
}

impl<H> PoolState<H> {
    /// Chains popped and waiting for frames.
    fn unused(&self) -> usize {
        self.chains.len() - self.first
    }
}

/// The pool during one call, its iovecs borrowed for the call's view of guest memory.
/// `MRG`: mergeable mode (a frame may span chains), else one chain per frame.
struct RxPool<'m, H, const MRG: bool> {
    gather: u64,
    /// Keep the unused chains the tail of what was popped (they are handed back at the end).
    keep_order: bool,
    chains: Vec<PooledChain<H>>,
    first: usize,
    iovecs: IovecList<'m>,
    first_iov: usize,
    free_bytes: u64,
}

impl<'m, H: Copy + Default + std::fmt::Debug, const MRG: bool> RxPool<'m, H, MRG> {
    /// Takes the pool out of `state` for one call.
    ///
    /// # Safety
    /// Every iovec in `state` must point into guest memory that stays mapped during `'m`.
    #[inline]
    unsafe fn resume(state: &mut PoolState<H>, gather: u64, keep_order: bool) -> Self {
        let iovecs = std::mem::take(&mut state.iovecs);
        RxPool {
            gather,
            keep_order,
            chains: std::mem::take(&mut state.chains),
            first: state.first,
            // SAFETY: the caller's contract.
            iovecs: unsafe { IovecList::from_parts(iovecs, state.iov_bytes) },
            first_iov: state.first_iov,
            free_bytes: state.free_bytes,
        }
    }

    /// Puts the pool back into `state` for the next call.
    #[inline]
    fn suspend(self, state: &mut PoolState<H>) {
        state.iov_bytes = self.iovecs.total_bytes();
        state.iovecs = self.iovecs.into_storage();
        state.chains = self.chains;
        state.first = self.first;
        state.first_iov = self.first_iov;
        state.free_bytes = self.free_bytes;
    }

    fn unused(&self) -> usize {
        self.chains.len() - self.first
    }

    fn is_empty(&self) -> bool {
        self.unused() == 0
    }

    fn clear(&mut self) {
        self.chains.clear();
        self.iovecs.clear();
        self.first = 0;
        self.first_iov = 0;
        self.free_bytes = 0;
    }

    #[inline]
    fn has_enough(&self) -> bool {
        if MRG {
            self.free_bytes >= self.gather || self.iovecs.len() - self.first_iov >= MAX_IOVECS
        } else {
            !self.is_empty()
        }
    }

    /// Whether a fill can stop: the pool can take a maximal frame (mergeable mode), or holds
    /// [`RX_FILL_CHAINS`] chains (one chain per frame: popped several at a time, so that the
    /// pops run in one loop and the fill's overhead is paid once for them).
    #[inline]
    fn filled(&self) -> bool {
        if MRG {
            self.has_enough()
        } else {
            self.unused() >= RX_FILL_CHAINS
        }
    }

    /// Pops chains until the pool is [`filled`](Self::filled), the driver has no more, or the
    /// call's budget is spent. Malformed chains are returned to the driver (length 0).
    ///
    /// One chain per frame, a run of lone direct descriptors (the receive buffers drivers
    /// post) is popped in one step ([`Ring::pop_lone`]); anything else, one chain at a time.
    #[inline(always)]
    fn fill<R: Ring<Head = H>>(
        &mut self,
        guest: &GuestView<'m>,
        ring: &mut R,
        counters: &mut RxCounters,
        budget: &mut WalkBudget,
    ) -> Result<(), RingError> {
        let mut lone = [H::default(); RX_FILL_CHAINS];
        while !self.filled() && !budget.exhausted() {
            if !MRG {
                // Below `RX_FILL_CHAINS` (not filled); each walk visits one descriptor, so the
                // budget lasts the run.
                let want = (RX_FILL_CHAINS - self.unused()).min(budget.remaining() as usize);
                let popped = ring.pop_lone(&mut lone[..want]);
                if popped > 0 {
                    let mut k = 0;
                    while k < popped {
                        if !self.take::<R, true>(guest, ring, counters, budget, lone[k], popped - k)
                        {
                            return Ok(());
                        }
                        k += 1;
                    }
                    continue;
                }
            }
            let Some(head) = ring.pop_head()? else {
                break;
            };
            if !self.take::<R, false>(guest, ring, counters, budget, head, 1) {
                break;
            }
        }
        Ok(())
    }

    /// Walks the popped chain `head` into the pool, or refuses it (see
    /// [`refuse`](Self::refuse)); `popped` counts it and the chains popped after it. False: the
    /// fill stops (`head` and those after it were put back). `LONE`: `head` came from
    /// [`Ring::pop_lone`].
    #[inline(always)]
    fn take<R: Ring<Head = H>, const LONE: bool>(
        &mut self,
        guest: &GuestView<'m>,
        ring: &mut R,
        counters: &mut RxCounters,
        budget: &mut WalkBudget,
        head: H,
        popped: usize,
    ) -> bool {
        let before = self.iovecs.len();
        let iovs = &mut self.iovecs;
        let result = if LONE {
            ring.walk_lone(guest, &head, Direction::DeviceWrites, iovs, budget)
        } else {
            ring.walk_chain(
                guest,
                &head,
                Direction::DeviceWrites,
                u32::MAX,
                iovs,
                budget,
            )
        };
        match result {
            Ok(len) if len as usize >= VNET_HDR_LEN => {
                if MRG {
                    // Frames are read across the whole pool and consumed by bytes, so its
                    // buffers may be merged where they follow each other in memory.
                    self.iovecs.merge_from(before, self.first_iov);
                }
                self.chains.push(PooledChain {
                    head,
                    len,
                    iov_count: self.iovecs.len() - before,
                });
                self.free_bytes += u64::from(len);
                true
            }
            refused => self.refuse(ring, counters, head, popped, before, refused),
        }
    }

    /// A popped chain that cannot take a frame (`result`): returned to the driver with
    /// length 0 and counted, unless chains popped before it are still pooled and order must
    /// be kept, in which case it is put back with the `popped − 1` chains popped after it and
    /// the fill stops (false).
    #[cold]
    #[inline(never)]
    fn refuse<R: Ring<Head = H>>(
        &mut self,
        ring: &mut R,
        counters: &mut RxCounters,
        head: H,
        popped: usize,
        before: usize,
        result: Result<u32, crate::virtio::chain::ChainError>,
    ) -> bool {
        match result {
            Ok(len) => {
                self.iovecs.truncate(before);
                log_short_chain(head, len);
            }
            Err(e) => log_refused_chain(head, &e),
        }
        if self.keep_order && !self.is_empty() {
            // Return it only once the chains popped before it are used, so that the
            // chains left in the pool always form the tail of what was popped.
            // At most `RX_FILL_CHAINS`.
            ring.unpop(&head, popped as u16);
            return false;
        }
        ring.add_used(head, 0);
        counters.malformed_chains += 1;
        true
    }

    /// The buffers the next frame is read into.
    #[inline]
    fn window(&self) -> Iovecs<'_> {
        let pooled = self.iovecs.len() - self.first_iov;
        if !MRG {
            let chain = self.chains[self.first];
            self.iovecs.range_of(
                self.first_iov,
                self.first_iov + chain.iov_count,
                chain.len as usize,
            )
        } else if pooled <= MAX_IOVECS {
            // The whole pool (the common case): its size is known.
            self.iovecs
                .range_of(self.first_iov, self.iovecs.len(), self.free_bytes as usize)
        } else {
            self.iovecs
                .range(self.first_iov, self.first_iov + MAX_IOVECS)
        }
    }

    /// A frame of `n` bytes (≤ the window) was read: returns the chains holding it to the
    /// driver, with `num_buffers` set. Returns how many chains were used.
    #[inline(always)]
    fn complete_frame<R: Ring<Head = H>>(&mut self, ring: &mut R, n: usize) -> usize {
        if !MRG {
            // One chain, `num_buffers` 1.
            let chain = self.chains[self.first];
            self.write_num_buffers(1);
            // `n` ≤ the window, i.e. chain.len, a u32.
            ring.add_used(chain.head, n as u32);
            self.free_bytes -= u64::from(chain.len);
            self.first_iov += chain.iov_count;
            self.first += 1;
            self.after_consumed();
            return 1;
        }
        let first = self.chains[self.first];
        if n <= first.len as usize {
            // The frame fits its first buffer (every frame up to a buffer's size): no loop.
            self.write_num_buffers(1);
            // `n` ≤ first.len, a u32.
            ring.add_used(first.head, n as u32);
            self.free_bytes -= u64::from(first.len);
            // Merged entries do not follow chain boundaries: consume the chain's bytes.
            self.iovecs
                .consume_front(&mut self.first_iov, first.len as usize);
            self.first += 1;
            self.after_consumed();
            return 1;
        }
        let mut count = 0;
        let mut remaining = n;
        while remaining > 0 && self.first + count < self.chains.len() {
            remaining = remaining.saturating_sub(self.chains[self.first + count].len as usize);
            count += 1;
        }
        self.write_num_buffers(u16::try_from(count).unwrap_or(u16::MAX));
        let mut remaining = n;
        let mut consumed = 0usize;
        for chain in &self.chains[self.first..self.first + count] {
            let len = remaining.min(chain.len as usize);
            remaining -= len;
            // `len` ≤ chain.len, a u32.
            ring.add_used(chain.head, len as u32);
            consumed += chain.len as usize;
            self.free_bytes -= u64::from(chain.len);
        }
        // Merged entries do not follow chain boundaries: consume the chains' bytes.
        self.iovecs.consume_front(&mut self.first_iov, consumed);
        self.first += count;
        self.after_consumed();
        count
    }

    /// Sets the frame's `num_buffers` (the header is at the front of the pool).
    #[inline]
    fn write_num_buffers(&self, count: u16) {
        let num_buffers = count.to_le_bytes();
        // The header's first buffer almost always holds it whole.
        if !self
            .iovecs
            .write_in_entry(self.first_iov, NUM_BUFFERS_OFFSET, num_buffers)
        {
            self.write_num_buffers_split(num_buffers);
        }
    }

    /// Drops the used chains from the storage once they are many (or all).
    #[inline]
    fn after_consumed(&mut self) {
        if self.is_empty() {
            self.clear();
        } else if self.first >= 64 {
            self.compact();
        }
    }

    /// `num_buffers` for a header split across buffers.
    #[cold]
    #[inline(never)]
    fn write_num_buffers_split(&self, num_buffers: [u8; 2]) {
        // The frame starts at the front of the pool.
        let header = self.iovecs.range(self.first_iov, self.iovecs.len());
        // Cannot fail: every pooled chain holds at least a full header.
        let written = header.write_at(NUM_BUFFERS_OFFSET, &num_buffers);
        debug_assert!(written, "pooled rx chain shorter than the header");
    }

    /// Drops the used chains from the front of the storage.
    #[cold]
    #[inline(never)]
    fn compact(&mut self) {
        self.chains.drain(..self.first);
        self.iovecs.remove_prefix(self.first_iov);
        self.first = 0;
        self.first_iov = 0;
    }
}
