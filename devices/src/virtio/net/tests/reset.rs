//! VIRTIO_F_RING_RESET through the workers (virtio-mmio QueueReset; the PCI register is the
//! same `VirtioState` code): a queue reset and moved to new rings in the middle of traffic
//! costs the other queues nothing, a reset with chains in flight publishes exactly what was
//! done and leaves the old ring alone, and storms and bad rings stay bounded.

use std::thread;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_NEEDS_RESET, VIRTIO_F_RING_RESET};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_QUEUE_READY, VIRTIO_MMIO_QUEUE_SEL};
use virtio_bindings::virtio_net::*;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::driver::DriverRing;
use super::support::{frame, guest_mem, wire, GuestQueue};
use super::worker::{ctrl_command, kick, multi_queue_device, TIMEOUT, VERSION_1};
use crate::backend::{NetBackend, PairBackend, PairPeer};
use crate::test_utils::mmio::{wait_until, Registers};
use crate::test_utils::packed::GuestPackedQueue;
use crate::virtio::mmio::QUEUE_RESET_OFFSET;
use crate::virtio::net::ctrl::{ACK_OK, CTRL_QUEUE_SIZE};
use crate::virtio::net::{MacAddr, NetDevice};
use crate::virtio::MmioTransport;

const fn bit(feature: u32) -> u64 {
    1 << feature
}

const RING_RESET: u64 = bit(VIRTIO_F_RING_RESET);
const MQ: u64 = VERSION_1 | bit(VIRTIO_NET_F_CTRL_VQ) | bit(VIRTIO_NET_F_MQ) | RING_RESET;
const QSIZE: u16 = 256;
/// The longest a QueueReset write may keep the vCPU (the device waits 20 ms at most; the
/// rest is slack for a loaded host).
const RESET_BOUND: Duration = Duration::from_secs(1);

fn device(pairs: usize) -> (NetDevice<PairBackend>, Vec<PairPeer>) {
    let (device, peers) = multi_queue_device(pairs);
    for peer in &peers {
        peer.set_timeout(TIMEOUT).expect("timeout");
    }
    (device, peers)
}

/// A queue of `size` in ring slot `slot` (rings at `slot` × 64 KiB, below 1 MiB; buffers in
/// the slot's own 512 KiB from 1 MiB on). Slots 0..=13.
fn ring(mem: &GuestMemoryMmap, slot: u64, size: u16) -> GuestQueue {
    slot_ring(mem, slot, size)
}

/// [`ring`] of `Q`'s kind.
fn slot_ring<Q: DriverRing>(mem: &GuestMemoryMmap, slot: u64, size: u16) -> Q {
    Q::at(mem, slot * 0x1_0000, size, 0x10_0000 + slot * 0x8_0000)
}

fn needs_reset(t: &mut MmioTransport) -> bool {
    t.status() & VIRTIO_CONFIG_S_NEEDS_RESET != 0
}

/// Resets queue `index` through QueueReset and waits until it reads 0; returns how long the
/// write itself took (the vCPU's share).
fn queue_reset(t: &mut MmioTransport, index: u32) -> Duration {
    t.w32(VIRTIO_MMIO_QUEUE_SEL, index);
    let start = Instant::now();
    t.w32(QUEUE_RESET_OFFSET, 1);
    let took = start.elapsed();
    assert!(
        wait_until(TIMEOUT, || t.r32(QUEUE_RESET_OFFSET) == 0),
        "queue {index}: reset done"
    );
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 0, "queue {index} disabled");
    took
}

/// The 60-byte frame number `seq` (its number in its first bytes), with its header.
fn numbered(seq: u32) -> Vec<u8> {
    let mut payload = frame(60, seq as u8);
    payload[..4].copy_from_slice(&seq.to_le_bytes());
    wire(&payload)
}

/// Sends `cmd` with `data` on the control queue (queue `index`); returns the ack.
fn ctrl_send<Q: DriverRing>(
    t: &MmioTransport,
    q: &mut Q,
    index: usize,
    cmd: [u8; 2],
    data: &[u8],
) -> u8 {
    ctrl_command(t, q, index, cmd, data).0
}

