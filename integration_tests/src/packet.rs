//! The driver guest's test frames and an AF_PACKET socket on a tap, shared by the tests that
//! boot `driver-guest` (`driver_guest.rs`, `driver_pci.rs`).
//!
//! Frame format (see guest/baremetal/src/frames.rs): dst, src, EtherType 0x88b5, sequence
//! number (u32 LE), frame length (u16 LE), then byte i = (seq + i) as u8.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The test frames' EtherType.
pub const ETHERTYPE: u16 = 0x88b5;
/// Bytes before the payload ramp.
pub const HEADER_LEN: usize = 20;

/// Test frame `seq` of `len` bytes from `src` to `dst`.
pub fn frame(dst: [u8; 6], src: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    f.extend_from_slice(&(len as u16).to_le_bytes());
    f.extend((HEADER_LEN..len).map(|i| (seq as usize + i) as u8));
    f
}

/// `mac` as `aa:bb:…`.
pub fn mac_string(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `aa:bb:…` as a MAC.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let bytes: Vec<u8> = s
        .trim()
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).ok())
        .collect::<Option<_>>()?;
    bytes.try_into().ok()
}

/// An AF_PACKET socket on the tap for the test EtherType (created inside the namespace).
pub struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// Opens and binds the socket on `ifname` (call inside the tap's namespace).
    pub fn open(ifname: &str) -> io::Result<PacketSocket> {
        let proto = ETHERTYPE.to_be() as i32;
        // SAFETY: plain socket(2); the result is checked and owned below.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh socket nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let name = std::ffi::CString::new(ifname).map_err(io::Error::other)?;
        // SAFETY: `name` is a NUL-terminated string that lives for the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid starting value.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETHERTYPE.to_be();
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: `addr` is a valid sockaddr_ll of the given size for the call.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // Room for a burst from a guest that transmits at native speed (ring=3); as root.
        let size: libc::c_int = 64 << 20;
        // SAFETY: setsockopt reads one c_int from `size`, which lives for the call.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        Ok(PacketSocket { fd })
    }

    /// The next frame the tap received from the guest (frames the host sent are skipped),
    /// waiting until `deadline`.
    pub fn recv(&self, buf: &mut [u8], deadline: Instant) -> io::Result<Option<usize>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            if rc == 0 {
                continue;
            }
            // SAFETY: sockaddr_ll is plain data.
            let mut from: libc::sockaddr_ll = unsafe { zeroed() };
            let mut from_len = size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: recvfrom writes at most buf.len() bytes into buf and at most from_len
            // bytes into `from`; both live for the call.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    continue;
                }
                return Err(e);
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some(n as usize));
        }
    }

    /// Sends `frame` on the tap (retrying while its queue is full).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: send reads frame.len() bytes from frame, which lives for the call.
            let n =
                unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
            if n == frame.len() as isize {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            // The tap's queue is full (the guest is slow): retry shortly.
            if n < 0 && e.raw_os_error() == Some(libc::ENOBUFS) {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            return Err(if n < 0 {
                e
            } else {
                io::Error::other("short send")
            });
        }
    }
}
