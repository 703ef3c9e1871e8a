//! The driver's DMA memory in co-simulation: a bump allocator over a window of the guest
//! memory the device model also uses, so every address the driver hands the device is a real
//! guest physical address and every buffer is shared memory, as in a VM.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vnet_driver::{Hal, PhysAddr};

const PAGE: u64 = 4096;

/// Hands out pages of one guest memory region, never reusing them (a co-simulation rig lives for
/// one trial). Guest address 0 is never handed out (virtio treats a ring at 0 as unset).
pub struct GuestMemHal {
    mem: GuestMemoryMmap<()>,
    /// Host address of guest physical 0 of the (single) region.
    host_base: usize,
    region_len: u64,
    next: AtomicU64,
}

impl GuestMemHal {
    /// Allocates from `[start, end)` of `mem`, whose first region must start at guest address 0
    /// and cover `end`.
    pub fn new(mem: GuestMemoryMmap<()>, start: u64, end: u64) -> Option<GuestMemHal> {
        let region = mem.find_region(GuestAddress(0))?;
        let region_len = region.len().min(end);
        let host_base = mem.get_host_address(GuestAddress(0)).ok()? as usize;
        Some(GuestMemHal {
            mem,
            host_base,
            region_len,
            next: AtomicU64::new(start.max(PAGE).next_multiple_of(PAGE)),
        })
    }

    /// Bytes still available.
    pub fn remaining(&self) -> u64 {
        self.region_len
            .saturating_sub(self.next.load(Ordering::Relaxed))
    }

    /// The guest memory (shared with the device).
    pub fn memory(&self) -> &GuestMemoryMmap<()> {
        &self.mem
    }
}

// SAFETY: allocations are page aligned (the cursor starts page aligned and moves in whole pages),
// contiguous in the single region that starts at guest physical 0 (so the host pointer is
// `host_base + paddr`, mapped for the life of `mem`, which this HAL holds), never handed out
// twice (the cursor only grows, atomically), and both translations are the same affine map
// bounded by the region.
unsafe impl Hal for GuestMemHal {
    fn dma_alloc(&self, pages: usize) -> Option<(PhysAddr, NonNull<u8>)> {
        let bytes = (pages as u64).checked_mul(PAGE)?;
        let paddr = self.next.fetch_add(bytes, Ordering::Relaxed);
        if paddr.checked_add(bytes)? > self.region_len {
            return None;
        }
        let vaddr = self.phys_to_virt(paddr)?;
        Some((paddr, vaddr))
    }

    unsafe fn dma_dealloc(&self, _paddr: PhysAddr, _vaddr: NonNull<u8>, _pages: usize) {
        // Bump allocator: memory comes back when the rig (and its guest memory) is dropped.
    }

    fn phys_to_virt(&self, paddr: PhysAddr) -> Option<NonNull<u8>> {
        if paddr >= self.region_len {
            return None;
        }
        NonNull::new((self.host_base + paddr as usize) as *mut u8)
    }

    fn virt_to_phys(&self, vaddr: NonNull<u8>) -> Option<PhysAddr> {
        let offset = (vaddr.as_ptr() as usize).checked_sub(self.host_base)? as u64;
        (offset < self.region_len).then_some(offset)
    }
}
