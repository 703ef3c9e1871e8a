//! Per-frame cost of the virtio-net datapath functions over guest memory and the socket-pair
//! backend: `process_tx` (guest → backend) and `process_rx` (backend → guest), 64 B and 1500 B
//! frames, in batches of 32 frames per call and one frame per call.
//!
//! Only the datapath call is timed (`iter_custom`); publishing buffers and the peer's side
//! (sending the frames to receive, draining the frames sent) happen outside the timed region.
//!
//! Run: `cargo bench -p devices --bench net -- --warm-up-time 1 --measurement-time 3`

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use devices::backend::{NetBackend, PairBackend, PairPeer};
use devices::iovec::IovecList;
use devices::virtio::net::metrics::{RxCounters, TxCounters};
use devices::virtio::net::rx::RX_GATHER_BYTES;
use devices::virtio::net::{RxMode, RxQueue, TxQueue, VNET_HDR_LEN};
use devices::virtio::vring::Virtqueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const QUEUE_SIZE: u16 = 256;
const BUF_LEN: u64 = 2048;
const BUFS_AT: u64 = 0x10_0000;
const FRAME_LENS: [usize; 2] = [64, 1500];
const BATCHES: [u64; 2] = [32, 1];

/// The driver side of one split queue: slot `i` always describes buffer `i`.
struct Ring {
    mem: GuestMemoryMmap,
    avail: u64,
    used: u64,
    avail_idx: u16,
}

impl Ring {
    /// A queue whose descriptors are device-readable buffers of `frame_len` + header (tx) or
    /// device-writable buffers of [`BUF_LEN`] bytes (rx).
    fn new(frame_len: Option<usize>) -> Ring {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100_0000)]).expect("memory");
        let size = u64::from(QUEUE_SIZE);
        let avail = 16 * size;
        let used = (avail + 6 + 2 * size + 3) & !3;
        for i in 0..size {
            let buf = BUFS_AT + i * BUF_LEN;
            let (len, flags) = match frame_len {
                Some(len) => {
                    let bytes: Vec<u8> = (0..VNET_HDR_LEN + len).map(|b| b as u8).collect();
                    mem.write_slice(&bytes, GuestAddress(buf)).expect("buffer");
                    (bytes.len() as u32, 0u16)
                }
                None => (BUF_LEN as u32, 2u16), // VRING_DESC_F_WRITE
            };
            let mut desc = [0u8; 16];
            desc[..8].copy_from_slice(&buf.to_le_bytes());
            desc[8..12].copy_from_slice(&len.to_le_bytes());
            desc[12..14].copy_from_slice(&flags.to_le_bytes());
            mem.write_slice(&desc, GuestAddress(i * 16))
                .expect("descriptor");
        }
        Ring {
            mem,
            avail,
            used,
            avail_idx: 0,
        }
    }

    fn queue(&self) -> Queue {
        let mut queue = Queue::new(QUEUE_SIZE).expect("queue");
        queue.set_size(QUEUE_SIZE);
        queue
            .try_set_desc_table_address(GuestAddress(0))
            .expect("aligned");
        queue
            .try_set_avail_ring_address(GuestAddress(self.avail))
            .expect("aligned");
        queue
            .try_set_used_ring_address(GuestAddress(self.used))
            .expect("aligned");
        queue.set_ready(true);
        queue.set_event_idx(true);
        queue
    }

    /// Makes the next `n` slots available.
    fn publish(&mut self, n: u64) {
        for _ in 0..n {
            let slot = self.avail_idx % QUEUE_SIZE;
            self.mem
                .write_obj(slot, GuestAddress(self.avail + 4 + 2 * u64::from(slot)))
                .expect("avail ring");
            self.avail_idx = self.avail_idx.wrapping_add(1);
        }
        self.mem
            .store(
                self.avail_idx,
                GuestAddress(self.avail + 2),
                Ordering::Release,
            )
            .expect("avail idx");
    }
}

