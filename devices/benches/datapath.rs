//! The device's own cost per frame, next to the backend's system call, **in the same run**.
//!
//! For each case the bench measures a bare loop of the backend's system call on the same tap
//! with the same frame (`writev` for tx, `readv` for rx) and the datapath call
//! ([`TxQueue::process`] / [`RxQueue::process`]) doing the same work through a virtqueue in
//! guest memory, in alternation: `--rounds` pairs of chunks of `--frames` frames a side (a few
//! milliseconds each; the order swapped every round, after a discarded warm-up pair), so that
//! the machine's changes of speed, which on a shared host come and go over seconds, land on
//! both sides of a pair. Each row prints the median baseline, the median case, the median of
//! the per-pair differences (the device's cost on top of the system call), that difference's
//! quartiles, and the fastest case less the fastest baseline (`best`). The null backend (no
//! system call, a benchmarking backend) isolates the virtio work.
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
//! - packed ring (virtio 1.1), null backend, 256 frames per call, each row against the same
//!   work over a split ring in the same run (the baseline column): `tx null 1-desc batch 256
//!   packed` and `tx null 2-desc batch 256 packed` (baseline `split`), the same with
//!   VIRTIO_F_IN_ORDER on both sides, `tx null 1-desc batch 256 packed in_order` and
//!   `tx null 2-desc batch 256 packed in_order` (baseline `split in_order`), and
//!   `rx null mrg off batch 256 packed` and `rx null mrg on batch 256 packed` (baseline
//!   `split`; rx has no IN_ORDER rows: the device returns each rx chain with its own used entry
//!   either way). `--only packed` runs them alone.
//!
//! The bench's driver side writes the avail ring as a guest driver does (stores and a release
//! store of the index through a pointer resolved once): the tx rows time whole iterations,
//! driver included, so its part must stay small next to the device's. The packed ring's driver
//! writes each chain's descriptors in place (the head's flags last, a release store) and reads
//! the used descriptors back before it reuses their slots, as a packed driver must: more work
//! per frame than the split driver's avail entry (it re-posts fixed chains without reading the
//! used ring). So the packed rows, tx and rx, time the device's calls alone (the driver's work
//! between two calls is not timed; two clock readings per 256-frame call add ~0.1 ns a frame
//! to both columns).
//!
//! The tap lives in a network namespace private to this process (`unshare(CLONE_NEWNET)`; needs
//! root and /dev/net/tun, else only the null-backend rows run). Measure on an idle machine: the
//! load average is printed with the table.
//!
//! Run: `cargo bench -p devices --bench datapath [-- --rounds N] [--quick] [--frames N] [--only TEXT]`
//! (`--only` keeps the rows whose name, baseline included for the rx tap rows, contains TEXT;
//! `--only =NAME` the row of that name).

use std::io;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use devices::backend::{
    BatchRing, NetBackend, NullBackend, Offloads, Tap, MAX_RX_BATCH, MAX_TX_BATCH,
};
use devices::iovec::IovecList;
use devices::test_utils::link::{link_up, PacketSocket};
use devices::test_utils::packed::{advance, GuestPackedQueue};
use devices::test_utils::queue::{GuestQueue, NEXT, WRITE};
use devices::virtio::net::metrics::{RxCounters, TxCounters};
use devices::virtio::net::rx::{RX_GATHER_BYTES, RX_GATHER_NO_GSO_BYTES};
use devices::virtio::net::{
    BucketConfig, RateLimiterConfig, RxMode, RxQueue, TxQueue, VNET_HDR_LEN,
};
use devices::virtio::packed::{PackedLayout, PackedVirtqueue, EVENT_FLAG_DESC, EVENT_WRAP_BIT};
use devices::virtio::ring::AnyRing;
use devices::virtio::vring::Virtqueue;
use std::os::fd::AsRawFd;
use virtio_bindings::virtio_config::VIRTIO_F_IN_ORDER;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
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

/// A buffer of a chain as the bench's drivers make it available: guest address, length and
/// flags (`WRITE` or 0; the drivers add `NEXT` where the chain goes on).
type Buf = (u64, u32, u16);

/// Guest memory for one bench queue (one 32 MiB region from guest address 0, its first 8 MiB,
/// rings and buffers, faulted in as a running guest's memory is) and the host address of
/// guest address 0.
fn bench_memory() -> (GuestMemoryMmap, *mut u8) {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x200_0000)]).expect("memory");
    mem.write_slice(&vec![0u8; 0x80_0000], GuestAddress(0))
        .expect("prefault");
    let host = mem
        .iter()
        .next()
        .expect("a region")
        .get_host_address(MemoryRegionAddress(0))
        .expect("in memory");
    (mem, host)
}

/// The tx chains of a ring of `size` descriptors: `size / descs` chains of `descs` buffers
/// (1: header + frame together; 2: header, then frame), chain `c`'s frame written into `mem`
/// at `BUFS_AT + c·2048`.
fn tx_chains(mem: &GuestMemoryMmap, size: u16, descs: u16, frame: &[u8]) -> Vec<Vec<Buf>> {
    (0..size / descs)
        .map(|c| {
            let buf = BUFS_AT + u64::from(c) * 2048;
            mem.write_slice(frame, GuestAddress(buf)).expect("frame");
            let (len, hdr) = (frame.len() as u32, VNET_HDR_LEN as u32);
            if descs == 1 {
                vec![(buf, len, 0)]
            } else {
                vec![(buf, hdr, 0), (buf + u64::from(hdr), len - hdr, 0)]
            }
        })
        .collect()
}

/// The rx chains of a ring of `size` descriptors: one device-writable 2 KiB buffer each.
fn rx_chains(size: u16) -> Vec<Vec<Buf>> {
    (0..size)
        .map(|i| {
            vec![(
                BUFS_AT + u64::from(i) * u64::from(RX_BUF_LEN),
                RX_BUF_LEN,
                WRITE,
            )]
        })
        .collect()
}

/// What the timed loops ask of the bench's driver side, over a split ring ([`Driver`]) or a
/// packed one ([`PackedDriver`]).
trait BenchDriver {
    /// The device's view of the ring (`in_order`: VIRTIO_F_IN_ORDER negotiated).
    fn ring(&self, in_order: bool) -> AnyRing;

    /// Makes the next `n` chains available (tx).
    fn publish(&mut self, n: usize);

    /// Posts every buffer once (rx: a full ring).
    fn fill(&mut self);

    /// Re-posts every buffer the device returned (rx: keeps the ring full); returns how many.
    fn repost_used(&mut self) -> usize;
}

/// The device's tx queue over `d`'s ring, with IN_ORDER or not.
fn tx_queue(d: &impl BenchDriver, in_order: bool) -> TxQueue {
    let mut txq = TxQueue::new(d.ring(in_order));
    txq.set_in_order(in_order);
    txq
}

/// `d` with every buffer posted (a full ring) and the device's rx queue over it, set up as the
/// worker sets it (sparse reads on: it polls the backend level-triggered).
fn rx_full<D: BenchDriver>(mut d: D, mode: RxMode, gather: u64) -> (D, RxQueue) {
    d.fill();
    let mut rxq = RxQueue::new(d.ring(false), mode, gather);
    rxq.set_sparse_reads(true);
    (d, rxq)
}

/// The driver side of one split queue in guest memory: fixed chains, made available in turn.
///
/// The avail ring is written as a guest driver writes it: a store per entry and a release
/// store of the index, through a host pointer resolved once ([`GuestQueue::push_avail`],
/// [`GuestQueue::publish_avail`]; vm-memory's generic per-access path would cost ~30 ns per
/// call at one frame per call, which the tx rows would charge to the device).
struct Driver {
    q: GuestQueue,
    /// Host address of guest address 0 of `q`'s memory.
    host: *mut u8,
    /// Chain heads, in the order they are made available.
    heads: Vec<u16>,
    next_head: usize,
    used_seen: u16,
}

