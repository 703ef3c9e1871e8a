//! The adapter's kick coalescing rule, driven through [`Adapter::observe`] with exact counts.

use crate::virtio::net::adapt::tests::{bounds, INTERVAL_US};
use crate::virtio::net::adapt::{
    Adapter, Decision, Observed, KICK_AHEAD, KICK_LOOK_US, MIN_KICK_AHEAD, SHORT_LOOK_US,
};
use crate::virtio::net::tuning::KickCoalescing;

/// One interval of a transmit flood at `per_s` frames a second with a kick every
/// `frames_per_kick` frames (lazy completion: no interrupts; no timed sleeps).
fn flood(per_s: u64, frames_per_kick: u64) -> Observed {
    let frames = per_s * INTERVAL_US / 1_000_000;
    Observed {
        frames,
        kicks: frames / frames_per_kick,
        elapsed_us: INTERVAL_US,
        ..Observed::default()
    }
}

const ON: KickCoalescing = KickCoalescing {
    max_packets: KICK_AHEAD,
    max_usecs: KICK_LOOK_US,
};

const SHORT: KickCoalescing = KickCoalescing {
    max_usecs: SHORT_LOOK_US,
    ..ON
};

/// Runs `n` intervals of `seen`; returns the kick coalescing decisions, in order.
fn run(a: &mut Adapter, seen: Observed, n: u32) -> Vec<KickCoalescing> {
    (0..n)
        .filter_map(|_| a.observe(seen).kick_coalescing)
        .collect()
}

/// A steady flood whose driver kicks every 100 frames, on a device that may not poll: kick
/// coalescing goes on trial once the load has been steady for a trial's judged intervals.
fn on_trial() -> Adapter {
    let mut a = Adapter::new(bounds(0, 64));
    let first = run(&mut a, flood(1_000_000, 100), 4);
    assert_eq!(first, vec![], "not before four steady intervals");
    assert_eq!(run(&mut a, flood(1_000_000, 100), 1), vec![ON]);
    assert_eq!(a.kick_coalescing(), ON);
    a
}

/// [`on_trial`], then the trial: the rate up by half (the first interval is not judged) and
/// kicks far fewer. Kept, and the shorter look goes on trial.
fn kept() -> Adapter {
    let mut a = on_trial();
    assert_eq!(run(&mut a, flood(1_500_000, 4_000), 5), vec![SHORT]);
    a
}

#[test]
fn a_flood_that_kicks_often_keeps_kick_coalescing_that_raises_its_rate() {
    let mut a = kept();
    // The shorter look does not raise the rate again: back to the long one.
    assert_eq!(run(&mut a, flood(1_500_000, 4_000), 5), vec![ON]);
    // And stays through 200 more intervals (a dip of a few included), the shorter look not
    // tried again.
    assert_eq!(run(&mut a, flood(1_500_000, 4_000), 100), vec![]);
    assert_eq!(run(&mut a, flood(500_000, 4_000), 5), vec![]);
    assert_eq!(run(&mut a, flood(1_500_000, 4_000), 100), vec![]);
    assert_eq!(a.kick_coalescing(), ON);
    assert_eq!(a.counters.kick_coalescing_changes, 3);
}

/// A request/response flood whose driver queues its next frames sooner than the long look
/// comes: the shorter look raises the rate by a quarter again and stays.
#[test]
fn a_flood_the_shorter_look_speeds_up_keeps_it() {
    let mut a = kept();
    assert_eq!(run(&mut a, flood(2_000_000, 4_000), 5), vec![]);
    assert_eq!(run(&mut a, flood(2_000_000, 4_000), 200), vec![]);
    assert_eq!(a.kick_coalescing(), SHORT);
    // A lasting fall ends it, and a new flood starts from the long look.
    assert_eq!(
        run(&mut a, flood(20_000, 1), 8),
        vec![KickCoalescing::default()]
    );
    assert_eq!(run(&mut a, flood(1_000_000, 100), 6), vec![ON]);
}

/// The buffers without a kick: three times the frames the driver sent per kick before the
/// trial (below what it keeps in flight, so kicks stay in charge), within 16..=192.
#[test]
fn the_trial_lets_the_driver_queue_three_times_its_frames_per_kick() {
    for (frames_per_kick, ahead) in [(10, 30), (4, MIN_KICK_AHEAD), (64, KICK_AHEAD), (100, 192)] {
        let mut a = Adapter::new(bounds(0, 64));
        let on = run(&mut a, flood(1_000_000, frames_per_kick), 5);
        assert_eq!(
            on,
            vec![KickCoalescing {
                max_packets: ahead,
                max_usecs: KICK_LOOK_US
            }],
            "{frames_per_kick} frames per kick"
        );
    }
}

