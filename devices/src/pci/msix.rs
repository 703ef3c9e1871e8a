//! MSI-X for the virtio-pci transport: the vector table and PBA the guest programs
//! ([`MsixTable`], vCPU side) and the per-vector interrupt lines the device worker signals
//! ([`MsixVectors`], shared, lock-free).
//!
//! # Delivery
//!
//! Every vector has its own eventfd, which the VMM registers as a KVM irqfd on a GSI of its
//! own; that GSI is routed (`KVM_SET_GSI_ROUTING`, an MSI entry) to the vector's address and
//! data. The worker signals a queue through [`MsixVectors::signal_queue`]: one atomic load of
//! the queue's vector (the driver's `queue_msix_vector`), one atomic read-modify-write of the
//! vector's state, and the eventfd write. A masked vector (entry mask bit, function mask, or
//! MSI-X disabled) does not fire: its pending bit is set instead, and the vCPU thread that
//! unmasks it clears the bit and fires the eventfd. Mask and pending bit share one atomic byte,
//! so an interrupt racing an unmask is either delivered by the worker or left pending for the
//! unmasking thread, never lost. (An interrupt racing a *mask* may still be delivered just after
//! the mask write; drivers tolerate a spurious interrupt, and KVM has no masked irqfd route.)
//!
//! # Routes
//!
//! The table reports every vector whose message (address, data) the guest made effective: an
//! entry written while it is deliverable, or a vector becoming deliverable with a message that
//! differs from the last one reported. Reports go to the handler installed with
//! [`MsixTable::set_route_handler`] (called synchronously, *before* a pending interrupt of the
//! vector is fired, so the VMM re-routes the GSI first), or, without a handler, queue up for
//! [`MsixTable::take_route_changes`].

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU16, AtomicU8, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// "No vector" in `config_msix_vector` / `queue_msix_vector`.
pub const VIRTIO_MSI_NO_VECTOR: u16 = 0xffff;
/// Size of one MSI-X table entry.
pub const MSIX_ENTRY_SIZE: u64 = 16;
/// The most vectors a table may have (the capability's 11-bit table size field).
pub const MSIX_MAX_VECTORS: u16 = 2048;
/// Message Control: MSI-X enable.
pub const MSIX_CTRL_ENABLE: u16 = 1 << 15;
/// Message Control: function mask.
pub const MSIX_CTRL_FUNCTION_MASK: u16 = 1 << 14;
/// Vector Control: mask bit.
pub const MSIX_VECTOR_MASKED: u32 = 1;

const STATE_MASKED: u8 = 1;
const STATE_PENDING: u8 = 2;

/// An MSI message: what a vector writes, and where.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    /// Message address (the LAPIC address on x86).
    pub address: u64,
    /// Message data (vector, delivery mode…).
    pub data: u32,
}

/// One vector's interrupt line.
#[derive(Debug)]
struct VectorLine {
    irqfd: EventFd,
    /// `STATE_MASKED` | `STATE_PENDING`.
    state: AtomicU8,
}

/// The device's MSI-X vectors as the worker signals them: one eventfd per vector, each
/// vector's mask and pending bit, and the driver's queue → vector and config → vector mapping.
/// Shared as `Arc<MsixVectors>`; no lock on any path.
#[derive(Debug)]
pub struct MsixVectors {
    lines: Box<[VectorLine]>,
    queue_vectors: Box<[AtomicU16]>,
    config_vector: AtomicU16,
}

