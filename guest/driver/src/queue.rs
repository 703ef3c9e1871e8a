//! The per-queue state of the driver: a [`SendQueue`] and a [`ReceiveQueue`], after Linux
//! virtio_net's `send_queue` / `receive_queue`.
//!
//! [`crate::VirtioNet`] keeps only what belongs to the device as a whole — the transport, the
//! DMA allocator, the configuration, the negotiated features, MAC, link and reset state, the
//! interrupt count — and holds one queue of each kind. Everything that belongs to one virtqueue
//! lives in its queue type:
//!
//! - [`SendQueue`]: the tx ring, the driver's copy-transmit buffers, the kick-threshold count
//!   (frames added since the last publish), the XDP_TX bulk queue and its chain scratch, the
//!   attached AF_XDP-style port (its completions come from this queue's reclaim), and the tx
//!   counters;
//! - [`ReceiveQueue`]: the rx ring, the rx buffer pool (posted, lent and free buffers), the
//!   mergeable-buffer reassembly state and gather scratch, and the rx counters.
//!
//! Why: a queue pair is the unit that multiqueue (VIRTIO_NET_F_MQ) replicates — rx queue `2n`
//! and tx queue `2n + 1`, each with its own ring, buffers, batching state and counters, driven
//! by its own CPU. With the state grouped, multiqueue becomes `Vec<ReceiveQueue>` and
//! `Vec<SendQueue>` plus a queue index on the datapath calls; [`crate::Counters`] is the sum of
//! the per-queue counters (see [`crate::VirtioNet::counters`]).
//!
//! The two queues of a pair are not independent: XDP_TX lends rx buffers of the
//! [`ReceiveQueue`] to the tx ring of the [`SendQueue`], and the send queue's reclaim gives them
//! back (see [`crate::xdp`]). The methods that cross that line stay on [`crate::VirtioNet`] and
//! borrow both queues; the methods on the queue types touch only their own queue (and the
//! transport, to notify it).
//!
//! The queue methods of each datapath are in this module's children (`rx`, `tx`, `xsk`,
//! `tune`), over the buffer types of the crate's `rx`, `tx` and `xsk` modules.

mod rx;
mod tune;
mod tx;
mod xsk;

use alloc::vec::Vec;

use crate::config::Config;
use crate::hal::Hal;
use crate::reset::ResetStats;
use crate::ring::{Buffer, Kick};
use crate::rx::{RxAssembly, RxPool};
use crate::transport::Transport;
use crate::tx::{TxPool, TxToken};
use crate::vring::Vring;
use crate::xsk::XskPort;
use tune::TxTuning;

/// A send queue's counters; [`crate::VirtioNet::counters`] reports them as the `tx_*`, kick,
/// XDP_TX and AF_XDP fields of [`crate::Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SendStats {
    /// `tx_frames`.
    pub(crate) frames: u64,
    /// `tx_bytes`.
    pub(crate) bytes: u64,
    /// `kicks`.
    pub(crate) kicks: u64,
    /// `kicks_suppressed`.
    pub(crate) kicks_suppressed: u64,
    /// `kicks_suppressed_no_notify`.
    pub(crate) kicks_suppressed_no_notify: u64,
    /// `tx_publishes`.
    pub(crate) publishes: u64,
    /// `tx_reclaimed`.
    pub(crate) reclaimed: u64,
    /// `tx_reclaim_polls`.
    pub(crate) reclaim_polls: u64,
    /// `ring_full`.
    pub(crate) ring_full: u64,
    /// `xdp_tx`.
    pub(crate) xdp_tx: u64,
    /// `xdp_tx_errors`.
    pub(crate) xdp_tx_errors: u64,
    /// `xdp_flushes`.
    pub(crate) xdp_flushes: u64,
    /// `xsk_invalid_descs`.
    pub(crate) xsk_invalid_descs: u64,
    /// This queue's share of `device_errors`.
    pub(crate) device_errors: u64,
}

/// A receive queue's counters; [`crate::VirtioNet::counters`] reports them as the `rx_*` and
/// XDP verdict fields of [`crate::Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReceiveStats {
    /// `rx_frames`.
    pub(crate) frames: u64,
    /// `rx_bytes`.
    pub(crate) bytes: u64,
    /// `rx_kicks`.
    pub(crate) kicks: u64,
    /// `rx_kicks_suppressed`.
    pub(crate) kicks_suppressed: u64,
    /// `xdp_pass`.
    pub(crate) xdp_pass: u64,
    /// `xdp_drop`.
    pub(crate) xdp_drop: u64,
    /// This queue's share of `device_errors`.
    pub(crate) device_errors: u64,
}

