//! The driver-side loops of each workload, and their measurement.
//!
//! Every workload runs a warm-up, then measures over a fixed duration: counters of the driver,
//! the device and both threads' CPU time are read before and after, and the deltas make a
//! [`Sample`].

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use vnet_driver::xsk::{self, Umem, XdpDesc, XskConfig, XskMode};
use vnet_driver::{Counters, Hal, TxCompletion, XdpAction};

use crate::cost::{spin_for_ns, task_cpu_ns, threads_named};
use crate::frames::{check_frame, test_frame, write_test_frame};
use crate::mixed::Phases;
use crate::rig::Rig;

/// What one trial measured (deltas over the measured window).
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Measured wall time, s.
    pub secs: f64,
    /// Packets counted by the workload (device tx frames, plus device rx frames when the
    /// workload receives too).
    pub packets: u64,
    /// Driver counters delta.
    pub driver: Counters,
    /// Device tx frames written to the backend.
    pub dev_tx_frames: u64,
    /// Device rx frames delivered to the driver.
    pub dev_rx_frames: u64,
    /// Device tx-queue interrupts raised.
    pub dev_tx_irqs: u64,
    /// Driver thread CPU ns.
    pub driver_cpu_ns: u64,
    /// Device worker CPU ns.
    pub device_cpu_ns: u64,
    /// Device busy-poll windows that found work.
    pub dev_busy_poll_found: u64,
    /// Microseconds the device busy-polled.
    pub dev_busy_poll_us: u64,
    /// Round-trip times of a request/response workload ([`Workload::PingPong`]; the trickle
    /// phases' of [`Workload::Mixed`]).
    pub latency: Option<Latency>,
    /// [`Workload::Mixed`]: the flood phases' round trips per second.
    pub flood_pps: Option<f64>,
    /// Where adaptation left both sides' knobs at the end of the trial.
    pub adapted: Adapted,
}

/// Where adaptation left the knobs at the end of a trial, and how often it moved them (over
/// the whole run, warm-up included). Meaningful for the side that adapts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adapted {
    /// Driver: kick threshold in use.
    pub kick_threshold: u64,
    /// Driver: XDP_TX bulk in use.
    pub xdp_bulk: u64,
    /// Driver: rx coalescing level requested (0: none).
    pub rx_coal_level: u64,
    /// Driver: changes of the three.
    pub driver_changes: u64,
    /// Device: busy-poll window chosen (µs).
    pub busy_poll_us: u64,
    /// Device: interrupt coalescing chosen (µs; 0: off).
    pub coalesce_usecs: u64,
    /// Device: changes of the busy-poll window.
    pub busy_poll_changes: u64,
    /// Device: changes of the coalescing.
    pub coalescing_changes: u64,
    /// Device: kick coalescing's look time chosen (µs; 0: off).
    pub kick_coalesce_usecs: u64,
    /// Device: changes of the kick coalescing.
    pub kick_coalescing_changes: u64,
}

impl Adapted {
    /// One line for a row's note: the sides that adapt (`device`, `driver`).
    pub fn describe(&self, device: bool, driver: bool) -> String {
        let mut parts = Vec::new();
        if driver {
            parts.push(format!(
                "driver ended at kick_threshold {} xdp_bulk {} rx_coal level {} ({} changes)",
                self.kick_threshold, self.xdp_bulk, self.rx_coal_level, self.driver_changes
            ));
        }
        if device {
            let mut part = format!(
                "device ended at busy_poll {} µs ({} changes) coalescing {} µs ({} changes)",
                self.busy_poll_us,
                self.busy_poll_changes,
                self.coalesce_usecs,
                self.coalescing_changes
            );
            if self.kick_coalescing_changes > 0 {
                part += &format!(
                    " kick coalescing {} µs ({} changes)",
                    self.kick_coalesce_usecs, self.kick_coalescing_changes
                );
            }
            parts.push(part);
        }
        parts.join("; ")
    }
}

impl Sample {
    /// Packets per second.
    pub fn pps(&self) -> f64 {
        self.packets as f64 / self.secs.max(1e-9)
    }
}

