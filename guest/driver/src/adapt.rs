//! Online adaptation of the driver's knobs ([`crate::Config::adaptive`]): the transmit kick
//! threshold, the XDP_TX bulk size and the device's rx interrupt coalescing.
//!
//! The decisions are made here, by three small controllers that hold no clock, allocate
//! nothing and see the datapath only through per-interval counts. The datapath counts (a
//! counter increment per frame at most) and hands a sample over once per interval:
//!
//! - [`KickController`], once per [`TX_INTERVAL_FRAMES`] transmitted frames (copy, AF_XDP and
//!   XDP_TX together), from the kick decisions of that interval ([`TxSample`]):
//!   - *raise* (double) the threshold when at least half of the decisions notified the device
//!     (each one an exit: the device had drained what it had and went to sleep) and at least
//!     half of the publishes were cut by the threshold rather than by the end of the caller's
//!     batch (a larger threshold would merge them), and the ring never filled up;
//!   - *lower* (halve) it when more than half of the decisions were suppressed by the device
//!     (EVENT_IDX or NO_NOTIFY: it is polling the ring, so notifications cost nothing, and
//!     every frame held back for the threshold is a frame the polling device waits for), unless
//!     the ring filled up: then the device's completions hold the driver back, not its
//!     publishes, and the threshold is *raised* instead (larger publishes cost a polling device
//!     fewer cache lines and the driver fewer interrupts; on a transmit flood into a polling
//!     device, threshold 32 against 8 measured 1.05 × in co-simulation and 1.3 × in the VM);
//!     from then on a polling device no longer brings it down (a larger threshold is what
//!     lets the device keep up, so a ring that then stops filling is no reason to lower it, and
//!     lowering it again would fill the ring again: in the VM that made the threshold move
//!     13–105 times in a trial of a million frames; a caller's batch ends with a publish
//!     whatever the threshold, so a request/response flow never waits on it);
//!   - otherwise hold. Turning back (a raise after a lower or the other way round) needs the
//!     opposite verdict on two intervals in a row, so a device that changes its mind on every
//!     interval does not make the threshold flap.
//!
//!   The threshold stays within `1..=min(64, ring size / 2, kick_threshold_max)`.
//! - [`BulkController`], once per [`BULK_INTERVAL_POLLS`] rx polls that bounced frames, from
//!   the XDP_TX frames per such poll ([`BulkSample`]): the bulk rises to the next power of two at
//!   or above the average when the average exceeds it in two intervals in a row (one flush per poll
//!   instead of several; an interval that spans a switch between a trickle and a flood mixes the
//!   two and asks for a bulk neither wants), and falls to the power of two at or above the average
//!   when the average is a quarter of the bulk or less (the gap between the two rules keeps an
//!   average sitting on a power of two from flapping), never below the configured bulk (a poll
//!   flushes what it bounced anyway: a smaller bulk would only split the flush), and at the
//!   configured bulk while the device polls the ring (fewer kicks than half the publishes, the kick
//!   threshold's test: a larger bulk would only hold frames back from a device that takes them at
//!   once; a device that sleeps between polls but takes a poll's later flushes awake is kicked once
//!   a poll whatever the bulk, and in the VM's mixed load a bulk raised on kicks per poll made the
//!   device wait for each flush). Within `1..=64`. With a clock a raise is a trial: the two
//!   intervals after the one it starts in are measured, and the raise is undone if the bounced
//!   frames' rate fell by more than an eighth against the two intervals that asked for it (a
//!   larger bulk saves kicks, but the device waits for each larger flush: in co-simulation, where
//!   the two sides run on two host threads and a kick is cheap, 64 against 16 over 64 frames in
//!   flight measured 0.6 × the rate; in the VM, where a kick costs the vCPU tens of µs, the raise
//!   pays). The next raise then waits [`BULK_PARK_INTERVALS`] intervals, doubling with each raise
//!   undone in a row up to [`BULK_MAX_PARK_INTERVALS`]; a fall (the load changed) drops a trial
//!   unjudged.
//! - [`RxDim`], once per [`RX_INTERVAL_POLLS`] rx polls, from the frames received, the
//!   interrupts taken and the time elapsed ([`RxSample`]), in the way of Linux's dynamic
//!   interrupt moderation: one step through [`RX_COAL_PROFILES`] per interval at most, in the
//!   same direction while the rx rate improves (or, at an equal rate, interrupts per frame
//!   fall), back one step and park when it got worse (or the rate has fallen since the climb
//!   began), park where it stops changing. It moves towards more coalescing only while
//!   interrupts bring two frames or more but fewer than [`RX_TARGET_FRAMES_PER_IRQ`] (with one,
//!   a request/response flow, or many, there is nothing to batch). A parking lasts 4
//!   intervals, doubling with each parking up to 256 (back to 4 when a search settled on more
//!   coalescing than it started from), then ends when the load changes; a search goes towards
//!   less coalescing first, as Linux's DIM leaves its parking. A rate that moves 2× ends a
//!   parking at once (at level 0 only if the last search from there did not come back to it:
//!   a load that switches faster than a search settles would start one, two control
//!   commands, at every switch), and the search starts from the first interval whose rate
//!   holds within 2× of the one before: those around a change mix two loads (a trickle after a
//!   flood would otherwise climb on every switch, each step a control command and a delay to
//!   the trickle).
//!
//! Without a clock the interval's poll count stands in for its duration (which suits a guest
//! that polls in a loop); with one ([`crate::VirtioNet::set_adapt_clock`]) rates are per tick.

