//! Device-side knobs that can change while the guest runs (the VMM's API sets them):
//! interrupt coalescing, whether the driver's `used_event` (EVENT_IDX) may suppress
//! interrupts, the tx budget per call, the device busy-poll and sparse rx reads.
//!
//! A change is handed to the worker without touching the datapath: the whole [`NetTuning`]
//! is packed into one atomic word, then an eventfd wakes the worker, which copies the word
//! into its own state between two batches. The worker never reads the atomic on the hot path.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::rate_limiter::{RateLimiterConfig, RateLimiterError};

/// Longest an interrupt may be held back (1 s): longer would only stall the guest.
pub const MAX_COALESCE_USECS: u32 = 1_000_000;

/// Longest device busy-poll (10 ms): a worker that polls longer is a spinning core.
pub const MAX_BUSY_POLL_USECS: u32 = 10_000;
/// Longest sleep between two looks of a sleeping busy-poll (1 ms).
pub const MAX_BUSY_POLL_SLEEP_USECS: u32 = 1000;
/// Longest kick coalescing time (10 ms): the longest a queued frame may wait for the device.
pub const MAX_KICK_COALESCE_USECS: u32 = 10_000;
/// Default frames per tx call before the worker looks at its other events.
pub const DEFAULT_TX_BUDGET: u16 = 256;
/// Largest tx budget (frames per call).
pub const MAX_TX_BUDGET: u16 = 4096;

/// Errors in a tuning request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TuningError {
    /// `max_usecs` above [`MAX_COALESCE_USECS`].
    #[error("interrupt_coalescing.max_usecs {0} is out of range (0..={MAX_COALESCE_USECS})")]
    MaxUsecs(u32),
    /// A packet bound without a time bound could hold an interrupt forever.
    #[error(
        "interrupt_coalescing.max_packets {0} needs max_usecs > 0 (without a time bound an \
         interrupt could be held forever); use max_packets 0 with max_usecs 0 to turn coalescing off"
    )]
    PacketsWithoutTime(u16),
    /// `busy_poll_us` above [`MAX_BUSY_POLL_USECS`].
    #[error("busy_poll_us {0} is out of range (0..={MAX_BUSY_POLL_USECS})")]
    BusyPoll(u32),
    /// `busy_poll_sleep_us` above [`MAX_BUSY_POLL_SLEEP_USECS`].
    #[error("busy_poll_sleep_us {0} is out of range (0..={MAX_BUSY_POLL_SLEEP_USECS})")]
    BusyPollSleep(u32),
    /// `kick_coalescing.max_usecs` above [`MAX_KICK_COALESCE_USECS`].
    #[error("kick_coalescing.max_usecs {0} is out of range (0..={MAX_KICK_COALESCE_USECS})")]
    KickUsecs(u32),
    /// A kick packet bound without a time bound could leave frames queued forever.
    #[error(
        "kick_coalescing.max_packets {0} needs max_usecs > 0 (without a time bound the last \
         frames of a burst could wait forever); use max_packets 0 to turn kick coalescing off"
    )]
    KickPacketsWithoutTime(u16),
    /// `tx_budget` of 0 or above [`MAX_TX_BUDGET`].
    #[error("tx_budget {0} is out of range (1..={MAX_TX_BUDGET})")]
    TxBudget(u16),
    /// A guest's NOTF_COAL `max_packets` above 65535.
    #[error("max_packets {0} is out of range (0..=65535)")]
    MaxPackets(u32),
    /// `adaptive.max_busy_poll_us` above [`MAX_BUSY_POLL_USECS`].
    #[error("adaptive.max_busy_poll_us {0} is out of range (0..={MAX_BUSY_POLL_USECS})")]
    AdaptiveBusyPoll(u32),
    /// `adaptive.max_coalesce_usecs` above [`MAX_COALESCE_USECS`].
    #[error("adaptive.max_coalesce_usecs {0} is out of range (0..={MAX_COALESCE_USECS})")]
    AdaptiveCoalesce(u32),
    /// `adaptive.interval_us` outside 100..=1000000.
    #[error("adaptive.interval_us {0} is out of range (100..=1000000)")]
    AdaptiveInterval(u32),
}

/// Interrupt coalescing: after a batch the driver wants to hear about, the device holds the
/// interrupt until `max_packets` frames have completed since the interrupt was first held, or
/// `max_usecs` have passed, whichever comes first.
///
/// `max_usecs == 0` turns coalescing off (every batch interrupts at once, the default);
/// `max_packets == 0` with `max_usecs > 0` bounds by time only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterruptCoalescing {
    /// Frames (rx + tx) completed while an interrupt is held that release it; 0: no packet bound.
    pub max_packets: u16,
    /// Microseconds an interrupt may be held; 0: coalescing off.
    pub max_usecs: u32,
}

