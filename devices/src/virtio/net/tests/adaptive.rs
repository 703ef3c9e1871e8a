//! Device-side adaptation end to end through the worker: the busy-poll window grows to cover
//! a driver's pauses and saves its kicks, adaptation turns on and off at run time with its
//! values published, and a guest's coalescing stays within the operator's bound (in `ctrl`).

use std::time::Duration;

use super::driver::{rig_for, start_rings, DriverRing};
use super::support::{guest_mem, GuestQueue};
use super::tuning::paced_driver;
use super::worker::{Rig, VERSION_1};
use crate::test_utils::mmio::wait_until;
use crate::virtio::net::{Adaptive, NetTuning, NetTuningUpdate};

fn adaptive(max_busy_poll_us: u32, max_coalesce_usecs: u32) -> Adaptive {
    Adaptive {
        enabled: true,
        max_busy_poll_us,
        max_coalesce_usecs,
        // Four or five 0.3 ms pauses per interval: enough for the three-in-four rule.
        interval_us: 1_500,
    }
}

/// A rig whose device adapts within `bounds` from the start; returns the driver's tx queue.
fn adapting_rig<Q: DriverRing>(mem: &vm_memory::GuestMemoryMmap, bounds: Adaptive) -> (Rig, Q) {
    let mut rig = rig_for::<Q>(mem, |_| {});
    rig.tuning
        .set(NetTuning {
            adaptive: bounds,
            ..NetTuning::default()
        })
        .expect("valid");
    let (rx, tx) = Q::pair(mem);
    start_rings(&mut rig.transport, VERSION_1, &[&rx, &tx]);
    (rig, tx)
}

#[test]
fn the_window_grows_to_cover_a_drivers_pauses_and_then_saves_its_kicks() {
    let _turn = super::support::spinning_device();
    let mem = guest_mem();
    let (rig, mut tx) = adapting_rig::<GuestQueue>(&mem, adaptive(1_000, 0));
    let a = &rig.metrics.adaptive;
    assert_eq!(a.enabled.get(), 1);
    // 0.2 ms pauses: the window jumps to the power of two that covers the longest one seen
    // (256 µs; more where the machine stretches the pauses), in one move or a few.
    let mut frames = 0;
    while a.busy_poll_us.get() < 256 && frames < 600 {
        paced_driver(&rig, &mut tx, false, 20, Duration::from_micros(200));
        frames += 20;
    }
    let window = a.busy_poll_us.get();
    assert!(
        (256..=1_000).contains(&window),
        "window {window} µs after {frames} pauses ({} intervals, {} changes)",
        a.intervals.get(),
        a.busy_poll_changes.get(),
    );
    let changes = a.busy_poll_changes.get();
    assert!(
        (1..=3).contains(&changes),
        "{changes} changes: a jump, not a doubling at a time (8 → 256 is six moves)"
    );
    assert_eq!(a.coalesce_usecs.get(), 0, "bound 0: no coalescing");
    // Now the windows catch frames. How many depends on how far a busy machine stretches the
    // pauses past the window: on two cores, with other tests' threads on one, the driver may
    // share the other with the spinning window and wait for it to end; so up to five rounds.
    // Without adaptation none is caught: no window.
    for _ in 0..5 {
        paced_driver(&rig, &mut tx, false, 20, Duration::from_micros(20));
        if rig.metrics.busy_poll.found_work.get() > 0 {
            break;
        }
    }
    assert!(
        rig.metrics.busy_poll.found_work.get() > 0,
        "window {} µs, {} polls, {} changes, {} intervals",
        a.busy_poll_us.get(),
        rig.metrics.busy_poll.polls.get(),
        a.busy_poll_changes.get(),
        a.intervals.get()
    );
    assert!(a.intervals.get() > 0);
}

#[test]
fn pauses_longer_than_the_bound_keep_the_window_off() {
    let mem = guest_mem();
    let (rig, mut tx) = adapting_rig::<GuestQueue>(&mem, adaptive(50, 0));
    let kicks = paced_driver(&rig, &mut tx, false, 40, Duration::from_millis(2));
    // No window catches a 2 ms pause: every frame kicks. The first frame follows the driver's
    // set-up closely, and one short gap may open a window for a while; the 2 ms gaps close it
    // again.
    assert_eq!(kicks, 40);
    assert_eq!(rig.metrics.adaptive.busy_poll_us.get(), 0);
    assert_eq!(rig.metrics.busy_poll.found_work.get(), 0);
}

#[test]
fn adaptation_turns_on_and_off_at_run_time_and_hands_back_the_fixed_knobs() {
    let _turn = super::support::spinning_device();
    let mem = guest_mem();
    let mut rig = rig_for::<GuestQueue>(&mem, |_| {});
    let (rx, mut tx) = GuestQueue::pair(&mem);
    start_rings(&mut rig.transport, VERSION_1, &[&rx, &tx]);
    let a = rig.metrics.adaptive.enabled.get();
    assert_eq!(a, 0);
    let on = NetTuningUpdate {
        adaptive: Some(adaptive(1_000, 64)),
        ..NetTuningUpdate::default()
    };
    assert!(rig.tuning.update(&on).expect("valid").adaptive.enabled);
    assert!(wait_until(Duration::from_secs(5), || rig
        .metrics
        .adaptive
        .enabled
        .get()
        == 1));
    let mut frames = 0;
    while rig.metrics.adaptive.busy_poll_us.get() == 0 && frames < 600 {
        paced_driver(&rig, &mut tx, false, 20, Duration::from_micros(200));
        frames += 20;
    }
    assert!(
        rig.metrics.adaptive.busy_poll_us.get() > 0,
        "{frames} frames"
    );
    // Off: the fixed window (0 here) is back, every frame kicks again.
    let off = NetTuningUpdate {
        adaptive: Some(Adaptive::default()),
        ..NetTuningUpdate::default()
    };
    rig.tuning.update(&off).expect("valid");
    assert!(wait_until(Duration::from_secs(5), || rig
        .metrics
        .adaptive
        .enabled
        .get()
        == 0));
    assert_eq!(rig.metrics.adaptive.busy_poll_us.get(), 0);
    let kicks = paced_driver(&rig, &mut tx, false, 10, Duration::from_micros(300));
    assert_eq!(kicks, 10);
    // Bounds out of range are refused with the field named.
    let bad = NetTuningUpdate {
        adaptive: Some(Adaptive {
            interval_us: 5,
            ..adaptive(1, 1)
        }),
        ..NetTuningUpdate::default()
    };
    let e = rig.tuning.update(&bad).expect_err("refused");
    assert!(e.to_string().contains("adaptive.interval_us"), "{e}");
}
