//! What both rings (the split [`super::vring`] and the packed [`super::packed`]) share below
//! the datapath: guest-physical → host translation over the regions a queue keeps alive
//! ([`GuestView`]), the bounds on the work a chain and a call may cost ([`WalkBudget`],
//! [`MAX_CHAIN_DESCRIPTORS`], [`CALL_DESCRIPTOR_BUDGET`]), and the interrupt decision's
//! vocabulary ([`InterruptDecision`], [`vring_need_event`]).

use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

use super::chain::{ChainError, Direction};
use crate::iovec::{IovecError, IovecList, MAX_IOVECS};

/// Reads a `T` at any alignment with volatile loads (indirect descriptor tables need not be
/// aligned): one load when `p` is aligned, byte by byte otherwise.
///
/// # Safety
/// `p..p + size_of::<T>()` must be inside mapped guest memory, and every bit pattern must be a
/// valid `T` (a `#[repr(C)]` descriptor of plain integers).
#[inline]
pub(crate) unsafe fn read_unaligned_volatile<T: Copy>(p: *const u8) -> T {
    if (p as usize).is_multiple_of(std::mem::align_of::<T>()) {
        // SAFETY: aligned, and in bounds per the caller's contract.
        return unsafe { std::ptr::read_volatile(p.cast::<T>()) };
    }
    let mut value = std::mem::MaybeUninit::<T>::uninit();
    let dst = value.as_mut_ptr().cast::<u8>();
    for i in 0..std::mem::size_of::<T>() {
        // SAFETY: `i < size_of::<T>()`: in bounds of the caller's range and of `value`.
        unsafe { dst.add(i).write(std::ptr::read_volatile(p.add(i))) };
    }
    // SAFETY: every byte was written, and any bit pattern is a valid `T` (caller's contract).
    unsafe { value.assume_init() }
}

/// Most descriptors one chain may link, direct and indirect together, empty ones included.
/// A frame needs at most [`MAX_IOVECS`] non-empty segments; Linux uses at most
/// `MAX_SKB_FRAGS + 2` (19).
pub const MAX_CHAIN_DESCRIPTORS: u32 = MAX_IOVECS as u32 + 1;
/// Descriptors one datapath call may visit before it yields (plus the chain in progress).
pub const CALL_DESCRIPTOR_BUDGET: u32 = 4096;

/// One guest memory region's host mapping.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostRegion {
    start: u64,
    len: u64,
    host: *mut u8,
}

/// Guest-physical → host translation for buffers, over the regions of one `GuestMemoryMmap`.
///
/// Built from memory that the owning queue ([`super::vring::Virtqueue`] or
/// [`super::packed::PackedVirtqueue`]) keeps alive.
#[derive(Debug)]
pub(crate) struct GuestView<'m> {
    mem: &'m GuestMemoryMmap,
    regions: &'m [HostRegion],
}

impl<'m> GuestView<'m> {
    /// The view of `mem` through `regions` (made by [`host_regions`] from the same memory).
    #[inline]
    pub(crate) fn new(mem: &'m GuestMemoryMmap, regions: &'m [HostRegion]) -> GuestView<'m> {
        GuestView { mem, regions }
    }

    /// The host address of `[addr, addr + len)` if it lies inside one region.
    #[inline]
    pub(crate) fn host_range(&self, addr: u64, len: u64) -> Option<*mut u8> {
        for r in self.regions {
            let off = addr.wrapping_sub(r.start);
            if off < r.len {
                if len <= r.len - off {
                    // SAFETY: `off < r.len`, so the result stays inside the region's mapping.
                    return Some(unsafe { r.host.add(off as usize) });
                }
                return None;
            }
        }
        None
    }

    /// Appends the guest range `[addr, addr + len)` to `iovs`: one entry when it lies in one
    /// region (the fast path), else split by vm-memory where it crosses regions.
    #[inline]
    pub(crate) fn push_range(
        &self,
        iovs: &mut IovecList<'m>,
        addr: u64,
        len: u32,
    ) -> Result<(), IovecError> {
        if len == 0 {
            return Ok(());
        }
        match self.host_range(addr, u64::from(len)) {
            // SAFETY: the range lies inside one region of `self.mem`, which is borrowed for
            // 'm, so it stays mapped and valid for reads and writes while the list lives.
            Some(host) => unsafe { iovs.push_raw(host, len as usize) },
            None => iovs.push_guest_range(self.mem, GuestAddress(addr), len),
        }
    }
}

/// A descriptor's buffer as both rings lay it out (guest address, length, flags), in native
/// byte order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Buffer {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) flags: u16,
}

/// What every buffer of a chain walked in one direction (the datapath's walks) must meet: its
/// WRITE flag, and the most bytes the chain may hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Directed {
    write_flag: u16,
    limit: u32,
}

impl Directed {
    /// Buffers the device accesses as `direction` says, `limit` bytes in all at most.
    #[inline(always)]
    pub(crate) fn new(direction: Direction, limit: u32) -> Directed {
        let write_flag = match direction {
            Direction::DeviceWrites => VRING_DESC_F_WRITE as u16,
            Direction::DeviceReads => 0,
        };
        Directed { write_flag, limit }
    }

