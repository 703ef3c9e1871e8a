//! Per-frame cost of the virtio-net datapath functions over guest memory and the socket-pair
//! backend: `process_tx` (guest → backend) and `process_rx` (backend → guest), 64 B and 1500 B
//! frames, in batches of 32 frames per call and one frame per call.
//!
//! Only the datapath call is timed (`iter_custom`); publishing buffers and the peer's side
//! (sending the frames to receive, draining the frames sent) happen outside the timed region.
//!
//! Run: `cargo bench -p devices --bench net -- --warm-up-time 1 --measurement-time 3`

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use devices::backend::{NetBackend, PairBackend, PairPeer};
use devices::iovec::IovecList;
use devices::test_utils::queue::{GuestQueue, WRITE};
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

/// The driver side of one split queue whose slot `i` always describes buffer `i`: device-readable
/// buffers of `frame_len` + header (tx) or device-writable buffers of [`BUF_LEN`] bytes (rx),
/// re-posted in turn ([`GuestQueue::publish_slots`]).
fn fixed_ring(frame_len: Option<usize>) -> GuestQueue {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100_0000)]).expect("memory");
    let mut q = GuestQueue::new(&mem, QUEUE_SIZE);
    for i in 0..u64::from(QUEUE_SIZE) {
        let buf = BUFS_AT + i * BUF_LEN;
        let (len, flags) = match frame_len {
            Some(len) => {
                let bytes: Vec<u8> = (0..VNET_HDR_LEN + len).map(|b| b as u8).collect();
                mem.write_slice(&bytes, GuestAddress(buf)).expect("buffer");
                (bytes.len() as u32, 0)
            }
            None => (BUF_LEN as u32, WRITE),
        };
        q.write_descs(&[(buf, len, flags, 0)]);
    }
    q
}

/// The device's view of `ring`, with EVENT_IDX.
fn device_queue(ring: &GuestQueue) -> Queue {
    let mut queue = ring.queue();
    queue.set_event_idx(true);
    queue
}

/// `iters` frames in calls of at most `batch`: `call(n)` prepares `n` frames, runs the call
/// and returns the time of the call alone; the sum of those times.
fn in_batches(iters: u64, batch: u64, mut call: impl FnMut(u64) -> Duration) -> Duration {
    let mut timed = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = batch.min(iters - done);
        timed += call(n);
        done += n;
    }
    timed
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
                let mut ring = fixed_ring(Some(frame_len));
                let mut txq =
                    TxQueue::new(Virtqueue::new(&device_queue(&ring), ring.mem()).expect("ring"));
                let (mut backend, peer) = PairBackend::new().expect("socketpair");
                let mut counters = TxCounters::default();
                b.iter_custom(|iters| {
                    in_batches(iters, batch, |n| {
                        ring.publish_slots(n as u16);
                        let start = Instant::now();
                        txq.process(&mut backend, &mut counters).expect("ring ok");
                        let timed = start.elapsed();
                        drain(&peer, n);
                        timed
                    })
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
                let mut ring = fixed_ring(None);
                let vq = Virtqueue::new(&device_queue(&ring), ring.mem()).expect("ring");
                let mut rxq = RxQueue::new(vq, RxMode::Mergeable, RX_GATHER_BYTES);
                let (mut backend, peer) = PairBackend::new().expect("socketpair");
                let mut counters = RxCounters::default();
                b.iter_custom(|iters| {
                    in_batches(iters, batch, |n| {
                        ring.publish_slots(n as u16);
                        for _ in 0..n {
                            peer.send_frame(&wire).expect("send");
                        }
                        let start = Instant::now();
                        rxq.process(&mut backend, &mut counters).expect("ring ok");
                        start.elapsed()
                    })
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
