//! [`DevPackedQueue`]: the device half of a packed virtqueue, written from the spec (not from
//! the driver's `ring/packed.rs`), over the same [`TestHal`] memory.
//!
//! Positions are counted as free-running descriptor numbers (`abs`, from 0); the ring position
//! is `abs % size` and the wrap counter `abs / size` even (both counters start at 1). The event
//! checks scan the window they cover instead of using the driver's modular arithmetic.

use std::sync::atomic::{fence, Ordering};
use std::vec::Vec;

use super::hal::TestHal;
use super::Desc;
use crate::hal::PhysAddr;

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_AVAIL: u16 = 1 << 7;
const F_USED: u16 = 1 << 15;
/// Event suppression flags, from the spec.
pub(crate) const EV_ENABLE: u16 = 0;
pub(crate) const EV_DISABLE: u16 = 1;
pub(crate) const EV_DESC: u16 = 2;

/// A chain the device took off the ring.
#[derive(Clone, Debug)]
pub(crate) struct PackedChain {
    /// The buffer id (from the last descriptor).
    pub(crate) id: u16,
    pub(crate) descs: Vec<Desc>,
    /// Ring position of the first descriptor.
    pub(crate) pos: u16,
}

impl PackedChain {
    /// Total length of the device-writable buffers.
    pub(crate) fn writable(&self) -> u32 {
        self.descs
            .iter()
            .filter(|d| d.writable())
            .map(|d| d.len)
            .sum()
    }
}

/// The device's view of one packed queue.
pub(crate) struct DevPackedQueue {
    hal: TestHal,
    pub(crate) size: u16,
    desc: PhysAddr,
    driver: PhysAddr,
    device: PhysAddr,
    pub(crate) event_idx: bool,
    /// Descriptors read so far (the next one to read is `avail_abs`).
    pub(crate) avail_abs: u64,
    /// Descriptors used so far: the next used descriptor goes to `used_abs`.
    pub(crate) used_abs: u64,
    /// `used_abs` at the last interrupt decision.
    signalled: u64,
}

/// The wrap counter at free-running position `abs` of a ring of `size`.
pub(crate) fn wrap_at(abs: u64, size: u16) -> bool {
    (abs / u64::from(size)).is_multiple_of(2)
}

/// Whether an event at `off_wrap` lies in the free-running window `[old, new)`: some position
/// there has offset and wrap counter of the event.
pub(crate) fn event_in_window(off_wrap: u16, old: u64, new: u64, size: u16) -> bool {
    let (off, wrap) = (off_wrap & 0x7fff, off_wrap & 0x8000 != 0);
    (old..new).any(|abs| abs % u64::from(size) == u64::from(off) && wrap_at(abs, size) == wrap)
}

impl DevPackedQueue {
    pub(crate) fn new(
        hal: TestHal,
        size: u16,
        (desc, driver, device): (PhysAddr, PhysAddr, PhysAddr),
        event_idx: bool,
    ) -> DevPackedQueue {
        assert_eq!(desc % 16, 0, "descriptor ring alignment");
        assert_eq!(
            (driver % 4, device % 4),
            (0, 0),
            "event structure alignment"
        );
        DevPackedQueue {
            hal,
            size,
            desc,
            driver,
            device,
            event_idx,
            avail_abs: 0,
            used_abs: 0,
            signalled: 0,
        }
    }

    fn at(&self, abs: u64) -> PhysAddr {
        self.desc + 16 * (abs % u64::from(self.size))
    }

    fn flags(&self, abs: u64) -> u16 {
        self.hal
            .atomic_u16(self.at(abs) + 14)
            .load(Ordering::Acquire)
    }

    /// Whether the descriptor at `abs` is available in its lap.
    fn is_avail(&self, abs: u64) -> bool {
        let flags = self.flags(abs);
        let wrap = wrap_at(abs, self.size);
        (flags & F_AVAIL != 0) == wrap && (flags & F_USED != 0) != wrap
    }

    /// Takes the next available chain, checking every descriptor's flags against its lap.
    pub(crate) fn pop(&mut self) -> Option<PackedChain> {
        if !self.is_avail(self.avail_abs) {
            return None;
        }
        fence(Ordering::Acquire);
        let pos = (self.avail_abs % u64::from(self.size)) as u16;
        let mut descs = Vec::new();
        loop {
            let abs = self.avail_abs;
            assert!(
                self.is_avail(abs),
                "descriptor {} of a chain not available in its lap (flags {:#x})",
                descs.len(),
                self.flags(abs)
            );
            let at = self.at(abs);
            let flags = self.flags(abs);
            descs.push(Desc {
                addr: self.hal.read_u64(at),
                len: self.hal.read_u32(at + 8),
                flags: flags & (F_NEXT | F_WRITE),
            });
            self.avail_abs += 1;
            assert!(
                descs.len() <= usize::from(self.size),
                "chain longer than the ring"
            );
            if flags & F_NEXT == 0 {
                let id = self.hal.read_u16(at + 12);
                return Some(PackedChain { id, descs, pos });
            }
        }
    }

