//! The VM's configuration: one set of typed, validated values shared by the CLI flags, the
//! config file (`--config-file`) and the API.
//!
//! The JSON shapes are Firecracker's where we overlap: a [`VmConfig`] is Firecracker's config
//! file (`boot-source`, `machine-config`, `network-interfaces`), and each part is the body of
//! the matching `PUT` request. Every way in goes through the same `validate` functions; the
//! API applies them to each request as it arrives, and again to the whole configuration at
//! `InstanceStart`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use devices::backend::validate_ifname;
use devices::virtio::net::vhost_user::VhostUserNetConfig;
use devices::virtio::net::{
    BackendKind, MacAddr, NetConfig, NetConfigError, NetTuning, NetTuningUpdate, RateLimiterConfig,
    TuningError,
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Smallest guest memory we accept: the kernel is linked at 16 MiB and needs room above it.
pub const MIN_MEM_MIB: u64 = 32;
/// Largest guest memory we accept (64 GiB); the host must also be able to back it.
pub const MAX_MEM_MIB: u64 = 64 * 1024;
/// Default guest memory. On hosts that emulate guest kernel code, each extra 128 MiB costs
/// ~1.6 s of boot in memmap init, so the default stays small.
pub const DEFAULT_MEM_MIB: u64 = 128;
/// Most vCPUs the MP table describes.
pub const MAX_VCPUS: u8 = 32;
/// Longest interface id (as Firecracker).
pub const MAX_IFACE_ID_LEN: usize = 64;

/// Largest config file read (`--config-file`); real ones are a few hundred bytes.
pub const MAX_CONFIG_FILE_BYTES: usize = 1 << 20;

/// The default kernel command line when the user gives none.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1";

/// Where the guest kernel comes from (`PUT /boot-source`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    /// An uncompressed ELF `vmlinux` or a `bzImage`.
    pub kernel_image_path: PathBuf,
    /// An initramfs (cpio, optionally compressed; uncompressed boots fastest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<PathBuf>,
    /// The kernel command line; [`DEFAULT_CMDLINE`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
}

impl BootSource {
    /// Checks the values (the files are checked when they are opened).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kernel_image_path.as_os_str().is_empty() {
            return Err(ConfigError::EmptyPath("kernel_image_path"));
        }
        if self
            .initrd_path
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(ConfigError::EmptyPath("initrd_path"));
        }
        if let Some(args) = &self.boot_args {
            if args.contains('\0') {
                return Err(ConfigError::CmdlineNul);
            }
            let max = crate::boot::max_user_cmdline_len();
            if args.len() > max {
                return Err(ConfigError::CmdlineTooLong {
                    len: args.len(),
                    max,
                });
            }
        }
        Ok(())
    }
}

/// vCPUs and memory (`PUT /machine-config`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    /// Number of vCPUs (1..=32).
    pub vcpu_count: u8,
    /// Guest memory in MiB (32..=65536).
    pub mem_size_mib: u64,
    /// Simultaneous multithreading: accepted for compatibility, only `false`.
    #[serde(default)]
    pub smt: bool,
    /// Dirty-page tracking (for snapshots): accepted for compatibility, only `false`.
    #[serde(default)]
    pub track_dirty_pages: bool,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: DEFAULT_MEM_MIB,
            smt: false,
            track_dirty_pages: false,
        }
    }
}

impl MachineConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_MEM_MIB..=MAX_MEM_MIB).contains(&self.mem_size_mib) {
            return Err(ConfigError::MemSize(self.mem_size_mib));
        }
        if !(1..=MAX_VCPUS).contains(&self.vcpu_count) {
            return Err(ConfigError::VcpuCount(self.vcpu_count));
        }
        if self.smt {
            return Err(ConfigError::Unsupported("smt: true"));
        }
        if self.track_dirty_pages {
            return Err(ConfigError::Unsupported("track_dirty_pages: true"));
        }
        Ok(())
    }

    /// This configuration with the fields `update` sets replaced.
    pub fn updated(&self, update: &MachineConfigUpdate) -> MachineConfig {
        MachineConfig {
            vcpu_count: update.vcpu_count.unwrap_or(self.vcpu_count),
            mem_size_mib: update.mem_size_mib.unwrap_or(self.mem_size_mib),
            smt: update.smt.unwrap_or(self.smt),
            track_dirty_pages: update.track_dirty_pages.unwrap_or(self.track_dirty_pages),
        }
    }
}

/// A partial change of [`MachineConfig`] (`PATCH /machine-config`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigUpdate {
    /// New vCPU count.
    pub vcpu_count: Option<u8>,
    /// New memory size.
    pub mem_size_mib: Option<u64>,
    /// See [`MachineConfig::smt`].
    pub smt: Option<bool>,
    /// See [`MachineConfig::track_dirty_pages`].
    pub track_dirty_pages: Option<bool>,
}

impl MachineConfigUpdate {
    /// True when the update changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == MachineConfigUpdate::default()
    }
}

/// How a virtio device reaches the guest (`transport=` in `--net`, `transport` in the API).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// virtio-mmio: a register page declared on the kernel command line, one IOAPIC pin
    /// shared by every queue. The default: the guest needs no PCI support, which costs boot
    /// time under emulation (see `docs/benchmarks.md`, "Guest boot").
    #[default]
    Mmio,
    /// Modern virtio-pci on bus 0 (configuration ports 0xCF8/0xCFC), BAR0 in the PCI MMIO
    /// window, one MSI-X vector per queue plus the configuration vector.
    Pci,
}

impl Transport {
    /// The name used in specs and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Mmio => "mmio",
            Transport::Pci => "pci",
        }
    }
}

