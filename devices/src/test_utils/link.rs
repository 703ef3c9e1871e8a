//! Interface helpers for tests and benches: `ifreq`s, link state, and packet sockets to send
//! and receive frames on an interface (a tap's host side). Call them inside the namespace the
//! interface lives in.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An all-zero `ifreq` carrying `name` (at most 15 bytes, no NUL).
pub fn ifreq_for(name: &str) -> libc::ifreq {
    crate::backend::tap::ifreq_for(name)
}

/// The index of interface `name` in the calling thread's namespace.
pub fn ifindex(name: &str) -> io::Result<libc::c_uint> {
    let cname = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(index)
}

/// Sets IFF_UP on `name`.
pub fn link_up(name: &str) -> io::Result<()> {
    set_link(name, true)
}

/// Sets or clears IFF_UP on `name`.
pub fn set_link(name: &str, up: bool) -> io::Result<()> {
    // SAFETY: plain socket creation; the result is checked before use.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `sock` was just opened and is owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let mut req = ifreq_for(name);
    // SAFETY: `req` is a valid ifreq living across the call; SIOCGIFFLAGS fills its flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union's flags member was just written by the kernel (and every bit pattern
    // is a valid i16).
    unsafe {
        if up {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as i16;
        } else {
            req.ifr_ifru.ifru_flags &= !(libc::IFF_UP as i16);
        }
    }
    // SAFETY: `req` is a valid ifreq living across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An AF_PACKET socket bound to one interface and EtherType: what it sends goes out of the
/// interface, what the interface carries of that EtherType it receives.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    addr: libc::sockaddr_ll,
}

impl PacketSocket {
    /// Opens a packet socket for `ethertype` (host order; `libc::ETH_P_ALL` for every frame)
    /// and binds it to interface `name`.
    pub fn open(name: &str, ethertype: u16) -> io::Result<PacketSocket> {
        let index = ifindex(name)?;
        let proto = ethertype.to_be();
        // SAFETY: plain socket creation; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = index as i32;
        addr.sll_halen = 6;
        // SAFETY: `addr` is a valid sockaddr_ll living across the call and its size is passed.
        let ret = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(PacketSocket { fd, addr })
    }

    /// Stops delivering the frames this host sends out of the interface back to the socket
    /// (`PACKET_IGNORE_OUTGOING`, Linux 4.20): a peer that only wants what comes back does
    /// half the receives.
    pub fn ignore_outgoing(&self) -> io::Result<()> {
        self.set_flag(libc::PACKET_IGNORE_OUTGOING)
    }

    /// Sends straight to the interface's driver, past the qdisc (`PACKET_QDISC_BYPASS`): what a
    /// batched injector wants.
    pub fn bypass_qdisc(&self) -> io::Result<()> {
        self.set_flag(libc::PACKET_QDISC_BYPASS)
    }

    /// Turns on the `SOL_PACKET` option `option` (an int flag).
    fn set_flag(&self, option: libc::c_int) -> io::Result<()> {
        let on: libc::c_int = 1;
        // SAFETY: `on` is a c_int living across the call and its size is passed.
        let ret = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                option,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `frame` (Ethernet header included) out of the interface; returns the bytes sent.
    pub fn send(&self, frame: &[u8]) -> io::Result<usize> {
        // SAFETY: `frame` and `addr` are valid for the call and their sizes are passed;
        // sendto only reads them.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&self.addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<PacketSocket> for OwnedFd {
    fn from(sock: PacketSocket) -> OwnedFd {
        sock.fd
    }
}
