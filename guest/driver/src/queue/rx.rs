//! Receive on one [`ReceiveQueue`](super::ReceiveQueue): taking used buffers and
//! reassembling frames.

use alloc::vec::Vec;

use crate::config::MAX_FRAME_LEN;
use crate::header::{NUM_BUFFERS_OFFSET, VNET_HDR_LEN};
use crate::queue::ReceiveQueue;
use crate::ring::{Access, Buffer, Used};
use crate::rx::{RxAssembly, RxRefused, NO_LINK};
use crate::transport::Transport;

impl ReceiveQueue {
    /// Takes one used rx buffer. Returns the first buffer and frame length once a frame is
    /// complete; refused buffers (and the frame they belonged to) are recycled. `mergeable`:
    /// MRG_RXBUF was negotiated (a frame may span several buffers).
    pub(crate) fn accept(
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
    pub(crate) fn gather(&mut self, first: u32, out: &mut Vec<u8>) {
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
    pub(crate) fn scatter(&mut self, first: u32, mut data: &[u8]) {
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
