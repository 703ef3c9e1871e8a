//! The run's queues coming and going: a queue pair enabled or disabled by the driver
//! (VQ_PAIRS_SET), and one queue reset and enabled again (VIRTIO_F_RING_RESET).

use std::os::fd::AsRawFd;

use log::{debug, error, info, warn};

use super::{drain, EventLoop, PairQueue, RxHold, WorkerError};
use crate::backend::NetBackend;
use crate::virtio::ring::AnyRing;

impl<'p, B: NetBackend> EventLoop<'p, B> {
    /// Follows the driver's active queue pairs (VQ_PAIRS_SET, carried out by pair 0): a pair
    /// enabled starts polling its kicks and backend queue (attached to the tap again) and
    /// runs what is pending; a pair disabled stops polling them and detaches its tap queue.
    pub(super) fn sync_enabled(&mut self) -> Result<(), WorkerError> {
        if self.pair == 0 {
            return Ok(());
        }
        let want = self.pair < self.tuning_shared.active_pairs();
        if want == self.enabled {
            return Ok(());
        }
        self.enabled = want;
        if let Err(e) = self.backend.set_queue_enabled(want) {
            warn!(
                "virtio-net {}: queue pair {}: the backend refused to {} its queue: {e}",
                self.label,
                self.pair,
                if want { "attach" } else { "detach" }
            );
        }
        Self::watch_kicks(
            &self.epoll,
            self.tx_kick.as_raw_fd(),
            self.rx_kick.as_raw_fd(),
            want,
        )
        .map_err(WorkerError::Epoll)?;
        info!(
            "virtio-net {}: queue pair {} {}",
            self.label,
            self.pair,
            if want { "enabled" } else { "disabled" }
        );
        if want {
            self.rx_hold = RxHold::Reading;
            self.update_backend_interest().map_err(WorkerError::Epoll)?;
            self.run_tx(self.parks())?;
            self.run_rx()?;
        } else {
            self.tx_parked = false;
            if self.rx_hold == RxHold::Parked {
                // Nothing polls a disabled pair; enabling it runs rx again.
                self.rx_hold = RxHold::Buffers;
            }
            self.tx_more = false;
            self.tx_waiting = false;
            self.update_backend_interest().map_err(WorkerError::Epoll)?;
        }
        Ok(())
    }

    /// Per-queue reset: the queue is no longer used, polled or completed; every other queue
    /// keeps running. What was completed is already published (every datapath call publishes
    /// before it returns); rx chains popped ahead of frames are dropped unused.
    pub(super) fn reset_queue(&mut self, queue: PairQueue) -> Result<(), WorkerError> {
        match queue {
            PairQueue::Rx => {
                let pooled = self.rx.detach();
                // Not polling the backend until the queue is back (frames wait in the tap).
                self.rx_hold = RxHold::Buffers;
                debug!(
                    "virtio-net {}: pair {} rx queue reset ({pooled} pooled chains dropped)",
                    self.label, self.pair
                );
            }
            PairQueue::Tx => {
                self.tx.detach();
                self.tx_parked = false;
                self.tx_more = false;
                self.tx_waiting = false;
                debug!(
                    "virtio-net {}: pair {} tx queue reset",
                    self.label, self.pair
                );
            }
        }
        self.metrics.queue_resets.add(1);
        self.update_backend_interest().map_err(WorkerError::Epoll)
    }

    /// The reset queue runs again on `vq` (its rings checked by the device, like at
    /// activation); kicks that came while it was reset are dropped, and whatever the driver
    /// queued is taken at once.
    pub(super) fn enable_queue(
        &mut self,
        queue: PairQueue,
        vq: AnyRing,
    ) -> Result<(), WorkerError> {
        let attached = match queue {
            PairQueue::Rx => self.rx.is_attached(),
            PairQueue::Tx => self.tx.is_attached(),
        };
        if attached {
            // The transport enables only a reset queue; keep the ring in use.
            error!(
                "virtio-net {}: pair {}: {queue:?} queue enabled while running",
                self.label, self.pair
            );
            return Ok(());
        }
        self.metrics.queue_reenables.add(1);
        match queue {
            PairQueue::Rx => {
                self.rx.attach(vq);
                drain(&self.rx_kick)?;
                self.resume_rx()
            }
            PairQueue::Tx => {
                self.tx.attach(vq);
                drain(&self.tx_kick)?;
                self.run_tx(self.parks())
            }
        }
    }
}
