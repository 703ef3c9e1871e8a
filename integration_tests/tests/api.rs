//! The REST API on a Unix socket, the config file and the per-thread seccomp filters, through
//! the `vmm` binary:
//! - a VM configured and started through the socket reaches `/init`, pings the host and echoes
//!   UDP while interrupt coalescing and EVENT_IDX suppression are changed at run time, with the
//!   counters of `GET /metrics` (JSON and Prometheus) following; `SendCtrlAltDel` ends it;
//! - the same VM from `--config-file`;
//! - a table of malformed and invalid requests, each answered with its status and a fault
//!   message, the VMM serving on afterwards;
//! - the socket file: mode 0600, a stale one replaced, a live one refused.
//!
//! Network tests run in a namespace they create (tap, addresses and VMM inside it).

use std::net::UdpSocket;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use devices::test_utils::netns::NetNs;
use integration_tests::api::Client;
use integration_tests::udp;
use integration_tests::{
    artifacts, final_metrics, guest_lock, run_vmm, test_cmdline, vmm_binary, VmmProcess,
};
use serde_json::{json, Value};

const TAP: &str = "vmmapi0";
const HOST_IP: &str = "10.202.0.1";
const GUEST_IP: &str = "10.202.0.2";
const PORT: u16 = 7777;
const SIZES: [usize; 2] = [64, 1400];
/// Datagrams echoed in each phase of the API test: defaults, coalescing, EVENT_IDX off (longer:
/// the guest driver suppresses only a few batches per burst, and that phase needs some).
const PHASE_DATAGRAMS: [usize; 3] = [300, 300, 600];
const BURST: usize = 50;
const BOOT_DEADLINE: Duration = Duration::from_secs(180);

/// A scratch directory for sockets and files, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("vmm-api-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Echoes `count` datagrams through the guest in bursts of BURST (all echoes of a burst back
/// before the next: bursts make the device complete buffers while the guest driver is still
/// busy with earlier ones, which is when EVENT_IDX suppresses interrupts), checking each.
fn udp_echo(count: usize) -> Result<(), String> {
    let sock = UdpSocket::bind((HOST_IP, 0)).map_err(|e| format!("bind: {e}"))?;
    sock.connect((GUEST_IP, PORT))
        .map_err(|e| format!("connect: {e}"))?;
    sock.set_read_timeout(Some(Duration::from_secs(15)))
        .map_err(|e| e.to_string())?;
    let (mut next, mut received) = (0usize, 0usize);
    let mut buf = vec![0u8; 65536];
    while received < count {
        while next < count && next - received < BURST && received % BURST == 0 {
            sock.send(&udp::pattern(next as u32, SIZES[next % SIZES.len()]))
                .map_err(|e| format!("send #{next}: {e}"))?;
            next += 1;
        }
        let n = sock
            .recv(&mut buf)
            .map_err(|e| format!("no echo after {received} of {count} datagrams: {e}"))?;
        if buf[..n] != udp::pattern(received as u32, SIZES[received % SIZES.len()])[..] {
            return Err(format!("echo #{received} differs from what was sent"));
        }
        received += 1;
    }
    Ok(())
}

fn tap_in(ns: &NetNs) {
    ns.ip(&["tuntap", "add", TAP, "mode", "tap", "vnet_hdr"])
        .unwrap();
    ns.ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", TAP])
        .unwrap();
    ns.ip(&["link", "set", TAP, "up"]).unwrap();
}

fn guest_cmdline(run: &str, echo: usize) -> String {
    format!(
        "{} vmm.ip={GUEST_IP}/24 vmm.peer={HOST_IP} vmm.echo={echo} vmm.port={PORT}",
        test_cmdline(run)
    )
}

