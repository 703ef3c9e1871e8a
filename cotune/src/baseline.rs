//! The physical floor: a raw write loop of the same frames to the same kind of backend, with no
//! virtio at all, on one thread. Every co-simulation row is divided by it.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::cost::thread_cpu_ns;
use crate::env::{wait_readable, wait_writable};
use crate::frames::test_frame;

/// What a raw write loop achieved.
#[derive(Clone, Copy, Debug)]
pub struct BaselineResult {
    /// Frames written.
    pub frames: u64,
    /// Frames per second.
    pub pps: f64,
    /// CPU ns per frame of the writing thread.
    pub cpu_ns_per_pkt: f64,
}

/// The system call a raw write loop makes per frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BareSyscall {
    /// `write(fd, frame, len)`: the cheapest way to hand a tap a frame.
    #[default]
    Write,
    /// `writev(fd, [frame], 1)`: one iovec, as a device with a scatter-gather list makes it.
    Writev,
}

/// Writes `vnet header + frame_size` frames to `fd` for `duration` as fast as it accepts them,
/// one `syscall` per frame.
pub fn raw_write_loop(
    fd: RawFd,
    frame_size: usize,
    duration: Duration,
    syscall: BareSyscall,
) -> BaselineResult {
    let frame = test_frame(frame_size, 0);
    let mut buf = vec![0u8; vnet_driver::VNET_HDR_LEN];
    buf.extend_from_slice(&frame);
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    timed(duration, || {
        let n = match syscall {
            // SAFETY: write reads buf.len() bytes from buf, which lives for the call.
            BareSyscall::Write => unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) },
            // SAFETY: the iovec points to buf (buf.len() bytes), which lives for the call;
            // writev only reads it.
            BareSyscall::Writev => unsafe { libc::writev(fd, &iov, 1) },
        };
        if n <= 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock {
            wait_writable(fd, 10);
        }
        n > 0
    })
}

/// Reads frames from `fd` (a non-blocking tap, as the device opens it, fed by the host
/// injector) for `duration`, one `read` per frame: the floor of receiving from a tap.
pub fn raw_read_loop(fd: RawFd, duration: Duration) -> BaselineResult {
    let mut buf = vec![0u8; 65_550];
    timed(duration, || {
        // SAFETY: read writes at most buf.len() bytes into buf, which lives for the call.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            wait_readable(fd, 10);
        }
        n > 0
    })
}

/// Calls `frame` (one system call: true when it moved a frame) for `duration`, on this
/// thread, and reports the rate and this thread's CPU time per frame.
fn timed(duration: Duration, mut frame: impl FnMut() -> bool) -> BaselineResult {
    let start = Instant::now();
    let cpu0 = thread_cpu_ns();
    let mut frames = 0u64;
    while start.elapsed() < duration {
        for _ in 0..64 {
            frames += u64::from(frame());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = thread_cpu_ns() - cpu0;
    BaselineResult {
        frames,
        pps: frames as f64 / secs,
        cpu_ns_per_pkt: cpu as f64 / frames.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both system calls send whole frames, header first.
    #[test]
    fn each_syscall_sends_whole_frames() {
        for syscall in [BareSyscall::Write, BareSyscall::Writev] {
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for the two descriptors socketpair writes.
            let ret = unsafe {
                libc::socketpair(
                    libc::AF_UNIX,
                    libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK,
                    0,
                    fds.as_mut_ptr(),
                )
            };
            assert_eq!(ret, 0);
            let r = raw_write_loop(fds[0], 60, Duration::from_millis(20), syscall);
            assert!(r.frames > 0 && r.pps > 0.0, "{syscall:?}: {r:?}");
            let mut got = [0u8; 256];
            // SAFETY: `got` is valid for writes of its length.
            let n = unsafe { libc::read(fds[1], got.as_mut_ptr().cast(), got.len()) };
            let mut want = vec![0u8; vnet_driver::VNET_HDR_LEN];
            want.extend_from_slice(&test_frame(60, 0));
            assert_eq!(&got[..n as usize], &want[..], "{syscall:?}");
            // SAFETY: both descriptors are ours.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        }
    }
}
