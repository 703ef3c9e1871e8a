//! Backends for a trial: the socketpair backend with a sink/source peer thread, or a real tap
//! in a network namespace the harness creates and removes.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use devices::backend::Tap;

/// A network namespace `cotune-<pid>-<n>`, deleted on drop. Only the tap and its peer live there.
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates the namespace with loopback up.
    pub fn new() -> io::Result<NetNs> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "cotune-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run_ip(&["netns", "add", &name])?;
        let ns = NetNs { name };
        run_ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs `f` on a thread inside the namespace (taps and sockets it opens live there).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let ns = File::open(format!("/run/netns/{}", self.name))?;
        thread::spawn(move || {
            // SAFETY: setns changes only this thread's network namespace, to the one the open
            // namespace file `ns` refers to.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("thread in namespace panicked"))?
    }

    /// Opens (creating) tap `name` in the namespace and sets it up.
    pub fn tap(&self, name: &str) -> io::Result<Tap> {
        let tap_name = name.to_owned();
        let tap = self
            .run(move || Tap::open(&tap_name))?
            .map_err(|e| io::Error::other(e.to_string()))?;
        run_ip(&["-n", &self.name, "link", "set", name, "up"])?;
        Ok(tap)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run_ip(&["netns", "del", &self.name]);
    }
}

fn run_ip(args: &[&str]) -> io::Result<()> {
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

/// A thread that drains frames from `fd` (the pair peer) until stopped, counting them.
pub struct Sink {
    stop: Arc<AtomicBool>,
    frames: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl Sink {
    /// Starts draining `fd` (kept open by the caller for the sink's lifetime).
    pub fn start(fd: RawFd) -> Sink {
        let stop = Arc::new(AtomicBool::new(false));
        let frames = Arc::new(AtomicU64::new(0));
        let (s, f) = (stop.clone(), frames.clone());
        let handle = thread::Builder::new()
            .name("cotune-sink".into())
            .spawn(move || {
                let mut buf = vec![0u8; 70_000];
                while !s.load(Ordering::Relaxed) {
                    // SAFETY: recv writes at most buf.len() bytes into buf, which outlives the
                    // call; fd stays open while the sink runs (the caller's contract).
                    let n = unsafe {
                        libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
                    };
                    if n > 0 {
                        f.fetch_add(1, Ordering::Relaxed);
                    } else {
                        wait_readable(fd, 10);
                    }
                }
            })
            .expect("spawn sink thread");
        Sink {
            stop,
            frames,
            handle: Some(handle),
        }
    }

    /// Frames drained so far.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Waits up to `ms` for `fd` to become readable.
pub fn wait_readable(fd: RawFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll reads and writes only the one pollfd we pass, which lives for the call.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// Waits up to `ms` for `fd` to become writable.
pub fn wait_writable(fd: RawFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: poll reads and writes only the one pollfd we pass, which lives for the call.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// An AF_PACKET socket bound to interface `ifname` (call inside the interface's namespace):
/// what it sends goes out of the interface, what the interface carries it receives.
pub fn packet_socket(ifname: &str) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2) call; the result is checked and then owned.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(ifname).map_err(|e| io::Error::other(e.to_string()))?;
    // SAFETY: name is a valid NUL-terminated string for the call.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: bind reads size_of::<sockaddr_ll>() bytes from &sll, which lives for the call.
    let rc = unsafe {
        libc::bind(
            owned.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}
