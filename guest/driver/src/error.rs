//! Error types, one per concern. `no_std`: `Display` by hand, `core::error::Error`.

use core::fmt;

/// A [`crate::Config`] value out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A queue size that is not a power of two in 2..=32768.
    QueueSize(u16),
    /// An rx buffer size outside 13..=header + largest frame.
    RxBufSize(u32),
    /// A tx buffer size outside 13..=header + largest frame.
    TxBufSize(u32),
    /// A kick threshold of 0.
    KickThreshold(u16),
    /// An XDP bulk size of 0.
    XdpBulk(u16),
    /// A largest adaptive kick threshold outside 1..=64.
    KickThresholdMax(u16),
    /// A queue pair count outside 1..=0x8000.
    QueuePairs(u16),
    /// More than one queue pair without the control queue (MQ needs CTRL_VQ).
    MqNeedsCtrlVq,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::QueueSize(s) => {
                write!(f, "queue size {s} is not a power of two in 2..=32768")
            }
            ConfigError::RxBufSize(s) => write!(f, "rx buffer size {s} out of range"),
            ConfigError::TxBufSize(s) => write!(f, "tx buffer size {s} out of range"),
            ConfigError::KickThreshold(n) => write!(f, "kick threshold {n} (must be at least 1)"),
            ConfigError::XdpBulk(n) => write!(f, "XDP bulk size {n} (must be at least 1)"),
            ConfigError::KickThresholdMax(n) => {
                write!(f, "largest kick threshold {n} (must be 1..=64)")
            }
            ConfigError::QueuePairs(n) => write!(f, "{n} queue pairs (must be 1..=32768)"),
            ConfigError::MqNeedsCtrlVq => {
                write!(
                    f,
                    "more than one queue pair needs the control queue (ctrl_vq)"
                )
            }
        }
    }
}

impl core::error::Error for ConfigError {}

/// Why [`crate::VirtioNet::new`] failed. The device is left with FAILED set (or reset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitError {
    /// The configuration is invalid.
    Config(ConfigError),
    /// The window does not hold a virtio-mmio device (wrong magic value).
    BadMagic(u32),
    /// A register layout other than Version 2 (legacy devices are unsupported).
    UnsupportedVersion(u32),
    /// Not a network device (the device ID).
    NotNet(u32),
    /// The device did not read back status 0 after a reset.
    ResetTimeout,
    /// The device does not offer VIRTIO_F_VERSION_1.
    NoVersion1,
    /// The device did not accept the acknowledged features (FEATURES_OK did not stick).
    FeaturesRejected,
    /// A queue the driver needs does not exist (QueueNumMax 0) or is already in use.
    QueueUnavailable(u16),
    /// MRG_RXBUF was not negotiated and rx buffers cannot hold a full frame.
    RxBufTooSmall {
        /// The configured size.
        size: u32,
        /// The smallest size that works without MRG_RXBUF.
        min: u32,
    },
    /// The HAL could not allocate DMA memory.
    DmaAlloc,
    /// The device set DEVICE_NEEDS_RESET when the driver set DRIVER_OK.
    DeviceNeedsReset,
    /// The device refused every MSI-X vector offered for a queue (`Some(queue)`) or for
    /// configuration changes (`None`): it read back NO_VECTOR.
    VectorRefused(Option<u16>),
    /// A queue's notification address lies outside the notification structure (virtio-pci).
    NotifyOutOfRange(u16),
    /// More than one queue pair was asked for, but VIRTIO_NET_F_MQ could not be negotiated:
    /// the device offers no MQ, or no control queue (MQ needs CTRL_VQ).
    MqUnavailable {
        /// Pairs asked for.
        wanted: u16,
    },
    /// More queue pairs were asked for than the device's `max_virtqueue_pairs`.
    TooManyQueuePairs {
        /// Pairs asked for.
        wanted: u16,
        /// The device's `max_virtqueue_pairs`.
        max: u16,
    },
    /// The control command enabling the queue pairs (MQ VQ_PAIRS_SET) failed.
    QueuePairsSet {
        /// Pairs asked for.
        wanted: u16,
        /// Why.
        error: CtrlError,
    },
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitError::Config(_) => write!(f, "invalid driver configuration"),
            InitError::BadMagic(m) => write!(f, "no virtio-mmio device (magic {m:#x})"),
            InitError::UnsupportedVersion(v) => write!(f, "virtio-mmio version {v} (need 2)"),
            InitError::NotNet(id) => write!(f, "device type {id} is not a network device"),
            InitError::ResetTimeout => write!(f, "device did not complete its reset"),
            InitError::NoVersion1 => write!(f, "device does not offer VIRTIO_F_VERSION_1"),
            InitError::FeaturesRejected => write!(f, "device rejected the acknowledged features"),
            InitError::QueueUnavailable(q) => write!(f, "queue {q} is unavailable"),
            InitError::RxBufTooSmall { size, min } => write!(
                f,
                "rx buffers of {size} bytes need MRG_RXBUF (at least {min} bytes without it)"
            ),
            InitError::DmaAlloc => write!(f, "DMA allocation failed"),
            InitError::DeviceNeedsReset => write!(f, "device needs a reset after DRIVER_OK"),
            InitError::VectorRefused(Some(q)) => {
                write!(f, "device refused every MSI-X vector for queue {q}")
            }
            InitError::VectorRefused(None) => {
                write!(
                    f,
                    "device refused every MSI-X vector for configuration changes"
                )
            }
            InitError::NotifyOutOfRange(q) => {
                write!(
                    f,
                    "queue {q}'s notification address is outside the notify structure"
                )
            }
            InitError::MqUnavailable { wanted } => write!(
                f,
                "{wanted} queue pairs asked for, but the device offers no multiqueue \
                 (VIRTIO_NET_F_MQ with VIRTIO_NET_F_CTRL_VQ)"
            ),
            InitError::TooManyQueuePairs { wanted, max } => write!(
                f,
                "{wanted} queue pairs asked for, but the device has at most {max} \
                 (max_virtqueue_pairs)"
            ),
            InitError::QueuePairsSet { wanted, error } => {
                write!(
                    f,
                    "enabling {wanted} queue pairs (VQ_PAIRS_SET) failed: {error}"
                )
            }
        }
    }
}

