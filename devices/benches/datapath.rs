//! The device's own cost per frame, next to the backend's system call, **in the same run**.
//!
//! For each case the bench measures, in alternation and `--repeats` times, a bare loop of the
//! backend's system call on the same tap with the same frame (`writev` for tx, `readv` for rx)
//! and the datapath call ([`TxQueue::process`] / [`RxQueue::process`]) doing the same work
//! through a virtqueue in guest memory; it prints the medians and the median of the per-repeat
//! differences: the device's cost on top of the system call. The null backend (no system call,
//! a benchmarking backend) isolates the virtio work.
//!
//! - tx: a pre-filled ring of 1- or 2-descriptor chains (header + 64 B frame; the header in its
//!   own descriptor for 2), drained 1 or 256 frames per call, on the tap with one `writev` per
//!   frame and batched through io_uring (32 frames per `io_uring_enter`); plus a bare loop of
//!   io_uring batches of 1, 2, 4, 8 and 32 frames, the batched path's floor.
//! - rx: the ring kept **full** of posted 2 KiB buffers (as a Linux guest keeps it), 1 or 32
//!   frames per call, MRG_RXBUF off, on (no GSO: 9 KiB gathered) and on with GSO (64 KiB),
//!   with sparse reads on as in the worker (one-frame calls skip the read that finds the tap
//!   empty, but one call in 32), and once with them off (every call reads until EAGAIN).
//!   Rows that split a one-frame call's cost: the read that finds the tap empty (the EAGAIN
//!   probe), the bare loop reading into guest memory instead of heap buffers, and the device
//!   over a benchmarking backend that reads each frame from the tap into host buffers (the
//!   device's work with the tap's system calls around it); and bare io_uring batches of reads,
//!   the last finding the tap empty, against `readv`s plus the probe.
//!
//! The bench's driver side writes the avail ring as a guest driver does (stores and a release
//! store of the index through a pointer resolved once): the tx rows time whole iterations,
//! driver included, so its part must stay small next to the device's.
//!
//! The tap lives in a network namespace private to this process (`unshare(CLONE_NEWNET)`; needs
//! root and /dev/net/tun, else only the null-backend rows run). Measure on an idle machine: the
//! load average is printed with the table.
//!
//! Run: `cargo bench -p devices --bench datapath [-- --repeats N] [--quick] [--frames N] [--only TEXT]`
//! (`--only` keeps the rows whose name, baseline included for the rx tap rows, contains TEXT).

use std::io;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use devices::backend::{
    BatchRing, NetBackend, NullBackend, Offloads, Tap, MAX_RX_BATCH, MAX_TX_BATCH,
};
use devices::iovec::IovecList;
use devices::test_utils::link::{link_up, PacketSocket};
use devices::test_utils::queue::{GuestQueue, NEXT, WRITE};
use devices::virtio::net::metrics::{RxCounters, TxCounters};
use devices::virtio::net::rx::{RX_GATHER_BYTES, RX_GATHER_NO_GSO_BYTES};
use devices::virtio::net::{
    BucketConfig, RateLimiterConfig, RxMode, RxQueue, TxQueue, VNET_HDR_LEN,
};
use devices::virtio::vring::Virtqueue;
use std::os::fd::AsRawFd;
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

const FRAME_LEN: usize = 64;
const ETHERTYPE: u16 = 0x88b5;
const TAP_NAME: &str = "dpbench0";
const RX_BUF_LEN: u32 = 2048;
const DESC_AT: u64 = 0;
const AVAIL_AT: u64 = 0x4000;
const USED_AT: u64 = 0x8000;
const BUFS_AT: u64 = 0x10_0000;

/// The driver side of one split queue in guest memory: fixed chains, made available in turn.
///
/// The avail ring is written as a guest driver writes it: a store per entry and a release
/// store of the index, through a host pointer resolved once. (Through `GuestQueue`, i.e.
/// vm-memory's generic per-access path, publishing cost ~30 ns per call at one frame per call,
/// which the tx rows used to charge to the device.)
struct Driver {
    q: GuestQueue,
    /// Host address of the avail ring (`AVAIL_AT`), inside `q`'s memory.
    avail: *mut u8,
    size: u16,
    avail_idx: u16,
    /// Chain heads, in the order they are made available.
    heads: Vec<u16>,
    next_head: usize,
    used_seen: u16,
}

