//! The virtio-net device: features, configuration space, activation and link status.

use std::fmt;
use std::io;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use log::{debug, error, info, warn};
use seccompiler::BpfProgram;
use virtio_bindings::virtio_config::{VIRTIO_F_IN_ORDER, VIRTIO_F_RING_PACKED, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::config::{MacAddr, NetConfig, NetConfigError};
use super::ctrl::CTRL_QUEUE_SIZE;
use super::link::{GuestMac, LinkControl, LinkState};
use super::metrics::NetMetrics;
use super::rx::RxMode;
use super::stats::VIRTIO_NET_F_DEVICE_STATS;
use super::tuning::{NetTuning, TuningControl};
use super::worker::{
    Activation, PairPositions, PairQueue, Shared, WorkerThread, WorkerThreadError,
};
use super::{CTRL_QUEUE, NUM_QUEUES, RX_QUEUE, TX_QUEUE};

// The worker takes the queues as [rx, tx, ctrl] (one pair), or rx0 tx0 rx1 tx1 … ctrl (MQ).
const _: () = assert!(RX_QUEUE == 0 && TX_QUEUE == 1 && CTRL_QUEUE == 2);
/// All queues of one pair, the control queue included.
const ALL_QUEUES: usize = CTRL_QUEUE + 1;
use crate::backend::{
    LoopBackend, NetBackend, Offloads, SinkBackend, SourceBackend, Tap, TapError,
};
use crate::virtio::ring::{AnyRing, RingPosition};
use crate::virtio::vhost_user::VhostUserDevice;
use crate::virtio::{
    ActivateError, ActivationContext, FeatureDependencyError, QueueResetState, VirtioDevice,
};

/// How long a per-queue reset waits on the vCPU thread for the worker to confirm it stopped
/// using the queue. The worker looks at its commands between two bounded datapath calls, so
/// it normally answers within microseconds; past this, `queue_reset` reads 1 until it does.
pub const QUEUE_RESET_WAIT: Duration = Duration::from_millis(20);

/// Errors creating a virtio-net device.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The tap could not be opened or created.
    #[error("failed to open tap")]
    Tap(#[from] TapError),
    /// The device's tuning eventfd could not be created.
    #[error("failed to create the tuning eventfd")]
    Tuning(#[source] io::Error),
    /// The worker thread could not be started or configured.
    #[error("virtio-net worker")]
    Worker(#[from] WorkerThreadError),
    /// A measurement backend could not be created.
    #[error("failed to create the measurement backend")]
    Backend(#[source] io::Error),
    /// The device description does not hold together.
    #[error(transparent)]
    Config(#[from] NetConfigError),
}

/// Where the device's backend is: with the worker thread once it runs.
enum WorkerSlot<B> {
    /// The thread could not be started yet (retried at activation).
    NotStarted(B),
    /// The thread owns the backend.
    Started(WorkerThread),
    /// The backend went with a thread that died.
    Lost,
}

/// A virtio-net device in front of a backend (a [`Tap`] unless said otherwise).
///
/// The device starts its worker thread when it is built; the thread owns the backend and runs
/// the datapath between activation and reset.
pub struct NetDevice<B: NetBackend = Tap> {
    label: String,
    mac: MacAddr,
    /// The MAC the driver set with VIRTIO_NET_CTRL_MAC_ADDR_SET ([`GuestMac`]), until reset.
    guest_mac: Arc<GuestMac>,
    /// rx0 tx0 … rxN-1 txN-1 ctrl (the control queue is queue 2 unless MQ is negotiated).
    queue_sizes: Vec<u16>,
    features: u64,
    /// One worker per queue pair (pair 0's also serves the control queue).
    workers: Vec<WorkerSlot<B>>,
    metrics: Arc<NetMetrics>,
    link: LinkControl,
    tuning: TuningControl,
    /// The current run's queue layout (between activation and reset).
    run: Option<RunLayout>,
    /// Per queue: the worker's answer to a reset still awaited (see [`QUEUE_RESET_WAIT`]).
    pending_resets: Vec<Option<Receiver<()>>>,
}

/// What a per-queue reset or re-enable needs to know of the current run.
struct RunLayout {
    /// Queue pairs the driver set up: queues `0..2 * pairs` are rx, tx of each pair.
    pairs: usize,
    /// Guest memory, for checking the rings of a queue enabled again.
    mem: GuestMemoryMmap,
    /// The negotiated features (the ring kind, EVENT_IDX, IN_ORDER of a queue enabled again).
    acked: u64,
}

impl<B: NetBackend> fmt::Debug for NetDevice<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetDevice")
            .field("label", &self.label)
            .field("mac", &self.mac)
            .field("features", &format_args!("{:#x}", self.features))
            .field("active", &self.is_active())
            .finish_non_exhaustive()
    }
}

impl NetDevice<Tap> {
    /// Opens (or creates) the tap of `config` and builds the device, its worker thread
    /// started.
    pub fn new(config: &NetConfig) -> Result<Self, NetError> {
        let mut taps = Tap::open_queues(&config.tap, usize::from(config.queues))?;
        if !config.io_uring {
            for tap in &mut taps {
                tap.set_tx_batching(false);
            }
        }
        NetDevice::with_config(taps, config)
    }
}

/// Opens `config.queues` measurement backends of one kind, one per queue pair.
fn measurement_backends<B>(
    config: &NetConfig,
    open: impl Fn() -> io::Result<B>,
) -> Result<Vec<B>, NetError> {
    (0..config.queues)
        .map(|_| open().map_err(NetError::Backend))
        .collect()
}

impl NetDevice<SinkBackend> {
    /// A device in front of sinks (`backend=sink`), its worker threads started.
    pub fn sink(config: &NetConfig) -> Result<Self, NetError> {
        NetDevice::with_config(measurement_backends(config, SinkBackend::new)?, config)
    }
}

impl NetDevice<SourceBackend> {
    /// A device in front of sources of `config.source_frame_size()`-byte frames addressed to
    /// the guest's MAC (`backend=source`), its worker threads started.
    pub fn source(config: &NetConfig) -> Result<Self, NetError> {
        let len = usize::from(config.source_frame_size());
        let backends =
            measurement_backends(config, || SourceBackend::new(config.mac.bytes(), len))?;
        NetDevice::with_config(backends, config)
    }
}

impl NetDevice<LoopBackend> {
    /// A device in front of loops (`backend=loop`), its worker threads started.
    pub fn looped(config: &NetConfig) -> Result<Self, NetError> {
        NetDevice::with_config(measurement_backends(config, LoopBackend::new)?, config)
    }
}

impl<B: NetBackend> NetDevice<B> {
    /// Builds the device of `config` in front of `backends` (one per queue pair), its rate
    /// limiters (`rate_pps` included) set and its worker threads started.
    pub fn with_config(backends: Vec<B>, config: &NetConfig) -> Result<Self, NetError> {
        let (rx, tx) = config.rate_limiters()?;
        let tuning = TuningControl::with_workers(NetTuning::default(), backends.len())
            .map_err(NetError::Tuning)?;
        // Validated with the config.
        let _ = tuning.set_rate_limiters(rx, tx);
        let mut device =
            NetDevice::build(backends, config.mac, config.queue_size, tuning, &config.tap)
                .with_ring_features(config.packed, config.in_order);
        device.start_threads()?;
        Ok(device)
    }

    /// Builds a device in front of `backend`. `queue_size` must be a power of two in
    /// 2..=32768 ([`NetConfig`] guarantees it; the transport refuses others).
    ///
    /// # Panics
    ///
    /// When the process cannot create one eventfd (out of file descriptors); use
    /// [`NetDevice::new`] for a fallible constructor.
    pub fn with_backend(backend: B, mac: MacAddr, queue_size: u16) -> Self {
        Self::with_backends(vec![backend], mac, queue_size)
    }

    /// A device with one queue pair per backend (VIRTIO_NET_F_MQ offered when there are
    /// several; at most [`MAX_QUEUE_PAIRS`](super::config::MAX_QUEUE_PAIRS) are used). See
    /// [`NetDevice::with_backend`].
    ///
    /// # Panics
    ///
    /// When `backends` is empty, or the process cannot create the eventfds.
    pub fn with_backends(mut backends: Vec<B>, mac: MacAddr, queue_size: u16) -> Self {
        assert!(!backends.is_empty(), "a virtio-net device needs a backend");
        backends.truncate(usize::from(super::config::MAX_QUEUE_PAIRS));
        // Tests, benches and the co-simulation harness build devices here; running out of file
        // descriptors there is not worth an error path in every caller.
        let tuning = TuningControl::with_workers(NetTuning::default(), backends.len())
            .expect("eventfd for the tuning");
        let mut device = NetDevice::build(backends, mac, queue_size, tuning, "net");
        if let Err(e) = device.start_threads() {
            error!("virtio-net {}: {e}; retried at activation", device.label);
        }
        device
    }

    /// `backends`: one per queue pair, 1..=16 (the callers ensure it).
    fn build(
        backends: Vec<B>,
        mac: MacAddr,
        queue_size: u16,
        tuning: TuningControl,
        label: &str,
    ) -> Self {
        let pairs = backends.len();
        let mut features = backends
            .first()
            .map_or(Offloads::NONE, NetBackend::supported_offloads);
        for backend in &backends[1.min(pairs)..] {
            features =
                Offloads::from_bits_truncate(features.bits() & backend.supported_offloads().bits());
        }
        let mut features = offered_features(features);
        if pairs > 1 {
            features |= bit(VIRTIO_NET_F_MQ);
        }
        let mut queue_sizes = vec![queue_size; 2 * pairs];
        queue_sizes.push(CTRL_QUEUE_SIZE);
        NetDevice {
            run: None,
            pending_resets: queue_sizes.iter().map(|_| None).collect(),
            label: label.to_owned(),
            mac,
            guest_mac: Arc::new(GuestMac::default()),
            queue_sizes,
            features,
            workers: backends.into_iter().map(WorkerSlot::NotStarted).collect(),
            metrics: Arc::new(NetMetrics::with_pairs(pairs)),
            link: LinkControl::new(),
            tuning,
        }
    }

    /// This device offering the packed ring (VIRTIO_F_RING_PACKED) when `packed` and
    /// VIRTIO_F_IN_ORDER when `in_order` (neither by default). Before activation only.
    pub fn with_ring_features(mut self, packed: bool, in_order: bool) -> Self {
        self.offer_ring_features(packed, in_order);
        self
    }

    /// As [`NetDevice::with_ring_features`], in place.
    pub fn offer_ring_features(&mut self, packed: bool, in_order: bool) {
        for (on, feature) in [
            (packed, VIRTIO_F_RING_PACKED),
            (in_order, VIRTIO_F_IN_ORDER),
        ] {
            if on {
                self.features |= bit(feature);
            } else {
                self.features &= !bit(feature);
            }
        }
    }

    /// The device's queue pairs (`max_virtqueue_pairs`).
    pub fn queue_pairs(&self) -> usize {
        self.workers.len()
    }

    /// Starts every worker thread not running yet.
    fn start_threads(&mut self) -> Result<(), WorkerThreadError> {
        for pair in 0..self.workers.len() {
            self.start_thread(pair)?;
        }
        Ok(())
    }

    /// Starts pair `pair`'s worker thread if it is not running yet (`net-TAP`, or `net-TAP-i`
    /// with several pairs).
    fn start_thread(&mut self, pair: usize) -> Result<&mut WorkerThread, WorkerThreadError> {
        let pairs = self.workers.len();
        let slot = self.workers.get_mut(pair).ok_or(WorkerThreadError::Gone)?;
        match std::mem::replace(slot, WorkerSlot::Lost) {
            WorkerSlot::NotStarted(backend) => {
                let shared = Shared {
                    label: self.label.as_str().into(),
                    metrics: self.metrics.clone(),
                    tuning: self.tuning.shared().clone(),
                    link: self.link.clone(),
                    guest_mac: self.guest_mac.clone(),
                    pair,
                    pairs: u16::try_from(pairs).unwrap_or(u16::MAX),
                };
                let name = if pairs > 1 {
                    format!("net-{}-{pair}", self.label)
                } else {
                    format!("net-{}", self.label)
                };
                match WorkerThread::spawn(&name, backend, shared) {
                    Ok(thread) => *slot = WorkerSlot::Started(thread),
                    Err((e, backend)) => {
                        *slot = WorkerSlot::NotStarted(backend);
                        return Err(WorkerThreadError::Spawn(e));
                    }
                }
            }
            other => *slot = other,
        }
        match slot {
            WorkerSlot::Started(thread) => Ok(thread),
            _ => Err(WorkerThreadError::Gone),
        }
    }

    /// Confines the worker threads with `filter` (a seccomp BPF program) before they ever run
    /// the datapath. Call it before the guest can activate the device.
    pub fn set_worker_seccomp_filter(&mut self, filter: Arc<BpfProgram>) -> Result<(), NetError> {
        for pair in 0..self.workers.len() {
            self.start_thread(pair)?.apply_seccomp(filter.clone())?;
        }
        Ok(())
    }

    /// A handle to change the device's runtime knobs (interrupt coalescing, EVENT_IDX).
    pub fn tuning_control(&self) -> TuningControl {
        self.tuning.clone()
    }

    /// The device's metrics (the VMM keeps this `Arc` to print them).
    pub fn metrics(&self) -> Arc<NetMetrics> {
        self.metrics.clone()
    }

    /// A handle to change the link status.
    pub fn link_control(&self) -> LinkControl {
        self.link.clone()
    }

    /// The guest's MAC address: the configured one, or the one the driver set over the
    /// control queue (until a reset).
    pub fn mac(&self) -> MacAddr {
        self.guest_mac.get().unwrap_or(self.mac)
    }

    /// `mac[6]`, `le16 status`, then `le16 max_virtqueue_pairs` (with MQ offered; 0 else).
    fn config_bytes(&self) -> [u8; 10] {
        let mut bytes = [0u8; 10];
        bytes[..6].copy_from_slice(&self.mac().bytes());
        let status = match self.link.link() {
            LinkState::Up => VIRTIO_NET_S_LINK_UP as u16,
            LinkState::Down => 0,
        };
        bytes[6..8].copy_from_slice(&status.to_le_bytes());
        if self.features & bit(VIRTIO_NET_F_MQ) != 0 {
            let pairs = u16::try_from(self.workers.len()).unwrap_or(u16::MAX);
            bytes[8..10].copy_from_slice(&pairs.to_le_bytes());
        }
        bytes
    }

    /// The queue pairs that take part in the run (the others are set up but idle): what
    /// VQ_PAIRS_SET does when the control queue is served elsewhere (vhost-user: the
    /// frontend keeps it, and enables rings instead). At least 1; pair 0 always runs.
    pub fn set_active_pairs(&self, pairs: usize) {
        let pairs = pairs.clamp(1, self.workers.len());
        self.tuning.shared().set_active_pairs(pairs);
        self.tuning.shared().notify_except(0);
    }

    /// Stops every worker; returns each one's ring positions (pair order).
    fn stop_worker(&mut self) -> Vec<Option<PairPositions>> {
        self.link.attach(None);
        self.run = None;
        self.pending_resets.fill_with(|| None);
        let positions = self
            .workers
            .iter_mut()
            .map(|worker| match worker {
                WorkerSlot::Started(thread) => thread.stop(),
                _ => None,
            })
            .collect();
        // After the worker stopped: it cannot set another one meanwhile.
        if self.guest_mac.clear() {
            self.link.bump_generation();
        }
        positions
    }
}

impl<B: NetBackend> VirtioDevice for NetDevice<B> {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn label(&self) -> &str {
        &self.label
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn queue_optional(&self, index: usize, acked: u64) -> bool {
        // Under MQ only pair 0 and the control queue must run: the driver may set up fewer
        // pairs than max_virtqueue_pairs (and then never enables the others).
        acked & bit(VIRTIO_NET_F_MQ) != 0 && (2..2 * self.workers.len()).contains(&index)
    }

    fn queues_in_use(&self, acked: u64) -> usize {
        if acked & bit(VIRTIO_NET_F_MQ) != 0 {
            self.queue_sizes.len()
        } else if acked & bit(VIRTIO_NET_F_CTRL_VQ) != 0 {
            ALL_QUEUES
        } else {
            NUM_QUEUES
        }
    }

    fn validate_features(&self, acked: u64) -> Result<(), FeatureDependencyError> {
        for &(feature, name, requires, requires_name) in FEATURE_DEPENDENCIES {
            if acked & bit(feature) != 0 && acked & bit(requires) == 0 {
                return Err(FeatureDependencyError {
                    feature: name,
                    requires: requires_name,
                });
            }
        }
        Ok(())
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config_bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        debug!(
            "virtio-net {}: ignored {}-byte config write at {offset:#x} (read-only)",
            self.label,
            data.len()
        );
    }

    fn config_generation(&self) -> u32 {
        self.link.generation()
    }

    fn activate(&mut self, ctx: ActivationContext) -> Result<(), ActivateError> {
        let result = self.start_worker(ctx);
        if result.is_err() {
            self.metrics.needs_reset_events.add(1);
        }
        result
    }

    fn reset(&mut self) {
        self.stop_worker();
    }

    /// Stops the workers; each reports its rings' positions once everything it popped is
    /// used or handed back (rx chains pooled ahead of frames go back to the avail ring).
    fn pause(&mut self) -> Vec<Option<RingPosition>> {
        let Some(run) = &self.run else {
            self.stop_worker();
            return Vec::new();
        };
        let queues = self.queues_in_use(run.acked);
        let ctrl_index = queues - 1;
        let has_ctrl = run.acked & bit(VIRTIO_NET_F_CTRL_VQ) != 0;
        let mut positions = vec![None; queues];
        for (pair, stopped) in self.stop_worker().into_iter().enumerate() {
            let Some(p) = stopped else { continue };
            for (index, position) in [(2 * pair, p.rx), (2 * pair + 1, p.tx)] {
                if let Some(slot) = positions.get_mut(index) {
                    *slot = position;
                }
            }
            if has_ctrl && p.ctrl.is_some() {
                positions[ctrl_index] = p.ctrl;
            }
        }
        positions
    }

    fn is_active(&self) -> bool {
        matches!(self.workers.first(), Some(WorkerSlot::Started(thread)) if thread.is_running())
    }

    fn supports_queue_reset(&self) -> bool {
        true
    }

    /// Resets an rx or tx queue (the control queue is refused: its commands are carried out
    /// as they come, and no driver resets it). The pair's worker is told over its command
    /// channel and answers once it stopped using the queue; the other queues never stop.
    fn reset_queue(&mut self, index: usize) -> QueueResetState {
        let Some(run) = &self.run else {
            // No run (a failed activation): nothing uses the queue.
            return QueueResetState::Done;
        };
        let Some((pair, queue)) = datapath_queue(run, index) else {
            return QueueResetState::Refused;
        };
        let thread = match self.workers.get(pair) {
            Some(WorkerSlot::Started(thread)) => thread,
            _ => return QueueResetState::Done,
        };
        let reply = match thread.reset_queue(queue) {
            Ok(reply) => reply,
            // The run ended (the device needs a reset): nothing uses the queue.
            Err(WorkerThreadError::NotRunning | WorkerThreadError::Gone) => {
                return QueueResetState::Done
            }
            Err(e) => {
                error!("virtio-net {}: cannot reset queue {index}: {e}", self.label);
                return QueueResetState::Refused;
            }
        };
        match reply.recv_timeout(QUEUE_RESET_WAIT) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => QueueResetState::Done,
            Err(RecvTimeoutError::Timeout) => {
                if let Some(slot) = self.pending_resets.get_mut(index) {
                    *slot = Some(reply);
                }
                QueueResetState::Ongoing
            }
        }
    }

    fn poll_queue_reset(&mut self, index: usize) -> QueueResetState {
        let Some(slot) = self.pending_resets.get_mut(index) else {
            return QueueResetState::Done;
        };
        match slot.as_ref().map(Receiver::try_recv) {
            Some(Err(TryRecvError::Empty)) => QueueResetState::Ongoing,
            _ => {
                *slot = None;
                QueueResetState::Done
            }
        }
    }

    /// Checks the rings exactly as at activation ([`AnyRing::new`]: alignment, inside one
    /// memory region, the used ring overlapping nothing the device reads), then hands the ring
    /// to the worker without waiting for it.
    fn enable_queue(&mut self, index: usize, queue: Queue) -> Result<(), ActivateError> {
        let result = self.enable_datapath_queue(index, &queue);
        if result.is_err() {
            self.metrics.needs_reset_events.add(1);
        }
        result
    }
}

/// Over vhost-user the frontend keeps the configuration space (MAC, link status) and may keep
/// the control queue: the device runs the pairs whose rings the frontend enabled.
impl<B: NetBackend> VhostUserDevice for NetDevice<B> {
    fn vhost_user_features(&self) -> u64 {
        (self.features | bit(VIRTIO_NET_F_GUEST_ANNOUNCE))
            & !(bit(VIRTIO_NET_F_MAC) | bit(VIRTIO_NET_F_STATUS))
    }

    fn queue_num(&self) -> u64 {
        self.workers.len() as u64
    }

    fn ring_required(&self, index: usize, _acked: u64) -> bool {
        index < NUM_QUEUES
    }

    /// The pairs from the first up to the first one not wholly enabled run.
    fn enable_rings(&mut self, enabled: &[bool]) {
        let pairs = enabled
            .chunks_exact(2)
            .take(self.workers.len())
            .take_while(|pair| pair[0] && pair[1])
            .count();
        self.set_active_pairs(pairs);
    }
}

/// Reads the configuration space `config` at `offset` into `data`; bytes past its end read as
/// 0. Shared by every virtio-net device (in process, vhost-user).
pub(crate) fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, byte) in data.iter_mut().enumerate() {
        *byte = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|o| config.get(o).copied())
            .unwrap_or(0);
    }
}

