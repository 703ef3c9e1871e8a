//! Device → driver signalling for one virtio device: the irqfd, the InterruptStatus bits
//! and the DEVICE_NEEDS_RESET flag, shared lock-free by the transport and the device worker.
//!
//! A virtio-mmio device has one line (one irqfd). A virtio-pci device with MSI-X
//! ([`VirtioInterrupt::with_msix`]) has one irqfd per MSI-X vector instead: a queue interrupt
//! goes to the vector the driver assigned to that queue, a configuration interrupt to the
//! configuration vector (see [`crate::pci::msix`]). A worker that knows which queue it
//! used calls [`VirtioInterrupt::signal_queue`]; [`VirtioInterrupt::signal_used_queue`] (which
//! queue unknown) fires every vector a queue is mapped to, each once. On one line both are the
//! same. The status bits (ISR on PCI) are set either way.
//!
//! A device served over vhost-user ([`VirtioInterrupt::vrings`]) has what the frontend gave
//! per ring instead: a call eventfd (KVM's irqfd, or the frontend's own) and an error eventfd.
//! There is no configuration interrupt (the frontend owns the configuration space); a device
//! that needs a reset says so on every ring's error eventfd.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::pci::msix::MsixVectors;

/// How a device's interrupts reach the guest.
#[derive(Debug)]
enum Signal {
    /// One line: one irqfd on the device's GSI (virtio-mmio).
    Line(EventFd),
    /// MSI-X: one irqfd per vector, each queue and the configuration on its own (virtio-pci).
    Msix(Arc<MsixVectors>),
    /// vhost-user: per ring, the frontend's call eventfd (none: the driver polls) and error
    /// eventfd.
    Vrings {
        calls: Vec<Option<EventFd>>,
        errors: Vec<Option<EventFd>>,
    },
}

/// Writes `fd` if there is one.
fn notify(fd: Option<&EventFd>) -> io::Result<()> {
    fd.map_or(Ok(()), |fd| fd.write(1))
}

/// The interrupt of one device. Shared as `Arc<VirtioInterrupt>`; no lock on any path.
#[derive(Debug)]
pub struct VirtioInterrupt {
    signal: Signal,
    status: AtomicU32,
    needs_reset: AtomicBool,
    /// Queue interrupts are raised outside the device (a vhost-user backend writes the line's
    /// irqfd itself): InterruptStatus always shows "used buffers", so that the driver looks at
    /// its queues whenever the line fires (virtio-mmio; MSI-X needs no status).
    external_queues: AtomicBool,
}

impl VirtioInterrupt {
    /// One line with a fresh (non-blocking) irqfd and no pending interrupt.
    pub fn new() -> io::Result<VirtioInterrupt> {
        Ok(VirtioInterrupt::with(Signal::Line(EventFd::new(
            EFD_NONBLOCK,
        )?)))
    }

    /// One line signalling `irqfd` (its owner keeps a clone to register it as the irqfd).
    pub fn line(irqfd: EventFd) -> VirtioInterrupt {
        VirtioInterrupt::with(Signal::Line(irqfd))
    }

    /// Interrupts through MSI-X `vectors` (one irqfd per vector).
    pub fn with_msix(vectors: Arc<MsixVectors>) -> VirtioInterrupt {
        VirtioInterrupt::with(Signal::Msix(vectors))
    }

    /// Interrupts through the call eventfds a vhost-user frontend gave, one per ring in
    /// queue-index order (`None`: that ring is polled), and its error eventfds.
    pub fn vrings(calls: Vec<Option<EventFd>>, errors: Vec<Option<EventFd>>) -> VirtioInterrupt {
        VirtioInterrupt::with(Signal::Vrings { calls, errors })
    }

    fn with(signal: Signal) -> VirtioInterrupt {
        VirtioInterrupt {
            signal,
            status: AtomicU32::new(0),
            needs_reset: AtomicBool::new(false),
            external_queues: AtomicBool::new(false),
        }
    }

    /// The MSI-X vectors, on a virtio-pci device.
    pub fn msix(&self) -> Option<&Arc<MsixVectors>> {
        match &self.signal {
            Signal::Msix(vectors) => Some(vectors),
            Signal::Line(_) | Signal::Vrings { .. } => None,
        }
    }

