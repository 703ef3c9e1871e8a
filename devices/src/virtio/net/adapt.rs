//! Device-side adaptation (`adaptive=on`): the worker moves its own busy-poll window,
//! interrupt coalescing and kick coalescing from what it saw in the last interval, within the
//! operator's bounds.
//!
//! - **Busy-poll** follows the driver's idle gaps, after the rule of KVM's halt polling: a
//!   wake-up (a kick or backend input) after an idle gap that a window at the bound would have
//!   covered is a kick and a sleep the device could have saved; one after a longer gap is
//!   polling that would have been wasted. The first [`GAP_SAMPLE`] sleeps of an interval are
//!   timed, then one in [`GAP_SAMPLE_EVERY`] ([`times_sleep`]), and the
//!   evidence is counted since the window last moved or the frame rate last changed 2× from
//!   one interval to the next (another load), [`GAP_HORIZON`] intervals at most: the
//!   window grows when two timed sleeps at least, and half of them or more, were short: it
//!   doubles (from [`BUSY_POLL_START_US`]), or jumps at once to the power of two that covers
//!   the longest of those short gaps, whichever is larger; it halves (under the start value: off)
//!   when three in four were long *and* two in three of its windows or more ran out without
//!   finding work (a window that finds work a third of the time or more earns its keep whatever
//!   the sleeps say), judged on the evidence of a
//!   whole [`GAP_HORIZON`] at once; otherwise it stays. On a flood (at least
//!   [`WINDOW_TRIAL_PER_S`] frames/s) each opening or growth is judged as a trial is, over
//!   [`WINDOW_TRIAL_INTERVALS`] intervals: given back, and the rule parked as after a failed
//!   trial (no opening or growth while parked), if the frame rate fell by a sixteenth
//!   ([`GAP_TRIAL_LOSS_DIV`]). Short gaps say that a window would catch the driver's next
//!   buffer, not that catching it pays: on a path something else bounds (a tap's `write`),
//!   the window's polling takes its cycles from the vCPU or the kernel's work on that path.
//!   Opening is quick and closing slow because
//!   the two mistakes cost differently: a window left open over a horizon too long costs the
//!   worker's polling (at most the window per wake-up, on its own thread), one closed under a load
//!   that needs it costs that load's rate (2× on the VM's flood through a `loop`), and a load that
//!   switches faster than a horizon (floods and trickles of 10 ms, the trickle's gaps longer than
//!   the bound) would otherwise have it close in every trickle, start each flood without it and
//!   soon, through the reversal rule below, stay wherever a switch left it. A window that covers
//!   the driver's gaps sees no sleeps and stays; a driver whose gaps exceed the bound keeps it off.
//!   A move against the window's last one waits [`GAP_HORIZON`] intervals, doubling with each such
//!   reversal (up to [`MAX_REVERSAL_WAIT`]): gaps that straddle the bound cannot make it open and
//!   close every few intervals.
//!
//!   Those gaps are measured under the window in force, and a closed one can make its own:
//!   a device that sleeps whenever it runs dry lets the driver's ring fill, the driver waits
//!   for the interrupt, and its next publish comes after its own wake-up, longer than the
//!   bound on a slow host, where a window would have kept the ring from filling and the driver
//!   from waiting at all. So a window under the bound (closed, or too small for the driver) under a
//!   flood (at least [`WINDOW_TRIAL_PER_S`] frames/s) whose gaps say "long" gets a *trial*: open at
//!   the bound for [`WINDOW_TRIAL_INTERVALS`] intervals, kept if the frame rate (averaged over all
//!   but its first, against as many before it) rose by a quarter, or did not fall by a tenth from
//!   an open window that mostly found work (the gap rule found it worth polling, and a longer one
//!   costs only the windows that run out, on the worker's own thread), else back where it was and
//!   parked like a failed coalescing step (for [`PARK_INTERVALS`] intervals at least, doubling with
//!   each failed trial in a row, then until the frame rate has changed by more than 2×): on a
//!   steady load that no window helps, one trial. A window the trial kept is not closed by the gap
//!   rule until the frame rate has stayed below half the rate that kept it for
//!   [`WINDOW_HOLD_INTERVALS`] intervals: the driver may still wait now and then (its ring full),
//!   and the gaps those waits leave say nothing against a window that multiplied the rate (nor does
//!   a rate that rose further, or a dip of a few intervals).
//! - **Interrupt coalescing** climbs a ladder of levels ([`LEVELS_US`], with a packet bound of
//!   [`LEVEL_PACKETS`]) while interrupts come faster than [`IRQ_HIGH_PER_S`] carrying fewer than
//!   [`TARGET_FRAMES_PER_IRQ`] frames each, but more than the two of a round trip
//!   ([`MIN_FRAMES_PER_IRQ16`]: a request/response flow has nothing to batch), on a steady load
//!   (the interval's frame rate and frames per interrupt within 2× of the one before: an interval
//!   that saw the load change mixes two, and a trickle after a flood would climb on every switch).
//!   Each step up is on trial for one interval: if the frames per interrupt did not grow by half,
//!   or the frame rate fell by a tenth, holding interrupts only added latency (a request/response
//!   flow, where nothing completes while an interrupt waits), so the step is undone and the ladder
//!   parks: for [`PARK_INTERVALS`] intervals at least (doubling with each failed trial in a row, up
//!   to [`MAX_PARK_INTERVALS`]), and then until the frame rate has changed by more than 2×. A level
//!   is left downwards when the frame rate falls below half the rate it was entered at, and at once
//!   when an interval completes nothing. While the guest sets coalescing itself (NOTF_COAL, e.g.
//!   Linux's DIM or the driver crate's `adaptive=1`), the ladder stays at the bottom: two
//!   controllers on one knob would each read the other's moves as the load's.
//!   Interrupts the counts do not call heavy (slower than [`IRQ_HIGH_PER_S`], or already
//!   carrying [`TARGET_FRAMES_PER_IRQ`] frames or more) may still cost the guest much each (its
//!   wake-up; on a host that emulates the guest's kernel, ~90 µs): a flood (at least
//!   [`WINDOW_TRIAL_PER_S`] frames/s, four intervals in a row steady) whose
//!   interrupts carry more than a round trip's frames gets the first level on a *rate trial*,
//!   judged as a window trial is (over [`WINDOW_TRIAL_INTERVALS`] intervals, the first left
//!   out): kept if the frame rate rose by an eighth ([`RATE_TRIAL_GAIN_DIV`]), else undone
//!   and parked as a failed step; a load that falls to under half its rate during the trial
//!   ends it at once. No window trial runs during one, nor it during a window trial, so
//!   neither judges the other's change.
//! - **Kick coalescing** (`adapt/kicks.rs`), with the window closed (a device that may not
//!   poll, or one whose window trial failed): a steady flood whose driver kicks at least once per
//!   [`FRAMES_PER_KICK_WORTH_A_TRIAL`] frames gets
//!   [`KICK_AHEAD`] buffers without a kick and a look after [`KICK_LOOK_US`] (at most the
//!   operator's `max_coalesce_usecs`) on a rate trial, judged as a window trial (kept if the
//!   rate rose by a quarter; else the shorter look [`SHORT_LOOK_US`] is tried the same way
//!   before it goes off and parks at the rate the load ran at without it; only steady floods
//!   count toward that park or end it, judged by the rate a trial would start from, so a
//!   load's trickles and the ramps between keep it); a kept one tries the shorter look
//!   [`SHORT_LOOK_US`] against it (back to the long one unless the rate rose by an eighth).
//!   The load's fall under half its rate for [`FALL_INTERVALS`] intervals ends it (at once
//!   under a trial, which it pauses for the flood's return to go on with, [`MAX_PAUSES`] times
//!   at most: kick coalescing that halves the rate looks the same, so the next fall fails
//!   it); the verdict (the rate without, the look) turns it on again in the first interval
//!   the same load floods, judged again each time (kept at an eighth's gain, where a first
//!   trial needs a quarter). While a verdict or a paused trial waits for its flood with kick
//!   coalescing off, intervals last a quarter of the operator's ([`Adapter::interval_us`],
//!   [`AWAIT_INTERVAL_DIV`]): the flood's first interval runs at the rate its kicks allow,
//!   and a shorter one ends sooner. A window that opens takes over. It starts beside no
//!   coalescing trial, and none starts beside it. The operator's own kick coalescing, and a
//!   driver without EVENT_IDX, leave it off ([`Observed::kicks_fixed`]).
//!
//! The [`Adapter`] owns no clock and no file descriptor: the worker counts, hands it one
//! interval's [`Observed`] counts, and applies the [`Decision`]. Its tests are exact, and
//! `cargo bench -p devices --bench adapt` measures what adapting costs the worker.

