//! A vhost-user frontend's memory table: the regions it shares (each a file descriptor, an
//! offset in it, a guest-physical range and the frontend's own virtual address for it), mapped
//! here as guest memory, and the translation of the frontend's virtual addresses (what
//! SET_VRING_ADDR carries) to guest-physical ones (what descriptors carry).
//!
//! Every region is hostile input. A region is refused when it is empty, wraps around, overlaps
//! another one (guest-physically or in the frontend's address space), when its file is not a
//! regular file (memfd, hugetlbfs or tmpfs) or is shorter than the range it claims, or when its
//! offset cannot be mapped. A mapping past the end of its file would raise SIGBUS at the first
//! access, so the file's size is checked, and the backend seals it against shrinking
//! (F_SEAL_SHRINK) where the frontend allows seals; a region it cannot seal is counted
//! (`unsealed_regions`), since a frontend that truncates such a file later can still make the
//! backend's next access to it fault.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// The most regions a table may hold (GET_MAX_MEM_SLOTS; SET_MEM_TABLE carries at most 8
/// with QEMU and 32 in the protocol).
pub const MAX_REGIONS: usize = 64;

/// Why a region or a table was refused.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// Zero size, or an end that does not fit in 64 bits.
    #[error("region at guest address {gpa:#x} has an invalid size {size:#x}")]
    BadRange {
        /// The region's guest-physical start.
        gpa: u64,
        /// Its size.
        size: u64,
    },
    /// The region overlaps one already in the table.
    #[error("region at guest address {0:#x} overlaps another region")]
    Overlap(u64),
    /// More regions than [`MAX_REGIONS`].
    #[error("more than {MAX_REGIONS} memory regions")]
    TooMany,
    /// `fstat` on the region's file failed.
    #[error("cannot inspect the region's file")]
    Stat(#[source] io::Error),
    /// The file is not a regular file (a memfd, hugetlbfs or tmpfs file).
    #[error("the region's file is not a regular file (memfd, hugetlbfs, tmpfs)")]
    NotAFile,
    /// The file is shorter than the range the region maps.
    #[error("the region's file holds {file_size:#x} bytes, the region needs {needed:#x}")]
    FileTooShort {
        /// What the file holds.
        file_size: u64,
        /// Offset + size of the region.
        needed: u64,
    },
    /// mmap refused the region (an offset not aligned to the page size, no memory).
    #[error("cannot map the region")]
    Map(#[source] vm_memory::mmap::MmapRegionError),
    /// REM_MEM_REG named a region the table does not hold.
    #[error("no region at guest address {0:#x} of that size")]
    NoSuchRegion(u64),
    /// An address the frontend gave (a ring's) lies in none of its regions.
    #[error("frontend address {0:#x} is in no memory region")]
    Untranslatable(u64),
}

/// One region as the frontend described it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// Guest-physical start.
    pub gpa: u64,
    /// Size in bytes.
    pub size: u64,
    /// The frontend's virtual address of the start.
    pub user_addr: u64,
    /// Offset of the start in the region's file.
    pub mmap_offset: u64,
}

impl RegionInfo {
    fn check(&self) -> Result<(), MemoryError> {
        let bad = || MemoryError::BadRange {
            gpa: self.gpa,
            size: self.size,
        };
        if self.size == 0 {
            return Err(bad());
        }
        for start in [self.gpa, self.user_addr, self.mmap_offset] {
            start.checked_add(self.size).ok_or_else(bad)?;
        }
        usize::try_from(self.size).map_err(|_| bad())?;
        Ok(())
    }

    fn overlaps(&self, other: &RegionInfo) -> bool {
        let meet = |a: u64, b: u64| a < b + other.size && b < a + self.size;
        meet(self.gpa, other.gpa) || meet(self.user_addr, other.user_addr)
    }
}

/// A region mapped here.
#[derive(Debug)]
struct Region {
    info: RegionInfo,
    mapping: std::sync::Arc<GuestRegionMmap>,
    sealed: bool,
}

/// The frontend's memory table, mapped.
#[derive(Debug, Default)]
pub struct MemoryTable {
    regions: Vec<Region>,
}

impl MemoryTable {
    /// The table of `regions` (SET_MEM_TABLE), each with its file; every region is checked
    /// and mapped, or none is.
    pub fn from_regions(
        regions: impl IntoIterator<Item = (RegionInfo, File)>,
    ) -> Result<MemoryTable, MemoryError> {
        let mut table = MemoryTable::default();
        for (info, file) in regions {
            table.add(info, file)?;
        }
        Ok(table)
    }

