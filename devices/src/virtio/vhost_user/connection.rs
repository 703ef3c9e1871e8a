//! One frontend's connection: its messages, one at a time, handed to the backend; its end,
//! however it comes, leaves the backend ready for the next frontend.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use log::{info, warn};
use vhost::vhost_user::{BackendReqHandler, Error as VhostError};

use super::{VhostUserBackend, VhostUserDevice};

/// How long a message may take to arrive once its first byte has: a frontend that stalls
/// mid-message is dropped rather than holding the backend's thread.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionEnd {
    /// The frontend closed the socket between two messages.
    #[error("the frontend disconnected")]
    Disconnected,
    /// A message was refused (malformed, out of order, out of range) or the socket failed; the
    /// connection is dropped.
    #[error("message refused")]
    Refused(#[source] VhostError),
}

/// A frontend's connection to a backend (the backend is shared across connections: the next
/// frontend finds the same device).
pub struct Connection<D: VhostUserDevice> {
    handler: BackendReqHandler<Mutex<VhostUserBackend<D>>>,
    backend: Arc<Mutex<VhostUserBackend<D>>>,
    fd: RawFd,
}

/// The backend, whatever a panic elsewhere left (it holds no invariant a panic can break
/// halfway: each message's changes are made before the device is reconciled).
pub fn lock<D>(backend: &Mutex<VhostUserBackend<D>>) -> MutexGuard<'_, VhostUserBackend<D>> {
    backend.lock().unwrap_or_else(|p| p.into_inner())
}

impl<D: VhostUserDevice> Connection<D> {
    /// Serves `stream` (a connected frontend) with `backend`.
    pub fn new(
        stream: UnixStream,
        backend: Arc<Mutex<VhostUserBackend<D>>>,
    ) -> std::io::Result<Self> {
        stream.set_read_timeout(Some(MESSAGE_TIMEOUT))?;
        let fd = stream.as_raw_fd();
        lock(&backend).connected();
        Ok(Connection {
            handler: BackendReqHandler::from_stream(stream, backend.clone()),
            backend,
            fd,
        })
    }

    /// The socket, for the caller's poll: [`Connection::process`] when it is readable.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Handles one message. An error ends the connection (drop it): the backend is reset for
    /// the next frontend when it is dropped.
    pub fn process(&mut self) -> Result<(), ConnectionEnd> {
        match self.handler.handle_request() {
            Ok(()) => Ok(()),
            Err(VhostError::Disconnected | VhostError::PartialMessage)
            | Err(VhostError::SocketBroken(_)) => Err(ConnectionEnd::Disconnected),
            Err(e) => {
                lock(&self.backend).metrics.protocol_errors.add(1);
                Err(ConnectionEnd::Refused(e))
            }
        }
    }
}

impl<D: VhostUserDevice> Drop for Connection<D> {
    fn drop(&mut self) {
        let mut backend = lock(&self.backend);
        backend.disconnected();
        info!("vhost-user {}: frontend connection closed", backend.label);
    }
}

/// Serves `stream` until the connection ends; returns why (a test and fuzzing helper: the
/// daemon polls [`Connection::fd`] beside its other sources).
pub fn serve<D: VhostUserDevice>(
    stream: UnixStream,
    backend: Arc<Mutex<VhostUserBackend<D>>>,
) -> ConnectionEnd {
    let mut connection = match Connection::new(stream, backend) {
        Ok(c) => c,
        Err(e) => return ConnectionEnd::Refused(VhostError::SocketError(e)),
    };
    loop {
        let mut poll = libc::pollfd {
            fd: connection.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call; poll only writes its `revents`.
        if unsafe { libc::poll(&mut poll, 1, -1) } < 0 {
            continue;
        }
        if let Err(end) = connection.process() {
            if let ConnectionEnd::Refused(e) = &end {
                warn!("vhost-user: closing the connection: {e}");
            }
            return end;
        }
    }
}
