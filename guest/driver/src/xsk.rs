//! AF_XDP-style transmit: a caller-owned frame area (the umem), a tx ring of [`XdpDesc`] the
//! application produces and the driver consumes, and a completion ring of umem addresses the
//! driver produces once the device has used a frame.
//!
//! **Header placement: headroom.** The umem is divided into chunks of `frame_size` bytes; a
//! descriptor's `addr` points at the frame data *inside* a chunk, at least [`XSK_HEADROOM`]
//! (12) bytes past the chunk start. In zero-copy mode the driver writes the zeroed
//! `virtio_net_hdr_v1` into those 12 bytes just before the frame and posts header + frame as
//! **one** device-readable descriptor — one descriptor per frame (full ring capacity, one iovec
//! per frame on the device side) instead of a 2-descriptor header+frame chain. Use
//! [`Umem::frame_addr`] for the conventional data address of chunk `i`.
//!
//! Ownership follows AF_XDP: a chunk (headroom included) belongs to the driver from the moment
//! its descriptor is submitted on the tx ring until its address comes back on the completion
//! ring; the application must not touch it meanwhile. Invalid descriptors are consumed and
//! counted (`xsk_invalid_descs`), not completed. Completions are produced in the order the
//! device returns the frames.
//!
//! [`XskMode::Copy`] copies each frame into a driver tx buffer instead (for comparison); its
//! completion, too, comes when the device has used the copy, as in Linux's copy mode.
//! `kick_threshold` applies to both modes.

use core::ptr::NonNull;

use crate::error::XskError;
use crate::hal::{Hal, PhysAddr};
use crate::header::VNET_HDR_LEN;
use crate::spsc::{self, Consumer, Producer};

/// Bytes reserved before the frame data in each umem chunk, for the virtio-net header.
pub const XSK_HEADROOM: u64 = VNET_HDR_LEN as u64;

/// A tx descriptor: `len` bytes of frame at umem offset `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpDesc {
    /// Offset of the frame data in the umem.
    pub addr: u64,
    /// Frame length.
    pub len: u32,
}

/// How the driver sends umem frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XskMode {
    /// Post the umem frame itself (header in its headroom).
    #[default]
    ZeroCopy,
    /// Copy each frame into a driver tx buffer.
    Copy,
}

/// Ring sizes and mode of an AF_XDP-style socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XskConfig {
    /// Tx ring slots (a power of two ≥ 2).
    pub tx_ring_size: u32,
    /// Completion ring slots (a power of two ≥ 2). Frames in flight never exceed it.
    pub completion_ring_size: u32,
    /// Zero-copy or copy.
    pub mode: XskMode,
}

impl Default for XskConfig {
    fn default() -> XskConfig {
        XskConfig {
            tx_ring_size: 1024,
            completion_ring_size: 1024,
            mode: XskMode::ZeroCopy,
        }
    }
}

/// A caller-owned, physically contiguous, DMA-able frame area.
///
/// A view, not an owner: `Copy`, and the memory is freed by whoever allocated it (after the
/// driver is dropped or the port detached). Accesses to frame bytes are `unsafe`: they must
/// respect the AF_XDP ownership rule (module docs).
#[derive(Clone, Copy, Debug)]
pub struct Umem {
    vaddr: NonNull<u8>,
    paddr: PhysAddr,
    size: usize,
    frame_size: u32,
}

// SAFETY: a `Umem` is an address range; every access to the bytes is `unsafe` and its contract
// (the ownership rule) excludes concurrent access to the same chunk from two threads.
unsafe impl Send for Umem {}

impl Umem {
    /// Registers `size` bytes at `vaddr`, split into chunks of `frame_size` bytes, translating
    /// the address with `hal`.
    ///
    /// # Safety
    ///
    /// `[vaddr, vaddr + size)` is DMA-able memory, physically contiguous from
    /// `hal.virt_to_phys(vaddr)`, valid for reads and writes until this `Umem`, every copy of
    /// it, and every driver it is attached to are gone; and nothing accesses it except through
    /// this `Umem` (and the device, for posted frames).
    pub unsafe fn new<H: Hal>(
        hal: &H,
        vaddr: NonNull<u8>,
        size: usize,
        frame_size: u32,
    ) -> Result<Umem, XskError> {
        if u64::from(frame_size) <= XSK_HEADROOM || size < frame_size as usize {
            return Err(XskError::UmemGeometry);
        }
        let paddr = hal.virt_to_phys(vaddr).ok_or(XskError::UmemNotDma)?;
        Ok(Umem {
            vaddr,
            paddr,
            size,
            frame_size,
        })
    }

