//! Runtime knobs end to end through the worker: interrupt coalescing (packet and time bounds,
//! switched off while an interrupt is held), busy-poll, EVENT_IDX suppression switched off,
//! and the worker's seccomp filter. Coalescing and busy-poll run on split and packed rings.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET;
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::GuestMemoryMmap;

use super::driver::{rig_for, send_frame, start_rings, started_rings, DriverRing};
use super::support::{frame, guest_mem, wire, GuestQueue};
use super::worker::{
    kick, no_interrupt, queues, reaches, rig, rig_with, send_one, start, start_on_queues,
    take_interrupt, Rig, TIMEOUT, VERSION_1,
};
use crate::backend::{NetBackend, PairBackend};
use crate::test_utils::mmio::{wait_until, Registers};
use crate::test_utils::packed::GuestPackedQueue;
use crate::virtio::net::{InterruptCoalescing, MacAddr, NetDevice, NetTuning};
use crate::virtio::MmioTransport;

const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;

fn coalescing(max_packets: u16, max_usecs: u32) -> NetTuning {
    NetTuning {
        interrupt_coalescing: InterruptCoalescing {
            max_packets,
            max_usecs,
        },
        ..NetTuning::default()
    }
}

/// A rig started with VERSION_1 whose device coalesces interrupts from the start; returns
/// the rig and the driver's tx queue.
fn coalescing_from_the_start<Q: DriverRing>(
    mem: &GuestMemoryMmap,
    max_packets: u16,
    max_usecs: u32,
) -> (Rig, Q) {
    let (rig, _rx, tx) = started_rings::<Q>(mem, VERSION_1, |device| {
        let tuning = device.tuning_control();
        tuning
            .set(coalescing(max_packets, max_usecs))
            .expect("valid");
    });
    (rig, tx)
}

#[test]
fn coalescing_holds_the_interrupt_until_max_packets() {
    holds_until_max_packets::<GuestQueue>();
}

#[test]
fn coalescing_holds_the_interrupt_until_max_packets_on_a_packed_ring() {
    holds_until_max_packets::<GuestPackedQueue>();
}

fn holds_until_max_packets<Q: DriverRing>() {
    let mem = guest_mem();
    let (mut rig, mut tx) = coalescing_from_the_start::<Q>(&mem, 4, 1_000_000);
    for seed in 0..3 {
        send_frame(&rig, &mut tx, seed);
    }
    assert!(no_interrupt(&rig.transport), "held: 3 of 4 packets");
    send_frame(&rig, &mut tx, 3);
    assert_eq!(take_interrupt(&mut rig.transport), VIRTIO_MMIO_INT_VRING);
    assert!(reaches(&rig.metrics.coalesce_packet_releases, 1));
    assert_eq!(rig.metrics.interrupts_held.get(), 3);
    assert_eq!(rig.metrics.irqfd_signals.get(), 1);
    assert_eq!(
        rig.metrics.tx.interrupts_raised.get(),
        4,
        "the driver wanted 4"
    );
    assert_eq!(rig.metrics.coalesce_timer_releases.get(), 0);
}

#[test]
fn coalescing_releases_a_held_interrupt_after_max_usecs() {
    released_after_max_usecs::<GuestQueue>();
}

#[test]
fn coalescing_releases_a_held_interrupt_after_max_usecs_on_a_packed_ring() {
    released_after_max_usecs::<GuestPackedQueue>();
}

fn released_after_max_usecs<Q: DriverRing>() {
    let mem = guest_mem();
    let (mut rig, _rx, mut tx) = started_rings::<Q>(&mem, VERSION_1, |_| {});
    // Changed at run time, while the worker runs.
    rig.tuning.set(coalescing(64, 30_000)).expect("valid");
    std::thread::sleep(Duration::from_millis(20));
    let sent = Instant::now();
    send_frame(&rig, &mut tx, 1);
    assert_eq!(take_interrupt(&mut rig.transport), VIRTIO_MMIO_INT_VRING);
    assert!(
        sent.elapsed() >= Duration::from_millis(30),
        "{:?}",
        sent.elapsed()
    );
    assert!(reaches(&rig.metrics.coalesce_timer_releases, 1));
    assert_eq!(rig.metrics.interrupts_held.get(), 1);
    assert_eq!(rig.metrics.irqfd_signals.get(), 1);
}