fn counter(m: &Value, path: &[&str]) -> u64 {
    let mut v = &m["net"]["eth0"];
    for p in path {
        v = &v[*p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("no counter {path:?} in {m}"))
}

fn delta(after: &Value, before: &Value, path: &[&str]) -> u64 {
    counter(after, path) - counter(before, path)
}

/// Sends `method path body` and checks the status; returns the response.
fn call(
    api: &Client,
    method: &str,
    path: &str,
    body: Option<Value>,
    status: u16,
) -> integration_tests::api::Response {
    let text = body.map(|b| b.to_string());
    let r = api
        .request(method, path, text.as_deref())
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    assert_eq!(r.status, status, "{method} {path}: {}", r.body);
    r
}

fn metrics(api: &Client) -> Value {
    call(api, "GET", "/metrics", None, 200).json()
}

#[test]
fn api_boots_a_vm_tunes_it_at_run_time_and_ctrl_alt_del_ends_it() {
    let a = artifacts();
    let (kernel, initrd) = (a.get("kernel").to_owned(), a.get("initrd").to_owned());
    let _guest = guest_lock();
    let dir = TempDir::new("boot");
    let sock = dir.path("api.sock");
    let ns = NetNs::new("api").expect("create network namespace");
    tap_in(&ns);

    let mut cmd = ns.command(&vmm_binary().to_string_lossy());
    cmd.arg("--api-sock").arg(&sock).args(["--id", "api-test"]);
    let mut vmm = VmmProcess::spawn(&mut cmd);
    let api = Client::new(&sock);
    assert!(api.wait_ready(Duration::from_secs(20)), "no API socket");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");

    let info = call(&api, "GET", "/", None, 200).json();
    assert_eq!(info["id"], "api-test");
    assert_eq!(info["state"], "Not started");

    let boot_source = json!({
        "kernel_image_path": kernel,
        "initrd_path": initrd,
        "boot_args": guest_cmdline("api", PHASE_DATAGRAMS.iter().sum()),
    });
    call(&api, "PUT", "/boot-source", Some(boot_source.clone()), 204);
    let machine = json!({"vcpu_count": 1, "mem_size_mib": 128});
    call(&api, "PUT", "/machine-config", Some(machine), 204);
    let iface = json!({"iface_id": "eth0", "host_dev_name": TAP, "guest_mac": "02:fc:00:00:00:01"});
    call(&api, "PUT", "/network-interfaces/eth0", Some(iface), 204);
    let config = call(&api, "GET", "/vm/config", None, 200).json();
    assert_eq!(config["boot-source"], boot_source);
    assert_eq!(config["machine-config"]["mem_size_mib"], 128);
    assert_eq!(config["network-interfaces"][0]["host_dev_name"], TAP);
    assert_eq!(
        config["network-interfaces"][0]["guest_mac"],
        "02:fc:00:00:00:01"
    );

    call(
        &api,
        "PUT",
        "/actions",
        Some(json!({"action_type": "InstanceStart"})),
        204,
    );
    assert_eq!(call(&api, "GET", "/", None, 200).json()["state"], "Running");
    // Pre-boot-only changes are refused now, as Firecracker does.
    let r = call(&api, "PUT", "/boot-source", Some(boot_source), 400);
    assert!(
        r.fault().unwrap().contains("not supported after starting"),
        "{}",
        r.body
    );
    let r = call(
        &api,
        "PUT",
        "/actions",
        Some(json!({"action_type": "InstanceStart"})),
        400,
    );
    assert!(r.fault().is_some());

    let ready = vmm.wait_for_console("nettest: listening", BOOT_DEADLINE);
    assert!(ready, "the guest never started its echo server");

    // Phase 1: defaults.
    let m0 = metrics(&api);
    ns.run(|| udp_echo(PHASE_DATAGRAMS[0])).unwrap().unwrap();
    let m1 = metrics(&api);
    assert_eq!(delta(&m1, &m0, &["interrupts_held"]), 0);
    assert!(delta(&m1, &m0, &["irqfd_signals"]) > 0);

    // Phase 2: interrupt coalescing, changed while the guest runs.
    let coalescing = json!({"max_packets": 16, "max_usecs": 1000});
    let patch = json!({"iface_id": "eth0", "tuning": {"interrupt_coalescing": coalescing}});
    call(&api, "PATCH", "/network-interfaces/eth0", Some(patch), 204);
    let config = call(&api, "GET", "/vm/config", None, 200).json();
    assert_eq!(
        config["network-interfaces"][0]["tuning"]["interrupt_coalescing"],
        coalescing
    );
    ns.run(|| udp_echo(PHASE_DATAGRAMS[1])).unwrap().unwrap();
    let m2 = metrics(&api);
    let held = delta(&m2, &m1, &["interrupts_held"]);
    let released = delta(&m2, &m1, &["coalesce_packet_releases"])
        + delta(&m2, &m1, &["coalesce_timer_releases"]);
    // Every batch the driver wanted an interrupt for was held, or released at once by the
    // packet bound; held interrupts went out by a bound.
    assert!(held > 0 && released > 0, "coalescing did not act: {m2}");
    let per_frame = |after: &Value, before: &Value| {
        let frames =
            delta(after, before, &["rx", "frames"]) + delta(after, before, &["tx", "frames"]);
        delta(after, before, &["irqfd_signals"]) as f64 / frames as f64
    };
    eprintln!(
        "interrupts per frame: {:.3} by default, {:.3} coalesced ({held} held, {released} released)",
        per_frame(&m1, &m0),
        per_frame(&m2, &m1)
    );

    // Phase 3: EVENT_IDX suppression off (coalescing off again).
    let patch = json!({"iface_id": "eth0", "tuning": {
        "interrupt_coalescing": {"max_packets": 0, "max_usecs": 0}, "event_idx": false}});
    call(&api, "PATCH", "/network-interfaces/eth0", Some(patch), 204);
    // The worker applies the change between two batches; a stray frame (ARP, IPv6 ND) handled
    // just before that still uses the old knobs. Start counting once the change has landed.
    std::thread::sleep(Duration::from_millis(300));
    let m2 = metrics(&api);
    ns.run(|| udp_echo(PHASE_DATAGRAMS[2])).unwrap().unwrap();
    let m3 = metrics(&api);
    // Every batch the driver's used_event suppressed interrupted anyway. (How many batches
    // the guest suppresses depends on timing, possibly none in a run: the device tests prove
    // the override itself deterministically.)
    let suppressed = delta(&m3, &m2, &["rx", "interrupts_suppressed_event_idx"])
        + delta(&m3, &m2, &["tx", "interrupts_suppressed_event_idx"]);
    let overridden = delta(&m3, &m2, &["event_idx_overrides"]);
    assert_eq!(overridden, suppressed, "{m3}");
    eprintln!("EVENT_IDX off: {overridden} suppressed batches interrupted anyway");
    assert_eq!(delta(&m3, &m2, &["interrupts_held"]), 0);
    assert_eq!(m3["vmm"]["seccomp"], true);

    // The same counters in Prometheus text.
    let r = api
        .request_with("GET", "/metrics", None, &[("Accept", "text/plain")])
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let line = format!("vmm_net_interrupts_held_total{{iface=\"eth0\",host_dev_name=\"{TAP}\"}} ");
    assert!(r.body.contains(&line), "{}", r.body);
    assert!(
        r.body.contains("# TYPE vmm_net_rx_frames_total counter"),
        "{}",
        r.body
    );

    // Ctrl+Alt+Del ends the VM (once the guest has reported its echo test and idles); the
    // VMM exits 0 and removes its socket.
    assert!(vmm.wait_for_console("vmm-guest: idle", Duration::from_secs(60)));
    call(
        &api,
        "PUT",
        "/actions",
        Some(json!({"action_type": "SendCtrlAltDel"})),
        204,
    );
    let out = vmm.finish(Duration::from_secs(30));
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("vmm-guest: init started"), "{out}");
    assert!(
        out.stdout.contains("3 packets received"),
        "ping failed: {out}"
    );
    assert!(
        out.stdout.contains(&format!(
            "nettest: echo received={} bad=0",
            PHASE_DATAGRAMS.iter().sum::<usize>()
        )),
        "{out}"
    );
    assert!(out.stderr.contains("Ctrl+Alt+Del"), "{out}");
    assert!(!sock.exists(), "the socket file is removed at exit");
    let last = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    assert!(counter(&last, &["rx", "frames"]) >= PHASE_DATAGRAMS.iter().sum::<usize>() as u64);
}