/// Pushes `frames` numbered frames on `tx` (kicking `kick` each time), waiting for used
/// entries whenever the ring is full; returns the queue and the used entries it took.
fn send_numbered<Q: DriverRing>(
    mut tx: Q,
    kick: vmm_sys_util::eventfd::EventFd,
    frames: u32,
) -> (Q, Vec<(u32, u32)>) {
    let deadline = Instant::now() + TIMEOUT * 3;
    let mut used = Vec::new();
    for seq in 0..frames {
        while seq as usize - used.len() >= usize::from(QSIZE - 1) {
            match tx.next_used() {
                Some(entry) => used.push(entry),
                None => {
                    assert!(Instant::now() < deadline, "tx stalled at frame {seq}");
                    thread::sleep(Duration::from_micros(100));
                }
            }
        }
        tx.offer_tx(&numbered(seq), &[]);
        kick.write(1).expect("kick");
    }
    (tx, used)
}

#[test]
fn a_queue_reset_mid_traffic_loses_no_frame_on_the_other_queues() {
    reset_mid_traffic::<GuestQueue>();
}

#[test]
fn a_queue_reset_mid_traffic_loses_no_frame_on_packed_rings() {
    reset_mid_traffic::<GuestPackedQueue>();
}

/// Two pairs and the control queue on rings of `Q`'s kind: pair 0's tx carries numbered
/// frames while the other data queues are reset and moved to new rings again and again.
fn reset_mid_traffic<Q: DriverRing>() {
    const FRAMES: u32 = 3000;
    const CYCLES: u64 = 20;
    let mem = guest_mem();
    let (mut device, peers) = device(2);
    device.offer_ring_features(Q::RING_FEATURES != 0, false);
    let metrics = device.metrics();
    let mut t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    let tx0 = slot_ring::<Q>(&mem, 1, QSIZE);
    let mut ctrl = slot_ring::<Q>(&mem, 4, CTRL_QUEUE_SIZE);
    assert!(
        t.negotiate(MQ | Q::RING_FEATURES),
        "FEATURES_OK with RING_RESET"
    );
    for (index, slot) in [(0u32, 0u64), (2, 2), (3, 3)] {
        slot_ring::<Q>(&mem, slot, QSIZE).program(&mut t, index);
    }
    tx0.program(&mut t, 1);
    ctrl.program(&mut t, 4);
    t.driver_ok();
    assert!(!needs_reset(&mut t));
    let pairs = 2u16.to_le_bytes();
    let vq_pairs_set = [
        VIRTIO_NET_CTRL_MQ as u8,
        VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8,
    ];
    assert_eq!(ctrl_send(&t, &mut ctrl, 4, vq_pairs_set, &pairs), ACK_OK);

    let tx0_kick = t.ioeventfds(0)[1].0.try_clone().expect("kick");
    let mut slowest = Duration::ZERO;
    // The queues reset every cycle, on fresh rings: pair 0's rx (the tx sender's own worker),
    // pair 1's tx and rx (the other worker).
    let mut moved = Vec::new();
    let (mut tx0, mut used) = thread::scope(|s| {
        let sender = s.spawn(|| send_numbered(tx0, tx0_kick, FRAMES));
        let receiver = s.spawn(|| {
            for seq in 0..FRAMES {
                let got = peers[0].recv_frame().expect("tx frame");
                assert!(got == numbered(seq), "frame {seq} intact and in order");
            }
        });
        for cycle in 0..CYCLES {
            let base = 5 + (cycle % 2) * 3;
            moved.clear();
            for (k, index) in [0u32, 3, 2].into_iter().enumerate() {
                slowest = slowest.max(queue_reset(&mut t, index));
                let q = slot_ring::<Q>(&mem, base + k as u64, QSIZE);
                q.program(&mut t, index);
                assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 1);
                moved.push(q);
            }
            assert!(!needs_reset(&mut t), "cycle {cycle}");
            thread::sleep(Duration::from_millis(2));
        }
        receiver.join().expect("every tx frame arrived in order");
        sender.join().expect("sender")
    });
    assert!(slowest < RESET_BOUND, "a QueueReset write took {slowest:?}");
    // Every chain of the other queue completed exactly once, in order.
    while used.len() < FRAMES as usize {
        used.push(tx0.wait_used());
    }
    assert!(tx0.next_used().is_none());
    for (i, &entry) in used.iter().enumerate() {
        assert_eq!(
            entry,
            ((i % usize::from(QSIZE)) as u32, 0),
            "used entry {i}"
        );
    }
    assert!(
        peers[0].try_recv_frame().expect("recv").is_none(),
        "nothing sent twice"
    );
    assert_eq!(metrics.queue_resets.get(), 3 * CYCLES);
    // Enables are handed over without waiting: the worker counts them as it takes them.
    assert!(wait_until(TIMEOUT, || metrics.queue_reenables.get() == 3 * CYCLES));
    assert_eq!(metrics.queues[0].tx.frames.get(), u64::from(FRAMES));

    // The reset queues carry traffic on their new rings.
    let [mut rx0, mut tx1, mut rx1] = <[Q; 3]>::try_from(moved).ok().expect("3 rings");
    for (index, q, peer) in [(0usize, &mut rx0, &peers[0]), (2, &mut rx1, &peers[1])] {
        let (head, addrs) = q.offer_rx(&[2048]);
        kick(&t, index);
        let inbound = wire(&frame(200, index as u8));
        peer.send_frame(&inbound).expect("send");
        assert_eq!(
            q.wait_used(),
            (u32::from(head), inbound.len() as u32),
            "queue {index}"
        );
        assert_eq!(q.peek(addrs[0] + 12, 200), inbound[12..]);
    }
    let out = wire(&frame(300, 9));
    let id = tx1.offer_tx(&out, &[12]);
    kick(&t, 3);
    assert_eq!(peers[1].recv_frame().expect("tx1 on its new ring"), out);
    assert_eq!(tx1.wait_used(), (u32::from(id), 0));
    assert_eq!(
        metrics.queues[1].tx.frames.get(),
        1,
        "pair 1's own counters"
    );
    assert!(!needs_reset(&mut t));
}