use crate::ctrl::Coalescing;

pub use crate::config::{KICK_THRESHOLD_CAP, XDP_BULK_MAX};
/// Frames transmitted per kick-threshold interval.
pub const TX_INTERVAL_FRAMES: u64 = 256;
/// Rx polls that bounced frames per XDP-bulk interval.
pub const BULK_INTERVAL_POLLS: u32 = 16;
/// Rx polls per rx-coalescing interval.
pub const RX_INTERVAL_POLLS: u32 = 64;

/// The rx coalescing levels [`RxDim`] moves through, least coalescing first: level 0 asks
/// for an interrupt per used buffer, the others for one per `max_packets` buffers or after
/// `usecs` microseconds, whichever comes first.
pub const RX_COAL_PROFILES: [Coalescing; 5] = [
    Coalescing {
        max_packets: 0,
        usecs: 0,
    },
    Coalescing {
        max_packets: 8,
        usecs: 8,
    },
    Coalescing {
        max_packets: 16,
        usecs: 32,
    },
    Coalescing {
        max_packets: 32,
        usecs: 64,
    },
    Coalescing {
        max_packets: 64,
        usecs: 128,
    },
];
/// Shortest stay in a parking, in rx intervals.
pub const RX_PARK_INTERVALS: u32 = 4;
/// Longest stay in a parking, after searches in a row that came back to it.
pub const RX_MAX_PARK_INTERVALS: u32 = 256;
/// Highest level of [`RX_COAL_PROFILES`].
pub const RX_MAX_LEVEL: u8 = RX_COAL_PROFILES.len() as u8 - 1;

/// What the transmit paths did over one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxSample {
    /// Frames added to the ring.
    pub frames: u32,
    /// Kick decisions made (publishes of at least one frame).
    pub decisions: u32,
    /// Decisions that notified the device (the rest were suppressed by it).
    pub kicks: u32,
    /// Publishes triggered by the threshold (the others ended a batch or met a full ring).
    pub threshold_cuts: u32,
    /// Times a transmit path found the ring full.
    pub ring_full: u32,
}

/// Whether the device polls the ring, from the kick decisions of an interval: fewer than half
/// of the `decisions` (publishes) notified it, the others suppressed by it (EVENT_IDX or
/// NO_NOTIFY). The kick threshold and the XDP bulk go by the same test.
pub(crate) fn device_polls(kicks: u64, decisions: u64) -> bool {
    kicks.saturating_mul(2) < decisions
}