impl InterruptCoalescing {
    /// No coalescing.
    pub const OFF: InterruptCoalescing = InterruptCoalescing {
        max_packets: 0,
        max_usecs: 0,
    };

    /// True when interrupts may be held back.
    pub fn is_enabled(&self) -> bool {
        self.max_usecs > 0
    }

    /// The bounds a guest asked for with NOTF_COAL (`max_packets`, `max_usecs` as on the
    /// wire), validated like the operator's: the same meaning and the same limits. `max_usecs`
    /// 0 with `max_packets` 0 or 1 is "off" (what Linux sends, and what the spec calls no
    /// coalescing); `max_usecs` 0 with `max_packets` > 1 would hold an interrupt with no time
    /// bound and is refused, like `max_usecs` above [`MAX_COALESCE_USECS`] and `max_packets`
    /// above 65535.
    pub fn from_guest(max_packets: u32, max_usecs: u32) -> Result<Self, TuningError> {
        let max_packets =
            u16::try_from(max_packets).map_err(|_| TuningError::MaxPackets(max_packets))?;
        let c = InterruptCoalescing {
            max_packets,
            max_usecs,
        };
        c.validate()?;
        Ok(c)
    }

    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), TuningError> {
        if self.max_usecs > MAX_COALESCE_USECS {
            return Err(TuningError::MaxUsecs(self.max_usecs));
        }
        if self.max_usecs == 0 && self.max_packets > 1 {
            return Err(TuningError::PacketsWithoutTime(self.max_packets));
        }
        Ok(())
    }
}

/// Kick coalescing, the device's side of the driver's kick batching (EVENT_IDX only): when
/// the tx queue runs dry, the device lets the driver queue `max_packets` buffers without a
/// kick, the next one kicking (`avail_event` set that far past the next entry, at most the
/// queue size less one), instead of asking for a kick at the next buffer, and looks at the
/// ring by itself `max_usecs` after it went to sleep. A look that finds frames sends them and
/// waits the same way again; one that finds none asks for a kick at the next buffer until the
/// next kick or look finds work. A driver that queues steadily then kicks once per
/// `max_packets` frames, and no frame waits more than about `max_usecs` for the device.
///
/// `max_packets == 0` turns it off (the default); it needs `max_usecs > 0`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KickCoalescing {
    /// Buffers the driver queues past a drained ring before it kicks; 0: off.
    pub max_packets: u16,
    /// Microseconds after which the device looks at the ring by itself (1..=10000 when on).
    pub max_usecs: u32,
}

impl KickCoalescing {
    /// Whether the driver is asked to kick later than at its next buffer.
    pub fn is_enabled(&self) -> bool {
        self.max_packets > 0
    }

    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), TuningError> {
        if self.max_usecs > MAX_KICK_COALESCE_USECS {
            return Err(TuningError::KickUsecs(self.max_usecs));
        }
        if self.max_usecs == 0 && self.max_packets > 0 {
            return Err(TuningError::KickPacketsWithoutTime(self.max_packets));
        }
        Ok(())
    }
}

/// Default adaptation interval.
pub const DEFAULT_ADAPT_INTERVAL_US: u32 = 1_000;
/// Shortest adaptation interval.
pub const MIN_ADAPT_INTERVAL_US: u32 = 100;
/// Longest adaptation interval.
pub const MAX_ADAPT_INTERVAL_US: u32 = 1_000_000;
/// Default bound on the busy-poll window.
pub const DEFAULT_ADAPT_MAX_BUSY_POLL_US: u32 = 64;
/// Default bound on the coalescing time.
pub const DEFAULT_ADAPT_MAX_COALESCE_USECS: u32 = 64;

/// Device-side adaptation and the operator's bounds (`--net …,adaptive=on`, the config file's
/// and the API's `tuning.adaptive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adaptive {
    /// Adapt (off by default). While on, the busy-poll window and the operator's interrupt
    /// coalescing are the adapter's (`busy_poll_us` and `interrupt_coalescing` are ignored);
    /// coalescing the guest sets over NOTF_COAL still wins. Kick coalescing is the adapter's
    /// too unless the operator set it (`kick_coalescing`).
    #[serde(default)]
    pub enabled: bool,
    /// Longest busy-poll window the device may choose (µs, 0..=10000; 0: never poll).
    #[serde(default = "default_max_busy_poll_us")]
    pub max_busy_poll_us: u32,
    /// Longest interrupt hold the device may choose (µs; 0: never coalesce). Only the
    /// ladder's levels at or under it are used; it also bounds the look of the kick
    /// coalescing the device may choose (0: none).
    #[serde(default = "default_max_coalesce_usecs")]
    pub max_coalesce_usecs: u32,
    /// How often the device looks at what it saw and decides (µs, 100..=1000000).
    #[serde(default = "default_interval_us")]
    pub interval_us: u32,
}

