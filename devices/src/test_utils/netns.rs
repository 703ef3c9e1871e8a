//! Network namespaces for tests and harnesses, so that no interface or address a test uses
//! lives in the root namespace:
//!
//! - [`in_netns`]: a private, unnamed namespace for one thread (`unshare(CLONE_NEWNET)`), gone
//!   with the thread;
//! - [`NetNs`]: a named namespace (`ip netns add`) that other processes can join (`ip netns
//!   exec`) and threads can enter, deleted on drop (also on panic).
//!
//! Both need root (and `ip` for [`NetNs`]).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::thread;

use crate::backend::Tap;

/// Runs `body` in a new network namespace on its own thread; `None` (reported on stderr)
/// without root. A panic in `body` is resumed on the caller's thread.
pub fn in_netns<T: Send + 'static>(body: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: this test needs root (a network namespace, taps)");
        return None;
    }
    let result = thread::spawn(move || {
        // SAFETY: CLONE_NEWNET moves only the calling thread (ours, never reused) into a new
        // network namespace; no memory is involved.
        let ret = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            ret,
            0,
            "unshare(CLONE_NEWNET): {}",
            io::Error::last_os_error()
        );
        body()
    })
    .join();
    match result {
        Ok(value) => Some(value),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Runs `ip ARGS...`; its stderr is the error on failure.
pub fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// A named network namespace (`ip netns add`) with its loopback up, deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates namespace `vmmtest-<tag>-<pid>`.
    pub fn new(tag: &str) -> io::Result<NetNs> {
        NetNs::named(format!("vmmtest-{tag}-{}", std::process::id()))
    }

    /// Creates namespace `name`. A namespace of that name left by a killed earlier run (the
    /// names carry the pid, which can be reused) is deleted first.
    pub fn named(name: String) -> io::Result<NetNs> {
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let ns = NetNs { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NS ARGS...`.
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Turns IPv6 off in the namespace, for interfaces made after it too, so that nothing but
    /// a test's own traffic crosses them: with it on, the kernel's router solicitations and
    /// multicast listener reports leave every interface that comes up, at any time.
    pub fn disable_ipv6(&self) -> io::Result<()> {
        let status = self
            .command("sysctl")
            .args([
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "sysctl in network namespace {}: {status}",
                self.name
            )))
        }
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `f` on a thread that has entered the namespace; taps and sockets it opens live
    /// there.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let ns = File::open(format!("/run/netns/{}", self.name))?;
        thread::spawn(move || {
            // SAFETY: setns changes only this thread's network namespace, to the one the open
            // namespace file `ns` refers to; `ns` stays open for the whole call.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("the thread in the namespace panicked"))?
    }

    /// Opens (creating) tap `name` in the namespace and sets its link up.
    pub fn tap(&self, name: &str) -> io::Result<Tap> {
        let tap_name = name.to_owned();
        let tap = self
            .run(move || Tap::open(&tap_name))?
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.ip(&["link", "set", name, "up"])?;
        Ok(tap)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("cannot delete network namespace {}: {e}", self.name);
        }
    }
}
