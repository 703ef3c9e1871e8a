//! [`VirtioNet`]: device bring-up (virtio 1.2 §3.1.1 over any [`Transport`]), interrupts, and the
//! per-queue interrupt controls. The per-queue state is in `queue` ([`SendQueue`],
//! [`ReceiveQueue`]); the data types of each feature are in the crate's modules of the same
//! name, and the methods each feature adds to [`VirtioNet`] in this module's children (`rx`,
//! `tx`, `xdp`, `xsk`, `ctrl`, `mq`, `reset`, `stats`, `tune`, `pci`).

mod ctrl;
mod mq;
mod pci;
mod reset;
mod rx;
mod stats;
mod tune;
mod tx;
mod xdp;
mod xsk;

use crate::config::{Config, TxCompletion, MIN_RX_BUF_WITHOUT_MRG};
use crate::counters::Counters;
use crate::ctrl::CTRL_QUEUE_SIZE;
use crate::ctrl::{ControlQueue, CtrlStats, CtrlWait, CTRL_BUF_BYTES, CTRL_MAX_CHAIN};
use crate::error::InitError;
use crate::features::{self, NET_F_CTRL_VQ, NET_F_MAC, NET_F_MRG_RXBUF, NET_F_STATUS};
use crate::hal::{DmaRegion, Hal};
use crate::mq::{Layout, Pair, Pairs};
use crate::queue::{ReceiveQueue, ReceiveStats, SendQueue, SendStats};
use crate::transport::{status, QueueSetup, Transport, INT_CONFIG_CHANGE, INT_USED_BUFFER};
use crate::tune::RxTuning;
use crate::vring::{RingMode, Vring};

/// Virtio device ID of a network card.
const DEVICE_ID_NET: u32 = 1;
/// Index of the receive queue.
pub(crate) const RX_QUEUE: u16 = 0;
/// Index of the transmit queue.
pub(crate) const TX_QUEUE: u16 = 1;
/// Reads of Status after a reset before giving up.
const RESET_POLLS: usize = 1000;
/// `status` config field bit: link up.
const NET_S_LINK_UP: u16 = 1;

/// A queue of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueId {
    /// The receive queue (index 0).
    Rx,
    /// The transmit queue (index 1).
    Tx,
}

/// What re-enabling a queue's interrupts found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Rearm {
    /// Nothing pending: wait for the interrupt.
    Armed,
    /// Used buffers arrived meanwhile: poll again (the interrupt may not come for them).
    UsedPending,
}

/// What [`VirtioNet::handle_interrupt`] found in InterruptStatus.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrqStatus {
    /// Some queue has used buffers (the device does not say which: poll both queues of every
    /// pair).
    pub used_buffers: bool,
    /// The configuration changed (link status re-read; see [`VirtioNet::link_up`]).
    pub config_changed: bool,
    /// The device set DEVICE_NEEDS_RESET: drop the driver and start over.
    pub needs_reset: bool,
}

impl IrqStatus {
    /// True if the interrupt was this device's.
    pub fn any(&self) -> bool {
        self.used_buffers || self.config_changed
    }
}

/// A virtio-net device driven over transport `T` with DMA memory from `H`.
///
/// Single-threaded by design (`&mut self` everywhere); `Send` when `H` and `T` are, so a
/// co-simulation can move it to its driver thread. Dropping it resets the device (so it stops
/// all DMA) and then frees the rings and buffers.
///
/// Device-wide state is kept here; each virtqueue's state is in its own send queue or receive
/// queue (the crate-private `SendQueue` and `ReceiveQueue`, the unit multiqueue replicates).
pub struct VirtioNet<H: Hal, T: Transport> {
    pub(crate) hal: H,
    pub(crate) transport: T,
    pub(crate) config: Config,
    pub(crate) features: u64,
    pub(crate) mac: Option<[u8; 6]>,
    pub(crate) link_up: bool,
    pub(crate) needs_reset: bool,
    /// Calls of [`Self::handle_interrupt`] that found InterruptStatus bits.
    pub(crate) interrupts: u64,
    /// The receive queue (virtqueue [`RX_QUEUE`]).
    pub(crate) rq: ReceiveQueue,
    /// The send queue (virtqueue [`TX_QUEUE`]).
    pub(crate) sq: SendQueue,
    /// The control queue (virtqueue 2), if VIRTIO_NET_F_CTRL_VQ was negotiated.
    pub(crate) cq: Option<ControlQueue>,
    /// How long a control command waits for its answer.
    pub(crate) ctrl_wait: CtrlWait,
    /// The other queue pairs (multiqueue, [`crate::mq`]); `rq`/`sq` are the current pair.
    pub(crate) mq: Pairs,
    /// The rx coalescing adaptation ([`Config::adaptive`] on a device that can take it).
    pub(crate) rx_tuning: Option<RxTuning>,
    /// The clock of the rx adaptation intervals ([`Self::set_adapt_clock`]).
    pub(crate) adapt_clock: Option<fn() -> u64>,
}

