//! `vmm`: a small KVM virtual machine monitor built around a tunable virtio-net datapath.
//!
//! [`launch`] runs the VMM thread: it boots a VM from a [`config::VmConfig`] given up front
//! (CLI flags or a config file) and/or serves the REST API ([`api`]) on a Unix socket, and
//! returns when the VM ends. [`run`] is the CLI's shortcut: boot this config, no API.

pub mod api;
pub mod boot;
pub mod bus;
pub mod config;
pub mod files;
pub mod host;
pub mod kvm;
pub mod memory;
pub mod metrics;
pub mod pci;
pub mod seccomp;
pub mod signals;
pub mod vhost_user_net;
pub mod vm;

use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};
use vmm_sys_util::timerfd::TimerFd;

use crate::api::server::{ApiChannel, ApiMetrics, ApiServer, ApiServerError};
use crate::boot::BootError;
use crate::bus::BusError;
use crate::config::{ConfigError, VmConfig};
use crate::kvm::vcpu::VcpuExit;
use crate::kvm::KvmError;
use crate::seccomp::{Filters, SeccompError, SeccompMode, ThreadKind};
use crate::vm::RunningVm;

pub use crate::api::VmmActionError;

/// How often the watchdog checks that the vCPUs make progress.
const WATCHDOG_PERIOD: Duration = Duration::from_secs(1);

