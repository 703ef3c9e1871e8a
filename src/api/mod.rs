//! The REST API: Firecracker's paths, JSON bodies and status codes where we overlap, plus our
//! co-tuning extensions (`PATCH /network-interfaces/{id}` with `tuning`, `GET /metrics`).
//!
//! Shape (as Firecracker's): the API thread ([`server`]) speaks HTTP on a Unix socket, turns
//! each request into a typed [`VmmRequest`] ([`parse_request`]: 404/405/400 for bad paths,
//! methods and bodies are answered here), and sends it over a channel, waking the VMM thread
//! with an eventfd. The VMM thread owns the VM, acts, and replies on a per-request channel.
//!
//! The routes are listed once, in [`ROUTES`]; `docs/api/openapi.yaml` describes them and a test
//! checks the two agree.

pub mod handler;
pub mod http;
pub mod server;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{
    check_json_objects, validate_iface_id, BootSource, MachineConfig, MachineConfigUpdate,
    NetworkInterface, NetworkInterfaceUpdate,
};

/// Largest request body accepted (Firecracker's limit).
pub const MAX_BODY_BYTES: usize = 51_200;

/// HTTP methods the API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// PUT
    Put,
    /// PATCH
    Patch,
}

impl Method {
    /// The method's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
        }
    }

    fn parse(method: &str) -> Option<Method> {
        [Method::Get, Method::Put, Method::Patch]
            .into_iter()
            .find(|m| m.as_str() == method)
    }
}

/// One path of the API and the methods it answers.
#[derive(Clone, Copy, Debug)]
pub struct Route {
    /// The path as OpenAPI writes it (`{iface_id}` for a path parameter).
    pub path: &'static str,
    /// The methods it answers (others get 405).
    pub methods: &'static [Method],
}

/// Every route the server answers.
pub const ROUTES: &[Route] = &[
    Route {
        path: "/",
        methods: &[Method::Get],
    },
    Route {
        path: "/actions",
        methods: &[Method::Put],
    },
    Route {
        path: "/boot-source",
        methods: &[Method::Put],
    },
    Route {
        path: "/machine-config",
        methods: &[Method::Get, Method::Put, Method::Patch],
    },
    Route {
        path: "/network-interfaces/{iface_id}",
        methods: &[Method::Get, Method::Put, Method::Patch],
    },
    Route {
        path: "/vm/config",
        methods: &[Method::Get],
    },
    Route {
        path: "/metrics",
        methods: &[Method::Get],
    },
];

/// `GET /network-interfaces/{iface_id}`: the interface as configured, and the interrupt
/// coalescing in force on its device, per direction, with who set it (the operator's `tuning`,
/// or the guest over the control queue with VIRTIO_NET_F_NOTF_COAL: the last one set wins).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NetworkInterfaceInfo {
    /// The configuration (as in `GET /vm/config`).
    #[serde(flatten)]
    pub config: crate::config::NetworkInterface,
    /// The interrupt coalescing in force.
    pub coalescing_in_force: devices::virtio::net::CoalescingInForce,
}

/// `PUT /actions` body.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ActionBody {
    /// What to do.
    pub action_type: ActionType,
}

/// The actions of `PUT /actions`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum ActionType {
    /// Boot the configured VM.
    InstanceStart,
    /// Press Ctrl+Alt+Del on the guest's keyboard (see `docs/api/README.md`, "SendCtrlAltDel", for guests without one).
    SendCtrlAltDel,
    /// Print the metrics line on stderr now.
    FlushMetrics,
}