fn default_max_busy_poll_us() -> u32 {
    DEFAULT_ADAPT_MAX_BUSY_POLL_US
}

fn default_max_coalesce_usecs() -> u32 {
    DEFAULT_ADAPT_MAX_COALESCE_USECS
}

fn default_interval_us() -> u32 {
    DEFAULT_ADAPT_INTERVAL_US
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            enabled: false,
            max_busy_poll_us: DEFAULT_ADAPT_MAX_BUSY_POLL_US,
            max_coalesce_usecs: DEFAULT_ADAPT_MAX_COALESCE_USECS,
            interval_us: DEFAULT_ADAPT_INTERVAL_US,
        }
    }
}

impl Adaptive {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), TuningError> {
        if self.max_busy_poll_us > MAX_BUSY_POLL_USECS {
            return Err(TuningError::AdaptiveBusyPoll(self.max_busy_poll_us));
        }
        if self.max_coalesce_usecs > MAX_COALESCE_USECS {
            return Err(TuningError::AdaptiveCoalesce(self.max_coalesce_usecs));
        }
        if !(MIN_ADAPT_INTERVAL_US..=MAX_ADAPT_INTERVAL_US).contains(&self.interval_us) {
            return Err(TuningError::AdaptiveInterval(self.interval_us));
        }
        Ok(())
    }

    /// Packs validated bounds into one word: bit 0 enabled, 1..15 max_busy_poll_us
    /// (≤ 10 000), 15..35 max_coalesce_usecs (≤ 1 000 000), 35..55 interval_us (≤ 1 000 000).
    pub(crate) fn pack(&self) -> u64 {
        u64::from(self.enabled)
            | u64::from(self.max_busy_poll_us & 0x3fff) << 1
            | u64::from(self.max_coalesce_usecs & 0xf_ffff) << 15
            | u64::from(self.interval_us & 0xf_ffff) << 35
    }

    pub(crate) fn unpack(word: u64) -> Adaptive {
        Adaptive {
            enabled: word & 1 != 0,
            max_busy_poll_us: ((word >> 1) & 0x3fff) as u32,
            max_coalesce_usecs: ((word >> 15) & 0xf_ffff) as u32,
            interval_us: ((word >> 35) & 0xf_ffff) as u32,
        }
    }
}

/// The runtime knobs of one virtio-net device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetTuning {
    /// Interrupt coalescing (off by default).
    #[serde(default)]
    pub interrupt_coalescing: InterruptCoalescing,
    /// Honour the driver's `used_event` when EVENT_IDX was negotiated (true, the default). With
    /// false the device interrupts after every batch the driver has not masked with its flags,
    /// as if it had not read `used_event`: for experiments on interrupt suppression.
    #[serde(default = "default_event_idx")]
    pub event_idx: bool,
    /// Frames one tx call sends before the worker looks at its other events (rx, timers,
    /// the API) and comes back (1..=4096, default 256).
    #[serde(default = "default_tx_budget")]
    pub tx_budget: u16,
    /// Device busy-poll, in microseconds (0: off, the default; at most 10 ms). After the worker
    /// drains the queues it keeps polling the tx avail ring (and, when rx waits for buffers,
    /// the rx avail ring; the backend every few microseconds) this long with the driver's
    /// notifications still disabled, before it re-enables them and sleeps: a driver that
    /// queues again within the window needs no kick. The userspace counterpart of vhost-net's
    /// `busyloop_timeout`; it costs a core while it polls.
    #[serde(default)]
    pub busy_poll_us: u32,
    /// How the busy-poll waits between two looks at the rings, in microseconds (0: it spins,
    /// the default; at most 1 ms). Above 0 the worker sleeps this long on a timer between
    /// looks (any epoll event wakes it early), its notifications still off: the driver still
    /// needs no kick within the window, for a fraction of the core a spinning poll costs. No
    /// effect while busy-poll is off.
    #[serde(default)]
    pub busy_poll_sleep_us: u32,
    /// Kick coalescing on the tx queue (off by default; see [`KickCoalescing`]). No effect
    /// while a busy-poll window runs (the driver's notifications are off then anyway) or
    /// without EVENT_IDX.
    #[serde(default)]
    pub kick_coalescing: KickCoalescing,
    /// Sparse rx reads (true, the default): when frames come one per wake-up (the last call
    /// that read the backend until empty found exactly one), an rx call reads one frame and
    /// stops instead of reading again to find the backend empty (a failed system call, ~370 ns
    /// on a tap here); one call in 32 still reads until empty, and one that finds a burst ends
    /// the mode. With false every rx call reads until the backend is empty.
    #[serde(default = "default_rx_sparse_reads")]
    pub rx_sparse_reads: bool,
    /// Device-side adaptation of the busy-poll window and the interrupt coalescing (off by
    /// default; see [`Adaptive`]).
    #[serde(default)]
    pub adaptive: Adaptive,
}

