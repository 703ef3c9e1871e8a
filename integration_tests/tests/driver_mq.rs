//! The bare-metal driver guest with two queue pairs: `--net tap=TAP,queues=2` on a multi-queue
//! tap, the guest at `ring=3` with `queues=2`. Over virtio-mmio the pairs share one interrupt;
//! the guest negotiates VIRTIO_NET_F_MQ, sets up rx0 tx0 rx1 tx1 and the control queue (4),
//! and enables both pairs with VQ_PAIRS_SET 2.
//!
//! - tx: the guest spreads its frames round robin per batch over the pairs; a host AF_PACKET
//!   socket on the tap checks that every frame arrives once and intact (the sequence number is
//!   the frame's id), and the device's per-pair counters (`queues[i]` in the metrics the VMM
//!   prints at exit) show both tap queues carried them.
//! - echo: the host sends frames, the guest bounces each on the pair it arrived on (XDP_TX)
//!   and the host checks every echo. Which tap queue (hence which pair) a host frame reaches
//!   is the host kernel's choice: tun hashes the skb's flow, and a frame of the test
//!   EtherType dissects no further than its protocol, so every frame would hash alike and
//!   take one queue. The host therefore sends each frame (its bytes unchanged) with one of
//!   [`STEER_PROTOCOLS`] protocol values in turn as the skb's protocol: different hashes,
//!   spread over both queues (the hash key is random per host boot; with 16 values the chance
//!   that all land on one queue is 2^-15).
//!
//! In both, the guest's per-queue counters (`queues[i]` in its result line) equal the
//! device's per-pair counters: frames and kicks per queue.
//!
//! Both also run over virtio-pci (`--net …,transport=pci`, `transport=pci` in the guest): one
//! MSI-X vector per queue (entry q + 1 for queue q, the control queue's after both pairs),
//! every one programmed and unmasked by the guest; the interrupts arrive on the vectors of the
//! queue that wanted them, pair 1's included.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use devices::test_utils::netns::NetNs;
use integration_tests::packet::{self, collect_frames, frame, guest_mac, mac_string, PacketSocket};
use integration_tests::{
    driver_result, final_metrics, guest_lock, json_u64 as n, tap_counter, RunOutput, VmmProcess,
};
use serde_json::Value;

const TAP: &str = "vmmdmqtap0";
/// The destination MAC of the frames the host sends (the guest swaps it into the source).
const GUEST_DST: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
/// Frames in flight when the host sends for the echo workload.
const WINDOW: u64 = 32;
const PAIRS: usize = 2;
/// skb protocols the echo test's frames are sent with (the frames keep EtherType 0x88b5).
const STEER_PROTOCOLS: u16 = 16;

fn namespace(tag: &str) -> (NetNs, PacketSocket, [u8; 6]) {
    let ns = integration_tests::namespace_with_multi_queue_tap(tag, TAP);
    let (sock, tap_mac) = packet::tap_socket(&ns, TAP);
    (ns, sock, tap_mac)
}

/// The device's transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Mmio,
    Pci,
}

fn start_guest(ns: &NetNs, cmdline: &str, transport: Transport) -> VmmProcess {
    let net = format!("tap={TAP},queues={PAIRS}");
    match transport {
        Transport::Mmio => integration_tests::spawn_driver_guest(ns, cmdline, &net, None),
        Transport::Pci => integration_tests::spawn_driver_guest(
            ns,
            &format!("{cmdline} transport=pci"),
            &format!("{net},transport=pci"),
            None,
        ),
    }
}

