//! **Measurement** backends: the VMM's counterpart of DPDK testpmd's forwarding modes and of
//! benchmarking vhost-net with XDP_DROP on the tap. Each stands for a host side faster than the
//! guest, so that what is measured is the device and the driver, not the tap's kernel path.
//! Never the default; `--net backend=sink|source|loop` selects one.
//!
//! - [`SinkBackend`] discards every transmitted frame (and has nothing to receive).
//! - [`SourceBackend`] hands the guest a generated frame whenever it reads: the configured
//!   length, the project's test EtherType (0x88b5) and a sequence number per frame, the
//!   payload a ramp that depends on it (the layout the driver guest's `frames` module checks),
//!   so the guest can check order, loss and every byte. What the guest sends is discarded.
//! - [`LoopBackend`] returns every transmitted frame as a received one, MACs swapped, in
//!   order. It holds at most [`LOOP_CAPACITY`] frames: a full loop refuses further frames with
//!   `EAGAIN` (the transmit queue waits, as it does on a full tap) until the guest takes some.
//!
//! None of them offers checksum or segmentation offloads: the guest sends and receives
//! complete frames, and every virtio-net header they hand over is zero.
//!
//! Their file descriptor is an eventfd whose counter encodes readiness for the worker's
//! level-triggered epoll: 0 (writable, not readable), 1 (both) or `u64::MAX - 1` (readable,
//! not writable: the kernel reports an eventfd writable only while one more could be added).
//! A sink's never becomes readable, a source's always is, a loop's follows its queue; it
//! changes only when the loop goes from empty to non-empty or to full and back, not per frame.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::NetBackend;
use crate::iovec::Iovecs;

/// The virtio-net header in front of each frame (`virtio_net_hdr_v1`).
const VNET_HDR: usize = 12;
/// Most frames a [`LoopBackend`] holds.
pub const LOOP_CAPACITY: usize = 256;
/// The EtherType of the frames a [`SourceBackend`] generates (IEEE local experimental 1).
pub const TEST_ETHERTYPE: u16 = 0x88b5;
/// Bytes of a generated frame before its payload: MACs, EtherType, sequence number (u32 LE),
/// frame length (u16 LE).
pub const SOURCE_HEADER_LEN: usize = 20;
/// Largest frame a [`SourceBackend`] generates (a jumbo frame).
pub const MAX_SOURCE_FRAME: usize = 9014;
/// The source MAC of generated frames (locally administered).
pub const SOURCE_MAC: [u8; 6] = [0x02, 0x53, 0x52, 0x43, 0x00, 0x01];

/// The first [`SOURCE_HEADER_LEN`] bytes of test frame `seq`, `len` bytes long (the driver
/// guest's layout): `dst`, `src`, EtherType 0x88b5, `seq` (u32 LE), `len` (u16 LE). Byte
/// `i ≥ 20` of the frame is then `(seq + i) as u8`.
pub fn test_frame_header(
    dst: [u8; 6],
    src: [u8; 6],
    seq: u32,
    len: u16,
) -> [u8; SOURCE_HEADER_LEN] {
    let mut h = [0u8; SOURCE_HEADER_LEN];
    h[0..6].copy_from_slice(&dst);
    h[6..12].copy_from_slice(&src);
    h[12..14].copy_from_slice(&TEST_ETHERTYPE.to_be_bytes());
    h[14..18].copy_from_slice(&seq.to_le_bytes());
    h[18..20].copy_from_slice(&len.to_le_bytes());
    h
}

/// Readiness an eventfd's counter encodes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ready {
    /// Counter 0: writable only.
    Write,
    /// Counter 1: readable and writable.
    Both,
    /// Counter `u64::MAX - 1`: readable only.
    Read,
}

impl Ready {
    fn counter(self) -> u64 {
        match self {
            Ready::Write => 0,
            Ready::Both => 1,
            Ready::Read => u64::MAX - 1,
        }
    }
}

/// An eventfd standing for a backend's readiness.
#[derive(Debug)]
struct ReadyFd {
    fd: EventFd,
    state: Ready,
}

