//! A virtio-net device whose datapath is in another process: a vhost-user backend
//! (`vhost-user-net`, DPDK's `net_vhost`, any other). The VMM keeps the transport, the
//! configuration space (MAC, link status, queue pairs) and the device status; the backend gets
//! the guest's memory, the rings, the guest's ioeventfds as kick eventfds and the interrupt's
//! irqfds as call eventfds, so that in steady state no frame and no notification passes
//! through the VMM.
//!
//! # The control thread
//!
//! One thread per device (`vhost-NAME`) owns the connection: it connects (or, with the
//! backend as the client, accepts), negotiates, and carries out what the transport asks (set
//! the rings up at DRIVER_OK, stop them at a reset) on behalf of the vCPU thread, which only
//! sends it a message and waits for the answer: the vCPU's seccomp filter allows no socket
//! calls. The same thread notices the backend going away (the socket hangs up): the link goes
//! down (a configuration interrupt tells the driver), and it connects again (or waits for the
//! backend) every [`RECONNECT_EVERY`]. A backend that comes back with the features the driver
//! acknowledged gets the rings again, each from its used position (split rings: the used
//! index in guest memory; chains the old backend took and did not use are taken again, as on a
//! NIC reset), and the link goes up. A packed ring's used position is not in memory: a packed
//! device whose backend died needs the driver to reset it (DEVICE_NEEDS_RESET).
//!
//! # Features and the control queue
//!
//! The driver is offered what the backend offered of the device features this VMM knows,
//! with MAC and STATUS (the VMM's configuration space). The control queue goes to the backend
//! when the backend serves it: it offers CTRL_VQ and one of the commands only a device that
//! runs the queue offers (NOTF_COAL, DEVICE_STATS), as `vhost-user-net` does. Otherwise the
//! VMM serves the queue itself ([`super::local_ctrl`]), as QEMU does: it offers CTRL_VQ,
//! CTRL_RX, CTRL_MAC_ADDR and, when the backend has more than one queue pair, MQ; VQ_PAIRS_SET
//! becomes SET_VRING_ENABLE of the pairs' rings (pair 0 alone until the driver asks for more),
//! the MAC and rx-mode commands are acknowledged, and every other command is refused. DPDK
//! 22.11's vhost offers CTRL_VQ but never reads the queue, so the VMM serves it.
//!
//! # Interrupts
//!
//! With MSI-X, each ring's call eventfd is the irqfd of the vector the driver gave its queue
//! (KVM delivers it; a masked vector is not honoured, as the guest's drivers never mask a
//! vector they use). With one line (virtio-mmio), every ring's call eventfd is the line's
//! irqfd and InterruptStatus always shows "used buffers" ([`VirtioInterrupt::set_external_queues`]).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{error, info, warn};
use seccompiler::BpfProgram;
use serde::Serialize;
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_config::{
    VIRTIO_F_IN_ORDER, VIRTIO_F_RING_PACKED, VIRTIO_F_RING_RESET, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::config::MacAddr;
use super::ctrl::CTRL_QUEUE_SIZE;
use super::link::{LinkControl, LinkState};
use super::local_ctrl::{CtrlRequest, LocalCtrl, LocalCtrlMetrics};
use super::stats::VIRTIO_NET_F_DEVICE_STATS;
use crate::counters::{Counter, Gauge};
use crate::virtio::net::device::QUEUE_RESET_WAIT;
use crate::virtio::vhost_user::VHOST_USER_F_PROTOCOL_FEATURES;
use crate::virtio::{
    ActivateError, ActivationContext, QueueResetState, VirtioDevice, VirtioInterrupt,
};

/// How often a lost backend is looked for again.
pub const RECONNECT_EVERY: Duration = Duration::from_millis(100);
/// How long the VMM waits for the backend when the device is built.
pub const FIRST_CONNECT_WAIT: Duration = Duration::from_secs(30);
/// How long the vCPU thread waits for the control thread to set the rings up or stop them.
const COMMAND_WAIT: Duration = Duration::from_secs(10);

const fn bit(feature: u32) -> u64 {
    1 << feature
}

/// The device features a backend may offer and this VMM passes on to the driver.
const PASSED_ON: u64 = bit(VIRTIO_F_VERSION_1)
    | bit(VIRTIO_RING_F_EVENT_IDX)
    | bit(VIRTIO_RING_F_INDIRECT_DESC)
    | bit(VIRTIO_F_RING_PACKED)
    | bit(VIRTIO_F_IN_ORDER)
    | bit(VIRTIO_NET_F_MRG_RXBUF)
    | bit(VIRTIO_NET_F_CSUM)
    | bit(VIRTIO_NET_F_GUEST_CSUM)
    | bit(VIRTIO_NET_F_GUEST_TSO4)
    | bit(VIRTIO_NET_F_GUEST_TSO6)
    | bit(VIRTIO_NET_F_GUEST_UFO)
    | bit(VIRTIO_NET_F_HOST_TSO4)
    | bit(VIRTIO_NET_F_HOST_TSO6)
    | bit(VIRTIO_NET_F_HOST_UFO);
/// The control queue's features, passed on when the backend serves the queue.
const CTRL_FEATURES: u64 = bit(VIRTIO_NET_F_CTRL_VQ)
    | bit(VIRTIO_NET_F_CTRL_RX)
    | bit(VIRTIO_NET_F_CTRL_MAC_ADDR)
    | bit(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS)
    | bit(VIRTIO_NET_F_NOTF_COAL)
    | bit(VIRTIO_NET_F_VQ_NOTF_COAL)
    | bit(VIRTIO_NET_F_DEVICE_STATS)
    | bit(VIRTIO_NET_F_MQ);
/// The VMM's own: its configuration space.
const OWN: u64 = bit(VIRTIO_NET_F_MAC) | bit(VIRTIO_NET_F_STATUS);
/// The control queue's features when the VMM serves the queue (with MQ where the backend has
/// pairs).
const LOCAL_CTRL: u64 = bit(VIRTIO_NET_F_CTRL_VQ)
    | bit(VIRTIO_NET_F_CTRL_RX)
    | bit(VIRTIO_NET_F_CTRL_MAC_ADDR)
    | bit(VIRTIO_NET_F_MQ);

/// What `--net vhost-user=` describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VhostUserNetConfig {
    /// The backend's socket.
    pub socket: PathBuf,
    /// The backend connects as the client (run with `--client`): the VMM listens on `socket`.
    pub backend_connects: bool,
    /// Queue pairs at most (the backend may offer fewer).
    pub queues: u16,
    /// Maximum size of each queue.
    pub queue_size: u16,
    /// Offer the packed ring (if the backend does).
    pub packed: bool,
    /// Offer IN_ORDER (if the backend does).
    pub in_order: bool,
    /// The guest's MAC address (configuration space).
    pub mac: MacAddr,
}