impl Driver {
    fn new(size: u16) -> Driver {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x200_0000)]).expect("memory");
        // Fault the rings and buffers in, as a running guest's memory is.
        mem.write_slice(&vec![0u8; 0x80_0000], GuestAddress(0))
            .expect("prefault");
        let q = GuestQueue::with_rings(&mem, size, (DESC_AT, AVAIL_AT, USED_AT), BUFS_AT);
        // One region from guest address 0 (above).
        let avail = mem
            .iter()
            .next()
            .expect("a region")
            .get_host_address(MemoryRegionAddress(AVAIL_AT))
            .expect("avail ring in memory");
        Driver {
            q,
            avail,
            size,
            avail_idx: 0,
            heads: Vec::new(),
            next_head: 0,
            used_seen: 0,
        }
    }

    fn mem(&self) -> &GuestMemoryMmap {
        self.q.mem()
    }

    /// Tx chains of `descs` descriptors (1: header + frame together; 2: header, then frame).
    fn tx(size: u16, descs: u16, frame: &[u8]) -> Driver {
        let mut d = Driver::new(size);
        for c in 0..size / descs {
            let buf = BUFS_AT + u64::from(c) * 2048;
            d.mem()
                .write_slice(frame, GuestAddress(buf))
                .expect("frame");
            let head = if descs == 1 {
                d.q.write_descs(&[(buf, frame.len() as u32, 0, 0)])
            } else {
                let hdr = VNET_HDR_LEN as u32;
                d.q.write_descs(&[
                    (buf, hdr, NEXT, c * descs + 1),
                    (buf + u64::from(hdr), frame.len() as u32 - hdr, 0, 0),
                ])
            }[0];
            d.heads.push(head);
        }
        d
    }

    /// Rx: one device-writable 2 KiB buffer per descriptor.
    fn rx(size: u16) -> Driver {
        let mut d = Driver::new(size);
        for i in 0..size {
            let buf = BUFS_AT + u64::from(i) * u64::from(RX_BUF_LEN);
            let head = d.q.write_descs(&[(buf, RX_BUF_LEN, WRITE, 0)])[0];
            d.heads.push(head);
        }
        d
    }

    /// Rx with every buffer posted (a full ring) and the device's queue over it, set up as
    /// the worker sets it (sparse reads on: it polls the backend level-triggered).
    fn rx_full(size: u16, mode: RxMode, gather: u64) -> (Driver, RxQueue) {
        let mut d = Driver::rx(size);
        d.fill();
        let vq = Virtqueue::new(&d.queue(), d.mem()).expect("ring");
        let mut rxq = RxQueue::new(vq, mode, gather);
        rxq.set_sparse_reads(true);
        (d, rxq)
    }

    fn queue(&self) -> Queue {
        let mut q = self.q.queue();
        q.set_event_idx(true);
        q
    }

    /// Writes the next avail entry (seen by the device once [`Driver::publish_idx`] runs).
    fn push_avail(&mut self, head: u16) {
        let slot = 4 + 2 * usize::from(self.avail_idx % self.size);
        // SAFETY: `avail` is the host address of the 6 + 2·size-byte avail ring inside the
        // mapped memory `q` holds (so it outlives `self`), 2-aligned (AVAIL_AT); `slot + 2 ≤
        // 4 + 2·size`. The device reads the ring only inside `process` calls, on this thread.
        unsafe { std::ptr::write_volatile(self.avail.add(slot).cast::<u16>(), head.to_le()) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Publishes the entries pushed so far: a release store of the avail index.
    fn publish_idx(&self) {
        // SAFETY: as in `push_avail`; offset 2 is the 2-aligned u16 `idx`, and guest memory is
        // plain shared memory, valid for atomic access.
        let idx = unsafe { AtomicU16::from_ptr(self.avail.add(2).cast()) };
        idx.store(self.avail_idx.to_le(), Ordering::Release);
    }

    /// Makes `heads` available.
    fn publish_heads(&mut self, heads: &[u16]) {
        for &head in heads {
            self.push_avail(head);
        }
        self.publish_idx();
    }

    /// Makes the next `n` chains available (tx).
    fn publish(&mut self, n: usize) {
        for _ in 0..n {
            let head = self.heads[self.next_head];
            self.next_head = (self.next_head + 1) % self.heads.len();
            self.push_avail(head);
        }
        self.publish_idx();
    }

    /// Posts every buffer once (rx: a full ring).
    fn fill(&mut self) {
        let heads = self.heads.clone();
        self.publish_heads(&heads);
    }

    /// Re-posts every buffer the device returned (rx: keeps the ring full).
    fn repost_used(&mut self) -> usize {
        let from = self.used_seen;
        let n = self.q.used_idx().wrapping_sub(from);
        let q = &mut self.q;
        let ids: Vec<u16> = (0..n)
            .map(|k| q.used(from.wrapping_add(k)).0 as u16)
            .collect();
        self.publish_heads(&ids);
        self.used_seen = from.wrapping_add(n);
        usize::from(n)
    }
}

fn frame() -> Vec<u8> {
    let mut f = vec![0u8; VNET_HDR_LEN];
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99]); // not our own, not broadcast
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f.extend((0..FRAME_LEN - 14).map(|i| i as u8));
    f
}

