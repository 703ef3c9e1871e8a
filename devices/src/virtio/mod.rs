//! Virtio devices: the virtio-mmio transport, the device interface it drives, and devices.
//!
//! The transport ([`mmio::MmioTransport`]) owns the register state, the queue configuration
//! and the eventfds; when the driver sets DRIVER_OK it hands a [`VirtioDevice`] an
//! [`ActivationContext`] with everything the datapath needs, and the device moves it all into
//! a worker thread that owns it (no lock shared with the vCPU thread).
//!
//! # Per-queue reset (VIRTIO_F_RING_RESET, virtio 1.2 §2.6.1)
//!
//! Both transports carry it (virtio-pci `queue_reset` at common configuration offset 0x3a,
//! virtio-mmio `QueueReset` at 0x0c0; one implementation in `common::VirtioState`), and offer
//! the feature exactly when the device says [`VirtioDevice::supports_queue_reset`] (virtio-net
//! does; the trait's default refuses). The driver's side, once the feature is negotiated and
//! DRIVER_OK is set:
//!
//! 1. select the queue, write 1 to `queue_reset`;
//! 2. read `queue_reset` until it reads 0 (and `queue_enable` reads 0): the device no longer
//!    touches the queue, and its size, ring addresses and indexes are back to the defaults;
//!    every buffer the device had not marked used belongs to the driver again;
//! 3. program `queue_size`, the three ring addresses (new memory or the same rings
//!    re-initialised with indexes from 0) and, on PCI, `queue_msix_vector`;
//! 4. write 1 to `queue_enable` (mmio: `QueueReady`); then post buffers and notify.
//!
//! Refused with a warning and no effect: a reset before DRIVER_OK, without the feature
//! negotiated, of a queue not in use, not enabled or already reset, a value other than 1, and
//! (virtio-net) a reset of the control queue; queue configuration writes and `queue_enable` of a
//! queue whose reset is still ongoing. Rings given at re-enable get the activation's checks
//! (transport: ready, aligned, inside guest memory, avail ring not at 0; device: the same
//! [`ring::AnyRing::new`] checks as at activation, so the used ring may not overlap what the
//! device reads, and a packed ring restarts at offset 0 with wrap counter 1); unusable ones set
//! DEVICE_NEEDS_RESET.
//!
//! **Ack model.** The write runs on the vCPU thread and must not wait for the datapath for
//! long. virtio-net sends the reset to the pair's worker over its command channel (an eventfd
//! wakes its epoll loop, which handles it between two bounded datapath calls: normally within
//! microseconds) and waits for the worker's answer at most
//! [`net::device::QUEUE_RESET_WAIT`] (20 ms). Past that, the write returns and `queue_reset`
//! reads 1 until the answer comes (each read polls it), as the spec allows; Linux's
//! `vp_modern_set_queue_reset` polls exactly so. What the worker does on the reset: every
//! datapath call has already published its used entries, so what was sent or received is the
//! driver's; it then drops the rx pool (chains popped ahead of frames are never filled: they go
//! back to the driver with the ring), clears its tx wait/park state, and forgets the ring's
//! host pointers ([`net::rx::RxQueue::detach`], [`net::tx::TxQueue::detach`]). A tx chain the
//! backend refused (EAGAIN) was not sent and is not used. Kicks for the queue are drained and
//! ignored; frames for a reset rx queue wait in the tap. Every other queue, including the other
//! direction of the same pair on the same worker, keeps running. Re-enable checks the rings on
//! the vCPU thread and hands the resolved ring to the worker without waiting; the worker
//! attaches it (rate limiter and its bucket levels kept, so resets do not refill them) and runs
//! the queue at once. Counted in `queue_resets` and `queue_reenables`.
//!
//! # VIRTIO_F_ACCESS_PLATFORM
//!
//! Offered by the PCI transport for every device ([`pci::TRANSPORT_FEATURES`]), not by
//! virtio-mmio. There is no vIOMMU, so the addresses a driver gives are guest-physical with or
//! without it; negotiating it only makes a Linux guest use its DMA API for the rings and
//! buffers, which AF_XDP zero-copy in virtio_net requires (`virtqueue_dma_dev`). A driver may
//! decline it; both ways work identically on the device side.

