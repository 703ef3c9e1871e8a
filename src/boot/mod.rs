//! x86_64 direct boot: load the kernel (ELF vmlinux or bzImage) and the initrd, then write the
//! zero page, command line, MP table, GDT and identity page tables. No BIOS, no real mode: the
//! vCPU starts in 64-bit mode at the kernel's 64-bit entry point.
//!
//! Everything here works on guest memory only, so it is unit-tested without KVM.

pub mod layout;
pub mod mptable;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::{self, BzImage, Elf, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend as _};

use crate::memory::{
    self, GuestMemory, CMDLINE_MAX_SIZE, CMDLINE_START, EBDA_START, HIMEM_START, ZERO_PAGE_START,
};

const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448; // "HdrS"
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x100_0000;
/// `xloadflags`: the kernel has a 64-bit entry point 0x200 bytes into the protected-mode code.
const XLF_KERNEL_64: u16 = 1;
/// `loadflags`: the protected-mode code is loaded at 0x100000.
const LOADED_HIGH: u8 = 1;
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
const PAGE_SIZE: u64 = 0x1000;

/// Why the guest could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("cannot open kernel image {path:?}")]
    OpenKernel {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path:?} is not a kernel: neither an ELF vmlinux nor a bzImage")]
    NotAKernel { path: PathBuf },
    #[error("bzImage {path:?} has no 64-bit entry point (xloadflags lacks XLF_KERNEL_64)")]
    No64BitEntry { path: PathBuf },
    #[error("cannot load kernel image {path:?}")]
    LoadKernel {
        path: PathBuf,
        #[source]
        source: loader::Error,
    },
    #[error("cannot open initrd {path:?}")]
    OpenInitrd {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("initrd {path:?} ({size} bytes) does not fit in guest memory below {limit:#x} above the kernel (ends at {kernel_end:#x})")]
    InitrdTooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
        kernel_end: u64,
    },
    #[error("cannot read initrd {path:?} into guest memory")]
    ReadInitrd {
        path: PathBuf,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("invalid kernel command line")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    #[error("cannot write the kernel command line")]
    WriteCmdline(#[source] loader::Error),
    #[error("cannot write the zero page")]
    ZeroPage(#[source] linux_loader::configurator::Error),
    #[error("cannot write the MP table")]
    MpTable(#[source] mptable::MpTableError),
    #[error("cannot write the boot GDT and page tables")]
    Layout(#[source] vm_memory::GuestMemoryError),
}

/// Where the kernel went and how to enter it.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    /// The guest physical address of the 64-bit entry point.
    pub entry: u64,
    /// First byte after the kernel image (the initrd must not overlap it).
    pub end: u64,
    /// The bzImage's setup header, copied into the zero page; `None` for an ELF vmlinux.
    pub setup_header: Option<setup_header>,
}

/// Where the initrd went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitrdPlacement {
    /// Guest physical address, page aligned.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
}

/// The format of a kernel image, told by its magic numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    /// An uncompressed ELF `vmlinux`.
    Elf,
    /// A bzImage (x86 boot protocol).
    BzImage,
}

/// Tells an ELF vmlinux from a bzImage by their magic numbers.
pub fn detect_format<R: Read + Seek>(image: &mut R) -> std::io::Result<Option<KernelFormat>> {
    let mut head = [0u8; 4];
    image.seek(SeekFrom::Start(0))?;
    if image.read_exact(&mut head).is_err() {
        return Ok(None);
    }
    if head == *b"\x7fELF" {
        return Ok(Some(KernelFormat::Elf));
    }
    let mut magic = [0u8; 4];
    if image.seek(SeekFrom::Start(0x202)).is_ok()
        && image.read_exact(&mut magic).is_ok()
        && u32::from_le_bytes(magic) == KERNEL_HDR_MAGIC
    {
        return Ok(Some(KernelFormat::BzImage));
    }
    Ok(None)
}

/// Loads the kernel at `path` into guest memory.
pub fn load_kernel(mem: &GuestMemory, path: &Path) -> Result<LoadedKernel, BootError> {
    let open_err = |source| BootError::OpenKernel {
        path: path.to_owned(),
        source,
    };
    let mut file = crate::files::open_regular(path).map_err(open_err)?;
    let format = detect_format(&mut file).map_err(open_err)?;
    let load_err = |source| BootError::LoadKernel {
        path: path.to_owned(),
        source,
    };
    match format {
        Some(KernelFormat::Elf) => {
            if let Some(kernel) = map_elf(mem, &file) {
                return Ok(kernel);
            }
            let r = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            Ok(LoadedKernel {
                entry: r.kernel_load.raw_value(),
                end: r.kernel_end,
                setup_header: None,
            })
        }
        Some(KernelFormat::BzImage) => {
            let r = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            let hdr = r.setup_header.ok_or_else(|| BootError::NotAKernel {
                path: path.to_owned(),
            })?;
            if hdr.xloadflags & XLF_KERNEL_64 == 0 {
                return Err(BootError::No64BitEntry {
                    path: path.to_owned(),
                });
            }
            // The decompressor needs `init_size` bytes from the load address.
            let end = r
                .kernel_end
                .max(r.kernel_load.raw_value() + u64::from(hdr.init_size));
            Ok(LoadedKernel {
                entry: r.kernel_load.raw_value() + BZIMAGE_64BIT_ENTRY_OFFSET,
                end,
                setup_header: Some(hdr),
            })
        }
        None => Err(BootError::NotAKernel {
            path: path.to_owned(),
        }),
    }
}

/// The highest page-aligned address at which an initrd of `size` bytes ends below `limit` and
/// starts above `kernel_end`.
pub fn initrd_address(size: u64, limit: u64, kernel_end: u64) -> Option<u64> {
    let start = limit.checked_sub(size)? & !(PAGE_SIZE - 1);
    (start >= kernel_end).then_some(start)
}

/// Loads the initrd as high as the kernel accepts, page aligned, above the kernel.
pub fn load_initrd(
    mem: &GuestMemory,
    path: &Path,
    kernel: &LoadedKernel,
) -> Result<InitrdPlacement, BootError> {
    let mut file = crate::files::open_regular(path).map_err(|source| BootError::OpenInitrd {
        path: path.to_owned(),
        source,
    })?;
    let size = file
        .metadata()
        .map_err(|source| BootError::OpenInitrd {
            path: path.to_owned(),
            source,
        })?
        .len();
    // The boot protocol's `initrd_addr_max` is the highest address the initrd may *end* at
    // (inclusive); without a header (ELF) the kernel accepts anything below 4 GiB.
    let addr_max = kernel
        .setup_header
        .map(|h| u64::from(h.initrd_addr_max) + 1)
        .filter(|&m| m > 1)
        .unwrap_or(memory::FOUR_GIB);
    let limit = addr_max.min(memory::lowmem_end(mem.last_addr().raw_value() + 1));
    let too_large = || BootError::InitrdTooLarge {
        path: path.to_owned(),
        size,
        limit,
        kernel_end: kernel.end,
    };
    let addr = initrd_address(size, limit, kernel.end).ok_or_else(too_large)?;
    // Copied, not mapped like the kernel's text: the guest frees these pages after unpacking
    // and reuses them, network buffers included, and a copy-on-write fault at the device's
    // first write into each slowed the TCP test's receive path enough to lose host GSO.
    mem.read_exact_volatile_from(GuestAddress(addr), &mut file, size as usize)
        .map_err(|source| BootError::ReadInitrd {
            path: path.to_owned(),
            source,
        })?;
    Ok(InitrdPlacement { addr, size })
}

/// Puts `len` bytes of `file` from `offset` into guest memory at `addr` as a private
/// (copy-on-write) mapping of the file instead of copying them, and zeroes the rest of the last
/// page. Copying the 6.7 MB text segment of a vmlinux into fresh anonymous memory took ~5 ms of
/// page faults and copies, most of the VMM's start-up; mapping takes microseconds, and the
/// guest then reads the page cache's pages.
///
/// Returns false, with guest memory as it was, when the range is not page aligned or not inside
/// one memory region, or the mapping fails: the caller then copies.
fn map_file(mem: &GuestMemory, addr: u64, file: &File, offset: u64, len: u64) -> bool {
    if !addr.is_multiple_of(PAGE_SIZE) || !offset.is_multiple_of(PAGE_SIZE) || len == 0 {
        return false;
    }
    let Some(map_len) = len.checked_next_multiple_of(PAGE_SIZE) else {
        return false;
    };
    let Ok(slice) = mem.get_slice(GuestAddress(addr), map_len as usize) else {
        return false;
    };
    let Ok(file_offset) = libc::off_t::try_from(offset) else {
        return false;
    };
    let host = slice.ptr_guard_mut().as_ptr().cast::<libc::c_void>();
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: [host, host + map_len) lies inside one region of `mem`, a private anonymous
    // mapping that `mem` owns (and unmaps whole when dropped). MAP_FIXED replaces exactly those
    // pages with a private mapping of the file, readable and writable like the rest; the file's
    // pages past `offset + len` up to `map_len` exist because `len` bytes were read from it.
    // Nothing runs in the guest yet, and KVM follows the new mapping through its MMU notifier.
    let mapped = unsafe {
        libc::mmap(
            host,
            map_len as usize,
            prot,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            file.as_raw_fd(),
            file_offset,
        )
    };
    if mapped == libc::MAP_FAILED {
        // A failed MAP_FIXED may have unmapped the range: put fresh anonymous memory back.
        // SAFETY: as above, the range is part of `mem`'s own mapping.
        let restored = unsafe {
            libc::mmap(
                host,
                map_len as usize,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(restored, libc::MAP_FAILED, "cannot restore guest memory");
        return false;
    }
    let tail = (map_len - len) as usize;
    if tail > 0 {
        let zeros = [0u8; PAGE_SIZE as usize];
        if mem
            .write_slice(&zeros[..tail], GuestAddress(addr + len))
            .is_err()
        {
            return false;
        }
    }
    true
}

/// Loads an ELF vmlinux, its read-only `PT_LOAD` segments (text, rodata) mapped ([`map_file`])
/// and the writable ones copied (the guest writes them, and frees parts to its allocator: see
/// [`load_initrd`] for why those stay anonymous memory), with the result
/// linux-loader's `Elf::load` gives (entry `e_entry`, end the highest `p_paddr + p_memsz`).
/// `None` when the image is not a little-endian x86-64 ELF whose segments are page aligned in
/// the file and in memory and fit in it, or a mapping fails: linux-loader then loads it (and
/// reports what is wrong).
fn map_elf(mem: &GuestMemory, file: &File) -> Option<LoadedKernel> {
    const PT_LOAD: u32 = 1;
    const PF_W: u32 = 2;
    const EM_X86_64: u16 = 62;
    const PHDR_SIZE: usize = 56;
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());

    let mut ehdr = [0u8; 64];
    file.read_exact_at(&mut ehdr, 0).ok()?;
    if &ehdr[..4] != b"\x7fELF" || ehdr[4] != 2 || ehdr[5] != 1 || u16_at(&ehdr, 18) != EM_X86_64 {
        return None;
    }
    let (entry, phoff) = (u64_at(&ehdr, 24), u64_at(&ehdr, 32));
    let (phentsize, phnum) = (
        usize::from(u16_at(&ehdr, 54)),
        usize::from(u16_at(&ehdr, 56)),
    );
    if entry < HIMEM_START || phentsize != PHDR_SIZE || phnum == 0 || phnum > 64 {
        return None;
    }
    let mut phdrs = vec![0u8; PHDR_SIZE * phnum];
    file.read_exact_at(&mut phdrs, phoff).ok()?;
    let file_len = file.metadata().ok()?.len();
    let mut segments = Vec::new();
    let mut end = 0;
    for ph in phdrs.chunks_exact(PHDR_SIZE) {
        let (offset, paddr) = (u64_at(ph, 8), u64_at(ph, 24));
        let (filesz, memsz) = (u64_at(ph, 32), u64_at(ph, 40));
        if u32_at(ph, 0) != PT_LOAD || filesz == 0 {
            continue;
        }
        if !offset.is_multiple_of(PAGE_SIZE)
            || !paddr.is_multiple_of(PAGE_SIZE)
            || filesz > memsz
            || offset.checked_add(filesz)? > file_len
            || mem
                .get_slice(GuestAddress(paddr), usize::try_from(memsz).ok()?)
                .is_err()
        {
            return None;
        }
        let writable = u32_at(ph, 4) & PF_W != 0;
        segments.push((paddr, offset, filesz, writable));
        end = end.max(paddr.checked_add(memsz)?);
    }
    if segments.is_empty() {
        return None;
    }
    for (paddr, offset, filesz, writable) in segments {
        // If a later segment fails, linux-loader copies the whole image over these.
        if writable {
            let mut f = file.try_clone().ok()?;
            f.seek(SeekFrom::Start(offset)).ok()?;
            mem.read_exact_volatile_from(GuestAddress(paddr), &mut f, filesz as usize)
                .ok()?;
        } else if !map_file(mem, paddr, file, offset, filesz) {
            return None;
        }
    }
    Some(LoadedKernel {
        entry,
        end,
        setup_header: None,
    })
}

/// The e820 map: base memory up to the EBDA, the EBDA reserved (it holds the MP table), then RAM
/// from 1 MiB to the MMIO hole and above 4 GiB.
pub fn e820_map(mem_size: u64) -> Vec<boot_e820_entry> {
    let mut map = vec![
        boot_e820_entry {
            addr: 0,
            size: EBDA_START,
            r#type: E820_RAM,
        },
        boot_e820_entry {
            addr: EBDA_START,
            size: 0x400,
            r#type: E820_RESERVED,
        },
    ];
    for r in memory::ram_ranges(mem_size) {
        let start = r.start.max(HIMEM_START);
        let end = r.start + r.len;
        if end > start {
            map.push(boot_e820_entry {
                addr: start,
                size: end - start,
                r#type: E820_RAM,
            });
        }
    }
    map
}

/// Builds the zero page for `kernel`.
pub fn build_boot_params(
    kernel: &LoadedKernel,
    cmdline_len: usize,
    initrd: Option<InitrdPlacement>,
    mem_size: u64,
) -> boot_params {
    let mut params = boot_params::default();
    if let Some(hdr) = kernel.setup_header {
        params.hdr = hdr;
    } else {
        params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
        params.hdr.header = KERNEL_HDR_MAGIC;
        params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES;
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.loadflags |= LOADED_HIGH;
    params.hdr.cmd_line_ptr = CMDLINE_START as u32;
    params.hdr.cmdline_size = cmdline_len as u32;
    if let Some(initrd) = initrd {
        params.hdr.ramdisk_image = initrd.addr as u32;
        params.hdr.ramdisk_size = initrd.size as u32;
    }
    let map = e820_map(mem_size);
    params.e820_entries = map.len() as u8;
    for (slot, entry) in params.e820_table.iter_mut().zip(map) {
        *slot = entry;
    }
    params
}

/// Writes everything the kernel reads at entry: command line, zero page, MP table, GDT and page
/// tables.
pub fn configure_system(
    mem: &GuestMemory,
    kernel: &LoadedKernel,
    cmdline: &Cmdline,
    initrd: Option<InitrdPlacement>,
    mem_size: u64,
    vcpus: u8,
) -> Result<(), BootError> {
    loader::load_cmdline(mem, GuestAddress(CMDLINE_START), cmdline)
        .map_err(BootError::WriteCmdline)?;
    let cmdline_len = cmdline
        .as_cstring()
        .map_err(BootError::Cmdline)?
        .as_bytes_with_nul()
        .len();
    let params = build_boot_params(kernel, cmdline_len, initrd, mem_size);
    LinuxBootConfigurator::write_bootparams::<GuestMemory>(
        &BootParams::new::<boot_params>(&params, GuestAddress(ZERO_PAGE_START)),
        mem,
    )
    .map_err(BootError::ZeroPage)?;
    mptable::setup_mptable(mem, vcpus).map_err(BootError::MpTable)?;
    layout::write_gdt_and_page_tables(mem).map_err(BootError::Layout)?;
    Ok(())
}

/// A command line with room for the kernel's maximum.
pub fn new_cmdline(base: &str) -> Result<Cmdline, BootError> {
    Cmdline::try_from(base, CMDLINE_MAX_SIZE).map_err(BootError::Cmdline)
}

/// Each virtio-mmio device's register window.
pub const MMIO_DEVICE_SIZE: u64 = 0x1000;
/// Virtio devices take IOAPIC pins from [`FIRST_VIRTIO_GSI`] to 23.
pub const MAX_VIRTIO_DEVICES: usize = 19;
/// The first GSI given to virtio devices (0–4 are the timer, keyboard, cascade and COM ports).
pub const FIRST_VIRTIO_GSI: u32 = 5;

/// The MMIO base and GSI of the virtio device at `index`.
pub fn virtio_slot(index: usize) -> (u64, u32) {
    (
        memory::MMIO_START + index as u64 * MMIO_DEVICE_SIZE,
        FIRST_VIRTIO_GSI + index as u32,
    )
}

/// What the VMM appends to the user's command line.
#[derive(Clone, Copy, Debug, Default)]
pub struct CmdlineAdditions<'a> {
    /// (MMIO base, GSI) of each virtio device.
    pub devices: &'a [(u64, u32)],
    /// `tsc_early_khz=`, when the user did not give it.
    pub tsc_khz: Option<u32>,
    /// Options the host needs (see [`crate::host::HostQuirks::extra_cmdline`]).
    pub extra: Option<&'a str>,
}

/// The guest's command line: the user's `base` and the VMM's `additions`.
pub fn vm_cmdline(base: &str, additions: &CmdlineAdditions) -> Result<Cmdline, BootError> {
    let mut cmdline = new_cmdline(base)?;
    for &(base, gsi) in additions.devices {
        cmdline
            .add_virtio_mmio_device(MMIO_DEVICE_SIZE, GuestAddress(base), gsi, None)
            .map_err(BootError::Cmdline)?;
    }
    if let Some(khz) = additions.tsc_khz {
        cmdline
            .insert("tsc_early_khz", &khz.to_string())
            .map_err(BootError::Cmdline)?;
    }
    if let Some(extra) = additions.extra {
        cmdline.insert_str(extra).map_err(BootError::Cmdline)?;
    }
    Ok(cmdline)
}

/// The longest command line a user may give: what is left of the kernel's maximum once the
/// VMM appended the most it ever does (every virtio device, the TSC frequency, the PVM
/// options). The configuration is checked against it, so that a command line accepted there
/// always fits at boot.
pub fn max_user_cmdline_len() -> usize {
    let devices: Vec<(u64, u32)> = (0..MAX_VIRTIO_DEVICES).map(virtio_slot).collect();
    let worst = CmdlineAdditions {
        devices: &devices,
        tsc_khz: Some(u32::MAX),
        extra: Some(crate::host::PVM_CMDLINE),
    };
    // With a one-byte base: the additions then include the space before the first one.
    let with_additions = vm_cmdline("x", &worst)
        .and_then(|c| c.as_cstring().map_err(BootError::Cmdline))
        .map(|c| c.as_bytes_with_nul().len())
        .unwrap_or(CMDLINE_MAX_SIZE);
    CMDLINE_MAX_SIZE.saturating_sub(with_additions - 1)
}

/// Reads the zero page back (for tests and diagnostics).
pub fn read_boot_params(mem: &GuestMemory) -> Result<boot_params, vm_memory::GuestMemoryError> {
    mem.read_obj(GuestAddress(ZERO_PAGE_START))
}

#[cfg(test)]
mod tests;
