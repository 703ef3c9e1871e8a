//! Helpers for tests that boot real guests through the `vmm` binary.
//!
//! Guests run one at a time ([`guest_lock`]): each busy vCPU takes a whole host core, and the
//! machines these tests run on may have only two.

pub mod api;
pub mod packet;
pub mod udp;
pub mod vhost_user;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration_tests lives inside the workspace")
        .to_owned()
}

/// Paths printed by `resources/build-guest.sh`.
#[derive(Clone, Debug)]
pub struct Artifacts {
    /// `key=path` lines, by key.
    pub paths: HashMap<String, PathBuf>,
}

impl Artifacts {
    /// The path printed for `key`; panics with a clear message when the script did not print it.
    pub fn get(&self, key: &str) -> &Path {
        self.paths
            .get(key)
            .unwrap_or_else(|| panic!("build-guest.sh printed no `{key}=` line: {:?}", self.paths))
    }
}

/// Builds (first time) or reuses the guest kernel and initramfs.
pub fn artifacts() -> &'static Artifacts {
    static ARTIFACTS: OnceLock<Artifacts> = OnceLock::new();
    ARTIFACTS.get_or_init(|| {
        let script = workspace_root().join("resources/build-guest.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script:?}: {e}"));
        assert!(out.status.success(), "{script:?} failed: {}", out.status);
        let paths = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), PathBuf::from(v.trim())))
            .collect();
        Artifacts { paths }
    })
}

/// The host side of the driver guest's `echo=` workload: waits for the guest's ready line,
/// exchanges `count` frames of `size` bytes ([`packet::echo_in_order`], giving up after
/// `timeout`), lets the VMM finish, and asserts that every frame came back and the VMM exited
/// cleanly. Returns the VMM's output.
pub fn echo_through_guest(
    mut vmm: VmmProcess,
    sock: &packet::PacketSocket,
    macs: ([u8; 6], [u8; 6]),
    (count, size): (u64, usize),
    window: u64,
    timeout: Duration,
) -> RunOutput {
    assert!(
        vmm.wait_for_console_line("driver-guest: ready", Duration::from_secs(60)),
        "the guest never came up"
    );
    let result = packet::echo_in_order(sock, macs, (count, size), window, timeout);
    let out = vmm.finish(Duration::from_secs(120));
    assert_eq!(result.unwrap_or_else(|e| panic!("{e}\n{out}")), count);
    assert!(out.success(), "{out}");
    out
}

/// The driver guest's result line (`{"driver":{…}}`), its inner object.
pub fn driver_result(out: &RunOutput) -> serde_json::Value {
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("{\"driver\":"))
        .unwrap_or_else(|| panic!("no {{\"driver\":…}} line\n{out}"));
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("bad result line: {e}\n{out}"));
    v["driver"].clone()
}

/// The number `key` of a JSON object (panics, showing the object, if it is missing).
pub fn json_u64(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key:?} in {v}"))
}

/// The guest kernel variant `name` (`resources/kernel/variant-NAME.config` merged on top of
/// the test kernel's config; built the first time, then cached like the others).
pub fn kernel_variant(name: &str) -> &'static Path {
    static VARIANTS: Mutex<Vec<(String, &'static Path)>> = Mutex::new(Vec::new());
    variant(
        &VARIANTS,
        name,
        ["--kernel-only", "--kernel-variant"],
        "kernel",
    )
}

/// The initramfs variant `name`: the test initramfs plus the programs of that variant and the
/// shared libraries they need (`initrd_variant_programs` in `resources/build-guest.sh`; e.g.
/// `ethtool`). Built the first time, then cached like the others.
pub fn initrd_variant(name: &str) -> &'static Path {
    static VARIANTS: Mutex<Vec<(String, &'static Path)>> = Mutex::new(Vec::new());
    variant(
        &VARIANTS,
        name,
        ["--initrd-only", "--initrd-variant"],
        "initrd",
    )
}