    /// Chains available from the next position to read, without taking them.
    pub(crate) fn available_chains(&self) -> u16 {
        let (mut abs, mut chains) = (self.avail_abs, 0u16);
        while chains < self.size && self.is_avail(abs) {
            let start = abs;
            while self.flags(abs) & F_NEXT != 0 && abs - start < u64::from(self.size) {
                abs += 1;
            }
            abs += 1;
            chains += 1;
        }
        chains
    }

    /// Writes a used descriptor with any id and length at the next used position, marks it
    /// used (WRITE if `write`), and moves the used position `skip` descriptors on.
    pub(crate) fn push_used_raw(&mut self, id: u16, len: u32, write: bool, skip: u16) {
        let at = self.at(self.used_abs);
        self.hal.write(at + 8, &len.to_le_bytes());
        self.hal.write(at + 12, &id.to_le_bytes());
        let mut flags = if wrap_at(self.used_abs, self.size) {
            F_AVAIL | F_USED
        } else {
            0
        };
        if write {
            flags |= F_WRITE;
        }
        fence(Ordering::Release);
        self.hal.atomic_u16(at + 14).store(flags, Ordering::Release);
        self.used_abs += u64::from(skip);
    }

    /// Returns `chain` used with `len` bytes written.
    pub(crate) fn push_used(&mut self, chain: &PackedChain, len: u32) {
        let skip = chain.descs.len() as u16;
        self.push_used_raw(chain.id, len, len > 0, skip);
    }

    /// IN_ORDER: returns `chains` (in the order they were taken) with one used descriptor that
    /// carries the last one's id and `len`.
    pub(crate) fn push_used_batch(&mut self, chains: &[PackedChain], len: u32) {
        let last = chains.last().expect("a batch");
        let skip: usize = chains.iter().map(|c| c.descs.len()).sum();
        self.push_used_raw(last.id, len, len > 0, skip as u16);
    }

    /// Writes the device event suppression structure.
    pub(crate) fn set_event(&self, flags: u16, off_wrap: u16) {
        self.hal
            .atomic_u16(self.device)
            .store(off_wrap, Ordering::Relaxed);
        self.hal
            .atomic_u16(self.device + 2)
            .store(flags, Ordering::Release);
    }

    /// The `off_wrap` encoding of free-running position `abs`.
    pub(crate) fn off_wrap_of(&self, abs: u64) -> u16 {
        let off = (abs % u64::from(self.size)) as u16;
        off | if wrap_at(abs, self.size) { 0x8000 } else { 0 }
    }

    /// Asks for a kick at the next descriptor made available (DESC with EVENT_IDX, else
    /// ENABLE); true if one is already available (the device should go on instead of waiting).
    pub(crate) fn enable_notifications(&mut self) -> bool {
        if self.event_idx {
            self.set_event(EV_DESC, self.off_wrap_of(self.avail_abs));
        } else {
            self.set_event(EV_ENABLE, 0);
        }
        fence(Ordering::SeqCst);
        self.is_avail(self.avail_abs)
    }

    /// Asks for no kicks.
    pub(crate) fn disable_notifications(&mut self) {
        self.set_event(EV_DISABLE, 0);
    }

    /// The driver event suppression structure: (flags, off_wrap).
    pub(crate) fn driver_event(&self) -> (u16, u16) {
        let flags = self.hal.atomic_u16(self.driver + 2).load(Ordering::Acquire);
        let off_wrap = self.hal.atomic_u16(self.driver).load(Ordering::Acquire);
        (flags, off_wrap)
    }

    /// The device's interrupt decision after writing used descriptors.
    pub(crate) fn needs_interrupt(&mut self) -> bool {
        fence(Ordering::SeqCst);
        let (old, new) = (self.signalled, self.used_abs);
        self.signalled = new;
        if old == new {
            return false;
        }
        match self.driver_event() {
            (EV_DISABLE, _) => false,
            (EV_DESC, off_wrap) if self.event_idx => event_in_window(off_wrap, old, new, self.size),
            _ => true,
        }
    }
}
