//! What [`VirtioNet`] does only over virtio-pci (see [`crate::pci`]).

use crate::transport::Transport;

impl<H: crate::Hal, T: Transport> crate::VirtioNet<H, T> {
    /// The guest's handler for MSI-X vector `vector` (a per-source interrupt: no ISR read,
    /// no acknowledgement). Counts the interrupt if the vector is this device's; the
    /// configuration vector re-reads the configuration and checks for DEVICE_NEEDS_RESET, a
    /// queue vector reports used buffers (poll the queue(s) on it: [`Transport::queue_vector`]).
    pub fn handle_msix(&mut self, vector: u16) -> crate::IrqStatus {
        let config_changed = self.transport.config_vector() == Some(vector);
        // Every pair's rx and tx queue, and the control queue.
        let ctrl = self.cq.as_ref().map(|cq| cq.ring.index());
        let used_buffers = (0..2 * self.queue_pairs())
            .chain(ctrl)
            .any(|q| self.transport.queue_vector(q) == Some(vector));
        if !config_changed && !used_buffers {
            return crate::IrqStatus::default();
        }
        self.interrupts += 1;
        if used_buffers {
            self.note_pair_interrupts();
        }
        if config_changed {
            self.config_changed();
        }
        crate::IrqStatus {
            used_buffers,
            config_changed,
            needs_reset: self.needs_reset,
        }
    }
}
