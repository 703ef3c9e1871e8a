use super::*;
use vnet_driver::xsk::XskMode;

fn opts(quick: bool) -> Options {
    Options::for_tests(quick)
}

#[test]
fn seed_presets_run_on_their_regime_and_refuse_what_cannot_run() {
    for preset in Preset::SEEDS {
        assert!(
            preset.backend().is_some_and(BackendKind::is_measurement),
            "{preset:?}"
        );
        for quick in [true, false] {
            let pts = points(preset, &opts(quick));
            assert!(!pts.is_empty(), "{preset:?}");
            let backend = preset.backend().unwrap_or(BackendKind::Pair);
            for p in &pts {
                let w = backend.adapt(HostPath::Stack, p.workload);
                assert!(backend.refuses(HostPath::Stack, w).is_none(), "{preset:?}");
            }
        }
    }
    let full = points(Preset::SeedKickThreshold, &opts(false));
    let ns: Vec<u16> = full.iter().map(|p| p.config.kick_threshold).collect();
    assert!(
        (3..=13).all(|n| ns.contains(&n)),
        "every N of the seed's median range: {ns:?}"
    );
    // A loop (or a reflecting tap) forwards what a bounce would echo; a sink receives
    // nothing, nor does a tap whose host path drops.
    let stack = HostPath::Stack;
    assert_eq!(
        BackendKind::Loop.adapt(stack, Workload::XdpBounce),
        Workload::Fwd
    );
    let reflect = HostPath::XdpReflect;
    assert_eq!(
        BackendKind::Tap.adapt(reflect, Workload::Echo),
        Workload::Fwd
    );
    assert_eq!(
        BackendKind::Tap.adapt(stack, Workload::Echo),
        Workload::Echo
    );
    assert!(BackendKind::Sink.refuses(stack, Workload::Echo).is_some());
    assert_eq!(BackendKind::Tap.adapt(stack, Workload::Fwd), Workload::Echo);
    assert_eq!(
        BackendKind::Pair.adapt(stack, Workload::Fwd),
        Workload::Echo
    );
    assert_eq!(
        BackendKind::Tap.adapt(reflect, Workload::Fwd),
        Workload::Fwd
    );
    assert!(BackendKind::Tap.refuses(reflect, Workload::Fwd).is_none());
    assert!(BackendKind::Tap
        .refuses(HostPath::XdpDrop, Workload::Rx)
        .is_some());
    assert!(BackendKind::Pair
        .refuses(HostPath::XdpDrop, Workload::Rx)
        .is_some());
    assert!(BackendKind::Sink.refuses(reflect, Workload::Fwd).is_some());
    assert_eq!(BackendKind::Sink.baseline_backend(), BackendKind::Tap);
    assert_eq!(BackendKind::Pair.baseline_backend(), BackendKind::Pair);
    let err = run_preset(
        Preset::XdpBulk,
        &Options {
            backend: BackendKind::Sink,
            ..opts(true)
        },
        &mut |_| {},
    );
    assert!(err.is_err_and(|e| e.to_string().contains("a sink has nothing to receive")));
}

#[test]
fn measurement_backends_run_in_co_simulation() {
    // No root needed: a sink takes zero-copy transmit, a source feeds rx, a loop forwards.
    for (backend, workload) in [
        (BackendKind::Sink, Workload::XskTx(XskMode::ZeroCopy)),
        (BackendKind::Source, Workload::Rx),
        (BackendKind::Loop, Workload::Fwd),
    ] {
        let o = Options {
            backend,
            ..opts(true)
        };
        let mut p = zc_tx_point(&o, vec![], 8, DevKnobs::default(), None);
        p.workload = workload;
        let sample = sim_trial(&p, &o).expect("trial");
        assert!(sample.packets > 1000, "{backend:?}: {sample:?}");
    }
}

