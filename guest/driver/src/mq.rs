//! Multiqueue (VIRTIO_NET_F_MQ, virtio 1.2 §5.1.6.5.5): several queue pairs, each a
//! receive queue + send queue (the crate-private `queue` module) with its own rings, buffers,
//! batching state and counters.
//!
//! With [`crate::Config::queue_pairs`] = N > 1 the driver negotiates MQ (it needs CTRL_VQ),
//! checks N against the device's `max_virtqueue_pairs` M (configuration space offset 8), sets
//! up rx queue `2i` and tx queue `2i + 1` for every pair `i` < N and the control queue at `2M`
//! (virtio 1.2 §5.1.2: its index follows M, not N; queues of pairs N..M stay unused),
//! and after DRIVER_OK posts every pair's rx buffers and sends MQ VQ_PAIRS_SET N on the
//! control queue (the device uses pair 0 only until then). Every failure is an
//! [`InitError`]; with N = 1 nothing here runs and MQ is not negotiated.
//!
//! **The current pair.** The datapath code (`tx`, `rx`, `xdp`, `xsk`) works on
//! `VirtioNet::rq`/`VirtioNet::sq`: the *current* pair. The other pairs wait in
//! driver's parking slots; [`VirtioNet::select_pair`] swaps the chosen pair in (two moves of a pair's
//! queue state, 848 bytes on x86-64 today; nothing when it is already current), so every datapath method — transmit,
//! `queue_tx`/`flush_tx`, `reclaim_tx`, `poll_rx`, the interrupt controls, AF_XDP — acts on
//! the pair selected, unchanged, and a single-pair driver (always pair 0) runs exactly as
//! before. [`VirtioNet::on_pair`] selects and returns the driver, for one-line per-pair calls
//! (`net.on_pair(1)?.queue_tx(frame)`).
//!
//! **Interrupts.** Over virtio-mmio all queues share one interrupt: after
//! [`VirtioNet::handle_interrupt`] reports used buffers the caller polls every pair. The driver
//! counts, per pair, the interrupts it serviced while that pair had used buffers waiting
//! ([`PairCounters::interrupts`]); [`crate::Counters`] sums the pairs.
//!
//! [`VirtioNet::select_pair`]: crate::VirtioNet::select_pair
//! [`VirtioNet::on_pair`]: crate::VirtioNet::on_pair
//! [`VirtioNet::handle_interrupt`]: crate::VirtioNet::handle_interrupt

use alloc::vec::Vec;

use crate::config::{Config, MAX_QUEUE_PAIRS};
use crate::error::InitError;
use crate::features::NET_F_MQ;
use crate::hal::{DmaRegion, Hal};
use crate::queue::{ReceiveQueue, ReceiveStats, SendQueue, SendStats};
use crate::rx::RxPool;
use crate::transport::Transport;
use crate::tx::TxPool;
use crate::vring::{RingMode, Vring};

/// Configuration space offset of `max_virtqueue_pairs` (le16, valid with MQ).
const MAX_PAIRS_OFFSET: u32 = 8;

/// The rx queue index of pair `pair`.
pub fn rx_queue(pair: u16) -> u16 {
    2 * pair
}

/// The tx queue index of pair `pair`.
pub fn tx_queue(pair: u16) -> u16 {
    2 * pair + 1
}

/// The queues the driver sets up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Queue pairs (rx `2i`, tx `2i + 1`).
    pub(crate) pairs: u16,
    /// The control queue's index: 2 without MQ, `2 * max_virtqueue_pairs` with it (virtio 1.2
    /// §5.1.2), whatever number of pairs the driver uses.
    pub(crate) ctrl_queue: u16,
}

/// The queue layout under `config` once `features` are negotiated: one pair and the control
/// queue at 2 unless more pairs were asked for; then MQ must be negotiated and the device's
/// `max_virtqueue_pairs` large enough.
pub(crate) fn layout<T: Transport>(
    t: &mut T,
    features: u64,
    config: &Config,
) -> Result<Layout, InitError> {
    let wanted = config.queue_pairs;
    if wanted <= 1 {
        return Ok(Layout {
            pairs: 1,
            ctrl_queue: 2,
        });
    }
    if features & NET_F_MQ == 0 {
        return Err(InitError::MqUnavailable { wanted });
    }
    let max = t.read_config_u16(MAX_PAIRS_OFFSET);
    // A device with the spec's largest 0x8000 pairs would put its control queue at 0x10000,
    // past the 16-bit queue indexes this driver uses: refused too.
    if wanted > max || max >= MAX_QUEUE_PAIRS {
        return Err(InitError::TooManyQueuePairs { wanted, max });
    }
    Ok(Layout {
        pairs: wanted,
        ctrl_queue: 2 * max,
    })
}