impl MsixVectors {
    /// `num_vectors` vectors (1..=2048), all masked, for a device with `num_queues` queues,
    /// none mapped to a vector.
    pub fn new(num_vectors: u16, num_queues: usize) -> io::Result<Self> {
        if num_vectors == 0 || num_vectors > MSIX_MAX_VECTORS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{num_vectors} MSI-X vectors (1..=2048)"),
            ));
        }
        let lines = (0..num_vectors)
            .map(|_| {
                Ok(VectorLine {
                    irqfd: EventFd::new(EFD_NONBLOCK)?,
                    state: AtomicU8::new(STATE_MASKED),
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(MsixVectors {
            lines: lines.into(),
            queue_vectors: (0..num_queues)
                .map(|_| AtomicU16::new(VIRTIO_MSI_NO_VECTOR))
                .collect(),
            config_vector: AtomicU16::new(VIRTIO_MSI_NO_VECTOR),
        })
    }

    /// The number of vectors.
    pub fn len(&self) -> u16 {
        self.lines.len() as u16
    }

    /// Never true (a table has at least one vector); for symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// The eventfd of `vector`, to register as the irqfd of the vector's GSI.
    pub fn irqfd(&self, vector: u16) -> Option<&EventFd> {
        self.lines.get(usize::from(vector)).map(|l| &l.irqfd)
    }

    /// Fires `vector`, or marks it pending while it is masked. `VIRTIO_MSI_NO_VECTOR` and
    /// vectors past the table do nothing.
    pub fn trigger(&self, vector: u16) -> io::Result<()> {
        let Some(line) = self.lines.get(usize::from(vector)) else {
            return Ok(());
        };
        let masked = line
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & STATE_MASKED != 0).then_some(s | STATE_PENDING)
            })
            .is_ok();
        if masked {
            Ok(())
        } else {
            line.irqfd.write(1)
        }
    }

    /// Signals queue `index` on the vector the driver assigned to it (nothing without one).
    pub fn signal_queue(&self, index: usize) -> io::Result<()> {
        match self.queue_vectors.get(index) {
            Some(v) => self.trigger(v.load(Ordering::Acquire)),
            None => Ok(()),
        }
    }

    /// Signals every vector some queue is mapped to, each once: what a device that does not
    /// say which queue it used gets (a spurious queue interrupt is harmless to a driver).
    pub fn signal_all_queues(&self) -> io::Result<()> {
        let mut result = Ok(());
        for (i, v) in self.queue_vectors.iter().enumerate() {
            let vector = v.load(Ordering::Acquire);
            let seen = self.queue_vectors[..i]
                .iter()
                .any(|w| w.load(Ordering::Acquire) == vector);
            if !seen {
                if let Err(e) = self.trigger(vector) {
                    result = Err(e);
                }
            }
        }
        result
    }

    /// Signals the configuration-change vector.
    pub fn signal_config(&self) -> io::Result<()> {
        self.trigger(self.config_vector.load(Ordering::Acquire))
    }

    /// The vector of queue `index` (`VIRTIO_MSI_NO_VECTOR` when none or no such queue).
    pub fn queue_vector(&self, index: usize) -> u16 {
        self.queue_vectors
            .get(index)
            .map_or(VIRTIO_MSI_NO_VECTOR, |v| v.load(Ordering::Acquire))
    }

    /// The configuration-change vector.
    pub fn config_vector(&self) -> u16 {
        self.config_vector.load(Ordering::Acquire)
    }

    /// Maps queue `index` to `vector`; a vector past the table maps it to none. Returns what
    /// was stored.
    pub(crate) fn set_queue_vector(&self, index: usize, vector: u16) -> u16 {
        let vector = self.valid_or_none(vector);
        if let Some(v) = self.queue_vectors.get(index) {
            v.store(vector, Ordering::Release);
        }
        vector
    }

    /// Maps configuration changes to `vector` (none if past the table). Returns what was stored.
    pub(crate) fn set_config_vector(&self, vector: u16) -> u16 {
        let vector = self.valid_or_none(vector);
        self.config_vector.store(vector, Ordering::Release);
        vector
    }

    fn valid_or_none(&self, vector: u16) -> u16 {
        if usize::from(vector) < self.lines.len() {
            vector
        } else {
            VIRTIO_MSI_NO_VECTOR
        }
    }

    /// True while `vector` has an interrupt waiting for an unmask (its PBA bit).
    pub fn is_pending(&self, vector: u16) -> bool {
        self.lines
            .get(usize::from(vector))
            .is_some_and(|l| l.state.load(Ordering::Acquire) & STATE_PENDING != 0)
    }

    /// True while `vector` is masked (entry, function, or MSI-X disabled).
    pub fn is_masked(&self, vector: u16) -> bool {
        self.lines
            .get(usize::from(vector))
            .is_none_or(|l| l.state.load(Ordering::Acquire) & STATE_MASKED != 0)
    }

    /// Masks `vector`.
    fn mask(&self, vector: u16) {
        if let Some(l) = self.lines.get(usize::from(vector)) {
            l.state.fetch_or(STATE_MASKED, Ordering::AcqRel);
        }
    }

    /// Unmasks `vector`, firing it if it was pending.
    fn unmask(&self, vector: u16) -> io::Result<()> {
        let Some(line) = self.lines.get(usize::from(vector)) else {
            return Ok(());
        };
        if line.state.swap(0, Ordering::AcqRel) & STATE_PENDING != 0 {
            line.irqfd.write(1)
        } else {
            Ok(())
        }
    }

    /// Device (virtio) reset: no queue or config vector, no pending interrupt; masks stay.
    pub(crate) fn reset_signals(&self) {
        for v in self.queue_vectors.iter() {
            v.store(VIRTIO_MSI_NO_VECTOR, Ordering::Release);
        }
        self.config_vector
            .store(VIRTIO_MSI_NO_VECTOR, Ordering::Release);
        for l in self.lines.iter() {
            l.state.fetch_and(!STATE_PENDING, Ordering::AcqRel);
            // A WouldBlock only means no stale signal was left.
            let _ = l.irqfd.read();
        }
    }
}