#[test]
fn two_dimensional_presets_cover_their_grid_and_set_the_device_knobs() {
    for preset in [
        Preset::KickBusyPoll,
        Preset::CompletionCoalesce,
        Preset::BulkCoalesce,
    ] {
        for quick in [true, false] {
            let pts = points(preset, &opts(quick));
            assert!(pts.iter().all(|p| p.axes.len() == 2), "{preset:?}");
            let xs: std::collections::BTreeSet<_> = pts.iter().map(|p| &p.axes[0].1).collect();
            let ys: std::collections::BTreeSet<_> = pts.iter().map(|p| &p.axes[1].1).collect();
            assert_eq!(pts.len(), xs.len() * ys.len(), "{preset:?} is a full grid");
            if quick {
                assert_eq!((xs.len(), ys.len()), (2, 2), "{preset:?} --quick is 2x2");
            }
            for p in &pts {
                assert!(p.dev.tuning().validate().is_ok(), "{preset:?} {p:?}");
                let y: u32 = p.axes[1].1.parse().unwrap();
                let dev_y = match p.axes[1].0 {
                    "busy_poll_us" => p.dev.busy_poll_us,
                    "coalesce_packets" => u32::from(p.dev.coalesce_packets),
                    other => panic!("unexpected axis {other}"),
                };
                assert_eq!(y, dev_y, "the second axis is the device knob");
            }
        }
    }
}

#[test]
fn kick_coalesce_option_sets_every_point_of_a_preset_that_does_not_sweep_it() {
    let k = crate::point::parse_kick_coalesce("192/50").expect("valid");
    assert_eq!((k.max_packets, k.max_usecs), (192, 50));
    for bad in [
        "192",
        "0/50",
        "192/0",
        "192/10001",
        "65536/50",
        "a/b",
        "192/50/1",
    ] {
        assert!(crate::point::parse_kick_coalesce(bad).is_err(), "{bad}");
    }
    let o = Options {
        kick_coalescing: Some(k),
        ..opts(true)
    };
    let pts = preset_points(Preset::SeedKickThreshold, &o).expect("points");
    assert!(pts.iter().all(|p| p.dev.kick_coalescing == k));
    assert!(pts.iter().all(|p| p
        .dev
        .net_spec_keys()
        .contains(",kick_coalesce_packets=192,")));
    let err = preset_points(Preset::KickCoalesce, &o).expect_err("it sweeps the knob");
    assert!(err.to_string().contains("--kick-coalesce"), "{err}");
}

#[test]
fn busy_poll_sleep_option_sets_every_point_of_a_preset_that_does_not_sweep_it() {
    let own = preset_points(Preset::BusyPoll, &opts(true)).expect("points");
    assert!(own.iter().all(|p| p.dev.busy_poll_sleep_us == 0));
    let o = Options {
        busy_poll_sleep_us: Some(20),
        ..opts(true)
    };
    let pts = preset_points(Preset::BusyPoll, &o).expect("points");
    assert_eq!(pts.len(), own.len());
    assert!(pts.iter().all(|p| p.dev.busy_poll_sleep_us == 20));
    assert!(pts.iter().all(|p| p.dev.tuning().validate().is_ok()));
    let err = preset_points(Preset::BusyPollSleep, &o).expect_err("it sweeps the sleep");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("--busy-poll-sleep-us"), "{err}");
}

#[test]
fn kick_coalesce_crosses_the_kick_threshold_with_the_device_kick_coalescing() {
    for (quick, n, k) in [(true, 2, 2), (false, 3, 3)] {
        let pts = points(Preset::KickCoalesce, &opts(quick));
        assert_eq!(pts.len(), n * k);
        for p in &pts {
            assert!(p.dev.tuning().validate().is_ok(), "{p:?}");
            assert_eq!(p.dev.busy_poll_us, 0, "kicks, not a busy-poll");
            assert!(p.pace.is_none());
            assert_eq!(p.axes[0].1, p.config.kick_threshold.to_string());
            let k = p.dev.kick_coalescing;
            assert_eq!(p.axes[1].1, k.max_packets.to_string());
            assert_eq!(k.max_usecs > 0, k.max_packets > 0);
        }
        assert!(pts.iter().any(|p| p.dev.kick_coalescing.max_packets == 0));
        assert!(pts.iter().any(|p| p.dev.kick_coalescing.max_packets == 192));
    }
}

