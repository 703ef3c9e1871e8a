//! The physical floor: a raw write loop of the same frames to the same kind of backend, with no
//! virtio at all, on one thread. Every co-simulation row is divided by it.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use devices::backend::{BatchRing, MAX_TX_BATCH};

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
    /// The device's own batched transmit: 32 writes per `io_uring_enter`, on a ring whose one
    /// registered file is the backend's (`devices::backend::BatchRing`, as the tap uses it).
    IoUring,
}

/// Writes `vnet header + frame_size` frames to `fd` for `duration` as fast as it accepts them,
/// one `syscall` per frame (per batch of [`MAX_TX_BATCH`] for [`BareSyscall::IoUring`]).
pub fn raw_write_loop(
    fd: RawFd,
    frame_size: usize,
    duration: Duration,
    syscall: BareSyscall,
) -> io::Result<BaselineResult> {
    let frame = test_frame(frame_size, 0);
    let mut buf = vec![0u8; vnet_driver::VNET_HDR_LEN];
    buf.extend_from_slice(&frame);
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let sent = |n: isize| {
        if n <= 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock {
            wait_writable(fd, 10);
        }
        u64::from(n > 0)
    };
    Ok(match syscall {
        BareSyscall::Write => timed(duration, || {
            // SAFETY: write reads buf.len() bytes from buf, which lives for the call.
            let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
            sent(n)
        }),
        BareSyscall::Writev => timed(duration, || {
            // SAFETY: the iovec points to buf (buf.len() bytes), which lives for the call;
            // writev only reads it.
            let n = unsafe { libc::writev(fd, &iov, 1) };
            sent(n)
        }),
        BareSyscall::IoUring => {
            let mut ring = BatchRing::new(fd)?;
            let iovs = [iov; MAX_TX_BATCH];
            let ends: Vec<usize> = (1..=MAX_TX_BATCH).collect();
            let mut results: Vec<io::Result<usize>> = (0..MAX_TX_BATCH).map(|_| Ok(0)).collect();
            let mut failed = None;
            let r = timed(duration, || {
                // SAFETY: every iovec points to buf, which lives for the call.
                if let Err(e) = unsafe { ring.write(&iovs, &ends, &mut results) } {
                    failed.get_or_insert(e);
                    return 0;
                }
                let n = results.iter().filter(|r| r.is_ok()).count();
                if n < MAX_TX_BATCH {
                    wait_writable(fd, 10);
                }
                n as u64
            });
            match failed {
                Some(e) => return Err(e),
                None => r,
            }
        }
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
        u64::from(n > 0)
    })
}

/// Calls `frame` (one system call: the frames it moved) for `duration`, on this thread, and
/// reports the rate and this thread's CPU time per frame.
fn timed(duration: Duration, mut frame: impl FnMut() -> u64) -> BaselineResult {
    let start = Instant::now();
    let cpu0 = thread_cpu_ns();
    let mut frames = 0u64;
    while start.elapsed() < duration {
        for _ in 0..64 {
            frames += frame();
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

    /// Every system call sends whole frames, header first.
    #[test]
    fn each_syscall_sends_whole_frames() {
        for syscall in [
            BareSyscall::Write,
            BareSyscall::Writev,
            BareSyscall::IoUring,
        ] {
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
            let r = raw_write_loop(fds[0], 60, Duration::from_millis(20), syscall).expect("ran");
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