/// Errors building the device.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserNetError {
    /// No backend answered on the socket in time.
    #[error("no vhost-user backend on {path:?} within {wait:?}")]
    NoBackend {
        /// The socket.
        path: PathBuf,
        /// How long the VMM waited.
        wait: Duration,
        /// The last error.
        #[source]
        source: io::Error,
    },
    /// The backend's answers during negotiation.
    #[error("vhost-user negotiation with {path:?} failed")]
    Negotiation {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: vhost::Error,
    },
    /// The backend lacks what a virtio-net device needs (VERSION_1).
    #[error("the vhost-user backend on {0:?} does not offer VIRTIO_F_VERSION_1")]
    Features(PathBuf),
    /// The control thread could not be started.
    #[error("cannot start the vhost-user control thread")]
    Thread(#[source] io::Error),
    /// Listening on the socket (the backend as the client) failed.
    #[error("cannot listen on {path:?}")]
    Listen {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The vhost-user device's counters (`vhost_user` in the metrics).
#[derive(Debug, Default, Serialize)]
pub struct VhostUserNetMetrics {
    /// Connections to a backend made (the first one included).
    pub connections: Counter,
    /// Times the backend went away.
    pub disconnects: Counter,
    /// Times the rings were set up again on a backend that came back.
    pub reconnects: Counter,
    /// Ring set-ups the backend refused, or that failed.
    pub setup_errors: Counter,
    /// 1 while connected.
    pub connected: Gauge,
    /// The features the driver acknowledged (0 before DRIVER_OK).
    pub acked_features: Gauge,
    /// Per-queue resets carried out (VIRTIO_F_RING_RESET: the ring stopped on the backend).
    pub queue_resets: Counter,
    /// Reset rings handed to the backend again.
    pub queue_reenables: Counter,
    /// The control queue, when the VMM serves it (the backend does not).
    pub ctrl: LocalCtrlMetrics,
}

/// What the control thread is told by the vCPU thread.
enum Command {
    /// The driver set DRIVER_OK: set the rings up.
    Start(Box<Run>, Sender<Result<(), String>>),
    /// The driver reset the device: stop the rings.
    Stop(Sender<()>),
    /// Per-queue reset of a datapath ring: stop it (GET_VRING_BASE); answers once stopped.
    ResetQueue(usize, Sender<()>),
    /// The reset ring enabled again on the queue the driver programmed.
    EnableQueue(usize, Box<Queue>, Sender<Result<(), String>>),
    /// The device goes away.
    Exit,
}

/// One run of the device: what the backend needs to serve the driver.
struct Run {
    mem: GuestMemoryMmap,
    queues: Vec<Queue>,
    kicks: Vec<EventFd>,
    interrupt: Arc<VirtioInterrupt>,
    acked: u64,
}

/// A virtio-net device served by a vhost-user backend.
pub struct VhostUserNet {
    label: String,
    mac: MacAddr,
    pairs: u16,
    queue_sizes: Vec<u16>,
    features: u64,
    link: LinkControl,
    metrics: Arc<VhostUserNetMetrics>,
    commands: Sender<Command>,
    wake: EventFd,
    thread: Option<JoinHandle<()>>,
    active: bool,
    /// Per queue: the control thread's answer to a reset still awaited.
    pending_resets: Vec<Option<Receiver<()>>>,
}

impl std::fmt::Debug for VhostUserNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserNet")
            .field("label", &self.label)
            .field("features", &format_args!("{:#x}", self.features))
            .finish_non_exhaustive()
    }
}

