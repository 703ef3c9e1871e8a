//! The API thread: HTTP/1.1 on a Unix socket (tiny_http), requests forwarded to the VMM thread.
//!
//! The socket file is created with mode 0600. A stale socket file (nobody listening) is
//! replaced; a live one, or a path that is not a socket, is an error. The thread installs its
//! seccomp filter before it accepts anything; the HTTP server's own threads (an accept thread
//! and one per connection) are started from it and inherit the filter.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use seccompiler::BpfProgram;
use serde::Serialize;
use tiny_http::{Header, Response, Server, StatusCode};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{
    fault_body, parse_request, ApiError, VmmRequest, VmmResponse, VmmResult, MAX_BODY_BYTES,
};
use crate::metrics::prometheus_text;

/// How often the API thread checks whether it must stop.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("{0:?} is in use by a running process")]
    InUse(PathBuf),
    #[error("{0:?} exists and is not a socket; not replacing it")]
    NotASocket(PathBuf),
    #[error("cannot remove the stale socket {path:?}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {path:?}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create an eventfd")]
    EventFd(#[source] io::Error),
    #[error("cannot start the API thread")]
    Thread(#[source] io::Error),
    #[error("the API thread failed to start: {0}")]
    Setup(String),
}

/// Counters of the API, shown in `GET /metrics`.
#[derive(Debug, Default, Serialize)]
pub struct ApiMetrics {
    /// Requests answered.
    pub requests: AtomicCounter,
    /// Requests answered with a 4xx status.
    pub client_errors: AtomicCounter,
    /// Requests answered with a 5xx status.
    pub server_errors: AtomicCounter,
}

/// A relaxed counter that serialises as a number.
#[derive(Debug, Default)]
pub struct AtomicCounter(AtomicU64);

impl AtomicCounter {
    fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// The value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Serialize for AtomicCounter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.get())
    }
}

/// One request for the VMM thread, with where to send the answer.
pub struct ApiCall {
    /// The request.
    pub request: VmmRequest,
    /// The answer goes here (dropping it answers 503).
    pub reply: SyncSender<VmmResult>,
}

/// The VMM thread's end: requests arrive on `requests`, `wake` is written for each.
pub struct ApiChannel {
    /// Incoming requests.
    pub requests: Receiver<ApiCall>,
    /// Readable when requests are pending (register it in the VMM's epoll).
    pub wake: EventFd,
}

/// The running API thread.
pub struct ApiServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// Listens on `path` and starts the API thread, which installs `filter` first.
    pub fn start(
        path: &Path,
        filter: Option<Arc<BpfProgram>>,
        metrics: Arc<ApiMetrics>,
    ) -> Result<(ApiServer, ApiChannel), ApiServerError> {
        let listener = bind(path)?;
        let wake = EventFd::new(EFD_NONBLOCK).map_err(ApiServerError::EventFd)?;
        let thread_wake = wake.try_clone().map_err(ApiServerError::EventFd)?;
        let (requests_tx, requests_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                let bridge = Bridge {
                    requests: requests_tx,
                    wake: thread_wake,
                    metrics,
                };
                api_thread(listener, filter, bridge, &thread_stop, ready_tx);
            })
            .map_err(ApiServerError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ApiServerError::Setup(e)),
            Err(_) => return Err(ApiServerError::Setup("the thread ended".into())),
        }
        log::info!("API listening on {path:?}");
        Ok((
            ApiServer {
                stop,
                thread: Some(thread),
            },
            ApiChannel {
                requests: requests_rx,
                wake,
            },
        ))
    }

    /// Stops the API thread after the request it is answering; the socket file is removed.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the API thread panicked");
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Binds `path` with mode 0600, replacing a stale socket file.
pub fn bind(path: &Path) -> Result<UnixListener, ApiServerError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => return Err(ApiServerError::InUse(path.to_owned())),
            Err(_) => {
                log::info!("replacing the stale socket {path:?}");
                fs::remove_file(path).map_err(|source| ApiServerError::RemoveStale {
                    path: path.to_owned(),
                    source,
                })?;
            }
        },
        Ok(_) => return Err(ApiServerError::NotASocket(path.to_owned())),
        Err(_) => {}
    }
    let bind_err = |source| ApiServerError::Bind {
        path: path.to_owned(),
        source,
    };
    // The socket file gets its mode from the umask at bind time: make it 0600 from the
    // start, so that there is no moment where others could connect. The VMM has no other
    // thread creating files yet.
    // SAFETY: umask only changes this process's file-mode mask; it cannot fail.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(bind_err)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
    Ok(listener)
}

/// The API thread's end of the channel to the VMM.
struct Bridge {
    requests: Sender<ApiCall>,
    wake: EventFd,
    metrics: Arc<ApiMetrics>,
}