impl Driver {
    /// A queue of `size` entries holding the chains `chains` builds in its memory.
    fn new(size: u16, chains: impl FnOnce(&GuestMemoryMmap) -> Vec<Vec<Buf>>) -> Driver {
        let (mem, host) = bench_memory();
        let mut q = GuestQueue::with_rings(&mem, size, (DESC_AT, AVAIL_AT, USED_AT), BUFS_AT);
        let heads = chains(&mem).iter().map(|c| q.write_chain(c)).collect();
        Driver {
            q,
            host,
            heads,
            next_head: 0,
            used_seen: 0,
        }
    }

    /// Host address of the avail ring.
    fn avail(&self) -> *mut u8 {
        self.host.wrapping_add(AVAIL_AT as usize)
    }

    fn mem(&self) -> &GuestMemoryMmap {
        self.q.mem()
    }

    /// Tx chains of `descs` descriptors ([`tx_chains`]).
    fn tx(size: u16, descs: u16, frame: &[u8]) -> Driver {
        Driver::new(size, |mem| tx_chains(mem, size, descs, frame))
    }

    /// Rx: one device-writable 2 KiB buffer per descriptor.
    fn rx(size: u16) -> Driver {
        Driver::new(size, |_| rx_chains(size))
    }

    fn queue(&self) -> Queue {
        let mut q = self.q.queue();
        q.set_event_idx(true);
        q
    }

    /// Makes `heads` available.
    fn publish_heads(&mut self, heads: &[u16]) {
        for &head in heads {
            self.q.push_avail(head);
        }
        self.q.publish_avail();
    }
}

impl BenchDriver for Driver {
    /// The split ring (IN_ORDER is the tx queue's alone: [`TxQueue::set_in_order`]).
    fn ring(&self, _in_order: bool) -> AnyRing {
        Virtqueue::new(&self.queue(), self.mem())
            .expect("ring")
            .into()
    }

    fn publish(&mut self, n: usize) {
        for _ in 0..n {
            let head = self.heads[self.next_head];
            self.next_head = (self.next_head + 1) % self.heads.len();
            self.q.push_avail(head);
        }
        self.q.publish_avail();
    }

    fn fill(&mut self) {
        let heads = self.heads.clone();
        self.publish_heads(&heads);
    }

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

/// The driver side of one packed queue in guest memory, laid out by [`GuestPackedQueue`] at
/// [`Driver`]'s addresses (the descriptor ring at `DESC_AT`, the driver event area at
/// `AVAIL_AT`, the device's at `USED_AT`): the same fixed chains, chain `c` with buffer id `c`,
/// made available in turn.
///
/// The ring is written as a guest driver writes it, through a host pointer resolved once
/// ([`GuestPackedQueue::write_at`]): each chain's descriptors in place from the avail position,
/// with the AVAIL/USED bits of the driver's wrap counter (flipped at each wrap), the first
/// descriptor's flags last with a release store. Before writing, it takes back what the device
/// returned, reading used descriptors from its used position
/// ([`GuestPackedQueue::used_id_at`]; under IN_ORDER one returns every chain up to its id), as
/// a packed driver must before it reuses their slots. Its positions stay in registers while it
/// works (`PackedDriver::push_next`, `PackedDriver::reclaim`), as a driver's do.
struct PackedDriver {
    q: GuestPackedQueue,
    size: u16,
    /// Where the next chain goes: (offset, the driver's wrap counter).
    avail: (u16, bool),
    /// Where the next used descriptor is expected: (offset, the used wrap counter).
    used: (u16, bool),
    /// Every chain's buffers, `per_chain` a chain (chain `c`'s from `c·per_chain`).
    bufs: Vec<Buf>,
    per_chain: u16,
    chains: u16,
    next_chain: u16,
    /// Chains made available and not returned: the `outstanding` chains before `next_chain`.
    outstanding: u16,
}

impl PackedDriver {
    /// A queue of `size` descriptors holding the chains `chains` builds in its memory (all of
    /// one length).
    fn new(size: u16, chains: impl FnOnce(&GuestMemoryMmap) -> Vec<Vec<Buf>>) -> PackedDriver {
        let (mem, _) = bench_memory();
        let layout = PackedLayout {
            size,
            desc: DESC_AT,
            driver_event: AVAIL_AT,
            device_event: USED_AT,
        };
        let q = GuestPackedQueue::with_layout(&mem, layout);
        // EVENT_IDX, an interrupt asked for at the start position (as the split driver's
        // `used_event` stays 0).
        q.set_driver_event(EVENT_WRAP_BIT, EVENT_FLAG_DESC);
        let chains = chains(&mem);
        let per_chain = chains[0].len() as u16;
        assert!(chains.iter().all(|c| c.len() == usize::from(per_chain)));
        PackedDriver {
            q,
            size,
            avail: (0, true),
            used: (0, true),
            per_chain,
            chains: chains.len() as u16,
            bufs: chains.concat(),
            next_chain: 0,
            outstanding: 0,
        }
    }

    /// Tx chains of `descs` descriptors ([`tx_chains`]).
    fn tx(size: u16, descs: u16, frame: &[u8]) -> PackedDriver {
        PackedDriver::new(size, |mem| tx_chains(mem, size, descs, frame))
    }

    /// Rx: one device-writable 2 KiB buffer per descriptor.
    fn rx(size: u16) -> PackedDriver {
        PackedDriver::new(size, |_| rx_chains(size))
    }

    /// Makes the next `n` chains available: each written from the avail position, its head's
    /// flags stored last (release).
    fn push_next(&mut self, n: usize) {
        let (size, per) = (self.size, usize::from(self.per_chain));
        let total = usize::from(self.outstanding) + n;
        // The slots are free: at most `size` descriptors are out, and the device returned the
        // others (`reclaim`).
        assert!(total * per <= usize::from(size), "packed ring full");
        let (mut at, mut c) = (self.avail, self.next_chain);
        for _ in 0..n {
            let bufs = &self.bufs[usize::from(c) * per..][..per];
            let descs = bufs.iter().enumerate().map(|(i, &(addr, len, flags))| {
                let next = if i + 1 < per { NEXT } else { 0 };
                (addr, len, c, flags | next)
            });
            at = self.q.write_at(at, descs);
            c = if c + 1 == self.chains { 0 } else { c + 1 };
        }
        (self.avail, self.next_chain) = (at, c);
        self.outstanding = total as u16;
    }

    /// Takes back the chains the device returned: the used descriptors from the used position
    /// (flags with acquire, then the id), each returning every outstanding chain up to its id
    /// (one, unless IN_ORDER batched them). Returns how many chains.
    fn reclaim(&mut self) -> usize {
        let (size, chains) = (self.size, self.chains);
        let (mut used, mut left) = (self.used, self.outstanding);
        let mut oldest = (self.next_chain + chains - left) % chains;
        while left > 0 {
            let Some(id) = self.q.used_id_at(used) else {
                break;
            };
            // Chains up to `id`: one, unless IN_ORDER batched them. One is a branch (predicted)
            // around a call, so the next used position does not wait for the load of `id`.
            let back = if id == oldest {
                1
            } else {
                in_order_batch(id, oldest, chains, left)
            };
            used = advance(used, back * self.per_chain, size);
            oldest += back;
            if oldest >= chains {
                oldest -= chains;
            }
            left -= back;
        }
        let n = self.outstanding - left;
        (self.used, self.outstanding) = (used, left);
        usize::from(n)
    }
}

/// How many chains a used descriptor with buffer id `id` returns under IN_ORDER: the
/// outstanding ones (`left` of them, of `chains` made available in turn) from `oldest` up to
/// `id`.
#[cold]
#[inline(never)]
fn in_order_batch(id: u16, oldest: u16, chains: u16, left: u16) -> u16 {
    let back = if id >= oldest {
        id - oldest
    } else {
        id + chains - oldest
    } + 1;
    assert!(back <= left, "used id {id} not outstanding");
    back
}

impl BenchDriver for PackedDriver {
    /// The packed ring, EVENT_IDX negotiated.
    fn ring(&self, in_order: bool) -> AnyRing {
        let features = 1 << VIRTIO_RING_F_EVENT_IDX | u64::from(in_order) << VIRTIO_F_IN_ORDER;
        PackedVirtqueue::new(self.q.mem(), &self.q.layout(), features)
            .expect("packed ring")
            .into()
    }

