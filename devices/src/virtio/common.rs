//! Transport logic shared by virtio transports: the device status state machine, the
//! acknowledged-features check and the preparation of the queues handed over at activation.
//!
//! These are the rules of [`super::mmio::MmioTransport`] as pure functions, so that the
//! virtio-pci transport applies exactly the same ones.

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_RING_PACKED, VIRTIO_F_RING_RESET, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use std::fmt;
use std::sync::Arc;

use log::{error, warn};

use super::{ActivationContext, QueueResetState, VirtioDevice, VirtioInterrupt};
use crate::error_chain;

/// The status bits the driver sets, in the order it must set them.
pub(crate) const STATUS_STEPS: [u32; 4] = [
    VIRTIO_CONFIG_S_ACKNOWLEDGE,
    VIRTIO_CONFIG_S_DRIVER,
    VIRTIO_CONFIG_S_FEATURES_OK,
    VIRTIO_CONFIG_S_DRIVER_OK,
];

/// What a write to the device status register does.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StatusChange {
    /// The driver wrote 0: reset the device.
    Reset,
    /// The status becomes `status`; `activate` when DRIVER_OK was just set; `warning` for a
    /// (partly) refused write.
    Update {
        status: u32,
        activate: bool,
        warning: Option<String>,
    },
}

/// Applies the driver's write of `value` to the status `old`: steps in order
/// (ACKNOWLEDGE → DRIVER → FEATURES_OK → DRIVER_OK, several at once allowed), no bit cleared
/// without a reset, FAILED sticks, nothing after FAILED, FEATURES_OK only if `check_features`
/// accepts the acknowledged features. NEEDS_RESET in `value` is ignored (it is the device's).
pub(crate) fn write_status(
    old: u32,
    value: u32,
    check_features: impl FnOnce() -> Result<(), String>,
) -> StatusChange {
    let value = value & !VIRTIO_CONFIG_S_NEEDS_RESET;
    if value == 0 {
        return StatusChange::Reset;
    }
    let refuse = |warning: String| StatusChange::Update {
        status: old,
        activate: false,
        warning: Some(warning),
    };
    if value & old != old {
        return refuse(format!(
            "Status {value:#x} clears bits of {old:#x} without a reset"
        ));
    }
    if value & VIRTIO_CONFIG_S_FAILED != 0 {
        return StatusChange::Update {
            status: old | VIRTIO_CONFIG_S_FAILED,
            activate: false,
            warning: None,
        };
    }
    if old & VIRTIO_CONFIG_S_FAILED != 0 {
        return refuse(format!("Status {value:#x} after FAILED (reset first)"));
    }
    let mut status = old;
    let mut activate = false;
    let mut check_features = Some(check_features);
    for step in STATUS_STEPS {
        if status & step != 0 {
            continue;
        }
        if value & step == 0 {
            break;
        }
        if step == VIRTIO_CONFIG_S_FEATURES_OK {
            let check = check_features.take().map_or(Ok(()), |f| f());
            if let Err(why) = check {
                return StatusChange::Update {
                    status,
                    activate: false,
                    warning: Some(format!("FEATURES_OK refused: {why}")),
                };
            }
        }
        if step == VIRTIO_CONFIG_S_DRIVER_OK {
            activate = true;
        }
        status |= step;
    }
    let ignored = value & !status;
    StatusChange::Update {
        status,
        activate,
        warning: (ignored != 0).then(|| {
            format!("Status bits {ignored:#x} ignored (out of order or unknown) in {value:#x}")
        }),
    }
}

/// Checks the features the driver acknowledged against the `offered` ones: a subset, with
/// VERSION_1, and acceptable to the device.
pub(crate) fn check_features(
    device: &dyn VirtioDevice,
    offered: u64,
    acked: u64,
) -> Result<(), String> {
    if acked & !offered != 0 {
        return Err(format!(
            "driver acknowledged features {:#x} the device did not offer",
            acked & !offered
        ));
    }
    if acked & (1 << VIRTIO_F_VERSION_1) == 0 {
        return Err("VIRTIO_F_VERSION_1 not acknowledged (legacy drivers are unsupported)".into());
    }
    device.validate_features(acked).map_err(|e| e.to_string())
}

/// Why the queues cannot be handed to the device.
#[derive(Debug)]
pub(crate) enum ActivationProblem {
    /// The driver's doing (logged as a guest warning).
    Guest(String),
    /// The host's (logged as an error).
    Host(String),
}

/// The first `in_use` queues, copied for the worker (each valid in `mem`, EVENT_IDX set from
/// `acked`), and clones of their kick eventfds. A queue the driver left disabled where
/// `optional(index)` allows it is handed over as a fresh, not-ready queue, for the device
/// to leave alone.
pub(crate) fn activation_queues(
    mem: &GuestMemoryMmap,
    queues: &[Queue],
    kicks: &[EventFd],
    in_use: usize,
    acked: u64,
    optional: impl Fn(usize) -> bool,
) -> Result<(Vec<Queue>, Vec<EventFd>), ActivationProblem> {
    let mut out_queues = Vec::with_capacity(in_use);
    let mut out_kicks = Vec::with_capacity(in_use);
    for (index, (queue, kick)) in queues.iter().zip(kicks).enumerate().take(in_use) {
        if !queue.ready() && optional(index) {
            let unused = Queue::new(queue.max_size()).map_err(|e| {
                ActivationProblem::Host(format!("cannot make unused queue {index}: {e}"))
            })?;
            out_queues.push(unused);
        } else {
            out_queues.push(worker_queue(mem, queue, index, acked, "DRIVER_OK")?);
        }
        out_kicks.push(kick.try_clone().map_err(|e| {
            ActivationProblem::Host(format!("cannot clone kick eventfd {index}: {e}"))
        })?);
    }
    Ok((out_queues, out_kicks))
}

