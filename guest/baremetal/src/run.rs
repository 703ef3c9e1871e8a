//! The driver loop: bring the device up, run the workload, print the result line, power off.
//!
//! Runs in whichever ring `ring=` chose; everything privileged goes through [`crate::sys`].
//! Interrupts are taken the way a guest kernel takes them: the device's vector only counts
//! (in [`DEVICE_IRQS`]) and EOIs; the loop sees the count move and runs the driver's interrupt
//! service routine ([`VirtioNet::handle_interrupt`]: InterruptStatus read and acknowledge; with
//! `transport=pci`, [`VirtioNet::handle_msix`] per MSI-X vector that fired: no register
//! access), then the NAPI-style polls. The loop waits (`hlt`) only where an interrupt is due; where the
//! mode has none (tx completion without tx interrupts) it polls.
//!
//! With `queues=N` (N > 1) the driver sets up N queue pairs. The virtio-mmio device has one
//! interrupt line for all of them, so every interrupt schedules every pair's rx poll and tx
//! poll, and each pair re-arms its own interrupts when its poll comes up short. Over
//! virtio-pci every queue has its own MSI-X vector (counted per vector, reported per pair);
//! the loop runs `handle_msix` for each vector that fired and then polls as on mmio. The tx
//! workload spreads frames round robin per batch: the i-th batch (up to `batch=` frames, cut
//! short when that pair's ring is full) goes to pair `i mod N`; frame ids (sequence numbers)
//! stay global, so the host can check that every frame arrived intact whatever the pair. The
//! echo workload bounces each frame on the pair it arrived on (XDP_TX).
//!
//! `echo=`, `rx=`, `fwd=`, `pingpong=` and `mixed=` share one receive loop
//! ([`Driver::receive`]): `echo=` and `fwd=` bounce each test frame (XDP_TX), `fwd=` after
//! sending its window of test frames first; `rx=` checks each frame (pattern and per-pair
//! sequence number) and drops it; `pingpong=` times each frame's round trip and sends the next
//! in its place (XDP_TX); `mixed=` does the same in alternating flood and trickle phases
//! ([`vnet_baremetal::mixed`]).

use alloc::string::String;
use alloc::vec;
use core::cell::RefCell;
use core::fmt::Write;
use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use vnet_baremetal::calibrate::ns_to_cycles;
use vnet_baremetal::cmdline::{Coalesce, Options, Ring, TransportChoice, Wait, Workload};
use vnet_baremetal::devstats;
use vnet_baremetal::frames::{self, Ramp};
use vnet_baremetal::latency::{Histogram, RoundTrips};
use vnet_baremetal::mixed::{Flood, Mixed};
use vnet_baremetal::report::{Outcome, Report};
use vnet_driver::features::NET_F_DEVICE_STATS;
use vnet_driver::transport::WINDOW_SIZE;
use vnet_driver::{
    xdp, CtrlWait, MmioTransport, QueueId, Rearm, Transport, TxCompletion, TxError, VirtioNet,
    XdpAction,
};

use crate::arch::{cpu, DEVICE_IRQS, MSIX_IRQS, MSIX_VECTORS, TICKS};
use crate::memory::DmaHal;
use crate::sys::{self, fail_early};

mod queue_reset;

type Net = VirtioNet<DmaHal, MmioTransport>;

/// Source MAC when the device offers none.
const FALLBACK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// TSC frequency assumed for the timeout when neither the command line nor CPUID gives one.
const FALLBACK_TSC_KHZ: u64 = 1_000_000;
/// How long a control command waits for the device's answer (TSC-timed when the frequency is
/// known; otherwise the driver's default bound on polls).
const CTRL_TIMEOUT_MS: u64 = 1000;

/// The TSC frequency from CPUID leaf 0x15 (the VMM fills it in), kHz.
fn cpuid_tsc_khz() -> Option<u64> {
    let (max, ..) = cpu::cpuid(0);
    if max < 0x15 {
        return None;
    }
    let (den, num, crystal_hz, _) = cpu::cpuid(0x15);
    if den == 0 || num == 0 || crystal_hz == 0 {
        return None;
    }
    Some(u64::from(crystal_hz) * u64::from(num) / u64::from(den) / 1000)
}

/// Runs the whole program after the machine set-up; never returns.
pub fn main(o: &Options) -> ! {
    let tsc_khz = o.tsc_khz.or_else(cpuid_tsc_khz);
    if o.transport == TransportChoice::Pci {
        if o.hostile.is_some() {
            fail_early("hostile= needs transport=mmio");
        }
        if let Workload::Calibrate(_) = o.workload {
            fail_early("calibrate= needs transport=mmio");
        }
        let Some(transport) = crate::pci::take_transport() else {
            fail_early("transport=pci: the device was not set up");
        };
        let net = match VirtioNet::new(DmaHal, transport, o.driver) {
            Ok(net) => net,
            Err(e) => fail_early(&alloc::format!("driver initialisation failed: {e}")),
        };
        if let Err(e) = check_msix_vectors(&net) {
            fail_early(&e);
        }
        let (net, coalesce_error) = start(net, o, tsc_khz);
        finish(net, o, coalesce_error, tsc_khz)
    }
    let Some(dev) = o.device else {
        fail_early("no virtio_mmio.device= on the command line (start the VMM with --net)");
    };
    if dev.size < WINDOW_SIZE as u64 || dev.base < cpu::MMIO_START {
        fail_early("the virtio_mmio.device= window is too small or not in the MMIO hole");
    }
    let Some(base) = NonNull::new(dev.base as *mut u8) else {
        fail_early("virtio_mmio.device= at address 0");
    };
    // SAFETY: the VMM placed a virtio-mmio window of `dev.size` (≥ WINDOW_SIZE) bytes at
    // `dev.base`, page aligned (checked by the parser), which the page tables map uncached and
    // user-accessible; nothing else in this program touches it.
    let transport = unsafe { MmioTransport::new(base) };
    if let Some(which) = o.hostile {
        crate::hostile::run(transport, which);
    }
    let net = match VirtioNet::new(DmaHal, transport, o.driver) {
        Ok(net) => net,
        Err(e) => fail_early(&alloc::format!("driver initialisation failed: {e}")),
    };
    let (net, coalesce_error) = start(net, o, tsc_khz);
    if let (Workload::Calibrate(samples), None) = (o.workload, &coalesce_error) {
        let deadline = deadline(o, tsc_khz);
        calibrate(net, o, samples, tsc_khz, deadline);
    }
    finish(net, o, coalesce_error, tsc_khz)
}

