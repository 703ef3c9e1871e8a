//! `vhost-user-net` driven by a driver no one here wrote: DPDK's virtio PMD, through
//! `dpdk-testpmd`'s virtio-user port (Debian's `dpdk`, no hugepages). Every forwarding mode
//! runs on split and packed rings, with and without IN_ORDER (DPDK's default, so the device
//! must really complete in order), without MRG_RXBUF, and on two queue pairs with DPDK's
//! control queue; every frame is counted on both sides: testpmd's port totals against the
//! backend's metrics.

use std::time::Duration;

use integration_tests::vhost_user::{scratch_dir, Backend, PortTotals, Testpmd};
use integration_tests::{guest_lock, namespace_with_tap, tap_counter};

/// How long each run forwards.
const RUN: Duration = Duration::from_millis(1500);
const QUEUE_SIZE: u64 = 256;
/// A burst of testpmd's (`start tx_first` sends one per queue).
const BURST: u64 = 32;

const VERSION_1: u64 = 1 << 32;
const RING_PACKED: u64 = 1 << 34;
const IN_ORDER: u64 = 1 << 35;
const MRG_RXBUF: u64 = 1 << 15;
const MQ: u64 = 1 << 22;

/// A ring layout: virtio-user's devargs, the backend's `--net` keys, the features both sides
/// must have negotiated (within `mask`).
struct Layout {
    name: &'static str,
    devargs: &'static str,
    keys: &'static str,
    features: u64,
    mask: u64,
    queues: u64,
}

const MASK: u64 = RING_PACKED | IN_ORDER | MRG_RXBUF | MQ;

const LAYOUTS: [Layout; 6] = [
    Layout {
        name: "split",
        devargs: "packed_vq=0,in_order=0",
        keys: "",
        features: MRG_RXBUF,
        mask: MASK,
        queues: 1,
    },
    Layout {
        name: "split + IN_ORDER",
        devargs: "packed_vq=0,in_order=1",
        keys: ",in_order=on",
        features: MRG_RXBUF | IN_ORDER,
        mask: MASK,
        queues: 1,
    },
    Layout {
        name: "packed",
        devargs: "packed_vq=1,in_order=0",
        keys: ",packed=on",
        features: RING_PACKED | MRG_RXBUF,
        mask: MASK,
        queues: 1,
    },
    Layout {
        name: "packed + IN_ORDER",
        devargs: "packed_vq=1,in_order=1",
        keys: ",packed=on,in_order=on",
        features: RING_PACKED | IN_ORDER | MRG_RXBUF,
        mask: MASK,
        queues: 1,
    },
    Layout {
        name: "split without MRG_RXBUF",
        devargs: "packed_vq=0,mrg_rxbuf=0",
        keys: "",
        features: 0,
        mask: MASK,
        queues: 1,
    },
    Layout {
        name: "two queue pairs and DPDK's control queue (packed)",
        devargs: "packed_vq=1,queues=2,cq=1",
        keys: ",packed=on,queues=2",
        features: RING_PACKED | MRG_RXBUF | MQ,
        mask: MASK,
        queues: 2,
    },
];

/// testpmd's queue options for `layout`.
fn queue_args(layout: &Layout) -> Vec<String> {
    let q = layout.queues;
    vec![
        format!("--rxq={q}"),
        format!("--txq={q}"),
        "--nb-cores=1".into(),
    ]
}

