//! The phases of [`Workload::Mixed`](crate::workloads::Workload::Mixed), the co-simulation's
//! counterpart of the driver guest's `mixed=N window=W phase_us=P`: the request/response loop
//! alternating between a **flood** (W frames in flight: throughput) and a **trickle** (one
//! frame in flight: latency), each phase lasting P on the host clock. The rules are the
//! guest's (`guest/baremetal/src/mixed.rs`):
//! - A frame's round trip counts toward the phase it was sent in.
//! - A flood sends no new frame once its time is up; its frames in flight then drain, counted
//!   toward the flood, and the last one's buffer carries the first trickle frame: the trickle's
//!   time starts then.
//! - The frame that returns after the trickle's time is up carries the next flood's first
//!   frame, and W − 1 more are due by copy: the flood's time starts then.
//! - The flood rate is the flood frames over the floods' time, each flood from its start to
//!   its last flood frame back.
//!
//! This module keeps the phase and the flood's figures; the frames in flight (and the
//! trickle's round trips) are [`PingPong`](crate::workloads::PingPong)'s. Only what happens
//! from `record_from` on (after a warm-up) counts toward the flood rate.

use std::time::{Duration, Instant};

/// Which phase the loop is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// W frames in flight.
    Flood,
    /// The flood's time is up: its frames come back and none is sent.
    Drain,
    /// One frame in flight.
    Trickle,
}

/// The phase schedule of a mixed run, and what its floods did.
#[derive(Clone, Debug)]
pub struct Phases {
    window: u32,
    length: Duration,
    phase: Phase,
    /// When the current phase's time is up (flood, trickle).
    end: Instant,
    flood_start: Instant,
    flood_last: Instant,
    record_from: Instant,
    /// Flood round trips from `record_from` on.
    flood_frames: u64,
    /// Closed floods' time from `record_from` on.
    flood_time: Duration,
    phases: u64,
    /// Frames due by copy (each later flood's top-up).
    owed: u32,
}

impl Phases {
    /// Floods of `window` frames in flight (at least 1) and phases of `length`, starting with
    /// a flood at `now` (its first window is the caller's to send); flood frames and time
    /// count from `record_from` on.
    pub fn new(window: u32, length: Duration, now: Instant, record_from: Instant) -> Phases {
        Phases {
            window: window.max(1),
            length,
            phase: Phase::Flood,
            end: now + length,
            flood_start: now,
            flood_last: now,
            record_from,
            flood_frames: 0,
            flood_time: Duration::ZERO,
            phases: 1,
            owed: 0,
        }
    }

    /// The phase the loop is in.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// A frame sent now belongs to a flood.
    pub fn flooding(&self) -> bool {
        self.phase == Phase::Flood
    }

    /// A frame in flight came back at `now`: `flood` says it was sent during a flood,
    /// `in_flight` counts the frames still out, `more` says frames remain to be sent. Returns
    /// whether to answer it with the next frame (in its buffer).
    pub fn returned(&mut self, flood: bool, in_flight: usize, now: Instant, more: bool) -> bool {
        if flood {
            self.flood_last = now;
            if now >= self.record_from {
                self.flood_frames += 1;
            }
        }
        match self.phase {
            Phase::Flood if now < self.end => {}
            Phase::Flood | Phase::Drain => {
                self.phase = Phase::Drain;
                if in_flight > 0 {
                    return false;
                }
                self.flood_time += self.open_flood();
                self.flood_start = self.flood_last;
                if more {
                    self.begin(Phase::Trickle, now);
                }
            }
            Phase::Trickle if now < self.end => {}
            Phase::Trickle => {
                if more {
                    self.begin(Phase::Flood, now);
                    (self.flood_start, self.flood_last) = (now, now);
                    self.owed = self.window - 1;
                }
            }
        }
        more
    }

    fn begin(&mut self, phase: Phase, now: Instant) {
        self.phase = phase;
        self.end = now + self.length;
        self.phases += 1;
    }

    /// The current flood's time so far (from `record_from` on; zero once closed).
    fn open_flood(&self) -> Duration {
        let start = self.flood_start.max(self.record_from);
        self.flood_last.saturating_duration_since(start)
    }

