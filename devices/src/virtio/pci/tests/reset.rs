//! VIRTIO_F_RING_RESET on the PCI transport (`queue_reset`, virtio 1.2 §4.1.4.3) and
//! VIRTIO_F_ACCESS_PLATFORM: the register's semantics against a fake device, every ill-timed
//! write refused without effect, and the real net device over PCI resetting a queue.

use super::*;

const RING_RESET: u64 = 1 << VIRTIO_F_RING_RESET;
const ACCESS_PLATFORM: u64 = 1 << VIRTIO_F_ACCESS_PLATFORM;
/// `queue_reset` in the common configuration.
const Q_RESET: u64 = 0x3a;

fn select(t: &mut VirtioPciTransport, index: u16) {
    bar_w(t, Q_SELECT, 2, index.into());
}

/// (queue_reset, queue_enable, queue_size, queue_desc) of queue `index`.
fn queue_regs(t: &mut VirtioPciTransport, index: u16) -> (u64, u64, u64, u64) {
    select(t, index);
    (
        bar_r(t, Q_RESET, 2),
        bar_r(t, Q_ENABLE, 2),
        bar_r(t, Q_SIZE, 2),
        bar_r(t, Q_DESC, 8),
    )
}

fn reset_queue(t: &mut VirtioPciTransport, index: u16) {
    select(t, index);
    bar_w(t, Q_RESET, 2, 1);
}

/// Negotiates `features`, programs the three queues at 0x1000, 0x2000, 0x3000 and sets
/// DRIVER_OK.
fn running(t: &mut VirtioPciTransport, features: u64) {
    assert!(negotiate(t, features));
    setup_queue(t, 0, 32, 0x1000, 1);
    setup_queue(t, 1, 32, 0x2000, 2);
    setup_queue(t, 2, 16, 0x3000, 3);
    driver_ok(t);
    assert_eq!(status(t), ACK | DRIVER | FEATURES_OK | DRIVER_OK);
}

#[test]
fn ring_reset_is_offered_only_by_devices_that_reset_queues_and_access_platform_always() {
    // A device offering neither: the transport adds ACCESS_PLATFORM, and RING_RESET when the
    // device can reset queues.
    let (mut t, _) = transport_with(VERSION_1, true);
    assert_eq!(offered(&mut t), VERSION_1 | RING_RESET | ACCESS_PLATFORM);
    let (mut t, _) = transport_with(VERSION_1 | RING_RESET, false);
    assert_eq!(
        offered(&mut t),
        VERSION_1 | ACCESS_PLATFORM,
        "RING_RESET from a device that cannot reset queues is not offered"
    );
    assert!(!negotiate(&mut t, VERSION_1 | RING_RESET));

    // Negotiation with and without ACCESS_PLATFORM; the device sees what was acked.
    let (mut t, state) = transport_with(VERSION_1, true);
    for features in [
        VERSION_1,
        VERSION_1 | ACCESS_PLATFORM,
        VERSION_1 | RING_RESET,
    ] {
        running(&mut t, features);
        let acked = lock(&state).ctx.as_ref().expect("active").acked_features;
        assert_eq!(acked, features);
    }
}

