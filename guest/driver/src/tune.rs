//! The datapath side of [`crate::Config::adaptive`]: the per-interval counts the controllers
//! of [`crate::adapt`] are fed with, and applying what they decide (the send queue's kick
//! threshold and XDP_TX bulk; the device's rx coalescing, over the control queue).
//!
//! Per frame the datapath pays at most a counter increment (an XDP_TX bounce, a threshold
//! cut); the interval checks run once per publish (transmit) and once per rx poll.

use crate::adapt::{
    BulkController, BulkSample, KickController, RxDim, RxSample, TxSample, BULK_INTERVAL_POLLS,
    RX_INTERVAL_POLLS, TX_INTERVAL_FRAMES,
};
use crate::config::Config;
use crate::ctrl::Coalescing;
use crate::features::{NET_F_CTRL_VQ, NET_F_NOTF_COAL, NET_F_VQ_NOTF_COAL};
use crate::hal::Hal;
use crate::mq::rx_queue;
use crate::net::VirtioNet;
use crate::queue::{SendQueue, SendStats};
use crate::transport::Transport;

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
    /// Kicks sent when the current bulk interval started.
    bulk_kicks_mark: u64,
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
            bulk_kicks_mark: 0,
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
    /// [`BULK_INTERVAL_POLLS`] polls that bounced frames.
    fn tune_bulk(&mut self) {
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
        // A device that sleeps between polls takes a kick for most of them; one that polls
        // the ring takes few.
        let kicks_now = TxMark::of(&self.stats).kicks;
        let kicks = kicks_now.wrapping_sub(t.bulk_kicks_mark);
        t.bulk_kicks_mark = kicks_now;
        s.device_polls = kicks.saturating_mul(2) < u64::from(s.polls);
        if t.bulk.observe(s) {
            t.bulk_changes += 1;
            self.xdp_bulk = t.bulk.value();
        }
        t.bulk_sample = BulkSample::default();
    }
}

/// How the rx coalescing is set on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CoalCommand {
    /// NOTF_COAL RX_SET: every rx queue at once.
    RxSet,
    /// NOTF_COAL VQ_SET on each rx queue.
    VqSet,
}

/// The device-wide rx coalescing adaptation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RxTuning {
    dim: RxDim,
    command: CoalCommand,
    /// False once the device refused a command (or did not answer): adaptation stops there.
    active: bool,
    /// Rx polls in the current interval.
    polls: u32,
    /// Rx frames, interrupts and clock at the start of the current interval.
    start: (u64, u64, u64),
    /// The level the device last accepted (0, its default, before any command).
    applied: u8,
    pub(crate) changes: u64,
    pub(crate) errors: u64,
}

impl RxTuning {
    /// The adaptation for a device with `features`, if it can set rx coalescing.
    pub(crate) fn new(features: u64) -> Option<RxTuning> {
        if features & NET_F_CTRL_VQ == 0 {
            return None;
        }
        let command = if features & NET_F_NOTF_COAL != 0 {
            CoalCommand::RxSet
        } else if features & NET_F_VQ_NOTF_COAL != 0 {
            CoalCommand::VqSet
        } else {
            return None;
        };
        Some(RxTuning {
            dim: RxDim::new(),
            command,
            active: true,
            polls: 0,
            start: (0, 0, 0),
            applied: 0,
            changes: 0,
            errors: 0,
        })
    }

    /// The level in use on the device.
    pub(crate) fn level(&self) -> u8 {
        self.applied
    }
}

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// Measures rx adaptation intervals against `now` (clock ticks, any monotonic unit)
    /// instead of rx polls: rates are then frames per tick. Give one when the guest does not
    /// poll in a loop (a guest that halts between interrupts polls in bursts).
    pub fn set_adapt_clock(&mut self, now: Option<fn() -> u64>) {
        self.adapt_clock = now;
        // Restart the interval in the new unit.
        let start = self.rx_mark();
        if let Some(t) = self.rx_tuning.as_mut() {
            t.start = start;
            t.polls = 0;
        }
    }

    /// The end of an rx poll: closes the adaptation intervals that are complete.
    pub(crate) fn tune_after_poll(&mut self) {
        self.sq.tune_bulk();
        let Some(t) = self.rx_tuning.as_mut() else {
            return;
        };
        if !t.active {
            return;
        }
        t.polls += 1;
        if t.polls < RX_INTERVAL_POLLS {
            return;
        }
        let (frames, interrupts, clock) = self.rx_mark();
        let Some(t) = self.rx_tuning.as_mut() else {
            return;
        };
        let elapsed = match self.adapt_clock {
            Some(_) => clock.wrapping_sub(t.start.2),
            None => u64::from(t.polls),
        };
        let sample = RxSample {
            frames: frames.wrapping_sub(t.start.0),
            interrupts: interrupts.wrapping_sub(t.start.1),
            elapsed,
        };
        t.start = (frames, interrupts, clock);
        t.polls = 0;
        if t.dim.observe(&sample) {
            let (command, profile) = (t.command, t.dim.profile());
            self.apply_rx_coalescing(command, profile);
        }
    }

    /// Rx frames (all pairs), interrupts and the clock (0 without one), now.
    fn rx_mark(&self) -> (u64, u64, u64) {
        let frames = self.summed_stats().1.frames;
        (
            frames,
            self.interrupts,
            self.adapt_clock.map_or(0, |now| now()),
        )
    }

    /// Sends the new rx coalescing to the device; a refusal (or no answer) stops the
    /// adaptation, counted in `rx_coal_errors`.
    fn apply_rx_coalescing(&mut self, command: CoalCommand, c: Coalescing) {
        let result = match command {
            CoalCommand::RxSet => self.set_rx_coalescing(c.max_packets, c.usecs),
            CoalCommand::VqSet => (0..self.active_queue_pairs()).try_for_each(|pair| {
                self.set_vq_coalescing(rx_queue(pair), c.max_packets, c.usecs)
            }),
        };
        if let Some(t) = self.rx_tuning.as_mut() {
            match result {
                Ok(()) => {
                    t.changes += 1;
                    t.applied = t.dim.level();
                }
                Err(_) => {
                    t.errors += 1;
                    t.active = false;
                }
            }
        }
    }

    /// (kick threshold, XDP bulk, rx coalescing level) in use on the current pair, and the
    /// changes of each summed over the pairs, and the rx coalescing commands that failed.
    pub(crate) fn adapt_counters(&self) -> ([u16; 2], u8, [u64; 3], u64) {
        let mut changes = [0u64; 3];
        for sq in core::iter::once(&self.sq).chain(self.mq.parked().map(|p| &p.sq)) {
            if let Some(t) = &sq.tuning {
                changes[0] += t.kick_changes;
                changes[1] += t.bulk_changes;
            }
        }
        let (level, errors) = match &self.rx_tuning {
            Some(t) => {
                changes[2] = t.changes;
                (t.level(), t.errors)
            }
            None => (0, 0),
        };
        (
            [self.sq.kick_threshold, self.sq.xdp_bulk],
            level,
            changes,
            errors,
        )
    }
}
