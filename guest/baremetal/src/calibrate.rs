//! The `calibrate=N` workload's arithmetic and its result line: percentiles of TSC samples,
//! cycles to nanoseconds, and the `{"calibrate":{…}}` JSON line. The measuring itself runs in
//! the guest (`src/probe.rs`); what it measures is described there and in `docs/driver-guest.md`.
//!
//! The line starts with the fields a consumer reads, in this order:
//! `{"calibrate":{"ring":3,"tsc_khz":…,"samples":…,"kick_ns":…,"exit_ns":…,"irq_ns":…,
//! "irq_latency_ns":…` (integers, medians), then the 10th and 90th percentiles of each
//! (`kick_ns_p10`, `kick_ns_p90`, …) and the extra measurements (`isr_ns`, `cpuid_ns`,
//! `loop_ns`, the sample counts that survived the filters, `irq_early`).

use core::fmt::{self, Write};

use crate::cmdline::Ring;

/// The 10th, 50th and 90th percentiles of a set of samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    /// 10th percentile.
    pub p10: u64,
    /// Median.
    pub median: u64,
    /// 90th percentile.
    pub p90: u64,
}

impl Percentiles {
    /// Sorts `samples` and takes the nearest-rank percentiles (the median of an even count is
    /// the lower middle sample); `None` for no samples.
    pub fn of(samples: &mut [u64]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let at = |p: usize| samples[(samples.len() - 1) * p / 100];
        Some(Percentiles {
            p10: at(10),
            median: at(50),
            p90: at(90),
        })
    }

    /// The same percentiles converted from TSC cycles to nanoseconds at `tsc_khz`.
    pub fn to_ns(self, tsc_khz: u64) -> Percentiles {
        Percentiles {
            p10: cycles_to_ns(self.p10, tsc_khz),
            median: cycles_to_ns(self.median, tsc_khz),
            p90: cycles_to_ns(self.p90, tsc_khz),
        }
    }
}

/// `cycles` of a TSC running at `tsc_khz` in nanoseconds (rounded to nearest; saturating; 0 for
/// a zero frequency).
pub fn cycles_to_ns(cycles: u64, tsc_khz: u64) -> u64 {
    if tsc_khz == 0 {
        return 0;
    }
    let khz = u128::from(tsc_khz);
    let ns = (u128::from(cycles) * 1_000_000 + khz / 2) / khz;
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// `ns` nanoseconds in cycles of a TSC running at `tsc_khz` (saturating).
pub fn ns_to_cycles(ns: u64, tsc_khz: u64) -> u64 {
    u64::try_from(u128::from(ns) * u128::from(tsc_khz) / 1_000_000).unwrap_or(u64::MAX)
}

/// Which interrupts `irq` measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrqSource {
    /// The device's (a tx completion through the irqfd).
    Device,
    /// The local APIC timer's, because fewer than 10 % of the device's interrupts arrived in
    /// the timing loop (the device worker ran on the vCPU's host core).
    ApicTimer,
}

/// What `calibrate=N` measured, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Calibration {
    /// Where the measuring loops ran.
    pub ring: Ring,
    /// The TSC frequency used for the conversion.
    pub tsc_khz: u64,
    /// Samples asked for (`calibrate=N`) per measurement.
    pub samples: u32,
    /// One QueueNotify write of the tx queue (the driver's kick).
    pub kick: Percentiles,
    /// One no-op exit handled by KVM (a read of the local APIC's ID register).
    pub exit: Percentiles,
    /// The time one device interrupt (or APIC timer interrupt, see `irq_source`) took from
    /// the interrupted loop.
    pub irq: Percentiles,
    /// From just before the kick to the interrupt's arrival in the interrupted loop.
    pub irq_latency: Percentiles,
    /// The driver's interrupt service routine after each interrupt (InterruptStatus read and
    /// InterruptACK write, both handled by the VMM in userspace).
    pub isr: Percentiles,
    /// One `cpuid` (leaf 0), for comparison with `exit`.
    pub cpuid: Percentiles,
    /// The median iteration of the undisturbed timing loop, subtracted from each interrupt gap.
    pub loop_ns: u64,
    /// Device interrupt samples kept (a sample is dropped when the timer ticked during it, or
    /// when the interrupt arrived before the timing loop started: see `irq_early`). With
    /// [`IrqSource::ApicTimer`], `irq` holds timer samples instead and this says how few
    /// device samples there were.
    pub irq_samples: u32,
    /// Which interrupts `irq` measured.
    pub irq_source: IrqSource,
    /// Latency samples kept: kicked frames during which the timer did not tick (the driver's
    /// kick decision may suppress a kick).
    pub latency_samples: u32,
    /// Interrupts that arrived while the kick was still in progress (the device worker ran
    /// on the vCPU's host core during the kick's exit): their cost is inside that kick, so
    /// they give no `irq` sample, and their `irq_latency` sample is the kick's duration (an
    /// upper bound).
    pub irq_early: u32,
    /// Frames the interrupt measurement sent (one per sample, plus one per dropped sample
    /// retried).
    pub irq_attempts: u32,
}