fn default_event_idx() -> bool {
    true
}

fn default_rx_sparse_reads() -> bool {
    true
}

fn default_tx_budget() -> u16 {
    DEFAULT_TX_BUDGET
}

impl Default for NetTuning {
    fn default() -> Self {
        NetTuning {
            interrupt_coalescing: InterruptCoalescing::OFF,
            event_idx: true,
            tx_budget: DEFAULT_TX_BUDGET,
            busy_poll_us: 0,
            busy_poll_sleep_us: 0,
            kick_coalescing: KickCoalescing::default(),
            rx_sparse_reads: true,
            adaptive: Adaptive::default(),
        }
    }
}

impl NetTuning {
    /// Checks every knob.
    pub fn validate(&self) -> Result<(), TuningError> {
        self.interrupt_coalescing.validate()?;
        if self.busy_poll_us > MAX_BUSY_POLL_USECS {
            return Err(TuningError::BusyPoll(self.busy_poll_us));
        }
        if self.busy_poll_sleep_us > MAX_BUSY_POLL_SLEEP_USECS {
            return Err(TuningError::BusyPollSleep(self.busy_poll_sleep_us));
        }
        if self.tx_budget == 0 || self.tx_budget > MAX_TX_BUDGET {
            return Err(TuningError::TxBudget(self.tx_budget));
        }
        self.kick_coalescing.validate()?;
        self.adaptive.validate()
    }

    /// This tuning with the fields `update` sets replaced.
    pub fn updated(&self, update: &NetTuningUpdate) -> NetTuning {
        NetTuning {
            interrupt_coalescing: update
                .interrupt_coalescing
                .unwrap_or(self.interrupt_coalescing),
            event_idx: update.event_idx.unwrap_or(self.event_idx),
            tx_budget: update.tx_budget.unwrap_or(self.tx_budget),
            busy_poll_us: update.busy_poll_us.unwrap_or(self.busy_poll_us),
            busy_poll_sleep_us: update.busy_poll_sleep_us.unwrap_or(self.busy_poll_sleep_us),
            kick_coalescing: update.kick_coalescing.unwrap_or(self.kick_coalescing),
            rx_sparse_reads: update.rx_sparse_reads.unwrap_or(self.rx_sparse_reads),
            adaptive: update.adaptive.unwrap_or(self.adaptive),
        }
    }

    /// Packs a validated tuning into one word: bits 0..20 max_usecs (≤ 1 000 000), 20..36
    /// max_packets, bit 36 event_idx, 37..51 busy_poll_us (≤ 10 000), bit 51
    /// rx_sparse_reads, 52..64 tx_budget − 1 (1..=4096).
    /// (The adaptation bounds go in a second word, [`Adaptive::pack`], `busy_poll_sleep_us` and
    /// the kick coalescing in a third, [`NetTuning::pack_extra`].)
    fn pack(&self) -> u64 {
        u64::from(self.interrupt_coalescing.max_usecs & 0xf_ffff)
            | u64::from(self.interrupt_coalescing.max_packets) << 20
            | u64::from(self.event_idx) << 36
            | u64::from(self.busy_poll_us & 0x3fff) << 37
            | u64::from(self.rx_sparse_reads) << 51
            | u64::from(self.tx_budget.wrapping_sub(1) & 0xfff) << 52
    }

    fn unpack(word: u64) -> NetTuning {
        NetTuning {
            interrupt_coalescing: InterruptCoalescing {
                max_usecs: (word & 0xf_ffff) as u32,
                max_packets: (word >> 20) as u16,
            },
            event_idx: word & 1 << 36 != 0,
            busy_poll_us: ((word >> 37) & 0x3fff) as u32,
            busy_poll_sleep_us: 0,
            kick_coalescing: KickCoalescing::default(),
            rx_sparse_reads: word & 1 << 51 != 0,
            tx_budget: ((word >> 52) & 0xfff) as u16 + 1,
            adaptive: Adaptive::default(),
        }
    }