impl std::str::FromStr for Transport {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Transport, ConfigError> {
        match s {
            "mmio" => Ok(Transport::Mmio),
            "pci" => Ok(Transport::Pci),
            _ => Err(ConfigError::InvalidTransport(s.to_owned())),
        }
    }
}

/// A `--net vhost-user=PATH[,queues=N][,queue_size=N][,transport=mmio|pci][,packed=on]
/// [,in_order=on][,mac=MAC][,vhost_mode=client|server]` spec: the interface `iface_id`, its
/// device served by the vhost-user backend on PATH. `None`: the spec is not a vhost-user one.
pub fn parse_vhost_user_spec(
    spec: &str,
    iface_id: &str,
) -> Option<Result<NetworkInterface, ConfigError>> {
    let socket = spec
        .split(',')
        .find_map(|item| item.strip_prefix("vhost-user="))?;
    let mut iface = NetworkInterface::vhost_user(iface_id, PathBuf::from(socket));
    let bad = |key: &str, value: &str, expected: &'static str| ConfigError::Net {
        iface_id: iface_id.to_owned(),
        error: NetConfigError::InvalidValue {
            key: key.to_owned(),
            value: value.to_owned(),
            expected,
        },
    };
    let on_off = |key: &str, value: &str| match value {
        "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        _ => Err(bad(key, value, "on or off")),
    };
    for item in spec.split(',') {
        let (key, value) = item.split_once('=').unwrap_or((item, ""));
        let result = match key {
            "vhost-user" => Ok(()),
            "queues" => value
                .parse()
                .map(|v| iface.queues = Some(v))
                .map_err(|_| bad(key, value, "1..=16")),
            "queue_size" => value
                .parse()
                .map(|v| iface.queue_size = Some(v))
                .map_err(|_| bad(key, value, "a power of two, 2..=32768")),
            "packed" => on_off(key, value).map(|v| iface.packed = Some(v)),
            "in_order" => on_off(key, value).map(|v| iface.in_order = Some(v)),
            "mac" => parse_guest_mac(value).map(|mac| iface.guest_mac = Some(mac)),
            "transport" => value.parse().map(|t| iface.transport = Some(t)),
            "vhost_mode" => match value {
                "client" => Ok(VhostMode::Client),
                "server" => Ok(VhostMode::Server),
                _ => Err(bad(key, value, "client or server")),
            }
            .map(|mode| iface.vhost_mode = Some(mode)),
            _ => Err(ConfigError::VhostUser {
                iface_id: iface_id.to_owned(),
                what: "a vhost-user spec takes vhost-user, queues, queue_size, transport, \
                       packed, in_order, mac and vhost_mode (the datapath's keys are the \
                       backend's: vhost-user-net --net)",
            }),
        };
        if let Err(e) = result {
            return Some(Err(e));
        }
    }
    Some(
        iface
            .vhost_user_config()
            .map(|c| c.map(|_| iface))
            .unwrap_or_else(|| {
                Err(ConfigError::VhostUser {
                    iface_id: iface_id.to_owned(),
                    what: "no socket",
                })
            }),
    )
}

/// An in-process `--net` spec: the device (the MAC checked as strictly as in the API) and the
/// transport, if given. The message of an error is the command line's.
pub fn parse_net_spec(spec: &str) -> Result<(NetConfig, Option<Transport>), String> {
    let (spec, transport) = split_transport(spec).map_err(|e| e.to_string())?;
    for item in spec.split(',') {
        if let Some(mac) = item.strip_prefix("mac=") {
            parse_guest_mac(mac).map_err(|e| e.to_string())?;
        }
    }
    let config = spec.parse().map_err(|e: NetConfigError| e.to_string())?;
    Ok((config, transport))
}

/// Takes `transport=pci|mmio` out of a `--net` spec: the rest (for [`NetConfig`]'s parser)
/// and the transport, if given.
pub fn split_transport(spec: &str) -> Result<(String, Option<Transport>), ConfigError> {
    let mut transport = None;
    let mut rest = Vec::new();
    for item in spec.split(',') {
        match item.strip_prefix("transport=") {
            Some(value) => {
                if transport.replace(value.parse::<Transport>()?).is_some() {
                    return Err(ConfigError::DuplicateTransport);
                }
            }
            None => rest.push(item),
        }
    }
    if transport.is_some() && rest.iter().all(|item| item.is_empty()) {
        return Err(ConfigError::NetSpecWithoutTap);
    }
    Ok((rest.join(","), transport))
}

/// A virtio-net device on a host tap (`PUT /network-interfaces/{iface_id}`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterface {
    /// The interface's name in the API and in the metrics.
    pub iface_id: String,
    /// The host tap (opened, or created when it does not exist). Empty or absent with a
    /// measurement backend.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_dev_name: String,
    /// Extension: `tap` (default) or a measurement backend, `sink`, `source` or `loop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// Extension, measurement backends: the frame rate a sink or loop takes, or a source
    /// offers (none: as fast as the device goes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_pps: Option<u64>,
    /// Extension, `source`: Ethernet bytes per generated frame (20..=9014, default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_size: Option<u16>,
    /// The guest's MAC address; derived from the tap name when absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_guest_mac"
    )]
    pub guest_mac: Option<MacAddr>,
    /// Extension: the size of each queue (a power of two, 2..=32768; default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_size: Option<u16>,
    /// Extension: queue pairs (1..=16; default 1). More than one offers VIRTIO_NET_F_MQ and
    /// opens the tap multi-queue (one fd and one worker thread per pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// Firecracker's receive rate limiter (also changed by `PATCH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    /// Firecracker's transmit rate limiter (also changed by `PATCH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<RateLimiterConfig>,
    /// Extension: the device's runtime knobs (also changed by `PATCH`).
    #[serde(default)]
    pub tuning: NetTuning,
    /// Extension: `mmio` (default) or `pci`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
    /// Extension: transmit batched through io_uring where the kernel allows it (default
    /// true); false: one `write` (or `writev`) per frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_uring: Option<bool>,
    /// Extension: offer the packed virtqueue layout, VIRTIO_F_RING_PACKED (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packed: Option<bool>,
    /// Extension: offer VIRTIO_F_IN_ORDER (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_order: Option<bool>,
    /// A vhost-user backend's socket: the device's datapath runs in that process (no tap,
    /// no backend key, no rate limiter or tuning here: the backend has its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user_socket: Option<PathBuf>,
    /// Who connects on `vhost_user_socket` (Cloud Hypervisor's `vhost_mode`): `client` (the
    /// default: the VMM connects to a listening backend) or `server` (the VMM listens; the
    /// backend connects, `vhost-user-net --client`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_mode: Option<VhostMode>,
}

