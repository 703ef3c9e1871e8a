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

use crate::config::{TxCompletion, MAX_FRAME_LEN};
use crate::features::NET_F_MRG_RXBUF;
use crate::hal::{DmaRegion, Hal, PhysAddr};
use crate::header::{NUM_BUFFERS_OFFSET, VNET_HDR_LEN};
use crate::net::VirtioNet;
use crate::queue::ReceiveQueue;
use crate::ring::{Access, Buffer, Used};
use crate::transport::Transport;
use crate::xdp::XdpAction;

/// End of a buffer list.
pub(crate) const NO_LINK: u32 = u32::MAX;

/// The rx buffers and what the driver knows about each.
pub(crate) struct RxPool {
    region: DmaRegion,
    buf_size: u32,
    count: u32,
    /// Buffers owned by the driver and not lent out (a stack).
    free: Vec<u32>,
    /// The next buffer of the same frame, or [`NO_LINK`].
    link: Vec<u32>,
    /// Bytes the device wrote into each buffer (header included for a first buffer).
    len: Vec<u32>,
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
    first: u32,
    last: u32,
    missing: u16,
    bytes: usize,
}

impl RxAssembly {
    /// The frame's first buffer.
    pub(crate) fn first(&self) -> u32 {
        self.first
    }
}

/// Why a used rx buffer was refused.
#[derive(Clone, Copy, Debug)]
enum RxRefused {
    /// The device reported more bytes than the buffer holds.
    TooLong,
    /// A first buffer without a whole header and at least one byte of frame.
    TooShort,
    /// `num_buffers` 0 or more than there are buffers.
    NumBuffers,
    /// The frame would exceed the largest frame.
    FrameTooLarge,
}

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// Receives up to `budget` frames and runs `program` on each (the frame without its
    /// header). [`XdpAction::Pass`] and [`XdpAction::Drop`] recycle the buffers (the program is
    /// the consumer: copy what you keep); [`XdpAction::Tx`] sends the frame back out, zero-copy
    /// (see [`crate::xdp`]). Then flushes the XDP_TX queue and re-posts free rx buffers.
    ///
    /// In [`TxCompletion::CleanFromRx`] mode, reclaims used tx buffers first. Returns the number
    /// of frames received (less than `budget`: the used ring is empty, or the frame at its head
    /// is still incomplete).
    pub fn poll_rx<F: FnMut(&[u8]) -> XdpAction>(
        &mut self,
        budget: usize,
        program: &mut F,
    ) -> usize {
        self.poll_rx_mut(budget, &mut |frame: &mut [u8]| program(frame))
    }

    /// [`Self::poll_rx`] with a program that may rewrite the frame in place (e.g. swap MAC
    /// addresses before [`XdpAction::Tx`]).
    pub fn poll_rx_mut<F: FnMut(&mut [u8]) -> XdpAction>(
        &mut self,
        budget: usize,
        program: &mut F,
    ) -> usize {
        if self.config.tx_completion == TxCompletion::CleanFromRx {
            self.reclaim_tx();
        }
        let mergeable = self.features & NET_F_MRG_RXBUF != 0;
        let mut frames = 0;
        while frames < budget {
            let used = match self.rq.ring.pop_used() {
                Ok(Some(used)) => used,
                Ok(None) => break,
                Err(_error) => {
                    self.rq.note_device_error();
                    continue;
                }
            };
            match self.rq.accept(used, mergeable) {
                Ok(Some((first, bytes))) => {
                    self.deliver(first, bytes, program);
                    frames += 1;
                }
                Ok(None) => {}
                Err(_refused) => self.rq.note_device_error(),
            }
        }
        self.xdp_flush();
        self.refill_rx();
        if self.config.adaptive {
            self.tune_after_poll();
        }
        frames
    }

    /// Runs the program on a complete frame and carries out its verdict.
    fn deliver<F: FnMut(&mut [u8]) -> XdpAction>(
        &mut self,
        first: u32,
        bytes: usize,
        program: &mut F,
    ) {
        let rq = &mut self.rq;
        rq.stats.frames += 1;
        rq.stats.bytes += bytes as u64;
        let first_len = rq.pool.used_len(first) as usize;
        let single = rq.pool.link[first as usize] == NO_LINK;
        let action = if single {
            // SAFETY: the frame's buffers were returned by the device and are the driver's;
            // the slice ends before `program` returns and no other pool reference is live.
            program(unsafe { rq.pool.bytes_mut(first, VNET_HDR_LEN, first_len) })
        } else {
            let mut scratch = core::mem::take(&mut rq.scratch);
            scratch.clear();
            rq.gather(first, &mut scratch);
            let action = program(&mut scratch);
            if action == XdpAction::Tx {
                rq.scatter(first, &scratch);
            }
            rq.scratch = scratch;
            action
        };
        match action {
            XdpAction::Pass => {
                rq.stats.xdp_pass += 1;
                rq.pool.recycle(first);
            }
            XdpAction::Drop => {
                rq.stats.xdp_drop += 1;
                rq.pool.recycle(first);
            }
            XdpAction::Tx => self.xdp_queue_tx(first),
        }
    }

    /// Posts every free rx buffer the rx ring has room for, then publishes and kicks.
    pub(crate) fn refill_rx(&mut self) {
        self.rq.refill(&mut self.transport);
    }
}