    /// The third word: bits 0..16 busy_poll_sleep_us (≤ 1000), 16..32 the kick coalescing's
    /// max_packets, 32..48 its max_usecs (≤ 10 000).
    fn pack_extra(&self) -> u64 {
        u64::from(self.busy_poll_sleep_us & 0xffff)
            | u64::from(self.kick_coalescing.max_packets) << 16
            | u64::from(self.kick_coalescing.max_usecs & 0xffff) << 32
    }

    /// Puts [`NetTuning::pack_extra`]'s fields back into this tuning.
    fn unpack_extra(&mut self, word: u64) {
        self.busy_poll_sleep_us = (word & 0xffff) as u32;
        self.kick_coalescing = KickCoalescing {
            max_packets: (word >> 16) as u16,
            max_usecs: ((word >> 32) & 0xffff) as u32,
        };
    }
}

/// A partial change of [`NetTuning`] (`PATCH`): absent fields keep their value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetTuningUpdate {
    /// New interrupt coalescing bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt_coalescing: Option<InterruptCoalescing>,
    /// New EVENT_IDX interrupt-suppression setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_idx: Option<bool>,
    /// New tx budget per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_budget: Option<u16>,
    /// New busy-poll window (µs, 0 = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_poll_us: Option<u32>,
    /// New wait between a busy-poll's looks (µs, 0 = spin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_poll_sleep_us: Option<u32>,
    /// New kick coalescing bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kick_coalescing: Option<KickCoalescing>,
    /// New sparse rx reads setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_sparse_reads: Option<bool>,
    /// New device-side adaptation setting and bounds (absent fields take their defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<Adaptive>,
}

impl NetTuningUpdate {
    /// True when the update changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == NetTuningUpdate::default()
    }
}

/// Marks a guest coalescing word as set.
const GUEST_SET: u64 = 1 << 63;

/// Who set a direction's interrupt coalescing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoalescingSource {
    /// The operator (`--net coalesce_*`, the config file, `PATCH .. tuning`).
    Operator,
    /// The guest driver (VIRTIO_NET_F_NOTF_COAL over the control queue, e.g. `ethtool -C`).
    Guest,
}

/// One direction's interrupt coalescing in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectionCoalescing {
    /// Who set it.
    pub source: CoalescingSource,
    /// See [`InterruptCoalescing::max_packets`].
    pub max_packets: u16,
    /// See [`InterruptCoalescing::max_usecs`].
    pub max_usecs: u32,
}

/// The interrupt coalescing in force on a device, per direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoalescingInForce {
    /// Receive (queue 0).
    pub rx: DirectionCoalescing,
    /// Transmit (queue 1).
    pub tx: DirectionCoalescing,
}

/// Changes a device's tuning from any thread; the worker picks the change up between two
/// batches. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TuningControl {
    shared: Arc<TuningShared>,
}

#[derive(Debug)]
pub(crate) struct TuningShared {
    word: AtomicU64,
    /// The adaptation bounds ([`Adaptive::pack`]), stored before `word`.
    adaptive: AtomicU64,
    /// [`NetTuning::busy_poll_sleep_us`] and the kick coalescing
    /// ([`NetTuning::pack_extra`]), stored before `word`.
    extra: AtomicU64,
    /// Bumped by every operator change that names the interrupt coalescing: the worker then
    /// drops what the guest set (the last one set wins).
    operator_coalescing: AtomicU64,
    /// What the guest set with NOTF_COAL, `[rx, tx]` ([`GUEST_SET`] | packed bounds; 0: not
    /// set). Written by the worker only, read by [`TuningControl::coalescing_in_force`].
    guest: [AtomicU64; 2],
    /// The rate limiters (control path only: the worker copies them when `changed` fires).
    limiters: Mutex<Limiters>,
    /// The guest's active queue pairs (VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET; 1 without MQ).
    active_pairs: AtomicU64,
    /// Written after each change, one per worker (queue pair; a reader consumes the count);
    /// each worker polls its own.
    pub(crate) changed: Box<[EventFd]>,
}

/// Both directions' rate limiters and a change count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Limiters {
    pub(crate) rx: RateLimiterConfig,
    pub(crate) tx: RateLimiterConfig,
    /// Bumped by every change, so the worker rebuilds its buckets only then.
    pub(crate) generation: u64,
}

impl TuningControl {
    #[cfg(test)]
    pub(crate) fn new(initial: NetTuning) -> io::Result<TuningControl> {
        Self::with_workers(initial, 1)
    }

