//! Multiqueue (VIRTIO_NET_F_MQ) end to end through the workers: the feature and
//! `max_virtqueue_pairs` only with several pairs, the queue layout rx0 tx0 rx1 tx1 … ctrl, one
//! worker (thread, backend) per pair, pair 1 idle until VQ_PAIRS_SET enables it and idle again
//! when the driver goes back to one pair, frames intact on both pairs, per-pair counters, and
//! malformed MQ commands acked ERR.

use std::sync::Arc;
use std::time::Duration;

use virtio_bindings::virtio_mmio::VIRTIO_MMIO_STATUS;
use virtio_bindings::virtio_net::*;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::support::{frame, guest_mem, wire, GuestQueue};
use super::worker::{ctrl_command, kick, multi_queue_device, reaches, TIMEOUT, VERSION_1};
use crate::backend::{PairBackend, PairPeer};
use crate::test_utils::mmio::{wait_until, Registers};
use crate::virtio::net::ctrl::{ACK_ERR, ACK_OK, CTRL_QUEUE_SIZE};
use crate::virtio::net::{NetDevice, NetMetrics};
use crate::virtio::{MmioTransport, VirtioDevice};

const fn bit(feature: u32) -> u64 {
    1 << feature
}

const CTRL: u64 = VERSION_1 | bit(VIRTIO_NET_F_CTRL_VQ);
const MQ: u64 = CTRL | bit(VIRTIO_NET_F_MQ);
const MQ_CLASS: u8 = VIRTIO_NET_CTRL_MQ as u8;
const VQ_PAIRS_SET: u8 = VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8;

fn device(pairs: usize) -> (NetDevice<PairBackend>, Vec<PairPeer>) {
    multi_queue_device(pairs)
}

#[test]
fn mq_and_max_virtqueue_pairs_are_offered_only_with_several_pairs() {
    let (one, _peers) = device(1);
    assert_eq!(one.features() & bit(VIRTIO_NET_F_MQ), 0);
    assert_eq!(one.queue_max_sizes(), &[256, 256, CTRL_QUEUE_SIZE]);
    let mut config = [0xAAu8; 4];
    one.read_config(8, &mut config);
    assert_eq!(config, [0; 4], "no max_virtqueue_pairs without MQ");

    let (three, _peers) = device(3);
    assert_ne!(three.features() & bit(VIRTIO_NET_F_MQ), 0);
    assert_eq!(three.queue_pairs(), 3);
    assert_eq!(
        three.queue_max_sizes(),
        &[256, 256, 256, 256, 256, 256, CTRL_QUEUE_SIZE],
        "rx0 tx0 rx1 tx1 rx2 tx2 ctrl"
    );
    let mut config = [0u8; 10];
    three.read_config(0, &mut config);
    assert_eq!(&config[..6], &[2, 0, 0, 0, 0, 1], "mac");
    assert_eq!(u16::from_le_bytes([config[8], config[9]]), 3);
    let mut one_byte = [0u8; 1];
    three.read_config(8, &mut one_byte);
    assert_eq!(one_byte, [3]);
    // The queues the driver sets up follow what it negotiated.
    assert_eq!(three.queues_in_use(MQ), 7);
    assert_eq!(three.queues_in_use(CTRL), 3, "without MQ: rx0 tx0 ctrl");
    assert_eq!(three.queues_in_use(VERSION_1), 2);
    let refused = three
        .validate_features(VERSION_1 | bit(VIRTIO_NET_F_MQ))
        .expect_err("MQ needs CTRL_VQ");
    assert_eq!((refused.feature, refused.requires), ("MQ", "CTRL_VQ"));
    assert!(three.validate_features(MQ).is_ok());
}

/// The driver's rings of a two-pair device: rx0 tx0 rx1 tx1 ctrl.
struct Rings {
    rx: [GuestQueue; 2],
    tx: [GuestQueue; 2],
    ctrl: GuestQueue,
}

fn rings(mem: &GuestMemoryMmap) -> Rings {
    let q = |i: u64, size| GuestQueue::at(mem, GuestAddress(i * 0x1_0000), size, (i + 1) << 20);
    Rings {
        rx: [q(0, 256), q(2, 256)],
        tx: [q(1, 256), q(3, 256)],
        ctrl: q(4, CTRL_QUEUE_SIZE),
    }
}

