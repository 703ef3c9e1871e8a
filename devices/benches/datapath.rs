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
//!   own descriptor for 2), drained 1 or 256 frames per call.
//! - rx: the ring kept **full** of posted 2 KiB buffers (as a Linux guest keeps it), 1 or 32
//!   frames per call, MRG_RXBUF off, on (no GSO: 9 KiB gathered) and on with GSO (64 KiB).
//!
//! The tap lives in a network namespace private to this process (`unshare(CLONE_NEWNET)`; needs
//! root and /dev/net/tun, else only the null-backend rows run). Measure on an idle machine: the
//! load average is printed with the table.
//!
//! Run: `cargo bench -p devices --bench datapath [-- --repeats N] [--quick]`

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use devices::backend::{NetBackend, NullBackend, Tap};
use devices::iovec::IovecList;
use devices::virtio::net::metrics::{RxCounters, TxCounters};
use devices::virtio::net::rx::{RX_GATHER_BYTES, RX_GATHER_NO_GSO_BYTES};
use devices::virtio::net::{RxMode, RxQueue, TxQueue, VNET_HDR_LEN};
use devices::virtio::vring::Virtqueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const FRAME_LEN: usize = 64;
const ETHERTYPE: u16 = 0x88b5;
const TAP_NAME: &str = "dpbench0";
const RX_BUF_LEN: u32 = 2048;
const DESC_AT: u64 = 0;
const AVAIL_AT: u64 = 0x4000;
const USED_AT: u64 = 0x8000;
const BUFS_AT: u64 = 0x10_0000;

/// The driver side of one split queue in guest memory.
struct Driver {
    mem: GuestMemoryMmap,
    size: u16,
    /// Chain heads, in the order they are made available.
    heads: Vec<u16>,
    next_head: usize,
    avail_idx: u16,
    used_seen: u16,
}

