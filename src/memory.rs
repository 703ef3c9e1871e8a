//! Guest physical memory and the fixed layout of the low megabyte.

use vm_memory::{GuestAddress, GuestMemoryMmap};

/// The guest's memory type everywhere in the VMM.
pub type GuestMemory = GuestMemoryMmap<()>;

/// The GDT used to enter 64-bit mode.
pub const BOOT_GDT_START: u64 = 0x500;
/// An empty IDT (the kernel installs its own).
pub const BOOT_IDT_START: u64 = 0x520;
/// The Linux zero page (`struct boot_params`).
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Identity page tables: PML4, one PDPT, then four page directories mapping 4 GiB with 2 MiB pages.
pub const PML4_START: u64 = 0x9000;
/// The page-directory-pointer table.
pub const PDPTE_START: u64 = 0xa000;
/// The first of four page directories.
pub const PDE_START: u64 = 0xb000;
/// The kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Largest command line we write (the kernel's x86 COMMAND_LINE_SIZE).
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// Start of the extended BIOS data area; the MP table lives in its last KiB of base memory.
pub const EBDA_START: u64 = 0x9fc00;
/// The first byte above the legacy hole.
pub const HIMEM_START: u64 = 0x10_0000;
/// Device MMIO space: a 768 MiB hole below 4 GiB.
pub const MMIO_START: u64 = 0xd000_0000;
/// End of the 32-bit address space.
pub const FOUR_GIB: u64 = 0x1_0000_0000;

/// A RAM range of guest physical memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRange {
    /// First address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// The RAM ranges for `size` bytes of memory: below the MMIO hole, and the rest above 4 GiB.
pub fn ram_ranges(size: u64) -> Vec<RamRange> {
    if size <= MMIO_START {
        vec![RamRange {
            start: 0,
            len: size,
        }]
    } else {
        vec![
            RamRange {
                start: 0,
                len: MMIO_START,
            },
            RamRange {
                start: FOUR_GIB,
                len: size - MMIO_START,
            },
        ]
    }
}

/// Memory below 4 GiB (where the initrd and boot structures must go).
pub fn lowmem_end(size: u64) -> u64 {
    size.min(MMIO_START)
}

/// Anonymous, private, lazily-backed guest memory of `size` bytes.
pub fn create_guest_memory(size: u64) -> Result<GuestMemory, vm_memory::mmap::FromRangesError> {
    let ranges: Vec<(GuestAddress, usize)> = ram_ranges(size)
        .iter()
        .map(|r| (GuestAddress(r.start), r.len as usize))
        .collect();
    GuestMemoryMmap::from_ranges(&ranges)
}

/// Guest memory of `size` bytes that another process can map: one memfd (sealed against
/// growing and shrinking), each RAM range a shared mapping of its part of the file. Used when
/// a vhost-user device is configured; its backend maps the same file.
pub fn create_shared_guest_memory(size: u64) -> Result<GuestMemory, SharedMemoryError> {
    // SAFETY: memfd_create with a static name returns a new descriptor (checked) that we own.
    let fd = unsafe {
        libc::memfd_create(
            c"vmm-guest-ram".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(SharedMemoryError::Create(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.set_len(size).map_err(SharedMemoryError::Create)?;
    // SAFETY: F_ADD_SEALS on our own descriptor only adds seals.
    if unsafe {
        libc::fcntl(
            fd,
            libc::F_ADD_SEALS,
            libc::F_SEAL_GROW | libc::F_SEAL_SHRINK,
        )
    } < 0
    {
        return Err(SharedMemoryError::Create(std::io::Error::last_os_error()));
    }
    let mut offset = 0u64;
    let mut regions = Vec::new();
    for range in ram_ranges(size) {
        let file = file.try_clone().map_err(SharedMemoryError::Create)?;
        let mapping = vm_memory::mmap::MmapRegion::from_file(
            vm_memory::FileOffset::new(file, offset),
            range.len as usize,
        )
        .map_err(SharedMemoryError::Map)?;
        regions.push(
            vm_memory::GuestRegionMmap::new(mapping, GuestAddress(range.start))
                .ok_or(SharedMemoryError::Layout)?,
        );
        offset += range.len;
    }
    GuestMemoryMmap::from_regions(regions).map_err(|_| SharedMemoryError::Layout)
}

/// Why shared guest memory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SharedMemoryError {
    /// memfd_create, ftruncate, a seal or a duplicate failed.
    #[error("cannot create the guest memory file")]
    Create(#[source] std::io::Error),
    /// mmap failed.
    #[error("cannot map the guest memory file")]
    Map(#[source] vm_memory::mmap::MmapRegionError),
    /// The ranges do not make guest memory (a bug).
    #[error("the guest memory ranges overlap")]
    Layout,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_split_around_the_mmio_hole() {
        assert_eq!(
            ram_ranges(128 << 20),
            vec![RamRange {
                start: 0,
                len: 128 << 20
            }]
        );
        let big = 4u64 << 30;
        let r = ram_ranges(big);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].len + r[1].len, big);
        assert_eq!(r[1].start, FOUR_GIB);
        assert_eq!(lowmem_end(big), MMIO_START);
    }

    #[test]
    fn shared_memory_is_one_sealed_file_mapped_range_by_range() {
        use std::os::fd::AsRawFd;
        use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};
        let size = 64 << 20;
        let mem = create_shared_guest_memory(size).expect("shared memory");
        mem.write_obj(0x1234_5678u32, GuestAddress(0x1000))
            .expect("write");
        let region = mem.iter().next().expect("one region");
        let file = &region.file_offset().expect("file-backed").file();
        let mut word = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(*file, &mut word, 0x1000).expect("read");
        assert_eq!(
            u32::from_le_bytes(word),
            0x1234_5678,
            "the file holds guest memory"
        );
        // SAFETY: F_GET_SEALS reads the seals of a descriptor we hold.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        assert_ne!(seals & libc::F_SEAL_SHRINK, 0);
        assert_ne!(seals & libc::F_SEAL_GROW, 0);
        assert_eq!(mem.last_addr().0, size - 1);
    }

    #[test]
    fn fixed_structures_do_not_overlap() {
        let mut spans = [
            (BOOT_GDT_START, 4 * 8),
            (BOOT_IDT_START, 8),
            (ZERO_PAGE_START, 0x1000),
            (BOOT_STACK_POINTER - 0x100, 0x100),
            (PML4_START, 0x1000),
            (PDPTE_START, 0x1000),
            (PDE_START, 4 * 0x1000),
            (CMDLINE_START, CMDLINE_MAX_SIZE as u64),
            (EBDA_START, 0x400),
        ];
        spans.sort();
        for w in spans.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "{:x?} overlaps {:x?}",
                w[0],
                w[1]
            );
        }
        const { assert!(EBDA_START + 0x400 <= HIMEM_START) };
    }
}