/// A device of `pairs` pairs behind the MMIO transport and the driver's rings for two pairs
/// and the control queue; also the backends' far ends and the device's metrics.
fn mq_transport(
    mem: &GuestMemoryMmap,
    pairs: usize,
) -> (MmioTransport, Rings, Vec<PairPeer>, Arc<NetMetrics>) {
    let (device, peers) = device(pairs);
    let metrics = device.metrics();
    let t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    (t, rings(mem), peers, metrics)
}

/// Negotiates MQ and programs the five queues; the control queue is 4 (2 × pairs).
fn start_mq(t: &mut MmioTransport, r: &Rings) {
    start_mq_with_ctrl_at(t, r, 4);
}

/// Negotiates MQ and programs two pairs and the control queue, at `ctrl` (2 × the device's
/// pairs; the queues between stay disabled).
fn start_mq_with_ctrl_at(t: &mut MmioTransport, r: &Rings, ctrl: u32) {
    assert!(t.negotiate(MQ), "FEATURES_OK accepted");
    for (index, q) in [&r.rx[0], &r.tx[0], &r.rx[1], &r.tx[1]]
        .into_iter()
        .enumerate()
    {
        t.setup_queue(index as u32, 256, q.ring_addrs());
    }
    t.setup_queue(ctrl, CTRL_QUEUE_SIZE, r.ctrl.ring_addrs());
    t.driver_ok();
    assert_eq!(t.status() & 0xff, 0xf, "running, not NEEDS_RESET");
}

/// Sends `class.command` with `data` on the control queue `index`; returns the ack.
fn send(t: &MmioTransport, q: &mut GuestQueue, index: usize, cmd: [u8; 2], data: &[u8]) -> u8 {
    let (ack, used, head) = ctrl_command(t, q, index, cmd, data);
    assert_eq!(used, (u32::from(head), 1));
    ack
}

fn pairs_set(t: &MmioTransport, r: &mut Rings, pairs: u16) -> u8 {
    send(
        t,
        &mut r.ctrl,
        4,
        [MQ_CLASS, VQ_PAIRS_SET],
        &pairs.to_le_bytes(),
    )
}

/// Sends a frame on pair `pair`'s tx queue (index 2 × pair + 1).
fn transmit(t: &MmioTransport, r: &mut Rings, pair: usize, seed: u8) -> Vec<u8> {
    let bytes = wire(&frame(100 + usize::from(seed), seed));
    r.tx[pair].push_tx(&bytes, &[]);
    kick(t, 2 * pair + 1);
    bytes
}

/// What the guest got in a receive buffer, `num_buffers` (the device's, 1) set back to 0 as
/// the backend sent it.
fn arrived(q: &GuestQueue, addr: u64, len: usize) -> Vec<u8> {
    let mut bytes = q.read(addr, len);
    assert_eq!(&bytes[10..12], &[1, 0], "num_buffers");
    bytes[10] = 0;
    bytes
}

fn quiet(peer: &PairPeer) -> bool {
    std::thread::sleep(Duration::from_millis(100));
    peer.try_recv_frame().expect("recv").is_none()
}

fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn pair_1_carries_frames_only_after_vq_pairs_set() {
    let mem = guest_mem();
    let (device, peers) = device(2);
    let metrics: std::sync::Arc<NetMetrics> = device.metrics();
    // A thread names itself once it runs.
    for name in ["net-net-0", "net-net-1"] {
        assert!(
            wait_until(TIMEOUT, || thread_names().iter().any(|n| n == name)),
            "{name} in {:?}",
            thread_names()
        );
    }
    let mut t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    let mut r = rings(&mem);
    start_mq(&mut t, &r);
    assert!(wait_until(TIMEOUT, || peers[1].queue_enabled() == Some(false)));

    // Only pair 0 is active: a frame on tx1 stays queued, one for rx1 stays in the backend.
    let early_tx = transmit(&t, &mut r, 1, 1);
    let (_, rx1_bufs) = r.rx[1].push_rx(&[2048]);
    kick(&t, 2);
    let early_rx = wire(&frame(300, 7));
    peers[1].send_frame(&early_rx).expect("send");
    assert!(quiet(&peers[1]), "tx1 not polled before VQ_PAIRS_SET");
    assert_eq!(r.tx[1].used_idx(), 0);
    assert_eq!(r.rx[1].used_idx(), 0, "rx1 not filled before VQ_PAIRS_SET");
    // Pair 0 works meanwhile.
    let zero = transmit(&t, &mut r, 0, 2);
    assert_eq!(peers[0].recv_frame().expect("frame"), zero);

    // Two pairs: what waited on pair 1 flows, intact, both ways.
    assert_eq!(pairs_set(&t, &mut r, 2), ACK_OK);
    assert_eq!(peers[1].recv_frame().expect("frame on pair 1"), early_tx);
    assert!(wait_until(TIMEOUT, || r.rx[1].used_idx() == 1));
    assert_eq!(r.rx[1].used(0).1 as usize, early_rx.len());
    assert_eq!(
        arrived(&r.rx[1], rx1_bufs[0], early_rx.len()),
        early_rx,
        "intact"
    );
    assert_eq!(peers[1].queue_enabled(), Some(true));
    // Both pairs at once, each frame on its own pair's backend.
    let (_, rx0_bufs) = r.rx[0].push_rx(&[2048]);
    kick(&t, 0);
    let a = transmit(&t, &mut r, 0, 3);
    let b = transmit(&t, &mut r, 1, 4);
    assert_eq!(peers[0].recv_frame().expect("frame"), a);
    assert_eq!(peers[1].recv_frame().expect("frame"), b);
    let inbound = wire(&frame(500, 9));
    peers[0].send_frame(&inbound).expect("send");
    assert!(wait_until(TIMEOUT, || r.rx[0].used_idx() == 1));
    assert_eq!(arrived(&r.rx[0], rx0_bufs[0], inbound.len()), inbound);
    assert!(wait_until(TIMEOUT, || r.tx[1].used_idx() == 2));

    // Per-pair counters, and the top-level ones are their sums.
    assert!(wait_until(TIMEOUT, || metrics.tx.frames.get() == 4));
    assert_eq!(metrics.queues[0].tx.frames.get(), 2);
    assert_eq!(metrics.queues[1].tx.frames.get(), 2);
    assert_eq!(metrics.queues[0].rx.frames.get(), 1);
    assert!(wait_until(TIMEOUT, || metrics.queues[1].rx.frames.get() == 1));
    assert_eq!(metrics.rx.frames.get(), 2);
    assert_eq!(
        metrics.queues[1].tx.bytes.get(),
        (early_tx.len() + b.len() - 24) as u64
    );
    assert_eq!(metrics.ctrl.mq_pairs_sets.get(), 1);

    // Malformed MQ commands: ERR, counted, nothing changes.
    let (errors, oor, bad_len) = (
        metrics.ctrl.errors.get(),
        metrics.ctrl.out_of_range.get(),
        metrics.ctrl.bad_length.get(),
    );
    assert_eq!(pairs_set(&t, &mut r, 0), ACK_ERR, "0 pairs");
    assert_eq!(
        pairs_set(&t, &mut r, 3),
        ACK_ERR,
        "more than max_virtqueue_pairs"
    );
    assert_eq!(pairs_set(&t, &mut r, u16::MAX), ACK_ERR);
    let short = send(&t, &mut r.ctrl, 4, [MQ_CLASS, VQ_PAIRS_SET], &[2]);
    assert_eq!(short, ACK_ERR, "1-byte data");
    let rss = send(&t, &mut r.ctrl, 4, [MQ_CLASS, 1], &[0; 4]);
    assert_eq!(rss, ACK_ERR, "RSS_CONFIG is not offered");
    assert_eq!(metrics.ctrl.errors.get(), errors + 5);
    assert_eq!(metrics.ctrl.out_of_range.get(), oor + 3);
    assert_eq!(metrics.ctrl.bad_length.get(), bad_len + 1);
    assert_eq!(metrics.ctrl.mq_pairs_sets.get(), 1);
    let c = transmit(&t, &mut r, 1, 5);
    assert_eq!(peers[1].recv_frame().expect("pair 1 still on"), c);

    // Back to one pair: pair 1 stops being polled and its backend queue is detached.
    assert_eq!(pairs_set(&t, &mut r, 1), ACK_OK);
    assert!(wait_until(TIMEOUT, || peers[1].queue_enabled() == Some(false)));
    transmit(&t, &mut r, 1, 6);
    assert!(
        quiet(&peers[1]),
        "tx1 not polled after going back to one pair"
    );
    let d = transmit(&t, &mut r, 0, 8);
    assert_eq!(peers[0].recv_frame().expect("pair 0 still on"), d);
    assert_eq!(metrics.ctrl.mq_pairs_sets.get(), 2);

    // A reset and a new run start from one pair again.
    t.w32(VIRTIO_MMIO_STATUS, 0);
    let mut r = rings(&mem);
    start_mq(&mut t, &r);
    transmit(&t, &mut r, 1, 10);
    assert!(
        quiet(&peers[1]),
        "pair 1 idle after reset until VQ_PAIRS_SET"
    );
    assert_eq!(pairs_set(&t, &mut r, 2), ACK_OK);
    assert!(peers[1].recv_frame().is_ok());
}