impl ReadyFd {
    fn new(state: Ready) -> io::Result<ReadyFd> {
        let fd = EventFd::new(EFD_NONBLOCK)?;
        let mut ready = ReadyFd {
            fd,
            state: Ready::Write,
        };
        ready.set(state)?;
        Ok(ready)
    }

    /// Moves the counter to `state` (two system calls at most, none when it is already there).
    fn set(&mut self, state: Ready) -> io::Result<()> {
        if state == self.state {
            return Ok(());
        }
        if self.state != Ready::Write {
            // Back to 0; EAGAIN cannot happen (the counter is not 0) but is harmless.
            match self.fd.read() {
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                _ => {}
            }
        }
        if state != Ready::Write {
            self.fd.write(state.counter())?;
        }
        self.state = state;
        Ok(())
    }
}

/// Copies `parts`, one after the other, into the start of `iovs`; stops where `iovs` ends.
/// Returns the bytes copied.
fn scatter(iovs: &Iovecs<'_>, parts: &[&[u8]]) -> usize {
    let mut copied = 0;
    let mut entries = iovs.as_raw().iter();
    let (mut base, mut room) = (std::ptr::null_mut::<u8>(), 0usize);
    for part in parts {
        let mut src = *part;
        while !src.is_empty() {
            if room == 0 {
                let Some(iov) = entries.next() else {
                    return copied;
                };
                (base, room) = (iov.iov_base.cast::<u8>(), iov.iov_len);
                continue;
            }
            let n = room.min(src.len());
            // SAFETY: `base..base + room` is the unwritten rest of an entry of `iovs`, valid
            // for writes while `iovs` is borrowed (IovecList invariant), and `n <= room`; the
            // source is a host slice that cannot overlap guest memory or a host buffer the
            // list borrows mutably. Bytes have no invalid values, so a guest writing the same
            // memory meanwhile only garbles its own frame, as with the kernel's `readv`.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), base, n);
                base = base.add(n);
            }
            room -= n;
            copied += n;
            src = &src[n..];
        }
    }
    copied
}

/// Replaces `out` with the bytes of `iovs`.
fn gather(iovs: &Iovecs<'_>, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(iovs.total_bytes());
    for iov in iovs.as_raw() {
        let start = out.len();
        // SAFETY: the entry is valid for reads of `iov_len` bytes while `iovs` is borrowed
        // (IovecList invariant), `out` has room for them (reserved above: the entries add up
        // to `total_bytes`), and `set_len` covers exactly the bytes just copied.
        unsafe {
            std::ptr::copy_nonoverlapping(
                iov.iov_base.cast::<u8>(),
                out.as_mut_ptr().add(start),
                iov.iov_len,
            );
            out.set_len(start + iov.iov_len);
        }
    }
}

/// Discards every transmitted frame; never has a frame to receive.
#[derive(Debug)]
pub struct SinkBackend {
    ready: ReadyFd,
    frames: u64,
}

impl SinkBackend {
    /// A sink.
    pub fn new() -> io::Result<SinkBackend> {
        Ok(SinkBackend {
            ready: ReadyFd::new(Ready::Write)?,
            frames: 0,
        })
    }

    /// Frames discarded so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }
}

impl AsRawFd for SinkBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.ready.fd.as_raw_fd()
    }
}

impl NetBackend for SinkBackend {
    // Frames are counted by their descriptors' lengths, never read.
    const READS_PAYLOAD: bool = false;

    fn read_frame(&mut self, _iovs: Iovecs<'_>) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }

    fn write_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        self.frames += 1;
        Ok(iovs.total_bytes())
    }
}

/// A source's frame length out of range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("source frame size {0} out of range ({SOURCE_HEADER_LEN}..={MAX_SOURCE_FRAME} bytes)")]
pub struct FrameSizeError(pub usize);

/// Checks a [`SourceBackend`]'s frame length (Ethernet frame, without the virtio-net header).
pub fn validate_source_frame(len: usize) -> Result<(), FrameSizeError> {
    if (SOURCE_HEADER_LEN..=MAX_SOURCE_FRAME).contains(&len) {
        Ok(())
    } else {
        Err(FrameSizeError(len))
    }
}