/// Where the connection comes from.
enum Endpoint {
    /// The VMM connects to the backend's socket.
    Connect(PathBuf),
    /// The backend connects to the VMM's.
    Listen(UnixListener, PathBuf),
}

impl Endpoint {
    /// Where `config`'s backend is: its socket to connect to, or one to listen on.
    fn of(config: &VhostUserNetConfig) -> Result<Endpoint, VhostUserNetError> {
        if !config.backend_connects {
            return Ok(Endpoint::Connect(config.socket.clone()));
        }
        let listener =
            UnixListener::bind(&config.socket).map_err(|source| VhostUserNetError::Listen {
                path: config.socket.clone(),
                source,
            })?;
        Ok(Endpoint::Listen(listener, config.socket.clone()))
    }

    fn path(&self) -> &Path {
        match self {
            Endpoint::Connect(path) | Endpoint::Listen(_, path) => path,
        }
    }

    /// One attempt: a stream, or the reason there is none yet.
    fn try_connect(&self) -> io::Result<UnixStream> {
        match self {
            Endpoint::Connect(path) => UnixStream::connect(path),
            Endpoint::Listen(listener, _) => {
                let (stream, _) = listener.accept()?;
                stream.set_nonblocking(false)?;
                Ok(stream)
            }
        }
    }
}

/// A connected, negotiated backend.
struct Backend {
    frontend: Frontend,
    fd: RawFd,
    features: u64,
    pairs: u16,
}

/// The protocol features the VMM asks for.
fn wanted_protocol() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::RESET_DEVICE
}

impl Backend {
    /// Negotiates on a fresh connection (owner, features, protocol features, queue pairs).
    fn negotiate(stream: UnixStream, max_pairs: u16) -> vhost::Result<Backend> {
        let fd = stream.as_raw_fd();
        let mut frontend = Frontend::from_stream(stream, u64::from(max_pairs) * 2 + 1);
        frontend.set_owner()?;
        let features = frontend.get_features()?;
        let mut pairs = 1;
        if features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            let offered = frontend.get_protocol_features()?;
            let protocol = offered & wanted_protocol();
            frontend.set_protocol_features(protocol)?;
            // GET_QUEUE_NUM is not asked: QEMU and DPDK read its answer as queue pairs,
            // Cloud Hypervisor and rust-vmm's frontend as queues. The device has the pairs it
            // was configured with; a backend with fewer refuses the rings past its own.
            if protocol.contains(VhostUserProtocolFeatures::MQ) {
                pairs = max_pairs;
            }
            if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
                // Every request waits for the backend's answer: a refusal is seen at once.
                frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
        }
        Ok(Backend {
            frontend,
            fd,
            features,
            pairs,
        })
    }

    /// Whether the backend serves the control queue (see the module docs).
    fn serves_ctrl(&self) -> bool {
        self.features & bit(VIRTIO_NET_F_CTRL_VQ) != 0
            && self.features & (bit(VIRTIO_NET_F_NOTF_COAL) | bit(VIRTIO_NET_F_DEVICE_STATS)) != 0
    }
}

