//! Device-side knobs that can change while the guest runs (the VMM's API sets them):
//! interrupt coalescing, whether the driver's `used_event` (EVENT_IDX) may suppress
//! interrupts, the tx budget per call and the device busy-poll.
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
    /// `tx_budget` of 0 or above [`MAX_TX_BUDGET`].
    #[error("tx_budget {0} is out of range (1..={MAX_TX_BUDGET})")]
    TxBudget(u16),
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
}

fn default_event_idx() -> bool {
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
        if self.tx_budget == 0 || self.tx_budget > MAX_TX_BUDGET {
            return Err(TuningError::TxBudget(self.tx_budget));
        }
        Ok(())
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
        }
    }

    /// Packs a validated tuning into one word: bits 0..20 max_usecs (≤ 1 000 000), 20..36
    /// max_packets, bit 36 event_idx, 37..51 busy_poll_us (≤ 10 000), 51..64 tx_budget
    /// (≤ 4096).
    fn pack(&self) -> u64 {
        u64::from(self.interrupt_coalescing.max_usecs & 0xf_ffff)
            | u64::from(self.interrupt_coalescing.max_packets) << 20
            | u64::from(self.event_idx) << 36
            | u64::from(self.busy_poll_us & 0x3fff) << 37
            | u64::from(self.tx_budget & 0x1fff) << 51
    }

    fn unpack(word: u64) -> NetTuning {
        NetTuning {
            interrupt_coalescing: InterruptCoalescing {
                max_usecs: (word & 0xf_ffff) as u32,
                max_packets: (word >> 20) as u16,
            },
            event_idx: word & 1 << 36 != 0,
            busy_poll_us: ((word >> 37) & 0x3fff) as u32,
            tx_budget: ((word >> 51) & 0x1fff) as u16,
        }
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
}

impl NetTuningUpdate {
    /// True when the update changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == NetTuningUpdate::default()
    }
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
    /// The rate limiters (control path only: the worker copies them when `changed` fires).
    limiters: Mutex<Limiters>,
    /// Written after each change; the worker polls it.
    pub(crate) changed: EventFd,
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
    pub(crate) fn new(initial: NetTuning) -> io::Result<TuningControl> {
        Ok(TuningControl {
            shared: Arc::new(TuningShared {
                word: AtomicU64::new(initial.pack()),
                limiters: Mutex::new(Limiters::default()),
                changed: EventFd::new(EFD_NONBLOCK)?,
            }),
        })
    }

    /// Validates `tuning` and hands it to the device (and its worker, if one runs).
    pub fn set(&self, tuning: NetTuning) -> Result<(), TuningError> {
        tuning.validate()?;
        self.shared.word.store(tuning.pack(), Ordering::Release);
        // The eventfd only fails when its counter would overflow, i.e. the worker already has
        // a wake-up pending that will read the new word.
        let _ = self.shared.changed.write(1);
        Ok(())
    }

    /// The tuning in force (or about to be picked up).
    pub fn get(&self) -> NetTuning {
        NetTuning::unpack(self.shared.word.load(Ordering::Acquire))
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
        let _ = self.shared.changed.write(1);
        Ok(())
    }

    /// The rate limiters in force (rx, tx).
    pub fn rate_limiters(&self) -> (RateLimiterConfig, RateLimiterConfig) {
        let l = self.shared.lock_limiters();
        (l.rx, l.tx)
    }
}

impl TuningShared {
    pub(crate) fn load(&self) -> NetTuning {
        NetTuning::unpack(self.word.load(Ordering::Acquire))
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
            },
            NetTuning {
                interrupt_coalescing: InterruptCoalescing {
                    max_packets: 1,
                    max_usecs: 1,
                },
                event_idx: true,
                tx_budget: 1,
                busy_poll_us: 1,
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
                tx_budget: 0,
                ..NetTuning::default()
            },
            NetTuning {
                tx_budget: MAX_TX_BUDGET + 1,
                ..NetTuning::default()
            },
        ] {
            assert!(control.set(bad).is_err(), "{bad:?}");
        }
        assert!(
            control.shared().changed.read().is_err(),
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
        };
        control.set(good).expect("valid");
        assert_eq!(control.get(), good);
        assert_eq!(control.shared().changed.read().expect("signalled"), 1);
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
        let u: NetTuningUpdate = serde_json::from_str(r#"{"event_idx":false}"#).expect("valid");
        assert!(!NetTuning::default().updated(&u).event_idx);
        assert!(!u.is_empty());
        assert!(NetTuningUpdate::default().is_empty());
    }
}