    /// Signals "used buffers available" on queue `index`: its MSI-X vector, or the one line.
    pub fn signal_queue(&self, index: usize) -> io::Result<()> {
        self.status
            .fetch_or(VIRTIO_MMIO_INT_VRING, Ordering::AcqRel);
        match &self.signal {
            Signal::Msix(vectors) => vectors.signal_queue(index),
            Signal::Line(irqfd) => irqfd.write(1),
            Signal::Vrings { calls, .. } => notify(calls.get(index).and_then(Option::as_ref)),
        }
    }

    /// Signals "used buffers available" on a worker's two queues (its rx and tx queue): each
    /// queue's MSI-X vector, once if they share one; on the one line, one signal.
    pub fn signal_queue_pair(&self, rx: usize, tx: usize) -> io::Result<()> {
        self.status
            .fetch_or(VIRTIO_MMIO_INT_VRING, Ordering::AcqRel);
        match &self.signal {
            Signal::Msix(vectors) => {
                let (a, b) = (vectors.queue_vector(rx), vectors.queue_vector(tx));
                vectors.trigger(a)?;
                if b != a {
                    vectors.trigger(b)?;
                }
                Ok(())
            }
            Signal::Line(irqfd) => irqfd.write(1),
            Signal::Vrings { calls, .. } => {
                let call = |i: usize| calls.get(i).and_then(Option::as_ref);
                notify(call(rx))?;
                notify(call(tx))
            }
        }
    }

    /// The eventfd the VMM registers as an irqfd on the device's GSI (one line; MSI-X has one
    /// per vector, see [`Self::msix`]).
    pub fn irqfd(&self) -> Option<&EventFd> {
        match &self.signal {
            Signal::Line(irqfd) => Some(irqfd),
            Signal::Msix(_) | Signal::Vrings { .. } => None,
        }
    }

    /// Signals "used buffers available" (InterruptStatus bit 0).
    pub fn signal_used_queue(&self) -> io::Result<()> {
        self.signal(VIRTIO_MMIO_INT_VRING)
    }

    /// Signals "configuration changed" (InterruptStatus bit 1).
    pub fn signal_config_change(&self) -> io::Result<()> {
        self.signal(VIRTIO_MMIO_INT_CONFIG)
    }

    /// Marks the device DEVICE_NEEDS_RESET and tells the driver with a configuration interrupt.
    pub fn set_needs_reset(&self) -> io::Result<()> {
        self.needs_reset.store(true, Ordering::Release);
        if let Signal::Vrings { errors, .. } = &self.signal {
            return errors.iter().try_for_each(|fd| notify(fd.as_ref()));
        }
        self.signal_config_change()
    }

