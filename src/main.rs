//! The `vmm` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use devices::virtio::net::NetConfig;
use vmm::config::{BootSource, MachineConfig, VmConfig, DEFAULT_MEM_MIB};

/// A small KVM virtual machine monitor built around a tunable virtio-net datapath.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Guest kernel: an uncompressed ELF vmlinux (fastest) or a bzImage.
    #[arg(long, value_name = "PATH")]
    kernel: PathBuf,
    /// Initramfs to pass to the kernel (an uncompressed cpio boots fastest).
    #[arg(long, value_name = "PATH")]
    initrd: Option<PathBuf>,
    /// Kernel command line, replacing the default `console=ttyS0 reboot=k panic=-1`. The VMM
    /// appends what its devices and the host need.
    #[arg(long, value_name = "STR")]
    cmdline: Option<String>,
    /// Guest memory in MiB (32..=65536).
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MEM_MIB)]
    mem_size: u64,
    /// Number of vCPUs (1..=32).
    #[arg(long, value_name = "N", default_value_t = 1)]
    vcpus: u8,
    /// A virtio-net device on a host tap: `TAP` or `tap=TAP[,mac=MAC][,queue_size=N]`. The tap
    /// is opened, or created when it does not exist. Repeat for more devices.
    #[arg(long, value_name = "SPEC")]
    net: Vec<NetConfig>,
    /// Print device metrics as a JSON line on stderr every SECS seconds (always once at exit).
    #[arg(long, value_name = "SECS")]
    metrics_interval: Option<u64>,
}

impl Cli {
    fn into_config(self) -> VmConfig {
        VmConfig {
            boot_source: BootSource {
                kernel_image_path: self.kernel,
                initrd_path: self.initrd,
                boot_args: self.cmdline,
            },
            machine_config: MachineConfig {
                vcpu_count: self.vcpus,
                mem_size_mib: self.mem_size,
            },
            net: self.net,
            metrics_interval_secs: self.metrics_interval,
        }
    }
}

/// The error and its causes on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let config = Cli::parse().into_config();
    match vmm::run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vmm: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
