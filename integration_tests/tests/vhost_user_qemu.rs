//! `vhost-user-net` behind QEMU 7.2 (Debian's `qemu-system-x86`), the project's Linux guest
//! booted by QEMU: Linux's own virtio-net driver negotiates with the backend through QEMU, pings
//! the host and runs TCP both ways through the backend's tap in a network namespace, on split
//! and packed rings and with two queue pairs (QEMU keeps the control queue). The features the
//! guest's driver negotiated are read back from the backend.

use std::time::Duration;

use integration_tests::vhost_user::{qemu_command, scratch_dir, Backend, QemuAccel};
use integration_tests::{artifacts, guest_lock, namespace_with_tap, tcp_through_guest, VmmProcess};

const HOST_IP: &str = "10.200.0.1";
const GUEST_IP: &str = "10.200.0.2";
const PORT: u16 = 7777;
const TCP_BYTES: usize = 256 * 1024;

const EVENT_IDX: u64 = 1 << 29;
const RING_PACKED: u64 = 1 << 34;
const MRG_RXBUF: u64 = 1 << 15;
const MQ: u64 = 1 << 22;
const VERSION_1: u64 = 1 << 32;

/// Boots the guest under QEMU against a backend on tap `tap` (`keys`: the backend's extra
/// `--net` keys; `device`: QEMU's device properties), runs the ping and the TCP exchange, and
/// checks the features negotiated (`want` within `mask`).
fn boot(tag: &str, keys: &str, queues: u16, device: &str, (want, mask): (u64, u64)) {
    let _lock = guest_lock();
    let tap = format!("vuq{tag}");
    let ns = if queues > 1 {
        integration_tests::namespace_with_multi_queue_tap(&format!("vu-qemu-{tag}"), &tap)
    } else {
        namespace_with_tap(&format!("vu-qemu-{tag}"), &tap)
    };
    ns.ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", &tap])
        .expect("host address");
    let dir = scratch_dir("qemu");
    let spec = format!("tap={tap},queues={queues}{keys}");
    let be = Backend::start(&dir, &spec, Some(&ns));
    let a = artifacts();
    let cmdline = format!(
        "console=ttyS0 reboot=k panic=-1 quiet vmm.run=net vmm.ip={GUEST_IP}/24 \
         vmm.peer={HOST_IP} vmm.port={PORT} vmm.tcp={TCP_BYTES}"
    );
    let accel = QemuAccel::detect();
    let mut cmd = qemu_command(
        (a.get("bzimage"), a.get("initrd"), &cmdline),
        &be.socket,
        queues,
        device,
        accel,
    );
    let qemu = VmmProcess::spawn(&mut cmd);
    let (out, _) = tcp_through_guest(&ns, qemu, (GUEST_IP, PORT), TCP_BYTES);
    assert!(
        out.stdout
            .contains("3 packets transmitted, 3 packets received"),
        "the guest pinged the host through the backend ({accel:?}): {out}"
    );
    let device_metrics = be.device_metrics();
    let negotiated = device_metrics["vhost_user"]["negotiated_features"]
        .as_u64()
        .unwrap_or(0);
    let log = be.process.log();
    // The guest is gone: QEMU closed the connection and the device stopped with it.
    assert_eq!(negotiated, 0, "{device_metrics}");
    let line = log
        .lines()
        .rfind(|l| l.contains("the frontend negotiated features"))
        .unwrap_or_else(|| panic!("no negotiation in the backend's log: {log}"));
    let features = u64::from_str_radix(line.rsplit("0x").next().expect("a hex value").trim(), 16)
        .expect("features in hex");
    assert_eq!(
        features & (mask | VERSION_1),
        want | VERSION_1,
        "the guest's driver negotiated {features:#x} ({accel:?})"
    );
    // TCP both ways went through the backend (in a few large segments: TSO and GSO).
    let tx = device_metrics["tx"]["bytes"].as_u64().unwrap_or(0);
    let rx = device_metrics["rx"]["bytes"].as_u64().unwrap_or(0);
    assert!(
        tx >= TCP_BYTES as u64 && rx >= TCP_BYTES as u64,
        "tx {tx} bytes, rx {rx} bytes: {device_metrics}"
    );
    assert_eq!(device_metrics["vhost_user"]["protocol_errors"], 0, "{log}");
    assert_eq!(device_metrics["needs_reset_events"], 0, "{log}");
    let process = be.process;
    process.signal(libc::SIGTERM);
    let out = process.finish(Duration::from_secs(10));
    assert_eq!(out.status.and_then(|s| s.code()), Some(143), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn linux_under_qemu_split_rings() {
    boot(
        "split",
        "",
        1,
        ",packed=off",
        (
            EVENT_IDX | MRG_RXBUF,
            EVENT_IDX | MRG_RXBUF | RING_PACKED | MQ,
        ),
    );
}

#[test]
fn linux_under_qemu_packed_rings() {
    boot(
        "packed",
        ",packed=on",
        1,
        ",packed=on",
        (
            EVENT_IDX | MRG_RXBUF | RING_PACKED,
            EVENT_IDX | MRG_RXBUF | RING_PACKED | MQ,
        ),
    );
}

#[test]
fn linux_under_qemu_two_queue_pairs() {
    boot(
        "mq",
        ",packed=on",
        2,
        ",packed=on",
        (
            EVENT_IDX | MRG_RXBUF | RING_PACKED | MQ,
            EVENT_IDX | MRG_RXBUF | RING_PACKED | MQ,
        ),
    );
}
