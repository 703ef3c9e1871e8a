//! `calibrate=N`: measures, with the TSC, what notifications and interrupts cost the driver on
//! this host, in the ring the driver loop runs in (`ring=3` for the numbers that matter on a
//! host that emulates guest kernel mode). Each measurement takes `N` samples; the result line
//! carries medians and 10th/90th percentiles (`vnet_baremetal::calibrate`).
//!
//! - **kick**: one QueueNotify write of the tx queue, exactly the driver's kick
//!   ([`vnet_driver::Transport::notify`] on the MMIO window), timed with fenced TSC reads around
//!   the write. KVM completes it through the device's ioeventfd (an eventfd write that wakes
//!   the device worker) without leaving the kernel. The tx ring has nothing new, so the worker
//!   wakes, finds nothing and sleeps again; samples are [`SPACING_NS`] apart so that every kick
//!   finds it asleep, as a kick after an idle period does.
//! - **exit**: one read of the local APIC's ID register. It is the cheapest exit that reaches
//!   no device and no userspace: the page is MMIO for the guest, KVM's in-kernel local APIC
//!   answers the read, and the vCPU resumes without returning to the VMM process (unlike an
//!   access to an unclaimed MMIO or port address, which `KVM_RUN` hands to the VMM, or the
//!   device's registers, which reach the device model). It also works from user mode (the
//!   page is mapped user-accessible; port I/O is not allowed at CPL3). `cpuid` (leaf 0), the
//!   usual no-op exit on VMX hosts, is measured too (`cpuid_ns`) but is not the reference: a
//!   host that runs guest user mode natively need not trap it (KVM's PVM module does, and
//!   there it costs more than the APIC read: ~3.7 against ~2.8 µs at `ring=3`). On a host
//!   with APIC-register virtualisation (APICv) the APIC read does not exit at all and
//!   `exit_ns` drops to tens of nanoseconds; `cpuid_ns` is the exit there.
//! - **irq**: the time one device interrupt takes away from the code it interrupts (delivery,
//!   the kernel-mode handler `irq_device` — count, EOI, `iretq` — and the return): a loop
//!   that only reads the TSC and the interrupt count spins while the device completes one tx
//!   buffer; the largest gap between two of its TSC reads, minus the loop's own median
//!   iteration (`loop_ns`), is the sample. A sample during which the timer ticked is dropped.
//!   The interrupt comes from sending one frame with tx interrupts armed (`used_event` at the
//!   next used entry; whatever `tx_completion=` says), the device's ordinary completion path.
//!   When the device worker runs on the vCPU's host core, the worker runs inside the kick's
//!   exit and the interrupt is injected before the loop starts: such a sample is dropped and
//!   counted in `irq_early`. A dropped sample is retried with another frame, up to 4 frames
//!   per sample asked for (`irq_attempts`). With fewer than 10 % of the samples kept (a
//!   loaded host, where the worker and the vCPU share a core all along; `taskset -c 0 vmm`
//!   gives it at will) the few left are outliers, not the interrupt's cost: `irq` then
//!   measures `N` interrupts of the local APIC timer instead, restarted at ~20 µs for each
//!   (same injection, same three-instruction handler), and says so (`irq_source`).
//! - **irq_latency**: from the TSC read just before the frame is queued and kicked to the
//!   interrupt's arrival in the spinning loop (the start of the largest gap; the handler's
//!   entry follows within the delivery part of `irq`): the kick's exit, the worker's
//!   wake-up, its processing of the frame (a `writev` to the tap), the irqfd signal and the
//!   injection. For an interrupt taken during its kick, the kick's duration (an upper bound).
//!   Dropped when the timer ticked or the driver's kick decision suppressed the kick.
//! - **isr**: the driver's interrupt service routine after each interrupt
//!   ([`vnet_driver::VirtioNet::handle_interrupt`]: InterruptStatus read and InterruptACK
//!   write, two MMIO exits the VMM handles in userspace).
//!
//! The fenced TSC pair's own cost (its median, measured first) is subtracted from the kick,
//! exit, cpuid and isr samples.

use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use vnet_baremetal::calibrate::{cycles_to_ns, ns_to_cycles, Calibration, IrqSource, Percentiles};
use vnet_baremetal::cmdline::Options;
use vnet_baremetal::frames::Ramp;
use vnet_driver::transport::Transport;
use vnet_driver::{MmioTransport, QueueId, Rearm, TxError, VirtioNet};

use crate::arch::{apic, cpu, DEVICE_IRQS, TICKS};
use crate::memory::DmaHal;