use super::tuning::{Adaptive, InterruptCoalescing, KickCoalescing, MIN_ADAPT_INTERVAL_US};

mod kicks;

pub use kicks::{
    FALL_INTERVALS, FRAMES_PER_KICK_WORTH_A_TRIAL, KICK_AHEAD, KICK_LOOK_US, MAX_PAUSES,
    SHORT_LOOK_US,
};

/// First busy-poll window, in microseconds, when adaptation turns it on.
pub const BUSY_POLL_START_US: u32 = 8;
/// The coalescing ladder's time bounds (level 1 upwards; level 0 is off).
pub const LEVELS_US: [u32; 7] = [8, 16, 32, 64, 128, 256, 512];
/// The packet bound of every coalescing level: a quarter of a default 256-entry ring, so a
/// held interrupt never leaves the driver short of buffers.
pub const LEVEL_PACKETS: u16 = 64;
/// The first this many sleeps of an adaptation interval are timed for the busy-poll's
/// evidence ([`times_sleep`]).
pub const GAP_SAMPLE: u32 = 8;
/// After an interval's first [`GAP_SAMPLE`] sleeps, one in this many is timed: the gaps'
/// distribution is the same, and a sleep that is not timed costs the worker no clock read.
pub const GAP_SAMPLE_EVERY: u32 = 32;
/// Intervals over which the busy-poll's evidence (idle gaps) accumulates at most.
pub const GAP_HORIZON: u32 = 16;
/// Longest wait before the busy-poll window may move against its last move, in intervals.
pub const MAX_REVERSAL_WAIT: u32 = 1024;
/// Frame rate (per second) from which a window under the bound is worth a trial under long
/// gaps.
pub const WINDOW_TRIAL_PER_S: u64 = 100_000;
/// Intervals a window trial runs: the first sees the change happen, the frame rate of the
/// others is averaged and compared with the average of as many before it (at most: since the
/// evidence was last dropped). One interval's rate swings 2× on a VM's steady load, which
/// made a verdict on one interval a coin toss.
pub const WINDOW_TRIAL_INTERVALS: u32 = 5;
/// Intervals a window trial's verdict averages (all but the first).
const TRIAL_JUDGED: usize = WINDOW_TRIAL_INTERVALS as usize - 1;
/// A window the gap rule opened or grew is given back, and the rule parked, if the frame rate
/// fell by the rate before it over this (a sixteenth) over the trial's intervals: on a path
/// that something else bounds (a tap's `write`), polling takes its cycles from the vCPU or
/// the kernel's work on that path and lowers the rate it cannot raise.
pub const GAP_TRIAL_LOSS_DIV: u64 = 16;
/// A coalescing rate trial keeps its level if the frame rate rose by the rate before it over
/// this: by an eighth.
pub const RATE_TRIAL_GAIN_DIV: u64 = 8;
/// While kick coalescing waits for a flood it knows (a verdict or a paused trial), intervals
/// last the operator's `interval_us` over this (at least [`MIN_ADAPT_INTERVAL_US`]). On this
/// project's host, a polling guest's mixed load (10 ms floods of request/response with 64
/// frames in flight, kick-bound without kick coalescing, between 10 ms trickles) ran its floods
/// at 0.98 × the best fixed point's rate with 250 µs intervals, against 0.90 × with 1 ms.
pub const AWAIT_INTERVAL_DIV: u32 = 4;
/// Shortest park after a failed coalescing or window trial, in intervals.
pub const PARK_INTERVALS: u32 = 16;
/// Longest park after failed trials in a row.
pub const MAX_PARK_INTERVALS: u32 = 1024;
/// Intervals in a row the frame rate must stay under half the rate that kept a trial's window
/// before the gap rule may close it (a dip of a few intervals, the host pausing a thread, is
/// not a fall of the load).
pub const WINDOW_HOLD_INTERVALS: u32 = 8;
/// Interrupt rate above which coalescing is worth a try.
pub const IRQ_HIGH_PER_S: u64 = 16_000;
/// Frames per interrupt (×16) from which coalescing is worth a try: 2.5, more than the two
/// (one each way) of a request/response round trip.
pub const MIN_FRAMES_PER_IRQ16: u64 = 40;
/// Frames per interrupt from which coalescing has nothing left to gain: half a default
/// 256-entry ring (the driver then reclaims in batches that large anyway). A driver that
/// already asks for an interrupt every quarter ring (64 frames, as on a transmit flood that
/// the device polls) still gains from a hold: each interrupt it takes is a wake-up, and a
/// step is kept only if it batches half as many frames again at the same rate.
pub const TARGET_FRAMES_PER_IRQ: u64 = 128;
/// Whether the worker times the `nth` sleep (from 1) of an adaptation interval: the first
/// [`GAP_SAMPLE`], then one in [`GAP_SAMPLE_EVERY`]. Where sleeps are rare (a window that
/// catches all but a round trip or two a millisecond, whose misses are what the window should
/// grow to cover) every one is evidence, and one in eight alone left the rule without any for
/// tens of intervals; where they come with every frame (a thousand an interval at 1 M
/// frames/s) a few dozen timed ones say what the gaps are, and the clock reads (two per timed
/// sleep, ~26 ns each on a slow host) stay a small part of a sleep's cost.
pub fn times_sleep(nth: u32) -> bool {
    nth <= GAP_SAMPLE || nth.is_multiple_of(GAP_SAMPLE_EVERY)
}

