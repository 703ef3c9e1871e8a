//! A Linux tap interface opened with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, non-blocking.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use log::{debug, info, warn};

use super::{
    iov_count, retrying, BatchRing, LinkWatch, NetBackend, Offloads, MAX_TX_BATCH, MIN_RING_BATCH,
};
use crate::iovec::{IovecList, Iovecs};

/// Longest interface name Linux accepts (`IFNAMSIZ` - 1 for the NUL).
pub const MAX_IFNAME_LEN: usize = libc::IFNAMSIZ - 1;

/// Errors opening or configuring a tap.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The interface name is not one Linux accepts.
    #[error("invalid tap name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// `/dev/net/tun` could not be opened.
    #[error("failed to open /dev/net/tun")]
    OpenTun(#[source] io::Error),
    /// `TUNSETIFF` failed (the name belongs to a non-tap interface, or no permission).
    #[error("TUNSETIFF failed for {name:?}")]
    SetIff {
        /// The tap name.
        name: String,
        /// The ioctl's error.
        #[source]
        source: io::Error,
    },
    /// `TUNSETOFFLOAD` failed even with no offload.
    #[error("TUNSETOFFLOAD failed for {name:?}")]
    SetOffload {
        /// The tap name.
        name: String,
        /// The ioctl's error.
        #[source]
        source: io::Error,
    },
    /// A tap that exists without `multi_queue` cannot be opened with several queues.
    #[error(
        "tap {name:?} exists but is not a multi-queue tap, so it cannot be opened with \
         queues={queues}; delete it, or recreate it with `ip tuntap add dev {name} mode tap \
         multi_queue` (or let the VMM create it)"
    )]
    NotMultiQueue {
        /// The tap name.
        name: String,
        /// The queues asked for.
        queues: usize,
    },
    /// `TUNSETQUEUE` failed (attaching or detaching a queue of a multi-queue tap).
    #[error("TUNSETQUEUE failed for {name:?}")]
    SetQueue {
        /// The tap name.
        name: String,
        /// The ioctl's error.
        #[source]
        source: io::Error,
    },
    /// `TUNSETVNETHDRSZ` failed.
    #[error("TUNSETVNETHDRSZ failed for {name:?}")]
    SetVnetHdrSize {
        /// The tap name.
        name: String,
        /// The ioctl's error.
        #[source]
        source: io::Error,
    },
}

/// Checks `name` against the kernel's `dev_valid_name` rules, and refuses `%` templates.
/// On error, says why.
pub fn validate_ifname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("empty")
    } else if name.len() > MAX_IFNAME_LEN {
        Err("longer than 15 bytes")
    } else if name == "." || name == ".." {
        Err("reserved name")
    } else if name
        .bytes()
        .any(|b| b == b'/' || b == b':' || b == b'%' || b.is_ascii_whitespace() || b < 0x20)
    {
        Err("contains '/', ':', '%', whitespace or a control character")
    } else {
        Ok(())
    }
}

/// An open tap interface. Closing it (drop) deletes a non-persistent tap.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
    supported: Offloads,
    read_iovecs: IovecScratch,
    guard: [u8; 1],
    /// The interface's link notifications (absent if they could not be subscribed to, and on
    /// the queues of a multi-queue tap but the first).
    link: Option<LinkWatch>,
    /// One queue of a multi-queue tap: `Some(attached)` (see [`NetBackend::set_queue_enabled`]).
    queue: Option<bool>,
    /// Batched transmit ([`BatchRing`]), where io_uring is available and not turned off.
    tx_ring: Option<Box<BatchRing>>,
}

/// Room to append the guard byte to the caller's iovecs without allocating per frame.
///
/// A tap's `readv` returns the *truncated* length when a frame does not fit, which cannot be
/// told apart from a frame that exactly fills the buffers. One extra iovec of one byte after
/// the caller's makes it exact: a result above the caller's capacity means "did not fit".
#[derive(Debug, Default)]
struct IovecScratch(Vec<libc::iovec>);

// SAFETY: the vector is emptied before `read_frame` returns, so it never holds a pointer
// between calls, let alone across threads; only its allocation moves with the Tap.
unsafe impl Send for IovecScratch {}

impl Tap {
    /// Turns batched transmit through io_uring ([`BatchRing`]) on or off; on by default where
    /// the kernel allows it. Returns whether it is on. Off, every frame is one `writev`.
    pub fn set_tx_batching(&mut self, on: bool) -> bool {
        if !on {
            self.tx_ring = None;
        } else if self.tx_ring.is_none() {
            match BatchRing::new(self.file.as_raw_fd()) {
                Ok(ring) => self.tx_ring = Some(Box::new(ring)),
                Err(e) => info!(
                    "tap {}: io_uring unavailable ({e}); one writev per transmitted frame",
                    self.name
                ),
            }
        }
        self.tx_ring.is_some()
    }

