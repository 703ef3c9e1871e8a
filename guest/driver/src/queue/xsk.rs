//! The AF_XDP-style port's side of a [`SendQueue`](super::SendQueue) (see [`crate::xsk`]).

use crate::header::VNET_HDR_LEN;
use crate::queue::SendQueue;
use crate::ring::{Access, Buffer};
use crate::tx::TxToken;
use crate::xsk::{Umem, XdpDesc, XSK_HEADROOM};

impl SendQueue {
    /// Posts a checked umem frame in place, header in its headroom. False if the ring is full.
    pub(crate) fn post_umem_zero_copy(&mut self, umem: &Umem, desc: XdpDesc) -> bool {
        if self.ring.free_descriptors() == 0 {
            return false;
        }
        let start = desc.addr - XSK_HEADROOM;
        let Ok(hdr) = umem.range(start, VNET_HDR_LEN) else {
            return false;
        };
        // SAFETY: the 12 headroom bytes of a chunk the application handed over on the tx ring
        // (checked to lie inside the umem and the chunk); the driver owns the chunk until its
        // completion, and the device is not reading it (not posted yet).
        unsafe { hdr.write_bytes(0, VNET_HDR_LEN) };
        let buffer = Buffer {
            addr: umem.paddr() + start,
            len: desc.len + VNET_HDR_LEN as u32,
            access: Access::DeviceReads,
        };
        self.ring.add(&[buffer], TxToken::Umem(desc.addr)).is_ok()
    }

    /// Copies a checked umem frame (it fits a tx buffer) into a driver tx buffer and posts that.
    /// False if the ring is full.
    pub(crate) fn post_umem_copy(&mut self, umem: &Umem, desc: XdpDesc) -> bool {
        if self.ring.free_descriptors() == 0 {
            return false;
        }
        let len = desc.len as usize;
        let Ok(src) = umem.range(desc.addr, len) else {
            return false;
        };
        let Some(buf) = self.pool.take() else {
            return false;
        };
        // SAFETY: `buf` was just taken; `src` is `len` bytes of a chunk the driver owns until
        // completion (tx ring ownership rule), in the caller's umem, not in the tx buffers.
        let filled = unsafe { self.pool.fill(buf, src, len) };
        let token = TxToken::UmemCopy {
            buf,
            addr: desc.addr,
        };
        if filled.is_some_and(|buffer| self.ring.add(&[buffer], token).is_ok()) {
            return true;
        }
        self.pool.give_back(buf);
        false
    }
}