/// What the worker saw in one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Frames completed (rx + tx).
    pub frames: u64,
    /// Interrupts sent.
    pub interrupts: u64,
    /// Wake-ups on work after an idle gap (busy-poll window included) of at most the bound.
    pub short_gaps: u64,
    /// Wake-ups on work after a longer idle gap.
    pub long_gaps: u64,
    /// The longest of the short idle gaps, in microseconds (0: not known). A window that
    /// grows jumps straight to the power of two that covers it, instead of doubling its way
    /// there one evidence-gathering step at a time.
    pub longest_short_gap_us: u32,
    /// Busy-poll windows started.
    pub windows: u64,
    /// Busy-poll windows that found work before they ran out.
    pub windows_found: u64,
    /// The interval's length in microseconds.
    pub elapsed_us: u64,
    /// The guest sets the interrupt coalescing (NOTF_COAL): its values win, so the device
    /// leaves its ladder at the bottom rather than move a knob the guest is moving too.
    pub guest_coalesces: bool,
    /// The driver's tx kicks.
    pub kicks: u64,
    /// The kick coalescing is not the adapter's: the operator set it, or the driver did not
    /// negotiate EVENT_IDX (its kicks cannot be put off).
    pub kicks_fixed: bool,
}

impl Observed {
    /// The interval's frame rate, per second.
    fn frames_per_s(&self) -> u64 {
        self.frames.saturating_mul(1_000_000) / self.elapsed_us.max(1)
    }
}

