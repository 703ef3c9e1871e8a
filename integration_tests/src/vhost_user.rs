//! Driving `vhost-user-net` from real frontends: DPDK's `dpdk-testpmd` with a virtio-user port
//! (Debian's `dpdk` package, no hugepages), and the backend's own metrics over its API.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::{Duration, Instant};

use devices::test_utils::netns::NetNs;

use crate::api::Client;
use crate::{vhost_user_net_binary, workspace_root, VmmProcess};

/// Where a test's sockets go: a fresh directory per call.
pub fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vhost-user-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// A running `vhost-user-net` listening on `socket`, its API on `api`.
pub struct Backend {
    /// The process (its log is on stderr).
    pub process: VmmProcess,
    /// The vhost-user socket.
    pub socket: PathBuf,
    /// The API client.
    pub api: Client,
}

impl Backend {
    /// Starts `vhost-user-net --net SPEC` on a socket in `dir` (inside `ns` when given: its
    /// tap lives there), and waits for its API.
    pub fn start(dir: &Path, spec: &str, ns: Option<&NetNs>) -> Backend {
        let socket = dir.join("vhost-user.sock");
        let api_sock = dir.join("api.sock");
        let bin = vhost_user_net_binary().to_string_lossy().into_owned();
        let mut cmd = match ns {
            Some(ns) => ns.command(&bin),
            None => Command::new(&bin),
        };
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--api-sock")
            .arg(&api_sock)
            .args(["--net", spec]);
        let mut process = VmmProcess::spawn(&mut cmd);
        let api = Client::new(&api_sock);
        assert!(
            api.wait_ready(Duration::from_secs(10)),
            "vhost-user-net's API did not come up: {}",
            process.log()
        );
        assert!(process.is_running());
        Backend {
            process,
            socket,
            api,
        }
    }

    /// `GET /metrics`, the device's part (`net.IFACE`).
    pub fn device_metrics(&self) -> serde_json::Value {
        let doc = self
            .api
            .request("GET", "/metrics", None)
            .expect("GET /metrics")
            .json();
        let nets = doc["net"].as_object().expect("net metrics");
        nets.values().next().expect("one device").clone()
    }

    /// Waits until the device's counter at `path` (e.g. `["tx", "frames"]`) stops moving
    /// (unchanged over 200 ms), and returns it.
    pub fn settled(&self, path: &[&str]) -> u64 {
        let read = || {
            let mut v = self.device_metrics();
            for key in path {
                v = v[*key].clone();
            }
            v.as_u64()
                .unwrap_or_else(|| panic!("counter {path:?} in {v}"))
        };
        let mut last = read();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            thread::sleep(Duration::from_millis(200));
            let now = read();
            if now == last || Instant::now() > deadline {
                return now;
            }
            last = now;
        }
    }
}

/// The totals testpmd printed for all its ports at `stop`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortTotals {
    /// Frames received.
    pub rx: u64,
    /// Frames the port refused on receive.
    pub rx_dropped: u64,
    /// Frames sent.
    pub tx: u64,
    /// Frames the port could not send.
    pub tx_dropped: u64,
}

/// Whether `program` is on the `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Installs the third-party frontends' Debian packages (`dpdk`, `qemu-system-x86`) when
/// `program` is missing, as `resources/build-guest.sh` does the guest's: as root, unless
/// `VMM_NO_INSTALL` is set. Otherwise the test that needs it fails, saying what to install.
fn ensure_installed(program: &str) {
    static INSTALL: Once = Once::new();
    if on_path(program) {
        return;
    }
    INSTALL.call_once(|| {
        // SAFETY: getuid has no preconditions and cannot fail.
        let root = unsafe { libc::getuid() } == 0;
        if !root || std::env::var_os("VMM_NO_INSTALL").is_some() {
            return;
        }
        let status = Command::new("bash")
            .arg(workspace_root().join("resources/install-deps.sh"))
            .status();
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "resources/install-deps.sh failed: {status:?}"
        );
    });
}