/// The queues the driver uses: every pair's rx and tx, then the control queue.
fn used_queues<T: Transport>(net: &VirtioNet<DmaHal, T>) -> impl Iterator<Item = u16> {
    (0..2 * net.queue_pairs()).chain(net.ctrl_queue_index())
}

/// Every vector the driver assigned (configuration and each used queue) has a handler here
/// (< [`MSIX_VECTORS`]; `pci::init` programmed and unmasked those entries): a queue on an
/// entry without one would never interrupt.
fn check_msix_vectors<T: Transport>(net: &VirtioNet<DmaHal, T>) -> Result<(), String> {
    let t = net.transport();
    let config = core::iter::once((None, t.config_vector()));
    let queues = used_queues(net).map(|q| (Some(q), t.queue_vector(q)));
    for (queue, vector) in config.chain(queues) {
        if let Some(v) = vector.filter(|&v| usize::from(v) >= MSIX_VECTORS) {
            let what = match queue {
                Some(q) => alloc::format!("queue {q}"),
                None => String::from("configuration changes"),
            };
            return Err(alloc::format!(
                "transport=pci: {what} got MSI-X entry {v}, but this guest handles entries \
                 0..{MSIX_VECTORS}"
            ));
        }
    }
    Ok(())
}

/// MSI-X interrupts taken on `vector` (0 without one).
fn vector_irqs(vector: Option<u16>) -> u64 {
    vector
        .and_then(|v| MSIX_IRQS.get(usize::from(v)))
        .map_or(0, |c| c.load(Ordering::Relaxed))
}

/// The TSC value at which the workload gives up (`timeout_ms=`).
fn deadline(o: &Options, tsc_khz: Option<u64>) -> u64 {
    let timeout = o
        .timeout_ms
        .saturating_mul(tsc_khz.unwrap_or(FALLBACK_TSC_KHZ));
    cpu::rdtsc().saturating_add(timeout)
}

/// After bring-up: the ready line, the control-command clock, and `coalesce=` (its error, if
/// the device refused it).
fn start<T: Transport>(
    mut net: VirtioNet<DmaHal, T>,
    o: &Options,
    tsc_khz: Option<u64>,
) -> (VirtioNet<DmaHal, T>, Option<String>) {
    let mut line = String::new();
    let mac = net.mac().unwrap_or(FALLBACK_MAC);
    let _ = writeln!(
        line,
        "driver-guest: ready ring={} mac={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x} features={:#x} \
         queues={}/{} pairs={} heap_left={} transport={}",
        match o.ring {
            Ring::Kernel => 0,
            Ring::User => 3,
        },
        mac[0],
        mac[1],
        mac[2],
        mac[3],
        mac[4],
        mac[5],
        net.features(),
        net.queue_sizes().0,
        net.queue_sizes().1,
        net.queue_pairs(),
        crate::memory::remaining(),
        match o.transport {
            TransportChoice::Mmio => "mmio",
            TransportChoice::Pci => "pci",
        },
    );
    sys::write(line.as_bytes());
    if o.transport == TransportChoice::Pci {
        let t = net.transport();
        let mut line = String::new();
        // Pair 0 and the control queue, then the other pairs' queues.
        let _ = write!(
            line,
            "driver-guest: msix vectors config={:?} rx={:?} tx={:?} ctrl={:?}",
            t.config_vector(),
            t.queue_vector(0),
            t.queue_vector(1),
            net.ctrl_queue_index().and_then(|q| t.queue_vector(q)),
        );
        for pair in 1..net.queue_pairs() {
            let _ = write!(
                line,
                " rx{pair}={:?} tx{pair}={:?}",
                t.queue_vector(2 * pair),
                t.queue_vector(2 * pair + 1),
            );
        }
        line.push('\n');
        sys::write(line.as_bytes());
    }

    if o.driver.adaptive {
        // Rates per TSC cycle: the loop may halt between interrupts, so its polls do not
        // measure time (the frequency is not needed to compare two rates).
        net.set_adapt_clock(Some(cpu::rdtsc));
    }
    if let Some(khz) = tsc_khz.filter(|&k| k > 0) {
        net.set_ctrl_wait(CtrlWait::Clock {
            now: cpu::rdtsc,
            ticks: CTRL_TIMEOUT_MS.saturating_mul(khz),
        });
    }
    // `coalesce=`: once, after bring-up and before any workload. A refusal ends the run with
    // an error result line (no workload), which still reports the control counters.
    let coalesce_error = o.coalesce.and_then(|c| set_coalescing(&mut net, c).err());
    if coalesce_error.is_none() {
        if let Some(c) = o.coalesce {
            let mut line = String::new();
            let _ = writeln!(line, "driver-guest: coalesce={c} set");
            sys::write(line.as_bytes());
        }
    }
    (net, coalesce_error)
}