#![warn(missing_docs)]

pub mod chain;
mod common;
mod guest;
pub mod irq;
pub mod mmio;
pub mod net;
pub mod packed;
pub mod pci;
pub mod ring;
pub mod vhost_user;
pub mod vring;

use std::io;
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

pub use irq::VirtioInterrupt;
pub use mmio::MmioTransport;

/// What a device receives when the driver sets DRIVER_OK.
#[derive(Debug)]
pub struct ActivationContext {
    /// Guest memory (a cheap clone sharing the mappings).
    pub mem: GuestMemoryMmap,
    /// The queues as the driver configured them, in queue-index order, EVENT_IDX already set
    /// from the negotiated features. Every queue is ready and lies inside guest memory. Only
    /// the device's [`VirtioDevice::queues_in_use`] first queues are passed.
    pub queues: Vec<Queue>,
    /// The queue notification eventfds (clones of the ones the VMM registered as ioeventfds),
    /// in queue-index order.
    pub kicks: Vec<EventFd>,
    /// The device's interrupt line.
    pub interrupt: Arc<VirtioInterrupt>,
    /// The features the driver acknowledged (a subset of the offered ones, with VERSION_1).
    pub acked_features: u64,
    /// Where each queue's ring resumes, in queue-index order (vhost-user's SET_VRING_BASE, a
    /// snapshot); missing or `None`: the queue's own indexes, a packed ring's start.
    pub positions: Vec<Option<ring::RingPosition>>,
}

