//! The worker thread end to end: the transport activates the device from registers, the test
//! plays KVM (writes the kick eventfds, watches the irqfd) and the far end of the backend.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_NEEDS_RESET};
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_CONFIG_GENERATION, VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INTERRUPT_STATUS,
    VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING, VIRTIO_MMIO_STATUS,
};
use virtio_bindings::virtio_net::{VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_MRG_RXBUF};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::backend::{Offloads, PairBackend, PairPeer};
use crate::test_utils::mmio::{wait_eventfd, wait_until, Registers};
use crate::test_utils::packed::GuestPackedQueue;
use crate::virtio::net::metrics::Counter;
use crate::virtio::net::tests::driver::{rig_for, start_rings, started_rings, DriverRing};
use crate::virtio::net::tests::support::{frame, guest_mem, wire, GuestQueue, WRITE};
use crate::virtio::net::LinkState;
use crate::virtio::net::{LinkControl, MacAddr, NetDevice, NetMetrics, TuningControl};
use crate::virtio::MmioTransport;
use crate::BusDevice;

pub(super) const TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const VERSION_1: u64 = 1 << 32;
const MMIO_BASE: u64 = 0xd000_0000;

pub(super) struct Rig {
    pub(super) transport: MmioTransport,
    pub(super) peer: PairPeer,
    pub(super) metrics: Arc<NetMetrics>,
    pub(super) link: LinkControl,
    pub(super) tuning: TuningControl,
}

pub(super) fn rig(mem: &GuestMemoryMmap) -> Rig {
    rig_with(mem, |_| {})
}

/// A rig whose device `configure` sees before it goes behind the transport.
pub(super) fn rig_with(
    mem: &GuestMemoryMmap,
    configure: impl FnOnce(&mut NetDevice<PairBackend>),
) -> Rig {
    let (backend, peer) = PairBackend::new().expect("socketpair");
    let mut device = NetDevice::with_backend(backend, MacAddr::new([2, 0, 0, 0, 0, 1]), 256);
    configure(&mut device);
    let metrics = device.metrics();
    let link = device.link_control();
    let tuning = device.tuning_control();
    let transport = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    Rig {
        transport,
        peer,
        metrics,
        link,
        tuning,
    }
}

/// Negotiates `features`, programs both queues and sets DRIVER_OK.
pub(super) fn start(t: &mut MmioTransport, features: u64, rx: &GuestQueue, tx: &GuestQueue) {
    assert!(t.negotiate(features), "FEATURES_OK accepted");
    t.setup_queue(0, 256, rx.ring_addrs());
    t.setup_queue(1, 256, tx.ring_addrs());
    t.driver_ok();
    let status = t.r32(VIRTIO_MMIO_STATUS);
    assert_eq!(
        status & (VIRTIO_CONFIG_S_DRIVER_OK | VIRTIO_CONFIG_S_NEEDS_RESET),
        VIRTIO_CONFIG_S_DRIVER_OK
    );
}

/// [`start`] on the rings of [`queues`]; returns them.
pub(super) fn start_on_queues(
    t: &mut MmioTransport,
    mem: &GuestMemoryMmap,
    features: u64,
) -> (GuestQueue, GuestQueue) {
    let (rx, tx) = queues(mem);
    start(t, features, &rx, &tx);
    (rx, tx)
}

/// A [`rig`] on `mem` with its queues of [`queues`] started with `features`.
fn started(mem: &GuestMemoryMmap, features: u64) -> (Rig, GuestQueue, GuestQueue) {
    let mut r = rig(mem);
    let (rx, tx) = start_on_queues(&mut r.transport, mem, features);
    (r, rx, tx)
}

/// After a reset, the driver starts over with VERSION_1 on [`queues_after_reset`]; a
/// `len`-byte frame `seed` sent on the new tx queue reaches the peer.
fn restart_and_send(r: &mut Rig, mem: &GuestMemoryMmap, len: usize, seed: u8) {
    let (rx, mut tx) = queues_after_reset(mem);
    start(&mut r.transport, VERSION_1, &rx, &tx);
    let out = wire(&frame(len, seed));
    tx.push_tx(&out, &[]);
    kick(&r.transport, 1);
    assert_eq!(r.peer.recv_frame().expect("frame"), out);
}

/// Plays KVM: the guest wrote `queue` to QueueNotify, the ioeventfd fires.
pub(super) fn kick(t: &MmioTransport, queue: usize) {
    t.ioeventfds(MMIO_BASE)[queue].0.write(1).expect("kick");
}

