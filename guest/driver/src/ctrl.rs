//! The control virtqueue (VIRTIO_NET_F_CTRL_VQ, virtio 1.2 §5.1.6.5): synchronous commands
//! ([`crate::VirtioNet::control`]) and typed helpers for notification coalescing
//! (VIRTIO_NET_F_NOTF_COAL, VIRTIO_NET_F_VQ_NOTF_COAL) and the receive mode
//! (VIRTIO_NET_F_CTRL_RX); the device statistics (VIRTIO_NET_F_DEVICE_STATS) are in
//! [`crate::stats`].
//!
//! A command is one descriptor chain, laid out as Linux's `virtnet_send_command` lays it out:
//! the device-readable header `{u8 class; u8 command}`, the device-readable command data (if
//! any), the device-writable `u8 ack` ([`VIRTIO_NET_OK`] or [`VIRTIO_NET_ERR`]) and the
//! device-writable result (if any), in that order (virtio 1.3 §5.1.6.5). The driver queues one command at a time, kicks
//! (always: notification suppression is not trusted for this rare path) and busy-waits on the
//! used ring, bounded by [`CtrlWait`]; the queue's interrupts are off (as in Linux, whose
//! control queue has no callback), so commands never add to the interrupt count. None of this
//! touches the rx or tx queues. The control queue is queue 2, or `2N` with N queue pairs
//! ([`crate::mq`]).
//!
//! A command the device has not answered when the wait ends stays queued (its buffers belong
//! to the device until it returns them): later commands fail with [`CtrlError::Busy`] until the
//! device returns it, and then go ahead.

use core::fmt;

use crate::error::CtrlError;
use crate::hal::{DmaRegion, Hal};
use crate::ring::{Access, Buffer};
use crate::vring::Vring;

/// The device accepted the command.
pub const VIRTIO_NET_OK: u8 = 0;
/// The device refused the command.
pub const VIRTIO_NET_ERR: u8 = 1;

/// Class RX (needs VIRTIO_NET_F_CTRL_RX); command data: one `u8` (0 off, 1 on).
pub const CLASS_RX: u8 = 0;
/// RX: promiscuous mode on or off.
pub const RX_PROMISC: u8 = 0;
/// RX: all-multicast mode on or off.
pub const RX_ALLMULTI: u8 = 1;

/// Class MQ: multiqueue (needs VIRTIO_NET_F_MQ).
pub const CLASS_MQ: u8 = 4;
/// MQ: `le16 virtqueue_pairs`, the queue pairs the device uses from now on.
pub const MQ_VQ_PAIRS_SET: u8 = 0;

/// Class NOTF_COAL: notification coalescing.
pub const CLASS_NOTF_COAL: u8 = 6;
/// NOTF_COAL (needs VIRTIO_NET_F_NOTF_COAL): `le32 tx_max_packets; le32 tx_usecs`.
pub const NOTF_COAL_TX_SET: u8 = 0;
/// NOTF_COAL (needs VIRTIO_NET_F_NOTF_COAL): `le32 rx_max_packets; le32 rx_usecs`.
pub const NOTF_COAL_RX_SET: u8 = 1;
/// NOTF_COAL (needs VIRTIO_NET_F_VQ_NOTF_COAL):
/// `le16 vqn; le16 reserved; le32 max_packets; le32 max_usecs`.
pub const NOTF_COAL_VQ_SET: u8 = 2;
/// NOTF_COAL (needs VIRTIO_NET_F_VQ_NOTF_COAL): request `le16 vqn; le16 reserved`, reply
/// `le32 max_packets; le32 max_usecs`.
pub const NOTF_COAL_VQ_GET: u8 = 3;

/// Control queue size asked for (lowered to the device's maximum).
pub(crate) const CTRL_QUEUE_SIZE: u16 = 8;
/// Descriptors of the longest command chain (header, data, reply, ack).
pub(crate) const CTRL_MAX_CHAIN: u16 = 4;

/// Largest command data [`crate::VirtioNet::control`] sends.
pub const DATA_MAX: usize = 2016;
/// Largest reply [`crate::VirtioNet::control`] receives (ack excluded).
pub const REPLY_MAX: usize = 1024;

/// Layout of the command buffer (one page, reused by every command).
const HDR_OFFSET: usize = 0;
const DATA_OFFSET: usize = 16;
pub(crate) const REPLY_OFFSET: usize = 2048;
pub(crate) const ACK_OFFSET: usize = REPLY_OFFSET + REPLY_MAX;
/// Bytes of the command buffer.
pub(crate) const CTRL_BUF_BYTES: usize = ACK_OFFSET + 1;
/// Written to the ack byte before a command is queued: a device that returns the chain without
/// writing the ack is caught ([`CtrlError::BadAck`]).
const ACK_UNSET: u8 = 0xff;

/// Default bound of a command's wait: polls of the used ring (well under a second on a host
/// CPU; a device that answers at all answers within microseconds).
pub const DEFAULT_CTRL_POLLS: u32 = 1 << 24;

/// The device's answer to a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    /// VIRTIO_NET_OK.
    Ok,
    /// VIRTIO_NET_ERR.
    Err,
}

/// How long [`crate::VirtioNet::control`] busy-waits for the device's answer (see
/// [`crate::VirtioNet::set_ctrl_wait`]).
#[derive(Clone, Copy, Debug)]
pub enum CtrlWait {
    /// Poll the used ring at most this many times (at least once).
    Polls(u32),
    /// Poll until `now()` has advanced by `ticks` from the kick (any monotonic clock: the TSC
    /// in a guest, nanoseconds on a host thread).
    Clock {
        /// The clock.
        now: fn() -> u64,
        /// The bound, in the clock's units.
        ticks: u64,
    },
}

