//! The phases of `mixed=N window=W phase_us=P`: the request/response loop of `pingpong=`
//! alternating between a **flood** (W frames in flight: throughput) and a **trickle** (one
//! frame in flight: latency), each phase lasting P on the TSC.
//!
//! The rules, in TSC cycles (the caller converts `phase_us=`):
//! - The run starts with a flood: `min(W, N)` frames are due by copy ([`Mixed::due`]).
//! - A frame's round trip counts toward the phase it was sent in: a flood frame adds to the
//!   flood's frames, a trickle frame's round trip is recorded in the trickle histogram.
//! - A flood phase sends no new frame once its time is up; it then **drains**: every flood
//!   frame still in flight comes back and is counted toward the flood before the trickle
//!   starts. The last one's buffer carries the first trickle frame, and the trickle's time
//!   starts then.
//! - A trickle phase answers each returned frame with the next one until its time is up; the
//!   frame that returns after that carries the next flood's first frame, and `W − 1` more are
//!   due by copy: the flood's time starts then.
//! - The flood rate is the flood frames over the floods' time: each from its start to its last
//!   flood frame back.
//!
//! Nothing here reads the TSC: every call takes `now`, so the logic is tested on the host.

use crate::latency::{Histogram, RoundTrips};

/// Which phase the loop is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// W frames in flight, each returned one answered with the next.
    Flood,
    /// The flood's time is up: its frames come back and none is sent.
    Drain,
    /// One frame in flight.
    Trickle,
}

/// One frame in flight.
#[derive(Clone, Copy, Debug)]
struct Slot {
    seq: u32,
    sent_at: u64,
    /// Sent during a flood (its round trip counts toward the flood).
    flood: bool,
}

/// What the floods did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flood {
    /// Phases begun, floods and trickles.
    pub phases: u64,
    /// Round trips of flood frames (drained ones included).
    pub frames: u64,
    /// TSC cycles of the floods: each from its start to its last flood frame back.
    pub cycles: u64,
}

/// The state of a `mixed=` run.
pub struct Mixed {
    window: u32,
    phase_cycles: u64,
    limit: u64,
    phase: Phase,
    /// When the current phase's time is up (Flood, Trickle).
    phase_end: u64,
    /// When the current (or last) flood started.
    flood_start: u64,
    /// When the last flood frame came back.
    flood_last: u64,
    slots: alloc::vec::Vec<Option<Slot>>,
    in_flight: u32,
    /// Frames due by copy (the first window, the top-up of each later flood).
    owed: u32,
    sent: u64,
    bad: u64,
    flood: Flood,
    trickle: Histogram,
}

impl Mixed {
    /// A run of `limit` frames in all, `window` (1..) in flight during a flood, phases of
    /// `phase_cycles`, starting with a flood at `now`.
    pub fn new(window: u32, phase_cycles: u64, limit: u64, now: u64) -> Mixed {
        let window = window.max(1);
        Mixed {
            window,
            phase_cycles,
            limit,
            phase: Phase::Flood,
            phase_end: now.saturating_add(phase_cycles),
            flood_start: now,
            flood_last: now,
            slots: alloc::vec![None; window as usize],
            in_flight: 0,
            owed: u32::try_from(limit.min(u64::from(window))).unwrap_or(window),
            sent: 0,
            bad: 0,
            flood: Flood {
                phases: 1,
                ..Flood::default()
            },
            trickle: Histogram::new(),
        }
    }

    /// The phase the loop is in.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The sequence number of the next frame to send by copy now, if one is due; once it is
    /// queued, call [`Mixed::queued`] (a frame the ring did not take stays due).
    pub fn due(&self) -> Option<u32> {
        (self.owed > 0 && self.sent < self.limit).then_some(self.sent as u32)
    }

    /// The frame of `seq` (the number [`Mixed::due`] or [`Mixed::returned`] gave) was queued
    /// at `now`; `copy`: sent by copy (it settles one frame due).
    pub fn queued(&mut self, seq: u32, now: u64, copy: bool) {
        let Some(free) = self.slots.iter_mut().find(|s| s.is_none()) else {
            return;
        };
        *free = Some(Slot {
            seq,
            sent_at: now,
            flood: self.phase == Phase::Flood,
        });
        self.in_flight += 1;
        self.sent += 1;
        if copy {
            self.owed = self.owed.saturating_sub(1);
        }
    }