impl core::error::Error for InitError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            InitError::Config(e) => Some(e),
            InitError::QueuePairsSet { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<ConfigError> for InitError {
    fn from(e: ConfigError) -> Self {
        InitError::Config(e)
    }
}

/// Why a frame was not queued for transmission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxError {
    /// No free descriptor or tx buffer (counted in `ring_full`). Reclaim and retry.
    RingFull,
    /// The frame is longer than a tx buffer holds.
    TooLarge {
        /// The frame's length.
        len: usize,
        /// The largest frame accepted.
        max: usize,
    },
    /// An empty frame.
    Empty,
}

impl fmt::Display for TxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxError::RingFull => write!(f, "transmit ring full"),
            TxError::TooLarge { len, max } => write!(f, "{len}-byte frame exceeds {max} bytes"),
            TxError::Empty => write!(f, "empty frame"),
        }
    }
}

impl core::error::Error for TxError {}

/// Errors of the AF_XDP-style transmit path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XskError {
    /// The HAL cannot translate the umem's address.
    UmemNotDma,
    /// A frame size of at most the 12-byte headroom, or a umem smaller than one frame.
    UmemGeometry,
    /// An access outside the umem.
    OutOfBounds,
    /// A ring size that is not a power of two ≥ 2.
    RingSize(u32),
    /// A port is already attached.
    AlreadyAttached,
    /// No port is attached.
    NotAttached,
    /// Frames of the port are still in flight.
    Busy,
}

impl fmt::Display for XskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XskError::UmemNotDma => write!(f, "umem is not DMA-able memory"),
            XskError::UmemGeometry => write!(f, "umem frame size or length invalid"),
            XskError::OutOfBounds => write!(f, "access outside the umem"),
            XskError::RingSize(n) => write!(f, "ring size {n} is not a power of two >= 2"),
            XskError::AlreadyAttached => write!(f, "an AF_XDP port is already attached"),
            XskError::NotAttached => write!(f, "no AF_XDP port attached"),
            XskError::Busy => write!(f, "umem frames still in flight"),
        }
    }
}