/// One table entry as the guest wrote it.
#[derive(Clone, Copy, Debug)]
struct MsixEntry {
    addr_lo: u32,
    addr_hi: u32,
    data: u32,
    ctrl: u32,
}

impl Default for MsixEntry {
    fn default() -> Self {
        // Every entry comes out of reset masked (PCI 3.0 §6.8.2.9).
        MsixEntry {
            addr_lo: 0,
            addr_hi: 0,
            data: 0,
            ctrl: MSIX_VECTOR_MASKED,
        }
    }
}

impl MsixEntry {
    fn message(&self) -> MsiMessage {
        MsiMessage {
            address: u64::from(self.addr_hi) << 32 | u64::from(self.addr_lo),
            data: self.data,
        }
    }
}

/// Called with (vector, message) when a vector's route must change.
pub type RouteHandler = Box<dyn FnMut(u16, MsiMessage) + Send>;

/// The MSI-X table, PBA and Message Control as the guest programs them (vCPU thread side).
pub struct MsixTable {
    entries: Vec<MsixEntry>,
    enabled: bool,
    function_mask: bool,
    vectors: Arc<MsixVectors>,
    reported: Vec<Option<MsiMessage>>,
    changes: Vec<(u16, MsiMessage)>,
    handler: Option<RouteHandler>,
}

impl fmt::Debug for MsixTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MsixTable")
            .field("entries", &self.entries)
            .field("enabled", &self.enabled)
            .field("function_mask", &self.function_mask)
            .finish_non_exhaustive()
    }
}

impl MsixTable {
    /// A table over `vectors` (one entry per vector), MSI-X disabled, every entry masked.
    pub fn new(vectors: Arc<MsixVectors>) -> Self {
        let n = usize::from(vectors.len());
        MsixTable {
            entries: vec![MsixEntry::default(); n],
            enabled: false,
            function_mask: false,
            vectors,
            reported: vec![None; n],
            changes: Vec::new(),
            handler: None,
        }
    }

    /// The shared per-vector lines.
    pub fn vectors(&self) -> &Arc<MsixVectors> {
        &self.vectors
    }

    /// Size of the table in bytes.
    pub fn table_size(&self) -> u64 {
        self.entries.len() as u64 * MSIX_ENTRY_SIZE
    }

    /// Size of the PBA in bytes (whole quadwords).
    pub fn pba_size(&self) -> u64 {
        self.entries.len().div_ceil(64) as u64 * 8
    }

    /// Installs the route handler; reports queued so far are passed to it at once.
    pub fn set_route_handler(&mut self, mut handler: RouteHandler) {
        for (v, msg) in self.changes.drain(..) {
            handler(v, msg);
        }
        self.handler = Some(handler);
    }

    /// The route changes since the last call (without a handler), one per vector, latest
    /// message.
    pub fn take_route_changes(&mut self) -> Vec<(u16, MsiMessage)> {
        std::mem::take(&mut self.changes)
    }

    /// The message of every vector that can fire now (for a VMM building its routes at once).
    pub fn routes(&self) -> Vec<(u16, MsiMessage)> {
        (0..self.entries.len() as u16)
            .filter(|&v| self.deliverable(v))
            .map(|v| (v, self.entries[usize::from(v)].message()))
            .collect()
    }