    /// Frames due by copy now (a new flood's top-up to its window); taking them settles them.
    pub fn take_owed(&mut self) -> u32 {
        std::mem::take(&mut self.owed)
    }

    /// An answer [`Phases::returned`] asked for could not be sent in its buffer: it is due by
    /// copy instead.
    pub fn owe(&mut self) {
        self.owed += 1;
    }

    /// Phases begun, floods and trickles.
    pub fn phases(&self) -> u64 {
        self.phases
    }

    /// Flood round trips per second (from `record_from` on), `None` before any.
    pub fn flood_pps(&self) -> Option<f64> {
        let mut time = self.flood_time;
        if self.phase != Phase::Trickle {
            time += self.open_flood();
        }
        (self.flood_frames > 0 && !time.is_zero())
            .then(|| self.flood_frames as f64 / time.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_micros(n)
    }

    #[test]
    fn flood_drains_before_the_trickle_and_the_trickle_tops_up_the_flood() {
        let t0 = Instant::now();
        let mut p = Phases::new(4, Duration::from_micros(100), t0, t0);
        assert!(p.flooding());
        // Within the flood: answered.
        assert!(p.returned(true, 3, us(t0, 10), true));
        // Time up: the three others drain, none answered, until the last.
        assert!(!p.returned(true, 3, us(t0, 100), true));
        assert_eq!(p.phase(), Phase::Drain);
        assert!(!p.returned(true, 2, us(t0, 110), true));
        assert!(!p.returned(true, 1, us(t0, 120), true));
        assert!(p.returned(true, 0, us(t0, 150), true));
        assert_eq!((p.phase(), p.phases()), (Phase::Trickle, 2));
        assert_eq!(p.take_owed(), 0, "one frame in flight");
        // 5 flood frames in 150 µs.
        let pps = p.flood_pps().unwrap();
        assert!((pps - 5.0 / 150e-6).abs() < 1.0, "{pps}");
        // Trickle frames: answered until its time (150 + 100) is up; the one back after that
        // starts the flood, with W − 1 more due by copy.
        assert!(p.returned(false, 0, us(t0, 200), true));
        assert_eq!(p.phase(), Phase::Trickle);
        assert!(p.returned(false, 0, us(t0, 260), true));
        assert_eq!((p.phase(), p.phases()), (Phase::Flood, 3));
        assert_eq!(p.take_owed(), 3);
        assert_eq!(p.take_owed(), 0, "taken once");
        // Trickle frames add nothing to the flood.
        assert!((p.flood_pps().unwrap() - pps).abs() < 1.0);
        // The new flood's frames: 2 more in 40 µs of flood.
        assert!(p.returned(true, 3, us(t0, 280), true));
        assert!(p.returned(true, 3, us(t0, 300), true));
        let pps = p.flood_pps().unwrap();
        assert!((pps - 7.0 / 190e-6).abs() < 1.0, "{pps}");
    }

    #[test]
    fn nothing_more_to_send_ends_the_phases() {
        let t0 = Instant::now();
        let mut p = Phases::new(2, Duration::from_micros(100), t0, t0);
        assert!(!p.returned(true, 1, us(t0, 10), false));
        assert!(!p.returned(true, 0, us(t0, 200), false));
        assert_eq!(p.phases(), 1, "no trickle begun without frames to send");
        let mut answer = Phases::new(1, Duration::from_micros(100), t0, t0);
        answer.owe();
        assert_eq!(answer.take_owed(), 1);
    }

    #[test]
    fn the_warm_up_counts_toward_nothing() {
        let t0 = Instant::now();
        let mut p = Phases::new(2, Duration::from_micros(1000), t0, us(t0, 500));
        assert!(p.returned(true, 1, us(t0, 100), true));
        assert_eq!(p.flood_pps(), None);
        assert!(p.returned(true, 1, us(t0, 600), true));
        assert!(p.returned(true, 1, us(t0, 700), true));
        // Two frames in the 200 µs from the warm-up's end.
        let pps = p.flood_pps().unwrap();
        assert!((pps - 2.0 / 200e-6).abs() < 1.0, "{pps}");
    }
}
