//! A measured point as a report row: its axes, names, the notes that explain it.

use std::io;

use vnet_driver::xsk::XskMode;
use vnet_driver::{Config, TxCompletion};

use crate::baseline::{BareSyscall, BaselineResult};
use crate::noise::{cpu_pct, loadavg1};
use crate::report::Row;
use crate::workloads::{self, Workload};

use super::*;
use crate::point::{BackendKind, DevKnobs, HostPath, Measured, Point};

pub(super) fn xsk_mode_name(w: Workload) -> &'static str {
    match w {
        Workload::XskTx(XskMode::ZeroCopy) => "zero-copy",
        Workload::XskTx(XskMode::Copy) => "copy",
        _ => "",
    }
}

pub(super) fn workload_name(w: Workload) -> &'static str {
    match w {
        Workload::XskTx(_) => "xsk-tx",
        Workload::Bidirectional => "bidirectional",
        Workload::XdpBounce => "xdp-bounce",
        Workload::Echo => "echo",
        Workload::Rx => "rx",
        Workload::Fwd => "fwd",
        Workload::PingPong(_) => "pingpong",
        Workload::Mixed { .. } => "mixed",
    }
}

pub(super) fn completion_name(c: TxCompletion) -> &'static str {
    match c {
        TxCompletion::TxInterrupt => "tx-interrupt",
        TxCompletion::CleanFromRx => "clean-from-rx",
        TxCompletion::Lazy => "lazy",
    }
}

/// The backend and device columns of a row measured on `opts` (`sim`: in co-simulation).
fn placement(opts: &Options, sim: bool) -> (String, String) {
    let backend = if sim || opts.backend.is_measurement() {
        opts.backend
    } else {
        BackendKind::Tap
    };
    let device = match (&opts.vm, sim) {
        (Some(vm), false) => vm.device.name(),
        _ => crate::vm::DevicePlacement::InProcess.name(),
    };
    (backend_label(backend, opts.host_path), device.into())
}

/// A row for `point` with every knob of both sides and, if measured, its metrics.
pub(super) fn point_row(
    preset: Preset,
    target: &str,
    point: &Point,
    m: Option<&Measured>,
    base_pps: f64,
    load: f64,
    opts: &Options,
) -> Row {
    let nan = f64::NAN;
    let per = |n: u64| m.map_or(nan, |m| n as f64 / m.packets.max(1) as f64);
    let axis = |i: usize| point.axes.get(i).cloned().unwrap_or(("", String::new()));
    let (knob, value) = axis(0);
    let (knob2, value2) = axis(1);
    let pps = m.map_or(nan, Measured::pps);
    let rtt_us = |f: fn(&workloads::Latency) -> u64| {
        m.and_then(|m| m.latency.as_ref())
            .map_or(nan, |l| f(l) as f64 / 1000.0)
    };
    let sim = target == "sim";
    // CPU times, when they were read.
    let cpu = m
        .filter(|m| m.cpu_secs.is_finite())
        .map(|m| (m.driver_cpu_ns, m.device_cpu_ns));
    let (backend, device) = placement(opts, sim);
    Row {
        preset: preset.name().into(),
        target: target.into(),
        knob: knob.into(),
        value,
        knob2: knob2.into(),
        value2,
        workload: workload_name(point.workload).into(),
        frame_size: point.frame_size,
        kick_threshold: point.config.kick_threshold,
        tx_completion: completion_name(point.config.tx_completion).into(),
        event_idx: point.config.event_idx,
        xdp_bulk: point.config.xdp_bulk,
        xsk_mode: xsk_mode_name(point.workload).into(),
        burst: point.pace.map_or(0, |p| p.burst),
        pause_us: point.pace.map_or(0, |p| p.pause_us),
        coalesce_packets: point.dev.coalesce_packets,
        coalesce_usecs: point.dev.coalesce_usecs,
        dev_event_idx: point.dev.event_idx,
        tx_budget: point.dev.tx_budget,
        busy_poll_us: point.dev.busy_poll_us,
        busy_poll_sleep_us: point.dev.busy_poll_sleep_us,
        kick_coalesce_packets: point.dev.kick_coalescing.max_packets,
        kick_coalesce_usecs: point.dev.kick_coalescing.max_usecs,
        rx_sparse_reads: point.dev.rx_sparse_reads,
        ring: point.ring().name().into(),
        dev_adaptive: point.dev.adaptive,
        drv_adaptive: point.config.adaptive,
        pps,
        p50_us: rtt_us(|l| l.p50_ns),
        p99_us: rtt_us(|l| l.p99_ns),
        p999_us: rtt_us(|l| l.p999_ns),
        kicks_per_pkt: per(m.map_or(0, |m| m.kicks)),
        irqs_per_pkt: per(m.map_or(0, |m| m.irqs)),
        tx_irqs_per_pkt: per(m.map_or(0, |m| m.tx_irqs)),
        kicks_suppressed_per_pkt: per(m.map_or(0, |m| m.kicks_suppressed)),
        driver_ns_per_pkt: cpu.map_or(nan, |c| per(c.0)),
        device_ns_per_pkt: cpu.map_or(nan, |c| per(c.1)),
        driver_cpu_pct: m.map_or(nan, |m| cpu_pct(m.driver_cpu_ns, m.cpu_secs)),
        device_cpu_pct: m.map_or(nan, |m| cpu_pct(m.device_cpu_ns, m.cpu_secs)),
        busy_poll_found_per_pkt: per(m.map_or(0, |m| m.busy_poll_found)),
        busy_poll_pct: m.map_or(nan, |m| cpu_pct(m.busy_poll_us * 1000, m.secs)),
        ratio_to_baseline: pps / base_pps,
        vm_sim_ratio: nan,
        loadavg1: load,
        backend,
        device,
        kick_cost_ns: if sim { Some(opts.kick_cost_ns) } else { None },
        irq_cost_ns: if sim { Some(opts.irq_cost_ns) } else { None },
        note: m.map_or_else(String::new, |m| notes(point, m)),
    }
}