/// Queue `index`, copied for the worker: ready and inside `mem`, EVENT_IDX set from `acked`
/// (`when`: what the driver did, for the messages). Used at activation and when a queue is
/// enabled again after its reset, so both get exactly the same checks.
fn worker_queue(
    mem: &GuestMemoryMmap,
    queue: &Queue,
    index: usize,
    acked: u64,
    when: &str,
) -> Result<Queue, ActivationProblem> {
    // virtio-queue's validity check is the split ring's (ring sizes and alignments); a packed
    // ring's three parts are checked by the device when it resolves them (`AnyRing::new`),
    // which refuses a bad layout as it refuses a split ring the used ring of which overlaps.
    let packed = acked & (1 << VIRTIO_F_RING_PACKED) != 0;
    let usable = if packed {
        queue.ready() && queue.size() != 0
    } else {
        queue.is_valid(mem)
    };
    if !usable {
        return Err(ActivationProblem::Guest(format!(
            "{when} with queue {index} not ready or outside guest memory"
        )));
    }
    if queue.avail_ring() == 0 {
        // virtio-queue treats an avail ring at guest address 0 as "not configured".
        return Err(ActivationProblem::Guest(format!(
            "{when} with queue {index}'s avail ring at guest address 0 (unsupported)"
        )));
    }
    let mut worker_queue = Queue::try_from(queue.state())
        .map_err(|e| ActivationProblem::Host(format!("cannot copy queue {index}: {e}")))?;
    worker_queue.set_event_idx(acked & (1 << VIRTIO_RING_F_EVENT_IDX) != 0);
    Ok(worker_queue)
}

/// Where a queue stands with respect to a per-queue reset (VIRTIO_F_RING_RESET).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum QueuePhase {
    /// Not being reset: configurable before DRIVER_OK, running after.
    #[default]
    Normal,
    /// The driver asked for a reset; the datapath has not confirmed yet (`queue_reset` reads 1).
    Resetting,
    /// Reset: back to its default configuration, which the driver may program again (after
    /// DRIVER_OK) before enabling it.
    Reset,
}

/// Which ring address a driver write sets (virtio 1.x: descriptor, driver and device areas).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RingPart {
    Desc,
    Avail,
    Used,
}

/// Warnings about guest misbehaviour logged per transport before going quiet.
const MAX_GUEST_WARNINGS: u32 = 32;

/// The transport-independent half of a virtio transport, embedded by both: the device, its
/// queues and kick eventfds, the interrupt, the status machine and feature negotiation, and
/// activation and reset. The transports keep only their register layouts (and, for PCI, the
/// configuration space and MSI-X).
pub(crate) struct VirtioState {
    pub(crate) device: Box<dyn VirtioDevice>,
    pub(crate) mem: GuestMemoryMmap,
    pub(crate) interrupt: Arc<VirtioInterrupt>,
    pub(crate) queues: Vec<Queue>,
    pub(crate) kicks: Vec<EventFd>,
    pub(crate) status: u32,
    pub(crate) device_features_sel: u32,
    pub(crate) driver_features_sel: u32,
    pub(crate) acked_features: u64,
    /// Per queue: where it stands with respect to a per-queue reset.
    queue_phases: Vec<QueuePhase>,
    guest_warnings: u32,
    /// "virtio-mmio" or "virtio-pci", for log lines.
    transport: &'static str,
    /// What the transport offers beside the device's features, and the features it cannot
    /// offer whatever the device says.
    features: TransportFeatures,
}

/// The transport's share of the offered features.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TransportFeatures {
    /// Offered in addition to the device's features (e.g. VIRTIO_F_ACCESS_PLATFORM on PCI).
    pub(crate) added: u64,
    /// Never offered.
    pub(crate) unsupported: u64,
}

impl VirtioState {
    /// The state of a freshly reset device.
    pub(crate) fn new(
        transport: &'static str,
        features: TransportFeatures,
        mem: GuestMemoryMmap,
        device: Box<dyn VirtioDevice>,
        interrupt: Arc<VirtioInterrupt>,
        queues: Vec<Queue>,
        kicks: Vec<EventFd>,
    ) -> VirtioState {
        VirtioState {
            device,
            mem,
            interrupt,
            queue_phases: vec![QueuePhase::Normal; queues.len()],
            queues,
            kicks,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            guest_warnings: 0,
            transport,
            features,
        }
    }

    /// "virtio-mmio LABEL (device type N)" for log lines.
    pub(crate) fn name(&self) -> String {
        format!(
            "{} {} (device type {})",
            self.transport,
            self.device.label(),
            self.device.device_type()
        )
    }

