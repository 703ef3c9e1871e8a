//! Backends for a trial: the socketpair backend with a sink/source peer thread, or a real tap
//! in a network namespace the harness creates and removes (`devices::test_utils::netns`).

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use devices::test_utils::link::PacketSocket;
use devices::test_utils::netns::NetNs;

/// A network namespace `cotune-<pid>-<n>` (deleted on drop) for one trial's tap and its peer,
/// with IPv6 off so that nothing but the workload crosses a tap made in it: the kernel's
/// router solicitations and multicast listener reports would reach the device as received
/// frames at any time, one of them after the last interrupt a trial's check took.
pub fn trial_netns() -> io::Result<NetNs> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let ns = NetNs::named(format!(
        "cotune-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))?;
    ns.disable_ipv6()?;
    Ok(ns)
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
pub fn packet_socket(ifname: &str) -> io::Result<OwnedFd> {
    let sock = PacketSocket::open(ifname, libc::ETH_P_ALL as u16)?;
    // Only frames the device sends count as received (an echo peer's window depends on it).
    sock.ignore_outgoing()?;
    Ok(OwnedFd::from(sock))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    /// Through a real tap (root): a trial's namespace sends nothing of its own over the tap
    /// (with IPv6 on, the kernel's solicitations and listener reports arrive within two
    /// seconds of the link going up, several of them).
    #[test]
    fn a_trials_tap_carries_nothing_but_the_workload() {
        let ns = super::trial_netns().expect("namespace");
        let tap = ns.tap("qtap0").expect("tap");
        let fd = tap.as_raw_fd();
        let mut buf = [0u8; 2048];
        let deadline = Instant::now() + Duration::from_millis(2500);
        while Instant::now() < deadline {
            if super::wait_readable(fd, 50) {
                // SAFETY: read writes at most buf.len() bytes into buf, which lives for the call.
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                assert!(n <= 0, "the tap carried a {n}-byte frame nobody sent");
            }
        }
    }
}