/// ns per frame of `iters` batches of `batch` frames sent through `txq`.
fn run_tx<B: NetBackend>(
    d: &mut Driver,
    txq: &mut TxQueue,
    backend: &mut B,
    batch: usize,
    frames: usize,
) -> f64 {
    let mut counters = TxCounters::default();
    let iters = frames.div_ceil(batch);
    let start = Instant::now();
    for _ in 0..iters {
        d.publish(batch);
        let mut left = batch as u64;
        while left > 0 {
            let before = counters.frames;
            txq.process(backend, &mut counters).expect("ring ok");
            left -= counters.frames - before;
            if counters.frames == before {
                break;
            }
        }
    }
    let ns = start.elapsed().as_nanos() as f64;
    assert_eq!(counters.malformed_chains + counters.backend_errors, 0);
    ns / (iters * batch) as f64
}

/// ns per frame of a bare `writev` loop of the frames the tx chains of `d` hold (header and
/// frame split as the chains split them), in ring order, straight from their buffers in guest
/// memory: 2 KiB apart, as a guest's buffers are, where [`run_writev`]'s heap copies sit
/// next to each other.
fn run_writev_guest(backend: &mut Tap, d: &Driver, frame: &[u8], descs: u16, frames: usize) -> f64 {
    let host = d.avail.wrapping_sub(AVAIL_AT as usize);
    let lists: Vec<IovecList<'_>> = (0..d.heads.len())
        .map(|c| {
            let at = BUFS_AT as usize + c * 2048;
            // SAFETY: `host` is the host address of guest address 0 of `d`'s one region
            // (32 MiB), mapped while `d` lives (it outlives the lists); chain `c`'s buffer is
            // the frame's bytes at BUFS_AT + c·2 KiB, inside it, which only the kernel reads
            // meanwhile.
            let buf = unsafe { std::slice::from_raw_parts_mut(host.wrapping_add(at), frame.len()) };
            let mut list = IovecList::new();
            if descs == 1 {
                list.push_slice(buf).expect("room");
            } else {
                let (hdr, rest) = buf.split_at_mut(VNET_HDR_LEN);
                list.push_slice(hdr).expect("room");
                list.push_slice(rest).expect("room");
            }
            list
        })
        .collect();
    writev_loop(backend, &lists, frames)
}

