//! `cotune`: sweeps of the co-tuning knobs of the guest driver and the device, in co-simulation,
//! in real VMs, or both.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cotune::autotune::{autotune, Objective};
use cotune::baseline::BareSyscall;
use cotune::calib::Calibration;
use cotune::cost::{DEFAULT_IRQ_COST_NS, DEFAULT_KICK_COST_NS};
use cotune::noise::{loadavg1, BUSY_LOADAVG};
use cotune::point::parse_kick_coalesce;
use cotune::report::{plot, to_csv, to_table, Row};
use cotune::sweep::{run_preset, BackendKind, HostPath, Options, Preset, RingLayout, Target};
use cotune::transport::TransportKind;
use cotune::vm::{self, GuestWait, VmEnv};
use devices::virtio::net::KickCoalescing;

/// What else cotune does than sweep presets.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Search PRESET's knobs (both sides) for the best point of an objective with far fewer
    /// trials than its grid (a compass search over the grid, one trial per point, then the two
    /// best topped up to --repeat trials); prints the path and the best point. Takes the sweep
    /// options (--target sim|vm, --backend, --repeat, ...) after the preset.
    Autotune {
        /// The preset whose grid is searched.
        #[arg(value_enum)]
        preset: Preset,
        /// What to maximise.
        #[arg(long, value_enum, default_value_t = Objective::Pps)]
        objective: Objective,
        /// Also measure the full grid (every point --repeat times) and say how close the search
        /// came and with how many of the grid's trials.
        #[arg(long)]
        check_grid: bool,
    },
}

/// `--device`: where the VMs' device runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum DeviceArg {
    /// In `vmm`.
    InProcess,
    /// In `vhost-user-net`, behind `vmm --net vhost-user=`.
    VhostUser,
}

/// `--ring`: the virtqueue layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RingArg {
    /// The split virtqueue (descriptor table, avail ring, used ring).
    Split,
    /// The packed virtqueue (VIRTIO_F_RING_PACKED).
    Packed,
}

/// `--tx-completion`: the driver's tx completion for every point of a preset that does not
/// sweep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TxCompletionArg {
    /// Tx interrupts, reclaimed in a tx poll after each (the driver's default; Linux napi_tx).
    TxInterrupt,
    /// No tx interrupts; reclaimed in every rx poll (Linux's `virtnet_poll_cleantx`).
    CleanFromRx,
    /// No tx interrupts; reclaimed on transmit when the ring runs low.
    Lazy,
}

