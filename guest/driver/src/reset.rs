//! Per-queue reset (VIRTIO_F_RING_RESET, virtio 1.2 §2.6.1): [`VirtioNet::reset_queue`] resets
//! one data queue while the other keeps running, takes back every buffer the device did not
//! use, and brings the queue back on the same (re-zeroed) rings.
//!
//! The sequence, once the feature is negotiated and DRIVER_OK set:
//!
//! 1. [`Transport::reset_queue`]: select the queue, write 1 to its reset register, poll until
//!    the register reads 0 and the queue reads disabled. The device no longer touches the
//!    rings; what it marked used stays in the used ring, everything else is the driver's;
//! 2. pop what the device did return: tx chains were sent (reclaimed as usual, counted in
//!    `tx_completed_at_reset`); rx buffers the device wrote but nobody polled are dropped
//!    (`rx_buffers_dropped_at_reset`: poll before resetting to keep them);
//! 3. take the chains still in flight off the ring: rx buffers go back to the pool and are
//!    posted again (`rx_buffers_reclaimed`); tx frames were **not sent** and are never
//!    completed later (`tx_frames_not_sent`: copy buffers freed, XDP_TX buffers given back to
//!    the rx pool, AF_XDP frames completed to the port so the umem frame is not lost);
//! 4. zero the ring memory and the ring's indexes (the device starts the queue again at index
//!    0), program size and addresses (and on PCI the MSI-X vector) with
//!    [`Transport::setup_queue`], which enables the queue; check DEVICE_NEEDS_RESET; post rx
//!    buffers and kick.
//!
//! The control queue cannot be reset (virtio-net refuses it), so [`QueueId`] names only the
//! data queues.
//!
//! [`VirtioNet::reset_queue`]: crate::VirtioNet::reset_queue
//! [`Transport::reset_queue`]: crate::Transport::reset_queue
//! [`Transport::setup_queue`]: crate::Transport::setup_queue
//! [`QueueId`]: crate::QueueId

use core::fmt;

use crate::error::InitError;

/// Reads of the reset register [`VirtioNet::reset_queue`] allows before giving up. Each read is
/// an exit to the VMM on real hardware (microseconds); the VMM answers within its worker's
/// turnaround (normally microseconds, bounded by its own wait), so this bound is only reached by
/// a device that never completes the reset.
///
/// [`VirtioNet::reset_queue`]: crate::VirtioNet::reset_queue
pub const QUEUE_RESET_POLLS: u32 = 1 << 20;

/// Why a per-queue reset failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueResetError {
    /// VIRTIO_F_RING_RESET was not negotiated (the device did not offer it).
    NotNegotiated,
    /// The transport has no per-queue reset register.
    Unsupported,
    /// The transport has no such queue.
    NoSuchQueue(u16),
    /// The reset register did not read 0 (or the queue did not read disabled) within the poll
    /// bound: the queue is left reset or resetting; the driver reports itself broken
    /// ([`VirtioNet::is_broken`]): drop it and start over.
    ///
    /// [`VirtioNet::is_broken`]: crate::VirtioNet::is_broken
    Timeout,
    /// Re-enabling the queue failed (the device is marked FAILED).
    Setup(InitError),
    /// The device set DEVICE_NEEDS_RESET when the queue was re-enabled (e.g. it refused the
    /// rings): drop the driver and start over.
    DeviceNeedsReset,
}

impl fmt::Display for QueueResetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueResetError::NotNegotiated => write!(f, "VIRTIO_F_RING_RESET not negotiated"),
            QueueResetError::Unsupported => write!(f, "the transport has no queue reset"),
            QueueResetError::NoSuchQueue(q) => write!(f, "no queue {q}"),
            QueueResetError::Timeout => write!(f, "the queue reset did not complete"),
            QueueResetError::Setup(e) => write!(f, "re-enabling the queue failed: {e}"),
            QueueResetError::DeviceNeedsReset => {
                write!(f, "the device needs a reset after re-enabling the queue")
            }
        }
    }
}

impl core::error::Error for QueueResetError {}

/// What one [`VirtioNet::reset_queue`] found.
///
/// [`VirtioNet::reset_queue`]: crate::VirtioNet::reset_queue
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueResetReport {
    /// Entries the device had marked used before the reset: tx chains sent (reclaimed), or rx
    /// buffers written but not polled (dropped).
    pub used: usize,
    /// Chains still in flight, taken back: tx frames not sent, or rx buffers the device did not
    /// fill (posted again).
    pub unused: usize,
}

/// One queue's reset counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ResetStats {
    /// Resets completed (queue re-enabled).
    pub(crate) resets: u64,
    /// Resets that failed.
    pub(crate) failed: u64,
    /// Sum of [`QueueResetReport::used`].
    pub(crate) used: u64,
    /// Sum of [`QueueResetReport::unused`].
    pub(crate) unused: u64,
}

/// The per-queue reset counters ([`VirtioNet::reset_counters`]). All start at 0 and only grow.
///
/// [`VirtioNet::reset_counters`]: crate::VirtioNet::reset_counters
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResetCounters {
    /// Rx queue resets completed.
    pub rx_resets: u64,
    /// Tx queue resets completed.
    pub tx_resets: u64,
    /// Resets of either queue that failed.
    pub failed: u64,
    /// Posted rx buffers the device gave back unfilled (posted again).
    pub rx_buffers_reclaimed: u64,
    /// Rx buffers the device had filled and returned but nobody polled before the reset
    /// (dropped; one per frame without MRG_RXBUF).
    pub rx_buffers_dropped_at_reset: u64,
    /// Tx frames the device had not sent when its queue was reset (never completed).
    pub tx_frames_not_sent: u64,
    /// Tx chains the device had sent, reclaimed by the reset.
    pub tx_completed_at_reset: u64,
}