/// Waits for the irqfd and acknowledges what InterruptStatus says.
pub(super) fn take_interrupt(t: &mut MmioTransport) -> u32 {
    assert!(wait_eventfd(t.irqfd(), TIMEOUT) > 0, "irqfd signalled");
    let status = t.r32(VIRTIO_MMIO_INTERRUPT_STATUS);
    t.w32(VIRTIO_MMIO_INTERRUPT_ACK, status);
    status
}

pub(super) fn queues(mem: &GuestMemoryMmap) -> (GuestQueue, GuestQueue) {
    (
        GuestQueue::at(mem, GuestAddress(0), 256, 0x10_0000),
        GuestQueue::at(mem, GuestAddress(0x1_0000), 256, 0x40_0000),
    )
}

/// A second pair of queues, clear of [`queues`]' rings and buffers: the driver starting over
/// after a reset.
pub(super) fn queues_after_reset(mem: &GuestMemoryMmap) -> (GuestQueue, GuestQueue) {
    (
        GuestQueue::at(mem, GuestAddress(0x2_0000), 256, 0x60_0000),
        GuestQueue::at(mem, GuestAddress(0x3_0000), 256, 0x70_0000),
    )
}

/// Sends one frame from the guest on queue 1 and waits until the device has returned its
/// buffer.
pub(super) fn send_one(rig: &Rig, tx: &mut GuestQueue, seed: u8) {
    let used = tx.used_idx();
    tx.push_tx(&wire(&frame(64, seed)), &[]);
    kick(&rig.transport, 1);
    rig.peer.recv_frame().expect("frame");
    assert!(wait_until(TIMEOUT, || tx.used_idx() == used.wrapping_add(1)));
}

/// Waits (up to [`TIMEOUT`]) until `counter` reads `value`; false if it never does.
pub(super) fn reaches(counter: &Counter, value: u64) -> bool {
    wait_until(TIMEOUT, || counter.get() == value)
}

/// No interrupt within 50 ms.
pub(super) fn no_interrupt(t: &MmioTransport) -> bool {
    wait_eventfd(t.irqfd(), Duration::from_millis(50)) == 0
}

/// A device with `pairs` queue pairs, a socket-pair backend each (MAC 02:00:00:00:00:01,
/// 256-entry queues); the far ends in pair order.
pub(super) fn multi_queue_device(pairs: usize) -> (NetDevice<PairBackend>, Vec<PairPeer>) {
    let (backends, peers) = (0..pairs)
        .map(|_| PairBackend::new().expect("socketpair"))
        .unzip();
    let device = NetDevice::with_backends(backends, MacAddr::new([2, 0, 0, 0, 0, 1]), 256);
    (device, peers)
}

/// Sends `class.command` with `data` on the control queue `q` (queue `index`) and waits until
/// the device returns the chain; returns the ack, the used entry and the chain's id.
pub(super) fn ctrl_command<Q: DriverRing>(
    t: &MmioTransport,
    q: &mut Q,
    index: usize,
    cmd: [u8; 2],
    data: &[u8],
) -> (u8, (u32, u32), u16) {
    let mut readable = cmd.to_vec();
    readable.extend_from_slice(data);
    let out = q.put(&readable);
    let ack = q.put(&[0xAA]);
    q.skip_used();
    let id = q.offer(&[(out, readable.len() as u32, 0), (ack, 1, WRITE)]);
    kick(t, index);
    let used = q.wait_used();
    (q.peek(ack, 1)[0], used, id)
}