/// A wait of a number of intervals that doubles each time it starts, from `min` up to `max`
/// (the XDP bulk's after an undone raise, the rx coalescing's parking).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Backoff {
    /// Intervals left of the current wait.
    left: u32,
    /// The next wait's length.
    next: u32,
    min: u32,
    max: u32,
}

impl Backoff {
    const fn new(min: u32, max: u32) -> Backoff {
        Backoff {
            left: 0,
            next: min,
            min,
            max,
        }
    }

    /// A wait starts; the next one will be twice as long.
    fn start(&mut self) {
        self.left = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
    }

    /// The next wait is the shortest again.
    fn reset(&mut self) {
        self.next = self.min;
    }

    /// One interval of the wait passes.
    fn tick(&mut self) {
        self.left = self.left.saturating_sub(1);
    }

    /// The wait is on.
    fn waiting(&self) -> bool {
        self.left > 0
    }
}

/// The direction of a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    Up,
    Down,
}

/// The kick threshold's controller (see the module documentation for its rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KickController {
    value: u16,
    /// The configured threshold: adaptation raises it while the device sleeps and brings it
    /// back down to here, never below (publishing more often than configured costs the
    /// driver and the device cache lines, and a polling device does not need it).
    min: u16,
    max: u16,
    /// The direction of the last change.
    last: Option<Move>,
    /// The previous interval asked to turn back; one more such interval turns.
    turn_pending: bool,
    /// The ring filled up under a polling device: the threshold was raised for it, and a
    /// polling device no longer brings it down.
    raised_on_full: bool,
}

impl KickController {
    /// Starts at `start`, bounded by `1..=min(64, ring_size / 2, max)` (at least 1).
    pub fn new(start: u16, ring_size: u16, max: u16) -> KickController {
        let max = max.min(KICK_THRESHOLD_CAP).min(ring_size / 2).max(1);
        KickController {
            value: start.clamp(1, max),
            min: start.clamp(1, max),
            max,
            last: None,
            turn_pending: false,
            raised_on_full: false,
        }
    }

    /// The threshold in use.
    pub fn value(&self) -> u16 {
        self.value
    }

    /// The largest threshold it may choose.
    pub fn max(&self) -> u16 {
        self.max
    }

    /// Takes one interval's sample; returns true if the threshold changed.
    pub fn observe(&mut self, s: &TxSample) -> bool {
        let decisions = u64::from(s.decisions);
        if decisions == 0 {
            return false;
        }
        // A hostile sample may claim more kicks or cuts than decisions: they are capped.
        let kicks = u64::from(s.kicks).min(decisions);
        let cuts = u64::from(s.threshold_cuts).min(decisions);
        let device_polls = device_polls(kicks, decisions);
        let polls_behind = device_polls && s.ring_full > 0;
        self.raised_on_full |= polls_behind;
        let verdict = if !device_polls && 2 * cuts >= decisions && s.ring_full == 0 {
            Some(Move::Up)
        } else if polls_behind {
            // The device polls, yet the ring filled: completions, not publishes, hold the
            // driver back, so no frame waits on the threshold that would not wait on the ring
            // anyway, and larger publishes save both sides cache lines and wake-ups.
            Some(Move::Up)
        } else if device_polls && !self.raised_on_full {
            Some(Move::Down)
        } else {
            None
        };
        let Some(wanted) = verdict else {
            self.turn_pending = false;
            return false;
        };
        if self.last.is_some_and(|last| last != wanted) && !self.turn_pending {
            self.turn_pending = true;
            return false;
        }
        self.turn_pending = false;
        let next = match wanted {
            Move::Up => self.value.saturating_mul(2).min(self.max),
            Move::Down => (self.value / 2).max(self.min),
        };
        if next == self.value {
            return false;
        }
        self.value = next;
        self.last = Some(wanted);
        true
    }
}