    /// Logs guest misbehaviour, rate-limited per transport.
    pub(crate) fn guest_warn(&mut self, args: fmt::Arguments<'_>) {
        self.guest_warnings = self.guest_warnings.saturating_add(1);
        let dev = self.name();
        if self.guest_warnings <= MAX_GUEST_WARNINGS {
            warn!("{dev}: {args}");
        } else if self.guest_warnings == MAX_GUEST_WARNINGS + 1 {
            warn!("{dev}: further guest errors are not logged");
        }
    }

    /// True when every bit of `bits` is set in the status.
    pub(crate) fn has(&self, bits: u32) -> bool {
        self.status & bits == bits
    }

    /// The features offered: the device's and the transport's, without those the transport
    /// cannot offer; VIRTIO_F_RING_RESET exactly when the device can reset a queue.
    pub(crate) fn offered_features(&self) -> u64 {
        let mut features = self.device.features() | self.features.added;
        if self.device.supports_queue_reset() {
            features |= 1 << VIRTIO_F_RING_RESET;
        } else {
            features &= !(1 << VIRTIO_F_RING_RESET);
        }
        features & !self.features.unsupported
    }

    /// The status register as the driver reads it (with the device's NEEDS_RESET).
    pub(crate) fn status_register(&self) -> u32 {
        if self.interrupt.needs_reset() {
            self.status | VIRTIO_CONFIG_S_NEEDS_RESET
        } else {
            self.status
        }
    }

    /// The driver's write of 32 feature bits at `driver_features_sel` (`register`: its name
    /// in this transport, for the warnings).
    pub(crate) fn write_driver_features(&mut self, value: u32, register: &str) {
        if !self.has(VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER)
            || self.has(VIRTIO_CONFIG_S_FEATURES_OK)
        {
            let status = self.status;
            self.guest_warn(format_args!(
                "{register} written in status {status:#x} (allowed after DRIVER, before FEATURES_OK)"
            ));
            return;
        }
        match self.driver_features_sel {
            0 => self.acked_features = (self.acked_features & !0xffff_ffff) | u64::from(value),
            1 => {
                self.acked_features = (self.acked_features & 0xffff_ffff) | (u64::from(value) << 32)
            }
            sel => self.guest_warn(format_args!("{register} written with selector {sel}")),
        }
    }

    /// Queue `sel`, if its configuration may be written now (after FEATURES_OK, before
    /// DRIVER_OK; or after DRIVER_OK while the queue is reset); warns otherwise.
    pub(crate) fn configurable_queue(&mut self, sel: usize, what: &str) -> Option<&mut Queue> {
        let reset = self.queue_phases.get(sel) == Some(&QueuePhase::Reset);
        if !reset && (!self.has(VIRTIO_CONFIG_S_FEATURES_OK) || self.has(VIRTIO_CONFIG_S_DRIVER_OK))
        {
            let status = self.status;
            self.guest_warn(format_args!(
                "{what} written in status {status:#x} (allowed after FEATURES_OK, before \
                 DRIVER_OK, or while the queue is reset)"
            ));
            return None;
        }
        if self.queues.get(sel).is_none() {
            self.guest_warn(format_args!("{what} written for nonexistent queue {sel}"));
            return None;
        }
        self.queues.get_mut(sel)
    }

    /// Sets `part` of queue `sel`'s ring addresses to `update(old)` (a transport writes one
    /// half of the 64-bit address at a time); a misaligned address is refused with a warning.
    pub(crate) fn write_ring_addr(
        &mut self,
        sel: usize,
        part: RingPart,
        update: impl FnOnce(u64) -> u64,
    ) {
        let Some(queue) = self.configurable_queue(sel, "a queue address register") else {
            return;
        };
        let old = match part {
            RingPart::Desc => queue.desc_table(),
            RingPart::Avail => queue.avail_ring(),
            RingPart::Used => queue.used_ring(),
        };
        let addr = GuestAddress(update(old));
        let result = match part {
            RingPart::Desc => queue.try_set_desc_table_address(addr),
            RingPart::Avail => queue.try_set_avail_ring_address(addr),
            RingPart::Used => queue.try_set_used_ring_address(addr),
        };
        if result.is_err() {
            self.guest_warn(format_args!(
                "{part:?} ring address {:#x} refused (misaligned)",
                addr.0
            ));
        }
    }

    /// A notification for queue `index` that did not go through an ioeventfd.
    pub(crate) fn notify(&mut self, index: u64) {
        match usize::try_from(index).ok().and_then(|i| self.kicks.get(i)) {
            Some(kick) => {
                if let Err(e) = kick.write(1) {
                    error!(
                        "{}: failed to signal queue {index}'s kick eventfd: {e}",
                        self.name()
                    );
                }
            }
            None => self.guest_warn(format_args!("notification for nonexistent queue {index}")),
        }
    }

    /// The driver's write of the status register. Returns true when it asks for a reset,
    /// which the transport carries out (it has state of its own to reset).
    #[must_use]
    pub(crate) fn write_status(&mut self, value: u32) -> bool {
        let offered = self.offered_features();
        let acked = self.acked_features;
        let change = write_status(self.status, value, || {
            check_features(self.device.as_ref(), offered, acked)
        });
        match change {
            StatusChange::Reset => true,
            StatusChange::Update {
                status,
                activate,
                warning,
            } => {
                self.status = status;
                if let Some(w) = warning {
                    self.guest_warn(format_args!("{w}"));
                }
                if activate {
                    self.activate();
                }
                false
            }
        }
    }