#[test]
fn frames_flow_both_ways_through_the_worker() {
    let mem = guest_mem();
    let features = VERSION_1 | 1 << VIRTIO_NET_F_MRG_RXBUF | 1 << VIRTIO_NET_F_GUEST_CSUM;
    let (mut r, mut rx, mut tx) = started(&mem, features);
    assert_eq!(
        r.peer.offloads(),
        Offloads::CSUM,
        "tap offloads follow the guest's"
    );
    assert_eq!(r.peer.vnet_hdr_size(), 12);

    // tx: guest → peer.
    let out = wire(&frame(1000, 1));
    tx.push_tx(&out, &[12]);
    kick(&r.transport, 1);
    assert_eq!(r.peer.recv_frame().expect("frame"), out);
    assert_eq!(take_interrupt(&mut r.transport), VIRTIO_MMIO_INT_VRING);
    assert_eq!(tx.used_idx(), 1);

    // rx: peer → guest. The worker found no buffers at start and asked to be kicked.
    assert_eq!(rx.used_flags(), 0);
    let (_, bufs) = rx.push_rx(&[2048]);
    rx.push_rx(&[2048]);
    kick(&r.transport, 0);
    let inbound = frame(700, 2);
    r.peer.send_frame(&wire(&inbound)).expect("send");
    assert!(wait_until(TIMEOUT, || rx.used_idx() == 1));
    assert_eq!(rx.read(bufs[0] + 12, 700), inbound);
    assert_eq!(take_interrupt(&mut r.transport), VIRTIO_MMIO_INT_VRING);

    // Reset stops the worker and hands the backend back: a second life works.
    r.transport.w32(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(r.metrics.tx.frames.get(), 1);
    assert_eq!(r.metrics.rx.frames.get(), 1);
    assert_eq!(r.metrics.rx.kicks.get(), 1);
    assert_eq!(r.metrics.tx.kicks.get(), 1);
    assert_eq!(r.metrics.irqfd_signals.get(), 2);
    restart_and_send(&mut r, &mem, 60, 3);
    assert_eq!(r.metrics.activations.get(), 2);
    assert_eq!(r.peer.offloads(), Offloads::NONE);
}

/// Frames one at a time put the worker's rx in sparse-read mode (a call reads one frame and
/// stops without the empty read); a burst that follows is still delivered whole and in order:
/// the backend fd is polled level-triggered, so the frames a call leaves queued bring the
/// worker back.
#[test]
fn a_burst_after_sparse_frames_is_delivered_whole() {
    burst_after_sparse_frames::<GuestQueue>();
}

#[test]
fn a_burst_after_sparse_frames_is_delivered_whole_on_a_packed_ring() {
    burst_after_sparse_frames::<GuestPackedQueue>();
}

fn burst_after_sparse_frames<Q: DriverRing>() {
    let mem = guest_mem();
    // The buffers are offered before the device starts.
    let (mut rx, tx) = Q::pair(&mem);
    let bufs: HashMap<u32, u64> = (0..200)
        .map(|_| {
            let (id, addrs) = rx.offer_rx(&[2048]);
            (u32::from(id), addrs[0])
        })
        .collect();
    let mut r = rig_for::<Q>(&mem, |_| {});
    start_rings(&mut r.transport, VERSION_1, &[&rx, &tx]);
    let mut sent = 0u16;
    let check = |rx: &mut Q, i: u16| {
        let (id, len) = rx.wait_used();
        assert_eq!(len, 12 + 60);
        assert_eq!(rx.peek(bufs[&id] + 12, 60), frame(60, i as u8), "frame {i}");
    };
    for _ in 0..5 {
        r.peer
            .send_frame(&wire(&frame(60, sent as u8)))
            .expect("send");
        check(&mut rx, sent);
        sent += 1;
    }
    for _ in 0..150 {
        r.peer
            .send_frame(&wire(&frame(60, sent as u8)))
            .expect("send");
        sent += 1;
    }
    for i in 5..sent {
        check(&mut rx, i);
    }
    assert!(rx.next_used().is_none(), "nothing else used");
    assert_eq!(r.metrics.rx.frames.get(), u64::from(sent));
}

#[test]
fn event_idx_suppresses_interrupts_end_to_end() {
    let mem = guest_mem();
    let (mut r, _rx, mut tx) = started(&mem, VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX);
    // used_event stays 0: the driver wants one interrupt, for the first buffer only.
    for i in 0..3u8 {
        send_one(&r, &mut tx, i);
        // The worker asks for a kick at the next buffer (avail_event).
        assert!(wait_until(TIMEOUT, || tx.avail_event() == u16::from(i) + 1));
    }
    assert!(reaches(&r.metrics.tx.kicks, 3));
    assert_eq!(take_interrupt(&mut r.transport), VIRTIO_MMIO_INT_VRING);
    assert_eq!(r.metrics.tx.interrupts_raised.get(), 1);
    assert_eq!(r.metrics.tx.interrupts_suppressed_event_idx.get(), 2);
    assert!(no_interrupt(&r.transport));

    // Moving used_event forward asks for the next one.
    tx.set_used_event(3);
    tx.push_tx(&wire(&frame(64, 9)), &[]);
    kick(&r.transport, 1);
    r.peer.recv_frame().expect("frame");
    assert_eq!(take_interrupt(&mut r.transport), VIRTIO_MMIO_INT_VRING);
}

#[test]
fn rx_backpressure_resumes_on_the_rx_kick() {
    let mem = guest_mem();
    let (r, mut rx, _tx) = started(&mem, VERSION_1 | 1 << VIRTIO_NET_F_MRG_RXBUF);
    let frames: Vec<_> = (0..5).map(|i| frame(100 + i, i as u8)).collect();
    for f in &frames {
        r.peer.send_frame(&wire(f)).expect("send");
    }
    let rx_metrics = &r.metrics.rx;
    assert!(wait_until(TIMEOUT, || rx_metrics.no_buffer_stalls.get() >= 1));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rx_metrics.frames.get(), 0, "nothing read without buffers");
    assert_eq!(rx_metrics.dropped_no_buffer.get(), 0);

    let bufs: Vec<_> = (0..5).map(|_| rx.push_rx(&[1024]).1[0]).collect();
    kick(&r.transport, 0);
    assert!(wait_until(TIMEOUT, || rx.used_idx() == 5));
    for (addr, f) in bufs.iter().zip(&frames) {
        assert_eq!(rx.read(addr + 12, f.len()), *f);
    }
    assert!(reaches(&rx_metrics.frames, 5));
    assert_eq!(rx_metrics.dropped_no_buffer.get(), 0);
}