    /// A test frame came back at `now` carrying `seq` (`None`: it failed the check). Returns
    /// the sequence number to answer with in its buffer (then call [`Mixed::queued`] once it
    /// is queued), or `None` to drop it.
    pub fn returned(&mut self, seq: Option<u32>, now: u64) -> Option<u32> {
        let slot = seq.and_then(|q| {
            let i = self
                .slots
                .iter()
                .position(|s| s.is_some_and(|s| s.seq == q))?;
            self.slots[i].take()
        });
        let Some(slot) = slot else {
            self.bad += 1;
            return None;
        };
        self.in_flight -= 1;
        if slot.flood {
            self.flood.frames += 1;
            self.flood_last = now;
        } else {
            self.trickle.record(now.saturating_sub(slot.sent_at));
        }
        match self.phase {
            Phase::Flood if now < self.phase_end => {}
            Phase::Flood | Phase::Drain => {
                self.phase = Phase::Drain;
                if self.in_flight > 0 {
                    return None;
                }
                // The last flood frame is back: the flood's time is closed, and the trickle
                // starts with this buffer.
                self.flood.cycles += self.flood_last.saturating_sub(self.flood_start);
                self.flood_start = self.flood_last;
                if self.sent < self.limit {
                    self.begin(Phase::Trickle, now);
                }
            }
            Phase::Trickle if now < self.phase_end => {}
            Phase::Trickle => {
                if self.sent < self.limit {
                    self.begin(Phase::Flood, now);
                    self.flood_start = now;
                    self.flood_last = now;
                    self.owed = self.window - 1;
                }
            }
        }
        (self.sent < self.limit).then_some(self.sent as u32)
    }

    /// The answer [`Mixed::returned`] gave could not be written into the returned buffer:
    /// it is due by copy instead (the same sequence number).
    pub fn send_by_copy(&mut self) {
        self.owed += 1;
    }

    fn begin(&mut self, phase: Phase, now: u64) {
        self.phase = phase;
        self.phase_end = now.saturating_add(self.phase_cycles);
        self.flood.phases += 1;
    }

    /// What the floods did, the run ended: a flood still going counts to its last frame
    /// back.
    pub fn flood(&self) -> Flood {
        let mut f = self.flood;
        if self.phase != Phase::Trickle {
            // 0 once the flood's time was closed at the end of its drain.
            f.cycles += self.flood_last.saturating_sub(self.flood_start);
        }
        f
    }

