//! The physical floor: a raw write loop of the same frames to the same kind of backend, with no
//! virtio at all, on one thread. Every co-simulation row is divided by it.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::cost::thread_cpu_ns;
use crate::env::wait_writable;
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

/// Writes `vnet header + frame_size` frames to `fd` for `duration` as fast as it accepts them.
pub fn raw_write_loop(fd: RawFd, frame_size: usize, duration: Duration) -> BaselineResult {
    let frame = test_frame(frame_size, 0);
    let mut buf = vec![0u8; vnet_driver::VNET_HDR_LEN];
    buf.extend_from_slice(&frame);
    let start = Instant::now();
    let cpu0 = thread_cpu_ns();
    let mut frames = 0u64;
    while start.elapsed() < duration {
        for _ in 0..64 {
            // SAFETY: write reads buf.len() bytes from buf, which lives for the call.
            let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
            if n > 0 {
                frames += 1;
            } else if std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock {
                wait_writable(fd, 10);
            }
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