#[test]
fn the_same_vm_starts_from_a_config_file() {
    let a = artifacts();
    let (kernel, initrd) = (a.get("kernel").to_owned(), a.get("initrd").to_owned());
    let _guest = guest_lock();
    let dir = TempDir::new("file");
    let ns = NetNs::new("apifile").expect("create network namespace");
    tap_in(&ns);
    let config = json!({
        "boot-source": {
            "kernel_image_path": kernel,
            "initrd_path": initrd,
            "boot_args": guest_cmdline("net", 0),
        },
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 128},
        "network-interfaces": [{
            "iface_id": "eth0",
            "host_dev_name": TAP,
            "tuning": {"interrupt_coalescing": {"max_packets": 8, "max_usecs": 500}}
        }],
        "drives": []
    });
    let file = dir.path("vm.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let mut cmd = ns.command(&vmm_binary().to_string_lossy());
    cmd.arg("--config-file").arg(&file);
    let out = VmmProcess::spawn(&mut cmd).finish(BOOT_DEADLINE);
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("vmm-guest: init started"), "{out}");
    assert!(
        out.stdout.contains("3 packets received"),
        "ping failed: {out}"
    );
    assert!(out.stdout.contains("vmm-guest: done"), "{out}");
    let m = final_metrics(&out.stderr).unwrap_or_else(|| panic!("no metrics line: {out}"));
    assert!(counter(&m, &["rx", "frames"]) >= 3, "{m}");
    assert!(
        counter(&m, &["interrupts_held"]) > 0,
        "the file's tuning applies: {m}"
    );
    assert_eq!(m["net"]["eth0"]["host_dev_name"], TAP);

    // A file that is not a valid configuration is a clear error before anything starts.
    std::fs::write(
        &file,
        r#"{"boot-source": {"kernel_image_path": "/k"}, "bogus": 1}"#,
    )
    .unwrap();
    let out = run_vmm(
        &["--config-file", &file.to_string_lossy()],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(out.stderr.contains("unknown field `bogus`"), "{out}");
}

