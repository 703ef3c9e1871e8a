//! The control-queue commands of [`VirtioNet`] (see [`crate::ctrl`]).

use crate::ctrl::{
    Ack, Coalescing, ControlQueue, CtrlWait, ACK_OFFSET, CLASS_NOTF_COAL, CLASS_RX, DATA_MAX,
    NOTF_COAL_RX_SET, NOTF_COAL_TX_SET, NOTF_COAL_VQ_GET, NOTF_COAL_VQ_SET, REPLY_MAX,
    REPLY_OFFSET, RX_ALLMULTI, RX_PROMISC, VIRTIO_NET_ERR, VIRTIO_NET_OK,
};
use crate::error::CtrlError;
use crate::features::{NET_F_CTRL_RX, NET_F_CTRL_VQ, NET_F_NOTF_COAL, NET_F_VQ_NOTF_COAL};
use crate::hal::Hal;
use crate::ring::Kick;
use crate::transport::Transport;
use crate::VirtioNet;

/// Little-endian `u32` pair (the payload of TX_SET and RX_SET).
fn coalescing_bytes(c: Coalescing) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&c.max_packets.to_le_bytes());
    b[4..].copy_from_slice(&c.usecs.to_le_bytes());
    b
}

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// True if the control queue is set up (VIRTIO_NET_F_CTRL_VQ negotiated).
    pub fn has_ctrl_vq(&self) -> bool {
        self.cq.is_some()
    }

    /// The control queue's index (`2 · max_virtqueue_pairs` with VIRTIO_NET_F_MQ, else 2),
    /// if it is set up: what [`Transport::queue_vector`] takes to find its MSI-X vector.
    pub fn ctrl_queue_index(&self) -> Option<u16> {
        self.cq.as_ref().map(|cq| cq.ring.index())
    }

    /// Sets how long each control command busy-waits for the device's answer (default:
    /// [`CtrlWait::Polls`] of [`DEFAULT_CTRL_POLLS`](crate::ctrl::DEFAULT_CTRL_POLLS)).
    pub fn set_ctrl_wait(&mut self, wait: CtrlWait) {
        self.ctrl_wait = wait;
    }

    /// Sends one control command and busy-waits for the device's answer: the header
    /// `{class, cmd}`, `data` (device-readable, at most [`DATA_MAX`] bytes), `reply.len()`
    /// device-writable bytes (at most [`REPLY_MAX`]; copied into `reply` when the device
    /// answers) and the ack. One chain is queued, the device notified if it wants it, and the
    /// used ring polled until the chain comes back or the [`CtrlWait`] bound passes.
    ///
    /// `Ok(Ack::Err)` is the device's VIRTIO_NET_ERR (counted in `ctrl_failed`). The caller is
    /// responsible for sending only what the negotiated features allow (the typed helpers
    /// check).
    pub fn control(
        &mut self,
        class: u8,
        cmd: u8,
        data: &[u8],
        reply: &mut [u8],
    ) -> Result<Ack, CtrlError> {
        let wait = self.ctrl_wait;
        let Some(cq) = self.cq.as_mut() else {
            return Err(CtrlError::NotNegotiated("VIRTIO_NET_F_CTRL_VQ"));
        };
        if data.len() > DATA_MAX || reply.len() > REPLY_MAX {
            return Err(CtrlError::TooLarge);
        }
        if cq.ring.is_broken() {
            return Err(CtrlError::Device);
        }
        // Errors up to here: nothing was sent, nothing is counted.
        cq.reclaim_stale()?;
        reply.fill(0);
        cq.write(REPLY_OFFSET, reply);
        cq.queue(class, cmd, data, reply.len())?;
        // Always notified, whatever `avail_event` / NO_NOTIFY say (the decision still runs, to
        // keep the ring's bookkeeping and its fence): commands are rare, a kick the device did
        // not ask for costs one exit, and one it needed but did not get would stall the
        // command for the whole wait.
        let _: Kick = cq.ring.kick_decision();
        self.transport.notify(cq.ring.index());
        let result = wait_for_answer(cq, wait, reply);
        if !matches!(result, Ok(Ack::Ok)) {
            cq.stats.failed += 1;
        }
        if result == Err(CtrlError::Timeout) {
            cq.stats.timeouts += 1;
        }
        result
    }

    /// Sends a command whose only answer is the ack: `Ok(())` on VIRTIO_NET_OK,
    /// [`CtrlError::Rejected`] on VIRTIO_NET_ERR.
    pub(crate) fn command(&mut self, class: u8, cmd: u8, data: &[u8]) -> Result<(), CtrlError> {
        match self.control(class, cmd, data, &mut [])? {
            Ack::Ok => Ok(()),
            Ack::Err => Err(CtrlError::Rejected),
        }
    }

    pub(crate) fn require(&self, feature: u64, name: &'static str) -> Result<(), CtrlError> {
        if self.features & NET_F_CTRL_VQ != 0 && self.features & feature != 0 {
            Ok(())
        } else {
            Err(CtrlError::NotNegotiated(name))
        }
    }

    /// NOTF_COAL TX_SET: the device notifies of used tx buffers after `max_packets` of them
    /// or `usecs` microseconds (needs VIRTIO_NET_F_NOTF_COAL).
    pub fn set_tx_coalescing(&mut self, max_packets: u32, usecs: u32) -> Result<(), CtrlError> {
        self.require(NET_F_NOTF_COAL, "VIRTIO_NET_F_NOTF_COAL")?;
        let data = coalescing_bytes(Coalescing { max_packets, usecs });
        self.command(CLASS_NOTF_COAL, NOTF_COAL_TX_SET, &data)
    }

    /// NOTF_COAL RX_SET: as [`Self::set_tx_coalescing`] for used rx buffers.
    pub fn set_rx_coalescing(&mut self, max_packets: u32, usecs: u32) -> Result<(), CtrlError> {
        self.require(NET_F_NOTF_COAL, "VIRTIO_NET_F_NOTF_COAL")?;
        let data = coalescing_bytes(Coalescing { max_packets, usecs });
        self.command(CLASS_NOTF_COAL, NOTF_COAL_RX_SET, &data)
    }

    /// NOTF_COAL VQ_SET: coalescing of virtqueue `vq` alone (needs
    /// VIRTIO_NET_F_VQ_NOTF_COAL; the device refuses queues that are not rx or tx queues).
    pub fn set_vq_coalescing(
        &mut self,
        vq: u16,
        max_packets: u32,
        usecs: u32,
    ) -> Result<(), CtrlError> {
        self.require(NET_F_VQ_NOTF_COAL, "VIRTIO_NET_F_VQ_NOTF_COAL")?;
        let mut data = [0u8; 12];
        data[..2].copy_from_slice(&vq.to_le_bytes());
        data[4..].copy_from_slice(&coalescing_bytes(Coalescing { max_packets, usecs }));
        self.command(CLASS_NOTF_COAL, NOTF_COAL_VQ_SET, &data)
    }

    /// NOTF_COAL VQ_GET: the coalescing parameters of virtqueue `vq` (needs
    /// VIRTIO_NET_F_VQ_NOTF_COAL).
    pub fn get_vq_coalescing(&mut self, vq: u16) -> Result<Coalescing, CtrlError> {
        self.require(NET_F_VQ_NOTF_COAL, "VIRTIO_NET_F_VQ_NOTF_COAL")?;
        let mut data = [0u8; 4];
        data[..2].copy_from_slice(&vq.to_le_bytes());
        let mut reply = [0u8; 8];
        match self.control(CLASS_NOTF_COAL, NOTF_COAL_VQ_GET, &data, &mut reply)? {
            Ack::Ok => Ok(Coalescing {
                max_packets: u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]),
                usecs: u32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]),
            }),
            Ack::Err => Err(CtrlError::Rejected),
        }
    }

    /// RX PROMISC: promiscuous mode on or off (needs VIRTIO_NET_F_CTRL_RX, see
    /// [`crate::Config::ctrl_rx`]).
    pub fn set_promisc(&mut self, on: bool) -> Result<(), CtrlError> {
        self.require(NET_F_CTRL_RX, "VIRTIO_NET_F_CTRL_RX")?;
        self.command(CLASS_RX, RX_PROMISC, &[u8::from(on)])
    }

    /// RX ALLMULTI: all-multicast mode on or off (needs VIRTIO_NET_F_CTRL_RX).
    pub fn set_allmulti(&mut self, on: bool) -> Result<(), CtrlError> {
        self.require(NET_F_CTRL_RX, "VIRTIO_NET_F_CTRL_RX")?;
        self.command(CLASS_RX, RX_ALLMULTI, &[u8::from(on)])
    }
}