    /// A control for a device with `workers` worker threads (one per queue pair; at least 1).
    pub(crate) fn with_workers(initial: NetTuning, workers: usize) -> io::Result<TuningControl> {
        let changed = (0..workers.max(1))
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<io::Result<Box<[EventFd]>>>()?;
        Ok(TuningControl {
            shared: Arc::new(TuningShared {
                word: AtomicU64::new(initial.pack()),
                adaptive: AtomicU64::new(initial.adaptive.pack()),
                extra: AtomicU64::new(initial.pack_extra()),
                operator_coalescing: AtomicU64::new(0),
                guest: [AtomicU64::new(0), AtomicU64::new(0)],
                limiters: Mutex::new(Limiters::default()),
                active_pairs: AtomicU64::new(1),
                changed,
            }),
        })
    }

    /// Validates `tuning` and hands it to the device (and its worker, if one runs).
    pub fn set(&self, tuning: NetTuning) -> Result<(), TuningError> {
        tuning.validate()?;
        self.shared
            .adaptive
            .store(tuning.adaptive.pack(), Ordering::Release);
        self.shared
            .extra
            .store(tuning.pack_extra(), Ordering::Release);
        self.shared.word.store(tuning.pack(), Ordering::Release);
        self.shared.notify_except(usize::MAX);
        Ok(())
    }

    /// Applies a partial change (`PATCH`) and returns the tuning now in force. Naming
    /// `interrupt_coalescing` takes the coalescing back from the guest (NOTF_COAL), even with
    /// the same value: the last one set wins.
    pub fn update(&self, update: &NetTuningUpdate) -> Result<NetTuning, TuningError> {
        let tuning = self.get().updated(update);
        tuning.validate()?;
        if update.interrupt_coalescing.is_some() {
            self.shared
                .operator_coalescing
                .fetch_add(1, Ordering::AcqRel);
        }
        self.set(tuning)?;
        Ok(tuning)
    }

    /// The interrupt coalescing in force per direction, and who set it: the operator's
    /// [`NetTuning::interrupt_coalescing`] (both directions, frames counted together), or what
    /// the guest set with NOTF_COAL for a direction (the other keeps the operator's bounds).
    pub fn coalescing_in_force(&self) -> CoalescingInForce {
        let operator = self.get().interrupt_coalescing;
        let direction = |i: usize| {
            let word = self.shared.guest[i].load(Ordering::Acquire);
            if word & GUEST_SET != 0 {
                DirectionCoalescing {
                    source: CoalescingSource::Guest,
                    max_packets: (word >> 32) as u16,
                    max_usecs: word as u32,
                }
            } else {
                DirectionCoalescing {
                    source: CoalescingSource::Operator,
                    max_packets: operator.max_packets,
                    max_usecs: operator.max_usecs,
                }
            }
        };
        CoalescingInForce {
            rx: direction(0),
            tx: direction(1),
        }
    }

    /// The tuning in force (or about to be picked up).
    pub fn get(&self) -> NetTuning {
        self.shared.load()
    }

    pub(crate) fn shared(&self) -> &Arc<TuningShared> {
        &self.shared
    }

    /// Validates and installs new rate limiters (rx, tx); the worker applies them between
    /// batches, with full buckets.
    pub fn set_rate_limiters(
        &self,
        rx: RateLimiterConfig,
        tx: RateLimiterConfig,
    ) -> Result<(), RateLimiterError> {
        rx.validate()?;
        tx.validate()?;
        {
            let mut l = self.shared.lock_limiters();
            l.rx = rx;
            l.tx = tx;
            l.generation += 1;
        }
        self.shared.notify_except(usize::MAX);
        Ok(())
    }

    /// The rate limiters in force (rx, tx).
    pub fn rate_limiters(&self) -> (RateLimiterConfig, RateLimiterConfig) {
        let l = self.shared.lock_limiters();
        (l.rx, l.tx)
    }
}

impl TuningShared {
    /// Wakes every worker but `pair`'s (`usize::MAX`: all) to pick up a change.
    pub(crate) fn notify_except(&self, pair: usize) {
        for (i, changed) in self.changed.iter().enumerate() {
            if i != pair {
                // The eventfd only fails when its counter would overflow, i.e. the worker
                // already has a wake-up pending that will read the new state.
                let _ = changed.write(1);
            }
        }
    }

    /// The queue pairs the driver enabled (1..=the device's pairs).
    pub(crate) fn active_pairs(&self) -> usize {
        self.active_pairs.load(Ordering::Acquire) as usize
    }

