//! [`Config`]: the driver's knobs, validated once at [`crate::VirtioNet::new`].

use crate::error::ConfigError;
use crate::header::VNET_HDR_LEN;

/// Largest queue size of a split virtqueue.
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Largest Ethernet frame the driver sends or accepts (a 64 KiB GSO payload plus headers).
pub const MAX_FRAME_LEN: usize = 65536 + 18;
/// Most queue pairs a virtio-net device may have (VIRTIO_NET_CTRL_MQ_VQ_PAIRS_MAX).
pub const MAX_QUEUE_PAIRS: u16 = 0x8000;
/// Smallest rx buffer when MRG_RXBUF is not negotiated: header + a 1518-byte Ethernet frame
/// (1500 MTU, Ethernet header, one VLAN tag). No receive offloads are negotiated, so the device
/// never hands over anything larger.
pub const MIN_RX_BUF_WITHOUT_MRG: u32 = (VNET_HDR_LEN + 1518) as u32;
/// Upper bound of the adaptive kick threshold (Linux found AF_XDP zero-copy transmit best
/// around 8 and erratic above 13 on some devices; 64 leaves room for devices that sleep).
pub const KICK_THRESHOLD_CAP: u16 = 64;
/// Upper bound of the adaptive XDP_TX bulk.
pub const XDP_BULK_MAX: u16 = 64;

/// How used transmit buffers are reclaimed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TxCompletion {
    /// Tx interrupts on; the caller reclaims in a tx poll ([`crate::VirtioNet::reclaim_tx`]) after
    /// an interrupt (Linux napi_tx).
    #[default]
    TxInterrupt,
    /// Tx interrupts off (EVENT_IDX: `used_event` kept far ahead; otherwise NO_INTERRUPT on the
    /// tx ring); used tx buffers are reclaimed at the start of every
    /// [`crate::VirtioNet::poll_rx`], as Linux's `virtnet_poll_cleantx` does. With no receive
    /// traffic nothing is reclaimed unless the caller calls `reclaim_tx`.
    CleanFromRx,
    /// Tx interrupts off; a transmit path reclaims when fewer than a quarter of the tx ring's
    /// descriptors are free.
    Lazy,
}