/// Whether a frame rate `rate` is within 2× of `at` (either way).
fn within_2x(rate: u64, at: u64) -> bool {
    rate <= at.saturating_mul(2) && rate >= at / 2
}

/// Whether a trial's frame rate `rate` rose by `1 / div` over the rate `before` it.
fn rose_by(rate: u64, before: u64, div: u64) -> bool {
    rate >= before.saturating_add(before / div)
}

/// A busy-poll window trial running (see the module docs).
#[derive(Clone, Copy, Debug)]
struct WindowTrial {
    /// Its frame rates against the rate before it.
    rates: RateTrial,
    /// The window it started from: where a trial that fails goes back to.
    from: u32,
    /// The window it started from mostly found work: the gap rule found polling worth it,
    /// and a longer window costs only the windows that run out (the worker's own polling), so
    /// the bound is kept unless the frame rate fell by a tenth, instead of only when it rose
    /// by a quarter.
    from_earns: bool,
    /// The gap rule opened or grew the window (no trial at the bound): kept unless the frame
    /// rate fell by [`GAP_TRIAL_LOSS_DIV`]'s share.
    gap: bool,
}

/// A trial's frame rates, window or coalescing (see the module docs): over
/// [`WINDOW_TRIAL_INTERVALS`] intervals, the first (which sees the change happen) left out,
/// against the rate before it.
#[derive(Clone, Copy, Debug)]
struct RateTrial {
    /// The frame rate before it (per second).
    before: u64,
    /// The sum of the frame rates of the intervals it has judged so far.
    sum: u64,
    /// Intervals it has left.
    left: u32,
}

impl RateTrial {
    fn new(before: u64) -> RateTrial {
        RateTrial {
            before,
            sum: 0,
            left: WINDOW_TRIAL_INTERVALS,
        }
    }

    /// Counts one interval's frame rate: the mean rate of the judged intervals once the last
    /// is in, `None` before.
    fn count(&mut self, rate: u64) -> Option<u64> {
        if self.left < WINDOW_TRIAL_INTERVALS {
            self.sum = self.sum.saturating_add(rate);
        }
        if self.left > 1 {
            self.left -= 1;
            return None;
        }
        Some(self.sum / TRIAL_JUDGED as u64)
    }
}

/// A rule parked after a failed trial (window, coalescing or kick coalescing): for the park's
/// length at least (it doubles with each failed trial in a row, up to [`MAX_PARK_INTERVALS`]),
/// then until the frame rate has moved 2× from the rate the trial failed at.
#[derive(Clone, Copy, Debug)]
struct Park {
    /// The frame rate the last trial failed at (`None`: not parked).
    at: Option<u64>,
    /// Intervals left before the park may end.
    left: u32,
    /// The next park's length.
    next: u32,
}

impl Park {
    const fn new() -> Park {
        Park {
            at: None,
            left: 0,
            next: PARK_INTERVALS,
        }
    }

    /// Whether the rule stays parked in an interval at frame rate `rate` (counting it).
    fn holds(&mut self, rate: u64) -> bool {
        let Some(at) = self.at else {
            return false;
        };
        if self.left > 0 {
            self.left -= 1;
            return true;
        }
        if within_2x(rate, at) {
            return true;
        }
        self.at = None;
        false
    }

    /// A trial failed at frame rate `rate`: parks for the next park's length, doubling it.
    fn fail(&mut self, rate: u64) {
        self.at = Some(rate);
        self.left = self.next;
        self.next = self.next.saturating_mul(2).min(MAX_PARK_INTERVALS);
    }

    /// A trial was kept: the next park is short again.
    fn kept(&mut self) {
        self.next = PARK_INTERVALS;
    }
}

/// What changed after an interval (`None`: unchanged).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// The new busy-poll window (µs).
    pub busy_poll_us: Option<u32>,
    /// The new interrupt coalescing.
    pub coalescing: Option<InterruptCoalescing>,
    /// The new kick coalescing.
    pub kick_coalescing: Option<KickCoalescing>,
}

/// Decisions counted, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdaptCounters {
    /// Intervals observed.
    pub intervals: u64,
    /// Changes of the busy-poll window.
    pub busy_poll_changes: u64,
    /// Changes of the coalescing.
    pub coalescing_changes: u64,
    /// Changes of the kick coalescing.
    pub kick_coalescing_changes: u64,
}

