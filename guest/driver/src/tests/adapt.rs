//! The adaptation controllers ([`crate::adapt`]) on synthetic workloads: where they settle,
//! how fast, how they answer a step change of the workload, and that no observation takes a
//! value out of its bounds.
//!
//! Bounds proved here: the kick threshold settles within 8 intervals (3 from the default 8 to
//! either end) and reaches the other end within 8 after a step; the XDP bulk within 1 (with a
//! clock, a raise is measured over 3 more and undone if it costs the rate); the rx
//! coalescing level parks within 6 intervals, from the start and after a step. Each then holds
//! for 100 more intervals of the same workload.

use crate::adapt::{
    BulkController, BulkSample, KickController, RxDim, RxSample, TxSample, RX_COAL_PROFILES,
    RX_MAX_LEVEL, TX_INTERVAL_FRAMES, XDP_BULK_MAX,
};

/// How the simulated device treats the driver's kicks.
#[derive(Clone, Copy, Debug)]
enum Device {
    /// Drains every batch at once and sleeps: every kick decision notifies.
    Sleeps,
    /// Busy-polls the ring: every kick decision is suppressed.
    Polls,
    /// Busy-polls the ring but completes slower than the driver sends: every kick decision
    /// is suppressed and the ring fills up once per interval.
    PollsBehind,
    /// Wakes on the first kick of a caller's batch and works through the batch (EVENT_IDX not
    /// re-armed meanwhile): the later decisions of the batch are suppressed.
    WakesPerBatch,
}

/// One interval ([`TX_INTERVAL_FRAMES`] frames) of a caller sending batches of `batch` frames
/// with threshold `n` to `device`, counted as the driver's tx path counts it.
fn tx_interval(n: u16, batch: u32, device: Device) -> TxSample {
    let frames = TX_INTERVAL_FRAMES as u32;
    let n = u32::from(n);
    let batches = frames / batch;
    let cuts_per_batch = batch / n;
    let decisions_per_batch = cuts_per_batch + u32::from(!batch.is_multiple_of(n));
    let kicks_per_batch = match device {
        Device::Sleeps => decisions_per_batch,
        Device::Polls | Device::PollsBehind => 0,
        Device::WakesPerBatch => 1,
    };
    TxSample {
        frames,
        decisions: batches * decisions_per_batch,
        kicks: batches * kicks_per_batch,
        threshold_cuts: batches * cuts_per_batch,
        ring_full: u32::from(matches!(device, Device::PollsBehind)),
    }
}

/// Runs `c` on the workload until it has not changed for 100 intervals; returns the number of
/// intervals after which it last changed (0: never).
fn kick_settle(c: &mut KickController, batch: u32, device: Device) -> usize {
    let mut last_change = 0;
    for i in 1..=200 {
        let sample = tx_interval(c.value(), batch, device);
        if c.observe(&sample) {
            last_change = i;
        }
        if i >= last_change + 100 {
            return last_change;
        }
    }
    panic!("kick threshold still changing after 200 intervals: {c:?}");
}

#[test]
fn kick_threshold_settles_within_8_intervals_and_then_holds() {
    let cases = [
        // A sleeping device and long batches: every kick is an exit, batch as much as allowed.
        (256, Device::Sleeps, 64),
        // Batches of 20: the threshold stops growing once the end of the batch cuts it.
        (20, Device::Sleeps, 32),
        // A polling device: kicks are free; back to the configured 8, never below (publishing
        // more often than configured costs both sides cache lines and buys a poller nothing).
        (256, Device::Polls, 8),
        // A polling device that falls behind: the ring, not the threshold, holds frames back,
        // so publish in the largest batches allowed.
        (256, Device::PollsBehind, 64),
        // A device woken once per batch works through it: the rest of its kicks are free.
        (64, Device::WakesPerBatch, 8),
    ];
    for (batch, device, settled) in cases {
        let mut c = KickController::new(8, 256, 64);
        let when = kick_settle(&mut c, batch, device);
        assert!(when <= 8, "{batch} {device:?}: last change at {when}");
        assert_eq!(c.value(), settled, "{batch} {device:?}");
    }
}

