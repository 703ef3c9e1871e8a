//! Attaching an AF_XDP-style port to [`VirtioNet`] and driving it (see [`crate::xsk`]).

use crate::config::MAX_FRAME_LEN;
use crate::error::XskError;
use crate::hal::Hal;
use crate::net::VirtioNet;
use crate::transport::Transport;
use crate::xsk::{XskMode, XskPort, XSK_HEADROOM};

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// Attaches the driver's half of an AF_XDP-style socket (one at a time).
    pub fn attach_xsk(&mut self, port: XskPort) -> Result<(), XskError> {
        if self.sq.xsk.is_some() {
            return Err(XskError::AlreadyAttached);
        }
        self.sq.xsk = Some(port);
        Ok(())
    }

    /// Detaches the port, once none of its frames is in flight (reclaim first).
    pub fn detach_xsk(&mut self) -> Result<XskPort, XskError> {
        match &self.sq.xsk {
            None => Err(XskError::NotAttached),
            Some(port) if port.in_flight > 0 => Err(XskError::Busy),
            Some(_) => self.sq.xsk.take().ok_or(XskError::NotAttached),
        }
    }

    /// Sends up to `budget` frames from the attached port's tx ring (what `sendto()` on an
    /// AF_XDP socket triggers): publishes every `kick_threshold` frames and at the end. Stops
    /// early when the tx ring is full or the completion ring could not take more frames in
    /// flight. Returns the number of frames posted.
    pub fn xsk_transmit(&mut self, budget: usize) -> usize {
        if self.sq.xsk.is_none() {
            return 0;
        }
        // Reclaim with the port attached, so that the frames it reclaims are completed.
        self.lazy_reclaim();
        let Some(mut port) = self.sq.xsk.take() else {
            return 0;
        };
        let (sq, transport) = (&mut self.sq, &mut self.transport);
        let room = port.completion.free().saturating_sub(port.in_flight) as usize;
        let mut sent = 0;
        while sent < budget.min(room) {
            let Some(desc) = port.tx.peek() else {
                break;
            };
            let (headroom, max_len) = match port.mode {
                XskMode::ZeroCopy => (XSK_HEADROOM, MAX_FRAME_LEN),
                XskMode::Copy => (0, sq.pool.max_frame()),
            };
            if !port.umem.check_tx(desc, headroom, max_len) {
                port.tx.pop();
                sq.stats.xsk_invalid_descs += 1;
                continue;
            }
            let posted = match port.mode {
                XskMode::ZeroCopy => sq.post_umem_zero_copy(&port.umem, desc),
                XskMode::Copy => sq.post_umem_copy(&port.umem, desc),
            };
            if !posted {
                sq.ring_full(transport);
                break;
            }
            port.tx.pop();
            port.in_flight += 1;
            sent += 1;
            sq.stats.frames += 1;
            sq.stats.bytes += u64::from(desc.len);
            sq.frame_added(transport);
        }
        port.tx.release();
        sq.xsk = Some(port);
        sq.flush(transport);
        sent
    }
}