#[test]
fn a_kick_trial_that_does_not_raise_the_rate_is_undone_and_parked() {
    let mut a = on_trial();
    // A tenth faster: not the quarter a trial needs.
    let off = run(&mut a, flood(1_100_000, 4_000), 5);
    assert_eq!(off, vec![KickCoalescing::default()]);
    // The same load, kicking as before: parked, no second trial.
    assert_eq!(run(&mut a, flood(1_000_000, 100), 500), vec![]);
    // Another load (3×): tried again once steady.
    assert_eq!(run(&mut a, flood(3_000_000, 100), 6), vec![ON]);
}

#[test]
fn a_flood_that_ends_under_its_trial_fails_it_at_once() {
    let mut a = on_trial();
    assert_eq!(run(&mut a, flood(1_500_000, 4_000), 2), vec![]);
    assert_eq!(
        run(&mut a, flood(20_000, 1), 1),
        vec![KickCoalescing::default()]
    );
    // Under the shorter look's trial: back to the long look at once, kept until the fall
    // has lasted.
    let mut a = kept();
    assert_eq!(run(&mut a, flood(1_500_000, 4_000), 1), vec![]);
    assert_eq!(run(&mut a, flood(20_000, 1), 1), vec![ON]);
}

#[test]
fn kick_coalescing_ends_when_the_flood_does() {
    let mut a = kept();
    assert_eq!(run(&mut a, flood(1_500_000, 4_000), 5), vec![ON]);
    // A trickle: a few intervals under half the rate are a dip, a lasting fall ends it.
    let trickle = flood(20_000, 1);
    assert_eq!(run(&mut a, trickle, 7), vec![]);
    assert_eq!(run(&mut a, trickle, 1), vec![KickCoalescing::default()]);
    // The trickle kicks for every frame but is no flood: no trial.
    assert_eq!(run(&mut a, trickle, 100), vec![]);
}

#[test]
fn kick_coalescing_is_never_tried_where_it_is_not_the_adapters() {
    // The driver kicks rarely already.
    let mut a = Adapter::new(bounds(0, 64));
    assert_eq!(run(&mut a, flood(1_000_000, 1_000), 100), vec![]);
    // The operator allows no hold.
    let mut a = Adapter::new(bounds(0, 0));
    assert_eq!(run(&mut a, flood(1_000_000, 100), 100), vec![]);
    // The operator set kick coalescing, or the driver has no EVENT_IDX.
    let mut a = Adapter::new(bounds(0, 64));
    let fixed = Observed {
        kicks_fixed: true,
        ..flood(1_000_000, 100)
    };
    assert_eq!(run(&mut a, fixed, 100), vec![]);
    assert_eq!(a.kick_coalescing(), KickCoalescing::default());
    assert_eq!(a.counters.kick_coalescing_changes, 0);
}

#[test]
fn the_operator_taking_the_knob_or_the_hold_ends_it_at_once() {
    // A trial running when the operator fixes the knob: off at the next interval.
    let mut a = on_trial();
    let fixed = Observed {
        kicks_fixed: true,
        ..flood(1_500_000, 4_000)
    };
    assert_eq!(run(&mut a, fixed, 1), vec![KickCoalescing::default()]);

    // Kept, its shorter look on trial, then the hold bound lowered: the look trial ends and
    // the look follows the bound; no hold allowed: off.
    let mut a = kept();
    let d = a.set_bounds(bounds(0, 10));
    assert_eq!(
        d,
        Decision {
            kick_coalescing: Some(KickCoalescing {
                max_usecs: 10,
                ..ON
            }),
            ..Decision::default()
        }
    );
    // New bounds that leave the look where it is change nothing.
    assert_eq!(a.set_bounds(bounds(0, 10)), Decision::default());
    let d = a.set_bounds(bounds(0, 0));
    assert_eq!(d.kick_coalescing, Some(KickCoalescing::default()));
    assert_eq!(a.kick_coalescing(), KickCoalescing::default());
}

#[test]
fn a_window_that_opens_takes_over_from_kick_coalescing() {
    let mut a = kept();
    // The operator now allows polling, and the device's sleeps end on work soon after they
    // start: the window opens, and kick coalescing goes off in the same interval.
    a.set_bounds(bounds(64, 64));
    let short_gaps = Observed {
        short_gaps: 8,
        longest_short_gap_us: 20,
        ..flood(1_500_000, 4_000)
    };
    let d = a.observe(short_gaps);
    assert!(d.busy_poll_us.is_some_and(|us| us > 0), "{d:?}");
    assert_eq!(d.kick_coalescing, Some(KickCoalescing::default()));
}
