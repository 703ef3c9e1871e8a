//! `NetConfig`: what the user says about a virtio-net device (CLI, API, tests).
//!
//! CLI form: `tap0`, or `tap=tap0,mac=02:00:00:00:00:01,queue_size=256` (keys in any order,
//! `tap` required), plus rate limiters (`rx_bw`, `rx_ops`, `tx_bw`, `tx_ops`) and the device's
//! runtime knobs (`coalesce_packets`, `coalesce_usecs`, `event_idx=on|off`, `tx_budget`,
//! `busy_poll_us`, `busy_poll_sleep_us`, `kick_coalesce_packets`, `kick_coalesce_usecs`,
//! `rx_sparse_reads=on|off`, `adaptive=on|off` with its bounds `adaptive_max_busy_poll_us`,
//! `adaptive_max_coalesce_usecs` and `adaptive_interval_us`; see
//! [`NetTuning`]) and the ring features offered
//! (`packed=on|off`, `in_order=on|off`, both off by default). The serde form is `{"tap": "tap0", "mac": "...", "queue_size": 256}` with
//! `mac` and `queue_size` optional; both forms are validated the same way.
//!
//! `backend=sink|source|loop` (serde `"backend"`) puts a **measurement** backend in place of
//! the tap (see [`crate::backend`]'s `SinkBackend`, `SourceBackend`, `LoopBackend`), with
//! `rate_pps=R` (a sink or a loop that takes R frames/s, a source that offers R frames/s:
//! the transmit, respectively receive, frame rate limiter) and, for a source, `frame_size=B`
//! (Ethernet bytes per frame, default 64).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::rate_limiter::{parse_bucket, BucketConfig, RateLimiterConfig, RateLimiterError};
use super::tuning::{NetTuning, TuningError};

use crate::backend::{validate_ifname, validate_source_frame, FrameSizeError};

/// Default (and maximum advertised) size of each queue.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// Smallest queue size accepted.
pub const MIN_QUEUE_SIZE: u16 = 2;
/// Largest queue size accepted (the split-ring maximum).
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Most queue pairs a device may have (`queues=`).
pub const MAX_QUEUE_PAIRS: u16 = 16;

