//! Applying the rx coalescing adaptation from [`VirtioNet`] (see [`crate::adapt`]).

use crate::adapt::{RxSample, RX_INTERVAL_POLLS};
use crate::ctrl::Coalescing;
use crate::hal::Hal;
use crate::mq::rx_queue;
use crate::net::VirtioNet;
use crate::transport::Transport;
use crate::tune::CoalCommand;

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
        if let Some(t) = self.sq.tuning.as_mut() {
            t.bulk_start = None;
        }
    }

    /// The end of an rx poll: closes the adaptation intervals that are complete.
    pub(crate) fn tune_after_poll(&mut self) {
        self.sq.tune_bulk(self.adapt_clock);
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