#[test]
fn queue_reset_register_semantics() {
    let (mut t, state) = transport();
    // Reads 0 from the start, for every queue, and for nonexistent ones.
    for index in [0, 1, 2, 3, 0xffff] {
        assert_eq!(queue_regs(&mut t, index).0, 0);
    }
    // Before negotiation and before DRIVER_OK: refused, no effect.
    reset_queue(&mut t, 0);
    assert!(negotiate(&mut t, VERSION_1 | RING_RESET));
    setup_queue(&mut t, 0, 32, 0x1000, 1);
    reset_queue(&mut t, 0);
    assert_eq!(
        queue_regs(&mut t, 0),
        (0, 1, 32, 0x1000),
        "before DRIVER_OK"
    );
    assert!(lock(&state).queue_resets.is_empty());
    // Without RING_RESET negotiated: refused, the queue keeps running.
    running(&mut t, VERSION_1);
    reset_queue(&mut t, 1);
    assert_eq!(queue_regs(&mut t, 1), (0, 1, 32, 0x2000), "not negotiated");
    assert!(lock(&state).queue_resets.is_empty());

    running(&mut t, VERSION_1 | RING_RESET);
    // Bad index, bad value: refused.
    reset_queue(&mut t, 3);
    reset_queue(&mut t, 0xffff);
    select(&mut t, 1);
    for bad in [0, 2, 0xffff] {
        bar_w(&mut t, Q_RESET, 2, bad);
    }
    bar_w(&mut t, Q_RESET, 4, 1);
    bar_w(&mut t, Q_RESET - 1, 2, 1);
    assert_eq!(queue_regs(&mut t, 1), (0, 1, 32, 0x2000));
    assert!(lock(&state).queue_resets.is_empty());

    // Reset queue 1: the device is told; 0 in queue_reset and queue_enable, defaults back.
    reset_queue(&mut t, 1);
    assert_eq!(lock(&state).queue_resets, [1]);
    assert_eq!(queue_regs(&mut t, 1), (0, 0, 64, 0));
    // The others are untouched and stay frozen.
    assert_eq!(queue_regs(&mut t, 0), (0, 1, 32, 0x1000));
    bar_w(&mut t, Q_DESC, 8, 0x5000);
    bar_w(&mut t, Q_SIZE, 2, 16);
    assert_eq!(queue_regs(&mut t, 0), (0, 1, 32, 0x1000));
    // A second reset of a reset queue: refused.
    reset_queue(&mut t, 1);
    assert_eq!(lock(&state).queue_resets, [1]);

    // The driver reprograms it (other size, rings and vector) and enables it.
    setup_queue(&mut t, 1, 16, 0x6000, 3);
    assert_eq!(queue_regs(&mut t, 1), (0, 1, 16, 0x6000));
    assert_eq!(bar_r(&mut t, Q_MSIX, 2), 3);
    {
        let s = lock(&state);
        assert_eq!(s.queue_enables.len(), 1);
        let (index, q) = &s.queue_enables[0];
        assert_eq!(*index, 1);
        assert_eq!(
            (q.size(), q.desc_table(), q.avail_ring(), q.used_ring()),
            (16, 0x6000, 0x6400, 0x6800)
        );
        assert!(q.ready());
        assert_eq!(
            (q.next_avail(), q.next_used()),
            (0, 0),
            "indexes start over"
        );
        assert!(!q.event_idx_enabled(), "EVENT_IDX not negotiated");
    }
    // Enabled again: frozen again, and a second enable does nothing.
    bar_w(&mut t, Q_SIZE, 2, 32);
    bar_w(&mut t, Q_ENABLE, 2, 1);
    assert_eq!(queue_regs(&mut t, 1), (0, 1, 16, 0x6000));
    assert_eq!(lock(&state).queue_enables.len(), 1);

    // The device refuses (e.g. a control queue): no effect.
    lock(&state).reset_answer = Some(QueueResetState::Refused);
    reset_queue(&mut t, 2);
    assert_eq!(queue_regs(&mut t, 2), (0, 1, 16, 0x3000));

    // A reset the device confirms later: 1 while ongoing, nothing configurable meanwhile.
    {
        let mut s = lock(&state);
        s.reset_answer = Some(QueueResetState::Ongoing);
        s.poll_answer = Some(QueueResetState::Ongoing);
    }
    reset_queue(&mut t, 0);
    for _ in 0..3 {
        assert_eq!(bar_r(&mut t, Q_RESET, 2), 1);
    }
    bar_w(&mut t, Q_SIZE, 2, 16);
    bar_w(&mut t, Q_DESC, 8, 0x7000);
    bar_w(&mut t, Q_ENABLE, 2, 1);
    assert_eq!(queue_regs(&mut t, 0), (1, 0, 64, 0), "not configurable yet");
    assert_eq!(lock(&state).queue_enables.len(), 1);
    lock(&state).poll_answer = Some(QueueResetState::Done);
    assert_eq!(queue_regs(&mut t, 0), (0, 0, 64, 0), "done");
    setup_queue(&mut t, 0, 32, 0x7000, 1);
    assert_eq!(queue_regs(&mut t, 0), (0, 1, 32, 0x7000));
    assert_eq!(lock(&state).queue_enables.len(), 2);

    // A device reset in the middle of a queue reset forgets it.
    lock(&state).reset_answer = None;
    reset_queue(&mut t, 1);
    set_status(&mut t, 0);
    assert_eq!(queue_regs(&mut t, 1), (0, 0, 64, 0));
    running(&mut t, VERSION_1 | RING_RESET);
    assert_eq!(queue_regs(&mut t, 1), (0, 1, 32, 0x2000));
}

