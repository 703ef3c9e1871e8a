//! Multiqueue on [`VirtioNet`] (see [`crate::mq`]).

use crate::config::TxCompletion;
use crate::ctrl::{CLASS_MQ, MQ_VQ_PAIRS_SET};
use crate::error::{CtrlError, InitError, PairError};
use crate::features::NET_F_MQ;
use crate::hal::Hal;
use crate::mq::{rx_queue, tx_queue, Pair, PairCounters};
use crate::net::{queue_size, VirtioNet};
use crate::queue::{ReceiveStats, SendStats};
use crate::transport::Transport;
use crate::vring::RingMode;

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