/// What the XDP_TX path did over one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BulkSample {
    /// Rx polls that bounced at least one frame.
    pub polls: u32,
    /// Frames bounced in those polls.
    pub frames: u32,
    /// The device polls the ring: fewer than half of the interval's publishes sent it a kick
    /// (a device that sleeps once between polls but takes a poll's later flushes awake takes
    /// one kick for several publishes, and a larger bulk would save it none). Then
    /// a bulk above the configured one only holds frames back from a device that would take
    /// them at once, so the bulk stays at the configured value.
    pub device_polls: bool,
    /// The interval's duration in clock ticks (0: no clock; a raise is then kept untried).
    pub elapsed: u64,
}

/// Bulk intervals a raise waits for after one that it tried and undid, at first; doubled at
/// each raise undone in a row, up to [`BULK_MAX_PARK_INTERVALS`].
pub const BULK_PARK_INTERVALS: u32 = 4;
/// Longest wait after raises undone in a row, in bulk intervals.
pub const BULK_MAX_PARK_INTERVALS: u32 = 512;
/// Intervals a raised bulk is measured over (after the one it starts in) before it is judged.
pub const BULK_TRIAL_INTERVALS: u32 = 2;

/// A raise under trial: measured against the two intervals that asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BulkTrial {
    /// The bulk before the raise, restored if the raise does not hold the rate.
    from: u16,
    /// Frames and ticks of the intervals that asked for the raise (at `from`).
    before: (u64, u64),
    /// Frames and ticks measured at the raised bulk so far (the interval of the raise, which
    /// spans it, left out).
    after: (u64, u64),
    /// Intervals seen since the raise, its own included.
    intervals: u32,
}

/// The XDP_TX bulk's controller (see the module documentation for its rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BulkController {
    value: u16,
    /// The configured bulk: the bulk follows the frames per poll upwards from it and comes
    /// back down to it, never below (a poll flushes what it bounced anyway: a smaller bulk
    /// only splits the flush).
    min: u16,
    /// The previous interval asked for a larger bulk (its frames and ticks); one more such
    /// interval raises it.
    raise_pending: Option<(u64, u64)>,
    /// A raise being measured (with a clock only).
    trial: Option<BulkTrial>,
    /// The wait before a raise may be tried again, after one that was undone.
    park: Backoff,
}

impl BulkController {
    /// Starts at `start`, bounded by `1..=64`.
    pub fn new(start: u16) -> BulkController {
        BulkController {
            value: start.clamp(1, XDP_BULK_MAX),
            min: start.clamp(1, XDP_BULK_MAX),
            raise_pending: None,
            trial: None,
            park: Backoff::new(BULK_PARK_INTERVALS, BULK_MAX_PARK_INTERVALS),
        }
    }

    /// The bulk in use.
    pub fn value(&self) -> u16 {
        self.value
    }

    /// Takes one interval's sample; returns true if the bulk changed.
    pub fn observe(&mut self, s: &BulkSample) -> bool {
        if s.polls == 0 {
            return false;
        }
        let average = if s.device_polls {
            0
        } else {
            u64::from(s.frames).div_ceil(u64::from(s.polls))
        };
        let target = average
            .clamp(u64::from(self.min), u64::from(XDP_BULK_MAX))
            .next_power_of_two()
            .min(u64::from(XDP_BULK_MAX)) as u16;
        let value = u64::from(self.value);
        let this = (u64::from(s.frames), s.elapsed);
        self.park.tick();
        // (At the largest bulk an average above it asks for nothing.)
        let raise = u64::from(target) > value;
        if !raise && average.saturating_mul(4) <= value {
            // A quarter of the bulk or less a poll: the load changed, and a raise under trial
            // is dropped unjudged with it.
            self.trial = None;
            self.raise_pending = None;
            return self.set(target);
        }
        if self.trial.is_some() {
            return self.judge(this);
        }
        // A raise needs two intervals in a row that ask for it: one that spans a switch from
        // a trickle (one frame a poll, each poll kicking a device that slept) to a flood (many
        // frames a poll, a device that polls) asks for one that neither load wants.
        let first = core::mem::replace(&mut self.raise_pending, raise.then_some(this));
        let Some(first) = first.filter(|_| raise && !self.park.waiting()) else {
            return false;
        };
        self.raise_pending = None;
        if this.1 > 0 && first.1 > 0 {
            self.trial = Some(BulkTrial {
                from: self.value,
                before: (first.0 + this.0, first.1.saturating_add(this.1)),
                after: (0, 0),
                intervals: 0,
            });
        }
        self.set(target)
    }

