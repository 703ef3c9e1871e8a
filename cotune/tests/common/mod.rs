//! What cotune's integration tests share: the co-simulation rig on a socket pair, frames as
//! the peer sends them, and running the `cotune` binary.

// Each test file uses its own share of these.
#![allow(dead_code, unused_macros)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cotune::frames::test_frame;
use cotune::rig::{Rig, RigConfig};
use cotune::transport::TransportKind;
use devices::backend::{PairBackend, PairPeer};
use vnet_driver::Config;

/// The rig with the driver configured by `driver`, over `transport`, with no modelled kick or
/// interrupt cost, on one socket-pair backend per queue pair; the far ends (5-second timeouts)
/// come back beside it.
pub fn rig_with_peers(driver: Config, transport: TransportKind) -> (Rig, Vec<PairPeer>) {
    let (backends, peers): (Vec<_>, Vec<_>) = (0..driver.queue_pairs)
        .map(|_| PairBackend::new().expect("socketpair"))
        .unzip();
    for peer in &peers {
        peer.set_timeout(Duration::from_secs(5)).unwrap();
    }
    let config = RigConfig {
        driver,
        device: Default::default(),
        kick_cost_ns: 0,
        irq_cost_ns: 0,
        transport,
        // The device offers the layout the driver asks for.
        ring: cotune::sweep::RingLayout {
            packed: driver.packed,
            in_order: driver.in_order,
        },
    };
    (Rig::with_backends(backends, &config).expect("rig"), peers)
}

/// [`rig_with_peers`] with one queue pair: the rig and its peer.
pub fn rig_on(driver: Config, transport: TransportKind) -> (Rig, PairPeer) {
    let (rig, mut peers) = rig_with_peers(driver, transport);
    assert_eq!(peers.len(), 1, "one queue pair");
    (rig, peers.remove(0))
}

/// Test frame `seq` of `size` bytes behind a zeroed virtio-net header, as a peer sends it.
pub fn peer_frame(size: usize, seq: u32) -> Vec<u8> {
    let mut f = vec![0u8; vnet_driver::VNET_HDR_LEN];
    f.extend_from_slice(&test_frame(size, seq));
    f
}

/// A peer keeps up to `window` frames in flight while the driver takes them: before each
/// `step`, `send(seq)` sends the next of `total` frames while fewer than `window` are
/// outstanding; `step` services the driver and returns how many frames are done so far. Ends
/// when all `total` are; fails with `stuck(done)` after 30 seconds.
pub fn pump(
    total: u32,
    window: u32,
    mut send: impl FnMut(u32),
    mut step: impl FnMut() -> u32,
    stuck: impl Fn(u32) -> String,
) {
    let (mut sent, mut done) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while done < total {
        assert!(Instant::now() < deadline, "{}", stuck(done));
        while sent < total && sent - done < window {
            send(sent);
            sent += 1;
        }
        done = step();
    }
}

/// The `cotune` binary, to be given arguments.
pub fn cotune() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cotune"))
}

/// Runs `cmd`; asserts that it succeeded (its output in the message) and returns its stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run cotune");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A fresh directory `cotune-<tag>-<pid>` in the temporary directory.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cotune-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Two tests of the scenario `$scenario(transport)`, in a module of its name: `over_mmio`
/// (virtio-mmio) and `over_pci` (virtio-pci).
macro_rules! over_both_transports {
    ($scenario:ident) => {
        mod $scenario {
            #[test]
            fn over_mmio() {
                super::$scenario(cotune::transport::TransportKind::Mmio);
            }

            #[test]
            fn over_pci() {
                super::$scenario(cotune::transport::TransportKind::Pci);
            }
        }
    };
}