/// Which workload a trial runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// AF_XDP-style transmit from a umem (zero-copy or copy).
    XskTx(XskMode),
    /// Copy transmit in batches while receiving what the peer sends (NAPI-style loop).
    Bidirectional,
    /// Every received frame is bounced back with XDP_TX (MACs swapped).
    XdpBounce,
    /// As [`Workload::XdpBounce`], with a peer that keeps [`ECHO_WINDOW`] frames in flight
    /// instead of flooding: the driver guest's `echo=` workload, so that `--target both`
    /// compares the same thing on both sides.
    Echo,
    /// Receive only: every received frame is dropped (the driver guest's `rx=`), against a
    /// backend that generates frames (`source`).
    Rx,
    /// Forwarding at rate: the driver seeds [`FWD_WINDOW`] frames, then bounces every
    /// received frame with XDP_TX (the driver guest's `fwd= window=`), against a `loop`.
    Fwd,
    /// Request/response (the driver guest's `pingpong= window=W`): this many test frames in
    /// flight (1..=[`MAX_PINGPONG_WINDOW`]), each carrying its sequence number; every frame
    /// that comes back is timed (host `Instant`s), checked to be one in flight and intact,
    /// and replaced by the next (the returned buffer rewritten, XDP_TX). Against a `loop`, or
    /// a tap whose XDP program reflects every frame.
    PingPong(u32),
    /// The request/response loop of [`Workload::PingPong`] alternating between a flood
    /// (`window` frames in flight, 1..=[`MAX_PINGPONG_WINDOW`]) and a trickle (one frame in
    /// flight), each phase lasting `phase` on the host clock: the driver guest's `mixed=N
    /// window=W phase_us=P` (the phases' rules: [`crate::mixed`]). Its figures are the
    /// floods' round trips per second ([`Sample::flood_pps`]) and the trickles' round-trip
    /// times ([`Sample::latency`]). Against a `loop`, or a tap whose XDP program reflects
    /// every frame.
    Mixed {
        /// Frames in flight during a flood.
        window: u32,
        /// How long each phase lasts.
        phase: Duration,
    },
}

impl Workload {
    /// A request/response workload: every frame must come back.
    pub fn round_trips(self) -> bool {
        matches!(self, Workload::PingPong(_) | Workload::Mixed { .. })
    }
}

/// Most frames [`Workload::PingPong`] keeps in flight (as the driver guest's `window=`).
pub const MAX_PINGPONG_WINDOW: u32 = 64;

/// Round-trip times of a request/response workload, in nanoseconds: exact nearest-rank
/// percentiles of every round trip measured (the `q`-quantile of `n` samples is the smallest
/// with at least `ceil(q · n)` samples at or below it), and what the check of the returned
/// frames found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    /// Round trips timed.
    pub samples: u64,
    /// The fastest.
    pub min_ns: u64,
    /// The median.
    pub p50_ns: u64,
    /// The 99th percentile.
    pub p99_ns: u64,
    /// The 99.9th percentile.
    pub p999_ns: u64,
    /// The slowest.
    pub max_ns: u64,
    /// Frames that came back damaged or with a sequence number not in flight.
    pub bad: u64,
    /// Frames sent that had not come back when the workload ended (counted where it runs
    /// to a number of round trips; a timed run ends with its window in flight).
    pub lost: u64,
}

impl Latency {
    /// The percentiles of `rtts` (sorted here); `None` when empty.
    pub fn of(rtts: &mut [u64]) -> Option<Latency> {
        rtts.sort_unstable();
        let n = rtts.len() as u64;
        let at = |num: u64| -> u64 {
            let rank = (n * num).div_ceil(1000).max(1);
            rtts[rank as usize - 1]
        };
        Some(Latency {
            samples: n,
            min_ns: *rtts.first()?,
            p50_ns: at(500),
            p99_ns: at(990),
            p999_ns: at(999),
            max_ns: *rtts.last()?,
            bad: 0,
            lost: 0,
        })
    }

    /// Errors unless every frame came back intact and the percentiles are in order and
    /// positive.
    pub fn check(&self) -> Result<(), String> {
        if self.bad > 0 || self.lost > 0 {
            return Err(format!(
                "{} frames came back bad, {} never came back",
                self.bad, self.lost
            ));
        }
        let ordered = [
            self.min_ns,
            self.p50_ns,
            self.p99_ns,
            self.p999_ns,
            self.max_ns,
        ];
        if self.samples == 0 || self.min_ns == 0 || ordered.windows(2).any(|w| w[0] > w[1]) {
            return Err(format!("round trips out of order or empty: {self:?}"));
        }
        Ok(())
    }
}

/// Frames the echo peer keeps in flight (as the VM target's host peer does).
pub const ECHO_WINDOW: u64 = 64;
/// Frames a forwarding workload keeps in flight (`window=` of the driver guest).
pub const FWD_WINDOW: u64 = 256;

