//! Feature bits the driver knows, and which of them it acknowledges.

use crate::config::Config;

/// The device has a given MAC address (configuration bytes 0..6).
pub const NET_F_MAC: u64 = 1 << 5;
/// The device handles packets with a partial checksum (transmit checksum offload).
pub const NET_F_CSUM: u64 = 1 << 0;
/// The driver can merge receive buffers (`num_buffers` in the header).
pub const NET_F_MRG_RXBUF: u64 = 1 << 15;
/// The configuration `status` field (link up) is valid.
pub const NET_F_STATUS: u64 = 1 << 16;
/// `used_event` / `avail_event` notification suppression.
pub const RING_F_EVENT_IDX: u64 = 1 << 29;
/// Virtio 1.x (required).
pub const F_VERSION_1: u64 = 1 << 32;

/// The features the driver acknowledges out of `offered` under `config`: VERSION_1, MAC,
/// STATUS, and EVENT_IDX, MRG_RXBUF, CSUM as `config` says. Nothing else (no indirect
/// descriptors, no receive offloads: received frames never carry partial checksums).
pub fn acknowledged(offered: u64, config: &Config) -> u64 {
    let mut wanted = F_VERSION_1 | NET_F_MAC | NET_F_STATUS;
    if config.event_idx {
        wanted |= RING_F_EVENT_IDX;
    }
    if config.mrg_rxbuf {
        wanted |= NET_F_MRG_RXBUF;
    }
    if config.csum {
        wanted |= NET_F_CSUM;
    }
    offered & wanted
}