    /// One interval of a raise under trial: after [`BULK_TRIAL_INTERVALS`] (the raise's own
    /// not counted), the raise stays if the bounced frames' rate held within an eighth of the
    /// one that asked for it, and is undone otherwise (the device then waits for each larger
    /// flush longer than the kicks it saves cost: on two host threads, a bulk of 64 over 64
    /// frames in flight measured 0.6 × the rate at 16), with the next raise parked.
    fn judge(&mut self, this: (u64, u64)) -> bool {
        let Some(t) = self.trial.as_mut() else {
            return false;
        };
        t.intervals += 1;
        if t.intervals == 1 {
            return false;
        }
        t.after = (t.after.0 + this.0, t.after.1.saturating_add(this.1));
        if t.intervals <= BULK_TRIAL_INTERVALS {
            return false;
        }
        let t = *t;
        self.trial = None;
        // after / after_ticks ≥ 7/8 · before / before_ticks, cross-multiplied.
        let after = u128::from(t.after.0) * u128::from(t.before.1);
        let before = u128::from(t.before.0) * u128::from(t.after.1);
        if after.saturating_mul(8) >= before.saturating_mul(7) {
            self.park.reset();
            return false;
        }
        self.park.start();
        self.set(t.from)
    }

    fn set(&mut self, value: u16) -> bool {
        let changed = value != self.value;
        self.value = value;
        changed
    }
}

/// What the receive path saw over one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxSample {
    /// Frames received.
    pub frames: u64,
    /// Interrupts taken.
    pub interrupts: u64,
    /// The interval's duration: clock ticks, or rx polls without a clock (0 is taken as 1).
    pub elapsed: u64,
}

/// How one interval compares with the reference one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// A significantly higher rate, or at the same rate fewer interrupts per frame.
    Better,
    /// Neither better nor worse.
    Same,
    /// A significantly lower rate, or at the same rate more interrupts per frame.
    Worse,
}

/// `a` against `b` with more than a 10 % difference counting (relative to `b`).
fn significant(a: u128, b: u128) -> core::cmp::Ordering {
    let diff = a.abs_diff(b);
    // `diff > b / 10` is `10 · diff > b` without the overflow (the products of two u64).
    if diff > b / 10 && diff > 0 {
        a.cmp(&b)
    } else {
        core::cmp::Ordering::Equal
    }
}

/// The rate of `curr` against that of `prev` (frames per elapsed, cross-multiplied).
fn rate_order(curr: &RxSample, prev: &RxSample) -> core::cmp::Ordering {
    let (ce, pe) = (
        u128::from(curr.elapsed.max(1)),
        u128::from(prev.elapsed.max(1)),
    );
    significant(u128::from(curr.frames) * pe, u128::from(prev.frames) * ce)
}

/// Frames per interrupt under which more coalescing is worth trying (as the device's ladder).
pub const RX_TARGET_FRAMES_PER_IRQ: u64 = 16;

/// Interrupts carry fewer than [`RX_TARGET_FRAMES_PER_IRQ`] frames: coalescing could batch.
fn wants_more(s: &RxSample) -> bool {
    // Two frames per interrupt at least (with one a request/response flow has nothing to
    // batch, and a hold is pure latency), and fewer than the target.
    s.interrupts > 0
        && s.frames >= s.interrupts.saturating_mul(2)
        && s.frames < s.interrupts.saturating_mul(RX_TARGET_FRAMES_PER_IRQ)
}

/// The rx rate moved by more than 2× either way.
fn rate_changed_2x(curr: &RxSample, prev: &RxSample) -> bool {
    let c = u128::from(curr.frames) * u128::from(prev.elapsed.max(1));
    let p = u128::from(prev.frames) * u128::from(curr.elapsed.max(1));
    c > p.saturating_mul(2) || p > c.saturating_mul(2)
}