#[test]
fn a_driver_without_mq_gets_one_pair_and_the_control_queue_at_2() {
    let mem = guest_mem();
    let (mut t, mut r, peers, metrics) = mq_transport(&mem, 2);
    assert!(t.negotiate(CTRL), "FEATURES_OK accepted");
    t.setup_queue(0, 256, r.rx[0].ring_addrs());
    t.setup_queue(1, 256, r.tx[0].ring_addrs());
    t.setup_queue(2, CTRL_QUEUE_SIZE, r.ctrl.ring_addrs());
    t.driver_ok();
    assert_eq!(t.status() & 0xff, 0xf, "running with three queues");
    let a = transmit(&t, &mut r, 0, 1);
    assert_eq!(peers[0].recv_frame().expect("frame"), a);
    let ack = send(
        &t,
        &mut r.ctrl,
        2,
        [MQ_CLASS, VQ_PAIRS_SET],
        &2u16.to_le_bytes(),
    );
    assert_eq!(ack, ACK_ERR, "MQ not negotiated");
    assert_eq!(metrics.ctrl.not_negotiated.get(), 1);
    assert_eq!(peers[1].queue_enabled(), None, "pair 1 never started");
}

/// An IPv4/UDP frame of flow `flow` (source port), marked so it can be told apart from what
/// the host kernel sends on its own (IPv6 neighbour discovery).
fn udp_frame(flow: u16) -> Vec<u8> {
    let payload = [b'v', b'm', b'm', b'q', flow as u8, (flow >> 8) as u8];
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    let ip_len = (20 + 8 + payload.len()) as u16;
    f.extend_from_slice(&[
        0x45,
        0,
        (ip_len >> 8) as u8,
        ip_len as u8,
        0,
        0,
        0x40,
        0,
        64,
        17,
    ]);
    f.extend_from_slice(&[0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    let sport = 1000 + flow;
    let udp_len = (8 + payload.len()) as u16;
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&2000u16.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&payload);
    f
}

/// The marked UDP frames the guest received on `q` since used index `from` (buffers by head
/// in `bufs`), by flow.
fn received_flows(
    q: &GuestQueue,
    bufs: &std::collections::HashMap<u32, u64>,
    from: u16,
) -> Vec<(u16, Vec<u8>)> {
    q.used_since(from)
        .into_iter()
        .filter_map(|(id, len)| {
            let bytes = q.read(bufs[&id], len as usize);
            let frame = bytes.get(12..)?.to_vec();
            let marker = frame.get(42..46)?;
            (marker == b"vmmq").then(|| (u16::from_le_bytes([frame[46], frame[47]]), frame))
        })
        .collect()
}

#[test]
fn a_real_multi_queue_tap_carries_frames_on_every_enabled_pair() {
    use crate::test_utils::link::{link_up, PacketSocket};
    use crate::test_utils::netns::in_netns;
    use crate::virtio::net::NetConfig;

    in_netns(|| {
        let config: NetConfig = "tap=vmmmqdev0,queues=2".parse().expect("config");
        let device = NetDevice::new(&config).expect("device on a multi-queue tap");
        assert_eq!(device.queue_pairs(), 2);
        let metrics = device.metrics();
        link_up("vmmmqdev0").expect("link up");
        const ETHERTYPE: u16 = 0x88b5;
        let experimental = PacketSocket::open("vmmmqdev0", ETHERTYPE).expect("packet socket");
        let ipv4 = PacketSocket::open("vmmmqdev0", 0x0800).expect("packet socket");
        let mem = guest_mem();
        let mut t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
        let mut r = rings(&mem);
        // Each ring's buffers by head (heads are per ring).
        let mut bufs = [
            std::collections::HashMap::new(),
            std::collections::HashMap::new(),
        ];
        for (q, bufs) in r.rx.iter_mut().zip(&mut bufs) {
            for _ in 0..64 {
                let (head, addrs) = q.push_rx(&[2048]);
                bufs.insert(u32::from(head), addrs[0]);
            }
        }
        start_mq(&mut t, &r);
        let [bufs0, bufs1] = bufs;

        // One pair: every flow lands on pair 0 (pair 1's tap queue is detached).
        for flow in 0..8 {
            ipv4.send(&udp_frame(flow)).expect("send");
        }
        let on_pair_0 = || received_flows(&r.rx[0], &bufs0, 0).len();
        assert!(wait_until(TIMEOUT, || on_pair_0() == 8), "{}", on_pair_0());
        assert!(received_flows(&r.rx[1], &bufs1, 0).is_empty());
        let (rx0_seen, rx1_seen) = (r.rx[0].used_idx(), r.rx[1].used_idx());

        // Two pairs: frames from both tx queues reach the host intact; host flows spread
        // over both rx queues (32 flows: all on one queue has odds 2^-31).
        assert_eq!(pairs_set(&t, &mut r, 2), ACK_OK);
        for pair in 0..2 {
            let out = wire(&{
                let mut f = vec![0xff; 6];
                f.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
                f.extend_from_slice(&ETHERTYPE.to_be_bytes());
                f.extend(std::iter::repeat_n(pair as u8 + 0x40, 100));
                f
            });
            r.tx[pair].push_tx(&out, &[]);
            kick(&t, 2 * pair + 1);
            let mut buf = vec![0u8; 2048];
            let n = loop {
                // SAFETY: `buf` has room for its length and outlives the call.
                let n = unsafe {
                    libc::recv(
                        std::os::fd::AsRawFd::as_raw_fd(&experimental),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                    )
                };
                assert!(n > 0, "recv: {}", std::io::Error::last_os_error());
                if n as usize == out.len() - 12 {
                    break n as usize;
                }
            };
            assert_eq!(buf[..n], out[12..], "pair {pair}'s frame intact");
        }
        std::thread::sleep(Duration::from_millis(50));
        for flow in 100..132 {
            ipv4.send(&udp_frame(flow)).expect("send");
        }
        let total = || {
            received_flows(&r.rx[0], &bufs0, rx0_seen).len()
                + received_flows(&r.rx[1], &bufs1, rx1_seen).len()
        };
        assert!(wait_until(TIMEOUT, || total() == 32), "{}", total());
        let on_pair_1 = received_flows(&r.rx[1], &bufs1, rx1_seen);
        assert!(!on_pair_1.is_empty(), "no flow steered to pair 1");
        for (flow, frame) in on_pair_1 {
            assert_eq!(frame, udp_frame(flow), "intact");
        }
        assert!(wait_until(TIMEOUT, || metrics.queues[1].tx.frames.get() == 1));
        assert_eq!(metrics.queues[0].tx.frames.get(), 1);
        assert!(metrics.queues[1].rx.frames.get() >= 1);
        assert_eq!(
            metrics.rx.frames.get(),
            metrics.queues[0].rx.frames.get() + metrics.queues[1].rx.frames.get()
        );
        drop(t);
    });
}

/// Acknowledges whatever interrupts are pending (the irqfd count and InterruptStatus).
fn drain_interrupts(t: &mut MmioTransport) {
    use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INTERRUPT_STATUS};
    crate::test_utils::mmio::wait_eventfd(t.irqfd(), Duration::from_millis(20));
    let status = t.r32(VIRTIO_MMIO_INTERRUPT_STATUS);
    t.w32(VIRTIO_MMIO_INTERRUPT_ACK, status);
}

