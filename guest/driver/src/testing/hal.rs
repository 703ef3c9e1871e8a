//! [`TestHal`]: DMA memory from one zeroed, page-aligned arena; physical address = offset.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU16;
use std::sync::{Arc, Mutex, MutexGuard};
use std::vec::Vec;

use crate::hal::{Hal, PhysAddr, PAGE_SIZE};

struct Arena {
    base: NonNull<u8>,
    layout: Layout,
    state: Mutex<ArenaState>,
}

#[derive(Default)]
struct ArenaState {
    /// Bump pointer (page 0 stays unused, so no ring ever sits at address 0).
    next: usize,
    /// Live allocations: paddr → pages.
    live: BTreeMap<PhysAddr, usize>,
    /// Allocations still allowed (None: unlimited).
    budget: Option<usize>,
}

// SAFETY: the arena is plain memory; the driver and the test device access it only through raw
// pointers and atomics, following the virtio ownership protocol (and tests on one thread
// otherwise). The bookkeeping is behind a mutex.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `TestHal::new` with this layout; the last `Arc` is going away.
        unsafe { dealloc(self.base.as_ptr(), self.layout) };
    }
}

/// A HAL over a private arena. Cheap to clone (shared arena).
#[derive(Clone)]
pub(crate) struct TestHal {
    arena: Arc<Arena>,
}

impl TestHal {
    /// An arena of `size` bytes (a multiple of the page size).
    pub(crate) fn new(size: usize) -> TestHal {
        let layout = Layout::from_size_align(size, PAGE_SIZE).expect("layout");
        // SAFETY: `layout` has a non-zero size.
        let base = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("arena allocation");
        TestHal {
            arena: Arc::new(Arena {
                base,
                layout,
                state: Mutex::new(ArenaState {
                    next: PAGE_SIZE,
                    ..ArenaState::default()
                }),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, ArenaState> {
        self.arena.state.lock().expect("arena lock")
    }

    /// Allocations not freed yet.
    pub(crate) fn live_allocations(&self) -> usize {
        self.state().live.len()
    }

    /// Lets only `n` more allocations succeed.
    pub(crate) fn fail_after(&self, n: usize) {
        self.state().budget = Some(n);
    }

    /// A pointer to `len` bytes at `paddr`; panics outside the arena (test code).
    pub(crate) fn ptr(&self, paddr: PhysAddr, len: usize) -> *mut u8 {
        let start = usize::try_from(paddr).expect("paddr");
        assert!(
            start + len <= self.arena.layout.size(),
            "access {paddr:#x}+{len} outside the arena"
        );
        // SAFETY: inside the arena (asserted).
        unsafe { self.arena.base.as_ptr().add(start) }
    }

    pub(crate) fn read(&self, paddr: PhysAddr, len: usize) -> Vec<u8> {
        let mut out = std::vec![0u8; len];
        // SAFETY: `ptr` checked the range; `out` is a fresh vector.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(paddr, len), out.as_mut_ptr(), len) };
        out
    }

    pub(crate) fn write(&self, paddr: PhysAddr, data: &[u8]) {
        // SAFETY: `ptr` checked the range; `data` is a borrowed slice outside the arena.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr(paddr, data.len()), data.len())
        };
    }

    pub(crate) fn atomic_u16(&self, paddr: PhysAddr) -> &AtomicU16 {
        assert_eq!(paddr % 2, 0);
        // SAFETY: inside the arena, 2-aligned, lives as long as `self`; ring index fields are
        // only accessed atomically once a queue is live.
        unsafe { AtomicU16::from_ptr(self.ptr(paddr, 2).cast()) }
    }

    pub(crate) fn read_u16(&self, paddr: PhysAddr) -> u16 {
        u16::from_le_bytes(self.read(paddr, 2).try_into().expect("2 bytes"))
    }

    pub(crate) fn read_u32(&self, paddr: PhysAddr) -> u32 {
        u32::from_le_bytes(self.read(paddr, 4).try_into().expect("4 bytes"))
    }

    pub(crate) fn read_u64(&self, paddr: PhysAddr) -> u64 {
        u64::from_le_bytes(self.read(paddr, 8).try_into().expect("8 bytes"))
    }

    /// Allocates `pages` for the test itself (e.g. a umem), outside the driver.
    pub(crate) fn alloc_pages(&self, pages: usize) -> (PhysAddr, NonNull<u8>) {
        self.dma_alloc(pages).expect("arena exhausted")
    }
}

// SAFETY: regions come from the bump pointer, never overlap, are page aligned and inside the
// arena (zeroed at creation, never reused); translation is base + offset both ways.
unsafe impl Hal for TestHal {
    fn dma_alloc(&self, pages: usize) -> Option<(PhysAddr, NonNull<u8>)> {
        let mut state = self.state();
        if let Some(budget) = state.budget.as_mut() {
            if *budget == 0 {
                return None;
            }
            *budget -= 1;
        }
        let bytes = pages * PAGE_SIZE;
        if pages == 0 || state.next + bytes > self.arena.layout.size() {
            return None;
        }
        let paddr = state.next as PhysAddr;
        state.next += bytes;
        state.live.insert(paddr, pages);
        drop(state);
        Some((paddr, NonNull::new(self.ptr(paddr, bytes))?))
    }

    unsafe fn dma_dealloc(&self, paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) {
        assert_eq!(self.phys_to_virt(paddr), Some(vaddr));
        assert_eq!(self.state().live.remove(&paddr), Some(pages), "bad dealloc");
    }

    fn phys_to_virt(&self, paddr: PhysAddr) -> Option<NonNull<u8>> {
        (paddr < self.arena.layout.size() as u64).then(|| NonNull::new(self.ptr(paddr, 0)))?
    }

    fn virt_to_phys(&self, vaddr: NonNull<u8>) -> Option<PhysAddr> {
        let offset = (vaddr.as_ptr() as usize).checked_sub(self.arena.base.as_ptr() as usize)?;
        (offset < self.arena.layout.size()).then_some(offset as PhysAddr)
    }
}
