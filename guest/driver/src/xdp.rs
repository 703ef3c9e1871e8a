//! The rx program's verdicts and the XDP_TX bulk queue.
//!
//! A frame the program bounces ([`XdpAction::Tx`]) is sent **without a copy**, from the rx
//! buffers it arrived in: the 12-byte header the device wrote at the start of the first buffer
//! is zeroed in place and becomes the tx header, and the tx chain is made of the frame's rx
//! buffers (one descriptor each, device-readable). The buffers go back to the rx pool, and are
//! re-posted, when the device returns that tx chain (in whatever reclaim path the
//! [`crate::TxCompletion`] mode uses; the rx ring is refilled right then).
//!
//! Bounced frames are queued and flushed — added to the tx ring, one publish, one kick decision
//! — when `xdp_bulk` frames are queued and at the end of every rx poll. `xdp_bulk = 1` is
//! per-frame transmit. A frame that finds no room on the tx ring is dropped and counted
//! (`xdp_tx_errors`, `ring_full`).

use crate::hal::Hal;
use crate::header::VNET_HDR_LEN;
use crate::net::VirtioNet;
use crate::ring::{Access, Buffer};
use crate::transport::Transport;
use crate::tx::TxToken;

/// What the rx program decided for a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAction {
    /// Deliver: the program consumed the frame (counted in `xdp_pass`).
    Pass,
    /// Drop it (counted in `xdp_drop`).
    Drop,
    /// Send it back out of the same device (XDP_TX).
    Tx,
}

/// Swaps the destination and source MAC addresses of an Ethernet frame (a reflector's rewrite
/// before [`XdpAction::Tx`]). Frames shorter than 12 bytes are left alone.
pub fn swap_macs(frame: &mut [u8]) {
    if let Some(addrs) = frame.get_mut(..12) {
        let (dst, src) = addrs.split_at_mut(6);
        dst.swap_with_slice(src);
    }
}

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// Queues the frame starting at rx buffer `first` for XDP_TX; flushes at `xdp_bulk`.
    pub(crate) fn xdp_queue_tx(&mut self, first: u32) {
        // SAFETY: the frame's buffers are the driver's (returned by the device, not re-posted);
        // no other reference into the pool is live.
        unsafe { self.rq.pool.bytes_mut(first, 0, VNET_HDR_LEN) }.fill(0);
        self.sq.xdp_queue.push(first);
        if let Some(tuning) = self.sq.tuning.as_mut() {
            tuning.bounced += 1;
        }
        if self.sq.xdp_queue.len() >= usize::from(self.sq.xdp_bulk) {
            self.xdp_flush();
        }
    }

    /// Adds every queued XDP_TX frame to the tx ring, then one publish and one kick decision.
    pub(crate) fn xdp_flush(&mut self) {
        if self.sq.xdp_queue.is_empty() {
            return;
        }
        self.lazy_reclaim();
        let (sq, rx_pool) = (&mut self.sq, &mut self.rq.pool);
        let mut queued = 0u64;
        let mut reclaimed = false;
        let mut rx_returned = false;
        let mut bounced = core::mem::take(&mut sq.xdp_queue);
        for &first in &bounced {
            sq.chain.clear();
            sq.chain.extend(rx_pool.frame(first).map(|buf| Buffer {
                addr: rx_pool.addr(buf),
                len: rx_pool.used_len(buf),
                access: Access::DeviceReads,
            }));
            if sq.ring.free_descriptors() < sq.chain.len() && !reclaimed {
                // As Linux's XDP transmit does in every completion mode: take back what the
                // device has returned before giving up on room (in tx-interrupt mode the tx
                // poll may not have run yet; a dropped bounce shrinks a forwarding window).
                reclaimed = true;
                rx_returned |= sq.reclaim(rx_pool).1;
            }
            if sq.ring.add(&sq.chain, TxToken::XdpTx(first)).is_ok() {
                queued += 1;
            } else {
                sq.stats.ring_full += 1;
                sq.stats.xdp_tx_errors += 1;
                rx_pool.recycle(first);
            }
        }
        bounced.clear();
        sq.xdp_queue = bounced;
        sq.stats.xdp_tx += queued;
        if queued > 0 {
            sq.stats.xdp_flushes += 1;
            sq.flush(&mut self.transport);
        }
        if rx_returned {
            self.refill_rx();
        }
    }
}