#[test]
fn the_guests_coalescing_applies_to_every_pair() {
    let mem = guest_mem();
    let (mut t, mut r, peers, metrics) = mq_transport(&mem, 2);
    let features = MQ | bit(VIRTIO_NET_F_NOTF_COAL);
    assert!(t.negotiate(features), "FEATURES_OK accepted");
    for (index, q) in [&r.rx[0], &r.tx[0], &r.rx[1], &r.tx[1]]
        .into_iter()
        .enumerate()
    {
        t.setup_queue(index as u32, 256, q.ring_addrs());
    }
    t.setup_queue(4, CTRL_QUEUE_SIZE, r.ctrl.ring_addrs());
    t.driver_ok();
    assert_eq!(pairs_set(&t, &mut r, 2), ACK_OK);
    // TX_SET, carried out by pair 0's worker, holds pair 1's tx interrupts too.
    let mut coal = 4u32.to_le_bytes().to_vec();
    coal.extend_from_slice(&1_000_000u32.to_le_bytes());
    let tx_set = [
        VIRTIO_NET_CTRL_NOTF_COAL as u8,
        VIRTIO_NET_CTRL_NOTF_COAL_TX_SET as u8,
    ];
    assert_eq!(send(&t, &mut r.ctrl, 4, tx_set, &coal), ACK_OK);
    // Pair 1's worker picks it up on its next wake-up (the tuning eventfd).
    std::thread::sleep(Duration::from_millis(100));
    drain_interrupts(&mut t);
    for seed in 0..3 {
        let used = r.tx[1].used_idx();
        transmit(&t, &mut r, 1, seed);
        peers[1].recv_frame().expect("frame on pair 1");
        assert!(wait_until(TIMEOUT, || r.tx[1].used_idx() == used + 1));
    }
    assert_eq!(
        crate::test_utils::mmio::wait_eventfd(t.irqfd(), Duration::from_millis(50)),
        0,
        "pair 1 holds its interrupt: 3 of 4 tx frames"
    );
    transmit(&t, &mut r, 1, 3);
    peers[1].recv_frame().expect("frame on pair 1");
    assert!(crate::test_utils::mmio::wait_eventfd(t.irqfd(), TIMEOUT) > 0);
    assert!(reaches(&metrics.coalesce_packet_releases, 1));
    assert_eq!(metrics.queues[1].tx.frames.get(), 4);
}