    fn publish(&mut self, n: usize) {
        self.reclaim();
        self.push_next(n);
    }

    fn fill(&mut self) {
        self.push_next(usize::from(self.chains));
    }

    fn repost_used(&mut self) -> usize {
        let n = self.reclaim();
        self.push_next(n);
        n
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

/// Lists of a frame split as the chains split it (1: one iovec; 2: the header, then the
/// frame), one per buffer of `bufs`, each holding the frame's `len` bytes at its start.
fn frame_lists<'a>(
    bufs: impl Iterator<Item = &'a mut [u8]>,
    len: usize,
    descs: u16,
) -> Vec<IovecList<'a>> {
    bufs.map(|buf| {
        let buf = &mut buf[..len];
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
    .collect()
}

/// `n` buffers of `stride` bytes from guest address `BUFS_AT` of `d`'s memory: where the tx
/// chains' frames and the rx chains' buffers are.
fn guest_bufs(d: &Driver, n: usize, stride: usize) -> impl Iterator<Item = &mut [u8]> {
    let host = d.host;
    (0..n).map(move |i| {
        let at = BUFS_AT as usize + i * stride;
        // SAFETY: `host` is the host address of guest address 0 of `d`'s one region (32 MiB,
        // mapped while `d` lives, which the slice's lifetime is tied to); buffer `i` lies at
        // BUFS_AT + i·stride, inside it (n·stride ≤ 1 MiB here). The bench's bare loops hand
        // these bytes only to the kernel (writev reads them, readv writes them), on this thread,
        // never while a device call on the same buffers runs.
        unsafe { std::slice::from_raw_parts_mut(host.wrapping_add(at), stride) }
    })
}

/// Runs `txq` until the `batch` frames just published are sent (or a call sends none).
#[inline(always)]
fn send_published<B: NetBackend>(
    txq: &mut TxQueue,
    backend: &mut B,
    counters: &mut TxCounters,
    batch: usize,
) {
    let mut left = batch as u64;
    while left > 0 {
        let before = counters.frames;
        txq.process(backend, counters).expect("ring ok");
        left -= counters.frames - before;
        if counters.frames == before {
            break;
        }
    }
}

/// What a tx row times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Timed {
    /// Whole iterations, the driver's publishing included.
    Loop,
    /// The device's calls alone (the packed rows, whose two drivers do different work).
    DeviceCalls,
}

/// ns per frame of `iters` batches of `batch` frames sent through `txq`, timed as `timed` says.
fn run_tx<B: NetBackend>(
    d: &mut impl BenchDriver,
    txq: &mut TxQueue,
    backend: &mut B,
    (batch, frames): (usize, usize),
    timed: Timed,
) -> f64 {
    let mut counters = TxCounters::default();
    let iters = frames.div_ceil(batch);
    let mut calls = Duration::ZERO;
    let start = Instant::now();
    for _ in 0..iters {
        d.publish(batch);
        if timed == Timed::DeviceCalls {
            let call = Instant::now();
            send_published(txq, backend, &mut counters, batch);
            calls += call.elapsed();
        } else {
            send_published(txq, backend, &mut counters, batch);
        }
    }
    let ns = match timed {
        Timed::Loop => start.elapsed(),
        Timed::DeviceCalls => calls,
    };
    assert_eq!(counters.malformed_chains + counters.backend_errors, 0);
    if timed == Timed::DeviceCalls {
        // The null backend takes every frame: the calls timed are the frames counted.
        assert_eq!(counters.frames, (iters * batch) as u64, "every frame sent");
    }
    ns.as_nanos() as f64 / (iters * batch) as f64
}

/// The least a split-ring device does for a one-frame tx call with EVENT_IDX, written out by
/// hand over [`Driver`]'s 1-descriptor chains with no checks at all (not a device: a floor to
/// read the device rows against): its state lives in memory and each call is out of line, as a
/// device's must be between two wake-ups.
struct Floor {
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    /// Host address of guest address 0.
    host: *mut u8,
    size: u16,
    next_avail: u16,
    next_used: u16,
    fd: libc::c_int,
}

impl Floor {
    /// Over `d`'s rings, from where the driver is (nothing pending, every used entry returned).
    fn new(d: &Driver, tap: &Tap) -> Floor {
        let host = d.host;
        Floor {
            desc: host.wrapping_add(DESC_AT as usize),
            avail: d.avail(),
            used: host.wrapping_add(USED_AT as usize),
            host,
            size: d.q.size(),
            next_avail: d.q.avail_idx(),
            next_used: d.q.used_idx(),
            fd: tap.as_raw_fd(),
        }
    }

    /// Pops the next avail head and reads its descriptor: (head, buffer's guest address,
    /// length), or `None` when the driver has published nothing more.
    #[inline(always)]
    fn pop(&mut self) -> Option<(usize, u64, u32)> {
        // SAFETY: the pointers are the host addresses of a live [`Driver`]'s rings (inside its
        // one 32 MiB region, which outlives `self` in the bench): a table of `size` 16-byte
        // descriptors and an avail ring of 6 + 2·size bytes, each suitably aligned; the slot
        // is masked and heads are the bench's own (< size). The driver side runs on this thread
        // between calls.
        unsafe {
            let idx = AtomicU16::from_ptr(self.avail.add(2).cast()).load(Ordering::Acquire);
            if idx == self.next_avail {
                return None;
            }
            let slot = usize::from(self.next_avail & (self.size - 1));
            let head = usize::from(std::ptr::read_volatile(
                self.avail.add(4 + 2 * slot).cast::<u16>(),
            ));
            self.next_avail = self.next_avail.wrapping_add(1);
            let dp = self.desc.add(16 * head);
            let addr = std::ptr::read_volatile(dp.cast::<u64>());
            let len = std::ptr::read_volatile(dp.add(8).cast::<u32>());
            Some((head, addr, len))
        }
    }

    /// Writes used element (`head`, `len`) and stores the used index; returns the index before.
    #[inline(always)]
    fn add_used(&mut self, head: usize, len: u32) -> u16 {
        // SAFETY: the used ring is 6 + 8·size bytes, 4-aligned, inside the region (see `pop`);
        // the slot is masked.
        unsafe {
            let elem = self
                .used
                .add(4 + 8 * usize::from(self.next_used & (self.size - 1)))
                .cast::<u32>();
            std::ptr::write_volatile(elem, head as u32);
            std::ptr::write_volatile(elem.add(1), len);
            let old = self.next_used;
            self.next_used = old.wrapping_add(1);
            AtomicU16::from_ptr(self.used.add(2).cast()).store(self.next_used, Ordering::Release);
            old
        }
    }

    /// The interrupt decision after a fence: `vring_need_event(used_event, new, old)`.
    #[inline(always)]
    fn needs_interrupt(&self, old: u16) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        let at = 4 + 2 * usize::from(self.size);
        // SAFETY: `used_event` is the u16 after the avail ring's entries (see `pop`).
        let event =
            unsafe { AtomicU16::from_ptr(self.avail.add(at).cast()) }.load(Ordering::Relaxed);
        self.next_used.wrapping_sub(event).wrapping_sub(1) < self.next_used.wrapping_sub(old)
    }