fn compare(curr: &RxSample, prev: &RxSample) -> Verdict {
    use core::cmp::Ordering::*;
    match rate_order(curr, prev) {
        Greater => return Verdict::Better,
        Less => return Verdict::Worse,
        Equal => {}
    }
    if curr.frames == 0 || prev.frames == 0 {
        return Verdict::Same;
    }
    // Interrupts per frame, cross-multiplied; fewer is better.
    match significant(
        u128::from(curr.interrupts) * u128::from(prev.frames),
        u128::from(prev.interrupts) * u128::from(curr.frames),
    ) {
        Less => Verdict::Better,
        Greater => Verdict::Worse,
        Equal => Verdict::Same,
    }
}

/// Where [`RxDim`] is in its search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Search {
    /// No sample yet: the next one becomes the reference.
    Start,
    /// A new load (the rate moved 2×): the search starts from the first sample whose rate
    /// holds within 2× of the one before it (a switch may take more than one interval to
    /// pass, a flood's drain between it and a trickle, say).
    NewLoad,
    /// Stepping through the levels in one direction.
    Moving { dir: Move },
    /// Stepped back after a worse interval: the next sample, measured at the restored level,
    /// becomes the parking reference.
    Settling,
    /// Parked at a level, against the sample measured there.
    Parked,
}

/// The rx coalescing controller: Linux-style dynamic interrupt moderation over
/// [`RX_COAL_PROFILES`] (see the module documentation for its rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxDim {
    level: u8,
    search: Search,
    /// The sample compared against: the previous one while moving, the one measured at the
    /// parking level while parked.
    reference: RxSample,
    /// Where the current climb towards more coalescing began: each step is compared with the
    /// interval before it, and the climb also with this one, so that steps each too small to
    /// count cannot add up to a loss.
    origin: RxSample,
    /// The parking's shortest stay: doubles with each parking, so that noise cannot keep the
    /// search (and its control commands) going; back to the shortest when a search settled on
    /// more coalescing than it started from (coalescing pays on this load).
    park: Backoff,
    /// The level the current (or last) search started from, and whether it has moved since.
    search_from: u8,
    moved: bool,
    /// The last search from level 0 came back to it: coalescing did not pay on that load.
    fruitless: bool,
}

impl Default for RxDim {
    fn default() -> Self {
        RxDim::new()
    }
}

impl RxDim {
    /// Starts at level 0 (no coalescing, the device's default), before any sample.
    pub fn new() -> RxDim {
        RxDim {
            level: 0,
            search: Search::Start,
            reference: RxSample::default(),
            origin: RxSample::default(),
            park: Backoff::new(RX_PARK_INTERVALS, RX_MAX_PARK_INTERVALS),
            search_from: 0,
            moved: false,
            fruitless: false,
        }
    }

    /// The current level (an index into [`RX_COAL_PROFILES`]).
    pub fn level(&self) -> u8 {
        self.level
    }

    /// The coalescing of the current level.
    pub fn profile(&self) -> Coalescing {
        RX_COAL_PROFILES[usize::from(self.level.min(RX_MAX_LEVEL))]
    }

    /// True while parked (settled).
    pub fn is_parked(&self) -> bool {
        self.search == Search::Parked
    }