/// Who connects on a vhost-user socket (see [`NetworkInterface::vhost_mode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VhostMode {
    /// The VMM connects (the backend listens).
    #[default]
    Client,
    /// The VMM listens (the backend connects).
    Server,
}

impl NetworkInterface {
    /// The interface for a CLI `--net` device: the tap name is also its id.
    pub fn from_net_config(config: NetConfig) -> NetworkInterface {
        let measurement = config.backend.is_measurement();
        NetworkInterface {
            iface_id: config.tap.clone(),
            host_dev_name: if measurement {
                String::new()
            } else {
                config.tap
            },
            backend: measurement.then_some(config.backend),
            rate_pps: config.rate_pps,
            frame_size: config.frame_size,
            guest_mac: Some(config.mac),
            queue_size: Some(config.queue_size),
            queues: (config.queues > 1).then_some(config.queues),
            rx_rate_limiter: limited(config.rx_rate_limiter),
            tx_rate_limiter: limited(config.tx_rate_limiter),
            tuning: config.tuning,
            transport: None,
            io_uring: (!config.io_uring).then_some(false),
            packed: config.packed.then_some(true),
            in_order: config.in_order.then_some(true),
            vhost_user_socket: None,
            vhost_mode: None,
        }
    }

    /// An interface `iface_id` with nothing else given (no tap yet: fill in what it needs).
    pub fn named(iface_id: &str) -> NetworkInterface {
        NetworkInterface {
            iface_id: iface_id.to_owned(),
            host_dev_name: String::new(),
            backend: None,
            rate_pps: None,
            frame_size: None,
            guest_mac: None,
            queue_size: None,
            queues: None,
            rx_rate_limiter: None,
            tx_rate_limiter: None,
            tuning: NetTuning::default(),
            transport: None,
            io_uring: None,
            packed: None,
            in_order: None,
            vhost_user_socket: None,
            vhost_mode: None,
        }
    }

    /// An interface whose device is served by the vhost-user backend on `socket`.
    pub fn vhost_user(iface_id: &str, socket: PathBuf) -> NetworkInterface {
        NetworkInterface {
            vhost_user_socket: Some(socket),
            ..NetworkInterface::named(iface_id)
        }
    }

    /// The vhost-user device's description, when the interface is one (validated).
    pub fn vhost_user_config(&self) -> Option<Result<VhostUserNetConfig, ConfigError>> {
        let socket = self.vhost_user_socket.as_ref()?;
        let refuse = |what| {
            Err(ConfigError::VhostUser {
                iface_id: self.iface_id.clone(),
                what,
            })
        };
        if socket.as_os_str().is_empty() {
            return Some(refuse("the socket path is empty"));
        }
        let in_process_only = !self.host_dev_name.is_empty()
            || self.backend.is_some()
            || self.rate_pps.is_some()
            || self.frame_size.is_some()
            || self.io_uring.is_some()
            || self.rx_rate_limiter.is_some()
            || self.tx_rate_limiter.is_some()
            || self.tuning != NetTuning::default();
        if in_process_only {
            return Some(refuse(
                "a tap, a backend, rate limiters and tuning belong to the backend's own \
                 configuration (vhost-user-net --net)",
            ));
        }
        // The queue bounds as any device's (a measurement spec of the same shape).
        let checked = NetConfig::with_backend_kind(
            BackendKind::Sink,
            Some(self.iface_id.clone()),
            Some(
                self.guest_mac
                    .unwrap_or(MacAddr::derived_from(&self.iface_id)),
            ),
            self.queue_size,
        )
        .and_then(|c| c.with_queues(self.queues.unwrap_or(1)));
        Some(match checked {
            Ok(c) => Ok(VhostUserNetConfig {
                socket: socket.clone(),
                backend_connects: self.vhost_mode == Some(VhostMode::Server),
                queues: c.queues,
                queue_size: c.queue_size,
                packed: self.packed.unwrap_or(false),
                in_order: self.in_order.unwrap_or(false),
                mac: c.mac,
            }),
            Err(error) => Err(ConfigError::Net {
                iface_id: self.iface_id.clone(),
                error,
            }),
        })
    }

    /// The guest's MAC address on this interface.
    pub fn mac(&self) -> Result<MacAddr, ConfigError> {
        match self.vhost_user_config() {
            Some(config) => Ok(config?.mac),
            None => Ok(self.net_config()?.mac),
        }
    }

    /// The backend in force (a tap when not given).
    pub fn backend(&self) -> BackendKind {
        self.backend.unwrap_or_default()
    }

    /// The transport in force (`mmio` when not given).
    pub fn transport(&self) -> Transport {
        self.transport.unwrap_or_default()
    }