#[test]
fn switching_coalescing_off_releases_the_held_interrupt() {
    let mem = guest_mem();
    let (mut rig, mut tx) = coalescing_from_the_start::<GuestQueue>(&mem, 0, 1_000_000);
    send_one(&rig, &mut tx, 1);
    assert!(no_interrupt(&rig.transport), "held for up to 1 s");
    let switched = Instant::now();
    rig.tuning.set(NetTuning::default()).expect("valid");
    assert_eq!(take_interrupt(&mut rig.transport), VIRTIO_MMIO_INT_VRING);
    assert!(switched.elapsed() < Duration::from_millis(500));
    assert_eq!(rig.metrics.coalesce_timer_releases.get(), 0);
    // Off now: the next batch interrupts at once.
    send_one(&rig, &mut tx, 2);
    assert_eq!(take_interrupt(&mut rig.transport), VIRTIO_MMIO_INT_VRING);
}

#[test]
fn event_idx_suppression_can_be_switched_off() {
    let mem = guest_mem();
    let mut rig = rig(&mem);
    let (_rx, mut tx) = start_on_queues(&mut rig.transport, &mem, VERSION_1 | EVENT_IDX);
    rig.tuning
        .set(NetTuning {
            event_idx: false,
            ..NetTuning::default()
        })
        .expect("valid");
    std::thread::sleep(Duration::from_millis(20));
    // used_event stays 0: the driver wants only the first interrupt; the device sends three.
    for seed in 0..3 {
        send_one(&rig, &mut tx, seed);
        assert_eq!(take_interrupt(&mut rig.transport), VIRTIO_MMIO_INT_VRING);
    }
    assert_eq!(rig.metrics.tx.interrupts_raised.get(), 1);
    assert_eq!(rig.metrics.tx.interrupts_suppressed_event_idx.get(), 2);
    assert_eq!(rig.metrics.event_idx_overrides.get(), 2);
}

