//! `vmm --net vhost-user=SOCKET`: the VMM keeps the transport and hands the datapath to a
//! backend in another process, ours (`vhost-user-net`) or DPDK's (`net_vhost`). The driver
//! guest streams through it on mmio and pci, split and packed rings, one and two queue pairs;
//! every frame is counted on both sides.

use std::path::Path;
use std::time::Duration;

use integration_tests::vhost_user::{scratch_dir, Backend, Testpmd};
use integration_tests::{
    artifacts, driver_result, guest_lock, json_u64, vmm_binary, RunOutput, VmmProcess,
};
use serde_json::Value;

/// Boots the driver guest with `--net vhost-user=SOCKET{keys}` and `cmdline`; returns its
/// result line (its workload done) and the VMM's output.
fn driver_guest(socket: &Path, keys: &str, cmdline: &str) -> (Value, RunOutput) {
    let (d, out) = driver_guest_run(socket, keys, cmdline);
    assert_eq!(d["status"], "done", "{d}\n{out}");
    (d, out)
}

/// [`driver_guest`], however the workload ended.
fn driver_guest_run(socket: &Path, keys: &str, cmdline: &str) -> (Value, RunOutput) {
    let mut cmd = std::process::Command::new(vmm_binary());
    cmd.arg("--kernel")
        .arg(artifacts().get("driver_guest"))
        .args(["--cmdline", cmdline])
        .arg("--net")
        .arg(format!("vhost-user={}{keys}", socket.display()));
    let out = VmmProcess::spawn(&mut cmd).finish(Duration::from_secs(120));
    assert!(out.success(), "{out}");
    let d = driver_result(&out);
    (d, out)
}

/// The VMM's final metrics of its vhost-user interface.
fn vmm_device(out: &RunOutput) -> Value {
    let m = integration_tests::final_metrics(&out.stderr).expect("metrics line");
    let dev = m["net"]["vu0"].clone();
    assert_eq!(dev["backend"], "vhost-user", "{m}");
    dev
}

struct Case {
    name: &'static str,
    /// The backend's extra `--net` keys.
    backend: &'static str,
    /// The VMM's extra `--net` keys.
    vmm: &'static str,
    /// The guest's extra words.
    guest: &'static str,
    pairs: u64,
}

const CASES: [Case; 4] = [
    Case {
        name: "mmio, split",
        backend: "",
        vmm: "",
        guest: "",
        pairs: 1,
    },
    Case {
        name: "pci, split",
        backend: "",
        vmm: ",transport=pci",
        guest: " transport=pci",
        pairs: 1,
    },
    Case {
        name: "pci, packed",
        backend: ",packed=on",
        vmm: ",transport=pci,packed=on",
        guest: " transport=pci packed=1",
        pairs: 1,
    },
    Case {
        name: "mmio, packed, two queue pairs",
        backend: ",packed=on,queues=2",
        vmm: ",packed=on,queues=2",
        guest: " packed=1 queues=2",
        pairs: 2,
    },
];