#[test]
fn kick_threshold_follows_a_step_of_the_workload_within_8_intervals() {
    let mut c = KickController::new(8, 256, 64);
    kick_settle(&mut c, 256, Device::Sleeps);
    assert_eq!(c.value(), 64);
    // Flood to a sleeping device → the device starts polling → back (to the configured 8);
    // a polling device that falls behind → up again, and it stays up from then on (its ring
    // no longer filling is what the larger threshold bought).
    for (device, target, within) in [
        (Device::Polls, 8, 8),
        (Device::Sleeps, 64, 8),
        (Device::Polls, 8, 8),
        (Device::PollsBehind, 64, 8),
        (Device::Polls, 64, 0),
        (Device::Sleeps, 64, 0),
        (Device::Polls, 64, 0),
    ] {
        let when = kick_settle(&mut c, 256, device);
        assert!(when <= within, "{device:?}: last change at {when}");
        assert_eq!(c.value(), target, "{device:?}");
    }
}

#[test]
fn kick_threshold_holds_while_a_polling_device_fills_the_ring_now_and_then() {
    // A ring of 256 that fills once per cycle fills in some intervals of 256 frames and not in
    // others: the threshold climbs and stays, whatever the beat.
    // Runs 400 intervals of a device that behaves as `device(i)` in interval i; returns the
    // threshold it ends at and how many times it changed.
    let run = |device: &dyn Fn(usize) -> Device| {
        let mut c = KickController::new(8, 256, 64);
        let mut changes = 0;
        for i in 0..400 {
            changes += u32::from(c.observe(&tx_interval(c.value(), 256, device(i))));
        }
        (c.value(), changes)
    };
    for every in [2, 3, 4, 8] {
        let beat = |i: usize| {
            if i.is_multiple_of(every) {
                Device::PollsBehind
            } else {
                Device::Polls
            }
        };
        assert_eq!(run(&beat), (64, 3), "full every {every} intervals");
    }
    // Nor does a device that misses its window (sleeps) one interval in four.
    let sleeps_now_and_then = |i: usize| match i % 4 {
        0 => Device::PollsBehind,
        1 => Device::Sleeps,
        _ => Device::Polls,
    };
    assert_eq!(run(&sleeps_now_and_then), (64, 3));
}

#[test]
fn kick_threshold_turns_back_only_on_two_intervals_in_a_row() {
    let mut c = KickController::new(8, 256, 64);
    assert!(c.observe(&tx_interval(8, 256, Device::Sleeps)));
    assert_eq!(c.value(), 16);
    // One polling interval between sleeping ones changes nothing...
    assert!(!c.observe(&tx_interval(16, 256, Device::Polls)));
    assert_eq!(c.value(), 16);
    assert!(c.observe(&tx_interval(16, 256, Device::Sleeps)));
    assert_eq!(c.value(), 32);
    // ...two in a row turn it.
    assert!(!c.observe(&tx_interval(32, 256, Device::Polls)));
    assert!(c.observe(&tx_interval(32, 256, Device::Polls)));
    assert_eq!(c.value(), 16);
    // A ring that filled up stops the growth; an interval without decisions changes nothing.
    let mut full = tx_interval(16, 256, Device::Sleeps);
    full.ring_full = 1;
    assert!(!c.observe(&full));
    assert!(!c.observe(&TxSample::default()));
    assert_eq!(c.value(), 16);
}

#[test]
fn kick_threshold_bounds_come_from_the_ring_and_the_config() {
    assert_eq!(KickController::new(8, 8, 64).max(), 4, "half the ring");
    assert_eq!(KickController::new(8, 8, 64).value(), 4);
    assert_eq!(
        KickController::new(8, 256, 12).max(),
        12,
        "kick_threshold_max"
    );
    assert_eq!(KickController::new(8, 1024, 500).max(), 64, "the cap");
    assert_eq!(KickController::new(0, 2, 0).value(), 1, "never below 1");
    let mut c = KickController::new(8, 256, 12);
    kick_settle(&mut c, 256, Device::Sleeps);
    assert_eq!(c.value(), 12);
}

/// xorshift64*: reproducible pseudo-random numbers without a crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// 0, 1, u32::MAX, u32::MAX - 1 or a random value, equally often.
    fn hostile_u32(&mut self) -> u32 {
        match self.next() % 5 {
            0 => 0,
            1 => 1,
            2 => u32::MAX,
            3 => u32::MAX - 1,
            _ => self.next() as u32 >> (self.next() % 32),
        }
    }

    fn hostile_u64(&mut self) -> u64 {
        match self.next() % 4 {
            0 => 0,
            1 => u64::MAX,
            2 => u64::from(self.hostile_u32()),
            _ => self.next(),
        }
    }
}

