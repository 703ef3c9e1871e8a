//! Memory: one bump allocator over the RAM after the image, serving both the Rust heap
//! (`alloc`) and the driver's DMA pages ([`DmaHal`]). Nothing is ever freed: the program runs
//! one workload and powers off. Memory is identity-mapped, so a DMA address is its pointer.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use vnet_driver::{Hal, PhysAddr, PAGE_SIZE};

static NEXT: AtomicU64 = AtomicU64::new(0);
static END: AtomicU64 = AtomicU64::new(0);

/// Hands out `[start, end)` (page-aligned inward). Called once, before any allocation.
pub fn init(start: u64, end: u64) {
    let page = PAGE_SIZE as u64;
    NEXT.store(start.next_multiple_of(page), Ordering::Relaxed);
    END.store(end & !(page - 1), Ordering::Relaxed);
}

/// `size` bytes aligned to `align` (a power of two), or `None` when memory is exhausted.
fn bump(size: u64, align: u64) -> Option<u64> {
    let end = END.load(Ordering::Relaxed);
    let mut next = NEXT.load(Ordering::Relaxed);
    loop {
        let start = next.checked_next_multiple_of(align)?;
        let new = start.checked_add(size)?;
        if new > end {
            return None;
        }
        match NEXT.compare_exchange_weak(next, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(start),
            Err(current) => next = current,
        }
    }
}

/// `pages` zeroed pages (fresh guest memory is zero and nothing is reused).
pub fn alloc_pages(pages: usize) -> Option<u64> {
    let page = PAGE_SIZE as u64;
    bump((pages as u64).checked_mul(page)?, page)
}

/// Bytes not handed out yet.
pub fn remaining() -> u64 {
    END.load(Ordering::Relaxed)
        .saturating_sub(NEXT.load(Ordering::Relaxed))
}

struct Bump;

// SAFETY: `bump` returns disjoint, suitably aligned ranges of identity-mapped RAM that nothing
// else uses (the image ends before `init`'s start), and never the same range twice.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match bump(layout.size() as u64, layout.align() as u64) {
            Some(addr) => addr as *mut u8,
            None => core::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
}

#[global_allocator]
static ALLOCATOR: Bump = Bump;

/// The driver's DMA memory: pages from the bump allocator, physical address = pointer.
#[derive(Clone, Copy, Debug)]
pub struct DmaHal;

// SAFETY: `alloc_pages` returns page-aligned, contiguous, identity-mapped RAM never handed out
// before (so unaliased), readable and writable through the identity pointer, which is also the
// address the device uses (guest physical). The translations are the identity, limited to RAM
// below the allocator's end.
unsafe impl Hal for DmaHal {
    fn dma_alloc(&self, pages: usize) -> Option<(PhysAddr, NonNull<u8>)> {
        let addr = alloc_pages(pages)?;
        Some((addr, NonNull::new(addr as *mut u8)?))
    }

    unsafe fn dma_dealloc(&self, _paddr: PhysAddr, _vaddr: NonNull<u8>, _pages: usize) {}

    fn phys_to_virt(&self, paddr: PhysAddr) -> Option<NonNull<u8>> {
        if paddr >= END.load(Ordering::Relaxed) {
            return None;
        }
        NonNull::new(paddr as *mut u8)
    }

    fn virt_to_phys(&self, vaddr: NonNull<u8>) -> Option<PhysAddr> {
        let addr = vaddr.as_ptr() as u64;
        (addr < END.load(Ordering::Relaxed)).then_some(addr)
    }
}