struct Mark {
    t: Instant,
    driver: Counters,
    dev_tx: u64,
    dev_rx: u64,
    dev_tx_irqs: u64,
    drv_cpu: u64,
    dev_cpu: u64,
    busy_found: u64,
    busy_us: u64,
    /// The device's adaptation: busy-poll µs, coalescing µs, their changes, kick coalescing µs
    /// and its changes.
    device: [u64; 6],
}

fn device_worker_tid() -> Option<i32> {
    threads_named("net-").into_iter().next()
}

fn mark(rig: &Rig, dev_tid: Option<i32>) -> Mark {
    Mark {
        t: Instant::now(),
        driver: rig.net.counters(),
        dev_tx: rig.metrics.tx.frames.get(),
        dev_rx: rig.metrics.rx.frames.get(),
        dev_tx_irqs: rig.metrics.tx.interrupts_raised.get(),
        drv_cpu: rig.cpu_ns(),
        dev_cpu: dev_tid.and_then(task_cpu_ns).unwrap_or(0),
        busy_found: rig.metrics.busy_poll.found_work.get(),
        busy_us: rig.metrics.busy_poll.polled_us.get(),
        device: {
            let a = &rig.metrics.adaptive;
            [
                a.busy_poll_us.get(),
                a.coalesce_usecs.get(),
                a.busy_poll_changes.get(),
                a.coalescing_changes.get(),
                a.kick_coalesce_usecs.get(),
                a.kick_coalescing_changes.get(),
            ]
        },
    }
}

fn delta(a: &Mark, b: &Mark, workload: Workload) -> Sample {
    let dev_tx_frames = b.dev_tx - a.dev_tx;
    let dev_rx_frames = b.dev_rx - a.dev_rx;
    let packets = match workload {
        Workload::XskTx(_)
        | Workload::XdpBounce
        | Workload::Echo
        | Workload::Fwd
        | Workload::PingPong(_)
        | Workload::Mixed { .. } => dev_tx_frames,
        Workload::Bidirectional => dev_tx_frames + dev_rx_frames,
        Workload::Rx => dev_rx_frames,
    };
    Sample {
        secs: (b.t - a.t).as_secs_f64(),
        packets,
        driver: counters_delta(&a.driver, &b.driver),
        dev_tx_frames,
        dev_rx_frames,
        dev_tx_irqs: b.dev_tx_irqs - a.dev_tx_irqs,
        driver_cpu_ns: b.drv_cpu - a.drv_cpu,
        device_cpu_ns: b.dev_cpu.saturating_sub(a.dev_cpu),
        dev_busy_poll_found: b.busy_found - a.busy_found,
        dev_busy_poll_us: b.busy_us - a.busy_us,
        latency: None,
        flood_pps: None,
        adapted: adapted(&b.driver, &b.device),
    }
}

/// The adaptation state from the driver's counters and the device's metrics.
fn adapted(driver: &Counters, device: &[u64; 6]) -> Adapted {
    Adapted {
        kick_threshold: driver.kick_threshold_now,
        xdp_bulk: driver.xdp_bulk_now,
        rx_coal_level: driver.rx_coal_level,
        driver_changes: driver.kick_threshold_changes
            + driver.xdp_bulk_changes
            + driver.rx_coal_changes,
        busy_poll_us: device[0],
        coalesce_usecs: device[1],
        busy_poll_changes: device[2],
        coalescing_changes: device[3],
        kick_coalesce_usecs: device[4],
        kick_coalescing_changes: device[5],
    }
}

/// The counters from `a` to `b`: each field listed is `b`'s less `a`'s, the others are `b`'s.
fn counters_delta(a: &Counters, b: &Counters) -> Counters {
    // A macro: a function cannot take the field names.
    macro_rules! since_a {
        ($($field:ident),*) => {
            Counters { $($field: b.$field - a.$field,)* ..*b }
        };
    }
    since_a! {
        tx_frames, tx_bytes, rx_frames, rx_bytes, kicks, kicks_suppressed, rx_kicks,
        interrupts, tx_reclaimed, tx_reclaim_polls, ring_full, xdp_tx
    }
}

/// Pacing of a transmit workload (the driver guest's `burst=B pause_us=P`): after every
/// `burst` frames queued and flushed, the driver spins `pause_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// Frames per burst (1..=64 here).
    pub burst: u32,
    /// Microseconds the driver spins after each burst.
    pub pause_us: u32,
}

