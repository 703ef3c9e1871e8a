//! Helpers for tests that boot real guests through the `vmm` binary.
//!
//! Guests run one at a time ([`guest_lock`]): each busy vCPU takes a whole host core, and the
//! machines these tests run on may have only two.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
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

/// The `vmm` binary, built from the current sources (in the same profile as the tests).
pub fn vmm_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "vmm", "--bin", "vmm"])
            .current_dir(workspace_root());
        let release = !cfg!(debug_assertions);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cannot run cargo to build vmm");
        assert!(status.success(), "building the vmm binary failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target"));
        let bin = target
            .join(if release { "release" } else { "debug" })
            .join("vmm");
        assert!(bin.exists(), "{bin:?} does not exist after cargo build");
        bin
    })
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

/// Runs `cmd` with stdin closed, collecting its output, killing it after `deadline`.
pub fn run_command(cmd: &mut Command, deadline: Duration) -> RunOutput {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
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