/// Queue `index`'s pair and direction in `run`, if it is a datapath queue.
fn datapath_queue(run: &RunLayout, index: usize) -> Option<(usize, PairQueue)> {
    let queue = if index.is_multiple_of(2) {
        PairQueue::Rx
    } else {
        PairQueue::Tx
    };
    (index < 2 * run.pairs).then_some((index / 2, queue))
}

impl<B: NetBackend> NetDevice<B> {
    fn enable_datapath_queue(&mut self, index: usize, queue: &Queue) -> Result<(), ActivateError> {
        let run = self.run.as_ref().ok_or(ActivateError::BackendUnavailable)?;
        let (pair, which) = datapath_queue(run, index).ok_or(ActivateError::QueueReset)?;
        if self.pending_resets.get(index).is_some_and(Option::is_some) {
            return Err(ActivateError::QueueReset);
        }
        let vq = AnyRing::new(queue, &run.mem, run.acked).map_err(ActivateError::Ring)?;
        match self.workers.get(pair) {
            Some(WorkerSlot::Started(thread)) => thread
                .enable_queue(which, vq)
                .map_err(|_| ActivateError::BackendUnavailable),
            _ => Err(ActivateError::BackendUnavailable),
        }
    }

    fn start_worker(&mut self, ctx: ActivationContext) -> Result<(), ActivateError> {
        let expected = self.queues_in_use(ctx.acked_features);
        if ctx.queues.len() != expected || ctx.kicks.len() != expected {
            return Err(ActivateError::QueueCount {
                expected,
                got: ctx.queues.len().min(ctx.kicks.len()),
            });
        }
        let mem = ctx.mem.clone();
        let interrupt = ctx.interrupt.clone();
        let acked = ctx.acked_features;
        let activations = self.activations(
            ctx.queues,
            ctx.kicks,
            &ctx.positions,
            ctx.acked_features,
            &mem,
            &interrupt,
        )?;
        let usable = activations.len();
        // Only pair 0 until the driver sends VQ_PAIRS_SET (virtio 1.2 §5.1.6.5.5).
        self.tuning.shared().set_active_pairs(1);
        for (pair, activation) in activations.into_iter().enumerate() {
            let started = self
                .start_thread(pair)
                .map_err(|e| match e {
                    WorkerThreadError::Spawn(e) => ActivateError::Spawn(e),
                    _ => ActivateError::BackendUnavailable,
                })
                // Stops a run still going (the transport cannot set DRIVER_OK twice without a
                // reset; be safe anyway), then starts the new one.
                .and_then(|thread| thread.start(activation));
            if let Err(e) = started {
                // All pairs or none: the ones started go back to waiting.
                self.stop_worker();
                return Err(e);
            }
        }
        self.metrics.activations.add(1);
        info!(
            "virtio-net {}: the driver started {usable} queue pair(s) on {} rings{}",
            self.label,
            if acked & bit(VIRTIO_F_RING_PACKED) != 0 {
                "packed"
            } else {
                "split"
            },
            if acked & bit(VIRTIO_F_IN_ORDER) != 0 {
                ", IN_ORDER"
            } else {
                ""
            }
        );
        self.run = Some(RunLayout {
            pairs: usable,
            mem,
            acked,
        });
        self.link.attach(Some(interrupt));
        Ok(())
    }

