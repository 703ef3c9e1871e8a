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

use std::time::{Duration, Instant};

use super::tuning::{InterruptCoalescing, NetTuning};

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

/// Index of the receive direction in the moderator's per-direction arrays.
pub(crate) const RX: usize = 0;
/// Index of the transmit direction.
pub(crate) const TX: usize = 1;

/// How the coalescing bounds apply to the device's one interrupt line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Coalescing {
    /// The operator's knob (REST `tuning`, `--net coalesce_*`): one hold, released when
    /// `max_packets` frames of either direction (rx + tx counted together) completed or
    /// `max_usecs` passed.
    Shared(InterruptCoalescing),
    /// The guest set per-direction bounds (NOTF_COAL), `[rx, tx]`: each direction holds its
    /// own wanted interrupt, counting its own frames under its own bounds; the shared line is
    /// released as soon as either direction's hold reaches its bound (packets or time), or a
    /// direction without coalescing wants an interrupt. Releasing the line serves both
    /// directions (the driver looks at every queue on the one interrupt), so both holds end.
    Split([InterruptCoalescing; 2]),
}

/// The interrupt moderation state of one device (see the module docs).
#[derive(Debug)]
pub(crate) struct Moderator {
    event_idx: bool,
    coalescing: Coalescing,
    /// The driver wants an interrupt for what completed this round, per direction.
    pending: [bool; 2],
    /// Interrupts held back by coalescing, per hold (one in `Shared`, `[rx, tx]` in `Split`):
    /// frames completed since each was first held.
    held: [Option<u64>; 2],
    /// In `Split`: when the armed timer fires (the earliest hold's deadline).
    deadline: Option<Instant>,
    /// The directions that wanted an interrupt since the last one went out (`[rx, tx]`):
    /// the queues whose MSI-X vectors it goes to ([`Moderator::take_wanted`]).
    unsignalled: [bool; 2],
    pub(crate) counters: ModerationCounters,
}

impl Moderator {
    /// A moderator with `tuning` in force (the operator's coalescing) and nothing pending.
    pub(crate) fn new(tuning: NetTuning) -> Moderator {
        Moderator {
            event_idx: tuning.event_idx,
            coalescing: Coalescing::Shared(tuning.interrupt_coalescing),
            pending: [false; 2],
            held: [None; 2],
            deadline: None,
            unsignalled: [false; 2],
            counters: ModerationCounters::default(),
        }
    }

    /// Records one datapath call's decision for direction `dir` ([`RX`] or [`TX`]): the driver
    /// wants an interrupt, or EVENT_IDX suppressed one (which the EVENT_IDX override turns into
    /// an interrupt).
    pub(crate) fn batch(
        &mut self,
        dir: usize,
        needs_interrupt: bool,
        suppressed_by_event_idx: bool,
    ) {
        if needs_interrupt {
            self.pending[dir & 1] = true;
            self.unsignalled[dir & 1] = true;
        } else if suppressed_by_event_idx && !self.event_idx {
            self.pending[dir & 1] = true;
            self.unsignalled[dir & 1] = true;
            self.counters.event_idx_overrides += 1;
        }
    }

    /// The interrupt goes out: which directions (`[rx, tx]`) wanted it since the last one.
    /// With per-queue vectors (MSI-X) only those queues' vectors fire; the one line of
    /// virtio-mmio fires once whatever this says.
    pub(crate) fn take_wanted(&mut self) -> [bool; 2] {
        std::mem::take(&mut self.unsignalled)
    }

    fn release_all(&mut self) {
        self.held = [None; 2];
        self.deadline = None;
    }

