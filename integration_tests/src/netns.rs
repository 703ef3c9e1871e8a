//! Network namespaces for tests: every address a test uses lives in a namespace the test
//! created, and the namespace is deleted when the test ends (also on panic).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::thread;

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct NetNs {
    name: String,
}

fn ip(args: &[&str]) -> io::Result<()> {
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

impl NetNs {
    /// Creates namespace `vmmtest-<tag>-<pid>` with its loopback up.
    pub fn new(tag: &str) -> io::Result<NetNs> {
        let name = format!("vmmtest-{tag}-{}", std::process::id());
        // A namespace left by a killed earlier run of the same pid is reused after deletion.
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

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `f` on a thread that has entered the namespace; sockets it opens live there.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let ns = File::open(format!("/run/netns/{}", self.name))?;
        thread::spawn(move || {
            // SAFETY: setns only changes this thread's network namespace to the one `ns` refers
            // to; `ns` is an open namespace file for the whole call.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("the thread in the namespace panicked"))?
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("cannot delete network namespace {}: {e}", self.name);
        }
    }
}
