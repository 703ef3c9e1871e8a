//! virtio-net over virtio-pci with MSI-X (`--net tap=TAP,transport=pci`) and a Linux guest:
//! the guest finds the device on PCI bus 0 through ports 0xCF8/0xCFC (no ACPI, no kernel
//! option), at BAR0 where the VMM put it, and gives each queue its own MSI-X vector. Ping, a
//! UDP echo and a TCP stream each way (offloads in use) go through it with every byte checked,
//! under the VMM's seccomp filters (the vCPU thread installs the MSI routes); on split rings,
//! and again on packed rings (`packed=on`).
//!
//! The test kernel has no sysfs (it costs over a second of boot), so the queues Linux set up
//! are read from `/proc/interrupts` (one `virtioN-input.I` / `virtioN-output.I` line per
//! queue, on PCI-MSIX), which the guest's net test prints with `vmm.irqs=1`, with
//! `/proc/bus/pci/devices`; one test boots the `sysfs` kernel variant to read
//! `/sys/class/net/eth0/queues` too.

use std::path::Path;
use std::time::Duration;

use devices::test_utils::netns::NetNs;
use integration_tests::udp;
use integration_tests::{
    artifacts, assert_tcp_offloads, final_metrics, guest_lock, kernel_variant, linux_guest_command,
    raise_initial_window, rings_started, tap_counter, tcp_through_guest, test_cmdline, RunOutput,
    VmmProcess, TCP_MSS, TCP_STREAM_BYTES,
};

const PORT: u16 = 7777;

/// One guest on one tap in its own namespace, addresses 10.202.N.1 (host) and .2 (guest).
struct PciGuest {
    ns: NetNs,
    tap: String,
    host_ip: String,
    guest_ip: String,
    vmm: VmmProcess,
}

/// Once the guest's echo server listens: `count` UDP datagrams of 64, 512 and 1400 bytes, one
/// at a time, each echo checked; then the VMM's exit. Asserts both went well.
fn udp_echo_then_finish(
    mut vmm: VmmProcess,
    ns: &NetNs,
    (host_ip, guest_ip): (&str, &str),
    count: usize,
) -> RunOutput {
    let ready = vmm.wait_for_console("nettest: listening", Duration::from_secs(180));
    let echo = if ready {
        let (h, gu) = (host_ip.to_owned(), guest_ip.to_owned());
        ns.run(move || udp::echo((&h, &gu, PORT), count, 1, &[64, 512, 1400]).map(|(n, _)| n))
            .expect("run in namespace")
    } else {
        Err("the guest never started its echo server".into())
    };
    let out = vmm.finish(Duration::from_secs(120));
    assert_eq!(echo.unwrap_or_else(|e| panic!("{e}\n{out}")), count);
    assert!(out.success(), "{out}");
    out
}

/// Starts a guest whose device is `--net tap=TAP,transport=pci` plus `net_extra`, with the
/// net test's `guest_args`.
fn start(tag: &str, subnet: u8, tap_mode: &[&str], net_extra: &str, guest_args: &str) -> PciGuest {
    start_on(
        artifacts().get("kernel"),
        tag,
        subnet,
        tap_mode,
        net_extra,
        guest_args,
    )
}

/// [`start`] with another kernel.
fn start_on(
    kernel: &Path,
    tag: &str,
    subnet: u8,
    tap_mode: &[&str],
    net_extra: &str,
    guest_args: &str,
) -> PciGuest {
    let initrd = artifacts().get("initrd").to_owned();
    let tap = format!("vmmpci{subnet}");
    let host_ip = format!("10.202.{subnet}.1");
    let guest_ip = format!("10.202.{subnet}.2");
    let ns = NetNs::new(tag).expect("create network namespace");
    let mut add = vec!["tuntap", "add", &tap, "mode", "tap", "vnet_hdr"];
    add.extend_from_slice(tap_mode);
    ns.ip(&add).unwrap();
    ns.ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &tap])
        .unwrap();
    ns.ip(&["link", "set", &tap, "up"]).unwrap();
    let cmdline = format!(
        "{} vmm.ip={guest_ip}/24 vmm.peer={host_ip} vmm.port={PORT} vmm.irqs=1 {guest_args}",
        test_cmdline("net")
    );
    let net = format!("tap={tap},transport=pci{net_extra}");
    let mut cmd = linux_guest_command(&ns, (kernel, &initrd), &cmdline, &net);
    let vmm = VmmProcess::spawn(&mut cmd);
    PciGuest {
        ns,
        tap,
        host_ip,
        guest_ip,
        vmm,
    }
}