/// Runs `workload` on `rig` for `warmup` then `duration`, with frames of `frame_size` bytes,
/// paced by `pace` (transmit workloads only).
pub fn run(
    rig: &mut Rig,
    workload: Workload,
    frame_size: usize,
    pace: Option<Pace>,
    warmup: Duration,
    duration: Duration,
) -> Sample {
    match workload {
        Workload::XskTx(mode) => xsk_tx(rig, mode, frame_size, pace, warmup, duration),
        Workload::Bidirectional => bidirectional(rig, frame_size, warmup, duration),
        Workload::XdpBounce | Workload::Echo => {
            xdp_bounce(rig, frame_size, warmup, duration, workload)
        }
        Workload::Rx => rx_only(rig, warmup, duration),
        Workload::Fwd => {
            seed(rig, frame_size, FWD_WINDOW);
            xdp_bounce(rig, frame_size, warmup, duration, workload)
        }
        Workload::PingPong(window) => {
            let pp = PingPong::new(window, frame_size, Instant::now() + warmup);
            request_response(rig, pp, workload, warmup, duration)
        }
        Workload::Mixed { window, phase } => {
            let pp = PingPong::mixed(window, phase, frame_size, Instant::now() + warmup);
            request_response(rig, pp, workload, warmup, duration)
        }
    }
}

/// Runs the loop of `pp` (seeded here) for `warmup`, then measures it for `duration`.
fn request_response(
    rig: &mut Rig,
    mut pp: PingPong,
    workload: Workload,
    warmup: Duration,
    duration: Duration,
) -> Sample {
    pp.seed(rig, u64::MAX);
    let (a, b) = measure_window(rig, warmup, duration, &mut |rig| {
        pp.step(rig, u64::MAX);
    });
    let mut sample = delta(&a, &b, workload);
    sample.latency = pp.latency(false);
    sample.flood_pps = pp.flood_pps();
    sample
}

/// One frame in flight: its sequence number, when it was queued, and whether it was sent
/// during a flood of [`Workload::Mixed`] (always for [`Workload::PingPong`]).
#[derive(Clone, Copy, Debug)]
struct Slot {
    seq: u32,
    sent_at: Instant,
    flood: bool,
}

/// The request/response loop of [`Workload::PingPong`] and [`Workload::Mixed`].
pub struct PingPong {
    /// Per slot (the window): the frame in flight.
    slots: Vec<Option<Slot>>,
    /// Frames sent (the next sequence number).
    sent: u64,
    /// Frames back (intact and in flight).
    returned: u64,
    /// Frames back that were damaged or not in flight.
    bad: u64,
    /// Round trips of the frames that came back from `record_from` on (of [`Workload::Mixed`]:
    /// the trickle's), ns.
    rtts: Vec<u64>,
    record_from: Instant,
    frame_size: usize,
    /// [`Workload::Mixed`]'s phases.
    phases: Option<Phases>,
}

impl PingPong {
    /// `window` frames of `frame_size` bytes in flight (1..=[`MAX_PINGPONG_WINDOW`]); round
    /// trips ending before `record_from` are not recorded (a warm-up).
    pub fn new(window: u32, frame_size: usize, record_from: Instant) -> PingPong {
        let window = window.clamp(1, MAX_PINGPONG_WINDOW) as usize;
        PingPong {
            slots: vec![None; window],
            sent: 0,
            returned: 0,
            bad: 0,
            rtts: Vec::new(),
            record_from,
            frame_size,
            phases: None,
        }
    }

    /// [`Workload::Mixed`]: floods of `window` frames (1..=[`MAX_PINGPONG_WINDOW`]) and
    /// trickles of one, phases of `phase`, starting with a flood now; as [`PingPong::new`]
    /// otherwise (only the trickles' round trips are recorded).
    pub fn mixed(
        window: u32,
        phase: Duration,
        frame_size: usize,
        record_from: Instant,
    ) -> PingPong {
        let window = window.clamp(1, MAX_PINGPONG_WINDOW);
        let mut pp = PingPong::new(window, frame_size, record_from);
        pp.phases = Some(Phases::new(window, phase, Instant::now(), record_from));
        pp
    }

    /// A frame sent now belongs to a flood (of [`Workload::Mixed`]; always otherwise).
    fn flooding(&self) -> bool {
        self.phases.as_ref().is_none_or(Phases::flooding)
    }

