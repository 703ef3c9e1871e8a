//! Per-queue reset (VIRTIO_F_RING_RESET) from the driver guest (`guest/baremetal`) in a real VM:
//! `reset_queue=rx|tx reset_every=N` on its command line resets one queue every N frames of a
//! `tx=` workload, at `ring=3`, over virtio-pci (MSI-X) and virtio-mmio. A host-side AF_PACKET
//! socket on the tap checks that every frame arrives intact and in order, and the guest's reset
//! count is checked against the device's `queue_resets` / `queue_reenables` metrics.

use std::time::Duration;

use integration_tests::packet::{collect_frames, guest_mac, mac_string, tap_socket};
use integration_tests::{
    assert_guest_frames, driver_result, guest_lock, json_u64 as n, metrics_of,
};
use serde_json::Value;

const TAP: &str = "vmmtap0";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Pci,
    Mmio,
}

/// Boots the driver guest with `tx=count` and `reset_queue=queue reset_every=every` over `via`,
/// collects what arrives on the tap, and checks every frame (intact, in order, none missing or
/// extra), the guest's reset counters against `resets` and the device's metrics. Returns the
/// guest's result and the device's metrics.
fn tx_with_resets(
    tag: &str,
    via: Via,
    queue: &str,
    count: u64,
    every: u64,
    resets: u64,
) -> (Value, Value) {
    let _guest = guest_lock();
    let size = 128usize;
    let ns = integration_tests::namespace_with_tap(tag, TAP);
    let (sock, tap_mac) = tap_socket(&ns, TAP);
    // Until `count` frames, then a little longer to catch duplicates.
    let reader = collect_frames(
        sock,
        count,
        Duration::from_secs(120),
        Duration::from_millis(300),
    );
    let (transport, net) = match via {
        Via::Pci => ("pci", format!("tap={TAP},transport=pci")),
        Via::Mmio => ("mmio", format!("tap={TAP}")),
    };
    let cmdline = format!(
        "console=ttyS0 ring=3 transport={transport} tx={count} size={size} dst={} \
         timeout_ms=60000 tx_completion=tx-interrupt reset_queue={queue} reset_every={every}",
        mac_string(tap_mac)
    );
    let vmm = integration_tests::spawn_driver_guest(&ns, &cmdline, &net, None);
    let out = vmm.finish(Duration::from_secs(120));
    let frames = reader.join().expect("reader thread");
    assert!(out.success(), "{out}");
    let d = driver_result(&out);
    let dev = metrics_of(&out)["net"][TAP].clone();
    let ctx = || format!("driver {d}\ndevice {dev}\n{out}");
    assert_eq!(d["status"], "done", "{}", ctx());
    assert_eq!(d["transport"], transport, "{}", ctx());
    let src = guest_mac(&out.stdout).unwrap_or_else(|| panic!("no ready line\n{out}"));
    // Every frame, intact and in order, none twice.
    assert_guest_frames(&frames, (tap_mac, src), size, &ctx());
    assert_eq!(frames.len() as u64, count, "{}", ctx());
    // The guest's resets: as planned, none failed, and the device carried out as many.
    let r = &d["resets"];
    assert_eq!(r["queue"], queue, "{}", ctx());
    assert_eq!(n(r, "every"), every, "{}", ctx());
    let (rx, tx) = match queue {
        "rx" => (resets, 0),
        _ => (0, resets),
    };
    assert_eq!(
        (n(r, "rx"), n(r, "tx"), n(r, "failed")),
        (rx, tx, 0),
        "{}",
        ctx()
    );
    assert_eq!(n(&dev, "queue_resets"), resets, "{}", ctx());
    assert_eq!(n(&dev, "queue_reenables"), resets, "{}", ctx());
    assert_eq!(n(&dev, "needs_reset_events"), 0, "{}", ctx());
    // No frame lost or counted twice on either side.
    assert_eq!(
        (n(&d, "tx_frames"), n(&d, "tx_reclaimed")),
        (count, count),
        "{}",
        ctx()
    );
    assert_eq!(n(&dev["tx"], "frames"), count, "{}", ctx());
    // Tx kicks: the device counts each one it reads, except that re-enabling a reset queue
    // drains its kick eventfd uncounted (and then runs the queue, so nothing is missed): a kick
    // the guest sends right after re-enabling the tx queue can race into that drain.
    let (guest_kicks, dev_kicks) = (n(&d, "kicks"), n(&dev["tx"], "kicks"));
    if queue == "tx" {
        assert!(
            dev_kicks <= guest_kicks && guest_kicks - dev_kicks <= resets,
            "{}",
            ctx()
        );
    } else {
        assert_eq!(guest_kicks, dev_kicks, "{}", ctx());
    }
    assert_eq!(n(&d, "device_errors"), 0, "{}", ctx());
    eprintln!(
        "{transport} {queue} resets: {resets} in {count} frames, {} pps in guest, resets {r}",
        d["pps"]
    );
    (d, dev)
}

