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
mod tests {
    use super::*;

    const ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
    const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
    const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
    const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;

    fn update(old: u32, value: u32, features: Result<(), String>) -> (u32, bool, bool) {
        match write_status(old, value, || features) {
            StatusChange::Reset => panic!("unexpected reset"),
            StatusChange::Update {
                status,
                activate,
                warning,
            } => (status, activate, warning.is_some()),
        }
    }

    #[test]
    fn status_machine() {
        assert_eq!(
            write_status(ACK, VIRTIO_CONFIG_S_NEEDS_RESET, || Ok(())),
            StatusChange::Reset
        );
        assert_eq!(update(0, DRIVER, Ok(())), (0, false, true));
        assert_eq!(
            update(0, ACK | DRIVER, Ok(())),
            (ACK | DRIVER, false, false)
        );
        assert_eq!(
            update(ACK | DRIVER, ACK, Ok(())),
            (ACK | DRIVER, false, true)
        );
        let all = ACK | DRIVER | FEATURES_OK | DRIVER_OK;
        assert_eq!(update(0, all, Ok(())), (all, true, false));
        assert_eq!(
            update(0, all, Err("no".into())),
            (ACK | DRIVER, false, true),
            "steps before a refused FEATURES_OK are kept"
        );
        let failed = ACK | VIRTIO_CONFIG_S_FAILED;
        assert_eq!(update(ACK, failed, Ok(())), (failed, false, false));
        assert_eq!(
            update(failed, failed | DRIVER, Ok(())),
            (failed, false, false)
        );
        assert_eq!(
            update(failed, ACK | DRIVER, Ok(())),
            (failed, false, true),
            "nothing after FAILED"
        );
        assert_eq!(
            update(all, all, Ok(())),
            (all, false, false),
            "no re-activation"
        );
    }
}