#[test]
fn bad_requests_get_their_status_and_a_fault_message_and_the_vmm_serves_on() {
    let dir = TempDir::new("bad");
    let sock = dir.path("api.sock");
    let mut vmm = VmmProcess::spawn(Command::new(vmm_binary()).arg("--api-sock").arg(&sock));
    let api = Client::new(&sock);
    assert!(api.wait_ready(Duration::from_secs(20)), "no API socket");
    // A valid interface first, so that PATCH has something to refuse.
    call(
        &api,
        "PUT",
        "/network-interfaces/eth0",
        Some(json!({"iface_id": "eth0", "host_dev_name": "vmmbad0"})),
        204,
    );
    let big = format!(
        r#"{{"kernel_image_path": "/k", "boot_args": "{}"}}"#,
        "x".repeat(60_000)
    );
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        ("PUT", "/boot-source", "{", 400, "deserializing"),
        ("PUT", "/boot-source", "", 400, "needs a JSON body"),
        (
            "PUT",
            "/boot-source",
            r#"{"kernel_image_path": 5}"#,
            400,
            "invalid type",
        ),
        (
            "PUT",
            "/boot-source",
            r#"{"kernel_image_path": "/k", "x": 1}"#,
            400,
            "unknown field `x`",
        ),
        (
            "PUT",
            "/boot-source",
            "{}",
            400,
            "missing field `kernel_image_path`",
        ),
        (
            "PUT",
            "/boot-source",
            r#"{"kernel_image_path": "/nonexistent/vmlinux"}"#,
            400,
            "cannot open the kernel image",
        ),
        (
            "PUT",
            "/boot-source",
            r#"{"kernel_image_path": ""}"#,
            400,
            "must not be empty",
        ),
        ("PUT", "/boot-source", "[1, 2]", 400, "invalid type"),
        ("PUT", "/boot-source", "\u{1}\u{2}", 400, "deserializing"),
        (
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 0, "mem_size_mib": 128}"#,
            400,
            "vCPU count 0 is out of range",
        ),
        (
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 8}"#,
            400,
            "memory size 8 MiB is out of range",
        ),
        (
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 300, "mem_size_mib": 128}"#,
            400,
            "invalid value",
        ),
        (
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": -1, "mem_size_mib": 128}"#,
            400,
            "invalid value",
        ),
        (
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": "2", "mem_size_mib": 128}"#,
            400,
            "invalid type",
        ),
        (
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 2, "mem_size_mib": 128, "smt": true}"#,
            400,
            "smt: true is not supported",
        ),
        ("PATCH", "/machine-config", "{}", 400, "changes nothing"),
        (
            "PUT",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth1", "host_dev_name": "t1"}"#,
            400,
            "does not match",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            r#"{"iface_id": "eth1", "host_dev_name": "bad/name"}"#,
            400,
            "invalid tap name",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            r#"{"iface_id": "eth1", "host_dev_name": "t1", "guest_mac": "01:00:00:00:00:01"}"#,
            400,
            "invalid MAC",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            r#"{"iface_id": "eth1", "host_dev_name": "t1", "queue_size": 100}"#,
            400,
            "invalid queue_size",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            r#"{"iface_id": "eth1", "host_dev_name": "t1", "rx_rate_limiter": {"ops": {"size": 10, "refill_time": 0}}}"#,
            400,
            "refill_time must be 1..=86400000 ms",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            r#"{"iface_id": "eth1", "host_dev_name": "vmmbad0"}"#,
            400,
            "used by two network interfaces",
        ),
        (
            "PUT",
            "/network-interfaces/bad%20id",
            r#"{"iface_id": "bad%20id", "host_dev_name": "t1"}"#,
            400,
            "invalid iface_id",
        ),
        (
            "PATCH",
            "/network-interfaces/eth9",
            r#"{"iface_id": "eth9", "tuning": {"event_idx": false}}"#,
            400,
            "no network interface",
        ),
        (
            "PATCH",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0"}"#,
            400,
            "changes nothing",
        ),
        (
            "PATCH",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "tuning": {"interrupt_coalescing": {"max_packets": 8, "max_usecs": 0}}}"#,
            400,
            "needs max_usecs > 0",
        ),
        (
            "PATCH",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "tuning": {"interrupt_coalescing": {"max_packets": 8, "max_usecs": 5000000}}}"#,
            400,
            "out of range",
        ),
        (
            "PATCH",
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "tuning": {"interrupt_coalescing": {"max_packets": 8}}}"#,
            400,
            "missing field `max_usecs`",
        ),
        (
            "PUT",
            "/actions",
            r#"{"action_type": "Reboot"}"#,
            400,
            "unknown variant `Reboot`",
        ),
        (
            "PUT",
            "/actions",
            r#"{"action_type": "SendCtrlAltDel"}"#,
            400,
            "not running",
        ),
        (
            "PUT",
            "/actions",
            r#"{"action_type": "InstanceStart"}"#,
            400,
            "no boot source",
        ),
        ("GET", "/nonexistent", "", 404, "no such path"),
        ("GET", "/network-interfaces/", "", 404, "no such path"),
        ("PUT", "/drives/rootfs", "{}", 404, "no such path"),
        ("DELETE", "/machine-config", "", 405, "not allowed"),
        ("POST", "/actions", "{}", 405, "not allowed"),
        ("GET", "/boot-source", "", 405, "not allowed"),
        ("PUT", "/metrics", "{}", 405, "not allowed"),
        ("PUT", "/boot-source", &big, 413, "larger than the limit"),
    ];
    assert!(cases.len() >= 20);
    for &(method, path, body, status, message) in cases {
        let r = api
            .request(method, path, Some(body))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(r.status, status, "{method} {path} {body:.80}: {}", r.body);
        let fault = r
            .fault()
            .unwrap_or_else(|| panic!("{method} {path}: no fault_message in {:?}", r.body));
        assert!(
            fault.contains(message),
            "{method} {path} {body:.80}: {fault:?} does not say {message:?}"
        );
        if status == 405 {
            assert!(
                r.header("allow").is_some(),
                "{method} {path}: no Allow header"
            );
        }
    }
    // Not even HTTP: the server answers 400 and carries on.
    let r = api.raw(b"GARBAGE\r\n\r\n").expect("an answer");
    assert_eq!(r.status, 400);

    // Still serving, and nothing changed by the refused requests.
    let info = call(&api, "GET", "/", None, 200).json();
    assert_eq!(info["state"], "Not started");
    let config = call(&api, "GET", "/vm/config", None, 200).json();
    assert!(config.get("boot-source").is_none(), "{config}");
    assert_eq!(config["machine-config"]["vcpu_count"], 1);
    assert_eq!(
        config["network-interfaces"].as_array().map(Vec::len),
        Some(1)
    );
    let m = metrics(&api);
    assert!(m["vmm"]["api"]["client_errors"].as_u64().unwrap() >= cases.len() as u64);
    call(
        &api,
        "PUT",
        "/machine-config",
        Some(json!({"vcpu_count": 2, "mem_size_mib": 64})),
        204,
    );
    call(
        &api,
        "PATCH",
        "/machine-config",
        Some(json!({"mem_size_mib": 96})),
        204,
    );
    let machine = call(&api, "GET", "/machine-config", None, 200).json();
    assert_eq!(machine["mem_size_mib"], 96);
    assert_eq!(machine["vcpu_count"], 2);
    assert!(vmm.is_running(), "the VMM survived every request");
}