    /// The device description (validated).
    pub fn net_config(&self) -> Result<NetConfig, ConfigError> {
        let measurement = self.backend().is_measurement();
        let name = if !self.host_dev_name.is_empty() {
            Some(self.host_dev_name.clone())
        } else if measurement && validate_ifname(&self.iface_id).is_ok() {
            // A measurement backend is named after its interface (logs, worker thread).
            Some(self.iface_id.clone())
        } else {
            None
        };
        // A measurement backend's MAC comes from the interface's id, so that two differ.
        let mac = if measurement {
            Some(
                self.guest_mac
                    .unwrap_or(MacAddr::derived_from(&self.iface_id)),
            )
        } else {
            self.guest_mac
        };
        NetConfig::with_backend_kind(self.backend(), name, mac, self.queue_size)
            .and_then(|c| c.with_backend_options(self.rate_pps, self.frame_size))
            .and_then(|c| c.with_queues(self.queues.unwrap_or(1)))
            .map(|c| {
                c.with_io_uring(self.io_uring.unwrap_or(true))
                    .with_ring_features(
                        self.packed.unwrap_or(false),
                        self.in_order.unwrap_or(false),
                    )
            })
            .and_then(|c| {
                c.with_rate_limiters(
                    self.rx_rate_limiter.unwrap_or_default(),
                    self.tx_rate_limiter.unwrap_or_default(),
                )
            })
            .map_err(|error| ConfigError::Net {
                iface_id: self.iface_id.clone(),
                error,
            })
    }

    /// Checks the id, the device description and the tuning.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_iface_id(&self.iface_id)?;
        if let Some(mac) = self.guest_mac {
            check_guest_mac(mac)?;
        }
        if let Some(config) = self.vhost_user_config() {
            return config.map(|_| ());
        }
        self.net_config()?;
        self.tuning.validate().map_err(|error| ConfigError::Tuning {
            iface_id: self.iface_id.clone(),
            error,
        })
    }
}

/// Parses a guest MAC address strictly: six groups of exactly two hex digits separated by
/// `:` (no signs, no spaces), neither multicast (bit 0 of the first byte: a guest needs a
/// unicast address) nor all zero.
pub fn parse_guest_mac(text: &str) -> Result<MacAddr, ConfigError> {
    let bad = |reason| ConfigError::InvalidMac {
        mac: text.to_owned(),
        reason,
    };
    let groups: Vec<&str> = text.split(':').collect();
    if groups.len() != 6 {
        return Err(bad("expected six groups xx:xx:xx:xx:xx:xx"));
    }
    let mut bytes = [0u8; 6];
    for (byte, group) in bytes.iter_mut().zip(&groups) {
        if group.len() != 2 || !group.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("each group is two hex digits"));
        }
        *byte = u8::from_str_radix(group, 16).map_err(|_| bad("each group is two hex digits"))?;
    }
    let mac = MacAddr::new(bytes);
    check_guest_mac(mac).map_err(|_| bad(mac_defect(mac).unwrap_or("")))?;
    Ok(mac)
}

fn mac_defect(mac: MacAddr) -> Option<&'static str> {
    let bytes = mac.bytes();
    if bytes == [0; 6] {
        Some("the all-zero address is not a station address")
    } else if bytes[0] & 1 != 0 {
        Some("multicast (bit 0 of the first byte is set); a guest needs a unicast address")
    } else {
        None
    }
}

/// Checks that `mac` can be a guest's address (unicast, not all zero).
pub fn check_guest_mac(mac: MacAddr) -> Result<(), ConfigError> {
    match mac_defect(mac) {
        None => Ok(()),
        Some(reason) => Err(ConfigError::InvalidMac {
            mac: mac.to_string(),
            reason,
        }),
    }
}

fn deserialize_guest_mac<'de, D: Deserializer<'de>>(d: D) -> Result<Option<MacAddr>, D::Error> {
    let text = String::deserialize(d)?;
    parse_guest_mac(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// Checks the shape of a JSON document for the API or a config file: serde would take a
/// struct written as an array of its fields (`["/k"]` for a boot source, `[]` for a whole
/// configuration), which no client means. Objects are required at the top and inside; an
/// array is accepted only as a config file's `network-interfaces` or `drives`, of objects.
pub fn check_json_objects(value: &Value) -> Result<(), String> {
    fn no_arrays(value: &Value, at: &str) -> Result<(), String> {
        match value {
            Value::Array(_) => Err(format!(
                "invalid type: an array at `{at}`, expected an object or a value"
            )),
            Value::Object(map) => map.iter().try_for_each(|(k, v)| no_arrays(v, k)),
            _ => Ok(()),
        }
    }
    let Value::Object(map) = value else {
        return Err("invalid type: expected a JSON object".into());
    };
    for (key, value) in map {
        match (key.as_str(), value) {
            ("network-interfaces" | "drives", Value::Array(items)) => {
                for item in items {
                    if !item.is_object() {
                        return Err(format!("invalid type: `{key}` is a list of objects"));
                    }
                    no_arrays(item, key)?;
                }
            }
            _ => no_arrays(value, key)?,
        }
    }
    Ok(())
}

/// Checks an interface id: 1..=64 ASCII letters, digits, `_` or `-`.
pub fn validate_iface_id(id: &str) -> Result<(), ConfigError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_IFACE_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidIfaceId(id.to_owned()))
    }
}

/// A limiter worth showing (`None` for one that limits nothing).
fn limited(config: RateLimiterConfig) -> Option<RateLimiterConfig> {
    (config != RateLimiterConfig::default()).then_some(config)
}

/// A change of a network interface (`PATCH /network-interfaces/{iface_id}`): Firecracker's
/// body shape (`iface_id`, the rate limiters to replace), plus our `tuning`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterfaceUpdate {
    /// Must equal the id in the path.
    pub iface_id: String,
    /// New receive buckets (each given bucket replaces the current one; absent ones stay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    /// New transmit buckets (likewise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<RateLimiterConfig>,
    /// The knobs to change; absent ones keep their value.
    #[serde(default)]
    pub tuning: Option<NetTuningUpdate>,
}

