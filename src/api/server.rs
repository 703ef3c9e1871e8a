//! The API thread: HTTP/1.1 on a Unix socket, requests forwarded to the VMM thread.
//!
//! The socket file is created with mode 0600. A stale socket file (nobody listening) is
//! replaced; a live one, or a path that is not a socket, is an error. The thread installs its
//! seccomp filter before it accepts anything.
//!
//! One thread serves every connection (as Firecracker's API): non-blocking sockets in an
//! epoll set, each request parsed incrementally by [`super::http::Parser`] within fixed bounds
//! and answered in turn, so that no client can hold another up for longer than the VMM thread
//! takes to answer one request. The bounds are in [`Limits`] and [`super::http`]: at most 16
//! connections (a new one replaces the longest-idle, else gets 503), 10 s between requests,
//! 5 s to send a request and 5 s to take its answer, 8 KiB of request line and headers, 64
//! header fields, 50 KiB of body. A descriptor is held in reserve so that a process out of
//! descriptors still turns clients away instead of spinning or failing.

use std::fs;
use std::io::{self, Read};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use seccompiler::BpfProgram;
use serde::Serialize;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::http::{self, Event, Parser, Request, Version};
use super::{fault_body, parse_request, ApiError, VmmRequest, VmmResponse, VmmResult};
use crate::metrics::prometheus_text;

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

/// Bounds of the HTTP server; [`Limits::default`] is what the VMM uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once. A connection beyond them replaces the longest-idle one
    /// (between requests), or is answered 503 and closed when every one is mid-request.
    pub max_connections: usize,
    /// How long a connection may stay open between requests.
    pub idle_timeout: Duration,
    /// How long a client has from the first byte of a request to its last.
    pub request_timeout: Duration,
    /// How long a client has to take a response.
    pub write_timeout: Duration,
    /// After an error answer, how long the rest of the client's request is read and thrown
    /// away before the connection closes (so that the client can read the answer).
    pub linger_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 16,
            idle_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            linger_timeout: Duration::from_secs(1),
        }
    }
}

/// Most bytes thrown away from a connection closing after an error answer.
const LINGER_BYTES: usize = 1 << 20;
/// Bytes read from a connection per readiness event (the next chunk waits for the next
/// event, so that every connection gets its turn).
const READ_CHUNK: usize = 4096;
/// How long accepting pauses when no descriptor is left even after freeing the spare one.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The running API thread.
pub struct ApiServer {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// Listens on `path` and starts the API thread, which installs `filter` first.
    pub fn start(
        path: &Path,
        filter: Option<Arc<BpfProgram>>,
        metrics: Arc<ApiMetrics>,
    ) -> Result<(ApiServer, ApiChannel), ApiServerError> {
        ApiServer::start_with(path, filter, metrics, Limits::default())
    }

    /// [`ApiServer::start`] with other limits (tests).
    pub fn start_with(
        path: &Path,
        filter: Option<Arc<BpfProgram>>,
        metrics: Arc<ApiMetrics>,
        limits: Limits,
    ) -> Result<(ApiServer, ApiChannel), ApiServerError> {
        let listener = bind(path)?;
        let setup = |source| ApiServerError::Bind {
            path: path.to_owned(),
            source,
        };
        listener.set_nonblocking(true).map_err(setup)?;
        // Everything the thread needs is created here: its filter allows no new descriptors
        // but connections (and duplicates of the spare one).
        let epoll = Epoll::new().map_err(setup)?;
        let wake = EventFd::new(EFD_NONBLOCK).map_err(ApiServerError::EventFd)?;
        let thread_wake = wake.try_clone().map_err(ApiServerError::EventFd)?;
        let stop = EventFd::new(EFD_NONBLOCK).map_err(ApiServerError::EventFd)?;
        let thread_stop = stop.try_clone().map_err(ApiServerError::EventFd)?;
        let spare = stop.try_clone().map_err(ApiServerError::EventFd)?;
        for (fd, token) in [
            (listener.as_raw_fd(), Token::Listener),
            (thread_stop.as_raw_fd(), Token::Stop),
        ] {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token.data()),
                )
                .map_err(setup)?;
        }
        let (requests_tx, requests_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let server = Server {
            listener,
            epoll,
            stop: thread_stop,
            spare: Some(spare),
            conns: (0..limits.max_connections.max(1)).map(|_| None).collect(),
            accept_paused_until: None,
            limits,
            bridge: Bridge {
                requests: requests_tx,
                wake: thread_wake,
                metrics,
            },
        };
        let socket_path = path.to_owned();
        let thread = thread::Builder::new()
            .name("api".into())
            .spawn(move || api_thread(server, filter, &ready_tx, &socket_path))
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
        // The counter cannot overflow from one write.
        let _ = self.stop.write(1);
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

/// What an epoll event of the API thread is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Listener,
    Stop,
    Conn(usize),
}