#[test]
fn a_reset_with_chains_in_flight_publishes_what_was_sent_and_leaves_the_old_ring_alone() {
    const BIG: usize = 16_000;
    let mem = guest_mem();
    let (device, peers) = device(1);
    let peer = &peers[0];
    let metrics = device.metrics();
    let mut t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    let mut rx = ring(&mem, 0, QSIZE);
    let mut tx = GuestQueue::at(&mem, GuestAddress(0x1_0000), QSIZE, 0x20_0000);
    assert!(t.negotiate(VERSION_1 | bit(VIRTIO_NET_F_MRG_RXBUF) | RING_RESET));
    t.setup_queue(0, QSIZE, rx.ring_addrs());
    t.setup_queue(1, QSIZE, tx.ring_addrs());
    t.driver_ok();

    // tx: more big frames than the backend takes; the peer reads none yet.
    let frames: Vec<Vec<u8>> = (0..64).map(|i| wire(&frame(BIG, i as u8))).collect();
    for f in &frames {
        tx.push_tx(f, &[12]);
    }
    kick(&t, 1);
    assert!(wait_until(TIMEOUT, || metrics.tx.backend_full.get() > 0));
    let sent = tx.used_idx();
    assert!(
        0 < sent && sent < 64,
        "{sent} sent before the backend filled"
    );
    queue_reset(&mut t, 1);
    let sent = tx.used_idx();
    // Everything sent was published, nothing else: the peer gets exactly those, in order,
    // and the worker does not send the rest once the backend drains.
    for (i, f) in frames.iter().enumerate().take(usize::from(sent)) {
        assert!(peer.recv_frame().expect("sent frame") == *f, "frame {i}");
    }
    thread::sleep(Duration::from_millis(100));
    assert!(
        peer.try_recv_frame().expect("recv").is_none(),
        "unsent chains stay unsent"
    );
    assert_eq!(tx.used_idx(), sent, "the old ring is left alone");
    for i in 0..sent {
        assert_eq!(
            tx.used(i),
            (u32::from(2 * i), 0),
            "each chain once, in order"
        );
    }
    assert_eq!(metrics.tx.frames.get(), u64::from(sent));
    // The driver re-initialises the same rings (indexes from 0) and enables the queue.
    let mut tx = GuestQueue::at(&mem, GuestAddress(0x1_0000), QSIZE, 0x60_0000);
    t.setup_queue(1, QSIZE, tx.ring_addrs());
    let fresh = wire(&frame(100, 0xee));
    tx.push_tx(&fresh, &[]);
    kick(&t, 1);
    assert!(
        peer.recv_frame().expect("frame") == fresh,
        "only the new frame"
    );
    assert!(wait_until(TIMEOUT, || tx.used_idx() == 1));

    // rx: the worker pools chains ahead of frames (mergeable: 9 KiB worth); after the reset
    // none of them is filled, and frames that came meanwhile land in the new ring.
    let bufs: Vec<u64> = (0..8).map(|_| rx.push_rx(&[2048]).1[0]).collect();
    kick(&t, 0);
    let first = wire(&frame(500, 1));
    peer.send_frame(&first).expect("send");
    assert!(wait_until(TIMEOUT, || rx.used_idx() == 1));
    assert_eq!(rx.read(bufs[0] + 12, 500), first[12..]);
    queue_reset(&mut t, 0);
    let later: Vec<Vec<u8>> = (2..5).map(|i| wire(&frame(400, i))).collect();
    for f in &later {
        peer.send_frame(f).expect("send");
    }
    thread::sleep(Duration::from_millis(100));
    assert_eq!(rx.used_idx(), 1, "nothing delivered into the old ring");
    for &buf in &bufs[1..] {
        assert!(
            rx.read(buf, 2048).iter().all(|&b| b == 0),
            "pooled buffer untouched"
        );
    }
    let mut rx = ring(&mem, 5, QSIZE);
    let new_bufs: Vec<u64> = (0..8).map(|_| rx.push_rx(&[2048]).1[0]).collect();
    t.setup_queue(0, QSIZE, rx.ring_addrs());
    assert!(
        wait_until(TIMEOUT, || rx.used_idx() == 3),
        "{}",
        rx.used_idx()
    );
    for (i, f) in later.iter().enumerate() {
        assert_eq!(rx.used(i as u16).1 as usize, f.len());
        assert_eq!(
            rx.read(new_bufs[i] + 12, 400),
            f[12..],
            "frame {i} in order"
        );
    }
    assert_eq!(metrics.queue_resets.get(), 2);
    assert!(!needs_reset(&mut t));
}