    /// Adds a region (ADD_MEM_REG). One identical to a region already held is accepted and
    /// changes nothing: QEMU sends each region once per queue pair.
    pub fn add(&mut self, info: RegionInfo, file: File) -> Result<(), MemoryError> {
        info.check()?;
        if self.regions.iter().any(|r| r.info == info) {
            return Ok(());
        }
        if self.regions.iter().any(|r| r.info.overlaps(&info)) {
            return Err(MemoryError::Overlap(info.gpa));
        }
        if self.regions.len() >= MAX_REGIONS {
            return Err(MemoryError::TooMany);
        }
        let sealed = check_file(&file, info.mmap_offset + info.size)?;
        // `check` made sure the size fits in usize.
        let size = info.size as usize;
        let mapping = MmapRegion::from_file(FileOffset::new(file, info.mmap_offset), size)
            .map_err(MemoryError::Map)?;
        let mapping =
            GuestRegionMmap::new(mapping, GuestAddress(info.gpa)).ok_or(MemoryError::BadRange {
                gpa: info.gpa,
                size: info.size,
            })?;
        self.regions.push(Region {
            info,
            mapping: std::sync::Arc::new(mapping),
            sealed,
        });
        self.regions.sort_by_key(|r| r.info.gpa);
        Ok(())
    }

    /// Removes the region of that guest address and size (REM_MEM_REG).
    pub fn remove(&mut self, gpa: u64, size: u64) -> Result<(), MemoryError> {
        let at = self
            .regions
            .iter()
            .position(|r| r.info.gpa == gpa && r.info.size == size)
            .ok_or(MemoryError::NoSuchRegion(gpa))?;
        self.regions.remove(at);
        Ok(())
    }

    /// How many regions the table holds.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether the table is empty (no memory table yet).
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Regions the backend could not seal against shrinking.
    pub fn unsealed(&self) -> usize {
        self.regions.iter().filter(|r| !r.sealed).count()
    }

    /// The table as guest memory (cheap: the mappings are shared), `None` while it is empty.
    pub fn guest_memory(&self) -> Option<GuestMemoryMmap> {
        let regions = self.regions.iter().map(|r| r.mapping.clone()).collect();
        // Sorted and disjoint by construction.
        GuestMemoryMmap::from_arc_regions(regions).ok()
    }

    /// The guest-physical address of the frontend's virtual address `addr`.
    pub fn translate(&self, addr: u64) -> Result<u64, MemoryError> {
        self.regions
            .iter()
            .find(|r| addr >= r.info.user_addr && addr - r.info.user_addr < r.info.size)
            .map(|r| r.info.gpa + (addr - r.info.user_addr))
            .ok_or(MemoryError::Untranslatable(addr))
    }
}