/// Errors in a virtio-net device description.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetConfigError {
    /// No `tap=` given in the key=value form.
    #[error("missing tap=NAME (or backend=sink|source|loop)")]
    MissingTap,
    /// `rate_pps` or `frame_size` given where it does not apply, or out of range.
    #[error("{key}: {reason}")]
    BackendOption {
        /// The key.
        key: &'static str,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A source's frame size out of range.
    #[error(transparent)]
    FrameSize(#[from] FrameSizeError),
    /// A key other than tap, mac, queue_size, the rate limiter and the tuning keys.
    #[error(
        "unknown key {0:?} (expected tap, backend, rate_pps, frame_size, mac, queue_size, \
         rx_bw, rx_ops, tx_bw, tx_ops, coalesce_packets, coalesce_usecs, event_idx, tx_budget, \
         busy_poll_us, busy_poll_sleep_us, kick_coalesce_packets, kick_coalesce_usecs, \
         rx_sparse_reads, adaptive, adaptive_max_busy_poll_us, adaptive_max_coalesce_usecs, \
         adaptive_interval_us, queues, io_uring, packed, in_order)"
    )]
    UnknownKey(String),
    /// `backend=` names no backend.
    #[error("invalid backend {0:?} (expected tap, sink, source or loop)")]
    InvalidBackend(String),
    /// A tuning key whose value is not a number (or `on`/`off` for `event_idx` and
    /// `rx_sparse_reads`).
    #[error("invalid {key} {value:?} ({expected})")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// Tuning knobs out of range.
    #[error(transparent)]
    Tuning(#[from] TuningError),
    /// A key given twice.
    #[error("key {0:?} given more than once")]
    DuplicateKey(String),
    /// An item without `=` in the key=value form.
    #[error("expected key=value, got {0:?}")]
    NotKeyValue(String),
    /// The tap name is not a valid interface name.
    #[error("invalid tap name {name:?}: {reason}")]
    InvalidTapName {
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The MAC is not six `:`-separated hex bytes, or is multicast.
    #[error("invalid MAC address {0:?} (expected a unicast xx:xx:xx:xx:xx:xx)")]
    InvalidMac(String),
    /// The queue size is not a number, not a power of two, or out of range.
    #[error("invalid queue_size {0:?} (a power of two from 2 to 32768)")]
    InvalidQueueSize(String),
    /// A rate limiter bucket that cannot be used.
    #[error(transparent)]
    RateLimiter(#[from] RateLimiterError),
    /// The number of queue pairs is not a number in 1..=16.
    #[error("invalid queues {0:?} (queue pairs, 1 to {MAX_QUEUE_PAIRS})")]
    InvalidQueues(String),
}

/// An Ethernet MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MacAddr([u8; 6]);

impl MacAddr {
    /// The address from its six bytes.
    pub const fn new(bytes: [u8; 6]) -> MacAddr {
        MacAddr(bytes)
    }

    /// The six bytes.
    pub const fn bytes(&self) -> [u8; 6] {
        self.0
    }

    /// A stable, locally administered unicast address derived from a tap name:
    /// `02:` followed by five bytes of the name's FNV-1a hash.
    pub fn derived_from(name: &str) -> MacAddr {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        let h = hash.to_be_bytes();
        MacAddr([0x02, h[0], h[1], h[2], h[3], h[4]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = NetConfigError;

    fn from_str(s: &str) -> Result<MacAddr, NetConfigError> {
        let bad = || NetConfigError::InvalidMac(s.to_owned());
        let mut bytes = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut bytes {
            let part = parts.next().ok_or_else(bad)?;
            // Exactly two hex digits (`from_str_radix` alone would take a sign).
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        // No more groups, unicast, and not all-zero.
        if parts.next().is_some() || bytes[0] & 1 != 0 || bytes == [0; 6] {
            return Err(bad());
        }
        Ok(MacAddr(bytes))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What is behind the device (`backend=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// A host tap (the default and the only one for real traffic).
    #[default]
    Tap,
    /// Measurement: discards every transmitted frame.
    Sink,
    /// Measurement: generates numbered test frames for the guest to receive.
    Source,
    /// Measurement: every transmitted frame comes back as a received one, MACs swapped.
    Loop,
}

impl BackendKind {
    /// The name used on the command line, in the API and in the metrics.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Tap => "tap",
            BackendKind::Sink => "sink",
            BackendKind::Source => "source",
            BackendKind::Loop => "loop",
        }
    }

    /// True for the measurement backends (everything but the tap).
    pub const fn is_measurement(self) -> bool {
        !matches!(self, BackendKind::Tap)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = NetConfigError;

    fn from_str(s: &str) -> Result<BackendKind, NetConfigError> {
        match s {
            "tap" => Ok(BackendKind::Tap),
            "sink" => Ok(BackendKind::Sink),
            "source" => Ok(BackendKind::Source),
            "loop" => Ok(BackendKind::Loop),
            _ => Err(NetConfigError::InvalidBackend(s.to_owned())),
        }
    }
}

/// The frame size of a `source` when none is given.
pub const DEFAULT_SOURCE_FRAME: u16 = 64;

/// A validated virtio-net device description.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawNetConfig")]
pub struct NetConfig {
    /// Host tap interface (opened, or created if absent); with a measurement backend, the
    /// device's name (in logs and metrics).
    pub tap: String,
    /// What is behind the device (a tap unless said otherwise).
    #[serde(default, skip_serializing_if = "is_tap")]
    pub backend: BackendKind,
    /// Measurement backends: the frame rate a sink or a loop takes, or a source offers
    /// (the transmit, respectively receive, `ops` rate limiter); none: as fast as the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_pps: Option<u64>,
    /// A source's Ethernet frame size (20..=9014; [`DEFAULT_SOURCE_FRAME`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_size: Option<u16>,
    /// The guest's MAC address.
    pub mac: MacAddr,
    /// Maximum size of each queue.
    pub queue_size: u16,
    /// Queue pairs (1..=16, default 1): with more than one the device offers
    /// VIRTIO_NET_F_MQ and opens the tap multi-queue, one fd and one worker per pair.
    #[serde(skip_serializing_if = "is_one")]
    pub queues: u16,
    /// Receive rate limiter (none by default).
    #[serde(default, skip_serializing_if = "is_unlimited")]
    pub rx_rate_limiter: RateLimiterConfig,
    /// Transmit rate limiter (none by default).
    #[serde(default, skip_serializing_if = "is_unlimited")]
    pub tx_rate_limiter: RateLimiterConfig,
    /// The device's runtime knobs at start (defaults: no coalescing, EVENT_IDX honoured, tx
    /// budget 256, no busy-poll).
    #[serde(default, skip_serializing_if = "is_default_tuning")]
    pub tuning: NetTuning,
    /// Transmit through io_uring batches where the kernel allows it (default on; off: one
    /// `write` (or `writev`) per frame, and the worker never enters io_uring).
    #[serde(skip_serializing_if = "is_true")]
    pub io_uring: bool,
    /// Offer the packed virtqueue layout (VIRTIO_F_RING_PACKED; default off: split rings
    /// only). A driver that accepts it runs every queue of the device on packed rings.
    #[serde(default, skip_serializing_if = "is_false")]
    pub packed: bool,
    /// Offer VIRTIO_F_IN_ORDER (default off): the driver makes buffers available in order,
    /// and the device returns each batch of transmitted frames with one used entry.
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_order: bool,
}

fn is_false(on: &bool) -> bool {
    !*on
}

fn is_tap(kind: &BackendKind) -> bool {
    *kind == BackendKind::Tap
}

fn is_true(on: &bool) -> bool {
    *on
}

fn is_one(queues: &u16) -> bool {
    *queues == 1
}

fn is_default_tuning(tuning: &NetTuning) -> bool {
    *tuning == NetTuning::default()
}

fn is_unlimited(config: &RateLimiterConfig) -> bool {
    *config == RateLimiterConfig::default()
}

/// The unvalidated serde form of [`NetConfig`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNetConfig {
    tap: Option<String>,
    backend: Option<BackendKind>,
    rate_pps: Option<u64>,
    frame_size: Option<u16>,
    mac: Option<MacAddr>,
    queue_size: Option<u16>,
    queues: Option<u16>,
    #[serde(default)]
    rx_rate_limiter: RateLimiterConfig,
    #[serde(default)]
    tx_rate_limiter: RateLimiterConfig,
    #[serde(default)]
    tuning: NetTuning,
    io_uring: Option<bool>,
    packed: Option<bool>,
    in_order: Option<bool>,
}

impl TryFrom<RawNetConfig> for NetConfig {
    type Error = NetConfigError;

    fn try_from(raw: RawNetConfig) -> Result<NetConfig, NetConfigError> {
        NetConfig::with_backend_kind(
            raw.backend.unwrap_or_default(),
            raw.tap,
            raw.mac,
            raw.queue_size,
        )?
        .with_backend_options(raw.rate_pps, raw.frame_size)?
        .with_queues(raw.queues.unwrap_or(1))?
        .with_rate_limiters(raw.rx_rate_limiter, raw.tx_rate_limiter)?
        .with_tuning(raw.tuning)
        .map(|c| {
            c.with_io_uring(raw.io_uring.unwrap_or(true))
                .with_ring_features(raw.packed.unwrap_or(false), raw.in_order.unwrap_or(false))
        })
    }
}

impl NetConfig {
    /// A validated config; `mac` defaults to [`MacAddr::derived_from`] the tap name and
    /// `queue_size` to [`DEFAULT_QUEUE_SIZE`].
    pub fn new(
        tap: String,
        mac: Option<MacAddr>,
        queue_size: Option<u16>,
    ) -> Result<NetConfig, NetConfigError> {
        validate_ifname(&tap).map_err(|reason| NetConfigError::InvalidTapName {
            name: tap.clone(),
            reason,
        })?;
        if let Some(mac) = mac {
            if mac.0[0] & 1 != 0 {
                return Err(NetConfigError::InvalidMac(mac.to_string()));
            }
        }
        let queue_size = queue_size.unwrap_or(DEFAULT_QUEUE_SIZE);
        if !(MIN_QUEUE_SIZE..=MAX_QUEUE_SIZE).contains(&queue_size) || !queue_size.is_power_of_two()
        {
            return Err(NetConfigError::InvalidQueueSize(queue_size.to_string()));
        }
        Ok(NetConfig {
            mac: mac.unwrap_or_else(|| MacAddr::derived_from(&tap)),
            tap,
            backend: BackendKind::Tap,
            rate_pps: None,
            frame_size: None,
            queue_size,
            queues: 1,
            rx_rate_limiter: RateLimiterConfig::default(),
            tx_rate_limiter: RateLimiterConfig::default(),
            tuning: NetTuning::default(),
            io_uring: true,
            packed: false,
            in_order: false,
        })
    }

    /// A validated config for a device in front of `kind`: a tap needs `tap` (its name);
    /// for a measurement backend `tap` is only the device's name (no tap is opened), the
    /// backend's kind when absent.
    pub fn with_backend_kind(
        kind: BackendKind,
        tap: Option<String>,
        mac: Option<MacAddr>,
        queue_size: Option<u16>,
    ) -> Result<NetConfig, NetConfigError> {
        match (kind, tap) {
            (BackendKind::Tap, None) => Err(NetConfigError::MissingTap),
            (kind, name) => {
                let name = name.unwrap_or_else(|| kind.name().to_owned());
                let mut config = NetConfig::new(name, mac, queue_size)?;
                config.backend = kind;
                Ok(config)
            }
        }
    }

    /// This config with a measurement backend's rate and (for a source) frame size; both
    /// are refused for a tap, `frame_size` for anything but a source.
    pub fn with_backend_options(
        mut self,
        rate_pps: Option<u64>,
        frame_size: Option<u16>,
    ) -> Result<NetConfig, NetConfigError> {
        if rate_pps.is_some() && !self.backend.is_measurement() {
            return Err(NetConfigError::BackendOption {
                key: "rate_pps",
                reason: "only for backend=sink|source|loop (a tap's rate: tx_ops=, rx_ops=)",
            });
        }
        if rate_pps == Some(0) {
            return Err(NetConfigError::BackendOption {
                key: "rate_pps",
                reason: "must be at least 1 frame/s (leave it out for no limit)",
            });
        }
        if let Some(size) = frame_size {
            if self.backend != BackendKind::Source {
                return Err(NetConfigError::BackendOption {
                    key: "frame_size",
                    reason: "only for backend=source",
                });
            }
            validate_source_frame(usize::from(size))?;
        }
        self.rate_pps = rate_pps;
        self.frame_size = frame_size;
        Ok(self)
    }

    /// The source's frame size in force.
    pub fn source_frame_size(&self) -> u16 {
        self.frame_size.unwrap_or(DEFAULT_SOURCE_FRAME)
    }

    /// The rate limiters in force at start: the configured ones, with `rate_pps` as the
    /// `ops` bucket of the direction the backend paces (receive for a source, transmit
    /// otherwise): a bucket of R/100 frames refilled every 10 ms (R ≥ 10 000: within 0.5 %
    /// of R, bursts of 10 ms), or of R frames every second below.
    ///
    /// # Errors
    ///
    /// When that direction has an `ops` bucket already.
    pub fn rate_limiters(&self) -> Result<(RateLimiterConfig, RateLimiterConfig), NetConfigError> {
        let (mut rx, mut tx) = (self.rx_rate_limiter, self.tx_rate_limiter);
        let Some(rate) = self.rate_pps else {
            return Ok((rx, tx));
        };
        let paced = if self.backend == BackendKind::Source {
            &mut rx
        } else {
            &mut tx
        };
        if paced.ops.is_some_and(|b| b.is_enabled()) {
            return Err(NetConfigError::BackendOption {
                key: "rate_pps",
                reason: "the same direction has an ops rate limiter already",
            });
        }
        paced.ops = Some(pps_bucket(rate));
        Ok((rx, tx))
    }

    /// This config with batched transmit through io_uring on or off.
    pub fn with_io_uring(mut self, on: bool) -> NetConfig {
        self.io_uring = on;
        self
    }

    /// This config offering the packed ring (`packed`) and IN_ORDER (`in_order`) or not.
    pub fn with_ring_features(mut self, packed: bool, in_order: bool) -> NetConfig {
        self.packed = packed;
        self.in_order = in_order;
        self
    }

    /// This config with `queues` queue pairs (1..=[`MAX_QUEUE_PAIRS`]).
    pub fn with_queues(mut self, queues: u16) -> Result<NetConfig, NetConfigError> {
        if !(1..=MAX_QUEUE_PAIRS).contains(&queues) {
            return Err(NetConfigError::InvalidQueues(queues.to_string()));
        }
        self.queues = queues;
        Ok(self)
    }

    /// This config with rate limiters (validated).
    pub fn with_rate_limiters(
        mut self,
        rx: RateLimiterConfig,
        tx: RateLimiterConfig,
    ) -> Result<NetConfig, NetConfigError> {
        rx.validate()?;
        tx.validate()?;
        self.rx_rate_limiter = rx;
        self.tx_rate_limiter = tx;
        Ok(self)
    }

    /// This config with the device knobs `tuning` at start (validated).
    pub fn with_tuning(mut self, tuning: NetTuning) -> Result<NetConfig, NetConfigError> {
        tuning.validate()?;
        self.tuning = tuning;
        Ok(self)
    }
}

/// The `ops` bucket of `rate` frames per second (see [`NetConfig::rate_limiters`]).
fn pps_bucket(rate: u64) -> BucketConfig {
    if rate >= 10_000 {
        BucketConfig {
            size: (rate + 50) / 100,
            one_time_burst: 0,
            refill_time: 10,
        }
    } else {
        BucketConfig {
            size: rate,
            one_time_burst: 0,
            refill_time: 1000,
        }
    }
}

/// A tuning value from the CLI form.
/// Sets the tuning knob `key` (a `coalesce_*`, `event_idx`, `tx_budget`, `busy_poll_us`,
/// `busy_poll_sleep_us`, `kick_coalesce_*`, `rx_sparse_reads` or `adaptive*` key) from `value`;
/// false if `key` is none of them.
fn tuning_key(tuning: &mut NetTuning, key: &str, value: &str) -> Result<bool, NetConfigError> {
    let adaptive = &mut tuning.adaptive;
    match key {
        "adaptive" => adaptive.enabled = on_off(key, value)?,
        "adaptive_max_busy_poll_us" => {
            adaptive.max_busy_poll_us = knob(key, value, "microseconds")?
        }
        "adaptive_max_coalesce_usecs" => {
            adaptive.max_coalesce_usecs = knob(key, value, "microseconds")?
        }
        "adaptive_interval_us" => adaptive.interval_us = knob(key, value, "microseconds")?,
        "coalesce_packets" => {
            tuning.interrupt_coalescing.max_packets = knob(key, value, "frames, 0..=65535")?
        }
        "coalesce_usecs" => {
            tuning.interrupt_coalescing.max_usecs = knob(key, value, "microseconds")?
        }
        "event_idx" => tuning.event_idx = on_off(key, value)?,
        "tx_budget" => tuning.tx_budget = knob(key, value, "frames per call")?,
        "rx_sparse_reads" => tuning.rx_sparse_reads = on_off(key, value)?,
        "busy_poll_us" => tuning.busy_poll_us = knob(key, value, "microseconds")?,
        "busy_poll_sleep_us" => tuning.busy_poll_sleep_us = knob(key, value, "microseconds")?,
        "kick_coalesce_packets" => {
            tuning.kick_coalescing.max_packets = knob(key, value, "frames, 0..=65535")?
        }
        "kick_coalesce_usecs" => {
            tuning.kick_coalescing.max_usecs = knob(key, value, "microseconds")?
        }
        _ => return Ok(false),
    }
    Ok(true)
}

fn knob<T: FromStr>(key: &str, value: &str, expected: &'static str) -> Result<T, NetConfigError> {
    value.parse().map_err(|_| NetConfigError::InvalidValue {
        key: key.to_owned(),
        value: value.to_owned(),
        expected,
    })
}

fn on_off(key: &str, value: &str) -> Result<bool, NetConfigError> {
    match value {
        "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        _ => Err(NetConfigError::InvalidValue {
            key: key.to_owned(),
            value: value.to_owned(),
            expected: "on or off",
        }),
    }
}

impl FromStr for NetConfig {
    type Err = NetConfigError;

    fn from_str(s: &str) -> Result<NetConfig, NetConfigError> {
        if !s.contains('=') {
            return NetConfig::new(s.to_owned(), None, None);
        }
        let (mut tap, mut mac, mut queue_size, mut queues) = (None, None, None, None);
        let (mut backend, mut rate_pps, mut frame_size) = (None, None, None);
        let (mut rx, mut tx) = (RateLimiterConfig::default(), RateLimiterConfig::default());
        let mut tuning = NetTuning::default();
        let (mut io_uring, mut packed, mut in_order) = (None, None, None);
        let mut seen: Vec<&str> = Vec::new();
        for item in s.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| NetConfigError::NotKeyValue(item.to_owned()))?;
            let duplicate = match key {
                "tap" => tap.replace(value.to_owned()).is_some(),
                "backend" => backend.replace(value.parse::<BackendKind>()?).is_some(),
                "rate_pps" => rate_pps
                    .replace(knob::<u64>(key, value, "frames per second")?)
                    .is_some(),
                "frame_size" => frame_size
                    .replace(knob::<u16>(key, value, "bytes, 20..=9014")?)
                    .is_some(),
                "mac" => mac.replace(value.parse::<MacAddr>()?).is_some(),
                "queue_size" => {
                    let size = value
                        .parse::<u16>()
                        .map_err(|_| NetConfigError::InvalidQueueSize(value.to_owned()))?;
                    queue_size.replace(size).is_some()
                }
                "queues" => {
                    let n = value
                        .parse::<u16>()
                        .map_err(|_| NetConfigError::InvalidQueues(value.to_owned()))?;
                    queues.replace(n).is_some()
                }
                "io_uring" => io_uring.replace(on_off(key, value)?).is_some(),
                "packed" => packed.replace(on_off(key, value)?).is_some(),
                "in_order" => in_order.replace(on_off(key, value)?).is_some(),
                "rx_bw" => rx.bandwidth.replace(parse_bucket(value)?).is_some(),
                "rx_ops" => rx.ops.replace(parse_bucket(value)?).is_some(),
                "tx_bw" => tx.bandwidth.replace(parse_bucket(value)?).is_some(),
                "tx_ops" => tx.ops.replace(parse_bucket(value)?).is_some(),
                _ if tuning_key(&mut tuning, key, value)? => {
                    let again = seen.contains(&key);
                    seen.push(key);
                    again
                }
                _ => return Err(NetConfigError::UnknownKey(key.to_owned())),
            };
            if duplicate {
                return Err(NetConfigError::DuplicateKey(key.to_owned()));
            }
        }
        NetConfig::with_backend_kind(backend.unwrap_or_default(), tap, mac, queue_size)?
            .with_backend_options(rate_pps, frame_size)?
            .with_queues(queues.unwrap_or(1))?
            .with_rate_limiters(rx, tx)?
            .with_tuning(tuning)
            .map(|c| {
                c.with_io_uring(io_uring.unwrap_or(true))
                    .with_ring_features(packed.unwrap_or(false), in_order.unwrap_or(false))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurement_backends_need_no_tap_and_map_rate_pps_to_the_paced_direction() {
        let sink: NetConfig = "backend=sink".parse().expect("valid");
        assert_eq!(
            (sink.backend, sink.tap.as_str()),
            (BackendKind::Sink, "sink")
        );
        assert_eq!(sink.rate_limiters().expect("ok"), Default::default());
        let named: NetConfig = "backend=loop,tap=lo1,queues=2".parse().expect("valid");
        assert_eq!(
            (named.backend, named.tap.as_str(), named.queues),
            (BackendKind::Loop, "lo1", 2)
        );
        // A sink or loop paces what it takes (tx), a source what it offers (rx).
        let fast: NetConfig = "backend=sink,rate_pps=1234567".parse().expect("valid");
        let (rx, tx) = fast.rate_limiters().expect("ok");
        assert_eq!(rx, RateLimiterConfig::default());
        let ops = tx.ops.expect("ops bucket");
        assert_eq!((ops.size, ops.refill_time), (12346, 10));
        let slow: NetConfig = "backend=source,rate_pps=500,frame_size=1514"
            .parse()
            .expect("valid");
        let (rx, tx) = slow.rate_limiters().expect("ok");
        assert_eq!(tx, RateLimiterConfig::default());
        let ops = rx.ops.expect("ops bucket");
        assert_eq!((ops.size, ops.refill_time), (500, 1000));
        assert_eq!(slow.source_frame_size(), 1514);
        assert_eq!(
            "backend=source"
                .parse::<NetConfig>()
                .expect("valid")
                .source_frame_size(),
            DEFAULT_SOURCE_FRAME
        );
        // rate_pps and the same direction's ops bucket cannot both be set.
        let both: NetConfig = "backend=sink,rate_pps=100,tx_ops=10/1"
            .parse()
            .expect("parses");
        assert!(matches!(
            both.rate_limiters(),
            Err(NetConfigError::BackendOption { .. })
        ));
        let other: NetConfig = "backend=sink,rate_pps=100,rx_ops=10/1"
            .parse()
            .expect("parses");
        assert!(other.rate_limiters().is_ok());
        // serde: round trip, and the same rules.
        let json = serde_json::to_string(&slow).expect("json");
        assert_eq!(
            serde_json::from_str::<NetConfig>(&json).expect("valid"),
            slow
        );
        let api: NetConfig =
            serde_json::from_str(r#"{"backend":"loop","rate_pps":1000}"#).expect("valid");
        assert_eq!((api.backend, api.rate_pps), (BackendKind::Loop, Some(1000)));
        assert!(
            serde_json::from_str::<NetConfig>(r#"{"backend":"sink","frame_size":64}"#).is_err()
        );
        assert!(serde_json::from_str::<NetConfig>(r#"{"backend":"wire"}"#).is_err());
    }

    #[test]
    fn measurement_backend_options_are_refused_where_they_do_not_apply() {
        for (spec, want) in [
            (
                "backend=wire",
                NetConfigError::InvalidBackend("wire".into()),
            ),
            (
                "backend=sink,backend=loop",
                NetConfigError::DuplicateKey("backend".into()),
            ),
            ("mac=02:00:00:00:00:01", NetConfigError::MissingTap),
            ("backend=tap", NetConfigError::MissingTap),
            (
                "backend=source,frame_size=19",
                NetConfigError::FrameSize(FrameSizeError(19)),
            ),
            (
                "backend=source,frame_size=9015",
                NetConfigError::FrameSize(FrameSizeError(9015)),
            ),
        ] {
            assert_eq!(spec.parse::<NetConfig>(), Err(want), "{spec}");
        }
        for spec in [
            "tap=t0,rate_pps=1000",
            "backend=sink,rate_pps=0",
            "backend=sink,frame_size=64",
            "backend=loop,frame_size=64",
        ] {
            assert!(
                matches!(
                    spec.parse::<NetConfig>(),
                    Err(NetConfigError::BackendOption { .. })
                ),
                "{spec}"
            );
        }
        assert!(matches!(
            "backend=sink,rate_pps=fast".parse::<NetConfig>(),
            Err(NetConfigError::InvalidValue { .. })
        ));
        assert!(matches!(
            "backend=source,frame_size=70000".parse::<NetConfig>(),
            Err(NetConfigError::InvalidValue { .. })
        ));
    }

    #[test]
    fn packed_and_in_order_keys_and_fields() {
        let default: NetConfig = "tap0".parse().expect("valid");
        assert!(!default.packed && !default.in_order);
        let on: NetConfig = "tap=t0,packed=on,in_order=on".parse().expect("valid");
        assert!(on.packed && on.in_order);
        let json = serde_json::to_string(&on).expect("json");
        assert!(json.contains("\"packed\":true") && json.contains("\"in_order\":true"));
        let back: NetConfig = serde_json::from_str(&json).expect("parse");
        assert!(back.packed && back.in_order);
        assert!(!serde_json::to_string(&default)
            .expect("json")
            .contains("packed"));
        assert!(matches!(
            "tap=t0,packed=yes".parse::<NetConfig>(),
            Err(NetConfigError::InvalidValue { .. })
        ));
        assert_eq!(
            "tap=t0,packed=on,packed=off".parse::<NetConfig>(),
            Err(NetConfigError::DuplicateKey("packed".into()))
        );
    }

    #[test]
    fn io_uring_key_and_field() {
        assert!("tap0".parse::<NetConfig>().expect("valid").io_uring);
        assert!(
            "tap=t0,io_uring=on"
                .parse::<NetConfig>()
                .expect("valid")
                .io_uring
        );
        let off: NetConfig = "tap=t0,io_uring=off".parse().expect("valid");
        assert!(!off.io_uring);
        assert!(matches!(
            "tap=t0,io_uring=maybe".parse::<NetConfig>(),
            Err(NetConfigError::InvalidValue { .. })
        ));
        assert_eq!(
            "tap=t0,io_uring=on,io_uring=off".parse::<NetConfig>(),
            Err(NetConfigError::DuplicateKey("io_uring".into()))
        );
        // serde: on is the default and not written back; off round-trips.
        let json = serde_json::to_string(&off).expect("json");
        assert!(json.contains("\"io_uring\":false"), "{json}");
        let back: NetConfig = serde_json::from_str(&json).expect("valid");
        assert!(!back.io_uring);
        let on: NetConfig = serde_json::from_str(r#"{"tap":"t0"}"#).expect("valid");
        assert!(on.io_uring);
        assert!(!serde_json::to_string(&on)
            .expect("json")
            .contains("io_uring"));
    }

    #[test]
    fn queues_key_and_field() {
        let cfg: NetConfig = "tap=t0,queues=2".parse().expect("valid");
        assert_eq!(cfg.queues, 2);
        assert_eq!("tap0".parse::<NetConfig>().expect("valid").queues, 1);
        let max: NetConfig = "tap=t0,queues=16".parse().expect("valid");
        assert_eq!(max.queues, MAX_QUEUE_PAIRS);
        for bad in ["0", "17", "-1", "two", ""] {
            assert_eq!(
                format!("tap=t0,queues={bad}").parse::<NetConfig>(),
                Err(NetConfigError::InvalidQueues(bad.to_owned())),
                "{bad}"
            );
        }
        assert_eq!(
            "tap=t0,queues=2,queues=2".parse::<NetConfig>(),
            Err(NetConfigError::DuplicateKey("queues".into()))
        );
        let err = "tap=t0,queues=99".parse::<NetConfig>().unwrap_err();
        assert!(err.to_string().contains("1 to 16"), "{err}");
        // serde: absent is 1 (and not written back), present is validated.
        let json: NetConfig = serde_json::from_str(r#"{"tap":"t0","queues":4}"#).expect("valid");
        assert_eq!(json.queues, 4);
        assert!(serde_json::to_string(&json)
            .expect("json")
            .contains("\"queues\":4"));
        let one: NetConfig = serde_json::from_str(r#"{"tap":"t0"}"#).expect("valid");
        assert_eq!(one.queues, 1);
        assert!(!serde_json::to_string(&one)
            .expect("json")
            .contains("queues"));
        assert!(serde_json::from_str::<NetConfig>(r#"{"tap":"t0","queues":0}"#).is_err());
        assert!(serde_json::from_str::<NetConfig>(r#"{"tap":"t0","queues":17}"#).is_err());
    }

    #[test]
    fn bare_name_gets_defaults() {
        let cfg: NetConfig = "tap0".parse().expect("valid");
        assert_eq!(cfg.tap, "tap0");
        assert_eq!(cfg.queue_size, DEFAULT_QUEUE_SIZE);
        assert_eq!(cfg.mac, MacAddr::derived_from("tap0"));
        assert_eq!(cfg.mac.bytes()[0], 0x02, "locally administered unicast");
        assert_ne!(MacAddr::derived_from("tap0"), MacAddr::derived_from("tap1"));
    }

    #[test]
    fn key_value_form() {
        let cfg: NetConfig = "queue_size=1024,tap=vmtap,mac=02:AA:bb:00:00:01"
            .parse()
            .expect("valid");
        assert_eq!(cfg.tap, "vmtap");
        assert_eq!(cfg.queue_size, 1024);
        assert_eq!(cfg.mac.to_string(), "02:aa:bb:00:00:01");
    }

    #[test]
    fn errors_name_the_problem() {
        let cases: [(&str, NetConfigError); 8] = [
            ("mac=02:00:00:00:00:01", NetConfigError::MissingTap),
            ("tap=a,speed=10", NetConfigError::UnknownKey("speed".into())),
            ("tap=a,tap=b", NetConfigError::DuplicateKey("tap".into())),
            ("tap=a,mac", NetConfigError::NotKeyValue("mac".into())),
            (
                "tap=a,mac=03:00:00:00:00:01",
                NetConfigError::InvalidMac("03:00:00:00:00:01".into()),
            ),
            (
                "tap=a,mac=02:00:00:00:00",
                NetConfigError::InvalidMac("02:00:00:00:00".into()),
            ),
            (
                "tap=a,queue_size=100",
                NetConfigError::InvalidQueueSize("100".into()),
            ),
            (
                "tap=a,queue_size=65536",
                NetConfigError::InvalidQueueSize("65536".into()),
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(input.parse::<NetConfig>(), Err(expected), "{input}");
        }
        for bad in ["", "a/b", "sixteen-bytes-xx", "tap 0", "..", "tap%d", "a:b"] {
            assert!(
                matches!(
                    bad.parse::<NetConfig>(),
                    Err(NetConfigError::InvalidTapName { .. })
                ),
                "{bad:?}"
            );
        }
        assert!("tap=a,queue_size=1".parse::<NetConfig>().is_err());
        assert!("tap=a,queue_size=32768".parse::<NetConfig>().is_ok());
    }

    #[test]
    fn rate_limiters_in_the_short_form() {
        let cfg: NetConfig = "tap=t0,tx_ops=50000/1000,tx_bw=20000000/1000/1000000,rx_ops=10/1"
            .parse()
            .expect("valid");
        assert_eq!(
            cfg.tx_rate_limiter.ops.map(|b| (b.size, b.refill_time)),
            Some((50000, 1000))
        );
        assert_eq!(
            cfg.tx_rate_limiter.bandwidth.map(|b| b.one_time_burst),
            Some(1_000_000)
        );
        assert_eq!(cfg.rx_rate_limiter.ops.map(|b| b.size), Some(10));
        assert!(cfg.rx_rate_limiter.bandwidth.is_none());
        for bad in [
            "tap=t0,tx_ops=5",
            "tap=t0,rx_bw=1/0",
            "tap=t0,tx_ops=1/1,tx_ops=2/2",
        ] {
            assert!(bad.parse::<NetConfig>().is_err(), "{bad}");
        }
        let json: NetConfig = serde_json::from_str(
            r#"{"tap":"t0","tx_rate_limiter":{"ops":{"size":5,"refill_time":10}}}"#,
        )
        .expect("valid");
        assert_eq!(json.tx_rate_limiter.ops.map(|b| b.size), Some(5));
    }

    #[test]
    fn adaptation_and_its_bounds_in_the_short_form_and_the_json_form() {
        use crate::virtio::net::tuning::Adaptive;
        let cfg: NetConfig = "tap=t0,adaptive=on,adaptive_max_busy_poll_us=200,\
                              adaptive_max_coalesce_usecs=32,adaptive_interval_us=500"
            .parse()
            .expect("valid");
        assert_eq!(
            cfg.tuning.adaptive,
            Adaptive {
                enabled: true,
                max_busy_poll_us: 200,
                max_coalesce_usecs: 32,
                interval_us: 500,
            }
        );
        let defaults: NetConfig = "tap=t0,adaptive=on".parse().expect("valid");
        assert_eq!(
            defaults.tuning.adaptive,
            Adaptive {
                enabled: true,
                ..Adaptive::default()
            }
        );
        for (bad, error) in [
            (
                "tap=t0,adaptive=on,adaptive_max_busy_poll_us=10001",
                NetConfigError::Tuning(TuningError::AdaptiveBusyPoll(10_001)),
            ),
            (
                "tap=t0,adaptive_interval_us=50",
                NetConfigError::Tuning(TuningError::AdaptiveInterval(50)),
            ),
            (
                "tap=t0,adaptive=maybe",
                NetConfigError::InvalidValue {
                    key: "adaptive".into(),
                    value: "maybe".into(),
                    expected: "on or off",
                },
            ),
            (
                "tap=t0,adaptive=on,adaptive=off",
                NetConfigError::DuplicateKey("adaptive".into()),
            ),
        ] {
            assert_eq!(bad.parse::<NetConfig>(), Err(error), "{bad}");
        }
        let json: NetConfig = serde_json::from_str(
            r#"{"tap":"t0","tuning":{"adaptive":{"enabled":true,"max_busy_poll_us":9}}}"#,
        )
        .expect("valid");
        assert_eq!(
            (
                json.tuning.adaptive.max_busy_poll_us,
                json.tuning.adaptive.interval_us
            ),
            (9, 1_000)
        );
    }

    #[test]
    fn tuning_in_the_short_form() {
        let cfg: NetConfig =
            "tap=t0,coalesce_packets=16,coalesce_usecs=100,event_idx=off,tx_budget=64,busy_poll_us=50,rx_sparse_reads=off,busy_poll_sleep_us=10,kick_coalesce_packets=128,kick_coalesce_usecs=50"
                .parse()
                .expect("valid");
        assert!(!cfg.tuning.rx_sparse_reads);
        assert_eq!(cfg.tuning.interrupt_coalescing.max_packets, 16);
        assert_eq!(cfg.tuning.interrupt_coalescing.max_usecs, 100);
        assert!(!cfg.tuning.event_idx);
        assert_eq!(cfg.tuning.tx_budget, 64);
        assert_eq!(cfg.tuning.busy_poll_us, 50);
        assert_eq!(cfg.tuning.busy_poll_sleep_us, 10);
        assert_eq!(
            (
                cfg.tuning.kick_coalescing.max_packets,
                cfg.tuning.kick_coalescing.max_usecs
            ),
            (128, 50)
        );
        assert_eq!(
            "tap0".parse::<NetConfig>().expect("valid").tuning,
            NetTuning::default()
        );
        let cases: [(&str, NetConfigError); 10] = [
            (
                "tap=t0,busy_poll_us=10001",
                NetConfigError::Tuning(TuningError::BusyPoll(10001)),
            ),
            (
                "tap=t0,kick_coalesce_packets=64",
                NetConfigError::Tuning(TuningError::KickPacketsWithoutTime(64)),
            ),
            (
                "tap=t0,kick_coalesce_packets=64,kick_coalesce_usecs=10001",
                NetConfigError::Tuning(TuningError::KickUsecs(10001)),
            ),
            (
                "tap=t0,busy_poll_us=50,busy_poll_sleep_us=1001",
                NetConfigError::Tuning(TuningError::BusyPollSleep(1001)),
            ),
            (
                "tap=t0,tx_budget=0",
                NetConfigError::Tuning(TuningError::TxBudget(0)),
            ),
            (
                "tap=t0,coalesce_packets=8",
                NetConfigError::Tuning(TuningError::PacketsWithoutTime(8)),
            ),
            (
                "tap=t0,busy_poll_us=5,busy_poll_us=6",
                NetConfigError::DuplicateKey("busy_poll_us".into()),
            ),
            (
                "tap=t0,event_idx=maybe",
                NetConfigError::InvalidValue {
                    key: "event_idx".into(),
                    value: "maybe".into(),
                    expected: "on or off",
                },
            ),
            (
                "tap=t0,rx_sparse_reads=sometimes",
                NetConfigError::InvalidValue {
                    key: "rx_sparse_reads".into(),
                    value: "sometimes".into(),
                    expected: "on or off",
                },
            ),
            (
                "tap=t0,tx_budget=-1",
                NetConfigError::InvalidValue {
                    key: "tx_budget".into(),
                    value: "-1".into(),
                    expected: "frames per call",
                },
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(input.parse::<NetConfig>(), Err(expected), "{input}");
        }
        let json: NetConfig =
            serde_json::from_str(r#"{"tap":"t0","tuning":{"busy_poll_us":7}}"#).expect("valid");
        assert_eq!(json.tuning.busy_poll_us, 7);
        assert!(
            serde_json::from_str::<NetConfig>(r#"{"tap":"t0","tuning":{"tx_budget":0}}"#).is_err()
        );
    }

    #[test]
    fn macs_are_six_groups_of_two_hex_digits_unicast_and_not_zero() {
        for bad in [
            "+2:00:00:00:00:01",
            "02:+0:00:00:00:01",
            "02:-0:00:00:00:01",
            "00:00:00:00:00:00",
            "01:00:5e:00:00:01",
            "2:00:00:00:00:01",
            "002:00:00:00:00:01",
            "02-00-00-00-00-01",
            "02:00:00:00:00:01:",
            "02:00:00:00:00:0g",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?}");
        }
        let mac: MacAddr = "02:Ab:cD:00:00:ff".parse().expect("valid");
        assert_eq!(mac, MacAddr::new([2, 0xab, 0xcd, 0, 0, 0xff]));
    }

    #[test]
    fn serde_round_trip_validates() {
        let cfg: NetConfig = serde_json::from_str(r#"{"tap":"tap7"}"#).expect("valid");
        assert_eq!(cfg, "tap7".parse().expect("valid"));
        let json = serde_json::to_string(&cfg).expect("serialise");
        assert_eq!(
            serde_json::from_str::<NetConfig>(&json).expect("valid"),
            cfg
        );
        assert!(serde_json::from_str::<NetConfig>(r#"{"tap":"t","queue_size":3}"#).is_err());
        assert!(serde_json::from_str::<NetConfig>(r#"{"tap":"t","bogus":1}"#).is_err());
        assert!(serde_json::from_str::<NetConfig>(r#"{"tap":"t","mac":"zz"}"#).is_err());
    }
}