/// Runs `workload` against our backend `kind` for every case; `check` gets the guest's result
/// and the backend's device metrics.
fn each_case(kind: &str, workload: &str, check: impl Fn(&Case, &Value, &Value)) {
    let _lock = guest_lock();
    for case in &CASES {
        let dir = scratch_dir(kind);
        let be = Backend::start(&dir, &format!("backend={kind}{}", case.backend), None);
        let (d, out) = driver_guest(
            &be.socket,
            case.vmm,
            &format!("{workload} ring=3{}", case.guest),
        );
        let vmm = vmm_device(&out);
        assert_eq!(vmm["vhost_user"]["setup_errors"], 0, "{}: {vmm}", case.name);
        assert_eq!(vmm["vhost_user"]["disconnects"], 0, "{}: {vmm}", case.name);
        let want = if case.backend.contains("packed") {
            "packed"
        } else {
            "split"
        };
        assert_eq!(d["virtqueue"], want, "{}: {d}", case.name);
        // The control queue went to our backend: the pairs were enabled through it.
        assert_eq!(d["ctrl_vq"], 1, "{}: {d}", case.name);
        let device = be.device_metrics();
        // The VMM enables the rings once all are set up: the backend started its device once.
        assert_eq!(device["activations"], 1, "{}: {device}", case.name);
        if case.pairs > 1 {
            assert_eq!(
                device["ctrl"]["mq_pairs_sets"], 1,
                "{}: {device}",
                case.name
            );
        }
        check(case, &d, &device);
        let process = be.process;
        process.signal(libc::SIGTERM);
        process.finish(Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn the_driver_guest_transmits_into_our_backends_sink() {
    each_case("sink", "tx=100000", |case, d, device| {
        assert_eq!(json_u64(d, "done"), 100_000, "{}", case.name);
        assert_eq!(
            device["tx"]["frames"], 100_000,
            "{}: every frame reached the sink",
            case.name
        );
    });
}

#[test]
fn the_driver_guest_receives_from_our_backends_source() {
    each_case("source", "rx=100000", |case, d, device| {
        assert_eq!(json_u64(d, "done"), 100_000, "{}", case.name);
        assert_eq!(
            json_u64(d, "rx_bad") + json_u64(d, "rx_lost"),
            0,
            "{}: {d}",
            case.name
        );
        let delivered = device["rx"]["frames"].as_u64().unwrap_or(0);
        assert!(delivered >= 100_000, "{}: {device}", case.name);
    });
}

#[test]
fn the_driver_guest_forwards_through_our_backends_loop() {
    each_case("loop", "fwd=100000", |case, d, device| {
        assert_eq!(json_u64(d, "done"), 100_000, "{}", case.name);
        let (tx, rx) = (
            device["tx"]["frames"].as_u64().unwrap_or(0),
            device["rx"]["frames"].as_u64().unwrap_or(0),
        );
        assert!(tx >= 100_000 && rx >= 100_000, "{}: {device}", case.name);
    });
}

/// How the VMM and the driver guest run against DPDK's `net_vhost`.
struct DpdkLayout {
    name: &'static str,
    /// Queue pairs (testpmd's `queues=`, the VMM's and the guest's).
    pairs: u16,
    /// The VMM's extra `--net` keys.
    vmm: &'static str,
    /// The guest's extra words.
    guest: &'static str,
}

const DPDK_ONE_PAIR: DpdkLayout = DpdkLayout {
    name: "mmio, split, one pair",
    pairs: 1,
    vmm: "",
    guest: "",
};

/// DPDK's `net_vhost` as the backend: testpmd in `mode` listens, the driver guest runs
/// `workload`; returns the guest's result, testpmd's totals and the VMM's device metrics.
fn against_dpdk(
    layout: &DpdkLayout,
    mode: &str,
    workload: &str,
) -> (Value, integration_tests::vhost_user::PortTotals, Value) {
    let dir = scratch_dir("dpdk");
    let socket = dir.join("vhost.sock");
    let q = layout.pairs;
    let mut testpmd = Testpmd::vhost(
        &socket,
        &format!("queues={q}"),
        &[
            &format!("--forward-mode={mode}"),
            "--nb-cores=1",
            &format!("--rxq={q}"),
            &format!("--txq={q}"),
        ],
    );
    testpmd.command("start");
    let keys = format!(",queues={q}{}", layout.vmm);
    let cmdline = format!("{workload} ring=3 queues={q}{}", layout.guest);
    let (d, out) = driver_guest_run(&socket, &keys, &cmdline);
    let vmm = vmm_device(&out);
    assert_eq!(
        vmm["vhost_user"]["setup_errors"], 0,
        "{}: {vmm}",
        layout.name
    );
    let totals = testpmd.forward("", Duration::from_millis(200));
    testpmd.quit();
    let _ = std::fs::remove_dir_all(&dir);
    // DPDK's vhost offers CTRL_VQ but never reads the queue: the VMM serves it.
    assert_eq!(d["ctrl_vq"], 1, "{}: {d}", layout.name);
    let ctrl = &vmm["vhost_user"]["ctrl"];
    assert_eq!(ctrl["errors"], 0, "{}: {vmm}", layout.name);
    assert_eq!(ctrl["malformed_chains"], 0, "{}: {vmm}", layout.name);
    if q > 1 {
        assert_eq!(
            ctrl["mq_pairs_sets"], 1,
            "{}: the driver's VQ_PAIRS_SET became the pairs' rings enabled: {vmm}",
            layout.name
        );
    }
    (d, totals, vmm)
}

#[test]
fn the_driver_guest_streams_through_dpdks_vhost_backend() {
    let _lock = guest_lock();
    let (d, totals, _) = against_dpdk(&DPDK_ONE_PAIR, "rxonly", "tx=100000");
    assert_eq!(d["status"], "done", "{d}");
    assert_eq!(json_u64(&d, "done"), 100_000);
    assert_eq!(
        totals.rx, 100_000,
        "testpmd received every frame: {totals:?}"
    );
    let (d, totals, _) = against_dpdk(&DPDK_ONE_PAIR, "macswap", "fwd=100000");
    assert_eq!(d["status"], "done", "{d}");
    assert_eq!(json_u64(&d, "done"), 100_000, "{d}");
    assert!(totals.rx >= 100_000 && totals.tx >= 100_000, "{totals:?}");
    // testpmd's frames are UDP, not the guest's test frames: it receives and drops them
    // (`foreign_frames`) until its time is up.
    let (d, totals, _) = against_dpdk(&DPDK_ONE_PAIR, "txonly", "rx=10000 timeout_ms=2000");
    let received = json_u64(&d, "rx_frames");
    assert!(received >= 10_000, "{d}");
    assert_eq!(json_u64(&d, "foreign_frames"), received, "{d}");
    assert!(totals.tx >= received, "{totals:?}");
}

#[test]
fn the_driver_guest_uses_two_pairs_of_dpdks_vhost_through_the_vmms_control_queue() {
    let _lock = guest_lock();
    for layout in [
        DpdkLayout {
            name: "pci, split, two pairs",
            pairs: 2,
            vmm: ",transport=pci",
            guest: " transport=pci",
        },
        DpdkLayout {
            name: "mmio, packed, two pairs",
            pairs: 2,
            vmm: ",packed=on",
            guest: " packed=1",
        },
    ] {
        let (d, totals, _) = against_dpdk(&layout, "rxonly", "tx=100000");
        assert_eq!(d["status"], "done", "{}: {d}", layout.name);
        assert_eq!(json_u64(&d, "done"), 100_000, "{}: {d}", layout.name);
        assert_eq!(totals.rx, 100_000, "{}: {totals:?}", layout.name);
        // Both pairs carried frames: pair 1's rings were enabled on the backend.
        let pairs = d["queues"].as_array().expect("queues");
        assert_eq!(pairs.len(), 2, "{}: {d}", layout.name);
        for (i, pair) in pairs.iter().enumerate() {
            assert!(
                json_u64(pair, "tx") > 0,
                "{}: pair {i} idle: {d}",
                layout.name
            );
        }
        let (d, totals, _) = against_dpdk(&layout, "macswap", "fwd=100000");
        assert_eq!(json_u64(&d, "done"), 100_000, "{}: {d}", layout.name);
        assert!(totals.rx >= 100_000, "{}: {totals:?}", layout.name);
    }
}

/// Starts the driver guest against `socket` (in the background) with `cmdline`.
fn spawn_guest(socket: &Path, cmdline: &str, api: &Path) -> VmmProcess {
    let mut cmd = std::process::Command::new(vmm_binary());
    cmd.arg("--kernel")
        .arg(artifacts().get("driver_guest"))
        .args(["--cmdline", cmdline])
        .arg("--api-sock")
        .arg(api)
        .arg("--net")
        .arg(format!("vhost-user={}", socket.display()));
    VmmProcess::spawn(&mut cmd)
}

#[test]
fn the_vm_survives_its_backend_killed_and_resumes_when_it_is_back() {
    let _lock = guest_lock();
    let dir = scratch_dir("kill");
    let spec = "backend=loop";
    let be = Backend::start(&dir, spec, None);
    let api_sock = dir.join("vmm.sock");
    let mut vmm = spawn_guest(&be.socket, "fwd=3000000 ring=3 timeout_ms=60000", &api_sock);
    assert!(
        vmm.wait_for_console_line("driver-guest: ready", Duration::from_secs(30)),
        "the guest came up"
    );
    std::thread::sleep(Duration::from_millis(300));
    // SIGKILL: no goodbye on the socket.
    let backend = be.process;
    backend.signal(libc::SIGKILL);
    backend.finish(Duration::from_secs(5));
    let vmm_api = integration_tests::api::Client::new(&api_sock);
    let metrics = |api: &integration_tests::api::Client| {
        api.request("GET", "/metrics", None)
            .expect("the VMM's API answers")
            .json()["net"]["vu0"]
            .clone()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metrics(&vmm_api)["vhost_user"]["disconnects"] != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the VMM noticed the backend's death"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(vmm.is_running(), "the VM outlives its backend");
    // The backend comes back on the same socket; the VMM reconnects and traffic resumes.
    let back = std::time::Instant::now();
    let be = Backend::start(&dir, spec, None);
    while metrics(&vmm_api)["vhost_user"]["reconnects"] != 1 {
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "the VMM reconnected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = vmm.finish(Duration::from_secs(90));
    assert!(out.success(), "{out}");
    let d = driver_result(&out);
    assert_eq!(
        d["status"], "done",
        "traffic resumed and the workload ended: {d}\n{out}"
    );
    assert!(
        be.device_metrics()["tx"]["frames"].as_u64().unwrap_or(0) > 0,
        "the new backend carried frames"
    );
    let vmm_metrics = vmm_device(&out);
    assert_eq!(vmm_metrics["vhost_user"]["reconnects"], 1, "{vmm_metrics}");
    let process = be.process;
    process.signal(libc::SIGTERM);
    process.finish(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_backend_survives_its_vmm_killed_and_serves_the_next() {
    let _lock = guest_lock();
    let dir = scratch_dir("vmmkill");
    let be = Backend::start(&dir, "backend=sink", None);
    let api_sock = dir.join("vmm.sock");
    let mut vmm = spawn_guest(&be.socket, "tx=50000000 ring=3", &api_sock);
    assert!(vmm.wait_for_console_line("driver-guest: ready", Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(300));
    vmm.signal(libc::SIGKILL);
    vmm.finish(Duration::from_secs(5));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = be.device_metrics();
        if m["vhost_user"]["disconnects"] == 1 {
            assert_eq!(
                m["vhost_user"]["memory_regions"], 0,
                "the VM's memory unmapped: {m}"
            );
            assert_eq!(m["vhost_user"]["connected"], 0);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the backend noticed: {m}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (d, _) = driver_guest(&be.socket, "", "tx=10000 ring=3");
    assert_eq!(json_u64(&d, "done"), 10_000, "the next VM is served");
    let process = be.process;
    process.signal(libc::SIGTERM);
    process.finish(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Boots the project's Linux guest through `vmm --net vhost-user=` on our backend's tap in a
/// network namespace; the guest pings the host and runs TCP both ways.
fn linux_through_our_backend(tag: &str, backend_keys: &str, vmm_keys: &str) {
    const HOST_IP: &str = "10.200.0.1";
    const GUEST_IP: &str = "10.200.0.2";
    const BYTES: usize = 128 * 1024;
    let _lock = guest_lock();
    let tap = format!("vuf{tag}");
    let ns = if backend_keys.contains("queues=") {
        integration_tests::namespace_with_multi_queue_tap(&format!("vu-linux-{tag}"), &tap)
    } else {
        integration_tests::namespace_with_tap(&format!("vu-linux-{tag}"), &tap)
    };
    ns.ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", &tap])
        .expect("host address");
    let dir = scratch_dir("linux");
    let be = Backend::start(&dir, &format!("tap={tap}{backend_keys}"), Some(&ns));
    let a = artifacts();
    let cmdline = format!(
        "console=ttyS0 reboot=k panic=-1 quiet vmm.run=net vmm.ip={GUEST_IP}/24 \
         vmm.peer={HOST_IP} vmm.port=7777 vmm.tcp={BYTES}"
    );
    let mut cmd = std::process::Command::new(vmm_binary());
    cmd.arg("--kernel")
        .arg(a.get("kernel"))
        .arg("--initrd")
        .arg(a.get("initrd"))
        .args(["--cmdline", &cmdline])
        .arg("--net")
        .arg(format!("vhost-user={}{vmm_keys}", be.socket.display()));
    let vmm = VmmProcess::spawn(&mut cmd);
    let (out, _) = integration_tests::tcp_through_guest(&ns, vmm, (GUEST_IP, 7777), BYTES);
    assert!(
        out.stdout
            .contains("3 packets transmitted, 3 packets received"),
        "the guest pinged the host through the backend: {out}"
    );
    let device = be.device_metrics();
    assert!(
        device["tx"]["bytes"].as_u64().unwrap_or(0) >= BYTES as u64,
        "{device}"
    );
    assert!(
        device["rx"]["bytes"].as_u64().unwrap_or(0) >= BYTES as u64,
        "{device}"
    );
    let process = be.process;
    process.signal(libc::SIGTERM);
    process.finish(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn linux_boots_and_talks_through_our_backend_on_mmio() {
    linux_through_our_backend("m", "", "");
}

#[test]
fn linux_boots_and_talks_through_our_backend_on_pci_packed_two_pairs() {
    linux_through_our_backend(
        "p",
        ",packed=on,queues=2",
        ",transport=pci,packed=on,queues=2",
    );
}

/// Boots the project's Linux guest through DPDK's `net_vhost` with testpmd answering ARP and
/// ICMP echo (`icmpecho`): the guest pings through it, on `vmm_keys` (`queues=` pairs).
fn linux_pings_through_dpdk(pairs: u16, vmm_keys: &str) {
    let _lock = guest_lock();
    let dir = scratch_dir("dpdk-linux");
    let socket = dir.join("vhost.sock");
    let mut testpmd = Testpmd::vhost(
        &socket,
        &format!("queues={pairs}"),
        &[
            "--forward-mode=icmpecho",
            "--nb-cores=1",
            &format!("--rxq={pairs}"),
            &format!("--txq={pairs}"),
        ],
    );
    testpmd.command("start");
    let a = artifacts();
    let mut cmd = std::process::Command::new(vmm_binary());
    cmd.arg("--kernel")
        .arg(a.get("kernel"))
        .arg("--initrd")
        .arg(a.get("initrd"))
        .args([
            "--cmdline",
            "console=ttyS0 reboot=k panic=-1 quiet vmm.run=net vmm.ip=10.201.0.2/24 \
             vmm.peer=10.201.0.1",
        ])
        .arg("--net")
        .arg(format!(
            "vhost-user={},queues={pairs}{vmm_keys}",
            socket.display()
        ));
    let out = VmmProcess::spawn(&mut cmd).finish(Duration::from_secs(180));
    let totals = testpmd.forward("", Duration::from_millis(200));
    testpmd.quit();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.stdout
            .contains("3 packets transmitted, 3 packets received"),
        "the guest pinged through DPDK's vhost: {out}"
    );
    let vmm = vmm_device(&out);
    let ctrl = &vmm["vhost_user"]["ctrl"];
    assert_eq!(ctrl["errors"], 0, "{vmm}");
    assert!(
        json_u64(ctrl, "ok") >= 1,
        "Linux's commands were acked: {vmm}"
    );
    if pairs > 1 {
        assert_eq!(ctrl["mq_pairs_sets"], 1, "{vmm}");
    }
    assert!(totals.rx >= 3 && totals.tx >= 3, "{totals:?}");
}

#[test]
fn linux_pings_through_dpdks_vhost_backend_on_mmio() {
    linux_pings_through_dpdk(1, "");
}

#[test]
fn linux_pings_through_dpdks_vhost_backend_on_pci_two_pairs() {
    linux_pings_through_dpdk(2, ",transport=pci");
}

/// Per-queue reset (VIRTIO_F_RING_RESET) through `vmm --net vhost-user=`: the driver guest
/// resets one queue every 250 of 3000 frames sent into our backend's sink; the VMM stops the
/// ring on the backend (GET_VRING_BASE) and hands it back from its start. Every frame reaches
/// the sink once.
#[test]
fn queues_reset_one_at_a_time_through_our_backend_lose_no_frame() {
    let _lock = guest_lock();
    for (transport, queue) in [("pci", "rx"), ("pci", "tx"), ("mmio", "tx")] {
        let name = format!("{transport} {queue}");
        let dir = scratch_dir("reset");
        let be = Backend::start(&dir, "backend=sink", None);
        let (d, out) = driver_guest(
            &be.socket,
            &format!(",transport={transport}"),
            &format!(
                "tx=3000 ring=3 transport={transport} tx_completion=tx-interrupt \
                 reset_queue={queue} reset_every=250"
            ),
        );
        let r = &d["resets"];
        let (rx, tx) = if queue == "rx" { (11, 0) } else { (0, 11) };
        assert_eq!(
            (json_u64(r, "rx"), json_u64(r, "tx"), json_u64(r, "failed")),
            (rx, tx, 0),
            "{name}: {d}"
        );
        assert_eq!(json_u64(r, "tx_not_sent"), 0, "{name}: {d}");
        let vmm = vmm_device(&out);
        assert_eq!(vmm["vhost_user"]["queue_resets"], 11, "{name}: {vmm}");
        assert_eq!(vmm["vhost_user"]["queue_reenables"], 11, "{name}: {vmm}");
        assert_eq!(vmm["vhost_user"]["setup_errors"], 0, "{name}: {vmm}");
        assert_eq!(
            be.settled(&["tx", "frames"]),
            3000,
            "{name}: every frame reached the sink once"
        );
        let process = be.process;
        process.signal(libc::SIGTERM);
        process.finish(Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