    /// The trickle's round trips in TSC cycles, the frames back that failed the check or
    /// were not in flight (any phase), and the frames still in flight (lost).
    pub fn trickle(&self) -> RoundTrips {
        RoundTrips {
            bad: self.bad,
            lost: u64::from(self.in_flight),
            cycles: self.trickle.percentiles(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    /// Sends every frame due by copy at `now`; their sequence numbers.
    fn send_due(m: &mut Mixed, now: u64) -> Vec<u32> {
        let mut seqs = Vec::new();
        while let Some(seq) = m.due() {
            m.queued(seq, now, true);
            seqs.push(seq);
        }
        seqs
    }

    /// `seq` comes back at `now`; its answer is queued then.
    fn back(m: &mut Mixed, seq: u32, now: u64) -> Option<u32> {
        let answer = m.returned(Some(seq), now);
        if let Some(a) = answer {
            m.queued(a, now, false);
        }
        answer
    }

    #[test]
    fn starts_with_a_flood_of_the_window() {
        let mut m = Mixed::new(4, 1000, 100, 0);
        assert_eq!(m.phase(), Phase::Flood);
        assert_eq!(send_due(&mut m, 0), [0, 1, 2, 3]);
        assert_eq!((m.in_flight(), m.due()), (4, None));
        // Fewer frames than the window: only those.
        let mut short = Mixed::new(64, 1000, 3, 0);
        assert_eq!(send_due(&mut short, 0), [0, 1, 2]);
        // A frame the ring did not take stays due.
        let m = Mixed::new(2, 1000, 100, 0);
        assert_eq!(m.due(), Some(0));
        assert_eq!(m.due(), Some(0));
    }

    #[test]
    fn flood_answers_each_frame_until_its_time_is_up_then_drains() {
        let mut m = Mixed::new(3, 1000, 1000, 0);
        send_due(&mut m, 0);
        // Within the phase: each frame is answered with the next sequence number.
        assert_eq!(back(&mut m, 0, 10), Some(3));
        assert_eq!(back(&mut m, 1, 20), Some(4));
        assert_eq!(m.in_flight(), 3);
        // Time is up: no new frame; the frames in flight drain, counted toward the flood.
        assert_eq!(back(&mut m, 2, 1000), None);
        assert_eq!(m.phase(), Phase::Drain);
        assert_eq!(back(&mut m, 3, 1010), None);
        assert_eq!(m.phase(), Phase::Drain);
        assert!(m.trickle().cycles.is_none(), "no trickle sample yet");
        // The last flood frame back: its buffer carries the first trickle frame.
        assert_eq!(back(&mut m, 4, 1050), Some(5));
        assert_eq!((m.phase(), m.in_flight()), (Phase::Trickle, 1));
        let f = m.flood();
        assert_eq!((f.phases, f.frames, f.cycles), (2, 5, 1050));
    }

    #[test]
    fn trickle_keeps_one_frame_then_the_flood_tops_up_the_window() {
        let mut m = Mixed::new(4, 100, 1000, 0);
        send_due(&mut m, 0);
        for seq in 0..3 {
            assert_eq!(back(&mut m, seq, 100), None);
        }
        // The fourth flood frame back at 150: the trickle runs 150..250.
        assert_eq!(back(&mut m, 3, 150), Some(4));
        assert_eq!(m.due(), None, "one frame in flight");
        assert_eq!(back(&mut m, 4, 170), Some(5));
        assert_eq!(back(&mut m, 5, 249), Some(6));
        assert_eq!(m.in_flight(), 1);
        // Past the trickle's end: the returned frame is still a trickle sample, and its
        // buffer carries the flood's first frame; three more are due by copy.
        assert_eq!(back(&mut m, 6, 260), Some(7));
        assert_eq!(m.phase(), Phase::Flood);
        assert_eq!(send_due(&mut m, 261), [8, 9, 10]);
        assert_eq!(m.in_flight(), 4);
        let t = m.trickle().cycles.unwrap();
        // Round trips 20, 79 and 11 cycles.
        assert_eq!((t.samples, t.min, t.max), (3, 11, 79));
        let f = m.flood();
        assert_eq!((f.phases, f.frames), (3, 4));
        // The first flood ran 0..150; the second started at 260 and has no frame back yet.
        assert_eq!(f.cycles, 150);
        // Flood frames sent at 260 and 261 count toward the flood when they come back.
        for (seq, t) in [(7, 300), (8, 301)] {
            assert!(back(&mut m, seq, t).is_some());
        }
        let f = m.flood();
        assert_eq!((f.frames, f.cycles), (6, 150 + 41));
        assert_eq!(m.trickle().cycles.unwrap().samples, 3);
    }

    #[test]
    fn samples_go_to_the_phase_their_frame_was_sent_in() {
        // Every frame in flight comes back 7 cycles after it was sent. Whatever the phase,
        // flood frames + trickle samples = frames back, and a run to N frames ends with none
        // in flight.
        let (window, phase, n) = (8u32, 500u64, 5_000u64);
        let mut m = Mixed::new(window, phase, n, 0);
        let mut in_flight: Vec<u32> = send_due(&mut m, 0);
        let (mut now, mut back_count) = (0u64, 0u64);
        let mut trickle_seen = false;
        while !in_flight.is_empty() {
            now += 7;
            for seq in core::mem::take(&mut in_flight) {
                back_count += 1;
                in_flight.extend(back(&mut m, seq, now));
                assert!(m.in_flight() <= window);
                if m.phase() == Phase::Trickle {
                    // One frame at most while the trickle runs, none due by copy.
                    trickle_seen = true;
                    assert!(m.in_flight() <= 1 && m.due().is_none());
                }
            }
            in_flight.extend(send_due(&mut m, now));
        }
        assert!(trickle_seen);
        assert_eq!(back_count, n);
        let (f, t) = (m.flood(), m.trickle());
        let samples = t.cycles.map_or(0, |p| p.samples);
        assert_eq!(f.frames + samples, n);
        // Equal phases: the flood carries about W times the trickle's frames.
        assert!(f.frames > 4 * samples, "{f:?} {samples}");
        assert!(f.phases >= 4 && samples > 0, "{f:?}");
        assert_eq!((t.bad, t.lost), (0, 0));
        let p = t.cycles.unwrap();
        assert_eq!((p.min, p.max), (7, 7));
        // W frames per 7 cycles while flooding (each phase's last 7-cycle step is its
        // drain, where frames come back without replacement).
        let rate = f.frames as f64 / f.cycles as f64;
        assert!(
            rate > 0.9 * 8.0 / 7.0 && rate <= 8.0 / 7.0 + 1e-9,
            "{rate} {f:?}"
        );
    }

    #[test]
    fn bad_and_unknown_frames_are_dropped_and_counted() {
        let mut m = Mixed::new(2, 1000, 100, 0);
        send_due(&mut m, 0);
        assert_eq!(m.returned(None, 5), None);
        assert_eq!(m.returned(Some(77), 5), None);
        assert_eq!(m.in_flight(), 2, "still in flight");
        let t = m.trickle();
        assert_eq!((t.bad, t.lost), (2, 2));
        // The same frame twice: the second is not in flight any more.
        assert_eq!(back(&mut m, 0, 6), Some(2));
        assert_eq!(m.returned(Some(0), 7), None);
        assert_eq!(m.trickle().bad, 3);
        // An answer that could not be written into its buffer goes by copy, same number.
        assert_eq!(m.returned(Some(1), 8), Some(3));
        m.send_by_copy();
        assert_eq!(send_due(&mut m, 9), [3]);
        assert_eq!(m.in_flight(), 2);
    }

    #[test]
    fn stops_sending_at_the_limit() {
        let mut m = Mixed::new(2, 1000, 3, 0);
        send_due(&mut m, 0);
        assert_eq!(back(&mut m, 0, 1), Some(2));
        assert_eq!(back(&mut m, 1, 2), None);
        assert_eq!(back(&mut m, 2, 3), None);
        assert_eq!(m.in_flight(), 0);
        assert_eq!(m.flood().frames, 3);
        assert_eq!(
            m.flood().cycles,
            3,
            "the flood still going counts to its last frame"
        );
    }
}
