//! The driver guest (`guest/baremetal`) on virtio-pci with MSI-X: `--net tap=…,transport=pci`
//! and `transport=pci` on the guest's command line. The guest enumerates PCI bus 0 through
//! 0xCF8/0xCFC, maps BAR0, aims an MSI-X vector per queue (and one for configuration changes)
//! at its local APIC and drives the device from user mode (`ring=3`) without reading the ISR.
//! A host-side AF_PACKET socket on the tap checks every frame; the guest's counters are
//! checked against the device's metrics.

use std::time::Duration;

use integration_tests::packet::{collect_frames, guest_mac, mac_string, tap_socket, PacketSocket};
use integration_tests::{
    assert_guest_counters_match_device, assert_guest_frames, driver_result, guest_lock,
    json_u64 as n, metrics_of, RunOutput, VmmProcess,
};
use serde_json::Value;

const TAP: &str = "vmmtap0";
/// The destination MAC of the frames the host sends (the guest swaps it into the source).
const GUEST_DST: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
/// Echo frames in flight.
const WINDOW: u64 = 32;

fn namespace(tag: &str) -> (devices::test_utils::netns::NetNs, PacketSocket, [u8; 6]) {
    let ns = integration_tests::namespace_with_tap(tag, TAP);
    let (sock, tap_mac) = tap_socket(&ns, TAP);
    (ns, sock, tap_mac)
}

fn start_pci_guest(ns: &devices::test_utils::netns::NetNs, cmdline: &str) -> VmmProcess {
    integration_tests::spawn_driver_guest(
        ns,
        &format!("{cmdline} ring=3 transport=pci"),
        &format!("tap={TAP},transport=pci"),
        None,
    )
}

/// The guest's counters against the device's, and the MSI-X vectors: config on entry 0, rx
/// and tx on their own; every interrupt came through a queue vector the device signalled (a
/// queue pair's signal fires the vectors of its queues that wanted it; an edge interrupt
/// arriving while the previous one is pending merges with it, so the guest may take fewer),
/// none through the config one. Returns the device's metrics.
fn check(d: &Value, out: &RunOutput) -> Value {
    let dev = metrics_of(out)["net"][TAP].clone();
    let ctx = || format!("driver {d}\ndevice {dev}\n{out}");
    assert_eq!(d["status"], "done", "{}", ctx());
    assert_eq!(d["transport"], "pci", "{}", ctx());
    assert!(
        out.stdout
            .contains("driver-guest: msix vectors config=Some(0) rx=Some(1) tx=Some(2)"),
        "{}",
        ctx()
    );
    assert_guest_counters_match_device(d, &dev, ctx);
    let (rx, tx, ctrl, config) = (
        n(d, "irqs_rx"),
        n(d, "irqs_tx"),
        n(d, "irqs_ctrl"),
        n(d, "irqs_config"),
    );
    let signalled = n(&dev, "irqfd_signals");
    assert_eq!(rx + tx + ctrl + config, n(d, "irqs_taken"), "{}", ctx());
    assert!(rx <= signalled && tx <= signalled, "{}", ctx());
    assert!(rx + tx + ctrl > 0, "no interrupt at all: {}", ctx());
    assert_eq!(config, 0, "{}", ctx());
    dev
}

/// `tx=N`: every frame arrives intact; the tx completions come through the tx vector.
#[test]
fn pci_guest_transmits_frames_intact_over_msix() {
    let _guest = guest_lock();
    let (ns, sock, tap_mac) = namespace("dpcitx");
    let (count, size) = (3000u64, 128usize);
    let reader = collect_frames(sock, count, Duration::from_secs(120), Duration::ZERO);
    let vmm = start_pci_guest(
        &ns,
        &format!(
            "console=ttyS0 tx={count} size={size} dst={} timeout_ms=60000 tx_completion=tx-interrupt",
            mac_string(tap_mac)
        ),
    );
    let out = vmm.finish(Duration::from_secs(120));
    let frames = reader.join().expect("reader thread");
    assert!(out.success(), "{out}");
    let d = driver_result(&out);
    let src = guest_mac(&out.stdout).unwrap_or_else(|| panic!("no ready line\n{out}"));
    assert_eq!(frames.len() as u64, count, "{out}");
    assert_guest_frames(&frames, (tap_mac, src), size, "");
    let dev = check(&d, &out);
    assert_eq!(
        (n(&d, "tx_frames"), n(&d, "tx_reclaimed")),
        (count, count),
        "{d}"
    );
    // Tx completions came on the tx queue's own vector, at most one per tx interrupt the
    // device raised.
    assert!(n(&d, "irqs_tx") > 0, "{d}");
    assert!(
        n(&d, "irqs_tx") <= n(&dev["tx"], "interrupts_raised"),
        "{d}\n{dev}"
    );
    assert!(n(&d, "interrupts") > 0, "{d}");
    eprintln!(
        "pci tx: {} pps in guest, irqs rx/tx/ctrl/config {}/{}/{}/{}",
        d["pps"], d["irqs_rx"], d["irqs_tx"], d["irqs_ctrl"], d["irqs_config"]
    );
}

/// `echo=N`: the host sends, the guest bounces every frame back (XDP_TX) on rx interrupts.
#[test]
fn pci_guest_echoes_frames_intact_over_msix() {
    let _guest = guest_lock();
    let (ns, sock, tap_mac) = namespace("dpciecho");
    let (count, size) = (1000u64, 100usize);
    let vmm = start_pci_guest(
        &ns,
        &format!("console=ttyS0 echo={count} size={size} timeout_ms=60000"),
    );
    let out = integration_tests::echo_through_guest(
        vmm,
        &sock,
        (GUEST_DST, tap_mac),
        (count, size),
        WINDOW,
        Duration::from_secs(120),
    );
    let d = driver_result(&out);
    let dev = check(&d, &out);
    assert_eq!((n(&d, "xdp_tx"), n(&d, "rx_frames")), (count, count), "{d}");
    // Received frames came on the rx queue's own vector.
    assert!(n(&d, "irqs_rx") > 0, "{d}");
    assert!(
        n(&d, "irqs_rx") <= n(&dev["rx"], "interrupts_raised"),
        "{d}\n{dev}"
    );
}

/// A guest asked for PCI on a VMM that gives it virtio-mmio finds no function and says so.
#[test]
fn pci_guest_without_a_pci_device_reports_it() {
    let _guest = guest_lock();
    let (ns, _sock, _) = namespace("dpcinone");
    let vmm = integration_tests::spawn_driver_guest(
        &ns,
        "console=ttyS0 tx=10 ring=3 transport=pci timeout_ms=10000",
        &format!("tap={TAP}"),
        None,
    );
    let out = vmm.finish(Duration::from_secs(60));
    let d = driver_result(&out);
    assert_eq!(d["status"], "error", "{out}");
    let error = d["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("no virtio-net function") && error.contains("transport=pci"),
        "{out}"
    );
}