/// The adaptation state of one worker (see the module docs).
#[derive(Clone, Debug)]
pub struct Adapter {
    bounds: Adaptive,
    busy_poll_us: u32,
    /// Wake-ups after short and after long idle gaps since the window last moved (over at most
    /// [`GAP_HORIZON`] intervals): evidence accumulates until it is enough to act on.
    gaps: (u64, u64),
    /// The longest short gap over the same intervals (µs).
    longest_short_gap_us: u32,
    /// Busy-poll windows started, and those that found work, over the same intervals.
    windows: (u64, u64),
    /// The window's last move (true: it grew) and the intervals since.
    last_move: Option<bool>,
    since_move: u32,
    /// Intervals a move against the last one must wait: doubles with each reversal (up to
    /// [`MAX_REVERSAL_WAIT`]), back to [`GAP_HORIZON`] after two moves the same way.
    reversal_wait: u32,
    /// Intervals the gap counts cover.
    gap_intervals: u32,
    /// A window trial running.
    window_trial: Option<WindowTrial>,
    /// The frame rates (per second) of the last [`TRIAL_JUDGED`] intervals, the latest at
    /// `recent_at`: a window trial's rate before it, and the interval before's (a rate 2× away
    /// from it is another load, and the gaps counted under the old one are dropped).
    recent: [u64; TRIAL_JUDGED],
    recent_at: usize,
    /// Parked after a failed window trial.
    window_park: Park,
    /// The frame rate a window trial was kept at, and the intervals in a row the rate has
    /// been under half of it: until those reach [`WINDOW_HOLD_INTERVALS`], the gap rule does
    /// not close the window (its gaps are the driver's own waits, which the window's gain
    /// outweighs).
    window_kept_at: Option<(u64, u32)>,
    /// Coalescing ladder level (0: off).
    level: usize,
    /// The frame rate (per second) each level above 0 was entered at.
    entered_at: [u64; LEVELS_US.len()],
    /// A step up on trial: the frames per interrupt (×16) and the frame rate before it.
    trial: Option<(u64, u64)>,
    /// The first level on a rate trial (interrupts few or already full, see the module docs):
    /// judged on the frame rate over [`WINDOW_TRIAL_INTERVALS`] intervals, as a window trial.
    rate_trial: Option<RateTrial>,
    /// Intervals in a row whose frame rate and frames per interrupt were each within 2× of
    /// the interval before's: a rate trial's rate before it averages only intervals of the
    /// load it is tried on.
    steady_run: u32,
    /// The coalescing ladder, parked after a failed step or rate trial.
    park: Park,
    /// The previous interval's frame rate (per second) and frames per interrupt (×16; both 0
    /// after an idle interval or one the guest coalesced): a step up needs a steady load, this
    /// interval's within 2× of them.
    last_rate: (u64, u64),
    /// The kick coalescing's rule.
    kicks: kicks::KickRule,
    /// Decisions counted since the worker last took them.
    pub counters: AdaptCounters,
}

impl Adapter {
    /// An adapter with everything off, within `bounds`.
    pub fn new(bounds: Adaptive) -> Adapter {
        Adapter {
            bounds,
            busy_poll_us: 0,
            gaps: (0, 0),
            longest_short_gap_us: 0,
            windows: (0, 0),
            last_move: None,
            since_move: 0,
            reversal_wait: GAP_HORIZON,
            gap_intervals: 0,
            window_trial: None,
            recent: [0; TRIAL_JUDGED],
            recent_at: 0,
            window_park: Park::new(),
            window_kept_at: None,
            level: 0,
            entered_at: [0; LEVELS_US.len()],
            last_rate: (0, 0),
            trial: None,
            rate_trial: None,
            steady_run: 0,
            park: Park::new(),
            kicks: kicks::KickRule::default(),
            counters: AdaptCounters::default(),
        }
    }

    /// New bounds: values now outside them come down at once.
    pub fn set_bounds(&mut self, bounds: Adaptive) -> Decision {
        let kicks_were = self.kick_coalescing();
        self.bounds = bounds;
        // A window trial runs at the old bound and would go back to a window the new one may
        // not allow: it says nothing about the new bound, so it ends here.
        self.window_trial = None;
        self.rate_trial = None;
        let mut d = Decision::default();
        if self.busy_poll_us > bounds.max_busy_poll_us {
            d.busy_poll_us = Some(self.set_busy_poll(bounds.max_busy_poll_us));
        }
        if self.level > self.top_level() {
            d.coalescing = Some(self.set_level(self.top_level()));
        }
        // A kick trial ends as a window trial does; a kept one follows the new hold bound.
        self.kicks.end_trials();
        if bounds.max_coalesce_usecs == 0 {
            self.kicks.stop();
        }
        let kicks = self.kick_coalescing();
        if kicks != kicks_were {
            self.counters.kick_coalescing_changes += 1;
            d.kick_coalescing = Some(kicks);
        }
        d
    }

    /// The busy-poll window chosen (µs).
    pub fn busy_poll_us(&self) -> u32 {
        self.busy_poll_us
    }

    /// The coalescing chosen.
    pub fn coalescing(&self) -> InterruptCoalescing {
        level_bounds(self.level)
    }

    /// The kick coalescing chosen.
    pub fn kick_coalescing(&self) -> KickCoalescing {
        self.kicks.bounds(self.bounds.max_coalesce_usecs)
    }

    /// Kick coalescing is on and the last interval ran at its flood's rate (a trial not
    /// paused, or a kept one not falling).
    pub fn kick_floods(&self) -> bool {
        self.kicks.floods()
    }

    /// The bounds in force (the operator's).
    pub fn bounds(&self) -> Adaptive {
        self.bounds
    }

    /// The length of the next interval (µs): the operator's, or a [`AWAIT_INTERVAL_DIV`]th of
    /// it while kick coalescing waits for a flood it knows, for the flood to get it sooner.
    pub fn interval_us(&self) -> u32 {
        if self.kicks.awaits_flood() {
            (self.bounds.interval_us / AWAIT_INTERVAL_DIV).max(MIN_ADAPT_INTERVAL_US)
        } else {
            self.bounds.interval_us
        }
    }