impl VhostUserNet {
    /// Connects to (or waits for) the backend of `config`, negotiates, and starts the control
    /// thread (which installs `filter` first, when given). `label` names the device in logs.
    pub fn new(
        config: &VhostUserNetConfig,
        label: &str,
        filter: Option<Arc<BpfProgram>>,
    ) -> Result<VhostUserNet, VhostUserNetError> {
        let endpoint = Endpoint::of(config)?;
        let stream = first_connection(&endpoint)?;
        let backend = Backend::negotiate(stream, config.queues).map_err(|source| {
            VhostUserNetError::Negotiation {
                path: config.socket.clone(),
                source,
            }
        })?;
        if backend.features & bit(VIRTIO_F_VERSION_1) == 0 {
            return Err(VhostUserNetError::Features(config.socket.clone()));
        }
        if let Endpoint::Listen(listener, _) = &endpoint {
            listener
                .set_nonblocking(true)
                .map_err(VhostUserNetError::Thread)?;
        }
        let features = offered_features(config, &backend);
        let ctrl_local = !backend.serves_ctrl();
        let pairs = if features & bit(VIRTIO_NET_F_MQ) != 0 {
            backend.pairs
        } else {
            1
        };
        let mut queue_sizes = vec![config.queue_size; 2 * usize::from(pairs)];
        queue_sizes.push(CTRL_QUEUE_SIZE);
        let metrics = Arc::new(VhostUserNetMetrics::default());
        metrics.connections.add(1);
        metrics.connected.set(1);
        let link = LinkControl::new();
        let (commands, receiver) = mpsc::channel();
        let wake = EventFd::new(EFD_NONBLOCK).map_err(VhostUserNetError::Thread)?;
        let control = Control {
            label: label.to_owned(),
            endpoint,
            backend: Some(backend),
            run: None,
            link: link.clone(),
            metrics: metrics.clone(),
            commands: receiver,
            wake: wake.try_clone().map_err(VhostUserNetError::Thread)?,
            features,
            last_attempt: Instant::now(),
            ctrl_local,
            local_ctrl: None,
            active_pairs: 1,
        };
        let thread = thread::Builder::new()
            .name(format!("vhost-{label}"))
            .spawn(move || control.run(filter))
            .map_err(VhostUserNetError::Thread)?;
        info!(
            "virtio-net {label}: vhost-user backend on {:?}, {pairs} queue pair(s), features \
             {features:#x} offered to the driver",
            config.socket
        );
        let pending_resets = (0..queue_sizes.len()).map(|_| None).collect();
        Ok(VhostUserNet {
            pending_resets,
            label: label.to_owned(),
            mac: config.mac,
            pairs,
            queue_sizes,
            features,
            link,
            metrics,
            commands,
            wake,
            thread: Some(thread),
            active: false,
        })
    }

    /// The device's counters.
    pub fn metrics(&self) -> Arc<VhostUserNetMetrics> {
        self.metrics.clone()
    }

    /// A handle to the link status (down while the backend is away).
    pub fn link_control(&self) -> LinkControl {
        self.link.clone()
    }

    fn send(&self, command: Command) -> bool {
        if self.commands.send(command).is_err() {
            return false;
        }
        self.wake.write(1).is_ok()
    }
}

/// The first connection: retried every [`RECONNECT_EVERY`] for [`FIRST_CONNECT_WAIT`].
fn first_connection(endpoint: &Endpoint) -> Result<UnixStream, VhostUserNetError> {
    let deadline = Instant::now() + FIRST_CONNECT_WAIT;
    loop {
        match endpoint.try_connect() {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => {
                return Err(VhostUserNetError::NoBackend {
                    path: endpoint.path().to_owned(),
                    wait: FIRST_CONNECT_WAIT,
                    source: e,
                })
            }
            Err(_) => thread::sleep(RECONNECT_EVERY),
        }
    }
}

/// The features the driver is offered (see the module docs).
fn offered_features(config: &VhostUserNetConfig, backend: &Backend) -> u64 {
    let mut passed = PASSED_ON;
    if !config.packed {
        passed &= !bit(VIRTIO_F_RING_PACKED);
    }
    if !config.in_order {
        passed &= !bit(VIRTIO_F_IN_ORDER);
    }
    let mq = config.queues >= 2 && backend.pairs >= 2;
    let local = if backend.serves_ctrl() {
        passed |= CTRL_FEATURES;
        if !mq {
            passed &= !bit(VIRTIO_NET_F_MQ);
        }
        0
    } else if mq {
        LOCAL_CTRL
    } else {
        LOCAL_CTRL & !bit(VIRTIO_NET_F_MQ)
    };
    (backend.features & passed) | OWN | local
}

impl VirtioDevice for VhostUserNet {
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

    fn queues_in_use(&self, acked: u64) -> usize {
        if acked & bit(VIRTIO_NET_F_MQ) != 0 {
            self.queue_sizes.len()
        } else if acked & bit(VIRTIO_NET_F_CTRL_VQ) != 0 {
            3
        } else {
            2
        }
    }