impl Token {
    fn data(self) -> u64 {
        match self {
            Token::Listener => 0,
            Token::Stop => 1,
            Token::Conn(slot) => 2 + slot as u64,
        }
    }

    fn from_data(data: u64) -> Token {
        match data {
            0 => Token::Listener,
            1 => Token::Stop,
            n => Token::Conn((n - 2) as usize),
        }
    }
}

/// Where a connection is in its exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for (more of) a request.
    Reading,
    /// Sending `out`; then reading again, or closing.
    Writing { then_close: bool },
    /// The answer is sent and our side shut: the rest of the client's bytes are thrown
    /// away until it closes, [`LINGER_BYTES`] or the deadline.
    Draining { discarded: usize },
}

/// One client connection.
struct Conn {
    stream: UnixStream,
    parser: Parser,
    /// Bytes read but not yet fed to the parser (at most [`READ_CHUNK`]: nothing is read
    /// while some are left).
    pending: Vec<u8>,
    /// The response being sent, and how much of it went out.
    out: Vec<u8>,
    sent: usize,
    phase: Phase,
    /// When the connection is closed if its phase has not moved on.
    deadline: Instant,
    /// When it last finished an exchange (the longest-idle connection is replaced first).
    idle_since: Instant,
}

impl Conn {
    /// Between requests: nothing received, nothing to send.
    fn is_idle(&self) -> bool {
        self.phase == Phase::Reading && self.parser.is_idle() && self.pending.is_empty()
    }
}

/// What became of a connection after it was served.
enum Fate {
    Keep,
    Close,
}

/// The API thread: installs its filter, says it is ready, serves until stopped, and removes
/// the socket file.
fn api_thread(
    mut server: Server,
    filter: Option<Arc<BpfProgram>>,
    ready: &mpsc::SyncSender<Result<(), String>>,
    socket_path: &Path,
) {
    if let Some(filter) = filter {
        if let Err(e) = seccompiler::apply_filter(&filter) {
            let _ = ready.send(Err(format!("cannot install the API seccomp filter: {e}")));
            return;
        }
    }
    let _ = ready.send(Ok(()));
    if let Err(e) = server.run() {
        log::error!("the API server stopped: {e}");
    }
    drop(server);
    // The socket file goes with the server.
    let _ = fs::remove_file(socket_path);
}

/// The API thread's event loop: a listener, at most [`Limits::max_connections`] connections,
/// all non-blocking, each request answered in turn.
struct Server {
    listener: UnixListener,
    epoll: Epoll,
    stop: EventFd,
    /// A descriptor held in reserve: freed to accept (and turn away) a client when the
    /// process has no descriptor left.
    spare: Option<EventFd>,
    conns: Vec<Option<Conn>>,
    accept_paused_until: Option<Instant>,
    limits: Limits,
    bridge: Bridge,
}

impl Server {
    fn run(&mut self) -> io::Result<()> {
        let mut events = vec![EpollEvent::default(); self.conns.len() + 2];
        loop {
            let timeout = self.next_timeout();
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for event in &events[..n] {
                match Token::from_data(event.data()) {
                    Token::Stop => return Ok(()),
                    Token::Listener => self.accept_all(),
                    Token::Conn(slot) => self.serve(slot),
                }
            }
            self.expire();
        }
    }

    /// Milliseconds until the next deadline (-1: none).
    fn next_timeout(&self) -> i32 {
        let next = self
            .conns
            .iter()
            .flatten()
            .map(|c| c.deadline)
            .chain(self.accept_paused_until)
            .min();
        match next {
            None => -1,
            Some(at) => {
                let ms = at.saturating_duration_since(Instant::now()).as_millis();
                // Rounded up, so that the deadline has passed when the wait ends.
                (ms + 1).min(i32::MAX as u128) as i32
            }
        }
    }