    /// One call: load the avail index, the entry and the descriptor, `write` the frame,
    /// write the used element and store the used index, store `avail_event`, fence, re-load
    /// the avail index and load `used_event` (the interrupt decision). Returns whether it sent.
    #[inline(never)]
    fn call(&mut self) -> bool {
        let Some((head, addr, len)) = self.pop() else {
            return false;
        };
        // SAFETY: the descriptor's buffer lies inside the region (the bench wrote it); write
        // keeps no pointer after returning.
        let n = unsafe { libc::write(self.fd, self.host.add(addr as usize).cast(), len as usize) };
        assert_eq!(n, len as isize, "write");
        let old = self.add_used(head, 0);
        let at = 4 + 8 * usize::from(self.size);
        // SAFETY: `avail_event` is the u16 after the used ring's elements (see `add_used`).
        unsafe { AtomicU16::from_ptr(self.used.add(at).cast()) }
            .store(self.next_avail, Ordering::Relaxed);
        let raise = self.needs_interrupt(old);
        // SAFETY: the avail index, as in `pop`.
        let again =
            unsafe { AtomicU16::from_ptr(self.avail.add(2).cast()) }.load(Ordering::Acquire);
        std::hint::black_box((again, raise));
        true
    }

    /// One rx call over `d`'s posted 1-descriptor buffers (2 KiB each): load the avail index,
    /// the entry and the descriptor, `readv` a frame into the buffer (and a guard byte, as the
    /// tap does), set `num_buffers`, write the used element and store the used index, fence,
    /// load `used_event` (the interrupt decision). Returns whether a frame was read.
    #[inline(never)]
    fn receive(&mut self, guard: &mut [u8; 1]) -> bool {
        let Some((head, addr, len)) = self.pop() else {
            return false;
        };
        // SAFETY: the buffer is one of the driver's 2 KiB rx buffers inside the region, which
        // nothing else touches during the call; readv keeps no pointer after returning.
        let n = unsafe {
            let buf = self.host.add(addr as usize);
            let iov = [
                libc::iovec {
                    iov_base: buf.cast(),
                    iov_len: len as usize,
                },
                libc::iovec {
                    iov_base: guard.as_mut_ptr().cast(),
                    iov_len: 1,
                },
            ];
            let n = libc::readv(self.fd, iov.as_ptr(), 2);
            assert!(n > VNET_HDR_LEN as isize && n <= len as isize, "readv");
            std::ptr::write_volatile(buf.add(10).cast::<[u8; 2]>(), 1u16.to_le_bytes());
            n
        };
        let old = self.add_used(head, n as u32);
        std::hint::black_box(self.needs_interrupt(old));
        true
    }
}

/// ns per frame of one-frame [`Floor::receive`] calls (timed per call; one frame injected
/// before each, the buffer re-posted after it), as [`run_rx`] times the device.
fn run_rx_floor(
    rig: &TapRig,
    d: &mut Driver,
    floor: &mut Floor,
    wire: &[u8],
    frames: usize,
) -> f64 {
    let mut guard = [0u8; 1];
    let mut timed = Duration::ZERO;
    for _ in 0..frames {
        inject(&rig.inject, &wire[VNET_HDR_LEN..], 1);
        let start = Instant::now();
        let got = floor.receive(&mut guard);
        timed += start.elapsed();
        assert!(got, "a buffer was posted");
        d.repost_used();
    }
    timed.as_nanos() as f64 / frames as f64
}

/// ns per frame of one-frame [`Floor`] calls, the driver publishing each frame first.
fn run_floor(d: &mut Driver, floor: &mut Floor, frames: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..frames {
        d.publish(1);
        assert!(floor.call(), "a frame was queued");
    }
    start.elapsed().as_nanos() as f64 / frames as f64
}

/// ns per frame of `frames` `writev`s, from `lists` in turn (a bare `writev` whatever the
/// segments, the baseline the device rows are read against).
fn writev_loop(backend: &mut Tap, lists: &[IovecList<'_>], frames: usize) -> f64 {
    let fd = backend.as_raw_fd();
    let start = Instant::now();
    for i in 0..frames {
        let raw = lists[i % lists.len()].as_iovecs().as_raw();
        // SAFETY: the iovecs point to buffers the lists borrow, valid for reads; writev keeps
        // no pointer after returning.
        let n = unsafe { libc::writev(fd, raw.as_ptr(), raw.len() as libc::c_int) };
        assert!(n > 0, "writev: {}", io::Error::last_os_error());
    }
    start.elapsed().as_nanos() as f64 / frames as f64
}

/// ns per frame of `frames` `write`s of single-segment frames, from `lists` in turn.
fn write_loop(backend: &mut Tap, lists: &[IovecList<'_>], frames: usize) -> f64 {
    let fd = backend.as_raw_fd();
    let start = Instant::now();
    for i in 0..frames {
        let [one] = lists[i % lists.len()].as_iovecs().as_raw() else {
            panic!("one segment per frame");
        };
        // SAFETY: the iovec points to a buffer the list borrows, valid for reads; write keeps
        // no pointer after returning.
        let n = unsafe { libc::write(fd, one.iov_base, one.iov_len) };
        assert!(n > 0, "write: {}", io::Error::last_os_error());
    }
    start.elapsed().as_nanos() as f64 / frames as f64
}

/// Bare `write`s of frames that another thread, on the other CPU, wrote just before, as a
/// guest's vCPU writes the frames a device then sends: 256 slots of 2 KiB in a ring, the
/// producer filling slot `i % 256` (the frame copied in, as a copy-transmit driver does) once
/// the consumer has sent frame `i - 256`, the consumer (this thread, timed) sending frame `i`
/// once it is published. No virtio: what the frame data's trip between the cores costs a
/// sender, against [`write_loop`] from the same 256 slots written once.
struct CrossCore {
    slots: Vec<u8>,
    frame: Vec<u8>,
}

impl CrossCore {
    const SLOTS: usize = 256;
    const SLOT: usize = 2048;

    fn new(frame: &[u8]) -> CrossCore {
        let mut slots = vec![0u8; Self::SLOTS * Self::SLOT];
        for slot in slots.chunks_mut(Self::SLOT) {
            slot[..frame.len()].copy_from_slice(frame);
        }
        CrossCore {
            slots,
            frame: frame.to_vec(),
        }
    }

    /// ns per frame of `frames` writes, the frames written by another thread (`fresh`) or not;
    /// with `ahead` > 0 the frame that many places ahead is prefetched before each write.
    /// Each side reads the other's counter only when it has caught up with what it last read
    /// (as a device reads the avail index once per batch), the consumer publishes its counter
    /// every 32 frames (as a device publishes used entries), and the counters have a cache
    /// line each: what remains is the frame data's trip.
    fn run(&mut self, tap: &Tap, frames: usize, fresh: bool, ahead: usize) -> f64 {
        #[repr(align(128))]
        struct Counter(std::sync::atomic::AtomicUsize);
        let fd = tap.as_raw_fd();
        let len = self.frame.len();
        let base = self.slots.as_mut_ptr() as usize;
        let produced = Counter(if fresh { 0 } else { frames }.into());
        let consumed = Counter(0.into());
        let frame = &self.frame;
        std::thread::scope(|scope| {
            if fresh {
                scope.spawn(|| {
                    pin_to_other_cpu();
                    let mut room = Self::SLOTS;
                    for i in 0..frames {
                        while i >= room {
                            room = consumed.0.load(Ordering::Acquire) + Self::SLOTS;
                            std::hint::spin_loop();
                        }
                        let at = base + (i % Self::SLOTS) * Self::SLOT;
                        // SAFETY: slot `i % SLOTS` lies inside `slots` (SLOTS · SLOT bytes),
                        // which outlives the scope; the consumer sent what it held (frame
                        // `i - SLOTS`) and reads it again only after the release store below.
                        unsafe {
                            std::ptr::copy_nonoverlapping(frame.as_ptr(), at as *mut u8, len)
                        };
                        produced.0.store(i + 1, Ordering::Release);
                    }
                });
            }
            // Timed from full slots, as in the steady state (the producer outruns the
            // consumer): the thread's start is not the sender's cost.
            while produced.0.load(Ordering::Acquire) < Self::SLOTS.min(frames) {
                std::hint::spin_loop();
            }
            let start = Instant::now();
            let mut ready = 0;
            for i in 0..frames {
                while i >= ready {
                    ready = produced.0.load(Ordering::Acquire);
                    std::hint::spin_loop();
                }
                let at = base + (i % Self::SLOTS) * Self::SLOT;
                if ahead > 0 && i + ahead < ready {
                    let next = (base + ((i + ahead) % Self::SLOTS) * Self::SLOT) as *const i8;
                    // SAFETY: PREFETCHT0 is a hint: it neither faults nor changes memory.
                    unsafe {
                        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                        _mm_prefetch::<_MM_HINT_T0>(next);
                        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(len - 1));
                    }
                }
                // SAFETY: the slot lies inside `slots`, published by the producer (acquire
                // above) and not rewritten before the release store below; write keeps no
                // pointer after returning.
                let n = unsafe { libc::write(fd, at as *const libc::c_void, len) };
                assert_eq!(n, len as isize, "write: {}", io::Error::last_os_error());
                if (i + 1) % 32 == 0 || i + 1 == frames {
                    consumed.0.store(i + 1, Ordering::Release);
                }
            }
            start.elapsed().as_nanos() as f64 / frames as f64
        })
    }
}

/// What sends the frames of [`run_tx_remote`]: the device, or the split ring's floor.
enum Sender<'a> {
    Device(&'a mut TxQueue, &'a mut Tap),
    Floor(&'a mut Floor),
}

/// ns per frame of `frames` frames sent by `sender` while a driver on the other CPU makes them
/// available, as a guest's vCPU does, at most `lead` frames ahead of what the device returned:
/// for each frame it writes the next chain's descriptor, copies the frame into its buffer,
/// writes the avail entry and stores the avail index (release); when it has caught up with what
/// it last read of the used index, it reads the index again and the used elements it covers.
/// No kicks and no interrupts: the sender polls. What a VM's worker pays for the frames' and the
/// rings' trips between the cores, with the device's own work, against [`CrossCore`] (the
/// same trip for the frame data alone) or a hot bare loop.
fn run_tx_remote(
    d: &mut Driver,
    sender: Sender<'_>,
    frame: &[u8],
    frames: usize,
    lead: usize,
) -> f64 {
    #[derive(Clone, Copy)]
    struct Ring {
        avail: usize,
        used: usize,
        host: usize,
    }
    let host = d.host;
    let ring = Ring {
        avail: d.avail() as usize,
        used: host.wrapping_add(USED_AT as usize) as usize,
        host: host as usize,
    };
    let (size, chains) = (d.q.size(), d.heads.len());
    let lead = lead.min(chains);
    let (heads, first_head, first_avail) = (&d.heads, d.next_head, d.q.avail_idx());
    let used_start = d.q.used_idx();
    let len = frame.len();
    let ns = std::thread::scope(|scope| {
        scope.spawn(move || {
            pin_to_other_cpu();
            let ring = ring;
            // SAFETY: `used` is the host address of the used ring's 2-aligned index inside the
            // driver's mapped region, which outlives the scope; guest memory is plain shared
            // memory, valid for atomic access.
            let used_idx = unsafe { AtomicU16::from_ptr((ring.used + 2) as *mut u16) };
            // SAFETY: as above, the avail ring's index.
            let avail_idx = unsafe { AtomicU16::from_ptr((ring.avail + 2) as *mut u16) };
            let mut returned = 0usize;
            let mut avail = first_avail;
            for i in 0..frames {
                while i >= returned + lead {
                    let idx = used_idx.load(Ordering::Acquire);
                    let now = usize::from(idx.wrapping_sub(used_start));
                    for k in returned..now {
                        let slot = usize::from(used_start.wrapping_add(k as u16) % size);
                        // SAFETY: used element `slot < size` of the used ring (6 + 8·size
                        // bytes, 4-aligned, inside the region), published before the index
                        // loaded with acquire above.
                        let elem = unsafe {
                            std::ptr::read_volatile((ring.used + 4 + 8 * slot) as *const u64)
                        };
                        std::hint::black_box(elem);
                    }
                    returned = now;
                    std::hint::spin_loop();
                }
                let chain = (first_head + i) % chains;
                let head = heads[chain];
                let buf = BUFS_AT as usize + chain * 2048;
                let desc = ring.host + DESC_AT as usize + 16 * usize::from(head);
                let slot = ring.avail + 4 + 2 * usize::from(avail % size);
                // SAFETY: the chain's descriptor, its 2 KiB buffer and the avail slot lie
                // inside the region (see `Driver::tx`, `GuestQueue::push_avail`); the sender
                // returned this chain (acquire above) and reads it again only after the release
                // store below.
                unsafe {
                    std::ptr::write_volatile(desc as *mut u64, (buf as u64).to_le());
                    std::ptr::write_volatile((desc + 8) as *mut u32, (len as u32).to_le());
                    std::ptr::write_volatile((desc + 12) as *mut u32, 0);
                    std::ptr::copy_nonoverlapping(
                        frame.as_ptr(),
                        (ring.host + buf) as *mut u8,
                        len,
                    );
                    std::ptr::write_volatile(slot as *mut u16, head.to_le());
                }
                avail = avail.wrapping_add(1);
                avail_idx.store(avail.to_le(), Ordering::Release);
            }
        });
        // Timed from a full ring, as it is in the steady state (the driver outruns the
        // sender): the thread's start is not the sender's cost.
        // SAFETY: the avail ring's index, as in the driver thread.
        let avail_idx = unsafe { AtomicU16::from_ptr((ring.avail + 2) as *mut u16) };
        while usize::from(avail_idx.load(Ordering::Acquire).wrapping_sub(first_avail))
            < lead.min(frames)
        {
            std::hint::spin_loop();
        }
        let start = Instant::now();
        match sender {
            Sender::Device(txq, tap) => {
                let mut counters = TxCounters::default();
                while (counters.frames as usize) < frames {
                    txq.process(tap, &mut counters).expect("ring ok");
                }
                assert_eq!(counters.malformed_chains + counters.backend_errors, 0);
            }
            Sender::Floor(floor) => {
                let mut sent = 0;
                while sent < frames {
                    sent += usize::from(floor.call());
                }
            }
        }
        start.elapsed().as_nanos() as f64 / frames as f64
    });
    d.next_head = (first_head + frames) % chains;
    d.q.set_avail_idx(first_avail.wrapping_add(frames as u16));
    ns
}

/// Runs `f` while a thread on the other CPU spins on a flag of its own cache line (shares
/// nothing with `f`, as a vCPU running guest code shares nothing with a device between frames).
fn beside_a_busy_cpu<R>(f: impl FnOnce() -> R) -> R {
    #[repr(align(128))]
    struct Flag(std::sync::atomic::AtomicBool);
    let stop = Flag(false.into());
    let started = Flag(false.into());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            pin_to_other_cpu();
            started.0.store(true, Ordering::Release);
            while !stop.0.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        while !started.0.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        let r = f();
        stop.0.store(true, Ordering::Relaxed);
        r
    })
}