/// Runs the workload, prints the result line and powers off.
fn finish<T: Transport>(
    net: VirtioNet<DmaHal, T>,
    o: &Options,
    coalesce_error: Option<String>,
    tsc_khz: Option<u64>,
) -> ! {
    let deadline = deadline(o, tsc_khz);
    let pause_cycles = pause_cycles(o, tsc_khz);
    let phase_cycles = phase_cycles(o, tsc_khz);
    let rx_defer_cycles = rx_defer_cycles(o, tsc_khz);
    let pairs = net.queue_pairs();
    let mut d = Driver {
        net,
        o,
        msix: o.transport == TransportChoice::Pci,
        msix_seen: [0; MSIX_VECTORS],
        irqs_seen: 0,
        halts: 0,
        foreign: 0,
        rx_scheduled: vec![false; usize::from(pairs)],
        rx_short_since: vec![None; usize::from(pairs)],
        rx_defer_cycles,
        deadline,
        timed_out: false,
        pause_cycles,
        pauses: 0,
        phase_cycles,
        next_reset: o.reset.map_or(u64::MAX, |p| p.every),
        rx_check: None,
        round_trips: None,
        flood: None,
    };
    let (outcome, run) = d.run_workload(coalesce_error.as_deref());
    // The device's counters, before the driver's are copied: the statistics commands count
    // in `ctrl_commands` as in the device's CVQ `command_num`.
    let device_stats = (d.net.features() & NET_F_DEVICE_STATS != 0)
        .then(|| devstats::read_settled(&mut d.net, || stats_pause(tsc_khz)));
    let device_stats = device_stats
        .as_ref()
        .map(|r| r.as_ref().map_err(String::as_str));
    d.write_result(outcome, run, device_stats, tsc_khz);
    // The device is left running (not reset): the VMM prints its metrics as they are.
    sys::power_off()
}

/// TSC cycles of each pause of `burst=`/`pause_us=` (0: none); ends the run when a pause
/// needs the TSC's frequency and it is not known.
fn pause_cycles(o: &Options, tsc_khz: Option<u64>) -> u64 {
    match (o.pause, tsc_khz) {
        (Some(p), Some(khz)) => ns_to_cycles(u64::from(p.pause_us) * 1000, khz),
        (Some(p), None) if p.pause_us > 0 => fail_early(
            "pause_us= needs the TSC frequency (neither tsc_early_khz= nor CPUID leaf 0x15 gives it)",
        ),
        _ => 0,
    }
}

/// TSC cycles of `rx_defer_us=` (0: none); ends the run when they need the TSC's frequency and
/// it is not known.
fn rx_defer_cycles(o: &Options, tsc_khz: Option<u64>) -> u64 {
    match (o.rx_defer_us, tsc_khz.filter(|&k| k > 0)) {
        (0, _) => 0,
        (us, Some(khz)) => ns_to_cycles(u64::from(us) * 1000, khz),
        (_, None) => fail_early(
            "rx_defer_us= needs the TSC frequency (neither tsc_early_khz= nor CPUID leaf 0x15 gives it)",
        ),
    }
}

/// TSC cycles of each phase of `mixed=` (0 for the other workloads); ends the run when the
/// TSC's frequency is not known.
fn phase_cycles(o: &Options, tsc_khz: Option<u64>) -> u64 {
    let Workload::Mixed { phase_us, .. } = o.workload else {
        return 0;
    };
    match tsc_khz.filter(|&k| k > 0) {
        Some(khz) => ns_to_cycles(u64::from(phase_us) * 1000, khz),
        None => fail_early(
            "mixed= needs the TSC frequency (neither tsc_early_khz= nor CPUID leaf 0x15 gives it)",
        ),
    }
}

impl<T: Transport> Driver<'_, T> {
    /// Runs the workload, unless `coalesce=` was refused (then that is the run's error).
    fn run_workload<'e>(&mut self, coalesce_error: Option<&'e str>) -> (Outcome<'e>, Run) {
        let run = match (self.o.workload, coalesce_error) {
            (_, Some(_)) => Ok(Run::default()),
            (Workload::Tx(n), None) => self.tx(n),
            (Workload::Echo(n), None) => self.echo(n),
            (Workload::Rx(n), None) => self.rx(n),
            (Workload::Fwd { frames, window }, None) => self.fwd(frames, window),
            (Workload::PingPong { frames, window }, None) => self.pingpong(frames, window),
            (Workload::Mixed { frames, window, .. }, None) => self.mixed(frames, window),
            (Workload::Idle | Workload::Calibrate(_), None) => Ok(Run::default()),
        };
        match (run, coalesce_error) {
            (_, Some(e)) => (Outcome::Error(e), Run::default()),
            (Ok(run), None) if self.timed_out => (Outcome::Timeout, run),
            (Ok(run), None) => (Outcome::Done, run),
            (Err((e, run)), None) => (Outcome::Error(e), run),
        }
    }

    /// MSI-X interrupts taken: per pair, on its rx and tx queue's vector (entry q + 1 for
    /// queue q, read back; none on virtio-mmio), and in all on the rx queues', the tx
    /// queues', the control queue's and the configuration vector.
    fn msix_irqs(&self) -> (alloc::vec::Vec<[u64; 2]>, [u64; 4]) {
        let t = self.net.transport();
        let queue_irqs: alloc::vec::Vec<[u64; 2]> = if self.msix {
            (0..self.net.queue_pairs())
                .map(|p| [2 * p, 2 * p + 1].map(|q| vector_irqs(t.queue_vector(q))))
                .collect()
        } else {
            alloc::vec::Vec::new()
        };
        let msix_irqs = [
            queue_irqs.iter().map(|q| q[0]).sum(),
            queue_irqs.iter().map(|q| q[1]).sum(),
            if self.msix {
                vector_irqs(self.net.ctrl_queue_index().and_then(|q| t.queue_vector(q)))
            } else {
                0
            },
            if self.msix {
                vector_irqs(t.config_vector())
            } else {
                0
            },
        ];
        (queue_irqs, msix_irqs)
    }

    /// Prints the result line.
    fn write_result(
        &self,
        outcome: Outcome<'_>,
        run: Run,
        device_stats: Option<Result<&devstats::DevStats, &str>>,
        tsc_khz: Option<u64>,
    ) {
        let o = self.o;
        let net = &self.net;
        let queues: alloc::vec::Vec<_> = (0..net.queue_pairs())
            .filter_map(|p| net.pair_counters(p).ok())
            .collect();
        let (queue_irqs, msix_irqs) = self.msix_irqs();
        let report = Report {
            outcome,
            ring: o.ring,
            wait: o.wait,
            workload: o.workload,
            done: run.done,
            frame_size: o.frame_size,
            config: *net.config(),
            features: net.features(),
            queue_sizes: net.queue_sizes(),
            counters: net.counters(),
            irqs_taken: DEVICE_IRQS.load(Ordering::Relaxed),
            transport: o.transport,
            msix_irqs,
            queue_irqs: &queue_irqs,
            ticks: TICKS.load(Ordering::Relaxed),
            waits: self.halts,
            foreign_frames: self.foreign,
            cycles: run.cycles,
            tsc_khz,
            pause: o.pause,
            pauses: self.pauses,
            coalesce: o.coalesce,
            queues: &queues,
            resets: o.reset.map(|p| (p, net.reset_counters())),
            rx_budget: o.rx_budget,
            rx_defer_us: o.rx_defer_us,
            rx_check: self.rx_check,
            round_trips: self.round_trips,
            flood: self.flood,
            device_stats,
        };
        let mut line = String::with_capacity(2048);
        let _ = report.write_json(&mut line);
        line.push('\n');
        sys::write(line.as_bytes());
    }
}