    /// Takes one interval's sample (measured at the current level); returns true if the level
    /// changed (at most by one).
    pub fn observe(&mut self, curr: &RxSample) -> bool {
        let before = self.level;
        match self.search {
            Search::Start => self.begin(curr),
            Search::NewLoad if rate_changed_2x(curr, &self.reference) => self.reference = *curr,
            Search::NewLoad => self.begin(curr),
            Search::Moving { dir } => match compare(curr, &self.reference) {
                Verdict::Better
                    if dir == Move::Up
                        && rate_order(curr, &self.origin) == core::cmp::Ordering::Less =>
                {
                    // Fewer interrupts per frame, but the rate has fallen since the climb
                    // began: go back a level and park.
                    self.move_level(Move::Down);
                    self.search = Search::Settling;
                }
                Verdict::Better if dir == Move::Up && !wants_more(curr) => self.park(curr),
                Verdict::Better => self.step(dir, curr),
                Verdict::Same => self.park(curr),
                Verdict::Worse => {
                    // The level before was better: go back to it and park there.
                    let back = match dir {
                        Move::Up => Move::Down,
                        Move::Down => Move::Up,
                    };
                    self.move_level(back);
                    self.search = Search::Settling;
                }
            },
            Search::Settling => self.park(curr),
            // Above level 0 a new load may be one the hold delays: the search starts at once.
            // At level 0 it only risks latency, and after a search that came back to 0 it waits
            // for the parking to run out (a load that switches faster than the intervals
            // would otherwise start a search, two control commands, at every switch).
            Search::Parked
                if rate_changed_2x(curr, &self.reference)
                    && !(self.level == 0 && self.fruitless) =>
            {
                // A new load. The interval that saw the change holds some of each load: the
                // search starts from a steady sample of the new one (a request/response flow
                // that alternates with floods would otherwise climb on every switch, and every
                // step is a control command and a delay).
                self.reference = *curr;
                self.search = Search::NewLoad;
            }
            Search::Parked if self.park.waiting() => self.park.tick(),
            Search::Parked => {
                // The load changed: search again, towards less coalescing first (as Linux's
                // DIM leaves its parking), unless there is none to remove.
                if compare(curr, &self.reference) != Verdict::Same {
                    self.leave_parking(self.open_direction(Move::Down), curr);
                }
            }
        }
        self.level != before
    }

    /// Starts a search from `curr`, a sample with nothing to compare with: towards less
    /// coalescing if there is any (as Linux's DIM leaves its parking: a new load may be one the
    /// hold only delays), else towards more if interrupts carry few frames, else parks.
    fn begin(&mut self, curr: &RxSample) {
        let dir = if self.level > 0 {
            Move::Down
        } else if wants_more(curr) {
            Move::Up
        } else {
            self.park(curr);
            return;
        };
        self.search_towards(dir, curr);
    }

    /// `dir`, or the other way when the table ends in that direction.
    fn open_direction(&self, dir: Move) -> Move {
        match dir {
            Move::Up if self.level == RX_MAX_LEVEL => Move::Down,
            Move::Down if self.level == 0 => Move::Up,
            _ => dir,
        }
    }

    fn leave_parking(&mut self, dir: Move, curr: &RxSample) {
        if dir == Move::Up && !wants_more(curr) {
            // Interrupts already carry many frames: nothing to gain, stay.
            self.park(curr);
            return;
        }
        self.search_towards(dir, curr);
    }

    /// A search from the current level in `dir`, `curr` its origin: the first step now.
    fn search_towards(&mut self, dir: Move, curr: &RxSample) {
        self.search = Search::Moving { dir };
        self.origin = *curr;
        self.search_from = self.level;
        self.moved = false;
        self.step(dir, curr);
    }

    fn park(&mut self, curr: &RxSample) {
        self.fruitless = self.level == 0 && self.search_from == 0 && self.moved;
        if self.level > self.search_from {
            // More coalescing paid on this load: searches may come often again.
            self.park.reset();
        }
        self.moved = false;
        self.reference = *curr;
        self.search = Search::Parked;
        self.park.start();
    }

    /// One step in `dir` with `curr` as the new reference; parks at the edge of the table.
    /// A search only moves one way from where it left parking, so it parks after at most
    /// [`RX_MAX_LEVEL`] steps.
    fn step(&mut self, dir: Move, curr: &RxSample) {
        if self.move_level(dir) {
            self.reference = *curr;
        } else {
            self.park(curr);
        }
    }

    /// Moves one level in `dir`; false at the edge.
    fn move_level(&mut self, dir: Move) -> bool {
        match dir {
            Move::Up if self.level < RX_MAX_LEVEL => self.level += 1,
            Move::Down if self.level > 0 => self.level -= 1,
            _ => return false,
        }
        self.moved = true;
        true
    }
}