pub use crate::boot::{FIRST_VIRTIO_GSI, MAX_VIRTIO_DEVICES};

/// Everything needed to start a VM: Firecracker's config-file shape, and what
/// `GET /vm/config` returns.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// The kernel, initrd and command line (required to boot).
    #[serde(
        rename = "boot-source",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub boot_source: Option<BootSource>,
    /// vCPUs and memory.
    #[serde(rename = "machine-config", default)]
    pub machine_config: MachineConfig,
    /// virtio-net devices, in the order the guest sees them (eth0, eth1, …).
    #[serde(rename = "network-interfaces", default)]
    pub network_interfaces: Vec<NetworkInterface>,
    /// Block devices: accepted only empty, so that Firecracker config files with
    /// `"drives": []` load.
    #[serde(default, skip_serializing)]
    pub drives: Vec<serde_json::Value>,
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
    #[error("kernel command line of {len} bytes is too long (at most {max} bytes: the VMM appends its devices to it)")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("invalid MAC address {mac:?}: {reason}")]
    InvalidMac { mac: String, reason: &'static str },
    #[error("{0} must not be empty")]
    EmptyPath(&'static str),
    #[error("no boot source: set the kernel with PUT /boot-source (or `boot-source` in the config file)")]
    MissingBootSource,
    #[error("too many network interfaces: {0} (at most {MAX_VIRTIO_DEVICES})")]
    TooManyDevices(usize),
    #[error("invalid iface_id {0:?}: 1 to {MAX_IFACE_ID_LEN} ASCII letters, digits, '_' or '-'")]
    InvalidIfaceId(String),
    #[error("tap {0:?} is used by two network interfaces")]
    DuplicateTap(String),
    #[error("iface_id {0:?} is given twice")]
    DuplicateIfaceId(String),
    #[error("MAC address {0} is used by two network interfaces")]
    DuplicateMac(String),
    #[error("network interface {iface_id:?}: {error}")]
    Net {
        iface_id: String,
        error: NetConfigError,
    },
    #[error("network interface {iface_id:?}: {error}")]
    Tuning {
        iface_id: String,
        error: TuningError,
    },
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    #[error("block devices (`drives`) are not supported")]
    Drives,
    #[error("invalid transport {0:?} (expected pci or mmio)")]
    InvalidTransport(String),
    #[error("key \"transport\" given more than once")]
    DuplicateTransport,
    #[error("missing tap=NAME")]
    NetSpecWithoutTap,
    #[error("network interface {iface_id:?} (vhost-user): {what}")]
    VhostUser {
        iface_id: String,
        what: &'static str,
    },
}

impl VmConfig {
    /// Checks everything needed to boot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.boot_source
            .as_ref()
            .ok_or(ConfigError::MissingBootSource)?
            .validate()?;
        self.validate_devices()
    }

    /// Checks everything but the presence of a boot source (a configuration being built).
    pub fn validate_devices(&self) -> Result<(), ConfigError> {
        self.machine_config.validate()?;
        if !self.drives.is_empty() {
            return Err(ConfigError::Drives);
        }
        if self.network_interfaces.len() > MAX_VIRTIO_DEVICES {
            return Err(ConfigError::TooManyDevices(self.network_interfaces.len()));
        }
        let (mut ids, mut taps, mut macs) = (HashSet::new(), HashSet::new(), HashSet::new());
        for iface in &self.network_interfaces {
            iface.validate()?;
            if !ids.insert(iface.iface_id.as_str()) {
                return Err(ConfigError::DuplicateIfaceId(iface.iface_id.clone()));
            }
            let tap = iface.vhost_user_socket.is_none() && !iface.backend().is_measurement();
            if tap && !taps.insert(iface.host_dev_name.as_str()) {
                return Err(ConfigError::DuplicateTap(iface.host_dev_name.clone()));
            }
            let mac = iface.mac()?;
            if !macs.insert(mac) {
                return Err(ConfigError::DuplicateMac(mac.to_string()));
            }
        }
        Ok(())
    }

    /// Parses and validates a config file's text.
    pub fn from_json(text: &str) -> Result<VmConfig, ConfigFileError> {
        let value: Value = serde_json::from_str(text).map_err(ConfigFileError::Json)?;
        check_json_objects(&value).map_err(ConfigFileError::Shape)?;
        let config: VmConfig = serde_json::from_str(text).map_err(ConfigFileError::Json)?;
        config.validate().map_err(ConfigFileError::Invalid)?;
        Ok(config)
    }

    /// Reads, parses and validates a config file: a regular file of at most
    /// [`MAX_CONFIG_FILE_BYTES`] (see [`crate::files`]).
    pub fn from_file(path: &Path) -> Result<VmConfig, ConfigFileError> {
        let text = crate::files::read_regular_to_string(path, MAX_CONFIG_FILE_BYTES)
            .map_err(ConfigFileError::Read)?;
        VmConfig::from_json(&text)
    }

    /// Replaces the boot source after checking it.
    pub fn set_boot_source(&mut self, boot_source: BootSource) -> Result<(), ConfigError> {
        boot_source.validate()?;
        self.boot_source = Some(boot_source);
        Ok(())
    }

    /// Replaces the machine configuration after checking it.
    pub fn set_machine_config(&mut self, machine: MachineConfig) -> Result<(), ConfigError> {
        machine.validate()?;
        self.machine_config = machine;
        Ok(())
    }

    /// Adds `iface`, or replaces the interface with the same id, if the result is valid.
    pub fn put_network_interface(&mut self, iface: NetworkInterface) -> Result<(), ConfigError> {
        let mut next = self.clone();
        match next
            .network_interfaces
            .iter_mut()
            .find(|n| n.iface_id == iface.iface_id)
        {
            Some(slot) => *slot = iface,
            None => next.network_interfaces.push(iface),
        }
        next.validate_devices()?;
        *self = next;
        Ok(())
    }

    /// The interface called `iface_id`.
    pub fn network_interface_mut(&mut self, iface_id: &str) -> Option<&mut NetworkInterface> {
        self.network_interfaces
            .iter_mut()
            .find(|n| n.iface_id == iface_id)
    }

    /// The command line the user asked for (before the VMM appends what it must).
    pub fn base_cmdline(&self) -> &str {
        self.boot_source
            .as_ref()
            .and_then(|b| b.boot_args.as_deref())
            .unwrap_or(DEFAULT_CMDLINE)
    }
}

