use std::io::Write;

use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::memory::create_guest_memory;

const MIB: u64 = 1 << 20;

/// A minimal ELF64 executable with one PT_LOAD of `payload` at 16 MiB, entry at its start.
fn tiny_elf(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 64 + 56];
    f[0..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little endian
    f[6] = 1; // version
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86_64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // entry
    f[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    f[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    f[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    f[56..58].copy_from_slice(&1u16.to_le_bytes()); // phnum
    let ph = &mut f[64..120];
    ph[0..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    ph[8..16].copy_from_slice(&120u64.to_le_bytes()); // offset
    ph[16..24].copy_from_slice(&0x100_0000u64.to_le_bytes()); // vaddr
    ph[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // paddr
    ph[32..40].copy_from_slice(&(payload.len() as u64).to_le_bytes()); // filesz
    ph[40..48].copy_from_slice(&(payload.len() as u64 + 0x1000).to_le_bytes()); // memsz
    f.extend_from_slice(payload);
    f
}

fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("vmm-boot-test-{}-{name}", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    path
}

#[test]
fn e820_reserves_ebda_and_skips_mmio_hole() {
    let map = e820_map(128 * MIB);
    let entries: Vec<(u64, u64, u32)> = map.iter().map(|e| (e.addr, e.size, e.r#type)).collect();
    assert_eq!(
        entries,
        vec![
            (0, EBDA_START, E820_RAM),
            (EBDA_START, 0x400, E820_RESERVED),
            (HIMEM_START, 128 * MIB - HIMEM_START, E820_RAM),
        ]
    );
    let big = e820_map(5 << 30);
    assert_eq!(big.len(), 4);
    let (a, s) = (big[2].addr, big[2].size);
    assert_eq!(a + s, memory::MMIO_START);
    let (a, s) = (big[3].addr, big[3].size);
    assert_eq!(
        (a, s),
        (memory::FOUR_GIB, (5u64 << 30) - memory::MMIO_START)
    );
}

#[test]
fn initrd_goes_high_page_aligned_and_above_the_kernel() {
    assert_eq!(initrd_address(0x1800, 0x10_0000, 0), Some(0xf_e000));
    assert_eq!(initrd_address(0x1000, 0x10_0000, 0), Some(0xf_f000));
    assert_eq!(
        initrd_address(0x10_0000, 0x20_0000, 0x10_0000),
        Some(0x10_0000)
    );
    assert_eq!(initrd_address(0x10_0001, 0x20_0000, 0x10_0000), None);
    assert_eq!(initrd_address(u64::MAX, 0x20_0000, 0), None);
}

#[test]
fn zero_page_for_elf_kernel() {
    let kernel = LoadedKernel {
        entry: 0x100_0000,
        end: 0x200_0000,
        setup_header: None,
    };
    let initrd = InitrdPlacement {
        addr: 0x700_0000,
        size: 0x1234,
    };
    let p = build_boot_params(&kernel, 42, Some(initrd), 128 * MIB);
    let hdr = p.hdr;
    assert_eq!({ hdr.boot_flag }, KERNEL_BOOT_FLAG_MAGIC);
    assert_eq!({ hdr.header }, KERNEL_HDR_MAGIC);
    assert_eq!({ hdr.type_of_loader }, KERNEL_LOADER_OTHER);
    assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_START as u32);
    assert_eq!({ hdr.cmdline_size }, 42);
    assert_eq!({ hdr.ramdisk_image }, 0x700_0000);
    assert_eq!({ hdr.ramdisk_size }, 0x1234);
    assert_eq!(p.e820_entries, 3);
}

#[test]
fn configure_system_writes_cmdline_zero_page_and_tables() {
    let mem = create_guest_memory(64 * MIB).unwrap();
    let kernel = LoadedKernel {
        entry: 0x100_0000,
        end: 0x180_0000,
        setup_header: None,
    };
    let cmdline = new_cmdline("console=ttyS0 reboot=k").unwrap();
    configure_system(&mem, &kernel, &cmdline, None, 64 * MIB, 1).unwrap();
    let mut buf = [0u8; 23];
    mem.read_slice(&mut buf, GuestAddress(CMDLINE_START))
        .unwrap();
    assert_eq!(&buf, b"console=ttyS0 reboot=k\0");
    let p = read_boot_params(&mem).unwrap();
    assert_eq!({ p.hdr.cmdline_size }, 23);
    let mut mp = [0u8; 4];
    mem.read_slice(&mut mp, GuestAddress(EBDA_START)).unwrap();
    assert_eq!(&mp, b"_MP_");
    // The identity map covers the kernel entry with a 2 MiB page.
    let pde: u64 = mem
        .read_obj(GuestAddress(memory::PDE_START + 8 * (0x100_0000 >> 21)))
        .unwrap();
    assert_eq!(pde & !0xfff, 0x100_0000);
    assert_eq!(pde & 0x83, 0x83);
}

#[test]
fn loads_an_elf_kernel_and_an_initrd() {
    let mem = create_guest_memory(64 * MIB).unwrap();
    let elf = temp_file("vmlinux", &tiny_elf(b"KERNEL!!"));
    let k = load_kernel(&mem, &elf).unwrap();
    assert_eq!(k.entry, 0x100_0000);
    assert!(k.end >= 0x100_0008);
    let mut b = [0u8; 8];
    mem.read_slice(&mut b, GuestAddress(0x100_0000)).unwrap();
    assert_eq!(&b, b"KERNEL!!");

    let initrd = temp_file("initrd", &[0xab; 5000]);
    let placed = load_initrd(&mem, &initrd, &k).unwrap();
    assert_eq!(placed.size, 5000);
    assert_eq!(placed.addr % PAGE_SIZE, 0);
    assert!(placed.addr + placed.size <= 64 * MIB);
    assert!(placed.addr >= k.end);
    let mut last = [0u8; 1];
    mem.read_slice(&mut last, GuestAddress(placed.addr + 4999))
        .unwrap();
    assert_eq!(last[0], 0xab);
    std::fs::remove_file(elf).unwrap();
    std::fs::remove_file(initrd).unwrap();
}

#[test]
fn initrd_too_large_is_a_clear_error() {
    let mem = create_guest_memory(32 * MIB).unwrap();
    let k = LoadedKernel {
        entry: 0x100_0000,
        end: 0x180_0000,
        setup_header: None,
    };
    let initrd = temp_file("big-initrd", &vec![0u8; 9 << 20]);
    let err = load_initrd(&mem, &initrd, &k).unwrap_err();
    assert!(matches!(err, BootError::InitrdTooLarge { .. }), "{err}");
    std::fs::remove_file(initrd).unwrap();
}

#[test]
fn a_file_that_is_not_a_kernel_is_rejected() {
    let mem = create_guest_memory(32 * MIB).unwrap();
    let junk = temp_file("junk", b"#!/bin/sh\necho not a kernel\n");
    let err = load_kernel(&mem, &junk).unwrap_err();
    assert!(matches!(err, BootError::NotAKernel { .. }), "{err}");
    let empty = temp_file("empty", b"");
    assert!(matches!(
        load_kernel(&mem, &empty).unwrap_err(),
        BootError::NotAKernel { .. }
    ));
    assert!(matches!(
        load_kernel(&mem, Path::new("/nonexistent/vmlinux")).unwrap_err(),
        BootError::OpenKernel { .. }
    ));
    std::fs::remove_file(junk).unwrap();
    std::fs::remove_file(empty).unwrap();
}

#[test]
fn bzimage_header_is_detected() {
    let mut img = vec![0u8; 0x1000];
    img[0x202..0x206].copy_from_slice(&KERNEL_HDR_MAGIC.to_le_bytes());
    let mut c = std::io::Cursor::new(img);
    assert_eq!(detect_format(&mut c).unwrap(), Some(KernelFormat::BzImage));
    let mut c = std::io::Cursor::new(tiny_elf(b"x"));
    assert_eq!(detect_format(&mut c).unwrap(), Some(KernelFormat::Elf));
}

/// Issue 11, class 6: a FIFO as the kernel or initrd froze the VMM thread in open(2).
#[test]
fn a_fifo_as_kernel_or_initrd_is_refused_at_once() {
    let mem = create_guest_memory(32 * MIB).unwrap();
    let fifo = std::env::temp_dir().join(format!("vmm-boot-fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let started = std::time::Instant::now();
    let err = load_kernel(&mem, &fifo).unwrap_err();
    assert!(matches!(err, BootError::OpenKernel { .. }), "{err}");
    assert!(
        crate::error_chain(&err).contains("not a regular file (a FIFO)"),
        "{err}"
    );
    let k = LoadedKernel {
        entry: 0x100_0000,
        end: 0x180_0000,
        setup_header: None,
    };
    let err = load_initrd(&mem, &fifo, &k).unwrap_err();
    assert!(matches!(err, BootError::OpenInitrd { .. }), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    let err = load_kernel(&mem, Path::new("/dev/zero")).unwrap_err();
    assert!(matches!(err, BootError::OpenKernel { .. }), "{err}");
    std::fs::remove_file(fifo).unwrap();
}

#[test]
fn a_page_aligned_elf_is_mapped_privately_with_the_tail_zeroed() {
    // tiny_elf's segment starts at file offset 120; move it to 4096 so that it is mapped.
    let payload = b"MAPPED!!";
    let mut image = tiny_elf(payload);
    image.truncate(120);
    image[64 + 8..64 + 16].copy_from_slice(&0x1000u64.to_le_bytes());
    image.resize(0x1000, 0);
    image.extend_from_slice(payload);
    image.extend_from_slice(&[0xee; 100]); // file bytes past p_filesz: not the guest's
    let elf = temp_file("vmlinux-aligned", &image);
    let mem = create_guest_memory(64 * MIB).unwrap();
    mem.write_slice(&[0x55; 16], GuestAddress(0x100_0000 + 8))
        .unwrap();
    let k = load_kernel(&mem, &elf).unwrap();
    assert_eq!(k.entry, 0x100_0000);
    assert_eq!(k.end, 0x100_0000 + payload.len() as u64 + 0x1000);
    let mut b = [0u8; 16];
    mem.read_slice(&mut b, GuestAddress(0x100_0000)).unwrap();
    assert_eq!(&b, b"MAPPED!!\0\0\0\0\0\0\0\0");
    // Copy-on-write: the guest's writes never reach the file.
    mem.write_slice(b"written!", GuestAddress(0x100_0000))
        .unwrap();
    assert_eq!(&std::fs::read(&elf).unwrap()[0x1000..0x1008], payload);
    std::fs::remove_file(elf).unwrap();
}
