//! The XDP_TX path of [`VirtioNet`] (see [`crate::xdp`]).

use crate::hal::Hal;
use crate::header::VNET_HDR_LEN;
use crate::net::VirtioNet;
use crate::ring::{Access, Buffer};
use crate::transport::Transport;
use crate::tx::TxToken;

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