    /// One interval's counts in; what changed out.
    pub fn observe(&mut self, seen: Observed) -> Decision {
        self.counters.intervals += 1;
        let before = self.recent[self.recent_at];
        self.recent_at = (self.recent_at + 1) % TRIAL_JUDGED;
        self.recent[self.recent_at] = seen.frames_per_s();
        let wanted = self.next_busy_poll(seen, before);
        let busy_poll = match self.window_trial(seen, wanted) {
            Some(trial) => {
                self.since_move = self.since_move.saturating_add(1);
                trial
            }
            None => {
                let moved = self.turn_wait(wanted);
                // A flood's window must pay: judged by its rate (a trickle's cannot cost).
                let flood = seen.frames_per_s() >= WINDOW_TRIAL_PER_S;
                if moved > self.busy_poll_us && flood && self.rate_trial.is_none() {
                    self.start_gap_trial(self.busy_poll_us);
                }
                moved
            }
        };
        if busy_poll != self.busy_poll_us || self.gap_intervals >= GAP_HORIZON {
            self.forget_gaps();
        }
        let level = self.next_level(seen);
        let kicks = self.kicks.observe(
            &seen,
            kicks::Context {
                recent_mean: self.recent_mean(TRIAL_JUDGED),
                allowed: busy_poll == 0
                    && self.window_trial.is_none()
                    && self.bounds.max_coalesce_usecs > 0
                    && !seen.kicks_fixed,
                other_trial: self.trial.is_some() || self.rate_trial.is_some(),
            },
        );
        Decision {
            busy_poll_us: (busy_poll != self.busy_poll_us).then(|| self.set_busy_poll(busy_poll)),
            coalescing: (level != self.level).then(|| self.set_level(level)),
            kick_coalescing: kicks.then(|| {
                self.counters.kick_coalescing_changes += 1;
                self.kick_coalescing()
            }),
        }
    }

    fn set_busy_poll(&mut self, us: u32) -> u32 {
        self.busy_poll_us = us;
        self.counters.busy_poll_changes += 1;
        us
    }

    fn set_level(&mut self, level: usize) -> InterruptCoalescing {
        self.level = level;
        self.counters.coalescing_changes += 1;
        level_bounds(level)
    }

    /// The highest ladder level within the bound.
    fn top_level(&self) -> usize {
        LEVELS_US
            .iter()
            .take_while(|&&us| us <= self.bounds.max_coalesce_usecs)
            .count()
    }

    /// `wanted`, unless it turns the window back the other way sooner than the reversal wait
    /// allows: gaps that straddle the bound would otherwise open and close it every few
    /// intervals.
    fn turn_wait(&mut self, wanted: u32) -> u32 {
        self.since_move = self.since_move.saturating_add(1);
        if wanted == self.busy_poll_us {
            return wanted;
        }
        let grows = wanted > self.busy_poll_us;
        match self.last_move {
            Some(last) if last != grows && self.since_move < self.reversal_wait => {
                return self.busy_poll_us;
            }
            Some(last) if last != grows => {
                self.reversal_wait = self.reversal_wait.saturating_mul(2).min(MAX_REVERSAL_WAIT);
            }
            Some(_) => self.reversal_wait = GAP_HORIZON,
            None => {}
        }
        self.last_move = Some(grows);
        self.since_move = 0;
        wanted
    }

    /// The window trial's part (see the module docs): `Some` window while one runs, starts or
    /// ends; `None` leaves the window to the gap rule's `wanted`.
    fn window_trial(&mut self, seen: Observed, wanted: u32) -> Option<u32> {
        let rate = seen.frames_per_s();
        if let Some(trial) = self.window_trial.take() {
            return Some(self.go_on_with_trial(trial, rate));
        }
        if let Some((kept, under)) = self.window_kept_at {
            // Only a fall that lasts lifts the hold: a rate that rose further since says
            // nothing against the window (the hold once ended on a doubling too, and the gap
            // rule then closed the window that had made it), nor does a dip of a few
            // intervals.
            let under = if rate.saturating_mul(2) >= kept {
                0
            } else {
                under + 1
            };
            if under < WINDOW_HOLD_INTERVALS && self.busy_poll_us > 0 {
                self.window_kept_at = Some((kept, under));
                return (wanted < self.busy_poll_us).then_some(self.busy_poll_us);
            }
            self.window_kept_at = None;
        }
        let bound = self.bounds.max_busy_poll_us;
        if self.window_park.holds(rate) {
            // Parked: the gap rule may close the window, not open or grow it.
            return (wanted > self.busy_poll_us).then_some(self.busy_poll_us);
        }
        // A window under the bound that the gap rule would not grow: closed, too small for a
        // driver that waits under it (its gaps are long), which no horizon of evidence may
        // close while the load switches faster than one, or one whose windows mostly find work
        // while the sleeps they miss are long.
        let now = self.busy_poll_us;
        let long = self.gaps.1 >= 2 && self.gaps.1 > self.gaps.0;
        if now < bound
            && wanted <= now
            && long
            && rate >= WINDOW_TRIAL_PER_S
            && self.rate_trial.is_none()
        {
            self.start_trial(now);
            return Some(bound);
        }
        None
    }

