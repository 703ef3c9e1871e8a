//! SIGTERM and SIGINT: an orderly stop, then, if a second one comes, an immediate one.
//!
//! [`StopSignals::block`] blocks both in the calling thread before the VMM starts any other
//! thread (they inherit the mask), and opens a signalfd the VMM thread's event loop reads. The
//! first signal makes the VMM stop the VM the way a guest reset does (vCPUs joined, workers
//! publish their counters, the metrics line printed, the API socket removed) and exit with
//! 128 + the signal number; before that stop begins, [`StopSignals::unblock_for_second`]
//! unblocks both in the VMM thread (the only one that has them unblocked) with their default
//! action, so that a second signal ends the process at once.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The stop signals' signalfd.
#[derive(Debug)]
pub struct StopSignals {
    fd: OwnedFd,
    mask: libc::sigset_t,
}

impl StopSignals {
    /// Blocks SIGTERM and SIGINT in the calling thread and opens a signalfd for them.
    pub fn block() -> io::Result<StopSignals> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
        let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `mask` is a valid sigset_t for the duration of each call.
        unsafe {
            libc::sigemptyset(&mut mask);
            libc::sigaddset(&mut mask, libc::SIGTERM);
            libc::sigaddset(&mut mask, libc::SIGINT);
        }
        // SAFETY: `mask` is a valid, initialised sigset_t; the old mask is not wanted.
        let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &mask, std::ptr::null_mut()) };
        if ret != 0 {
            return Err(io::Error::from_raw_os_error(ret));
        }
        // SAFETY: `mask` is valid; -1 asks for a new signalfd; the result is checked.
        let fd = unsafe { libc::signalfd(-1, &mask, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(StopSignals { fd, mask })
    }

    /// The signal received, if one is pending.
    pub fn take(&self) -> Option<i32> {
        // SAFETY: signalfd_siginfo is plain data; all-zero is valid.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is valid for writes of `size` bytes and outlives the call.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        (n == size as isize).then_some(info.ssi_signo as i32)
    }

    /// Lets a second SIGTERM/SIGINT reach this thread with its default action: the process
    /// ends at once (the other threads keep them blocked).
    pub fn unblock_for_second(&self) {
        // SAFETY: `mask` is a valid, initialised sigset_t; the old mask is not wanted.
        let ret =
            unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.mask, std::ptr::null_mut()) };
        if ret != 0 {
            log::warn!(
                "cannot unblock SIGTERM/SIGINT: {}",
                io::Error::from_raw_os_error(ret)
            );
        }
    }
}

impl AsRawFd for StopSignals {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A signal's name for the log.
pub fn name(signo: i32) -> &'static str {
    match signo {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "signal",
    }
}
