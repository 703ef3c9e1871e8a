//! The metrics document (`GET /metrics`, the stderr line) and its Prometheus text rendering.
//!
//! The JSON document is `{"net": {IFACE_ID: {device counters, "host_dev_name"}}, "vmm":
//! {...}}`. Its Prometheus form (text exposition format 0.0.4) has one family per counter:
//! `vmm_net_rx_frames_total{iface="eth0",host_dev_name="tap0"} 42`, and the VMM's own values
//! as `vmm_*` (counters end in `_total`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Map, Value};

/// One metric family being collected.
#[derive(Default)]
struct Family {
    counter: bool,
    help: String,
    samples: Vec<(String, String)>,
}

/// Renders the metrics document as Prometheus text.
pub fn prometheus_text(doc: &Value) -> String {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    if let Some(nets) = doc.get("net").and_then(Value::as_object) {
        for (iface, device) in nets {
            let mut labels = format!("iface=\"{}\"", escape(iface));
            if let Some(tap) = device.get("host_dev_name").and_then(Value::as_str) {
                let _ = write!(labels, ",host_dev_name=\"{}\"", escape(tap));
            }
            if let Some(device) = device.as_object() {
                collect(&mut families, "vmm_net", device, &labels, true);
            }
        }
    }
    if let Some(vmm) = doc.get("vmm").and_then(Value::as_object) {
        if let Some(state) = vmm.get("state").and_then(Value::as_str) {
            families.insert(
                "vmm_state".into(),
                Family {
                    counter: false,
                    help: "The VM's state (the label); always 1".into(),
                    samples: vec![(format!("state=\"{}\"", escape(state)), "1".into())],
                },
            );
        }
        collect(&mut families, "vmm", vmm, "", false);
    }
    let mut out = String::new();
    for (name, family) in families {
        let _ = writeln!(out, "# HELP {name} {}", family.help);
        let kind = if family.counter { "counter" } else { "gauge" };
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in family.samples {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
    }
    out
}

/// Adds the numeric (and boolean) leaves of `object` under `prefix`. In the net part every
/// number is a counter; in the VMM part, those under `api` are.
fn collect(
    families: &mut BTreeMap<String, Family>,
    prefix: &str,
    object: &Map<String, Value>,
    labels: &str,
    counters: bool,
) {
    for (key, value) in object {
        let path = format!("{prefix}_{}", sanitize(key));
        match value {
            Value::Object(inner) => {
                let counters = counters || (prefix == "vmm" && key == "api");
                collect(families, &path, inner, labels, counters);
            }
            Value::Number(n) => add(families, path, counters, labels, n.to_string()),
            Value::Bool(b) => add(families, path, false, labels, u8::from(*b).to_string()),
            _ => {}
        }
    }
}

fn add(
    families: &mut BTreeMap<String, Family>,
    path: String,
    counter: bool,
    labels: &str,
    value: String,
) {
    let name = if counter {
        format!("{path}_total")
    } else {
        path
    };
    let family = families.entry(name).or_insert_with_key(|name| Family {
        counter,
        help: help_for(name),
        samples: Vec::new(),
    });
    family.samples.push((labels.to_owned(), value));
}

fn help_for(name: &str) -> String {
    let known = [
        (
            "vmm_uptime_seconds",
            "Seconds since the VM started (0 before)",
        ),
        ("vmm_vcpus", "vCPUs of the running VM"),
        (
            "vmm_seccomp",
            "1 when the per-thread seccomp filters are on",
        ),
        ("vmm_api_requests_total", "API requests answered"),
        (
            "vmm_api_client_errors_total",
            "API requests answered with a 4xx status",
        ),
        (
            "vmm_api_server_errors_total",
            "API requests answered with a 5xx status",
        ),
    ];
    if let Some((_, help)) = known.iter().find(|(n, _)| *n == name) {
        return (*help).to_owned();
    }
    match name.strip_prefix("vmm_net_") {
        Some(rest) => format!(
            "virtio-net counter {} (see NetMetrics)",
            rest.trim_end_matches("_total")
        ),
        None => name.to_owned(),
    }
}

/// Metric names take `[a-zA-Z0-9_]`.
fn sanitize(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Label values escape `\`, `"` and newlines.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One network device's part of the document: its counters, `"backend"`, and its tap
/// (`"host_dev_name"`) or `"measurement_backend": true`.
pub fn net_device(
    metrics: &devices::virtio::net::NetMetrics,
    backend: devices::virtio::net::BackendKind,
    tap: &str,
) -> Value {
    let mut value = serde_json::to_value(metrics).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut value {
        if backend.is_measurement() {
            fields.insert("measurement_backend".into(), Value::Bool(true));
        } else {
            fields.insert("host_dev_name".into(), Value::String(tap.to_owned()));
        }
        fields.insert("backend".into(), Value::String(backend.name().into()));
    }
    value
}

impl crate::Vmm {
    /// The metrics document: `{"net": {IFACE_ID: {..}}, "vmm": {..}}`.
    pub(crate) fn metrics(&self) -> Value {
        let (nets, uptime, vcpus) = match &self.vm {
            Some(vm) => (vm.net_metrics(), vm.uptime().as_secs_f64(), vm.vcpu_count()),
            None => (Map::new(), 0.0, 0),
        };
        serde_json::json!({
            "net": nets,
            "vmm": {
                "state": self.state(),
                "uptime_seconds": uptime,
                "vcpus": vcpus,
                "seccomp": self.filters.is_some(),
                "api": &*self.api_metrics,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_families_with_labels_and_types() {
        let doc = serde_json::json!({
            "net": {
                "eth0": {"host_dev_name": "tap0", "rx": {"frames": 3}, "irqfd_signals": 2},
                "eth1": {"host_dev_name": "t\"1", "rx": {"frames": 5}, "irqfd_signals": 0}
            },
            "vmm": {"state": "Running", "uptime_seconds": 1.5, "seccomp": true,
                    "api": {"requests": 7}}
        });
        let text = prometheus_text(&doc);
        assert!(
            text.contains("# TYPE vmm_net_rx_frames_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("vmm_net_rx_frames_total{iface=\"eth0\",host_dev_name=\"tap0\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("host_dev_name=\"t\\\"1\"} 5\n"), "{text}");
        assert!(text.contains("# TYPE vmm_api_requests_total counter\nvmm_api_requests_total 7\n"));
        assert!(text.contains("# TYPE vmm_uptime_seconds gauge\nvmm_uptime_seconds 1.5\n"));
        assert!(text.contains("vmm_seccomp 1\n"));
        assert!(text.contains("vmm_state{state=\"Running\"} 1\n"));
        // One TYPE line per family, all its samples together.
        assert_eq!(
            text.matches("# TYPE vmm_net_irqfd_signals_total").count(),
            1
        );
        let lines: Vec<_> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("# TYPE vmm_net_irqfd_signals_total"))
            .unwrap();
        assert!(lines[at + 1].starts_with("vmm_net_irqfd_signals_total{iface=\"eth0\""));
        assert!(lines[at + 2].starts_with("vmm_net_irqfd_signals_total{iface=\"eth1\""));
    }
}
