//! `tap-xdp [--netns NS] TAP drop|reflect`: attaches a minimal XDP program to a tap (for
//! users running `vmm` by hand) until SIGINT/SIGTERM/SIGHUP, then detaches and exits 0.
//!
//! The program is attached through a bpf link owned by this process only, so it is detached
//! however the process ends (signal, error, even `SIGKILL`).

use std::fs::File;
use std::io;
use std::mem;
use std::os::fd::AsRawFd;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use cotune::xdp::{self, XdpProgram};

/// Attach a minimal XDP program to a tap until Ctrl-C.
#[derive(Parser, Debug)]
#[command(name = "tap-xdp")]
struct Args {
    /// Enter network namespace /var/run/netns/NS (as `ip netns add NS` creates) first.
    #[arg(long, value_name = "NS")]
    netns: Option<String>,
    /// The tap interface.
    tap: String,
    /// `drop`: XDP_DROP the frames written to the tap (no skb is built); `reflect`: XDP_TX
    /// them back to the tap fd that wrote them.
    program: Program,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Program {
    Drop,
    Reflect,
}

/// Moves this (single-threaded) process into network namespace `name`.
fn enter_netns(name: &str) -> io::Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a network namespace name"),
        ));
    }
    let path = format!("/var/run/netns/{name}");
    let ns = File::open(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot open network namespace {name:?} ({path}): {e}"),
        )
    })?;
    // SAFETY: setns changes only the calling thread's network namespace (this process has
    // one thread) to the one the open file `ns` refers to; `ns` stays open for the call.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot enter network namespace {name:?}: {e}"),
        ));
    }
    Ok(())
}

/// The signals that end the wait.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any use.
    let mut set: libc::sigset_t = unsafe { mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned here; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
    }
    set
}

fn run(args: &Args) -> io::Result<()> {
    // Block the stop signals first (the process has one thread), so that one arriving while
    // attaching stays pending and ends the wait below instead of killing the process.
    let set = stop_signals();
    // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    if let Some(ns) = &args.netns {
        enter_netns(ns)?;
    }
    let program = match args.program {
        Program::Drop => XdpProgram::Drop,
        Program::Reflect => XdpProgram::Reflect,
    };
    let attachment = xdp::attach(&args.tap, program)?;
    println!(
        "attached {} to {} (ifindex {}, {} mode); Ctrl-C detaches",
        program,
        args.tap,
        attachment.ifindex(),
        attachment.mode()
    );
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is an initialised sigset_t whose signals are blocked in this thread;
    // sigwait writes the signal number to `sig`, which outlives the call.
    let ret = unsafe { libc::sigwait(&set, &mut sig) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    drop(attachment);
    eprintln!("detached {program} from {}", args.tap);
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tap-xdp: {e}");
            ExitCode::FAILURE
        }
    }
}