    /// The driver's write of `value` to queue `sel`'s reset register (`register`: its name in
    /// this transport): 1 starts a per-queue reset of a running queue when VIRTIO_F_RING_RESET
    /// was negotiated. Anything else is refused with a warning and has no effect.
    pub(crate) fn write_queue_reset(&mut self, sel: usize, value: u64, register: &str) {
        let refuse = |state: &mut Self, why: &str| {
            state.guest_warn(format_args!(
                "{register} {value} for queue {sel} refused: {why}"
            ));
        };
        if value != 1 {
            return refuse(self, "only 1 may be written");
        }
        if self.acked_features & (1 << VIRTIO_F_RING_RESET) == 0 {
            return refuse(self, "VIRTIO_F_RING_RESET not negotiated");
        }
        if !self.has(VIRTIO_CONFIG_S_DRIVER_OK) {
            return refuse(self, "before DRIVER_OK");
        }
        if sel >= self.device.queues_in_use(self.acked_features) || sel >= self.queues.len() {
            return refuse(self, "no such queue in use");
        }
        match self.queue_phases[sel] {
            QueuePhase::Normal => {}
            QueuePhase::Resetting | QueuePhase::Reset => {
                return refuse(self, "the queue is already reset (enable it first)")
            }
        }
        if !self.queues[sel].ready() {
            return refuse(self, "the queue is not enabled");
        }
        let phase = match self.device.reset_queue(sel) {
            QueueResetState::Refused => return refuse(self, "the device cannot reset it"),
            QueueResetState::Ongoing => QueuePhase::Resetting,
            QueueResetState::Done => QueuePhase::Reset,
        };
        // Back to the defaults: the driver programs the queue again before enabling it.
        self.queues[sel].reset();
        self.queue_phases[sel] = phase;
    }

    /// Queue `sel`'s reset register as the driver reads it: 1 while its reset is ongoing.
    pub(crate) fn queue_reset_register(&mut self, sel: usize) -> u64 {
        match self.queue_phases.get(sel) {
            Some(QueuePhase::Resetting) => match self.device.poll_queue_reset(sel) {
                QueueResetState::Ongoing => 1,
                QueueResetState::Done | QueueResetState::Refused => {
                    self.queue_phases[sel] = QueuePhase::Reset;
                    0
                }
            },
            _ => 0,
        }
    }

    /// The driver's write of queue `sel`'s enable register (`what`: its name): before
    /// DRIVER_OK it sets the queue's readiness; after DRIVER_OK, 1 on a reset queue restarts it
    /// on the rings as programmed since (with the activation's checks; unusable rings set
    /// DEVICE_NEEDS_RESET).
    pub(crate) fn write_queue_enable(&mut self, sel: usize, ready: bool, what: &str) {
        let reset = self.queue_phases.get(sel) == Some(&QueuePhase::Reset);
        if !reset || !self.has(VIRTIO_CONFIG_S_DRIVER_OK) {
            if let Some(queue) = self.configurable_queue(sel, what) {
                queue.set_ready(ready);
            }
            return;
        }
        if !ready {
            return self.guest_warn(format_args!(
                "{what} 0 for reset queue {sel} ignored (it is not enabled)"
            ));
        }
        let mut queue = match Queue::try_from(self.queues[sel].state()) {
            Ok(queue) => queue,
            Err(e) => {
                error!("{}: cannot copy queue {sel}: {e}", self.name());
                return self.fail_activation();
            }
        };
        queue.set_ready(true);
        let prepared = worker_queue(&self.mem, &queue, sel, self.acked_features, what);
        let queue = match prepared {
            Ok(queue) => queue,
            Err(ActivationProblem::Guest(why)) => {
                self.guest_warn(format_args!("{why} (after its reset)"));
                return self.fail_activation();
            }
            Err(ActivationProblem::Host(why)) => {
                error!("{}: {why}", self.name());
                return self.fail_activation();
            }
        };
        if let Err(e) = self.device.enable_queue(sel, queue) {
            self.guest_warn(format_args!(
                "queue {sel} cannot run after its reset: {}",
                error_chain(&e)
            ));
            return self.fail_activation();
        }
        self.queues[sel].set_ready(true);
        self.queue_phases[sel] = QueuePhase::Normal;
    }

    fn activate(&mut self) {
        let in_use = self.device.queues_in_use(self.acked_features);
        let acked = self.acked_features;
        let device = &self.device;
        let prepared = activation_queues(
            &self.mem,
            &self.queues,
            &self.kicks,
            in_use,
            acked,
            |index| device.queue_optional(index, acked),
        );
        let (queues, kicks) = match prepared {
            Ok(q) => q,
            Err(ActivationProblem::Guest(why)) => {
                self.guest_warn(format_args!("{why}"));
                return self.fail_activation();
            }
            Err(ActivationProblem::Host(why)) => {
                error!("{}: {why}", self.name());
                return self.fail_activation();
            }
        };
        let ctx = ActivationContext {
            mem: self.mem.clone(),
            queues,
            kicks,
            interrupt: self.interrupt.clone(),
            acked_features: self.acked_features,
            positions: Vec::new(),
        };
        if let Err(e) = self.device.activate(ctx) {
            error!("{}: activation failed: {e}", self.name());
            self.fail_activation();
        }
    }