/// A request for the VMM thread.
#[derive(Clone, Debug, PartialEq)]
pub enum VmmRequest {
    /// `GET /`
    GetInstanceInfo,
    /// `GET /vm/config`
    GetVmConfig,
    /// `GET /machine-config`
    GetMachineConfig,
    /// `GET /metrics`
    GetMetrics,
    /// `PUT /boot-source`
    PutBootSource(BootSource),
    /// `PUT /machine-config`
    PutMachineConfig(MachineConfig),
    /// `PATCH /machine-config`
    PatchMachineConfig(MachineConfigUpdate),
    /// `PUT /network-interfaces/{iface_id}`
    PutNetworkInterface(NetworkInterface),
    /// `PATCH /network-interfaces/{iface_id}`
    PatchNetworkInterface(NetworkInterfaceUpdate),
    /// `GET /network-interfaces/{iface_id}`
    GetNetworkInterface(String),
    /// `PUT /actions`
    Action(ActionType),
}

/// What the VMM thread answers.
#[derive(Clone, Debug, PartialEq)]
pub enum VmmResponse {
    /// Done, nothing to say (204).
    NoContent,
    /// A JSON document (200).
    Json(Value),
    /// The metrics (200): JSON, or Prometheus text when the client asked for `text/plain`.
    Metrics(Value),
}

/// Why the VMM refused (or could not carry out) a well-formed request. The API answers
/// [`status`](VmmActionError::status) with the error and its causes as the `fault_message`.
#[derive(Debug, thiserror::Error)]
pub enum VmmActionError {
    /// Firecracker's wording, for requests that only make sense before boot.
    #[error("The requested operation is not supported after starting the microVM.")]
    NotAfterBoot,
    /// A configuration value was refused.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// No interface has that id.
    #[error("no network interface {0:?}")]
    UnknownInterface(String),
    /// The update would change nothing.
    #[error("the update changes nothing{hint}")]
    EmptyUpdate {
        /// What to give instead (may be empty).
        hint: &'static str,
    },
    /// A kernel or initrd path cannot be used.
    #[error("cannot open the {what} {path:?}")]
    Open {
        /// "kernel image" or "initrd".
        what: &'static str,
        /// The path given.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The device refused new knobs.
    #[error("network interface {iface_id:?}")]
    Tuning {
        /// The interface.
        iface_id: String,
        /// Why.
        #[source]
        source: devices::virtio::net::TuningError,
    },
    /// A rate limiter that cannot be used.
    #[error("network interface {iface_id:?}")]
    RateLimiter {
        /// The interface.
        iface_id: String,
        /// Why.
        #[source]
        source: devices::virtio::net::RateLimiterError,
    },
    /// InstanceStart on a running VM.
    #[error("the VM is already running")]
    AlreadyRunning,
    /// An action that needs a running VM.
    #[error("the VM is not running")]
    NotRunning,
    /// Building or starting the VM failed.
    #[error("cannot start the VM")]
    Start(#[source] Box<crate::VmmError>),
    /// The answer could not be serialised (a bug).
    #[error("cannot serialise the answer")]
    Serialise(#[source] serde_json::Error),
    /// Anything else (test doubles).
    #[error("{0}")]
    Other(String),
}

impl VmmActionError {
    /// The HTTP status: 400 for what the client can change (as Firecracker answers every
    /// refusal), 500 for the VMM's own failures.
    pub fn status(&self) -> u16 {
        match self {
            VmmActionError::Serialise(_) => 500,
            _ => 400,
        }
    }
}

/// The VMM thread's answer to one request.
pub type VmmResult = Result<VmmResponse, VmmActionError>;

/// A request the API thread answers itself, with the HTTP status it deserves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status code.
    pub status: u16,
    /// The `fault_message`.
    pub message: String,
    /// For 405: the methods the path allows.
    pub allow: Option<&'static [Method]>,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            allow: None,
        }
    }

    /// The JSON body: `{"fault_message": "..."}`.
    pub fn body(&self) -> String {
        fault_body(&self.message)
    }
}

/// `{"fault_message": message}`.
pub fn fault_body(message: &str) -> String {
    serde_json::json!({ "fault_message": message }).to_string()
}

