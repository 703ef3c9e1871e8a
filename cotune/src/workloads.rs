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
use crate::frames::test_frame;
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
    }
}

fn delta(a: &Mark, b: &Mark, workload: Workload) -> Sample {
    let dev_tx_frames = b.dev_tx - a.dev_tx;
    let dev_rx_frames = b.dev_rx - a.dev_rx;
    let packets = match workload {
        Workload::XskTx(_) | Workload::XdpBounce | Workload::Echo | Workload::Fwd => dev_tx_frames,
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
    }
}

fn counters_delta(a: &Counters, b: &Counters) -> Counters {
    Counters {
        tx_frames: b.tx_frames - a.tx_frames,
        tx_bytes: b.tx_bytes - a.tx_bytes,
        rx_frames: b.rx_frames - a.rx_frames,
        rx_bytes: b.rx_bytes - a.rx_bytes,
        kicks: b.kicks - a.kicks,
        kicks_suppressed: b.kicks_suppressed - a.kicks_suppressed,
        rx_kicks: b.rx_kicks - a.rx_kicks,
        interrupts: b.interrupts - a.interrupts,
        tx_reclaimed: b.tx_reclaimed - a.tx_reclaimed,
        tx_reclaim_polls: b.tx_reclaim_polls - a.tx_reclaim_polls,
        ring_full: b.ring_full - a.ring_full,
        xdp_tx: b.xdp_tx - a.xdp_tx,
        ..*b
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
    }
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