/// The guest's per-queue counters against the device's per-pair ones; returns the guest's
/// queues.
fn check_pairs(d: &Value, m: &Value, out: &RunOutput) -> Vec<Value> {
    let dev = &m["net"][TAP];
    let ctx = || format!("driver {d}\ndevice {dev}\n{out}");
    assert_eq!(d["status"], "done", "{}", ctx());
    assert_eq!(n(d, "queue_pairs"), PAIRS as u64, "{}", ctx());
    // MQ negotiated (bit 22) and both pairs enabled with one VQ_PAIRS_SET.
    assert_ne!(n(d, "features") & (1 << 22), 0, "{}", ctx());
    assert_eq!(n(&dev["ctrl"], "mq_pairs_sets"), 1, "{}", ctx());
    assert_eq!(n(&dev["ctrl"], "errors"), 0, "{}", ctx());
    assert!(
        out.stderr.contains("the driver set 2 queue pair(s)"),
        "{}",
        ctx()
    );
    let guest = d["queues"].as_array().expect("guest queues").clone();
    let device = dev["queues"].as_array().expect("device queues");
    assert_eq!((guest.len(), device.len()), (PAIRS, PAIRS), "{}", ctx());
    for (i, (g, p)) in guest.iter().zip(device).enumerate() {
        assert_eq!(n(g, "tx"), n(&p["tx"], "frames"), "pair {i} tx: {}", ctx());
        assert_eq!(n(g, "rx"), n(&p["rx"], "frames"), "pair {i} rx: {}", ctx());
        assert_eq!(
            n(g, "kicks"),
            n(&p["tx"], "kicks"),
            "pair {i} kicks: {}",
            ctx()
        );
        assert_eq!(
            n(g, "rx_kicks"),
            n(&p["rx"], "kicks"),
            "pair {i} rx kicks: {}",
            ctx()
        );
        assert_eq!(n(&p["tx"], "malformed_chains"), 0, "{}", ctx());
        // A pair is counted for an interrupt only if the driver serviced one.
        assert!(n(g, "irqs") <= n(d, "interrupts"), "pair {i}: {}", ctx());
    }
    // The device-wide counters are the sums, on both sides.
    for (key, dir, field) in [("tx", "tx", "frames"), ("rx", "rx", "frames")] {
        let sum: u64 = guest.iter().map(|g| n(g, key)).sum();
        assert_eq!(sum, n(&dev[dir], field), "{key}: {}", ctx());
    }
    assert_eq!(n(d, "device_errors"), 0, "{}", ctx());
    assert!(n(d, "interrupts") <= n(d, "irqs_taken"), "{}", ctx());
    guest
}

fn per_pair(queues: &[Value], key: &str) -> Vec<u64> {
    queues.iter().map(|q| n(q, key)).collect()
}

/// Over virtio-pci: each queue has its own MSI-X vector (config 0, rx0 1, tx0 2, rx1 3, tx1 4,
/// control 5), the per-pair vector counts add up to the per-source totals, those to every
/// interrupt taken, and no queue vector fired more often than its pair's queue signalled.
/// On virtio-mmio every vector count is 0.
fn check_vectors(d: &Value, queues: &[Value], m: &Value, out: &RunOutput, transport: Transport) {
    let dev = &m["net"][TAP];
    let ctx = || format!("driver {d}\ndevice {dev}\n{out}");
    let (rx, tx) = (per_pair(queues, "irqs_rx"), per_pair(queues, "irqs_tx"));
    let totals = ["irqs_rx", "irqs_tx", "irqs_ctrl", "irqs_config"].map(|k| n(d, k));
    if transport == Transport::Mmio {
        assert_eq!(d["transport"], "mmio", "{}", ctx());
        assert!(
            rx.iter().chain(&tx).chain(&totals).all(|&c| c == 0),
            "{}",
            ctx()
        );
        return;
    }
    assert_eq!(d["transport"], "pci", "{}", ctx());
    assert!(
        out.stdout.contains(
            "driver-guest: msix vectors config=Some(0) rx=Some(1) tx=Some(2) ctrl=Some(5) \
             rx1=Some(3) tx1=Some(4)"
        ),
        "{}",
        ctx()
    );
    assert_eq!(rx.iter().sum::<u64>(), totals[0], "{}", ctx());
    assert_eq!(tx.iter().sum::<u64>(), totals[1], "{}", ctx());
    assert_eq!(totals.iter().sum::<u64>(), n(d, "irqs_taken"), "{}", ctx());
    assert_eq!(totals[3], 0, "no configuration change: {}", ctx());
    let device = dev["queues"].as_array().expect("device queues");
    for (i, p) in device.iter().enumerate() {
        // The device raises a queue's vector only when that queue wanted the interrupt; an
        // edge arriving while the previous one is pending merges with it.
        let (rx_raised, tx_raised) = (
            n(&p["rx"], "interrupts_raised"),
            n(&p["tx"], "interrupts_raised"),
        );
        assert!(rx[i] <= rx_raised, "pair {i} rx: {}", ctx());
        assert!(tx[i] <= tx_raised, "pair {i} tx: {}", ctx());
    }
}

/// Tx: `count` frames spread over both pairs, every one intact at the host.
#[test]
fn two_pairs_transmit_frames_the_host_receives_intact() {
    run_tx("dmqtx", Transport::Mmio);
}

/// Tx over virtio-pci: the same, and each pair's tx completions interrupt on its own tx
/// vector.
#[test]
fn two_pairs_over_pci_transmit_with_a_vector_per_queue() {
    let queues = run_tx("dmqpcitx", Transport::Pci);
    let tx = per_pair(&queues, "irqs_tx");
    assert!(tx.iter().all(|&i| i > 0), "tx vectors per pair {tx:?}");
}