/// The driver's configuration. Build with struct update syntax over [`Config::default`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Receive queue size (a power of two, 2..=32768; lowered to the device's maximum).
    pub rx_queue_size: u16,
    /// Transmit queue size (as above).
    pub tx_queue_size: u16,
    /// Bytes per rx buffer, header included (one descriptor each). Without MRG_RXBUF it must be
    /// at least [`MIN_RX_BUF_WITHOUT_MRG`].
    pub rx_buf_size: u32,
    /// Bytes per driver-owned tx buffer (copy transmit), header included; the largest frame
    /// [`crate::VirtioNet::transmit`] accepts is this minus 12. Each buffer takes a slot of
    /// this plus 52 bytes rounded up to whole cache lines, so that its frame starts on one.
    pub tx_buf_size: u32,
    /// Transmit paths publish and make a kick decision once every this many frames, once at the
    /// end of each batch, and whenever the tx ring is full (≥ 1; values above the tx queue size
    /// therefore mean "at the end of the batch or when full").
    pub kick_threshold: u16,
    /// How used tx buffers are reclaimed.
    pub tx_completion: TxCompletion,
    /// XDP_TX frames queued before a flush (one publish, one kick decision); 1 transmits each
    /// frame on its own (≥ 1). Queued frames are also flushed at the end of every rx poll; those
    /// that find the tx ring full are dropped.
    pub xdp_bulk: u16,
    /// Negotiate VIRTIO_RING_F_EVENT_IDX if offered (else the NO_NOTIFY / NO_INTERRUPT flags).
    pub event_idx: bool,
    /// Negotiate VIRTIO_NET_F_MRG_RXBUF if offered.
    pub mrg_rxbuf: bool,
    /// Negotiate VIRTIO_NET_F_CSUM if offered (the driver never sends partial checksums, so
    /// this only changes what is negotiated).
    pub csum: bool,
    /// Negotiate VIRTIO_NET_F_CTRL_VQ if offered, with VIRTIO_NET_F_NOTF_COAL and
    /// VIRTIO_NET_F_VQ_NOTF_COAL where offered, and set up the control queue (queue 2) for
    /// [`crate::VirtioNet::control`] and its typed helpers. A device that does not offer
    /// CTRL_VQ is driven exactly as without this knob.
    pub ctrl_vq: bool,
    /// Also negotiate VIRTIO_NET_F_CTRL_RX (with `ctrl_vq`), for
    /// [`crate::VirtioNet::set_promisc`]. Off by default: with CTRL_RX negotiated the receive
    /// filter becomes the driver's to program, which this driver does only when asked.
    pub ctrl_rx: bool,
    /// Also negotiate VIRTIO_NET_F_DEVICE_STATS (with `ctrl_vq`), for
    /// [`crate::VirtioNet::query_stats`] and [`crate::VirtioNet::get_stats`]: the device's own
    /// per-queue counters, read over the control queue. On by default (it changes nothing on
    /// the datapath).
    pub device_stats: bool,
    /// Queue pairs to drive (1..=[`MAX_QUEUE_PAIRS`]). With more than one the driver
    /// negotiates VIRTIO_NET_F_MQ (which needs `ctrl_vq`), sets up that many rx/tx pairs (rx
    /// `2i`, tx `2i + 1`; the control queue at `2 * max_virtqueue_pairs`) and enables them
    /// with VQ_PAIRS_SET; the
    /// device must offer MQ and at least that many `max_virtqueue_pairs` (see [`crate::mq`]).
    /// 1 (the default) drives one pair exactly as without multiqueue, MQ not negotiated.
    pub queue_pairs: u16,
    /// Negotiate VIRTIO_F_RING_PACKED if offered: every queue on the packed virtqueue layout
    /// (virtio 1.2 §2.8) instead of the split one, with the same batching, kick suppression
    /// and completion modes. Queue sizes are then the configured ones lowered to the device's
    /// maximum, which need not be a power of two. Off by default.
    pub packed: bool,
    /// Negotiate VIRTIO_F_IN_ORDER if offered: the device uses buffers in the order they were
    /// made available and may return a batch with one used entry (split: one used element
    /// carrying the last chain's head; packed: one used descriptor), from which the driver
    /// reclaims every earlier buffer in order. Off by default.
    pub in_order: bool,
    /// Adapt the transmit kick threshold, the XDP_TX bulk and (where the device offers
    /// VIRTIO_NET_F_NOTF_COAL or VIRTIO_NET_F_VQ_NOTF_COAL over the control queue) its rx
    /// interrupt coalescing online, from what the datapath observes ([`crate::adapt`]).
    /// `kick_threshold` and `xdp_bulk` are then the starting values. A coalescing change is
    /// one synchronous control command sent from the rx poll that closes its interval (at
    /// most one per interval); the first one the device refuses or leaves unanswered stops the
    /// rx adaptation. The values in use and their changes are in [`crate::Counters`]. Off by
    /// default: every knob stays as configured and the datapath behaves exactly as without
    /// this field.
    pub adaptive: bool,
    /// With `adaptive`: the largest kick threshold it may choose (1..=64; it also stays at or
    /// below half the tx ring).
    pub kick_threshold_max: u16,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            rx_queue_size: 256,
            tx_queue_size: 256,
            rx_buf_size: 2048,
            tx_buf_size: 2048,
            kick_threshold: 8,
            tx_completion: TxCompletion::TxInterrupt,
            xdp_bulk: 16,
            event_idx: true,
            mrg_rxbuf: true,
            csum: false,
            ctrl_vq: true,
            ctrl_rx: false,
            device_stats: true,
            queue_pairs: 1,
            packed: false,
            in_order: false,
            adaptive: false,
            kick_threshold_max: KICK_THRESHOLD_CAP,
        }
    }
}

