//! Transmit on [`VirtioNet`].

use crate::config::TxCompletion;
use crate::error::TxError;
use crate::hal::Hal;
use crate::net::VirtioNet;
use crate::transport::Transport;
use crate::tx::TxBatch;

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