/// The note of a point a host injector fed: its rate, flagged when it ran within 1.5 × of the
/// guest's (then the injector, not the guest, may be what bounds the point).
/// A measured row's note: where adaptation left the knobs, and the host injector.
pub(super) fn notes(point: &Point, m: &Measured) -> String {
    let adapted = m
        .adapted
        .describe(point.dev.adaptive, point.config.adaptive);
    let host = host_note(m);
    match (adapted.is_empty(), host.is_empty()) {
        (true, _) => host,
        (false, true) => adapted,
        (false, false) => format!("{adapted}; {host}"),
    }
}

pub(super) fn host_note(m: &Measured) -> String {
    if m.host_pps <= 0.0 {
        return String::new();
    }
    let mut note = format!("host injector {:.0} pps", m.host_pps);
    if m.host_pps < 1.5 * m.pps() {
        note += " (within 1.5x of the guest: the injector may bound this point)";
    }
    note
}

/// The backend column: `tap` with its host path when that is not the stack
/// (`tap+xdp-drop`).
pub(super) fn backend_label(backend: BackendKind, host_path: HostPath) -> String {
    match (backend, host_path) {
        (BackendKind::Tap, HostPath::XdpDrop | HostPath::XdpReflect) => {
            format!("tap+{}", host_path.name())
        }
        (b, _) => b.name().into(),
    }
}

/// A baseline row: the raw write loop of `target`'s backend.
pub(super) fn baseline_row(
    target: &str,
    backend: BackendKind,
    size: usize,
    b: &BaselineResult,
    opts: &Options,
) -> Row {
    let name = match opts.bare {
        BareSyscall::Write => "raw-write",
        BareSyscall::Writev => "raw-writev",
        BareSyscall::IoUring => "raw-io-uring",
    };
    let point = Point {
        axes: vec![("loop", name.into())],
        config: Config::default(),
        dev: DevKnobs::default(),
        workload: Workload::XskTx(XskMode::Copy),
        pace: None,
        frame_size: size,
    };
    let mut row = point_row(
        Preset::Baseline,
        target,
        &point,
        None,
        b.pps,
        loadavg1(),
        opts,
    );
    row.workload = name.into();
    row.xsk_mode = String::new();
    row.pps = b.pps;
    row.ratio_to_baseline = 1.0;
    row.kicks_per_pkt = 0.0;
    row.irqs_per_pkt = 0.0;
    row.tx_irqs_per_pkt = 0.0;
    row.kicks_suppressed_per_pkt = 0.0;
    row.driver_ns_per_pkt = b.cpu_ns_per_pkt;
    row.device_ns_per_pkt = 0.0;
    row.busy_poll_found_per_pkt = 0.0;
    row.busy_poll_pct = 0.0;
    row.backend = backend_label(backend.baseline_backend(), opts.host_path);
    row.kick_cost_ns = None;
    row.irq_cost_ns = None;
    row
}

/// Point `p`'s VM row: the median of its trials, or a skipped row when the guest cannot run
/// it. `say` tells the progress before each trial.
pub(super) fn vm_point_row(
    preset: Preset,
    p: &Point,
    env: &crate::vm::VmEnv,
    base: f64,
    load: f64,
    opts: &Options,
    say: &mut dyn FnMut(&str, usize),
) -> io::Result<Row> {
    let mut skipped = crate::vm::unsupported(p, env.backend).map(str::to_owned);
    let mut runs = Vec::new();
    let mut note = String::new();
    for r in 0..opts.repeat {
        if skipped.is_some() {
            break;
        }
        say("vm", r);
        match crate::vm::run_point(env, p, opts.pin)? {
            crate::vm::VmRun::Measured(m, n) => {
                runs.push(*m);
                note = n;
            }
            crate::vm::VmRun::Unsupported(why) => skipped = Some(why),
        }
    }
    if let Some(why) = skipped {
        let mut row = point_row(preset, "vm", p, None, f64::NAN, load, opts);
        row.note = format!("skipped: {why}");
        return Ok(row);
    }
    let m = median(runs);
    let mut row = point_row(preset, "vm", p, Some(&m), base, load, opts);
    row.note = if row.note.is_empty() {
        note
    } else {
        format!("{note}; {}", row.note)
    };
    if row.driver_cpu_pct < 60.0 && row.device_cpu_pct < 60.0 {
        // From the counters: neither side was saturated, so what bounds the rate is outside
        // them (the host peer, for echo).
        row.note += "; vCPU and device worker both <60% busy: bound outside \
                     them (the host peer for echo)";
    }
    Ok(row)
}
