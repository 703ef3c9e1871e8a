//! Both sides adapting at once, in closed loop over a model of the traffic: the device's
//! [`Adapter`] (busy-poll window, interrupt coalescing) and the driver's [`KickController`] and
//! [`RxDim`] (kick threshold, the rx coalescing it asks the device for), each fed what the
//! other's choices make the traffic look like, one interval (1 ms) at a time. The model is
//! deterministic, so the tests say exactly how fast both settle, that they then stay, and that
//! they follow a change of workload; the real thing is measured by the `adaptive` preset.

use devices::virtio::net::adapt::{Adapter, Observed};
use devices::virtio::net::{Adaptive, InterruptCoalescing};
use vnet_driver::adapt::{KickController, RxDim, RxSample, TxSample};

const INTERVAL_US: u64 = 1_000;

/// A workload of the model.
#[derive(Clone, Copy, Debug)]
enum Traffic {
    /// Transmit at 500 k frames/s in caller batches of 64; publishing N frames takes the
    /// driver 2 µs each, so a sleeping device is idle `2N` µs between publishes.
    Flood,
    /// One frame in flight: a round trip takes 20 µs plus any interrupt hold, and the driver's
    /// turnaround leaves the device idle 12 µs per trip.
    PingPong,
}

/// Both sides' controllers and the device's bounds.
struct Sides {
    device: Adapter,
    bounds: Adaptive,
    kick: KickController,
    dim: RxDim,
    /// The driver has sent the device an rx coalescing (NOTF_COAL): the guest's values win.
    guest_set: bool,
}

/// What one interval changed (device, driver).
type Changed = (bool, bool);

impl Sides {
    fn new() -> Sides {
        let bounds = Adaptive {
            enabled: true,
            ..Adaptive::default()
        };
        Sides {
            device: Adapter::new(bounds),
            bounds,
            kick: KickController::new(8, 256, 64),
            dim: RxDim::new(),
            guest_set: false,
        }
    }

    /// The rx hold in force: once the driver has sent one, the guest's request (it wins),
    /// held within the device's bound; before, the device's own.
    fn rx_hold_us(&self) -> u64 {
        if self.guest_set {
            u64::from(self.dim.profile().usecs.min(self.bounds.max_coalesce_usecs))
        } else {
            u64::from(self.device.coalescing().max_usecs)
        }
    }

    /// One interval of `traffic` under the current choices; both sides observe it.
    fn interval(&mut self, traffic: Traffic) -> Changed {
        let window = u64::from(self.device.busy_poll_us());
        let (device_seen, tx, rx) = match traffic {
            Traffic::Flood => {
                let n = u64::from(self.kick.value());
                let frames = 500;
                let publishes = frames / n;
                let gap = 2 * n;
                let polling = window >= gap;
                let device_seen = Observed {
                    frames,
                    interrupts: 0,
                    // One sleep in eight is timed.
                    short_gaps: if polling || gap > 64 {
                        0
                    } else {
                        publishes.div_ceil(8)
                    },
                    long_gaps: if polling || gap <= 64 {
                        0
                    } else {
                        publishes.div_ceil(8)
                    },
                    longest_short_gap_us: if polling || gap > 64 { 0 } else { gap as u32 },
                    // A polling device's windows find each publish; a shorter one runs out.
                    windows: if window > 0 { publishes } else { 0 },
                    windows_found: if polling { publishes } else { 0 },
                    elapsed_us: INTERVAL_US,
                    guest_coalesces: self.guest_set,
                    // The model has no kick coalescing: the device's rule for it stays out.
                    kicks: 0,
                    kicks_fixed: true,
                };
                let tx = TxSample {
                    frames: frames as u32,
                    decisions: publishes as u32,
                    kicks: if polling { 0 } else { publishes as u32 },
                    threshold_cuts: publishes as u32,
                    ring_full: 0,
                };
                (device_seen, tx, RxSample::default())
            }
            Traffic::PingPong => {
                let trips = INTERVAL_US / (20 + self.rx_hold_us());
                let polling = window >= 12;
                let device_seen = Observed {
                    frames: 2 * trips,
                    interrupts: trips,
                    short_gaps: if polling { 0 } else { trips.div_ceil(8) },
                    long_gaps: 0,
                    longest_short_gap_us: if polling { 0 } else { 12 },
                    windows: if window > 0 { trips } else { 0 },
                    windows_found: if polling { trips } else { 0 },
                    elapsed_us: INTERVAL_US,
                    guest_coalesces: self.guest_set,
                    // The model has no kick coalescing: the device's rule for it stays out.
                    kicks: 0,
                    kicks_fixed: true,
                };
                let tx = TxSample {
                    frames: trips as u32,
                    decisions: trips as u32,
                    kicks: if polling { 0 } else { trips as u32 },
                    threshold_cuts: 0,
                    ring_full: 0,
                };
                let rx = RxSample {
                    frames: trips,
                    interrupts: trips,
                    elapsed: INTERVAL_US,
                };
                (device_seen, tx, rx)
            }
        };
        let d = self.device.observe(device_seen);
        let kick = self.kick.observe(&tx);
        let dim = rx.frames > 0 && self.dim.observe(&rx);
        // A level change goes to the device as NOTF_COAL.
        self.guest_set |= dim;
        (
            d.busy_poll_us.is_some() || d.coalescing.is_some(),
            kick || dim,
        )
    }