/// The driver may set up fewer pairs than `max_virtqueue_pairs` (virtio leaves unused queues
/// disabled): DRIVER_OK succeeds with pairs 0 and 1 of 3 set up, VQ_PAIRS_SET may enable
/// those two and no more, and pair 2's worker never runs.
#[test]
fn a_driver_may_set_up_fewer_pairs_than_the_device_has() {
    let mem = guest_mem();
    let (mut t, mut r, peers, metrics) = mq_transport(&mem, 3);
    // The control queue is at 2 × max_virtqueue_pairs = 6; queues 4 and 5 stay disabled.
    start_mq_with_ctrl_at(&mut t, &r, 6);
    let set = |t: &MmioTransport, r: &mut Rings, pairs: u16| {
        send(
            t,
            &mut r.ctrl,
            6,
            [MQ_CLASS, VQ_PAIRS_SET],
            &pairs.to_le_bytes(),
        )
    };
    assert_eq!(set(&t, &mut r, 3), ACK_ERR, "pair 2 was not set up");
    assert_eq!(set(&t, &mut r, 2), ACK_OK);
    for (pair, peer) in peers.iter().enumerate().take(2) {
        let sent = transmit(&t, &mut r, pair, pair as u8 + 1);
        assert_eq!(peer.recv_frame().expect("frame"), sent, "pair {pair}");
    }
    assert_eq!(metrics.ctrl.mq_pairs_sets.get(), 1);
    assert_eq!(metrics.needs_reset_events.get(), 0);
    // A half-set-up pair counts as not set up: one pair only.
    let (mut t, mut r, _peers, _) = mq_transport(&mem, 3);
    assert!(t.negotiate(MQ));
    for (index, q) in [&r.rx[0], &r.tx[0], &r.rx[1]].into_iter().enumerate() {
        t.setup_queue(index as u32, 256, q.ring_addrs());
    }
    t.setup_queue(6, CTRL_QUEUE_SIZE, r.ctrl.ring_addrs());
    t.driver_ok();
    assert_eq!(t.status() & 0xff, 0xf, "running");
    assert_eq!(
        set(&t, &mut r, 2),
        ACK_ERR,
        "pair 1 is missing its tx queue"
    );
    assert_eq!(set(&t, &mut r, 1), ACK_OK);
}