    fn fail_activation(&mut self) {
        if let Err(e) = self.interrupt.set_needs_reset() {
            error!("{}: failed to signal DEVICE_NEEDS_RESET: {e}", self.name());
        }
    }

    /// Device reset: the worker stopped, queues and kicks cleared, no interrupt pending,
    /// negotiation back to the start.
    pub(crate) fn reset(&mut self) {
        self.device.reset();
        for queue in &mut self.queues {
            queue.reset();
        }
        self.queue_phases.fill(QueuePhase::Normal);
        for kick in &self.kicks {
            // A WouldBlock only means no stale kick was pending.
            let _ = kick.read();
        }
        self.interrupt.reset();
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.acked_features = 0;
    }
}

#[cfg(test)]
pub(crate) mod fake;

#[cfg(test)]
mod tests {
    //! The status machine, feature negotiation, queue configuration, activation and reset,
    //! through [`VirtioState`] as both transports drive it, over a fake device.

    use std::sync::Mutex;

    use virtio_bindings::virtio_config::VIRTIO_F_ACCESS_PLATFORM;
    use virtio_bindings::virtio_mmio::VIRTIO_MMIO_INT_CONFIG;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;
    use fake::{lock, FakeDevice, FakeState, F_DEP, F_NEEDS, F_OPTIONAL};

    const ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
    const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
    const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
    const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
    const FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
    const NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;
    const ALL: u32 = ACK | DRIVER | FEATURES_OK | DRIVER_OK;

    const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
    const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
    /// Offered by the transport beside the device's features.
    const ADDED: u64 = 1 << VIRTIO_F_ACCESS_PLATFORM;
    /// Offered by the device, withheld by the transport.
    const WITHHELD: u64 = 1 << 39;
    /// Offered by the device, which cannot reset a queue: not offered.
    const RING_RESET: u64 = 1 << VIRTIO_F_RING_RESET;
    const NOT_OFFERED: u64 = 1 << 41;
    const DEVICE_FEATURES: u64 =
        VERSION_1 | F_NEEDS | F_DEP | F_OPTIONAL | EVENT_IDX | WITHHELD | RING_RESET;
    const OFFERED: u64 = VERSION_1 | F_NEEDS | F_DEP | F_OPTIONAL | EVENT_IDX | ADDED;