impl<H: Hal, T: Transport> VirtioNet<H, T> {
    /// Brings up the virtio-net device behind `transport`: checks it, resets it, negotiates
    /// features, sets up both queues (and the control queue if VIRTIO_NET_F_CTRL_VQ was
    /// negotiated), sets DRIVER_OK and posts the rx buffers.
    pub fn new(hal: H, mut transport: T, config: Config) -> Result<Self, InitError> {
        config.validate()?;
        let id = transport.device_type()?;
        if id != DEVICE_ID_NET {
            return Err(InitError::NotNet(id));
        }
        reset(&mut transport)?;
        let result = negotiate_layout(&mut transport, &config);
        let (features, layout, [rx_size, tx_size], ctrl_size) = match result {
            Ok(v) => v,
            Err(e) => {
                set_status(&mut transport, status::FAILED);
                return Err(e);
            }
        };
        let mode = RingMode::of(features);
        let Some(pair_memory) = Pair::alloc(&hal, &config, mode, (rx_size, tx_size)) else {
            set_status(&mut transport, status::FAILED);
            return Err(InitError::DmaAlloc);
        };
        let cq = match ctrl_size {
            None => None,
            Some(size) => {
                let Some(cq) = alloc_ctrl(&hal, mode, layout.ctrl_queue, size) else {
                    for region in &pair_memory {
                        // SAFETY: allocated just above from `hal`, never shown to the device.
                        unsafe { region.dealloc(&hal) };
                    }
                    set_status(&mut transport, status::FAILED);
                    return Err(InitError::DmaAlloc);
                };
                Some(cq)
            }
        };
        let Pair { rq, sq } = Pair::new(
            pair_memory,
            &config,
            mode,
            (RX_QUEUE, TX_QUEUE),
            (rx_size, tx_size),
        );
        let mut net = VirtioNet {
            rq,
            sq,
            hal,
            transport,
            config,
            features,
            mac: None,
            link_up: true,
            needs_reset: false,
            interrupts: 0,
            cq,
            ctrl_wait: CtrlWait::default(),
            mq: Pairs::single(),
            rx_tuning: config.adaptive.then(|| RxTuning::new(features)).flatten(),
            adapt_clock: None,
        };
        // From here on, dropping `net` resets the device and frees the memory.
        net.program_queue(RX_QUEUE)?;
        net.program_queue(TX_QUEUE)?;
        if net.cq.is_some() {
            net.program_queue(layout.ctrl_queue)?;
        }
        net.read_config();
        // Interrupt suppression lives in ring memory: set it before the device starts.
        net.arm_interrupts();
        if let Err(e) = net.add_pairs(layout.pairs) {
            set_status(&mut net.transport, status::FAILED);
            return Err(e);
        }
        set_status(&mut net.transport, status::DRIVER_OK);
        if net.transport.status() & status::DEVICE_NEEDS_RESET != 0 {
            return Err(InitError::DeviceNeedsReset);
        }
        net.refill_rx();
        net.start_pairs()?;
        Ok(net)
    }

    /// Interrupts on for rx, and for tx only when tx completion runs from them.
    fn arm_interrupts(&mut self) {
        self.rq.ring.enable_interrupts();
        match self.config.tx_completion {
            TxCompletion::TxInterrupt => {
                self.sq.ring.enable_interrupts();
            }
            TxCompletion::CleanFromRx | TxCompletion::Lazy => self.sq.ring.disable_interrupts(),
        }
    }