    /// Closes the connections whose deadline passed; resumes accepting after a pause.
    fn expire(&mut self) {
        let now = Instant::now();
        for slot in 0..self.conns.len() {
            if self.conns[slot].as_ref().is_some_and(|c| c.deadline <= now) {
                log::debug!("API: closing a connection that missed its deadline");
                self.close(slot);
            }
        }
        if self.accept_paused_until.is_some_and(|at| at <= now) {
            self.accept_paused_until = None;
            self.listen(ControlOperation::Add);
        }
    }

    fn listen(&self, op: ControlOperation) {
        let what = format!("{op:?}");
        let event = EpollEvent::new(EventSet::IN, Token::Listener.data());
        if let Err(e) = self.epoll.ctl(op, self.listener.as_raw_fd(), event) {
            log::error!("API: cannot {what} the listener in the epoll set: {e}");
        }
    }

    /// Accepts every pending connection.
    fn accept_all(&mut self) {
        loop {
            match accept(&self.listener) {
                Ok(stream) => self.admit(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if e.raw_os_error() == Some(libc::EMFILE)
                        || e.raw_os_error() == Some(libc::ENFILE) =>
                {
                    if !self.out_of_descriptors() {
                        return;
                    }
                }
                // ECONNABORTED, EINTR, ...: that client is gone; the next one may be there.
                Err(e) => log::debug!("API: accept: {e}"),
            }
        }
    }

    /// No descriptor for a new client (accept4 says so even when nobody is waiting): the
    /// spare one is freed to see. A waiting client takes the place of the longest-idle
    /// connection, or is turned away with 503 when every connection is mid-request. False
    /// when accepting is over for now (nobody waiting, or a pause).
    fn out_of_descriptors(&mut self) -> bool {
        self.spare = None;
        let accepted = accept(&self.listener);
        let still_out = accepted_emfile(&accepted);
        let go_on = match accepted {
            Ok(stream) => {
                match self.longest_idle() {
                    Some(slot) => {
                        log::debug!("API: out of descriptors; closing the longest-idle connection");
                        self.close(slot);
                        self.spare = self.stop.try_clone().ok();
                        self.admit(stream);
                    }
                    None => {
                        self.count(503);
                        turn_away(&stream);
                    }
                }
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) => {
                log::debug!("API: accept: {e}");
                false
            }
        };
        if self.spare.is_none() {
            self.spare = self.stop.try_clone().ok();
        }
        if self.spare.is_none() || still_out {
            log::warn!("API: out of file descriptors; not accepting for {ACCEPT_PAUSE:?}");
            self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
            self.listen(ControlOperation::Delete);
            return false;
        }
        go_on
    }

    fn longest_idle(&self) -> Option<usize> {
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| c.as_ref().filter(|c| c.is_idle()).map(|c| (slot, c)))
            .min_by_key(|(_, c)| c.idle_since)
            .map(|(slot, _)| slot)
    }

    /// Gives `stream` a slot: a free one, else the longest-idle connection's; else 503.
    fn admit(&mut self, stream: UnixStream) {
        let slot = match self.conns.iter().position(Option::is_none) {
            Some(slot) => slot,
            None => match self.longest_idle() {
                Some(slot) => {
                    log::debug!("API: connection limit reached; closing the longest-idle one");
                    self.close(slot);
                    slot
                }
                None => {
                    log::warn!(
                        "API: {} connections are mid-request; turning a new one away",
                        self.conns.len()
                    );
                    self.count(503);
                    turn_away(&stream);
                    return;
                }
            },
        };
        let event = EpollEvent::new(EventSet::IN, Token::Conn(slot).data());
        if let Err(e) = self
            .epoll
            .ctl(ControlOperation::Add, stream.as_raw_fd(), event)
        {
            log::error!("API: cannot watch a connection: {e}");
            return;
        }
        let now = Instant::now();
        self.conns[slot] = Some(Conn {
            stream,
            parser: Parser::new(),
            pending: Vec::new(),
            out: Vec::new(),
            sent: 0,
            phase: Phase::Reading,
            deadline: now + self.limits.idle_timeout,
            idle_since: now,
        });
    }

