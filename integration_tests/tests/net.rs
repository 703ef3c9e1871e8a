//! virtio-net on a tap through the `vmm` binary: the guest pings the host and echoes UDP
//! datagrams of 64, 1400 and 9000 bytes, every byte checked both ways; the device metrics agree
//! with the tap's own counters. A TCP stream each way uses segmentation offloads. Each test
//! runs on split rings and again with `packed=on` on packed rings; the UDP echo also runs with
//! the device's kick coalescing. The tap, its address and the VMM live in a network namespace
//! the test creates.

use std::time::{Duration, Instant};

use devices::test_utils::netns::NetNs;
use integration_tests::udp;
use integration_tests::{
    artifacts, assert_tap_counters_match, assert_tcp_offloads, final_metrics, guest_lock,
    linux_guest_command, raise_initial_window, rings_started, tcp_through_guest, test_cmdline,
    VmmProcess, TCP_MSS, TCP_STREAM_BYTES,
};

const TAP: &str = "vmmtap0";
const HOST_IP: &str = "10.200.0.1";
const GUEST_IP: &str = "10.200.0.2";
const PORT: u16 = 7777;
const SIZES: [usize; 3] = [64, 1400, 9000];
/// Datagrams of each size, each echoed back.
const PER_SIZE: usize = 1000;
const WINDOW: usize = 8;

/// A namespace with the tap configured as the host end (HOST_IP, `mtu`), and the VMM started
/// in it with the guest's net test and `extra` kernel parameters, `net_keys` added to its
/// `--net` spec (`,key=value…`).
fn start_guest_with(tag: &str, mtu: u32, extra: &str, net_keys: &str) -> (NetNs, VmmProcess) {
    let a = artifacts();
    let (kernel, initrd) = (a.get("kernel").to_owned(), a.get("initrd").to_owned());
    let ns = NetNs::new(tag).expect("create network namespace");
    ns.ip(&["tuntap", "add", TAP, "mode", "tap", "vnet_hdr"])
        .unwrap();
    ns.ip(&["link", "set", TAP, "mtu", &mtu.to_string()])
        .unwrap();
    ns.ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", TAP])
        .unwrap();
    ns.ip(&["link", "set", TAP, "up"]).unwrap();
    let cmdline = format!(
        "{} vmm.ip={GUEST_IP}/24 vmm.peer={HOST_IP} vmm.mtu={mtu} vmm.port={PORT} {extra}",
        test_cmdline("net")
    );
    let net = format!("tap={TAP}{net_keys}");
    let mut cmd = linux_guest_command(&ns, (&kernel, &initrd), &cmdline, &net);
    let vmm = VmmProcess::spawn(&mut cmd);
    (ns, vmm)
}

#[test]
fn guest_pings_host_and_echoes_udp_with_every_byte_checked() {
    let out = ping_and_echo_udp("udp", "");
    assert_eq!(rings_started(&out), "split rings", "by default: {out}");
}

/// The same with `packed=on`: a Linux guest negotiates the packed ring when it is offered, and
/// every byte still arrives both ways.
#[test]
fn guest_pings_host_and_echoes_udp_on_packed_rings() {
    let out = ping_and_echo_udp("udppk", ",packed=on");
    assert_eq!(rings_started(&out), "packed rings", "{out}");
}

/// The same with kick coalescing: Linux's driver, which kicks where `avail_event` says, may
/// queue up to 64 frames without a kick, and the device looks at the ring by itself 200 µs
/// after each drain; a look that finds it empty hands the next frame its kick back. Every byte
/// still arrives both ways, and the device looked by itself. Whether a look also finds frames
/// depends on the guest sending two within 200 µs, which a kernel this host emulates (a
/// round trip of ~10 ms) does only now and then: the looks that send frames are asserted where
/// the guest's pace is known (`driver_guest.rs`, `kick_coalescing_spares_a_bursty_guests_kicks`).
#[test]
fn guest_pings_host_and_echoes_udp_with_kick_coalescing() {
    let out = ping_and_echo_udp("udpkc", ",kick_coalesce_packets=64,kick_coalesce_usecs=200");
    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    let tx = &m["net"][TAP]["tx"];
    let (looks, found) = (
        tx["kick_timer_looks"].as_u64().unwrap(),
        tx["kick_timer_found"].as_u64().unwrap(),
    );
    eprintln!("kick coalescing: {looks} looks, {found} of them found frames");
    assert!(looks > 0 && found <= looks, "{m}");
}

