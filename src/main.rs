//! The `vmm` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use devices::virtio::net::NetConfig;
use vmm::config::{
    BootSource, MachineConfig, NetworkInterface, Transport, VmConfig, DEFAULT_MEM_MIB,
};
use vmm::seccomp::SeccompMode;
use vmm::{error_chain, Launch};

/// A small KVM virtual machine monitor built around a tunable virtio-net datapath.
///
/// Start a VM from flags (`--kernel ...`), from a Firecracker-style JSON file
/// (`--config-file`), or configure it through the REST API on a Unix socket (`--api-sock`);
/// the API can also serve a VM started from flags or a file.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Guest kernel: an uncompressed ELF vmlinux (fastest) or a bzImage.
    #[arg(long, value_name = "PATH", required_unless_present_any = ["config_file", "api_sock"], conflicts_with = "config_file")]
    kernel: Option<PathBuf>,
    /// Initramfs to pass to the kernel (an uncompressed cpio boots fastest).
    #[arg(long, value_name = "PATH", requires = "kernel")]
    initrd: Option<PathBuf>,
    /// Kernel command line, replacing the default `console=ttyS0 reboot=k panic=-1`. The VMM
    /// appends what its devices and the host need.
    #[arg(long, value_name = "STR", requires = "kernel")]
    cmdline: Option<String>,
    /// Guest memory in MiB (32..=65536).
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MEM_MIB, requires = "kernel")]
    mem_size: u64,
    /// Number of vCPUs (1..=32).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "kernel")]
    vcpus: u8,
    /// A virtio-net device on a host tap: `TAP` or
    /// `tap=TAP[,mac=MAC][,queue_size=N][,queues=N][,transport=mmio|pci]` (`queues`: queue
    /// pairs, 1..=16, a multi-queue tap when more than one; `transport`: virtio-mmio, the
    /// default, or virtio-pci with MSI-X). The tap is opened, or created when it does not
    /// exist. Repeat for more devices. Measurement instruments instead of a tap (never for
    /// real traffic): `backend=sink` (discards what the guest sends), `backend=source`
    /// (numbered test frames for the guest to receive, `frame_size=B`, default 64) or
    /// `backend=loop` (what the guest sends comes back, MACs swapped), each with an optional
    /// `rate_pps=R` (a NIC of R frames/s; none: as fast as the device goes). Or a device
    /// served by a vhost-user backend in another process: `vhost-user=SOCKET[,queues=N]
    /// [,queue_size=N][,transport=mmio|pci][,packed=on][,in_order=on][,mac=MAC]
    /// [,vhost_mode=client|server]` (interface vu0, vu1, …; see docs/vhost-user.md).
    #[arg(long, value_name = "SPEC", requires = "kernel", value_parser = parse_net)]
    net: Vec<NetSpec>,
    /// Boot the VM described by this JSON file (Firecracker's shape: `boot-source`,
    /// `machine-config`, `network-interfaces`).
    #[arg(long, value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// Serve the REST API (HTTP/1.1) on this Unix socket; without --kernel or --config-file
    /// the VM is configured and started through it.
    #[arg(long, value_name = "PATH")]
    api_sock: Option<PathBuf>,
    /// The instance id reported by `GET /`.
    #[arg(long, value_name = "ID", default_value = vmm::DEFAULT_INSTANCE_ID)]
    id: String,
    /// Per-thread seccomp filters (`off` only to debug).
    #[arg(long, value_enum, default_value_t = SeccompMode::On)]
    seccomp: SeccompMode,
    /// Print device metrics as a JSON line on stderr every SECS seconds (always once at exit).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    metrics_interval: Option<u64>,
}

/// A parsed `--net`: the device and its transport, or a vhost-user device.
#[derive(Clone, Debug)]
enum NetSpec {
    InProcess {
        config: NetConfig,
        transport: Option<Transport>,
    },
    VhostUser(NetworkInterface),
}

/// `--net`: the device description, with the MAC checked as strictly as in the API.
fn parse_net(spec: &str) -> Result<NetSpec, String> {
    if let Some(iface) = vmm::config::parse_vhost_user_spec(spec, "vu") {
        return iface.map(NetSpec::VhostUser).map_err(|e| e.to_string());
    }
    let (config, transport) = vmm::config::parse_net_spec(spec)?;
    Ok(NetSpec::InProcess { config, transport })
}

impl Cli {
    fn into_launch(self) -> Result<Launch, String> {
        let config = match (self.kernel, &self.config_file) {
            (Some(kernel), _) => Some(VmConfig {
                boot_source: Some(BootSource {
                    kernel_image_path: kernel,
                    initrd_path: self.initrd,
                    boot_args: self.cmdline,
                }),
                machine_config: MachineConfig {
                    vcpu_count: self.vcpus,
                    mem_size_mib: self.mem_size,
                    ..MachineConfig::default()
                },
                network_interfaces: self
                    .net
                    .into_iter()
                    .enumerate()
                    .map(|(i, spec)| match spec {
                        NetSpec::InProcess { config, transport } => NetworkInterface {
                            transport,
                            ..NetworkInterface::from_net_config(config)
                        },
                        // vu0, vu1, … (a tap's interface is named after its tap).
                        NetSpec::VhostUser(iface) => NetworkInterface {
                            iface_id: format!("vu{i}"),
                            ..iface
                        },
                    })
                    .collect(),
                drives: Vec::new(),
            }),
            (None, Some(path)) => Some(
                VmConfig::from_file(path)
                    .map_err(|e| format!("config file {path:?}: {}", error_chain(&e)))?,
            ),
            (None, None) => None,
        };
        Ok(Launch {
            config,
            api_sock: self.api_sock,
            seccomp: self.seccomp,
            metrics_interval: self.metrics_interval.map(Duration::from_secs),
            instance_id: self.id,
        })
    }
}

fn main() -> ExitCode {
    vmm::mark_process_start();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let launch = match Cli::parse().into_launch() {
        Ok(launch) => launch,
        Err(e) => {
            eprintln!("vmm: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match vmm::launch(launch) {
        Ok(vmm::VmEnd::GuestReset) => ExitCode::SUCCESS,
        // Stopped in order by SIGTERM/SIGINT: the shell's convention, 128 + the signal.
        Ok(vmm::VmEnd::Signal(signo)) => ExitCode::from(128 + signo as u8),
        Err(e) => {
            eprintln!("vmm: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