#[test]
fn busy_poll_sleep_runs_no_poll_then_one_window_spinning_and_sleeping() {
    for (quick, sleeps) in [(true, vec![0, 20]), (false, vec![0, 10, 20, 50])] {
        let pts = points(Preset::BusyPollSleep, &opts(quick));
        let knobs: Vec<(u32, u32)> = pts
            .iter()
            .map(|p| (p.dev.busy_poll_us, p.dev.busy_poll_sleep_us))
            .collect();
        let want: Vec<(u32, u32)> = std::iter::once((0, 0))
            .chain(sleeps.into_iter().map(|s| (200, s)))
            .collect();
        assert_eq!(knobs, want);
        for p in &pts {
            assert!(p.dev.tuning().validate().is_ok(), "{p:?}");
            // The axes are the knobs, the sleep first.
            assert_eq!(p.axes[0].1, p.dev.busy_poll_sleep_us.to_string());
            assert_eq!(p.axes[1].1, p.dev.busy_poll_us.to_string());
        }
    }
}

#[test]
fn busy_poll_presets_pace_the_driver_with_pauses_shorter_than_the_longest_poll() {
    for preset in [
        Preset::BusyPoll,
        Preset::KickBusyPoll,
        Preset::BusyPollSleep,
    ] {
        let pts = points(preset, &opts(false));
        let longest = pts.iter().map(|p| p.dev.busy_poll_us).max().unwrap();
        assert!(
            pts.iter().any(|p| p.dev.busy_poll_us == 0),
            "{preset:?} has an off point"
        );
        for p in &pts {
            let pace = p.pace.expect("paced");
            assert!(pace.pause_us > 0 && pace.pause_us < longest, "{preset:?}");
        }
    }
    assert!(points(Preset::KickThreshold, &opts(false))
        .iter()
        .all(|p| p.pace.is_none()));
}

#[test]
fn net_spec_names_only_the_knobs_that_differ() {
    assert_eq!(DevKnobs::default().net_spec_keys(), "");
    let k = DevKnobs {
        coalesce_packets: 32,
        coalesce_usecs: 100,
        event_idx: false,
        tx_budget: 64,
        busy_poll_us: 50,
        busy_poll_sleep_us: 10,
        kick_coalescing: KickCoalescing {
            max_packets: 128,
            max_usecs: 50,
        },
        rx_sparse_reads: false,
        ring: RingLayout::PACKED_IN_ORDER,
        adaptive: true,
        adaptive_max_busy_poll_us: 0,
    };
    assert_eq!(
        k.net_spec_keys(),
        ",coalesce_packets=32,coalesce_usecs=100,event_idx=off,tx_budget=64,busy_poll_us=50,\
         busy_poll_sleep_us=10,kick_coalesce_packets=128,kick_coalesce_usecs=50,\
         rx_sparse_reads=off,packed=on,in_order=on,adaptive=on,adaptive_max_busy_poll_us=0"
    );
    // Every key it writes is one the device's --net parser takes, with the same meaning.
    let spec: devices::virtio::net::NetConfig = format!("tap=t0{}", k.net_spec_keys())
        .parse()
        .expect("the device parses what cotune writes");
    assert_eq!(spec.tuning, k.tuning());
    assert!(spec.packed && spec.in_order);
}

#[test]
fn ring_layout_sweeps_both_sides_and_ring_applies_to_other_presets() {
    let pts = points(Preset::RingLayout, &opts(false));
    assert_eq!(pts.len(), RING_LAYOUTS.len() * COMPLETIONS.len());
    for p in &pts {
        let ring = p.ring();
        assert_eq!(
            (p.config.packed, p.config.in_order),
            (ring.packed, ring.in_order)
        );
        assert_eq!(p.axes[0], ("ring", ring.name().to_string()));
    }
    let layouts: std::collections::HashSet<_> = pts.iter().map(|p| p.ring().name()).collect();
    assert_eq!(layouts.len(), 3, "{layouts:?}");
    assert_eq!(points(Preset::RingLayout, &opts(true)).len(), 3);
    // The workload follows the backend's regime.
    let on = |backend| {
        let o = Options {
            backend,
            ..opts(true)
        };
        points(Preset::RingLayout, &o)[0].workload
    };
    assert_eq!(on(BackendKind::Source), Workload::Rx);
    assert_eq!(on(BackendKind::Loop), Workload::Fwd);
    assert!(matches!(on(BackendKind::Sink), Workload::XskTx(_)));
    // --ring packed --in-order puts every other preset's points on that layout.
    let o = Options {
        ring: RingLayout::PACKED_IN_ORDER,
        ..opts(true)
    };
    for p in points(Preset::KickThreshold, &o) {
        assert_eq!(p.ring(), RingLayout::PACKED_IN_ORDER);
        assert!(p.config.packed && p.config.in_order);
    }
}