    /// Hands queue `queue`'s rings to the device and enables it. On error the device is
    /// marked FAILED (and reset when `self` drops). The current pair's queues are `self.rq`/`self.sq` whichever pair that is; the others
    /// are parked in `self.mq`.
    pub(crate) fn program_queue(&mut self, queue: u16) -> Result<(), InitError> {
        let (size, (desc, avail, used)) = match &self.cq {
            _ if queue == self.rq.ring.index() => (self.rq.ring.size(), self.rq.ring.addresses()),
            _ if queue == self.sq.ring.index() => (self.sq.ring.size(), self.sq.ring.addresses()),
            Some(cq) if queue == cq.ring.index() => (cq.ring.size(), cq.ring.addresses()),
            _ => match self.mq.ring_of(queue) {
                Some(ring) => ring,
                None => return Ok(()),
            },
        };
        let setup = QueueSetup {
            size,
            desc,
            avail,
            used,
        };
        self.transport
            .setup_queue(queue, &setup)
            .inspect_err(|_| set_status(&mut self.transport, status::FAILED))
    }

    /// Reads MAC and link status, retrying while the configuration generation changes.
    fn read_config(&mut self) {
        let t = &mut self.transport;
        for _ in 0..4 {
            let generation = t.config_generation();
            let mut mac = [0u8; 6];
            for (offset, byte) in (0u32..).zip(mac.iter_mut()) {
                *byte = t.read_config_u8(offset);
            }
            let net_status = t.read_config_u16(6);
            if t.config_generation() != generation {
                continue;
            }
            if self.features & NET_F_MAC != 0 {
                self.mac = Some(mac);
            }
            if self.features & NET_F_STATUS != 0 {
                self.link_up = net_status & NET_S_LINK_UP != 0;
            }
            return;
        }
    }

    /// The guest's interrupt service routine: reads InterruptStatus and acknowledges what it
    /// found. Counts in `interrupts` when bits were set. On a configuration change, re-reads the
    /// link status and checks for DEVICE_NEEDS_RESET.
    pub fn handle_interrupt(&mut self) -> IrqStatus {
        let isr = self.transport.interrupt_status() & (INT_USED_BUFFER | INT_CONFIG_CHANGE);
        if isr == 0 {
            return IrqStatus::default();
        }
        self.transport.ack_interrupt(isr);
        self.interrupts += 1;
        if isr & INT_USED_BUFFER != 0 {
            self.note_pair_interrupts();
        }
        let config_changed = isr & INT_CONFIG_CHANGE != 0;
        if config_changed {
            self.config_changed();
        }
        IrqStatus {
            used_buffers: isr & INT_USED_BUFFER != 0,
            config_changed,
            needs_reset: self.needs_reset,
        }
    }

    /// A configuration change: checks for DEVICE_NEEDS_RESET and re-reads the configuration.
    pub(crate) fn config_changed(&mut self) {
        if self.transport.status() & status::DEVICE_NEEDS_RESET != 0 {
            self.needs_reset = true;
        }
        self.read_config();
    }

    /// Re-enables `queue`'s interrupts (EVENT_IDX: `used_event` = next used index; otherwise
    /// NO_INTERRUPT cleared), then re-checks the used ring behind a full fence.
    pub fn enable_interrupts(&mut self, queue: QueueId) -> Rearm {
        let pending = match queue {
            QueueId::Rx => self.rq.ring.enable_interrupts(),
            QueueId::Tx => self.sq.ring.enable_interrupts(),
        };
        if pending {
            Rearm::UsedPending
        } else {
            Rearm::Armed
        }
    }

    /// Asks the device not to interrupt for `queue` (EVENT_IDX: `used_event` far ahead;
    /// otherwise NO_INTERRUPT). Best effort: an interrupt may already be on its way.
    pub fn disable_interrupts(&mut self, queue: QueueId) {
        match queue {
            QueueId::Rx => self.rq.ring.disable_interrupts(),
            QueueId::Tx => self.sq.ring.disable_interrupts(),
        }
    }

    /// True if the device returned rx buffers not yet polled.
    pub fn rx_has_used(&mut self) -> bool {
        self.rq.ring.has_used()
    }

    /// Rx buffers the device returned and the driver has not polled yet (used entries: a frame
    /// takes one, or several with MRG_RXBUF), on the selected pair.
    pub fn rx_used_pending(&mut self) -> u16 {
        self.rq.ring.used_pending()
    }

    /// Tx chains (frames) the device returned and the driver has not reclaimed yet, on the
    /// selected pair.
    pub fn tx_used_pending(&mut self) -> u16 {
        self.sq.ring.used_pending()
    }

    /// True if the device returned tx buffers not yet reclaimed.
    pub fn tx_has_used(&mut self) -> bool {
        self.sq.ring.has_used()
    }