impl ReceiveQueue {
    /// Takes one used rx buffer. Returns the first buffer and frame length once a frame is
    /// complete; refused buffers (and the frame they belonged to) are recycled. `mergeable`:
    /// MRG_RXBUF was negotiated (a frame may span several buffers).
    fn accept(
        &mut self,
        used: Used<u32>,
        mergeable: bool,
    ) -> Result<Option<(u32, usize)>, RxRefused> {
        let Used { token: buf, len } = used;
        let pending = self.assembly.take();
        let refuse = |rq: &mut Self, why| {
            rq.pool.recycle(buf);
            if let Some(a) = pending {
                rq.pool.recycle(a.first);
            }
            Err(why)
        };
        if len > self.pool.buf_size {
            return refuse(self, RxRefused::TooLong);
        }
        self.pool.len[buf as usize] = len;
        self.pool.link[buf as usize] = NO_LINK;
        if let Some(mut a) = pending {
            let bytes = a.bytes + len as usize;
            if bytes > MAX_FRAME_LEN {
                return refuse(self, RxRefused::FrameTooLarge);
            }
            self.pool.link[a.last as usize] = buf;
            a.last = buf;
            a.bytes = bytes;
            a.missing -= 1;
            if a.missing == 0 {
                return Ok(Some((a.first, a.bytes)));
            }
            self.assembly = Some(a);
            return Ok(None);
        }
        if (len as usize) <= VNET_HDR_LEN {
            return refuse(self, RxRefused::TooShort);
        }
        let num_buffers = if mergeable {
            // SAFETY: `buf` was just returned by the device: the driver owns it; no other
            // reference into the pool is live.
            let hdr = unsafe { self.pool.bytes_mut(buf, 0, VNET_HDR_LEN) };
            u16::from_le_bytes([hdr[NUM_BUFFERS_OFFSET], hdr[NUM_BUFFERS_OFFSET + 1]])
        } else {
            1
        };
        if num_buffers == 0 || u32::from(num_buffers) > self.pool.count {
            return refuse(self, RxRefused::NumBuffers);
        }
        let bytes = len as usize - VNET_HDR_LEN;
        if num_buffers == 1 {
            return Ok(Some((buf, bytes)));
        }
        self.assembly = Some(RxAssembly {
            first: buf,
            last: buf,
            missing: num_buffers - 1,
            bytes,
        });
        Ok(None)
    }

    /// Appends the frame bytes of every buffer of the frame at `first` to `out`.
    fn gather(&mut self, first: u32, out: &mut Vec<u8>) {
        let mut start = VNET_HDR_LEN;
        let mut buf = first;
        while buf != NO_LINK {
            let len = self.pool.used_len(buf) as usize;
            // SAFETY: a buffer of a frame the device returned: the driver's; the slice is
            // copied from and dropped at once.
            out.extend_from_slice(unsafe { self.pool.bytes_mut(buf, start, len) });
            start = 0;
            buf = self.pool.link[buf as usize];
        }
    }

    /// Writes `data` back over the frame bytes of the buffers of the frame at `first`.
    fn scatter(&mut self, first: u32, mut data: &[u8]) {
        let mut start = VNET_HDR_LEN;
        let mut buf = first;
        while buf != NO_LINK && !data.is_empty() {
            let len = self.pool.used_len(buf) as usize;
            let n = (len - start).min(data.len());
            // SAFETY: as in `gather`.
            unsafe { self.pool.bytes_mut(buf, start, start + n) }.copy_from_slice(&data[..n]);
            data = &data[n..];
            start = 0;
            buf = self.pool.link[buf as usize];
        }
    }

    /// Posts every free buffer the ring has room for, then publishes and kicks over
    /// `transport`.
    pub(crate) fn refill<T: Transport>(&mut self, transport: &mut T) {
        let mut posted = false;
        while let Some(&buf) = self.pool.free.last() {
            let buffer = Buffer {
                addr: self.pool.addr(buf),
                len: self.pool.buf_size,
                access: Access::DeviceWrites,
            };
            if self.ring.add(&[buffer], buf).is_err() {
                break;
            }
            self.pool.free.pop();
            posted = true;
        }
        if posted {
            self.publish_and_kick(transport);
        }
    }
}
