//! Transmit: copy transmit into driver-owned buffers, kick batching (`kick_threshold`), and tx
//! reclaim for every kind of tx chain (copy, XDP_TX, AF_XDP zero-copy and copy).
//!
//! Every transmit path adds chains unpublished and counts them; after `kick_threshold` frames
//! it publishes `avail.idx` and makes one kick decision, and it does the same once at the end of
//! its batch ([`VirtioNet::flush_tx`]). The kick decision skips the notification when the device
//! said it needs none (EVENT_IDX `avail_event`, or NO_NOTIFY) and counts that.

use alloc::vec::Vec;

use crate::config::TxCompletion;
use crate::error::TxError;
use crate::hal::{DmaRegion, Hal, PhysAddr};
use crate::header::VNET_HDR_LEN;
use crate::net::VirtioNet;
use crate::queue::SendQueue;
use crate::ring::{Access, Buffer};
use crate::rx::RxPool;
use crate::transport::Transport;

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

/// The driver-owned tx buffers (copy transmit), one per tx descriptor.
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

    /// The largest frame a buffer holds.
    pub(crate) fn max_frame(&self) -> usize {
        self.buf_size as usize - VNET_HDR_LEN
    }

    fn offset(&self, buf: u16) -> usize {
        usize::from(buf) * self.buf_size as usize
    }

    pub(crate) fn take(&mut self) -> Option<u16> {
        self.free.pop()
    }

    pub(crate) fn give_back(&mut self, buf: u16) {
        self.free.push(buf);
    }

    /// Writes a zero header and then `len` bytes from `src` into `buf`. Returns the chain
    /// buffer for it, or `None` if the frame does not fit.
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
            p.write_bytes(0, VNET_HDR_LEN);
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxBatch {
    /// Frames queued (a prefix of the batch).
    pub sent: usize,
    /// Why the batch stopped early, if it did.
    pub stopped: Option<TxError>,
}

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// Sends one frame (a batch of one: published and kick-decided at once).
    pub fn transmit(&mut self, frame: &[u8]) -> Result<(), TxError> {
        let result = self.queue_tx(frame);
        self.flush_tx();
        result
    }

    /// Sends `frames` in order until one cannot be queued; publishes every `kick_threshold`
    /// frames and at the end.
    pub fn transmit_batch<'a, I>(&mut self, frames: I) -> TxBatch
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let mut batch = TxBatch {
            sent: 0,
            stopped: None,
        };
        for frame in frames {
            if let Err(e) = self.queue_tx(frame) {
                batch.stopped = Some(e);
                break;
            }
            batch.sent += 1;
        }
        self.flush_tx();
        batch
    }

    /// Queues one frame, copied into a driver tx buffer, as part of a batch the caller ends
    /// with [`Self::flush_tx`] (the `xmit_more` style). Publishes and kick-decides every
    /// `kick_threshold` frames.
    pub fn queue_tx(&mut self, frame: &[u8]) -> Result<(), TxError> {
        if frame.is_empty() {
            return Err(TxError::Empty);
        }
        let max = self.sq.pool.max_frame();
        if frame.len() > max {
            return Err(TxError::TooLarge {
                len: frame.len(),
                max,
            });
        }
        self.lazy_reclaim();
        self.sq.add_copy(&mut self.transport, frame)
    }

    /// Ends a batch: publishes what was queued and makes one kick decision.
    pub fn flush_tx(&mut self) {
        self.sq.flush(&mut self.transport);
    }

    /// [`TxCompletion::Lazy`]: reclaims when fewer than a quarter of the tx descriptors are free.
    pub(crate) fn lazy_reclaim(&mut self) {
        let ring = &self.sq.ring;
        if self.config.tx_completion == TxCompletion::Lazy
            && ring.free_descriptors() < usize::from(ring.size() / 4).max(1)
        {
            self.reclaim_tx();
        }
    }

    /// Reclaims every tx chain the device has returned: frees copy buffers, re-posts rx buffers
    /// lent to XDP_TX, completes AF_XDP frames. One reclaim pass (counted in
    /// `tx_reclaim_polls`). Returns the number of chains reclaimed.
    pub fn reclaim_tx(&mut self) -> usize {
        let (reclaimed, rx_returned) = self.sq.reclaim(&mut self.rq.pool);
        if rx_returned {
            self.refill_rx();
        }
        reclaimed
    }
}