/// ns per frame of `frames` `writev`s, from `lists` in turn.
fn writev_loop(backend: &mut Tap, lists: &[IovecList<'_>], frames: usize) -> f64 {
    let start = Instant::now();
    for i in 0..frames {
        backend
            .write_frame(lists[i % lists.len()].as_iovecs())
            .expect("writev");
    }
    start.elapsed().as_nanos() as f64 / frames as f64
}

/// ns per frame of a bare `writev` loop: the same frame, split as the chains are, from 256
/// rotating heap copies (next to each other: a smaller footprint than the ring's buffers, see
/// [`run_writev_guest`]).
fn run_writev(backend: &mut Tap, frame: &[u8], descs: u16, frames: usize) -> f64 {
    let mut bufs: Vec<Vec<u8>> = (0..256).map(|_| frame.to_vec()).collect();
    let mut lists: Vec<IovecList<'_>> = Vec::new();
    for buf in &mut bufs {
        let mut list = IovecList::new();
        if descs == 1 {
            list.push_slice(buf).expect("room");
        } else {
            let (hdr, rest) = buf.split_at_mut(VNET_HDR_LEN);
            list.push_slice(hdr).expect("room");
            list.push_slice(rest).expect("room");
        }
        lists.push(list);
    }
    writev_loop(backend, &lists, frames)
}

/// ns per frame of a bare loop of io_uring batches: `batch` `writev`s of the same frame, split
/// as the chains are, per `io_uring_enter` ([`BatchRing`] on the tap's fd), from 256 rotating
/// buffers.
fn run_uring(backend: &Tap, frame: &[u8], descs: u16, batch: usize, frames: usize) -> f64 {
    let mut ring = BatchRing::new(backend.as_raw_fd()).expect("io_uring");
    let mut bufs: Vec<Vec<u8>> = (0..256).map(|_| frame.to_vec()).collect();
    let mut lists: Vec<(IovecList<'_>, Vec<usize>)> = Vec::new();
    for chunk in bufs.chunks_mut(batch) {
        let mut list = IovecList::new();
        let mut ends = Vec::new();
        for buf in chunk {
            if descs == 1 {
                list.push_slice(buf).expect("room");
            } else {
                let (hdr, rest) = buf.split_at_mut(VNET_HDR_LEN);
                list.push_slice(hdr).expect("room");
                list.push_slice(rest).expect("room");
            }
            ends.push(list.len());
        }
        lists.push((list, ends));
    }
    let mut results: Vec<io::Result<usize>> = (0..batch).map(|_| Ok(0)).collect();
    let calls = frames.div_ceil(batch);
    let start = Instant::now();
    let mut sent = 0;
    for i in 0..calls {
        let (list, ends) = &lists[i % lists.len()];
        // SAFETY: the iovecs point into `bufs`, alive and unmoved for the whole loop.
        unsafe { ring.write(list.as_iovecs().as_raw(), ends, &mut results) }.expect("ring");
        assert!(
            results[..ends.len()].iter().all(|r| r.is_ok()),
            "batched write"
        );
        sent += ends.len();
    }
    start.elapsed().as_nanos() as f64 / sent as f64
}

/// The tap in this process's own network namespace, and a packet socket to inject frames.
struct TapRig {
    tap: Tap,
    inject: PacketSocket,
}

impl TapRig {
    fn new() -> io::Result<TapRig> {
        // SAFETY: CLONE_NEWNET moves this process (single-threaded here) into a new network
        // namespace; no memory is involved.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // No IPv6 (no neighbour discovery frames on the tap).
        let _ = std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
        let tap = Tap::open(TAP_NAME).map_err(io::Error::other)?;
        link_up(TAP_NAME)?;
        let inject = PacketSocket::open(TAP_NAME, ETHERTYPE)?;
        Ok(TapRig { tap, inject })
    }
}

/// Sends `n` copies of `frame` into the tap through `sock`.
fn inject(sock: &PacketSocket, frame: &[u8], n: usize) {
    for _ in 0..n {
        let sent = sock.send(frame).expect("inject");
        assert_eq!(sent, frame.len(), "inject");
    }
}

/// ns per frame of `process_rx` calls of `batch` frames each (timed per call; the frames are
/// injected before each call, the ring refilled after it).
fn run_rx<B: NetBackend>(
    d: &mut Driver,
    rxq: &mut RxQueue,
    backend: &mut B,
    mut inject: impl FnMut(&mut B, usize),
    batch: usize,
    frames: usize,
) -> f64 {
    let mut counters = RxCounters::default();
    let mut timed = Duration::ZERO;
    let iters = frames.div_ceil(batch);
    for _ in 0..iters {
        inject(backend, batch);
        let start = Instant::now();
        rxq.process(backend, &mut counters).expect("ring ok");
        timed += start.elapsed();
        d.repost_used();
    }
    assert_eq!(
        counters.frames,
        (iters * batch) as u64,
        "every injected frame received"
    );
    timed.as_nanos() as f64 / (iters * batch) as f64
}

/// ns per frame of one-frame `process_rx` calls that each read until EAGAIN (sparse reads off,
/// as the `readv+EAGAIN` baseline does), on the tap or, with `host`, on [`HostBufTap`].
fn run_rx_draining(rig: &mut TapRig, wire: &[u8], host: bool, frames: usize) -> f64 {
    let (mut d, mut rxq) = Driver::rx_full(256, RxMode::SingleChain, RX_GATHER_NO_GSO_BYTES);
    rxq.set_sparse_reads(false);
    let sock = &rig.inject;
    let frame = &wire[VNET_HDR_LEN..];
    if host {
        let mut host = HostBufTap::new(&rig.tap);
        run_rx(
            &mut d,
            &mut rxq,
            &mut host,
            |_, n| inject(sock, frame, n),
            1,
            frames,
        )
    } else {
        run_rx(
            &mut d,
            &mut rxq,
            &mut rig.tap,
            |_, n| inject(sock, frame, n),
            1,
            frames,
        )
    }
}

/// ns per frame of bare `readv` calls into one 2 KiB host buffer (+ the tap's guard byte),
/// `batch` frames per timed group, injected the same way. With `probe`, each group ends with
/// the `readv` that finds the tap empty (EAGAIN), as any device draining a tap must.
fn run_readv(rig: &mut TapRig, frame: &[u8], batch: usize, frames: usize, probe: bool) -> f64 {
    run_readv_into(rig, frame, batch, frames, probe, false)
}

/// [`run_readv`], into the rx buffers of a guest memory laid out as the device rows' (with
/// `guest`) instead of host heap buffers.
fn run_readv_into(
    rig: &mut TapRig,
    frame: &[u8],
    batch: usize,
    frames: usize,
    probe: bool,
    guest: bool,
) -> f64 {
    let mut bufs: Vec<Vec<u8>> = (0..256).map(|_| vec![0u8; RX_BUF_LEN as usize]).collect();
    let d = Driver::rx(256);
    let host = d.avail.wrapping_sub(AVAIL_AT as usize);
    let mut lists: Vec<IovecList<'_>> = Vec::new();
    for (i, buf) in bufs.iter_mut().enumerate() {
        let mut list = IovecList::new();
        if guest {
            let at = BUFS_AT as usize + i * RX_BUF_LEN as usize;
            // SAFETY: `host` is the host address of guest address 0 of `d`'s one region
            // (32 MiB), which `d` keeps mapped until this function returns; buffer `i` is the
            // 2 KiB at BUFS_AT + i·2 KiB, inside it, and nothing else uses it meanwhile.
            let slice = unsafe {
                std::slice::from_raw_parts_mut(host.wrapping_add(at), RX_BUF_LEN as usize)
            };
            list.push_slice(slice).expect("room");
        } else {
            list.push_slice(buf).expect("room");
        }
        lists.push(list);
    }
    let mut timed = Duration::ZERO;
    let iters = frames.div_ceil(batch);
    let mut next = 0;
    for _ in 0..iters {
        inject(&rig.inject, &frame[VNET_HDR_LEN..], batch);
        let start = Instant::now();
        for _ in 0..batch {
            rig.tap
                .read_frame(lists[next % lists.len()].as_iovecs())
                .expect("readv");
            next += 1;
        }
        if probe {
            let empty = rig.tap.read_frame(lists[next % lists.len()].as_iovecs());
            assert!(matches!(empty, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock));
        }
        timed += start.elapsed();
    }
    timed.as_nanos() as f64 / (iters * batch) as f64
}

/// ns per frame of a bare loop of io_uring read batches on the tap: `batch` frames injected,
/// then one [`BatchRing::read`] of `batch + 1` reads into 2 KiB host buffers (+ a guard byte
/// each), the last finding the tap empty: the batched form of [`run_readv`] with `probe`.
fn run_uring_read(rig: &mut TapRig, frame: &[u8], batch: usize, frames: usize) -> f64 {
    let mut ring = BatchRing::with_reads(rig.tap.as_raw_fd()).expect("io_uring");
    let reads = batch + 1;
    let mut bufs: Vec<Vec<u8>> = (0..reads).map(|_| vec![0u8; RX_BUF_LEN as usize]).collect();
    let mut guard = [0u8; 1];
    let mut iovs = Vec::new();
    let mut ends = Vec::new();
    for buf in &mut bufs {
        iovs.push(libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        });
        iovs.push(libc::iovec {
            iov_base: guard.as_mut_ptr().cast(),
            iov_len: 1,
        });
        ends.push(iovs.len());
    }
    let mut results: Vec<io::Result<usize>> = (0..reads).map(|_| Ok(0)).collect();
    let mut timed = Duration::ZERO;
    let iters = frames.div_ceil(batch);
    for _ in 0..iters {
        inject(&rig.inject, &frame[VNET_HDR_LEN..], batch);
        let start = Instant::now();
        // SAFETY: the iovecs point into `bufs` and `guard`, alive, unmoved and otherwise
        // unused for the whole loop.
        unsafe { ring.read(&iovs, &ends, &mut results) }.expect("ring");
        timed += start.elapsed();
        assert!(results[..batch].iter().all(|r| r.is_ok()), "batched read");
        assert!(
            matches!(results[batch], Err(ref e) if e.kind() == io::ErrorKind::WouldBlock),
            "the last read finds the tap empty"
        );
    }
    timed.as_nanos() as f64 / (iters * batch) as f64
}

/// A benchmarking backend: reads each frame from the tap (its own descriptor of the same
/// queue) into one of 256 rotating host buffers, as the bare loop does, and ignores the guest's
/// buffers; built with [`HostBufTap::sending`], it writes each frame from such buffers
/// instead of the guest's. The device then does all of its work with the tap's system calls
/// around it, without the kernel touching guest memory: device rows minus bare rows, the
/// device's own cost as the tap's calls leave the caches.
struct HostBufTap {
    file: std::fs::File,
    bufs: Vec<u8>,
    next: usize,
    guard: [u8; 1],
    /// Bytes of the frame each buffer holds ([`HostBufTap::sending`]).
    frame_len: usize,
}

impl HostBufTap {
    fn new(tap: &Tap) -> HostBufTap {
        // SAFETY: dup has no memory effects; the result is checked.
        let fd = unsafe { libc::dup(tap.as_raw_fd()) };
        assert!(fd >= 0, "dup: {}", io::Error::last_os_error());
        HostBufTap {
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            file: unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) },
            bufs: vec![0u8; 256 * RX_BUF_LEN as usize],
            next: 0,
            guard: [0],
            frame_len: 0,
        }
    }

    /// One that writes `frame` (header included) from its buffers on every `write_frame`.
    fn sending(tap: &Tap, frame: &[u8]) -> HostBufTap {
        let mut b = HostBufTap::new(tap);
        for buf in b.bufs.chunks_mut(RX_BUF_LEN as usize) {
            buf[..frame.len()].copy_from_slice(frame);
        }
        b.frame_len = frame.len();
        b
    }
}