#[test]
fn reset_storms_and_bad_rings_are_bounded() {
    let mem = guest_mem();
    let (device, peers) = device(1);
    let peer = &peers[0];
    let metrics = device.metrics();
    let mut t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    let features = VERSION_1 | bit(VIRTIO_NET_F_CTRL_VQ) | RING_RESET;
    let start = |t: &mut MmioTransport| {
        assert!(t.negotiate(features));
        for (index, slot) in [(0u32, 0u64), (1, 1)] {
            t.setup_queue(index, QSIZE, ring(&mem, slot, QSIZE).ring_addrs());
        }
        t.setup_queue(
            2,
            CTRL_QUEUE_SIZE,
            ring(&mem, 2, CTRL_QUEUE_SIZE).ring_addrs(),
        );
        // QueueReset before DRIVER_OK: refused.
        t.w32(VIRTIO_MMIO_QUEUE_SEL, 0);
        t.w32(QUEUE_RESET_OFFSET, 1);
        assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 1);
        t.driver_ok();
        assert!(!needs_reset(t));
    };
    start(&mut t);
    assert_eq!(metrics.queue_resets.get(), 0);

    // A storm: 400 resets and re-enables, on alternating rings, a frame now and then.
    let began = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut tx = None;
    for i in 0..400u64 {
        let index = (i % 2) as u32;
        slowest = slowest.max(queue_reset(&mut t, index));
        // More writes of 1 to a reset queue: refused.
        t.w32(QUEUE_RESET_OFFSET, 1);
        let q = ring(&mem, 3 + (i % 4), QSIZE);
        t.setup_queue(index, QSIZE, q.ring_addrs());
        if index == 1 {
            tx = Some(q);
        }
        if i % 50 == 49 {
            let tx = tx.as_mut().expect("tx ring");
            let f = wire(&frame(80, i as u8));
            tx.push_tx(&f, &[]);
            kick(&t, 1);
            assert!(peer.recv_frame().expect("frame") == f, "after reset {i}");
        }
    }
    assert!(slowest < RESET_BOUND, "a QueueReset write took {slowest:?}");
    assert!(began.elapsed() < TIMEOUT * 3, "{:?}", began.elapsed());
    assert_eq!(metrics.queue_resets.get(), 400);
    assert!(wait_until(TIMEOUT, || metrics.queue_reenables.get() == 400));
    assert!(!needs_reset(&mut t));

    // The control queue is not reset; QueueReady writes on running queues do nothing.
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 2);
    t.w32(QUEUE_RESET_OFFSET, 1);
    assert_eq!(t.r32(QUEUE_RESET_OFFSET), 0);
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 1);
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 0);
    t.w32(VIRTIO_MMIO_QUEUE_READY, 1);
    t.w32(VIRTIO_MMIO_QUEUE_READY, 0);
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 1);
    // Bad values and indexes.
    t.w32(QUEUE_RESET_OFFSET, 2);
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 7);
    t.w32(QUEUE_RESET_OFFSET, 1);
    assert_eq!(t.r32(QUEUE_RESET_OFFSET), 0);
    assert_eq!(metrics.queue_resets.get(), 400);
    assert!(!needs_reset(&mut t));

    // Re-enabled with the used ring over the descriptor table: refused, NEEDS_RESET; the
    // other queue keeps running meanwhile.
    queue_reset(&mut t, 1);
    let (desc, avail, _) = ring(&mem, 9, QSIZE).ring_addrs();
    t.setup_queue(1, QSIZE, (desc, avail, desc + 0x100));
    assert!(needs_reset(&mut t));
    assert_eq!(metrics.needs_reset_events.get(), 1);
    let mut rx = ring(&mem, 10, QSIZE);
    queue_reset(&mut t, 0);
    t.setup_queue(0, QSIZE, rx.ring_addrs());
    rx.push_rx(&[2048]);
    kick(&t, 0);
    peer.send_frame(&wire(&frame(64, 3))).expect("send");
    assert!(wait_until(TIMEOUT, || rx.used_idx() == 1), "rx still runs");

    // A device reset clears it all; then rings outside guest memory: NEEDS_RESET again.
    start(&mut t);
    queue_reset(&mut t, 0);
    t.setup_queue(0, QSIZE, (0x7f_f000, 0x7f_f800, 0x80_0000));
    assert!(needs_reset(&mut t));
    // A reset in the middle of a queue reset, then a clean run.
    start(&mut t);
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 1);
    t.w32(QUEUE_RESET_OFFSET, 1);
    start(&mut t);
    let mut tx = ring(&mem, 1, QSIZE);
    let f = wire(&frame(90, 7));
    tx.push_tx(&f, &[]);
    kick(&t, 1);
    assert!(peer.recv_frame().expect("frame") == f);
}