/// The pause between two reads of the device's counters: 1 ms on the TSC (a fixed spin
/// without its frequency).
fn stats_pause(tsc_khz: Option<u64>) {
    let cycles = tsc_khz.filter(|&k| k > 0).unwrap_or(FALLBACK_TSC_KHZ);
    let end = cpu::rdtsc().saturating_add(cycles);
    while cpu::rdtsc() < end {
        core::hint::spin_loop();
    }
}

/// `coalesce=`: NOTF_COAL TX_SET then RX_SET over the control queue. The error says which
/// step failed and why (no control queue, no NOTF_COAL, refused, unanswered).
fn set_coalescing<T: Transport>(net: &mut VirtioNet<DmaHal, T>, c: Coalesce) -> Result<(), String> {
    if !net.has_ctrl_vq() {
        return Err(String::from(
            "coalesce=: the device offers no control queue (VIRTIO_NET_F_CTRL_VQ)",
        ));
    }
    net.set_tx_coalescing(c.tx.max_packets, c.tx.usecs)
        .map_err(|e| alloc::format!("coalesce=: tx ({}): {e}", c.tx))?;
    net.set_rx_coalescing(c.rx.max_packets, c.rx.usecs)
        .map_err(|e| alloc::format!("coalesce=: rx ({}): {e}", c.rx))
}

/// `calibrate=N`: measures, prints the `{"calibrate":{…}}` line and powers off. Without a TSC
/// frequency (neither `tsc_early_khz=` nor CPUID leaf 0x15) nothing can be converted to
/// nanoseconds: the run ends with an error result line instead.
fn calibrate(mut net: Net, o: &Options, samples: u32, tsc_khz: Option<u64>, deadline: u64) -> ! {
    let Some(khz) = tsc_khz.filter(|&k| k > 0) else {
        fail_early(
            "calibrate needs the TSC frequency (neither tsc_early_khz= nor CPUID leaf 0x15 gives it)",
        );
    };
    match crate::probe::calibrate(&mut net, o, samples, khz, deadline) {
        Ok(c) => {
            let mut line = String::with_capacity(1024);
            let _ = c.write_json(&mut line);
            line.push('\n');
            sys::write(line.as_bytes());
            sys::power_off()
        }
        Err(e) => fail_early(e),
    }
}

/// What a workload did.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    /// Frames sent or echoed.
    done: u64,
    /// TSC cycles from the first frame to the last completion.
    cycles: u64,
}

/// Which part of a workload is reclaiming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Frames are still being queued.
    Sending,
    /// Everything is queued: collect the last completions.
    Draining,
}

struct Driver<'o, T: Transport> {
    net: VirtioNet<DmaHal, T>,
    o: &'o Options,
    /// MSI-X (`transport=pci`): per-vector interrupts, no ISR read.
    msix: bool,
    /// [`MSIX_IRQS`] when the loop last handled each vector.
    msix_seen: [u64; MSIX_VECTORS],
    /// [`DEVICE_IRQS`] when the loop last ran the interrupt service routine.
    irqs_seen: u64,
    /// Waits for an interrupt (`hlt`).
    halts: u64,
    /// Received frames that were not test frames.
    foreign: u64,
    /// Per queue pair: its rx poll is scheduled (its rx interrupts off).
    rx_scheduled: alloc::vec::Vec<bool>,
    /// Per queue pair: TSC value of the first of its polls since the last frame that found
    /// nothing (`rx_defer_us=`).
    rx_short_since: alloc::vec::Vec<Option<u64>>,
    /// TSC cycles a short rx poll defers re-arming the interrupts (`rx_defer_us=`; 0: none).
    rx_defer_cycles: u64,
    /// TSC value at which the workload gives up.
    deadline: u64,
    timed_out: bool,
    /// TSC cycles of each pause between bursts (`burst=`, `pause_us=`).
    pause_cycles: u64,
    /// Pauses made.
    pauses: u64,
    /// TSC cycles of each phase of `mixed=`.
    phase_cycles: u64,
    /// Frames done at which the next `reset_queue=` reset is due (`u64::MAX`: none planned).
    next_reset: u64,
    /// `rx=`: what the frame and sequence checks found.
    rx_check: Option<frames::SeqCounts>,
    /// `pingpong=`: the round trips' checks and percentiles (`mixed=`: its trickle phases').
    round_trips: Option<RoundTrips>,
    /// `mixed=`: what its flood phases did.
    flood: Option<Flood>,
}

