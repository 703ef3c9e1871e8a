//! VIRTIO_NET_F_DEVICE_STATS through Linux: the guest pings the host, then, with the link
//! quiet, runs `ethtool -S eth0`, for which its virtio_net driver reads the device's counters
//! with a control-queue STATS GET. Every `*_hw_*` counter ethtool shows must equal the device's
//! `GET /metrics` counter it stands for, read over the API before and after; the counters must
//! have moved; the kernel must neither fail to probe the device nor fail the GET.
//!
//! The guest boots the `ethtool` initramfs variant. The tap, its address, permanent neighbour
//! entries on both ends (so that no ARP crosses the link after the pings) and the VMM live in a
//! network namespace the test creates.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use integration_tests::api::Client;
use integration_tests::{
    artifacts, guest_lock, initrd_variant, linux_guest_command, namespace_with_tap, test_cmdline,
    RunOutput, VmmProcess,
};
use serde_json::Value;

const TAP: &str = "vmmstats0";
const HOST_IP: &str = "10.204.0.1";
const GUEST_IP: &str = "10.204.0.2";
const HOST_MAC: &str = "02:5a:00:00:00:01";
const GUEST_MAC: &str = "02:5a:00:00:00:02";
const PINGS: u64 = 5;
const BOOT_DEADLINE: Duration = Duration::from_secs(240);

/// The `ethtool -S` counters this device supports (RX_BASIC, RX_SPEED, TX_BASIC, TX_SPEED,
/// CVQ) as Linux 6.12 names them after `rx_hw_`/`rx0_hw_` or `tx_hw_`/`tx0_hw_`, each with the
/// device metric it is (`rx`/`tx` below `net.TAP` in `GET /metrics`). Linux shows the
/// RX_BASIC/TX_BASIC drop counters and RX_SPEED/TX_SPEED's `ratelimit_packets` only through
/// netlink's per-queue statistics, not through `ethtool -S`.
const RX_FIELDS: [(&str, &str); 5] = [
    ("packets", "frames"),
    ("bytes", "bytes"),
    ("notifications", "kicks"),
    ("interrupts", "interrupts_raised"),
    ("ratelimit_bytes", "rate_limiter_bandwidth_exceeded"),
];
const TX_FIELDS: [(&str, &str); 5] = RX_FIELDS;

/// Datapath metrics that must not move while the guest reads the statistics (the link is
/// quiet), beyond those ethtool shows.
const QUIET: [&str; 4] = [
    "dropped_no_buffer",
    "backend_errors",
    "malformed_chains",
    "rate_limiter_ops_exceeded",
];

/// A scratch directory for the API socket, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("vmm-device-stats-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn metrics(api: &Client) -> Value {
    let r = api
        .request("GET", "/metrics", None)
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    assert_eq!(r.status, 200, "GET /metrics: {}", r.body);
    r.json()
}

/// The device counter at `path` below `net.TAP`.
fn counter(m: &Value, path: &[&str]) -> u64 {
    let mut v = &m["net"][TAP];
    for p in path {
        v = &v[*p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("no counter {path:?} for {TAP} in {m}"))
}

/// The console lines between the line starting with `begin` and the one starting with `end`
/// (exclusive), and the end line.
fn section<'a>(console: &'a str, begin: &str, end: &str) -> Option<(Vec<&'a str>, &'a str)> {
    let mut lines = console
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .skip_while(|l| !l.starts_with(begin));
    lines.next()?;
    let mut body = Vec::new();
    for l in lines {
        if l.starts_with(end) {
            return Some((body, l));
        }
        body.push(l);
    }
    None
}

/// `ethtool -S` output (`     name: value` lines) as a map.
fn parse_ethtool(lines: &[&str]) -> HashMap<String, u64> {
    lines
        .iter()
        .filter_map(|l| l.trim().split_once(": "))
        .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
        .collect()
}

#[test]
fn ethtool_in_the_guest_shows_the_device_metrics() {
    let kernel = artifacts().get("kernel").to_owned();
    let initrd = initrd_variant("ethtool");
    let _guest = guest_lock();
    let dir = TempDir::new();
    let sock = dir.0.join("api.sock");
    let ns = namespace_with_tap("stats", TAP);
    for args in [
        &["link", "set", TAP, "address", HOST_MAC][..],
        &["addr", "add", &format!("{HOST_IP}/24"), "dev", TAP],
        &[
            "neigh",
            "replace",
            GUEST_IP,
            "lladdr",
            GUEST_MAC,
            "dev",
            TAP,
            "nud",
            "permanent",
        ],
    ] {
        ns.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    }
    let cmdline = format!(
        "{} vmm.ip={GUEST_IP}/24 vmm.peer={HOST_IP} vmm.peermac={HOST_MAC} vmm.pings={PINGS}",
        test_cmdline("device_stats")
    );
    let net = format!("tap={TAP},mac={GUEST_MAC}");
    let mut cmd = linux_guest_command(&ns, (&kernel, initrd), &cmdline, &net);
    cmd.arg("--api-sock").arg(&sock);
    let mut vmm = VmmProcess::spawn(&mut cmd);
    let api = Client::new(&sock);

    let quiet = vmm.wait_for_console_line("vmm-guest: stats: link quiet", BOOT_DEADLINE);
    let before = quiet.then(|| metrics(&api));
    let read = quiet && vmm.wait_for_console_line("vmm-guest: dmesg end", BOOT_DEADLINE);
    let after = read.then(|| metrics(&api));
    let out = vmm.finish(Duration::from_secs(60));
    let (Some(before), Some(after)) = (before, after) else {
        panic!("the guest did not get to the statistics: {out}");
    };
    assert!(out.success(), "{out}");
    check(&out, &before, &after);
}

