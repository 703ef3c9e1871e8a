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

use alloc::vec::Vec;

use crate::config::{Config, TxCompletion, MAX_QUEUE_PAIRS};
use crate::ctrl::{CLASS_MQ, MQ_VQ_PAIRS_SET};
use crate::error::{CtrlError, InitError, PairError};
use crate::features::NET_F_MQ;
use crate::hal::{DmaRegion, Hal};
use crate::net::{queue_size, VirtioNet};
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
                usize::from(sizes.1) * config.tx_buf_size as usize,
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
    slots: Vec<Option<Pair>>,
    /// The pair in `VirtioNet::rq`/`sq`.
    current: u16,
    /// Pairs enabled on the device (VQ_PAIRS_SET; 1 until then).
    active: u16,
    /// Interrupts serviced while each pair had used buffers waiting.
    interrupts: Vec<u64>,
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

    fn count(&self) -> u16 {
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
    fn accumulate(&mut self, o: &SendStats) {
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
    fn accumulate(&mut self, o: &ReceiveStats) {
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
    fn of(rq: &ReceiveStats, sq: &SendStats, interrupts: u64) -> PairCounters {
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

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// Sets up pairs 1..`pairs` (queues 2..2·`pairs`): their sizes, memory and queue
    /// registers, with interrupt suppression as for pair 0. Before DRIVER_OK, after pair 0.
    pub(crate) fn add_pairs(&mut self, pairs: u16) -> Result<(), InitError> {
        let mode = RingMode::of(self.features);
        let config = self.config;
        for pair in 1..pairs {
            let (rx, tx) = (rx_queue(pair), tx_queue(pair));
            let rx_size = queue_size(&mut self.transport, self.features, rx, config.rx_queue_size)?;
            let tx_size = queue_size(&mut self.transport, self.features, tx, config.tx_queue_size)?;
            let sizes = (rx_size, tx_size);
            let memory = Pair::alloc(&self.hal, &config, mode, sizes).ok_or(InitError::DmaAlloc)?;
            let mut p = Pair::new(memory, &config, mode, (rx, tx), sizes);
            p.rq.ring.enable_interrupts();
            match config.tx_completion {
                TxCompletion::TxInterrupt => {
                    p.sq.ring.enable_interrupts();
                }
                TxCompletion::CleanFromRx | TxCompletion::Lazy => p.sq.ring.disable_interrupts(),
            }
            // From here on the pair is the driver's: dropping it frees it.
            self.mq.slots.push(Some(p));
            self.mq.interrupts.push(0);
            self.program_queue(rx)?;
            self.program_queue(tx)?;
        }
        Ok(())
    }

    /// After DRIVER_OK: posts every other pair's rx buffers and enables the pairs
    /// (VQ_PAIRS_SET). The current pair (0) was refilled by the caller.
    pub(crate) fn start_pairs(&mut self) -> Result<(), InitError> {
        let pairs = self.mq.count();
        if pairs == 1 {
            return Ok(());
        }
        for pair in 1..pairs {
            self.refill_pair(pair);
        }
        // Pair 0 exists: the selection cannot fail.
        let _ = self.select_pair(0);
        self.set_queue_pairs(pairs)
            .map_err(|error| InitError::QueuePairsSet {
                wanted: pairs,
                error,
            })
    }

    fn refill_pair(&mut self, pair: u16) {
        if self.select_pair(pair).is_ok() {
            self.refill_rx();
        }
    }

    /// Queue pairs set up (1 without multiqueue).
    pub fn queue_pairs(&self) -> u16 {
        self.mq.count()
    }

    /// Queue pairs enabled on the device (after bring-up: all of them; see
    /// [`Self::set_queue_pairs`]).
    pub fn active_queue_pairs(&self) -> u16 {
        self.mq.active
    }

    /// The current pair: the one the datapath methods act on (0 unless selected).
    pub fn current_pair(&self) -> u16 {
        self.mq.current
    }

    /// Makes `pair` the current pair: from now on [`Self::transmit`], [`Self::queue_tx`],
    /// [`Self::flush_tx`], [`Self::reclaim_tx`], [`Self::poll_rx`], the interrupt controls,
    /// [`Self::tx_free_descriptors`], [`Self::rx_has_used`] and the AF_XDP calls act on its
    /// queues. Cheap (nothing when it is already current; otherwise two moves of the pairs'
    /// queue state).
    pub fn select_pair(&mut self, pair: u16) -> Result<(), PairError> {
        let current = self.mq.current;
        if pair == current {
            return Ok(());
        }
        let Some(incoming) = self
            .mq
            .slots
            .get_mut(usize::from(pair))
            .and_then(Option::take)
        else {
            return Err(PairError {
                pair,
                pairs: self.mq.count(),
            });
        };
        let outgoing = Pair {
            rq: core::mem::replace(&mut self.rq, incoming.rq),
            sq: core::mem::replace(&mut self.sq, incoming.sq),
        };
        self.mq.slots[usize::from(current)] = Some(outgoing);
        self.mq.current = pair;
        Ok(())
    }

    /// Selects `pair` ([`Self::select_pair`]) and returns the driver, for per-pair calls:
    /// `net.on_pair(1)?.queue_tx(frame)`, `net.on_pair(p)?.poll_rx(64, &mut program)`.
    pub fn on_pair(&mut self, pair: u16) -> Result<&mut Self, PairError> {
        self.select_pair(pair)?;
        Ok(self)
    }

    /// Pair `pair`'s counters.
    pub fn pair_counters(&self, pair: u16) -> Result<PairCounters, PairError> {
        let interrupts = self.mq.interrupts.get(usize::from(pair)).copied();
        let queues = if pair == self.mq.current {
            Some((&self.rq.stats, &self.sq.stats))
        } else {
            self.mq
                .slots
                .get(usize::from(pair))
                .and_then(Option::as_ref)
                .map(|p| (&p.rq.stats, &p.sq.stats))
        };
        match (queues, interrupts) {
            (Some((rq, sq)), Some(interrupts)) => Ok(PairCounters::of(rq, sq, interrupts)),
            _ => Err(PairError {
                pair,
                pairs: self.mq.count(),
            }),
        }
    }

    /// The (rx, tx) queue sizes of `pair`.
    pub fn pair_queue_sizes(&self, pair: u16) -> Result<(u16, u16), PairError> {
        if pair == self.mq.current {
            return Ok((self.rq.ring.size(), self.sq.ring.size()));
        }
        self.mq
            .slots
            .get(usize::from(pair))
            .and_then(Option::as_ref)
            .map(|p| (p.rq.ring.size(), p.sq.ring.size()))
            .ok_or(PairError {
                pair,
                pairs: self.mq.count(),
            })
    }

    /// MQ VQ_PAIRS_SET: the device uses pairs 0..`pairs` (1..=[`Self::queue_pairs`]; needs
    /// VIRTIO_NET_F_MQ). Bring-up already enabled them all; fewer leave the others idle (their
    /// queues stay set up, the device stops serving them).
    pub fn set_queue_pairs(&mut self, pairs: u16) -> Result<(), CtrlError> {
        if self.features & NET_F_MQ == 0 {
            return Err(CtrlError::NotNegotiated("VIRTIO_NET_F_MQ"));
        }
        if !(1..=self.mq.count()).contains(&pairs) {
            return Err(CtrlError::QueuePairs {
                wanted: pairs,
                pairs: self.mq.count(),
            });
        }
        self.command(CLASS_MQ, MQ_VQ_PAIRS_SET, &pairs.to_le_bytes())?;
        self.mq.active = pairs;
        Ok(())
    }

    /// Counts the interrupt just serviced against every pair with used buffers waiting.
    pub(crate) fn note_pair_interrupts(&mut self) {
        let current = usize::from(self.mq.current);
        if self.rq.ring.has_used() || self.sq.ring.has_used() {
            self.mq.interrupts[current] += 1;
        }
        for (slot, count) in self.mq.slots.iter_mut().zip(&mut self.mq.interrupts) {
            if let Some(p) = slot {
                if p.rq.ring.has_used() || p.sq.ring.has_used() {
                    *count += 1;
                }
            }
        }
    }

    /// The send and receive counters summed over every pair.
    pub(crate) fn summed_stats(&self) -> (SendStats, ReceiveStats) {
        let (mut sq, mut rq) = (self.sq.stats, self.rq.stats);
        for p in self.mq.parked() {
            sq.accumulate(&p.sq.stats);
            rq.accumulate(&p.rq.stats);
        }
        (sq, rq)
    }
}
