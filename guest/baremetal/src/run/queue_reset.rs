//! `reset_queue=`/`reset_every=` in the driver loop (see `vnet_baremetal::reset`): when the
//! workload has done the next multiple of `reset_every` frames, reset the queue and bring it
//! back. A tx reset first waits for every tx buffer to come back (between bursts), leaving
//! received frames on the rx ring for the workload.

use vnet_driver::{QueueId, QueueResetError, Transport, TxCompletion};

use super::Driver;

impl<T: Transport> Driver<'_, T> {
    /// Where the workload must stop queueing for the next reset (`u64::MAX`: never).
    pub(super) fn reset_due_at(&self) -> u64 {
        self.next_reset
    }

    /// Resets the planned queue for every multiple of `reset_every` that `done` frames of the
    /// `n`-frame workload reached (none once the workload is over).
    pub(super) fn reset_if_due(&mut self, done: u64, n: u64) -> Result<(), &'static str> {
        let Some(plan) = self.o.reset else {
            return Ok(());
        };
        while done >= self.next_reset && done < n {
            self.next_reset = self.next_reset.saturating_add(plan.every);
            if plan.queue == QueueId::Tx {
                self.drain_tx_keeping_rx();
            }
            self.net.reset_queue(plan.queue).map_err(reason)?;
        }
        Ok(())
    }
}

impl<T: Transport> Driver<'_, T> {
    /// Waits until the device has returned every tx buffer, without polling rx (the workload's
    /// own drain drops what arrives, which would lose frames `echo=` must bounce): an interrupt
    /// taken meanwhile schedules the rx poll, which the workload runs next.
    fn drain_tx_keeping_rx(&mut self) {
        let tx_size = usize::from(self.net.queue_sizes().1);
        let interrupt_due = self.mode() == TxCompletion::TxInterrupt;
        while self.net.tx_free_descriptors() < tx_size {
            if self.take_interrupt() {
                self.schedule_rx();
            }
            let free = self.net.tx_free_descriptors();
            if interrupt_due {
                self.tx_poll();
            } else {
                self.net.reclaim_tx();
            }
            if self.net.tx_free_descriptors() == free {
                if self.expired() {
                    return;
                }
                self.idle(interrupt_due);
            }
        }
    }
}

/// The result line's error for a failed reset.
fn reason(e: QueueResetError) -> &'static str {
    match e {
        QueueResetError::NotNegotiated => {
            "reset_queue=: the device does not offer VIRTIO_F_RING_RESET"
        }
        QueueResetError::Unsupported => "reset_queue=: the transport has no queue reset",
        QueueResetError::NoSuchQueue(_) => "reset_queue=: no such queue",
        QueueResetError::Timeout => "reset_queue=: the device did not complete the reset",
        QueueResetError::Setup(_) => "reset_queue=: re-enabling the queue failed",
        QueueResetError::DeviceNeedsReset => {
            "reset_queue=: the device needs a reset after re-enabling the queue"
        }
    }
}