/// A [`PairBackend`] whose writes take `delay` (a worker busy in a long system call).
struct SlowBackend {
    inner: PairBackend,
    delay: std::sync::Arc<std::sync::Mutex<Duration>>,
}

impl std::os::fd::AsRawFd for SlowBackend {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.inner.as_raw_fd()
    }
}

impl NetBackend for SlowBackend {
    fn read_frame(&mut self, iovs: crate::iovec::Iovecs<'_>) -> std::io::Result<usize> {
        self.inner.read_frame(iovs)
    }
    fn write_frame(&mut self, iovs: crate::iovec::Iovecs<'_>) -> std::io::Result<usize> {
        let delay = *self.delay.lock().expect("delay");
        thread::sleep(delay);
        self.inner.write_frame(iovs)
    }
    fn supported_offloads(&self) -> crate::backend::Offloads {
        self.inner.supported_offloads()
    }
    fn set_offloads(&mut self, offloads: crate::backend::Offloads) -> std::io::Result<()> {
        self.inner.set_offloads(offloads)
    }
    fn set_vnet_hdr_size(&mut self, size: u32) -> std::io::Result<()> {
        self.inner.set_vnet_hdr_size(size)
    }
}

#[test]
fn a_busy_worker_makes_queue_reset_read_1_until_it_answers() {
    const BUSY: Duration = Duration::from_secs(1);
    let mem = guest_mem();
    let (inner, peer) = PairBackend::new().expect("socketpair");
    peer.set_timeout(TIMEOUT).expect("timeout");
    let delay = std::sync::Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let backend = SlowBackend {
        inner,
        delay: delay.clone(),
    };
    let device = NetDevice::with_backend(backend, MacAddr::new([2, 0, 0, 0, 0, 1]), QSIZE);
    let metrics = device.metrics();
    let mut t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    let mut tx = ring(&mem, 1, QSIZE);
    assert!(t.negotiate(VERSION_1 | RING_RESET));
    t.setup_queue(0, QSIZE, ring(&mem, 0, QSIZE).ring_addrs());
    t.setup_queue(1, QSIZE, tx.ring_addrs());
    t.driver_ok();

    // The worker sits in a one-second write; the rx reset cannot be confirmed meanwhile.
    *delay.lock().expect("delay") = BUSY;
    let slow = wire(&frame(70, 1));
    tx.push_tx(&slow, &[]);
    kick(&t, 1);
    thread::sleep(Duration::from_millis(50));
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 0);
    let start = Instant::now();
    t.w32(QUEUE_RESET_OFFSET, 1);
    let took = start.elapsed();
    assert!(took < BUSY / 4, "the write waited {took:?}");
    assert_eq!(t.r32(QUEUE_RESET_OFFSET), 1, "ongoing");
    // Nothing configurable or enabled while it is ongoing.
    let rx = ring(&mem, 5, QSIZE);
    t.setup_queue(0, QSIZE, rx.ring_addrs());
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 0);
    assert_eq!(t.r32(QUEUE_RESET_OFFSET), 1, "still ongoing");
    // Once the worker is back, the reset completes; then the queue can be enabled.
    *delay.lock().expect("delay") = Duration::ZERO;
    assert!(wait_until(TIMEOUT, || t.r32(QUEUE_RESET_OFFSET) == 0));
    assert!(
        start.elapsed() >= BUSY / 2,
        "done only once the worker answered"
    );
    assert!(peer.recv_frame().expect("the slow frame") == slow);
    assert_eq!(metrics.queue_resets.get(), 1);
    assert_eq!(metrics.queue_reenables.get(), 0);
    let mut rx = ring(&mem, 5, QSIZE);
    let (_, bufs) = rx.push_rx(&[2048]);
    t.setup_queue(0, QSIZE, rx.ring_addrs());
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 1);
    let inbound = wire(&frame(90, 2));
    peer.send_frame(&inbound).expect("send");
    assert!(wait_until(TIMEOUT, || rx.used_idx() == 1));
    assert_eq!(rx.read(bufs[0] + 12, 90), inbound[12..]);
    assert!(!needs_reset(&mut t));
}