/// Why a device could not be activated. The transport then sets DEVICE_NEEDS_RESET.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The transport passed a different number of queues than the device has.
    #[error("expected {expected} queues, got {got}")]
    QueueCount {
        /// Queues the device has.
        expected: usize,
        /// Queues passed.
        got: usize,
    },
    /// The backend is gone (a previous worker could not hand it back).
    #[error("the device backend is unavailable")]
    BackendUnavailable,
    /// Configuring the backend for the negotiated features failed.
    #[error("failed to configure the backend")]
    Backend(#[source] io::Error),
    /// A queue's rings are unusable (misaligned, outside guest memory, or the used ring
    /// overlapping what the device reads).
    #[error("a queue's rings are unusable")]
    Ring(#[source] ring::RingError),
    /// Creating the worker's eventfds or epoll failed.
    #[error("failed to set up the worker's event loop")]
    EventLoop(#[source] io::Error),
    /// Spawning the worker thread failed.
    #[error("failed to spawn the worker thread")]
    Spawn(#[source] io::Error),
    /// A queue cannot be enabled again after its reset (not reset, not a datapath queue, the
    /// device does not reset queues, or its datapath did not answer in time).
    #[error("the queue cannot be enabled after a reset")]
    QueueReset,
}

/// A driver-acknowledged feature set the device refuses (FEATURES_OK then does not stick).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("feature {feature} requires {requires}")]
pub struct FeatureDependencyError {
    /// The feature acknowledged without its prerequisite.
    pub feature: &'static str,
    /// The missing prerequisite.
    pub requires: &'static str,
}

/// Where a per-queue reset (VIRTIO_F_RING_RESET) stands, as the device reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueResetState {
    /// The device does not reset this queue (the transport leaves it running and warns).
    Refused,
    /// The datapath has not yet confirmed that it stopped using the queue; ask again with
    /// [`VirtioDevice::poll_queue_reset`] (the driver reads `queue_reset` as 1 meanwhile).
    Ongoing,
    /// The queue is stopped: nothing of it is used or signalled until it is enabled again.
    Done,
}

/// A virtio device as the transport sees it (slow path only: registers and lifecycle).
pub trait VirtioDevice: Send {
    /// The virtio device ID (1 for net).
    fn device_type(&self) -> u32;

    /// A name for log lines (e.g. the network device's tap), empty when it has none.
    fn label(&self) -> &str {
        ""
    }

    /// The maximum size of each queue, in queue-index order (each a power of two ≤ 32768).
    fn queue_max_sizes(&self) -> &[u16];

    /// The features the device offers (including VIRTIO_F_VERSION_1).
    fn features(&self) -> u64;

    /// How many queues (the first ones, in queue-index order) the driver must set up with
    /// the features `acked`: all by default. A device with a queue that exists only with a
    /// feature (e.g. virtio-net's control queue) says fewer when it is not negotiated; the
    /// transport then ignores the others.
    fn queues_in_use(&self, acked: u64) -> usize {
        let _ = acked;
        self.queue_max_sizes().len()
    }

    /// Whether the driver may leave queue `index` (below [`Self::queues_in_use`]) disabled at
    /// DRIVER_OK with the features `acked` (virtio-net: the queue pairs past the first under
    /// VIRTIO_NET_F_MQ). Such a queue reaches [`Self::activate`] not ready. None by default.
    fn queue_optional(&self, index: usize, acked: u64) -> bool {
        let _ = (index, acked);
        false
    }

    /// Device-specific checks of the acknowledged features (e.g. dependencies between them),
    /// run when the driver sets FEATURES_OK. `acked` is already a subset of [`Self::features`].
    fn validate_features(&self, acked: u64) -> Result<(), FeatureDependencyError> {
        let _ = acked;
        Ok(())
    }

    /// Reads device configuration space at `offset`; bytes past its end read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// Writes device configuration space at `offset`.
    fn write_config(&mut self, offset: u64, data: &[u8]);

    /// The configuration generation: changes whenever the configuration space changes.
    fn config_generation(&self) -> u32 {
        0
    }

    /// Starts the datapath. On error the device must be left resettable.
    fn activate(&mut self, ctx: ActivationContext) -> Result<(), ActivateError>;

    /// Stops the datapath (joins the worker) and returns to the pre-activation state.
    fn reset(&mut self);

    /// [`Self::reset`], reporting first where each queue's ring stands (queue-index order;
    /// `None` for a queue that did not run), every chain the datapath took used or handed
    /// back: an activation given these positions resumes exactly there. A device that cannot
    /// tell reports nothing.
    fn pause(&mut self) -> Vec<Option<ring::RingPosition>> {
        self.reset();
        Vec::new()
    }

    /// True while the datapath runs (between a successful activation and the next reset).
    fn is_active(&self) -> bool;

    /// Whether [`Self::reset_queue`] and [`Self::enable_queue`] work for this device's
    /// datapath queues. The transport offers VIRTIO_F_RING_RESET only then.
    fn supports_queue_reset(&self) -> bool {
        false
    }

    /// Per-queue reset (virtio 1.2 §2.6.1) of queue `index` while the device runs: the datapath
    /// publishes what it completed, then stops using the queue (no buffer of it is used or
    /// signalled afterwards, its ring addresses are forgotten) while every other queue keeps
    /// running. Must not block for long (it runs on a vCPU thread): a device that cannot
    /// confirm quickly answers [`QueueResetState::Ongoing`].
    fn reset_queue(&mut self, index: usize) -> QueueResetState {
        let _ = index;
        QueueResetState::Refused
    }

    /// Whether the reset of queue `index` that [`Self::reset_queue`] answered `Ongoing` is done.
    fn poll_queue_reset(&mut self, index: usize) -> QueueResetState {
        let _ = index;
        QueueResetState::Done
    }

    /// Restarts queue `index` after its reset, on `queue` as the driver programmed it again
    /// (ready, inside guest memory, EVENT_IDX set from the negotiated features; prepared like
    /// the queues of [`ActivationContext`]). The rings get the same checks as at activation; an
    /// error leaves the queue stopped, and the transport sets DEVICE_NEEDS_RESET.
    fn enable_queue(&mut self, index: usize, queue: Queue) -> Result<(), ActivateError> {
        let _ = (index, queue);
        Err(ActivateError::QueueReset)
    }
}