    /// Runs `intervals` intervals; returns the last interval (1-based) in which either side
    /// changed, 0 if none did.
    fn run(&mut self, traffic: Traffic, intervals: usize) -> usize {
        let mut last = 0;
        for i in 1..=intervals {
            let (device, driver) = self.interval(traffic);
            if device || driver {
                last = i;
            }
        }
        last
    }

    fn state(&self) -> (u32, InterruptCoalescing, u16, u8) {
        (
            self.device.busy_poll_us(),
            self.device.coalescing(),
            self.kick.value(),
            self.dim.level(),
        )
    }
}

/// Both sides from the start on `traffic`: they settle within 80 intervals (a reversal of
/// the device's window waits 16, and a window closes one halving per 16-interval horizon: the
/// flood's driver ends up publishing 64 at a time, further apart than the window, which closes
/// from 16 µs in two halvings) and then stay for 300; returns them and where they settled.
fn settled(traffic: Traffic) -> (Sides, (u32, InterruptCoalescing, u16, u8)) {
    let mut s = Sides::new();
    let last = s.run(traffic, 88);
    assert!(
        last <= 80,
        "{traffic:?}: still changing at interval {last}: {:?}",
        s.state()
    );
    let at = s.state();
    assert_eq!(
        s.run(traffic, 300),
        0,
        "{traffic:?}: moved after settling at {at:?}"
    );
    (s, at)
}

#[test]
fn a_flood_settles_both_sides_and_they_stay() {
    let (_, settled) = settled(Traffic::Flood);
    // Either the device polls across the driver's publishes, or the driver batches as much as
    // it may into a device that sleeps: never frequent kicks into a sleeping device.
    let (window, coalescing, n, _) = settled;
    let polls = u64::from(window) >= 2 * u64::from(n);
    assert!(polls || n == 64, "{settled:?}");
    assert_eq!(coalescing, InterruptCoalescing::OFF);
}

#[test]
fn a_ping_pong_settles_both_sides_without_holding_interrupts() {
    let (s, settled) = settled(Traffic::PingPong);
    let (window, coalescing, _, level) = settled;
    assert!(
        window >= 12,
        "the window covers the turnaround: {settled:?}"
    );
    assert_eq!(
        (coalescing, level),
        (InterruptCoalescing::OFF, 0),
        "{settled:?}"
    );
    assert_eq!(s.rx_hold_us(), 0);
}

#[test]
fn a_workload_that_alternates_is_followed_within_a_bounded_number_of_intervals() {
    let mut s = Sides::new();
    s.run(Traffic::Flood, 30);
    for round in 0..5 {
        for traffic in [Traffic::PingPong, Traffic::Flood] {
            let last = s.run(traffic, 30);
            assert!(last <= 16, "round {round} {traffic:?}: changing at {last}");
            assert_eq!(
                s.rx_hold_us(),
                0,
                "round {round} {traffic:?}: {:?}",
                s.state()
            );
        }
    }
}