    /// One interval of a running window trial (see the module docs): the window it leaves.
    fn go_on_with_trial(&mut self, mut trial: WindowTrial, rate: u64) -> u32 {
        let Some(rate) = trial.rates.count(rate) else {
            self.window_trial = Some(trial);
            return self.busy_poll_us;
        };
        let before = trial.rates.before;
        if trial.gap {
            if rate >= before.saturating_sub(before / GAP_TRIAL_LOSS_DIV) {
                self.window_park.kept();
                return self.busy_poll_us;
            }
            self.window_park.fail(rate);
            return trial.from;
        }
        let kept = if trial.from_earns {
            rate >= before.saturating_sub(before / 10)
        } else {
            rose_by(rate, before, 4)
        };
        if kept {
            // Kept: a move up as far as the reversal rule is concerned.
            self.window_park.kept();
            self.window_kept_at = Some((rate, 0));
            self.last_move = Some(true);
            self.since_move = 0;
            return self.busy_poll_us;
        }
        self.window_park.fail(rate);
        trial.from
    }

    /// Starts a window trial at the bound from the window `now`.
    fn start_trial(&mut self, now: u32) {
        // The rate before: the average of the intervals since the evidence was last dropped
        // (another load), this one's included, over as many as the trial averages.
        let n = (self.gap_intervals as usize).clamp(1, TRIAL_JUDGED);
        self.window_trial = Some(WindowTrial {
            rates: RateTrial::new(self.recent_mean(n)),
            from: now,
            from_earns: now > 0 && self.windows.1.saturating_mul(2) > self.windows.0,
            gap: false,
        });
    }

    /// The gap rule moves the window up from `now`: judged by the frame rate as a trial is
    /// (see [`GAP_TRIAL_LOSS_DIV`]).
    fn start_gap_trial(&mut self, now: u32) {
        let n = (self.gap_intervals as usize).clamp(1, TRIAL_JUDGED);
        self.window_trial = Some(WindowTrial {
            rates: RateTrial::new(self.recent_mean(n)),
            from: now,
            from_earns: false,
            gap: true,
        });
    }

    /// Drops the busy-poll evidence: the window moved, the horizon is over, or the load changed.
    fn forget_gaps(&mut self) {
        self.gaps = (0, 0);
        self.longest_short_gap_us = 0;
        self.windows = (0, 0);
        self.gap_intervals = 0;
    }

    /// The gap rule's window; `before` is the interval before's frame rate.
    fn next_busy_poll(&mut self, seen: Observed, before: u64) -> u32 {
        let bound = self.bounds.max_busy_poll_us;
        let now = self.busy_poll_us;
        let rate = seen.frames_per_s();
        if !within_2x(rate, before) {
            // Another load: a trickle's long gaps say nothing about the flood that follows it.
            self.forget_gaps();
        }
        self.gaps.0 = self.gaps.0.saturating_add(seen.short_gaps);
        self.gaps.1 = self.gaps.1.saturating_add(seen.long_gaps);
        self.longest_short_gap_us = self.longest_short_gap_us.max(seen.longest_short_gap_us);
        self.windows.0 = self.windows.0.saturating_add(seen.windows);
        self.windows.1 = self.windows.1.saturating_add(seen.windows_found);
        self.gap_intervals += 1;
        // Growing needs two short sleeps and half of them short, shrinking two long ones,
        // three in four long and two in three windows or more that ran out over a whole
        // horizon (a third or more finding work earn their keep): gaps spread around the
        // bound, one stretched by the host now and then, or the trickles between floods,
        // leave the window alone. A
        // halting guest's ping-pong has two gaps a round trip, a short one (the loop's frame
        // coming back) and a long one (the guest's turn-around): the window that catches the
        // short one finds work in half of its windows, and judged against "more than half"
        // it closed and reopened every horizon (14 changes in a trial).
        let (short, long) = self.gaps;
        let (windows, found) = self.windows;
        let windows_earn = found > 0 && found.saturating_mul(3) >= windows;
        if short >= 2 && short >= long {
            // At least double, and at once as far as the longest short gap needs.
            let covering = self.longest_short_gap_us.checked_next_power_of_two();
            (now.saturating_mul(2))
                .max(BUSY_POLL_START_US)
                .max(covering.unwrap_or(u32::MAX))
                .min(bound)
        } else if long >= 2
            && long > short.saturating_mul(3)
            && !windows_earn
            && self.gap_intervals >= GAP_HORIZON
        {
            let half = now / 2;
            if half < BUSY_POLL_START_US.min(bound) {
                0
            } else {
                half
            }
        } else {
            now
        }
    }