/// An interactive `dpdk-testpmd` with one virtio-user port, driven through its stdin.
pub struct Testpmd {
    child: Child,
    stdin: ChildStdin,
    output: Arc<Mutex<String>>,
}

/// The EAL and testpmd arguments every run shares: no hugepages, no PCI, the forwarding lcore
/// on CPU 0 and the main lcore on CPU 1 (the backend's worker runs where the scheduler puts
/// it), an mbuf pool large enough for 2 × 2 queues of 1024.
fn base_args(prefix: &str) -> Vec<String> {
    [
        "-l",
        "0,1",
        "--main-lcore",
        "1",
        "--no-huge",
        "-m",
        "1024",
        "--no-pci",
        "--file-prefix",
        prefix,
    ]
    .map(String::from)
    .to_vec()
}

impl Testpmd {
    /// Starts testpmd with `net_virtio_user0,path=SOCKET,DEVARGS` and the testpmd options
    /// `args`, in interactive mode; waits for its prompt.
    pub fn virtio_user(socket: &Path, devargs: &str, args: &[&str]) -> Testpmd {
        Testpmd::with_vdev(
            &format!("net_virtio_user0,path={}", socket.display()),
            devargs,
            args,
        )
    }

    /// Starts testpmd with DPDK's vhost backend, `net_vhost0,iface=SOCKET,DEVARGS`: it
    /// listens on SOCKET for a frontend (`vmm --net vhost-user=SOCKET`).
    pub fn vhost(socket: &Path, devargs: &str, args: &[&str]) -> Testpmd {
        Testpmd::with_vdev(
            &format!("net_vhost0,iface={}", socket.display()),
            devargs,
            args,
        )
    }

    fn with_vdev(vdev: &str, devargs: &str, args: &[&str]) -> Testpmd {
        let prefix = format!("vu{}", std::process::id());
        let mut vdev = vdev.to_owned();
        if !devargs.is_empty() {
            vdev.push(',');
            vdev.push_str(devargs);
        }
        ensure_installed("dpdk-testpmd");
        // Line-buffered: testpmd prints with stdio, fully buffered into a pipe otherwise.
        let mut cmd = Command::new("stdbuf");
        cmd.args(["-oL", "dpdk-testpmd"])
            .args(base_args(&prefix))
            .args(["--vdev", &vdev, "--", "-i", "--total-num-mbufs=32768"])
            .args(args);
        let testpmd = Testpmd::spawn(&mut cmd);
        assert!(
            testpmd.wait_for("testpmd> ", Duration::from_secs(30)),
            "testpmd did not start: {}",
            testpmd.output()
        );
        testpmd
    }

