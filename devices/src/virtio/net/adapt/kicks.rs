//! The adapter's kick coalescing (see the parent module's docs): a device that does not poll
//! may still spare a driver that floods it most of its kicks, by letting it queue up to
//! [`KICK_AHEAD`] buffers past a drained ring without one and looking at the ring by itself
//! after at most [`KICK_LOOK_US`] µs. Whether that pays is what a trial says, as for a window.
//! A kept one then tries the shorter look, [`SHORT_LOOK_US`]: a driver that waits for what the
//! device sends back (a request/response flood) queues its next frames sooner than the long look
//! comes, and the short one serves it as a sleeping poll would, where a driver that only sends
//! gains nothing from more looks.
//!
//! A load that comes and goes (floods of a few milliseconds between trickles) is remembered: a
//! trial the load's fall cuts short pauses and goes on with the next flood, a kept one's verdict
//! (the rate without, the look found best) turns kick coalescing on as soon as the same load
//! floods again, judged again each time, and the flood's end (two intervals under half the kept
//! rate) turns it off, for the trickle's kicks to be served as they come.

use super::{rose_by, within_2x, Observed, Park, RateTrial, TRIAL_JUDGED};
use super::{RATE_TRIAL_GAIN_DIV, WINDOW_TRIAL_PER_S};
use crate::virtio::net::tuning::KickCoalescing;

/// Buffers the driver may queue past a drained ring without a kick while the adapter coalesces
/// kicks: three quarters of a default 256-entry queue (a smaller queue clamps it to its size
/// less one). A driver with fewer frames than that in flight never reaches the event, and the
/// device's looks serve its flood as a sleeping poll would: on this project's host a polling
/// guest's request/response flood of 64 frames in flight ran 1.6 × faster at 192 buffers and
/// the shorter look than at 32 (its kicks, ~40 µs of the vCPU's each, were the bound), and a
/// forwarding guest with 256 in flight 0.96 × its rate at 99 buffers.
pub const KICK_AHEAD: u16 = 192;
/// Longest the device leaves frames queued without a kick before it looks (µs; at most the
/// operator's `max_coalesce_usecs`, the hold the operator allows the device on anything).
pub const KICK_LOOK_US: u32 = 50;
/// The shorter look a kept kick coalescing tries (µs; at most the operator's bound too).
/// Fixed points on this project's host: a polling guest's request/response flood of 64 frames
/// in flight ran 1.6 × faster with it than with the long look; a transmit flood into a sink
/// 0.75–0.87 × (more looks, each finding less).
pub const SHORT_LOOK_US: u32 = 20;
/// Times a trial may pause (the load falling under half its rate without kick coalescing:
/// the flood ended) and go on with the flood's return; the next fall fails it, for kick
/// coalescing that halves the rate looks the same.
pub const MAX_PAUSES: u32 = 3;
/// Intervals in a row under half the rate kick coalescing was kept at that end it: the flood
/// is over (one such interval is a dip: a flood forwarding through the device has them).
pub const FALL_INTERVALS: u32 = 2;
/// A first trial keeps kick coalescing if the frame rate rose by the rate before it over
/// this: by a quarter. A verdict judged again on its flood's return keeps it at an eighth
/// ([`RATE_TRIAL_GAIN_DIV`]).
pub const FIRST_TRIAL_GAIN_DIV: u64 = 4;
/// A flood whose driver kicks at least once per this many frames has kicks worth sparing.
pub const FRAMES_PER_KICK_WORTH_A_TRIAL: u64 = 256;

/// What a kept trial found, remembered for the next flood of the same load: a load that comes
/// and goes (floods of a few milliseconds between trickles) gets kick coalescing back as soon as
/// it floods again, instead of four steady intervals and a trial each time.
#[derive(Clone, Copy, Debug)]
struct Verdict {
    /// The frame rate without kick coalescing (the trial's rate before it).
    before: u64,
    /// The frame rate the trial kept it at, with the long look.
    kept: u64,
    /// The look found best, or `None` while the shorter one has not been judged.
    look_us: Option<u32>,
}