#[test]
fn no_observation_takes_a_value_out_of_its_bounds() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..200 {
        let ring = 1u16 << (1 + rng.next() % 15);
        let max = rng.next() as u16;
        let mut kick = KickController::new(rng.next() as u16, ring, max);
        let hi = kick.max();
        assert!((1..=64).contains(&hi) && hi <= (ring / 2).max(1) && hi <= max.max(1));
        let mut bulk = BulkController::new(rng.next() as u16);
        let mut dim = RxDim::new();
        for i in 0..500 {
            // Odd rounds alternate between the extremes, even ones are random.
            let extreme = round % 2 == 1;
            let pick = |rng: &mut Rng| match (extreme, i % 2) {
                (true, 0) => 0,
                (true, _) => u32::MAX,
                _ => rng.hostile_u32(),
            };
            let tx = TxSample {
                frames: pick(&mut rng),
                decisions: pick(&mut rng),
                kicks: pick(&mut rng),
                threshold_cuts: pick(&mut rng),
                ring_full: pick(&mut rng),
            };
            kick.observe(&tx);
            assert!((1..=hi).contains(&kick.value()), "{tx:?} → {kick:?}");
            let b = BulkSample {
                polls: pick(&mut rng),
                frames: pick(&mut rng),
                device_polls: pick(&mut rng) % 2 == 0,
                elapsed: u64::from(pick(&mut rng)),
            };
            bulk.observe(&b);
            assert!((1..=XDP_BULK_MAX).contains(&bulk.value()), "{b:?}");
            let rx = if extreme {
                let v = if i % 2 == 0 { 0 } else { u64::MAX };
                RxSample {
                    frames: v,
                    interrupts: v,
                    elapsed: u64::MAX - v,
                }
            } else {
                RxSample {
                    frames: rng.hostile_u64(),
                    interrupts: rng.hostile_u64(),
                    elapsed: rng.hostile_u64(),
                }
            };
            let before = dim.level();
            dim.observe(&rx);
            assert!(dim.level() <= RX_MAX_LEVEL);
            assert!(dim.level().abs_diff(before) <= 1, "one level per interval");
            assert_eq!(dim.profile(), RX_COAL_PROFILES[usize::from(dim.level())]);
        }
    }
}

#[test]
fn xdp_bulk_follows_the_frames_per_poll_within_two_intervals() {
    let sample = |per_poll: u32| BulkSample {
        polls: 16,
        frames: 16 * per_poll,
        device_polls: false,
        elapsed: 0,
    };
    let mut b = BulkController::new(16);
    // From the default: a steady 40 per poll → 64 (one flush per poll) after two intervals,
    // held for 100; back down to the configured 16 at once, never below.
    for (per_poll, settled) in [(40, 64), (3, 16), (1, 16), (24, 32), (64, 64), (5, 16)] {
        let before = b.value();
        b.observe(&sample(per_poll));
        if settled > before {
            assert_eq!(b.value(), before, "{per_poll}: one interval is not enough");
            b.observe(&sample(per_poll));
        }
        assert_eq!(b.value(), settled, "{per_poll}");
        for _ in 0..100 {
            assert!(!b.observe(&sample(per_poll)));
        }
    }
    // An average wobbling across a power of two does not make it flap.
    let mut b = BulkController::new(16);
    assert!(!b.observe(&sample(17)));
    assert!(b.observe(&sample(17)));
    assert_eq!(b.value(), 32);
    for i in 0..100 {
        assert!(!b.observe(&sample(16 + i % 2)));
    }
    assert!(!b.observe(&BulkSample::default()), "no bounces, no change");
    // A device that polls: back to the configured 16 and kept there whatever the bounces.
    assert!(b.observe(&BulkSample {
        device_polls: true,
        ..sample(40)
    }));
    assert_eq!(b.value(), 16);
    assert!(!b.observe(&BulkSample {
        device_polls: true,
        ..sample(64)
    }));
}

/// The receive workloads of the rx coalescing tests.
#[derive(Clone, Copy, Debug)]
enum RxLoad {
    /// The device offers 10 frames per µs; the guest spends 1 µs per frame and 20 µs per
    /// interrupt, so its rate grows with the frames each interrupt brings.
    Flood,
    /// One frame in flight (request/response over a 10 µs round trip): the coalescing delay
    /// adds to every round trip.
    PingPong,
    /// Two frames in flight, each interrupt bringing both: the coalescing delay still adds to
    /// every round trip.
    Pairs,
}

