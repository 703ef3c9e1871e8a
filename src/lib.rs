//! `vmm`: a small KVM virtual machine monitor built around a tunable virtio-net datapath.
//!
//! [`launch`] runs the VMM thread: it boots a VM from a [`config::VmConfig`] given up front
//! (CLI flags or a config file) and/or serves the REST API ([`api`]) on a Unix socket, and
//! returns when the VM ends. [`run`] is the CLI's shortcut: boot this config, no API.

pub mod api;
pub mod boot;
pub mod bus;
pub mod config;
pub mod host;
pub mod kvm;
pub mod memory;
pub mod metrics;
pub mod seccomp;
pub mod vm;

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use crate::api::server::{ApiChannel, ApiMetrics, ApiServer, ApiServerError};
use crate::api::{ActionType, InstanceInfo, VmmRequest, VmmResponse, VmmResult};
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
/// Firecracker's answer to a pre-boot-only request after boot.
const NOT_AFTER_BOOT: &str = "The requested operation is not supported after starting the microVM.";

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
    #[error("cannot create a virtio transport: {0}")]
    Transport(String),
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    #[error("cannot start the API")]
    Api(#[from] ApiServerError),
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

/// Boots the VM described by `config` (no API) and runs it until the guest resets (`Ok`) or
/// something ends it abnormally (`Err`).
pub fn run(config: &VmConfig) -> Result<(), VmmError> {
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
/// the VM ends (or, API only, never before a VM ran).
pub fn launch(launch: Launch) -> Result<(), VmmError> {
    seccomp::cap_malloc_arenas();
    let filters = match launch.seccomp {
        SeccompMode::On => {
            seccomp::install_sigsys_handler()?;
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
    let epoll = Epoll::new().map_err(VmmError::Epoll)?;
    if let Some(channel) = &api_channel {
        epoll
            .ctl(
                ControlOperation::Add,
                channel.wake.as_raw_fd(),
                EpollEvent::new(EventSet::IN, Token::Api as u64),
            )
            .map_err(VmmError::Epoll)?;
    }
    let mut vmm = Vmm {
        config: launch.config.clone().unwrap_or_default(),
        vm: None,
        filters,
        epoll,
        api: api_channel,
        api_metrics,
        instance_id: launch.instance_id.clone(),
        exit: None,
    };
    let result = match launch.config {
        Some(_) => vmm.start_vm(),
        None => Ok(()),
    }
    .and_then(|()| vmm.run_loop(launch.metrics_interval));
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

/// What woke the VMM thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Api,
    Reset,
    VcpuExit,
}

impl Token {
    fn from_data(data: u64) -> Option<Token> {
        [Token::Api, Token::Reset, Token::VcpuExit]
            .into_iter()
            .find(|t| *t as u64 == data)
    }
}

/// The VMM thread's state.
struct Vmm {
    /// The configuration: being built (before boot), or the VM's (after).
    config: VmConfig,
    vm: Option<RunningVm>,
    filters: Option<Filters>,
    epoll: Epoll,
    api: Option<ApiChannel>,
    api_metrics: Arc<ApiMetrics>,
    instance_id: String,
    /// Set when the VM must end, with how.
    exit: Option<Result<(), VmmError>>,
}

pub(crate) fn unknown_iface(iface_id: &str) -> VmmActionError {
    VmmActionError(format!("no network interface {iface_id:?}"))
}

impl Vmm {
    fn run_loop(&mut self, metrics_every: Option<Duration>) -> Result<(), VmmError> {
        let mut events = [EpollEvent::default(); 8];
        let mut last_kick = Instant::now();
        let mut last_metrics = Instant::now();
        loop {
            let timeout = if self.vm.is_some() {
                WATCHDOG_PERIOD.as_millis() as i32
            } else {
                -1
            };
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(VmmError::Epoll(e)),
            };
            for event in &events[..n] {
                match Token::from_data(event.data()) {
                    Some(Token::Api) => self.serve_api(),
                    Some(Token::Reset) => {
                        log::info!("the guest reset the machine (i8042); stopping");
                        self.exit.get_or_insert(Ok(()));
                    }
                    Some(Token::VcpuExit) => {
                        match self.vm.as_ref().and_then(RunningVm::take_exit) {
                            Some(VcpuExit::Reset) => {
                                self.exit.get_or_insert(Ok(()));
                            }
                            Some(VcpuExit::Fault(msg)) => {
                                self.exit.get_or_insert(Err(VmmError::Guest(msg)));
                            }
                            Some(VcpuExit::Stopped) | None => {}
                        }
                    }
                    None => log::warn!("VMM: unknown epoll token {}", event.data()),
                }
            }
            if let Some(result) = self.exit.take() {
                return result;
            }
            if let Some(vm) = &self.vm {
                if last_kick.elapsed() >= WATCHDOG_PERIOD {
                    last_kick = Instant::now();
                    vm.kick_vcpus();
                }
                if metrics_every.is_some_and(|every| last_metrics.elapsed() >= every) {
                    last_metrics = Instant::now();
                    self.print_metrics();
                }
            }
        }
    }

    /// Builds and starts the VM from `self.config`, then confines the VMM thread.
    fn start_vm(&mut self) -> Result<(), VmmError> {
        let vm = RunningVm::start(&self.config, self.filters.as_ref())?;
        for (fd, token) in [
            (vm.reset_evt().as_raw_fd(), Token::Reset),
            (vm.vcpu_exit_evt().as_raw_fd(), Token::VcpuExit),
        ] {
            self.epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token as u64),
                )
                .map_err(VmmError::Epoll)?;
        }
        self.vm = Some(vm);
        // From here on the VMM thread only serves the API and watches the VM.
        if let Some(filters) = &self.filters {
            filters.apply(ThreadKind::Vmm)?;
        }
        Ok(())
    }

    /// Answers every queued API request.
    fn serve_api(&mut self) {
        let Some(api) = &self.api else {
            return;
        };
        // Read the wake-up first: a request sent after the drain below wakes us again.
        let _ = api.wake.read();
        let calls: Vec<_> = api.requests.try_iter().collect();
        for call in calls {
            let result = self.handle(call.request);
            // The API thread may have given up on the client; nothing to do then.
            let _ = call.reply.send(result);
        }
    }

    fn state(&self) -> &'static str {
        if self.vm.is_some() {
            "Running"
        } else {
            "Not started"
        }
    }

    fn handle(&mut self, request: VmmRequest) -> VmmResult {
        let running = self.vm.is_some();
        let refuse = |e: ConfigError| VmmActionError(e.to_string());
        match request {
            VmmRequest::GetInstanceInfo => json(&InstanceInfo {
                id: self.instance_id.clone(),
                state: self.state().into(),
                vmm_version: env!("CARGO_PKG_VERSION").into(),
                app_name: "vmm".into(),
            }),
            VmmRequest::GetVmConfig => json(&self.config),
            VmmRequest::GetMachineConfig => json(&self.config.machine_config),
            VmmRequest::GetMetrics => Ok(VmmResponse::Metrics(self.metrics())),
            VmmRequest::PutBootSource(_)
            | VmmRequest::PutMachineConfig(_)
            | VmmRequest::PatchMachineConfig(_)
            | VmmRequest::PutNetworkInterface(_)
                if running =>
            {
                Err(VmmActionError(NOT_AFTER_BOOT.into()))
            }
            VmmRequest::PutBootSource(boot_source) => {
                boot_source.validate().map_err(refuse)?;
                for (what, path) in [
                    Some(("kernel image", &boot_source.kernel_image_path)),
                    boot_source.initrd_path.as_ref().map(|p| ("initrd", p)),
                ]
                .into_iter()
                .flatten()
                {
                    File::open(path).map_err(|e| {
                        VmmActionError(format!("cannot open the {what} {path:?}: {e}"))
                    })?;
                }
                self.config.set_boot_source(boot_source).map_err(refuse)?;
                Ok(VmmResponse::NoContent)
            }
            VmmRequest::PutMachineConfig(machine) => {
                self.config.set_machine_config(machine).map_err(refuse)?;
                Ok(VmmResponse::NoContent)
            }
            VmmRequest::PatchMachineConfig(update) => {
                if update.is_empty() {
                    return Err(VmmActionError("the update changes nothing".into()));
                }
                let machine = self.config.machine_config.updated(&update);
                self.config.set_machine_config(machine).map_err(refuse)?;
                Ok(VmmResponse::NoContent)
            }
            VmmRequest::PutNetworkInterface(iface) => {
                self.config.put_network_interface(iface).map_err(refuse)?;
                Ok(VmmResponse::NoContent)
            }
            VmmRequest::PatchNetworkInterface(update) => {
                let id = update.iface_id;
                let Some(tuning) = update.tuning.filter(|t| !t.is_empty()) else {
                    return Err(VmmActionError(
                        "the update changes nothing (give a `tuning` object)".into(),
                    ));
                };
                let iface = self
                    .config
                    .network_interface_mut(&id)
                    .ok_or_else(|| unknown_iface(&id))?;
                let new = match &self.vm {
                    Some(vm) => vm.update_tuning(&id, &tuning)?,
                    None => {
                        let new = iface.tuning.updated(&tuning);
                        new.validate().map_err(|e| {
                            VmmActionError(format!("network interface {id:?}: {e}"))
                        })?;
                        new
                    }
                };
                iface.tuning = new;
                log::info!("network interface {id:?}: tuning now {new:?}");
                Ok(VmmResponse::NoContent)
            }
            VmmRequest::Action(ActionType::InstanceStart) => {
                if running {
                    return Err(VmmActionError("the VM is already running".into()));
                }
                self.config.validate().map_err(refuse)?;
                self.start_vm().map_err(|e| {
                    VmmActionError(format!("cannot start the VM: {}", error_chain(&e)))
                })?;
                Ok(VmmResponse::NoContent)
            }
            VmmRequest::Action(ActionType::SendCtrlAltDel) => {
                let Some(vm) = &self.vm else {
                    return Err(VmmActionError("the VM is not running".into()));
                };
                if vm.send_ctrl_alt_del() {
                    log::info!("Ctrl+Alt+Del sent to the guest's keyboard");
                } else {
                    // See the README ("SendCtrlAltDel"): no driver can receive the keys.
                    log::info!(
                        "Ctrl+Alt+Del: the guest has no i8042 keyboard driver (it never enabled \
                         the keyboard interrupt), so it cannot see the keys; stopping the VM"
                    );
                    self.exit.get_or_insert(Ok(()));
                }
                Ok(VmmResponse::NoContent)
            }
            VmmRequest::Action(ActionType::FlushMetrics) => {
                self.print_metrics();
                Ok(VmmResponse::NoContent)
            }
        }
    }

    /// The metrics document (see [`metrics`]).
    fn metrics(&self) -> Value {
        let (nets, uptime, vcpus) = match &self.vm {
            Some(vm) => (vm.net_metrics(), vm.uptime().as_secs_f64(), vm.vcpu_count()),
            None => (serde_json::Map::new(), 0.0, 0),
        };
        serde_json::json!({
            "net": nets,
            "vmm": {
                "state": self.state(),
                "uptime_seconds": uptime,
                "vcpus": vcpus,
                "seccomp": self.filters.is_some(),
                "api": &*self.api_metrics,
            }
        })
    }

    /// Prints the metrics as one JSON line on stderr.
    fn print_metrics(&self) {
        // One write: stderr is unbuffered, and other threads log there too.
        let line = format!("{}\n", self.metrics());
        let _ = io::Write::write_all(&mut io::stderr().lock(), line.as_bytes());
    }
}

/// The error and its causes on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn json<T: serde::Serialize>(value: &T) -> VmmResult {
    serde_json::to_value(value)
        .map(VmmResponse::Json)
        .map_err(|e| VmmActionError(format!("cannot serialise the answer: {e}")))
}