    /// What each worker is handed: its pair's queues, kicks and resume positions (pair 0 also
    /// the control queue, when it is set up: a vhost-user frontend may keep it), for the pairs
    /// the driver set up.
    fn activations(
        &self,
        queues: Vec<Queue>,
        kicks: Vec<vmm_sys_util::eventfd::EventFd>,
        positions: &[Option<RingPosition>],
        acked_features: u64,
        mem: &GuestMemoryMmap,
        interrupt: &Arc<crate::virtio::VirtioInterrupt>,
    ) -> Result<Vec<Activation>, ActivateError> {
        let expected = queues.len();
        let position = |index: usize| positions.get(index).copied().flatten();
        // With MQ: rx0 tx0 … rxN-1 txN-1 ctrl; without: rx tx [ctrl].
        let pairs = if acked_features & bit(VIRTIO_NET_F_MQ) != 0 {
            self.workers.len()
        } else {
            1
        };
        let mut queues = queues;
        let mut kicks = kicks;
        let ctrl_position = position(expected - 1);
        let mut ctrl = if expected > 2 * pairs {
            queues
                .pop()
                .zip(kicks.pop())
                .filter(|(queue, _)| queue.ready())
        } else {
            None
        };
        let mut activations = Vec::with_capacity(pairs);
        let mut queues = queues.into_iter();
        let mut kicks = kicks.into_iter();
        for pair in 0..pairs {
            let (Some(rx), Some(tx), Some(rx_kick), Some(tx_kick)) =
                (queues.next(), queues.next(), kicks.next(), kicks.next())
            else {
                return Err(ActivateError::QueueCount { expected, got: 0 });
            };
            if !(rx.ready() && tx.ready()) {
                // The driver set up the pairs before this one only (`queue_optional`): they
                // are all VQ_PAIRS_SET may enable.
                if rx.ready() || tx.ready() {
                    warn!(
                        "{}: queue pair {pair} is half set up; the driver can use pairs 0..{pair}",
                        self.label
                    );
                }
                break;
            }
            let ctrl = ctrl.take();
            activations.push(Activation {
                positions: PairPositions {
                    rx: position(2 * pair),
                    tx: position(2 * pair + 1),
                    ctrl: ctrl.as_ref().and(ctrl_position),
                },
                mem: mem.clone(),
                rx,
                tx,
                rx_kick,
                tx_kick,
                ctrl,
                acked_features,
                rx_mode: RxMode::from_features(acked_features),
                offloads: guest_offloads(acked_features),
                interrupt: interrupt.clone(),
                usable_pairs: 1,
            });
        }
        let usable = activations.len();
        for activation in &mut activations {
            // `usable` ≤ pairs ≤ MAX_QUEUE_PAIRS.
            activation.usable_pairs = usable as u16;
        }
        Ok(activations)
    }
}