/// One interval (1 ms, in ns ticks) of `load` at coalescing `level`.
fn rx_interval(level: u8, load: RxLoad) -> RxSample {
    const T: u64 = 1_000_000;
    let p = RX_COAL_PROFILES[usize::from(level)];
    let (frames, per_irq) = match load {
        RxLoad::Flood => {
            // Without coalescing the guest's own polling gathers two frames per interrupt.
            let per_irq = u64::from(p.max_packets.min(10 * p.usecs)).max(2);
            (T * per_irq / (1_000 * per_irq + 20_000), per_irq)
        }
        RxLoad::PingPong => (T / (10_000 + 1_000 * u64::from(p.usecs)), 1),
        RxLoad::Pairs => (2 * T / (10_000 + 1_000 * u64::from(p.usecs)), 2),
    };
    RxSample {
        frames,
        interrupts: frames.div_ceil(per_irq),
        elapsed: T,
    }
}

/// Runs `dim` on `load` until it is parked and has held for 100 intervals; returns the
/// interval at which it parked.
fn dim_settle(dim: &mut RxDim, load: RxLoad) -> usize {
    let mut parked_at = None;
    for i in 1..=200 {
        let changed = dim.observe(&rx_interval(dim.level(), load));
        match parked_at {
            None if dim.is_parked() => parked_at = Some(i),
            None => {}
            Some(at) => {
                assert!(
                    !changed && dim.is_parked(),
                    "{load:?}: moved at {i} after parking"
                );
                if i >= at + 100 {
                    return at;
                }
            }
        }
    }
    panic!("{load:?}: not settled: {dim:?}");
}

/// Settles `dim` on each load in turn: it parks within 6 intervals, at the level given.
fn settle_each(dim: &mut RxDim, steps: &[(RxLoad, u8)]) {
    for &(load, level) in steps {
        let parked = dim_settle(dim, load);
        assert!(parked <= 6, "{load:?}: parked at {parked}");
        assert_eq!(dim.level(), level, "{load:?}");
    }
}

#[test]
fn rx_coalescing_settles_within_6_intervals_and_then_holds() {
    // The flood stops climbing at the first level whose interrupts bring 16 frames or more;
    // a ping-pong (one frame per interrupt) never tries.
    for step in [(RxLoad::Flood, 3), (RxLoad::PingPong, 0)] {
        settle_each(&mut RxDim::new(), &[step]);
    }
}

#[test]
fn rx_coalescing_follows_a_step_of_the_workload_within_6_intervals() {
    let mut dim = RxDim::new();
    dim_settle(&mut dim, RxLoad::Flood);
    settle_each(
        &mut dim,
        &[
            (RxLoad::PingPong, 0),
            (RxLoad::Flood, 3),
            (RxLoad::PingPong, 0),
        ],
    );
}

#[test]
fn rx_coalescing_steps_back_and_parks_when_a_step_made_it_worse() {
    let mut dim = RxDim::new();
    // The first interval has nothing to compare with: it tries more coalescing.
    assert!(dim.observe(&rx_interval(0, RxLoad::Pairs)));
    assert_eq!(dim.level(), 1);
    // Worse at level 1: back to 0, whose next interval becomes the parking reference.
    assert!(dim.observe(&rx_interval(1, RxLoad::Pairs)));
    assert_eq!(dim.level(), 0);
    assert!(!dim.is_parked());
    assert!(!dim.observe(&rx_interval(0, RxLoad::Pairs)));
    assert!(dim.is_parked());
    // Within 10 % of the reference: still parked.
    let mut s = rx_interval(0, RxLoad::Pairs);
    s.frames += s.frames / 20;
    assert!(!dim.observe(&s));
    assert!(dim.is_parked());
}

#[test]
fn rx_coalescing_does_not_climb_on_small_losses_that_add_up() {
    // Each level costs 6 % of the rate (under the 10 % a single step must show) and halves
    // the interrupts per frame: a climb judged step by step would reach the top and lose a
    // quarter of the rate; judged against where it began, it stops after the loss reaches 10 %.
    let mut dim = RxDim::new();
    for _ in 0..50 {
        let level = u32::from(dim.level());
        let frames = (100_000.0 * 0.94f64.powi(level as i32)) as u64;
        dim.observe(&RxSample {
            frames,
            interrupts: (frames >> level).max(1),
            elapsed: 1_000_000,
        });
    }
    assert!(dim.level() <= 2, "climbed to level {}", dim.level());
    assert!(dim.is_parked());
}