    fn close(&mut self, slot: usize) {
        // Closing the descriptor also removes it from the epoll set.
        self.conns[slot] = None;
    }

    /// Handles readiness of the connection in `slot`.
    fn serve(&mut self, slot: usize) {
        let Some(mut conn) = self.conns[slot].take() else {
            return;
        };
        let before = interest(conn.phase);
        let fate = match conn.phase {
            Phase::Reading => self.read(&mut conn),
            Phase::Writing { .. } => self.flush(&mut conn),
            Phase::Draining { discarded } => drain(&mut conn, discarded),
        };
        if let Fate::Close = fate {
            return;
        }
        let after = interest(conn.phase);
        if after != before {
            let event = EpollEvent::new(after, Token::Conn(slot).data());
            if let Err(e) = self
                .epoll
                .ctl(ControlOperation::Modify, conn.stream.as_raw_fd(), event)
            {
                log::error!("API: cannot watch a connection: {e}");
                return;
            }
        }
        self.conns[slot] = Some(conn);
    }

    /// Reads one chunk and serves what it completes.
    fn read(&mut self, conn: &mut Conn) -> Fate {
        let mut buf = [0u8; READ_CHUNK];
        let n = match (&conn.stream).read(&mut buf) {
            Ok(0) => return Fate::Close,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Fate::Keep,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Fate::Keep,
            Err(_) => return Fate::Close,
        };
        if conn.parser.is_idle() && conn.pending.is_empty() {
            // A request starts: it must be complete within the request timeout.
            conn.deadline = Instant::now() + self.limits.request_timeout;
        }
        conn.pending.extend_from_slice(&buf[..n]);
        self.advance(conn)
    }

    /// Feeds the pending bytes to the parser and answers what they complete, until they are
    /// used up or an answer cannot be sent at once.
    fn advance(&mut self, conn: &mut Conn) -> Fate {
        while conn.phase == Phase::Reading && !conn.pending.is_empty() {
            let step = match conn.parser.feed(&conn.pending) {
                Ok(step) => step,
                Err(e) => {
                    conn.pending.clear();
                    let answer = Answer::error(e.status(), &e.to_string());
                    log::info!("API: refused a request: {} {}", answer.status, answer.body);
                    self.count(answer.status);
                    conn.out = answer.into_bytes(Version::Http11, true);
                    conn.phase = Phase::Writing { then_close: true };
                    break;
                }
            };
            conn.pending.drain(..step.consumed);
            match step.event {
                None => {}
                Some(Event::Continue) => {
                    conn.out = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
                    conn.phase = Phase::Writing { then_close: false };
                }
                Some(Event::Request(request)) => {
                    let close = !request.keep_alive();
                    let version = request.version;
                    let answer = self.answer(request);
                    conn.out = answer.into_bytes(version, close);
                    conn.phase = Phase::Writing { then_close: close };
                }
            }
        }
        match conn.phase {
            Phase::Writing { .. } => {
                conn.sent = 0;
                conn.deadline = Instant::now() + self.limits.write_timeout;
                self.flush(conn)
            }
            Phase::Reading | Phase::Draining { .. } => Fate::Keep,
        }
    }

    /// Sends what is left of the response; then reads on, or shuts our side and drains.
    fn flush(&mut self, conn: &mut Conn) -> Fate {
        while conn.sent < conn.out.len() {
            match send(&conn.stream, &conn.out[conn.sent..]) {
                Ok(n) => conn.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Fate::Keep,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Fate::Close,
            }
        }
        conn.out = Vec::new();
        conn.sent = 0;
        let now = Instant::now();
        match conn.phase {
            Phase::Writing { then_close: true } => {
                if conn.stream.shutdown(Shutdown::Write).is_err() {
                    return Fate::Close;
                }
                conn.phase = Phase::Draining { discarded: 0 };
                conn.deadline = now + self.limits.linger_timeout;
                Fate::Keep
            }
            _ => {
                conn.phase = Phase::Reading;
                if conn.parser.is_idle() && conn.pending.is_empty() {
                    conn.idle_since = now;
                    conn.deadline = now + self.limits.idle_timeout;
                    Fate::Keep
                } else {
                    if conn.parser.is_idle() {
                        // A pipelined request: its own time starts now.
                        conn.deadline = now + self.limits.request_timeout;
                    }
                    self.advance(conn)
                }
            }
        }
    }