/// One transmit virtqueue and everything the driver keeps for it (Linux: `send_queue`).
pub(crate) struct SendQueue {
    /// The tx virtqueue.
    pub(crate) ring: Vring<TxToken>,
    /// The driver-owned buffers of copy transmit, one per descriptor.
    pub(crate) pool: TxPool,
    /// Frames added to the ring since the last publish (published at `kick_threshold`).
    pub(crate) pending: u16,
    /// The kick threshold in use ([`Config::kick_threshold`], or the adaptive one).
    pub(crate) kick_threshold: u16,
    /// The XDP_TX bulk in use ([`Config::xdp_bulk`], or the adaptive one).
    pub(crate) xdp_bulk: u16,
    /// The adaptation of `kick_threshold` and `xdp_bulk` ([`Config::adaptive`]).
    pub(crate) tuning: Option<TxTuning>,
    /// First rx buffer of each XDP_TX frame waiting for the bulk flush.
    pub(crate) xdp_queue: Vec<u32>,
    /// Reused chain description for multi-buffer transmits.
    pub(crate) chain: Vec<Buffer>,
    /// The attached AF_XDP-style port, if any.
    pub(crate) xsk: Option<XskPort>,
    pub(crate) stats: SendStats,
    /// Per-queue reset counters ([`crate::reset`]).
    pub(crate) resets: ResetStats,
}

/// One receive virtqueue and everything the driver keeps for it (Linux: `receive_queue`).
pub(crate) struct ReceiveQueue {
    /// The rx virtqueue.
    pub(crate) ring: Vring<u32>,
    /// The rx buffers: posted on the ring, lent to the tx ring (XDP_TX), or free.
    pub(crate) pool: RxPool,
    /// A mergeable frame whose buffers have not all been returned yet.
    pub(crate) assembly: Option<RxAssembly>,
    /// Contiguous copy of a multi-buffer frame for the rx program.
    pub(crate) scratch: Vec<u8>,
    pub(crate) stats: ReceiveStats,
    /// Per-queue reset counters ([`crate::reset`]).
    pub(crate) resets: ResetStats,
}

impl SendQueue {
    /// A send queue over `ring` and `pool` with the knobs of `config`, with room for the
    /// XDP_TX frames a bulk may hold.
    pub(crate) fn new(ring: Vring<TxToken>, pool: TxPool, config: &Config) -> SendQueue {
        let tuning = config.adaptive.then(|| TxTuning::new(config, ring.size()));
        SendQueue {
            pending: 0,
            kick_threshold: tuning
                .as_ref()
                .map_or(config.kick_threshold, TxTuning::kick_threshold),
            xdp_bulk: tuning.as_ref().map_or(config.xdp_bulk, TxTuning::xdp_bulk),
            tuning,
            xdp_queue: Vec::with_capacity(usize::from(config.xdp_bulk_capacity())),
            ring,
            pool,
            chain: Vec::new(),
            xsk: None,
            stats: SendStats::default(),
            resets: ResetStats::default(),
        }
    }

    /// Publishes what was added to the ring and notifies the device over `transport` if it
    /// wants it.
    pub(crate) fn publish_and_kick<T: Transport>(&mut self, transport: &mut T) {
        if self.ring.publish() {
            self.stats.publishes += 1;
        }
        match notify_if_wanted(&mut self.ring, transport) {
            Kick::NothingNew => {}
            Kick::Notify => self.stats.kicks += 1,
            Kick::SuppressedByEventIdx => self.stats.kicks_suppressed += 1,
            Kick::SuppressedByFlag => self.stats.kicks_suppressed_no_notify += 1,
        }
    }
}

impl ReceiveQueue {
    /// A receive queue over `ring` and `pool`.
    pub(crate) fn new(ring: Vring<u32>, pool: RxPool) -> ReceiveQueue {
        ReceiveQueue {
            ring,
            pool,
            assembly: None,
            scratch: Vec::new(),
            stats: ReceiveStats::default(),
            resets: ResetStats::default(),
        }
    }

    /// Publishes what was added to the ring and notifies the device over `transport` if it
    /// wants it.
    pub(crate) fn publish_and_kick<T: Transport>(&mut self, transport: &mut T) {
        self.ring.publish();
        match notify_if_wanted(&mut self.ring, transport) {
            Kick::NothingNew => {}
            Kick::Notify => self.stats.kicks += 1,
            Kick::SuppressedByEventIdx | Kick::SuppressedByFlag => self.stats.kicks_suppressed += 1,
        }
    }
}

/// Notifies the device over `transport` if it wants to hear of what `ring` published; returns
/// the decision, for the queue's counters.
fn notify_if_wanted<X: Copy, T: Transport>(ring: &mut Vring<X>, transport: &mut T) -> Kick {
    let kick = ring.kick_decision();
    if kick == Kick::Notify {
        transport.notify(ring.index());
    }
    kick
}

/// What both queue kinds do alike with their `ring`, `pool` and `stats` (a macro: the fields
/// have other types in each, and no trait spans them).
macro_rules! queue_upkeep {
    ($queue:ty) => {
        impl $queue {
            /// Counts a used-ring entry (or a used buffer) the driver ignored.
            pub(crate) fn note_device_error(&mut self) {
                self.stats.device_errors += 1;
            }

            /// Frees the ring and the buffers.
            ///
            /// # Safety
            ///
            /// As [`crate::hal::DmaRegion::dealloc`] for both regions: they came from `hal`, the
            /// device no longer uses them (it was reset), and nothing uses them afterwards.
            pub(crate) unsafe fn dealloc<H: Hal>(&self, hal: &H) {
                // SAFETY: forwarded from this function's contract.
                unsafe {
                    self.ring.dealloc(hal);
                    self.pool.dealloc(hal);
                }
            }
        }
    };
}

queue_upkeep!(SendQueue);
queue_upkeep!(ReceiveQueue);