#[test]
fn noisy_rx_rates_do_not_keep_the_coalescing_search_going() {
    // A request/response flow whose rate wanders ±30 % from one interval to the next and that
    // any coalescing slows: each search from the parking comes back to level 0, each stay
    // there is longer than the last, and few commands go out.
    let mut dim = RxDim::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut changes = 0;
    for _ in 0..2_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let hold = u64::from(dim.profile().usecs);
        let frames = 1_000_000 * (70 + seed % 61) / 100 / (20 + hold);
        changes += u32::from(dim.observe(&RxSample {
            frames,
            interrupts: frames,
            elapsed: 1_000_000,
        }));
    }
    assert!(changes <= 80, "{changes} level changes in 2000 intervals");
    assert_eq!(dim.level(), 0);
}

#[test]
fn rx_coalescing_does_not_climb_on_the_switches_of_a_mixed_load() {
    // Floods whose interrupts already bring 24 frames (the driver polls) alternate with a
    // request/response trickle every 10 intervals; the interval that sees a switch holds a
    // quarter of the old load and three quarters of the new one. Neither load wants
    // coalescing: a search that started from the mixed interval would climb on every switch
    // to the trickle (two control commands per cycle, and the trickle delayed meanwhile).
    let flood = RxSample {
        frames: 3_000,
        interrupts: 125,
        elapsed: 1_000_000,
    };
    let trickle = RxSample {
        frames: 100,
        interrupts: 100,
        elapsed: 1_000_000,
    };
    let mix = |old: &RxSample, new: &RxSample| RxSample {
        frames: (old.frames + 3 * new.frames) / 4,
        interrupts: (old.interrupts + 3 * new.interrupts) / 4,
        elapsed: 1_000_000,
    };
    let mut dim = RxDim::new();
    let mut changes = 0;
    let mut last = flood;
    for cycle in 0..40 {
        let load = if cycle % 2 == 0 { flood } else { trickle };
        changes += u32::from(dim.observe(&mix(&last, &load)));
        for _ in 1..10 {
            changes += u32::from(dim.observe(&load));
        }
        last = load;
    }
    assert!(changes <= 2, "{changes} level changes over 40 switches");
    assert_eq!(dim.level(), 0);
}

#[test]
fn a_load_that_keeps_switching_does_not_keep_the_search_going() {
    // The rate moves 2.3× every 5 intervals (a load switching faster than a search can
    // settle), interrupts bring 4 frames (coalescing looks worth a try), and every level of
    // coalescing costs 15 % of the rate. Once a search has come back to level 0, the moves of
    // the rate no longer start one each: the parkings run their course (doubling), and the
    // control commands thin out (one search per switch, two commands each, without that).
    let mut dim = RxDim::new();
    let mut changes = 0;
    for i in 0..2_000u32 {
        let rate = if (i / 5) % 2 == 0 { 1_000.0 } else { 2_300.0 };
        let frames = (rate * 0.85f64.powi(i32::from(dim.level()))) as u64;
        changes += u32::from(dim.observe(&RxSample {
            frames,
            interrupts: frames / 4,
            elapsed: 1_000_000,
        }));
    }
    assert!(changes <= 80, "{changes} level changes in 2000 intervals");
    assert_eq!(dim.level(), 0);
}

#[test]
fn the_switches_of_a_mixed_load_do_not_raise_the_xdp_bulk() {
    // A trickle (one frame a poll, every poll kicking a device that slept between them)
    // alternating with a flood that the device polls (40 frames a poll, few kicks): the
    // interval that spans a switch to the flood averages more than 16 frames a poll with half
    // of its polls kicking, which alone would raise the bulk to 32 at every switch.
    let trickle = BulkSample {
        polls: 16,
        frames: 16,
        device_polls: false,
        elapsed: 0,
    };
    let switch = BulkSample {
        polls: 16,
        frames: 8 + 8 * 40,
        device_polls: false,
        elapsed: 0,
    };
    let flood = BulkSample {
        polls: 16,
        frames: 16 * 40,
        device_polls: true,
        elapsed: 0,
    };
    let mut b = BulkController::new(16);
    for _ in 0..50 {
        for s in [trickle, trickle, switch, flood, flood, flood] {
            assert!(!b.observe(&s), "{s:?}");
            assert_eq!(b.value(), 16);
        }
    }
}