/// A trial of kick coalescing.
#[derive(Clone, Copy, Debug)]
struct KickTrial {
    /// Its frame rates against the rate before it.
    rates: RateTrial,
    /// The verdict's, judged again on the flood's return (not a first trial).
    returned: bool,
    /// The look it runs at.
    look_us: u32,
    /// It resumed with the flood's return: the next interval sees the change happen, and is
    /// not judged.
    skip: bool,
    /// The times the load's fall has paused it.
    pauses: u32,
}

impl KickTrial {
    fn new(before: u64, returned: bool, look_us: u32) -> KickTrial {
        KickTrial {
            rates: RateTrial::new(before),
            returned,
            look_us,
            skip: false,
            pauses: 0,
        }
    }
}

/// The kick coalescing rule's state.
#[derive(Clone, Copy, Debug)]
pub(super) struct KickRule {
    /// Kick coalescing on (on trial or kept).
    on: bool,
    /// The look in force: [`KICK_LOOK_US`], or [`SHORT_LOOK_US`] on trial or kept.
    look_us: u32,
    /// The shorter look on trial: its frame rates against the long look's.
    look_trial: Option<RateTrial>,
    /// A trial running.
    trial: Option<KickTrial>,
    /// A trial the load's fall cut short, for the flood's return to go on with: a load whose
    /// floods are shorter than a trial is judged over several of them.
    paused: Option<KickTrial>,
    /// The frame rate kick coalescing was kept at, and the intervals in a row under half of
    /// it: [`FALL_INTERVALS`] of them are the flood's end, and end the coalescing (the verdict
    /// stays for the flood's return).
    kept_at: Option<(u64, u32)>,
    /// What the last kept trial found.
    verdict: Option<Verdict>,
    /// Parked after a failed trial.
    park: Park,
    /// The last interval's frame rate, and the intervals in a row within 2× of the one before
    /// (a trial's rate before it averages only intervals of the load it is tried on).
    last_rate: u64,
    steady: u32,
}

/// What the rest of the adapter says about this interval.
#[derive(Clone, Copy, Debug)]
pub(super) struct Context {
    /// The mean frame rate of the last [`TRIAL_JUDGED`] intervals, this one's included.
    pub recent_mean: u64,
    /// The kick coalescing may be the adapter's now: the busy-poll window is closed, no
    /// window trial runs, the operator allows a hold and did not fix the knob.
    pub allowed: bool,
    /// Another trial (the coalescing ladder's) runs: none starts beside it.
    pub other_trial: bool,
}

impl Default for KickRule {
    fn default() -> Self {
        KickRule {
            on: false,
            look_us: KICK_LOOK_US,
            look_trial: None,
            trial: None,
            paused: None,
            kept_at: None,
            verdict: None,
            park: Park::new(),
            last_rate: 0,
            steady: 0,
        }
    }
}

impl KickRule {
    /// The kick coalescing in force, within the operator's hold bound.
    pub fn bounds(&self, max_hold_us: u32) -> KickCoalescing {
        if !self.on || max_hold_us == 0 {
            return KickCoalescing::default();
        }
        KickCoalescing {
            max_packets: KICK_AHEAD,
            max_usecs: self.look_us.min(max_hold_us),
        }
    }

    /// Off, with a verdict or a paused trial waiting for the flood they were found on.
    pub fn awaits_flood(&self) -> bool {
        !self.on && (self.verdict.is_some() || self.paused.is_some())
    }

    /// On, and the last interval ran at the flood's rate: a trial the load's fall did not
    /// pause, or a kept one whose rate was at least half the kept rate.
    pub fn floods(&self) -> bool {
        self.on && (self.trial.is_some() || matches!(self.kept_at, Some((_, 0))))
    }

    /// A trial runs (of kick coalescing, or of its shorter look).
    pub fn on_trial(&self) -> bool {
        self.trial.is_some() || self.look_trial.is_some()
    }

    /// Off at once (the bounds or the window took the knob): a running trial ends unjudged,
    /// and what the trials found is forgotten (it was found under other bounds).
    pub fn stop(&mut self) -> bool {
        self.verdict = None;
        self.paused = None;
        self.rest()
    }