    fn count(&self, status: u16) {
        let metrics = &self.bridge.metrics;
        metrics.requests.inc();
        match status {
            400..=499 => metrics.client_errors.inc(),
            500..=599 => metrics.server_errors.inc(),
            _ => {}
        }
    }

    /// The answer to a complete request.
    fn answer(&self, request: Request) -> Answer {
        let answer = match parse_request(&request.method, &request.target, &request.body) {
            Err(e) => Answer::from_api_error(e),
            Ok(vmm_request) => match self.bridge.call(vmm_request) {
                None => Answer::error(503, "the VMM is shutting down"),
                Some(Err(e)) => Answer::error(e.status(), &crate::error_chain(&e)),
                Some(Ok(VmmResponse::NoContent)) => Answer::json(204, String::new()),
                Some(Ok(VmmResponse::Json(value))) => Answer::json(200, value.to_string()),
                Some(Ok(VmmResponse::Metrics(value))) if request.accepts_text() => Answer {
                    status: 200,
                    body: prometheus_text(&value),
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    allow: None,
                },
                Some(Ok(VmmResponse::Metrics(value))) => Answer::json(200, value.to_string()),
            },
        };
        self.count(answer.status);
        let (method, target) = (&request.method, &request.target);
        if answer.status >= 400 {
            log::info!("API {method} {target}: {} {}", answer.status, answer.body);
        } else {
            log::debug!("API {method} {target}: {}", answer.status);
        }
        answer
    }
}

/// The epoll events a connection in `phase` waits for.
fn interest(phase: Phase) -> EventSet {
    match phase {
        Phase::Reading | Phase::Draining { .. } => EventSet::IN,
        Phase::Writing { .. } => EventSet::OUT,
    }
}

/// Reads and throws away what the client still sends after an error answer.
fn drain(conn: &mut Conn, discarded: usize) -> Fate {
    let mut buf = [0u8; READ_CHUNK];
    match (&conn.stream).read(&mut buf) {
        Ok(0) => Fate::Close,
        Ok(n) if discarded + n >= LINGER_BYTES => Fate::Close,
        Ok(n) => {
            conn.phase = Phase::Draining {
                discarded: discarded + n,
            };
            Fate::Keep
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Fate::Keep,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Fate::Keep,
        Err(_) => Fate::Close,
    }
}

/// Accepts one connection, non-blocking and close-on-exec from the start.
fn accept(listener: &UnixListener) -> io::Result<UnixStream> {
    // SAFETY: null address pointers are allowed (the peer's address is not wanted); the call
    // takes no other pointer.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: accept4 returned a new descriptor that nothing else owns.
    Ok(unsafe { UnixStream::from_raw_fd(fd) })
}

fn accepted_emfile(accepted: &io::Result<UnixStream>) -> bool {
    matches!(accepted, Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)))
}

/// `send` without SIGPIPE when the client is gone.
fn send(stream: &UnixStream, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: `bytes` is valid for reads of its length during the call, which keeps no
    // pointer to it.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Answers 503 to a connection that gets no slot (one non-blocking send: a new socket's
/// buffer holds it), then closes it.
fn turn_away(stream: &UnixStream) {
    // What the client sent already is read first (unread data at close would reset the
    // connection before the client reads the answer).
    let mut buf = [0u8; READ_CHUNK];
    let _ = (&*stream).read(&mut buf);
    let answer = Answer::error(503, "too many API connections; try again");
    let _ = send(stream, &answer.into_bytes(Version::Http11, true));
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

    fn json(status: u16, body: String) -> Answer {
        Answer {
            status,
            body,
            content_type: "application/json",
            allow: None,
        }
    }

    /// The response's bytes.
    fn into_bytes(self, version: Version, close: bool) -> Vec<u8> {
        let allow;
        let extra: &[(&str, &str)] = match &self.allow {
            Some(methods) => {
                allow = [("Allow", methods.as_str())];
                &allow
            }
            None => &[],
        };
        http::response_bytes(
            version,
            self.status,
            self.content_type,
            extra,
            close,
            self.body.as_bytes(),
        )
    }
}

#[cfg(test)]
mod tests;