    /// Sends the next frame by copy into a free slot (waiting for ring space until
    /// `deadline`); false if there is no free slot or no room in time.
    fn send_copy(&mut self, rig: &mut Rig, frame: &mut [u8], deadline: Instant) -> bool {
        let Some(i) = self.slots.iter().position(Option::is_none) else {
            return false;
        };
        let seq = self.sent as u32;
        write_test_frame(frame, seq);
        while rig.net.transmit(frame).is_err() {
            rig.net.reclaim_tx();
            if Instant::now() >= deadline {
                return false;
            }
        }
        self.occupy(i, seq);
        true
    }

    /// Slot `i` now holds frame `seq`, just sent (the next sequence number).
    fn occupy(&mut self, i: usize, seq: u32) {
        let flood = self.flooding();
        self.slots[i] = Some(Slot {
            seq,
            sent_at: Instant::now(),
            flood,
        });
        self.sent += 1;
    }

    /// Sends the first frames: the window, or `limit` frames if fewer (waiting for ring space
    /// as needed, at most a second).
    pub fn seed(&mut self, rig: &mut Rig, limit: u64) {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut frame = test_frame(self.frame_size, 0);
        while self.sent < limit && self.send_copy(rig, &mut frame, deadline) {}
    }

    /// A frame came back at `now` intact and in flight (its slot taken): records it and says
    /// whether to answer it with the next frame while fewer than `limit` were sent.
    fn record(&mut self, slot: Slot, now: Instant, limit: u64) -> bool {
        self.returned += 1;
        let more = self.sent < limit;
        let Some(phases) = self.phases.as_mut() else {
            if now >= self.record_from {
                self.rtts.push((now - slot.sent_at).as_nanos() as u64);
            }
            return more;
        };
        if !slot.flood && now >= self.record_from {
            self.rtts.push((now - slot.sent_at).as_nanos() as u64);
        }
        let in_flight = self.slots.iter().filter(|s| s.is_some()).count();
        phases.returned(slot.flood, in_flight, now, more)
    }

    /// One pass: takes an interrupt (waiting up to 1 ms for one), polls rx, times and checks
    /// each returned frame and sends the next in its place while fewer than `limit` were sent
    /// (of [`Workload::Mixed`]: as its phase says, and a new flood's top-up by copy), and
    /// reclaims tx as the bounce loop does.
    pub fn step(&mut self, rig: &mut Rig, limit: u64) {
        let irq = rig.take_interrupt(1);
        if irq || rig.net.rx_has_used() {
            let errors = rig.net.counters().xdp_tx_errors;
            // Slots answered with XDP_TX in this poll, in order.
            let mut bounced = Vec::new();
            rig.rx_poll(&mut |frame: &mut [u8]| {
                let now = Instant::now();
                let slot = check_frame(frame).and_then(|seq| {
                    self.slots
                        .iter()
                        .position(|s| s.is_some_and(|s| s.seq == seq))
                });
                let Some((i, slot)) = slot.and_then(|i| Some((i, self.slots[i].take()?))) else {
                    self.bad += 1;
                    return XdpAction::Drop;
                };
                if !self.record(slot, now, limit) {
                    return XdpAction::Drop;
                }
                let seq = self.sent as u32;
                if !write_test_frame(frame, seq) {
                    if let Some(p) = self.phases.as_mut() {
                        p.owe();
                    }
                    return XdpAction::Drop;
                }
                self.occupy(i, seq);
                bounced.push(i);
                XdpAction::Tx
            });
            // Frames the tx ring had no room for (`xdp_tx_errors`: the last ones a flush
            // added) are sent again by copy, so that the window stays whole.
            let failed = (rig.net.counters().xdp_tx_errors - errors) as usize;
            let mut frame = test_frame(self.frame_size, 0);
            for &i in &bounced[bounced.len().saturating_sub(failed)..] {
                let Some(slot) = self.slots[i].as_mut() else {
                    continue;
                };
                write_test_frame(&mut frame, slot.seq);
                let deadline = Instant::now() + Duration::from_secs(1);
                while rig.net.transmit(&frame).is_err() && Instant::now() < deadline {
                    rig.net.reclaim_tx();
                }
                slot.sent_at = Instant::now();
            }
            self.top_up(rig, limit);
        }
        if rig.net.config().tx_completion != TxCompletion::CleanFromRx {
            rig.net.reclaim_tx();
        }
    }