/// Runs the tx test; returns the guest's per-queue counters.
fn run_tx(tag: &str, transport: Transport) -> Vec<Value> {
    const COUNT: u64 = 20_000;
    const SIZE: usize = 128;
    let _guest = guest_lock();
    let (ns, sock, tap_mac) = namespace(tag);
    let cmdline = format!(
        "console=ttyS0 tx={COUNT} size={SIZE} dst={} queues={PAIRS} ring=3 timeout_ms=120000",
        mac_string(tap_mac)
    );
    let reader = collect_frames(sock, COUNT, Duration::from_secs(180), Duration::ZERO);
    let vmm = start_guest(&ns, &cmdline, transport);
    let out = vmm.finish(Duration::from_secs(180));
    let frames = reader.join().expect("reader thread");
    assert!(out.success(), "{out}");
    let d = driver_result(&out);
    let src = guest_mac(&out.stdout).unwrap_or_else(|| panic!("no ready line\n{out}"));
    assert!(out.stdout.contains(" pairs=2 "), "{out}");

    // Every frame once, intact (the pairs' tap queues interleave them on the tap).
    assert_eq!(
        frames.len() as u64,
        COUNT,
        "frames the host received\n{out}"
    );
    let mut seen = BTreeSet::new();
    for f in &frames {
        let seq = packet::seq_of(f).unwrap_or_else(|| panic!("not a test frame: {f:02x?}"));
        assert!(
            *f == frame(tap_mac, src, seq, SIZE),
            "frame #{seq} differs ({} bytes): {:02x?}",
            f.len(),
            &f[..f.len().min(32)]
        );
        assert!(seen.insert(seq), "frame #{seq} twice");
    }
    assert_eq!(seen.last().copied(), Some(COUNT as u32 - 1));

    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line\n{out}"));
    let queues = check_pairs(&d, &m, &out);
    check_vectors(&d, &queues, &m, &out, transport);
    assert_eq!(n(&d, "tx_frames"), COUNT, "{d}");
    // Round robin per batch: both pairs carried a large share.
    let tx = per_pair(&queues, "tx");
    assert!(
        tx.iter().all(|&t| t >= COUNT / 4),
        "frames per pair {tx:?}: {d}"
    );
    // Both pairs kicked and (tx-interrupt mode) had completions serviced by interrupt.
    assert!(per_pair(&queues, "kicks").iter().all(|&k| k > 0), "{d}");
    assert!(per_pair(&queues, "irqs").iter().all(|&i| i > 0), "{d}");
    assert!(
        per_pair(&queues, "tx_reclaimed") == tx,
        "every frame reclaimed on its own pair: {d}"
    );
    // The host kernel counted every frame the device wrote to either tap queue.
    assert_eq!(
        tap_counter(&ns, TAP, "rx_packets"),
        n(&m["net"][TAP]["tx"], "frames"),
        "{m}"
    );
    eprintln!(
        "queues=2 tx x{COUNT} size={SIZE} {transport:?}: frames per pair {tx:?}, kicks per pair \
         {:?}, irqs per pair {:?}, tx vector irqs per pair {:?}, {} pps (in guest)",
        per_pair(&queues, "kicks"),
        per_pair(&queues, "irqs"),
        per_pair(&queues, "irqs_tx"),
        d["pps"]
    );
    queues
}

/// Echo: the host's frames, spread over both tap queues, come back intact on the pair each
/// arrived on.
#[test]
fn two_pairs_echo_frames_back_intact() {
    // Interrupt-driven (tx interrupts too), and a polling loop that cleans tx from rx.
    run_echo("dmqecho", "", Transport::Mmio);
    run_echo(
        "dmqechopoll",
        "wait=poll tx_completion=clean-from-rx",
        Transport::Mmio,
    );
}

/// Echo over virtio-pci: the same; interrupt-driven, each pair's frames interrupt on its own
/// rx vector (and its bounces' completions on its tx vector).
#[test]
fn two_pairs_over_pci_echo_with_a_vector_per_queue() {
    let queues = run_echo("dmqpciecho", "", Transport::Pci);
    let (rx, tx) = (per_pair(&queues, "irqs_rx"), per_pair(&queues, "irqs_tx"));
    assert!(rx.iter().all(|&i| i > 0), "rx vectors per pair {rx:?}");
    assert!(tx.iter().all(|&i| i > 0), "tx vectors per pair {tx:?}");
    run_echo(
        "dmqpciechopoll",
        "wait=poll tx_completion=clean-from-rx",
        Transport::Pci,
    );
}

