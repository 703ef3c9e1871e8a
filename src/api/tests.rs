//! The router, and the OpenAPI document checked against it.

use std::collections::BTreeSet;

use devices::virtio::net::{InterruptCoalescing, MacAddr, NetTuning, NetTuningUpdate};
use serde_json::{json, Value};
use yaml_rust2::{Yaml, YamlLoader};

use super::*;
use crate::config::VmConfig;

fn parse(method: &str, path: &str, body: &str) -> Result<VmmRequest, ApiError> {
    parse_request(method, path, body.as_bytes())
}

fn status(method: &str, path: &str, body: &str) -> u16 {
    match parse(method, path, body) {
        Ok(_) => 200,
        Err(e) => e.status,
    }
}

#[test]
fn paths_methods_and_bodies() {
    assert_eq!(parse("GET", "/", ""), Ok(VmmRequest::GetInstanceInfo));
    assert_eq!(parse("GET", "/metrics?x=1", ""), Ok(VmmRequest::GetMetrics));
    assert_eq!(
        parse("PUT", "/actions", r#"{"action_type":"SendCtrlAltDel"}"#),
        Ok(VmmRequest::Action(ActionType::SendCtrlAltDel))
    );
    assert_eq!(status("GET", "/nope", ""), 404);
    assert_eq!(status("GET", "/boot-source/", ""), 404);
    assert_eq!(status("GET", "/network-interfaces", ""), 404);
    assert_eq!(status("GET", "/network-interfaces/", ""), 404);
    assert_eq!(status("PUT", "/network-interfaces/a/b", "{}"), 404);
    let e = parse("DELETE", "/machine-config", "").unwrap_err();
    assert_eq!((e.status, e.allow), (405, Some(ROUTES[3].methods)));
    assert_eq!(status("GET", "/boot-source", ""), 405);
    assert_eq!(status("POST", "/actions", "{}"), 405);
    assert_eq!(status("PUT", "/boot-source", ""), 400);
    assert_eq!(status("PUT", "/boot-source", "{"), 400);
    assert_eq!(
        status("PUT", "/boot-source", r#"{"kernel_image_path":1}"#),
        400
    );
    assert_eq!(status("PUT", "/actions", r#"{"action_type":"Pause"}"#), 400);
}

#[test]
fn the_iface_id_of_the_path_must_match_the_body() {
    let body = r#"{"iface_id":"eth1","host_dev_name":"tap0"}"#;
    let e = parse("PUT", "/network-interfaces/eth0", body).unwrap_err();
    assert_eq!(e.status, 400);
    assert!(e.message.contains("does not match"), "{}", e.message);
    assert!(parse("PUT", "/network-interfaces/eth1", body).is_ok());
    let e = parse("PUT", "/network-interfaces/bad%20id", body).unwrap_err();
    assert_eq!(e.status, 400);
    let patch = r#"{"iface_id":"eth0","tuning":{"event_idx":false}}"#;
    assert_eq!(
        parse("PATCH", "/network-interfaces/eth0", patch),
        Ok(VmmRequest::PatchNetworkInterface(
            crate::config::NetworkInterfaceUpdate {
                iface_id: "eth0".into(),
                rx_rate_limiter: None,
                tx_rate_limiter: None,
                tuning: Some(NetTuningUpdate {
                    event_idx: Some(false),
                    ..NetTuningUpdate::default()
                }),
            }
        ))
    );
    // Firecracker's rate-limiter fields are accepted; a bucket field we do not know is not.
    let limits = r#"{"iface_id":"eth0","rx_rate_limiter":{"ops":{"size":10,"refill_time":100}}}"#;
    assert!(parse("PATCH", "/network-interfaces/eth0", limits).is_ok());
    let e = parse(
        "PATCH",
        "/network-interfaces/eth0",
        r#"{"iface_id":"eth0","rx_rate_limiter":{"ops":{"size":1,"refill_time":1,"x":1}}}"#,
    )
    .unwrap_err();
    assert!(e.message.contains("unknown field `x`"), "{}", e.message);
}

#[test]
fn fault_bodies_are_json() {
    let body: Value = serde_json::from_str(&fault_body("a \"quoted\"\nline")).unwrap();
    assert_eq!(body, json!({"fault_message": "a \"quoted\"\nline"}));
}

fn yaml_to_json(y: &Yaml) -> Value {
    match y {
        Yaml::Real(s) => s.parse::<f64>().map(Value::from).unwrap_or(Value::Null),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(s) => Value::from(s.clone()),
        Yaml::Boolean(b) => Value::from(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(yaml_to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    (key, yaml_to_json(v))
                })
                .collect(),
        ),
        _ => Value::Null,
    }
}

fn openapi() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api/openapi.yaml");
    let text = std::fs::read_to_string(path).expect("docs/api/openapi.yaml");
    let docs = YamlLoader::load_from_str(&text).expect("valid YAML");
    yaml_to_json(&docs[0])
}

/// The property names of a schema, following a `$ref`.
fn properties(doc: &Value, schema: &str) -> BTreeSet<String> {
    doc["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("schema {schema} has properties"))
        .keys()
        .cloned()
        .collect()
}

fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

/// Coalescing in force: the guest's on rx (8 frames, 50 µs), the operator's `max_packets`
/// and `max_usecs` on tx.
fn guest_rx_operator_tx(
    max_packets: u16,
    max_usecs: u32,
) -> devices::virtio::net::CoalescingInForce {
    use devices::virtio::net::{CoalescingInForce, CoalescingSource, DirectionCoalescing};
    CoalescingInForce {
        rx: DirectionCoalescing {
            source: CoalescingSource::Guest,
            max_packets: 8,
            max_usecs: 50,
        },
        tx: DirectionCoalescing {
            source: CoalescingSource::Operator,
            max_packets,
            max_usecs,
        },
    }
}

#[test]
fn openapi_document_matches_the_server() {
    let doc = openapi();

    // Every route and method the server answers is documented, and nothing else.
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .flat_map(|r| {
            r.methods
                .iter()
                .map(|m| (r.path.to_owned(), m.as_str().to_lowercase()))
        })
        .collect();
    let paths = doc["paths"].as_object().expect("paths");
    let documented: BTreeSet<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("path item")
                .keys()
                .filter(|k| ["get", "put", "patch", "post", "delete"].contains(&k.as_str()))
                .map(|m| (path.clone(), m.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(served, documented);

    for (path, method) in &documented {
        let op = &doc["paths"][path][method];
        let responses = op["responses"].as_object().expect("responses");
        let success = if method == "get" { "200" } else { "204" };
        assert!(
            responses.contains_key(success),
            "{method} {path}: {success}"
        );
        let concrete = path.replace("{iface_id}", "eth0");
        let upper = method.to_uppercase();
        match op["requestBody"]["content"]["application/json"]["example"].as_object() {
            Some(_) => {
                assert!(responses.contains_key("400"), "{method} {path}: 400");
                // The documented example is a request the server takes.
                let example =
                    op["requestBody"]["content"]["application/json"]["example"].to_string();
                let parsed = parse_request(&upper, &concrete, example.as_bytes());
                assert!(parsed.is_ok(), "{method} {path}: {parsed:?}");
            }
            None => {
                assert!(
                    op["requestBody"].is_null(),
                    "{method} {path} needs an example"
                );
                assert!(
                    parse_request(&upper, &concrete, b"").is_ok(),
                    "{method} {path}"
                );
            }
        }
    }

    // The schemas name the fields the server reads and writes.
    let tuning = NetTuning {
        interrupt_coalescing: InterruptCoalescing {
            max_packets: 1,
            max_usecs: 1,
        },
        event_idx: true,
        tx_budget: 64,
        busy_poll_us: 5,
        busy_poll_sleep_us: 2,
        kick_coalescing: devices::virtio::net::KickCoalescing {
            max_packets: 128,
            max_usecs: 50,
        },
        rx_sparse_reads: false,
        adaptive: devices::virtio::net::Adaptive {
            enabled: true,
            ..Default::default()
        },
    };
    let iface = crate::config::NetworkInterface {
        iface_id: "eth0".into(),
        host_dev_name: "tap0".into(),
        // Every field given (a measurement backend's too), to compare with the document.
        backend: Some(devices::virtio::net::BackendKind::Sink),
        rate_pps: Some(1_000_000),
        frame_size: Some(64),
        guest_mac: Some(MacAddr::new([2, 0, 0, 0, 0, 1])),
        queue_size: Some(256),
        queues: Some(2),
        rx_rate_limiter: Some(devices::virtio::net::RateLimiterConfig {
            bandwidth: Some(devices::virtio::net::BucketConfig {
                size: 1 << 20,
                one_time_burst: 0,
                refill_time: 1000,
            }),
            ops: None,
        }),
        tx_rate_limiter: Some(devices::virtio::net::RateLimiterConfig {
            bandwidth: None,
            ops: Some(devices::virtio::net::BucketConfig {
                size: 1000,
                one_time_burst: 0,
                refill_time: 100,
            }),
        }),
        tuning,
        transport: Some(crate::config::Transport::Pci),
        io_uring: Some(false),
        packed: Some(true),
        in_order: Some(true),
        vhost_user_socket: Some("/run/vu.sock".into()),
        vhost_mode: Some(crate::config::VhostMode::Server),
    };
    let boot = crate::config::BootSource {
        kernel_image_path: "/k".into(),
        initrd_path: Some("/i".into()),
        boot_args: Some("a".into()),
    };
    let full = VmConfig {
        boot_source: Some(boot.clone()),
        network_interfaces: vec![iface.clone()],
        ..VmConfig::default()
    };
    let all_some_machine = crate::config::MachineConfigUpdate {
        vcpu_count: Some(1),
        mem_size_mib: Some(64),
        smt: Some(false),
        track_dirty_pages: Some(false),
    };
    let update = crate::config::NetworkInterfaceUpdate {
        iface_id: "eth0".into(),
        rx_rate_limiter: iface.rx_rate_limiter,
        tx_rate_limiter: iface.tx_rate_limiter,
        tuning: Some(NetTuningUpdate {
            interrupt_coalescing: Some(tuning.interrupt_coalescing),
            event_idx: Some(true),
            tx_budget: Some(tuning.tx_budget),
            busy_poll_us: Some(tuning.busy_poll_us),
            busy_poll_sleep_us: Some(tuning.busy_poll_sleep_us),
            kick_coalescing: Some(tuning.kick_coalescing),
            rx_sparse_reads: Some(tuning.rx_sparse_reads),
            adaptive: Some(tuning.adaptive),
        }),
    };
    let info = InstanceInfo {
        id: "i".into(),
        state: "Running".into(),
        vmm_version: "v".into(),
        app_name: "vmm".into(),
    };
    let in_force = guest_rx_operator_tx(1, 1);
    let iface_info = crate::api::NetworkInterfaceInfo {
        config: iface.clone(),
        coalescing_in_force: in_force,
    };
    let checks: [(&str, Value); 15] = [
        (
            "NetworkInterfaceInfo",
            serde_json::to_value(&iface_info).unwrap(),
        ),
        ("CoalescingInForce", serde_json::to_value(in_force).unwrap()),
        (
            "DirectionCoalescing",
            serde_json::to_value(in_force.rx).unwrap(),
        ),
        ("BootSource", serde_json::to_value(&boot).unwrap()),
        (
            "MachineConfiguration",
            serde_json::to_value(crate::config::MachineConfig::default()).unwrap(),
        ),
        (
            "MachineConfigurationUpdate",
            serde_json::to_value(&all_some_machine).unwrap(),
        ),
        ("NetworkInterface", serde_json::to_value(&iface).unwrap()),
        (
            "PartialNetworkInterface",
            serde_json::to_value(&update).unwrap(),
        ),
        ("NetTuning", serde_json::to_value(tuning).unwrap()),
        (
            "NetTuningUpdate",
            serde_json::to_value(update.tuning).unwrap(),
        ),
        (
            "InterruptCoalescing",
            serde_json::to_value(tuning.interrupt_coalescing).unwrap(),
        ),
        ("Adaptive", serde_json::to_value(tuning.adaptive).unwrap()),
        ("FullVmConfiguration", serde_json::to_value(&full).unwrap()),
        ("InstanceInfo", serde_json::to_value(&info).unwrap()),
        (
            "InstanceActionInfo",
            serde_json::to_value(ActionBody {
                action_type: ActionType::InstanceStart,
            })
            .unwrap(),
        ),
    ];
    for (schema, value) in checks {
        assert_eq!(properties(&doc, schema), keys(&value), "schema {schema}");
    }
    let actions: BTreeSet<String> = doc["components"]["schemas"]["InstanceActionInfo"]
        ["properties"]["action_type"]["enum"]
        .as_array()
        .expect("enum")
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect();
    let ours: BTreeSet<String> = [
        ActionType::InstanceStart,
        ActionType::SendCtrlAltDel,
        ActionType::FlushMetrics,
    ]
    .iter()
    .map(|a| {
        serde_json::to_value(a)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    })
    .collect();
    assert_eq!(actions, ours);
}

#[test]
fn get_network_interface_names_the_interface() {
    assert_eq!(
        parse_request("GET", "/network-interfaces/eth0", b"").expect("valid"),
        VmmRequest::GetNetworkInterface("eth0".into())
    );
    assert_eq!(
        parse_request("GET", "/network-interfaces/bad%20id", b"")
            .expect_err("bad id")
            .status,
        400
    );
    // The document: the configuration, flattened, and the coalescing in force.
    let info = NetworkInterfaceInfo {
        // Every field not given is left out (None, the default tuning).
        config: serde_json::from_value(json!({
            "iface_id": "eth0",
            "host_dev_name": "tap0",
            "packed": true,
            "in_order": true,
        }))
        .expect("a valid interface"),
        coalescing_in_force: guest_rx_operator_tx(0, 0),
    };
    let value = serde_json::to_value(&info).expect("serialises");
    assert_eq!(value["iface_id"], "eth0");
    assert_eq!(
        value["coalescing_in_force"]["rx"],
        json!({"source": "guest", "max_packets": 8, "max_usecs": 50})
    );
    assert_eq!(value["coalescing_in_force"]["tx"]["source"], "operator");
}