impl Calibration {
    /// Writes the `{"calibrate":{…}}` line (without the newline).
    pub fn write_json<W: Write>(&self, w: &mut W) -> fmt::Result {
        let ring = match self.ring {
            Ring::Kernel => 0,
            Ring::User => 3,
        };
        write!(
            w,
            "{{\"calibrate\":{{\"ring\":{ring},\"tsc_khz\":{},\"samples\":{},\"kick_ns\":{},\
             \"exit_ns\":{},\"irq_ns\":{},\"irq_latency_ns\":{}",
            self.tsc_khz,
            self.samples,
            self.kick.median,
            self.exit.median,
            self.irq.median,
            self.irq_latency.median,
        )?;
        for (name, p) in [
            ("kick_ns", self.kick),
            ("exit_ns", self.exit),
            ("irq_ns", self.irq),
            ("irq_latency_ns", self.irq_latency),
        ] {
            write!(w, ",\"{name}_p10\":{},\"{name}_p90\":{}", p.p10, p.p90)?;
        }
        write!(
            w,
            ",\"isr_ns\":{},\"cpuid_ns\":{},\"loop_ns\":{},\"irq_samples\":{},\
             \"latency_samples\":{},\"irq_early\":{},\"irq_attempts\":{},\"irq_source\":\"{}\"}}}}",
            self.isr.median,
            self.cpuid.median,
            self.loop_ns,
            self.irq_samples,
            self.latency_samples,
            self.irq_early,
            self.irq_attempts,
            match self.irq_source {
                IrqSource::Device => "device",
                IrqSource::ApicTimer => "apic-timer",
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;
    use alloc::vec::Vec;

    #[test]
    fn percentiles() {
        assert_eq!(Percentiles::of(&mut []), None);
        let one = Percentiles::of(&mut [7]).unwrap();
        assert_eq!((one.p10, one.median, one.p90), (7, 7, 7));
        // 1..=100 shuffled: nearest rank over indices 0..=99.
        let mut v: Vec<u64> = (1..=100).map(|i| (i * 37) % 101).collect();
        let p = Percentiles::of(&mut v).unwrap();
        assert_eq!((p.p10, p.median, p.p90), (10, 50, 90));
        // An outlier does not move the median.
        let p = Percentiles::of(&mut [5, 5, 5, 1_000_000, 5]).unwrap();
        assert_eq!((p.median, p.p90), (5, 5));
        let p = Percentiles::of(&mut [4, 1, 3, 2]).unwrap();
        assert_eq!((p.p10, p.median, p.p90), (1, 2, 3));
    }

    #[test]
    fn conversions() {
        // 2 GHz: 2 cycles per ns.
        assert_eq!(cycles_to_ns(5000, 2_000_000), 2500);
        assert_eq!(cycles_to_ns(3, 2_000_000), 2); // 1.5 rounds up
        assert_eq!(cycles_to_ns(123, 0), 0);
        assert_eq!(cycles_to_ns(u64::MAX, 1), u64::MAX);
        assert_eq!(ns_to_cycles(50_000, 2_100_000), 105_000);
        assert_eq!(ns_to_cycles(u64::MAX, u64::MAX), u64::MAX);
        let p = Percentiles {
            p10: 1000,
            median: 2000,
            p90: 3000,
        }
        .to_ns(1_000_000);
        assert_eq!((p.p10, p.median, p.p90), (1000, 2000, 3000));
    }

    #[test]
    fn result_line() {
        let pc = |median| Percentiles {
            p10: median - 1,
            median,
            p90: median + 1,
        };
        let c = Calibration {
            ring: Ring::User,
            tsc_khz: 2_100_000,
            samples: 2000,
            kick: pc(2400),
            exit: pc(1500),
            irq: pc(9000),
            irq_latency: pc(30000),
            isr: pc(40000),
            cpuid: pc(100),
            loop_ns: 12,
            irq_samples: 1998,
            irq_source: IrqSource::Device,
            latency_samples: 1990,
            irq_early: 3,
            irq_attempts: 2010,
        };
        let mut s = String::new();
        c.write_json(&mut s).unwrap();
        assert!(
            s.starts_with(
                "{\"calibrate\":{\"ring\":3,\"tsc_khz\":2100000,\"samples\":2000,\
                 \"kick_ns\":2400,\"exit_ns\":1500,\"irq_ns\":9000,\"irq_latency_ns\":30000,"
            ),
            "{s}"
        );
        for field in [
            "\"kick_ns_p10\":2399,",
            "\"kick_ns_p90\":2401,",
            "\"irq_latency_ns_p90\":30001,",
            "\"isr_ns\":40000,",
            "\"cpuid_ns\":100,",
            "\"loop_ns\":12,",
            "\"irq_samples\":1998,",
        ] {
            assert!(s.contains(field), "{field} missing in {s}");
        }
        assert!(
            s.ends_with(
                "\"latency_samples\":1990,\"irq_early\":3,\"irq_attempts\":2010,\
                 \"irq_source\":\"device\"}}"
            ),
            "{s}"
        );
        let mut k = c;
        k.ring = Ring::Kernel;
        k.irq_source = IrqSource::ApicTimer;
        let mut s = String::new();
        k.write_json(&mut s).unwrap();
        assert!(s.starts_with("{\"calibrate\":{\"ring\":0,"), "{s}");
        assert!(s.ends_with(",\"irq_source\":\"apic-timer\"}}"), "{s}");
    }
}
