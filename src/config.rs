//! The VM's configuration: one set of typed, validated values shared by the CLI (and later the
//! API and config file).

use std::path::PathBuf;

use devices::virtio::net::NetConfig;
use serde::{Deserialize, Serialize};

/// Smallest guest memory we accept: the kernel is linked at 16 MiB and needs room above it.
pub const MIN_MEM_MIB: u64 = 32;
/// Largest guest memory we accept (64 GiB); the host must also be able to back it.
pub const MAX_MEM_MIB: u64 = 64 * 1024;
/// Default guest memory. On hosts that emulate guest kernel code, each extra 128 MiB costs
/// ~1.6 s of boot in memmap init, so the default stays small.
pub const DEFAULT_MEM_MIB: u64 = 128;
/// Most vCPUs the MP table describes.
pub const MAX_VCPUS: u8 = 32;

/// The default kernel command line when the user gives none.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1";

/// Where the guest kernel comes from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    /// An uncompressed ELF `vmlinux` or a `bzImage`.
    pub kernel_image_path: PathBuf,
    /// An initramfs (cpio, optionally compressed; uncompressed boots fastest).
    pub initrd_path: Option<PathBuf>,
    /// The kernel command line; [`DEFAULT_CMDLINE`] when absent.
    pub boot_args: Option<String>,
}

/// vCPUs and memory.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    /// Number of vCPUs (1..=32).
    pub vcpu_count: u8,
    /// Guest memory in MiB (32..=65536).
    pub mem_size_mib: u64,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: DEFAULT_MEM_MIB,
        }
    }
}

/// Most virtio devices: each takes one IOAPIC pin from [`FIRST_VIRTIO_GSI`] to 23.
pub const MAX_VIRTIO_DEVICES: usize = 19;
/// The first GSI given to virtio devices (0–4 are the timer, keyboard, cascade and COM ports).
pub const FIRST_VIRTIO_GSI: u32 = 5;

/// Everything needed to start a VM.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// The kernel, initrd and command line.
    pub boot_source: BootSource,
    /// vCPUs and memory.
    #[serde(default)]
    pub machine_config: MachineConfig,
    /// virtio-net devices, in the order the guest sees them (eth0, eth1, …).
    #[serde(default)]
    pub net: Vec<NetConfig>,
    /// Print device metrics every this many seconds (and always once at exit).
    #[serde(default)]
    pub metrics_interval_secs: Option<u64>,
}

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("memory size {0} MiB is out of range ({MIN_MEM_MIB}..={MAX_MEM_MIB} MiB)")]
    MemSize(u64),
    #[error("vCPU count {0} is out of range (1..={MAX_VCPUS})")]
    VcpuCount(u8),
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("too many network devices: {0} (at most {MAX_VIRTIO_DEVICES})")]
    TooManyDevices(usize),
    #[error("tap {0:?} is used by two network devices")]
    DuplicateTap(String),
    #[error("metrics interval must be at least 1 second")]
    MetricsInterval,
}

impl VmConfig {
    /// Checks every value a user controls. Files are checked when they are opened.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let m = &self.machine_config;
        if !(MIN_MEM_MIB..=MAX_MEM_MIB).contains(&m.mem_size_mib) {
            return Err(ConfigError::MemSize(m.mem_size_mib));
        }
        if !(1..=MAX_VCPUS).contains(&m.vcpu_count) {
            return Err(ConfigError::VcpuCount(m.vcpu_count));
        }
        if self
            .boot_source
            .boot_args
            .as_deref()
            .is_some_and(|a| a.contains('\0'))
        {
            return Err(ConfigError::CmdlineNul);
        }
        if self.net.len() > MAX_VIRTIO_DEVICES {
            return Err(ConfigError::TooManyDevices(self.net.len()));
        }
        for (i, n) in self.net.iter().enumerate() {
            if self.net[..i].iter().any(|m| m.tap == n.tap) {
                return Err(ConfigError::DuplicateTap(n.tap.clone()));
            }
        }
        if self.metrics_interval_secs == Some(0) {
            return Err(ConfigError::MetricsInterval);
        }
        Ok(())
    }

    /// The command line the user asked for (before the VMM appends what it must).
    pub fn base_cmdline(&self) -> &str {
        self.boot_source
            .boot_args
            .as_deref()
            .unwrap_or(DEFAULT_CMDLINE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mem: u64, vcpus: u8) -> VmConfig {
        VmConfig {
            boot_source: BootSource {
                kernel_image_path: "k".into(),
                initrd_path: None,
                boot_args: None,
            },
            machine_config: MachineConfig {
                vcpu_count: vcpus,
                mem_size_mib: mem,
            },
            net: Vec::new(),
            metrics_interval_secs: None,
        }
    }

    #[test]
    fn validation_bounds() {
        assert_eq!(config(128, 1).validate(), Ok(()));
        assert_eq!(config(16, 1).validate(), Err(ConfigError::MemSize(16)));
        assert_eq!(
            config(MAX_MEM_MIB + 1, 1).validate(),
            Err(ConfigError::MemSize(MAX_MEM_MIB + 1))
        );
        assert_eq!(config(128, 0).validate(), Err(ConfigError::VcpuCount(0)));
        assert_eq!(config(128, 33).validate(), Err(ConfigError::VcpuCount(33)));
        let mut c = config(128, 1);
        c.net = vec![
            "tap0".parse().unwrap(),
            "tap=tap0,mac=02:00:00:00:00:09".parse().unwrap(),
        ];
        assert_eq!(c.validate(), Err(ConfigError::DuplicateTap("tap0".into())));
        c.net = (0..20)
            .map(|i| format!("tap{i}").parse().unwrap())
            .collect();
        assert_eq!(c.validate(), Err(ConfigError::TooManyDevices(20)));
        c.net.truncate(19);
        assert_eq!(c.validate(), Ok(()));
        c.metrics_interval_secs = Some(0);
        assert_eq!(c.validate(), Err(ConfigError::MetricsInterval));
    }

    #[test]
    fn json_shape_rejects_unknown_fields() {
        let ok = r#"{"boot_source":{"kernel_image_path":"/k"},"machine_config":{"vcpu_count":1,"mem_size_mib":64}}"#;
        let c: VmConfig = serde_json::from_str(ok).unwrap();
        assert_eq!(c.machine_config.mem_size_mib, 64);
        assert_eq!(c.base_cmdline(), DEFAULT_CMDLINE);
        let bad = r#"{"boot_source":{"kernel_image_path":"/k","bogus":1}}"#;
        assert!(serde_json::from_str::<VmConfig>(bad).is_err());
    }
}