    /// End of a worker round in which `completed` frames (`[rx, tx]`) were moved: one
    /// interrupt for everything wanted (now, or held until a packet or time bound). `now` is
    /// only called when a per-direction hold starts (not per frame, not in `Shared`).
    pub(crate) fn end_round(
        &mut self,
        completed: [u64; 2],
        now: impl FnOnce() -> Instant,
    ) -> Moderation {
        let wanted = std::mem::take(&mut self.pending);
        let (lanes, wanted, completed, bounds) = match self.coalescing {
            Coalescing::Shared(c) => (
                1,
                [wanted[RX] || wanted[TX], false],
                [completed[RX] + completed[TX], 0],
                [c, c],
            ),
            Coalescing::Split(b) => (2, wanted, completed, b),
        };
        let was_holding = self.held.iter().any(Option::is_some);
        let mut signal_now = false;
        let mut new_hold: Option<u32> = None;
        for lane in 0..lanes {
            if wanted[lane] && self.held[lane].is_none() {
                if bounds[lane].is_enabled() {
                    self.held[lane] = Some(0);
                    let usecs = bounds[lane].max_usecs;
                    new_hold = Some(new_hold.map_or(usecs, |u| u.min(usecs)));
                } else {
                    signal_now = true;
                }
            }
        }
        if signal_now {
            // A direction that does not coalesce wants its interrupt: it serves everyone.
            self.release_all();
            return Moderation {
                signal: true,
                timer: if was_holding || new_hold.is_some() {
                    TimerOp::Clear
                } else {
                    TimerOp::Keep
                },
            };
        }
        let mut out = Moderation::NOTHING;
        if let Some(usecs) = new_hold {
            let after = Duration::from_micros(usecs.into());
            if lanes == 1 {
                out.timer = TimerOp::Arm(after);
            } else {
                let t = now();
                let deadline = t + after;
                if self.deadline.is_none_or(|d| deadline < d) {
                    self.deadline = Some(deadline);
                    out.timer = TimerOp::Arm(after);
                }
            }
        }
        let mut holding_wanted = false;
        for lane in 0..lanes {
            if let Some(held) = self.held[lane].as_mut() {
                *held += completed[lane];
                let max = bounds[lane].max_packets;
                if max > 0 && *held >= u64::from(max) {
                    self.counters.coalesce_packet_releases += 1;
                    self.release_all();
                    return Moderation::RELEASE;
                }
                holding_wanted |= wanted[lane];
            }
        }
        if holding_wanted {
            self.counters.interrupts_held += 1;
        }
        out
    }

    /// The coalescing timer fired: a held interrupt goes out now.
    pub(crate) fn timer_fired(&mut self) -> Moderation {
        if self.held.iter().any(Option::is_some) {
            self.release_all();
            self.counters.coalesce_timer_releases += 1;
            return Moderation::RELEASE;
        }
        Moderation::NOTHING
    }

    /// New knobs; an interrupt held under bounds that no longer apply (coalescing off for its
    /// hold, or holds counted differently) goes out now.
    pub(crate) fn retune(&mut self, event_idx: bool, coalescing: Coalescing) -> Moderation {
        self.event_idx = event_idx;
        let old = std::mem::replace(&mut self.coalescing, coalescing);
        let holding = self.held.iter().any(Option::is_some);
        let still_applies = match (old, coalescing) {
            (Coalescing::Shared(_), Coalescing::Shared(c)) => c.is_enabled(),
            (Coalescing::Split(_), Coalescing::Split(b)) => self
                .held
                .iter()
                .zip(b)
                .all(|(h, c)| h.is_none() || c.is_enabled()),
            _ => false,
        };
        if holding && !still_applies {
            self.release_all();
            return Moderation::RELEASE;
        }
        Moderation::NOTHING
    }

    /// The coalescing in force.
    #[cfg(test)]
    pub(crate) fn coalescing(&self) -> Coalescing {
        self.coalescing
    }