impl From<TxCompletionArg> for vnet_driver::TxCompletion {
    fn from(a: TxCompletionArg) -> Self {
        match a {
            TxCompletionArg::TxInterrupt => vnet_driver::TxCompletion::TxInterrupt,
            TxCompletionArg::CleanFromRx => vnet_driver::TxCompletion::CleanFromRx,
            TxCompletionArg::Lazy => vnet_driver::TxCompletion::Lazy,
        }
    }
}

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
    /// `autotune PRESET`: search the preset's grid instead of sweeping it.
    #[command(subcommand)]
    command: Option<Command>,
    /// Presets to run (default: all).
    #[arg(value_enum)]
    presets: Vec<Preset>,
    /// Where each point is measured.
    #[arg(long, global = true, value_enum, default_value_t = Target::Sim)]
    target: Target,
    /// Measured seconds per co-simulation trial.
    #[arg(long, global = true, default_value_t = 2.0)]
    duration: f64,
    /// Warm-up seconds per co-simulation trial.
    #[arg(long, global = true, default_value_t = 0.5)]
    warmup: f64,
    /// Trials per point; the median is reported.
    #[arg(long, global = true, default_value_t = 3)]
    repeat: usize,
    /// Rounds of the adaptive preset's paired re-run of the best fixed point against
    /// adaptation (alternated; at least --repeat). More rounds, a steadier paired ratio.
    #[arg(long, global = true, default_value_t = cotune::sweep::PAIRED_ROUNDS)]
    paired_rounds: usize,
    /// Ethernet frame size in bytes (overrides each preset's default).
    #[arg(long, global = true)]
    frame_size: Option<usize>,
    /// The device's backend: in co-simulation `pair` or `tap`, or one of the measurement
    /// backends `sink`, `source`, `loop` (a host side faster than the guest), which VMs then
    /// use too (`vmm --net backend=…`; the baseline stays the raw tap loop). Not given: `pair`,
    /// and the seed presets, rx-coalesce and rx-busy-poll run on their own regimes (sink, loop,
    /// source);
    /// given, it applies to them too (e.g. `--backend tap seed-kick-threshold`: the plain tap).
    #[arg(long, global = true, value_enum)]
    backend: Option<BackendKind>,
    /// Device transport, in co-simulation and in VMs: virtio-mmio (one interrupt line, the
    /// ISR read per interrupt) or virtio-pci with an MSI-X vector per queue (no ISR read).
    #[arg(long, global = true, value_enum, default_value_t = TransportKind::Mmio)]
    transport: TransportKind,
    /// What the host does with the frames written to the tap (`--backend tap` and VMs on a
    /// tap): the network stack, or a 2-instruction XDP program attached for the run
    /// (`xdp-drop`: a non-blocking writer's frames skip the skb; `xdp-reflect`: each frame
    /// comes back to the same fd, so receiving presets forward through the tap). It applies to
    /// the raw write loop too, and is detached when cotune exits, however it exits.
    #[arg(long, global = true, value_enum, default_value_t = HostPath::Stack)]
    host_path: HostPath,
    /// How the driver guest waits when its rings are idle, in VMs: `halt` until an interrupt
    /// (its default), or `poll` its used rings (a busy-polling guest, as a DPDK or AF_XDP
    /// busy-poll application runs; a forwarding loop is then no longer bound by the guest's
    /// wake-up). Co-simulation's driver always waits for the interrupt.
    #[arg(long, global = true, value_enum, default_value_t = GuestWait::Halt)]
    guest_wait: GuestWait,
    /// Where the VMs' device runs: in `vmm` (`in-process`), or in `vhost-user-net` with `vmm`
    /// its vhost-user frontend (`vhost-user`: the backend gets the point's device keys, `vmm
    /// --net vhost-user=` the ring layout and transport; the device's counters come from the
    /// backend). Co-simulation keeps the device in process either way. A CSV column.
    #[arg(long, global = true, value_enum, default_value_t = DeviceArg::InProcess)]
    device: DeviceArg,
    /// The virtqueue layout of every point, offered by the device and requested by the driver
    /// (`vmm --net …,packed=on`, the guest's `packed=1`); the ring-layout preset sweeps it.
    #[arg(long, global = true, value_enum, default_value_t = RingArg::Split)]
    ring: RingArg,
    /// VIRTIO_F_IN_ORDER on both sides (with `--ring`).
    #[arg(long, global = true)]
    in_order: bool,
    /// The driver's tx completion for every point (both targets), for the presets that do not
    /// sweep it (those that do refuse it). Not given: each preset's own, mostly the driver's
    /// default `tx-interrupt`. With `--guest-wait poll` in VMs, `clean-from-rx` or `lazy`
    /// leaves the polling guest no interrupt at all (on a host where the guest's interrupt
    /// path is slow, a tx interrupt would otherwise dominate every round trip).
    #[arg(long, global = true, value_enum)]
    tx_completion: Option<TxCompletionArg>,
    /// Every point's device busy-poll sleeps this many µs between its looks at the rings
    /// instead of spinning (`--net …,busy_poll_sleep_us=`; 1..=1000), for the presets that do
    /// not sweep it (busy-poll-sleep refuses it). Applies where a point's busy-poll is on.
    #[arg(long, global = true, value_name = "US",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    busy_poll_sleep_us: Option<u32>,
    /// Every point's device coalesces the driver's kicks: `N/US` lets the driver queue N
    /// buffers past a drained tx ring without a kick and has the device look at the ring
    /// itself after US µs (`--net …,kick_coalesce_packets=N,kick_coalesce_usecs=US`; N 1..=65535,
    /// US 1..=10000), for the presets that do not sweep it (kick-coalesce refuses it).
    #[arg(long, global = true, value_name = "N/US", value_parser = parse_kick_coalesce)]
    kick_coalesce: Option<KickCoalescing>,
    /// The device may not poll, as for an operator who grants it no core: no point has a
    /// busy-poll window (presets that set one refuse this), adapting devices run with
    /// `adaptive_max_busy_poll_us=0` (they may coalesce kicks instead), and the adaptive
    /// preset's grid sweeps the device's kick coalescing (off, 192 buffers with 50 or 20 µs
    /// looks) in place of the busy-poll window.
    #[arg(long, global = true)]
    no_polling: bool,
    /// The adaptive preset's workloads to run (default: all of the backend's: fwd, pingpong
    /// and mixed through a loop, xsk-tx into a sink), e.g. `--workloads mixed` for a long
    /// `--vm-frames` run of the load that changes without the ping-pong's one frame in flight.
    #[arg(long, global = true, value_name = "NAME,…", value_delimiter = ',')]
    workloads: Vec<String>,
    /// The raw backend write loop's system call (`write`, the cheapest; `writev` of one
    /// iovec, as a device with a scatter-gather list makes it; `io-uring`, the device's own
    /// batches of 32 writes per submission on the backend as the ring's fixed file).
    #[arg(long, global = true, value_enum, default_value_t = BareSyscall::Write)]
    baseline_syscall: BareSyscall,
    /// vCPU time charged per driver kick in co-simulation, ns (0 = raw co-simulation), or
    /// `auto`: measured once by the driver guest (calibrate=2000 ring=3) in a VM.
    #[arg(long, global = true, value_parser = parse_cost, default_value_t = Cost::Ns(DEFAULT_KICK_COST_NS))]
    kick_cost_ns: Cost,
    /// vCPU time charged per interrupt taken in co-simulation, ns, or `auto` (see above).
    #[arg(long, global = true, value_parser = parse_cost, default_value_t = Cost::Ns(DEFAULT_IRQ_COST_NS))]
    irq_cost_ns: Cost,
    /// Pin the driver (vCPU) thread and the device worker to two separate CPUs.
    #[arg(long, global = true)]
    pin: bool,
    /// The vmm binary (default: `vmm` beside this executable, else target/release/vmm).
    #[arg(long, global = true, value_name = "PATH")]
    vmm: Option<PathBuf>,
    /// The driver guest (default: what resources/build-guest.sh --driver-guest-only builds).
    #[arg(long, global = true, value_name = "PATH")]
    guest: Option<PathBuf>,
    /// Frames per VM trial (default 300000; 30000 with --quick).
    #[arg(long, global = true, value_name = "N")]
    vm_frames: Option<u64>,
    /// Write one CSV row per point to FILE.
    #[arg(long, global = true, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Draw 1-D sweeps (pps and kicks/pkt against the knob) and 2-D sweeps (heatmaps) as SVG.
    #[arg(long, global = true, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// A short run for CI: fewer points (2-D sweeps 2x2), 0.3 s trials, one repeat.
    #[arg(long, global = true)]
    quick: bool,
    /// The adaptive preset fails (exit status 1) when, for a target and workload, both sides
    /// adapting score under RATIO × the best fixed point in the paired re-run (× the defaults
    /// where there is none) of the same run: a regression check (on a path where no knob can
    /// help, adapting must not cost).
    #[arg(long, global = true, value_name = "RATIO")]
    check_adaptive: Option<f64>,
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("cotune: {msg}");
    ExitCode::from(2)
}