/// Runs the echo test; returns the guest's per-queue counters.
fn run_echo(tag: &str, knobs: &str, transport: Transport) -> Vec<Value> {
    const COUNT: u64 = 5_000;
    const SIZE: usize = 256;
    let _guest = guest_lock();
    let (ns, sock, tap_mac) = namespace(tag);
    let cmdline = format!(
        "console=ttyS0 echo={COUNT} size={SIZE} queues={PAIRS} ring=3 timeout_ms=120000 {knobs}"
    );
    let mut vmm = start_guest(&ns, &cmdline, transport);
    assert!(
        vmm.wait_for_console_line("driver-guest: ready", Duration::from_secs(60)),
        "the guest never came up"
    );
    let exchange = || -> Result<u64, String> {
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut buf = vec![0u8; 65536];
        let (mut sent, mut received) = (0u64, 0u64);
        let mut seen = BTreeSet::new();
        while received < COUNT {
            while sent < COUNT && sent - received < WINDOW {
                let protocol = packet::ETHERTYPE + (sent % u64::from(STEER_PROTOCOLS)) as u16;
                sock.send_as(&frame(GUEST_DST, tap_mac, sent as u32, SIZE), protocol)
                    .map_err(|e| format!("send #{sent}: {e}"))?;
                sent += 1;
            }
            let len = match sock.recv(&mut buf, deadline).map_err(|e| e.to_string())? {
                Some(len) => len,
                None => return Err(format!("no echo after {received} of {COUNT} (sent {sent})")),
            };
            // Pairs may interleave their echoes: check each by its own id.
            let echo = &buf[..len];
            let seq = packet::seq_of(echo).ok_or_else(|| format!("not a test frame: {len}"))?;
            // The guest swaps the MACs.
            if echo != frame(tap_mac, GUEST_DST, seq, SIZE) || u64::from(seq) >= sent {
                return Err(format!(
                    "echo #{seq} differs ({len} bytes): {:02x?}",
                    &echo[..len.min(32)]
                ));
            }
            if !seen.insert(seq) {
                return Err(format!("echo #{seq} twice"));
            }
            received += 1;
        }
        Ok(received)
    };
    let result = exchange();
    let out = vmm.finish(Duration::from_secs(120));
    let echoed = result.unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(echoed, COUNT);
    assert!(out.success(), "{out}");
    let d = driver_result(&out);
    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line\n{out}"));
    let queues = check_pairs(&d, &m, &out);
    check_vectors(&d, &queues, &m, &out, transport);
    assert_eq!((n(&d, "xdp_tx"), n(&d, "rx_frames")), (COUNT, COUNT), "{d}");
    assert_eq!(n(&d, "xdp_tx_errors"), 0, "{d}");
    // Each pair bounced exactly what it received.
    let (rx, tx) = (per_pair(&queues, "rx"), per_pair(&queues, "tx"));
    assert_eq!(rx, tx, "{d}");
    assert_eq!(rx.iter().sum::<u64>(), COUNT, "{d}");
    assert!(
        rx.iter().all(|&r| r > 0),
        "both pairs received: {rx:?}: {d}"
    );
    eprintln!(
        "queues=2 echo x{COUNT} size={SIZE} {transport:?} {knobs}: frames per pair {rx:?}, irqs \
         per pair {:?}, rx/tx vector irqs per pair {:?}/{:?}, {} pps (in guest)",
        per_pair(&queues, "irqs"),
        per_pair(&queues, "irqs_rx"),
        per_pair(&queues, "irqs_tx"),
        d["pps"]
    );
    queues
}

/// Pair counts the device cannot give end the run with an error line that says why: more
/// pairs than `max_virtqueue_pairs`, a device without multiqueue, `queues=` without the
/// control queue, and an out-of-range `queues=`.
#[test]
fn unusable_pair_counts_are_clear_error_lines() {
    let _guest = guest_lock();
    let cases = [
        // (guest words, device queues, what the error says)
        (
            "queues=3",
            PAIRS,
            "3 queue pairs asked for, but the device has at most 2",
        ),
        ("queues=2", 1, "the device offers no multiqueue"),
        ("queues=2 ctrl_vq=0", PAIRS, "queues"),
        ("queues=17", PAIRS, "queues"),
    ];
    for (i, (words, device_queues, error)) in cases.into_iter().enumerate() {
        // A one-pair device needs a tap without multi_queue.
        let tag = format!("dmqbad{i}");
        let ns = if device_queues > 1 {
            integration_tests::namespace_with_multi_queue_tap(&tag, TAP)
        } else {
            integration_tests::namespace_with_tap(&tag, TAP)
        };
        let cmdline = format!("console=ttyS0 tx=10 ring=3 {words}");
        let net = format!("tap={TAP},queues={device_queues}");
        let vmm = integration_tests::spawn_driver_guest(&ns, &cmdline, &net, None);
        let out = vmm.finish(Duration::from_secs(60));
        assert!(out.success(), "{words}: {out}");
        let d = driver_result(&out);
        assert_eq!(d["status"], "error", "{words}: {d}");
        let text = d["error"].as_str().unwrap_or("");
        assert!(text.contains(error), "{words}: {text:?} lacks {error:?}");
    }
}