impl<T: Transport> Driver<'_, T> {
    fn mode(&self) -> TxCompletion {
        self.net.config().tx_completion
    }

    /// Runs the interrupt service routine if the device interrupted since the last call.
    fn take_interrupt(&mut self) -> bool {
        let n = DEVICE_IRQS.load(Ordering::Relaxed);
        if n == self.irqs_seen {
            return false;
        }
        self.irqs_seen = n;
        if self.msix {
            // Each vector that fired is its own source: no ISR read, no acknowledgement.
            for (entry, seen) in self.msix_seen.iter_mut().enumerate() {
                let count = MSIX_IRQS[entry].load(Ordering::Relaxed);
                if count != *seen {
                    *seen = count;
                    self.net.handle_msix(entry as u16);
                }
            }
        } else {
            self.net.handle_interrupt();
        }
        true
    }

    fn expired(&mut self) -> bool {
        if !self.timed_out && cpu::rdtsc() >= self.deadline {
            self.timed_out = true;
        }
        self.timed_out
    }

    /// Nothing to do right now: wait for an interrupt when one is due (and `wait=halt`),
    /// otherwise spin once.
    fn idle(&mut self, interrupt_due: bool) {
        if interrupt_due && self.o.wait == Wait::Halt {
            self.halts += 1;
            sys::wait(self.irqs_seen);
        } else {
            core::hint::spin_loop();
        }
    }

    /// The queue pairs (1 without `queues=`).
    fn pairs(&self) -> u16 {
        self.net.queue_pairs()
    }

    /// Makes `pair` the one the driver's datapath calls act on (`pair` < [`Self::pairs`]).
    fn select(&mut self, pair: u16) -> bool {
        self.net.select_pair(pair).is_ok()
    }

    fn any_rx_scheduled(&self) -> bool {
        self.rx_scheduled.iter().any(|&s| s)
    }

    /// Schedules `pair`'s rx poll (NAPI): its rx interrupts off until a poll finds its ring
    /// drained.
    fn schedule_rx_pair(&mut self, pair: u16) {
        let i = usize::from(pair);
        if !self.rx_scheduled[i] && self.select(pair) {
            self.net.disable_interrupts(QueueId::Rx);
            self.rx_scheduled[i] = true;
        }
    }

    /// Schedules every pair's rx poll (the interrupt line is shared: it does not say which).
    fn schedule_rx(&mut self) {
        for pair in 0..self.pairs() {
            self.schedule_rx_pair(pair);
        }
    }

    /// One rx poll of at most `budget` frames (`rx_budget=`, or fewer) on `pair`, if
    /// scheduled. A short poll re-arms its rx interrupts and re-checks (the
    /// `virtqueue_enable_cb` race), unless `busy` (the caller polls the used ring itself,
    /// `wait=poll`: the interrupts stay off, as under Linux's busy polling, and the pair is
    /// unscheduled until its ring has entries again); a full one stays scheduled, so the
    /// caller services tx between polls as a NAPI loop does.
    fn poll_rx_pair<F: FnMut(&mut [u8]) -> XdpAction>(
        &mut self,
        pair: u16,
        budget: usize,
        busy: bool,
        program: &mut F,
    ) {
        let i = usize::from(pair);
        if !self.rx_scheduled[i] || !self.select(pair) {
            return;
        }
        let got = self.net.poll_rx_mut(budget, program);
        if got == budget {
            self.rx_short_since[i] = None;
            return;
        }
        if !busy && self.defers_rearm(i, got) {
            return;
        }
        if busy || self.net.enable_interrupts(QueueId::Rx) == Rearm::Armed {
            self.rx_scheduled[i] = false;
        } else {
            self.net.disable_interrupts(QueueId::Rx);
        }
    }

    /// `rx_defer_us=`: whether pair `i`'s short poll (`got` frames) keeps the pair scheduled,
    /// its interrupts still off, instead of re-arming them: until the pair's polls have found
    /// nothing for the deferral (Linux's `napi_defer_hard_irqs` with `gro_flush_timeout`). A
    /// forwarding loop that flushed its bulk queue at the end of a poll finds the frames it
    /// sent coming back without an interrupt and a `hlt` each.
    fn defers_rearm(&mut self, i: usize, got: usize) -> bool {
        if self.rx_defer_cycles == 0 {
            return false;
        }
        let now = cpu::rdtsc();
        let since = if got > 0 {
            self.rx_short_since[i] = Some(now);
            now
        } else {
            *self.rx_short_since[i].get_or_insert(now)
        };
        if now.saturating_sub(since) < self.rx_defer_cycles {
            return true;
        }
        self.rx_short_since[i] = None;
        false
    }

    /// Drops whatever arrives (the tx workload's receive side), on every pair.
    fn drop_rx(&mut self) {
        let mut foreign = 0;
        let mut program = |_: &mut [u8]| {
            foreign += 1;
            XdpAction::Drop
        };
        let budget = self.o.rx_budget;
        for pair in 0..self.pairs() {
            if self.rx_scheduled[usize::from(pair)] || self.mode() != TxCompletion::CleanFromRx {
                self.poll_rx_pair(pair, budget, false, &mut program);
            } else if self.select(pair) {
                // Tx is cleaned from the rx poll, which runs whether or not frames arrived.
                self.net.poll_rx_mut(budget, &mut program);
            }
        }
        self.foreign += foreign;
    }

    /// The tx poll after a tx interrupt (napi_tx), on every pair: reclaim, re-arm, reclaim
    /// what raced in.
    fn tx_poll(&mut self) {
        for pair in 0..self.pairs() {
            if !self.select(pair) {
                continue;
            }
            self.net.reclaim_tx();
            while self.net.enable_interrupts(QueueId::Tx) == Rearm::UsedPending {
                self.net.reclaim_tx();
            }
        }
    }

    /// Free tx descriptors over every pair.
    fn tx_free(&mut self) -> usize {
        let mut free = 0;
        for pair in 0..self.pairs() {
            if self.select(pair) {
                free += self.net.tx_free_descriptors();
            }
        }
        free
    }

    /// Tx descriptors over every pair.
    fn tx_size(&self) -> usize {
        (0..self.pairs())
            .filter_map(|pair| self.net.pair_queue_sizes(pair).ok())
            .map(|(_, tx)| usize::from(tx))
            .sum()
    }

    /// Takes a pending interrupt and reclaims tx buffers the way the completion mode does.
    /// Returns true if tx descriptors were freed.
    fn service_tx(&mut self, phase: Phase) -> bool {
        let free = self.tx_free();
        let irq = self.take_interrupt();
        if irq {
            self.schedule_rx();
        }
        // In clean-from-rx mode the rx poll reclaims tx first (virtnet_poll_cleantx).
        self.drop_rx();
        match self.mode() {
            TxCompletion::TxInterrupt => {
                if irq {
                    self.tx_poll();
                }
            }
            TxCompletion::CleanFromRx => {}
            TxCompletion::Lazy => {
                // While sending, the transmit path reclaims by itself when the ring runs low.
                if phase == Phase::Draining {
                    for pair in 0..self.pairs() {
                        if self.select(pair) {
                            self.net.reclaim_tx();
                        }
                    }
                }
            }
        }
        self.tx_free() > free
    }

    /// `burst=`/`pause_us=`: spins `pause_cycles` on the TSC (interrupts are taken and counted
    /// meanwhile; the loop services them afterwards).
    fn pause(&mut self) {
        self.pauses += 1;
        let end = cpu::rdtsc().saturating_add(self.pause_cycles);
        while cpu::rdtsc() < end {
            core::hint::spin_loop();
        }
    }

    /// Waits until the device has returned every tx buffer of every pair.
    fn drain_tx(&mut self) {
        let tx_size = self.tx_size();
        let interrupt_due = self.mode() == TxCompletion::TxInterrupt;
        while self.tx_free() < tx_size {
            if !self.service_tx(Phase::Draining) {
                if self.expired() {
                    return;
                }
                self.idle(interrupt_due);
            }
        }
    }

    /// `tx=N`: sends `n` test frames in batches of `batch`.
    fn tx(&mut self, n: u64) -> Result<Run, (&'static str, Run)> {
        let size = self.o.frame_size;
        let max = self.net.config().tx_buf_size as usize - vnet_driver::VNET_HDR_LEN;
        if size > max {
            return Err(("size= exceeds the driver's tx buffer", Run::default()));
        }
        let ramp = Ramp::new(size);
        let mut frame = vec![0u8; size];
        let src = self.net.mac().unwrap_or(FALLBACK_MAC);
        let interrupt_due = self.mode() == TxCompletion::TxInterrupt;
        let burst = self.o.pause.map(|p| p.burst);
        // Frames queued since the last pause.
        let mut in_burst = 0u32;
        let start = cpu::rdtsc();
        let mut sent = 0u64;
        // Batches started: batch i goes to pair i mod N.
        let mut batches = 0u64;
        let pairs = u64::from(self.pairs());
        while sent < n {
            // The remainder is < N ≤ 16: fits.
            let pair = (batches % pairs) as u16;
            batches += 1;
            if !self.select(pair) {
                return Err(("no such queue pair", Run::default()));
            }
            let mut queued = 0;
            let mut full = false;
            let reset_at = self.reset_due_at();
            while queued < self.o.batch && sent < n && sent < reset_at && Some(in_burst) != burst {
                if !ramp.fill(&mut frame, self.o.dst, src, sent as u32) {
                    return Err(("cannot build a frame of size=", Run::default()));
                }
                match self.net.queue_tx(&frame) {
                    Ok(()) => {
                        sent += 1;
                        queued += 1;
                        in_burst += 1;
                    }
                    Err(TxError::RingFull) => {
                        full = true;
                        break;
                    }
                    Err(_) => return Err(("the driver refused a frame", Run::default())),
                }
            }
            self.net.flush_tx();
            if let Err(e) = self.reset_if_due(sent, n) {
                return Err((
                    e,
                    Run {
                        done: sent,
                        cycles: 0,
                    },
                ));
            }
            let reclaimed = self.service_tx(Phase::Sending);
            if Some(in_burst) == burst && sent < n {
                // A whole burst is queued, published and kick-decided: pause before the next.
                in_burst = 0;
                self.pause();
            } else if full && !reclaimed {
                if self.expired() {
                    break;
                }
                self.idle(interrupt_due);
            }
        }
        self.drain_tx();
        Ok(Run {
            done: sent,
            cycles: cpu::rdtsc().saturating_sub(start),
        })
    }

    /// `echo=N`: bounces the next `n` received test frames back (XDP_TX, MACs swapped);
    /// other frames are dropped.
    fn echo(&mut self, n: u64) -> Result<Run, (&'static str, Run)> {
        self.fwd(n, 0)
    }

    /// `fwd=N window=W`: sends `W` test frames (sequence numbers `0..W`), then bounces every
    /// received test frame back (XDP_TX, MACs swapped), until `n` are forwarded: `echo=` is
    /// `fwd=` without a window. Against a device that loops frames back the `W` frames
    /// circulate.
    fn fwd(&mut self, n: u64, window: u32) -> Result<Run, (&'static str, Run)> {
        let r = self.receive(n, &mut Window::new(window, |_| {}), |_, frame| {
            xdp::swap_macs(frame);
            XdpAction::Tx
        })?;
        self.drain_tx();
        Ok(r.through_drain())
    }

    /// `rx=N`: receives `n` test frames, checks each one (pattern, length field and the
    /// sequence number in its pair's sequence space) and drops it. Timed from the first frame
    /// to the `n`-th.
    fn rx(&mut self, n: u64) -> Result<Run, (&'static str, Run)> {
        let mut check = frames::SeqCheck::new(usize::from(self.pairs()));
        let r = self.receive(n, &mut Window::new(0, |_| {}), |pair, frame| {
            check.frame(usize::from(pair), frame);
            XdpAction::Drop
        });
        self.rx_check = Some(check.counts);
        Ok(r?.through_last_frame())
    }

    /// `pingpong=N window=W`: sends `min(W, N)` test frames (sequence numbers from 0), then,
    /// for every test frame that comes back, takes its round trip from the TSC value kept for
    /// its sequence number when it was queued, checks it is intact and one in flight, and
    /// sends the next sequence number in its place (the returned buffer rewritten, XDP_TX)
    /// until `n` frames were sent; ends at the `n`-th returned frame. Timed from the first send
    /// to the `n`-th return.
    fn pingpong(&mut self, n: u64, window: u32) -> Result<Run, (&'static str, Run)> {
        let seed = u32::try_from(n.min(u64::from(window))).unwrap_or(window);
        let ramp = Ramp::new(self.o.frame_size);
        let (dst, src) = (self.o.dst, self.net.mac().unwrap_or(FALLBACK_MAC));
        let flight = RefCell::new(InFlight {
            slots: vec![None; window as usize],
            sent: 0,
            bad: 0,
            rtt: Histogram::new(),
        });
        let start = cpu::rdtsc();
        let mut seeds = Window::new(seed, |seq| {
            let f = &mut *flight.borrow_mut();
            if let Some(s) = f.slots.get_mut(seq as usize) {
                *s = Some((seq, cpu::rdtsc()));
                f.sent += 1;
            }
        });
        let r = self.receive(n, &mut seeds, |_, frame| {
            let now = cpu::rdtsc();
            let f = &mut *flight.borrow_mut();
            let slot = frames::check(frame).and_then(|seq| {
                f.slots
                    .iter()
                    .position(|s| s.is_some_and(|(q, _)| q == seq))
            });
            let Some(sent_at) = slot.and_then(|i| f.slots[i].take()).map(|(_, t)| t) else {
                f.bad += 1;
                return XdpAction::Drop;
            };
            f.rtt.record(now.saturating_sub(sent_at));
            let seq = f.sent as u32;
            if f.sent < n && ramp.fill(frame, dst, src, seq) {
                // `slot` is Some here: its entry was just taken.
                f.slots[slot.unwrap_or(0)] = Some((seq, cpu::rdtsc()));
                f.sent += 1;
                XdpAction::Tx
            } else {
                XdpAction::Drop
            }
        });
        let f = flight.into_inner();
        self.round_trips = Some(RoundTrips {
            bad: f.bad,
            lost: f.slots.iter().filter(|s| s.is_some()).count() as u64,
            cycles: f.rtt.percentiles(),
        });
        let r = r?;
        self.drain_tx();
        Ok(Run {
            done: r.done,
            cycles: r.last.map_or(0, |l| l.saturating_sub(start)),
        })
    }

    /// `mixed=N window=W phase_us=P`: the loop of `pingpong=` in alternating flood (W frames in
    /// flight) and trickle (one) phases of P each, on the TSC ([`Mixed`]: the first window
    /// and each flood's top-up go by copy, every other frame in the buffer of the one it
    /// answers, XDP_TX). Ends at the `n`-th returned frame; timed from the first send to it.
    fn mixed(&mut self, n: u64, window: u32) -> Result<Run, (&'static str, Run)> {
        let ramp = Ramp::new(self.o.frame_size);
        let (dst, src) = (self.o.dst, self.net.mac().unwrap_or(FALLBACK_MAC));
        let start = cpu::rdtsc();
        let m = RefCell::new(Mixed::new(window, self.phase_cycles, n, start));
        let r = self.receive(n, &mut MixedSeeds(&m), |_, frame| {
            let m = &mut *m.borrow_mut();
            let Some(seq) = m.returned(frames::check(frame), cpu::rdtsc()) else {
                return XdpAction::Drop;
            };
            if ramp.fill(frame, dst, src, seq) {
                m.queued(seq, cpu::rdtsc(), false);
                XdpAction::Tx
            } else {
                m.send_by_copy();
                XdpAction::Drop
            }
        });
        let m = m.into_inner();
        self.round_trips = Some(m.trickle());
        self.flood = Some(m.flood());
        let r = r?;
        self.drain_tx();
        Ok(Run {
            done: r.done,
            cycles: r.last.map_or(0, |l| l.saturating_sub(start)),
        })
    }

    /// The receive loop of `echo=`, `fwd=`, `rx=`, `pingpong=` and `mixed=`: runs
    /// `on_frame(pair, frame)` on each of the next `n` received test frames and carries out
    /// its verdict; other frames (and test frames beyond the `n`-th) are dropped and counted as
    /// foreign. Sends the frames `seeds` asks for by copy (round robin over the pairs), as many
    /// at a time as the tx rings take, interleaved with the receive polls.
    ///
    /// Rx notifications: with `wait=halt` an interrupt schedules every pair's rx poll (rx
    /// interrupts off) and the loop `hlt`s when there is nothing to do; with `wait=poll` the
    /// loop schedules a pair's poll when its used ring has entries and leaves its rx
    /// interrupts off. A poll takes at most `rx_budget=` frames; with `wait=halt` a short poll
    /// re-arms the pair's interrupts (NAPI).
    fn receive<F: FnMut(u16, &mut [u8]) -> XdpAction>(
        &mut self,
        n: u64,
        seeds: &mut dyn Seeds,
        mut on_frame: F,
    ) -> Result<Received, (&'static str, Run)> {
        let mut seeder: Option<Seeder> = None;
        let mut done = 0u64;
        let mut foreign = 0u64;
        let mut start = None;
        let mut last = None;
        let busy = self.o.wait == Wait::Poll;
        while done < n {
            if seeds.due().is_some() {
                let s = match seeder.as_mut() {
                    Some(s) => s,
                    None => seeder.insert(Seeder::new(self)?),
                };
                s.send(self, seeds);
            }
            let irq = self.take_interrupt();
            let before = done;
            // wait=poll: the loop polls the used rings itself; wait=halt: the interrupt says.
            if irq {
                self.schedule_rx();
            } else if busy {
                for pair in 0..self.pairs() {
                    if self.select(pair) && self.net.rx_has_used() {
                        self.schedule_rx_pair(pair);
                    }
                }
            }
            if self.any_rx_scheduled() {
                for pair in 0..self.pairs() {
                    if done >= n {
                        break;
                    }
                    // Not beyond the n-th frame: later frames stay on the ring.
                    let left = usize::try_from(n - done).unwrap_or(usize::MAX);
                    let budget = self.o.rx_budget.min(left);
                    self.poll_rx_pair(pair, budget, busy, &mut |frame: &mut [u8]| {
                        if done < n && frames::is_test_frame(frame) {
                            if start.is_none() {
                                start = Some(cpu::rdtsc());
                            }
                            done += 1;
                            if done == n {
                                last = Some(cpu::rdtsc());
                            }
                            on_frame(pair, frame)
                        } else {
                            foreign += 1;
                            XdpAction::Drop
                        }
                    });
                }
            }
            if irq && self.mode() == TxCompletion::TxInterrupt {
                self.tx_poll();
            }
            if let Err(e) = self.reset_if_due(done, n) {
                self.foreign += foreign;
                return Err((e, Run { done, cycles: 0 }));
            }
            if done == before && !irq && !self.any_rx_scheduled() {
                if self.expired() {
                    break;
                }
                // wait=halt: rx interrupts are armed, the next frame interrupts.
                self.idle(true);
            }
        }
        self.foreign += foreign;
        Ok(Received { done, start, last })
    }
}

