//! Interrupt moderation: from the rings' per-call decisions to the interrupts the device sends.
//!
//! The datapath decides per call whether the driver wants an interrupt
//! ([`InterruptDecision`](crate::virtio::vring::InterruptDecision): EVENT_IDX's `used_event` or
//! the NO_INTERRUPT flag). The [`Moderator`] turns those decisions into actions at the end of
//! each worker round: signal now, or hold the interrupt (coalescing) until `max_packets` frames
//! completed or `max_usecs` passed, and it applies the EVENT_IDX override. It owns no file
//! descriptor and reads no clock: the worker executes what it returns ([`Moderation`]) on the
//! irqfd and the coalescing timerfd, and tells it when the timer fired. Its tests are therefore
//! exact and sleep-free.

use std::time::Duration;

use super::tuning::NetTuning;

/// What the worker must do with the coalescing timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimerOp {
    /// Leave it as it is.
    Keep,
    /// (Re)arm it to fire once after this long.
    Arm(Duration),
    /// Disarm it.
    Clear,
}

/// The actions for the worker after a moderator event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Moderation {
    /// Signal the interrupt (irqfd) now.
    pub(crate) signal: bool,
    /// What to do with the coalescing timer.
    pub(crate) timer: TimerOp,
}

impl Moderation {
    const NOTHING: Moderation = Moderation {
        signal: false,
        timer: TimerOp::Keep,
    };
    const RELEASE: Moderation = Moderation {
        signal: true,
        timer: TimerOp::Clear,
    };
}

/// What the moderator did, counted for the device metrics (published by the worker).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ModerationCounters {
    /// Rounds whose wanted interrupt was held back by coalescing.
    pub(crate) interrupts_held: u64,
    /// Held interrupts released because `max_packets` frames completed.
    pub(crate) coalesce_packet_releases: u64,
    /// Held interrupts released by the `max_usecs` timer.
    pub(crate) coalesce_timer_releases: u64,
    /// Batches interrupted although EVENT_IDX suppressed them (override tuned on).
    pub(crate) event_idx_overrides: u64,
}

/// The interrupt moderation state of one device (see the module docs).
#[derive(Debug)]
pub(crate) struct Moderator {
    tuning: NetTuning,
    /// The driver wants an interrupt for what completed this round.
    pending: bool,
    /// An interrupt held back by coalescing: frames completed since it was first held.
    held: Option<u64>,
    pub(crate) counters: ModerationCounters,
}

impl Moderator {
    /// A moderator with `tuning` in force and nothing pending.
    pub(crate) fn new(tuning: NetTuning) -> Moderator {
        Moderator {
            tuning,
            pending: false,
            held: None,
            counters: ModerationCounters::default(),
        }
    }

    /// Records one datapath call's decision: the driver wants an interrupt, or EVENT_IDX
    /// suppressed one (which the EVENT_IDX override turns into an interrupt).
    pub(crate) fn batch(&mut self, needs_interrupt: bool, suppressed_by_event_idx: bool) {
        if needs_interrupt {
            self.pending = true;
        } else if suppressed_by_event_idx && !self.tuning.event_idx {
            self.pending = true;
            self.counters.event_idx_overrides += 1;
        }
    }

    /// End of a worker round in which `completed` frames were moved: one interrupt for
    /// everything wanted (now, or held until its packet or time bound).
    pub(crate) fn end_round(&mut self, completed: u64) -> Moderation {
        let coalescing = self.tuning.interrupt_coalescing;
        let wanted = std::mem::take(&mut self.pending);
        let mut out = Moderation::NOTHING;
        if wanted && self.held.is_none() {
            if coalescing.is_enabled() {
                out.timer = TimerOp::Arm(Duration::from_micros(coalescing.max_usecs.into()));
                self.held = Some(0);
            } else {
                out.signal = true;
            }
        }
        if let Some(held) = self.held.as_mut() {
            *held += completed;
            if coalescing.max_packets > 0 && *held >= u64::from(coalescing.max_packets) {
                self.counters.coalesce_packet_releases += 1;
                self.held = None;
                return Moderation::RELEASE;
            }
            if wanted {
                self.counters.interrupts_held += 1;
            }
        }
        out
    }

    /// The coalescing timer fired: a held interrupt goes out now.
    pub(crate) fn timer_fired(&mut self) -> Moderation {
        if self.held.take().is_some() {
            self.counters.coalesce_timer_releases += 1;
            return Moderation::RELEASE;
        }
        Moderation::NOTHING
    }

