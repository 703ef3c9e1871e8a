//! Network backends: where the frames of a virtio-net device go to and come from.
//!
//! A frame on a backend is the 12-byte `virtio_net_hdr_v1` followed by the Ethernet frame,
//! exactly as a tap opened with `IFF_VNET_HDR` (vnet header size 12) exchanges them. The
//! datapath moves frames with one `readv`/`writev` straight between the backend and guest
//! memory ([`Iovecs`]).

#![warn(missing_docs)]

mod link;
mod measure;
mod null;
mod pair;
pub(crate) mod tap;
mod uring;

use std::io;
use std::ops::BitOr;
use std::os::fd::{AsRawFd, RawFd};

pub use link::LinkWatch;
pub use measure::{
    test_frame_header, validate_source_frame, FrameSizeError, LoopBackend, SinkBackend,
    SourceBackend, LOOP_CAPACITY, MAX_SOURCE_FRAME, SOURCE_HEADER_LEN, SOURCE_MAC, TEST_ETHERTYPE,
};
pub use null::NullBackend;
pub use pair::{PairBackend, PairPeer, DEFAULT_PEER_TIMEOUT};
pub use tap::{validate_ifname, Tap, TapError, MAX_IFNAME_LEN};
pub use uring::{BatchRing, IORING_UNREGISTER_FILES, MAX_RX_BATCH, MAX_TX_BATCH, MIN_RING_BATCH};

use crate::iovec::{IovecList, Iovecs};

/// A frame transport that the device worker polls with epoll.
///
/// The file descriptor is non-blocking: `read_frame` and `write_frame` return
/// [`io::ErrorKind::WouldBlock`] instead of waiting. Implementations are plain structs used
/// through generics on the hot path (no `dyn`).
pub trait NetBackend: AsRawFd + Send + 'static {
    /// Whether [`NetBackend::write_frame`] reads the frame's bytes (a tap copies them). The
    /// frame-by-frame transmit path warms the next frame's lines only for a backend that does:
    /// one that discards frames unread (a measurement sink) would pull them out of the
    /// driver's cache for nothing, and the driver's next write of that buffer would have to
    /// take them back. (A batch's frames are always warmed: a backend batches writes because
    /// the kernel copies them.)
    const READS_PAYLOAD: bool = true;

    /// Reads one frame (virtio-net header + Ethernet frame) into `iovs`. A system call a
    /// signal interrupts is made again: never [`io::ErrorKind::Interrupted`] (nor for
    /// [`NetBackend::write_frame`]).
    ///
    /// Returns the frame's length, or any value larger than `iovs.total_bytes()` if the frame
    /// did not fit: it was then truncated and consumed, and the caller must count it as
    /// dropped. `Ok(0)` means the backend reached end of file (its peer went away).
    fn read_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize>;

    /// Writes one frame (virtio-net header + Ethernet frame) gathered from `iovs`.
    fn write_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize>;

    /// Most frames one [`NetBackend::write_frames`] call takes. 1 (the default) means the
    /// backend gains nothing from batches and the datapath calls
    /// [`NetBackend::write_frame`] per frame.
    fn tx_batch(&self) -> usize {
        1
    }

    /// Fewest queued frames worth a [`NetBackend::write_frames`] call (when
    /// [`NetBackend::tx_batch`] > 1): a call that finds fewer frames queued writes them one
    /// by one, without building a batch.
    fn tx_batch_min(&self) -> usize {
        2
    }

    /// Writes several frames, in order: frame `i` is `frames.range(ends[i - 1], ends[i])`
    /// (from 0 for the first), and its result, as [`NetBackend::write_frame`] would return
    /// it, goes to `results[i]`. Unlike a loop of `write_frame` calls, a failed frame does not
    /// stop the frames after it. `ends.len()` is at most [`NetBackend::tx_batch`] and at most
    /// `results.len()`.
    fn write_frames(
        &mut self,
        frames: &IovecList<'_>,
        ends: &[usize],
        results: &mut [io::Result<usize>],
    ) {
        let mut start = 0;
        for (&end, result) in ends.iter().zip(results.iter_mut()) {
            *result = self.write_frame(frames.range(start, end));
            start = end;
        }
    }

    /// The receive offloads the backend can apply (probed when it was opened). None unless
    /// the backend says otherwise: complete, checksummed frames both ways.
    fn supported_offloads(&self) -> Offloads {
        Offloads::NONE
    }

    /// Sets which offloads the backend may leave undone in frames it hands us (`TUNSETOFFLOAD`):
    /// partial checksums and GSO frames the guest negotiated to accept. A backend without
    /// offloads has nothing to set.
    fn set_offloads(&mut self, offloads: Offloads) -> io::Result<()> {
        let _ = offloads;
        Ok(())
    }

    /// Sets the size of the virtio-net header in front of each frame (`TUNSETVNETHDRSZ`). A
    /// backend that makes and takes frames itself always uses the 12-byte header.
    fn set_vnet_hdr_size(&mut self, size: u32) -> io::Result<()> {
        let _ = size;
        Ok(())
    }

    /// A file descriptor that becomes readable when the backend's link may have changed, if
    /// the backend has a link to follow (the worker polls it).
    fn link_fd(&self) -> Option<RawFd> {
        None
    }

    /// Reads the pending link notifications: the latest link state among them (true: up).
    fn poll_link(&mut self) -> Option<bool> {
        None
    }

    /// Enables or disables this backend queue (one queue pair of a multiqueue device): a
    /// disabled queue should get no frames from the host (a multiqueue tap detaches it with
    /// `TUNSETQUEUE`, so the kernel steers flows to the enabled ones). Idempotent. Backends
    /// with a single queue need do nothing.
    fn set_queue_enabled(&mut self, enabled: bool) -> io::Result<()> {
        let _ = enabled;
        Ok(())
    }
}

