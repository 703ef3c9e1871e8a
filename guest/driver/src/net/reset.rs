//! Per-queue reset on [`VirtioNet`] (see [`crate::reset`]).

use alloc::vec::Vec;

use crate::features::F_RING_RESET;
use crate::hal::Hal;
use crate::net::{QueueId, VirtioNet};
use crate::reset::{QueueResetError, QueueResetReport, ResetCounters, QUEUE_RESET_POLLS};
use crate::transport::{status, Transport};
use crate::tx::TxToken;

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// Resets data queue `queue` of the current pair ([`Self::select_pair`]) alone and brings
    /// it back (see the [module](crate::reset) doc); every other queue keeps running. Needs VIRTIO_F_RING_RESET ([`Self::features`]); without it
    /// nothing is written to the device.
    pub fn reset_queue(&mut self, queue: QueueId) -> Result<QueueResetReport, QueueResetError> {
        if self.features & F_RING_RESET == 0 {
            return Err(QueueResetError::NotNegotiated);
        }
        let result = self.reset_and_reenable(queue);
        let stats = match queue {
            QueueId::Rx => &mut self.rq.resets,
            QueueId::Tx => &mut self.sq.resets,
        };
        match result {
            Ok(report) => {
                stats.resets += 1;
                stats.used += report.used as u64;
                stats.unused += report.unused as u64;
            }
            Err(_) => stats.failed += 1,
        }
        result
    }

    fn reset_and_reenable(&mut self, queue: QueueId) -> Result<QueueResetReport, QueueResetError> {
        // The current pair's queue (`self.rq`/`self.sq`, whose buffers are taken back below).
        let index = match queue {
            QueueId::Rx => self.rq.ring.index(),
            QueueId::Tx => self.sq.ring.index(),
        };
        if let Err(e) = self.transport.reset_queue(index, QUEUE_RESET_POLLS) {
            // The queue may be half reset: neither side can trust its state any more.
            if e == QueueResetError::Timeout {
                self.needs_reset = true;
            }
            return Err(e);
        }
        let report = match queue {
            QueueId::Rx => self.take_back_rx(),
            QueueId::Tx => self.take_back_tx(),
        };
        self.program_queue(index).map_err(QueueResetError::Setup)?;
        if self.transport.status() & status::DEVICE_NEEDS_RESET != 0 {
            self.needs_reset = true;
            return Err(QueueResetError::DeviceNeedsReset);
        }
        // Rx: the ring is empty again; tx: XDP_TX may have given rx buffers back.
        self.refill_rx();
        Ok(report)
    }

    /// The rx queue is reset: drops what the device filled and nobody polled, takes every
    /// posted buffer back into the pool, re-zeroes the ring.
    fn take_back_rx(&mut self) -> QueueResetReport {
        let rq = &mut self.rq;
        let mut report = QueueResetReport::default();
        loop {
            match rq.ring.pop_used() {
                Ok(Some(used)) => {
                    rq.pool.recycle(used.token);
                    report.used += 1;
                }
                Ok(None) => break,
                Err(_error) => rq.note_device_error(),
            }
        }
        // A mergeable frame whose other buffers will never come.
        if let Some(assembly) = rq.assembly.take() {
            rq.pool.recycle(assembly.first());
        }
        let mut in_flight = Vec::new();
        rq.ring.reinit(&mut in_flight);
        report.unused = in_flight.len();
        for buf in in_flight {
            rq.pool.recycle(buf);
        }
        report
    }

    /// The tx queue is reset: reclaims what the device sent, takes back (and forgets) every
    /// frame it did not, re-zeroes the ring.
    fn take_back_tx(&mut self) -> QueueResetReport {
        let used = self.reclaim_tx();
        let sq = &mut self.sq;
        let mut in_flight = Vec::new();
        sq.ring.reinit(&mut in_flight);
        sq.pending = 0;
        for token in &in_flight {
            match *token {
                TxToken::Copy(buf) => sq.pool.give_back(buf),
                TxToken::XdpTx(first) => self.rq.pool.recycle(first),
                TxToken::Umem(addr) => {
                    if let Some(port) = sq.xsk.as_mut() {
                        port.complete(addr);
                    }
                }
                TxToken::UmemCopy { buf, addr } => {
                    sq.pool.give_back(buf);
                    if let Some(port) = sq.xsk.as_mut() {
                        port.complete(addr);
                    }
                }
            }
        }
        if let Some(port) = sq.xsk.as_mut() {
            port.submit_completions();
        }
        QueueResetReport {
            used,
            unused: in_flight.len(),
        }
    }

    /// The per-queue reset counters so far.
    pub fn reset_counters(&self) -> ResetCounters {
        let (rx, tx) = (self.rq.resets, self.sq.resets);
        ResetCounters {
            rx_resets: rx.resets,
            tx_resets: tx.resets,
            failed: rx.failed + tx.failed,
            rx_buffers_reclaimed: rx.unused,
            rx_buffers_dropped_at_reset: rx.used,
            tx_frames_not_sent: tx.unused,
            tx_completed_at_reset: tx.used,
        }
    }
}
