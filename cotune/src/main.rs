//! `cotune`: sweeps of the co-tuning knobs of the guest driver and the device, in co-simulation,
//! in real VMs, or both.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cotune::baseline::BareSyscall;
use cotune::cost::{DEFAULT_IRQ_COST_NS, DEFAULT_KICK_COST_NS};
use cotune::noise::{loadavg1, BUSY_LOADAVG};
use cotune::report::{plot, to_csv, to_table};
use cotune::sweep::{run_preset, BackendKind, HostPath, Options, Preset, Target};
use cotune::transport::TransportKind;
use cotune::vm::{self, VmEnv};

/// An exit cost: nanoseconds, or `auto` (measured by the driver guest in a VM on this host).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cost {
    Ns(u64),
    Auto,
}

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cost::Ns(n) => write!(f, "{n}"),
            Cost::Auto => f.write_str("auto"),
        }
    }
}

fn parse_cost(s: &str) -> Result<Cost, String> {
    if s == "auto" {
        return Ok(Cost::Auto);
    }
    match s.parse::<u64>() {
        Ok(n) if n <= 1_000_000 => Ok(Cost::Ns(n)),
        _ => Err(format!(
            "{s:?} is neither a cost in ns (0..=1000000) nor `auto`"
        )),
    }
}

/// Sweeps virtio-net co-tuning knobs of both sides (driver: kick threshold, tx completion,
/// XDP_TX bulk, zero-copy transmit; device: interrupt coalescing, busy-poll) and reports pps,
/// kicks and interrupts per packet against a raw backend write loop, in co-simulation (the
/// driver crate and the device model on host threads), in real VMs, or both.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Presets to run (default: all).
    #[arg(value_enum)]
    presets: Vec<Preset>,
    /// Where each point is measured.
    #[arg(long, value_enum, default_value_t = Target::Sim)]
    target: Target,
    /// Measured seconds per co-simulation trial.
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// Warm-up seconds per co-simulation trial.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Trials per point; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Ethernet frame size in bytes (overrides each preset's default).
    #[arg(long)]
    frame_size: Option<usize>,
    /// The device's backend: in co-simulation `pair` or `tap`, or one of the measurement
    /// backends `sink`, `source`, `loop` (a host side faster than the guest), which VMs then
    /// use too (`vmm --net backend=…`; the baseline stays the raw tap loop). Not given: `pair`,
    /// and the seed presets and rx-coalesce run on their own regimes (sink, loop, source);
    /// given, it applies to them too (e.g. `--backend tap seed-kick-threshold`: the plain tap).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Device transport, in co-simulation and in VMs: virtio-mmio (one interrupt line, the
    /// ISR read per interrupt) or virtio-pci with an MSI-X vector per queue (no ISR read).
    #[arg(long, value_enum, default_value_t = TransportKind::Mmio)]
    transport: TransportKind,
    /// What the host does with the frames written to the tap (`--backend tap` and VMs on a
    /// tap): the network stack, or a 2-instruction XDP program attached for the run
    /// (`xdp-drop`: a non-blocking writer's frames skip the skb; `xdp-reflect`: each frame
    /// comes back to the same fd, so receiving presets forward through the tap). It applies to
    /// the raw write loop too, and is detached when cotune exits, however it exits.
    #[arg(long, value_enum, default_value_t = HostPath::Stack)]
    host_path: HostPath,
    /// The raw backend write loop's system call (`write`, the cheapest; `writev` of one
    /// iovec, as a device with a scatter-gather list makes it).
    #[arg(long, value_enum, default_value_t = BareSyscall::Write)]
    baseline_syscall: BareSyscall,
    /// vCPU time charged per driver kick in co-simulation, ns (0 = raw co-simulation), or
    /// `auto`: measured once by the driver guest (calibrate=2000 ring=3) in a VM.
    #[arg(long, value_parser = parse_cost, default_value_t = Cost::Ns(DEFAULT_KICK_COST_NS))]
    kick_cost_ns: Cost,
    /// vCPU time charged per interrupt taken in co-simulation, ns, or `auto` (see above).
    #[arg(long, value_parser = parse_cost, default_value_t = Cost::Ns(DEFAULT_IRQ_COST_NS))]
    irq_cost_ns: Cost,
    /// Pin the driver (vCPU) thread and the device worker to two separate CPUs.
    #[arg(long)]
    pin: bool,
    /// The vmm binary (default: `vmm` beside this executable, else target/release/vmm).
    #[arg(long, value_name = "PATH")]
    vmm: Option<PathBuf>,
    /// The driver guest (default: what resources/build-guest.sh --driver-guest-only builds).
    #[arg(long, value_name = "PATH")]
    guest: Option<PathBuf>,
    /// Frames per VM trial (default 300000; 30000 with --quick).
    #[arg(long, value_name = "N")]
    vm_frames: Option<u64>,
    /// Write one CSV row per point to FILE.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Draw 1-D sweeps (pps and kicks/pkt against the knob) and 2-D sweeps (heatmaps) as SVG.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// A short run for CI: fewer points (2-D sweeps 2x2), 0.3 s trials, one repeat.
    #[arg(long)]
    quick: bool,
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("cotune: {msg}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let duration_ok = cli.duration > 0.0 && cli.duration <= 600.0;
    if !duration_ok || !(0.0..=60.0).contains(&cli.warmup) {
        return usage("--duration must be in (0, 600] s and --warmup in [0, 60] s");
    }
    if cli.repeat == 0 || cli.repeat > 100 {
        return usage("--repeat must be 1..=100");
    }
    if let Some(s) = cli.frame_size {
        if !(cotune::frames::MIN_FRAME..=1514).contains(&s) {
            return usage(&format!(
                "--frame-size must be {}..=1514",
                cotune::frames::MIN_FRAME
            ));
        }
    }
    if let Some(n) = cli.vm_frames {
        if !(1_000..=100_000_000).contains(&n) {
            return usage("--vm-frames must be 1000..=100000000");
        }
        if !cli.target.vm() {
            return usage("--vm-frames needs --target vm or both");
        }
    }
    let (kick, irq) = (cli.kick_cost_ns, cli.irq_cost_ns);
    let pin = if cli.pin {
        match cotune::noise::cpu_pair() {
            Ok(p) => Some(p),
            Err(e) => return usage(&e.to_string()),
        }
    } else {
        None
    };
    let calibrate = kick == Cost::Auto || irq == Cost::Auto;
    let backend = cli.backend.unwrap_or(BackendKind::Pair);
    if cli.target == Target::Both && cli.backend == Some(BackendKind::Pair) {
        eprintln!(
            "cotune: note: the VM's device writes to a tap; --backend tap makes the vm/sim ratio \
             compare like with like"
        );
    }
    let load = loadavg1();
    if load > BUSY_LOADAVG {
        eprintln!(
            "cotune: warning: the 1-minute load average is {load:.2} (> {BUSY_LOADAVG}): other work \
             shares the CPUs and the numbers will be noisy (see the loadavg1 column)"
        );
    }
    let vm_env = if cli.target.vm() || calibrate {
        let env = vm::locate_vmm(cli.vmm.clone()).and_then(|vmm| {
            vm::check_host()?;
            Ok(VmEnv {
                vmm,
                guest: vm::locate_guest(cli.guest.clone())?,
                frames: cli
                    .vm_frames
                    .unwrap_or(if cli.quick { 30_000 } else { 300_000 }),
                transport: cli.transport,
                backend,
                host_path: cli.host_path,
            })
        });
        match env {
            Ok(env) => Some(env),
            Err(e) => {
                eprintln!("cotune: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let mut calibration = None;
    if calibrate {
        let env = vm_env.as_ref().expect("located above");
        eprint!(
            "cotune: calibrating exit costs in a VM ({})...",
            env.guest.display()
        );
        match vm::calibrate(env) {
            Ok(c) => {
                eprintln!(
                    " kick {:.0} ns, interrupt {:.0} ns + service routine {:.0} ns",
                    c.kick_ns, c.irq_ns, c.isr_ns
                );
                calibration = Some(c);
            }
            Err(e) => {
                eprintln!("\ncotune: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let cost = |c: Cost, auto: fn(&cotune::calib::Calibration) -> f64| match c {
        Cost::Ns(n) => n,
        Cost::Auto => calibration.as_ref().map_or(0, |c| auto(c).round() as u64),
    };
    let opts = Options {
        duration: Duration::from_secs_f64(if cli.quick { 0.3 } else { cli.duration }),
        warmup: Duration::from_secs_f64(if cli.quick { 0.1 } else { cli.warmup }),
        repeat: if cli.quick { 1 } else { cli.repeat },
        frame_size: cli.frame_size,
        backend,
        own_regimes: cli.backend.is_none(),
        kick_cost_ns: cost(kick, |c| c.kick_ns),
        irq_cost_ns: cost(irq, |c| c.interrupt_cost_ns()),
        quick: cli.quick,
        target: cli.target,
        pin,
        vm: if cli.target.vm() {
            vm_env.clone()
        } else {
            None
        },
        transport: cli.transport,
        bare: cli.baseline_syscall,
        host_path: cli.host_path,
    };
    let presets = if cli.presets.is_empty() {
        Preset::ALL.to_vec()
    } else {
        cli.presets.clone()
    };
    let mut rows = Vec::new();
    let mut stderr = std::io::stderr();
    for &preset in &presets {
        let mut progress = |msg: &str| {
            let _ = write!(stderr, "\r\x1b[K{msg}");
            let _ = stderr.flush();
        };
        match run_preset(preset, &opts, &mut progress) {
            Ok(r) => rows.extend(r),
            // Running every preset: those the backend cannot run are left out, said so.
            Err(e) if cli.presets.is_empty() && e.kind() == std::io::ErrorKind::Unsupported => {
                let _ = writeln!(stderr, "\r\x1b[Kcotune: skipped: {e}");
            }
            Err(e) => {
                eprintln!("\ncotune: {}: {e}", preset.name());
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("\r\x1b[K");
    let target = match cli.target {
        Target::Sim => "sim",
        Target::Vm => "vm",
        Target::Both => "both",
    };
    let costs = match &calibration {
        Some(c) => format!(
            "kick_cost_ns={} irq_cost_ns={} (calibrated in a VM: kick {:.0} ns, exit {:.0} ns, irq {:.0} ns + isr {:.0} ns, irq latency {:.0} ns, {} samples, ring {}, tsc {} kHz)",
            opts.kick_cost_ns, opts.irq_cost_ns, c.kick_ns, c.exit_ns, c.irq_ns, c.isr_ns, c.irq_latency_ns, c.samples, c.ring, c.tsc_khz
        ),
        None => format!(
            "kick_cost_ns={} irq_cost_ns={}",
            opts.kick_cost_ns, opts.irq_cost_ns
        ),
    };
    let sim = if cli.target.sim() {
        format!(
            " sim_backend={}{} host_path={} transport={} {costs}",
            backend.name(),
            if cli.backend.is_none() && presets.iter().any(|p| p.backend().is_some()) {
                " (seed and rx presets: their own unless --backend; see the backend column)"
            } else {
                ""
            },
            cli.host_path.name(),
            cli.transport.name()
        )
    } else {
        String::new()
    };
    let vm = opts.vm.as_ref().map_or_else(String::new, |v| {
        format!(
            " vm_frames={} vmm={} guest={}",
            v.frames,
            v.vmm.display(),
            v.guest.display()
        )
    });
    println!(
        "# target={target}{sim}{vm} duration={:?} repeat={} pin={} loadavg1_at_start={load:.2}",
        opts.duration,
        opts.repeat,
        opts.pin.map_or_else(
            || "off".into(),
            |(a, b)| format!("driver/vcpu:cpu{a},device:cpu{b}")
        ),
    );
    print!("{}", to_table(&rows));
    if let Some(path) = &cli.csv {
        if let Err(e) = std::fs::write(path, to_csv(&rows)) {
            eprintln!("cotune: cannot write {path:?}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &cli.plot {
        match plot(&rows, path) {
            Ok(files) => {
                for f in files {
                    eprintln!("cotune: wrote {}", f.display());
                }
            }
            Err(e) => {
                eprintln!("cotune: cannot draw {path:?}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
