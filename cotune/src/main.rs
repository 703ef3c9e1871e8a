//! `cotune`: sweeps of the co-tuning knobs over the co-simulated guest driver and device.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cotune::cost::{DEFAULT_IRQ_COST_NS, DEFAULT_KICK_COST_NS};
use cotune::report::{plot_svg, to_csv, to_table};
use cotune::sweep::{run_preset, BackendKind, Options, Preset};

/// Sweeps virtio-net co-tuning knobs (kick threshold, tx completion, XDP_TX bulk, zero-copy
/// transmit) with the guest driver crate and the device model on host threads, and reports pps,
/// kicks and interrupts per packet against a raw backend write loop.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Presets to run (default: all).
    #[arg(value_enum)]
    presets: Vec<Preset>,
    /// Measured seconds per trial.
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// Warm-up seconds per trial.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Trials per point; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Ethernet frame size in bytes (overrides each preset's default).
    #[arg(long)]
    frame_size: Option<usize>,
    /// Device backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Pair)]
    backend: BackendKind,
    /// vCPU time charged per driver kick (a VM exit on hardware KVM), ns; 0 = raw co-simulation.
    #[arg(long, default_value_t = DEFAULT_KICK_COST_NS)]
    kick_cost_ns: u64,
    /// vCPU time charged per interrupt taken, ns; 0 = raw co-simulation.
    #[arg(long, default_value_t = DEFAULT_IRQ_COST_NS)]
    irq_cost_ns: u64,
    /// Write one CSV row per point to FILE.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Draw pps and kicks/pkt against the knob into FILE (SVG).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// A short run for CI: fewer points, 0.3 s trials, one repeat.
    #[arg(long)]
    quick: bool,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let duration_ok = cli.duration > 0.0 && cli.duration <= 600.0;
    if !duration_ok || !(0.0..=60.0).contains(&cli.warmup) {
        eprintln!("cotune: --duration must be in (0, 600] s and --warmup in [0, 60] s");
        return ExitCode::from(2);
    }
    if cli.repeat == 0 || cli.repeat > 100 {
        eprintln!("cotune: --repeat must be 1..=100");
        return ExitCode::from(2);
    }
    if let Some(s) = cli.frame_size {
        if !(cotune::frames::MIN_FRAME..=1514).contains(&s) {
            eprintln!(
                "cotune: --frame-size must be {}..=1514",
                cotune::frames::MIN_FRAME
            );
            return ExitCode::from(2);
        }
    }
    let opts = Options {
        duration: Duration::from_secs_f64(if cli.quick { 0.3 } else { cli.duration }),
        warmup: Duration::from_secs_f64(if cli.quick { 0.1 } else { cli.warmup }),
        repeat: if cli.quick { 1 } else { cli.repeat },
        frame_size: cli.frame_size,
        backend: cli.backend,
        kick_cost_ns: cli.kick_cost_ns,
        irq_cost_ns: cli.irq_cost_ns,
        quick: cli.quick,
    };
    let presets = if cli.presets.is_empty() {
        Preset::ALL.to_vec()
    } else {
        cli.presets.clone()
    };
    let mut rows = Vec::new();
    let mut stderr = std::io::stderr();
    for preset in presets {
        let mut progress = |msg: &str| {
            let _ = write!(stderr, "\r\x1b[K{msg}");
            let _ = stderr.flush();
        };
        match run_preset(preset, &opts, &mut progress) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("\ncotune: {}: {e}", preset.name());
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("\r\x1b[K");
    println!(
        "# backend={} kick_cost_ns={} irq_cost_ns={} duration={:?} repeat={}",
        cli.backend.to_possible_value_name(),
        opts.kick_cost_ns,
        opts.irq_cost_ns,
        opts.duration,
        opts.repeat
    );
    print!("{}", to_table(&rows));
    if let Some(path) = &cli.csv {
        if let Err(e) = std::fs::write(path, to_csv(&rows)) {
            eprintln!("cotune: cannot write {path:?}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &cli.plot {
        if let Err(e) = plot_svg(&rows, path) {
            eprintln!("cotune: cannot draw {path:?}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

trait ValueName {
    fn to_possible_value_name(&self) -> String;
}

impl ValueName for BackendKind {
    fn to_possible_value_name(&self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }
}