/// Which route `path` is, and its path parameter.
fn match_route(path: &str) -> Option<(&'static Route, Option<&str>)> {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    if let Some(id) = path.strip_prefix("/network-interfaces/") {
        if id.is_empty() || id.contains('/') {
            return None;
        }
        let route = ROUTES
            .iter()
            .find(|r| r.path == "/network-interfaces/{iface_id}")?;
        return Some((route, Some(id)));
    }
    ROUTES
        .iter()
        .find(|r| r.path == path && !r.path.contains('{'))
        .map(|r| (r, None))
}

fn json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request needs a JSON body"));
    }
    let refuse = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!(
            "An error occurred when deserializing the json body of a request: {e}."
        ))
    };
    // The shape first (objects, not arrays); then the typed value, for serde's messages.
    let value: Value = serde_json::from_slice(body).map_err(|e| refuse(&e))?;
    check_json_objects(&value).map_err(|e| refuse(&e))?;
    serde_json::from_slice(body).map_err(|e| refuse(&e))
}

/// Turns an HTTP request into a [`VmmRequest`], or the error the API answers itself.
pub fn parse_request(method: &str, path: &str, body: &[u8]) -> Result<VmmRequest, ApiError> {
    let (route, param) = match_route(path).ok_or_else(|| ApiError {
        status: 404,
        message: format!("no such path: {path}"),
        allow: None,
    })?;
    let method = Method::parse(method)
        .filter(|m| route.methods.contains(m))
        .ok_or_else(|| ApiError {
            status: 405,
            message: format!("{method} is not allowed on {}", route.path),
            allow: Some(route.methods),
        })?;
    let request = match (route.path, method) {
        ("/", Method::Get) => VmmRequest::GetInstanceInfo,
        ("/vm/config", Method::Get) => VmmRequest::GetVmConfig,
        ("/metrics", Method::Get) => VmmRequest::GetMetrics,
        ("/machine-config", Method::Get) => VmmRequest::GetMachineConfig,
        ("/machine-config", Method::Put) => VmmRequest::PutMachineConfig(json(body)?),
        ("/machine-config", Method::Patch) => VmmRequest::PatchMachineConfig(json(body)?),
        ("/boot-source", Method::Put) => VmmRequest::PutBootSource(json(body)?),
        ("/actions", Method::Put) => VmmRequest::Action(json::<ActionBody>(body)?.action_type),
        ("/network-interfaces/{iface_id}", _) => {
            let id = param.unwrap_or_default();
            validate_iface_id(id).map_err(|e| ApiError::bad_request(e.to_string()))?;
            if method == Method::Get {
                return Ok(VmmRequest::GetNetworkInterface(id.to_owned()));
            }
            let (request, body_id) = if method == Method::Put {
                let iface: NetworkInterface = json(body)?;
                let body_id = iface.iface_id.clone();
                (VmmRequest::PutNetworkInterface(iface), body_id)
            } else {
                let update: NetworkInterfaceUpdate = json(body)?;
                let body_id = update.iface_id.clone();
                (VmmRequest::PatchNetworkInterface(update), body_id)
            };
            if body_id != id {
                return Err(ApiError::bad_request(format!(
                    "The iface_id in the path ({id}) does not match the one in the body ({body_id})"
                )));
            }
            request
        }
        // Every (path, method) pair of ROUTES is handled above.
        (path, method) => {
            return Err(ApiError {
                status: 405,
                message: format!("{} is not allowed on {path}", method.as_str()),
                allow: Some(route.methods),
            })
        }
    };
    Ok(request)
}

/// `GET /`: Firecracker's InstanceInfo.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct InstanceInfo {
    /// The instance id (`--id`).
    pub id: String,
    /// "Not started" or "Running".
    pub state: String,
    /// This VMM's version.
    pub vmm_version: String,
    /// "vmm".
    pub app_name: String,
}

#[cfg(test)]
mod tests;