/// What [`Driver::receive`] did: test frames handled, and when the first and the `n`-th came.
struct Received {
    done: u64,
    start: Option<u64>,
    last: Option<u64>,
}

impl Received {
    /// Timed from the first frame to now: the caller has waited for the device to return
    /// every tx buffer (`echo=`, `fwd=`).
    fn through_drain(self) -> Run {
        Run {
            done: self.done,
            cycles: self.start.map_or(0, |s| cpu::rdtsc().saturating_sub(s)),
        }
    }

    /// Timed from the first frame to the `n`-th (`rx=`).
    fn through_last_frame(self) -> Run {
        let cycles = match (self.start, self.last) {
            (Some(s), Some(l)) => l.saturating_sub(s),
            _ => 0,
        };
        Run {
            done: self.done,
            cycles,
        }
    }
}

/// `pingpong=`'s frames in flight and what came back.
struct InFlight {
    /// Per slot (`window=` of them): the sequence number in flight and the TSC when it was
    /// queued.
    slots: alloc::vec::Vec<Option<(u32, u64)>>,
    /// Frames sent (the next sequence number).
    sent: u64,
    /// Frames back that were damaged or not in flight.
    bad: u64,
    /// Round trips, TSC cycles.
    rtt: Histogram,
}

/// The frames [`Driver::receive`] sends by copy (the answers to returned frames go in their
/// buffers, XDP_TX): the first window of `fwd=` and `pingpong=`, the first window and each
/// flood's top-up of `mixed=`.
trait Seeds {
    /// The sequence number of the next frame to queue now, if one is due.
    fn due(&mut self) -> Option<u32>;
    /// The frame of `seq` (the number `due` gave) was queued; one the ring did not take stays
    /// due.
    fn queued(&mut self, seq: u32);
}