/// Runs testpmd in `mode` against a backend of `backend` for every layout; `check` gets the
/// layout, testpmd's forwarding totals and its port's own counts (since the port started),
/// and the backend.
fn each_layout(
    backend: &str,
    mode: &str,
    start: &str,
    check: impl Fn(&Layout, PortTotals, PortTotals, &Backend),
) {
    let _lock = guest_lock();
    for layout in &LAYOUTS {
        let dir = scratch_dir(backend);
        let spec = format!("backend={backend}{}", layout.keys);
        let be = Backend::start(&dir, &spec, None);
        let mut args = vec![format!("--forward-mode={mode}")];
        args.extend(queue_args(layout));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut testpmd = Testpmd::virtio_user(&be.socket, layout.devargs, &args);
        let totals = testpmd.forward(start, RUN);
        let port = testpmd.port_stats();
        let device = be.device_metrics();
        let negotiated = device["vhost_user"]["negotiated_features"]
            .as_u64()
            .expect("negotiated features");
        assert_eq!(
            negotiated & (layout.mask | VERSION_1),
            layout.features | VERSION_1,
            "{}: negotiated {negotiated:#x}\n{}",
            layout.name,
            be.process.log()
        );
        check(layout, totals, port, &be);
        if layout.queues > 1 {
            for (pair, queue) in device["queues"]
                .as_array()
                .expect("pairs")
                .iter()
                .enumerate()
            {
                let moved = queue["tx"]["frames"].as_u64().unwrap_or(0)
                    + queue["rx"]["frames"].as_u64().unwrap_or(0);
                assert!(moved > 0, "{}: pair {pair} idle: {device}", layout.name);
            }
        }
        let output = testpmd.quit();
        let after = be.device_metrics();
        assert_eq!(
            after["vhost_user"]["disconnects"], 1,
            "{}: the backend saw testpmd go: {after}\n{output}",
            layout.name
        );
        assert_eq!(after["vhost_user"]["protocol_errors"], 0, "{}", layout.name);
        assert_eq!(after["needs_reset_events"], 0, "{}", layout.name);
        let mut process = be.process;
        assert!(
            process.is_running(),
            "{}: the backend outlives its frontend",
            layout.name
        );
        process.signal(libc::SIGTERM);
        let out = process.finish(Duration::from_secs(10));
        assert_eq!(out.status.and_then(|s| s.code()), Some(143), "{out}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn testpmd_txonly_into_a_sink_loses_no_frame() {
    each_layout("sink", "txonly", "start", |layout, totals, _, be| {
        let frames = be.settled(&["tx", "frames"]);
        assert!(totals.tx > 10_000, "{}: {totals:?}", layout.name);
        assert_eq!(
            frames, totals.tx,
            "{}: every frame testpmd sent reached the sink",
            layout.name
        );
        assert_eq!(be.device_metrics()["tx"]["malformed_chains"], 0);
    });
}

#[test]
fn testpmd_rxonly_from_a_source_gets_every_frame_the_device_delivered() {
    each_layout("source", "rxonly", "start", |layout, totals, port, be| {
        let delivered = be.settled(&["rx", "frames"]);
        assert!(totals.rx > 10_000, "{}: {totals:?}", layout.name);
        assert_eq!(
            (totals.rx_dropped, port.rx_dropped),
            (0, 0),
            "{}",
            layout.name
        );
        // The port read what the engine counted, and what `start` flushed from the queues.
        assert!(port.rx >= totals.rx, "{}: {port:?} {totals:?}", layout.name);
        // Delivered and never counted by the port: at most a ring's worth per queue that
        // the device fills after `stop`, and at most another that the PMD's port start
        // flushes uncounted ("flush the old packets": what arrived between a queue's
        // enable, by the control command for the second pair, and the port's start).
        assert!(
            port.rx <= delivered && delivered <= port.rx + 2 * QUEUE_SIZE * layout.queues,
            "{}: the port read {}, the device delivered {delivered}: {}",
            layout.name,
            port.rx,
            be.device_metrics()
        );
    });
}

#[test]
fn testpmd_macswap_through_a_loop_keeps_every_frame_circulating() {
    each_layout(
        "loop",
        "macswap",
        "start tx_first",
        |layout, totals, _, be| {
            let sent = be.settled(&["tx", "frames"]);
            let returned = be.settled(&["rx", "frames"]);
            assert!(totals.rx > 10_000, "{}: {totals:?}", layout.name);
            assert_eq!(
                (totals.rx_dropped, totals.tx_dropped),
                (0, 0),
                "{}",
                layout.name
            );
            assert_eq!(
                sent, totals.tx,
                "{}: the device took every frame",
                layout.name
            );
            assert_eq!(
                returned, sent,
                "{}: the loop returned every frame",
                layout.name
            );
            // The first bursts are still in flight: what testpmd sent and has not read yet.
            assert_eq!(
                totals.tx - totals.rx,
                BURST * layout.queues,
                "{}: {totals:?}",
                layout.name
            );
        },
    );
}

#[test]
fn testpmd_txonly_into_a_tap_reaches_the_kernel() {
    let _lock = guest_lock();
    let tap = "vutap0";
    let ns = namespace_with_tap("vu-tap", tap);
    let dir = scratch_dir("tap");
    let be = Backend::start(&dir, &format!("tap={tap}"), Some(&ns));
    let mut testpmd = Testpmd::virtio_user(
        &be.socket,
        "packed_vq=0",
        &["--forward-mode=txonly", "--nb-cores=1"],
    );
    let totals = testpmd.forward("start", RUN);
    let sent = be.settled(&["tx", "frames"]);
    assert!(totals.tx > 1000, "{totals:?}");
    assert_eq!(
        sent, totals.tx,
        "every frame testpmd sent reached the device"
    );
    // The tap's kernel side received each one (or dropped it on its backlog, counted).
    let received = tap_counter(&ns, tap, "rx_packets") + tap_counter(&ns, tap, "rx_dropped");
    assert_eq!(received, sent, "{}", be.process.log());
    assert_eq!(be.device_metrics()["tx"]["backend_errors"], 0);
    testpmd.quit();
}
