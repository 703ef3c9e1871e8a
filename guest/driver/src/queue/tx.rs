//! Transmit on one [`SendQueue`](super::SendQueue): adding chains and reclaiming them.

use crate::error::TxError;
use crate::queue::SendQueue;
use crate::rx::RxPool;
use crate::transport::Transport;
use crate::tx::TxToken;

impl SendQueue {
    /// Copies `frame` (non-empty, at most [`TxPool::max_frame`] bytes) into a driver tx buffer
    /// and adds it to the ring; publishes and kick-decides at the kick threshold.
    pub(crate) fn add_copy<T: Transport>(
        &mut self,
        transport: &mut T,
        frame: &[u8],
    ) -> Result<(), TxError> {
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