/// The most pairs `queues=` takes, over virtio-pci: 34 MSI-X entries (config, 16 rx, 16 tx,
/// control at 33), every one programmed, unmasked and handled by the guest; a tx workload's
/// completions interrupt on all 16 tx vectors (the last generated stubs included) and every
/// frame arrives.
#[test]
fn sixteen_pairs_over_pci_interrupt_on_every_tx_vector() {
    const PAIRS16: u16 = 16;
    const COUNT: u64 = 16 * 256;
    const SIZE: usize = 64;
    let _guest = guest_lock();
    let (ns, sock, tap_mac) = namespace("dmqpci16");
    let cmdline = format!(
        "console=ttyS0 tx={COUNT} size={SIZE} dst={} queues={PAIRS16} queue_size=64 batch=16 \
         ring=3 timeout_ms=120000 transport=pci",
        mac_string(tap_mac)
    );
    let reader = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut buf = vec![0u8; 65536];
        let mut seen = BTreeSet::new();
        while (seen.len() as u64) < COUNT {
            match sock.recv(&mut buf, deadline) {
                Ok(Some(len)) => {
                    if let Some(seq) = packet::seq_of(&buf[..len]) {
                        seen.insert(seq);
                    }
                }
                Ok(None) => break,
                Err(e) => panic!("AF_PACKET recv: {e}"),
            }
        }
        seen
    });
    let vmm = integration_tests::spawn_driver_guest(
        &ns,
        &cmdline,
        &format!("tap={TAP},queues={PAIRS16},transport=pci"),
        None,
    );
    let out = vmm.finish(Duration::from_secs(120));
    let seen = reader.join().expect("reader thread");
    assert!(out.success(), "{out}");
    let d = driver_result(&out);
    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line\n{out}"));
    let dev = &m["net"][TAP];
    let ctx = || format!("driver {d}\ndevice {dev}\n{out}");
    assert_eq!(d["status"], "done", "{}", ctx());
    assert_eq!(
        seen.len() as u64,
        COUNT,
        "distinct frames at the host: {}",
        ctx()
    );
    assert!(
        out.stdout.contains(
            "driver-guest: msix vectors config=Some(0) rx=Some(1) tx=Some(2) ctrl=Some(33) \
             rx1=Some(3) tx1=Some(4)"
        ) && out.stdout.contains(" rx15=Some(31) tx15=Some(32)"),
        "{}",
        ctx()
    );
    let queues = d["queues"].as_array().expect("guest queues");
    let device = dev["queues"].as_array().expect("device queues");
    assert_eq!(
        (queues.len(), device.len()),
        (usize::from(PAIRS16), usize::from(PAIRS16)),
        "{}",
        ctx()
    );
    for (i, (g, p)) in queues.iter().zip(device).enumerate() {
        assert_eq!(n(g, "tx"), n(&p["tx"], "frames"), "pair {i}: {}", ctx());
        assert!(n(g, "tx") > 0, "pair {i} sent nothing: {}", ctx());
        let irqs = n(g, "irqs_tx");
        assert!(
            irqs > 0 && irqs <= n(&p["tx"], "interrupts_raised"),
            "pair {i} tx vector: {}",
            ctx()
        );
    }
    let tx_sum: u64 = per_pair(queues, "irqs_tx").iter().sum();
    assert_eq!(tx_sum, n(&d, "irqs_tx"), "{}", ctx());
    let totals: u64 = ["irqs_rx", "irqs_tx", "irqs_ctrl", "irqs_config"]
        .iter()
        .map(|k| n(&d, k))
        .sum();
    assert_eq!(totals, n(&d, "irqs_taken"), "{}", ctx());
    assert_eq!(n(&d, "irqs_config"), 0, "{}", ctx());
    eprintln!(
        "queues=16 over pci tx x{COUNT}: tx vector irqs per pair {:?}",
        per_pair(queues, "irqs_tx")
    );
}