/// Sequence numbers `0..window`, each passed to `on_seed` as it is queued (`fwd=`,
/// `pingpong=`; none for `echo=` and `rx=`).
struct Window<S> {
    next: u32,
    window: u32,
    on_seed: S,
}

impl<S: FnMut(u32)> Window<S> {
    fn new(window: u32, on_seed: S) -> Window<S> {
        Window {
            next: 0,
            window,
            on_seed,
        }
    }
}

impl<S: FnMut(u32)> Seeds for Window<S> {
    fn due(&mut self) -> Option<u32> {
        (self.next < self.window).then_some(self.next)
    }

    fn queued(&mut self, seq: u32) {
        self.next += 1;
        (self.on_seed)(seq);
    }
}

/// `mixed=`'s frames by copy: what its [`Mixed`] says is due.
struct MixedSeeds<'a>(&'a RefCell<Mixed>);

impl Seeds for MixedSeeds<'_> {
    fn due(&mut self) -> Option<u32> {
        self.0.borrow().due()
    }

    fn queued(&mut self, seq: u32) {
        self.0.borrow_mut().queued(seq, cpu::rdtsc(), true);
    }
}

/// Sends the frames [`Seeds`] asks for by copy, round robin over the pairs, as the tx rings
/// take them.
struct Seeder {
    ramp: Ramp,
    frame: alloc::vec::Vec<u8>,
    src: [u8; 6],
    /// Frames queued (the next one goes to pair `seeded mod N`).
    seeded: u32,
}

