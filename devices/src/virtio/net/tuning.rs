//! Device-side knobs that can change while the guest runs (the VMM's API sets them):
//! interrupt coalescing and whether the driver's `used_event` (EVENT_IDX) may suppress
//! interrupts.
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
}

fn default_event_idx() -> bool {
    true
}

impl Default for NetTuning {
    fn default() -> Self {
        NetTuning {
            interrupt_coalescing: InterruptCoalescing::OFF,
            event_idx: true,
        }
    }
}

impl NetTuning {
    /// Checks every knob.
    pub fn validate(&self) -> Result<(), TuningError> {
        self.interrupt_coalescing.validate()
    }

    /// This tuning with the fields `update` sets replaced.
    pub fn updated(&self, update: &NetTuningUpdate) -> NetTuning {
        NetTuning {
            interrupt_coalescing: update
                .interrupt_coalescing
                .unwrap_or(self.interrupt_coalescing),
            event_idx: update.event_idx.unwrap_or(self.event_idx),
        }
    }

    /// Packs into one word: bits 0..32 max_usecs, 32..48 max_packets, bit 48 event_idx.
    fn pack(&self) -> u64 {
        u64::from(self.interrupt_coalescing.max_usecs)
            | u64::from(self.interrupt_coalescing.max_packets) << 32
            | u64::from(self.event_idx) << 48
    }

    fn unpack(word: u64) -> NetTuning {
        NetTuning {
            interrupt_coalescing: InterruptCoalescing {
                max_usecs: word as u32,
                max_packets: (word >> 32) as u16,
            },
            event_idx: word & 1 << 48 != 0,
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
}

impl NetTuningUpdate {
    /// True when the update changes nothing.
    pub fn is_empty(&self) -> bool {
        self.interrupt_coalescing.is_none() && self.event_idx.is_none()
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
            event_idx: true,
        };
        assert!(control.set(bad).is_err());
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
        let u: NetTuningUpdate = serde_json::from_str(r#"{"event_idx":false}"#).expect("valid");
        assert!(!NetTuning::default().updated(&u).event_idx);
        assert!(!u.is_empty());
        assert!(NetTuningUpdate::default().is_empty());
    }
}
