//! The result line: one JSON object on the console, `{"driver":{…}}`, with the driver's
//! counters, the interrupts the guest took and what the workload did.

use core::fmt::{self, Write};

use vnet_driver::{Config, Counters, PairCounters, TxCompletion};

use crate::cmdline::{Coalesce, Pause, Ring, TransportChoice, Wait, Workload};

/// How the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// The workload completed.
    Done,
    /// `timeout_ms` passed first.
    Timeout,
    /// Something failed before or during the workload.
    Error(&'a str),
}

/// Everything the result line reports.
#[derive(Clone, Copy, Debug)]
pub struct Report<'a> {
    /// How it ended.
    pub outcome: Outcome<'a>,
    /// Where the driver loop ran.
    pub ring: Ring,
    /// How it waited.
    pub wait: Wait,
    /// The workload asked for.
    pub workload: Workload,
    /// Frames the workload completed (sent, or echoed).
    pub done: u64,
    /// Ethernet frame length of sent frames.
    pub frame_size: usize,
    /// The driver's configuration.
    pub config: Config,
    /// Negotiated feature bits.
    pub features: u64,
    /// (rx, tx) queue sizes in use.
    pub queue_sizes: (u16, u16),
    /// The driver's counters.
    pub counters: Counters,
    /// Device interrupts taken (entries into the device's interrupt vector, or any of its
    /// MSI-X vectors).
    pub irqs_taken: u64,
    /// The transport.
    pub transport: TransportChoice,
    /// MSI-X interrupts taken per source: rx queues and tx queues (each the sum over the
    /// pairs), control queue, configuration (all 0 on virtio-mmio).
    pub msix_irqs: [u64; 4],
    /// Per queue pair, the MSI-X interrupts taken on its rx and tx queue's vectors (empty on
    /// virtio-mmio: reported as 0).
    pub queue_irqs: &'a [[u64; 2]],
    /// Timer ticks taken.
    pub ticks: u64,
    /// Times the loop waited for an interrupt.
    pub waits: u64,
    /// Received frames that were not test frames (dropped).
    pub foreign_frames: u64,
    /// Workload duration in TSC cycles.
    pub cycles: u64,
    /// TSC frequency, if known.
    pub tsc_khz: Option<u64>,
    /// `burst=`/`pause_us=` of the tx workload (reported as 0 and 0 when off).
    pub pause: Option<Pause>,
    /// Pauses the tx workload made.
    pub pauses: u64,
    /// `coalesce=` as asked (reported whether or not the device took it: see the status).
    pub coalesce: Option<Coalesce>,
    /// Each queue pair's counters (`queues=`; one entry per pair).
    pub queues: &'a [PairCounters],
    /// `reset_queue=`/`reset_every=` and the driver's reset counters (`"resets":null` when
    /// off).
    pub resets: Option<(crate::reset::ResetPlan, vnet_driver::ResetCounters)>,
    /// Frames per rx poll (`rx_budget=`; reported with `rx=` and `fwd=`).
    pub rx_budget: usize,
    /// How long a short rx poll defers re-arming the interrupts (`rx_defer_us=`; reported with
    /// `fwd=`).
    pub rx_defer_us: u32,
    /// The `rx=` workload's frame and sequence checks (reported with `rx=`, as 0s if the
    /// workload did not run).
    pub rx_check: Option<crate::frames::SeqCounts>,
    /// `pingpong=`: the round trips' checks and percentiles (reported with `pingpong=`, as 0s
    /// if the workload did not run).
    pub round_trips: Option<crate::latency::RoundTrips>,
    /// `mixed=`: what the flood phases did (reported with `mixed=`, as 0s if the workload
    /// did not run); its trickle phases' round trips are in `round_trips`.
    pub flood: Option<crate::mixed::Flood>,
    /// The device's counters read after the workload (`None`: VIRTIO_NET_F_DEVICE_STATS not
    /// negotiated; an error: why they could not be read).
    pub device_stats: Option<Result<&'a crate::devstats::DevStats, &'a str>>,
}