    /// The message vector `vector` sends (whatever its mask).
    pub fn message(&self, vector: u16) -> Option<MsiMessage> {
        self.entries.get(usize::from(vector)).map(|e| e.message())
    }

    /// MSI-X enabled in Message Control.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Function Mask in Message Control.
    pub fn function_masked(&self) -> bool {
        self.function_mask
    }

    /// Message Control as read: enable, function mask and the table size (N − 1).
    pub fn message_control(&self) -> u16 {
        let mut ctrl = (self.entries.len() as u16 - 1) & 0x7ff;
        if self.enabled {
            ctrl |= MSIX_CTRL_ENABLE;
        }
        if self.function_mask {
            ctrl |= MSIX_CTRL_FUNCTION_MASK;
        }
        ctrl
    }

    /// The guest wrote Message Control (only enable and function mask are writable).
    pub fn write_message_control(&mut self, value: u16) {
        self.enabled = value & MSIX_CTRL_ENABLE != 0;
        self.function_mask = value & MSIX_CTRL_FUNCTION_MASK != 0;
        for v in 0..self.entries.len() as u16 {
            self.sync(v);
        }
    }

    fn deliverable(&self, vector: u16) -> bool {
        self.enabled
            && !self.function_mask
            && self
                .entries
                .get(usize::from(vector))
                .is_some_and(|e| e.ctrl & MSIX_VECTOR_MASKED == 0)
    }

    /// Brings the shared line of `vector` in line with the table: report a new route first,
    /// then mask or unmask (an unmask fires a pending interrupt on the new route).
    fn sync(&mut self, vector: u16) {
        if !self.deliverable(vector) {
            self.vectors.mask(vector);
            return;
        }
        let v = usize::from(vector);
        let msg = self.entries[v].message();
        if self.reported[v] != Some(msg) {
            self.reported[v] = Some(msg);
            match &mut self.handler {
                Some(handler) => handler(vector, msg),
                None => {
                    self.changes.retain(|(w, _)| *w != vector);
                    self.changes.push((vector, msg));
                }
            }
        }
        if let Err(e) = self.vectors.unmask(vector) {
            log::error!("MSI-X vector {vector}: failed to fire a pending interrupt: {e}");
        }
    }