/// The rx queue is reset 11 times while 3000 frames go out on the tx queue: not one is lost,
/// and the rx queue comes back with a full ring each time.
#[test]
fn pci_rx_resets_during_tx_lose_no_frame() {
    let (d, _) = tx_with_resets("drstpcirx", Via::Pci, "rx", 3000, 250, 11);
    let r = &d["resets"];
    // Every reset took back a full ring of posted buffers (nothing arrives on the tap).
    assert_eq!(n(r, "rx_reclaimed"), 11 * n(&d, "rx_queue_size"), "{d}");
    assert_eq!(n(r, "rx_dropped"), 0, "{d}");
}

/// The tx queue itself is reset between bursts, 9 times in 2000 frames: later frames flow, and
/// none was left unsent (each reset waited for the ring to drain).
#[test]
fn pci_tx_resets_between_bursts_keep_frames_flowing() {
    tx_resets_between_bursts("drstpcitx", Via::Pci);
}

fn tx_resets_between_bursts(tag: &str, via: Via) {
    let (d, _) = tx_with_resets(tag, via, "tx", 2000, 200, 9);
    assert_eq!(n(&d["resets"], "tx_not_sent"), 0, "{d}");
}

/// The same over virtio-mmio (QueueReset at 0x0c0).
#[test]
fn mmio_rx_resets_during_tx_lose_no_frame() {
    tx_with_resets("drstmmiorx", Via::Mmio, "rx", 3000, 250, 11);
}

/// The same over virtio-mmio.
#[test]
fn mmio_tx_resets_between_bursts_keep_frames_flowing() {
    tx_resets_between_bursts("drstmmiotx", Via::Mmio);
}

/// `echo=` with the tx queue reset between bursts every 100 echoes (9 times): the host sends
/// with a window of 32 frames in flight and gets every echo back, intact and in order; frames
/// that arrive while the guest drains and resets its tx queue wait on the rx ring.
#[test]
fn pci_echo_with_tx_resets_returns_every_frame() {
    let _guest = guest_lock();
    let (count, size, window) = (1000u64, 100usize, 32u64);
    let guest_dst = [0x02, 0, 0, 0, 0, 0x0b];
    let ns = integration_tests::namespace_with_tap("drstpciecho", TAP);
    let (sock, tap_mac) = tap_socket(&ns, TAP);
    let vmm = integration_tests::spawn_driver_guest(
        &ns,
        &format!(
            "console=ttyS0 ring=3 transport=pci echo={count} size={size} timeout_ms=60000 \
             reset_queue=tx reset_every=100"
        ),
        &format!("tap={TAP},transport=pci"),
        None,
    );
    let out = integration_tests::echo_through_guest(
        vmm,
        &sock,
        (guest_dst, tap_mac),
        (count, size),
        window,
        Duration::from_secs(120),
    );
    let d = driver_result(&out);
    let dev = metrics_of(&out)["net"][TAP].clone();
    let ctx = || format!("driver {d}\ndevice {dev}\n{out}");
    assert_eq!(d["status"], "done", "{}", ctx());
    assert_eq!(
        (n(&d, "xdp_tx"), n(&d, "rx_frames")),
        (count, count),
        "{}",
        ctx()
    );
    let r = &d["resets"];
    assert_eq!(
        (n(r, "tx"), n(r, "rx"), n(r, "failed"), n(r, "tx_not_sent")),
        (9, 0, 0, 0),
        "{}",
        ctx()
    );
    assert_eq!(n(&dev, "queue_resets"), 9, "{}", ctx());
    assert_eq!(n(&dev, "queue_reenables"), 9, "{}", ctx());
    assert_eq!(n(&dev["tx"], "frames"), count, "{}", ctx());
    assert_eq!(n(&dev["rx"], "frames"), count, "{}", ctx());
}