/// Pins the calling thread to an online CPU other than the main thread's, if there is one.
fn pin_to_other_cpu() {
    let main = MAIN_CPU.load(Ordering::Relaxed);
    // SAFETY: sysconf has no preconditions; a zeroed cpu_set_t is an empty set, and the CPU_*
    // helpers and sched_setaffinity only read and write the set passed, whose size is given.
    unsafe {
        let online = usize::try_from(libc::sysconf(libc::_SC_NPROCESSORS_ONLN)).unwrap_or(1);
        let Some(cpu) = (0..online).find(|&c| c != main) else {
            return;
        };
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one);
    }
}

/// Pins the bench's thread to the CPU it runs on (the rows that use a second thread put it on
/// another CPU), and records which.
fn pin_main_thread() {
    // SAFETY: sched_getcpu has no preconditions; a zeroed cpu_set_t is an empty set, and the
    // CPU_* helpers and sched_setaffinity only read and write the set passed, whose size is
    // given.
    unsafe {
        let Ok(cpu) = usize::try_from(libc::sched_getcpu()) else {
            return;
        };
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) == 0 {
            MAIN_CPU.store(cpu, Ordering::Relaxed);
        }
    }
}

/// The CPU the bench's main thread is pinned to (set in `main`).
static MAIN_CPU: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A bare loop of io_uring batches: `batch` `writev`s per `io_uring_enter` ([`BatchRing`] on
/// the tap's fd), from 256 rotating heap copies of the frame split as the chains are.
struct UringWrites {
    ring: BatchRing,
    /// Owns the bytes `lists` points to (heap buffers: they stay put when this moves).
    _bufs: Vec<Vec<u8>>,
    lists: Vec<(Vec<libc::iovec>, Vec<usize>)>,
    results: Vec<io::Result<usize>>,
}

impl UringWrites {
    fn new(tap: &Tap, frame: &[u8], descs: u16, batch: usize) -> UringWrites {
        let mut bufs: Vec<Vec<u8>> = (0..256).map(|_| frame.to_vec()).collect();
        let mut lists = Vec::new();
        for chunk in bufs.chunks_mut(batch) {
            let framed = frame_lists(chunk.iter_mut().map(Vec::as_mut_slice), frame.len(), descs);
            let mut iovs = Vec::new();
            let mut ends = Vec::new();
            for list in &framed {
                iovs.extend_from_slice(list.as_iovecs().as_raw());
                ends.push(iovs.len());
            }
            lists.push((iovs, ends));
        }
        UringWrites {
            ring: BatchRing::new(tap.as_raw_fd()).expect("io_uring"),
            _bufs: bufs,
            lists,
            results: (0..batch).map(|_| Ok(0)).collect(),
        }
    }

    /// ns per frame of batches covering at least `frames` frames.
    fn run(&mut self, frames: usize) -> f64 {
        let start = Instant::now();
        let mut sent = 0;
        let mut i = 0;
        while sent < frames {
            let (iovs, ends) = &self.lists[i % self.lists.len()];
            i += 1;
            // SAFETY: the iovecs point into `self._bufs`, alive and unmoved while `self` lives
            // and only read meanwhile.
            unsafe { self.ring.write(iovs, ends, &mut self.results) }.expect("ring");
            assert!(
                self.results[..ends.len()].iter().all(|r| r.is_ok()),
                "batched write"
            );
            sent += ends.len();
        }
        start.elapsed().as_nanos() as f64 / sent as f64
    }
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
    d: &mut impl BenchDriver,
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

/// ns per frame of bare `readv` calls, each into one buffer of `lists` in turn, `batch` frames
/// per timed group, injected as the device rows' are. With `probe`, each group ends with the
/// `readv` that finds the tap empty (EAGAIN), as any device draining a tap must.
fn readv_loop(
    rig: &mut TapRig,
    lists: &[IovecList<'_>],
    frame: &[u8],
    batch: usize,
    frames: usize,
    probe: bool,
) -> f64 {
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

/// One 2 KiB list per buffer of `bufs`.
fn rx_lists<'a>(bufs: impl Iterator<Item = &'a mut [u8]>) -> Vec<IovecList<'a>> {
    bufs.map(|buf| {
        let mut list = IovecList::new();
        list.push_slice(&mut buf[..RX_BUF_LEN as usize])
            .expect("room");
        list
    })
    .collect()
}

/// A bare loop of io_uring read batches on the tap: `batch` frames injected, then one
/// [`BatchRing::read`] of `batch + 1` reads into 2 KiB host buffers (+ a guard byte each), the
/// last finding the tap empty: the batched form of [`readv_loop`] with `probe`.
struct UringReads {
    ring: BatchRing,
    /// Own the bytes `iovs` points to (heap buffers: they stay put when this moves).
    _bufs: Vec<Vec<u8>>,
    _guard: Box<[u8; 1]>,
    iovs: Vec<libc::iovec>,
    ends: Vec<usize>,
    results: Vec<io::Result<usize>>,
    batch: usize,
}

impl UringReads {
    fn new(tap: &Tap, batch: usize) -> UringReads {
        let reads = batch + 1;
        let mut bufs: Vec<Vec<u8>> = (0..reads).map(|_| vec![0u8; RX_BUF_LEN as usize]).collect();
        let mut guard = Box::new([0u8; 1]);
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
        UringReads {
            ring: BatchRing::with_reads(tap.as_raw_fd()).expect("io_uring"),
            _bufs: bufs,
            _guard: guard,
            iovs,
            ends,
            results: (0..reads).map(|_| Ok(0)).collect(),
            batch,
        }
    }

    /// ns per frame of `frames` frames read in batches.
    fn run(&mut self, rig: &TapRig, frame: &[u8], frames: usize) -> f64 {
        let batch = self.batch;
        let mut timed = Duration::ZERO;
        let iters = frames.div_ceil(batch);
        for _ in 0..iters {
            inject(&rig.inject, &frame[VNET_HDR_LEN..], batch);
            let start = Instant::now();
            // SAFETY: the iovecs point into `self._bufs` and `self._guard`, alive, unmoved and
            // otherwise unused while `self` lives.
            unsafe { self.ring.read(&self.iovs, &self.ends, &mut self.results) }.expect("ring");
            timed += start.elapsed();
            assert!(
                self.results[..batch].iter().all(|r| r.is_ok()),
                "batched read"
            );
            assert!(
                matches!(self.results[batch], Err(ref e) if e.kind() == io::ErrorKind::WouldBlock),
                "the last read finds the tap empty"
            );
        }
        timed.as_nanos() as f64 / (iters * batch) as f64
    }
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

/// `--only =NAME` keeps that row alone.
fn wanted(name: &str) -> bool {
    ONLY.get()
        .and_then(Option::as_deref)
        .is_none_or(|only| match only.strip_prefix('=') {
            Some(exact) => name == exact,
            None => name.contains(only),
        })
}

/// The `q`-quantile (0..=1) of `v`, nearest rank.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Runs `side(false)` (the baseline) and `side(true)` (the case) alternately: one warm-up
/// pair, discarded, then `rounds` pairs, the order swapped every round. Each side runs one
/// chunk of frames (milliseconds), so that a change in the machine's speed, which on a shared
/// host comes and goes over seconds, lands on both sides of a pair.
fn alternate(rounds: usize, mut side: impl FnMut(bool) -> f64) -> Vec<(f64, f64)> {
    side(false);
    side(true);
    (0..rounds)
        .map(|r| {
            if r % 2 == 0 {
                let base = side(false);
                (base, side(true))
            } else {
                let case = side(true);
                (side(false), case)
            }
        })
        .collect()
}

/// One row: the median baseline, the median case, the median per-pair difference and that
/// difference's quartiles, and the fastest case less the fastest baseline (`best`: on a shared
/// host, what the code costs when nothing else slows either side; noise only adds time).
fn report(name: &str, base: &str, pairs: &[(f64, f64)]) {
    let mut b: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let mut c: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let mut d: Vec<f64> = pairs.iter().map(|p| p.1 - p.0).collect();
    let (q1, q3) = (quantile(&mut d, 0.25), quantile(&mut d, 0.75));
    let best = quantile(&mut c, 0.0) - quantile(&mut b, 0.0);
    println!(
        "{name:<58} {base:<24} {:>6.0} {:>6.0} {:>+6.0}  {:>+5.0}..{:<+5.0} {best:>+6.0}",
        quantile(&mut b, 0.5),
        quantile(&mut c, 0.5),
        quantile(&mut d, 0.5),
        q1,
        q3
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
    let rounds = value("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 3 } else { 24 });
    let frames: usize = value("--frames")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1024 } else { 8192 });
    let only = value("--only").cloned();
    ONLY.set(only).expect("set once");
    pin_main_thread();
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# datapath bench: 64 B frames, {rounds} alternated rounds of {frames} frames a side \
         (rx: {}); loadavg {}",
        frames / 4,
        loadavg.trim()
    );
    println!(
        "{:<58} {:<24} {:>6} {:>6} {:>6}  over q1..q3   best",
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
            let mut d = Driver::tx(512, descs, &wire);
            let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
            let mut null = NullBackend::new(wire.len()).expect("null backend");
            let pairs = alternate(rounds, |case| {
                if case {
                    run_tx(&mut d, &mut txq, &mut null, (batch, frames), Timed::Loop)
                } else {
                    0.0
                }
            });
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
        let mut sides: Vec<(Driver, TxQueue)> = (0..2)
            .map(|limited| {
                let d = Driver::tx(512, 1, &wire);
                let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
                if limited == 1 {
                    txq.set_rate_limiter(&never_hit);
                }
                (d, txq)
            })
            .collect();
        let mut null = NullBackend::new(wire.len()).expect("null backend");
        let pairs = alternate(rounds, |case| {
            let (d, txq) = &mut sides[usize::from(case)];
            run_tx(d, txq, &mut null, (batch, frames), Timed::Loop)
        });
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
            let (mut d, mut rxq) = rx_full(Driver::rx(256), mode, gather);
            let mut null = NullBackend::new(wire.len()).expect("null backend");
            let pairs = alternate(rounds, |case| {
                if case {
                    run_rx(
                        &mut d,
                        &mut rxq,
                        &mut null,
                        |b, n| b.queue_rx(n as u64),
                        batch,
                        frames,
                    )
                } else {
                    timer_overhead(frames / batch) / batch as f64
                }
            });
            report(&name, "timer", &pairs);
        }
    }
    // The packed ring against the split one (each row's baseline), 256 frames per call: tx
    // with VIRTIO_F_IN_ORDER on both sides or on neither, rx without (the device returns each
    // rx chain with its own used entry either way).
    let mut null = NullBackend::new(wire.len()).expect("null backend");
    for descs in [1u16, 2] {
        for in_order in [false, true] {
            let order = if in_order { " in_order" } else { "" };
            let name = format!("tx null {descs}-desc batch 256 packed{order}");
            if !wanted(&name) {
                continue;
            }
            let mut split = Driver::tx(512, descs, &wire);
            let mut split_q = tx_queue(&split, in_order);
            let mut packed = PackedDriver::tx(512, descs, &wire);
            let mut packed_q = tx_queue(&packed, in_order);
            let pairs = alternate(rounds, |case| {
                if case {
                    run_tx(
                        &mut packed,
                        &mut packed_q,
                        &mut null,
                        (256, frames),
                        Timed::DeviceCalls,
                    )
                } else {
                    run_tx(
                        &mut split,
                        &mut split_q,
                        &mut null,
                        (256, frames),
                        Timed::DeviceCalls,
                    )
                }
            });
            report(&name, &format!("split{order}"), &pairs);
        }
    }
    for (mode, label) in [
        (RxMode::SingleChain, "mrg off"),
        (RxMode::Mergeable, "mrg on"),
    ] {
        let name = format!("rx null {label} batch 256 packed");
        if !wanted(&name) {
            continue;
        }
        let (mut split, mut split_q) = rx_full(Driver::rx(256), mode, RX_GATHER_NO_GSO_BYTES);
        let (mut packed, mut packed_q) =
            rx_full(PackedDriver::rx(256), mode, RX_GATHER_NO_GSO_BYTES);
        let feed = |b: &mut NullBackend, n: usize| b.queue_rx(n as u64);
        let pairs = alternate(rounds, |case| {
            if case {
                run_rx(&mut packed, &mut packed_q, &mut null, feed, 256, frames)
            } else {
                run_rx(&mut split, &mut split_q, &mut null, feed, 256, frames)
            }
        });
        report(&name, "split", &pairs);
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
    // default where the kernel has it), each against a bare writev loop from 256 heap copies
    // of the frame; and bare loops of io_uring batches, the floor of the batched path.
    let uring = rig.tap.set_tx_batching(true);
    if !uring {
        println!("# io_uring unavailable: the batched rows are skipped");
    }
    for descs in [1u16, 2] {
        let base_name = format!("writev {descs} iov");
        let mut heap: Vec<Vec<u8>> = (0..256).map(|_| wire.clone()).collect();
        let heap = frame_lists(heap.iter_mut().map(Vec::as_mut_slice), wire.len(), descs);
        let write_row = "tx tap: bare write (one segment, no iovec)";
        if descs == 1 && wanted(write_row) {
            let pairs = alternate(rounds, |case| {
                if case {
                    write_loop(&mut rig.tap, &heap, frames)
                } else {
                    writev_loop(&mut rig.tap, &heap, frames)
                }
            });
            report(write_row, &base_name, &pairs);
        }
        for (cross_row, ahead) in [
            (
                "tx tap: bare write, frames just written by the other CPU",
                0,
            ),
            ("tx tap: the same, each prefetched 4 frames ahead", 4),
        ] {
            if descs == 1 && wanted(cross_row) {
                let mut cross = CrossCore::new(&wire);
                let pairs = alternate(rounds, |fresh| cross.run(&rig.tap, frames, fresh, ahead));
                report(cross_row, "write, same 256 slots", &pairs);
            }
        }
        let busy_row = "tx tap: bare writev, the other CPU busy (shares nothing)";
        if descs == 1 && wanted(busy_row) {
            let pairs = alternate(rounds, |case| {
                if case {
                    beside_a_busy_cpu(|| writev_loop(&mut rig.tap, &heap, frames))
                } else {
                    writev_loop(&mut rig.tap, &heap, frames)
                }
            });
            report(busy_row, &base_name, &pairs);
        }
        // A driver on the other CPU, as in a VM: the device, batched and not, and the floor,
        // against the bare loop of frames the other CPU wrote and against the hot one; and the
        // batched device with a driver only 8 frames ahead (a driver as slow as the device).
        for (row, sender, lead) in [
            ("tx tap (writev) 1-desc, a driver on the other CPU", 0, 256),
            (
                "tx tap (io_uring) 1-desc, a driver on the other CPU",
                1,
                256,
            ),
            ("tx tap (io_uring) 1-desc, the same 8 frames ahead", 1, 8),
            ("tx tap: the floor, a driver on the other CPU", 2, 256),
        ] {
            if descs != 1 || (sender == 1 && !uring) || !wanted(row) {
                continue;
            }
            for (base, cross) in [
                ("write, other CPU's frames", true),
                (base_name.as_str(), false),
            ] {
                rig.tap.set_tx_batching(sender == 1);
                let mut d = Driver::tx(256, 1, &wire);
                let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
                let mut floor = Floor::new(&d, &rig.tap);
                let mut bare = CrossCore::new(&wire);
                let pairs = alternate(rounds, |case| match (case, cross) {
                    (true, _) => {
                        let s = if sender == 2 {
                            Sender::Floor(&mut floor)
                        } else {
                            Sender::Device(&mut txq, &mut rig.tap)
                        };
                        run_tx_remote(&mut d, s, &wire, frames, lead)
                    }
                    (false, true) => bare.run(&rig.tap, frames, true, 0),
                    (false, false) => writev_loop(&mut rig.tap, &heap, frames),
                });
                report(row, base, &pairs);
            }
        }
        rig.tap.set_tx_batching(uring);
        for ring_batch in [1usize, 2, 4, 8, MAX_TX_BATCH] {
            let name = format!("bare io_uring {ring_batch} x writev {descs} iov");
            if !uring || !wanted(&name) {
                continue;
            }
            let mut bare = UringWrites::new(&rig.tap, &wire, descs, ring_batch);
            let pairs = alternate(rounds, |case| {
                if case {
                    bare.run(frames)
                } else {
                    writev_loop(&mut rig.tap, &heap, frames)
                }
            });
            report(&name, &base_name, &pairs);
        }
        for batch in [1usize, 256] {
            for batching in [false, true] {
                let how = if batching { "io_uring" } else { "writev" };
                let name = format!("tx tap ({how}) {descs}-desc batch {batch}");
                if (batching && !uring) || !wanted(&name) {
                    continue;
                }
                // The bare loop writes through `write_frame` (a writev) either way.
                rig.tap.set_tx_batching(batching);
                let mut d = Driver::tx(512, descs, &wire);
                let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
                let pairs = alternate(rounds, |case| {
                    if case {
                        run_tx(&mut d, &mut txq, &mut rig.tap, (batch, frames), Timed::Loop)
                    } else {
                        writev_loop(&mut rig.tap, &heap, frames)
                    }
                });
                report(&name, &base_name, &pairs);
            }
        }
        // The bare loop from the ring's own buffers (2 KiB apart), against the heap copies
        // (next to each other); and the one-frame device row against it.
        let layout_row = format!("tx tap: bare writev {descs} iov from the ring's guest buffers");
        let dev_row = format!("tx tap (writev) {descs}-desc batch 1 over the same");
        let floor_row = "tx tap: the split ring's least work by hand, batch 1 (a floor)";
        if wanted(&layout_row) || wanted(&dev_row) || (descs == 1 && wanted(floor_row)) {
            rig.tap.set_tx_batching(false);
            let mut d = Driver::tx(512, descs, &wire);
            let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
            // A second driver over the same layout lends the bare loop its buffers.
            let lender = Driver::tx(512, descs, &wire);
            let guest = frame_lists(
                guest_bufs(&lender, usize::from(512 / descs), 2048),
                wire.len(),
                descs,
            );
            if wanted(&layout_row) {
                let layout = alternate(rounds, |case| {
                    writev_loop(&mut rig.tap, if case { &guest } else { &heap }, frames)
                });
                report(&layout_row, &base_name, &layout);
            }
            if wanted(&dev_row) {
                let dev = alternate(rounds, |case| {
                    if case {
                        run_tx(&mut d, &mut txq, &mut rig.tap, (1, frames), Timed::Loop)
                    } else {
                        writev_loop(&mut rig.tap, &guest, frames)
                    }
                });
                report(&dev_row, &format!("{base_name}, ring's buffers"), &dev);
            }
            if descs == 1 && wanted(floor_row) {
                let mut d = Driver::tx(512, 1, &wire);
                let mut floor = Floor::new(&d, &rig.tap);
                let pairs = alternate(rounds, |case| {
                    if case {
                        run_floor(&mut d, &mut floor, frames)
                    } else {
                        writev_loop(&mut rig.tap, &guest, frames)
                    }
                });
                report(floor_row, &format!("{base_name}, ring's buffers"), &pairs);
            }
        }
        let host_tx_row = format!("tx tap (writev) {descs}-desc batch 1, frames from host buffers");
        if descs == 1 && wanted(&host_tx_row) {
            let mut host = HostBufTap::sending(&rig.tap, &wire);
            let mut d = Driver::tx(512, 1, &wire);
            let mut txq = TxQueue::new(Virtqueue::new(&d.queue(), d.mem()).expect("ring"));
            let pairs = alternate(rounds, |case| {
                if case {
                    run_tx(&mut d, &mut txq, &mut host, (1, frames), Timed::Loop)
                } else {
                    writev_loop(&mut rig.tap, &heap, frames)
                }
            });
            report(&host_tx_row, &base_name, &pairs);
        }
    }
    rig.tap.set_tx_batching(true);

    // rx: frames injected through a packet socket on the tap's host side before each timed
    // call; the bare loops read into 256 rotating 2 KiB heap buffers.
    let rx_frames = frames / 4;
    let mut heap: Vec<Vec<u8>> = (0..256).map(|_| vec![0u8; RX_BUF_LEN as usize]).collect();
    let heap = rx_lists(heap.iter_mut().map(Vec::as_mut_slice));
    let probe_row = "rx tap: the EAGAIN probe per call";
    if wanted(probe_row) {
        let pairs = alternate(rounds, |probe| {
            readv_loop(&mut rig, &heap, &wire, 1, rx_frames, probe)
        });
        report(probe_row, "readv", &pairs);
    }
    for batch in [1usize, 3, 7, 15, MAX_RX_BATCH - 1] {
        let name = format!("bare io_uring {} x readv (last: EAGAIN)", batch + 1);
        if !uring || !wanted(&name) {
            continue;
        }
        let mut bare = UringReads::new(&rig.tap, batch);
        let pairs = alternate(rounds, |case| {
            if case {
                bare.run(&rig, &wire, rx_frames)
            } else {
                readv_loop(&mut rig, &heap, &wire, batch, rx_frames, true)
            }
        });
        report(&name, "readv+EAGAIN", &pairs);
    }
    // One-frame calls that each read until EAGAIN (sparse reads off, as the `readv+EAGAIN`
    // baseline does), on the tap or on `HostBufTap`.
    for (row, host) in [
        ("rx tap mrg off batch 1, frames into host buffers", true),
        (
            "rx tap mrg off batch 1, sparse reads off (every call reads until EAGAIN)",
            false,
        ),
    ] {
        if !wanted(row) {
            continue;
        }
        let (mut d, mut rxq) =
            rx_full(Driver::rx(256), RxMode::SingleChain, RX_GATHER_NO_GSO_BYTES);
        rxq.set_sparse_reads(false);
        let mut host_tap = HostBufTap::new(&rig.tap);
        let pairs = alternate(rounds, |case| {
            if !case {
                return readv_loop(&mut rig, &heap, &wire, 1, rx_frames, true);
            }
            let (sock, frame) = (&rig.inject, &wire[VNET_HDR_LEN..]);
            if host {
                let feed = |_: &mut HostBufTap, n| inject(sock, frame, n);
                run_rx(&mut d, &mut rxq, &mut host_tap, feed, 1, rx_frames)
            } else {
                let feed = |_: &mut Tap, n| inject(sock, frame, n);
                run_rx(&mut d, &mut rxq, &mut rig.tap, feed, 1, rx_frames)
            }
        });
        report(row, "readv+EAGAIN", &pairs);
    }
    let guest_row = "rx tap: bare readv+EAGAIN into guest memory";
    if wanted(guest_row) {
        let lender = Driver::rx(256);
        let guest = rx_lists(guest_bufs(&lender, 256, RX_BUF_LEN as usize));
        let pairs = alternate(rounds, |case| {
            let lists = if case { &guest } else { &heap };
            readv_loop(&mut rig, lists, &wire, 1, rx_frames, true)
        });
        report(guest_row, "readv+EAGAIN", &pairs);
    }
    let rx_floor_row = "rx tap: the split ring's least work by hand, batch 1 (a floor)";
    if wanted(rx_floor_row) {
        let mut d = Driver::rx(256);
        let mut floor = Floor::new(&d, &rig.tap);
        d.fill();
        let pairs = alternate(rounds, |case| {
            if case {
                run_rx_floor(&rig, &mut d, &mut floor, &wire, rx_frames)
            } else {
                readv_loop(&mut rig, &heap, &wire, 1, rx_frames, false)
            }
        });
        report(rx_floor_row, "readv", &pairs);
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
            let (mut d, mut rxq) = rx_full(Driver::rx(256), mode, gather);
            let pairs = alternate(rounds, |case| {
                if !case {
                    return readv_loop(&mut rig, &heap, &wire, batch, rx_frames, probe);
                }
                let (sock, frame) = (&rig.inject, &wire[VNET_HDR_LEN..]);
                let feed = |_: &mut Tap, n| inject(sock, frame, n);
                run_rx(&mut d, &mut rxq, &mut rig.tap, feed, batch, rx_frames)
            });
            report(&name, base_name, &pairs);
        }
    }
}