    /// Opens the tap `name`, creating it if no interface has that name (logs which).
    ///
    /// The fd is non-blocking, the vnet header size is set to 12 and receive offloads are off
    /// until [`NetBackend::set_offloads`]; which offloads the kernel accepts is probed here.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        Tap::open_with(name, false)
    }

    /// Opens `queues` queues of the tap `name` (creating it if no interface has that name):
    /// one [`Tap`] (fd) per queue pair of a multiqueue device. With one queue this is
    /// [`Tap::open`]; with more the tap is opened `IFF_MULTI_QUEUE` on each fd, and a tap that
    /// exists without `multi_queue` is refused ([`TapError::NotMultiQueue`]). Every queue but
    /// the first starts detached (`TUNSETQUEUE`): the kernel steers no frame to it until its
    /// worker enables it. Only the first follows the link.
    pub fn open_queues(name: &str, queues: usize) -> Result<Vec<Tap>, TapError> {
        if queues <= 1 {
            return Ok(vec![Tap::open(name)?]);
        }
        let mut taps = Vec::with_capacity(queues);
        for i in 0..queues {
            let mut tap = Tap::open_with(name, true).map_err(|e| match e {
                TapError::SetIff { source, .. }
                    if source.raw_os_error() == Some(libc::EINVAL) && i == 0 =>
                {
                    TapError::NotMultiQueue {
                        name: name.to_owned(),
                        queues,
                    }
                }
                other => other,
            })?;
            if i > 0 {
                tap.link = None;
                tap.set_queue_enabled(false)
                    .map_err(|source| TapError::SetQueue {
                        name: name.to_owned(),
                        source,
                    })?;
            }
            taps.push(tap);
        }
        Ok(taps)
    }

    fn open_with(name: &str, multi_queue: bool) -> Result<Tap, TapError> {
        validate_ifname(name).map_err(|reason| TapError::InvalidName {
            name: name.to_owned(),
            reason,
        })?;
        let existed = interface_exists(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;

        let mut req = ifreq_for(name);
        // `IFF_*` values fit in the c_short flags field.
        let mut flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
        if multi_queue {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        req.ifr_ifru.ifru_flags = flags as i16;
        // SAFETY: `req` is a valid, NUL-terminated ifreq that outlives the call; TUNSETIFF reads
        // it and writes back the interface name, both within the struct.
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if ret < 0 {
            return Err(TapError::SetIff {
                name: name.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        match (existed, multi_queue) {
            (true, false) => info!("opened existing tap {name}"),
            (false, false) => info!("created tap {name}"),
            (true, true) => debug!("opened a queue of multi-queue tap {name}"),
            (false, true) => info!("created multi-queue tap {name}"),
        }

        let mut tap = Tap {
            file,
            name: name.to_owned(),
            supported: Offloads::NONE,
            read_iovecs: IovecScratch::default(),
            guard: [0],
            link: link_watch(name),
            queue: multi_queue.then_some(true),
            tx_ring: None,
        };
        tap.set_tx_batching(true);
        tap.supported = tap.probe_offloads();
        tap.set_offloads(Offloads::NONE)
            .map_err(|source| TapError::SetOffload {
                name: name.to_owned(),
                source,
            })?;
        tap.set_vnet_hdr_size(crate::virtio::net::VNET_HDR_LEN as u32)
            .map_err(|source| TapError::SetVnetHdrSize {
                name: name.to_owned(),
                source,
            })?;
        Ok(tap)
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Finds which offload combinations `TUNSETOFFLOAD` accepts on this kernel.
    fn probe_offloads(&mut self) -> Offloads {
        let mut supported = Offloads::NONE;
        if self.set_offloads(Offloads::CSUM).is_ok() {
            supported = Offloads::CSUM;
            let tso = Offloads::CSUM | Offloads::TSO4 | Offloads::TSO6;
            if self.set_offloads(tso).is_ok() {
                supported = supported | tso;
            }
            let ufo = Offloads::CSUM | Offloads::UFO;
            if self.set_offloads(ufo).is_ok() {
                supported = supported | ufo;
            }
        }
        supported
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for Tap {
    fn read_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        let scratch = &mut self.read_iovecs.0;
        // Buffers that follow each other in memory (a guest's mergeable rx buffers are carved
        // from larger pages one after the other) go to the kernel as one entry: less to import.
        for iov in iovs.as_raw() {
            match scratch.last_mut() {
                Some(last)
                    if last.iov_base.cast::<u8>().wrapping_add(last.iov_len)
                        == iov.iov_base.cast() =>
                {
                    last.iov_len += iov.iov_len;
                }
                _ => scratch.push(*iov),
            }
        }
        scratch.push(libc::iovec {
            iov_base: self.guard.as_mut_ptr().cast(),
            iov_len: 1,
        });
        let count = libc::c_int::try_from(scratch.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: the caller's iovecs point to memory valid for writes while `iovs` is
        // borrowed (IovecList invariant, at most UIO_MAXIOV - 1 of them), the last one to
        // `self.guard`, borrowed here; readv keeps no pointer after returning.
        let result =
            retrying(|| unsafe { libc::readv(self.file.as_raw_fd(), scratch.as_ptr(), count) });
        scratch.clear();
        result
    }

    fn write_frame(&mut self, iovs: Iovecs<'_>) -> io::Result<usize> {
        let fd = self.file.as_raw_fd();
        match iovs.as_raw() {
            // One segment (header and frame in one buffer, the common small frame): `write`,
            // which spares the kernel importing an iovec array.
            [one] => retrying(|| {
                // SAFETY: the iovec points to memory valid for reads while `iovs` is borrowed
                // (IovecList invariant, bounds-checked against guest memory) and write keeps
                // no pointer after returning.
                unsafe { libc::write(fd, one.iov_base, one.iov_len) }
            }),
            raw => retrying(|| {
                // SAFETY: as above, for every iovec; writev keeps no pointer after returning.
                unsafe { libc::writev(fd, raw.as_ptr(), iov_count(&iovs)) }
            }),
        }
    }

    fn tx_batch(&self) -> usize {
        if self.tx_ring.is_some() {
            MAX_TX_BATCH
        } else {
            1
        }
    }

    fn tx_batch_min(&self) -> usize {
        // Below this a ring submission costs more than the writevs it replaces.
        MIN_RING_BATCH
    }

    fn write_frames(
        &mut self,
        frames: &IovecList<'_>,
        ends: &[usize],
        results: &mut [io::Result<usize>],
    ) {
        let unsupported = |r: &io::Result<usize>| {
            r.as_ref()
                .is_err_and(|e| e.raw_os_error() == Some(libc::EOPNOTSUPP))
        };
        let mut retry_all = true;
        if let Some(ring) = self
            .tx_ring
            .as_mut()
            .filter(|_| ends.len() >= MIN_RING_BATCH)
        {
            // SAFETY: every iovec of `frames` points to memory valid for reads while `frames`
            // is borrowed (IovecList invariant, bounds-checked against guest memory), which
            // covers the whole call.
            match unsafe { ring.write(frames.as_iovecs().as_raw(), ends, results) } {
                Ok(()) if !results[..ends.len()].iter().any(unsupported) => return,
                Ok(()) => {
                    // The tap refuses RWF_NOWAIT (an older kernel): those frames were not
                    // written; write them as before.
                    info!(
                        "tap {}: no non-blocking io_uring writes; one writev per frame",
                        self.name
                    );
                    retry_all = false;
                }
                Err(e) => warn!(
                    "tap {}: io_uring failed ({e}); one writev per frame from now on",
                    self.name
                ),
            }
            self.tx_ring = None;
        }
        let mut start = 0;
        for (&end, result) in ends.iter().zip(results.iter_mut()) {
            if retry_all || unsupported(result) {
                *result = self.write_frame(frames.range(start, end));
            }
            start = end;
        }
    }

    fn supported_offloads(&self) -> Offloads {
        self.supported
    }

    fn link_fd(&self) -> Option<RawFd> {
        self.link.as_ref().map(AsRawFd::as_raw_fd)
    }

    fn poll_link(&mut self) -> Option<bool> {
        self.link.as_mut()?.poll()
    }

    fn set_offloads(&mut self, offloads: Offloads) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value and touches no user memory.
        let ret = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(offloads.bits()),
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn set_queue_enabled(&mut self, enabled: bool) -> io::Result<()> {
        // Single-queue taps have nothing to attach; an unchanged state would get EINVAL.
        if self.queue.is_none_or(|attached| attached == enabled) {
            return Ok(());
        }
        let mut req = ifreq_for("");
        let flags = if enabled {
            libc::IFF_ATTACH_QUEUE
        } else {
            libc::IFF_DETACH_QUEUE
        };
        // `IFF_*` values fit in the c_short flags field.
        req.ifr_ifru.ifru_flags = flags as i16;
        // SAFETY: `req` is a valid ifreq living on this stack frame for the whole call;
        // TUNSETQUEUE only reads its flags.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETQUEUE, &mut req) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        self.queue = Some(enabled);
        Ok(())
    }

    fn set_vnet_hdr_size(&mut self, size: u32) -> io::Result<()> {
        let size = libc::c_int::try_from(size)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: TUNSETVNETHDRSZ reads one c_int through the pointer, which points to `size`
        // living on this stack frame for the whole call.
        let ret = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETVNETHDRSZ,
                &size as *const libc::c_int,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// An all-zero `ifreq` carrying `name` (already validated: ≤ 15 bytes, no NUL).
pub(crate) fn ifreq_for(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data (a name array and a union of integers and pointers) for
    // which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

/// Subscribes to `name`'s link notifications (logged and skipped if that fails).
fn link_watch(name: &str) -> Option<LinkWatch> {
    let cname = CString::new(name).ok()?;
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the call.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    match LinkWatch::new(ifindex) {
        Ok(watch) => Some(watch),
        Err(e) => {
            warn!("tap {name}: cannot follow its link state: {e}");
            None
        }
    }
}

/// True if an interface named `name` exists in the calling thread's network namespace.
fn interface_exists(name: &str) -> bool {
    let Ok(cname) = CString::new(name) else {
        return false;
    };
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::if_nametoindex(cname.as_ptr()) != 0 }
}

#[cfg(test)]
mod tests;
