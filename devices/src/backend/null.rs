//! A **benchmarking** backend that moves no bytes: it isolates the virtio work of the datapath
//! from the backend's system call. Never the default, and not reachable from the command line.
//!
//! `write_frame` discards the frame (it returns its length); `read_frame` "receives" a frame
//! of a configured length while any are pending, without writing to the buffers.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::NetBackend;
use crate::iovec::Iovecs;

/// A backend that discards what is sent and reports frames it never writes (for benchmarks).
#[derive(Debug)]
pub struct NullBackend {
    /// Something to hand epoll; never readable.
    fd: EventFd,
    rx_len: usize,
    rx_pending: u64,
    /// Frames "written".
    pub tx_frames: u64,
}

impl NullBackend {
    /// A null backend whose reads report frames of `rx_len` bytes (header included).
    pub fn new(rx_len: usize) -> io::Result<NullBackend> {
        Ok(NullBackend {
            fd: EventFd::new(EFD_NONBLOCK)?,
            rx_len,
            rx_pending: 0,
            tx_frames: 0,
        })
    }

    /// Makes `n` more frames pending for `read_frame`.
    pub fn queue_rx(&mut self, n: u64) {
        self.rx_pending += n;
    }
}

impl AsRawFd for NullBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl NetBackend for NullBackend {
    fn read_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        if self.rx_pending == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.rx_pending -= 1;
        // A frame that does not fit is reported as truncated, as a tap does.
        Ok(if self.rx_len > iovs.total_bytes() {
            iovs.total_bytes() + 1
        } else {
            self.rx_len
        })
    }

    fn write_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        self.tx_frames += 1;
        Ok(iovs.total_bytes())
    }
}