/// Checks that `file` is a regular file of at least `needed` bytes, and seals it against
/// shrinking where it allows seals. Returns whether it is sealed.
fn check_file(file: &File, needed: u64) -> Result<bool, MemoryError> {
    let meta = file.metadata().map_err(MemoryError::Stat)?;
    if !meta.file_type().is_file() {
        return Err(MemoryError::NotAFile);
    }
    if meta.len() < needed {
        return Err(MemoryError::FileTooShort {
            file_size: meta.len(),
            needed,
        });
    }
    let fd = file.as_raw_fd();
    // SAFETY: F_GET_SEALS on a descriptor we own reads its seals and changes nothing.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals >= 0 && seals & libc::F_SEAL_SHRINK != 0 {
        return Ok(true);
    }
    // SAFETY: F_ADD_SEALS on a descriptor we own only adds a seal (or fails, changing
    // nothing); it touches no memory of this process.
    let added = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    Ok(added == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    fn memfd(len: u64, sealing: bool) -> File {
        let flags = if sealing { libc::MFD_ALLOW_SEALING } else { 0 };
        // SAFETY: memfd_create with a static name returns a new descriptor we then own.
        let fd = unsafe { libc::memfd_create(c"vhost-user-test".as_ptr(), flags) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(len).expect("ftruncate");
        file
    }

    fn region(gpa: u64, size: u64, user_addr: u64) -> RegionInfo {
        RegionInfo {
            gpa,
            size,
            user_addr,
            mmap_offset: 0,
        }
    }

    #[test]
    fn regions_map_translate_and_share_the_frontends_bytes() {
        let file = memfd(0x20_0000, true);
        let mine = file.try_clone().expect("dup");
        let mut table = MemoryTable::from_regions([
            (region(0, 0x10_0000, 0x7f00_0000_0000), file),
            (
                RegionInfo {
                    gpa: 0x4000_0000,
                    size: 0x10_0000,
                    user_addr: 0x7f10_0000_0000,
                    mmap_offset: 0x10_0000,
                },
                mine.try_clone().expect("dup"),
            ),
        ])
        .expect("table");
        assert_eq!(table.len(), 2);
        assert_eq!(table.unsealed(), 0, "a memfd that allows seals is sealed");
        assert_eq!(table.translate(0x7f00_0000_1000).expect("in"), 0x1000);
        assert_eq!(table.translate(0x7f10_0000_0010).expect("in"), 0x4000_0010);
        assert!(matches!(
            table.translate(0x7f00_0010_0000),
            Err(MemoryError::Untranslatable(_))
        ));
        let mem = table.guest_memory().expect("memory");
        mem.write_obj(0xabcd_u32, GuestAddress(0x4000_0000))
            .expect("write");
        // The second region is the file's second MiB: the frontend sees the write there.
        let mut word = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&mine, &mut word, 0x10_0000).expect("read");
        assert_eq!(u32::from_le_bytes(word), 0xabcd);
        assert!(mem.read_obj::<u8>(GuestAddress(0xf_ffff)).is_ok());
        assert!(
            mem.read_obj::<u8>(GuestAddress(0x10_0000)).is_err(),
            "a hole"
        );
        // Sealed: the frontend can no longer shrink the file under our mapping.
        assert!(mine.set_len(0x1000).is_err(), "F_SEAL_SHRINK in force");
        // An identical region again (QEMU, once per queue pair) changes nothing.
        table
            .add(
                region(0, 0x10_0000, 0x7f00_0000_0000),
                memfd(0x10_0000, true),
            )
            .expect("idempotent");
        assert_eq!(table.len(), 2);
        table.remove(0, 0x10_0000).expect("remove");
        assert_eq!(table.len(), 1);
        assert!(matches!(
            table.remove(0, 0x10_0000),
            Err(MemoryError::NoSuchRegion(0))
        ));
    }

    #[test]
    fn hostile_regions_are_refused() {
        let add = |info: RegionInfo, file: File| MemoryTable::default().add(info, file);
        // Empty, wrapping, larger than the file, past the file's end by its offset.
        assert!(matches!(
            add(region(0, 0, 0), memfd(0x1000, true)),
            Err(MemoryError::BadRange { .. })
        ));
        assert!(matches!(
            add(region(u64::MAX - 0xfff, 0x2000, 0), memfd(0x2000, true)),
            Err(MemoryError::BadRange { .. })
        ));
        assert!(matches!(
            add(region(0, 0x10_0000, 0), memfd(0x1000, true)),
            Err(MemoryError::FileTooShort { .. })
        ));
        let past_end = RegionInfo {
            mmap_offset: 0x1000,
            ..region(0, 0x1000, 0)
        };
        assert!(matches!(
            add(past_end, memfd(0x1000, true)),
            Err(MemoryError::FileTooShort { .. })
        ));
        // An offset mmap cannot take.
        let unaligned = RegionInfo {
            mmap_offset: 0x10,
            ..region(0, 0x1000, 0)
        };
        assert!(matches!(
            add(unaligned, memfd(0x2000, true)),
            Err(MemoryError::Map(_))
        ));
        // Not a regular file: a socket, a pipe.
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let socket = File::from(std::os::fd::OwnedFd::from(a));
        assert!(matches!(
            add(region(0, 0x1000, 0), socket),
            Err(MemoryError::NotAFile)
        ));
        // Overlaps, guest-physically or in the frontend's address space.
        let mut table = MemoryTable::default();
        table
            .add(
                region(0x10_0000, 0x10_0000, 0x1000_0000),
                memfd(0x10_0000, true),
            )
            .expect("first");
        for clash in [
            region(0x18_0000, 0x10_0000, 0x9000_0000),
            region(0x80_0000, 0x10_0000, 0x1008_0000),
        ] {
            assert!(matches!(
                table.add(clash, memfd(0x10_0000, true)),
                Err(MemoryError::Overlap(_))
            ));
        }
        // A memfd without sealing maps, and is counted.
        table
            .add(
                region(0x100_0000, 0x1000, 0x2000_0000),
                memfd(0x1000, false),
            )
            .expect("unsealable");
        assert_eq!(table.unsealed(), 1);
        // Too many.
        let mut full = MemoryTable::default();
        for i in 0..MAX_REGIONS as u64 {
            full.add(region(i << 20, 0x1000, i << 20), memfd(0x1000, true))
                .expect("fits");
        }
        assert!(matches!(
            full.add(region(1 << 40, 0x1000, 1 << 40), memfd(0x1000, true)),
            Err(MemoryError::TooMany)
        ));
    }
}
