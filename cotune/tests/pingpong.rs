//! Request/response in co-simulation: the driver crate keeps W frames in flight through the
//! device model's `loop` backend, times every round trip with host `Instant`s, and checks
//! every returned frame; the driver's and the device's counters agree afterwards.

use std::time::Duration;

use cotune::rig::{Rig, RigConfig};
use cotune::transport::TransportKind;
use cotune::workloads::pingpong_rounds;
use devices::backend::LoopBackend;
use devices::virtio::net::NetTuning;
use vnet_driver::{Config, TxCompletion};

const ROUND_TRIPS: u64 = 5_000;

fn loop_rig(driver: Config) -> Rig {
    let config = RigConfig {
        driver,
        device: NetTuning::default(),
        kick_cost_ns: 0,
        irq_cost_ns: 0,
        transport: TransportKind::Mmio,
        ring: Default::default(),
    };
    Rig::new(LoopBackend::new().expect("loop backend"), &config).expect("rig")
}

#[test]
fn pingpong_through_a_loop_times_every_round_trip() {
    for (window, completion) in [
        (1, TxCompletion::TxInterrupt),
        (16, TxCompletion::Lazy),
        (16, TxCompletion::CleanFromRx),
        (16, TxCompletion::TxInterrupt),
    ] {
        let mut rig = loop_rig(Config {
            tx_completion: completion,
            ..Config::default()
        });
        let l = pingpong_rounds(&mut rig, 64, window, ROUND_TRIPS, Duration::from_secs(20))
            .expect("no frame came back");
        let ctx = format!(
            "window {window} {completion:?}: {l:?}\ndriver {:?}\ndevice tx {:?} rx {:?}",
            rig.net.counters(),
            rig.metrics.tx,
            rig.metrics.rx
        );
        assert_eq!(l.samples, ROUND_TRIPS, "{ctx}");
        assert_eq!((l.bad, l.lost), (0, 0), "{ctx}");
        assert!(l.min_ns > 0, "{ctx}");
        assert!(
            l.min_ns <= l.p50_ns
                && l.p50_ns <= l.p99_ns
                && l.p99_ns <= l.p999_ns
                && l.p999_ns <= l.max_ns,
            "{ctx}"
        );
        l.check().unwrap();
        // Each round trip is one frame each way: the window by copy, the rest by XDP_TX (a
        // frame the tx ring had no room for sent again by copy).
        let c = rig.net.counters();
        assert_eq!(
            (c.tx_frames, c.xdp_tx),
            (
                u64::from(window) + c.xdp_tx_errors,
                ROUND_TRIPS - u64::from(window) - c.xdp_tx_errors
            ),
            "{ctx}"
        );
        assert_eq!(c.rx_frames, ROUND_TRIPS, "{ctx}");
        assert_eq!(rig.metrics.tx.frames.get(), ROUND_TRIPS, "{ctx}");
        rig.quiesce();
        rig.consistency().unwrap();
        assert_eq!(rig.metrics.rx.frames.get(), ROUND_TRIPS, "{ctx}");
    }
}