/// Why the VMM could not run, or how the VM ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    #[error("cannot allocate {mib} MiB of guest memory")]
    Memory {
        mib: u64,
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error("cannot place a device on the bus")]
    Bus(#[from] BusError),
    #[error("cannot create an eventfd")]
    EventFd(#[source] io::Error),
    #[error("cannot set up the VMM's event loop")]
    Epoll(#[source] io::Error),
    #[error("cannot start a thread")]
    Thread(#[source] io::Error),
    #[error("the VM stopped: {0}")]
    Guest(String),
    #[error("cannot create the network device on tap {tap:?}")]
    Net {
        tap: String,
        #[source]
        source: devices::virtio::net::NetError,
    },
    #[error("cannot create the virtio transport of {iface_id:?}")]
    Transport {
        iface_id: String,
        #[source]
        source: devices::virtio::mmio::MmioError,
    },
    #[error("cannot create the virtio-pci transport of {iface_id:?}")]
    PciTransport {
        iface_id: String,
        #[source]
        source: devices::virtio::pci::PciTransportError,
    },
    #[error("cannot put {iface_id:?} on the PCI bus")]
    Pci {
        iface_id: String,
        #[source]
        source: pci::PciError,
    },
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    #[error("cannot start the API")]
    Api(#[from] ApiServerError),
    #[error("cannot set up SIGTERM/SIGINT handling")]
    Signals(#[source] io::Error),
    #[error("cannot create shared guest memory (a vhost-user device needs it)")]
    SharedMemory(#[source] crate::memory::SharedMemoryError),
    #[error("network interface {iface_id:?}: the vhost-user device")]
    VhostUser {
        iface_id: String,
        #[source]
        source: devices::virtio::net::vhost_user::VhostUserNetError,
    },
}

/// What to run.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// A VM to boot at once (from CLI flags or a config file).
    pub config: Option<VmConfig>,
    /// Serve the API on this Unix socket.
    pub api_sock: Option<PathBuf>,
    /// Per-thread seccomp filters.
    pub seccomp: SeccompMode,
    /// Print the metrics line on stderr this often (and always once at exit).
    pub metrics_interval: Option<Duration>,
    /// The instance id shown by `GET /`.
    pub instance_id: String,
}

/// How the VM ended without an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmEnd {
    /// The guest reset the machine (or Ctrl+Alt+Del ended a guest that cannot see it).
    GuestReset,
    /// The VMM was asked to stop by this signal (SIGTERM or SIGINT): the VM was stopped in
    /// order (vCPUs joined, counters published, metrics printed, API socket removed). The
    /// process exits with 128 + the signal number.
    Signal(i32),
}

/// Boots the VM described by `config` (no API) and runs it until the guest resets, a signal
/// stops it (`Ok`) or something ends it abnormally (`Err`).
pub fn run(config: &VmConfig) -> Result<VmEnd, VmmError> {
    launch(Launch {
        config: Some(config.clone()),
        instance_id: DEFAULT_INSTANCE_ID.into(),
        ..Launch::default()
    })
}

static PROCESS_START: OnceLock<Instant> = OnceLock::new();

/// Marks the moment the VMM started (`main` calls this first): the vCPU logs the VMM's own
/// start-up time, from here to its first `KVM_RUN`, against it. Later calls return the first
/// call's instant.
pub fn mark_process_start() -> Instant {
    *PROCESS_START.get_or_init(Instant::now)
}

/// Logs, once per VM, how long the VMM took from [`mark_process_start`] to the first
/// `KVM_RUN`, with the wall-clock time so that a caller can also count the process's exec
/// (`scripts/boot-time.sh` does).
pub(crate) fn log_first_run() {
    let wall = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let since = PROCESS_START
        .get()
        .map(|t| {
            format!(
                "{:.3} ms after the VMM started",
                t.elapsed().as_secs_f64() * 1e3
            )
        })
        .unwrap_or_else(|| "start-up time unknown".into());
    log::info!(
        "first KVM_RUN: {since} (unix time {}.{:06})",
        wall.as_secs(),
        wall.subsec_micros()
    );
}

/// The instance id when none is given (Firecracker's).
pub const DEFAULT_INSTANCE_ID: &str = "anonymous-instance";

/// Runs the VMM: boots `launch.config` if given, serves the API if asked, and returns when
/// the VM ends (or, API only, never before a VM ran), or SIGTERM/SIGINT asks it to stop.
///
/// Must be called before the process starts other threads: it blocks SIGTERM and SIGINT in
/// the calling thread, every thread it starts inherits that, and the VMM thread reads them
/// from a signalfd. After the first, a second one ends the process at once.
pub fn launch(launch: Launch) -> Result<VmEnd, VmmError> {
    let signals = signals::StopSignals::block().map_err(VmmError::Signals)?;
    seccomp::cap_malloc_arenas();
    let filters = match launch.seccomp {
        SeccompMode::On => {
            seccomp::install_sigsys_handler()?;
            seccomp::install_panic_hook();
            Some(Filters::build()?)
        }
        SeccompMode::Off => {
            log::warn!("seccomp filters are off");
            None
        }
    };
    // SAFETY-free: the handler does nothing; its only purpose is to make KVM_RUN return EINTR.
    extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}
    register_signal_handler(SIGRTMIN(), kick_handler)
        .map_err(|e| VmmError::Thread(io::Error::from_raw_os_error(e.errno())))?;

    let api_metrics = Arc::new(ApiMetrics::default());
    let (api_server, api_channel) = match &launch.api_sock {
        Some(path) => {
            let filter = filters.as_ref().map(|f| f.get(ThreadKind::Api).clone());
            let (server, channel) = ApiServer::start(path, filter, api_metrics.clone())?;
            (Some(server), Some(channel))
        }
        None => (None, None),
    };
    let mut tick = TimerFd::new().map_err(|e| VmmError::Epoll(io_err(e)))?;
    tick.reset(WATCHDOG_PERIOD, Some(WATCHDOG_PERIOD))
        .map_err(|e| VmmError::Epoll(io_err(e)))?;
    let vmm = Vmm {
        config: launch.config.clone().unwrap_or_default(),
        boot_at_start: launch.config.is_some(),
        vm: None,
        filters,
        api: api_channel,
        api_metrics,
        instance_id: launch.instance_id.clone(),
        tick,
        signals,
        metrics_every: launch.metrics_interval,
        last_metrics: Instant::now(),
        exit: None,
    };
    let mut manager: EventManager<Vmm> =
        EventManager::new().map_err(|e| VmmError::Epoll(event_err(e)))?;
    let id = manager.add_subscriber(vmm);
    let result = loop {
        if let Err(e) = manager.run() {
            break Err(VmmError::Epoll(event_err(e)));
        }
        match manager.subscriber_mut(id) {
            Ok(vmm) => {
                if let Some(result) = vmm.exit.take() {
                    break result;
                }
            }
            Err(e) => break Err(VmmError::Epoll(event_err(e))),
        }
    };
    // Not `remove_subscriber`: that unregisters each fd (epoll_ctl), which the VMM thread's
    // seccomp filter refuses once a VM ran. The epoll fd just goes with the manager.
    let vmm = match manager.subscriber_mut(id) {
        Ok(vmm) => vmm,
        Err(e) => return Err(VmmError::Epoll(event_err(e))),
    };
    // Answer nothing more: requests still queued get 503 once the channel is dropped.
    vmm.api = None;
    if let Some(vm) = &mut vmm.vm {
        vm.stop();
    }
    if vmm.vm.is_some() {
        vmm.print_metrics();
    }
    if let Some(server) = api_server {
        server.shutdown();
    }
    result
}

/// What woke the VMM thread (event-manager data tags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Api,
    Reset,
    VcpuExit,
    /// The periodic timer: the vCPU watchdog kick and the metrics line.
    Tick,
    /// SIGTERM or SIGINT.
    Signal,
}

impl Token {
    const ALL: [Token; 5] = [
        Token::Api,
        Token::Reset,
        Token::VcpuExit,
        Token::Tick,
        Token::Signal,
    ];

    fn from_data(data: u32) -> Option<Token> {
        Token::ALL.into_iter().find(|t| *t as u32 == data)
    }
}

/// The VMM thread's state, and its one event-manager subscriber.
///
/// The VMM thread's sources (API requests, the guest's reset, vCPU exits, the watchdog and
/// metrics timer, stop signals) all act on this one state, so one subscriber dispatches them
/// by token. The device workers keep their own hand-written epoll loop: see
/// `devices::virtio::net` (worker module) for why.
pub(crate) struct Vmm {
    /// The configuration: being built (before boot), or the VM's (after).
    pub(crate) config: VmConfig,
    /// Boot `config` as soon as the loop starts (CLI or config file).
    boot_at_start: bool,
    pub(crate) vm: Option<RunningVm>,
    pub(crate) filters: Option<Filters>,
    api: Option<ApiChannel>,
    pub(crate) api_metrics: Arc<ApiMetrics>,
    pub(crate) instance_id: String,
    tick: TimerFd,
    signals: signals::StopSignals,
    metrics_every: Option<Duration>,
    last_metrics: Instant,
    /// Set when the VM must end, with how.
    pub(crate) exit: Option<Result<VmEnd, VmmError>>,
}

impl MutEventSubscriber for Vmm {
    fn init(&mut self, ops: &mut EventOps) {
        let mut sources = vec![
            (self.tick.as_raw_fd(), Token::Tick),
            (self.signals.as_raw_fd(), Token::Signal),
        ];
        if let Some(api) = &self.api {
            sources.push((api.wake.as_raw_fd(), Token::Api));
        }
        for (fd, token) in sources {
            if let Err(e) = ops.add(Events::with_data_raw(fd, token as u32, EventSet::IN)) {
                self.exit = Some(Err(VmmError::Epoll(event_err(e))));
                return;
            }
        }
        if self.boot_at_start {
            if let Err(e) = self.start_vm(ops) {
                self.exit = Some(Err(e));
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match Token::from_data(events.data()) {
            Some(Token::Api) => self.serve_api(ops),
            Some(Token::Reset) => {
                log::info!("the guest reset the machine (i8042); stopping");
                self.exit.get_or_insert(Ok(VmEnd::GuestReset));
            }
            Some(Token::VcpuExit) => match self.vm.as_ref().and_then(RunningVm::take_exit) {
                Some(VcpuExit::Reset) => {
                    self.exit.get_or_insert(Ok(VmEnd::GuestReset));
                }
                Some(VcpuExit::Fault(msg)) => {
                    self.exit.get_or_insert(Err(VmmError::Guest(msg)));
                }
                Some(VcpuExit::Stopped) | None => {}
            },
            Some(Token::Tick) => self.tick(),
            Some(Token::Signal) => {
                if let Some(signo) = self.signals.take() {
                    log::info!(
                        "{}: stopping the VM (a second one ends the process at once)",
                        signals::name(signo)
                    );
                    self.signals.unblock_for_second();
                    self.exit.get_or_insert(Ok(VmEnd::Signal(signo)));
                }
            }
            None => log::warn!("VMM: unknown event token {}", events.data()),
        }
    }
}

impl Vmm {
    /// The periodic timer: kick the vCPUs (the watchdog) and print the metrics when due.
    fn tick(&mut self) {
        let _ = self.tick.wait();
        if let Some(vm) = &self.vm {
            vm.kick_vcpus();
            if self
                .metrics_every
                .is_some_and(|every| self.last_metrics.elapsed() >= every)
            {
                self.last_metrics = Instant::now();
                self.print_metrics();
            }
        }
    }

    /// Builds and starts the VM from `self.config`, then confines the VMM thread.
    pub(crate) fn start_vm(&mut self, ops: &mut EventOps) -> Result<(), VmmError> {
        let vm = RunningVm::start(&self.config, self.filters.as_ref())?;
        for (fd, token) in [
            (vm.reset_evt().as_raw_fd(), Token::Reset),
            (vm.vcpu_exit_evt().as_raw_fd(), Token::VcpuExit),
        ] {
            ops.add(Events::with_data_raw(fd, token as u32, EventSet::IN))
                .map_err(|e| VmmError::Epoll(event_err(e)))?;
        }
        self.vm = Some(vm);
        // From here on the VMM thread only serves the API and watches the VM.
        if let Some(filters) = &self.filters {
            filters.apply(ThreadKind::Vmm)?;
        }
        Ok(())
    }

    /// Answers every queued API request.
    fn serve_api(&mut self, ops: &mut EventOps) {
        let Some(api) = &self.api else {
            return;
        };
        // Read the wake-up first: a request sent after the drain below wakes us again.
        let _ = api.wake.read();
        let calls: Vec<_> = api.requests.try_iter().collect();
        for call in calls {
            let result = self.handle(call.request, ops);
            // The API thread may have given up on the client; nothing to do then.
            let _ = call.reply.send(result);
        }
    }

    pub(crate) fn state(&self) -> &'static str {
        if self.vm.is_some() {
            "Running"
        } else {
            "Not started"
        }
    }

    /// Prints the metrics as one JSON line on stderr.
    pub(crate) fn print_metrics(&self) {
        // One write: stderr is unbuffered, and other threads log there too.
        let line = format!("{}\n", self.metrics());
        let _ = io::Write::write_all(&mut io::stderr().lock(), line.as_bytes());
    }
}

pub use devices::error_chain;

pub(crate) fn io_err(e: vmm_sys_util::errno::Error) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

fn event_err(e: event_manager::Error) -> io::Error {
    match e {
        event_manager::Error::Epoll(e) => io_err(e),
        e => io::Error::other(format!("{e}")),
    }
}
