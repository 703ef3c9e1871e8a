//! Following a network interface's link state through rtnetlink (`RTMGRP_LINK`).
//!
//! The socket is opened when the backend is (before any seccomp filter) and polled by the
//! device worker through epoll; reading it needs only `read`. A link is up while the interface
//! is administratively up (`IFF_UP`; a tap's carrier is on while we hold it open, and bringing
//! it up reports `IFF_UP` before `IFF_RUNNING`, which would flap the guest's link); a deleted
//! interface is down for good.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `sizeof(struct nlmsghdr)`.
const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct ifinfomsg)`.
const IFINFOMSG_LEN: usize = 16;

/// Link-state notifications for one interface.
#[derive(Debug)]
pub struct LinkWatch {
    sock: OwnedFd,
    ifindex: i32,
    buf: Vec<u8>,
}

impl LinkWatch {
    /// Subscribes to link notifications and keeps those of interface `ifindex`.
    pub fn new(ifindex: u32) -> io::Result<LinkWatch> {
        // SAFETY: plain socket creation; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain old data; all-zero is valid.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: `addr` is a valid sockaddr_nl and its size is passed.
        let ret = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LinkWatch {
            sock,
            ifindex: ifindex as i32,
            buf: vec![0; 16384],
        })
    }

    /// Reads every pending notification; returns the interface's latest state among them
    /// (true: up), or `None` if none concerned it.
    pub fn poll(&mut self) -> Option<bool> {
        let mut state = None;
        loop {
            // SAFETY: `buf` is valid for writes of its length and outlives the call.
            let n = unsafe {
                libc::read(
                    self.sock.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                )
            };
            let Ok(n) = usize::try_from(n) else {
                // EAGAIN: drained. ENOBUFS (the kernel dropped notifications): the next one
                // still tells the current state.
                return state;
            };
            if n == 0 {
                return state;
            }
            if let Some(s) = parse_link_messages(&self.buf[..n], self.ifindex) {
                state = Some(s);
            }
        }
    }
}

impl AsRawFd for LinkWatch {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// The last state of interface `ifindex` in a buffer of netlink messages, if any concerns it.
/// Malformed or truncated messages end the walk.
pub(crate) fn parse_link_messages(mut buf: &[u8], ifindex: i32) -> Option<bool> {
    let mut state = None;
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().ok()?);
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        let body = &buf[NLMSG_HDRLEN..len];
        if (kind == libc::RTM_NEWLINK || kind == libc::RTM_DELLINK) && body.len() >= IFINFOMSG_LEN {
            let index = i32::from_ne_bytes(body[4..8].try_into().ok()?);
            let flags = u32::from_ne_bytes(body[8..12].try_into().ok()?);
            if index == ifindex {
                state = Some(kind == libc::RTM_NEWLINK && flags & libc::IFF_UP as u32 != 0);
            }
        }
        // Messages are 4-byte aligned.
        let advance = (len + 3) & !3;
        if advance >= buf.len() {
            break;
        }
        buf = &buf[advance..];
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, index: i32, flags: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&32u32.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[0, 0, 0, 0]); // family, pad, type
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m
    }

    #[test]
    fn the_last_message_about_our_interface_wins() {
        let up = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
        let mut buf = message(libc::RTM_NEWLINK, 7, up);
        buf.extend(message(libc::RTM_NEWLINK, 8, 0)); // another interface
        assert_eq!(parse_link_messages(&buf, 7), Some(true));
        buf.extend(message(libc::RTM_NEWLINK, 7, libc::IFF_RUNNING as u32)); // admin down
        assert_eq!(parse_link_messages(&buf, 7), Some(false));
        buf.extend(message(libc::RTM_NEWLINK, 7, libc::IFF_UP as u32)); // up, carrier coming
        assert_eq!(parse_link_messages(&buf, 7), Some(true));
        buf.extend(message(libc::RTM_DELLINK, 7, up));
        assert_eq!(parse_link_messages(&buf, 7), Some(false));
        assert_eq!(parse_link_messages(&buf, 9), None);
    }

    #[test]
    fn malformed_messages_end_the_walk_without_panicking() {
        let good = message(
            libc::RTM_NEWLINK,
            7,
            (libc::IFF_UP | libc::IFF_RUNNING) as u32,
        );
        for cut in 0..good.len() {
            let _ = parse_link_messages(&good[..cut], 7);
        }
        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&4u32.to_ne_bytes()); // shorter than a header
        assert_eq!(parse_link_messages(&bad, 7), None);
        bad[0..4].copy_from_slice(&u32::MAX.to_ne_bytes()); // longer than the buffer
        assert_eq!(parse_link_messages(&bad, 7), None);
    }
}
