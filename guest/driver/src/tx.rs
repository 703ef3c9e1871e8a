//! Transmit: copy transmit into driver-owned buffers, kick batching (`kick_threshold`), and tx
//! reclaim for every kind of tx chain (copy, XDP_TX, AF_XDP zero-copy and copy).
//!
//! Every transmit path adds chains unpublished and counts them; after `kick_threshold` frames
//! it publishes `avail.idx` and makes one kick decision, and it does the same once at the end of
//! its batch ([`VirtioNet::flush_tx`]). The kick decision skips the notification when the device
//! said it needs none (EVENT_IDX `avail_event`, or NO_NOTIFY) and counts that.
//!
//! [`VirtioNet::flush_tx`]: crate::VirtioNet::flush_tx

use alloc::vec::Vec;

use crate::error::TxError;
use crate::hal::{DmaRegion, Hal, PhysAddr};
use crate::header::VNET_HDR_LEN;
use crate::ring::{Access, Buffer};

/// What a tx chain carries, to be released when the device returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxToken {
    /// A driver tx buffer (copy transmit).
    Copy(u16),
    /// An XDP_TX frame sent from its rx buffers (first buffer of the frame).
    XdpTx(u32),
    /// An AF_XDP frame sent from the umem in place (its descriptor address).
    Umem(u64),
    /// An AF_XDP frame copied into a driver tx buffer (copy mode).
    UmemCopy {
        /// The driver buffer.
        buf: u16,
        /// The umem descriptor address to complete.
        addr: u64,
    },
}

/// A cache line of the CPUs this driver is tuned for.
const CACHE_LINE: usize = 64;

/// Where the header sits in a tx buffer's slot: the frame after it starts on a cache line, and
/// the header shares its line with nothing that is ever written. The header is zero for every
/// frame copy transmit sends, so once written it stays: the frame's lines are then the only
/// ones the driver dirties per frame and the device (on another CPU) has to fetch from it,
/// one line instead of two for a 64-byte frame.
const HDR_OFFSET: usize = CACHE_LINE - VNET_HDR_LEN;

/// The driver-owned tx buffers (copy transmit), one per tx descriptor, each in a slot of
/// [`TxPool::stride`] bytes: [`HDR_OFFSET`] unused bytes, the header, the frame.
pub(crate) struct TxPool {
    region: DmaRegion,
    buf_size: u32,
    free: Vec<u16>,
}

impl TxPool {
    pub(crate) fn new(region: DmaRegion, buf_size: u32, count: u16) -> TxPool {
        TxPool {
            region,
            buf_size,
            free: (0..count).rev().collect(),
        }
    }

    /// Bytes of DMA memory `count` buffers of `buf_size` bytes (header included) take.
    pub(crate) fn region_len(buf_size: u32, count: u16) -> usize {
        usize::from(count) * Self::stride(buf_size)
    }

    /// A buffer's slot: the header's offset and the buffer, rounded up to whole cache lines.
    fn stride(buf_size: u32) -> usize {
        (HDR_OFFSET + buf_size as usize).next_multiple_of(CACHE_LINE)
    }

    /// The largest frame a buffer holds.
    pub(crate) fn max_frame(&self) -> usize {
        self.buf_size as usize - VNET_HDR_LEN
    }

    /// Where `buf`'s header starts in the region.
    fn offset(&self, buf: u16) -> usize {
        usize::from(buf) * Self::stride(self.buf_size) + HDR_OFFSET
    }

    pub(crate) fn take(&mut self) -> Option<u16> {
        self.free.pop()
    }

    pub(crate) fn give_back(&mut self, buf: u16) {
        self.free.push(buf);
    }

    /// Makes `buf`'s header zero (writing it only if it is not: see [`HDR_OFFSET`]) and copies
    /// `len` bytes from `src` after it. Returns the chain buffer for it, or `None` if the frame
    /// does not fit.
    ///
    /// # Safety
    ///
    /// `buf` was taken with [`Self::take`] and not given back; `src` is valid for reads of
    /// `len` bytes, does not overlap the tx buffers, and is not written meanwhile.
    pub(crate) unsafe fn fill(&mut self, buf: u16, src: *const u8, len: usize) -> Option<Buffer> {
        if len > self.max_frame() {
            return None;
        }
        let p = self.region.ptr_at(self.offset(buf), VNET_HDR_LEN + len)?;
        // SAFETY: `p` is valid for header + `len` bytes (checked by `ptr_at`), and the buffer is
        // not posted (taken from the free stack), so the device does not read it now; `src` is
        // valid and disjoint by this function's contract.
        unsafe {
            if p.cast::<[u8; VNET_HDR_LEN]>().read() != [0; VNET_HDR_LEN] {
                p.write_bytes(0, VNET_HDR_LEN);
            }
            core::ptr::copy_nonoverlapping(src, p.add(VNET_HDR_LEN), len);
        }
        Some(Buffer {
            addr: self.addr(buf),
            len: (VNET_HDR_LEN + len) as u32,
            access: Access::DeviceReads,
        })
    }

    fn addr(&self, buf: u16) -> PhysAddr {
        self.region.paddr() + self.offset(buf) as u64
    }

    /// # Safety
    ///
    /// As [`DmaRegion::dealloc`].
    pub(crate) unsafe fn dealloc<H: Hal>(&self, hal: &H) {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.region.dealloc(hal) };
    }
}

/// The outcome of [`VirtioNet::transmit_batch`].
///
/// [`VirtioNet::transmit_batch`]: crate::VirtioNet::transmit_batch
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxBatch {
    /// Frames queued (a prefix of the batch).
    pub sent: usize,
    /// Why the batch stopped early, if it did.
    pub stopped: Option<TxError>,
}
