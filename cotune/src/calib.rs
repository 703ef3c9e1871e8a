//! Exit-cost calibration: the driver guest's `calibrate=N` workload measures, with its TSC in
//! a real VM on this host, what a kick and an interrupt cost the vCPU, and prints one line
//!
//! ```text
//! {"calibrate":{"ring":3,"tsc_khz":…,"samples":…,"kick_ns":…,"exit_ns":…,"irq_ns":…,"irq_latency_ns":…}}
//! ```
//!
//! `cotune --kick-cost-ns auto --irq-cost-ns auto` boots the guest once and charges those
//! costs in the co-simulation.

use serde::Deserialize;

/// What the guest measured.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct Calibration {
    /// Privilege ring the measuring loop ran in.
    pub ring: u8,
    /// The guest's TSC frequency.
    pub tsc_khz: u64,
    /// Samples per measurement.
    pub samples: u64,
    /// A kick: the queue-notify MMIO write's round trip, ns.
    pub kick_ns: f64,
    /// A no-op exit, ns.
    pub exit_ns: f64,
    /// An interrupt's cost to the vCPU (handler entry, body, EOI, return), ns.
    pub irq_ns: f64,
    /// From the device's signal to the handler, ns.
    pub irq_latency_ns: f64,
    /// The driver's interrupt service routine (InterruptStatus read and ack: two MMIO exits to
    /// the VMM process), ns; 0 when the guest did not report it.
    #[serde(default)]
    pub isr_ns: f64,
}

impl Calibration {
    /// What one interrupt costs the driver's vCPU in the VM: the interrupt itself and the
    /// service routine's register exits. In co-simulation the same routine's register
    /// accesses are plain function calls, so `--irq-cost-ns auto` charges both.
    pub fn interrupt_cost_ns(&self) -> f64 {
        self.irq_ns + self.isr_ns
    }
}

#[derive(Deserialize)]
struct Line {
    calibrate: Calibration,
}

/// Why no calibration could be read from the guest's output.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CalibrationError {
    #[error(
        "the driver guest printed no {{\"calibrate\":…}} line (does its build know calibrate=N?)"
    )]
    Missing,
    #[error("bad calibrate line {line:?}: {reason}")]
    Bad {
        /// The line.
        line: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Finds and parses the `{"calibrate":…}` line in the guest's console output.
pub fn parse_output(console: &str) -> Result<Calibration, CalibrationError> {
    let line = console
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("{\"calibrate\":"))
        .ok_or(CalibrationError::Missing)?;
    parse_line(line)
}

/// Parses one `{"calibrate":…}` line; costs must be finite and positive.
pub fn parse_line(line: &str) -> Result<Calibration, CalibrationError> {
    let bad = |reason: String| CalibrationError::Bad {
        line: line.to_owned(),
        reason,
    };
    let c = serde_json::from_str::<Line>(line)
        .map_err(|e| bad(e.to_string()))?
        .calibrate;
    for (name, v) in [("kick_ns", c.kick_ns), ("irq_ns", c.irq_ns)] {
        if !(v.is_finite() && v > 0.0 && v < 1e9) {
            return Err(bad(format!("{name} {v} is not a plausible cost")));
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"calibrate":{"ring":3,"tsc_khz":2994372,"samples":2000,"kick_ns":2417,"exit_ns":1873,"irq_ns":3120,"irq_latency_ns":5400}}"#;

    #[test]
    fn parses_the_guest_line() {
        let c = parse_line(SAMPLE).unwrap();
        assert_eq!(c.ring, 3);
        assert_eq!(c.tsc_khz, 2_994_372);
        assert_eq!(c.samples, 2000);
        assert_eq!(c.kick_ns, 2417.0);
        assert_eq!(c.exit_ns, 1873.0);
        assert_eq!(c.irq_ns, 3120.0);
        assert_eq!(c.isr_ns, 0.0, "absent: 0");
        assert_eq!(c.interrupt_cost_ns(), 3120.0);
        let with_isr = parse_line(&SAMPLE.replace("}}", ",\"isr_ns\":40000}}")).unwrap();
        assert_eq!(with_isr.interrupt_cost_ns(), 43120.0);
        assert_eq!(c.irq_latency_ns, 5400.0);
    }

    #[test]
    fn finds_the_line_among_console_output() {
        let console = format!("driver-guest: ready ring=3 mac=...\n{SAMPLE}\r\n{{\"driver\":{{\"status\":\"done\"}}}}\n");
        assert_eq!(parse_output(&console).unwrap().kick_ns, 2417.0);
        assert_eq!(
            parse_output("driver-guest: ready\n"),
            Err(CalibrationError::Missing)
        );
    }

    #[test]
    fn refuses_a_truncated_or_implausible_line() {
        assert!(matches!(
            parse_line(&SAMPLE[..SAMPLE.len() - 10]),
            Err(CalibrationError::Bad { .. })
        ));
        let zero = SAMPLE.replace("\"kick_ns\":2417", "\"kick_ns\":0");
        assert!(matches!(
            parse_line(&zero),
            Err(CalibrationError::Bad { .. })
        ));
        let missing = SAMPLE.replace(",\"irq_ns\":3120", "");
        assert!(matches!(
            parse_line(&missing),
            Err(CalibrationError::Bad { .. })
        ));
    }
}
