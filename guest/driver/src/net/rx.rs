//! Receive on [`VirtioNet`].

use crate::config::TxCompletion;
use crate::features::NET_F_MRG_RXBUF;
use crate::hal::Hal;
use crate::header::VNET_HDR_LEN;
use crate::net::VirtioNet;
use crate::rx::NO_LINK;
use crate::transport::Transport;
use crate::xdp::XdpAction;

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
