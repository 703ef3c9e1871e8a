//! The adapter's kick coalescing (see the parent module's docs): a device that does not poll
//! may still spare a driver that floods it most of its kicks, by letting it queue up to
//! [`KICK_AHEAD`] buffers past a drained ring without one and looking at the ring by itself
//! after at most [`KICK_LOOK_US`] µs. Whether that pays is what a trial says, as for a window.
//! A kept one then tries the shorter look, [`SHORT_LOOK_US`]: a driver that waits for what the
//! device sends back (a request/response flood) queues its next frames sooner than the long look
//! comes, and the short one serves it as a sleeping poll would, where a driver that only sends
//! gains nothing from more looks.

use super::{within_2x, Observed, Park, RateTrial, TRIAL_JUDGED};
use super::{WINDOW_HOLD_INTERVALS, WINDOW_TRIAL_PER_S};
use crate::virtio::net::tuning::KickCoalescing;

/// Most buffers the driver may queue past a drained ring without a kick while the adapter
/// coalesces kicks: three quarters of a default 256-entry queue (a smaller queue clamps it to
/// its size less one). The trial sets [`AHEAD_PER_KICK`] times the frames the driver sent per
/// kick before it, between [`MIN_KICK_AHEAD`] and this: below what the driver keeps in flight,
/// so that its kicks stay in charge (above it the driver never reaches the event, and each
/// batch waits for the look: a sleeping poll, slower than the kicks on a flood of 64 frames
/// in flight).
pub const KICK_AHEAD: u16 = 192;
/// Fewest buffers the adapter lets the driver queue without a kick.
pub const MIN_KICK_AHEAD: u16 = 16;
/// The buffers without a kick, in frames per kick seen before the trial.
pub const AHEAD_PER_KICK: u64 = 3;
/// Longest the device leaves frames queued without a kick before it looks (µs; at most the
/// operator's `max_coalesce_usecs`, the hold the operator allows the device on anything).
pub const KICK_LOOK_US: u32 = 50;
/// The shorter look a kept kick coalescing tries (µs; at most the operator's bound too).
/// Fixed points on this project's host: a polling guest's request/response flood of 64 frames
/// in flight ran 1.6 × faster with it than with the long look; a transmit flood into a sink
/// 0.75–0.87 × (more looks, each finding less).
pub const SHORT_LOOK_US: u32 = 20;
/// A flood whose driver kicks at least once per this many frames has kicks worth sparing.
pub const FRAMES_PER_KICK_WORTH_A_TRIAL: u64 = 256;

/// The kick coalescing rule's state.
#[derive(Clone, Copy, Debug)]
pub(super) struct KickRule {
    /// Kick coalescing on (on trial or kept).
    on: bool,
    /// The buffers without a kick chosen when the trial started.
    ahead: u16,
    /// The look in force: [`KICK_LOOK_US`], or [`SHORT_LOOK_US`] on trial or kept.
    look_us: u32,
    /// The shorter look on trial: its frame rates against the long look's.
    look_trial: Option<RateTrial>,
    /// A trial running: its frame rates against the rate before it.
    trial: Option<RateTrial>,
    /// The frame rate a trial was kept at, and the intervals in a row the rate has been under
    /// half of it: a fall that lasts [`WINDOW_HOLD_INTERVALS`] ends the flood's coalescing.
    kept_at: Option<(u64, u32)>,
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
            ahead: KICK_AHEAD,
            look_us: KICK_LOOK_US,
            look_trial: None,
            trial: None,
            kept_at: None,
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
            max_packets: self.ahead,
            max_usecs: self.look_us.min(max_hold_us),
        }
    }

    /// A trial runs (of kick coalescing, or of its shorter look).
    pub fn on_trial(&self) -> bool {
        self.trial.is_some() || self.look_trial.is_some()
    }

    /// Off at once (the bounds or the window took the knob): a running trial ends unjudged.
    pub fn stop(&mut self) -> bool {
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
    /// long look (the rate did not rise by a quarter, or fell under half: the flood is ending).
    fn judge_look(&mut self, rate: u64) -> bool {
        let Some(mut trial) = self.look_trial.take() else {
            return false;
        };
        let judged = trial.count(rate);
        let kept = match judged {
            _ if rate < trial.before / 2 => false,
            Some(mean) => mean >= trial.before.saturating_add(trial.before / 4),
            None => {
                self.look_trial = Some(trial);
                return false;
            }
        };
        if !kept {
            // Not worth the looks: the long one, for as long as kick coalescing is kept.
            self.look_us = KICK_LOOK_US;
        }
        !kept
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
        if let Some(mut trial) = self.trial.take() {
            let judged = trial.count(rate);
            // The load fell away under the trial (a trickle after a flood): its frames are not
            // worth holding, so the trial ends here, failed.
            let mean = match judged {
                _ if rate < trial.before / 2 => rate,
                Some(mean) => mean,
                None => {
                    self.trial = Some(trial);
                    return false;
                }
            };
            if mean >= trial.before.saturating_add(trial.before / 4) {
                // Kept: the shorter look goes on trial against it.
                self.kept_at = Some((mean, 0));
                self.park.kept();
                self.look_trial = Some(RateTrial::new(mean));
                self.look_us = SHORT_LOOK_US;
                return true;
            }
            self.park.fail(mean);
            self.on = false;
            return true;
        }
        if self.on {
            let look_changed = self.judge_look(rate);
            // Kept: only a fall that lasts ends it (the flood is over; a trickle's frames are
            // not worth holding), not a dip of a few intervals.
            let (kept, under) = self.kept_at.unwrap_or((rate, 0));
            let under = if rate.saturating_mul(2) >= kept {
                0
            } else {
                under + 1
            };
            if under < WINDOW_HOLD_INTERVALS {
                self.kept_at = Some((kept, under));
                return look_changed;
            }
            return self.stop();
        }
        if self.park.holds(rate) {
            return false;
        }
        let kicks_many = seen.kicks >= 2
            && seen.kicks.saturating_mul(FRAMES_PER_KICK_WORTH_A_TRIAL) >= seen.frames;
        let steady = self.steady as usize >= TRIAL_JUDGED;
        if kicks_many && steady && cx.recent_mean >= WINDOW_TRIAL_PER_S && !cx.other_trial {
            self.trial = Some(RateTrial::new(cx.recent_mean));
            self.on = true;
            let per_kick = seen.frames / seen.kicks.max(1);
            self.ahead = per_kick
                .saturating_mul(AHEAD_PER_KICK)
                .clamp(MIN_KICK_AHEAD.into(), KICK_AHEAD.into()) as u16;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests;
