//! `--target vm`: a point measured in a real VM. Each trial boots the bare-metal driver guest
//! (`guest/baremetal`, `ring=3`) through the `vmm` binary on a tap in a network namespace the
//! tool creates and removes, as `guest/baremetal/sweep.sh` does: driver knobs and the workload
//! go on the guest's command line, device knobs in the `--net` spec; the guest's
//! `{"driver":…}` line (stdout) and the VMM's `{"net":…}` metrics line (stderr, at exit) give
//! the counters. The echo workload's host side is a packet socket in the namespace.

use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use devices::test_utils::link::PacketSocket;
use devices::test_utils::netns::NetNs;
use serde_json::Value;
use vnet_driver::xsk::XskMode;

use crate::calib::{self, Calibration};
use crate::frames::{test_frame, ETHERTYPE, SRC_MAC};
use crate::noise::{comm_name, pin_thread, proc_task_cpu_ns, proc_thread_named};
use crate::point::{BackendKind, HostPath, Measured, Point};
use crate::workloads::Workload;

/// The tap each VM trial uses (inside its own namespace).
const TAP: &str = "ctap0";
/// Echo frames the host peer keeps in flight (as sweep.sh).
const IN_FLIGHT: u64 = crate::workloads::ECHO_WINDOW;
/// How long a guest may take to come up.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What booting VMs needs.
#[derive(Clone, Debug)]
pub struct VmEnv {
    /// The `vmm` binary.
    pub vmm: PathBuf,
    /// The driver guest (ELF).
    pub guest: PathBuf,
    /// Frames per VM trial (`tx=N` / `echo=N`).
    pub frames: u64,
    /// The device transport (`--net …,transport=pci` and the guest's `transport=pci`).
    pub transport: crate::transport::TransportKind,
    /// The device's backend: a tap (for `tap` and `pair`), or the VMM's measurement
    /// backend of that name (`--net backend=sink|source|loop`).
    pub backend: BackendKind,
    /// The tap's host path (an XDP program attached to it for each VM).
    pub host_path: HostPath,
    /// How the driver guest waits when its rings are idle (its `wait=`).
    pub guest_wait: GuestWait,
    /// Where the device runs: in `vmm`, or in `vhost-user-net` behind `vmm --net vhost-user=`.
    pub device: DevicePlacement,
}

/// Where a VM's device runs (`--device`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DevicePlacement {
    /// In the VMM (`vmm --net …`).
    #[default]
    InProcess,
    /// In `vhost-user-net` (this binary), the VMM its vhost-user frontend.
    VhostUser(PathBuf),
}

impl DevicePlacement {
    /// The CSV column's value.
    pub fn name(&self) -> &'static str {
        match self {
            DevicePlacement::InProcess => "in-process",
            DevicePlacement::VhostUser(_) => "vhost-user",
        }
    }
}

/// The `vhost-user-net` binary beside `vmm`.
pub fn locate_backend(vmm: &Path) -> Result<PathBuf, String> {
    let bin = vmm.with_file_name("vhost-user-net");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "--device vhost-user: no {} (build it: cargo build --release --bin vhost-user-net)",
            bin.display()
        ))
    }
}

/// How the driver guest waits for work (its `wait=` word).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GuestWait {
    /// `hlt` until an interrupt when one is due (the guest's default).
    #[default]
    Halt,
    /// Spin polling the used rings (a busy-polling guest: no interrupt's wake-up, and the
    /// guest's turn-around no longer bounds a forwarding loop).
    Poll,
}

/// The workspace root (cotune's manifest directory's parent).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The `vmm` binary: `explicit`, else `vmm` beside this executable, else the workspace's
/// `target/release/vmm`.
pub fn locate_vmm(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("--vmm {}: no such file", p.display()))
        };
    }
    let mut tried = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        tried.push(dir.join("vmm"));
        // Test binaries run from target/<profile>/deps.
        if dir.ends_with("deps") {
            if let Some(up) = dir.parent() {
                tried.push(up.join("vmm"));
            }
        }
    }
    tried.push(workspace_root().join("target/release/vmm"));
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "no vmm binary (looked at {}); build it (cargo build --release -p vmm) or pass --vmm PATH",
            tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// The driver guest: `explicit`, else what `resources/build-guest.sh --driver-guest-only`
/// prints as `driver_guest=` (it builds the guest once and caches it).
pub fn locate_guest(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("--guest {}: no such file", p.display()))
        };
    }
    let script = workspace_root().join("resources/build-guest.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--driver-guest-only")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --driver-guest-only failed ({})",
            script.display(),
            out.status
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("driver_guest="))
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "{} printed no driver_guest= line with a file",
                script.display()
            )
        })
}

/// Refuses a VM target on a machine that cannot boot one here.
pub fn check_host() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("--target vm|both needs root (a network namespace and a tap)".into());
    }
    if !Path::new("/dev/kvm").exists() {
        return Err("--target vm|both needs /dev/kvm".into());
    }
    Ok(())
}

/// Why `point` has no counterpart in the driver guest on `backend`, if it has none.
pub fn unsupported(point: &Point, backend: BackendKind) -> Option<&'static str> {
    match (point.workload, backend) {
        (Workload::XskTx(XskMode::Copy), _) => {
            Some("the driver guest has no AF_XDP copy-mode transmit (only tx= batches)")
        }
        (Workload::XskTx(_), BackendKind::Loop) => {
            Some("the driver guest's tx= takes no frames back from a loop")
        }
        _ => None,
    }
}