#[test]
fn mixed_runs_floods_and_trickles_in_co_simulation() {
    let o = Options {
        backend: BackendKind::Loop,
        duration: Duration::from_millis(300),
        ..opts(true)
    };
    let pts = points(Preset::Mixed, &o);
    assert_eq!(pts.len(), 2);
    assert_eq!(Preset::Mixed.backend(), Some(BackendKind::Loop));
    assert!(BackendKind::Sink
        .refuses(HostPath::Stack, pts[0].workload)
        .is_some());
    assert!(BackendKind::Loop
        .refuses(HostPath::Stack, pts[0].workload)
        .is_none());
    // Short phases, so that a 300 ms trial holds many of each.
    let mut p = pts[0].clone();
    p.workload = Workload::Mixed {
        window: 32,
        phase: Duration::from_millis(5),
    };
    let m = sim_trial(&p, &o).expect("trial");
    let l = m.latency.expect("trickle round trips");
    let flood = m.flood_pps.expect("a flood rate");
    // Every packet is a round trip of one phase or the other; the trickle's are timed.
    assert!(l.samples > 10 && l.samples < m.packets, "{m:?}");
    assert!(
        l.min_ns > 0 && l.p50_ns <= l.p99_ns && l.p99_ns <= l.p999_ns,
        "{l:?}"
    );
    assert_eq!((l.bad, l.lost), (0, 0));
    // The CSV's pps is the floods' rate, and 32 frames in flight beat one at a time.
    assert_eq!(m.pps(), flood);
    let trickle_pps = 1e9 / l.p50_ns as f64;
    assert!(
        flood > trickle_pps,
        "flood {flood} pps, trickle {trickle_pps}"
    );
    let row = point_row(Preset::Mixed, "sim", &p, Some(&m), f64::NAN, 0.0, &o);
    assert_eq!((row.workload.as_str(), row.pps), ("mixed", flood));
    assert_eq!(row.p50_us, l.p50_ns as f64 / 1000.0);
}

#[test]
fn tx_completion_applies_to_every_point_of_a_preset_that_does_not_sweep_it() {
    let o = Options {
        backend: BackendKind::Loop,
        tx_completion: Some(TxCompletion::CleanFromRx),
        ..opts(true)
    };
    let pts = preset_points(Preset::Adaptive, &o).expect("the adaptive preset keeps it");
    assert!(!pts.is_empty());
    assert!(pts
        .iter()
        .all(|p| p.config.tx_completion == TxCompletion::CleanFromRx));
    let own = Options {
        tx_completion: None,
        ..o.clone()
    };
    assert!(preset_points(Preset::Adaptive, &own)
        .expect("no override")
        .iter()
        .all(|p| p.config.tx_completion == TxCompletion::TxInterrupt));
    for preset in [Preset::TxCompletion, Preset::SeedTxCompletion] {
        let e = preset_points(preset, &o).expect_err("it sweeps the tx completion");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
}

/// `--workloads`: the adaptive preset runs only the workloads named, in its own order; a
/// name it does not run on the backend, or another preset, refuses the option.
#[test]
fn workloads_keeps_only_the_adaptive_presets_workloads_named() {
    let o = |names: &[&str]| Options {
        backend: BackendKind::Loop,
        workloads: names.iter().map(|s| s.to_string()).collect(),
        ..opts(true)
    };
    let all = preset_points(Preset::Adaptive, &o(&[])).expect("points");
    let names = |pts: &[Point]| -> Vec<&'static str> {
        let mut v: Vec<_> = pts.iter().map(|p| workload_name(p.workload)).collect();
        v.dedup();
        v
    };
    assert_eq!(names(&all), ["fwd", "pingpong", "mixed"]);
    let some = preset_points(Preset::Adaptive, &o(&["mixed", "fwd"])).expect("points");
    assert_eq!(names(&some), ["fwd", "mixed"]);
    let per_workload = all.len() / 3;
    assert_eq!(some.len(), 2 * per_workload);
    let err = |names: &[&str], preset| {
        preset_points(preset, &o(names))
            .expect_err("refused")
            .to_string()
    };
    let bad = err(&["xsk-tx"], Preset::Adaptive);
    assert!(
        bad.contains("runs fwd, pingpong, mixed, not \"xsk-tx\""),
        "{bad}"
    );
    let other = err(&["fwd"], Preset::Mixed);
    assert!(other.contains("applies to the adaptive preset"), "{other}");
    // On a sink the preset's one workload is zero-copy transmit.
    let sink = Options {
        backend: BackendKind::Sink,
        ..o(&["xsk-tx"])
    };
    let pts = preset_points(Preset::Adaptive, &sink).expect("points");
    assert!(!pts.is_empty() && pts.iter().all(|p| workload_name(p.workload) == "xsk-tx"));
}

