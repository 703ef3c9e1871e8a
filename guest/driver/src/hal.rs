//! The memory seam: DMA allocation and address translation ([`Hal`]), and the driver's owned
//! DMA regions.

use core::ptr::NonNull;

/// An address as the device sees it (a guest physical address).
pub type PhysAddr = u64;

/// The allocation granule of [`Hal::dma_alloc`].
pub const PAGE_SIZE: usize = 4096;

/// DMA memory and address translation for the driver.
///
/// Methods take `&self`: the HAL is a value the driver owns (a co-simulation HAL holds the base
/// of the shared guest-memory mapping and an allocator; a bare-metal HAL may be a unit struct).
///
/// # Safety
///
/// The driver hands the addresses this trait produces to the device and accesses the memory
/// through the pointers it returns, so its memory safety rests on these promises:
///
/// - [`dma_alloc`](Hal::dma_alloc) returns, for `pages` > 0, a region of `pages * PAGE_SIZE`
///   bytes that is aligned to [`PAGE_SIZE`], physically contiguous starting at the returned
///   [`PhysAddr`], readable and writable through the returned pointer, and not aliased by any
///   other allocation or Rust reference until it is passed to
///   [`dma_dealloc`](Hal::dma_dealloc). (The driver zeroes what it allocates; the HAL need not.)
/// - The device accesses DMA memory only as the virtio protocol allows: a buffer only while it
///   is made available to the device (between its publication in the avail ring and its return
///   in the used ring), the rings' device-written fields only as the device. The driver cannot
///   check this; against a device that may break it, the HAL must isolate the device (IOMMU,
///   bounce buffers) itself.
/// - [`virt_to_phys`](Hal::virt_to_phys) and [`phys_to_virt`](Hal::phys_to_virt), when they
///   return `Some`, are correct translations of DMA-able memory, and are consistent with each
///   other and with `dma_alloc`.
pub unsafe trait Hal {
    /// Allocates `pages` contiguous pages of DMA memory; `None` if that is not possible.
    /// Returns the address the device uses and the pointer the driver uses.
    fn dma_alloc(&self, pages: usize) -> Option<(PhysAddr, NonNull<u8>)>;

    /// Frees a region returned by [`dma_alloc`](Hal::dma_alloc).
    ///
    /// # Safety
    ///
    /// `paddr`, `vaddr` and `pages` are exactly those of one earlier `dma_alloc` of this HAL
    /// that has not been freed yet, and neither the driver nor the device uses the region any
    /// more (the driver resets the device before freeing ring and buffer memory).
    unsafe fn dma_dealloc(&self, paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize);

    /// The driver's pointer to the DMA-able memory at `paddr`, if it is mapped.
    fn phys_to_virt(&self, paddr: PhysAddr) -> Option<NonNull<u8>>;

    /// The device's address of the DMA-able memory at `vaddr`, if it is DMA-able (used for the
    /// caller-owned umem of [`crate::xsk`]).
    fn virt_to_phys(&self, vaddr: NonNull<u8>) -> Option<PhysAddr>;
}

/// A DMA region owned by the driver. No `Drop`: it must be returned to the HAL that allocated it
/// with [`DmaRegion::dealloc`] once the device is reset (the driver does it when dropped).
#[derive(Debug)]
pub(crate) struct DmaRegion {
    paddr: PhysAddr,
    vaddr: NonNull<u8>,
    pages: usize,
}

// SAFETY: the region is plain memory owned by one driver object; all accesses go through that
// object (`&mut` for writes), so moving it to another thread moves every access with it.
unsafe impl Send for DmaRegion {}

impl DmaRegion {
    /// Allocates at least `bytes` (at least one page) of zeroed DMA memory.
    pub(crate) fn alloc<H: Hal>(hal: &H, bytes: usize) -> Option<DmaRegion> {
        let pages = bytes.div_ceil(PAGE_SIZE).max(1);
        let (paddr, vaddr) = hal.dma_alloc(pages)?;
        // SAFETY: the Hal contract makes `vaddr` valid for writes of `pages * PAGE_SIZE` bytes
        // and unaliased; the device has not been given its address yet.
        unsafe { vaddr.as_ptr().write_bytes(0, pages * PAGE_SIZE) };
        Some(DmaRegion {
            paddr,
            vaddr,
            pages,
        })
    }

    /// Allocates one region per entry of `sizes`, or none at all.
    pub(crate) fn alloc_all<H: Hal, const N: usize>(
        hal: &H,
        sizes: [usize; N],
    ) -> Option<[DmaRegion; N]> {
        let mut regions = alloc::vec::Vec::with_capacity(N);
        for bytes in sizes {
            match DmaRegion::alloc(hal, bytes) {
                Some(region) => regions.push(region),
                None => {
                    for region in &regions {
                        // SAFETY: allocated just above from `hal`, never shown to the device.
                        unsafe { region.dealloc(hal) };
                    }
                    return None;
                }
            }
        }
        regions.try_into().ok()
    }

    /// Returns the region to `hal`.
    ///
    /// # Safety
    ///
    /// `hal` allocated it, this is the only call, and neither the driver nor the device
    /// accesses the region afterwards.
    pub(crate) unsafe fn dealloc<H: Hal>(&self, hal: &H) {
        // SAFETY: forwarded from this function's contract.
        unsafe { hal.dma_dealloc(self.paddr, self.vaddr, self.pages) };
    }

    /// The device address of the first byte.
    pub(crate) fn paddr(&self) -> PhysAddr {
        self.paddr
    }

    /// The size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.pages * PAGE_SIZE
    }

    /// A pointer to byte `offset`, if `offset + len` lies inside the region.
    pub(crate) fn ptr_at(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // SAFETY: `offset` ≤ the region's length, so the result stays inside (or one past) the
        // allocation.
        Some(unsafe { self.vaddr.as_ptr().add(offset) })
    }
}