    /// True while an interrupt is held back.
    #[cfg(test)]
    pub(crate) fn is_holding(&self) -> bool {
        self.held.iter().any(Option::is_some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_interrupt_goes_to_the_directions_that_wanted_it() {
        let mut m = Moderator::new(tuning(4, 1000, true));
        m.batch(RX, true, false);
        assert!(!m.end_round([1, 0], Instant::now).signal, "held");
        m.batch(RX, false, true); // suppressed with EVENT_IDX honoured: not wanted
        assert!(!m.end_round([1, 0], Instant::now).signal);
        m.batch(RX, true, false);
        assert_eq!(m.end_round([2, 0], Instant::now), SIGNAL);
        assert_eq!(m.take_wanted(), [true, false], "rx only");
        assert_eq!(m.take_wanted(), [false, false], "taken");
        m.batch(TX, true, false);
        m.batch(RX, true, false);
        assert_eq!(m.end_round([0, 4], Instant::now), SIGNAL);
        assert_eq!(m.take_wanted(), [true, true]);
        // The EVENT_IDX override makes a suppressed direction wanted.
        let mut m = Moderator::new(tuning(0, 0, false));
        m.batch(TX, false, true);
        assert!(m.end_round([0, 1], Instant::now).signal);
        assert_eq!(m.take_wanted(), [false, true]);
    }

    #[test]
    fn without_coalescing_every_wanted_round_signals_once() {
        let mut m = Moderator::new(NetTuning::default());
        m.batch(TX, true, false);
        m.batch(TX, true, false); // rx and tx both want one: still one interrupt
        assert_eq!(
            m.end_round([0, 2], Instant::now),
            Moderation {
                signal: true,
                timer: TimerOp::Keep
            }
        );
        assert_eq!(
            m.end_round([0, 5], Instant::now),
            Moderation::NOTHING,
            "nothing wanted"
        );
        m.batch(TX, false, true); // suppressed by EVENT_IDX, honoured
        assert_eq!(m.end_round([0, 1], Instant::now), Moderation::NOTHING);
        assert_eq!(m.counters, ModerationCounters::default());
    }

    #[test]
    fn the_event_idx_override_turns_suppressions_into_interrupts() {
        let mut m = Moderator::new(tuning(0, 0, false));
        m.batch(TX, false, true);
        assert!(m.end_round([0, 1], Instant::now).signal);
        m.batch(TX, false, false); // NO_INTERRUPT flag: not EVENT_IDX, still honoured
        assert!(!m.end_round([0, 1], Instant::now).signal);
        assert_eq!(m.counters.event_idx_overrides, 1);
    }

    #[test]
    fn coalescing_holds_until_max_packets() {
        let mut m = Moderator::new(tuning(4, 1000, true));
        m.batch(TX, true, false);
        assert_eq!(
            m.end_round([0, 1], Instant::now),
            Moderation {
                signal: false,
                timer: TimerOp::Arm(Duration::from_micros(1000))
            }
        );
        assert!(m.is_holding());
        m.batch(TX, true, false);
        assert_eq!(
            m.end_round([0, 2], Instant::now),
            Moderation::NOTHING,
            "3 of 4 frames"
        );
        assert_eq!(
            m.end_round([0, 0], Instant::now),
            Moderation::NOTHING,
            "idle round"
        );
        m.batch(TX, true, false);
        assert_eq!(
            m.end_round([0, 1], Instant::now),
            SIGNAL,
            "4th frame releases, timer cleared"
        );
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
        m.batch(TX, true, false);
        assert_eq!(
            m.end_round([0, 1], Instant::now).timer,
            TimerOp::Arm(Duration::from_micros(50))
        );
        assert_eq!(m.timer_fired(), SIGNAL);
        assert_eq!(m.counters.coalesce_timer_releases, 1);
        // The next wanted round starts a new hold.
        m.batch(TX, true, false);
        assert!(matches!(
            m.end_round([0, 1], Instant::now).timer,
            TimerOp::Arm(_)
        ));
    }

    #[test]
    fn a_large_round_releases_at_once() {
        let mut m = Moderator::new(tuning(8, 1000, true));
        m.batch(TX, true, false);
        assert_eq!(m.end_round([0, 32], Instant::now), SIGNAL);
        assert_eq!(m.counters.interrupts_held, 0);
    }

    #[test]
    fn switching_coalescing_off_releases_what_is_held() {
        let mut m = Moderator::new(tuning(64, 1000, true));
        m.batch(TX, true, false);
        m.end_round([0, 1], Instant::now);
        assert_eq!(
            m.retune(
                true,
                Coalescing::Shared(tuning(64, 2000, true).interrupt_coalescing)
            ),
            Moderation::NOTHING
        );
        assert!(m.is_holding(), "still coalescing: keep holding");
        assert_eq!(
            m.retune(true, Coalescing::Shared(InterruptCoalescing::OFF)),
            SIGNAL
        );
        m.batch(TX, true, false);
        assert!(m.end_round([0, 1], Instant::now).signal, "no more holding");
    }
}

#[cfg(test)]
mod split_tests {
    //! The guest's per-direction bounds (NOTF_COAL) on the one interrupt line.
    use super::*;

    const SIGNAL: Moderation = Moderation::RELEASE;

    fn c(max_packets: u16, max_usecs: u32) -> InterruptCoalescing {
        InterruptCoalescing {
            max_packets,
            max_usecs,
        }
    }

    fn split(rx: InterruptCoalescing, tx: InterruptCoalescing) -> Moderator {
        let mut m = Moderator::new(NetTuning::default());
        assert_eq!(
            m.retune(true, Coalescing::Split([rx, tx])),
            Moderation::NOTHING
        );
        m
    }

    #[test]
    fn each_direction_counts_its_own_frames_against_its_own_bound() {
        let t0 = Instant::now();
        let mut m = split(c(4, 1000), c(2, 1000));
        m.batch(RX, true, false);
        assert_eq!(
            m.end_round([3, 5], || t0),
            Moderation {
                signal: false,
                timer: TimerOp::Arm(Duration::from_micros(1000))
            },
            "rx held at 3 of 4; tx frames the driver did not ask about do not count"
        );
        m.batch(TX, true, false);
        assert_eq!(m.end_round([0, 1], || t0), Moderation::NOTHING, "tx 1 of 2");
        m.batch(TX, true, false);
        assert_eq!(
            m.end_round([0, 1], || t0),
            SIGNAL,
            "tx reached its bound first"
        );
        assert!(!m.is_holding(), "the interrupt served rx too");
        assert_eq!(m.counters.coalesce_packet_releases, 1);
    }

    #[test]
    fn a_direction_without_coalescing_releases_the_line_at_once() {
        let t0 = Instant::now();
        let mut m = split(c(64, 1000), InterruptCoalescing::OFF);
        m.batch(RX, true, false);
        assert!(!m.end_round([1, 0], || t0).signal, "rx held");
        m.batch(TX, true, false);
        assert_eq!(
            m.end_round([0, 1], || t0),
            Moderation {
                signal: true,
                timer: TimerOp::Clear
            }
        );
        assert!(!m.is_holding());
    }

    #[test]
    fn the_timer_follows_the_earliest_deadline() {
        let t0 = Instant::now();
        let mut m = split(c(64, 50), c(64, 1000));
        m.batch(TX, true, false);
        assert_eq!(
            m.end_round([0, 1], || t0).timer,
            TimerOp::Arm(Duration::from_micros(1000))
        );
        // rx starts holding 100 µs later with 50 µs: its deadline (150) is earlier.
        m.batch(RX, true, false);
        assert_eq!(
            m.end_round([1, 0], || t0 + Duration::from_micros(100))
                .timer,
            TimerOp::Arm(Duration::from_micros(50))
        );
        // A later tx hold could not be earlier: the timer is left alone.
        assert_eq!(m.timer_fired(), SIGNAL);
        m.batch(RX, true, false);
        m.end_round([1, 0], || t0 + Duration::from_micros(200));
        m.batch(TX, true, false);
        assert_eq!(
            m.end_round([0, 1], || t0 + Duration::from_micros(210))
                .timer,
            TimerOp::Keep,
            "tx's deadline (1210) is after rx's (250)"
        );
        assert_eq!(m.counters.coalesce_timer_releases, 1);
    }

    #[test]
    fn switching_between_shared_and_split_releases_what_is_held() {
        let t0 = Instant::now();
        let mut m = Moderator::new(NetTuning {
            interrupt_coalescing: c(64, 1000),
            ..NetTuning::default()
        });
        m.batch(RX, true, false);
        m.end_round([1, 0], || t0);
        assert!(m.is_holding());
        assert_eq!(
            m.retune(true, Coalescing::Split([c(64, 1000), c(64, 1000)])),
            SIGNAL,
            "the hold counted frames differently"
        );
        m.batch(TX, true, false);
        m.end_round([0, 1], || t0);
        assert_eq!(
            m.retune(true, Coalescing::Split([c(64, 1000), c(8, 10)])),
            Moderation::NOTHING,
            "tx still coalesces: keep holding"
        );
        assert_eq!(m.coalescing(), Coalescing::Split([c(64, 1000), c(8, 10)]));
        assert_eq!(
            m.retune(
                true,
                Coalescing::Split([c(64, 1000), InterruptCoalescing::OFF])
            ),
            SIGNAL
        );
    }
}