/// A config file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read it")]
    Read(#[source] std::io::Error),
    #[error("not a valid configuration")]
    Json(#[source] serde_json::Error),
    #[error("not a valid configuration: {0}")]
    Shape(String),
    #[error("invalid configuration")]
    Invalid(#[source] ConfigError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mem: u64, vcpus: u8) -> VmConfig {
        VmConfig {
            boot_source: Some(BootSource {
                kernel_image_path: "k".into(),
                initrd_path: None,
                boot_args: None,
            }),
            machine_config: MachineConfig {
                vcpu_count: vcpus,
                mem_size_mib: mem,
                ..MachineConfig::default()
            },
            ..VmConfig::default()
        }
    }

    fn iface(id: &str, tap: &str) -> NetworkInterface {
        NetworkInterface {
            host_dev_name: tap.into(),
            ..NetworkInterface::named(id)
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
        c.network_interfaces = vec![iface("a", "tap0"), iface("b", "tap0")];
        assert_eq!(c.validate(), Err(ConfigError::DuplicateTap("tap0".into())));
        c.network_interfaces = vec![iface("a", "tap0"), iface("a", "tap1")];
        assert_eq!(c.validate(), Err(ConfigError::DuplicateIfaceId("a".into())));
        c.network_interfaces = (0..20)
            .map(|i| iface(&format!("eth{i}"), &format!("tap{i}")))
            .collect();
        assert_eq!(c.validate(), Err(ConfigError::TooManyDevices(20)));
        c.network_interfaces.truncate(19);
        assert_eq!(c.validate(), Ok(()));
        c.boot_source = None;
        assert_eq!(c.validate(), Err(ConfigError::MissingBootSource));
        assert_eq!(c.validate_devices(), Ok(()));
    }

    #[test]
    fn measurement_backends_in_the_config_file() {
        let text = r#"{
            "boot-source": {"kernel_image_path": "/k"},
            "network-interfaces": [
                {"iface_id": "sink0", "backend": "sink", "rate_pps": 1000000},
                {"iface_id": "sink1", "backend": "sink"},
                {"iface_id": "src", "backend": "source", "frame_size": 1514, "transport": "pci"},
                {"iface_id": "eth0", "host_dev_name": "tap0"}
            ]
        }"#;
        let c = VmConfig::from_json(text).expect("valid");
        let nets: Vec<NetConfig> = c
            .network_interfaces
            .iter()
            .map(|i| i.net_config().expect("valid"))
            .collect();
        assert_eq!(nets[0].backend, BackendKind::Sink);
        assert_eq!(nets[0].rate_pps, Some(1_000_000));
        // Named after the interface (logs, the worker thread `net-sink0`).
        assert_eq!(nets[0].tap, "sink0");
        // Two unnamed sinks: different MACs (from their ids).
        assert_ne!(nets[0].mac, nets[1].mac);
        assert_eq!(nets[2].source_frame_size(), 1514);
        assert_eq!(nets[3].backend, BackendKind::Tap);
        // A tap needs its host_dev_name; options of measurement backends stay theirs.
        for bad in [
            r#"{"iface_id": "e", "backend": "tap"}"#,
            r#"{"iface_id": "e"}"#,
            r#"{"iface_id": "e", "host_dev_name": "tap0", "rate_pps": 10}"#,
            r#"{"iface_id": "e", "backend": "loop", "frame_size": 64}"#,
            r#"{"iface_id": "e", "backend": "pipe"}"#,
        ] {
            let text = format!(
                r#"{{"boot-source":{{"kernel_image_path":"/k"}},"network-interfaces":[{bad}]}}"#
            );
            assert!(VmConfig::from_json(&text).is_err(), "{bad}");
        }
        // The CLI form keeps the backend and its options.
        let cli: NetConfig = "backend=source,rate_pps=5000,frame_size=128"
            .parse()
            .expect("valid");
        let iface = NetworkInterface::from_net_config(cli.clone());
        assert_eq!(iface.host_dev_name, "");
        assert_eq!(iface.net_config().expect("valid"), cli);
    }

    #[test]
    fn firecracker_config_file_shape() {
        let text = r#"{
            "boot-source": {"kernel_image_path": "/k", "boot_args": "console=ttyS0"},
            "machine-config": {"vcpu_count": 2, "mem_size_mib": 64, "smt": false},
            "network-interfaces": [
                {"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "AA:FC:00:00:00:01"}
            ],
            "drives": []
        }"#;
        let c = VmConfig::from_json(text).expect("valid");
        assert_eq!(c.machine_config.vcpu_count, 2);
        assert_eq!(c.base_cmdline(), "console=ttyS0");
        let n = c.network_interfaces[0].net_config().expect("valid");
        assert_eq!(n.mac.to_string(), "aa:fc:00:00:00:01");
        assert!(VmConfig::from_json(r#"{"machine-config":{}}"#).is_err());
        assert!(matches!(
            VmConfig::from_json(r#"{"boot-source":{"kernel_image_path":"/k"},"drives":[{}]}"#),
            Err(ConfigFileError::Invalid(ConfigError::Drives))
        ));
        assert!(matches!(
            VmConfig::from_json(r#"{"boot-source":{"kernel_image_path":"/k"},"logger":{}}"#),
            Err(ConfigFileError::Json(_))
        ));
    }

    #[test]
    fn transport_in_specs_files_and_api_bodies() {
        assert_eq!(
            split_transport("tap=tap0,transport=pci,queues=2"),
            Ok(("tap=tap0,queues=2".to_owned(), Some(Transport::Pci)))
        );
        assert_eq!(
            split_transport("transport=mmio,tap=t"),
            Ok(("tap=t".to_owned(), Some(Transport::Mmio)))
        );
        assert_eq!(split_transport("tap0"), Ok(("tap0".to_owned(), None)));
        assert_eq!(
            split_transport("tap=t,transport=usb"),
            Err(ConfigError::InvalidTransport("usb".into()))
        );
        assert_eq!(
            split_transport("tap=t,transport=PCI"),
            Err(ConfigError::InvalidTransport("PCI".into()))
        );
        assert_eq!(
            split_transport("tap=t,transport=pci,transport=mmio"),
            Err(ConfigError::DuplicateTransport)
        );
        assert_eq!(
            split_transport("transport=pci"),
            Err(ConfigError::NetSpecWithoutTap)
        );
        assert_eq!(
            ConfigError::InvalidTransport("usb".into()).to_string(),
            "invalid transport \"usb\" (expected pci or mmio)"
        );

        let body = |extra: &str| {
            serde_json::from_str::<NetworkInterface>(&format!(
                r#"{{"iface_id":"eth0","host_dev_name":"tap0"{extra}}}"#
            ))
        };
        let pci = body(r#","transport":"pci""#).expect("valid");
        assert_eq!(pci.transport(), Transport::Pci);
        assert_eq!(body("").expect("valid").transport(), Transport::Mmio);
        let e = body(r#","transport":"virtio""#).unwrap_err().to_string();
        assert!(
            e.contains("unknown variant `virtio`, expected `mmio` or `pci`"),
            "{e}"
        );
        // Round trip: the field is shown only when given.
        let shown = serde_json::to_value(&pci).expect("serialise");
        assert_eq!(shown["transport"], "pci");
        let shown = serde_json::to_value(body("").expect("valid")).expect("serialise");
        assert!(shown.get("transport").is_none());
        let file = r#"{"boot-source":{"kernel_image_path":"/k"},
            "network-interfaces":[{"iface_id":"a","host_dev_name":"tap0","transport":"pci"},
                                  {"iface_id":"b","host_dev_name":"tap1","transport":"mmio"}]}"#;
        let c = VmConfig::from_json(file).expect("valid");
        assert_eq!(c.network_interfaces[0].transport(), Transport::Pci);
        assert_eq!(c.network_interfaces[1].transport(), Transport::Mmio);
    }

    #[test]
    fn network_interface_queues_extension() {
        let iface = |queues: &str| {
            serde_json::from_str::<NetworkInterface>(&format!(
                r#"{{"iface_id":"eth0","host_dev_name":"tap0"{queues}}}"#
            ))
            .expect("shape")
        };
        let two = iface(r#","queues":2"#);
        assert_eq!(two.net_config().expect("valid").queues, 2);
        assert!(two.validate().is_ok());
        assert_eq!(iface("").net_config().expect("valid").queues, 1);
        for bad in ["0", "17"] {
            let e = iface(&format!(r#","queues":{bad}"#))
                .validate()
                .unwrap_err();
            assert!(
                crate::error_chain(&e).contains("invalid queues"),
                "{bad}: {}",
                crate::error_chain(&e)
            );
        }
        // A --net device keeps its queues in the configuration (and omits the default).
        let cli: NetConfig = "tap=tap0,queues=4".parse().expect("valid");
        let from_cli = NetworkInterface::from_net_config(cli);
        assert_eq!(from_cli.queues, Some(4));
        assert_eq!(from_cli.net_config().expect("valid").queues, 4);
        let one = NetworkInterface::from_net_config("tap0".parse().expect("valid"));
        assert_eq!(one.queues, None);
        assert!(!serde_json::to_string(&one)
            .expect("json")
            .contains("queues"));
    }

    #[test]
    fn parts_reject_unknown_fields_and_bad_values() {
        assert!(serde_json::from_str::<BootSource>(r#"{"kernel_image_path":"/k","x":1}"#).is_err());
        assert!(serde_json::from_str::<MachineConfig>(r#"{"vcpu_count":1}"#).is_err());
        assert!(
            serde_json::from_str::<MachineConfig>(r#"{"vcpu_count":300,"mem_size_mib":64}"#)
                .is_err()
        );
        let smt: MachineConfig =
            serde_json::from_str(r#"{"vcpu_count":2,"mem_size_mib":64,"smt":true}"#)
                .expect("shape");
        assert_eq!(smt.validate(), Err(ConfigError::Unsupported("smt: true")));
        let bad_mac =
            r#"{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"01:00:00:00:00:01"}"#;
        assert!(serde_json::from_str::<NetworkInterface>(bad_mac).is_err());
        for id in ["", "a/b", "eth 0", &"x".repeat(65)] {
            assert!(validate_iface_id(id).is_err(), "{id:?}");
        }
        assert!(validate_iface_id("eth0_a-1").is_ok());
    }

    /// Issue 11, class 8: `+` signs (u8::from_str_radix takes `+a`), the all-zero and
    /// multicast addresses were taken as guest MACs.
    #[test]
    fn guest_macs_are_parsed_strictly() {
        assert_eq!(
            parse_guest_mac("aa:FC:00:00:00:01").map(|m| m.to_string()),
            Ok("aa:fc:00:00:00:01".to_owned())
        );
        for bad in [
            "+2:00:00:00:00:01",
            "02:+0:00:00:00:01",
            "-2:00:00:00:00:01",
            "00:00:00:00:00:00",
            "01:00:00:00:00:01",
            "ff:ff:ff:ff:ff:ff",
            "2:00:00:00:00:01",
            "002:00:00:00:00:01",
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "02:00:00:00:00:01:",
            " 02:00:00:00:00:01",
            "02-00-00-00-00-01",
            "0x:00:00:00:00:01",
            "",
        ] {
            let e = parse_guest_mac(bad).unwrap_err();
            assert!(e.to_string().contains("invalid MAC"), "{bad:?}: {e}");
        }
        for json in [
            r#"{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"+2:00:00:00:00:01"}"#,
            r#"{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"00:00:00:00:00:00"}"#,
        ] {
            let e = serde_json::from_str::<NetworkInterface>(json).unwrap_err();
            assert!(e.to_string().contains("invalid MAC"), "{e}");
        }
        let mut zero = iface("eth0", "tap0");
        zero.guest_mac = Some(MacAddr::new([0; 6]));
        assert!(matches!(
            zero.validate(),
            Err(ConfigError::InvalidMac { .. })
        ));
    }

    /// Issue 11, class 8: `[]` (or any array) parsed as a valid configuration: serde takes a
    /// struct written as the array of its fields.
    #[test]
    fn only_objects_are_configurations() {
        for text in [
            "[]",
            "[null]",
            r#"[{"kernel_image_path":"/k"}]"#,
            r#"{"boot-source":["/k"]}"#,
            r#"{"boot-source":{"kernel_image_path":"/k"},"machine-config":[1,128]}"#,
            r#"{"boot-source":{"kernel_image_path":"/k"},"network-interfaces":[["eth0","tap0"]]}"#,
            "1",
            "\"x\"",
            "null",
        ] {
            assert!(
                matches!(
                    VmConfig::from_json(text),
                    Err(ConfigFileError::Shape(_) | ConfigFileError::Json(_))
                ),
                "{text}"
            );
        }
        assert!(matches!(
            VmConfig::from_json("[]"),
            Err(ConfigFileError::Shape(_))
        ));
        let ok = r#"{"boot-source":{"kernel_image_path":"/k"},"network-interfaces":[{"iface_id":"eth0","host_dev_name":"tap0"}],"drives":[]}"#;
        assert!(VmConfig::from_json(ok).is_ok());
    }

    /// Issue 11, class 6 and 8: a config file that is a FIFO or a character device.
    #[test]
    fn config_files_are_regular_and_bounded() {
        let e = VmConfig::from_file(Path::new("/dev/zero")).unwrap_err();
        assert!(crate::error_chain(&e).contains("a character device"), "{e}");
        let dir = std::env::temp_dir().join(format!("vmm-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.json");
        std::fs::write(&big, " ".repeat(MAX_CONFIG_FILE_BYTES + 1)).unwrap();
        let e = VmConfig::from_file(&big).unwrap_err();
        assert!(
            crate::error_chain(&e).contains("larger than the limit"),
            "{e}"
        );
        let good = dir.join("good.json");
        std::fs::write(&good, r#"{"boot-source":{"kernel_image_path":"/k"}}"#).unwrap();
        assert!(VmConfig::from_file(&good).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 11, class 8: a command line of up to 2047 bytes was accepted, then failed at
    /// boot ("too large") once the VMM appended its devices. The limit checked is what is
    /// left after the most the VMM ever appends, and exactly that fits at boot.
    #[test]
    fn an_accepted_command_line_always_fits_at_boot() {
        let max = crate::boot::max_user_cmdline_len();
        assert!((1024..2047).contains(&max), "{max}");
        let mut c = config(128, 1);
        let args = |len| Some("x".repeat(len));
        c.boot_source.as_mut().unwrap().boot_args = args(max);
        assert_eq!(c.validate(), Ok(()));
        c.network_interfaces = (0..MAX_VIRTIO_DEVICES)
            .map(|i| iface(&format!("eth{i}"), &format!("tap{i}")))
            .collect();
        assert_eq!(c.validate(), Ok(()));
        let devices: Vec<(u64, u32)> = (0..MAX_VIRTIO_DEVICES)
            .map(crate::boot::virtio_slot)
            .collect();
        let worst = crate::boot::CmdlineAdditions {
            devices: &devices,
            tsc_khz: Some(u32::MAX),
            extra: Some(crate::host::PVM_CMDLINE),
        };
        let cmdline = crate::boot::vm_cmdline(c.base_cmdline(), &worst).expect("fits");
        assert_eq!(
            cmdline.as_cstring().unwrap().as_bytes_with_nul().len(),
            crate::memory::CMDLINE_MAX_SIZE
        );
        c.boot_source.as_mut().unwrap().boot_args = args(max + 1);
        assert_eq!(
            c.validate(),
            Err(ConfigError::CmdlineTooLong { len: max + 1, max })
        );
    }

    #[test]
    fn put_network_interface_replaces_by_id_and_keeps_the_old_config_on_error() {
        let mut c = VmConfig::default();
        c.put_network_interface(iface("eth0", "tap0"))
            .expect("valid");
        c.put_network_interface(iface("eth1", "tap1"))
            .expect("valid");
        c.put_network_interface(iface("eth0", "tap9"))
            .expect("replaced");
        assert_eq!(c.network_interfaces[0].host_dev_name, "tap9");
        assert_eq!(
            c.put_network_interface(iface("eth2", "tap1")),
            Err(ConfigError::DuplicateTap("tap1".into()))
        );
        assert_eq!(c.network_interfaces.len(), 2);
    }
}
