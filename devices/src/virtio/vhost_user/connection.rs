//! One frontend's connection: its messages, one at a time, handed to the backend; its end,
//! however it comes, leaves the backend ready for the next frontend.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use log::{debug, info, warn};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{BackendReqHandler, Error as VhostError, VhostUserBackendReqHandlerMut};

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
        if let Some(done) = self.early_enable() {
            return done;
        }
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

/// SET_VRING_ENABLE's request code.
const SET_VRING_ENABLE: u32 = 18;
/// Header flags: the version, a reply, a reply wanted.
const VERSION_1: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;

impl<D: VhostUserDevice> Connection<D> {
    /// SET_VRING_ENABLE before SET_FEATURES, served here: QEMU 7.2 restores each ring's
    /// enable state before it sets the features (it deems VHOST_USER_F_PROTOCOL_FEATURES
    /// negotiated once offered), and the `vhost` crate refuses the message until SET_FEATURES.
    /// `None`: the next message is anything else, for the crate.
    fn early_enable(&mut self) -> Option<Result<(), ConnectionEnd>> {
        let mut msg = [0u8; 20];
        // SAFETY: `msg` is valid for writes of its length for the call; MSG_PEEK leaves the
        // bytes in the socket.
        let n = unsafe {
            libc::recv(
                self.fd,
                msg.as_mut_ptr().cast(),
                msg.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        let word = |msg: &[u8; 20], at: usize| {
            u32::from_le_bytes([msg[at], msg[at + 1], msg[at + 2], msg[at + 3]])
        };
        let (code, flags, size) = (word(&msg, 0), word(&msg, 4), word(&msg, 8));
        if n != 20 || code != SET_VRING_ENABLE || size != 8 || flags & 0x3 != VERSION_1 {
            return None;
        }
        let mut backend = lock(&self.backend);
        if backend.acked.is_some() {
            return None;
        }
        // The message is whole in the socket: take it.
        // SAFETY: as above, without MSG_PEEK: the 20 bytes peeked are consumed.
        let taken = unsafe { libc::recv(self.fd, msg.as_mut_ptr().cast(), 20, 0) };
        if taken != 20 {
            return Some(Err(ConnectionEnd::Disconnected));
        }
        let (index, num) = (word(&msg, 12), word(&msg, 16));
        let result = match num {
            0 | 1 => backend.set_vring_enable(index, num == 1),
            _ => Err(VhostError::InvalidParam),
        };
        let reply_ack = backend.protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0;
        if let Err(e) = result {
            backend.metrics.protocol_errors.add(1);
            return Some(Err(ConnectionEnd::Refused(e)));
        }
        drop(backend);
        if flags & NEED_REPLY != 0 && reply_ack {
            let mut reply = [0u8; 20];
            reply[..4].copy_from_slice(&SET_VRING_ENABLE.to_le_bytes());
            reply[4..8].copy_from_slice(&(VERSION_1 | REPLY).to_le_bytes());
            reply[8..12].copy_from_slice(&8u32.to_le_bytes());
            // SAFETY: `reply` is valid for reads of its length for the call.
            let sent =
                unsafe { libc::send(self.fd, reply.as_ptr().cast(), 20, libc::MSG_NOSIGNAL) };
            if sent != 20 {
                return Some(Err(ConnectionEnd::Disconnected));
            }
        }
        debug!("vhost-user: SET_VRING_ENABLE({index}, {num}) before SET_FEATURES");
        Some(Ok(()))
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