    /// [`Workload::Mixed`]: sends a new flood's frames due by copy (at most a second waiting
    /// for ring space).
    fn top_up(&mut self, rig: &mut Rig, limit: u64) {
        let owed = self.phases.as_mut().map_or(0, Phases::take_owed);
        if owed == 0 {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut frame = test_frame(self.frame_size, 0);
        for _ in 0..owed {
            if self.sent >= limit || !self.send_copy(rig, &mut frame, deadline) {
                break;
            }
        }
    }

    /// Frames that came back intact and in flight.
    pub fn returned(&self) -> u64 {
        self.returned
    }

    /// The recorded round trips' percentiles and the checks; `lost` counts the frames still
    /// in flight as lost (a run to a number of round trips).
    pub fn latency(&mut self, lost: bool) -> Option<Latency> {
        let mut l = Latency::of(&mut self.rtts)?;
        l.bad = self.bad;
        if lost {
            l.lost = self.slots.iter().filter(|s| s.is_some()).count() as u64;
        }
        Some(l)
    }

    /// [`Workload::Mixed`]: the floods' round trips per second (`None` for
    /// [`Workload::PingPong`], or before a flood frame came back).
    pub fn flood_pps(&self) -> Option<f64> {
        self.phases.as_ref()?.flood_pps()
    }

    /// [`Workload::Mixed`]: phases begun (0 for [`Workload::PingPong`]).
    pub fn phases(&self) -> u64 {
        self.phases.as_ref().map_or(0, Phases::phases)
    }
}

/// Runs [`Workload::PingPong`] with `window` frames in flight until `n` round trips (or
/// `timeout`), every round trip recorded: the percentiles, `bad` and `lost` (frames sent
/// that did not come back), or `None` if no frame came back.
pub fn pingpong_rounds(
    rig: &mut Rig,
    frame_size: usize,
    window: u32,
    n: u64,
    timeout: Duration,
) -> Option<Latency> {
    let deadline = Instant::now() + timeout;
    let mut pp = PingPong::new(window, frame_size, Instant::now());
    pp.seed(rig, n);
    while pp.returned() < n && Instant::now() < deadline {
        pp.step(rig, n);
    }
    // Every tx buffer back, as the driver guest waits for them before it reports.
    while rig.net.counters().tx_reclaimed < rig.net.counters().tx_frames + rig.net.counters().xdp_tx
        && Instant::now() < deadline
    {
        rig.take_interrupt(1);
        rig.net.reclaim_tx();
    }
    pp.latency(true)
}

/// Transmits `n` test frames (waiting for ring space as needed, at most a second).
fn seed(rig: &mut Rig, frame_size: usize, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut sent = 0;
    while sent < n && Instant::now() < deadline {
        let batch: Vec<Vec<u8>> = (sent..n.min(sent + 32))
            .map(|i| test_frame(frame_size, i as u32))
            .collect();
        sent += rig.net.transmit_batch(batch.iter().map(Vec::as_slice)).sent as u64;
        rig.net.reclaim_tx();
    }
}

fn rx_only(rig: &mut Rig, warmup: Duration, duration: Duration) -> Sample {
    let (a, b) = measure_window(rig, warmup, duration, &mut |rig| {
        let irq = rig.take_interrupt(1);
        if irq || rig.net.rx_has_used() {
            rig.rx_poll(&mut |_| XdpAction::Drop);
        }
    });
    delta(&a, &b, Workload::Rx)
}

/// Services completions and interrupts the way the configured tx-completion mode does, between
/// two transmit batches. `starved` says the transmitter has nothing left to send.
fn service(rig: &mut Rig, starved: bool) {
    let mode = rig.net.config().tx_completion;
    // A starved transmitter may block for an interrupt; a busy one only checks.
    let wait_ms = if starved && mode == TxCompletion::TxInterrupt {
        10
    } else {
        0
    };
    let irq = rig.take_interrupt(wait_ms);
    match mode {
        TxCompletion::TxInterrupt => {
            if irq || starved {
                rig.tx_poll();
            }
        }
        TxCompletion::CleanFromRx => {
            // The rx poll reclaims tx first (virtnet_poll_cleantx).
            rig.net.poll_rx(64, &mut |_| XdpAction::Drop);
        }
        TxCompletion::Lazy => {
            if starved {
                rig.net.reclaim_tx();
            }
        }
    }
}

fn xsk_tx(
    rig: &mut Rig,
    mode: XskMode,
    frame_size: usize,
    pace: Option<Pace>,
    warmup: Duration,
    duration: Duration,
) -> Sample {
    const CHUNK: u32 = 2048;
    const CHUNKS: u32 = 1024;
    let pages = (CHUNK * CHUNKS) as usize / vnet_driver::PAGE_SIZE;
    let Some((_, vaddr)) = rig.umem_hal.dma_alloc(pages) else {
        return Sample::default();
    };
    // SAFETY: the region was just allocated for this umem alone from the rig's guest memory,
    // which outlives the trial; nobody else touches it.
    let umem = match unsafe { Umem::new(&rig.umem_hal, vaddr, (CHUNK * CHUNKS) as usize, CHUNK) } {
        Ok(u) => u,
        Err(_) => return Sample::default(),
    };
    let mut free: Vec<u64> = (0..CHUNKS).filter_map(|i| umem.frame_addr(i)).collect();
    for (i, &addr) in free.iter().enumerate() {
        // SAFETY: no frame has been submitted yet; the application owns every chunk.
        let _ = unsafe { umem.write(addr, &test_frame(frame_size, i as u32)) };
    }
    let config = XskConfig {
        tx_ring_size: CHUNKS,
        completion_ring_size: CHUNKS,
        mode,
    };
    let Ok((mut sock, port)) = xsk::socket(umem, config) else {
        return Sample::default();
    };
    if rig.net.attach_xsk(port).is_err() {
        return Sample::default();
    }
    let len = frame_size as u32;
    let burst = pace.map_or(64, |p| p.burst.clamp(1, 64)) as usize;
    let pause_ns = pace.map_or(0, |p| u64::from(p.pause_us) * 1000);
    let mut descs: Vec<XdpDesc> = Vec::with_capacity(64);
    let mut step = |rig: &mut Rig, free: &mut Vec<u64>| {
        while let Some(addr) = sock.completion.pop() {
            free.push(addr);
        }
        sock.completion.release();
        descs.clear();
        let take = free.len().min(burst);
        descs.extend(
            free.drain(free.len() - take..)
                .map(|addr| XdpDesc { addr, len }),
        );
        let submitted = sock.submit_tx(&descs);
        // Descriptors the tx ring could not take go back to the free list.
        free.extend(descs[submitted..].iter().map(|d| d.addr));
        let sent = rig.net.xsk_transmit(burst);
        service(rig, sent == 0);
        spin_for_ns(pause_ns);
    };
    let dev_tid = measure_window(rig, warmup, duration, &mut |rig| step(rig, &mut free));
    let sample = delta(&dev_tid.0, &dev_tid.1, Workload::XskTx(mode));
    // Let the last frames complete, then detach so the umem can go.
    for _ in 0..100 {
        rig.net.reclaim_tx();
        if rig.net.detach_xsk().is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sample
}

/// Runs `step` for `warmup`, marks, runs it for `duration`, marks again.
fn measure_window(
    rig: &mut Rig,
    warmup: Duration,
    duration: Duration,
    step: &mut dyn FnMut(&mut Rig),
) -> (Mark, Mark) {
    let start = Instant::now();
    while start.elapsed() < warmup {
        step(rig);
    }
    let dev_tid = device_worker_tid();
    let a = mark(rig, dev_tid);
    let start = Instant::now();
    while start.elapsed() < duration {
        for _ in 0..16 {
            step(rig);
        }
    }
    let b = mark(rig, dev_tid);
    (a, b)
}

fn bidirectional(rig: &mut Rig, frame_size: usize, warmup: Duration, duration: Duration) -> Sample {
    let frames: Vec<Vec<u8>> = (0..32).map(|i| test_frame(frame_size, i)).collect();
    let (a, b) = measure_window(rig, warmup, duration, &mut |rig| {
        let batch = rig.net.transmit_batch(frames.iter().map(|f| f.as_slice()));
        let starved = batch.sent == 0;
        let irq = rig.take_interrupt(0);
        if irq || rig.net.rx_has_used() {
            rig.rx_poll(&mut |_| XdpAction::Drop);
        }
        match rig.net.config().tx_completion {
            TxCompletion::TxInterrupt => {
                if irq || starved {
                    rig.tx_poll();
                }
            }
            // Reclaimed inside poll_rx; with no rx traffic at all a starved transmitter polls.
            TxCompletion::CleanFromRx | TxCompletion::Lazy => {
                if starved {
                    rig.net.reclaim_tx();
                }
            }
        }
        if starved && !irq {
            rig.take_interrupt(1);
        }
    });
    delta(&a, &b, Workload::Bidirectional)
}

/// Bounces every received frame back with XDP_TX. Forwarding (`Workload::Fwd`) keeps its
/// window: a frame XDP_TX could not queue (the tx ring full) is replaced by a fresh one.
fn xdp_bounce(
    rig: &mut Rig,
    frame_size: usize,
    warmup: Duration,
    duration: Duration,
    workload: Workload,
) -> Sample {
    let refill = test_frame(frame_size, 0);
    let mut dropped = rig.net.counters().xdp_tx_errors;
    let mut owed = 0u64;
    let (a, b) = measure_window(rig, warmup, duration, &mut |rig| {
        let irq = rig.take_interrupt(1);
        if irq || rig.net.rx_has_used() {
            rig.rx_poll(&mut |frame: &mut [u8]| {
                vnet_driver::xdp::swap_macs(frame);
                XdpAction::Tx
            });
        }
        if rig.net.config().tx_completion != TxCompletion::CleanFromRx {
            rig.net.reclaim_tx();
        }
        if workload == Workload::Fwd {
            let now = rig.net.counters().xdp_tx_errors;
            owed += now - dropped;
            dropped = now;
            while owed > 0 && rig.net.transmit(&refill).is_ok() {
                owed -= 1;
            }
        }
    });
    delta(&a, &b, workload)
}

/// A peer thread for workloads that receive: sends `frame_size` frames into `fd` (with a
/// zeroed virtio-net header when `with_header`) as fast as the backend takes them, and drains
/// whatever comes back, until `stop`.
pub fn peer_loop(
    fd: RawFd,
    frame_size: usize,
    with_header: bool,
    window: Option<u64>,
    stop: &std::sync::atomic::AtomicBool,
) -> (u64, u64) {
    use std::sync::atomic::Ordering;
    let mut out = if with_header {
        vec![0u8; vnet_driver::VNET_HDR_LEN]
    } else {
        Vec::new()
    };
    out.extend_from_slice(&test_frame(frame_size, 0));
    let mut buf = vec![0u8; 70_000];
    let (mut sent, mut received) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let mut progress = false;
        for _ in 0..32 {
            if window.is_some_and(|w| sent - received.min(sent) >= w) {
                break;
            }
            // SAFETY: send reads out.len() bytes from out, which lives for the call.
            let n = unsafe { libc::send(fd, out.as_ptr().cast(), out.len(), libc::MSG_DONTWAIT) };
            if n <= 0 {
                break;
            }
            sent += 1;
            progress = true;
        }
        loop {
            // SAFETY: recv writes at most buf.len() bytes into buf, which lives for the call.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n <= 0 {
                break;
            }
            received += 1;
            progress = true;
        }
        if !progress {
            crate::env::wait_readable(fd, 1);
        }
    }
    (sent, received)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(Latency::of(&mut []), None);
        // 1..=1000 shuffled: p50 is the 500th, p99 the 990th, p99.9 the 999th.
        let mut v: Vec<u64> = (1..=1000).map(|i| (i * 7919) % 1000 + 1).collect();
        let l = Latency::of(&mut v).unwrap();
        assert_eq!(
            (l.samples, l.min_ns, l.p50_ns, l.p99_ns, l.p999_ns, l.max_ns),
            (1000, 1, 500, 990, 999, 1000)
        );
        l.check().unwrap();
        // Fewer samples than 1000: p99.9 is the largest; one sample is every percentile.
        let l = Latency::of(&mut [30, 10, 20]).unwrap();
        assert_eq!((l.p50_ns, l.p99_ns, l.p999_ns), (20, 30, 30));
        let l = Latency::of(&mut [5]).unwrap();
        assert_eq!((l.min_ns, l.p50_ns, l.p999_ns, l.max_ns), (5, 5, 5, 5));
        // A slow tail of 2 in 1000 moves p99.9 and max only.
        let mut v = vec![100u64; 998];
        v.extend([9000, 9000]);
        let l = Latency::of(&mut v).unwrap();
        assert_eq!(
            (l.p50_ns, l.p99_ns, l.p999_ns, l.max_ns),
            (100, 100, 9000, 9000)
        );
    }

    #[test]
    fn check_refuses_loss_damage_and_disorder() {
        let good = Latency::of(&mut [10, 20, 30]).unwrap();
        good.check().unwrap();
        for bad in [
            Latency { bad: 1, ..good },
            Latency { lost: 1, ..good },
            Latency { min_ns: 0, ..good },
            Latency { p99_ns: 5, ..good },
            Latency::default(),
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