impl SendQueue {
    /// Copies `frame` (non-empty, at most [`TxPool::max_frame`] bytes) into a driver tx buffer
    /// and adds it to the ring; publishes and kick-decides at the kick threshold.
    fn add_copy<T: Transport>(&mut self, transport: &mut T, frame: &[u8]) -> Result<(), TxError> {
        if self.ring.free_descriptors() == 0 {
            return Err(self.ring_full(transport));
        }
        let Some(buf) = self.pool.take() else {
            return Err(self.ring_full(transport));
        };
        // SAFETY: `buf` was just taken; `frame` is ordinary memory of `frame.len()` bytes,
        // borrowed for the call, so it cannot overlap the driver's DMA buffers.
        let filled = unsafe { self.pool.fill(buf, frame.as_ptr(), frame.len()) };
        let added = filled.map(|buffer| self.ring.add(&[buffer], TxToken::Copy(buf)));
        if !matches!(added, Some(Ok(()))) {
            self.pool.give_back(buf);
            return Err(self.ring_full(transport));
        }
        self.stats.frames += 1;
        self.stats.bytes += frame.len() as u64;
        self.frame_added(transport);
        Ok(())
    }

    /// Ends a batch: publishes what was queued and makes one kick decision. With
    /// [`crate::Config::adaptive`], also closes the adaptation interval when it is complete.
    pub(crate) fn flush<T: Transport>(&mut self, transport: &mut T) {
        self.pending = 0;
        self.publish_and_kick(transport);
        if self.tuning.is_some() {
            self.tune_tx();
        }
    }

    /// Counts a frame added to the ring; publishes and kick-decides at the kick threshold.
    pub(crate) fn frame_added<T: Transport>(&mut self, transport: &mut T) {
        self.pending += 1;
        if self.pending >= self.kick_threshold {
            if let Some(tuning) = self.tuning.as_mut() {
                tuning.threshold_cuts += 1;
            }
            self.flush(transport);
        }
    }

    /// Counts a full ring and publishes what is pending, so the device can make room.
    pub(crate) fn ring_full<T: Transport>(&mut self, transport: &mut T) -> TxError {
        self.stats.ring_full += 1;
        self.flush(transport);
        TxError::RingFull
    }

    /// Takes every chain the device has returned off the ring: frees copy buffers, recycles rx
    /// buffers lent to XDP_TX into `rx_pool`, completes AF_XDP frames. Returns the number of
    /// chains reclaimed and whether rx buffers came back (the caller re-posts them).
    pub(crate) fn reclaim(&mut self, rx_pool: &mut RxPool) -> (usize, bool) {
        self.stats.reclaim_polls += 1;
        let mut reclaimed = 0;
        let mut rx_returned = false;
        loop {
            let used = match self.ring.pop_used() {
                Ok(Some(used)) => used,
                Ok(None) => break,
                Err(_error) => {
                    self.note_device_error();
                    continue;
                }
            };
            reclaimed += 1;
            match used.token {
                TxToken::Copy(buf) => self.pool.give_back(buf),
                TxToken::XdpTx(first) => {
                    rx_pool.recycle(first);
                    rx_returned = true;
                }
                TxToken::Umem(addr) => {
                    if let Some(port) = self.xsk.as_mut() {
                        port.complete(addr);
                    }
                }
                TxToken::UmemCopy { buf, addr } => {
                    self.pool.give_back(buf);
                    if let Some(port) = self.xsk.as_mut() {
                        port.complete(addr);
                    }
                }
            }
        }
        if let Some(port) = self.xsk.as_mut() {
            port.submit_completions();
        }
        self.stats.reclaimed += reclaimed as u64;
        (reclaimed, rx_returned)
    }
}