    fn next_level(&mut self, seen: Observed) -> usize {
        if seen.guest_coalesces || seen.frames == 0 {
            // The guest's values win; or nothing to batch: no interrupt is worth holding.
            self.trial = None;
            self.rate_trial = None;
            self.steady_run = 0;
            self.last_rate = (0, 0);
            return 0;
        }
        let per_s = |n: u64| n.saturating_mul(1_000_000) / seen.elapsed_us.max(1);
        let rate = seen.frames_per_s();
        let frames_per_irq16 = seen.frames.saturating_mul(16) / seen.interrupts.max(1);
        let (last_rate, last_fpi16) =
            std::mem::replace(&mut self.last_rate, (rate, frames_per_irq16));
        // An interval whose frame rate or frames per interrupt moved 2× from the one before
        // saw the load change: what it counted mixes two loads (the end of a flood and the
        // start of a trickle carry a few frames per interrupt that neither has), so no trial
        // starts from it. The frame rate alone may not tell: a switch late in the interval
        // keeps the old load's rate, but the trickle's round trips, an interrupt each, divide
        // the flood's frames per interrupt, and the flood's first frames multiply the
        // trickle's.
        let steady = within_2x(rate, last_rate) && within_2x(frames_per_irq16, last_fpi16);
        self.steady_run = if steady {
            self.steady_run.saturating_add(1)
        } else {
            0
        };
        if let Some(trial) = self.rate_trial.take() {
            return self.go_on_with_rate_trial(trial, rate);
        }
        if let Some((fpi_before, rate_before)) = self.trial.take() {
            let batched = frames_per_irq16 >= fpi_before.saturating_add(fpi_before / 2);
            let kept_rate = rate >= rate_before.saturating_sub(rate_before / 10);
            if !(batched && kept_rate) {
                // Holding the interrupt did not batch more frames, or slowed the flow: undo,
                // and stop trying for a while, then until the load changes.
                self.park.fail(rate);
                return self.level.saturating_sub(1);
            }
            self.park.kept();
        }
        if self.park.holds(rate) {
            return self.level;
        }
        if self.level > 0 && rate < self.entered_at[self.level - 1] / 2 {
            return self.level - 1;
        }
        // Fast interrupts carrying a few frames each: several in flight, so holding one
        // lets more complete. With about one frame per direction per interrupt (a
        // request/response flow) there is nothing to batch, and a hold is pure latency.
        let interrupts_heavy = per_s(seen.interrupts) > IRQ_HIGH_PER_S
            && (MIN_FRAMES_PER_IRQ16..TARGET_FRAMES_PER_IRQ * 16).contains(&frames_per_irq16);
        if interrupts_heavy && steady && self.level < self.top_level() && !self.kicks.on_trial() {
            self.entered_at[self.level] = rate;
            self.trial = Some((frames_per_irq16, rate));
            return self.level + 1;
        }
        // A flood whose interrupts are few, or already carry a full batch, may still gain
        // from the first level where each interrupt costs the guest much (its wake-up, or a
        // host that emulates its kernel): what the counts cannot tell, the frame rate can.
        let batchable = seen.interrupts > 0 && frames_per_irq16 >= MIN_FRAMES_PER_IRQ16;
        if self.level == 0
            && batchable
            && self.steady_run as usize >= TRIAL_JUDGED
            && rate >= WINDOW_TRIAL_PER_S
            && self.top_level() > 0
            && self.no_other_trial()
        {
            self.start_rate_trial();
            return 1;
        }
        self.level
    }

    /// Neither a window trial nor a kick coalescing trial runs: a coalescing rate trial would
    /// judge their change as its own.
    fn no_other_trial(&self) -> bool {
        self.window_trial.is_none() && !self.kicks.on_trial()
    }

    /// The mean frame rate of the last `n` intervals (at most [`TRIAL_JUDGED`]), this one's
    /// included.
    fn recent_mean(&self, n: usize) -> u64 {
        let sum: u128 = (0..n)
            .map(|i| u128::from(self.recent[(self.recent_at + TRIAL_JUDGED - i) % TRIAL_JUDGED]))
            .sum();
        u64::try_from(sum / n.max(1) as u128).unwrap_or(u64::MAX)
    }

    /// Starts a rate trial of the first level, against the mean rate of the steady intervals
    /// just seen.
    fn start_rate_trial(&mut self) {
        let before = self.recent_mean(TRIAL_JUDGED);
        self.entered_at[0] = before;
        self.rate_trial = Some(RateTrial::new(before));
    }

    /// One interval of a running coalescing rate trial (see the module docs): the level it
    /// leaves.
    fn go_on_with_rate_trial(&mut self, mut trial: RateTrial, rate: u64) -> usize {
        let judged = trial.count(rate);
        // The load fell away under the trial (a trickle after a flood): the held interrupts
        // would only delay its round trips, so the trial ends here, failed.
        let fell = rate < trial.before / 2;
        let rate = match judged {
            _ if fell => rate,
            Some(mean) => mean,
            None => {
                self.rate_trial = Some(trial);
                return self.level;
            }
        };
        if rose_by(rate, trial.before, RATE_TRIAL_GAIN_DIV) {
            self.park.kept();
            return self.level;
        }
        self.park.fail(rate);
        0
    }
}

/// The coalescing of ladder level `level` (0: off).
fn level_bounds(level: usize) -> InterruptCoalescing {
    match level.checked_sub(1).and_then(|i| LEVELS_US.get(i)) {
        Some(&max_usecs) => InterruptCoalescing {
            max_packets: LEVEL_PACKETS,
            max_usecs,
        },
        None => InterruptCoalescing::OFF,
    }
}

#[cfg(test)]
mod tests;
