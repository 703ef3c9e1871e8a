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
/// The device has a control virtqueue (queue 2 without multiqueue).
pub const NET_F_CTRL_VQ: u64 = 1 << 17;
/// Several queue pairs (`max_virtqueue_pairs` in the configuration space, enabled with the
/// control queue's MQ VQ_PAIRS_SET; requires CTRL_VQ).
pub const NET_F_MQ: u64 = 1 << 22;
/// Control class RX: promiscuous and all-multicast modes (requires CTRL_VQ).
pub const NET_F_CTRL_RX: u64 = 1 << 18;
/// Control class NOTF_COAL: TX_SET and RX_SET, device-wide notification coalescing (requires
/// CTRL_VQ).
pub const NET_F_NOTF_COAL: u64 = 1 << 53;
/// Per-queue reset (virtio 1.2 §2.6.1): one queue can be reset and re-enabled while the others
/// run ([`crate::VirtioNet::reset_queue`]).
pub const F_RING_RESET: u64 = 1 << 40;
/// Control class NOTF_COAL: VQ_SET and VQ_GET, per-virtqueue notification coalescing (requires
/// CTRL_VQ).
pub const NET_F_VQ_NOTF_COAL: u64 = 1 << 52;

/// The packed virtqueue layout (virtio 1.2 §2.8) instead of the split one (negotiated with
/// [`Config::packed`](crate::Config::packed)).
pub const F_RING_PACKED: u64 = 1 << 34;
/// The device uses buffers in the order they were made available (and may return a batch with
/// one used entry; negotiated with [`Config::in_order`](crate::Config::in_order)).
pub const F_IN_ORDER: u64 = 1 << 35;

/// Control class STATS: QUERY and GET, the device's per-queue counters (requires CTRL_VQ).
pub const NET_F_DEVICE_STATS: u64 = 1 << 50;

/// The features the driver acknowledges out of `offered` under `config`: VERSION_1, MAC,
/// STATUS, RING_RESET (harmless if never used: it only adds a register), and EVENT_IDX, MRG_RXBUF, CSUM as `config` says; with `config.ctrl_vq` the control
/// queue (CTRL_VQ) with NOTF_COAL and VQ_NOTF_COAL, CTRL_RX if `config.ctrl_rx` too and
/// DEVICE_STATS if `config.device_stats` (each only if CTRL_VQ is offered: the spec makes them
/// depend on it); with `config.queue_pairs` > 1
/// also MQ (likewise only with CTRL_VQ); RING_PACKED with `config.packed` and IN_ORDER with
/// `config.in_order`. Nothing else (no indirect
/// descriptors, no receive offloads: received frames never carry partial checksums).
pub fn acknowledged(offered: u64, config: &Config) -> u64 {
    let mut wanted = F_VERSION_1 | NET_F_MAC | NET_F_STATUS | F_RING_RESET;
    if config.event_idx {
        wanted |= RING_F_EVENT_IDX;
    }
    if config.mrg_rxbuf {
        wanted |= NET_F_MRG_RXBUF;
    }
    if config.csum {
        wanted |= NET_F_CSUM;
    }
    if config.packed {
        wanted |= F_RING_PACKED;
    }
    if config.in_order {
        wanted |= F_IN_ORDER;
    }
    if config.ctrl_vq && offered & NET_F_CTRL_VQ != 0 {
        wanted |= NET_F_CTRL_VQ | NET_F_NOTF_COAL | NET_F_VQ_NOTF_COAL;
        if config.ctrl_rx {
            wanted |= NET_F_CTRL_RX;
        }
        if config.device_stats {
            wanted |= NET_F_DEVICE_STATS;
        }
        if config.queue_pairs > 1 {
            wanted |= NET_F_MQ;
        }
    }
    offered & wanted
}