/// `--no-polling`: the adaptive preset's grid has no busy-poll window and sweeps kick
/// coalescing instead, its adapting devices may not open a window (said on their `--net`),
/// `--kick-coalesce` no longer applies to it, and a preset that sets a window refuses it.
#[test]
fn no_polling_sweeps_kick_coalescing_in_place_of_the_window() {
    let o = Options {
        backend: BackendKind::Loop,
        no_polling: true,
        ..opts(true)
    };
    let pts = preset_points(Preset::Adaptive, &o).expect("points");
    assert!(pts.iter().all(|p| p.dev.busy_poll_us == 0));
    assert!(pts.iter().all(|p| p.dev.adaptive_max_busy_poll_us == 0));
    let settings = |pts: &[Point]| -> Vec<String> {
        let mixed = pts
            .iter()
            .filter(|p| matches!(p.workload, Workload::Mixed { .. }));
        mixed.map(|p| p.axes[1].1.clone()).collect()
    };
    let with = settings(&pts);
    assert_eq!(
        with,
        [
            "default",
            "bp0-kt1",
            "bp0-kt1-kc192/50",
            "bp0-kt1-kc192/20",
            "bp0-kt32",
            "bp0-kt32-kc192/50",
            "bp0-kt32-kc192/20",
            "adaptive-device",
            "adaptive-driver",
            "adaptive"
        ]
    );
    let adapting = pts
        .iter()
        .find(|p| p.dev.adaptive)
        .expect("an adapting point");
    let spec = adapting.dev.net_spec_keys();
    assert!(
        spec.ends_with(",adaptive=on,adaptive_max_busy_poll_us=0"),
        "{spec}"
    );
    assert_eq!(adapting.dev.tuning().adaptive.max_busy_poll_us, 0);
    let kc = pts
        .iter()
        .find(|p| p.dev.kick_coalescing.is_enabled())
        .expect("kc");
    assert!(kc
        .dev
        .net_spec_keys()
        .contains(",kick_coalesce_packets=192,"));
    // Without the option: the window swept, no kick coalescing, the default bound.
    let own = preset_points(
        Preset::Adaptive,
        &Options {
            no_polling: false,
            ..o.clone()
        },
    )
    .expect("points");
    assert!(own.iter().any(|p| p.dev.busy_poll_us == 64));
    assert!(own.iter().all(|p| !p.dev.kick_coalescing.is_enabled()));
    assert!(own
        .iter()
        .all(|p| !p.dev.net_spec_keys().contains("max_busy_poll")));
    let k = crate::point::parse_kick_coalesce("64/50").expect("valid");
    let both = Options {
        kick_coalescing: Some(k),
        ..o.clone()
    };
    let e = preset_points(Preset::Adaptive, &both).expect_err("it sweeps kick coalescing");
    assert!(e.to_string().contains("--kick-coalesce"), "{e}");
    let e = preset_points(Preset::BusyPoll, &o).expect_err("it sets a window");
    assert!(e.to_string().contains("--no-polling"), "{e}");
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn ring_layouts_run_in_co_simulation() {
    for backend in [BackendKind::Sink, BackendKind::Source, BackendKind::Loop] {
        let o = Options {
            backend,
            ..opts(true)
        };
        for p in points(Preset::RingLayout, &o) {
            let m = sim_trial(&p, &o).unwrap_or_else(|e| panic!("{}: {e}", p.label()));
            assert!(
                m.packets > 0,
                "{} on {}: no packets",
                p.label(),
                backend.name()
            );
        }
    }
}