impl Bridge {
    /// Sends `request` to the VMM thread and waits for its answer.
    fn call(&self, request: VmmRequest) -> Option<VmmResult> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.requests.send(ApiCall { request, reply }).ok()?;
        // The eventfd cannot overflow in practice; if it did, the VMM is already woken.
        let _ = self.wake.write(1);
        answer.recv().ok()
    }
}

fn api_thread(
    listener: UnixListener,
    filter: Option<Arc<BpfProgram>>,
    bridge: Bridge,
    stop: &AtomicBool,
    ready: SyncSender<Result<(), String>>,
) {
    if let Some(filter) = filter {
        if let Err(e) = seccompiler::apply_filter(&filter) {
            let _ = ready.send(Err(format!("cannot install the API seccomp filter: {e}")));
            return;
        }
    }
    // The server's threads are created here, after the filter: they inherit it.
    let server = match Server::from_listener(listener, None) {
        Ok(server) => server,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start the HTTP server: {e}")));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    while !stop.load(Ordering::Acquire) {
        match server.recv_timeout(STOP_POLL) {
            Ok(Some(request)) => handle(request, &bridge),
            Ok(None) => {}
            Err(e) => {
                log::error!("API server: {e}");
                break;
            }
        }
    }
    // Dropping the server here stops its accept thread and removes the socket file.
}

/// An answer on its way to the client.
struct Answer {
    status: u16,
    body: String,
    content_type: &'static str,
    allow: Option<String>,
}

impl Answer {
    fn error(status: u16, message: &str) -> Answer {
        Answer {
            status,
            body: fault_body(message),
            content_type: "application/json",
            allow: None,
        }
    }

    fn from_api_error(e: ApiError) -> Answer {
        let mut answer = Answer::error(e.status, &e.message);
        answer.allow = e.allow.map(|methods| {
            methods
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        });
        answer
    }
}

fn handle(mut request: tiny_http::Request, bridge: &Bridge) {
    let method = request.method().as_str().to_owned();
    let url = request.url().to_owned();
    let wants_text = request
        .headers()
        .iter()
        .any(|h| h.field.equiv("Accept") && h.value.as_str().contains("text/plain"));
    let answer = match read_body(&mut request) {
        Err(answer) => answer,
        Ok(body) => match parse_request(&method, &url, &body) {
            Err(e) => Answer::from_api_error(e),
            Ok(vmm_request) => match bridge.call(vmm_request) {
                None => Answer::error(503, "the VMM is shutting down"),
                Some(Err(e)) => Answer::error(400, &e.0),
                Some(Ok(VmmResponse::NoContent)) => Answer {
                    status: 204,
                    body: String::new(),
                    content_type: "application/json",
                    allow: None,
                },
                Some(Ok(VmmResponse::Json(value))) => Answer {
                    status: 200,
                    body: value.to_string(),
                    content_type: "application/json",
                    allow: None,
                },
                Some(Ok(VmmResponse::Metrics(value))) if wants_text => Answer {
                    status: 200,
                    body: prometheus_text(&value),
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    allow: None,
                },
                Some(Ok(VmmResponse::Metrics(value))) => Answer {
                    status: 200,
                    body: value.to_string(),
                    content_type: "application/json",
                    allow: None,
                },
            },
        },
    };
    bridge.metrics.requests.inc();
    match answer.status {
        400..=499 => bridge.metrics.client_errors.inc(),
        500..=599 => bridge.metrics.server_errors.inc(),
        _ => {}
    }
    if answer.status >= 400 {
        log::info!("API {method} {url}: {} {}", answer.status, answer.body);
    } else {
        log::debug!("API {method} {url}: {}", answer.status);
    }
    respond(request, answer);
}

/// Reads the body, refusing more than [`MAX_BODY_BYTES`].
///
/// An oversized body is still read to its end, through a small buffer and thrown away: left
/// unread, tiny_http would drain it into one buffer of the declared length (a client could
/// declare terabytes), and on a kept-alive connection the rest would be taken for the next
/// request.
fn read_body(request: &mut tiny_http::Request) -> Result<Vec<u8>, Answer> {
    let reader = request.as_reader();
    let mut body = Vec::new();
    reader
        .take(MAX_BODY_BYTES as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| Answer::error(400, &format!("cannot read the request body: {e}")))?;
    if body.len() > MAX_BODY_BYTES {
        let _ = io::copy(reader, &mut io::sink());
        return Err(Answer::error(
            413,
            &format!("the request body is larger than the limit of {MAX_BODY_BYTES} bytes"),
        ));
    }
    Ok(body)
}

fn respond(request: tiny_http::Request, answer: Answer) {
    let mut response =
        Response::from_string(answer.body).with_status_code(StatusCode(answer.status));
    let mut headers = vec![("Content-Type", answer.content_type.to_owned())];
    if let Some(allow) = answer.allow {
        headers.push(("Allow", allow));
    }
    for (name, value) in headers {
        if let Ok(header) = Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            response.add_header(header);
        }
    }
    if let Err(e) = request.respond(response) {
        log::debug!("API: cannot send a response: {e}");
    }
}