impl<B: NetBackend> Drop for NetDevice<B> {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

const fn bit(feature: u32) -> u64 {
    1 << feature
}

/// (feature, its name, the feature it requires, that one's name) — virtio 1.2 §5.1.3.1.
const FEATURE_DEPENDENCIES: &[(u32, &str, u32, &str)] = &[
    (
        VIRTIO_NET_F_GUEST_TSO4,
        "GUEST_TSO4",
        VIRTIO_NET_F_GUEST_CSUM,
        "GUEST_CSUM",
    ),
    (
        VIRTIO_NET_F_GUEST_TSO6,
        "GUEST_TSO6",
        VIRTIO_NET_F_GUEST_CSUM,
        "GUEST_CSUM",
    ),
    (
        VIRTIO_NET_F_GUEST_UFO,
        "GUEST_UFO",
        VIRTIO_NET_F_GUEST_CSUM,
        "GUEST_CSUM",
    ),
    (
        VIRTIO_NET_F_HOST_TSO4,
        "HOST_TSO4",
        VIRTIO_NET_F_CSUM,
        "CSUM",
    ),
    (
        VIRTIO_NET_F_HOST_TSO6,
        "HOST_TSO6",
        VIRTIO_NET_F_CSUM,
        "CSUM",
    ),
    (VIRTIO_NET_F_HOST_UFO, "HOST_UFO", VIRTIO_NET_F_CSUM, "CSUM"),
    (
        VIRTIO_NET_F_CTRL_RX,
        "CTRL_RX",
        VIRTIO_NET_F_CTRL_VQ,
        "CTRL_VQ",
    ),
    (
        VIRTIO_NET_F_CTRL_MAC_ADDR,
        "CTRL_MAC_ADDR",
        VIRTIO_NET_F_CTRL_VQ,
        "CTRL_VQ",
    ),
    (
        VIRTIO_NET_F_CTRL_GUEST_OFFLOADS,
        "CTRL_GUEST_OFFLOADS",
        VIRTIO_NET_F_CTRL_VQ,
        "CTRL_VQ",
    ),
    (
        VIRTIO_NET_F_NOTF_COAL,
        "NOTF_COAL",
        VIRTIO_NET_F_CTRL_VQ,
        "CTRL_VQ",
    ),
    (
        VIRTIO_NET_F_VQ_NOTF_COAL,
        "VQ_NOTF_COAL",
        VIRTIO_NET_F_CTRL_VQ,
        "CTRL_VQ",
    ),
    (VIRTIO_NET_F_MQ, "MQ", VIRTIO_NET_F_CTRL_VQ, "CTRL_VQ"),
    (
        VIRTIO_NET_F_DEVICE_STATS,
        "DEVICE_STATS",
        VIRTIO_NET_F_CTRL_VQ,
        "CTRL_VQ",
    ),
];

/// The features offered in front of a backend supporting `offloads`.
pub fn offered_features(offloads: Offloads) -> u64 {
    let mut features = bit(VIRTIO_F_VERSION_1)
        | bit(VIRTIO_RING_F_EVENT_IDX)
        | bit(VIRTIO_RING_F_INDIRECT_DESC)
        | bit(VIRTIO_NET_F_MAC)
        | bit(VIRTIO_NET_F_STATUS)
        | bit(VIRTIO_NET_F_MRG_RXBUF)
        // The control queue (queue 2) and its commands; see `ctrl`.
        | bit(VIRTIO_NET_F_CTRL_VQ)
        | bit(VIRTIO_NET_F_CTRL_RX)
        | bit(VIRTIO_NET_F_CTRL_MAC_ADDR)
        | bit(VIRTIO_NET_F_NOTF_COAL)
        | bit(VIRTIO_NET_F_VQ_NOTF_COAL)
        | bit(VIRTIO_NET_F_DEVICE_STATS);
    if offloads.contains(Offloads::CSUM) {
        features |= bit(VIRTIO_NET_F_CSUM)
            | bit(VIRTIO_NET_F_GUEST_CSUM)
            | bit(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS);
        if offloads.contains(Offloads::TSO4 | Offloads::TSO6) {
            features |= bit(VIRTIO_NET_F_HOST_TSO4)
                | bit(VIRTIO_NET_F_HOST_TSO6)
                | bit(VIRTIO_NET_F_GUEST_TSO4)
                | bit(VIRTIO_NET_F_GUEST_TSO6);
        }
        if offloads.contains(Offloads::UFO) {
            features |= bit(VIRTIO_NET_F_HOST_UFO) | bit(VIRTIO_NET_F_GUEST_UFO);
        }
    }
    features
}

/// The receive offloads to enable on the backend: those the guest negotiated to accept.
pub fn guest_offloads(acked: u64) -> Offloads {
    let mut offloads = Offloads::NONE;
    for (feature, offload) in [
        (VIRTIO_NET_F_GUEST_CSUM, Offloads::CSUM),
        (VIRTIO_NET_F_GUEST_TSO4, Offloads::TSO4),
        (VIRTIO_NET_F_GUEST_TSO6, Offloads::TSO6),
        (VIRTIO_NET_F_GUEST_UFO, Offloads::UFO),
    ] {
        if acked & bit(feature) != 0 {
            offloads = offloads | offload;
        }
    }
    offloads
}