    /// The counters so far: the send, receive and control queues' counters, and the
    /// interrupts.
    pub fn counters(&self) -> Counters {
        // Every field on both sides is named, so a counter added to a queue or to `Counters`
        // does not compile until it is reported here. Summed over the queue pairs.
        let (sq, rq) = self.summed_stats();
        let SendStats {
            frames: tx_frames,
            bytes: tx_bytes,
            kicks,
            kicks_suppressed,
            kicks_suppressed_no_notify,
            publishes: tx_publishes,
            reclaimed: tx_reclaimed,
            reclaim_polls: tx_reclaim_polls,
            ring_full,
            xdp_tx,
            xdp_tx_errors,
            xdp_flushes,
            xsk_invalid_descs,
            device_errors: tx_device_errors,
        } = sq;
        let ReceiveStats {
            frames: rx_frames,
            bytes: rx_bytes,
            kicks: rx_kicks,
            kicks_suppressed: rx_kicks_suppressed,
            xdp_pass,
            xdp_drop,
            device_errors: rx_device_errors,
        } = rq;
        let CtrlStats {
            commands: ctrl_commands,
            failed: ctrl_failed,
            timeouts: ctrl_timeouts,
            device_errors: ctrl_device_errors,
        } = self.cq.as_ref().map_or(CtrlStats::default(), |cq| cq.stats);
        let ([kick_threshold_now, xdp_bulk_now], rx_coal_level, changes, rx_coal_errors) =
            self.adapt_counters();
        let [kick_threshold_changes, xdp_bulk_changes, rx_coal_changes] = changes;
        Counters {
            tx_frames,
            tx_bytes,
            rx_frames,
            rx_bytes,
            kicks,
            kicks_suppressed,
            kicks_suppressed_no_notify,
            tx_publishes,
            rx_kicks,
            rx_kicks_suppressed,
            interrupts: self.interrupts,
            tx_reclaimed,
            tx_reclaim_polls,
            ring_full,
            xdp_tx,
            xdp_tx_errors,
            xdp_flushes,
            xdp_drop,
            xdp_pass,
            xsk_invalid_descs,
            device_errors: tx_device_errors + rx_device_errors + ctrl_device_errors,
            ctrl_commands,
            ctrl_failed,
            ctrl_timeouts,
            kick_threshold_now: u64::from(kick_threshold_now),
            xdp_bulk_now: u64::from(xdp_bulk_now),
            rx_coal_level: u64::from(rx_coal_level),
            kick_threshold_changes,
            xdp_bulk_changes,
            rx_coal_changes,
            rx_coal_errors,
        }
    }

    /// The configuration in use (queue sizes as requested; see [`Self::queue_sizes`]).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The (rx, tx) queue sizes in use (the configured ones, lowered to the device's maximum)
    /// of the current pair (see [`Self::pair_queue_sizes`]).
    pub fn queue_sizes(&self) -> (u16, u16) {
        (self.rq.ring.size(), self.sq.ring.size())
    }

    /// The negotiated feature bits ([`crate::features`]).
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The device's MAC address, if it gave one (VIRTIO_NET_F_MAC).
    pub fn mac(&self) -> Option<[u8; 6]> {
        self.mac
    }

    /// Link status (always up without VIRTIO_NET_F_STATUS).
    pub fn link_up(&self) -> bool {
        self.link_up
    }

    /// True once the device asked for a reset or broke a used ring: the driver should be
    /// dropped and brought up again.
    pub fn is_broken(&self) -> bool {
        self.needs_reset
            || self.rq.ring.is_broken()
            || self.sq.ring.is_broken()
            || self.cq.as_ref().is_some_and(|cq| cq.ring.is_broken())
            || self.mq.any_broken()
    }

    /// Free descriptors on the tx ring (of the current pair).
    pub fn tx_free_descriptors(&self) -> usize {
        self.sq.ring.free_descriptors()
    }

    /// The transport (e.g. for its MSI-X vector assignment).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport (e.g. for a co-simulation to reach its device model).
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }
}

impl<H: Hal, T: Transport> Drop for VirtioNet<H, T> {
    fn drop(&mut self) {
        // Stop the device first: after a reset it no longer touches rings or buffers.
        self.transport.set_status(0);
        // SAFETY: every region came from `self.hal`, the device was just reset (a virtio-mmio
        // or virtio-pci reset of a device model completes when the status write returns), and
        // nothing uses them after drop.
        unsafe {
            self.rq.dealloc(&self.hal);
            self.sq.dealloc(&self.hal);
            if let Some(cq) = &self.cq {
                cq.dealloc(&self.hal);
            }
            self.mq.dealloc(&self.hal);
        }
    }
}