    fn spawn(cmd: &mut Command) -> Testpmd {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start dpdk-testpmd ({e}): install Debian's dpdk package")
            });
        let output = Arc::new(Mutex::new(String::new()));
        for stream in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let sink = output.clone();
            let mut stream = stream;
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let stdin = child.stdin.take().expect("stdin");
        Testpmd {
            child,
            stdin,
            output,
        }
    }

    /// Everything testpmd printed so far.
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Waits until testpmd's output holds `needle`.
    fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_for_count(needle, 1, timeout)
    }

    /// Waits until testpmd's output holds `needle` at least `count` times.
    fn wait_for_count(&self, needle: &str, count: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.output.lock().unwrap().matches(needle).count() >= count {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Types `line` at the prompt.
    pub fn command(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to testpmd");
    }

    /// `start` (or `start tx_first`), forwards for `run`, then `stop`: the totals it printed.
    pub fn forward(&mut self, start: &str, run: Duration) -> PortTotals {
        // The totals block is printed whole before "Done.".
        let done = self.output().matches("Done.").count() + 1;
        self.command(start);
        thread::sleep(run);
        self.command("stop");
        assert!(
            self.wait_for_count("Done.", done, Duration::from_secs(20)),
            "testpmd printed no totals: {}",
            self.output()
        );
        parse_totals(&self.output()).expect("totals")
    }

    /// `show port stats all`: frames received and sent by the port since it started, the
    /// frames testpmd flushed from its rx queues at `start` included (what the forwarding
    /// totals leave out).
    pub fn port_stats(&mut self) -> PortTotals {
        let marker = "NIC statistics for port";
        let before = self.output().matches(marker).count();
        self.command("show port stats all");
        assert!(
            self.wait_for_count("Tx-bps", before + 1, Duration::from_secs(10)),
            "no port statistics: {}",
            self.output()
        );
        let output = self.output();
        let block = output.rsplit(marker).next().unwrap_or_default();
        let value = |key: &str| -> u64 {
            block
                .find(key)
                .and_then(|at| block[at + key.len()..].split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {block}"))
        };
        PortTotals {
            rx: value("RX-packets:"),
            rx_dropped: value("RX-missed:"),
            tx: value("TX-packets:"),
            tx_dropped: value("TX-errors:"),
        }
    }

    /// `quit`, then waits for testpmd to exit.
    pub fn quit(mut self) -> String {
        self.command("quit");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.output()
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last "Accumulated forward statistics" block of testpmd's output.
pub fn parse_totals(output: &str) -> Option<PortTotals> {
    let block = output.rsplit("Accumulated forward statistics").next()?;
    let value = |key: &str| -> Option<u64> {
        let at = block.find(key)? + key.len();
        block[at..].split_whitespace().next()?.parse().ok()
    };
    Some(PortTotals {
        rx: value("RX-packets:")?,
        rx_dropped: value("RX-dropped:")?,
        tx: value("TX-packets:")?,
        tx_dropped: value("TX-dropped:")?,
    })
}

/// How QEMU can run the test guest on this host: with KVM and MSI-X where KVM runs it, else
/// with TCG and INTx (this project's PVM hosts: QEMU stops at the guest's first kernel-mode
/// `int3`, which `vmm` completes itself; and QEMU 7.2's MSI-X with vhost-user crashes under
/// TCG).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QemuAccel {
    /// `accel=kvm`, MSI-X vectors.
    Kvm,
    /// `accel=tcg`, `vectors=0` (INTx).
    Tcg,
}

impl QemuAccel {
    /// KVM where `/dev/kvm` exists and is not KVM's PVM module.
    pub fn detect() -> QemuAccel {
        let kvm = Path::new("/dev/kvm").exists();
        let pvm = Path::new("/sys/module/kvm_pvm").exists();
        if kvm && !pvm {
            QemuAccel::Kvm
        } else {
            QemuAccel::Tcg
        }
    }
}

/// A QEMU command line that boots `kernel` (a bzImage) with `initrd` and `cmdline`, its
/// memory shared (memfd), and one virtio-net-pci device on the vhost-user socket `socket`
/// with `queues` queue pairs; `device` adds device properties (`packed=on`, ...).
pub fn qemu_command(
    (kernel, initrd, cmdline): (&Path, &Path, &str),
    socket: &Path,
    queues: u16,
    device: &str,
    accel: QemuAccel,
) -> Command {
    let (accel, vectors) = match accel {
        QemuAccel::Kvm => ("kvm", String::new()),
        QemuAccel::Tcg => ("tcg", ",vectors=0".to_owned()),
    };
    let mq = if queues > 1 { ",mq=on" } else { "" };
    ensure_installed("qemu-system-x86_64");
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-machine",
        &format!("q35,accel={accel},memory-backend=mem0"),
    ])
    .args([
        "-object",
        "memory-backend-memfd,id=mem0,size=256M,share=on",
        "-m",
        "256M",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
    ])
    .arg("-kernel")
    .arg(kernel)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append", cmdline])
    .args([
        "-chardev",
        &format!("socket,id=vu0,path={}", socket.display()),
        "-netdev",
        &format!("vhost-user,id=n0,chardev=vu0,queues={queues}"),
        "-device",
        &format!("virtio-net-pci,netdev=n0,romfile=,mac=52:54:00:12:34:56{vectors}{mq}{device}"),
    ]);
    cmd
}
