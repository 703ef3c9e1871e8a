//! `vhost-user-net`: the project's virtio-net device served to a vhost-user frontend (QEMU,
//! Cloud Hypervisor, DPDK's virtio-user, `vmm --net vhost-user=`) in a process of its own.
//!
//! One main thread runs one event loop over the vhost-user socket (the listener between
//! frontends in server mode; the connection while a frontend is there), the API's requests,
//! SIGTERM/SIGINT and a one-second tick (the metrics line; reconnecting in client mode). The
//! frontend's messages go to `devices::virtio::vhost_user`, which activates and stops the
//! device; its datapath runs in the device's worker threads, as in `vmm`: the kicks the frontend
//! hands over are what the workers poll, its call eventfds what they signal.
//!
//! Threads and their seccomp filters: the API thread (`api`), the net workers (`net-worker`),
//! and the main thread (`vhost-user`), which installs its own once the device and the API are
//! up, before any frontend connects.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use devices::backend::NetBackend;
use devices::virtio::net::{BackendKind, NetDevice, NetMetrics, TuningControl};
use devices::virtio::vhost_user::{lock, Connection, ConnectionEnd, VhostUserBackend};
use serde_json::Value;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use crate::api::handler::{interface_info, patch_interface};
use crate::api::server::{ApiChannel, ApiMetrics, ApiServer};
use crate::api::{ActionType, InstanceInfo, VmmActionError, VmmRequest, VmmResponse, VmmResult};
use crate::config::NetworkInterface;
use crate::seccomp::{Filters, SeccompMode, ThreadKind};
use crate::{error_chain, signals, VmEnd, VmmError};

/// How often the loop ticks: the metrics line is due, or (client mode) a reconnection.
const TICK: Duration = Duration::from_secs(1);

/// What to run.
#[derive(Clone, Debug)]
pub struct DaemonLaunch {
    /// The vhost-user socket: listened on (server mode), or connected to (`client`).
    pub socket: PathBuf,
    /// Connect to the frontend's socket (and again whenever it goes away) instead of
    /// listening.
    pub client: bool,
    /// The device (`--net`), its iface id the name in the API and metrics.
    pub iface: NetworkInterface,
    /// Serve the API on this socket.
    pub api_sock: Option<PathBuf>,
    /// Per-thread seccomp filters.
    pub seccomp: SeccompMode,
    /// Print the metrics line on stderr this often (and always once at exit).
    pub metrics_interval: Option<Duration>,
    /// The instance id `GET /` shows.
    pub instance_id: String,
}

/// Runs the daemon until SIGTERM or SIGINT (`Ok(VmEnd::Signal)`) or a failure to start.
pub fn run(launch: DaemonLaunch) -> Result<VmEnd, VmmError> {
    let signals = signals::StopSignals::block().map_err(VmmError::Signals)?;
    crate::seccomp::cap_malloc_arenas();
    let filters = match launch.seccomp {
        SeccompMode::On => {
            crate::seccomp::install_sigsys_handler()?;
            crate::seccomp::install_panic_hook();
            Some(Filters::build()?)
        }
        SeccompMode::Off => {
            log::warn!("seccomp filters are off");
            None
        }
    };
    let config = launch.iface.net_config()?;
    let worker_filter = filters
        .as_ref()
        .map(|f| f.get(ThreadKind::NetWorker).clone());
    let net_err = |source| VmmError::Net {
        tap: config.tap.clone(),
        source,
    };
    let ctx = Context {
        launch: &launch,
        filters: filters.as_ref(),
        signals,
    };
    // One monomorphic datapath per backend kind, as in `vmm`.
    match config.backend {
        BackendKind::Tap => ctx.serve(NetDevice::new(&config).map_err(net_err)?, worker_filter),
        BackendKind::Sink => ctx.serve(NetDevice::sink(&config).map_err(net_err)?, worker_filter),
        BackendKind::Source => {
            ctx.serve(NetDevice::source(&config).map_err(net_err)?, worker_filter)
        }
        BackendKind::Loop => ctx.serve(NetDevice::looped(&config).map_err(net_err)?, worker_filter),
    }
}

struct Context<'a> {
    launch: &'a DaemonLaunch,
    filters: Option<&'a Filters>,
    signals: signals::StopSignals,
}

/// What woke the main thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Listener,
    Connection,
    Api,
    Signal,
    Tick,
}