fn reset<T: Transport>(t: &mut T) -> Result<(), InitError> {
    t.set_status(0);
    for _ in 0..RESET_POLLS {
        if t.status() == 0 {
            return Ok(());
        }
    }
    Err(InitError::ResetTimeout)
}

/// ORs `bits` into the Status register (virtio status bits are only ever added).
fn set_status<T: Transport>(t: &mut T, bits: u32) {
    let current = t.status() & !status::DEVICE_NEEDS_RESET;
    t.set_status(current | bits);
}

/// ACKNOWLEDGE, DRIVER, features, FEATURES_OK. Returns the negotiated features.
fn negotiate<T: Transport>(t: &mut T, config: &Config) -> Result<u64, InitError> {
    set_status(t, status::ACKNOWLEDGE);
    set_status(t, status::DRIVER);
    let offered = t.device_features();
    if offered & features::F_VERSION_1 == 0 {
        return Err(InitError::NoVersion1);
    }
    let acked = features::acknowledged(offered, config);
    t.set_driver_features(acked);
    set_status(t, status::FEATURES_OK);
    if t.status() & status::FEATURES_OK == 0 {
        return Err(InitError::FeaturesRejected);
    }
    Ok(acked)
}

/// The size to use for `queue`: `wanted`, lowered to the largest power of two the device allows
/// (packed rings, VIRTIO_F_RING_PACKED in `features`: to the device's maximum, any size).
pub(crate) fn queue_size<T: Transport>(
    t: &mut T,
    features: u64,
    queue: u16,
    wanted: u16,
) -> Result<u16, InitError> {
    let size = split_queue_size(t, queue, wanted)?;
    if features & features::F_RING_PACKED == 0 {
        return Ok(size);
    }
    // Checked above: at least 2, at most `wanted` ≤ 32768.
    Ok(t.queue_max_size(queue).min(u32::from(wanted)) as u16)
}

/// The size of split `queue`: `wanted`, lowered to the largest power of two the device allows.
fn split_queue_size<T: Transport>(t: &mut T, queue: u16, wanted: u16) -> Result<u16, InitError> {
    if t.queue_enabled(queue) {
        return Err(InitError::QueueUnavailable(queue));
    }
    let max = t.queue_max_size(queue).min(u32::from(wanted));
    if max < 2 {
        return Err(InitError::QueueUnavailable(queue));
    }
    // `max` ≤ `wanted` ≤ 32768: fits, and its highest power of two is ≥ 2.
    Ok(1 << (31 - max.leading_zeros()))
}

/// The negotiated features, the queue layout and the queues' sizes (rx, tx, and the control
/// queue's if it was negotiated): everything decided before memory is allocated.
fn negotiate_layout<T: Transport>(
    transport: &mut T,
    config: &Config,
) -> Result<(u64, Layout, [u16; 2], Option<u16>), InitError> {
    let features = negotiate(transport, config)?;
    transport.setup_config_vector()?;
    let layout = crate::mq::layout(transport, features, config)?;
    let sizes = [
        queue_size(transport, features, RX_QUEUE, config.rx_queue_size)?,
        queue_size(transport, features, TX_QUEUE, config.tx_queue_size)?,
    ];
    if features & NET_F_MRG_RXBUF == 0 && config.rx_buf_size < MIN_RX_BUF_WITHOUT_MRG {
        return Err(InitError::RxBufTooSmall {
            size: config.rx_buf_size,
            min: MIN_RX_BUF_WITHOUT_MRG,
        });
    }
    let ctrl_queue = layout.ctrl_queue;
    let ctrl_size = if features & NET_F_CTRL_VQ != 0 {
        let size = queue_size(transport, features, ctrl_queue, CTRL_QUEUE_SIZE)?;
        if size < CTRL_MAX_CHAIN {
            return Err(InitError::QueueUnavailable(ctrl_queue));
        }
        Some(size)
    } else {
        None
    };
    Ok((features, layout, sizes, ctrl_size))
}

/// The control queue `index` of `size` entries and its command buffer; `None` if the memory
/// cannot be had.
fn alloc_ctrl<H: Hal>(hal: &H, mode: RingMode, index: u16, size: u16) -> Option<ControlQueue> {
    let sizes = [mode.bytes(size), CTRL_BUF_BYTES];
    let [ring, buf] = DmaRegion::alloc_all(hal, sizes)?;
    Some(ControlQueue::new(Vring::new(mode, index, size, ring), buf))
}