#[test]
fn broken_ring_sets_needs_reset_and_the_vmm_survives() {
    let mem = guest_mem();
    let (mut r, _rx, mut tx) = started(&mem, VERSION_1);
    tx.set_avail_idx(1000);
    kick(&r.transport, 1);
    let t = &r.transport;
    assert!(wait_until(TIMEOUT, || t.status()
        & VIRTIO_CONFIG_S_NEEDS_RESET
        != 0));
    assert_eq!(take_interrupt(&mut r.transport), VIRTIO_MMIO_INT_CONFIG);
    assert_eq!(r.metrics.needs_reset_events.get(), 1);

    // The driver resets and starts over; the backend survived the failed worker.
    r.transport.w32(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(r.transport.r32(VIRTIO_MMIO_STATUS), 0);
    restart_and_send(&mut r, &mem, 64, 1);
}

#[test]
fn link_changes_raise_a_config_interrupt() {
    let mem = guest_mem();
    let Rig {
        mut transport,
        link,
        ..
    } = rig(&mem);
    let mut status = [0u8; 2];
    transport.read(0x106, &mut status);
    assert_eq!(status, [1, 0], "link up");
    let generation = transport.r32(VIRTIO_MMIO_CONFIG_GENERATION);

    // Before DRIVER_OK: the value and generation change, no interrupt.
    link.set_link(LinkState::Down);
    transport.read(0x106, &mut status);
    assert_eq!(status, [0, 0]);
    assert_ne!(transport.r32(VIRTIO_MMIO_CONFIG_GENERATION), generation);
    assert_eq!(
        wait_eventfd(transport.irqfd(), Duration::from_millis(20)),
        0
    );

    start_on_queues(&mut transport, &mem, VERSION_1);
    link.set_link(LinkState::Up);
    assert_eq!(take_interrupt(&mut transport), VIRTIO_MMIO_INT_CONFIG);
    transport.read(0x106, &mut status);
    assert_eq!(status, [1, 0]);
    link.set_link(LinkState::Up);
    assert_eq!(
        wait_eventfd(transport.irqfd(), Duration::from_millis(20)),
        0,
        "no change, no interrupt"
    );
}

#[test]
fn dropping_the_transport_stops_the_worker() {
    let mem = guest_mem();
    let (r, _rx, _tx) = started(&mem, VERSION_1);
    assert!(r.transport.device().features() & VERSION_1 != 0);
    let Rig {
        transport, peer, ..
    } = r;
    drop(transport);
    // The worker joined and the backend's fd closed: the peer reads end of file.
    assert_eq!(peer.recv_frame().expect("eof"), Vec::<u8>::new());
}

#[test]
fn a_full_ring_is_sent_in_budgeted_rounds_from_one_kick() {
    full_ring_from_one_kick::<GuestQueue>();
}

#[test]
fn a_full_ring_is_sent_in_budgeted_rounds_from_one_kick_on_a_packed_ring() {
    full_ring_from_one_kick::<GuestPackedQueue>();
}

fn full_ring_from_one_kick<Q: DriverRing>() {
    let mem = guest_mem();
    let (r, _rx, mut tx) = started_rings::<Q>(&mem, VERSION_1, |_| {});
    let frames: Vec<_> = (0..256)
        .map(|i| wire(&frame(60 + i % 50, i as u8)))
        .collect();
    let ids: Vec<u16> = frames.iter().map(|f| tx.offer_tx(f, &[])).collect();
    kick(&r.transport, 1);
    for f in &frames {
        assert_eq!(r.peer.recv_frame().expect("frame"), *f);
    }
    assert!(reaches(&r.metrics.tx.frames, 256));
    assert_eq!(r.metrics.tx.kicks.get(), 1);
    for id in ids {
        assert_eq!(tx.wait_used(), (u32::from(id), 0));
    }
}