    /// Bytes in the umem.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes per chunk.
    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }

    /// Whole chunks in the umem.
    pub fn frame_count(&self) -> u32 {
        u32::try_from(self.size / self.frame_size as usize).unwrap_or(u32::MAX)
    }

    /// The device address of the umem's first byte.
    pub fn paddr(&self) -> PhysAddr {
        self.paddr
    }

    /// The data address of chunk `frame` (its start plus [`XSK_HEADROOM`]).
    pub fn frame_addr(&self, frame: u32) -> Option<u64> {
        (frame < self.frame_count())
            .then(|| u64::from(frame) * u64::from(self.frame_size) + XSK_HEADROOM)
    }

    /// A pointer to `len` bytes at `addr`, if they lie in the umem.
    pub(crate) fn range(&self, addr: u64, len: usize) -> Result<*mut u8, XskError> {
        let start = usize::try_from(addr).map_err(|_| XskError::OutOfBounds)?;
        match start.checked_add(len) {
            Some(end) if end <= self.size => {
                // SAFETY: `start` ≤ `size`: inside the umem (constructor contract).
                Ok(unsafe { self.vaddr.as_ptr().add(start) })
            }
            _ => Err(XskError::OutOfBounds),
        }
    }

    /// Copies `data` into the umem at `addr`.
    ///
    /// # Safety
    ///
    /// The caller owns the chunk(s) written (not submitted on the tx ring since their last
    /// completion), and no reference to those bytes is live.
    pub unsafe fn write(&self, addr: u64, data: &[u8]) -> Result<(), XskError> {
        let dst = self.range(addr, data.len())?;
        // SAFETY: `dst` is valid for `data.len()` bytes (checked), caller-owned and unaliased by
        // this function's contract, so it cannot overlap the borrowed `data`.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes at `addr` out of the umem.
    ///
    /// # Safety
    ///
    /// As [`Self::write`], for the bytes read.
    pub unsafe fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), XskError> {
        let src = self.range(addr, out.len())?;
        // SAFETY: as in `write`, in the other direction.
        unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The `len` bytes at `addr`, to fill a frame in place.
    ///
    /// # Safety
    ///
    /// As [`Self::write`], for as long as the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn frame_mut(&self, addr: u64, len: usize) -> Result<&mut [u8], XskError> {
        let p = self.range(addr, len)?;
        // SAFETY: valid for `len` bytes (checked), exclusively the caller's (contract).
        Ok(unsafe { core::slice::from_raw_parts_mut(p, len) })
    }

    /// Checks a tx descriptor: 1..=`max_len` bytes, inside one chunk, at least `headroom`
    /// bytes past the chunk start.
    pub(crate) fn check_tx(&self, desc: XdpDesc, headroom: u64, max_len: usize) -> bool {
        let frame_size = u64::from(self.frame_size);
        let offset = desc.addr % frame_size;
        let len = u64::from(desc.len);
        let chunks_end = u64::from(self.frame_count()) * frame_size;
        len > 0
            && len <= max_len as u64
            && offset >= headroom
            && offset + len <= frame_size
            && desc
                .addr
                .checked_add(len)
                .is_some_and(|end| end <= chunks_end)
    }
}

/// The application's half of an AF_XDP-style socket.
pub struct XskSocket {
    /// The frame area (shared with the driver's half).
    pub umem: Umem,
    /// Where the application submits frames to send.
    pub tx: Producer<XdpDesc>,
    /// Where the driver returns the addresses of sent frames.
    pub completion: Consumer<u64>,
}

impl XskSocket {
    /// Pushes as many of `descs` as fit on the tx ring and submits them; returns how many.
    pub fn submit_tx(&mut self, descs: &[XdpDesc]) -> usize {
        let n = descs
            .iter()
            .take_while(|&&desc| self.tx.push(desc).is_ok())
            .count();
        self.tx.submit();
        n
    }
}

/// The driver's half of an AF_XDP-style socket; attach it with [`VirtioNet::attach_xsk`].
///
/// [`VirtioNet::attach_xsk`]: crate::VirtioNet::attach_xsk
pub struct XskPort {
    pub(crate) umem: Umem,
    pub(crate) mode: XskMode,
    pub(crate) tx: Consumer<XdpDesc>,
    pub(crate) completion: Producer<u64>,
    /// Frames posted to the device and not completed yet.
    pub(crate) in_flight: u32,
}

impl XskPort {
    /// Frames posted to the device and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Queues the completion of the frame at `addr` (space was reserved when it was posted).
    pub(crate) fn complete(&mut self, addr: u64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        // Cannot fail: a frame is posted only while the ring has room for all in flight.
        let _ = self.completion.push(addr);
    }

    /// Makes the queued completions visible to the application.
    pub(crate) fn submit_completions(&mut self) {
        self.completion.submit();
    }
}

/// Creates an AF_XDP-style socket over `umem`: the application's half and the driver's half.
pub fn socket(umem: Umem, config: XskConfig) -> Result<(XskSocket, XskPort), XskError> {
    let (tx_producer, tx_consumer) =
        spsc::ring(config.tx_ring_size).ok_or(XskError::RingSize(config.tx_ring_size))?;
    let (completion_producer, completion_consumer) = spsc::ring(config.completion_ring_size)
        .ok_or(XskError::RingSize(config.completion_ring_size))?;
    Ok((
        XskSocket {
            umem,
            tx: tx_producer,
            completion: completion_consumer,
        },
        XskPort {
            umem,
            mode: config.mode,
            tx: tx_consumer,
            completion: completion_producer,
            in_flight: 0,
        },
    ))
}