/// The guest's `/proc/interrupts` lines (between the markers net.sh prints).
fn guest_interrupts(out: &RunOutput) -> Vec<String> {
    out.stdout
        .lines()
        .skip_while(|l| !l.contains("vmm-guest: /proc/interrupts"))
        .skip(1)
        .take_while(|l| !l.contains("vmm-guest: /proc/bus/pci/devices"))
        .map(str::to_owned)
        .collect()
}

/// The count of the MSI-X interrupt named `name` (e.g. `virtio0-input.0`), if it exists.
fn msix_count(irqs: &[String], name: &str) -> Option<u64> {
    irqs.iter()
        .find(|l| l.contains("PCI-MSIX-0000:00:01.0") && l.split_whitespace().last() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

/// What every PCI guest shows: the device at 00:01.0 (1af4:1041, BAR0 at the VMM's
/// 0xe0000000, 64-bit memory), found by Linux's virtio-pci driver, and the VMM's placement.
fn assert_found_on_pci(out: &RunOutput) {
    assert!(
        out.stderr
            .contains("virtio-pci 00:01.0, BAR0 at 0xe0000000, MSI-X vectors on GSI 24..="),
        "{}",
        out.stderr
    );
    let device = out
        .stdout
        .lines()
        .find(|l| l.starts_with("0008\t1af41041"))
        .unwrap_or_else(|| panic!("no 00:01.0 1af4:1041 in /proc/bus/pci/devices: {out}"));
    let fields: Vec<&str> = device.split_whitespace().collect();
    assert_eq!(
        fields[3], "e0000004",
        "BAR0 (64-bit memory at 0xe0000000): {device}"
    );
    assert_eq!(fields.last(), Some(&"virtio-pci"), "{device}");
    assert!(!out.stderr.contains("moved BAR0"), "{}", out.stderr);
}

#[test]
fn a_linux_guest_on_virtio_pci_pings_echoes_udp_with_a_vector_per_queue() {
    let out = ping_and_echo_udp("pci", 1, "");
    assert_eq!(rings_started(&out), "split rings", "by default: {out}");
}

/// The same with `packed=on`: Linux negotiates the packed ring over virtio-pci too, and the
/// queues keep their vectors.
#[test]
fn a_linux_guest_on_virtio_pci_pings_echoes_udp_on_packed_rings() {
    let out = ping_and_echo_udp("pcipk", 6, ",packed=on");
    assert_eq!(rings_started(&out), "packed rings", "{out}");
}

/// Pings and echoes UDP through a guest on 10.202.`subnet`.0/24 whose device has `net_extra`
/// added to its `--net` spec; checks every byte, the MSI-X vectors and the counters, and
/// returns the VMM's output.
fn ping_and_echo_udp(tag: &str, subnet: u8, net_extra: &str) -> RunOutput {
    const COUNT: usize = 300;
    let _guest = guest_lock();
    let g = start(tag, subnet, &[], net_extra, &format!("vmm.echo={COUNT}"));
    let out = udp_echo_then_finish(g.vmm, &g.ns, (&g.host_ip, &g.guest_ip), COUNT);
    assert!(out.stdout.contains("3 packets received"), "ping: {out}");
    assert!(
        out.stdout.contains(&format!(
            "nettest: echo received={COUNT} bad=0 sizes=64,512,1400"
        )),
        "{out}"
    );
    assert_found_on_pci(&out);

    // One MSI-X vector per queue plus the configuration vector; the control queue has none
    // (Linux polls it). Every echo came in on input.0 and went out on output.0.
    let irqs = guest_interrupts(&out);
    eprintln!("guest /proc/interrupts:\n{}", irqs.join("\n"));
    let input = msix_count(&irqs, "virtio0-input.0").unwrap_or_else(|| panic!("{out}"));
    let output = msix_count(&irqs, "virtio0-output.0").unwrap_or_else(|| panic!("{out}"));
    assert!(msix_count(&irqs, "virtio0-config").is_some(), "{out}");
    assert_eq!(
        irqs.iter().filter(|l| l.contains("PCI-MSIX")).count(),
        3,
        "config, input.0, output.0: {out}"
    );
    assert!(input >= COUNT as u64 / 4, "rx interrupts {input}: {out}");
    assert!(output >= 1, "tx interrupts {output}: {out}");
    // Nothing on the legacy pins: the device has no INTx.
    assert!(!irqs
        .iter()
        .any(|l| l.contains("virtio") && l.contains("IO-APIC")));

    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    let dev = &m["net"][g.tap.as_str()];
    assert_eq!(
        dev["rx"]["frames"].as_u64().unwrap() + dev["rx"]["dropped_no_buffer"].as_u64().unwrap(),
        tap_counter(&g.ns, &g.tap, "tx_packets"),
        "{m}"
    );
    assert_eq!(
        dev["tx"]["frames"].as_u64().unwrap(),
        tap_counter(&g.ns, &g.tap, "rx_packets"),
        "{m}"
    );
    // Each interrupt goes to the vectors of the queues that wanted it, not to both: the
    // guest took fewer interrupts in all than two per device signal.
    let signals = dev["irqfd_signals"].as_u64().unwrap();
    assert!(
        input + output < 2 * signals,
        "input {input} + output {output} vs {signals} signals: {m}"
    );
    assert_eq!(dev["tx"]["malformed_chains"], 0, "{m}");
    assert_eq!(dev["rx"]["malformed_chains"], 0, "{m}");
    out
}

/// The TCP stream test of net.rs over virtio-pci: 4 MiB each way at MTU 1500, every byte
/// checked, with guest TSO and host GSO through the device (fewer frames than segments).
#[test]
fn tcp_stream_both_ways_over_virtio_pci() {
    let out = tcp_stream_both_ways("pcitcp", 2, "");
    assert_eq!(rings_started(&out), "split rings", "{out}");
}

/// The same with `packed=on`.
#[test]
fn tcp_stream_both_ways_over_virtio_pci_on_packed_rings() {
    let out = tcp_stream_both_ways("pcitcppk", 7, ",packed=on");
    assert_eq!(rings_started(&out), "packed rings", "{out}");
}

/// Streams TCP each way through a guest on 10.202.`subnet`.0/24 whose device has `net_extra`
/// added to its `--net` spec; checks every byte, the ping, the offloads and the vectors, and
/// returns the VMM's output.
fn tcp_stream_both_ways(tag: &str, subnet: u8, net_extra: &str) -> RunOutput {
    let _guest = guest_lock();
    let g = start(
        tag,
        subnet,
        &[],
        net_extra,
        &format!("vmm.tcp={TCP_STREAM_BYTES}"),
    );
    raise_initial_window(&g.ns, &format!("10.202.{subnet}.0/24"), &g.tap);
    let (out, _) = tcp_through_guest(&g.ns, g.vmm, (&g.guest_ip, PORT), TCP_STREAM_BYTES);
    assert!(out.stdout.contains("3 packets received"), "ping: {out}");
    assert_found_on_pci(&out);
    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    let dev = &m["net"][g.tap.as_str()];
    let rx_frames = dev["rx"]["frames"].as_u64().unwrap() as usize;
    let tx_frames = dev["tx"]["frames"].as_u64().unwrap() as usize;
    eprintln!("TCP over virtio-pci: {rx_frames} rx frames, {tx_frames} tx frames");
    // Frames longer than the MTU exist only through segmentation offload.
    assert_tcp_offloads(dev, &m, TCP_STREAM_BYTES, TCP_MSS);
    let irqs = guest_interrupts(&out);
    assert!(
        msix_count(&irqs, "virtio0-input.0").is_some_and(|n| n > 0),
        "{out}"
    );
    assert!(
        msix_count(&irqs, "virtio0-output.0").is_some_and(|n| n > 0),
        "{out}"
    );
    assert_eq!(dev["tx"]["malformed_chains"], 0, "{m}");
    assert_eq!(dev["rx"]["malformed_chains"], 0, "{m}");
    out
}

/// `queues=2` over PCI on a multi-queue tap: Linux sets up both pairs with a vector each
/// (input.0/output.0/input.1/output.1 plus config; the control queue has none) and, being
/// uniprocessor, enables one pair with VQ_PAIRS_SET: pair 1's vectors never fire.
#[test]
fn two_queue_pairs_over_virtio_pci_get_a_vector_each() {
    let out = two_queue_pairs_echo_udp("pcimq", 3, "");
    assert_eq!(rings_started(&out), "split rings", "{out}");
}

/// The same with `packed=on,in_order=on`: all five queues on packed rings. The device offers
/// VIRTIO_F_IN_ORDER, but the guest's Linux 6.12 does not accept it (its virtio ring code
/// drops the feature bit), so the rings run without it.
#[test]
fn two_queue_pairs_over_virtio_pci_on_packed_rings_with_in_order_offered() {
    let out = two_queue_pairs_echo_udp("pcimqpk", 8, ",packed=on,in_order=on");
    assert_eq!(rings_started(&out), "packed rings", "{out}");
}

/// `queues=2` plus `net_extra` over PCI on a multi-queue tap on 10.202.`subnet`.0/24: UDP
/// echoed with every byte checked, a vector for each queue, traffic on pair 0 only. Returns
/// the VMM's output.
fn two_queue_pairs_echo_udp(tag: &str, subnet: u8, net_extra: &str) -> RunOutput {
    const COUNT: usize = 200;
    let _guest = guest_lock();
    let g = start(
        tag,
        subnet,
        &["multi_queue"],
        &format!(",queues=2{net_extra}"),
        &format!("vmm.echo={COUNT}"),
    );
    let out = udp_echo_then_finish(g.vmm, &g.ns, (&g.host_ip, &g.guest_ip), COUNT);
    assert_found_on_pci(&out);
    assert!(
        out.stderr.contains("MSI-X vectors on GSI 24..=29"),
        "five queues and config: six vectors: {}",
        out.stderr
    );
    let irqs = guest_interrupts(&out);
    eprintln!("guest /proc/interrupts:\n{}", irqs.join("\n"));
    for name in [
        "virtio0-config",
        "virtio0-input.0",
        "virtio0-output.0",
        "virtio0-input.1",
        "virtio0-output.1",
    ] {
        assert!(msix_count(&irqs, name).is_some(), "{name}: {out}");
    }
    assert_eq!(
        irqs.iter().filter(|l| l.contains("PCI-MSIX")).count(),
        5,
        "{out}"
    );
    assert!(msix_count(&irqs, "virtio0-input.0").unwrap() > 0, "{out}");
    assert_eq!(msix_count(&irqs, "virtio0-input.1"), Some(0), "{out}");
    assert_eq!(msix_count(&irqs, "virtio0-output.1"), Some(0), "{out}");
    assert!(
        out.stderr.contains("the driver set 1 queue pair(s)"),
        "{}",
        out.stderr
    );
    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    let pairs = m["net"][g.tap.as_str()]["queues"]
        .as_array()
        .expect("per-pair metrics")
        .clone();
    assert!(
        pairs[0]["rx"]["frames"].as_u64().unwrap() >= COUNT as u64,
        "{m}"
    );
    assert_eq!(pairs[1]["rx"]["frames"], 0, "{m}");
    assert_eq!(pairs[1]["tx"]["frames"], 0, "{m}");
    out
}

/// The guest moves BAR0 (through `/proc/bus/pci/00/01.0`, the driver bound): to 0xe0008000
/// in the window (followed: MMIO range and notify ioeventfds move, on the vCPU thread under
/// its seccomp filter), to 0xc0000000 outside the window (refused with a warning, the VMM
/// runs on; RAM and the other ranges are refused by the same check, unit-tested in
/// `vmm::pci`), and back to 0xe0000000 (followed), after which the device works again: a
/// second ping.
#[test]
fn guest_bar_moves_are_followed_or_refused() {
    let _guest = guest_lock();
    let g = start("pcibar", 4, &[], "", "vmm.barmove=1");
    let out = g.vmm.finish(Duration::from_secs(180));
    assert!(out.success(), "{out}");
    assert_eq!(
        out.stdout.matches("vmm-guest: BAR0 written").count(),
        3,
        "{out}"
    );
    let moved_away = out
        .stderr
        .find("00:01.0: BAR0 moved to 0xe0008000")
        .unwrap_or_else(|| panic!("{}", out.stderr));
    let refused = out
        .stderr
        .find("00:01.0: the guest moved BAR0 to 0xc0000000, outside the PCI window")
        .unwrap_or_else(|| panic!("{}", out.stderr));
    let back = out
        .stderr
        .find("00:01.0: BAR0 moved to 0xe0000000")
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(moved_away < refused && refused < back, "{}", out.stderr);
    assert_eq!(
        out.stdout.matches("3 packets received").count(),
        2,
        "the device works before and after the moves: {out}"
    );
}

/// `/sys/class/net/eth0/queues` (on the `sysfs` kernel variant) lists the queues Linux gave
/// eth0: one rx and one tx queue per active pair. With `queues=2` the uniprocessor guest
/// enables one pair (VQ_PAIRS_SET 1), so `rx-0 tx-0`, while both pairs have their vectors.
#[test]
fn sysfs_lists_the_queues_linux_uses() {
    let _guest = guest_lock();
    let kernel = kernel_variant("sysfs");
    let g = start_on(kernel, "pcisys", 5, &["multi_queue"], ",queues=2", "");
    let out = g.vmm.finish(Duration::from_secs(180));
    assert!(out.success(), "{out}");
    assert_found_on_pci(&out);
    let queues: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|l| !l.contains("vmm-guest: /sys/class/net/eth0/queues"))
        .skip(1)
        .take_while(|l| !l.contains("vmm-guest: end of lists"))
        .flat_map(str::split_whitespace)
        .collect();
    assert_eq!(queues, ["rx-0", "tx-0"], "{out}");
    let irqs = guest_interrupts(&out);
    for name in ["virtio0-input.1", "virtio0-output.1"] {
        assert!(msix_count(&irqs, name).is_some(), "{name}: {out}");
    }
}