/// The arguments' ranges and combinations, as a usage error.
fn check_args(cli: &Cli) -> Result<(), String> {
    if cli.command.is_some() {
        if !cli.presets.is_empty() {
            return Err("autotune takes one preset, after the word autotune".into());
        }
        if cli.target == Target::Both {
            return Err("autotune searches one target: --target sim or --target vm".into());
        }
    }
    let duration_ok = cli.duration > 0.0 && cli.duration <= 600.0;
    if !duration_ok || !(0.0..=60.0).contains(&cli.warmup) {
        return Err("--duration must be in (0, 600] s and --warmup in [0, 60] s".into());
    }
    if cli.repeat == 0 || cli.repeat > 100 {
        return Err("--repeat must be 1..=100".into());
    }
    if cli.paired_rounds == 0 || cli.paired_rounds > 100 {
        return Err("--paired-rounds must be 1..=100".into());
    }
    if let Some(s) = cli.frame_size {
        if !(cotune::frames::MIN_FRAME..=1514).contains(&s) {
            return Err(format!(
                "--frame-size must be {}..=1514",
                cotune::frames::MIN_FRAME
            ));
        }
    }
    if let Some(n) = cli.vm_frames {
        if !(1_000..=100_000_000).contains(&n) {
            return Err("--vm-frames must be 1000..=100000000".into());
        }
        if !cli.target.vm() {
            return Err("--vm-frames needs --target vm or both".into());
        }
    }
    Ok(())
}