impl Seeder {
    fn new<T: Transport>(d: &Driver<'_, T>) -> Result<Seeder, (&'static str, Run)> {
        let size = d.o.frame_size;
        let max = d.net.config().tx_buf_size as usize - vnet_driver::VNET_HDR_LEN;
        if size > max {
            return Err(("size= exceeds the driver's tx buffer", Run::default()));
        }
        Ok(Seeder {
            ramp: Ramp::new(size),
            frame: vec![0u8; size],
            src: d.net.mac().unwrap_or(FALLBACK_MAC),
            seeded: 0,
        })
    }

    /// Queues as many of the frames due as the tx rings take now (the i-th on pair `i mod N`;
    /// it stops at the first full ring), then one flush (publish and kick decision) per pair
    /// that got frames.
    fn send<T: Transport>(&mut self, d: &mut Driver<'_, T>, seeds: &mut dyn Seeds) {
        let pairs = u32::from(d.pairs()).max(1);
        // Bit p: pair p has frames queued but not flushed (p < N ≤ 16).
        let mut queued = 0u32;
        while let Some(seq) = seeds.due() {
            let pair = self.seeded % pairs;
            if !d.select(pair as u16)
                || !self.ramp.fill(&mut self.frame, d.o.dst, self.src, seq)
                || d.net.queue_tx(&self.frame).is_err()
            {
                break;
            }
            seeds.queued(seq);
            self.seeded = self.seeded.wrapping_add(1);
            queued |= 1 << pair;
        }
        for pair in 0..pairs {
            if queued & (1 << pair) != 0 && d.select(pair as u16) {
                d.net.flush_tx();
            }
        }
    }
}
