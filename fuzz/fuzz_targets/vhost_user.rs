//! The vhost-user backend's message handling (`devices::virtio::vhost_user`, over rust-vmm
//! `vhost`'s parser): a hostile frontend's whole conversation, then its disconnection.
//!
//! Each input is a sequence of messages. A message is a request code (one of the protocol's,
//! or any value), header flags, a payload of arbitrary bytes and length (the header's size may
//! lie), and file descriptors where the request carries them: memory regions are memfds of a
//! size the input chooses (possibly shorter than the region claims), ring eventfds are
//! eventfds or, now and then, a memfd. Some inputs start with a well-formed handshake (owner,
//! features, protocol features, a memory table whose frontend address is the fuzzer's choice)
//! so that the ring messages reach the device; the rings then point wherever the input says.
//!
//! Invariants:
//! - no panic, whatever the messages (the process survives: the connection ends or goes on);
//! - a refused message ends the connection, counted as a protocol error;
//! - the backend ends every conversation stopped and empty: the device not running, no memory
//!   region mapped, no features negotiated, ready for the next frontend (one backend serves
//!   every input, as one daemon serves every frontend).

#![no_main]

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::Arbitrary;
use devices::backend::SinkBackend;
use devices::virtio::net::{MacAddr, NetDevice};
use devices::virtio::vhost_user::{lock, serve, ConnectionEnd, VhostUserBackend};
use libfuzzer_sys::fuzz_target;

type Backend = Arc<Mutex<VhostUserBackend<NetDevice<SinkBackend>>>>;

/// One backend for every input: two queue pairs in front of sinks.
fn backend() -> &'static Backend {
    static BACKEND: OnceLock<Backend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        let sinks = vec![
            SinkBackend::new().expect("sink"),
            SinkBackend::new().expect("sink"),
        ];
        let device = NetDevice::with_backends(sinks, MacAddr::new([2, 0, 0, 0, 0, 1]), 256)
            .with_ring_features(true, true);
        Arc::new(Mutex::new(VhostUserBackend::new(device, "fuzz")))
    })
}

/// The frontend's requests (FrontendReq codes).
const CODES: [u32; 24] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 22, 23, 24, 36, 37, 38,
];
const SET_MEM_TABLE: u32 = 5;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_CALL: u32 = 13;
const SET_VRING_ERR: u32 = 14;
const ADD_MEM_REG: u32 = 37;

#[derive(Arbitrary, Debug)]
struct Message {
    /// Index into CODES, or (past it) a raw code.
    code: u16,
    flags: u8,
    /// Overrides the header's size when set.
    size: Option<u16>,
    payload: Vec<u8>,
    /// Descriptors attached: memory regions (memfd sizes in pages), or a ring's eventfd
    /// (a memfd instead when the low bit is set).
    fds: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Begin with a well-formed handshake and a 4 MiB memory table at this frontend address.
    handshake: Option<u64>,
    messages: Vec<Message>,
}

fn memfd(pages: u64) -> File {
    // SAFETY: memfd_create with a static name returns a new descriptor we then own.
    let fd = unsafe { libc::memfd_create(c"fuzz".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(pages * 4096).expect("ftruncate");
    file
}

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd returns a new descriptor we then own (checked).
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
    assert!(fd >= 0);
    // SAFETY: as above.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Sends one message with `fds` attached.
fn send(
    socket: &UnixStream,
    code: u32,
    flags: u32,
    size: u32,
    payload: &[u8],
    fds: &[i32],
) -> bool {
    let mut bytes = Vec::with_capacity(12 + payload.len());
    bytes.extend_from_slice(&code.to_le_bytes());
    bytes.extend_from_slice(&flags.to_le_bytes());
    bytes.extend_from_slice(&size.to_le_bytes());
    bytes.extend_from_slice(payload);
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let space = if fds.is_empty() {
        0
    } else {
        // SAFETY: CMSG_SPACE is arithmetic.
        unsafe { libc::CMSG_SPACE((fds.len() * 4) as u32) as usize }
    };
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain data; all-zero is valid before the fields are set.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds one header and `fds.len()` descriptors
        // (CMSG_SPACE above); CMSG_FIRSTHDR points into it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
    }
    // SAFETY: `msg` points at live buffers for the call.
    unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_DONTWAIT) > 0 }
}

fn u64s(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fuzz_target!(|input: Input| {
    let backend = backend();
    let (frontend, theirs) = UnixStream::pair().expect("socketpair");
    // Everything the backend sees is written before it reads: the socket buffer holds it (an
    // input too large to fit is cut where the buffer fills).
    let mut keep = Vec::new();
    if let Some(addr) = input.handshake {
        let mem = memfd(1024);
        send(&frontend, 3, 1, 0, &[], &[]);
        // VERSION_1 | PROTOCOL_FEATURES | EVENT_IDX | RING_PACKED | IN_ORDER | MRG_RXBUF | MQ.
        let features = 1u64 << 32 | 1 << 30 | 1 << 29 | 1 << 34 | 1 << 35 | 1 << 15 | 1 << 22;
        send(&frontend, 2, 1, 8, &u64s(&[features]), &[]);
        send(&frontend, 16, 1, 8, &u64s(&[0x8009]), &[]); // MQ, REPLY_ACK, MEM_SLOTS
        let table = u64s(&[1, 0, 0x40_0000, addr, 0]);
        send(
            &frontend,
            SET_MEM_TABLE,
            1,
            table.len() as u32,
            &table,
            &[mem.as_raw_fd()],
        );
        keep.push(OwnedFd::from(mem));
    }
    for m in input.messages.iter().take(64) {
        let code = CODES
            .get(usize::from(m.code))
            .copied()
            .unwrap_or(u32::from(m.code));
        let flags = u32::from(m.flags & 0x0f);
        let size = m.size.map_or(m.payload.len() as u32, u32::from);
        let mut fds = Vec::new();
        for &f in m.fds.iter().take(9) {
            let fd = match code {
                SET_MEM_TABLE | ADD_MEM_REG => OwnedFd::from(memfd(u64::from(f % 8) * 256)),
                SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR if f & 1 == 0 => eventfd(),
                _ => OwnedFd::from(memfd(1)),
            };
            fds.push(fd.as_raw_fd());
            keep.push(fd);
        }
        if !send(&frontend, code, flags, size, &m.payload, &fds) {
            break;
        }
    }
    let _ = (&frontend).flush();
    // The frontend stops writing; the backend reads to the end.
    let _ = frontend.shutdown(std::net::Shutdown::Write);
    let before = lock(backend).metrics().protocol_errors.get();
    let end = serve(theirs, backend.clone());
    drop(keep);
    let b = lock(backend);
    let m = b.metrics();
    match end {
        ConnectionEnd::Refused(_) => assert_eq!(m.protocol_errors.get(), before + 1),
        ConnectionEnd::Disconnected => assert_eq!(m.protocol_errors.get(), before),
    }
    assert!(!b.is_running(), "the device stops with its frontend");
    assert_eq!(
        m.memory_regions.get(),
        0,
        "the frontend's memory is unmapped"
    );
    assert_eq!(m.negotiated_features.get(), 0);
    assert_eq!(m.connected.get(), 0);
});