/// Warns, on stderr, of a backend that does not compare like with like and of a busy host.
/// Returns the 1-minute load average.
fn warn_of_conditions(cli: &Cli) -> f64 {
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
    load
}

/// What booting VMs needs: the vmm and the guest located, the host checked.
fn locate_vm_env(cli: &Cli, backend: BackendKind) -> Result<VmEnv, String> {
    let vmm = vm::locate_vmm(cli.vmm.clone())?;
    let device = match cli.device {
        DeviceArg::InProcess => vm::DevicePlacement::InProcess,
        DeviceArg::VhostUser => vm::DevicePlacement::VhostUser(vm::locate_backend(&vmm)?),
    };
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
        guest_wait: cli.guest_wait,
        device,
    })
}

/// Measures the exit costs in a VM, saying so on stderr.
fn run_calibration(env: &VmEnv) -> Result<Calibration, String> {
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
            Ok(c)
        }
        Err(e) => Err(format!("\ncotune: {e}")),
    }
}

/// The sweep's options from the command line, the calibration (for `auto` costs) and the
/// located VM environment.
fn options(
    cli: &Cli,
    backend: BackendKind,
    pin: Option<(usize, usize)>,
    calibration: Option<&Calibration>,
    vm_env: Option<VmEnv>,
) -> Options {
    let cost = |c: Cost, auto: fn(&Calibration) -> f64| match c {
        Cost::Ns(n) => n,
        Cost::Auto => calibration.map_or(0, |c| auto(c).round() as u64),
    };
    Options {
        duration: Duration::from_secs_f64(if cli.quick { 0.3 } else { cli.duration }),
        warmup: Duration::from_secs_f64(if cli.quick { 0.1 } else { cli.warmup }),
        repeat: if cli.quick { 1 } else { cli.repeat },
        paired_rounds: cli.paired_rounds,
        frame_size: cli.frame_size,
        backend,
        own_regimes: cli.backend.is_none(),
        kick_cost_ns: cost(cli.kick_cost_ns, |c| c.kick_ns),
        irq_cost_ns: cost(cli.irq_cost_ns, |c| c.interrupt_cost_ns()),
        quick: cli.quick,
        target: cli.target,
        pin,
        vm: if cli.target.vm() { vm_env } else { None },
        transport: cli.transport,
        bare: cli.baseline_syscall,
        host_path: cli.host_path,
        ring: RingLayout {
            packed: cli.ring == RingArg::Packed,
            in_order: cli.in_order,
        },
        tx_completion: cli.tx_completion.map(Into::into),
        busy_poll_sleep_us: cli.busy_poll_sleep_us,
        kick_coalescing: cli.kick_coalesce,
        no_polling: cli.no_polling,
        workloads: cli.workloads.clone(),
    }
}

/// Runs each preset, with progress on stderr; an error (said on stderr) stops the run. Running
/// every preset, those the backend cannot run are left out, said so.
fn run_presets(cli: &Cli, presets: &[Preset], opts: &Options) -> Result<Vec<Row>, ()> {
    let mut rows = Vec::new();
    let mut stderr = std::io::stderr();
    for &preset in presets {
        let mut progress = |msg: &str| {
            let _ = write!(stderr, "\r\x1b[K{msg}");
            let _ = stderr.flush();
        };
        match run_preset(preset, opts, &mut progress) {
            Ok(r) => rows.extend(r),
            Err(e) if cli.presets.is_empty() && e.kind() == std::io::ErrorKind::Unsupported => {
                let _ = writeln!(stderr, "\r\x1b[Kcotune: skipped: {e}");
            }
            Err(e) => {
                eprintln!("\ncotune: {}: {e}", preset.name());
                return Err(());
            }
        }
    }
    eprintln!("\r\x1b[K");
    Ok(rows)
}