#[test]
fn reenabling_on_unusable_rings_needs_reset() {
    let (mut t, state) = transport();
    running(&mut t, VERSION_1 | RING_RESET);
    reset_queue(&mut t, 0);
    // Rings past the end of guest memory (1 MiB).
    setup_queue(&mut t, 0, 64, 0xf_ff00, 1);
    assert_ne!(status(&mut t) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    assert!(lock(&state).queue_enables.is_empty());
    // The avail ring at guest address 0 (virtio-queue's "unset").
    running(&mut t, VERSION_1 | RING_RESET);
    assert_eq!(status(&mut t) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    reset_queue(&mut t, 2);
    select(&mut t, 2);
    bar_w(&mut t, Q_SIZE, 2, 16);
    bar_w(&mut t, Q_DESC, 8, 0x3000);
    bar_w(&mut t, Q_DEVICE, 8, 0x3800);
    bar_w(&mut t, Q_ENABLE, 2, 1);
    assert_ne!(status(&mut t) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    assert!(lock(&state).queue_enables.is_empty());
}

/// The real net device over PCI: ACCESS_PLATFORM and RING_RESET negotiated, the tx queue
/// reset and moved to new rings while rx keeps its own; frames flow on both before and after.
#[test]
fn net_device_resets_a_queue_over_pci() {
    use std::time::Duration;

    use crate::test_utils::mmio::wait_until;
    use crate::test_utils::queue::{guest_mem, GuestQueue};

    let mem = guest_mem();
    let (mut t, peer, metrics) = net_over_pci(&mem);
    let features = VERSION_1 | RING_RESET | ACCESS_PLATFORM;
    assert_eq!(offered(&mut t) & features, features);
    assert!(negotiate(&mut t, features));
    let mut rx = GuestQueue::at(&mem, GuestAddress(0x1_0000), 64, 0x10_0000);
    let tx = GuestQueue::at(&mem, GuestAddress(0x2_0000), 64, 0x40_0000);
    let program = |t: &mut VirtioPciTransport, index: u16, q: &GuestQueue| {
        let (desc, avail, used) = q.ring_addrs();
        select(t, index);
        bar_w(t, Q_SIZE, 2, 64);
        bar_w(t, Q_DESC, 8, desc);
        bar_w(t, Q_DRIVER, 8, avail);
        bar_w(t, Q_DEVICE, 8, used);
        bar_w(t, Q_ENABLE, 2, 1);
    };
    program(&mut t, 0, &rx);
    program(&mut t, 1, &tx);
    driver_ok(&mut t);
    assert!(t.device().is_active());
    let wire = net_wire();

    // Reset tx (queue 1), done at once; move it to new rings.
    reset_queue(&mut t, 1);
    assert_eq!(queue_regs(&mut t, 1), (0, 0, 64, 0));
    assert!(wait_until(Duration::from_secs(5), || metrics
        .queue_resets
        .get()
        == 1));
    let mut tx = GuestQueue::at(&mem, GuestAddress(0x3_0000), 64, 0x50_0000);
    program(&mut t, 1, &tx);
    assert_eq!(status(&mut t) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    tx.push_tx(&wire, &[12]);
    bar_w(&mut t, NOTIFY_OFFSET + 4, 2, 1);
    assert_eq!(peer.recv_frame().expect("frame on the new ring"), wire);
    assert!(wait_until(Duration::from_secs(5), || tx.used_idx() == 1));
    // rx never stopped.
    let (head, addrs) = rx.push_rx(&[2048]);
    bar_w(&mut t, NOTIFY_OFFSET, 2, 0);
    peer.send_frame(&wire).expect("send");
    assert!(wait_until(Duration::from_secs(5), || rx.used_idx() == 1));
    assert_eq!(rx.used(0), (u32::from(head), wire.len() as u32));
    assert_eq!(rx.read(addrs[0] + 12, 100), wire[12..]);
    assert_eq!(metrics.queue_reenables.get(), 1);

    // The control queue is not negotiated: no queue 2 to reset.
    reset_queue(&mut t, 2);
    assert_eq!(metrics.queue_resets.get(), 1);
    set_status(&mut t, 0);
    assert!(!t.device().is_active());
}