impl Token {
    const ALL: [Token; 5] = [
        Token::Listener,
        Token::Connection,
        Token::Api,
        Token::Signal,
        Token::Tick,
    ];

    fn from_data(data: u64) -> Option<Token> {
        Token::ALL.into_iter().find(|t| *t as u64 == data)
    }
}

/// The daemon's state while it runs.
struct Daemon<'a, B: NetBackend> {
    launch: &'a DaemonLaunch,
    iface: NetworkInterface,
    backend: Arc<Mutex<VhostUserBackend<NetDevice<B>>>>,
    tuning: TuningControl,
    metrics: Arc<NetMetrics>,
    api_metrics: Arc<ApiMetrics>,
    api: Option<ApiChannel>,
    seccomp: bool,
    epoll: Epoll,
    listener: Option<UnixListener>,
    connection: Option<Connection<NetDevice<B>>>,
    started: Instant,
    last_metrics: Instant,
    exit: Option<VmEnd>,
}

impl Context<'_> {
    fn serve<B: NetBackend>(
        self,
        mut device: NetDevice<B>,
        worker_filter: Option<Arc<seccompiler::BpfProgram>>,
    ) -> Result<VmEnd, VmmError> {
        let launch = self.launch;
        let iface_id = launch.iface.iface_id.clone();
        let net_err = |source| VmmError::Net {
            tap: launch.iface.host_dev_name.clone(),
            source,
        };
        if let Some(filter) = worker_filter {
            device.set_worker_seccomp_filter(filter).map_err(net_err)?;
        }
        let tuning = device.tuning_control();
        tuning.set(launch.iface.tuning).map_err(|error| {
            VmmError::Config(crate::config::ConfigError::Tuning {
                iface_id: iface_id.clone(),
                error,
            })
        })?;
        let metrics = device.metrics();
        let label = launch.socket.display().to_string();
        let backend = Arc::new(Mutex::new(VhostUserBackend::new(device, &label)));
        let api_metrics = Arc::new(ApiMetrics::default());
        let (api_server, api) = match &launch.api_sock {
            Some(path) => {
                let filter = self.filters.map(|f| f.get(ThreadKind::Api).clone());
                let (server, channel) = ApiServer::start(path, filter, api_metrics.clone())?;
                (Some(server), Some(channel))
            }
            None => (None, None),
        };
        let mut tick = TimerFd::new().map_err(|e| VmmError::Epoll(crate::io_err(e)))?;
        tick.reset(TICK, Some(TICK))
            .map_err(|e| VmmError::Epoll(crate::io_err(e)))?;
        let epoll = self
            .event_sources(&tick, api.as_ref())
            .map_err(VmmError::Epoll)?;
        let listener = if launch.client {
            None
        } else {
            Some(listen(launch, &epoll)?)
        };
        let mut daemon = Daemon {
            launch,
            iface: launch.iface.clone(),
            backend,
            tuning,
            metrics,
            api_metrics,
            api,
            seccomp: self.filters.is_some(),
            epoll,
            listener,
            connection: None,
            started: Instant::now(),
            last_metrics: Instant::now(),
            exit: None,
        };
        if let Some(filters) = self.filters {
            filters.apply(ThreadKind::VhostUser)?;
        }
        if launch.client {
            daemon.reconnect();
        }
        let result = daemon.run(&self.signals, &mut tick);
        // The device stops with its frontend's connection.
        daemon.hang_up();
        daemon.api = None;
        daemon.print_metrics();
        if daemon.listener.is_some() {
            let _ = std::fs::remove_file(&launch.socket);
        }
        if let Some(server) = api_server {
            server.shutdown();
        }
        result
    }
}

impl Context<'_> {
    /// The loop's fixed sources: signals, the tick and the API.
    fn event_sources(&self, tick: &TimerFd, api: Option<&ApiChannel>) -> io::Result<Epoll> {
        let epoll = Epoll::new()?;
        let mut sources = vec![
            (self.signals.as_raw_fd(), Token::Signal),
            (tick.as_raw_fd(), Token::Tick),
        ];
        if let Some(api) = api {
            sources.push((api.wake.as_raw_fd(), Token::Api));
        }
        for (fd, token) in sources {
            watch(&epoll, ControlOperation::Add, fd, token)?;
        }
        Ok(epoll)
    }
}