/// One queue pair out of service (not the current one).
pub(crate) struct Pair {
    pub(crate) rq: ReceiveQueue,
    pub(crate) sq: SendQueue,
}

impl Pair {
    /// Rx buffers of a pair with rings of these sizes: a full rx ring, plus what the tx ring
    /// and the XDP bulk queue can hold lent out for zero-copy XDP_TX.
    fn rx_buffers(config: &Config, (rx_size, tx_size): (u16, u16)) -> u32 {
        u32::from(rx_size) + u32::from(tx_size) + u32::from(config.xdp_bulk_capacity())
    }

    /// A pair's memory for rings of `sizes` (rx, tx): the two rings, then the rx and tx
    /// buffer pools. `None` when `hal` has no room.
    pub(crate) fn alloc<H: Hal>(
        hal: &H,
        config: &Config,
        mode: RingMode,
        sizes: (u16, u16),
    ) -> Option<[DmaRegion; 4]> {
        let rx_count = Self::rx_buffers(config, sizes);
        DmaRegion::alloc_all(
            hal,
            [
                mode.bytes(sizes.0),
                mode.bytes(sizes.1),
                rx_count as usize * config.rx_buf_size as usize,
                TxPool::region_len(config.tx_buf_size, sizes.1),
            ],
        )
    }

    /// The pair of virtqueues `queues` (rx, tx) with rings of `sizes` over `memory` from
    /// [`Pair::alloc`] with the same sizes and configuration.
    pub(crate) fn new(
        memory: [DmaRegion; 4],
        config: &Config,
        mode: RingMode,
        (rx, tx): (u16, u16),
        sizes: (u16, u16),
    ) -> Pair {
        let [rx_ring, tx_ring, rx_bufs, tx_bufs] = memory;
        Pair {
            rq: ReceiveQueue::new(
                Vring::new(mode, rx, sizes.0, rx_ring),
                RxPool::new(rx_bufs, config.rx_buf_size, Self::rx_buffers(config, sizes)),
            ),
            sq: SendQueue::new(
                Vring::new(mode, tx, sizes.1, tx_ring),
                TxPool::new(tx_bufs, config.tx_buf_size, sizes.1),
                config,
            ),
        }
    }
}

/// The queue pairs besides the current one, and the per-pair state that is not a queue's.
pub(crate) struct Pairs {
    /// Slot `i` holds pair `i`, except the current pair's slot, which is empty (that pair is
    /// in `VirtioNet::rq`/`sq`).
    pub(crate) slots: Vec<Option<Pair>>,
    /// The pair in `VirtioNet::rq`/`sq`.
    pub(crate) current: u16,
    /// Pairs enabled on the device (VQ_PAIRS_SET; 1 until then).
    pub(crate) active: u16,
    /// Interrupts serviced while each pair had used buffers waiting.
    pub(crate) interrupts: Vec<u64>,
}

impl Pairs {
    /// One pair (pair 0, current).
    pub(crate) fn single() -> Pairs {
        Pairs {
            slots: alloc::vec![None],
            current: 0,
            active: 1,
            interrupts: alloc::vec![0],
        }
    }

    pub(crate) fn count(&self) -> u16 {
        // At most MAX_QUEUE_PAIRS slots (validated): fits.
        self.slots.len() as u16
    }

    /// The parked pairs (every pair but the current one).
    pub(crate) fn parked(&self) -> impl Iterator<Item = &Pair> {
        self.slots.iter().flatten()
    }

    /// Ring size and addresses of queue `queue`, if it belongs to a parked pair.
    pub(crate) fn ring_of(&self, queue: u16) -> Option<(u16, (u64, u64, u64))> {
        let pair = self.slots.get(usize::from(queue / 2))?.as_ref()?;
        Some(if queue.is_multiple_of(2) {
            (pair.rq.ring.size(), pair.rq.ring.addresses())
        } else {
            (pair.sq.ring.size(), pair.sq.ring.addresses())
        })
    }

    /// True if a parked pair's ring is broken.
    pub(crate) fn any_broken(&self) -> bool {
        self.parked()
            .any(|p| p.rq.ring.is_broken() || p.sq.ring.is_broken())
    }