    /// A fresh state over the fake device (two queues of 64) in 1 MiB of guest memory, with the transport's share
    /// of the features as virtio-pci has it; also the log and the interrupt line's eventfd.
    fn state() -> (VirtioState, Arc<Mutex<FakeState>>, EventFd) {
        let log = Arc::new(Mutex::new(FakeState::default()));
        let mem =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).expect("guest memory");
        let irqfd = EventFd::new(EFD_NONBLOCK).expect("eventfd");
        let line = irqfd.try_clone().expect("eventfd");
        let queues = vec![
            Queue::new(64).expect("queue"),
            Queue::new(64).expect("queue"),
        ];
        let kicks = (0..2)
            .map(|_| EventFd::new(EFD_NONBLOCK).expect("eventfd"))
            .collect();
        let state = VirtioState::new(
            "test",
            TransportFeatures {
                added: ADDED,
                unsupported: WITHHELD,
            },
            mem,
            Box::new(FakeDevice {
                state: log.clone(),
                sizes: vec![64, 64],
                features: DEVICE_FEATURES,
                resettable: false,
            }),
            Arc::new(VirtioInterrupt::line(line)),
            queues,
            kicks,
        );
        (state, log, irqfd)
    }

    /// One thing the driver (or the device) does.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// Writes the status register (a write asking for a reset resets, as in the transports).
        Status(u32),
        /// Writes the 32 feature bits selected by the first value.
        Features(u32, u32),
        /// Configures queue `.0` with `.1` entries, its rings at `.2` (descriptors), `.2 +
        /// 0x400` (avail) and `.2 + 0x800` (used), and enables it.
        Setup(usize, u16, u64),
        Size(usize, u16),
        Desc(usize, u64),
        Avail(usize, u64),
        Used(usize, u64),
        Enable(usize, bool),
        /// The device will refuse its activation.
        RefuseActivation,
    }
    use Step::*;

    fn apply(state: &mut VirtioState, log: &Mutex<FakeState>, step: Step) {
        match step {
            Status(value) => {
                if state.write_status(value) {
                    state.reset();
                }
            }
            Features(sel, value) => {
                state.driver_features_sel = sel;
                state.write_driver_features(value, "features");
            }
            Setup(index, size, base) => {
                for step in [
                    Size(index, size),
                    Desc(index, base),
                    Avail(index, base + 0x400),
                    Used(index, base + 0x800),
                    Enable(index, true),
                ] {
                    apply(state, log, step);
                }
            }
            Size(index, size) => {
                if let Some(queue) = state.configurable_queue(index, "size") {
                    queue.try_set_size(size).expect("a valid size");
                }
            }
            Desc(index, addr) => state.write_ring_addr(index, RingPart::Desc, |_| addr),
            Avail(index, addr) => state.write_ring_addr(index, RingPart::Avail, |_| addr),
            Used(index, addr) => state.write_ring_addr(index, RingPart::Used, |_| addr),
            Enable(index, ready) => state.write_queue_enable(index, ready, "enable"),
            RefuseActivation => lock(log).refuse_activation = true,
        }
    }

    /// Where a row starts: reached with the steps of [`Start::steps`].
    #[derive(Clone, Copy, Debug)]
    enum Start {
        Reset,
        Driver,
        FeaturesOk,
        Running,
    }
    use Start::*;

    const TO_FEATURES_OK: [Step; 4] = [
        Status(ACK),
        Status(ACK | DRIVER),
        Features(1, 1),
        Status(ACK | DRIVER | FEATURES_OK),
    ];

    impl Start {
        fn steps(self) -> Vec<Step> {
            match self {
                Reset => vec![],
                Driver => TO_FEATURES_OK[..2].to_vec(),
                FeaturesOk => TO_FEATURES_OK.to_vec(),
                Running => [
                    &TO_FEATURES_OK[..],
                    &[Setup(0, 32, 0x1000), Setup(1, 32, 0x2000), Status(ALL)],
                ]
                .concat(),
            }
        }
    }

    /// How a row ends: the status register as the driver reads it, the acknowledged features,
    /// queue 0 (size, descriptor table, used ring, ready), the device's activate and reset
    /// calls, whether it runs, and whether the steps warned about the guest.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct End {
        status: u32,
        acked: u64,
        queue0: (u16, u64, u64, bool),
        activations: usize,
        resets: usize,
        active: bool,
        warned: bool,
    }

    const AT_RESET: End = End {
        status: 0,
        acked: 0,
        queue0: (64, 0, 0, false),
        activations: 0,
        resets: 0,
        active: false,
        warned: false,
    };
    const AT_DRIVER: End = End {
        status: ACK | DRIVER,
        ..AT_RESET
    };
    const AT_FEATURES_OK: End = End {
        status: ACK | DRIVER | FEATURES_OK,
        acked: VERSION_1,
        ..AT_DRIVER
    };
    /// Queue 0 as [`Start::Running`] configures it.
    const QUEUE0: (u16, u64, u64, bool) = (32, 0x1000, 0x1800, true);
    const RUNNING: End = End {
        status: ALL,
        queue0: QUEUE0,
        activations: 1,
        active: true,
        ..AT_FEATURES_OK
    };
    /// DRIVER_OK whose activation failed: DEVICE_NEEDS_RESET, nothing runs.
    const NOT_RUNNING: End = End {
        status: ALL | NEEDS_RESET,
        queue0: QUEUE0,
        warned: true,
        ..AT_FEATURES_OK
    };

    const fn warned(end: End) -> End {
        End {
            warned: true,
            ..end
        }
    }

    const fn hi(features: u64) -> u32 {
        (features >> 32) as u32
    }

    const fn lo(features: u64) -> u32 {
        features as u32
    }

    /// Every legal and illegal step of the status machine, feature negotiation and queue
    /// configuration, and activation and reset: (what, start, steps, end).
    #[rustfmt::skip]
    const ROWS: &[(&str, Start, &[Step], End)] = &[
        // Status: each step in order, several at once.
        ("ACKNOWLEDGE", Reset, &[Status(ACK)], End { status: ACK, ..AT_RESET }),
        ("then DRIVER", Reset, &[Status(ACK), Status(ACK | DRIVER)], AT_DRIVER),
        ("ACKNOWLEDGE and DRIVER in one write", Reset, &[Status(ACK | DRIVER)], AT_DRIVER),
        ("features, then FEATURES_OK", Driver, &[Features(1, 1), Status(ACK | DRIVER | FEATURES_OK)], AT_FEATURES_OK),
        ("queues, then DRIVER_OK: activated", FeaturesOk, &[Setup(0, 32, 0x1000), Setup(1, 32, 0x2000), Status(ALL)], RUNNING),
        ("FEATURES_OK and DRIVER_OK in one write (every queue optional): activated", Driver, &[Features(0, lo(F_OPTIONAL)), Features(1, 1), Status(ALL)], End { status: ALL, acked: VERSION_1 | F_OPTIONAL, activations: 1, active: true, ..AT_DRIVER }),
        // Status: out of order, cleared bits, unknown bits, NEEDS_RESET, FAILED.
        ("DRIVER before ACKNOWLEDGE", Reset, &[Status(DRIVER)], warned(AT_RESET)),
        ("FEATURES_OK before DRIVER", Reset, &[Status(ACK), Status(ACK | FEATURES_OK)], warned(End { status: ACK, ..AT_RESET })),
        ("DRIVER_OK before FEATURES_OK", Driver, &[Status(ACK | DRIVER | DRIVER_OK)], warned(AT_DRIVER)),
        ("every step in one write: FEATURES_OK refused (nothing acked), the steps before kept", Reset, &[Status(ALL)], warned(AT_DRIVER)),
        ("unknown status bits", Driver, &[Status(ACK | DRIVER | 0x10)], warned(AT_DRIVER)),
        ("DRIVER cleared without a reset", Driver, &[Status(ACK)], warned(AT_DRIVER)),
        ("DRIVER_OK cleared without a reset", Running, &[Status(ACK | DRIVER | FEATURES_OK)], warned(RUNNING)),
        ("DRIVER_OK again: no second activation", Running, &[Status(ALL)], RUNNING),
        ("NEEDS_RESET written by the driver: ignored (it is the device's)", Driver, &[Status(ACK | DRIVER | NEEDS_RESET)], AT_DRIVER),
        ("NEEDS_RESET alone: a reset", Running, &[Status(NEEDS_RESET)], End { activations: 1, resets: 1, ..AT_RESET }),
        ("FAILED", Driver, &[Status(ACK | DRIVER | FAILED)], End { status: ACK | DRIVER | FAILED, ..AT_DRIVER }),
        ("FAILED on a running device", Running, &[Status(ALL | FAILED)], End { status: ALL | FAILED, ..RUNNING }),
        ("no progress after FAILED", Driver, &[Status(ACK | DRIVER | FAILED), Features(1, 1), Status(ACK | DRIVER | FAILED | FEATURES_OK)], End { status: ACK | DRIVER | FAILED, acked: VERSION_1, ..AT_DRIVER }),
        ("FAILED cleared without a reset", Driver, &[Status(ACK | DRIVER | FAILED), Status(ACK | DRIVER)], warned(End { status: ACK | DRIVER | FAILED, ..AT_DRIVER })),
        ("a reset after FAILED", Driver, &[Status(ACK | DRIVER | FAILED), Status(0)], End { resets: 1, ..AT_RESET }),
        // Features: written after DRIVER and before FEATURES_OK, a subset of the offered ones
        // with VERSION_1 that the device accepts.
        ("the low feature bits", Driver, &[Features(0, lo(F_DEP))], End { acked: F_DEP, ..AT_DRIVER }),
        ("features before DRIVER: ignored", Reset, &[Status(ACK), Features(1, 1)], warned(End { status: ACK, ..AT_RESET })),
        ("features after FEATURES_OK: frozen", FeaturesOk, &[Features(1, 0), Features(0, lo(F_DEP))], warned(AT_FEATURES_OK)),
        ("a feature selector past 1", Driver, &[Features(2, 1)], warned(AT_DRIVER)),
        ("FEATURES_OK with every offered feature", Driver, &[Features(0, lo(OFFERED)), Features(1, hi(OFFERED)), Status(ACK | DRIVER | FEATURES_OK)], End { acked: OFFERED, ..AT_FEATURES_OK }),
        ("FEATURES_OK with a feature and its prerequisite", Driver, &[Features(0, lo(F_NEEDS | F_DEP)), Features(1, 1), Status(ACK | DRIVER | FEATURES_OK)], End { acked: VERSION_1 | F_NEEDS | F_DEP, ..AT_FEATURES_OK }),
        ("FEATURES_OK with the transport's own feature", Driver, &[Features(1, hi(VERSION_1 | ADDED)), Status(ACK | DRIVER | FEATURES_OK)], End { acked: VERSION_1 | ADDED, ..AT_FEATURES_OK }),
        ("FEATURES_OK with a feature not offered", Driver, &[Features(1, hi(VERSION_1 | NOT_OFFERED)), Status(ACK | DRIVER | FEATURES_OK)], warned(End { acked: VERSION_1 | NOT_OFFERED, ..AT_DRIVER })),
        ("FEATURES_OK with a device feature the transport withholds", Driver, &[Features(1, hi(VERSION_1 | WITHHELD)), Status(ACK | DRIVER | FEATURES_OK)], warned(End { acked: VERSION_1 | WITHHELD, ..AT_DRIVER })),
        ("FEATURES_OK with RING_RESET from a device that cannot reset queues", Driver, &[Features(1, hi(VERSION_1 | RING_RESET)), Status(ACK | DRIVER | FEATURES_OK)], warned(End { acked: VERSION_1 | RING_RESET, ..AT_DRIVER })),
        ("FEATURES_OK without VERSION_1 (a legacy driver)", Driver, &[Features(0, lo(F_DEP)), Status(ACK | DRIVER | FEATURES_OK)], warned(End { acked: F_DEP, ..AT_DRIVER })),
        ("FEATURES_OK with a feature the device refuses without its prerequisite", Driver, &[Features(0, lo(F_NEEDS)), Features(1, 1), Status(ACK | DRIVER | FEATURES_OK)], warned(End { acked: VERSION_1 | F_NEEDS, ..AT_DRIVER })),
        ("FEATURES_OK refused, then accepted for other features", Driver, &[Features(1, hi(VERSION_1 | NOT_OFFERED)), Status(ACK | DRIVER | FEATURES_OK), Features(1, 1), Status(ACK | DRIVER | FEATURES_OK)], warned(AT_FEATURES_OK)),
        // Queues: configurable after FEATURES_OK and before DRIVER_OK.
        ("queue setup", FeaturesOk, &[Setup(0, 32, 0x1000)], End { queue0: QUEUE0, ..AT_FEATURES_OK }),
        ("queue setup before FEATURES_OK", Driver, &[Setup(0, 32, 0x1000)], warned(AT_DRIVER)),
        ("queue setup after DRIVER_OK", Running, &[Size(0, 16), Desc(0, 0x5000), Used(0, 0x6000), Enable(0, false)], warned(RUNNING)),
        ("a queue that does not exist", FeaturesOk, &[Setup(2, 32, 0x1000)], warned(AT_FEATURES_OK)),
        ("a descriptor table not 16-byte aligned", FeaturesOk, &[Desc(0, 0x1008)], warned(AT_FEATURES_OK)),
        ("a used ring not 4-byte aligned", FeaturesOk, &[Used(0, 0x1002)], warned(AT_FEATURES_OK)),
        // Activation at DRIVER_OK.
        ("DRIVER_OK with a queue left disabled", FeaturesOk, &[Setup(0, 32, 0x1000), Status(ALL)], NOT_RUNNING),
        ("DRIVER_OK with a queue left disabled where the device allows it", Driver, &[Features(0, lo(F_OPTIONAL)), Features(1, 1), Status(ACK | DRIVER | FEATURES_OK), Setup(0, 32, 0x1000), Status(ALL)], End { acked: VERSION_1 | F_OPTIONAL, ..RUNNING }),
        ("FEATURES_OK and DRIVER_OK in one write, the queues not configured", Driver, &[Features(1, 1), Status(ALL)], warned(End { status: ALL | NEEDS_RESET, acked: VERSION_1, ..AT_DRIVER })),
        ("DRIVER_OK with rings past the end of guest memory", FeaturesOk, &[Setup(0, 32, 0x1000), Setup(1, 32, 0xf_fc00), Status(ALL)], NOT_RUNNING),
        ("DRIVER_OK with an avail ring at guest address 0", FeaturesOk, &[Setup(0, 32, 0x1000), Setup(1, 32, 0x2000), Avail(1, 0), Status(ALL)], NOT_RUNNING),
        ("DRIVER_OK, the device refusing activation", FeaturesOk, &[Setup(0, 32, 0x1000), Setup(1, 32, 0x2000), RefuseActivation, Status(ALL)], End { activations: 1, warned: false, ..NOT_RUNNING }),
        // Reset: writing 0.
        ("a reset of a running device", Running, &[Status(0)], End { activations: 1, resets: 1, ..AT_RESET }),
        ("a reset clears NEEDS_RESET", FeaturesOk, &[Setup(0, 32, 0x1000), Status(ALL), Status(0)], warned(End { resets: 1, ..AT_RESET })),
        ("after a reset, negotiation and activation start over", Running, &[Status(0), Status(ACK | DRIVER), Features(1, 1), Status(ACK | DRIVER | FEATURES_OK), Setup(0, 32, 0x1000), Setup(1, 32, 0x2000), Status(ALL)], End { activations: 2, resets: 1, ..RUNNING }),
    ];

    #[test]
    fn status_machine() {
        for &(what, start, steps, expected) in ROWS {
            let (mut state, log, irqfd) = state();
            for step in start.steps() {
                apply(&mut state, &log, step);
            }
            state.guest_warnings = 0;
            for &step in steps {
                apply(&mut state, &log, step);
            }
            let queue = &state.queues[0];
            let end = {
                let log = lock(&log);
                End {
                    status: state.status_register(),
                    acked: state.acked_features,
                    queue0: (
                        queue.size(),
                        queue.desc_table(),
                        queue.used_ring(),
                        queue.ready(),
                    ),
                    activations: log.activations,
                    resets: log.resets,
                    active: log.ctx.is_some(),
                    warned: state.guest_warnings > 0,
                }
            };
            assert_eq!(end, expected, "{what} (from {start:?}, {steps:?})");
            // DEVICE_NEEDS_RESET comes with a configuration interrupt; a reset clears both.
            let needs_reset = end.status & NEEDS_RESET != 0;
            let config_irq = state.interrupt.status() & VIRTIO_MMIO_INT_CONFIG != 0;
            assert_eq!(config_irq, needs_reset, "{what}: configuration interrupt");
            assert_eq!(irqfd.read().is_ok(), needs_reset, "{what}: line signalled");
        }
    }

    /// What the device receives at DRIVER_OK: the queues as configured (EVENT_IDX set as
    /// negotiated; one the device lets the driver leave disabled as a fresh queue), clones of
    /// the kick eventfds and the transport's interrupt.
    #[test]
    fn activation_hands_over_queues_kicks_and_interrupt() {
        let (mut state, log, _irqfd) = state();
        let acked = VERSION_1 | EVENT_IDX | F_OPTIONAL;
        for step in [
            Status(ACK | DRIVER),
            Features(0, lo(acked)),
            Features(1, hi(acked)),
            Status(ACK | DRIVER | FEATURES_OK),
            Setup(0, 32, 0x1000),
            Status(ALL),
        ] {
            apply(&mut state, &log, step);
        }
        let log = lock(&log);
        let ctx = log.ctx.as_ref().expect("activated");
        assert_eq!(ctx.acked_features, acked);
        assert_eq!((ctx.queues.len(), ctx.kicks.len()), (2, 2));
        let q = &ctx.queues[0];
        assert_eq!(
            (q.size(), q.desc_table(), q.avail_ring(), q.used_ring()),
            (32, 0x1000, 0x1400, 0x1800)
        );
        assert!(q.ready() && q.event_idx_enabled());
        let unused = &ctx.queues[1];
        assert_eq!((unused.ready(), unused.size()), (false, 64));
        state.kicks[1].write(1).expect("kick");
        assert_eq!(ctx.kicks[1].read().expect("the same eventfd"), 1);
        assert!(ctx.kicks[0].read().is_err(), "queue 0 not kicked");
        assert!(Arc::ptr_eq(&ctx.interrupt, &state.interrupt));
    }
}
