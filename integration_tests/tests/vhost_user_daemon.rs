//! The `vhost-user-net` program itself: its API (the interface's metrics with the vhost-user
//! counters, in JSON and Prometheus text, run-time tuning, a VM's routes refused), client mode
//! reconnecting to a frontend that comes back (DPDK's virtio-user in server mode), and an
//! orderly SIGTERM.

use std::time::{Duration, Instant};

use integration_tests::api::Client;
use integration_tests::vhost_user::{scratch_dir, Backend, Testpmd};
use integration_tests::{guest_lock, vhost_user_net_binary, VmmProcess};
use serde_json::json;

#[test]
fn the_api_serves_the_interface_its_metrics_and_tuning() {
    let dir = scratch_dir("api");
    let be = Backend::start(&dir, "backend=sink,coalesce_usecs=100", None);
    let info = be.api.request("GET", "/", None).expect("GET /").json();
    assert_eq!(info["app_name"], "vhost-user-net");
    assert_eq!(info["state"], "Not started", "no frontend yet");
    let device = be.device_metrics();
    assert_eq!(device["backend"], "sink");
    assert_eq!(device["vhost_user"]["connections"], 0);
    assert!(device["vhost_user_socket"]
        .as_str()
        .is_some_and(|s| s.ends_with("vhost-user.sock")));
    let text = be
        .api
        .request_with("GET", "/metrics", None, &[("Accept", "text/plain")])
        .expect("Prometheus")
        .body;
    assert!(
        text.contains("vmm_net_vhost_user_connections_total{iface=\"sink\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains("vmm_net_tx_frames_total{iface=\"sink\"} 0\n"),
        "{text}"
    );

    // The interface given by --net, tuned at run time as in vmm.
    let iface = be
        .api
        .request("GET", "/network-interfaces/sink", None)
        .expect("GET iface");
    assert_eq!(iface.status, 200, "{}", iface.body);
    assert_eq!(
        iface.json()["tuning"]["interrupt_coalescing"]["max_usecs"],
        100,
        "the --net key is in force"
    );
    let patch = json!({"iface_id": "sink", "tuning": {"busy_poll_us": 50}}).to_string();
    let r = be
        .api
        .request("PATCH", "/network-interfaces/sink", Some(&patch))
        .expect("PATCH");
    assert_eq!(r.status, 204, "{}", r.body);
    let iface = be
        .api
        .request("GET", "/network-interfaces/sink", None)
        .expect("GET")
        .json();
    assert_eq!(iface["tuning"]["busy_poll_us"], 50);
    let bad = json!({"iface_id": "sink", "tuning": {"busy_poll_us": 100_000_000}}).to_string();
    let r = be
        .api
        .request("PATCH", "/network-interfaces/sink", Some(&bad))
        .expect("PATCH");
    assert_eq!(r.status, 400, "out of range: {}", r.body);
    let other = json!({"iface_id": "eth9", "tuning": {"busy_poll_us": 5}}).to_string();
    let r = be
        .api
        .request("PATCH", "/network-interfaces/eth9", Some(&other))
        .expect("PATCH");
    assert_eq!(r.status, 400, "no such interface: {}", r.body);
    // A VM's routes are not this program's.
    let boot = json!({"kernel_image_path": "/nonexistent"}).to_string();
    let r = be
        .api
        .request("PUT", "/boot-source", Some(&boot))
        .expect("PUT");
    assert_eq!(r.status, 400);
    assert!(
        r.fault().unwrap_or_default().contains("vhost-user-net"),
        "{}",
        r.body
    );

    // SIGTERM: exit 143, the metrics line printed, both sockets removed.
    let process = be.process;
    process.signal(libc::SIGTERM);
    let out = process.finish(Duration::from_secs(10));
    assert_eq!(out.status.and_then(|s| s.code()), Some(143), "{out}");
    assert!(
        integration_tests::final_metrics(&out.stderr).is_some(),
        "{out}"
    );
    assert!(!be.socket.exists(), "the vhost-user socket is removed");
    assert!(!dir.join("api.sock").exists(), "the API socket is removed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn client_mode_reconnects_to_a_frontend_that_comes_back() {
    let _lock = guest_lock();
    let dir = scratch_dir("client");
    let socket = dir.join("frontend.sock");
    let api_sock = dir.join("api.sock");
    // The backend starts first, retrying until the frontend's socket exists.
    let mut cmd = std::process::Command::new(vhost_user_net_binary());
    cmd.arg("--client")
        .arg("--socket")
        .arg(&socket)
        .arg("--api-sock")
        .arg(&api_sock)
        .args(["--net", "backend=sink"]);
    let process = VmmProcess::spawn(&mut cmd);
    let api = Client::new(&api_sock);
    assert!(api.wait_ready(Duration::from_secs(10)), "{}", process.log());
    let metrics = |api: &Client| {
        api.request("GET", "/metrics", None)
            .expect("metrics")
            .json()["net"]["sink"]
            .clone()
    };
    let mut sent = 0;
    for round in 1..=2u64 {
        // DPDK's virtio-user as the server end.
        let mut testpmd = Testpmd::virtio_user(
            &socket,
            "server=1",
            &["--forward-mode=txonly", "--nb-cores=1"],
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while metrics(&api)["vhost_user"]["connections"] != round && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let totals = testpmd.forward("start", Duration::from_millis(800));
        sent += totals.tx;
        assert!(totals.tx > 1000, "round {round}: {totals:?}");
        testpmd.quit();
        let deadline = Instant::now() + Duration::from_secs(10);
        while metrics(&api)["vhost_user"]["disconnects"] != round && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let m = metrics(&api);
        assert_eq!(m["vhost_user"]["disconnects"], round, "{m}");
        assert_eq!(
            m["tx"]["frames"], sent,
            "round {round}: every frame counted: {m}"
        );
    }
    process.signal(libc::SIGTERM);
    let out = process.finish(Duration::from_secs(10));
    assert_eq!(out.status.and_then(|s| s.code()), Some(143), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