/// Runs `build-guest.sh ONLY FLAG=NAME` once per `name` and returns the path it prints as
/// `key=`.
fn variant(
    cache: &Mutex<Vec<(String, &'static Path)>>,
    name: &str,
    [only, flag]: [&str; 2],
    key: &str,
) -> &'static Path {
    let mut variants = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, path)) = variants.iter().find(|(n, _)| n == name) {
        return path;
    }
    let script = workspace_root().join("resources/build-guest.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args([only, &format!("{flag}={name}")])
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {script:?}: {e}"));
    assert!(out.status.success(), "{script:?} {flag}={name} failed");
    let prefix = format!("{key}=");
    let found = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|p| PathBuf::from(p.trim()))
        .unwrap_or_else(|| panic!("no {key}= line for {flag}={name}"));
    let path: &'static Path = Box::leak(found.into_boxed_path());
    variants.push((name.to_owned(), path));
    path
}

/// The `vmm` binary, built from the current sources (in the same profile as the tests).
pub fn vmm_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_binary("vmm"))
}

/// The `vhost-user-net` binary, built from the current sources (in the tests' profile).
pub fn vhost_user_net_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_binary("vhost-user-net"))
}

/// Builds binary `name` of the `vmm` package in the tests' profile and returns its path.
fn workspace_binary(name: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "vmm", "--bin", name])
        .current_dir(workspace_root());
    let release = !cfg!(debug_assertions);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("cannot run cargo to build the binary");
    assert!(status.success(), "building {name} failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let bin = target
        .join(if release { "release" } else { "debug" })
        .join(name);
    assert!(bin.exists(), "{bin:?} does not exist after cargo build");
    bin
}

/// Serialises guests within a test binary.
pub fn guest_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a finished `vmm` run printed and how it ended.
#[derive(Debug)]
pub struct RunOutput {
    /// Exit status; `None` when the run was killed at its deadline.
    pub status: Option<ExitStatus>,
    /// The guest console.
    pub stdout: String,
    /// The VMM's log and errors.
    pub stderr: String,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl RunOutput {
    /// True when the VMM exited by itself with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl std::fmt::Display for RunOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {:?} after {:.1?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// Runs `vmm` with `args`, killing it after `deadline`.
pub fn run_vmm(args: &[&str], deadline: Duration) -> RunOutput {
    run_command(Command::new(vmm_binary()).args(args), deadline)
}

/// Starts `cmd` with stdin closed and stdout and stderr piped.
fn spawn_piped(cmd: &mut Command) -> std::process::Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// Runs `cmd` with stdin closed, collecting its output, killing it after `deadline`.
pub fn run_command(cmd: &mut Command, deadline: Duration) -> RunOutput {
    let start = Instant::now();
    let mut child = spawn_piped(cmd);
    let collect = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = collect(Box::new(child.stdout.take().expect("piped stdout")));
    let err = collect(Box::new(child.stderr.take().expect("piped stderr")));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for vmm") {
            break Some(status);
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    RunOutput {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        elapsed: start.elapsed(),
    }
}

/// The standard command line for test guests: console on COM1, reset through the i8042,
/// reboot on panic, quiet kernel, and the `/init` test to run.
pub fn test_cmdline(run: &str) -> String {
    format!("console=ttyS0 reboot=k panic=-1 quiet vmm.run={run}")
}

/// A running `vmm` whose console can be watched while it runs.
pub struct VmmProcess {
    child: std::process::Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<thread::JoinHandle<()>>,
    start: Instant,
}

impl VmmProcess {
    /// Starts `cmd` (a `vmm` command line, possibly wrapped in `ip netns exec`).
    pub fn spawn(cmd: &mut Command) -> VmmProcess {
        let mut child = spawn_piped(cmd);
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let pump = |mut r: Box<dyn Read + Send>, sink: Arc<Mutex<String>>| {
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            })
        };
        let readers = vec![
            pump(
                Box::new(child.stdout.take().expect("piped")),
                stdout.clone(),
            ),
            pump(
                Box::new(child.stderr.take().expect("piped")),
                stderr.clone(),
            ),
        ];
        VmmProcess {
            child,
            stdout,
            stderr,
            readers,
            start: Instant::now(),
        }
    }