impl Default for CtrlWait {
    fn default() -> Self {
        CtrlWait::Polls(DEFAULT_CTRL_POLLS)
    }
}

/// Notification coalescing parameters of a queue (or of all rx or tx queues).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coalescing {
    /// Used buffers after which the device notifies (0 or 1: every one).
    pub max_packets: u32,
    /// Microseconds after which the device notifies of pending used buffers (0: no delay).
    pub usecs: u32,
}

impl fmt::Display for Coalescing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.max_packets, self.usecs)
    }
}

/// The control queue's counters; [`crate::VirtioNet::counters`] reports them as the `ctrl_*`
/// fields of [`crate::Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CtrlStats {
    /// `ctrl_commands`.
    pub(crate) commands: u64,
    /// `ctrl_failed`.
    pub(crate) failed: u64,
    /// `ctrl_timeouts`.
    pub(crate) timeouts: u64,
    /// This queue's share of `device_errors`.
    pub(crate) device_errors: u64,
}

/// The control virtqueue and its command buffer.
pub(crate) struct ControlQueue {
    pub(crate) ring: Vring<()>,
    /// One page: header, data, reply and ack of the command in flight.
    buf: DmaRegion,
    /// A command is queued and not yet returned by the device.
    pub(crate) in_flight: bool,
    pub(crate) stats: CtrlStats,
}

impl ControlQueue {
    /// A control queue over `ring` (interrupts off from the start) and `buf` (at least
    /// [`CTRL_BUF_BYTES`]).
    pub(crate) fn new(mut ring: Vring<()>, buf: DmaRegion) -> ControlQueue {
        debug_assert!(buf.len() >= CTRL_BUF_BYTES);
        ring.disable_interrupts();
        ControlQueue {
            ring,
            buf,
            in_flight: false,
            stats: CtrlStats::default(),
        }
    }

    /// Copies `data` to byte `offset` of the command buffer.
    pub(crate) fn write(&mut self, offset: usize, data: &[u8]) {
        let Some(p) = self.buf.ptr_at(offset, data.len()) else {
            unreachable!("control buffer offset {offset} outside its region");
        };
        // SAFETY: `p` is valid for `data.len()` bytes inside the region (checked by `ptr_at`);
        // no command is in flight (callers check `in_flight`), so the device does not access the
        // buffer, and `data` is a borrowed slice outside DMA memory.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    }

    /// Copies bytes from `offset` of the command buffer into `out`.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) {
        let Some(p) = self.buf.ptr_at(offset, out.len()) else {
            unreachable!("control buffer offset {offset} outside its region");
        };
        // SAFETY: as in `write`; called after the device returned the chain (its writes were
        // published before the used index the ring loaded with Acquire).
        unsafe { core::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
    }

    /// Collects the answer to a command that timed out earlier, if the device has given it.
    pub(crate) fn reclaim_stale(&mut self) -> Result<(), CtrlError> {
        if !self.in_flight {
            return Ok(());
        }
        match self.ring.pop_used() {
            Ok(Some(_)) => {
                self.in_flight = false;
                Ok(())
            }
            Ok(None) => Err(CtrlError::Busy),
            Err(_) => {
                self.stats.device_errors += 1;
                Err(CtrlError::Device)
            }
        }
    }

    /// Writes one command into the buffer, queues its chain and publishes it.
    pub(crate) fn queue(
        &mut self,
        class: u8,
        cmd: u8,
        data: &[u8],
        reply_len: usize,
    ) -> Result<(), CtrlError> {
        self.write(HDR_OFFSET, &[class, cmd]);
        self.write(DATA_OFFSET, data);
        self.write(ACK_OFFSET, &[ACK_UNSET]);
        let base = self.buf.paddr();
        let mut chain = [Buffer {
            addr: base + HDR_OFFSET as u64,
            len: 2,
            access: Access::DeviceReads,
        }; CTRL_MAX_CHAIN as usize];
        let mut n = 1;
        // Lengths are bounded by DATA_MAX and REPLY_MAX: they fit u32.
        if !data.is_empty() {
            chain[n] = Buffer {
                addr: base + DATA_OFFSET as u64,
                len: data.len() as u32,
                access: Access::DeviceReads,
            };
            n += 1;
        }
        // The ack first, then the result (virtio 1.3 §5.1.6.5, as Linux lays it out).
        chain[n] = Buffer {
            addr: base + ACK_OFFSET as u64,
            len: 1,
            access: Access::DeviceWrites,
        };
        n += 1;
        if reply_len > 0 {
            chain[n] = Buffer {
                addr: base + REPLY_OFFSET as u64,
                len: reply_len as u32,
                access: Access::DeviceWrites,
            };
            n += 1;
        }
        // One command at a time on a ring of at least CTRL_MAX_CHAIN descriptors: never full,
        // unless the device broke the ring's bookkeeping.
        self.ring
            .add(&chain[..n], ())
            .map_err(|_| CtrlError::Device)?;
        self.in_flight = true;
        self.stats.commands += 1;
        self.ring.publish();
        Ok(())
    }

    /// Frees the ring and the command buffer.
    ///
    /// # Safety
    ///
    /// As [`crate::hal::DmaRegion::dealloc`] for both regions: they came from `hal`, the device
    /// no longer uses them (it was reset), and nothing uses them afterwards.
    pub(crate) unsafe fn dealloc<H: Hal>(&self, hal: &H) {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.ring.dealloc(hal);
            self.buf.dealloc(hal);
        }
    }
}