    fn queue_optional(&self, index: usize, acked: u64) -> bool {
        acked & bit(VIRTIO_NET_F_MQ) != 0 && (2..2 * usize::from(self.pairs)).contains(&index)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; 10];
        config[..6].copy_from_slice(&self.mac.bytes());
        let status = match self.link.link() {
            LinkState::Up => VIRTIO_NET_S_LINK_UP as u16,
            LinkState::Down => 0,
        };
        config[6..8].copy_from_slice(&status.to_le_bytes());
        if self.features & bit(VIRTIO_NET_F_MQ) != 0 {
            config[8..10].copy_from_slice(&self.pairs.to_le_bytes());
        }
        super::device::read_config_bytes(&config, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn config_generation(&self) -> u32 {
        self.link.generation()
    }

    fn activate(&mut self, ctx: ActivationContext) -> Result<(), ActivateError> {
        let (reply, answer) = mpsc::channel();
        self.link.attach(Some(ctx.interrupt.clone()));
        let run = Run {
            mem: ctx.mem,
            queues: ctx.queues,
            kicks: ctx.kicks,
            interrupt: ctx.interrupt,
            acked: ctx.acked_features,
        };
        if !self.send(Command::Start(Box::new(run), reply)) {
            return Err(ActivateError::BackendUnavailable);
        }
        self.metrics.acked_features.set(ctx.acked_features);
        match answer.recv_timeout(COMMAND_WAIT) {
            Ok(Ok(())) => {
                self.active = true;
                Ok(())
            }
            Ok(Err(why)) => {
                error!(
                    "virtio-net {}: the vhost-user backend refused the rings: {why}",
                    self.label
                );
                Err(ActivateError::Backend(io::Error::other(why)))
            }
            Err(_) => Err(ActivateError::BackendUnavailable),
        }
    }

    fn reset(&mut self) {
        self.link.attach(None);
        self.metrics.acked_features.set(0);
        self.active = false;
        let (reply, answer) = mpsc::channel();
        if self.send(Command::Stop(reply)) {
            let _ = answer.recv_timeout(COMMAND_WAIT);
        }
    }

    fn is_active(&self) -> bool {
        self.active
    }

    fn supports_queue_reset(&self) -> bool {
        true
    }

    /// Resets an rx or tx queue: the backend stops its ring (GET_VRING_BASE; `vhost-user-net`
    /// runs the other rings on, as the in-process device does). The control queue is refused.
    fn reset_queue(&mut self, index: usize) -> QueueResetState {
        if !self.active {
            return QueueResetState::Done;
        }
        if index >= 2 * usize::from(self.pairs) {
            return QueueResetState::Refused;
        }
        let (reply, answer) = mpsc::channel();
        if !self.send(Command::ResetQueue(index, reply)) {
            return QueueResetState::Done;
        }
        match answer.recv_timeout(QUEUE_RESET_WAIT) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => QueueResetState::Done,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(slot) = self.pending_resets.get_mut(index) {
                    *slot = Some(answer);
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
            Some(Err(mpsc::TryRecvError::Empty)) => QueueResetState::Ongoing,
            _ => {
                *slot = None;
                QueueResetState::Done
            }
        }
    }

    /// Hands the ring the driver programmed again to the backend, from its start.
    fn enable_queue(&mut self, index: usize, queue: Queue) -> Result<(), ActivateError> {
        let (reply, answer) = mpsc::channel();
        if !self.send(Command::EnableQueue(index, Box::new(queue), reply)) {
            return Err(ActivateError::BackendUnavailable);
        }
        match answer.recv_timeout(COMMAND_WAIT) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => {
                error!(
                    "virtio-net {}: the vhost-user backend refused queue {index} again: {why}",
                    self.label
                );
                Err(ActivateError::Backend(io::Error::other(why)))
            }
            Err(_) => Err(ActivateError::BackendUnavailable),
        }
    }
}

