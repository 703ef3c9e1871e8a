//! Reading the device's counters over the control queue (see [`crate::stats`]).

use crate::ctrl::Ack;
use crate::error::CtrlError;
use crate::features::NET_F_DEVICE_STATS;
use crate::hal::Hal;
use crate::stats::{
    parse, reply_len, DeviceStats, StatsTypes, CLASS_STATS, ENTRY_LEN, MAX_REPLY_LEN, STATS_GET,
    STATS_QUERY,
};
use crate::transport::Transport;
use crate::VirtioNet;

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// STATS QUERY: the statistics types the device supports (needs
    /// VIRTIO_NET_F_DEVICE_STATS). May include types this driver does not parse; intersect
    /// with [`StatsTypes::PARSED`] before [`Self::get_stats`].
    pub fn query_stats(&mut self) -> Result<StatsTypes, CtrlError> {
        self.require(NET_F_DEVICE_STATS, "VIRTIO_NET_F_DEVICE_STATS")?;
        let mut reply = [0u8; 8];
        match self.control(CLASS_STATS, STATS_QUERY, &[], &mut reply)? {
            Ack::Ok => Ok(StatsTypes(u64::from_le_bytes(reply))),
            Ack::Err => Err(CtrlError::Rejected),
        }
    }

    /// STATS GET of `types` for virtqueue `vq` (needs VIRTIO_NET_F_DEVICE_STATS): one entry,
    /// a reply sized exactly for the blocks, every block header checked (type, queue, size).
    ///
    /// `types` must be non-empty and within [`StatsTypes::PARSED`]
    /// ([`CtrlError::UnsupportedStats`] otherwise, nothing sent). The device refuses types it
    /// does not support or that do not fit the queue (RX_* on a transmit queue, CVQ on a data
    /// queue) and queues that do not exist: [`CtrlError::Rejected`]. A malformed reply is
    /// [`CtrlError::BadStatsReply`].
    pub fn get_stats(&mut self, vq: u16, types: StatsTypes) -> Result<DeviceStats, CtrlError> {
        self.require(NET_F_DEVICE_STATS, "VIRTIO_NET_F_DEVICE_STATS")?;
        if types.is_empty() || !StatsTypes::PARSED.contains(types) {
            return Err(CtrlError::UnsupportedStats(types.0));
        }
        let mut entry = [0u8; ENTRY_LEN];
        entry[..2].copy_from_slice(&vq.to_le_bytes());
        entry[8..].copy_from_slice(&types.0.to_le_bytes());
        let mut buf = [0u8; MAX_REPLY_LEN];
        let reply = &mut buf[..reply_len(types)];
        match self.control(CLASS_STATS, STATS_GET, &entry, reply)? {
            Ack::Ok => parse(vq, types, reply),
            Ack::Err => Err(CtrlError::Rejected),
        }
    }

    /// The parsed statistics types that fit virtqueue `vq` in this driver's layout: RX_* for
    /// a receive queue of a pair set up, TX_* for a transmit queue, CVQ for the control queue;
    /// empty for any other index. Intersect with [`Self::query_stats`]'s answer.
    pub fn stats_types_of(&self, vq: u16) -> StatsTypes {
        if Some(vq) == self.ctrl_queue_index() {
            StatsTypes::CVQ
        } else if u32::from(vq) >= 2 * u32::from(self.queue_pairs()) {
            StatsTypes::empty()
        } else if vq.is_multiple_of(2) {
            StatsTypes::RX
        } else {
            StatsTypes::TX
        }
    }
}
