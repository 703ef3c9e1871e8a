//! The `tap-xdp` binary: what it attaches is detached when it is killed with SIGKILL (the
//! bpf link dies with its last fd), and it detaches and exits 0 on SIGINT.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cotune::xdp::{attached_program, XdpProgram};
use devices::test_utils::netns::NetNs;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: this test needs root (a network namespace, a tap, bpf)");
    }
    root
}

/// Creates persistent tap `name` in `ns` (deleted with the namespace), link up.
fn tap_in(ns: &NetNs, name: &str) {
    ns.ip(&["tuntap", "add", "dev", name, "mode", "tap"])
        .unwrap();
    ns.ip(&["link", "set", name, "up"]).unwrap();
}

/// The XDP program attached to `tap` in `ns`.
fn attached_in(ns: &NetNs, tap: &str) -> Option<u32> {
    let tap = tap.to_owned();
    ns.run(move || attached_program(&tap)).unwrap().unwrap()
}

/// Starts `tap-xdp --netns NS TAP PROGRAM` and waits for its "attached" line.
fn start(ns: &NetNs, tap: &str, program: XdpProgram) -> (Child, String) {
    let arg = match program {
        XdpProgram::Drop => "drop",
        XdpProgram::Reflect => "reflect",
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_tap-xdp"))
        .args(["--netns", ns.name(), tap, arg])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// As root: a new namespace `tag` with tap `tap` in it, and `tap-xdp` started on it with
/// `program` (the child and its "attached" line). None, the test skipped, otherwise.
fn on_a_new_tap(tag: &str, tap: &str, program: XdpProgram) -> Option<(NetNs, Child, String)> {
    if !is_root() {
        return None;
    }
    let ns = NetNs::new(tag).unwrap();
    tap_in(&ns, tap);
    let (child, line) = start(&ns, tap, program);
    Some((ns, child, line))
}

/// Waits (up to 2 s) until nothing is attached to `tap`.
fn wait_detached(ns: &NetNs, tap: &str) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let attached = attached_in(ns, tap);
        if attached.is_none() || Instant::now() > deadline {
            return attached;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sigkill_detaches() {
    let Some((ns, mut child, line)) = on_a_new_tap("xdp-kill", "xdptap2", XdpProgram::Drop) else {
        return;
    };
    assert!(
        line.starts_with("attached xdp-drop to xdptap2 (ifindex "),
        "unexpected output {line:?}"
    );
    assert!(line.trim_end().ends_with("Ctrl-C detaches"), "{line:?}");
    assert!(
        attached_in(&ns, "xdptap2").is_some(),
        "nothing attached while tap-xdp runs"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(
        wait_detached(&ns, "xdptap2"),
        None,
        "still attached after SIGKILL"
    );
}

#[test]
fn sigint_detaches_and_exits_0() {
    let Some((ns, mut child, line)) = on_a_new_tap("xdp-int", "xdptap3", XdpProgram::Reflect)
    else {
        return;
    };
    assert!(
        line.starts_with("attached xdp-reflect to xdptap3"),
        "{line:?}"
    );
    assert!(attached_in(&ns, "xdptap3").is_some());
    // SAFETY: kill only sends a signal to our own child, which has not been waited for yet
    // (so its pid is not reused).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(wait_detached(&ns, "xdptap3"), None);
}

#[test]
fn missing_tap_fails_naming_it() {
    if !is_root() {
        return;
    }
    let ns = NetNs::new("xdp-missing").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tap-xdp"))
        .args(["--netns", ns.name(), "nosuchtap8", "drop"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nosuchtap8"), "{err}");
}