impl AsRawFd for HostBufTap {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for HostBufTap {
    fn read_frame(&mut self, _iovs: devices::iovec::Iovecs<'_>) -> io::Result<usize> {
        let at = self.next * RX_BUF_LEN as usize;
        self.next = (self.next + 1) % 256;
        let iov = [
            libc::iovec {
                iov_base: self.bufs[at..].as_mut_ptr().cast(),
                iov_len: RX_BUF_LEN as usize,
            },
            libc::iovec {
                iov_base: self.guard.as_mut_ptr().cast(),
                iov_len: 1,
            },
        ];
        // SAFETY: both iovecs point into buffers of `self` valid for writes of their lengths;
        // readv keeps no pointer after returning.
        let ret = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), 2) };
        usize::try_from(ret).map_err(|_| io::Error::last_os_error())
    }

    fn write_frame(&mut self, _iovs: devices::iovec::Iovecs<'_>) -> io::Result<usize> {
        let at = self.next * RX_BUF_LEN as usize;
        self.next = (self.next + 1) % 256;
        let frame = &self.bufs[at..at + self.frame_len];
        let iov = libc::iovec {
            iov_base: frame.as_ptr().cast_mut().cast(),
            iov_len: frame.len(),
        };
        // SAFETY: the iovec points into a buffer of `self` valid for reads of its length;
        // writev only reads it and keeps no pointer after returning.
        let ret = unsafe { libc::writev(self.file.as_raw_fd(), &iov, 1) };
        usize::try_from(ret).map_err(|_| io::Error::last_os_error())
    }

    fn supported_offloads(&self) -> Offloads {
        Offloads::NONE
    }

    fn set_offloads(&mut self, _offloads: Offloads) -> io::Result<()> {
        Ok(())
    }

    fn set_vnet_hdr_size(&mut self, _size: u32) -> io::Result<()> {
        Ok(())
    }
}

