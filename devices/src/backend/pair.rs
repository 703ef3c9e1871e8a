//! An unprivileged backend: one end of `socketpair(AF_UNIX, SOCK_SEQPACKET)`.
//!
//! Each record on the socket is one frame: virtio-net header + Ethernet frame, the same bytes
//! a tap with `IFF_VNET_HDR` exchanges. The device owns the non-blocking [`PairBackend`] end;
//! tests, benches and the co-simulation harness drive the blocking [`PairPeer`] end.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{iov_count, retrying, NetBackend, Offloads};
use crate::iovec::Iovecs;

/// How long a [`PairPeer`] blocks in `send_frame`/`recv_frame` before failing (tests must not
/// hang forever when the device misbehaves).
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// What the device configured on the backend, visible to the peer.
#[derive(Debug, Default)]
struct PairShared {
    offloads: AtomicU32,
    vnet_hdr_size: AtomicU32,
    /// `set_queue_enabled`: 0 never called, 1 enabled, 2 disabled.
    queue_state: AtomicU32,
}

/// The device's end of the socket pair (non-blocking).
#[derive(Debug)]
pub struct PairBackend {
    fd: OwnedFd,
    shared: Arc<PairShared>,
}

/// The far end of the socket pair (blocking, with [`DEFAULT_PEER_TIMEOUT`]).
#[derive(Debug)]
pub struct PairPeer {
    fd: OwnedFd,
    shared: Arc<PairShared>,
}

impl PairBackend {
    /// Creates a connected backend/peer pair.
    pub fn new() -> io::Result<(PairBackend, PairPeer)> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes; nothing else is
        // touched.
        let ret = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socketpair succeeded, so both descriptors are open and owned by nobody else.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        set_nonblocking(&ours)?;
        let shared = Arc::new(PairShared::default());
        let peer = PairPeer {
            fd: theirs,
            shared: shared.clone(),
        };
        peer.set_timeout(DEFAULT_PEER_TIMEOUT)?;
        Ok((PairBackend { fd: ours, shared }, peer))
    }
}

impl AsRawFd for PairBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl NetBackend for PairBackend {
    fn read_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        let mut msg = msghdr_for(&iovs);
        // SAFETY: `msg` points to the iovecs of `iovs`, each valid for writes while `iovs` is
        // borrowed (IovecList invariant); recvmsg keeps no pointer after returning. MSG_TRUNC
        // makes it return the full record length, like a tap does.
        retrying(|| unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_TRUNC) })
    }

    fn write_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        let msg = msghdr_for(&iovs);
        // SAFETY: `msg` points to the iovecs of `iovs`, each valid for reads while `iovs` is
        // borrowed (IovecList invariant); sendmsg keeps no pointer after returning.
        retrying(|| unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })
    }

    fn supported_offloads(&self) -> Offloads {
        Offloads::CSUM | Offloads::TSO4 | Offloads::TSO6 | Offloads::TSO_ECN | Offloads::UFO
    }

    fn set_offloads(&mut self, offloads: Offloads) -> io::Result<()> {
        self.shared
            .offloads
            .store(offloads.bits(), Ordering::Relaxed);
        Ok(())
    }

    fn set_vnet_hdr_size(&mut self, size: u32) -> io::Result<()> {
        self.shared.vnet_hdr_size.store(size, Ordering::Relaxed);
        Ok(())
    }

    fn set_queue_enabled(&mut self, enabled: bool) -> io::Result<()> {
        let state = if enabled { 1 } else { 2 };
        self.shared.queue_state.store(state, Ordering::Relaxed);
        Ok(())
    }
}

impl PairPeer {
    /// Sends one frame (header + Ethernet frame) to the device. Empty frames are refused:
    /// a zero-length record reads as end of file on the device side.
    pub fn send_frame(&self, frame: &[u8]) -> io::Result<()> {
        self.send_with_flags(frame, libc::MSG_NOSIGNAL)
    }