impl Drop for VhostUserNet {
    fn drop(&mut self) {
        self.send(Command::Exit);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The control thread's state.
struct Control {
    label: String,
    endpoint: Endpoint,
    backend: Option<Backend>,
    run: Option<Run>,
    link: LinkControl,
    metrics: Arc<VhostUserNetMetrics>,
    commands: Receiver<Command>,
    wake: EventFd,
    /// The features offered to the driver (a backend that comes back must still have them).
    features: u64,
    last_attempt: Instant,
    /// The VMM serves the control queue (the first backend did not).
    ctrl_local: bool,
    /// The control queue of the run, when the VMM serves it.
    local_ctrl: Option<LocalCtrl>,
    /// The queue pairs the driver uses (VQ_PAIRS_SET, when the VMM serves the control queue).
    active_pairs: u16,
}

impl Control {
    fn run(mut self, filter: Option<Arc<BpfProgram>>) {
        if let Some(filter) = filter {
            if let Err(e) = seccompiler::apply_filter(&filter) {
                error!(
                    "vhost-{}: cannot install the seccomp filter: {e}",
                    self.label
                );
                return;
            }
        }
        loop {
            let mut fds = vec![libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // The control queue's kick, then the backend's socket.
            let ctrl_at = self.local_ctrl.as_ref().map(|ctrl| {
                fds.push(libc::pollfd {
                    fd: ctrl.kick_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                fds.len() - 1
            });
            let backend_at = self.backend.as_ref().map(|backend| {
                fds.push(libc::pollfd {
                    fd: backend.fd,
                    events: libc::POLLRDHUP,
                    revents: 0,
                });
                fds.len() - 1
            });
            let timeout = if self.backend.is_some() {
                -1
            } else {
                RECONNECT_EVERY.as_millis() as i32
            };
            // SAFETY: `fds` is valid for its length for the call; poll only writes `revents`.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                continue;
            }
            if backend_at.is_some_and(|i| fds[i].revents != 0) {
                self.lost();
            }
            if ctrl_at.is_some_and(|i| fds[i].revents != 0) {
                self.serve_ctrl();
            }
            if fds[0].revents != 0 {
                let _ = self.wake.read();
                while let Ok(command) = self.commands.try_recv() {
                    match command {
                        Command::Start(run, reply) => {
                            let result = self.start(*run);
                            let _ = reply.send(result);
                        }
                        Command::Stop(reply) => {
                            self.stop();
                            let _ = reply.send(());
                        }
                        Command::ResetQueue(index, reply) => {
                            self.reset_queue(index);
                            let _ = reply.send(());
                        }
                        Command::EnableQueue(index, queue, reply) => {
                            let _ = reply.send(self.enable_queue(index, *queue));
                        }
                        Command::Exit => return,
                    }
                }
            }
            if self.backend.is_none() && self.last_attempt.elapsed() >= RECONNECT_EVERY {
                self.reconnect();
            }
        }
    }

    /// DRIVER_OK: the rings to the backend (kept for a backend that comes back).
    fn start(&mut self, run: Run) -> Result<(), String> {
        self.active_pairs = if self.ctrl_local { 1 } else { u16::MAX };
        self.local_ctrl = if self.ctrl_local {
            local_ctrl(&run).map_err(|e| format!("the control queue: {e}"))?
        } else {
            None
        };
        let plan = self.plan();
        let result = match &mut self.backend {
            Some(backend) => setup(backend, &run, false, plan).map_err(|e| e.to_string()),
            // The backend is away: the link stays down until it comes back.
            None => Ok(()),
        };
        if result.is_err() {
            self.metrics.setup_errors.add(1);
        }
        if run.interrupt.msix().is_none() {
            run.interrupt.set_external_queues(true);
        }
        self.run = Some(run);
        result
    }

    /// Which rings go to the backend, and which of them are enabled.
    fn plan(&self) -> RingPlan {
        RingPlan {
            ctrl_to_backend: !self.ctrl_local,
            active_pairs: self.active_pairs,
        }
    }

    /// Answers the control queue's commands (the VMM serves it): VQ_PAIRS_SET enables the
    /// backend's rings of the pairs in use and disables the others.
    fn serve_ctrl(&mut self) {
        let Some(mut ctrl) = self.local_ctrl.take() else {
            return;
        };
        let Some(run) = &self.run else {
            return;
        };
        let (backend, label, active) = (&mut self.backend, &self.label, &mut self.active_pairs);
        let served = ctrl.serve(&self.metrics.ctrl, |CtrlRequest::SetPairs(n)| {
            *active = n;
            let Some(backend) = backend.as_mut() else {
                // Set up so when the backend comes back.
                return true;
            };
            let plan = RingPlan {
                ctrl_to_backend: false,
                active_pairs: n,
            };
            match enable_rings(backend, run, plan) {
                Ok(()) => {
                    info!("virtio-net {label}: {n} queue pair(s) in use");
                    true
                }
                Err(e) => {
                    warn!("vhost-{label}: enabling {n} queue pair(s): {e}");
                    false
                }
            }
        });
        match served {
            Ok(true) => {
                if let Err(e) = run.interrupt.signal_queue(ctrl.index()) {
                    warn!("vhost-{}: signalling the control queue: {e}", self.label);
                }
                self.local_ctrl = Some(ctrl);
            }
            Ok(false) => self.local_ctrl = Some(ctrl),
            Err(e) => {
                error!(
                    "virtio-net {}: the driver broke the control queue: {e}; the device needs a reset",
                    self.label
                );
                let _ = run.interrupt.set_needs_reset();
            }
        }
    }

    /// A device reset: every ring stopped (GET_VRING_BASE), then the backend reset.
    fn stop(&mut self) {
        self.local_ctrl = None;
        let Some(run) = self.run.take() else {
            return;
        };
        if let Some(backend) = &self.backend {
            for index in rings_in_use(&run, !self.ctrl_local) {
                if let Err(e) = backend.frontend.get_vring_base(index) {
                    warn!("vhost-{}: GET_VRING_BASE({index}): {e}", self.label);
                }
            }
        }
    }

    /// Per-queue reset: the backend stops the ring (its other rings run on); the run forgets
    /// it until the driver enables it again.
    fn reset_queue(&mut self, index: usize) {
        let Some(run) = &mut self.run else {
            return;
        };
        let Some(queue) = run.queues.get_mut(index) else {
            return;
        };
        let was_ready = queue.ready();
        queue.set_ready(false);
        if was_ready {
            self.metrics.queue_resets.add(1);
        }
        if let (true, Some(backend)) = (was_ready, &self.backend) {
            if let Err(e) = backend.frontend.get_vring_base(index) {
                warn!("vhost-{}: GET_VRING_BASE({index}): {e}", self.label);
            }
        }
    }

    /// A reset ring enabled again: the backend gets it from its start.
    fn enable_queue(&mut self, index: usize, queue: Queue) -> Result<(), String> {
        let plan = self.plan();
        let Some(run) = &mut self.run else {
            return Err("the device is not running".into());
        };
        let slot = run
            .queues
            .get_mut(index)
            .ok_or_else(|| format!("no queue {index}"))?;
        *slot = queue;
        let Some(backend) = &mut self.backend else {
            // Set up with the others when the backend comes back.
            self.metrics.queue_reenables.add(1);
            return Ok(());
        };
        let result = setup_ring(backend, run, index, false)
            .and_then(|()| enable_ring(backend, run, index, plan));
        match result {
            Ok(()) => {
                self.metrics.queue_reenables.add(1);
                Ok(())
            }
            Err(e) => {
                self.metrics.setup_errors.add(1);
                Err(e.to_string())
            }
        }
    }

    /// The backend hung up.
    fn lost(&mut self) {
        self.backend = None;
        self.metrics.disconnects.add(1);
        self.metrics.connected.set(0);
        warn!(
            "virtio-net {}: the vhost-user backend on {:?} went away; link down until it is back",
            self.label,
            self.endpoint.path()
        );
        self.link.set_link(LinkState::Down);
        self.last_attempt = Instant::now() - RECONNECT_EVERY;
    }

    /// Looks for the backend again; a backend that is back gets the rings of the running
    /// driver, each from its used position.
    fn reconnect(&mut self) {
        self.last_attempt = Instant::now();
        let Ok(stream) = self.endpoint.try_connect() else {
            return;
        };
        let mut backend = match Backend::negotiate(stream, u16::MAX) {
            Ok(backend) => backend,
            Err(e) => {
                warn!(
                    "vhost-{}: the backend that connected failed to negotiate: {e}",
                    self.label
                );
                return;
            }
        };
        // What the backend must offer: not the configuration space's, nor per-queue reset
        // (the VMM's, through GET_VRING_BASE), nor the control queue's when the VMM serves it.
        let local = if self.ctrl_local { LOCAL_CTRL } else { 0 };
        let own = OWN | bit(VIRTIO_F_RING_RESET) | local;
        let needed = self
            .run
            .as_ref()
            .map_or(self.features & !own, |r| r.acked & !own);
        if (backend.features | VHOST_USER_F_PROTOCOL_FEATURES) & needed != needed {
            warn!(
                "vhost-{}: the backend came back without the features in use ({:#x} of {needed:#x})",
                self.label, backend.features
            );
            return;
        }
        self.metrics.connections.add(1);
        self.metrics.connected.set(1);
        if let Some(run) = &self.run {
            if run.acked & bit(VIRTIO_F_RING_PACKED) != 0 {
                // No used position in memory to resume a packed ring from.
                error!(
                    "virtio-net {}: the backend is back, but packed rings cannot resume: the \
                     driver must reset the device",
                    self.label
                );
                let _ = run.interrupt.set_needs_reset();
                self.backend = Some(backend);
                return;
            }
            if let Err(e) = setup(&mut backend, run, true, self.plan()) {
                self.metrics.setup_errors.add(1);
                warn!(
                    "vhost-{}: setting the rings up again failed: {e}",
                    self.label
                );
                return;
            }
            self.metrics.reconnects.add(1);
        }
        info!(
            "virtio-net {}: the vhost-user backend is back; link up",
            self.label
        );
        self.backend = Some(backend);
        self.link.set_link(LinkState::Up);
    }
}

/// The rings of `run` the backend serves: the ready datapath rings, and the control queue if
/// the backend serves it.
fn rings_in_use(run: &Run, ctrl_to_backend: bool) -> Vec<usize> {
    let ctrl_index = ctrl_index(run);
    run.queues
        .iter()
        .enumerate()
        .filter(|&(i, q)| q.ready() && (Some(i) != ctrl_index || ctrl_to_backend))
        .map(|(i, _)| i)
        .collect()
}

/// The control queue's index in `run`, if the driver acknowledged one (the last queue).
fn ctrl_index(run: &Run) -> Option<usize> {
    (run.acked & bit(VIRTIO_NET_F_CTRL_VQ) != 0).then(|| run.queues.len().saturating_sub(1))
}

/// The control queue of `run` for the VMM to serve, if the driver acknowledged one.
fn local_ctrl(run: &Run) -> Result<Option<LocalCtrl>, String> {
    let Some(index) = ctrl_index(run) else {
        return Ok(None);
    };
    let queue = &run.queues[index];
    if !queue.ready() {
        return Ok(None);
    }
    let kick = run.kicks[index].try_clone().map_err(|e| e.to_string())?;
    // The pairs the driver set up: VQ_PAIRS_SET may ask for those.
    let usable = run.queues[..index]
        .chunks_exact(2)
        .take_while(|pair| pair[0].ready() && pair[1].ready())
        .count();
    let usable = u16::try_from(usable).unwrap_or(u16::MAX);
    LocalCtrl::new(queue, &run.mem, run.acked, kick, index, usable)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Which rings of a run go to the backend, and which of them are enabled.
#[derive(Clone, Copy, Debug)]
struct RingPlan {
    /// The control queue's ring goes to the backend (it serves the queue).
    ctrl_to_backend: bool,
    /// The datapath rings of pairs `0..active_pairs` are enabled, the others disabled.
    active_pairs: u16,
}

/// SET_VRING_ENABLE of every ring of `run` the backend has, as `plan` says.
fn enable_rings(backend: &mut Backend, run: &Run, plan: RingPlan) -> vhost::Result<()> {
    if backend.features & VHOST_USER_F_PROTOCOL_FEATURES == 0 {
        // Without protocol features a ring runs once it has its kick.
        return Ok(());
    }
    for index in rings_in_use(run, plan.ctrl_to_backend) {
        enable_ring(backend, run, index, plan)?;
    }
    Ok(())
}

/// SET_VRING_ENABLE of ring `index` of `run`, as `plan` says (none without protocol features).
fn enable_ring(
    backend: &mut Backend,
    run: &Run,
    index: usize,
    plan: RingPlan,
) -> vhost::Result<()> {
    if backend.features & VHOST_USER_F_PROTOCOL_FEATURES == 0 {
        return Ok(());
    }
    let enable = Some(index) == ctrl_index(run) || index / 2 < usize::from(plan.active_pairs);
    backend.frontend.set_vring_enable(index, enable)
}

/// Hands the rings of `run` to `backend`: features, memory table, then per ring its size,
/// base, addresses (the VMM's own addresses of them), call and kick eventfds; then every ring's
/// enable.
/// `resume`: each split ring starts at its used index in guest memory (a backend that came
/// back); else at the queue's own indexes.
fn setup(backend: &mut Backend, run: &Run, resume: bool, plan: RingPlan) -> vhost::Result<()> {
    let rings = rings_in_use(run, plan.ctrl_to_backend);
    let features = backend.features;
    let f = &mut backend.frontend;
    // What the backend implements of what the driver acknowledged: not the configuration
    // space (the VMM's), the control queue's only if the backend serves it.
    let ctrl = if plan.ctrl_to_backend {
        CTRL_FEATURES
    } else {
        0
    };
    let device = run.acked & (PASSED_ON | ctrl);
    f.set_features(device | features & VHOST_USER_F_PROTOCOL_FEATURES)?;
    let regions = run
        .mem
        .iter()
        .map(VhostUserMemoryRegionInfo::from_guest_region)
        .collect::<vhost::Result<Vec<_>>>()?;
    f.set_mem_table(&regions)?;
    for &index in &rings {
        setup_ring(backend, run, index, resume)?;
    }
    // Enabled once all are set up, so that the backend starts its device once, with every
    // ring (a ring enabled as it is set up would restart it at each later ring's kick).
    enable_rings(backend, run, plan)
}

/// Hands ring `index` of `run` to the backend: size, base, addresses (the VMM's own addresses
/// of them), call and kick eventfds. `resume`: a split ring starts at its used index in guest
/// memory (a backend that came back); else at the queue's own indexes.
fn setup_ring(backend: &mut Backend, run: &Run, index: usize, resume: bool) -> vhost::Result<()> {
    let f = &mut backend.frontend;
    let host = |gpa: u64| -> vhost::Result<u64> {
        run.mem
            .get_host_address(GuestAddress(gpa))
            .map(|p| p as u64)
            .map_err(|_| vhost::Error::InvalidGuestMemory)
    };
    let packed = run.acked & bit(VIRTIO_F_RING_PACKED) != 0;
    let queue = &run.queues[index];
    let size = queue.size();
    f.set_vring_num(index, size)?;
    let base = if packed {
        0x8000
    } else if resume {
        run.mem
            .read_obj::<u16>(GuestAddress(queue.used_ring().wrapping_add(2)))
            .map(u16::from_le)
            .unwrap_or(0)
    } else {
        queue.next_avail()
    };
    f.set_vring_base(index, base)?;
    f.set_vring_addr(
        index,
        &VringConfigData {
            queue_max_size: size,
            queue_size: size,
            flags: 0,
            desc_table_addr: host(queue.desc_table())?,
            used_ring_addr: host(queue.used_ring())?,
            avail_ring_addr: host(queue.avail_ring())?,
            log_addr: None,
        },
    )?;
    let call = call_fd(&run.interrupt, index).map_err(vhost::Error::IOError)?;
    f.set_vring_call(index, &call)?;
    f.set_vring_kick(index, &run.kicks[index])
}

/// Queue `index`'s call eventfd: its MSI-X vector's irqfd, or the line's (an idle eventfd for
/// a queue without a vector: the driver wants no interrupt from it).
fn call_fd(interrupt: &VirtioInterrupt, index: usize) -> io::Result<EventFd> {
    if let Some(vectors) = interrupt.msix() {
        if let Some(irqfd) = vectors.irqfd(vectors.queue_vector(index)) {
            return irqfd.try_clone();
        }
        return EventFd::new(EFD_NONBLOCK);
    }
    match interrupt.irqfd() {
        Some(irqfd) => irqfd.try_clone(),
        None => EventFd::new(EFD_NONBLOCK),
    }
}