/// The guest's command line for `point` with `frames` frames.
pub fn cmdline(point: &Point, frames: u64) -> String {
    let c = &point.config;
    let workload = match point.workload {
        Workload::XskTx(_) => "tx",
        Workload::Bidirectional | Workload::XdpBounce | Workload::Echo => "echo",
        Workload::Rx => "rx",
        Workload::Fwd => "fwd",
        Workload::PingPong(_) => "pingpong",
        Workload::Mixed { .. } => "mixed",
    };
    let window = match point.workload {
        Workload::Fwd => format!(" window={}", crate::workloads::FWD_WINDOW),
        Workload::PingPong(w) => format!(" window={w}"),
        Workload::Mixed { window, phase } => {
            format!(" window={window} phase_us={}", phase.as_micros())
        }
        _ => String::new(),
    };
    let completion = match c.tx_completion {
        vnet_driver::TxCompletion::TxInterrupt => "tx-interrupt",
        vnet_driver::TxCompletion::CleanFromRx => "clean-from-rx",
        vnet_driver::TxCompletion::Lazy => "lazy",
    };
    let mut pace = point.pace.map_or_else(String::new, |p| {
        format!(" burst={} pause_us={}", p.burst, p.pause_us)
    });
    if c.packed {
        pace += " packed=1";
    }
    if c.in_order {
        pace += " in_order=1";
    }
    if c.adaptive {
        pace += " adaptive=1";
    }
    format!(
        "console=ttyS0 {workload}={frames}{window} size={} ring=3 kick_threshold={} \
         tx_completion={completion} event_idx={} xdp_bulk={} device_stats={} \
         timeout_ms=120000{pace}",
        point.frame_size,
        c.kick_threshold,
        u8::from(c.event_idx),
        c.xdp_bulk,
        u8::from(c.device_stats && c.ctrl_vq),
    )
}

/// A fresh namespace with tap [`TAP`] (vnet_hdr, up) for one VM, IPv6 off
/// ([`crate::env::trial_netns`]).
fn vm_netns() -> io::Result<NetNs> {
    let ns = crate::env::trial_netns()?;
    ns.ip(&["tuntap", "add", TAP, "mode", "tap", "vnet_hdr"])?;
    ns.ip(&["link", "set", TAP, "up"])?;
    Ok(ns)
}

/// Splits a VM point's `--net` into the backend's `--net` (everything but the transport) and
/// the VMM's (`vhost-user=SOCKET` with the ring layout, queue count and transport: the VMM
/// offers those too).
fn vhost_user_split(net: &str, socket: &Path) -> (String, String) {
    let device: Vec<&str> = net
        .split(',')
        .filter(|item| !item.starts_with("transport="))
        .collect();
    let mut vmm_net = format!("vhost-user={}", socket.display());
    for item in net.split(',') {
        if ["packed=", "in_order=", "transport=", "queues="]
            .iter()
            .any(|k| item.starts_with(k))
        {
            vmm_net.push(',');
            vmm_net.push_str(item);
        }
    }
    (device.join(","), vmm_net)
}

/// A `vhost-user-net` serving one VM trial's device (in the trial's namespace, beside the tap).
struct Backend {
    child: Child,
    stderr: Option<thread::JoinHandle<String>>,
    dir: PathBuf,
}