fn drain(peer: &PairPeer, n: u64) {
    for _ in 0..n {
        peer.recv_frame().expect("frame sent by process_tx");
    }
}

fn bench_tx(c: &mut Criterion) {
    let mut group = c.benchmark_group("tx");
    group.throughput(Throughput::Elements(1));
    for frame_len in FRAME_LENS {
        for batch in BATCHES {
            let id = BenchmarkId::new(format!("batch{batch}"), format!("{frame_len}B"));
            group.bench_function(id, |b| {
                let mut ring = Ring::new(Some(frame_len));
                let mut txq = TxQueue::new(Virtqueue::new(&ring.queue(), &ring.mem).expect("ring"));
                let (mut backend, peer) = PairBackend::new().expect("socketpair");
                let mut counters = TxCounters::default();
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    let mut done = 0;
                    while done < iters {
                        let n = batch.min(iters - done);
                        ring.publish(n);
                        let start = Instant::now();
                        txq.process(&mut backend, &mut counters).expect("ring ok");
                        timed += start.elapsed();
                        drain(&peer, n);
                        done += n;
                    }
                    timed
                });
                assert_eq!(counters.malformed_chains + counters.backend_errors, 0);
            });
        }
    }
    group.finish();
}

fn bench_rx(c: &mut Criterion) {
    let mut group = c.benchmark_group("rx");
    group.throughput(Throughput::Elements(1));
    for frame_len in FRAME_LENS {
        let wire: Vec<u8> = (0..VNET_HDR_LEN + frame_len).map(|b| b as u8).collect();
        for batch in BATCHES {
            let id = BenchmarkId::new(format!("batch{batch}"), format!("{frame_len}B"));
            group.bench_function(id, |b| {
                let mut ring = Ring::new(None);
                let vq = Virtqueue::new(&ring.queue(), &ring.mem).expect("ring");
                let mut rxq = RxQueue::new(vq, RxMode::Mergeable, RX_GATHER_BYTES);
                let (mut backend, peer) = PairBackend::new().expect("socketpair");
                let mut counters = RxCounters::default();
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    let mut done = 0;
                    while done < iters {
                        let n = batch.min(iters - done);
                        ring.publish(n);
                        for _ in 0..n {
                            peer.send_frame(&wire).expect("send");
                        }
                        let start = Instant::now();
                        rxq.process(&mut backend, &mut counters).expect("ring ok");
                        timed += start.elapsed();
                        done += n;
                    }
                    timed
                });
                assert_eq!(counters.dropped_no_buffer + counters.malformed_chains, 0);
            });
        }
    }
    group.finish();
}

/// The backend syscalls alone (same sizes, host buffers): what the datapath adds is the
/// difference.
fn bench_baseline(c: &mut Criterion) {
    let mut group = c.benchmark_group("baseline_pair_syscall");
    group.throughput(Throughput::Elements(1));
    for frame_len in FRAME_LENS {
        let mut wire: Vec<u8> = (0..VNET_HDR_LEN + frame_len).map(|b| b as u8).collect();
        group.bench_function(BenchmarkId::new("write", format!("{frame_len}B")), |b| {
            let (mut backend, peer) = PairBackend::new().expect("socketpair");
            let mut list = IovecList::new();
            list.push_slice(&mut wire).expect("room");
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    backend.write_frame(list.as_iovecs()).expect("write");
                    timed += start.elapsed();
                    drain(&peer, 1);
                }
                timed
            });
        });
        let frame = wire.clone();
        group.bench_function(BenchmarkId::new("read", format!("{frame_len}B")), |b| {
            let (mut backend, peer) = PairBackend::new().expect("socketpair");
            let mut buf = vec![0u8; BUF_LEN as usize];
            let mut list = IovecList::new();
            list.push_slice(&mut buf).expect("room");
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    peer.send_frame(&frame).expect("send");
                    let start = Instant::now();
                    backend.read_frame(list.as_iovecs()).expect("read");
                    timed += start.elapsed();
                }
                timed
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_tx, bench_rx, bench_baseline);
criterion_main!(benches);