    /// True once the device asked to be reset, until the driver resets it.
    pub fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::Acquire)
    }

    /// The InterruptStatus register.
    pub fn status(&self) -> u32 {
        let external = if self.external_queues.load(Ordering::Acquire) {
            VIRTIO_MMIO_INT_VRING
        } else {
            0
        };
        self.status.load(Ordering::Acquire) | external
    }

    /// Queue interrupts are raised by another process on the line's irqfd (`true`), or by
    /// this device again (`false`): see [`VirtioInterrupt::status`].
    pub fn set_external_queues(&self, external: bool) {
        self.external_queues.store(external, Ordering::Release);
    }

    /// InterruptACK: clears the bits the driver acknowledged.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::AcqRel);
    }

    /// Device reset: no pending interrupt, no reset request. Drains the irqfd counter.
    pub fn reset(&self) {
        self.status.store(0, Ordering::Release);
        self.needs_reset.store(false, Ordering::Release);
        self.external_queues.store(false, Ordering::Release);
        if let Signal::Line(irqfd) = &self.signal {
            // A WouldBlock here only means the counter was already 0.
            let _ = irqfd.read();
        }
    }

    fn signal(&self, bit: u32) -> io::Result<()> {
        self.status.fetch_or(bit, Ordering::AcqRel);
        match &self.signal {
            Signal::Msix(vectors) if bit == VIRTIO_MMIO_INT_CONFIG => vectors.signal_config(),
            Signal::Msix(vectors) => vectors.signal_all_queues(),
            Signal::Line(irqfd) => irqfd.write(1),
            // The frontend owns the configuration space and its interrupt.
            Signal::Vrings { .. } if bit == VIRTIO_MMIO_INT_CONFIG => Ok(()),
            Signal::Vrings { calls, .. } => calls.iter().try_for_each(|fd| notify(fd.as_ref())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_bits_and_irqfd() {
        let irq = VirtioInterrupt::new().expect("eventfd");
        irq.signal_used_queue().expect("signal");
        irq.signal_used_queue().expect("signal");
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_VRING);
        let irqfd = irq.irqfd().expect("one line");
        assert_eq!(irqfd.read().expect("irqfd written"), 2);
        irq.set_needs_reset().expect("signal");
        assert!(irq.needs_reset());
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG);
        irq.ack(VIRTIO_MMIO_INT_VRING);
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_CONFIG);
        irq.reset();
        assert_eq!(irq.status(), 0);
        assert!(!irq.needs_reset());
        assert!(irqfd.read().is_err(), "irqfd drained by reset");
    }

    #[test]
    fn vrings_signal_their_own_call_fds_and_report_a_reset_on_the_error_fds() {
        let fd = || EventFd::new(EFD_NONBLOCK).expect("eventfd");
        let calls = [fd(), fd(), fd()];
        let errors = [fd(), fd()];
        let clone = |fd: &EventFd| Some(fd.try_clone().expect("dup"));
        // Ring 3 is polled (no call fd), ring 2 has no error fd.
        let irq = VirtioInterrupt::vrings(
            vec![clone(&calls[0]), clone(&calls[1]), clone(&calls[2]), None],
            vec![clone(&errors[0]), clone(&errors[1])],
        );
        let count = |fd: &EventFd| fd.read().unwrap_or(0);
        irq.signal_queue_pair(0, 1).expect("signal");
        assert_eq!([&calls[0], &calls[1], &calls[2]].map(count), [1, 1, 0]);
        irq.signal_queue(2).expect("signal");
        irq.signal_queue(3).expect("a polled ring needs nothing");
        irq.signal_queue(9).expect("no such ring: nothing");
        assert_eq!([&calls[0], &calls[1], &calls[2]].map(count), [0, 0, 1]);
        irq.signal_config_change().expect("the frontend's business");
        assert_eq!([&calls[0], &calls[1], &calls[2]].map(count), [0, 0, 0]);
        irq.set_needs_reset().expect("signal");
        assert!(irq.needs_reset());
        assert_eq!([&errors[0], &errors[1]].map(count), [1, 1]);
        assert_eq!([&calls[0], &calls[1], &calls[2]].map(count), [0, 0, 0]);
    }

    #[test]
    fn queue_pair_signals_its_own_vectors_once_each() {
        use crate::pci::msix::{MsixTable, MSIX_CTRL_ENABLE};
        // Queues 0..4 (two pairs); vectors 0..3, all unmasked.
        let vectors = Arc::new(MsixVectors::new(4, 4).expect("eventfds"));
        let mut table = MsixTable::new(vectors.clone());
        table.write_message_control(MSIX_CTRL_ENABLE);
        for v in 0..4u64 {
            assert!(
                table.write_table(v * 16 + 12, &0u32.to_le_bytes()),
                "unmask {v}"
            );
        }
        let irq = VirtioInterrupt::with_msix(vectors.clone());
        assert!(irq.irqfd().is_none(), "no line beside the vectors");
        let fired = |v: u16| vectors.irqfd(v).expect("vector").read().unwrap_or(0);
        // Pair 1 (queues 2, 3) on vectors 2 and 3: only those fire.
        for (q, v) in [(0, 0), (1, 1), (2, 2), (3, 3)] {
            vectors.set_queue_vector(q, v);
        }
        irq.signal_queue_pair(2, 3).expect("signal");
        assert_eq!([fired(0), fired(1), fired(2), fired(3)], [0, 0, 1, 1]);
        // Both queues on one vector: one signal.
        vectors.set_queue_vector(3, 2);
        irq.signal_queue_pair(2, 3).expect("signal");
        assert_eq!([fired(0), fired(1), fired(2), fired(3)], [0, 0, 1, 0]);
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_VRING);
        // One line: one signal for the pair.
        let line = VirtioInterrupt::new().expect("eventfd");
        line.signal_queue_pair(0, 1).expect("signal");
        assert_eq!(line.irqfd().expect("a line").read().expect("written"), 1);
    }
}
