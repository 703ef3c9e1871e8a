//! The `vhost-user-net` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use devices::virtio::net::NetConfig;
use vmm::config::NetworkInterface;
use vmm::seccomp::SeccompMode;
use vmm::vhost_user_net::DaemonLaunch;
use vmm::{error_chain, VmEnd};

/// The project's virtio-net device as a vhost-user backend: QEMU, Cloud Hypervisor, DPDK's
/// virtio-user and `vmm --net vhost-user=` drive it from another process.
///
/// It listens on the socket (server mode, the default) or connects to a frontend's
/// (`--client`), serves one frontend at a time, and waits for the next one (or reconnects)
/// when it goes away.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The vhost-user socket: created and listened on, or (with --client) connected to.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Connect to the frontend's socket instead of listening, and again whenever it goes
    /// away (QEMU's `server=on` chardev).
    #[arg(long)]
    client: bool,
    /// The device, in `vmm`'s `--net` syntax: `TAP` or `tap=TAP[,queues=N][,packed=on]
    /// [,in_order=on][,...]`, or a measurement backend (`backend=sink|source|loop`). Every
    /// device key works except `transport` (the frontend is the transport).
    #[arg(long, value_name = "SPEC", value_parser = parse_net)]
    net: NetConfig,
    /// Serve the REST API's interface routes and `GET /metrics` on this Unix socket.
    #[arg(long, value_name = "PATH")]
    api_sock: Option<PathBuf>,
    /// The instance id reported by `GET /`.
    #[arg(long, value_name = "ID", default_value = vmm::DEFAULT_INSTANCE_ID)]
    id: String,
    /// Per-thread seccomp filters (`off` only to debug).
    #[arg(long, value_enum, default_value_t = SeccompMode::On)]
    seccomp: SeccompMode,
    /// Print the metrics as a JSON line on stderr every SECS seconds (always once at exit).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    metrics_interval: Option<u64>,
}

/// `--net`: `vmm`'s syntax, the MAC checked as strictly as in the API, no transport.
fn parse_net(spec: &str) -> Result<NetConfig, String> {
    match vmm::config::parse_net_spec(spec)? {
        (config, None) => Ok(config),
        (_, Some(_)) => Err("`transport` is the frontend's choice, not the backend's".into()),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    let launch = DaemonLaunch {
        socket: cli.socket,
        client: cli.client,
        iface: NetworkInterface::from_net_config(cli.net),
        api_sock: cli.api_sock,
        seccomp: cli.seccomp,
        metrics_interval: cli.metrics_interval.map(Duration::from_secs),
        instance_id: cli.id,
    };
    match vmm::vhost_user_net::run(launch) {
        Ok(VmEnd::Signal(signo)) => ExitCode::from(128 + signo as u8),
        Ok(VmEnd::GuestReset) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vhost-user-net: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