/// Server mode: the socket, listened on and watched.
fn listen(launch: &DaemonLaunch, epoll: &Epoll) -> Result<UnixListener, VmmError> {
    let listener = crate::api::server::bind(&launch.socket)?;
    watch(
        epoll,
        ControlOperation::Add,
        listener.as_raw_fd(),
        Token::Listener,
    )
    .map_err(VmmError::Epoll)?;
    log::info!(
        "vhost-user-net: {:?} waiting for a frontend on {:?}",
        launch.iface.iface_id,
        launch.socket
    );
    Ok(listener)
}

fn watch(epoll: &Epoll, op: ControlOperation, fd: RawFd, token: Token) -> io::Result<()> {
    epoll.ctl(op, fd, EpollEvent::new(EventSet::IN, token as u64))
}

impl<B: NetBackend> Daemon<'_, B> {
    fn run(
        &mut self,
        signals: &signals::StopSignals,
        tick: &mut TimerFd,
    ) -> Result<VmEnd, VmmError> {
        let mut events = [EpollEvent::default(); 8];
        loop {
            let n = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(VmmError::Epoll(e)),
            };
            for event in &events[..n] {
                match Token::from_data(event.data()) {
                    Some(Token::Listener) => self.accept(),
                    Some(Token::Connection) => self.message(),
                    Some(Token::Api) => self.serve_api(),
                    Some(Token::Signal) => {
                        if let Some(signo) = signals.take() {
                            log::info!(
                                "{}: stopping (a second one ends the process at once)",
                                signals::name(signo)
                            );
                            signals.unblock_for_second();
                            self.exit.get_or_insert(VmEnd::Signal(signo));
                        }
                    }
                    Some(Token::Tick) => {
                        let _ = tick.wait();
                        self.tick();
                    }
                    None => log::warn!("vhost-user-net: unknown event {}", event.data()),
                }
            }
            if let Some(end) = self.exit {
                return Ok(end);
            }
        }
    }

    /// A frontend connects (server mode): it is served, and the listener rests until it goes.
    fn accept(&mut self) {
        let Some(listener) = &self.listener else {
            return;
        };
        match listener.accept() {
            Ok((stream, _)) => {
                log::info!("vhost-user-net: a frontend connected");
                self.attach(stream);
            }
            Err(e) => log::warn!("vhost-user-net: accept failed: {e}"),
        }
    }

    /// Client mode: connects to the frontend's socket; retried every tick until it answers.
    fn reconnect(&mut self) {
        if self.connection.is_some() {
            return;
        }
        match UnixStream::connect(&self.launch.socket) {
            Ok(stream) => {
                log::info!(
                    "vhost-user-net: connected to the frontend on {:?}",
                    self.launch.socket
                );
                self.attach(stream);
            }
            Err(e) => log::debug!("vhost-user-net: connecting: {e}; retrying"),
        }
    }

    fn attach(&mut self, stream: UnixStream) {
        let connection = match Connection::new(stream, self.backend.clone()) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("vhost-user-net: cannot serve the connection: {e}");
                return;
            }
        };
        if let Err(e) = watch(
            &self.epoll,
            ControlOperation::Add,
            connection.fd(),
            Token::Connection,
        ) {
            log::warn!("vhost-user-net: cannot watch the connection: {e}");
            return;
        }
        if let Some(listener) = &self.listener {
            let _ = watch(
                &self.epoll,
                ControlOperation::Delete,
                listener.as_raw_fd(),
                Token::Listener,
            );
        }
        self.connection = Some(connection);
    }

    /// The frontend's next message.
    fn message(&mut self) {
        let Some(connection) = &mut self.connection else {
            return;
        };
        if let Err(end) = connection.process() {
            match &end {
                ConnectionEnd::Disconnected => log::info!("vhost-user-net: {end}"),
                ConnectionEnd::Refused(_) => log::warn!(
                    "vhost-user-net: closing the frontend's connection: {}",
                    error_chain(&end)
                ),
            }
            self.hang_up();
        }
    }

    /// Ends the connection (the device stops, the frontend's memory goes) and waits for the
    /// next frontend.
    fn hang_up(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        let _ = watch(
            &self.epoll,
            ControlOperation::Delete,
            connection.fd(),
            Token::Connection,
        );
        drop(connection);
        if let Some(listener) = &self.listener {
            if self.exit.is_none() {
                let _ = watch(
                    &self.epoll,
                    ControlOperation::Add,
                    listener.as_raw_fd(),
                    Token::Listener,
                );
            }
        }
    }

    fn tick(&mut self) {
        if self.launch.client && self.exit.is_none() {
            self.reconnect();
        }
        if self
            .launch
            .metrics_interval
            .is_some_and(|every| self.last_metrics.elapsed() >= every)
        {
            self.last_metrics = Instant::now();
            self.print_metrics();
        }
    }

    fn running(&self) -> bool {
        lock(&self.backend).is_running()
    }

    fn state(&self) -> &'static str {
        if self.running() {
            "Running"
        } else {
            "Not started"
        }
    }

    /// `{"net": {IFACE_ID: {device counters, "backend", "host_dev_name", "vhost_user": {..},
    /// "vhost_user_socket"}}, "vmm": {..}}`: `vmm`'s document, with the vhost-user counters.
    fn metrics(&self) -> Value {
        let mut device = crate::metrics::net_device(
            &self.metrics,
            self.iface.backend(),
            &self.iface.host_dev_name,
        );
        if let Value::Object(fields) = &mut device {
            let vhost_user = lock(&self.backend).metrics();
            fields.insert(
                "vhost_user".into(),
                serde_json::to_value(&*vhost_user).unwrap_or(Value::Null),
            );
            fields.insert(
                "vhost_user_socket".into(),
                Value::String(self.launch.socket.display().to_string()),
            );
        }
        let mut nets = serde_json::Map::new();
        nets.insert(self.iface.iface_id.clone(), device);
        serde_json::json!({
            "net": nets,
            "vmm": {
                "state": self.state(),
                "uptime_seconds": self.started.elapsed().as_secs_f64(),
                "seccomp": self.seccomp,
                "api": &*self.api_metrics,
            }
        })
    }

    fn print_metrics(&self) {
        let line = format!("{}\n", self.metrics());
        let _ = io::Write::write_all(&mut io::stderr().lock(), line.as_bytes());
    }

    fn serve_api(&mut self) {
        let Some(api) = &self.api else {
            return;
        };
        let _ = api.wake.read();
        let calls: Vec<_> = api.requests.try_iter().collect();
        for call in calls {
            let result = self.handle(call.request);
            let _ = call.reply.send(result);
        }
    }

    /// The API's routes as `vhost-user-net` serves them: the interface given by `--net`, its
    /// metrics and run-time tuning; a VM's routes are refused.
    fn handle(&mut self, request: VmmRequest) -> VmmResult {
        let iface = |id: &str| {
            (id == self.iface.iface_id)
                .then_some(())
                .ok_or_else(|| VmmActionError::UnknownInterface(id.to_owned()))
        };
        match request {
            VmmRequest::GetInstanceInfo => json(&InstanceInfo {
                id: self.launch.instance_id.clone(),
                state: self.state().into(),
                vmm_version: env!("CARGO_PKG_VERSION").into(),
                app_name: "vhost-user-net".into(),
            }),
            VmmRequest::GetMetrics => Ok(VmmResponse::Metrics(self.metrics())),
            VmmRequest::GetVmConfig => json(&serde_json::json!({
                "network-interfaces": [&self.iface],
            })),
            VmmRequest::GetNetworkInterface(id) => {
                iface(&id)?;
                interface_info(&self.iface, Some(&self.tuning))
            }
            VmmRequest::PatchNetworkInterface(update) => {
                iface(&update.iface_id)?;
                patch_interface(&mut self.iface, Some(&self.tuning), update)
            }
            VmmRequest::Action(ActionType::FlushMetrics) => {
                self.print_metrics();
                Ok(VmmResponse::NoContent)
            }
            other => Err(VmmActionError::Other(format!(
                "vhost-user-net serves one network interface (given by --net): {} is not \
                 supported",
                request_name(&other)
            ))),
        }
    }
}

fn request_name(request: &VmmRequest) -> &'static str {
    match request {
        VmmRequest::PutNetworkInterface(_) => "PUT /network-interfaces",
        VmmRequest::PutBootSource(_) => "PUT /boot-source",
        VmmRequest::PutMachineConfig(_)
        | VmmRequest::PatchMachineConfig(_)
        | VmmRequest::GetMachineConfig => "/machine-config",
        VmmRequest::Action(_) => "this action",
        _ => "this request",
    }
}

fn json<T: serde::Serialize>(value: &T) -> VmmResult {
    serde_json::to_value(value)
        .map(VmmResponse::Json)
        .map_err(VmmActionError::Serialise)
}
