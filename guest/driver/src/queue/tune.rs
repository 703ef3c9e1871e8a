//! A send queue's adaptation state and the interval checks that feed it (see [`crate::adapt`]).

use crate::adapt::{
    device_polls, BulkController, BulkSample, KickController, TxSample, BULK_INTERVAL_POLLS,
    TX_INTERVAL_FRAMES,
};
use crate::config::Config;
use crate::queue::{SendQueue, SendStats};

/// The send-queue counters an interval is measured from.
#[derive(Clone, Copy, Debug, Default)]
struct TxMark {
    frames: u64,
    decisions: u64,
    kicks: u64,
    ring_full: u64,
}

impl TxMark {
    fn of(s: &SendStats) -> TxMark {
        TxMark {
            frames: s.frames + s.xdp_tx,
            decisions: s.kicks + s.kicks_suppressed + s.kicks_suppressed_no_notify,
            kicks: s.kicks,
            ring_full: s.ring_full,
        }
    }
}

/// Clamps a count to the `u32` of a sample.
fn count(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A send queue's adaptation state: its two controllers and the current interval's counts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxTuning {
    kick: KickController,
    bulk: BulkController,
    /// Where the current kick-threshold interval started.
    mark: TxMark,
    /// Publishes the threshold triggered in the current interval.
    pub(crate) threshold_cuts: u64,
    /// Frames bounced (XDP_TX) since the end of the last rx poll.
    pub(crate) bounced: u64,
    /// Rx polls that bounced frames, and those frames, in the current bulk interval.
    bulk_sample: BulkSample,
    /// Where the current bulk interval started, and when (the adaptation clock's reading;
    /// None: no clock, or no reading yet).
    bulk_mark: TxMark,
    pub(crate) bulk_start: Option<u64>,
    /// Changes of the kick threshold and of the bulk.
    pub(crate) kick_changes: u64,
    pub(crate) bulk_changes: u64,
}

impl TxTuning {
    pub(crate) fn new(config: &Config, ring_size: u16) -> TxTuning {
        TxTuning {
            kick: KickController::new(config.kick_threshold, ring_size, config.kick_threshold_max),
            bulk: BulkController::new(config.xdp_bulk),
            mark: TxMark::default(),
            threshold_cuts: 0,
            bounced: 0,
            bulk_sample: BulkSample::default(),
            bulk_mark: TxMark::default(),
            bulk_start: None,
            kick_changes: 0,
            bulk_changes: 0,
        }
    }

    pub(crate) fn kick_threshold(&self) -> u16 {
        self.kick.value()
    }

    pub(crate) fn xdp_bulk(&self) -> u16 {
        self.bulk.value()
    }
}

impl SendQueue {
    /// Closes the kick-threshold interval if [`TX_INTERVAL_FRAMES`] frames went out since it
    /// started, and applies the controller's decision.
    pub(crate) fn tune_tx(&mut self) {
        let now = TxMark::of(&self.stats);
        let Some(t) = self.tuning.as_mut() else {
            return;
        };
        if now.frames.wrapping_sub(t.mark.frames) < TX_INTERVAL_FRAMES {
            return;
        }
        let sample = TxSample {
            frames: count(now.frames.wrapping_sub(t.mark.frames)),
            decisions: count(now.decisions.wrapping_sub(t.mark.decisions)),
            kicks: count(now.kicks.wrapping_sub(t.mark.kicks)),
            threshold_cuts: count(t.threshold_cuts),
            ring_full: count(now.ring_full.wrapping_sub(t.mark.ring_full)),
        };
        if t.kick.observe(&sample) {
            t.kick_changes += 1;
            self.kick_threshold = t.kick.value();
        }
        t.mark = now;
        t.threshold_cuts = 0;
    }

    /// Counts an rx poll's bounces into the bulk interval and closes it after
    /// [`BULK_INTERVAL_POLLS`] polls that bounced frames, timed by `clock` if there is one.
    pub(crate) fn tune_bulk(&mut self, clock: Option<fn() -> u64>) {
        let Some(t) = self.tuning.as_mut() else {
            return;
        };
        if t.bounced == 0 {
            return;
        }
        let s = &mut t.bulk_sample;
        s.polls += 1;
        s.frames = s.frames.saturating_add(count(t.bounced));
        t.bounced = 0;
        if s.polls < BULK_INTERVAL_POLLS {
            return;
        }
        // A device that sleeps as soon as it has drained a flush takes a kick for most
        // publishes; one that polls the ring (or stays awake between the flushes of a poll)
        // takes few: the kick threshold's test.
        let now = TxMark::of(&self.stats);
        let kicks = now.kicks.wrapping_sub(t.bulk_mark.kicks);
        let decisions = now.decisions.wrapping_sub(t.bulk_mark.decisions);
        t.bulk_mark = now;
        s.device_polls = device_polls(kicks, decisions);
        let tick = clock.map(|now| now());
        s.elapsed = match (t.bulk_start, tick) {
            (Some(start), Some(end)) => end.wrapping_sub(start),
            _ => 0,
        };
        t.bulk_start = tick;
        if t.bulk.observe(s) {
            t.bulk_changes += 1;
            self.xdp_bulk = t.bulk.value();
        }
        t.bulk_sample = BulkSample::default();
    }
}