    /// Off until the load floods again, the verdict kept: true if that changed anything.
    fn rest(&mut self) -> bool {
        self.trial = None;
        self.look_trial = None;
        self.kept_at = None;
        self.look_us = KICK_LOOK_US;
        std::mem::replace(&mut self.on, false)
    }

    /// Ends a running trial, as new bounds do: kick coalescing on trial goes off, a shorter look
    /// on trial goes back to the long one. True if that changed the kick coalescing.
    pub fn end_trials(&mut self) -> bool {
        if self.trial.is_some() {
            return self.stop();
        }
        if self.look_trial.take().is_some() {
            self.look_us = KICK_LOOK_US;
            return true;
        }
        false
    }

    /// One interval of a running shorter-look trial, if one runs: true if it went back to the
    /// long look (the rate did not rise by an eighth: the looks' two costs are alike, so
    /// the margin is a rate trial's, not a quarter).
    fn judge_look(&mut self, rate: u64) -> bool {
        let Some(mut trial) = self.look_trial.take() else {
            return false;
        };
        let Some(mean) = trial.count(rate) else {
            self.look_trial = Some(trial);
            return false;
        };
        let short = rose_by(mean, trial.before, RATE_TRIAL_GAIN_DIV);
        self.look_us = if short { SHORT_LOOK_US } else { KICK_LOOK_US };
        if let Some(v) = self.verdict.as_mut() {
            v.look_us = Some(self.look_us);
        }
        !short
    }

    /// A trial's frame rates are in (`mean` of its judged intervals, against `before`): kept
    /// or off, the verdict written or forgotten. A trial of a flood that came back with the
    /// shorter look not yet judged ran at the shorter look, which it judges against the rate
    /// the long one was kept at. A first trial that fails at the long look tries the shorter
    /// one before it parks (a flood that waits for what comes back may gain only from that).
    fn judge_trial(&mut self, trial: KickTrial, mean: u64) {
        let before = trial.rates.before;
        // A verdict judged again keeps it at a smaller gain than a first trial needs: one near
        // the quarter would otherwise be won and lost from one flood to the next, each loss
        // costing a park and a fresh trial (on this project's host the mixed load's floods
        // gain 1.2-1.4 × from it, and lost the verdict in some runs and not in others).
        let div = if trial.returned {
            RATE_TRIAL_GAIN_DIV
        } else {
            FIRST_TRIAL_GAIN_DIV
        };
        if !rose_by(mean, before, div) {
            if !trial.returned && trial.look_us == KICK_LOOK_US {
                self.start(KickTrial::new(before, false, SHORT_LOOK_US));
            } else {
                self.fail(trial);
            }
            return;
        }
        self.kept_at = Some((mean, 0));
        self.park.kept();
        if !trial.returned {
            // A first verdict. Where the shorter look paid and the long one did not, it is the
            // look; otherwise the shorter look goes on trial against the long one.
            let short = trial.look_us == SHORT_LOOK_US;
            self.verdict = Some(Verdict {
                before,
                kept: mean,
                look_us: short.then_some(SHORT_LOOK_US),
            });
            if !short {
                self.look_trial = Some(RateTrial::new(mean));
                self.look_us = SHORT_LOOK_US;
            }
            return;
        }
        if let Some(v) = self.verdict.as_mut().filter(|v| v.look_us.is_none()) {
            let look = if rose_by(mean, v.kept, RATE_TRIAL_GAIN_DIV) {
                SHORT_LOOK_US
            } else {
                KICK_LOOK_US
            };
            v.look_us = Some(look);
            self.look_us = look;
        }
    }

    /// `trial` failed: off, a returned trial's verdict forgotten, and parked at the rate its
    /// load ran at without kick coalescing, the rate the load's next floods come back at (only
    /// steady floods count toward the park or end it: see [`KickRule::observe`]). True (a
    /// change).
    fn fail(&mut self, trial: KickTrial) -> bool {
        if trial.returned {
            self.verdict = None;
        }
        self.park.fail(trial.rates.before);
        self.rest()
    }