/// Pings and echoes UDP through a guest whose `--net` spec has `net_keys` added, checks every
/// byte and the counters, and returns the VMM's output.
fn ping_and_echo_udp(tag: &str, net_keys: &str) -> integration_tests::RunOutput {
    let _guest = guest_lock();
    let count = PER_SIZE * SIZES.len();
    let (ns, mut vmm) = start_guest_with(tag, 9000, &format!("vmm.echo={count}"), net_keys);

    let ready = vmm.wait_for_console("nettest: listening", Duration::from_secs(180));
    let (echo, echo_time) = if ready {
        let t = Instant::now();
        (
            ns.run(move || udp::echo((HOST_IP, GUEST_IP, PORT), count, WINDOW, &SIZES))
                .expect("run in namespace"),
            t.elapsed(),
        )
    } else {
        (
            Err("the guest never started its echo server".into()),
            Duration::ZERO,
        )
    };
    let out = vmm.finish(Duration::from_secs(120));
    let (echoed, bytes) = echo.unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(echoed, count);
    eprintln!(
        "echoed {echoed} datagrams ({bytes} bytes each way) in {echo_time:.1?}; ping: {}",
        out.stdout
            .lines()
            .find(|l| l.contains("round-trip"))
            .unwrap_or("?")
    );

    assert!(
        out.stdout.contains("3 packets received"),
        "ping failed: {out}"
    );
    assert!(
        out.stdout.contains(&format!(
            "nettest: echo received={count} bad=0 sizes=64,1400,9000"
        )),
        "{out}"
    );
    assert!(out.success(), "{out}");

    // The device's counters agree with the tap's: what the tap sent is what the device
    // received (or counted as dropped), and the other way round.
    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    let dev = &m["net"][TAP];
    let rx_frames = dev["rx"]["frames"].as_u64().unwrap();
    let tx_frames = dev["tx"]["frames"].as_u64().unwrap();
    assert_tap_counters_match(&ns, TAP, dev, &m);
    assert!(
        rx_frames >= count as u64 && tx_frames >= count as u64,
        "{m}"
    );
    assert!(dev["rx"]["bytes"].as_u64().unwrap() >= bytes as u64, "{m}");
    assert!(dev["tx"]["bytes"].as_u64().unwrap() >= bytes as u64, "{m}");
    assert_eq!(dev["tx"]["malformed_chains"], 0, "{m}");
    assert_eq!(dev["rx"]["malformed_chains"], 0, "{m}");
    out
}

/// A TCP stream each way at MTU 1500 with every byte checked. The guest negotiates checksum
/// and TSO offloads, so both directions carry frames larger than the MTU (GSO through the
/// tap's virtio-net header): far fewer frames than MTU-sized segments would need.
#[test]
fn tcp_stream_both_ways_uses_segmentation_offload() {
    let out = tcp_stream_both_ways("tcp", "");
    assert_eq!(rings_started(&out), "split rings", "{out}");
}

/// The same with `packed=on`: TSO frames of up to 64 KiB each way, as descriptor chains on
/// the packed ring.
#[test]
fn tcp_stream_both_ways_uses_segmentation_offload_on_packed_rings() {
    let out = tcp_stream_both_ways("tcppk", ",packed=on");
    assert_eq!(rings_started(&out), "packed rings", "{out}");
}

/// Streams TCP each way through a guest whose `--net` spec has `net_keys` added, checks every
/// byte, the ping and the offloads, and returns the VMM's output.
fn tcp_stream_both_ways(tag: &str, net_keys: &str) -> integration_tests::RunOutput {
    let _guest = guest_lock();
    let (ns, vmm) = start_guest_with(tag, 1500, &format!("vmm.tcp={TCP_STREAM_BYTES}"), net_keys);
    raise_initial_window(&ns, "10.200.0.0/24", TAP);
    let sysctl = ns
        .command("sysctl")
        .args(["-qw", "net.ipv4.tcp_min_tso_segs=16"])
        .status()
        .expect("run sysctl");
    assert!(sysctl.success());
    let (out, took) = tcp_through_guest(&ns, vmm, (GUEST_IP, PORT), TCP_STREAM_BYTES);
    assert!(
        out.stdout.contains("3 packets received"),
        "ping failed: {out}"
    );
    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    let dev = &m["net"][TAP];
    let (rx_frames, tx_frames) = (
        dev["rx"]["frames"].as_u64().unwrap() as usize,
        dev["tx"]["frames"].as_u64().unwrap() as usize,
    );
    eprintln!(
        "TCP {TCP_STREAM_BYTES} bytes each way in {took:.1?}: {rx_frames} rx frames, {tx_frames} tx frames"
    );
    // Frames longer than the MTU exist only through segmentation offload.
    assert_tcp_offloads(dev, &m, TCP_STREAM_BYTES, TCP_MSS);
    assert_eq!(dev["tx"]["malformed_chains"], 0, "{m}");
    assert_eq!(dev["rx"]["malformed_chains"], 0, "{m}");
    assert_eq!(dev["tx"]["backend_errors"], 0, "{m}");
    out
}