/// Leaves a stale socket file at `path`: a stream socket bound there, never listening, then
/// closed. (A listener would do as well in a one-threaded process; here other tests' threads
/// start processes, and a fork between the bind and the close holds a copy of the socket until
/// its exec: a listener would accept connections meanwhile, which neither the VMM nor
/// `wait_ready` must take for a live server. A socket that never listens refuses them all.)
fn stale_socket(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain system calls on a descriptor this function owns: `addr` lives for the
    // bind, its length given; the descriptor is closed once, here.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        let bound = libc::bind(fd, (&raw const addr).cast(), len);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(bound, 0, "bind {path:?}: {err}");
    }
}

#[test]
fn the_socket_file_is_private_and_a_stale_one_is_replaced_but_a_live_one_is_not() {
    let dir = TempDir::new("sock");
    let sock = dir.path("api.sock");
    // A stale socket: its file left behind by a socket that is gone.
    stale_socket(&sock);
    assert!(sock.exists());
    let first = VmmProcess::spawn(
        Command::new(vmm_binary())
            .arg("--api-sock")
            .arg(&sock)
            .args(["--seccomp", "off"]),
    );
    let api = Client::new(&sock);
    assert!(
        api.wait_ready(Duration::from_secs(20)),
        "stale socket not replaced"
    );
    call(&api, "GET", "/", None, 200);
    assert_eq!(metrics(&api)["vmm"]["seccomp"], false, "--seccomp off");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // A live one is refused, and left alone.
    let out = run_vmm(
        &["--api-sock", &sock.to_string_lossy()],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(out.stderr.contains("in use"), "{out}");
    call(&api, "GET", "/", None, 200);
    drop(first);

    // A path that is not a socket is never replaced.
    let file = dir.path("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let out = run_vmm(
        &["--api-sock", &file.to_string_lossy()],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(out.stderr.contains("not a socket"), "{out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}