    /// Records the active queue pairs (the caller wakes the workers).
    pub(crate) fn set_active_pairs(&self, pairs: usize) {
        self.active_pairs.store(pairs as u64, Ordering::Release);
    }

    /// The guest's coalescing of direction `dir` (0 rx, 1 tx), if it set one.
    pub(crate) fn guest(&self, dir: usize) -> Option<InterruptCoalescing> {
        let word = self.guest[dir & 1].load(Ordering::Acquire);
        (word & GUEST_SET != 0).then_some(InterruptCoalescing {
            max_packets: (word >> 32) as u16,
            max_usecs: word as u32,
        })
    }

    /// The operator's coalescing change count.
    pub(crate) fn operator_coalescing(&self) -> u64 {
        self.operator_coalescing.load(Ordering::Acquire)
    }

    /// Records what the guest set for direction `dir` (0 rx, 1 tx), or `None`: not set.
    pub(crate) fn set_guest(&self, dir: usize, bounds: Option<InterruptCoalescing>) {
        let word = bounds.map_or(0, |c| {
            GUEST_SET | u64::from(c.max_packets) << 32 | u64::from(c.max_usecs)
        });
        self.guest[dir & 1].store(word, Ordering::Release);
    }

    pub(crate) fn load(&self) -> NetTuning {
        let mut tuning = NetTuning::unpack(self.word.load(Ordering::Acquire));
        tuning.adaptive = Adaptive::unpack(self.adaptive.load(Ordering::Acquire));
        tuning.unpack_extra(self.extra.load(Ordering::Acquire));
        tuning
    }

    pub(crate) fn limiters(&self) -> Limiters {
        *self.lock_limiters()
    }