    /// One interval at frame rate `rate` of a running `trial`: paused, failed, judged, or on.
    /// True when the kick coalescing changed.
    fn go_on_with_trial(&mut self, mut trial: KickTrial, rate: u64) -> bool {
        // The load fell away under the trial (a trickle after a flood): off, the trial paused
        // for the flood's return.
        if rate < trial.rates.before / 2 {
            if trial.pauses >= MAX_PAUSES {
                // Kick coalescing that halves the rate looks like the flood's end: a trial
                // that keeps falling is judged failed.
                return self.fail(trial);
            }
            self.paused = Some(KickTrial {
                pauses: trial.pauses + 1,
                ..trial
            });
            return self.rest();
        }
        let judged = match std::mem::take(&mut trial.skip) {
            true => None,
            false => trial.rates.count(rate),
        };
        let Some(mean) = judged else {
            self.trial = Some(trial);
            return false;
        };
        let was = self.bounds(u32::MAX);
        self.judge_trial(trial, mean);
        self.bounds(u32::MAX) != was
    }

    /// One interval in: true when the kick coalescing changed (on, off, or its look).
    pub fn observe(&mut self, seen: &Observed, cx: Context) -> bool {
        let rate = seen.frames_per_s();
        let last = std::mem::replace(&mut self.last_rate, rate);
        self.steady = if rate > 0 && within_2x(rate, last) {
            self.steady.saturating_add(1)
        } else {
            0
        };
        if !cx.allowed {
            return self.stop();
        }
        if let Some(trial) = self.trial.take() {
            return self.go_on_with_trial(trial, rate);
        }
        if let Some((kept, under)) = self.kept_at {
            // Kept: a fall under half that lasts is the flood's end (a trickle's frames are
            // not worth holding), and the flood's return brings it back at once. A dip of one
            // interval is not, nor is it judged for the look.
            if rate.saturating_mul(2) >= kept {
                self.kept_at = Some((kept, 0));
                return self.judge_look(rate);
            }
            if under + 1 >= FALL_INTERVALS {
                return self.rest();
            }
            self.kept_at = Some((kept, under + 1));
            return false;
        }
        let kicks_many = seen.kicks >= 2
            && seen.kicks.saturating_mul(FRAMES_PER_KICK_WORTH_A_TRIAL) >= seen.frames;
        let flood = kicks_many && rate >= WINDOW_TRIAL_PER_S && !cx.other_trial;
        let returns = |before: u64| flood && rate <= before.saturating_mul(2);
        if let Some(trial) = self.paused.filter(|t| returns(t.rates.before)) {
            // The flood a trial was cut short on is back: the trial goes on.
            return self.start(KickTrial {
                skip: true,
                ..trial
            });
        }
        if let Some(v) = self.verdict.filter(|v| returns(v.before)) {
            // The load a trial kept it for floods again: on at once, at the look found best
            // (the shorter one, if not yet judged), and judged again against the rate it had
            // without (a load that no longer gains forgets it).
            let look_us = v.look_us.unwrap_or(SHORT_LOOK_US);
            return self.start(KickTrial::new(v.before, true, look_us));
        }
        // Only an interval that could start a trial (a steady flood) counts toward a park or
        // ends it, by the rate a trial would start from: a load that comes and goes keeps the
        // park its floods earned across its trickles and the ramps between (each would
        // otherwise end it, and each flood after the park's length try again what failed on
        // it).
        let steady = self.steady as usize >= TRIAL_JUDGED;
        if !flood || !steady || cx.recent_mean < WINDOW_TRIAL_PER_S {
            return false;
        }
        if self.park.holds(cx.recent_mean) {
            return false;
        }
        self.start(KickTrial::new(cx.recent_mean, false, KICK_LOOK_US))
    }

    /// Kick coalescing on, on `trial`: true (a change).
    fn start(&mut self, trial: KickTrial) -> bool {
        self.look_us = trial.look_us;
        self.trial = Some(trial);
        self.paused = None;
        self.on = true;
        true
    }
}

#[cfg(test)]
mod tests;