/// A flood of 40 frames a poll whose rate at each bulk `ticks` gives (the interval's ticks
/// at that bulk), measured with a clock.
fn timed_flood(bulk: u16, ticks: fn(u16) -> u64) -> BulkSample {
    BulkSample {
        polls: 16,
        frames: 16 * 40,
        device_polls: false,
        elapsed: ticks(bulk),
    }
}

#[test]
fn a_bulk_raise_that_costs_the_rate_is_undone_and_tried_ever_more_rarely() {
    // The device waits for each larger flush: at 64 the flood runs at 0.6 × its rate at 16.
    let hurts = |bulk: u16| if bulk > 16 { 1_667 } else { 1_000 };
    let mut b = BulkController::new(16);
    let mut values = std::vec::Vec::new();
    for _ in 0..2_000 {
        b.observe(&timed_flood(b.value(), hurts));
        values.push(b.value());
    }
    // The first raise: asked for twice (intervals 0 and 1), then the interval it starts in
    // and two measured ones; undone at the third.
    assert_eq!(&values[..6], &[16, 64, 64, 64, 16, 16]);
    // Then the next raise waits 4 intervals after the undoing one (the last two asking for
    // it), and each raise undone doubles the wait, up to 512 intervals.
    let raises: std::vec::Vec<usize> = (1..values.len())
        .filter(|&i| values[i] == 64 && values[i - 1] == 16)
        .collect();
    let waits: std::vec::Vec<usize> = raises.windows(2).map(|w| w[1] - w[0] - 3).collect();
    assert_eq!(waits, [4, 8, 16, 32, 64, 128, 256, 512, 512]);
    let at_64 = values.iter().filter(|&&v| v == 64).count();
    assert_eq!(at_64, 3 * raises.len(), "each raise lasts its trial");
    assert!(
        at_64 * 50 < values.len(),
        "{at_64} of {} intervals at 64",
        values.len()
    );
}

#[test]
fn a_bulk_raise_that_holds_the_rate_is_kept() {
    // Kicks saved pay for the wait (the VM's forwarding into a device that sleeps): 64 runs
    // faster, or at the same rate within the eighth the rule allows.
    for at_64 in [600, 1_000, 1_140] {
        let mut b = BulkController::new(16);
        let mut changes = 0;
        for _ in 0..200 {
            let s = BulkSample {
                elapsed: if b.value() > 16 { at_64 } else { 1_000 },
                ..timed_flood(b.value(), |_| 0)
            };
            changes += u32::from(b.observe(&s));
        }
        assert_eq!(
            (b.value(), changes),
            (64, 1),
            "at 64: {at_64} ticks an interval"
        );
    }
    // A rate that falls by more than an eighth is not.
    let mut b = BulkController::new(16);
    for _ in 0..5 {
        let s = timed_flood(b.value(), |bulk| if bulk > 16 { 1_150 } else { 1_000 });
        b.observe(&s);
    }
    assert_eq!(b.value(), 16);
}

#[test]
fn a_trickle_drops_a_bulk_trial_unjudged_and_the_next_flood_tries_again() {
    // A flood at 0.6 × its rate at 64 whose end comes inside the trial: the trickle falls to
    // the configured bulk, with no verdict and so no wait: the next flood raises again after
    // its two intervals.
    let hurts = |bulk: u16| if bulk > 16 { 1_667 } else { 1_000 };
    let trickle = BulkSample {
        polls: 16,
        frames: 16,
        device_polls: false,
        elapsed: 5_000,
    };
    let mut b = BulkController::new(16);
    for round in 0..20 {
        let mut values = std::vec::Vec::new();
        for _ in 0..4 {
            b.observe(&timed_flood(b.value(), hurts));
            values.push(b.value());
        }
        assert_eq!(values, [16, 64, 64, 64], "round {round}");
        for _ in 0..3 {
            b.observe(&trickle);
            assert_eq!(b.value(), 16);
        }
    }
    // Without the trickle, the trial ends and the raise is undone.
    for _ in 0..5 {
        b.observe(&timed_flood(b.value(), hurts));
    }
    assert_eq!(b.value(), 16);
}