impl core::error::Error for XskError {}

/// Why a control command ([`crate::VirtioNet::control`] and its typed helpers) did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlError {
    /// The feature the command needs (named) was not negotiated: the device does not offer
    /// it, or [`crate::Config`] turned it off.
    NotNegotiated(&'static str),
    /// Command data or reply longer than [`crate::ctrl::DATA_MAX`] /
    /// [`crate::ctrl::REPLY_MAX`].
    TooLarge,
    /// An earlier command timed out and the device still holds it.
    Busy,
    /// The device did not answer within the wait bound ([`crate::ctrl::CtrlWait`]); the
    /// command stays queued (see [`CtrlError::Busy`]).
    Timeout,
    /// The device answered VIRTIO_NET_ERR (typed helpers; `control` returns
    /// [`crate::ctrl::Ack::Err`]).
    Rejected,
    /// The device returned the command with an ack that is neither VIRTIO_NET_OK nor
    /// VIRTIO_NET_ERR (0xff: it did not write the ack).
    BadAck(u8),
    /// The device acknowledged with VIRTIO_NET_OK but wrote fewer bytes than the reply and
    /// the ack (the used length).
    ShortReply {
        /// The used length.
        len: u32,
        /// Reply bytes plus the ack.
        expected: u32,
    },
    /// The device broke the control queue (a used entry that is not the command in flight, or
    /// a used index past the ring); counted in `device_errors`.
    Device,
    /// STATS GET asked for no type, or for a type this driver cannot parse (outside
    /// [`crate::stats::StatsTypes::PARSED`]); nothing was sent.
    UnsupportedStats(u64),
    /// The device acknowledged STATS GET with VIRTIO_NET_OK but its reply is malformed (a
    /// block of the wrong type, queue or size); none of it is used.
    BadStatsReply(crate::stats::StatsReplyError),
    /// VQ_PAIRS_SET with a pair count outside 1..=the pairs the driver set up.
    QueuePairs {
        /// Pairs asked for.
        wanted: u16,
        /// Pairs set up.
        pairs: u16,
    },
}

impl fmt::Display for CtrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtrlError::NotNegotiated(feature) => {
                write!(
                    f,
                    "{feature} not negotiated (the device does not offer it, or it is off)"
                )
            }
            CtrlError::TooLarge => write!(f, "control command data or reply too large"),
            CtrlError::Busy => write!(f, "an earlier control command is still unanswered"),
            CtrlError::Timeout => write!(f, "the device did not answer the control command"),
            CtrlError::Rejected => write!(f, "the device refused the command (VIRTIO_NET_ERR)"),
            CtrlError::BadAck(a) => write!(f, "invalid control ack {a:#x}"),
            CtrlError::ShortReply { len, expected } => write!(
                f,
                "control reply of {len} bytes written (expected {expected} with the ack)"
            ),
            CtrlError::Device => write!(f, "the device broke the control queue"),
            CtrlError::UnsupportedStats(types) => write!(
                f,
                "statistics types {types:#x} cannot be asked for (this driver parses CVQ, \
                 RX_BASIC, RX_SPEED, TX_BASIC and TX_SPEED)"
            ),
            CtrlError::BadStatsReply(e) => write!(f, "malformed device statistics: {e}"),
            CtrlError::QueuePairs { wanted, pairs } => write!(
                f,
                "{wanted} queue pairs asked for (the driver set up {pairs})"
            ),
        }
    }
}

impl core::error::Error for CtrlError {}

/// A queue pair index the driver did not set up ([`crate::VirtioNet::select_pair`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairError {
    /// The index asked for.
    pub pair: u16,
    /// Pairs set up (valid indexes are below this).
    pub pairs: u16,
}

impl fmt::Display for PairError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "queue pair {} does not exist (the driver set up {})",
            self.pair, self.pairs
        )
    }
}

impl core::error::Error for PairError {}