type Net = VirtioNet<DmaHal, MmioTransport>;

/// The tx queue's index (virtio-net: receiveq 0, transmitq 1).
const TX_QUEUE: u16 = 1;
/// Time between two kick (and two interrupt) samples, so that the device worker is asleep.
const SPACING_NS: u64 = 50_000;
/// Longest wait for one interrupt.
const IRQ_WAIT_NS: u64 = 100_000_000;
/// Iterations of the undisturbed timing loop measured for `loop_ns`.
const LOOP_SAMPLES: usize = 10_000;
/// Iterations the interrupt loop keeps spinning after it saw the count move (the interrupt
/// may have arrived just before the read that saw it, or just after the TSC read before).
const TAIL: u32 = 4;
/// Frames the interrupt measurement may send per sample asked for: a sample is dropped (and
/// another frame sent) when the timer ticked or the interrupt came during the kick.
const MAX_ATTEMPTS: u32 = 4;
/// The tick's count (APIC bus cycles / 16) for one timer sample: ~20 µs at KVM's 1 GHz bus.
const TIMER_DELAY_COUNT: u32 = 1250;
/// Source MAC when the device offers none (as the tx workload).
const FALLBACK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// Runs the measurements: `samples` of each, the TSC at `tsc_khz`, giving up at TSC `deadline`.
pub fn calibrate(
    net: &mut Net,
    o: &Options,
    samples: u32,
    tsc_khz: u64,
    deadline: u64,
) -> Result<Calibration, &'static str> {
    let n = samples as usize;
    let spacing = ns_to_cycles(SPACING_NS, tsc_khz);
    let overhead = tsc_overhead(n);
    let (mut exit, mut cpuid) = exits(n, overhead);
    let mut kick = Vec::with_capacity(n);
    for _ in 0..n {
        spin(spacing);
        kick.push(timed(overhead, || net.transport_mut().notify(TX_QUEUE)));
        if cpu::rdtsc() >= deadline {
            return Err("calibrate: timeout_ms passed while measuring kicks");
        }
    }
    let loop_cycles = loop_iteration();
    let mut d = device_interrupts(net, o, samples, tsc_khz, deadline, overhead, loop_cycles)?;
    let irq_samples = d.irq.len() as u32;
    // Fewer than 10 % of the device's interrupts in the loop: the few that are left are the
    // odd ones (the worker scheduled late), not the interrupt's cost. Measure the local APIC
    // timer's interrupt instead: same injection, same kind of handler.
    let irq_source = if d.irq.is_empty() || d.irq.len() * 10 < n {
        d.irq = timer_interrupts(n, loop_cycles, tsc_khz, deadline)?;
        IrqSource::ApicTimer
    } else {
        IrqSource::Device
    };
    let ns = |v: &mut Vec<u64>| Percentiles::of(v).unwrap_or_default().to_ns(tsc_khz);
    Ok(Calibration {
        ring: o.ring,
        tsc_khz,
        samples,
        kick: ns(&mut kick),
        exit: ns(&mut exit),
        irq: ns(&mut d.irq),
        irq_latency: ns(&mut d.latency),
        isr: ns(&mut d.isr),
        cpuid: ns(&mut cpuid),
        loop_ns: cycles_to_ns(loop_cycles, tsc_khz),
        irq_samples,
        irq_source,
        latency_samples: d.latency.len() as u32,
        irq_early: d.early,
        irq_attempts: d.attempts,
    })
}

/// The median of `n` fenced TSC pairs: what a timed sample subtracts.
fn tsc_overhead(n: usize) -> u64 {
    let mut empty = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = cpu::rdtsc_fenced();
        let t1 = cpu::rdtsc_fenced();
        empty.push(t1.wrapping_sub(t0));
    }
    Percentiles::of(&mut empty).map_or(0, |p| p.median)
}

/// `n` samples each of an exit (a local APIC register read) and of `cpuid`.
fn exits(n: usize, overhead: u64) -> (Vec<u64>, Vec<u64>) {
    let mut exit = Vec::with_capacity(n);
    let mut cpuid = Vec::with_capacity(n);
    for _ in 0..n {
        exit.push(timed(overhead, || {
            apic::read_id();
        }));
        cpuid.push(timed(overhead, || {
            cpu::cpuid(0);
        }));
    }
    (exit, cpuid)
}