    /// Like [`PairPeer::send_frame`] but fails with `WouldBlock` instead of waiting.
    pub fn try_send_frame(&self, frame: &[u8]) -> io::Result<()> {
        self.send_with_flags(frame, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
    }

    /// Receives one frame (header + Ethernet frame) from the device, waiting for it.
    pub fn recv_frame(&self) -> io::Result<Vec<u8>> {
        self.recv_with_flags(0)
    }

    /// Receives one frame if one is queued.
    pub fn try_recv_frame(&self) -> io::Result<Option<Vec<u8>>> {
        match self.recv_with_flags(libc::MSG_DONTWAIT) {
            Ok(frame) => Ok(Some(frame)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets how long blocking sends and receives wait. The bound is per system call: one a
    /// caught signal interrupted is made again with the whole timeout, so a caller that needs
    /// an overall deadline checks its own clock (as the fuzz targets do).
    pub fn set_timeout(&self, timeout: Duration) -> io::Result<()> {
        let tv = libc::timeval {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
        };
        for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
            // SAFETY: `tv` is a valid timeval living across the call and its size is passed.
            let ret = unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            if ret < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// The offloads the device last set on its end (`TUNSETOFFLOAD` equivalent).
    pub fn offloads(&self) -> Offloads {
        Offloads::from_bits_truncate(self.shared.offloads.load(Ordering::Relaxed))
    }

    /// What the device last said with `set_queue_enabled` (a multiqueue device's pair;
    /// `None` if it never did).
    pub fn queue_enabled(&self) -> Option<bool> {
        match self.shared.queue_state.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    /// The vnet header size the device last set on its end (0 if never set).
    pub fn vnet_hdr_size(&self) -> u32 {
        self.shared.vnet_hdr_size.load(Ordering::Relaxed)
    }

    fn send_with_flags(&self, frame: &[u8], flags: libc::c_int) -> io::Result<()> {
        if frame.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty frames are not sent",
            ));
        }
        retrying(|| {
            // SAFETY: `frame` is a valid buffer of `frame.len()` bytes for the whole call.
            unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    flags,
                )
            }
        })
        .map(|_| ())
    }

    fn recv_with_flags(&self, flags: libc::c_int) -> io::Result<Vec<u8>> {
        // Peek the record length first (MSG_TRUNC returns the real length), then read it.
        // Both are made again on EINTR: with a timeout set (`set_timeout`) a blocking socket
        // call fails so on any signal, even one installed with SA_RESTART (signal(7)), and a
        // timer signal in the caller's process (a fuzzer's watchdog) is not "no frame".
        let len = retrying(|| {
            // SAFETY: a zero-length read through a null buffer writes nothing.
            unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    flags | libc::MSG_PEEK | libc::MSG_TRUNC,
                )
            }
        })?;
        let mut buf = vec![0u8; len];
        let got = retrying(|| {
            // SAFETY: `buf` has room for `buf.len()` bytes and outlives the call.
            unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    flags,
                )
            }
        })?;
        buf.truncate(got);
        Ok(buf)
    }
}

impl AsRawFd for PairPeer {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn msghdr_for(iovs: &Iovecs<'_>) -> libc::msghdr {
    // SAFETY: msghdr is plain old data; all-zero is a valid value (no name, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iovs.as_raw().as_ptr().cast_mut();
    msg.msg_iovlen = iov_count(iovs) as _;
    msg
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd we own touch no user memory.
    let ret = unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 {
            flags
        } else {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK)
        }
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iovec::IovecList;