impl Backend {
    /// Starts it with the device spec `net` (`tap=…,knobs`, a `,transport=` left to the VMM);
    /// returns it and the VMM's `--net` for it.
    fn start(bin: &Path, ns: &NetNs, net: &str) -> io::Result<(Backend, String)> {
        let dir = std::env::temp_dir().join(format!("cotune-vu-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("vu.sock");
        let (device, vmm_net) = vhost_user_split(net, &socket);
        let mut child = ns
            .command(&bin.to_string_lossy())
            .arg("--socket")
            .arg(&socket)
            .args(["--net", &device])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stderr = child.stderr.take().expect("piped stderr");
        let stderr = thread::Builder::new()
            .name("cotune-beerr".into())
            .spawn(move || {
                let mut s = String::new();
                let _ = stderr.read_to_string(&mut s);
                s
            })?;
        let deadline = Instant::now() + READY_TIMEOUT;
        while !socket.exists() {
            if Instant::now() > deadline || child.try_wait()?.is_some() {
                let _ = child.kill();
                return Err(io::Error::other(format!(
                    "vhost-user-net --net {device} did not come up"
                )));
            }
            thread::sleep(Duration::from_millis(5));
        }
        let backend = Backend {
            child,
            stderr: Some(stderr),
            dir,
        };
        Ok((backend, vmm_net))
    }

    /// SIGTERM, then its stderr (the metrics line it prints at exit).
    fn stop(mut self) -> String {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill takes no pointers; the pid is our child's, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running `vmm`, killed on drop if it has not exited.
struct Vmm {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Vmm {
    fn spawn(
        env_vmm: &Path,
        guest: &Path,
        ns: &NetNs,
        net: &str,
        cmdline: &str,
    ) -> io::Result<Vmm> {
        let mut child = ns
            .command(&env_vmm.to_string_lossy())
            .arg("--kernel")
            .arg(guest)
            .args(["--net", net, "--cmdline", cmdline])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        thread::Builder::new()
            .name("cotune-vmout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })?;
        let stderr = thread::Builder::new()
            .name("cotune-vmerr".into())
            .spawn(move || {
                let mut s = String::new();
                let _ = stderr.read_to_string(&mut s);
                s
            })?;
        Ok(Vmm {
            child,
            lines,
            stderr: Some(stderr),
        })
    }

    /// The next console line, waiting until `deadline`.
    fn line_until(&self, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.lines.recv_timeout(left).ok()
    }

    /// Waits for the VMM to exit (killing it after `timeout`) and returns its stderr.
    fn finish(mut self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => thread::sleep(Duration::from_millis(5)),
            }
        }
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The vCPU and device-worker threads of a running VM and their CPU time (the worker in the
/// VMM's process, or in the vhost-user backend's).
struct VmThreads {
    pid: u32,
    vcpu: Option<i32>,
    worker_pid: u32,
    worker: Option<i32>,
}

impl VmThreads {
    fn find(pid: u32, worker_pid: u32) -> VmThreads {
        VmThreads {
            pid,
            vcpu: proc_thread_named(pid, "vcpu0"),
            worker_pid,
            worker: proc_thread_named(worker_pid, &comm_name(&format!("net-{TAP}"))),
        }
    }

    /// Both threads' CPU time, if both could be read (they exit when the guest resets).
    fn cpu(&self) -> Option<(u64, u64)> {
        let vcpu = self.vcpu.and_then(|t| proc_task_cpu_ns(self.pid, t))?;
        let worker = self
            .worker
            .and_then(|t| proc_task_cpu_ns(self.worker_pid, t))?;
        Some((vcpu, worker))
    }

    fn pin(&self, (a, b): (usize, usize)) -> io::Result<()> {
        let missing = |what| io::Error::other(format!("--pin: the VMM has no {what} thread"));
        pin_thread(self.vcpu.ok_or_else(|| missing("vcpu0"))?, a)?;
        pin_thread(self.worker.ok_or_else(|| missing("net-ctap0"))?, b)
    }
}

/// The echo workload's host side: sends test frames into the tap (at most [`IN_FLIGHT`]
/// unanswered) and counts the guest's echoes (MACs swapped), until `n` came back, `stop`, or
/// 10 s without an echo.
fn echo_peer(sock: PacketSocket, n: u64, size: usize, stop: Arc<AtomicBool>) -> u64 {
    let fd = sock.as_raw_fd();
    let mut buf = vec![0u8; 70_000];
    let (mut sent, mut got) = (0u64, 0u64);
    let mut last = Instant::now();
    while got < n && !stop.load(Ordering::Relaxed) && last.elapsed() < Duration::from_secs(10) {
        while sent < n && sent - got < IN_FLIGHT {
            if sock.send(&test_frame(size, sent as u32)).is_err() {
                break;
            }
            sent += 1;
        }
        if !crate::env::wait_readable(fd, 10) {
            continue;
        }
        loop {
            // SAFETY: recv writes at most buf.len() bytes into buf, which lives for the call.
            let r =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if r <= 0 {
                break;
            }
            let f = &buf[..r as usize];
            // An echo comes back addressed to our source MAC.
            if f.len() >= 14 && f[..6] == SRC_MAC && f[12..14] == ETHERTYPE.to_be_bytes() {
                got += 1;
                last = Instant::now();
            }
        }
    }
    got
}

/// The last `{"net":…}` line of the VMM's stderr, for tap [`TAP`].
fn device_metrics(stderr: &str) -> Option<Value> {
    let line = stderr.lines().rev().find(|l| l.starts_with("{\"net\":"))?;
    let v: Value = serde_json::from_str(line).ok()?;
    v.get("net")?.get(TAP).cloned()
}

fn num(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// What a VM trial gave.
#[derive(Debug)]
pub enum VmRun {
    /// The counters, and a note on how they map to the co-simulation's.
    Measured(Box<Measured>, String),
    /// This guest cannot run the point (why).
    Unsupported(String),
}

/// Boots the driver guest for one trial of `point`.
pub fn run_point(env: &VmEnv, point: &Point, pin: Option<(usize, usize)>) -> io::Result<VmRun> {
    let ns = vm_netns()?;
    let _xdp = if env.backend.is_measurement() {
        None
    } else {
        env.host_path.attach(&ns, TAP)?
    };
    let (mut net, cmdline) = vm_args(env, point);
    let backend = match &env.device {
        DevicePlacement::InProcess => None,
        DevicePlacement::VhostUser(bin) => {
            let (backend, vmm_net) = Backend::start(bin, &ns, &net)?;
            net = vmm_net;
            Some(backend)
        }
    };
    let vmm = Vmm::spawn(&env.vmm, &env.guest, &ns, &net, &cmdline)?;
    let (vmm, mut console) = wait_ready(vmm, &net, &cmdline)?;
    let worker_pid = backend.as_ref().map_or(vmm.child.id(), |b| b.child.id());
    let threads = VmThreads::find(vmm.child.id(), worker_pid);
    if let Some(cpus) = pin {
        threads.pin(cpus)?;
    }
    let start = (Instant::now(), threads.cpu());
    let hosts = HostSide::start(env, point, &ns)?;
    let (report, end) = read_result(&vmm, &threads, env.frames, &mut console);
    let end = end.unwrap_or(start);
    let (host, echoed) = hosts.stop();
    let mut stderr = vmm.finish(Duration::from_secs(10));
    if let Some(backend) = backend {
        // The device's counters are the backend's: its metrics line at exit.
        stderr = backend.stop();
    }
    drop(ns);
    let run = RunOutput {
        args: (&net, &cmdline),
        report,
        console,
        stderr,
        cpu: (start, end),
        host,
        echoed,
    };
    run.measured(env, point)
}

/// The VMM's `--net` spec and the guest's command line for `point`.
fn vm_args(env: &VmEnv, point: &Point) -> (String, String) {
    // A measurement backend takes the tap's name, so the metrics and thread names match.
    let backend = if env.backend.is_measurement() {
        format!("backend={},", env.backend.name())
    } else {
        String::new()
    };
    let mut net = format!("{backend}tap={TAP}{}", point.dev.net_spec_keys());
    if env.backend == BackendKind::Source {
        net += &format!(",frame_size={}", point.frame_size);
    }
    let mut cmdline = cmdline(point, env.frames);
    if env.guest_wait == GuestWait::Poll {
        cmdline.push_str(" wait=poll");
    }
    if env.transport == crate::transport::TransportKind::Pci {
        net.push_str(",transport=pci");
        cmdline.push_str(" transport=pci");
    }
    (net, cmdline)
}

/// Waits for the guest's `driver-guest: ready` line; returns the VMM and the console so far.
fn wait_ready(vmm: Vmm, net: &str, cmdline: &str) -> io::Result<(Vmm, String)> {
    let ready_by = Instant::now() + READY_TIMEOUT;
    let mut console = String::new();
    loop {
        let Some(line) = vmm.line_until(ready_by) else {
            let err = vmm.finish(Duration::from_secs(1));
            return Err(io::Error::other(format!(
                "the driver guest did not come up (vmm --net {net} --cmdline {cmdline:?}):\n{console}{err}"
            )));
        };
        let ready = line.contains("driver-guest: ready");
        console.push_str(&line);
        console.push('\n');
        if ready {
            return Ok((vmm, console));
        }
    }
}

/// A reading of both VM threads' CPU time (if read) and when it was taken.
type CpuReading = (Instant, Option<(u64, u64)>);

/// Reads the console until the guest's `{"driver":…}` line (the line, parsed), the VMM's
/// end, or a deadline for `frames`; the other lines go to `console`. Also returns the last
/// reading of both threads' CPU time (if any): sampled every 20 ms and as the result line
/// arrives (the threads end when the guest resets, which can beat the line to us).
fn read_result(
    vmm: &Vmm,
    threads: &VmThreads,
    frames: u64,
    console: &mut String,
) -> (Option<Value>, Option<CpuReading>) {
    // Generous: the slowest in-guest rates seen are ~50 kpps.
    let done_by = Instant::now() + Duration::from_secs(60) + Duration::from_micros(frames * 20);
    let mut report = None;
    let mut last = None;
    loop {
        let next = Instant::now() + Duration::from_millis(20);
        let line = if next < done_by {
            match vmm.lines.recv_timeout(Duration::from_millis(20)) {
                Ok(line) => Some(line),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match vmm.line_until(done_by) {
                Some(line) => Some(line),
                None => break,
            }
        };
        if let Some(c) = threads.cpu() {
            last = Some((Instant::now(), Some(c)));
        }
        let Some(line) = line else { continue };
        if line.starts_with("{\"driver\":") {
            report = serde_json::from_str::<Value>(&line).ok();
            break;
        }
        console.push_str(&line);
        console.push('\n');
    }
    (report, last)
}

/// The host's side of a VM trial: the injector (receiving on a tap) or the echo peer.
struct HostSide {
    injector: Option<crate::injector::Injector>,
    stop: Arc<AtomicBool>,
    peer: Option<thread::JoinHandle<u64>>,
}

impl HostSide {
    fn start(env: &VmEnv, point: &Point, ns: &NetNs) -> io::Result<HostSide> {
        let echo = !matches!(point.workload, Workload::XskTx(_) | Workload::Rx)
            && !point.workload.round_trips();
        let on_tap = !env.backend.is_measurement();
        let injector = if point.workload == Workload::Rx && on_tap {
            let sock = ns.run(|| PacketSocket::open(TAP, ETHERTYPE))??;
            let mac = devices::virtio::net::MacAddr::derived_from(TAP).bytes();
            Some(crate::injector::Injector::start(
                sock,
                mac,
                point.frame_size,
            )?)
        } else {
            None
        };
        let stop = Arc::new(AtomicBool::new(false));
        let peer = if echo && on_tap && env.host_path == HostPath::Stack {
            let sock = ns.run(|| PacketSocket::open(TAP, ETHERTYPE))??;
            // Only the echoes are wanted back: half the receives (the peer filters them anyway
            // where the kernel cannot).
            let _ = sock.ignore_outgoing();
            let (n, size, s) = (env.frames, point.frame_size, stop.clone());
            Some(
                thread::Builder::new()
                    .name("cotune-echo".into())
                    .spawn(move || echo_peer(sock, n, size, s))?,
            )
        } else {
            None
        };
        Ok(HostSide {
            injector,
            stop,
            peer,
        })
    }

    /// Stops both; the injector's figures and the echoes the peer counted, where they ran.
    fn stop(self) -> (Option<crate::injector::InjectorStats>, Option<u64>) {
        let host = self.injector.map(crate::injector::Injector::stop);
        self.stop.store(true, Ordering::Relaxed);
        let echoed = self.peer.map(|p| p.join().unwrap_or(0));
        (host, echoed)
    }
}

/// What a VM trial left to read once the VMM exited.
struct RunOutput<'a> {
    /// The VMM's `--net` spec and the guest's command line (for errors).
    args: (&'a str, &'a str),
    /// The guest's `{"driver":…}` line, if it came.
    report: Option<Value>,
    console: String,
    /// The VMM's stderr.
    stderr: String,
    /// Both threads' CPU time at the start and at the last reading.
    cpu: (CpuReading, CpuReading),
    host: Option<crate::injector::InjectorStats>,
    /// The echoes the host peer counted.
    echoed: Option<u64>,
}

impl RunOutput<'_> {
    /// The guest's and the VMM's counters as a measurement, after checking them.
    fn measured(self, env: &VmEnv, point: &Point) -> io::Result<VmRun> {
        let (net, cmdline) = self.args;
        let Some(report) = self.report.and_then(|r| r.get("driver").cloned()) else {
            return Err(io::Error::other(format!(
                "no result line from the driver guest (vmm --net {net} --cmdline {cmdline:?}):\n{}{}",
                self.console, self.stderr
            )));
        };
        let status = report.get("status").and_then(Value::as_str).unwrap_or("?");
        if status != "done" {
            return Err(io::Error::other(format!(
                "driver guest: status {status} ({report}) for --net {net} --cmdline {cmdline:?}"
            )));
        }
        // The device's counters as the guest read them (DEVICE_STATS) against its own.
        let stats_note = crate::check::vm_device_agreement(&report).map_err(|e| {
            io::Error::other(format!(
                "driver/device disagreement: {e} (--net {net} --cmdline {cmdline:?}): {report}"
            ))
        })?;
        let stderr = &self.stderr;
        let dev = device_metrics(stderr).ok_or_else(|| {
            io::Error::other(format!(
                "no {{\"net\":{{\"{TAP}\":…}}}} metrics line from the vmm:\n{stderr}"
            ))
        })?;
        if let Some(p) = point.pace {
            // A guest that does not know burst= ignores the word: it would run unpaced.
            if report.get("burst").and_then(Value::as_u64) != Some(u64::from(p.burst)) {
                return Ok(VmRun::Unsupported(format!(
                    "this driver guest ignores burst={} pause_us={} (no tx pacing in its build)",
                    p.burst, p.pause_us
                )));
            }
        }
        let ((t0, cpu0), (t1, cpu1)) = self.cpu;
        let cpu = match (cpu0, cpu1) {
            (Some(a), Some(b)) if t1 > t0 => {
                Some((b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)))
            }
            _ => None,
        };
        let done = num(&report, &["done"]);
        let elapsed_ns = num(&report, &["elapsed_ns"]);
        if elapsed_ns == 0 {
            return Err(io::Error::other(format!(
                "driver guest reported no elapsed_ns: {report}"
            )));
        }
        let mut note = vm_note(env, point, &report, self.echoed)?;
        if let Some(why) = stats_note {
            note += &format!("; device statistics not checked ({why})");
        }
        if cpu.is_none() {
            note += "; thread CPU not read (vcpu0/net-ctap0 not found)";
        }
        let m = Measured {
            secs: elapsed_ns as f64 / 1e9,
            packets: done,
            kicks: num(&report, &["kicks"]) + num(&report, &["rx_kicks"]),
            irqs: num(&report, &["irqs_taken"]),
            tx_irqs: num(&dev, &["tx", "interrupts_raised"]),
            kicks_suppressed: num(&report, &["kicks_suppressed"]),
            driver_cpu_ns: cpu.map_or(0, |c| c.0),
            device_cpu_ns: cpu.map_or(0, |c| c.1),
            cpu_secs: if cpu.is_some() {
                (t1 - t0).as_secs_f64()
            } else {
                f64::NAN
            },
            busy_poll_found: num(&dev, &["busy_poll", "found_work"]),
            busy_poll_us: num(&dev, &["busy_poll", "polled_us"]),
            host_pps: self.host.map_or(0.0, |h| h.pps()),
            latency: round_trips(&report),
            flood_pps: report.get("flood_pps").and_then(Value::as_f64),
            adapted: adapted(&report, &dev),
        };
        Ok(VmRun::Measured(Box::new(m), note))
    }
}

/// Where adaptation left the knobs: the driver's from its result line, the device's from its
/// metrics.
fn adapted(report: &Value, dev: &Value) -> crate::workloads::Adapted {
    crate::workloads::Adapted {
        kick_threshold: num(report, &["kick_threshold_now"]),
        xdp_bulk: num(report, &["xdp_bulk_now"]),
        rx_coal_level: num(report, &["rx_coal_level"]),
        driver_changes: num(report, &["adapt_changes"]),
        busy_poll_us: num(dev, &["adaptive", "busy_poll_us"]),
        coalesce_usecs: num(dev, &["adaptive", "coalesce_usecs"]),
        busy_poll_changes: num(dev, &["adaptive", "busy_poll_changes"]),
        coalescing_changes: num(dev, &["adaptive", "coalescing_changes"]),
        kick_coalesce_usecs: num(dev, &["adaptive", "kick_coalesce_usecs"]),
        kick_coalescing_changes: num(dev, &["adaptive", "kick_coalescing_changes"]),
    }
}

/// How the VM's counters map to the co-simulation's, and what the trial lost: an error when
/// a receiving guest got frames bad (or, from a source, lost any).
fn vm_note(env: &VmEnv, point: &Point, report: &Value, echoed: Option<u64>) -> io::Result<String> {
    // Receiving points reach here as the echo workload (`run_preset` maps them, and runs the
    // same workload in co-simulation), so a packet is one echo on both sides.
    let mut note = String::from(match (point.workload, env.backend) {
        (Workload::PingPong(_), _) => "vm: pingpong= (round trips timed on the guest's TSC)",
        (Workload::Mixed { .. }, _) => {
            "vm: mixed= (phases and round trips timed on the guest's TSC; pps: the floods')"
        }
        (Workload::XskTx(_), _) => "vm: tx= copy batches",
        (Workload::Rx, _) => "vm: rx= (every frame checked)",
        (Workload::Fwd, _) => "vm: fwd= (256 frames in flight)",
        (_, BackendKind::Source) => "vm: echo of the source's frames",
        _ => "vm: echo workload (host peer keeps 64 frames in flight)",
    });
    // A guest that does not know packed= or in_order= runs the split ring: a point on
    // another layout must not be reported as if it had run on it.
    let ring = point.ring();
    let virtqueue = report.get("virtqueue").and_then(Value::as_str);
    let in_order = report.get("in_order").and_then(Value::as_u64).unwrap_or(0) != 0;
    let expected = if ring.packed { "packed" } else { "split" };
    if (virtqueue.unwrap_or("split"), in_order) != (expected, ring.in_order) {
        return Err(io::Error::other(format!(
            "driver guest ran virtqueue {virtqueue:?} in_order {in_order}, not the point's {}: \
             {report}",
            ring.name()
        )));
    }
    let on_tap = !env.backend.is_measurement();
    if point.workload == Workload::Rx {
        // A source loses nothing; a tap drops what the guest does not take in time (sequence
        // gaps), but nothing may arrive damaged.
        let lost = if on_tap { 0 } else { num(report, &["rx_lost"]) };
        let bad = num(report, &["rx_bad"]) + lost;
        if bad > 0 {
            return Err(io::Error::other(format!(
                "driver guest: {bad} frames bad or lost: {report}"
            )));
        }
        if on_tap {
            note += &format!("; {} dropped at the tap", num(report, &["rx_lost"]));
        }
    }
    let done = num(report, &["done"]);
    check_round_trips(report, point.workload)?;
    if let Some(e) = echoed {
        if e < done {
            note += &format!("; peer counted {e} of {done} echoes");
        }
    }
    Ok(note)
}

/// The round trips of a `pingpong=` result line, or of a `mixed=` line's trickle phases
/// (`None` for other workloads, or a line without them).
fn round_trips(report: &Value) -> Option<crate::workloads::Latency> {
    let field = |k: &str| report.get(k).and_then(Value::as_u64);
    Some(crate::workloads::Latency {
        samples: field("rtt_samples")?,
        min_ns: field("rtt_min_ns")?,
        p50_ns: field("rtt_p50_ns")?,
        p99_ns: field("rtt_p99_ns")?,
        p999_ns: field("rtt_p999_ns")?,
        max_ns: field("rtt_max_ns")?,
        bad: field("rtt_bad")?,
        lost: field("rtt_lost")?,
    })
}

/// A `pingpong=` or `mixed=` trial's own checks (nothing for other workloads): the guest ran
/// the window (and phase length) asked for, accounted for every one of the round trips it was
/// asked for (`mixed=`: flood frames + trickle samples), none came back damaged or unknown and
/// none was lost, the percentiles are in order (`mixed=`: it reached a trickle and reports a
/// flood rate); and the device carried each frame once each way (`tx_frames` + `xdp_tx` =
/// round trips, `rx_frames` ≥ round trips).
fn check_round_trips(report: &Value, workload: Workload) -> io::Result<()> {
    let (name, window) = match workload {
        Workload::PingPong(w) => ("pingpong", w),
        Workload::Mixed { window, .. } => ("mixed", window),
        _ => return Ok(()),
    };
    let err = |what: String| Err(io::Error::other(format!("{name}: {what}: {report}")));
    let Some(l) = round_trips(report) else {
        return err("no round-trip times in the driver guest's line (an older guest?)".into());
    };
    let (requested, done) = (num(report, &["requested"]), num(report, &["done"]));
    if num(report, &["window"]) != u64::from(window) {
        return err(format!("the guest ran window={}", num(report, &["window"])));
    }
    let mut timed = l.samples;
    if let Workload::Mixed { phase, .. } = workload {
        if u128::from(num(report, &["phase_us"])) != phase.as_micros() {
            return err(format!(
                "the guest ran phase_us={}",
                num(report, &["phase_us"])
            ));
        }
        if num(report, &["phases"]) < 2 || l.samples == 0 {
            return err("no trickle phase (too few round trips for the phase length)".into());
        }
        if !report
            .get("flood_pps")
            .and_then(Value::as_f64)
            .is_some_and(|p| p > 0.0)
        {
            return err("no flood rate".into());
        }
        timed += num(report, &["flood_frames"]);
    }
    if timed != requested || done != requested {
        return err(format!(
            "{timed} round trips accounted for and {done} frames back of {requested}"
        ));
    }
    let sent = num(report, &["tx_frames"]) + num(report, &["xdp_tx"]);
    if sent != requested || num(report, &["rx_frames"]) < requested {
        return err(format!(
            "{sent} frames sent and {} received for {requested} round trips",
            num(report, &["rx_frames"])
        ));
    }
    l.check().or_else(err)
}

/// Boots the driver guest once with `calibrate=2000 ring=3` and reads its exit costs.
pub fn calibrate(env: &VmEnv) -> Result<Calibration, String> {
    let ns = vm_netns().map_err(|e| format!("calibration: {e}"))?;
    let cmdline = "console=ttyS0 calibrate=2000 ring=3 timeout_ms=60000";
    let vmm = Vmm::spawn(&env.vmm, &env.guest, &ns, &format!("tap={TAP}"), cmdline)
        .map_err(|e| format!("calibration: cannot start {}: {e}", env.vmm.display()))?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut console = String::new();
    while let Some(line) = vmm.line_until(deadline) {
        console.push_str(&line);
        console.push('\n');
        if line.starts_with("{\"calibrate\":") || line.starts_with("{\"driver\":") {
            break;
        }
    }
    let stderr = vmm.finish(Duration::from_secs(10));
    calib::parse_output(&console).map_err(|e| format!("calibration: {e}\n{console}{stderr}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::point::DevKnobs;
    use vnet_driver::{Config, TxCompletion};

    fn point(workload: Workload) -> Point {
        Point {
            axes: vec![("kick_threshold", "8".into())],
            config: Config {
                kick_threshold: 8,
                tx_completion: TxCompletion::Lazy,
                event_idx: false,
                xdp_bulk: 4,
                ..Config::default()
            },
            dev: DevKnobs::default(),
            workload,
            pace: None,
            frame_size: 128,
        }
    }

    #[test]
    fn command_line_carries_every_driver_knob_and_the_workload() {
        let c = cmdline(&point(Workload::XskTx(XskMode::ZeroCopy)), 1000);
        for word in [
            "tx=1000",
            "size=128",
            "ring=3",
            "kick_threshold=8",
            "tx_completion=lazy",
            "event_idx=0",
            "xdp_bulk=4",
            "device_stats=1",
        ] {
            assert!(c.split(' ').any(|w| w == word), "{word} missing from {c}");
        }
        assert!(!c.contains("burst="), "unpaced: {c}");
        let mut paced = point(Workload::XskTx(XskMode::ZeroCopy));
        paced.pace = Some(crate::workloads::Pace {
            burst: 8,
            pause_us: 20,
        });
        let c = cmdline(&paced, 1000);
        assert!(c.ends_with(" burst=8 pause_us=20"), "{c}");
        assert!(cmdline(&point(Workload::XdpBounce), 5).contains(" echo=5 "));
        assert!(cmdline(&point(Workload::Bidirectional), 5).contains(" echo=5 "));
    }

    /// The guest's `wait=` follows `--guest-wait`: nothing for the default halt, `wait=poll`
    /// for a polling guest, on a measurement backend and on a tap alike.
    #[test]
    fn the_guest_waits_as_asked() {
        for backend in [BackendKind::Loop, BackendKind::Tap] {
            let mut env = VmEnv {
                vmm: PathBuf::from("vmm"),
                guest: PathBuf::from("guest"),
                frames: 9,
                transport: crate::transport::TransportKind::Mmio,
                backend,
                host_path: HostPath::Stack,
                guest_wait: GuestWait::Halt,
                device: DevicePlacement::InProcess,
            };
            let (_, halt) = vm_args(&env, &point(Workload::Fwd));
            assert!(!halt.contains("wait="), "{halt}");
            env.guest_wait = GuestWait::Poll;
            let (_, poll) = vm_args(&env, &point(Workload::Fwd));
            assert_eq!(
                poll.split(' ').filter(|w| *w == "wait=poll").count(),
                1,
                "{poll}"
            );
            assert!(poll.starts_with(&halt), "only the wait word added: {poll}");
        }
    }

    #[test]
    fn vhost_user_points_split_the_spec_between_backend_and_vmm() {
        let (device, vmm) = vhost_user_split(
            "tap=vmtap0,packed=on,in_order=on,busy_poll_us=50,coalesce_packets=32,transport=pci",
            Path::new("/run/vu.sock"),
        );
        assert_eq!(
            device,
            "tap=vmtap0,packed=on,in_order=on,busy_poll_us=50,coalesce_packets=32"
        );
        assert_eq!(
            vmm,
            "vhost-user=/run/vu.sock,packed=on,in_order=on,transport=pci"
        );
        let (device, vmm) = vhost_user_split("backend=sink", Path::new("s"));
        assert_eq!(
            (device.as_str(), vmm.as_str()),
            ("backend=sink", "vhost-user=s")
        );
    }

    #[test]
    fn copy_mode_transmit_is_skipped_with_a_reason() {
        let tap = BackendKind::Tap;
        assert!(unsupported(&point(Workload::XskTx(XskMode::Copy)), tap).is_some());
        assert!(unsupported(&point(Workload::XskTx(XskMode::ZeroCopy)), tap).is_none());
        assert!(unsupported(&point(Workload::XdpBounce), tap).is_none());
        // The measurement backends: tx on a sink, rx from a source, fwd through a loop.
        let zc = point(Workload::XskTx(XskMode::ZeroCopy));
        assert!(unsupported(&zc, BackendKind::Sink).is_none());
        assert!(unsupported(&zc, BackendKind::Loop).is_some());
        assert!(unsupported(&point(Workload::Rx), BackendKind::Source).is_none());
        assert!(unsupported(&point(Workload::Rx), tap).is_none());
        assert!(unsupported(&point(Workload::Fwd), BackendKind::Loop).is_none());
    }

    #[test]
    fn rx_and_fwd_command_lines() {
        let rx = cmdline(&point(Workload::Rx), 7);
        assert!(rx.contains(" rx=7 ") && !rx.contains("window="), "{rx}");
        let fwd = cmdline(&point(Workload::Fwd), 9);
        assert!(fwd.contains(" fwd=9 window=256 "), "{fwd}");
        let pp = cmdline(&point(Workload::PingPong(16)), 9);
        assert!(pp.contains(" pingpong=9 window=16 "), "{pp}");
    }

    #[test]
    fn pingpong_result_lines_are_checked() {
        let line = |samples: u64, bad: u64, p99: u64| {
            serde_json::json!({
                "status": "done", "workload": "pingpong", "requested": 100, "done": 100,
                "window": 4, "rtt_samples": samples, "rtt_bad": bad, "rtt_lost": 0,
                "rtt_min_ns": 10_000, "rtt_p50_ns": 20_000, "rtt_p99_ns": p99,
                "rtt_p999_ns": 40_000, "rtt_max_ns": 50_000,
                "tx_frames": 4, "xdp_tx": 96, "rx_frames": 100,
            })
        };
        let good = line(100, 0, 30_000);
        check_round_trips(&good, Workload::PingPong(4)).unwrap();
        let l = round_trips(&good).unwrap();
        assert_eq!((l.samples, l.p50_ns, l.p999_ns), (100, 20_000, 40_000));
        assert!(
            check_round_trips(&good, Workload::PingPong(16)).is_err(),
            "another window"
        );
        assert!(
            check_round_trips(&line(99, 0, 30_000), Workload::PingPong(4)).is_err(),
            "a round trip short"
        );
        assert!(
            check_round_trips(&line(100, 1, 30_000), Workload::PingPong(4)).is_err(),
            "a bad frame"
        );
        assert!(
            check_round_trips(&line(100, 0, 45_000), Workload::PingPong(4)).is_err(),
            "p99 > p99.9"
        );
        let mut resent = good.clone();
        resent["xdp_tx"] = 97.into();
        assert!(
            check_round_trips(&resent, Workload::PingPong(4)).is_err(),
            "a frame sent twice"
        );
        let mut old = good;
        old.as_object_mut().unwrap().remove("rtt_p50_ns");
        assert!(round_trips(&old).is_none());
        assert!(check_round_trips(&old, Workload::PingPong(4)).is_err());
    }

    #[test]
    fn mixed_command_line_and_result_lines() {
        let mixed = Workload::Mixed {
            window: 64,
            phase: Duration::from_millis(10),
        };
        let c = cmdline(&point(mixed), 30_000);
        assert!(
            c.contains(" mixed=30000 window=64 phase_us=10000 size=128 "),
            "{c}"
        );
        // 900 flood round trips and 100 trickle ones (timed) of 1000, in 7 phases.
        let good = serde_json::json!({
            "status": "done", "workload": "mixed", "requested": 1000, "done": 1000,
            "window": 64, "phase_us": 10_000, "phases": 7, "flood_frames": 900,
            "flood_ns": 3_000_000, "flood_pps": 300_000,
            "rtt_samples": 100, "rtt_bad": 0, "rtt_lost": 0,
            "rtt_min_ns": 10_000, "rtt_p50_ns": 20_000, "rtt_p99_ns": 30_000,
            "rtt_p999_ns": 40_000, "rtt_max_ns": 50_000,
            "tx_frames": 64 * 4, "xdp_tx": 1000 - 64 * 4, "rx_frames": 1000,
        });
        check_round_trips(&good, mixed).unwrap();
        let l = round_trips(&good).unwrap();
        assert_eq!((l.samples, l.p50_ns, l.p99_ns), (100, 20_000, 30_000));
        let other_phase = Workload::Mixed {
            window: 64,
            phase: Duration::from_millis(1),
        };
        assert!(check_round_trips(&good, other_phase).is_err());
        let other_window = Workload::Mixed {
            window: 16,
            phase: Duration::from_millis(10),
        };
        assert!(check_round_trips(&good, other_window).is_err());
        for (key, value, why) in [
            ("flood_frames", 899, "a round trip unaccounted for"),
            ("phases", 1, "never reached a trickle"),
            ("rtt_lost", 1, "a frame lost"),
            ("xdp_tx", 745, "a frame short"),
        ] {
            let mut bad = good.clone();
            bad[key] = value.into();
            let e = check_round_trips(&bad, mixed).unwrap_err().to_string();
            assert!(e.starts_with("mixed: "), "{why}: {e}");
        }
        let mut no_rate = good.clone();
        no_rate.as_object_mut().unwrap().remove("flood_pps");
        assert!(check_round_trips(&no_rate, mixed).is_err(), "no flood rate");
        // The pingpong check does not ask for mixed's fields.
        assert!(check_round_trips(&good, Workload::Fwd).is_ok());
    }

    #[test]
    fn reads_the_device_metrics_line_of_the_tap() {
        let stderr = "[vmm] booting\n{\"net\":{\"ctap0\":{\"irqfd_signals\":5,\"tx\":{\"interrupts_raised\":7}}},\"vmm\":{}}\n";
        let dev = device_metrics(stderr).unwrap();
        assert_eq!(num(&dev, &["tx", "interrupts_raised"]), 7);
        assert_eq!(num(&dev, &["irqfd_signals"]), 5);
        assert!(device_metrics("{\"net\":{\"other\":{}}}").is_none());
    }
}
