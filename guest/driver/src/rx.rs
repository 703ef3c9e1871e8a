//! Receive: the rx buffer pool, rx buffer posting, mergeable-buffer reassembly and the rx poll
//! with its XDP-style program.
//!
//! Each rx buffer is one device-writable descriptor of `rx_buf_size` bytes in one DMA region.
//! The pool holds more buffers than the rx ring (rx ring + tx ring + XDP bulk queue), so the rx
//! ring stays full while buffers are lent to the tx ring for zero-copy XDP_TX.
//!
//! With MRG_RXBUF a frame spans `num_buffers` buffers (from the first buffer's header); the
//! device may publish them one at a time, so an incomplete frame is kept across polls. The
//! program sees a frame as one slice: a single-buffer frame in place, a multi-buffer frame as
//! a copy (written back before an XDP_TX, since the tx chain is made of the original buffers).

use alloc::vec::Vec;

use crate::hal::{DmaRegion, Hal, PhysAddr};

/// End of a buffer list.
pub(crate) const NO_LINK: u32 = u32::MAX;

/// The rx buffers and what the driver knows about each.
pub(crate) struct RxPool {
    region: DmaRegion,
    pub(crate) buf_size: u32,
    pub(crate) count: u32,
    /// Buffers owned by the driver and not lent out (a stack).
    pub(crate) free: Vec<u32>,
    /// The next buffer of the same frame, or [`NO_LINK`].
    pub(crate) link: Vec<u32>,
    /// Bytes the device wrote into each buffer (header included for a first buffer).
    pub(crate) len: Vec<u32>,
}

impl RxPool {
    /// `count` buffers of `buf_size` bytes in `region` (at least `count * buf_size` long).
    pub(crate) fn new(region: DmaRegion, buf_size: u32, count: u32) -> RxPool {
        RxPool {
            region,
            buf_size,
            count,
            free: (0..count).rev().collect(),
            link: alloc::vec![NO_LINK; count as usize],
            len: alloc::vec![0; count as usize],
        }
    }

    fn offset(&self, buf: u32) -> usize {
        buf as usize * self.buf_size as usize
    }

    pub(crate) fn addr(&self, buf: u32) -> PhysAddr {
        self.region.paddr() + self.offset(buf) as u64
    }

    /// Bytes `[start, end)` of buffer `buf`, mutably.
    ///
    /// # Safety
    ///
    /// `buf` is owned by the driver (returned by the device and not posted or lent again), and
    /// no other reference to its bytes is live.
    pub(crate) unsafe fn bytes_mut(&mut self, buf: u32, start: usize, end: usize) -> &mut [u8] {
        debug_assert!(start <= end && end <= self.buf_size as usize && buf < self.count);
        match self.region.ptr_at(self.offset(buf) + start, end - start) {
            // SAFETY: inside the region (checked by `ptr_at`); exclusively the driver's by this
            // function's contract; `&mut self` keeps other pool borrows out.
            Some(p) => unsafe { core::slice::from_raw_parts_mut(p, end - start) },
            None => &mut [],
        }
    }

    /// Returns every buffer of the frame starting at `first` to the free stack.
    pub(crate) fn recycle(&mut self, first: u32) {
        let mut buf = first;
        // Bounded: a list never holds more buffers than exist.
        for _ in 0..self.count {
            if buf == NO_LINK {
                break;
            }
            self.free.push(buf);
            buf = core::mem::replace(&mut self.link[buf as usize], NO_LINK);
        }
    }

    /// The buffers of the frame starting at `first`, in order.
    pub(crate) fn frame(&self, first: u32) -> impl Iterator<Item = u32> + '_ {
        let mut buf = first;
        (0..self.count).map_while(move |_| {
            let current = buf;
            if current == NO_LINK {
                return None;
            }
            buf = self.link[current as usize];
            Some(current)
        })
    }

    /// Buffers neither posted nor lent.
    #[cfg(test)]
    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Bytes the device wrote into `buf`.
    pub(crate) fn used_len(&self, buf: u32) -> u32 {
        self.len[buf as usize]
    }

    /// # Safety
    ///
    /// As [`DmaRegion::dealloc`].
    pub(crate) unsafe fn dealloc<H: Hal>(&self, hal: &H) {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.region.dealloc(hal) };
    }
}

/// A mergeable frame still missing buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RxAssembly {
    pub(crate) first: u32,
    pub(crate) last: u32,
    pub(crate) missing: u16,
    pub(crate) bytes: usize,
}

impl RxAssembly {
    /// The frame's first buffer.
    pub(crate) fn first(&self) -> u32 {
        self.first
    }
}

/// Why a used rx buffer was refused.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RxRefused {
    /// The device reported more bytes than the buffer holds.
    TooLong,
    /// A first buffer without a whole header and at least one byte of frame.
    TooShort,
    /// `num_buffers` 0 or more than there are buffers.
    NumBuffers,
    /// The frame would exceed the largest frame.
    FrameTooLarge,
}