    /// Appends `buf` to `iovs` after the `total` bytes of the chain before it and returns the
    /// new total: refused when its direction is the wrong one, when the chain would pass the
    /// limit, or when the buffer is not inside guest memory.
    #[inline(always)]
    pub(crate) fn push<'g>(
        self,
        guest: &GuestView<'g>,
        buf: Buffer,
        total: u32,
        iovs: &mut IovecList<'g>,
    ) -> Result<u32, ChainError> {
        if buf.flags & VRING_DESC_F_WRITE as u16 != self.write_flag {
            return Err(ChainError::WrongDirection { addr: buf.addr });
        }
        let total = add_len(total, buf.len, self.limit)?;
        guest.push_range(iovs, buf.addr, buf.len)?;
        Ok(total)
    }

    /// A chain of one direct buffer: charged as one descriptor to `budget`, appended to
    /// `iovs` as [`Directed::push`] does, `iovs` left as it was on error.
    #[inline(always)]
    pub(crate) fn push_lone<'g>(
        self,
        guest: &GuestView<'g>,
        buf: Buffer,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        budget.charge(1);
        let start = iovs.len();
        let pushed = self.push(guest, buf, 0, iovs);
        if pushed.is_err() {
            iovs.truncate(start);
        }
        pushed
    }
}

/// A control-style chain being walked (off the datapath): device-readable buffers first,
/// appended to one list, then device-writable ones, appended to the other; a readable buffer
/// after a writable one is refused, as are parts of more than `limit` bytes and buffers
/// outside guest memory.
pub(crate) struct ControlWalk<'a, 'g> {
    guest: &'a GuestView<'g>,
    limit: u32,
    readable: &'a mut IovecList<'g>,
    writable: &'a mut IovecList<'g>,
    /// The lists' lengths before the walk (what an error truncates them back to).
    starts: (usize, usize),
    totals: (u32, u32),
    seen_writable: bool,
}

impl<'a, 'g> ControlWalk<'a, 'g> {
    /// A walk appending to `readable` and `writable`, each part at most `limit` bytes.
    pub(crate) fn new(
        guest: &'a GuestView<'g>,
        limit: u32,
        readable: &'a mut IovecList<'g>,
        writable: &'a mut IovecList<'g>,
    ) -> ControlWalk<'a, 'g> {
        let starts = (readable.len(), writable.len());
        ControlWalk {
            guest,
            limit,
            readable,
            writable,
            starts,
            totals: (0, 0),
            seen_writable: false,
        }
    }

    /// Appends the chain's next buffer to its part.
    pub(crate) fn push(&mut self, buf: Buffer) -> Result<(), ChainError> {
        let (list, total) = if buf.flags & VRING_DESC_F_WRITE as u16 != 0 {
            self.seen_writable = true;
            (&mut *self.writable, &mut self.totals.1)
        } else if self.seen_writable {
            return Err(ChainError::WrongDirection { addr: buf.addr });
        } else {
            (&mut *self.readable, &mut self.totals.0)
        };
        *total = add_len(*total, buf.len, self.limit)?;
        self.guest.push_range(list, buf.addr, buf.len)?;
        Ok(())
    }

    /// The walk's outcome once the chain's traversal ended with `traversed`: the (readable,
    /// writable) byte counts, or the error with both lists as they were before the walk.
    pub(crate) fn finish(
        self,
        traversed: Result<(), ChainError>,
    ) -> Result<(u32, u32), ChainError> {
        match traversed {
            Ok(()) => Ok(self.totals),
            Err(e) => {
                self.readable.truncate(self.starts.0);
                self.writable.truncate(self.starts.1);
                Err(e)
            }
        }
    }
}

/// Adds a buffer's length to a chain's (or a chain part's) total, refusing more than `limit`.
#[inline(always)]
fn add_len(total: u32, len: u32, limit: u32) -> Result<u32, ChainError> {
    total
        .checked_add(len)
        .filter(|t| *t <= limit)
        .ok_or(ChainError::TooLong { limit })
}

/// The host mapping of every region of `mem`, for a [`GuestView`] of it.
pub(crate) fn host_regions(mem: &GuestMemoryMmap) -> Result<Vec<HostRegion>, GuestMemoryError> {
    let mut regions = Vec::new();
    for region in mem.iter() {
        let host = region.get_host_address(MemoryRegionAddress(0))?;
        regions.push(HostRegion {
            start: region.start_addr().0,
            len: region.len(),
            host,
        });
    }
    Ok(regions)
}

/// What the datapath may still visit in one call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WalkBudget {
    descriptors: u32,
}

impl WalkBudget {
    /// A fresh per-call budget of [`CALL_DESCRIPTOR_BUDGET`] descriptors.
    pub(crate) fn per_call() -> WalkBudget {
        WalkBudget {
            descriptors: CALL_DESCRIPTOR_BUDGET,
        }
    }

    /// True once the call has visited its share.
    pub(crate) fn exhausted(&self) -> bool {
        self.descriptors == 0
    }

    /// Descriptors the call may still visit.
    pub(crate) fn remaining(&self) -> u32 {
        self.descriptors
    }

    /// Charges `n` units of ring work (a pop that found nothing, a notification re-check).
    pub(crate) fn charge(&mut self, n: u32) {
        self.descriptors = self.descriptors.saturating_sub(n);
    }
}

/// Whether to interrupt the driver after adding used entries, and if not, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterruptDecision {
    /// Interrupt the driver.
    Raise,
    /// EVENT_IDX: `used_event` says the driver does not want one yet.
    SuppressedByEventIdx,
    /// No EVENT_IDX: the driver set `VRING_AVAIL_F_NO_INTERRUPT`.
    SuppressedByFlag,
}

/// The spec's `vring_need_event`: should the device notify, given the other side's event index
/// and that the index moved from `old` to `new`? Wrap-around safe.
pub fn vring_need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}