impl Config {
    /// Checks the values that do not depend on the device.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for size in [self.rx_queue_size, self.tx_queue_size] {
            if !(2..=MAX_QUEUE_SIZE).contains(&size) || !size.is_power_of_two() {
                return Err(ConfigError::QueueSize(size));
            }
        }
        let buf_range = (VNET_HDR_LEN as u32 + 1)..=(VNET_HDR_LEN + MAX_FRAME_LEN) as u32;
        if !buf_range.contains(&self.rx_buf_size) {
            return Err(ConfigError::RxBufSize(self.rx_buf_size));
        }
        if !buf_range.contains(&self.tx_buf_size) {
            return Err(ConfigError::TxBufSize(self.tx_buf_size));
        }
        if self.kick_threshold == 0 {
            return Err(ConfigError::KickThreshold(self.kick_threshold));
        }
        if self.xdp_bulk == 0 {
            return Err(ConfigError::XdpBulk(self.xdp_bulk));
        }
        if !(1..=KICK_THRESHOLD_CAP).contains(&self.kick_threshold_max) {
            return Err(ConfigError::KickThresholdMax(self.kick_threshold_max));
        }
        if !(1..=MAX_QUEUE_PAIRS).contains(&self.queue_pairs) {
            return Err(ConfigError::QueuePairs(self.queue_pairs));
        }
        if self.queue_pairs > 1 && !self.ctrl_vq {
            return Err(ConfigError::MqNeedsCtrlVq);
        }
        Ok(())
    }

    /// XDP_TX frames a send queue may hold for a flush: `xdp_bulk`, or the adaptive bulk's
    /// upper bound if that is larger.
    pub(crate) fn xdp_bulk_capacity(&self) -> u16 {
        if self.adaptive {
            self.xdp_bulk.max(XDP_BULK_MAX)
        } else {
            self.xdp_bulk
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(Config::default().validate(), Ok(()));
        let adaptive = Config {
            adaptive: true,
            kick_threshold_max: 1,
            ..Config::default()
        };
        assert_eq!(adaptive.validate(), Ok(()));
        let bad = [
            (
                Config {
                    rx_queue_size: 100,
                    ..Config::default()
                },
                ConfigError::QueueSize(100),
            ),
            (
                Config {
                    tx_queue_size: 1,
                    ..Config::default()
                },
                ConfigError::QueueSize(1),
            ),
            (
                Config {
                    kick_threshold: 0,
                    ..Config::default()
                },
                ConfigError::KickThreshold(0),
            ),
            (
                Config {
                    xdp_bulk: 0,
                    ..Config::default()
                },
                ConfigError::XdpBulk(0),
            ),
            (
                Config {
                    kick_threshold_max: 0,
                    ..Config::default()
                },
                ConfigError::KickThresholdMax(0),
            ),
            (
                Config {
                    kick_threshold_max: 65,
                    adaptive: true,
                    ..Config::default()
                },
                ConfigError::KickThresholdMax(65),
            ),
            (
                Config {
                    queue_pairs: 0,
                    ..Config::default()
                },
                ConfigError::QueuePairs(0),
            ),
            (
                Config {
                    queue_pairs: MAX_QUEUE_PAIRS + 1,
                    ..Config::default()
                },
                ConfigError::QueuePairs(MAX_QUEUE_PAIRS + 1),
            ),
            (
                Config {
                    queue_pairs: 2,
                    ctrl_vq: false,
                    ..Config::default()
                },
                ConfigError::MqNeedsCtrlVq,
            ),
            (
                Config {
                    rx_buf_size: 12,
                    ..Config::default()
                },
                ConfigError::RxBufSize(12),
            ),
            (
                Config {
                    tx_buf_size: 1 << 20,
                    ..Config::default()
                },
                ConfigError::TxBufSize(1 << 20),
            ),
        ];
        for (config, error) in bad {
            assert_eq!(config.validate(), Err(error));
        }
    }
}
