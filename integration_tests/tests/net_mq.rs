//! Multiqueue virtio-net with a Linux guest: `--net tap=TAP,queues=2` on a `multi_queue` tap.
//! Linux's virtio_net negotiates MQ, sets up the five queues (rx0 tx0 rx1 tx1 ctrl) over
//! virtio-mmio and sends VQ_PAIRS_SET with min(`max_virtqueue_pairs`, CPUs) at probe: 1, the
//! test kernel being uniprocessor (CONFIG_SMP off). UDP datagrams over 16 flows (source
//! ports) are echoed with every byte checked: the idle pair's tap queue is detached, so the
//! host kernel steers every flow to pair 0 and none is lost on a queue nobody reads (the
//! tap's counters equal the device's). The per-pair counters add up to the totals. The test
//! runs on split rings and again on packed rings (`packed=on`).

use std::net::UdpSocket;
use std::time::Duration;

use devices::test_utils::netns::NetNs;
use integration_tests::udp;
use integration_tests::{
    artifacts, assert_tap_counters_match, final_metrics, guest_lock, linux_guest_command,
    rings_started, test_cmdline, RunOutput, VmmProcess,
};

const TAP: &str = "vmmmqtap0";
const HOST_IP: &str = "10.201.0.1";
const GUEST_IP: &str = "10.201.0.2";
const PORT: u16 = 7777;
const FLOWS: usize = 16;
const PER_FLOW: usize = 50;

/// PER_FLOW datagrams on each of FLOWS sockets (one at a time, each echo checked).
fn udp_echo_flows() -> Result<usize, String> {
    let socks = (0..FLOWS)
        .map(|_| {
            let s = UdpSocket::bind((HOST_IP, 0)).map_err(|e| format!("bind: {e}"))?;
            s.connect((GUEST_IP, PORT))
                .map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(15)))
                .map_err(|e| e.to_string())?;
            Ok(s)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut buf = vec![0u8; 4096];
    let mut echoed = 0;
    for round in 0..PER_FLOW {
        for (flow, sock) in socks.iter().enumerate() {
            let seq = (round * FLOWS + flow) as u32;
            let size = 64 + (seq as usize * 37) % 1300;
            let out = udp::pattern(seq, size);
            sock.send(&out).map_err(|e| format!("send #{seq}: {e}"))?;
            let n = sock
                .recv(&mut buf)
                .map_err(|e| format!("no echo for #{seq} (flow {flow}): {e}"))?;
            if buf[..n] != out[..] {
                return Err(format!("echo #{seq} differs from what was sent"));
            }
            echoed += 1;
        }
    }
    Ok(echoed)
}

#[test]
fn a_linux_guest_uses_two_queue_pairs_on_a_multi_queue_tap() {
    let out = two_queue_pairs_echo_udp("mq", "");
    assert_eq!(rings_started(&out), "split rings", "{out}");
}

/// The same with `packed=on`: all five queues, the control queue's included, on packed rings.
#[test]
fn a_linux_guest_uses_two_queue_pairs_on_packed_rings() {
    let out = two_queue_pairs_echo_udp("mqpk", ",packed=on");
    assert_eq!(rings_started(&out), "packed rings", "{out}");
}

/// `--net tap=TAP,queues=2` plus `net_keys` (`,key=value…`): pings, echoes UDP over FLOWS
/// flows with every byte checked, checks the control queue's VQ_PAIRS_SET and the per-pair
/// counters, and returns the VMM's output.
fn two_queue_pairs_echo_udp(tag: &str, net_keys: &str) -> RunOutput {
    let _guest = guest_lock();
    let a = artifacts();
    let (kernel, initrd) = (a.get("kernel").to_owned(), a.get("initrd").to_owned());
    let ns = NetNs::new(tag).expect("create network namespace");
    ns.ip(&[
        "tuntap",
        "add",
        TAP,
        "mode",
        "tap",
        "vnet_hdr",
        "multi_queue",
    ])
    .unwrap();
    ns.ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", TAP])
        .unwrap();
    ns.ip(&["link", "set", TAP, "up"]).unwrap();
    let count = FLOWS * PER_FLOW;
    let cmdline = format!(
        "{} vmm.ip={GUEST_IP}/24 vmm.peer={HOST_IP} vmm.port={PORT} vmm.echo={count}",
        test_cmdline("net")
    );
    let net = format!("tap={TAP},queues=2{net_keys}");
    let mut cmd = linux_guest_command(&ns, (&kernel, &initrd), &cmdline, &net);
    let mut vmm = VmmProcess::spawn(&mut cmd);

    let ready = vmm.wait_for_console("nettest: listening", Duration::from_secs(180));
    let echo = if ready {
        ns.run(udp_echo_flows).expect("run in namespace")
    } else {
        Err("the guest never started its echo server".into())
    };
    let out = vmm.finish(Duration::from_secs(120));
    let echoed = echo.unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(echoed, count);
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("3 packets received"), "ping: {out}");
    assert!(
        out.stdout
            .contains(&format!("nettest: echo received={count} bad=0")),
        "{out}"
    );

    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    let dev = &m["net"][TAP];
    // Linux negotiated MQ and set its pairs (1: one CPU) at probe.
    assert!(dev["ctrl"]["mq_pairs_sets"].as_u64().unwrap() >= 1, "{m}");
    assert!(
        out.stderr.contains("the driver set 1 queue pair(s)"),
        "{}",
        out.stderr
    );
    assert_eq!(dev["ctrl"]["errors"], 0, "{m}");
    let pairs = dev["queues"].as_array().expect("per-pair metrics");
    assert_eq!(pairs.len(), 2, "{m}");
    for dir in ["rx", "tx"] {
        for field in ["frames", "bytes", "kicks"] {
            let sum: u64 = pairs.iter().map(|p| p[dir][field].as_u64().unwrap()).sum();
            assert_eq!(sum, dev[dir][field].as_u64().unwrap(), "{dir}.{field}: {m}");
        }
    }
    let rx_frames = dev["rx"]["frames"].as_u64().unwrap();
    assert_tap_counters_match(&ns, TAP, dev, &m);
    assert!(rx_frames >= count as u64, "{m}");
    // Everything went through pair 0; pair 1 was never polled.
    assert_eq!(pairs[0]["rx"]["frames"].as_u64().unwrap(), rx_frames, "{m}");
    assert_eq!(pairs[1]["rx"]["frames"], 0, "{m}");
    assert_eq!(pairs[1]["tx"]["frames"], 0, "{m}");
    eprintln!(
        "queues=2: pair 0 rx {} tx {}, pair 1 rx {} tx {}",
        pairs[0]["rx"]["frames"],
        pairs[0]["tx"]["frames"],
        pairs[1]["rx"]["frames"],
        pairs[1]["tx"]["frames"]
    );
    assert_eq!(dev["tx"]["malformed_chains"], 0, "{m}");
    assert_eq!(dev["rx"]["malformed_chains"], 0, "{m}");
    out
}