/// The device interrupt's samples, in TSC cycles.
struct IrqSamples {
    /// The interrupt's cost (the timing loop's largest gap less an iteration).
    irq: Vec<u64>,
    /// From the kick to the interrupt.
    latency: Vec<u64>,
    /// The service routine.
    isr: Vec<u64>,
    /// Interrupts taken before the kick returned.
    early: u32,
    /// Frames sent.
    attempts: u32,
}

/// Sends a frame at a time and times the device's tx interrupt for it, until `samples` are
/// kept (or `MAX_ATTEMPTS` × `samples` frames are sent).
fn device_interrupts(
    net: &mut Net,
    o: &Options,
    samples: u32,
    tsc_khz: u64,
    deadline: u64,
    overhead: u64,
    loop_cycles: u64,
) -> Result<IrqSamples, &'static str> {
    let n = samples as usize;
    let spacing = ns_to_cycles(SPACING_NS, tsc_khz);
    let mut d = IrqSamples {
        irq: Vec::with_capacity(n),
        latency: Vec::with_capacity(n),
        isr: Vec::with_capacity(n),
        early: 0,
        attempts: 0,
    };
    let size = o.frame_size;
    let ramp = Ramp::new(size);
    let mut frame = vec![0u8; size];
    let src = net.mac().unwrap_or(FALLBACK_MAC);
    let tx_size = usize::from(net.queue_sizes().1);
    // Only the tx queue's completion may interrupt (best effort: the host sends nothing).
    net.disable_interrupts(QueueId::Rx);
    // A dropped sample is retried, up to MAX_ATTEMPTS × samples frames.
    while d.irq.len() < n && d.attempts < samples.saturating_mul(MAX_ATTEMPTS) {
        d.attempts += 1;
        spin(spacing);
        // Tx interrupts armed at the next used entry, the ring empty.
        while net.enable_interrupts(QueueId::Tx) == Rearm::UsedPending {
            net.reclaim_tx();
        }
        if !ramp.fill(&mut frame, o.dst, src, d.attempts) {
            return Err("calibrate: cannot build a frame of size=");
        }
        let k = sample_interrupt(net, &frame, overhead, tsc_khz, deadline)?;
        d.isr.push(k.isr);
        if k.ticked {
            // The tick's gap may be the largest: drop the sample.
        } else if k.early {
            d.early += 1;
            // The interrupt was taken before the kick returned: its latency is at most the
            // kick's duration.
            if k.kicked {
                d.latency.push(k.t_kicked.wrapping_sub(k.t0));
            }
        } else {
            d.irq.push(k.gap.saturating_sub(loop_cycles));
            if k.kicked {
                d.latency.push(k.at.wrapping_sub(k.t0));
            }
        }
        // The device used the buffer before it interrupted: reclaim it.
        while net.tx_free_descriptors() < tx_size {
            net.reclaim_tx();
            if cpu::rdtsc() >= deadline {
                return Err("calibrate: the device did not return a tx buffer");
            }
        }
    }
    Ok(d)
}

/// One frame's interrupt as [`sample_interrupt`] timed it (TSC values and cycles).
struct IrqSample {
    /// Before the frame was queued.
    t0: u64,
    /// After the flush (and its kick, if any) returned.
    t_kicked: u64,
    /// The flush kicked.
    kicked: bool,
    /// The interrupt came during the kick.
    early: bool,
    /// The timing loop's largest gap, and the TSC at its end.
    gap: u64,
    at: u64,
    /// The service routine's cycles.
    isr: u64,
    /// The timer ticked meanwhile.
    ticked: bool,
}

/// Queues `frame`, flushes, waits in the timing loop for the device's interrupt and runs the
/// service routine, timing each.
fn sample_interrupt(
    net: &mut Net,
    frame: &[u8],
    overhead: u64,
    tsc_khz: u64,
    deadline: u64,
) -> Result<IrqSample, &'static str> {
    let irqs = DEVICE_IRQS.load(Ordering::Relaxed);
    let ticks = TICKS.load(Ordering::Relaxed);
    let kicks = net.counters().kicks;
    let t0 = cpu::rdtsc_fenced();
    match net.queue_tx(frame) {
        Ok(()) => {}
        Err(TxError::RingFull) => return Err("calibrate: the tx ring is full"),
        Err(_) => return Err("calibrate: the driver refused a frame"),
    }
    net.flush_tx();
    let t_kicked = cpu::rdtsc_fenced();
    let kicked = net.counters().kicks > kicks;
    // Already interrupted: the worker ran on this vCPU's host core during the kick's exit
    // and the interrupt was injected on the way back; it did not interrupt the loop.
    let early = DEVICE_IRQS.load(Ordering::Relaxed) != irqs;
    let limit = deadline.min(t0.saturating_add(ns_to_cycles(IRQ_WAIT_NS, tsc_khz)));
    let Some((gap, at)) = wait_interrupt(&DEVICE_IRQS, irqs, limit) else {
        return Err("calibrate: no device interrupt after a frame was sent");
    };
    let t1 = cpu::rdtsc_fenced();
    net.handle_interrupt();
    let t2 = cpu::rdtsc_fenced();
    Ok(IrqSample {
        t0,
        t_kicked,
        kicked,
        early,
        gap,
        at,
        isr: t2.wrapping_sub(t1).saturating_sub(overhead),
        ticked: TICKS.load(Ordering::Relaxed) != ticks,
    })
}