/// Polls `cq`'s used ring for the command just queued, within `wait`; copies the reply out.
fn wait_for_answer(
    cq: &mut ControlQueue,
    wait: CtrlWait,
    reply: &mut [u8],
) -> Result<Ack, CtrlError> {
    let start = match wait {
        CtrlWait::Clock { now, .. } => now(),
        CtrlWait::Polls(_) => 0,
    };
    let mut polls = 0u32;
    let used = loop {
        match cq.ring.pop_used() {
            Ok(Some(used)) => break used,
            Ok(None) => {}
            Err(_) => {
                // A used entry that is not our chain (or a broken ring): ours is still out.
                cq.stats.device_errors += 1;
                return Err(CtrlError::Device);
            }
        }
        polls = polls.saturating_add(1);
        let expired = match wait {
            CtrlWait::Polls(max) => polls >= max,
            CtrlWait::Clock { now, ticks } => now().wrapping_sub(start) >= ticks,
        };
        if expired {
            return Err(CtrlError::Timeout);
        }
        core::hint::spin_loop();
    };
    cq.in_flight = false;
    let mut ack = [0u8];
    cq.read(ACK_OFFSET, &mut ack);
    match ack[0] {
        VIRTIO_NET_OK => {
            // The used length counts the bytes the device wrote: ack and reply.
            let written = reply.len() as u32 + 1;
            if !reply.is_empty() && used.len < written {
                return Err(CtrlError::ShortReply {
                    len: used.len,
                    expected: written,
                });
            }
            cq.read(REPLY_OFFSET, reply);
            Ok(Ack::Ok)
        }
        VIRTIO_NET_ERR => Ok(Ack::Err),
        other => Err(CtrlError::BadAck(other)),
    }
}