/// Generates test frames for every read; discards what is transmitted.
#[derive(Debug)]
pub struct SourceBackend {
    ready: ReadyFd,
    /// The virtio-net header (zero) and the frame's first [`SOURCE_HEADER_LEN`] bytes; the
    /// sequence number is patched in per frame.
    header: [u8; VNET_HDR + SOURCE_HEADER_LEN],
    /// `ramp[i] = i as u8`, long enough to cut any payload from.
    ramp: Vec<u8>,
    len: usize,
    seq: u32,
    tx_frames: u64,
}

impl SourceBackend {
    /// A source of `len`-byte frames (Ethernet frame, 20..=9014 bytes) addressed to `dst`.
    pub fn new(dst: [u8; 6], len: usize) -> io::Result<SourceBackend> {
        validate_source_frame(len).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut header = [0u8; VNET_HDR + SOURCE_HEADER_LEN];
        // `len` ≤ 9014 (validated); the sequence number is patched in per frame.
        header[VNET_HDR..].copy_from_slice(&test_frame_header(dst, SOURCE_MAC, 0, len as u16));
        Ok(SourceBackend {
            ready: ReadyFd::new(Ready::Both)?,
            header,
            ramp: (0..len + 256).map(|i| i as u8).collect(),
            len,
            seq: 0,
            tx_frames: 0,
        })
    }

    /// Frames generated so far (the next frame's sequence number, modulo 2^32).
    pub fn frames(&self) -> u32 {
        self.seq
    }

    /// Transmitted frames discarded so far.
    pub fn tx_frames(&self) -> u64 {
        self.tx_frames
    }
}

impl AsRawFd for SourceBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.ready.fd.as_raw_fd()
    }
}

impl NetBackend for SourceBackend {
    // What the guest sends is discarded unread.
    const READS_PAYLOAD: bool = false;

    fn read_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        let seq = self.seq;
        self.seq = seq.wrapping_add(1);
        let total = VNET_HDR + self.len;
        if total > iovs.total_bytes() {
            // Consumed and reported truncated, as a tap does with a frame that does not fit.
            return Ok(iovs.total_bytes() + 1);
        }
        self.header[VNET_HDR + 14..VNET_HDR + 18].copy_from_slice(&seq.to_le_bytes());
        // Frame byte i (i ≥ 20) is (seq + i) as u8.
        let start = (seq as usize + SOURCE_HEADER_LEN) % 256;
        let payload = &self.ramp[start..start + self.len - SOURCE_HEADER_LEN];
        Ok(scatter(&iovs, &[&self.header, payload]))
    }

    fn write_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        self.tx_frames += 1;
        Ok(iovs.total_bytes())
    }
}

/// Returns each transmitted frame as a received one, MACs swapped, in order.
#[derive(Debug)]
pub struct LoopBackend {
    ready: ReadyFd,
    queued: VecDeque<Vec<u8>>,
    /// Buffers of frames already received, reused by the next transmitted ones.
    spare: Vec<Vec<u8>>,
}

impl LoopBackend {
    /// An empty loop.
    pub fn new() -> io::Result<LoopBackend> {
        Ok(LoopBackend {
            ready: ReadyFd::new(Ready::Write)?,
            queued: VecDeque::with_capacity(LOOP_CAPACITY),
            spare: Vec::new(),
        })
    }

    /// Frames transmitted and not yet received.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    fn update_ready(&mut self) -> io::Result<()> {
        self.ready.set(match self.queued.len() {
            0 => Ready::Write,
            LOOP_CAPACITY => Ready::Read,
            _ => Ready::Both,
        })
    }
}

impl AsRawFd for LoopBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.ready.fd.as_raw_fd()
    }
}