/// `s` as a JSON string.
struct JsonStr<'a>(&'a str);

impl fmt::Display for JsonStr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

fn completion_name(c: TxCompletion) -> &'static str {
    match c {
        TxCompletion::TxInterrupt => "tx-interrupt",
        TxCompletion::CleanFromRx => "clean-from-rx",
        TxCompletion::Lazy => "lazy",
    }
}

/// `cycles` of a TSC running at `khz` kHz (> 0), in nanoseconds.
fn cycles_to_ns(cycles: u64, khz: u64) -> u64 {
    u64::try_from(u128::from(cycles) * 1_000_000 / u128::from(khz)).unwrap_or(u64::MAX)
}

/// Writes the result line of a run that failed before it could count anything.
pub fn write_error<W: Write>(w: &mut W, error: &str) -> fmt::Result {
    write!(
        w,
        "{{\"driver\":{{\"status\":\"error\",\"error\":{}}}}}",
        JsonStr(error)
    )
}

impl Report<'_> {
    /// Nanoseconds of the workload, if the TSC frequency is known.
    pub fn elapsed_ns(&self) -> Option<u64> {
        let khz = self.tsc_khz.filter(|&k| k > 0)?;
        Some(cycles_to_ns(self.cycles, khz))
    }

    /// Workload frames per second, if the duration is known and not zero.
    pub fn pps(&self) -> Option<u64> {
        let ns = self.elapsed_ns().filter(|&ns| ns > 0)?;
        u64::try_from(u128::from(self.done) * 1_000_000_000 / u128::from(ns)).ok()
    }

    /// Writes the result line (without the newline).
    pub fn write_json<W: Write>(&self, w: &mut W) -> fmt::Result {
        self.write_run(w)?;
        self.write_config(w)?;
        self.write_counters(w)?;
        self.write_queues(w)?;
        if let Some(khz) = self.tsc_khz {
            write!(w, ",\"tsc_khz\":{khz}")?;
        }
        if let Some(ns) = self.elapsed_ns() {
            write!(w, ",\"elapsed_ns\":{ns}")?;
        }
        if let Some(pps) = self.pps() {
            write!(w, ",\"pps\":{pps}")?;
        }
        w.write_str("}}")
    }

    /// The line's start: how the run ended, where and how it ran, the workload and what it did.
    fn write_run<W: Write>(&self, w: &mut W) -> fmt::Result {
        let (status, error) = match self.outcome {
            Outcome::Done => ("done", None),
            Outcome::Timeout => ("timeout", None),
            Outcome::Error(e) => ("error", Some(e)),
        };
        let (workload, requested) = match self.workload {
            Workload::Tx(n) => ("tx", n),
            Workload::Echo(n) => ("echo", n),
            Workload::Rx(n) => ("rx", n),
            Workload::Fwd { frames, .. } => ("fwd", frames),
            Workload::PingPong { frames, .. } => ("pingpong", frames),
            Workload::Mixed { frames, .. } => ("mixed", frames),
            Workload::Idle => ("idle", 0),
            Workload::Calibrate(n) => ("calibrate", u64::from(n)),
        };
        write!(w, "{{\"driver\":{{\"status\":\"{status}\"")?;
        if let Some(e) = error {
            write!(w, ",\"error\":{}", JsonStr(e))?;
        }
        let ring = match self.ring {
            Ring::Kernel => 0,
            Ring::User => 3,
        };
        let wait = match self.wait {
            Wait::Halt => "halt",
            Wait::Poll => "poll",
        };
        let transport = match self.transport {
            TransportChoice::Mmio => "mmio",
            TransportChoice::Pci => "pci",
        };
        write!(
            w,
            ",\"ring\":{ring},\"wait\":\"{wait}\",\"transport\":\"{transport}\",\"workload\":\"{workload}\",\"requested\":{requested},\
             \"done\":{},\"size\":{}",
            self.done, self.frame_size
        )?;
        self.write_workload_fields(w)
    }

    /// The fields of `rx=`, `fwd=`, `pingpong=` and `mixed=` (the other workloads' lines
    /// have none).
    fn write_workload_fields<W: Write>(&self, w: &mut W) -> fmt::Result {
        let khz = self.tsc_khz.filter(|&k| k > 0);
        match self.workload {
            Workload::Rx(_) => {
                let k = self.rx_check.unwrap_or_default();
                write!(
                    w,
                    ",\"rx_budget\":{},\"rx_bad\":{},\"rx_lost\":{},\"rx_reordered\":{}",
                    self.rx_budget, k.bad, k.lost, k.reordered
                )
            }
            Workload::Fwd { window, .. } => {
                write!(
                    w,
                    ",\"window\":{window},\"rx_budget\":{},\"rx_defer_us\":{}",
                    self.rx_budget, self.rx_defer_us
                )
            }
            Workload::PingPong { window, .. } => {
                write!(w, ",\"window\":{window},\"rx_budget\":{}", self.rx_budget)?;
                self.write_round_trips(w, khz)
            }
            Workload::Mixed {
                window, phase_us, ..
            } => {
                let f = self.flood.unwrap_or_default();
                write!(
                    w,
                    ",\"window\":{window},\"phase_us\":{phase_us},\"rx_budget\":{},\
                     \"phases\":{},\"flood_frames\":{}",
                    self.rx_budget, f.phases, f.frames
                )?;
                if let Some(khz) = khz {
                    let ns = cycles_to_ns(f.cycles, khz);
                    write!(w, ",\"flood_ns\":{ns}")?;
                    if ns > 0 {
                        let pps = u128::from(f.frames) * 1_000_000_000 / u128::from(ns);
                        write!(w, ",\"flood_pps\":{pps}")?;
                    }
                }
                self.write_round_trips(w, khz)
            }
            _ => Ok(()),
        }
    }

    /// The round trips' checks and, with the TSC's frequency, percentiles (`pingpong=`, and
    /// the trickle phases of `mixed=`).
    fn write_round_trips<W: Write>(&self, w: &mut W, khz: Option<u64>) -> fmt::Result {
        let r = self.round_trips.unwrap_or_default();
        write!(
            w,
            ",\"rtt_samples\":{},\"rtt_bad\":{},\"rtt_lost\":{}",
            r.cycles.map_or(0, |p| p.samples),
            r.bad,
            r.lost
        )?;
        if let (Some(p), Some(khz)) = (r.cycles, khz) {
            let p = p.map(|c| cycles_to_ns(c, khz));
            write!(
                w,
                ",\"rtt_min_ns\":{},\"rtt_p50_ns\":{},\"rtt_p99_ns\":{},\
                 \"rtt_p999_ns\":{},\"rtt_max_ns\":{}",
                p.min, p.p50, p.p99, p.p999, p.max
            )?;
        }
        Ok(())
    }

    /// The driver's configuration, the features negotiated, coalescing, pacing and resets.
    fn write_config<W: Write>(&self, w: &mut W) -> fmt::Result {
        let c = &self.config;
        write!(
            w,
            ",\"kick_threshold\":{},\"tx_completion\":\"{}\",\"xdp_bulk\":{},\"event_idx\":{},\
             \"mrg_rxbuf\":{},\"ctrl_vq\":{},\"notf_coal\":{},\"device_stats\":{},\"features\":{},\
             \"rx_queue_size\":{},\"tx_queue_size\":{},\"virtqueue\":\"{}\",\"in_order\":{}",
            c.kick_threshold,
            completion_name(c.tx_completion),
            c.xdp_bulk,
            u8::from(self.features & vnet_driver::features::RING_F_EVENT_IDX != 0),
            u8::from(self.features & vnet_driver::features::NET_F_MRG_RXBUF != 0),
            u8::from(self.features & vnet_driver::features::NET_F_CTRL_VQ != 0),
            u8::from(self.features & vnet_driver::features::NET_F_NOTF_COAL != 0),
            u8::from(self.features & vnet_driver::features::NET_F_DEVICE_STATS != 0),
            self.features,
            self.queue_sizes.0,
            self.queue_sizes.1,
            if self.features & vnet_driver::features::F_RING_PACKED != 0 {
                "packed"
            } else {
                "split"
            },
            u8::from(self.features & vnet_driver::features::F_IN_ORDER != 0),
        )?;
        match self.coalesce {
            Some(c) => write!(w, ",\"coalesce\":\"{c}\"")?,
            None => w.write_str(",\"coalesce\":null")?,
        }
        let (burst, pause_us) = self.pause.map_or((0, 0), |p| (p.burst, p.pause_us));
        write!(
            w,
            ",\"burst\":{burst},\"pause_us\":{pause_us},\"pauses\":{}",
            self.pauses
        )?;
        write!(
            w,
            ",\"resets\":{}",
            crate::reset::ResetJson(self.resets.as_ref())
        )?;
        if c.adaptive {
            self.write_adaptive(w)?;
        }
        Ok(())
    }

    /// With `adaptive=1`: the knobs' final values and how often each changed.
    fn write_adaptive<W: Write>(&self, w: &mut W) -> fmt::Result {
        let k = &self.counters;
        write!(w, ",\"adaptive\":1")?;
        for (name, value) in [
            (
                "kick_threshold_max",
                u64::from(self.config.kick_threshold_max),
            ),
            ("kick_threshold_now", k.kick_threshold_now),
            ("xdp_bulk_now", k.xdp_bulk_now),
            ("rx_coal_level", k.rx_coal_level),
            ("kick_threshold_changes", k.kick_threshold_changes),
            ("xdp_bulk_changes", k.xdp_bulk_changes),
            ("rx_coal_changes", k.rx_coal_changes),
            ("rx_coal_errors", k.rx_coal_errors),
            (
                "adapt_changes",
                k.kick_threshold_changes + k.xdp_bulk_changes + k.rx_coal_changes,
            ),
        ] {
            write!(w, ",\"{name}\":{value}")?;
        }
        Ok(())
    }

    /// The driver's counters and the interrupts, ticks and waits the guest counted.
    fn write_counters<W: Write>(&self, w: &mut W) -> fmt::Result {
        let k = &self.counters;
        for (name, value) in [
            ("tx_frames", k.tx_frames),
            ("tx_bytes", k.tx_bytes),
            ("rx_frames", k.rx_frames),
            ("rx_bytes", k.rx_bytes),
            ("kicks", k.kicks),
            ("kicks_suppressed", k.kicks_suppressed),
            ("kicks_suppressed_no_notify", k.kicks_suppressed_no_notify),
            ("tx_publishes", k.tx_publishes),
            ("rx_kicks", k.rx_kicks),
            ("rx_kicks_suppressed", k.rx_kicks_suppressed),
            ("interrupts", k.interrupts),
            ("tx_reclaimed", k.tx_reclaimed),
            ("tx_reclaim_polls", k.tx_reclaim_polls),
            ("ring_full", k.ring_full),
            ("xdp_tx", k.xdp_tx),
            ("xdp_tx_errors", k.xdp_tx_errors),
            ("xdp_flushes", k.xdp_flushes),
            ("xdp_drop", k.xdp_drop),
            ("xdp_pass", k.xdp_pass),
            ("device_errors", k.device_errors),
            ("ctrl_commands", k.ctrl_commands),
            ("ctrl_failed", k.ctrl_failed),
            ("ctrl_timeouts", k.ctrl_timeouts),
            ("irqs_taken", self.irqs_taken),
            ("irqs_rx", self.msix_irqs[0]),
            ("irqs_tx", self.msix_irqs[1]),
            ("irqs_ctrl", self.msix_irqs[2]),
            ("irqs_config", self.msix_irqs[3]),
            ("ticks", self.ticks),
            ("waits", self.waits),
            ("foreign_frames", self.foreign_frames),
            ("cycles", self.cycles),
        ] {
            write!(w, ",\"{name}\":{value}")?;
        }
        Ok(())
    }

    /// The device's statistics (totals) and each queue pair's counters.
    fn write_queues<W: Write>(&self, w: &mut W) -> fmt::Result {
        match self.device_stats {
            Some(Ok(s)) => s.write_totals(w)?,
            Some(Err(e)) => write!(w, ",\"dev_stats_error\":{}", JsonStr(e))?,
            None => {}
        }
        write!(w, ",\"queue_pairs\":{},\"queues\":[", self.queues.len())?;
        for (i, q) in self.queues.iter().enumerate() {
            let msix = self.queue_irqs.get(i).copied().unwrap_or_default();
            if i > 0 {
                w.write_char(',')?;
            }
            // `tx` counts what the device's per-pair `tx.frames` counts: copy transmits and
            // XDP_TX bounces.
            write!(
                w,
                "{{\"tx\":{},\"rx\":{},\"kicks\":{},\"rx_kicks\":{},\"irqs\":{},\
                 \"tx_reclaimed\":{},\"xdp_tx\":{},\"ring_full\":{},\"kicks_suppressed\":{},\
                 \"irqs_rx\":{},\"irqs_tx\":{}",
                q.tx_frames + q.xdp_tx,
                q.rx_frames,
                q.kicks,
                q.rx_kicks,
                q.interrupts,
                q.tx_reclaimed,
                q.xdp_tx,
                q.ring_full,
                q.kicks_suppressed + q.kicks_suppressed_no_notify,
                msix[0],
                msix[1],
            )?;
            if let Some(Ok(s)) = self.device_stats {
                s.write_pair(i, w)?;
            }
            w.write_char('}')?;
        }
        w.write_char(']')?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;

    fn report() -> Report<'static> {
        Report {
            outcome: Outcome::Done,
            ring: Ring::User,
            wait: Wait::Halt,
            workload: Workload::Tx(100),
            done: 100,
            frame_size: 64,
            config: Config::default(),
            features: vnet_driver::features::RING_F_EVENT_IDX,
            queue_sizes: (256, 256),
            counters: Counters {
                tx_frames: 100,
                kicks: 13,
                interrupts: 4,
                ..Counters::default()
            },
            irqs_taken: 5,
            transport: TransportChoice::Pci,
            msix_irqs: [3, 2, 0, 0],
            queue_irqs: &[],
            ticks: 1,
            waits: 2,
            foreign_frames: 0,
            cycles: 2_000_000,
            tsc_khz: Some(1_000_000),
            pause: None,
            pauses: 0,
            coalesce: None,
            queues: &[],
            resets: None,
            rx_budget: 64,
            rx_defer_us: 0,
            rx_check: None,
            round_trips: None,
            flood: None,
            device_stats: None,
        }
    }

    /// The result line of `r`.
    fn json(r: &Report) -> String {
        let mut s = String::new();
        r.write_json(&mut s).unwrap();
        s
    }

    /// Checks that the result line of `r` holds each of `has` and none of `lacks`; returns it.
    fn check_line(r: &Report, has: &[&str], lacks: &[&str]) -> String {
        let s = json(r);
        for part in has {
            assert!(s.contains(part), "{part} missing in {s}");
        }
        for part in lacks {
            assert!(!s.contains(part), "{part} in {s}");
        }
        s
    }

    /// Gives `r` round trips timed on a 2 GHz TSC (two cycles a nanosecond): `bad`, `lost`, and
    /// `samples` of 10k, 20k, 30k, 40k and 50k cycles (min, p50, p99, p99.9, max). Checks that
    /// the line holds `before`, then their counts and times in nanoseconds.
    fn check_timed_round_trips(r: &mut Report, before: &str, [bad, lost, samples]: [u64; 3]) {
        r.round_trips = Some(crate::latency::RoundTrips {
            bad,
            lost,
            cycles: Some(crate::latency::Percentiles {
                samples,
                min: 10_000,
                p50: 20_000,
                p99: 30_000,
                p999: 40_000,
                max: 50_000,
            }),
        });
        r.tsc_khz = Some(2_000_000);
        let line = alloc::format!(
            "{before}\"rtt_samples\":{samples},\"rtt_bad\":{bad},\"rtt_lost\":{lost},\
             \"rtt_min_ns\":5000,\"rtt_p50_ns\":10000,\"rtt_p99_ns\":15000,\
             \"rtt_p999_ns\":20000,\"rtt_max_ns\":25000,\"kick_threshold\":"
        );
        check_line(r, &[&line], &[]);
    }

    #[test]
    fn result_line() {
        let s = json(&report());
        assert!(
            s.starts_with("{\"driver\":{\"status\":\"done\",\"ring\":3,"),
            "{s}"
        );
        for field in [
            "\"tx_frames\":100,",
            "\"kicks\":13,",
            "\"kicks_suppressed\":0,",
            "\"interrupts\":4,",
            "\"irqs_taken\":5,\"irqs_rx\":3,\"irqs_tx\":2,\"irqs_ctrl\":0,\"irqs_config\":0,",
            "\"wait\":\"halt\",\"transport\":\"pci\",",
            "\"rx_frames\":0,",
            "\"event_idx\":1,",
            "\"virtqueue\":\"split\",\"in_order\":0",
            "\"tx_completion\":\"tx-interrupt\"",
            "\"elapsed_ns\":2000000,",
            "\"pps\":50000}}",
            "\"burst\":0,\"pause_us\":0,\"pauses\":0,",
            "\"ctrl_vq\":0,\"notf_coal\":0,\"device_stats\":0,",
            "\"coalesce\":null,",
            "\"resets\":null,",
            "\"ctrl_commands\":0,\"ctrl_failed\":0,\"ctrl_timeouts\":0,",
        ] {
            assert!(s.contains(field), "{field} missing in {s}");
        }
    }

    #[test]
    fn per_queue_counters_are_reported() {
        let queues = [
            PairCounters {
                tx_frames: 60,
                rx_frames: 3,
                kicks: 8,
                rx_kicks: 2,
                interrupts: 5,
                tx_reclaimed: 60,
                ..PairCounters::default()
            },
            PairCounters {
                tx_frames: 40,
                xdp_tx: 2,
                kicks: 5,
                kicks_suppressed: 1,
                kicks_suppressed_no_notify: 2,
                ..PairCounters::default()
            },
        ];
        let mut r = report();
        r.queues = &queues;
        r.queue_irqs = &[[3, 2], [0, 7]];
        check_line(&r, &[",\"queue_pairs\":2,\"queues\":[{\"tx\":60,\"rx\":3,\"kicks\":8,\"rx_kicks\":2,\
                 \"irqs\":5,\"tx_reclaimed\":60,\"xdp_tx\":0,\"ring_full\":0,\"kicks_suppressed\":0,\
                 \"irqs_rx\":3,\"irqs_tx\":2},\
                 {\"tx\":42,\"rx\":0,\"kicks\":5,\"rx_kicks\":0,\"irqs\":0,\"tx_reclaimed\":0,\
                 \"xdp_tx\":2,\"ring_full\":0,\"kicks_suppressed\":3,\"irqs_rx\":0,\"irqs_tx\":7}],"], &[]);
        // Without MSI-X (virtio-mmio) the per-queue vector counts are 0.
        r.queue_irqs = &[];
        check_line(
            &r,
            &["\"kicks_suppressed\":3,\"irqs_rx\":0,\"irqs_tx\":0}],"],
            &[],
        );
        r.queues = &[];
        check_line(&r, &[",\"queue_pairs\":0,\"queues\":[],"], &[]);
    }

    #[test]
    fn device_stats_are_reported_beside_the_driver_counters() {
        use crate::devstats::{DevStats, PairStats};
        use vnet_driver::stats::{CvqStats, RxBasic, TxBasic};
        let stats = DevStats {
            pairs: alloc::vec![PairStats {
                tx: Some(TxBasic {
                    tx_packets: 100,
                    tx_notifications: 13,
                    ..TxBasic::default()
                }),
                rx: Some(RxBasic::default()),
                ..PairStats::default()
            }],
            cvq: Some(CvqStats {
                command_num: 4,
                ok_num: 3,
            }),
            reads: 2,
        };
        let queues = [PairCounters {
            tx_frames: 100,
            kicks: 13,
            ..PairCounters::default()
        }];
        let mut r = report();
        r.features |= vnet_driver::features::NET_F_DEVICE_STATS;
        r.queues = &queues;
        r.device_stats = Some(Ok(&stats));
        check_line(
            &r,
            &[
                "\"notf_coal\":0,\"device_stats\":1,",
                ",\"cycles\":2000000,\"dev_tx_packets\":100,",
                "\"dev_tx_notifications\":13,",
                "\"dev_ctrl_commands\":4,\"dev_ctrl_ok\":3,\"dev_stats_reads\":2,\"queue_pairs\":1,",
                "\"irqs_tx\":0,\"dev_tx\":100,\"dev_kicks\":13,\"dev_irqs_tx\":0,\"dev_rx\":0,\
                 \"dev_rx_kicks\":0,\"dev_irqs_rx\":0}],",
            ],
            &[],
        );
        r.device_stats = Some(Err("device_stats: GET of queue 1: refused"));
        check_line(
            &r,
            &[",\"cycles\":2000000,\"dev_stats_error\":\"device_stats: GET of queue 1: refused\",\
               \"queue_pairs\":1,"],
            &["dev_tx"],
        );
    }

    #[test]
    fn burst_and_pause_are_reported() {
        let mut r = report();
        r.pause = Some(Pause {
            burst: 8,
            pause_us: 50,
        });
        r.pauses = 12;
        check_line(&r, &[",\"burst\":8,\"pause_us\":50,\"pauses\":12,"], &[]);
    }

    #[test]
    fn adaptive_values_are_reported_only_when_on() {
        check_line(&report(), &[], &["adaptive", "_now"]);
        let mut r = report();
        r.config.adaptive = true;
        r.counters.kick_threshold_now = 32;
        r.counters.xdp_bulk_now = 4;
        r.counters.rx_coal_level = 2;
        r.counters.kick_threshold_changes = 2;
        r.counters.xdp_bulk_changes = 1;
        r.counters.rx_coal_changes = 3;
        r.counters.rx_coal_errors = 1;
        check_line(
            &r,
            &["\"resets\":null,\"adaptive\":1,\"kick_threshold_max\":64,\
               \"kick_threshold_now\":32,\"xdp_bulk_now\":4,\"rx_coal_level\":2,\
               \"kick_threshold_changes\":2,\"xdp_bulk_changes\":1,\"rx_coal_changes\":3,\
               \"rx_coal_errors\":1,\"adapt_changes\":6,\"tx_frames\":100,"],
            &[],
        );
    }

    #[test]
    fn coalesce_and_control_counters_are_reported() {
        use vnet_driver::features::{NET_F_CTRL_VQ, NET_F_NOTF_COAL};
        let mut r = report();
        r.features |= NET_F_CTRL_VQ | NET_F_NOTF_COAL;
        r.coalesce = crate::cmdline::parse_coalesce("64/500/0/0");
        r.counters.ctrl_commands = 2;
        r.counters.ctrl_failed = 1;
        r.counters.ctrl_timeouts = 1;
        r.outcome = Outcome::Error("coalesce=: the device did not answer");
        check_line(
            &r,
            &[
                "{\"driver\":{\"status\":\"error\",\"error\":\"coalesce=: the device did not answer\",",
                "\"ctrl_vq\":1,\"notf_coal\":1,",
                ",\"coalesce\":\"64/500/0/0\",",
                "\"ctrl_commands\":2,\"ctrl_failed\":1,\"ctrl_timeouts\":1,",
            ],
            &[],
        );
    }

    #[test]
    fn rx_and_fwd_fields() {
        let mut r = report();
        check_line(
            &r,
            &[],
            &["rx_budget", "rx_bad", "rx_lost", "rx_reordered", "window"],
        );
        r.workload = Workload::Rx(100);
        r.rx_check = Some(crate::frames::SeqCounts {
            bad: 1,
            lost: 2,
            reordered: 3,
        });
        check_line(
            &r,
            &[
                "\"workload\":\"rx\",\"requested\":100,\"done\":100,\"size\":64,\"rx_budget\":64,\
                 \"rx_bad\":1,\"rx_lost\":2,\"rx_reordered\":3,\"kick_threshold\":",
            ],
            &["window"],
        );
        r.workload = Workload::Fwd {
            frames: 100,
            window: 256,
        };
        r.rx_budget = 16;
        r.rx_defer_us = 20;
        check_line(
            &r,
            &[
                "\"workload\":\"fwd\",\"requested\":100,\"done\":100,\"size\":64,\"window\":256,\
                 \"rx_budget\":16,\"rx_defer_us\":20,\"kick_threshold\":",
            ],
            &["rx_bad"],
        );
    }

    #[test]
    fn pingpong_fields() {
        let mut r = Report {
            workload: Workload::PingPong {
                frames: 1000,
                window: 4,
            },
            done: 1000,
            ..report()
        };
        // Without a run: zeros, no percentiles.
        check_line(
            &r,
            &[
                "\"workload\":\"pingpong\",\"requested\":1000,\"done\":1000,\"size\":64,\
                 \"window\":4,\"rx_budget\":64,\"rtt_samples\":0,\"rtt_bad\":0,\"rtt_lost\":0,\
                 \"kick_threshold\":",
            ],
            &[],
        );
        check_timed_round_trips(&mut r, "", [1, 2, 1000]);
        // Without the TSC's frequency: no nanoseconds.
        r.tsc_khz = None;
        check_line(&r, &["\"rtt_lost\":2,\"kick_threshold\":"], &["rtt_p50_ns"]);
        // Other workloads have none of these.
        r.workload = Workload::Fwd {
            frames: 1000,
            window: 4,
        };
        check_line(&r, &[], &["rtt_"]);
    }

    #[test]
    fn mixed_fields() {
        let mut r = Report {
            workload: Workload::Mixed {
                frames: 10_000,
                window: 64,
                phase_us: 10_000,
            },
            done: 10_000,
            ..report()
        };
        // Without a run: zeros, no rates, no percentiles.
        check_line(
            &r,
            &[
                "\"workload\":\"mixed\",\"requested\":10000,\"done\":10000,\"size\":64,\
                 \"window\":64,\"phase_us\":10000,\"rx_budget\":64,\"phases\":0,\
                 \"flood_frames\":0,\"flood_ns\":0,\"rtt_samples\":0,\"rtt_bad\":0,\
                 \"rtt_lost\":0,\"kick_threshold\":",
            ],
            &["flood_pps"],
        );
        r.flood = Some(crate::mixed::Flood {
            phases: 7,
            frames: 9_000,
            cycles: 6_000_000,
        });
        // 9000 flood round trips in 3 ms.
        check_timed_round_trips(
            &mut r,
            "\"phases\":7,\"flood_frames\":9000,\"flood_ns\":3000000,\"flood_pps\":3000000,",
            [0, 1, 999],
        );
        // Without the TSC's frequency: counts only.
        r.tsc_khz = None;
        check_line(
            &r,
            &["\"flood_frames\":9000,\"rtt_samples\":999,"],
            &["flood_ns", "rtt_p50_ns"],
        );
        // pingpong= has no flood fields.
        r.workload = Workload::PingPong {
            frames: 1000,
            window: 4,
        };
        check_line(&r, &[], &["flood", "phase"]);
    }

    #[test]
    fn errors_are_escaped() {
        let mut r = report();
        r.outcome = Outcome::Error("bad \"x\"\n");
        r.tsc_khz = None;
        let s = check_line(
            &r,
            &["\"status\":\"error\",\"error\":\"bad \\\"x\\\"\\u000a\""],
            &["pps"],
        );
        assert!(s.ends_with("}}"), "{s}");
        let mut s = String::new();
        write_error(&mut s, "no \"device\"").unwrap();
        assert_eq!(
            s,
            "{\"driver\":{\"status\":\"error\",\"error\":\"no \\\"device\\\"\"}}"
        );
    }
}