    /// New knobs; an interrupt held under bounds that no longer apply goes out now.
    pub(crate) fn retune(&mut self, tuning: NetTuning) -> Moderation {
        self.tuning = tuning;
        if self.held.is_some() && !tuning.interrupt_coalescing.is_enabled() {
            self.held = None;
            return Moderation::RELEASE;
        }
        Moderation::NOTHING
    }

    /// True while an interrupt is held back.
    #[cfg(test)]
    pub(crate) fn is_holding(&self) -> bool {
        self.held.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::net::InterruptCoalescing;

    fn tuning(max_packets: u16, max_usecs: u32, event_idx: bool) -> NetTuning {
        NetTuning {
            interrupt_coalescing: InterruptCoalescing {
                max_packets,
                max_usecs,
            },
            event_idx,
            ..NetTuning::default()
        }
    }

    const SIGNAL: Moderation = Moderation::RELEASE;

    #[test]
    fn without_coalescing_every_wanted_round_signals_once() {
        let mut m = Moderator::new(NetTuning::default());
        m.batch(true, false);
        m.batch(true, false); // rx and tx both want one: still one interrupt
        assert_eq!(
            m.end_round(2),
            Moderation {
                signal: true,
                timer: TimerOp::Keep
            }
        );
        assert_eq!(m.end_round(5), Moderation::NOTHING, "nothing wanted");
        m.batch(false, true); // suppressed by EVENT_IDX, honoured
        assert_eq!(m.end_round(1), Moderation::NOTHING);
        assert_eq!(m.counters, ModerationCounters::default());
    }

    #[test]
    fn the_event_idx_override_turns_suppressions_into_interrupts() {
        let mut m = Moderator::new(tuning(0, 0, false));
        m.batch(false, true);
        assert!(m.end_round(1).signal);
        m.batch(false, false); // NO_INTERRUPT flag: not EVENT_IDX, still honoured
        assert!(!m.end_round(1).signal);
        assert_eq!(m.counters.event_idx_overrides, 1);
    }

    #[test]
    fn coalescing_holds_until_max_packets() {
        let mut m = Moderator::new(tuning(4, 1000, true));
        m.batch(true, false);
        assert_eq!(
            m.end_round(1),
            Moderation {
                signal: false,
                timer: TimerOp::Arm(Duration::from_micros(1000))
            }
        );
        assert!(m.is_holding());
        m.batch(true, false);
        assert_eq!(m.end_round(2), Moderation::NOTHING, "3 of 4 frames");
        assert_eq!(m.end_round(0), Moderation::NOTHING, "idle round");
        m.batch(true, false);
        assert_eq!(m.end_round(1), SIGNAL, "4th frame releases, timer cleared");
        assert!(!m.is_holding());
        assert_eq!(m.counters.interrupts_held, 2);
        assert_eq!(m.counters.coalesce_packet_releases, 1);
        assert_eq!(
            m.timer_fired(),
            Moderation::NOTHING,
            "a late timer is harmless"
        );
    }

    #[test]
    fn coalescing_releases_on_the_timer() {
        let mut m = Moderator::new(tuning(64, 50, true));
        m.batch(true, false);
        assert_eq!(
            m.end_round(1).timer,
            TimerOp::Arm(Duration::from_micros(50))
        );
        assert_eq!(m.timer_fired(), SIGNAL);
        assert_eq!(m.counters.coalesce_timer_releases, 1);
        // The next wanted round starts a new hold.
        m.batch(true, false);
        assert!(matches!(m.end_round(1).timer, TimerOp::Arm(_)));
    }

    #[test]
    fn a_large_round_releases_at_once() {
        let mut m = Moderator::new(tuning(8, 1000, true));
        m.batch(true, false);
        assert_eq!(m.end_round(32), SIGNAL);
        assert_eq!(m.counters.interrupts_held, 0);
    }

    #[test]
    fn switching_coalescing_off_releases_what_is_held() {
        let mut m = Moderator::new(tuning(64, 1000, true));
        m.batch(true, false);
        m.end_round(1);
        assert_eq!(m.retune(tuning(64, 2000, true)), Moderation::NOTHING);
        assert!(m.is_holding(), "still coalescing: keep holding");
        assert_eq!(m.retune(NetTuning::default()), SIGNAL);
        m.batch(true, false);
        assert!(m.end_round(1).signal, "no more holding");
    }
}