impl NetBackend for LoopBackend {
    fn read_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        let Some(frame) = self.queued.pop_front() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let copied = scatter(&iovs, &[&frame]);
        let len = if copied < frame.len() {
            // Truncated and consumed, as a tap does.
            iovs.total_bytes() + 1
        } else {
            frame.len()
        };
        self.spare.push(frame);
        self.update_ready()?;
        Ok(len)
    }

    fn write_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        if self.queued.len() == LOOP_CAPACITY {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut frame = self.spare.pop().unwrap_or_default();
        gather(&iovs, &mut frame);
        let len = frame.len();
        let header_len = VNET_HDR.min(len);
        frame[..header_len].fill(0);
        if len >= VNET_HDR + 12 {
            let (dst, src) = frame[VNET_HDR..VNET_HDR + 12].split_at_mut(6);
            dst.swap_with_slice(src);
        }
        self.queued.push_back(frame);
        self.update_ready()?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iovec::IovecList;

    /// True when `fd` polls readable / writable right now.
    fn poll(fd: RawFd) -> (bool, bool) {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        assert!(n >= 0);
        (
            p.revents & libc::POLLIN != 0,
            p.revents & libc::POLLOUT != 0,
        )
    }

    fn send(backend: &mut impl NetBackend, frame: &mut [u8]) -> io::Result<usize> {
        let mut list = IovecList::new();
        // Split in two entries to exercise the gather across entries.
        let (a, b) = frame.split_at_mut(5);
        list.push_slice(a).expect("room");
        list.push_slice(b).expect("room");
        backend.write_frame(list.as_iovecs())
    }

    fn recv(backend: &mut impl NetBackend, room: usize) -> (io::Result<usize>, Vec<u8>) {
        let mut buf = vec![0xeeu8; room];
        let (a, b) = buf.split_at_mut(room.min(7));
        let mut list = IovecList::new();
        list.push_slice(a).expect("room");
        list.push_slice(b).expect("room");
        let r = backend.read_frame(list.as_iovecs());
        drop(list);
        (r, buf)
    }

    fn frame(n: u8, len: usize) -> Vec<u8> {
        let mut f: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_add(n)).collect();
        f[..VNET_HDR].fill(0);
        f[VNET_HDR..VNET_HDR + 6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[VNET_HDR + 6..VNET_HDR + 12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f
    }

    #[test]
    fn sink_counts_every_frame_and_is_never_readable() {
        let mut sink = SinkBackend::new().expect("eventfd");
        assert_eq!(poll(sink.as_raw_fd()), (false, true));
        for i in 0..100u8 {
            let mut f = frame(i, 60 + usize::from(i));
            assert_eq!(send(&mut sink, &mut f).expect("sent"), f.len());
        }
        assert_eq!(sink.frames(), 100);
        assert!(recv(&mut sink, 100)
            .0
            .is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock));
        assert_eq!(poll(sink.as_raw_fd()), (false, true));
    }

    /// The layout the driver guest checks: MACs, EtherType, seq, length, byte i = seq + i.
    fn check_source_frame(buf: &[u8], seq: u32, len: usize, dst: [u8; 6]) {
        assert_eq!(&buf[..VNET_HDR], &[0; VNET_HDR]);
        let f = &buf[VNET_HDR..VNET_HDR + len];
        assert_eq!(&f[0..6], &dst);
        assert_eq!(&f[6..12], &SOURCE_MAC);
        assert_eq!(&f[12..14], &[0x88, 0xb5]);
        assert_eq!(&f[14..18], &seq.to_le_bytes());
        assert_eq!(&f[18..20], &(len as u16).to_le_bytes());
        for (i, &b) in f.iter().enumerate().skip(SOURCE_HEADER_LEN) {
            assert_eq!(b, (seq as usize + i) as u8, "seq {seq} byte {i}");
        }
    }

    #[test]
    fn source_generates_numbered_frames_in_order_every_byte_set() {
        let dst = [2, 1, 2, 3, 4, 5];
        for len in [20, 64, 1514, MAX_SOURCE_FRAME] {
            let mut source = SourceBackend::new(dst, len).expect("source");
            assert_eq!(poll(source.as_raw_fd()), (true, true));
            for seq in 0..300u32 {
                let (r, buf) = recv(&mut source, VNET_HDR + len + 3);
                assert_eq!(r.expect("frame"), VNET_HDR + len);
                check_source_frame(&buf, seq, len, dst);
                // Nothing past the frame is written.
                assert_eq!(&buf[VNET_HDR + len..], &[0xee; 3]);
            }
            assert_eq!(source.frames(), 300);
            // Still readable: a source never runs dry.
            assert_eq!(poll(source.as_raw_fd()), (true, true));
        }
    }

    #[test]
    fn source_reports_a_frame_too_big_as_truncated_and_moves_on() {
        let mut source = SourceBackend::new([2, 0, 0, 0, 0, 9], 100).expect("source");
        let (r, _) = recv(&mut source, 50);
        assert_eq!(r.expect("truncated"), 51);
        let (r, buf) = recv(&mut source, 200);
        assert_eq!(r.expect("frame"), VNET_HDR + 100);
        check_source_frame(&buf, 1, 100, [2, 0, 0, 0, 0, 9]);
    }

    #[test]
    fn source_refuses_frame_sizes_out_of_range() {
        for len in [0, 19, MAX_SOURCE_FRAME + 1] {
            assert!(SourceBackend::new([2, 0, 0, 0, 0, 1], len).is_err());
            assert_eq!(validate_source_frame(len), Err(FrameSizeError(len)));
        }
    }

    #[test]
    fn loop_returns_exactly_what_was_sent_macs_swapped_in_order() {
        let mut lo = LoopBackend::new().expect("loop");
        assert_eq!(poll(lo.as_raw_fd()), (false, true));
        let sent: Vec<Vec<u8>> = (0..50u8).map(|i| frame(i, 40 + usize::from(i))).collect();
        for f in &sent {
            let mut f = f.clone();
            // A non-zero header is not passed on.
            f[0] = 1;
            assert_eq!(send(&mut lo, &mut f).expect("sent"), f.len());
        }
        assert_eq!(poll(lo.as_raw_fd()), (true, true));
        for f in &sent {
            let (r, buf) = recv(&mut lo, 200);
            assert_eq!(r.expect("frame"), f.len());
            let mut want = f.clone();
            let (d, s) = want[VNET_HDR..VNET_HDR + 12].split_at_mut(6);
            d.swap_with_slice(s);
            assert_eq!(&buf[..f.len()], &want[..]);
        }
        assert!(recv(&mut lo, 200)
            .0
            .is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock));
        assert_eq!(poll(lo.as_raw_fd()), (false, true));
    }

    #[test]
    fn a_full_loop_refuses_with_eagain_and_is_not_writable_until_drained() {
        let mut lo = LoopBackend::new().expect("loop");
        for i in 0..LOOP_CAPACITY {
            send(&mut lo, &mut frame(i as u8, 64)).expect("room");
        }
        assert_eq!(poll(lo.as_raw_fd()), (true, false));
        let refused = send(&mut lo, &mut frame(0, 64));
        assert!(refused.is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock));
        assert_eq!(lo.queued(), LOOP_CAPACITY);
        let (r, _) = recv(&mut lo, 100);
        assert_eq!(r.expect("frame"), 64);
        assert_eq!(poll(lo.as_raw_fd()), (true, true));
        send(&mut lo, &mut frame(1, 64)).expect("room again");
        for _ in 0..LOOP_CAPACITY {
            recv(&mut lo, 100).0.expect("frame");
        }
        assert_eq!(poll(lo.as_raw_fd()), (false, true));
    }

    #[test]
    fn loop_truncates_a_frame_that_does_not_fit_and_keeps_order() {
        let mut lo = LoopBackend::new().expect("loop");
        send(&mut lo, &mut frame(1, 100)).expect("sent");
        send(&mut lo, &mut frame(2, 30)).expect("sent");
        assert_eq!(recv(&mut lo, 50).0.expect("truncated"), 51);
        assert_eq!(recv(&mut lo, 50).0.expect("frame"), 30);
    }
}