    fn lock_limiters(&self) -> std::sync::MutexGuard<'_, Limiters> {
        // Plain values: consistent even if a holder panicked.
        self.limiters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        for t in [
            NetTuning::default(),
            NetTuning {
                interrupt_coalescing: InterruptCoalescing {
                    max_packets: u16::MAX,
                    max_usecs: MAX_COALESCE_USECS,
                },
                event_idx: false,
                tx_budget: MAX_TX_BUDGET,
                busy_poll_us: MAX_BUSY_POLL_USECS,
                busy_poll_sleep_us: 0,
                kick_coalescing: KickCoalescing::default(),
                rx_sparse_reads: false,
                adaptive: Adaptive::default(),
            },
            NetTuning {
                interrupt_coalescing: InterruptCoalescing {
                    max_packets: 1,
                    max_usecs: 1,
                },
                event_idx: true,
                tx_budget: 1,
                busy_poll_us: 1,
                busy_poll_sleep_us: 0,
                kick_coalescing: KickCoalescing::default(),
                rx_sparse_reads: true,
                adaptive: Adaptive::default(),
            },
            NetTuning {
                tx_budget: 2048,
                rx_sparse_reads: false,
                adaptive: Adaptive::default(),
                ..NetTuning::default()
            },
        ] {
            assert_eq!(NetTuning::unpack(t.pack()), t);
        }
    }

    #[test]
    fn validation_bounds() {
        let c = |max_packets, max_usecs| InterruptCoalescing {
            max_packets,
            max_usecs,
        };
        assert_eq!(c(0, 0).validate(), Ok(()));
        assert_eq!(c(1, 0).validate(), Ok(()));
        assert_eq!(c(2, 0).validate(), Err(TuningError::PacketsWithoutTime(2)));
        assert_eq!(c(0, 50).validate(), Ok(()));
        assert_eq!(c(64, MAX_COALESCE_USECS).validate(), Ok(()));
        assert_eq!(
            c(64, MAX_COALESCE_USECS + 1).validate(),
            Err(TuningError::MaxUsecs(MAX_COALESCE_USECS + 1))
        );
    }

    #[test]
    fn control_validates_and_signals() {
        let control = TuningControl::new(NetTuning::default()).expect("eventfd");
        let bad = NetTuning {
            interrupt_coalescing: InterruptCoalescing {
                max_packets: 8,
                max_usecs: 0,
            },
            ..NetTuning::default()
        };
        assert!(control.set(bad).is_err());
        for bad in [
            NetTuning {
                busy_poll_us: MAX_BUSY_POLL_USECS + 1,
                ..NetTuning::default()
            },
            NetTuning {
                busy_poll_sleep_us: MAX_BUSY_POLL_SLEEP_USECS + 1,
                ..NetTuning::default()
            },
            NetTuning {
                tx_budget: 0,
                ..NetTuning::default()
            },
            NetTuning {
                tx_budget: MAX_TX_BUDGET + 1,
                ..NetTuning::default()
            },
            NetTuning {
                kick_coalescing: KickCoalescing {
                    max_packets: 64,
                    max_usecs: 0,
                },
                ..NetTuning::default()
            },
            NetTuning {
                kick_coalescing: KickCoalescing {
                    max_packets: 64,
                    max_usecs: MAX_KICK_COALESCE_USECS + 1,
                },
                ..NetTuning::default()
            },
        ] {
            assert!(control.set(bad).is_err(), "{bad:?}");
        }
        assert!(
            control.shared().changed[0].read().is_err(),
            "no wake-up for a refused change"
        );
        let good = NetTuning {
            interrupt_coalescing: InterruptCoalescing {
                max_packets: 8,
                max_usecs: 100,
            },
            event_idx: false,
            tx_budget: 32,
            busy_poll_us: 50,
            busy_poll_sleep_us: MAX_BUSY_POLL_SLEEP_USECS,
            kick_coalescing: KickCoalescing {
                max_packets: u16::MAX,
                max_usecs: MAX_KICK_COALESCE_USECS,
            },
            rx_sparse_reads: false,
            adaptive: Adaptive {
                enabled: true,
                max_busy_poll_us: 10,
                max_coalesce_usecs: 20,
                interval_us: 300,
            },
        };
        control.set(good).expect("valid");
        assert_eq!(control.get(), good);
        assert_eq!(control.shared().changed[0].read().expect("signalled"), 1);
    }

    #[test]
    fn serde_shape() {
        let t: NetTuning =
            serde_json::from_str(r#"{"interrupt_coalescing":{"max_packets":4,"max_usecs":10}}"#)
                .expect("valid");
        assert!(t.event_idx, "event_idx defaults to on");
        assert_eq!(t.interrupt_coalescing.max_packets, 4);
        assert!(serde_json::from_str::<NetTuning>(r#"{"bogus":1}"#).is_err());
        assert!(serde_json::from_str::<NetTuning>(
            r#"{"interrupt_coalescing":{"max_packets":70000,"max_usecs":1}}"#
        )
        .is_err());
        assert_eq!(t.tx_budget, DEFAULT_TX_BUDGET);
        assert_eq!(t.busy_poll_us, 0);
        let u: NetTuningUpdate =
            serde_json::from_str(r#"{"busy_poll_us":20,"tx_budget":64}"#).expect("valid");
        let t2 = NetTuning::default().updated(&u);
        assert_eq!((t2.busy_poll_us, t2.tx_budget), (20, 64));
        assert_eq!(t2.busy_poll_sleep_us, 0, "a busy-poll spins by default");
        let u: NetTuningUpdate =
            serde_json::from_str(r#"{"busy_poll_sleep_us":10}"#).expect("valid");
        let t2 = t2.updated(&u);
        assert_eq!((t2.busy_poll_us, t2.busy_poll_sleep_us), (20, 10));
        assert_eq!(
            t2.validate(),
            Ok(()),
            "the update keeps the fields it does not name"
        );
        assert_eq!(
            NetTuning {
                busy_poll_sleep_us: 1001,
                ..t2
            }
            .validate(),
            Err(TuningError::BusyPollSleep(1001))
        );
        let u: NetTuningUpdate = serde_json::from_str(r#"{"event_idx":false}"#).expect("valid");
        assert!(!NetTuning::default().updated(&u).event_idx);
        assert!(!u.is_empty());
        assert!(t.rx_sparse_reads, "rx_sparse_reads defaults to on");
        let u: NetTuningUpdate =
            serde_json::from_str(r#"{"rx_sparse_reads":false}"#).expect("valid");
        let t3 = NetTuning::default().updated(&u);
        assert!(!t3.rx_sparse_reads);
        assert_eq!(t3.tx_budget, DEFAULT_TX_BUDGET, "the other knobs kept");
        assert!(NetTuningUpdate::default().is_empty());
        let u: NetTuningUpdate =
            serde_json::from_str(r#"{"kick_coalescing":{"max_packets":128,"max_usecs":50}}"#)
                .expect("valid");
        let t4 = t3.updated(&u);
        assert_eq!(
            t4.kick_coalescing,
            KickCoalescing {
                max_packets: 128,
                max_usecs: 50
            }
        );
        assert!(!t4.rx_sparse_reads, "the other knobs kept");
        assert!(
            !NetTuning::default().kick_coalescing.is_enabled(),
            "off by default"
        );
        assert_eq!(
            KickCoalescing {
                max_packets: 1,
                max_usecs: 0
            }
            .validate(),
            Err(TuningError::KickPacketsWithoutTime(1))
        );
    }
}