#[test]
fn the_worker_applies_its_seccomp_filter_before_running() {
    // A filter that lets everything through except epoll_wait, which fails with EPERM: the
    // worker's first wait fails, so the device asks for a reset. The test thread itself is
    // not filtered.
    let denied = [libc::SYS_epoll_wait, libc::SYS_epoll_pwait]
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect::<BTreeMap<_, _>>();
    let filter = SeccompFilter::new(
        denied,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .expect("filter");
    let program: seccompiler::BpfProgram = filter.try_into().expect("compiles");
    let mem = guest_mem();
    let mut rig = rig_with(&mem, |device| {
        device
            .set_worker_seccomp_filter(Arc::new(program))
            .expect("installed");
    });
    let (rx, tx) = queues(&mem);
    // Not `start`: the device may already ask for a reset before DRIVER_OK can be read back.
    let t = &mut rig.transport;
    assert!(t.negotiate(VERSION_1));
    t.setup_queue(0, 256, rx.ring_addrs());
    t.setup_queue(1, 256, tx.ring_addrs());
    t.driver_ok();
    assert!(wait_until(TIMEOUT, || rig.transport.status()
        & VIRTIO_CONFIG_S_NEEDS_RESET
        != 0));
    assert_eq!(take_interrupt(&mut rig.transport), VIRTIO_MMIO_INT_CONFIG);
    assert_eq!(rig.metrics.needs_reset_events.get(), 1);
}

/// A driver that queues one frame, kicks only when the ring asks for it, waits for the frame
/// to be sent, and pauses `pause` before the next. Returns the kicks it wrote.
pub(super) fn paced_driver<Q: DriverRing>(
    rig: &Rig,
    tx: &mut Q,
    event_idx: bool,
    frames: u8,
    pause: Duration,
) -> u32 {
    let mut kicks = 0;
    for seed in 0..frames {
        let out = wire(&frame(64, seed));
        let id = tx.offer_tx(&out, &[]);
        if tx.wants_kick(1, event_idx) {
            kick(&rig.transport, 1);
            kicks += 1;
        }
        assert_eq!(rig.peer.recv_frame().expect("frame"), out);
        assert_eq!(tx.spin_used(), (u32::from(id), 0));
        std::thread::sleep(pause);
    }
    kicks
}

/// Sets the device's busy-poll window to `busy_poll_us` (0: off), before it starts.
fn busy_tuning<B: NetBackend>(busy_poll_us: u32) -> impl FnOnce(&mut NetDevice<B>) {
    move |device| {
        device
            .tuning_control()
            .set(NetTuning {
                busy_poll_us,
                ..NetTuning::default()
            })
            .expect("valid");
    }
}

/// A started rig with `Q`'s rings whose device busy-polls for `busy_poll_us` (0: off).
fn busy_rings<Q: DriverRing>(
    mem: &GuestMemoryMmap,
    features: u64,
    busy_poll_us: u32,
) -> (Rig, Q, Q) {
    started_rings::<Q>(mem, features, busy_tuning(busy_poll_us))
}

#[test]
fn busy_poll_saves_the_kicks_of_a_driver_that_pauses_less_than_the_window() {
    busy_poll_saves_kicks::<GuestQueue>();
}

#[test]
fn busy_poll_saves_the_kicks_of_a_driver_on_a_packed_ring() {
    busy_poll_saves_kicks::<GuestPackedQueue>();
}

fn busy_poll_saves_kicks<Q: DriverRing>() {
    let _turn = super::support::spinning_device();
    for event_idx in [true, false] {
        let features = VERSION_1
            | if event_idx {
                1 << VIRTIO_RING_F_EVENT_IDX
            } else {
                0
            };
        let mut kicks = Vec::new();
        for busy_poll_us in [0, 10_000] {
            let mem = guest_mem();
            let (rig, _rx, mut tx) = busy_rings::<Q>(&mem, features, busy_poll_us);
            // Pauses of 0.5 ms, well inside a 10 ms window (on a small machine running the
            // other tests beside it a pause now and then still outlasts it).
            let n = paced_driver(&rig, &mut tx, event_idx, 20, Duration::from_micros(500));
            let found = rig.metrics.busy_poll.found_work.get();
            if busy_poll_us == 0 {
                assert_eq!(rig.metrics.busy_poll.polls.get(), 0);
            } else {
                assert!(
                    found >= 12,
                    "event_idx {event_idx}: found work {found} times"
                );
                assert!(rig.metrics.busy_poll.polled_us.get() > 0);
            }
            kicks.push(n);
        }
        assert_eq!(
            kicks[0], 20,
            "event_idx {event_idx}: without busy-poll every frame kicks"
        );
        assert!(
            kicks[1] <= 8,
            "event_idx {event_idx}: busy-poll kept notifications off, yet {} kicks",
            kicks[1]
        );
    }
}

/// With `busy_poll_sleep_us` the window's looks are timer sleeps: a driver that pauses less
/// than the window still needs (almost) no kicks, and the worker slept between looks instead
/// of spinning; with 0 it spins and never sleeps.
#[test]
fn a_sleeping_busy_poll_saves_kicks_and_sleeps_between_looks() {
    let _turn = super::support::spinning_device();
    for sleep_us in [0, 100] {
        let mem = guest_mem();
        let (rig, _rx, mut tx) =
            started_rings::<GuestQueue>(&mem, VERSION_1 | EVENT_IDX, move |device| {
                device
                    .tuning_control()
                    .set(NetTuning {
                        busy_poll_us: 10_000,
                        busy_poll_sleep_us: sleep_us,
                        ..NetTuning::default()
                    })
                    .expect("valid");
            });
        let kicks = paced_driver(&rig, &mut tx, true, 20, Duration::from_micros(500));
        assert!(
            kicks <= 8,
            "sleep {sleep_us} µs: {kicks} kicks for 20 frames"
        );
        let m = &rig.metrics.busy_poll;
        assert!(wait_until(TIMEOUT, || m.found_work.get() >= 12));
        if sleep_us == 0 {
            assert_eq!(m.sleeps.get(), 0, "a spinning poll never sleeps");
        } else {
            // ~5 looks per 500 µs pause.
            assert!(
                wait_until(TIMEOUT, || m.sleeps.get() >= 20),
                "{}",
                m.sleeps.get()
            );
        }
    }
}

/// Receive-only traffic (the driver never transmits, so no tx queue parks): with busy-poll on,
/// the worker polls the backend for the window before it sleeps and finds the frames of a
/// peer that pauses less than the window; off, it never polls. Every frame lands whole either
/// way.
fn busy_poll_finds_received_frames<Q: DriverRing>() {
    let _turn = super::support::spinning_device();
    for busy_poll_us in [0, 10_000] {
        let mem = guest_mem();
        let mut rig = rig_for::<Q>(&mem, busy_tuning(busy_poll_us));
        let (mut rx, tx) = Q::pair(&mem);
        // The buffers are posted before the device starts: it never waits for them.
        let bufs: Vec<(u16, u64)> = (0..20)
            .map(|_| {
                let (id, addrs) = rx.offer_rx(&[2048]);
                (id, addrs[0])
            })
            .collect();
        start_rings(&mut rig.transport, VERSION_1, &[&rx, &tx]);
        // Let the windows at activation run out first.
        std::thread::sleep(Duration::from_millis(30));
        let found0 = rig.metrics.busy_poll.found_work.get();
        for (i, &(id, addr)) in bufs.iter().enumerate() {
            rig.peer
                .send_frame(&wire(&frame(100, i as u8)))
                .expect("send");
            assert_eq!(rx.wait_used(), (u32::from(id), 12 + 100));
            assert_eq!(rx.peek(addr + 12, 100), frame(100, i as u8), "frame {i}");
            // Well inside a 10 ms window (on a small machine running the other tests beside
            // it a pause now and then still outlasts it).
            std::thread::sleep(Duration::from_micros(500));
        }
        let found = rig.metrics.busy_poll.found_work.get() - found0;
        if busy_poll_us == 0 {
            assert_eq!(rig.metrics.busy_poll.polls.get(), 0);
        } else {
            assert!(found >= 12, "busy-poll found {found} of 20 frames");
            assert!(rig.metrics.busy_poll.polled_us.get() > 0);
        }
        assert_eq!(rig.metrics.tx.frames.get(), 0);
    }
}

/// A driver that posts one rx buffer at a time, each after the device ran out (a frame waits
/// in the backend), kicking only when the ring asks, and pauses less than the window: with
/// busy-poll on the device leaves rx notifications off while it polls for buffers, so the
/// driver need not kick; off, every buffer needs its kick.
fn busy_poll_saves_rx_kicks<Q: DriverRing>() {
    let _turn = super::support::spinning_device();
    for event_idx in [true, false] {
        let features = VERSION_1 | if event_idx { EVENT_IDX } else { 0 };
        let mut kicks = Vec::new();
        for busy_poll_us in [0, 10_000] {
            let mem = guest_mem();
            let (rig, mut rx, _tx) = busy_rings::<Q>(&mem, features, busy_poll_us);
            let mut n = 0;
            for i in 0..20u8 {
                rig.peer.send_frame(&wire(&frame(100, i))).expect("send");
                let (id, addrs) = rx.offer_rx(&[2048]);
                if rx.wants_kick(1, event_idx) {
                    kick(&rig.transport, 0);
                    n += 1;
                }
                assert_eq!(rx.wait_used(), (u32::from(id), 12 + 100));
                assert_eq!(rx.peek(addrs[0] + 12, 100), frame(100, i), "frame {i}");
                std::thread::sleep(Duration::from_micros(500));
            }
            if busy_poll_us > 0 {
                assert!(rig.metrics.busy_poll.found_work.get() >= 12);
            }
            kicks.push(n);
        }
        assert_eq!(
            kicks[0], 20,
            "event_idx {event_idx}: without busy-poll every buffer kicks"
        );
        assert!(
            kicks[1] <= 8,
            "event_idx {event_idx}: busy-poll kept rx notifications off, yet {} kicks",
            kicks[1]
        );
    }
}

#[test]
fn busy_poll_saves_the_rx_kicks_of_a_driver_that_refills_within_the_window() {
    busy_poll_saves_rx_kicks::<GuestQueue>();
}

#[test]
fn busy_poll_saves_the_rx_kicks_on_a_packed_ring() {
    busy_poll_saves_rx_kicks::<GuestPackedQueue>();
}

/// Busy-poll on, rx waiting for backend input (so the worker polls whatever tx does), and a
/// backend that stops taking frames with the driver's tx chains still queued: the worker must
/// keep looking at epoll while it polls, see the backend writable again and send the rest (a
/// poll that took the waiting tx queue for work would spin on it forever).
#[test]
fn busy_poll_waits_for_a_full_backend_and_sends_the_rest() {
    const BIG: usize = 16_000;
    let _turn = super::support::spinning_device();
    let mem = guest_mem();
    let (rig, mut rx, mut tx) = busy_rings::<GuestQueue>(&mem, VERSION_1, 10_000);
    for _ in 0..8 {
        rx.offer_rx(&[2048]);
    }
    kick(&rig.transport, 0);
    let frames: Vec<Vec<u8>> = (0..64).map(|i| wire(&frame(BIG, i as u8))).collect();
    for f in &frames {
        tx.offer_tx(f, &[12]);
    }
    kick(&rig.transport, 1);
    assert!(wait_until(TIMEOUT, || rig.metrics.tx.backend_full.get() > 0));
    // Let the worker poll a while with the backend full.
    std::thread::sleep(Duration::from_millis(50));
    let mut got = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while got.len() < frames.len() && Instant::now() < deadline {
        match rig.peer.try_recv_frame().expect("recv") {
            Some(f) => got.push(f),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    if got.len() < frames.len() {
        let n = got.len();
        // The worker is stuck: dropping the rig would wait for it forever.
        std::mem::forget(rig);
        panic!("{n} of 64 frames sent once the backend drained");
    }
    assert!(got == frames, "every frame whole, in order");
    assert!(wait_until(TIMEOUT, || rig.metrics.tx.frames.get() == 64));
}

#[test]
fn busy_poll_finds_received_frames_without_transmit() {
    busy_poll_finds_received_frames::<GuestQueue>();
}

#[test]
fn busy_poll_finds_received_frames_on_a_packed_ring() {
    busy_poll_finds_received_frames::<GuestPackedQueue>();
}

#[test]
fn busy_poll_window_ends_with_notifications_back_on() {
    busy_poll_window_ends(0);
}

#[test]
fn a_sleeping_busy_poll_window_ends_with_notifications_back_on() {
    busy_poll_window_ends(200);
}

/// Windows of 1 ms, spinning (`sleep_us` 0) or sleeping between looks, each end with the
/// driver's notifications back on.
fn busy_poll_window_ends(sleep_us: u32) {
    let _turn = super::support::spinning_device();
    let mem = guest_mem();
    let mut rig = rig(&mem);
    rig.tuning
        .set(NetTuning {
            busy_poll_us: 1000,
            busy_poll_sleep_us: sleep_us,
            ..NetTuning::default()
        })
        .expect("valid");
    let (_rx, mut tx) = start_on_queues(&mut rig.transport, &mem, VERSION_1 | EVENT_IDX);
    // The windows at activation (which also see the tuning change) end first.
    std::thread::sleep(Duration::from_millis(30));
    let (polls0, found0) = (
        rig.metrics.busy_poll.polls.get(),
        rig.metrics.busy_poll.found_work.get(),
    );
    // Pauses of 30 ms: every window (1 ms) ends first, so each frame needs its kick, and one
    // that the driver did not write would never be sent (the test would time out).
    let kicks = paced_driver(&rig, &mut tx, true, 5, Duration::from_millis(30));
    assert_eq!(kicks, 5);
    assert!(wait_until(TIMEOUT, || rig.metrics.busy_poll.polls.get() >= polls0 + 5));
    assert_eq!(rig.metrics.busy_poll.found_work.get(), found0);
    let polled = rig.metrics.busy_poll.polled_us.get();
    assert!(
        (5_000..40_000).contains(&polled),
        "polled {polled} µs in 5-7 windows of 1 ms"
    );
    // Switched off at run time: no more polling.
    rig.tuning.set(NetTuning::default()).expect("valid");
    std::thread::sleep(Duration::from_millis(20));
    let polls = rig.metrics.busy_poll.polls.get();
    assert_eq!(paced_driver(&rig, &mut tx, true, 3, Duration::ZERO), 3);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.metrics.busy_poll.polls.get(), polls);
}

/// A [`PairBackend`] whose reads fail with EIO while `fail` is set and a frame is queued (the
/// frame stays queued); with nothing queued a read finds nothing, as from a healthy backend.
struct FailingReads {
    inner: PairBackend,
    fail: Arc<AtomicBool>,
}

impl AsRawFd for FailingReads {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl NetBackend for FailingReads {
    fn read_frame(&mut self, iovs: crate::iovec::Iovecs<'_>) -> std::io::Result<usize> {
        if self.fail.load(Ordering::Relaxed) {
            let mut byte = 0u8;
            // SAFETY: `byte` is valid for a 1-byte write; recv keeps no pointer after it
            // returns. MSG_PEEK leaves the frame queued.
            let queued = unsafe {
                libc::recv(
                    self.as_raw_fd(),
                    (&raw mut byte).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if queued > 0 {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
        }
        self.inner.read_frame(iovs)
    }
    fn write_frame(&mut self, iovs: crate::iovec::Iovecs<'_>) -> std::io::Result<usize> {
        self.inner.write_frame(iovs)
    }
}

/// A backend read fails with the driver's rx buffers posted: rx pauses until the driver's next
/// rx kick and the worker tries no more reads meanwhile, busy-poll on or off. With busy-poll
/// on (tx parked after a transmit, and the buffers in sight of the poll) a poll that took the
/// buffers for a reason to read again would fail, find them again and never sleep.
#[test]
fn a_failed_backend_read_waits_for_the_next_rx_kick() {
    let _turn = super::support::spinning_device();
    for busy_poll_us in [0, 10_000] {
        let mem = guest_mem();
        let (inner, peer) = PairBackend::new().expect("socketpair");
        peer.set_timeout(TIMEOUT).expect("timeout");
        let fail = Arc::new(AtomicBool::new(true));
        let backend = FailingReads {
            inner,
            fail: fail.clone(),
        };
        let mut device = NetDevice::with_backend(backend, MacAddr::new([2, 0, 0, 0, 0, 1]), 256);
        busy_tuning(busy_poll_us)(&mut device);
        let metrics = device.metrics();
        let mut t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
        let (mut rx, mut tx) = queues(&mem);
        start(&mut t, VERSION_1, &rx, &tx);
        let (_, bufs) = rx.push_rx(&[2048]);
        rx.push_rx(&[2048]);
        kick(&t, 0);
        // A transmit: with busy-poll on, tx parks and the worker polls its window.
        let out = wire(&frame(80, 1));
        tx.push_tx(&out, &[]);
        kick(&t, 1);
        assert_eq!(peer.recv_frame().expect("frame"), out);

        let inbound = wire(&frame(90, 2));
        peer.send_frame(&inbound).expect("send");
        assert!(wait_until(TIMEOUT, || metrics.rx.backend_errors.get() >= 1));
        // Several busy-poll windows long; then the worker still serves tx.
        std::thread::sleep(Duration::from_millis(100));
        let out = wire(&frame(80, 3));
        tx.push_tx(&out, &[]);
        kick(&t, 1);
        let sent = peer.recv_frame().ok();
        let failed = metrics.rx.backend_errors.get();
        // The rx kick that posted the buffers may still wait in epoll when the first read
        // fails, and resumes rx once: two failed reads at most (a worker that resumed on its
        // own would fail thousands of times in 100 ms).
        if failed > 2 || sent.as_ref() != Some(&out) {
            // A worker spinning on the failure would never answer the transport's stop.
            std::mem::forget(t);
            panic!(
                "busy_poll_us {busy_poll_us}: {failed} failed reads without an rx kick, tx sent {}",
                sent.is_some()
            );
        }
        assert_eq!(rx.used_idx(), 0);

        // The backend recovers; the driver's rx kick resumes rx and the frame lands whole.
        fail.store(false, Ordering::Relaxed);
        kick(&t, 0);
        assert!(wait_until(TIMEOUT, || rx.used_idx() == 1));
        assert_eq!(rx.used(0).1, 12 + 90);
        assert_eq!(rx.read(bufs[0] + 12, 90), inbound[12..]);
        assert_eq!(metrics.rx.frames.get(), 1);
        assert_eq!(metrics.rx.backend_errors.get(), failed);
    }
}