impl Driver {
    fn new(size: u16) -> Driver {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x200_0000)]).expect("memory");
        // Fault the rings and buffers in, as a running guest's memory is.
        mem.write_slice(&vec![0u8; 0x80_0000], GuestAddress(0))
            .expect("prefault");
        Driver {
            mem,
            size,
            heads: Vec::new(),
            next_head: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    fn write_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut desc = [0u8; 16];
        desc[..8].copy_from_slice(&addr.to_le_bytes());
        desc[8..12].copy_from_slice(&len.to_le_bytes());
        desc[12..14].copy_from_slice(&flags.to_le_bytes());
        desc[14..].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&desc, GuestAddress(DESC_AT + 16 * u64::from(i)))
            .expect("descriptor");
    }

    /// Tx chains of `descs` descriptors (1: header + frame together; 2: header, then frame).
    fn tx(size: u16, descs: u16, frame: &[u8]) -> Driver {
        let mut d = Driver::new(size);
        for c in 0..size / descs {
            let buf = BUFS_AT + u64::from(c) * 2048;
            d.mem.write_slice(frame, GuestAddress(buf)).expect("frame");
            let head = c * descs;
            if descs == 1 {
                d.write_desc(head, buf, frame.len() as u32, 0, 0);
            } else {
                d.write_desc(head, buf, VNET_HDR_LEN as u32, 1, head + 1); // NEXT
                d.write_desc(
                    head + 1,
                    buf + VNET_HDR_LEN as u64,
                    (frame.len() - VNET_HDR_LEN) as u32,
                    0,
                    0,
                );
            }
            d.heads.push(head);
        }
        d
    }

    /// Rx: one device-writable 2 KiB buffer per descriptor.
    fn rx(size: u16) -> Driver {
        let mut d = Driver::new(size);
        for i in 0..size {
            let buf = BUFS_AT + u64::from(i) * u64::from(RX_BUF_LEN);
            d.write_desc(i, buf, RX_BUF_LEN, 2, 0); // WRITE
            d.heads.push(i);
        }
        d
    }

    fn queue(&self) -> Queue {
        let mut q = Queue::new(self.size).expect("queue");
        q.set_size(self.size);
        q.try_set_desc_table_address(GuestAddress(DESC_AT))
            .expect("desc");
        q.try_set_avail_ring_address(GuestAddress(AVAIL_AT))
            .expect("avail");
        q.try_set_used_ring_address(GuestAddress(USED_AT))
            .expect("used");
        q.set_ready(true);
        q.set_event_idx(true);
        q
    }

    fn push_avail(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        self.mem
            .write_obj(head, GuestAddress(AVAIL_AT + 4 + 2 * slot))
            .expect("avail entry");
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    fn store_avail_idx(&self) {
        self.mem
            .store(
                self.avail_idx,
                GuestAddress(AVAIL_AT + 2),
                Ordering::Release,
            )
            .expect("avail idx");
    }

    /// Makes the next `n` chains available (tx).
    fn publish(&mut self, n: usize) {
        for _ in 0..n {
            let head = self.heads[self.next_head];
            self.next_head = (self.next_head + 1) % self.heads.len();
            self.push_avail(head);
        }
        self.store_avail_idx();
    }

    /// Posts every buffer once (rx: a full ring).
    fn fill(&mut self) {
        for i in 0..self.heads.len() {
            let head = self.heads[i];
            self.push_avail(head);
        }
        self.store_avail_idx();
    }

    /// Re-posts every buffer the device returned (rx: keeps the ring full).
    fn repost_used(&mut self) -> usize {
        let used: u16 = self
            .mem
            .load(GuestAddress(USED_AT + 2), Ordering::Acquire)
            .expect("used idx");
        let n = used.wrapping_sub(self.used_seen);
        for _ in 0..n {
            let slot = u64::from(self.used_seen % self.size);
            let id: u32 = self
                .mem
                .read_obj(GuestAddress(USED_AT + 4 + 8 * slot))
                .expect("used elem");
            self.push_avail(id as u16);
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        self.store_avail_idx();
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

/// ns per frame of a bare `writev` loop: the same frame, split as the chains are, from 256
/// rotating buffers (the footprint of the ring's buffers).
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
    let start = Instant::now();
    for i in 0..frames {
        backend
            .write_frame(lists[i % lists.len()].as_iovecs())
            .expect("writev");
    }
    start.elapsed().as_nanos() as f64 / frames as f64
}

/// The tap in this process's own network namespace, and a packet socket to inject frames.
struct TapRig {
    tap: Tap,
    inject: OwnedFd,
    addr: libc::sockaddr_ll,
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
        let (inject, addr) = packet_socket(TAP_NAME)?;
        Ok(TapRig { tap, inject, addr })
    }

    fn inject(&self, frame: &[u8]) {
        // SAFETY: `frame` and `addr` are valid for the call; sendto copies them.
        let n = unsafe {
            libc::sendto(
                self.inject.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&self.addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(
            n,
            frame.len() as isize,
            "inject: {}",
            io::Error::last_os_error()
        );
    }
}

fn ifreq_for(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

fn link_up(name: &str) -> io::Result<()> {
    // SAFETY: plain socket creation.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `sock` was just opened and is owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let mut req = ifreq_for(name);
    // SAFETY: valid ifreq living across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union's flags member was just written by the kernel.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as i16 };
    // SAFETY: valid ifreq living across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn packet_socket(name: &str) -> io::Result<(OwnedFd, libc::sockaddr_ll)> {
    let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    let proto = ETHERTYPE.to_be();
    // SAFETY: plain socket creation.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = proto;
    addr.sll_ifindex = ifindex as i32;
    addr.sll_halen = 6;
    Ok((fd, addr))
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

/// ns per frame of bare `readv` calls into one 2 KiB host buffer (+ the tap's guard byte),
/// `batch` frames per timed group, injected the same way. With `probe`, each group ends with
/// the `readv` that finds the tap empty (EAGAIN), as any device draining a tap must.
fn run_readv(rig: &mut TapRig, frame: &[u8], batch: usize, frames: usize, probe: bool) -> f64 {
    let mut bufs: Vec<Vec<u8>> = (0..256).map(|_| vec![0u8; RX_BUF_LEN as usize]).collect();
    let mut lists: Vec<IovecList<'_>> = Vec::new();
    for buf in &mut bufs {
        let mut list = IovecList::new();
        list.push_slice(buf).expect("room");
        lists.push(list);
    }
    let mut timed = Duration::ZERO;
    let iters = frames.div_ceil(batch);
    let mut next = 0;
    for _ in 0..iters {
        for _ in 0..batch {
            rig.inject(&frame[VNET_HDR_LEN..]);
        }
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
    let repeats = args
        .iter()
        .position(|a| a == "--repeats")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 3 } else { 9 });
    let frames = if quick { 4096 } else { 65536 };
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
            let mut pairs = Vec::new();
            for _ in 0..repeats {
                let mut d = Driver::tx(512, descs, &wire);
                let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), &d.mem).expect("ring"));
                let mut null = NullBackend::new(wire.len()).expect("null backend");
                pairs.push((0.0, run_tx(&mut d, &mut txq, &mut null, batch, frames)));
            }
            report(&format!("tx null {descs}-desc batch {batch}"), "-", &pairs);
        }
    }
    for (mode, gather, label) in [
        (RxMode::SingleChain, RX_GATHER_NO_GSO_BYTES, "mrg off"),
        (RxMode::Mergeable, RX_GATHER_NO_GSO_BYTES, "mrg on"),
    ] {
        for batch in [1usize, 32] {
            let mut pairs = Vec::new();
            for _ in 0..repeats {
                let mut d = Driver::rx(256);
                d.fill();
                let mut rxq = RxQueue::new(
                    Virtqueue::new(&d.queue(), &d.mem).expect("ring"),
                    mode,
                    gather,
                );
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
            report(&format!("rx null {label} batch {batch}"), "timer", &pairs);
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
    for descs in [1u16, 2] {
        for batch in [1usize, 256] {
            let mut pairs = Vec::new();
            for _ in 0..repeats {
                let base = run_writev(&mut rig.tap, &wire, descs, frames);
                let mut d = Driver::tx(512, descs, &wire);
                let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), &d.mem).expect("ring"));
                let case = run_tx(&mut d, &mut txq, &mut rig.tap, batch, frames);
                pairs.push((base, case));
            }
            report(
                &format!("tx tap {descs}-desc batch {batch}"),
                &format!("writev {descs} iov"),
                &pairs,
            );
        }
    }
    let rx_frames = frames / 4;
    let mut pairs = Vec::new();
    for _ in 0..repeats {
        let bare = run_readv(&mut rig, &wire, 1, rx_frames, false);
        let probed = run_readv(&mut rig, &wire, 1, rx_frames, true);
        pairs.push((bare, probed));
    }
    report("rx tap: the EAGAIN probe per call", "readv", &pairs);
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
            let mut pairs = Vec::new();
            for _ in 0..repeats {
                let base = run_readv(&mut rig, &wire, batch, rx_frames, probe);
                let mut d = Driver::rx(256);
                d.fill();
                let mut rxq = RxQueue::new(
                    Virtqueue::new(&d.queue(), &d.mem).expect("ring"),
                    mode,
                    gather,
                );
                let inject_from = TapInjector {
                    fd: rig.inject.as_raw_fd(),
                    addr: rig.addr,
                    frame: wire[VNET_HDR_LEN..].to_vec(),
                };
                let case = run_rx(
                    &mut d,
                    &mut rxq,
                    &mut rig.tap,
                    |_, n| inject_from.send(n),
                    batch,
                    rx_frames,
                );
                pairs.push((base, case));
            }
            let base = if probe { "readv+EAGAIN" } else { "readv" };
            report(&format!("rx tap {label} batch {batch}"), base, &pairs);
        }
    }
}

/// Injects frames into the tap from inside a closure that also borrows the tap mutably.
struct TapInjector {
    fd: i32,
    addr: libc::sockaddr_ll,
    frame: Vec<u8>,
}

impl TapInjector {
    fn send(&self, n: usize) {
        for _ in 0..n {
            // SAFETY: `frame` and `addr` are valid for the call; sendto copies them.
            let sent = unsafe {
                libc::sendto(
                    self.fd,
                    self.frame.as_ptr().cast(),
                    self.frame.len(),
                    0,
                    (&self.addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            assert_eq!(sent, self.frame.len() as isize, "inject");
        }
    }
}