/// The fallback for `irq`: `n` interrupts of the local APIC timer, each
/// [`TIMER_DELAY_COUNT`] after a restart of the tick, measured as the device's are (largest
/// gap of the timing loop less `loop_cycles`). The usual tick is restored at the end.
fn timer_interrupts(
    n: usize,
    loop_cycles: u64,
    tsc_khz: u64,
    deadline: u64,
) -> Result<Vec<u64>, &'static str> {
    let mut irq = Vec::with_capacity(n);
    let irqs = DEVICE_IRQS.load(Ordering::Relaxed);
    let mut result = Ok(());
    for _ in 0..n {
        let ticks = TICKS.load(Ordering::Relaxed);
        apic::restart_tick(Some(TIMER_DELAY_COUNT));
        let limit = deadline.min(cpu::rdtsc().saturating_add(ns_to_cycles(IRQ_WAIT_NS, tsc_khz)));
        let sample = wait_interrupt(&TICKS, ticks, limit);
        // Back to the slow tick before the next one fires.
        apic::restart_tick(None);
        match sample {
            Some((gap, _)) => irq.push(gap.saturating_sub(loop_cycles)),
            None => {
                result = Err("calibrate: no local APIC timer interrupt");
                break;
            }
        }
    }
    apic::restart_tick(None);
    // A device interrupt in the loop would have been measured instead of the tick.
    if DEVICE_IRQS.load(Ordering::Relaxed) != irqs {
        return Err("calibrate: a device interrupt disturbed the APIC timer measurement");
    }
    result.map(|()| irq)
}

/// TSC cycles `f` took, less `overhead` (the fenced pair's own cost).
#[inline(always)]
fn timed(overhead: u64, f: impl FnOnce()) -> u64 {
    let t0 = cpu::rdtsc_fenced();
    f();
    let t1 = cpu::rdtsc_fenced();
    t1.wrapping_sub(t0).saturating_sub(overhead)
}

/// Spins for `cycles` TSC cycles.
fn spin(cycles: u64) {
    let end = cpu::rdtsc().saturating_add(cycles);
    while cpu::rdtsc() < end {
        core::hint::spin_loop();
    }
}

/// The median iteration of [`wait_interrupt`]'s loop when nothing interrupts it, in cycles.
fn loop_iteration() -> u64 {
    let mut gaps = vec![0u64; LOOP_SAMPLES];
    let irqs = DEVICE_IRQS.load(Ordering::Relaxed);
    let mut prev = cpu::rdtsc();
    for gap in gaps.iter_mut() {
        // The same two reads as the interrupt loop.
        let _moved = DEVICE_IRQS.load(Ordering::Relaxed) != irqs;
        let now = cpu::rdtsc();
        *gap = now.wrapping_sub(prev);
        prev = now;
    }
    Percentiles::of(&mut gaps).map_or(0, |p| p.median)
}

/// Spins reading the TSC and the interrupt count `counter` until the count moves from `seen`
/// (and [`TAIL`] iterations more), or until TSC `limit`. Returns the largest gap between two
/// consecutive TSC reads since the call and the TSC at the start of that gap.
fn wait_interrupt(counter: &AtomicU64, seen: u64, limit: u64) -> Option<(u64, u64)> {
    let mut prev = cpu::rdtsc();
    let (mut largest, mut start) = (0u64, prev);
    let mut tail: Option<u32> = None;
    loop {
        let moved = counter.load(Ordering::Relaxed) != seen;
        let now = cpu::rdtsc();
        let gap = now.wrapping_sub(prev);
        if gap > largest {
            (largest, start) = (gap, prev);
        }
        prev = now;
        match tail {
            Some(0) => return Some((largest, start)),
            Some(ref mut left) => *left -= 1,
            None if moved => tail = Some(TAIL),
            None if now >= limit => return None,
            None => {}
        }
    }
}