/// The `# target=…` line above the table: what ran, where, with which costs.
fn header(
    cli: &Cli,
    opts: &Options,
    calibration: Option<&Calibration>,
    presets: &[Preset],
    load: f64,
) -> String {
    let target = match cli.target {
        Target::Sim => "sim",
        Target::Vm => "vm",
        Target::Both => "both",
    };
    let costs = match calibration {
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
            opts.backend.name(),
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
    format!(
        "# target={target}{sim}{vm} ring={} duration={:?} repeat={} pin={} \
         loadavg1_at_start={load:.2}",
        opts.ring.name(),
        opts.duration,
        opts.repeat,
        opts.pin.map_or_else(
            || "off".into(),
            |(a, b)| format!("driver/vcpu:cpu{a},device:cpu{b}")
        ),
    )
}

/// Writes the CSV and the plots asked for, naming on stderr the plot files written.
fn write_outputs(cli: &Cli, rows: &[Row]) -> Result<(), String> {
    if let Some(path) = &cli.csv {
        if let Err(e) = std::fs::write(path, to_csv(rows)) {
            return Err(format!("cotune: cannot write {path:?}: {e}"));
        }
    }
    if let Some(path) = &cli.plot {
        match plot(rows, path) {
            Ok(files) => {
                for f in files {
                    eprintln!("cotune: wrote {}", f.display());
                }
            }
            Err(e) => return Err(format!("cotune: cannot draw {path:?}: {e}")),
        }
    }
    Ok(())
}

/// `cotune autotune`: the search (and the grid) with progress on stderr, the report on stdout.
fn run_autotune(
    cli: &Cli,
    preset: Preset,
    objective: Objective,
    check_grid: bool,
    opts: &Options,
    load: f64,
) -> ExitCode {
    let mut stderr = std::io::stderr();
    let mut progress = |msg: &str| {
        let _ = write!(stderr, "\r\x1b[K{msg}");
        let _ = stderr.flush();
    };
    let tuned = autotune(preset, opts, objective, check_grid, &mut progress);
    eprint!("\r\x1b[K");
    match tuned {
        Ok(t) => {
            println!("{}", header(cli, opts, None, &[preset], load));
            print!("{}", t.report());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cotune: autotune {}: {e}", preset.name());
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    if let Err(msg) = check_args(&cli) {
        return usage(&msg);
    }
    let pin = if cli.pin {
        match cotune::noise::cpu_pair() {
            Ok(p) => Some(p),
            Err(e) => return usage(&e.to_string()),
        }
    } else {
        None
    };
    let calibrate = cli.kick_cost_ns == Cost::Auto || cli.irq_cost_ns == Cost::Auto;
    let backend = cli.backend.unwrap_or(BackendKind::Pair);
    let load = warn_of_conditions(&cli);
    let vm_env = if cli.target.vm() || calibrate {
        match locate_vm_env(&cli, backend) {
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
        match run_calibration(vm_env.as_ref().expect("located above")) {
            Ok(c) => calibration = Some(c),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let opts = options(&cli, backend, pin, calibration.as_ref(), vm_env);
    if let Some(Command::Autotune {
        preset,
        objective,
        check_grid,
    }) = cli.command
    {
        return run_autotune(&cli, preset, objective, check_grid, &opts, load);
    }
    let presets = if cli.presets.is_empty() {
        Preset::ALL.to_vec()
    } else {
        cli.presets.clone()
    };
    let Ok(rows) = run_presets(&cli, &presets, &opts) else {
        return ExitCode::FAILURE;
    };
    println!(
        "{}",
        header(&cli, &opts, calibration.as_ref(), &presets, load)
    );
    print!("{}", to_table(&rows));
    let comparison = cotune::report::comparison_table(&rows);
    if !comparison.is_empty() {
        println!("\nadaptive against fixed knobs (per workload, its objective):\n{comparison}");
    }
    if let Err(e) = write_outputs(&cli, &rows) {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    match cli.check_adaptive {
        Some(min) if !adaptive_holds(&rows, min) => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    }
}

/// `--check-adaptive MIN`: whether adapting scored at least MIN × the defaults for every
/// target and workload the adaptive preset measured (and it measured some); says which did
/// not.
fn adaptive_holds(rows: &[Row], min: f64) -> bool {
    let comparisons = cotune::report::comparisons(rows);
    if comparisons.is_empty() {
        eprintln!("--check-adaptive: the adaptive preset measured nothing to compare");
        return false;
    }
    let mut holds = true;
    for c in &comparisons {
        // The paired re-run (adaptive and the best fixed point alternated) where there is one:
        // single trials of the grid swing more than the check's margin in a short run.
        let (ratio, against) = match &c.paired {
            Some((_, _, ratio)) => (*ratio, "the best fixed point, paired"),
            None => (c.vs_default, "the defaults"),
        };
        let ok = ratio >= min;
        println!(
            "check-adaptive {} {}: adaptive / {against} {ratio:.2} (at least {min:.2}): {}",
            c.target,
            c.workload,
            if ok { "ok" } else { "FAILED" }
        );
        holds &= ok;
    }
    holds
}