/// ns of one empty timed region (what per-call timing adds to the rx rows).
fn timer_overhead(iters: usize) -> f64 {
    let mut timed = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        std::hint::black_box(());
        timed += start.elapsed();
    }
    timed.as_nanos() as f64 / iters as f64
}

/// `--only TEXT`: run only the rows whose name contains TEXT (to profile one row).
static ONLY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

fn wanted(name: &str) -> bool {
    ONLY.get()
        .and_then(Option::as_deref)
        .is_none_or(|only| name.contains(only))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One row: the median baseline, the median case, and the median per-repeat difference.
fn report(name: &str, base: &str, pairs: &[(f64, f64)]) {
    let mut b: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let mut c: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let mut d: Vec<f64> = pairs.iter().map(|p| p.1 - p.0).collect();
    println!(
        "{name:<38} {base:<16} {:>9.0} {:>9.0} {:>+9.0}",
        median(&mut b),
        median(&mut c),
        median(&mut d)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // The value after `--name`, if given.
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let repeats = value("--repeats")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 3 } else { 9 });
    let frames = value("--frames")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 4096 } else { 65536 });
    let only = value("--only").cloned();
    ONLY.set(only).expect("set once");
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# datapath bench: 64 B frames, {repeats} repeats, {frames} frames each; loadavg {}",
        loadavg.trim()
    );
    println!(
        "{:<38} {:<16} {:>9} {:>9} {:>9}",
        "case (ns/frame)", "baseline", "base", "case", "over"
    );
    let wire = frame();

    // The null backend: the virtio work alone (baseline: nothing, 0 ns).
    for descs in [1u16, 2] {
        for batch in [1usize, 256] {
            let name = format!("tx null {descs}-desc batch {batch}");
            if !wanted(&name) {
                continue;
            }
            let mut pairs = Vec::new();
            for _ in 0..repeats {
                let mut d = Driver::tx(512, descs, &wire);
                let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
                let mut null = NullBackend::new(wire.len()).expect("null backend");
                pairs.push((0.0, run_tx(&mut d, &mut txq, &mut null, batch, frames)));
            }
            report(&name, "-", &pairs);
        }
    }
    // Rate limiters configured but never hit (both buckets far above the rate): what their
    // bookkeeping costs, against none, in the same run.
    let never_hit = RateLimiterConfig {
        bandwidth: Some(BucketConfig {
            size: u64::MAX >> 8,
            one_time_burst: 0,
            refill_time: 1,
        }),
        ops: Some(BucketConfig {
            size: u64::MAX >> 8,
            one_time_burst: 0,
            refill_time: 1,
        }),
    };
    for batch in [1usize, 256] {
        let name = format!("tx null 1-desc batch {batch} + limiter");
        if !wanted(&name) {
            continue;
        }
        let mut pairs = Vec::new();
        for _ in 0..repeats {
            let mut case = [0.0; 2];
            for (limited, ns) in case.iter_mut().enumerate() {
                let mut d = Driver::tx(512, 1, &wire);
                let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
                if limited == 1 {
                    txq.set_rate_limiter(&never_hit);
                }
                let mut null = NullBackend::new(wire.len()).expect("null backend");
                *ns = run_tx(&mut d, &mut txq, &mut null, batch, frames);
            }
            pairs.push((case[0], case[1]));
        }
        report(&name, "no limiter", &pairs);
    }
    for (mode, gather, label) in [
        (RxMode::SingleChain, RX_GATHER_NO_GSO_BYTES, "mrg off"),
        (RxMode::Mergeable, RX_GATHER_NO_GSO_BYTES, "mrg on"),
    ] {
        for batch in [1usize, 32] {
            let name = format!("rx null {label} batch {batch}");
            if !wanted(&name) {
                continue;
            }
            let mut pairs = Vec::new();
            for _ in 0..repeats {
                let (mut d, mut rxq) = Driver::rx_full(256, mode, gather);
                let mut null = NullBackend::new(wire.len()).expect("null backend");
                let timer = timer_overhead(frames / batch) / batch as f64;
                let ns = run_rx(
                    &mut d,
                    &mut rxq,
                    &mut null,
                    |b, n| b.queue_rx(n as u64),
                    batch,
                    frames,
                );
                pairs.push((timer, ns));
            }
            report(&name, "timer", &pairs);
        }
    }

    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("# tap rows skipped: they need root and /dev/net/tun");
        return;
    }
    let mut rig = match TapRig::new() {
        Ok(rig) => rig,
        Err(e) => {
            println!("# tap rows skipped: {e}");
            return;
        }
    };
    // tx on the tap: one writev per frame (batching off), and batched through io_uring (the
    // default where the kernel has it), each against a bare writev loop; and a bare loop of
    // io_uring batches of 32 writevs, the floor of the batched path.
    let uring = rig.tap.set_tx_batching(true);
    if !uring {
        println!("# io_uring unavailable: the batched rows are skipped");
    }
    for descs in [1u16, 2] {
        for ring_batch in [1usize, 2, 4, 8, MAX_TX_BATCH] {
            let name = format!("bare io_uring {ring_batch} x writev {descs} iov");
            if !wanted(&name) {
                continue;
            }
            let mut pairs = Vec::new();
            for _ in 0..repeats {
                if !uring {
                    break;
                }
                rig.tap.set_tx_batching(false);
                let base = run_writev(&mut rig.tap, &wire, descs, frames);
                pairs.push((base, run_uring(&rig.tap, &wire, descs, ring_batch, frames)));
            }
            if !pairs.is_empty() {
                report(&name, &format!("writev {descs} iov"), &pairs);
            }
        }
        for batch in [1usize, 256] {
            for batching in [false, true] {
                let how = if batching { "io_uring" } else { "writev" };
                let name = format!("tx tap ({how}) {descs}-desc batch {batch}");
                if (batching && !uring) || !wanted(&name) {
                    continue;
                }
                let mut pairs = Vec::new();
                for _ in 0..repeats {
                    rig.tap.set_tx_batching(false);
                    let base = run_writev(&mut rig.tap, &wire, descs, frames);
                    rig.tap.set_tx_batching(batching);
                    let mut d = Driver::tx(512, descs, &wire);
                    let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
                    let case = run_tx(&mut d, &mut txq, &mut rig.tap, batch, frames);
                    pairs.push((base, case));
                }
                report(&name, &format!("writev {descs} iov"), &pairs);
            }
        }
    }
    // The bare loop from the ring's own buffers, against the heap one; and the one-frame device
    // rows against it.
    for descs in [1u16, 2] {
        let layout_row = format!("tx tap: bare writev {descs} iov from the ring's guest buffers");
        let dev_row = format!("tx tap (writev) {descs}-desc batch 1 over the same");
        let base_name = format!("writev {descs} iov, ring's buffers");
        let (mut layout, mut dev) = (Vec::new(), Vec::new());
        for _ in 0..if wanted(&layout_row) || wanted(&dev_row) {
            repeats
        } else {
            0
        } {
            rig.tap.set_tx_batching(false);
            let heap = run_writev(&mut rig.tap, &wire, descs, frames);
            let mut d = Driver::tx(512, descs, &wire);
            let guest = run_writev_guest(&mut rig.tap, &d, &wire, descs, frames);
            let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
            layout.push((heap, guest));
            dev.push((guest, run_tx(&mut d, &mut txq, &mut rig.tap, 1, frames)));
        }
        if !layout.is_empty() {
            report(&layout_row, &format!("writev {descs} iov"), &layout);
            report(&dev_row, &base_name, &dev);
        }
    }
    let host_tx_row = "tx tap (writev) 1-desc batch 1, frames from host buffers";
    let mut pairs = Vec::new();
    for _ in 0..if wanted(host_tx_row) { repeats } else { 0 } {
        rig.tap.set_tx_batching(false);
        let base = run_writev(&mut rig.tap, &wire, 1, frames);
        let mut host = HostBufTap::sending(&rig.tap, &wire);
        let mut d = Driver::tx(512, 1, &wire);
        let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
        pairs.push((base, run_tx(&mut d, &mut txq, &mut host, 1, frames)));
    }
    if !pairs.is_empty() {
        report(host_tx_row, "writev 1 iov", &pairs);
    }
    rig.tap.set_tx_batching(true);
    let rx_frames = frames / 4;
    let mut pairs = Vec::new();
    let probe_row = "rx tap: the EAGAIN probe per call";
    for _ in 0..if wanted(probe_row) { repeats } else { 0 } {
        let bare = run_readv(&mut rig, &wire, 1, rx_frames, false);
        let probed = run_readv(&mut rig, &wire, 1, rx_frames, true);
        pairs.push((bare, probed));
    }
    if !pairs.is_empty() {
        report(probe_row, "readv", &pairs);
    }
    for batch in [1usize, 3, 7, 15, MAX_RX_BATCH - 1] {
        let name = format!("bare io_uring {} x readv (last: EAGAIN)", batch + 1);
        if !uring || !wanted(&name) {
            continue;
        }
        let mut pairs = Vec::new();
        for _ in 0..repeats {
            let base = run_readv(&mut rig, &wire, batch, rx_frames, true);
            pairs.push((base, run_uring_read(&mut rig, &wire, batch, rx_frames)));
        }
        report(&name, "readv+EAGAIN", &pairs);
    }
    for (row, host) in [
        ("rx tap mrg off batch 1, frames into host buffers", true),
        (
            "rx tap mrg off batch 1, sparse reads off (every call reads until EAGAIN)",
            false,
        ),
    ] {
        let mut pairs = Vec::new();
        for _ in 0..if wanted(row) { repeats } else { 0 } {
            let base = run_readv(&mut rig, &wire, 1, rx_frames, true);
            pairs.push((base, run_rx_draining(&mut rig, &wire, host, rx_frames)));
        }
        if !pairs.is_empty() {
            report(row, "readv+EAGAIN", &pairs);
        }
    }
    let guest_row = "rx tap: bare readv+EAGAIN into guest memory";
    let mut pairs = Vec::new();
    for _ in 0..if wanted(guest_row) { repeats } else { 0 } {
        let heap = run_readv_into(&mut rig, &wire, 1, rx_frames, true, false);
        let guest = run_readv_into(&mut rig, &wire, 1, rx_frames, true, true);
        pairs.push((heap, guest));
    }
    if !pairs.is_empty() {
        report(guest_row, "readv+EAGAIN", &pairs);
    }
    for (mode, gather, label, probe) in [
        (
            RxMode::SingleChain,
            RX_GATHER_NO_GSO_BYTES,
            "mrg off",
            false,
        ),
        (RxMode::SingleChain, RX_GATHER_NO_GSO_BYTES, "mrg off", true),
        (RxMode::Mergeable, RX_GATHER_NO_GSO_BYTES, "mrg on", true),
        (
            RxMode::Mergeable,
            RX_GATHER_BYTES,
            "mrg on, gso (64K)",
            true,
        ),
    ] {
        for batch in [1usize, 32] {
            let name = format!("rx tap {label} batch {batch}");
            let base_name = if probe { "readv+EAGAIN" } else { "readv" };
            if !wanted(&format!("{name} {base_name}")) {
                continue;
            }
            let mut pairs = Vec::new();
            for _ in 0..repeats {
                let base = run_readv(&mut rig, &wire, batch, rx_frames, probe);
                let (mut d, mut rxq) = Driver::rx_full(256, mode, gather);
                let case = run_rx(
                    &mut d,
                    &mut rxq,
                    &mut rig.tap,
                    |_, n| inject(&rig.inject, &wire[VNET_HDR_LEN..], n),
                    batch,
                    rx_frames,
                );
                pairs.push((base, case));
            }
            report(&name, base_name, &pairs);
        }
    }
}