    #[test]
    fn frames_cross_both_ways_with_record_boundaries() {
        let (mut backend, peer) = PairBackend::new().expect("socketpair");
        peer.send_frame(b"first").expect("send");
        peer.send_frame(b"second!").expect("send");

        let mut buf = [0u8; 64];
        let mut list = IovecList::new();
        list.push_slice(&mut buf).expect("room");
        assert_eq!(backend.read_frame(list.as_iovecs()).expect("read"), 5);
        assert_eq!(backend.read_frame(list.as_iovecs()).expect("read"), 7);
        let err = backend.read_frame(list.as_iovecs()).expect_err("empty");
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        drop(list);
        assert_eq!(&buf[..7], b"second!");

        let mut hdr = *b"hd";
        let mut body = *b"body";
        let mut list = IovecList::new();
        list.push_slice(&mut hdr).expect("room");
        list.push_slice(&mut body).expect("room");
        assert_eq!(backend.write_frame(list.as_iovecs()).expect("write"), 6);
        assert_eq!(peer.recv_frame().expect("recv"), b"hdbody");
        assert_eq!(peer.try_recv_frame().expect("try recv"), None);
    }

    #[test]
    fn oversized_frame_reports_full_length() {
        let (mut backend, peer) = PairBackend::new().expect("socketpair");
        peer.send_frame(&[7u8; 100]).expect("send");
        let mut buf = [0u8; 10];
        let mut list = IovecList::new();
        list.push_slice(&mut buf).expect("room");
        assert_eq!(backend.read_frame(list.as_iovecs()).expect("read"), 100);
        let err = backend.read_frame(list.as_iovecs()).expect_err("consumed");
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn closed_peer_reads_as_eof_and_empty_frames_are_refused() {
        let (mut backend, peer) = PairBackend::new().expect("socketpair");
        assert_eq!(
            peer.send_frame(&[]).expect_err("empty").kind(),
            io::ErrorKind::InvalidInput
        );
        drop(peer);
        let mut buf = [0u8; 10];
        let mut list = IovecList::new();
        list.push_slice(&mut buf).expect("room");
        assert_eq!(backend.read_frame(list.as_iovecs()).expect("eof"), 0);
        let err = backend
            .write_frame(list.as_iovecs())
            .expect_err("peer gone");
        assert_eq!(err.raw_os_error(), Some(libc::EPIPE));
    }

    #[test]
    fn configuration_is_visible_to_the_peer() {
        let (mut backend, peer) = PairBackend::new().expect("socketpair");
        backend
            .set_offloads(Offloads::CSUM | Offloads::TSO4)
            .expect("offloads");
        backend.set_vnet_hdr_size(12).expect("hdr size");
        assert_eq!(peer.offloads(), Offloads::CSUM | Offloads::TSO4);
        assert_eq!(peer.vnet_hdr_size(), 12);
    }

    extern "C" fn ignore_signal(_: libc::c_int) {}

    /// A signal caught while the peer waits (with a timeout set, the way a fuzzer's watchdog
    /// timer lands) is not a failed receive: the wait goes on and returns the frame.
    #[test]
    fn signals_do_not_end_a_timed_wait() {
        let signal = libc::SIGRTMIN() + 5;
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler is
        // an `extern "C"` function that does nothing, so it is async-signal-safe, and
        // SA_RESTART is what a fuzzer installs (the case where a timed wait still fails).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int) = ignore_signal;
            action.sa_sigaction = handler as usize;
            action.sa_flags = libc::SA_RESTART;
            assert_eq!(libc::sigaction(signal, &action, std::ptr::null_mut()), 0);
        }
        let (mut backend, peer) = PairBackend::new().expect("socketpair");
        peer.set_timeout(Duration::from_secs(5)).expect("timeout");
        // SAFETY: pthread_self has no preconditions.
        let waiter = unsafe { libc::pthread_self() };
        let sender = std::thread::spawn(move || {
            for _ in 0..10 {
                std::thread::sleep(Duration::from_millis(20));
                // SAFETY: `waiter` is the test's thread, alive until it joins this one, and
                // the signal has a handler installed above.
                assert_eq!(unsafe { libc::pthread_kill(waiter, signal) }, 0);
            }
            let mut frame = *b"after the signals";
            let mut list = IovecList::new();
            list.push_slice(&mut frame).expect("room");
            backend.write_frame(list.as_iovecs()).expect("write")
        });
        assert_eq!(peer.recv_frame().expect("recv"), b"after the signals");
        assert_eq!(sender.join().expect("sender"), 17);
    }
}