    /// Reads the table at `offset` (4-byte aligned dwords or 8-byte aligned qwords; anything
    /// else reads as 0).
    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let len = data.len() as u64;
        if !(len == 4 || len == 8) || !offset.is_multiple_of(len) {
            return;
        }
        for (i, chunk) in data.chunks_exact_mut(4).enumerate() {
            let off = offset + 4 * i as u64;
            let Some(entry) = self.entries.get((off / MSIX_ENTRY_SIZE) as usize) else {
                return;
            };
            let value = match off % MSIX_ENTRY_SIZE {
                0 => entry.addr_lo,
                4 => entry.addr_hi,
                8 => entry.data,
                _ => entry.ctrl,
            };
            chunk.copy_from_slice(&value.to_le_bytes());
        }
    }

    /// Writes the table at `offset` (4-byte aligned dwords or 8-byte aligned qwords; anything
    /// else is ignored). Returns false when the access was ignored.
    pub fn write_table(&mut self, offset: u64, data: &[u8]) -> bool {
        let len = data.len() as u64;
        if !(len == 4 || len == 8) || !offset.is_multiple_of(len) {
            return false;
        }
        for (i, chunk) in data.chunks_exact(4).enumerate() {
            let off = offset + 4 * i as u64;
            let index = (off / MSIX_ENTRY_SIZE) as usize;
            let Some(entry) = self.entries.get_mut(index) else {
                return false;
            };
            let value = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            match off % MSIX_ENTRY_SIZE {
                // Message Address bits 1:0 are reserved, read as 0.
                0 => entry.addr_lo = value & !3,
                4 => entry.addr_hi = value,
                8 => entry.data = value,
                // Only the mask bit of Vector Control is defined.
                _ => entry.ctrl = value & MSIX_VECTOR_MASKED,
            }
            self.sync(index as u16);
        }
        true
    }

    /// Reads the PBA at `offset` (aligned dwords or qwords; the PBA is read-only).
    pub fn read_pba(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let len = data.len() as u64;
        if !(len == 4 || len == 8) || !offset.is_multiple_of(len) {
            return;
        }
        for (i, byte) in data.iter_mut().enumerate() {
            let first = (offset + i as u64) * 8;
            for bit in 0..8u64 {
                let Ok(vector) = u16::try_from(first + bit) else {
                    return;
                };
                if self.vectors.is_pending(vector) {
                    *byte |= 1 << bit;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::thread;

    use super::*;

    #[test]
    fn vectors_outside_the_table_do_nothing() {
        let v = MsixVectors::new(2, 1).expect("vectors");
        assert!(MsixVectors::new(0, 1).is_err());
        assert!(MsixVectors::new(MSIX_MAX_VECTORS + 1, 1).is_err());
        v.trigger(VIRTIO_MSI_NO_VECTOR).expect("no vector: nothing");
        v.trigger(2).expect("past the table: nothing");
        v.signal_queue(7).expect("no such queue: nothing");
        assert_eq!(v.set_queue_vector(0, 2), VIRTIO_MSI_NO_VECTOR);
        assert_eq!(v.set_queue_vector(0, 1), 1);
        assert_eq!(v.set_config_vector(5), VIRTIO_MSI_NO_VECTOR);
        assert!(v.is_masked(9) && !v.is_pending(9));
        // Masked from the start: the queue's interrupt waits.
        v.signal_queue(0).expect("pending");
        assert!(v.is_pending(1));
        assert!(v.irqfd(1).unwrap().read().is_err());
        v.unmask(1).expect("fire");
        assert_eq!(v.irqfd(1).unwrap().read().expect("fired"), 1);
        v.unmask(1).expect("nothing pending");
        assert!(v.irqfd(1).unwrap().read().is_err(), "delivered once");
        v.reset_signals();
        assert_eq!(v.queue_vector(0), VIRTIO_MSI_NO_VECTOR);
        assert!(!v.is_masked(1), "a virtio reset leaves masks to the table");
    }

    /// A trigger racing mask toggles is never lost: once the vector ends unmasked, the
    /// interrupt has been fired, directly or from the pending bit.
    #[test]
    fn trigger_racing_mask_changes_is_never_lost() {
        let vectors = Arc::new(MsixVectors::new(1, 1).expect("vectors"));
        let barrier = Arc::new(Barrier::new(2));
        let rounds = 2000;
        let worker = {
            let (vectors, barrier) = (vectors.clone(), barrier.clone());
            thread::spawn(move || {
                for _ in 0..rounds {
                    barrier.wait();
                    vectors.trigger(0).expect("trigger");
                    barrier.wait();
                }
            })
        };
        for round in 0..rounds {
            if round % 2 == 0 {
                vectors.mask(0);
            }
            barrier.wait();
            for k in 0..(round % 7) {
                if k % 2 == 0 {
                    vectors.mask(0);
                } else {
                    vectors.unmask(0).expect("unmask");
                }
            }
            barrier.wait();
            vectors.unmask(0).expect("unmask");
            let fired = vectors.irqfd(0).unwrap().read().unwrap_or(0);
            assert!(fired >= 1, "round {round}: interrupt lost");
            assert!(!vectors.is_pending(0));
        }
        worker.join().expect("worker");
    }

    #[test]
    fn table_accesses_of_odd_sizes_are_ignored() {
        let vectors = Arc::new(MsixVectors::new(3, 2).expect("vectors"));
        let mut table = MsixTable::new(vectors);
        assert_eq!((table.table_size(), table.pba_size()), (48, 8));
        assert!(!table.write_table(0, &[1, 2]));
        assert!(!table.write_table(2, &[0; 4]));
        assert!(!table.write_table(4, &[0; 8]), "misaligned qword");
        assert!(!table.write_table(48, &[0; 4]), "past the table");
        let mut b = [0xffu8; 4];
        table.read_table(48, &mut b);
        assert_eq!(b, [0; 4]);
        table.read_table(12, &mut b);
        assert_eq!(b, [1, 0, 0, 0], "masked out of reset");
        let mut one = [0xffu8; 1];
        table.read_table(12, &mut one);
        assert_eq!(one, [0]);
        table.read_pba(8, &mut b);
        assert_eq!(b, [0; 4]);
        assert_eq!(table.message_control(), 2);
    }
}
