//! The driver guest's test frames on the host side: an AF_PACKET socket on a tap for the test
//! EtherType, the frame format (see `guest/baremetal/src/frames.rs`) and MAC helpers.
//!
//! Frame format: dst, src, EtherType 0x88b5, sequence number (u32 LE), frame length (u16 LE),
//! then byte i = (seq + i) as u8.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The test frames' EtherType (IEEE local experimental 1).
pub const ETHERTYPE: u16 = 0x88b5;
/// Bytes before the pattern.
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

/// The sequence number of a test frame (`None` if it is too short or not one).
pub fn seq_of(frame: &[u8]) -> Option<u32> {
    if frame.len() < HEADER_LEN || frame[12..14] != ETHERTYPE.to_be_bytes() {
        return None;
    }
    Some(u32::from_le_bytes(frame[14..18].try_into().ok()?))
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let bytes: Vec<u8> = s
        .trim()
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).ok())
        .collect::<Option<_>>()?;
    bytes.try_into().ok()
}

/// The MAC of `tap` in `ns`.
pub fn tap_mac(ns: &devices::test_utils::netns::NetNs, tap: &str) -> [u8; 6] {
    let out = ns
        .command("cat")
        .arg(format!("/sys/class/net/{tap}/address"))
        .output()
        .expect("read the tap's MAC");
    parse_mac(&String::from_utf8_lossy(&out.stdout)).expect("tap MAC")
}

/// An AF_PACKET socket on `tap` in `ns`, and the tap's MAC.
pub fn tap_socket(ns: &devices::test_utils::netns::NetNs, tap: &str) -> (PacketSocket, [u8; 6]) {
    let name = tap.to_owned();
    let sock = ns
        .run(move || PacketSocket::open(&name))
        .expect("run in namespace")
        .expect("AF_PACKET socket on the tap");
    (sock, tap_mac(ns, tap))
}

/// The guest's MAC from its `driver-guest: ready … mac=…` line.
pub fn guest_mac(stdout: &str) -> Option<[u8; 6]> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("driver-guest: ready"))?;
    let mac = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mac="))?;
    parse_mac(mac)
}

/// An AF_PACKET socket on the tap for the test EtherType (created inside the namespace).
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

impl PacketSocket {
    pub fn open(ifname: &str) -> io::Result<PacketSocket> {
        let proto = i32::from(ETHERTYPE.to_be());
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
        Ok(PacketSocket {
            fd,
            ifindex: ifindex as i32,
        })
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

    /// Sends `frame` on the tap (retrying while the tap's queue is full).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        self.send_as(frame, ETHERTYPE)
    }

    /// Sends `frame` (its bytes unchanged) with `protocol` as the skb's protocol: what the
    /// host kernel hashes to pick a queue of a multi-queue tap for a frame it cannot dissect
    /// further (tun's automatic steering), so different values may reach different queues.
    pub fn send_as(&self, frame: &[u8], protocol: u16) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid starting value.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = protocol.to_be();
        addr.sll_ifindex = self.ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&frame[..6.min(frame.len())]);
        loop {
            // SAFETY: sendto reads frame.len() bytes from frame and a sockaddr_ll from
            // `addr`; both live for the call.
            let n = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&addr as *const libc::sockaddr_ll).cast(),
                    size_of::<libc::sockaddr_ll>() as u32,
                )
            };
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

/// Collects what the guest sends on a thread of its own: frames until `count` arrived or
/// `within` passed, then (with a nonzero `linger`) more until none came for `linger`, to catch
/// extras such as duplicates.
pub fn collect_frames(
    sock: PacketSocket,
    count: u64,
    within: Duration,
    linger: Duration,
) -> std::thread::JoinHandle<Vec<Vec<u8>>> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + within;
        let mut buf = vec![0u8; 65536];
        let mut frames = Vec::new();
        loop {
            let until = if (frames.len() as u64) < count {
                deadline
            } else if linger.is_zero() {
                break;
            } else {
                Instant::now() + linger
            };
            match sock.recv(&mut buf, until) {
                Ok(Some(len)) => frames.push(buf[..len].to_vec()),
                Ok(None) => break,
                Err(e) => panic!("AF_PACKET recv: {e}"),
            }
        }
        frames
    })
}

/// The host side of the driver guest's `echo=` workload: sends `count` test frames of `size`
/// bytes to `guest_dst` with at most `window` in flight, and checks that each comes back in
/// order and intact, MACs swapped (from `guest_dst` to `tap_mac`). Returns the frames echoed,
/// or what went wrong; gives up `timeout` after it starts.
pub fn echo_in_order(
    sock: &PacketSocket,
    (guest_dst, tap_mac): ([u8; 6], [u8; 6]),
    (count, size): (u64, usize),
    window: u64,
    timeout: Duration,
) -> Result<u64, String> {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65536];
    let (mut sent, mut received) = (0u64, 0u64);
    while received < count {
        while sent < count && sent - received < window {
            sock.send(&frame(guest_dst, tap_mac, sent as u32, size))
                .map_err(|e| format!("send #{sent}: {e}"))?;
            sent += 1;
        }
        let Some(len) = sock.recv(&mut buf, deadline).map_err(|e| e.to_string())? else {
            return Err(format!("no echo after {received} of {count} (sent {sent})"));
        };
        if buf[..len] != frame(tap_mac, guest_dst, received as u32, size)[..] {
            return Err(format!(
                "echo #{received} differs ({len} bytes): {:02x?}",
                &buf[..len.min(32)]
            ));
        }
        received += 1;
    }
    Ok(received)
}