fn check(out: &RunOutput, before: &Value, after: &Value) {
    let console = &out.stdout;
    let fail = |what: String| -> ! {
        panic!("{what}\nmetrics before ethtool: {before}\nafter: {after}\n{out}")
    };

    // The kernel side: the driver probed the device and the GET did not fail.
    let (dmesg, _) = section(console, "vmm-guest: dmesg begin", "vmm-guest: dmesg end")
        .unwrap_or_else(|| fail("no dmesg output".into()));
    for l in &dmesg {
        // Linux 6.12: "virtio_net virtio0: probe with driver virtio_net failed with error -22".
        if l.contains("Failed to get hw stats") || (l.contains("probe") && l.contains("failed")) {
            fail(format!("kernel: {l}"));
        }
    }
    if !console.contains(&format!("vmm-guest: eth0 up {GUEST_IP}/24")) {
        fail("eth0 did not come up".into());
    }
    if !console.contains(&format!(
        "{PINGS} packets transmitted, {PINGS} packets received"
    )) {
        fail("the pings did not all come back".into());
    }

    let (lines, end) = section(
        console,
        "vmm-guest: ethtool -S eth0 begin",
        "vmm-guest: ethtool -S eth0 end",
    )
    .unwrap_or_else(|| fail("no ethtool output".into()));
    if end != "vmm-guest: ethtool -S eth0 end status=0" {
        fail(format!("ethtool failed: {end}"));
    }
    let stats = parse_ethtool(&lines);
    let hw: Vec<_> = stats.keys().filter(|k| k.contains("_hw_")).collect();
    if hw.is_empty() {
        fail("ethtool -S shows no *_hw_* counters: DEVICE_STATS was not negotiated".into());
    }
    let stat = |name: &str| {
        *stats
            .get(name)
            .unwrap_or_else(|| fail(format!("ethtool -S shows no {name}")))
    };

    // The link was quiet: the datapath counters did not move while the guest read them.
    for dir in ["rx", "tx"] {
        let fields = RX_FIELDS.iter().map(|(_, m)| *m).chain(QUIET);
        for metric in fields.filter(|m| !(dir == "tx" && *m == "dropped_no_buffer")) {
            let (b, a) = (
                counter(before, &[dir, metric]),
                counter(after, &[dir, metric]),
            );
            if a != b {
                fail(format!(
                    "{dir}.{metric} moved from {b} to {a} while ethtool ran"
                ));
            }
        }
    }

    // Each hw counter is the device metric it stands for; one queue pair, so the totals
    // (rx_hw_*) and queue 0 (rx0_hw_*) are the same numbers.
    let mut compared = Vec::new();
    for (dir, fields) in [("rx", RX_FIELDS), ("tx", TX_FIELDS)] {
        for (name, metric) in fields {
            let want = counter(after, &[dir, metric]);
            for shown in [format!("{dir}_hw_{name}"), format!("{dir}0_hw_{name}")] {
                let got = stat(&shown);
                if got != want {
                    fail(format!("{shown} = {got}, but {dir}.{metric} = {want}"));
                }
                compared.push(format!("{shown}={got}"));
            }
        }
    }

    // The control queue: the GET ethtool caused is the one command between the two reads. It
    // counts in command_num (its own reply included it) but not yet in ok_num.
    let (commands, ok) = (stat("cq_hw_command_num"), stat("cq_hw_ok_num"));
    let ctrl = |m: &Value, f: &str| counter(m, &["ctrl", f]);
    if commands != ctrl(after, "commands") || ok + 1 != ctrl(after, "ok") {
        fail(format!(
            "cq_hw_command_num = {commands} and cq_hw_ok_num = {ok}, but ctrl.commands = {} and \
             ctrl.ok = {} after the GET (command_num includes the GET, ok_num does not)",
            ctrl(after, "commands"),
            ctrl(after, "ok")
        ));
    }
    if ctrl(after, "commands") != ctrl(before, "commands") + 1
        || ctrl(after, "ok") != ctrl(before, "ok") + 1
    {
        fail("ethtool -S was not exactly one control command, acked OK".into());
    }
    compared.push(format!("cq_hw_command_num={commands} cq_hw_ok_num={ok}"));

    // The counters moved: the pings went out and came back (with ARP out of the way by the
    // permanent entries, at least PINGS frames each way).
    for name in ["rx_hw_packets", "tx_hw_packets"] {
        if stat(name) < PINGS {
            fail(format!("{name} = {} after {PINGS} pings", stat(name)));
        }
    }
    for name in [
        "rx_hw_bytes",
        "tx_hw_bytes",
        "rx_hw_interrupts",
        "tx_hw_notifications",
    ] {
        if stat(name) == 0 {
            fail(format!("{name} is 0 after {PINGS} pings"));
        }
    }
    eprintln!(
        "ethtool -S agrees with GET /metrics: {}",
        compared.join(" ")
    );
}