    /// Frees the parked pairs' rings and buffers.
    ///
    /// # Safety
    ///
    /// As [`SendQueue::dealloc`]: the regions came from `hal`, the device was reset, nothing
    /// uses them afterwards.
    pub(crate) unsafe fn dealloc<H: Hal>(&self, hal: &H) {
        for pair in self.parked() {
            // SAFETY: forwarded from this function's contract.
            unsafe {
                pair.rq.dealloc(hal);
                pair.sq.dealloc(hal);
            }
        }
    }
}

impl SendStats {
    pub(crate) fn accumulate(&mut self, o: &SendStats) {
        let SendStats {
            frames,
            bytes,
            kicks,
            kicks_suppressed,
            kicks_suppressed_no_notify,
            publishes,
            reclaimed,
            reclaim_polls,
            ring_full,
            xdp_tx,
            xdp_tx_errors,
            xdp_flushes,
            xsk_invalid_descs,
            device_errors,
        } = o;
        self.frames += frames;
        self.bytes += bytes;
        self.kicks += kicks;
        self.kicks_suppressed += kicks_suppressed;
        self.kicks_suppressed_no_notify += kicks_suppressed_no_notify;
        self.publishes += publishes;
        self.reclaimed += reclaimed;
        self.reclaim_polls += reclaim_polls;
        self.ring_full += ring_full;
        self.xdp_tx += xdp_tx;
        self.xdp_tx_errors += xdp_tx_errors;
        self.xdp_flushes += xdp_flushes;
        self.xsk_invalid_descs += xsk_invalid_descs;
        self.device_errors += device_errors;
    }
}

impl ReceiveStats {
    pub(crate) fn accumulate(&mut self, o: &ReceiveStats) {
        let ReceiveStats {
            frames,
            bytes,
            kicks,
            kicks_suppressed,
            xdp_pass,
            xdp_drop,
            device_errors,
        } = o;
        self.frames += frames;
        self.bytes += bytes;
        self.kicks += kicks;
        self.kicks_suppressed += kicks_suppressed;
        self.xdp_pass += xdp_pass;
        self.xdp_drop += xdp_drop;
        self.device_errors += device_errors;
    }
}

/// One queue pair's counters ([`VirtioNet::pair_counters`]); the fields mean what the
/// same-named fields of [`crate::Counters`] mean, for this pair's two queues.
///
/// [`VirtioNet::pair_counters`]: crate::VirtioNet::pair_counters
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairCounters {
    /// Frames queued on this pair's tx queue (copy transmit and AF_XDP).
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames received on this pair's rx queue.
    pub rx_frames: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Notifications of the tx queue.
    pub kicks: u64,
    /// Tx kicks skipped by EVENT_IDX.
    pub kicks_suppressed: u64,
    /// Tx kicks skipped by VRING_USED_F_NO_NOTIFY.
    pub kicks_suppressed_no_notify: u64,
    /// Stores of the tx avail index.
    pub tx_publishes: u64,
    /// Notifications of the rx queue.
    pub rx_kicks: u64,
    /// Rx kicks skipped.
    pub rx_kicks_suppressed: u64,
    /// Interrupts serviced ([`VirtioNet::handle_interrupt`] with used buffers) while this
    /// pair had used buffers waiting on its rx or tx ring.
    ///
    /// [`VirtioNet::handle_interrupt`]: crate::VirtioNet::handle_interrupt
    pub interrupts: u64,
    /// Tx chains reclaimed.
    pub tx_reclaimed: u64,
    /// Times a transmit path found the tx ring full.
    pub ring_full: u64,
    /// Frames bounced with XDP_TX on this pair's tx queue.
    pub xdp_tx: u64,
    /// XDP_TX frames dropped for lack of room.
    pub xdp_tx_errors: u64,
    /// Used entries of this pair the driver ignored.
    pub device_errors: u64,
}

impl PairCounters {
    pub(crate) fn of(rq: &ReceiveStats, sq: &SendStats, interrupts: u64) -> PairCounters {
        PairCounters {
            tx_frames: sq.frames,
            tx_bytes: sq.bytes,
            rx_frames: rq.frames,
            rx_bytes: rq.bytes,
            kicks: sq.kicks,
            kicks_suppressed: sq.kicks_suppressed,
            kicks_suppressed_no_notify: sq.kicks_suppressed_no_notify,
            tx_publishes: sq.publishes,
            rx_kicks: rq.kicks,
            rx_kicks_suppressed: rq.kicks_suppressed,
            interrupts,
            tx_reclaimed: sq.reclaimed,
            ring_full: sq.ring_full,
            xdp_tx: sq.xdp_tx,
            xdp_tx_errors: sq.xdp_tx_errors,
            device_errors: sq.device_errors + rq.device_errors,
        }
    }
}