/// A set of tap offload flags (`TUN_F_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Offloads(u32);

impl Offloads {
    /// No offload: the backend hands over complete, checksummed, MTU-sized frames.
    pub const NONE: Offloads = Offloads(0);
    /// Partial checksums (`TUN_F_CSUM`).
    pub const CSUM: Offloads = Offloads(libc::TUN_F_CSUM);
    /// TCPv4 segmentation offload (`TUN_F_TSO4`).
    pub const TSO4: Offloads = Offloads(libc::TUN_F_TSO4);
    /// TCPv6 segmentation offload (`TUN_F_TSO6`).
    pub const TSO6: Offloads = Offloads(libc::TUN_F_TSO6);
    /// TSO with ECN (`TUN_F_TSO_ECN`).
    pub const TSO_ECN: Offloads = Offloads(libc::TUN_F_TSO_ECN);
    /// UDP fragmentation offload (`TUN_F_UFO`).
    pub const UFO: Offloads = Offloads(libc::TUN_F_UFO);

    /// The raw `TUN_F_*` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The set made of the known `TUN_F_*` bits in `bits` (others are dropped).
    pub const fn from_bits_truncate(bits: u32) -> Offloads {
        Offloads(
            bits & (libc::TUN_F_CSUM
                | libc::TUN_F_TSO4
                | libc::TUN_F_TSO6
                | libc::TUN_F_TSO_ECN
                | libc::TUN_F_UFO),
        )
    }

    /// True if every flag of `other` is in `self`.
    pub const fn contains(self, other: Offloads) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Offloads {
    type Output = Offloads;

    fn bitor(self, rhs: Offloads) -> Offloads {
        Offloads(self.0 | rhs.0)
    }
}

/// Converts the return value of a `readv`/`writev`-like syscall.
fn syscall_len(ret: isize) -> io::Result<usize> {
    usize::try_from(ret).map_err(|_| io::Error::last_os_error())
}

/// [`syscall_len`] of `call()`, made again while a signal interrupts it (EINTR).
#[inline(always)]
fn retrying(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        match syscall_len(call()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            result => return result,
        }
    }
}

/// `iovs.as_raw().len()` as the `c_int`/`usize` count the syscalls take: at most
/// [`crate::iovec::MAX_IOVECS`] by construction.
fn iov_count(iovs: &Iovecs<'_>) -> libc::c_int {
    libc::c_int::try_from(iovs.as_raw().len()).unwrap_or(libc::c_int::MAX)
}