    /// Waits until the console shows `needle`; false on timeout or when the VMM exited first.
    pub fn wait_for_console(&mut self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.stdout.lock().unwrap().contains(needle) {
                return true;
            }
            if self.child.try_wait().ok().flatten().is_some() {
                thread::sleep(Duration::from_millis(100));
                return self.stdout.lock().unwrap().contains(needle);
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Waits until the console holds a whole line (newline included) that starts with
    /// `prefix`: a line being printed may be read half-way otherwise. Returns whether it did.
    pub fn wait_for_console_line(&mut self, prefix: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let whole = |out: &str| {
            out.split_inclusive('\n')
                .any(|l| l.starts_with(prefix) && l.ends_with('\n'))
        };
        loop {
            if whole(&self.stdout.lock().unwrap()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            if self.child.try_wait().ok().flatten().is_some() {
                thread::sleep(Duration::from_millis(100));
                return whole(&self.stdout.lock().unwrap());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the guest console printed so far.
    pub fn console(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// What the process logged on stderr so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends `signal` to the VMM.
    pub fn signal(&self, signal: i32) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill takes no pointers; the pid is our own child's, not yet reaped.
        let ret = unsafe { libc::kill(pid, signal) };
        assert_eq!(ret, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// True while the VMM has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    /// Waits for the VMM to exit (killing it at `deadline`) and returns what it printed.
    pub fn finish(mut self, deadline: Duration) -> RunOutput {
        let end = Instant::now() + deadline;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for vmm") {
                break Some(s);
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(50));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        RunOutput {
            status,
            stdout: self.stdout.lock().unwrap().clone(),
            stderr: self.stderr.lock().unwrap().clone(),
            elapsed: self.start.elapsed(),
        }
    }
}

impl Drop for VmmProcess {
    fn drop(&mut self) {
        // A test that panicked must not leave a guest running.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last JSON metrics line (`{"net":...}`) the VMM printed on stderr.
pub fn final_metrics(stderr: &str) -> Option<serde_json::Value> {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"net\":"))
        .and_then(|l| serde_json::from_str(l).ok())
}

/// The rings the driver started the device on, as the VMM logged it when the driver set
/// DRIVER_OK ("virtio-net TAP: the driver started N queue pair(s) on RINGS"): `split rings` or
/// `packed rings`, followed by `, IN_ORDER` when the driver accepted VIRTIO_F_IN_ORDER. From
/// the last such line; panics, showing the output, when there is none.
pub fn rings_started(out: &RunOutput) -> &str {
    out.stderr
        .lines()
        .rev()
        .find_map(|l| {
            let (head, rings) = l.split_once(" queue pair(s) on ")?;
            head.contains("the driver started")
                .then_some(rings.trim_end())
        })
        .unwrap_or_else(|| panic!("the VMM never logged the driver starting the device\n{out}"))
}

/// [`final_metrics`] of a run that must have printed them.
pub fn metrics_of(out: &RunOutput) -> serde_json::Value {
    final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line\n{out}"))
}

/// The driver guest's counters `d` against the device's metrics `dev` of one run: kicks each
/// way, frames each way (the guest's tx including its XDP_TX), no device error and no
/// malformed tx chain. `ctx` describes the run for a failure.
pub fn assert_guest_counters_match_device(
    d: &serde_json::Value,
    dev: &serde_json::Value,
    ctx: impl Fn() -> String,
) {
    let n = json_u64;
    for (what, guest, device) in [
        ("tx kicks", n(d, "kicks"), n(&dev["tx"], "kicks")),
        ("rx kicks", n(d, "rx_kicks"), n(&dev["rx"], "kicks")),
        (
            "tx frames",
            n(d, "tx_frames") + n(d, "xdp_tx"),
            n(&dev["tx"], "frames"),
        ),
        ("rx frames", n(d, "rx_frames"), n(&dev["rx"], "frames")),
        ("device errors", n(d, "device_errors"), 0),
        ("malformed tx chains", n(&dev["tx"], "malformed_chains"), 0),
    ] {
        assert_eq!(guest, device, "{what}: {}", ctx());
    }
}

/// The frames the host received from the driver guest's `tx=` workload are its test frames
/// 0, 1, … of `size` bytes from `src` to `dst`, each intact and in order. `ctx` describes the
/// run for a failure.
pub fn assert_guest_frames(
    frames: &[Vec<u8>],
    (dst, src): ([u8; 6], [u8; 6]),
    size: usize,
    ctx: &str,
) {
    for (seq, f) in frames.iter().enumerate() {
        assert!(
            f == &packet::frame(dst, src, seq as u32, size),
            "frame #{seq} differs ({} bytes): {:02x?}\n{ctx}",
            f.len(),
            &f[..f.len().min(32)]
        );
    }
}

/// The `vmm` command inside `ns` that boots `kernel` with `initrd` and `cmdline`, its net
/// device given by `net` (the `--net` value).
pub fn linux_guest_command(
    ns: &devices::test_utils::netns::NetNs,
    (kernel, initrd): (&Path, &Path),
    cmdline: &str,
    net: &str,
) -> Command {
    let mut cmd = ns.command(&vmm_binary().to_string_lossy());
    cmd.arg("--kernel")
        .arg(kernel)
        .arg("--initrd")
        .arg(initrd)
        .args(["--cmdline", cmdline, "--net", net]);
    cmd
}

/// The device's frame counters `dev` against tap `tap`'s in `ns`: what the tap sent the
/// device received or dropped for want of buffers, and what the device sent the tap received.
/// `m` (the whole metrics line) is shown on failure.
pub fn assert_tap_counters_match(
    ns: &devices::test_utils::netns::NetNs,
    tap: &str,
    dev: &serde_json::Value,
    m: &serde_json::Value,
) {
    let counter = |dir: &str, field: &str| dev[dir][field].as_u64().unwrap();
    assert_eq!(
        counter("rx", "frames") + counter("rx", "dropped_no_buffer"),
        tap_counter(ns, tap, "tx_packets"),
        "{m}"
    );
    assert_eq!(
        counter("tx", "frames"),
        tap_counter(ns, tap, "rx_packets"),
        "{m}"
    );
}

/// A TCP exchange of `bytes` each way used segmentation offload: the device's byte counters
/// `dev` cover it, frames longer than the MTU went both ways (the guest's TSO on tx, the host's
/// GSO on rx; frame counts alone are a weak sign, the emulated guest ACKs slowly, so the host
/// often sends single segments), and tx took fewer frames than `mss`-byte segments would.
/// `m` (the whole metrics line) is shown on failure.
pub fn assert_tcp_offloads(
    dev: &serde_json::Value,
    m: &serde_json::Value,
    bytes: usize,
    mss: usize,
) {
    let counter = |dir: &str, field: &str| dev[dir][field].as_u64().unwrap() as usize;
    assert!(counter("rx", "bytes") >= bytes, "{m}");
    assert!(counter("tx", "bytes") >= bytes, "{m}");
    assert!(
        counter("tx", "large_frames") > 0,
        "guest TSO not in use: {m}"
    );
    assert!(
        counter("rx", "large_frames") > 0,
        "host GSO to the guest not in use: {m}"
    );
    assert!(
        counter("tx", "frames") < bytes / mss,
        "guest TSO not in use: {m}"
    );
}

/// The bytes each way of the guest's TCP stream tests (`vmm.tcp=`).
pub const TCP_STREAM_BYTES: usize = 4 << 20;
/// The TCP segment size at MTU 1500 (IPv4, timestamps).
pub const TCP_MSS: usize = 1448;

/// Lets the host open TCP connections on `subnet` (through `tap` in `ns`) with a 100-segment
/// initial window: the guest's emulated kernel ACKs slowly, so an ACK-clocked host would send
/// one MSS at a time; a large initial window makes it send GSO bursts the device must deliver.
pub fn raise_initial_window(ns: &devices::test_utils::netns::NetNs, subnet: &str, tap: &str) {
    ns.ip(&["route", "change", subnet, "dev", tap, "initcwnd", "100"])
        .unwrap();
}

/// The host side of the guest's `vmm.tcp=` test: waits for the guest's TCP server (at
/// `guest_ip:port`), sends and receives `bytes` each way with every byte checked ([`tcp_exchange`]), lets the VMM finish and
/// asserts that the guest got every byte too and the VMM exited cleanly. Returns the VMM's
/// output and how long the exchange took.
pub fn tcp_through_guest(
    ns: &devices::test_utils::netns::NetNs,
    mut vmm: VmmProcess,
    (guest_ip, port): (&str, u16),
    bytes: usize,
) -> (RunOutput, Duration) {
    let ready = vmm.wait_for_console("nettest: tcp listening", Duration::from_secs(180));
    let t = Instant::now();
    let result = if ready {
        let ip = guest_ip.to_owned();
        ns.run(move || tcp_exchange(&ip, port, bytes))
            .expect("run in namespace")
    } else {
        Err("the guest never started its TCP server".into())
    };
    let took = t.elapsed();
    let out = vmm.finish(Duration::from_secs(120));
    result.unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert!(
        out.stdout
            .contains(&format!("nettest: tcp received={bytes} bad=0 sent={bytes}")),
        "{out}"
    );
    assert!(out.success(), "{out}");
    (out, took)
}

/// A network namespace with tap `tap` in it, up, and IPv6 off (so that the host sends nothing
/// of its own on the tap).
pub fn namespace_with_tap(tag: &str, tap: &str) -> devices::test_utils::netns::NetNs {
    namespace_with(tag, tap, &[])
}

/// [`namespace_with_tap`] with a multi-queue tap (for `--net tap=TAP,queues=N`, N > 1).
pub fn namespace_with_multi_queue_tap(tag: &str, tap: &str) -> devices::test_utils::netns::NetNs {
    namespace_with(tag, tap, &["multi_queue"])
}

fn namespace_with(tag: &str, tap: &str, flags: &[&str]) -> devices::test_utils::netns::NetNs {
    let ns = devices::test_utils::netns::NetNs::new(tag).expect("create network namespace");
    ns.disable_ipv6().expect("IPv6 off in the namespace");
    let mut add = vec!["tuntap", "add", tap, "mode", "tap", "vnet_hdr"];
    add.extend_from_slice(flags);
    ns.ip(&add).expect("create the tap");
    ns.ip(&["link", "set", tap, "up"]).expect("tap up");
    ns
}

/// The tap's kernel counter `name` (`/sys/class/net/TAP/statistics/NAME`, e.g. `rx_packets`)
/// read inside `ns`; `u64::MAX` when it cannot be read (so that an equality check fails).
pub fn tap_counter(ns: &devices::test_utils::netns::NetNs, tap: &str, name: &str) -> u64 {
    let out = ns
        .command("cat")
        .arg(format!("/sys/class/net/{tap}/statistics/{name}"))
        .output()
        .expect("read tap statistics");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(u64::MAX)
}

/// Starts the bare-metal driver guest through `vmm` in `ns`, with `--net NET`, the guest
/// command line `cmdline` and, if given, `--api-sock`.
pub fn spawn_driver_guest(
    ns: &devices::test_utils::netns::NetNs,
    cmdline: &str,
    net: &str,
    api_sock: Option<&Path>,
) -> VmmProcess {
    let guest = artifacts().get("driver_guest").to_owned();
    let mut cmd = ns.command(&vmm_binary().to_string_lossy());
    cmd.arg("--kernel").arg(&guest);
    cmd.args(["--cmdline", cmdline, "--net", net]);
    if let Some(sock) = api_sock {
        cmd.arg("--api-sock").arg(sock);
    }
    VmmProcess::spawn(&mut cmd)
}

/// [`spawn_driver_guest`], then waits for the guest's `driver-guest: ready` line.
pub fn ready_driver_guest(
    ns: &devices::test_utils::netns::NetNs,
    cmdline: &str,
    net: &str,
    api_sock: Option<&Path>,
) -> VmmProcess {
    let mut vmm = spawn_driver_guest(ns, cmdline, net, api_sock);
    assert!(
        vmm.wait_for_console_line("driver-guest: ready", Duration::from_secs(30)),
        "the guest came up"
    );
    vmm
}

/// The TCP stream pattern of resources/init/src/nettest.c (`vmm.tcp=BYTES`).
pub fn tcp_byte(i: usize) -> u8 {
    (i.wrapping_mul(7).wrapping_add(i / 251)) as u8
}

/// Sends `bytes` of the stream pattern to the guest's nettest at `guest_ip:port`, then reads
/// and checks `bytes` back.
pub fn tcp_exchange(guest_ip: &str, port: u16, bytes: usize) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect((guest_ip, port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let data: Vec<u8> = (0..bytes).map(tcp_byte).collect();
    s.write_all(&data).map_err(|e| format!("send: {e}"))?;
    let mut back = Vec::with_capacity(bytes);
    s.read_to_end(&mut back)
        .map_err(|e| format!("receive after {} bytes: {e}", back.len()))?;
    if back.len() != bytes {
        return Err(format!("received {} of {bytes} bytes back", back.len()));
    }
    match back.iter().enumerate().find(|(i, b)| **b != tcp_byte(*i)) {
        Some((i, b)) => Err(format!("byte {i} is {b:#x}, expected {:#x}", tcp_byte(i))),
        None => Ok(()),
    }
}
