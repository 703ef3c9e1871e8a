//! The GDT and identity-mapped page tables the boot vCPU starts with.

use vm_memory::{Bytes, GuestAddress};

use crate::memory::{
    GuestMemory, BOOT_GDT_START, BOOT_IDT_START, PDE_START, PDPTE_START, PML4_START,
};

/// The boot GDT: null, 64-bit code, data, TSS (flags, base, limit).
pub const GDT: [(u16, u32, u32); 4] = [
    (0, 0, 0),
    (0xa09b, 0, 0xfffff),
    (0xc093, 0, 0xfffff),
    (0x808b, 0, 0xfffff),
];
/// Index of the code segment in [`GDT`] (selector = index × 8).
pub const GDT_CODE: usize = 1;
/// Index of the data segment in [`GDT`].
pub const GDT_DATA: usize = 2;
/// Index of the TSS in [`GDT`].
pub const GDT_TSS: usize = 3;
/// How many 1 GiB slices of the low address space the page tables identity-map.
pub const IDENTITY_MAPPED_GIB: u64 = 4;

/// Encodes a GDT descriptor.
pub fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((u64::from(base) & 0xff00_0000) << (56 - 24))
        | ((u64::from(flags) & 0x0000_f0ff) << 40)
        | ((u64::from(limit) & 0x000f_0000) << (48 - 16))
        | ((u64::from(base) & 0x00ff_ffff) << 16)
        | (u64::from(limit) & 0x0000_ffff)
}

/// Writes the GDT, an empty IDT and page tables that identity-map the first 4 GiB with 2 MiB
/// pages (the 64-bit boot protocol requires the zero page, command line and kernel to be
/// mapped 1:1).
pub fn write_gdt_and_page_tables(mem: &GuestMemory) -> Result<(), vm_memory::GuestMemoryError> {
    for (i, &(flags, base, limit)) in GDT.iter().enumerate() {
        mem.write_obj(
            gdt_entry(flags, base, limit),
            GuestAddress(BOOT_GDT_START + 8 * i as u64),
        )?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))?;

    // PML4[0] -> PDPT; PDPT[i] -> PD i; PD i maps 512 × 2 MiB.
    const PRESENT_RW: u64 = 0x3;
    const PAGE_SIZE_2M: u64 = 0x80;
    mem.write_obj(PDPTE_START | PRESENT_RW, GuestAddress(PML4_START))?;
    for gib in 0..IDENTITY_MAPPED_GIB {
        let pd = PDE_START + gib * 0x1000;
        mem.write_obj(pd | PRESENT_RW, GuestAddress(PDPTE_START + gib * 8))?;
        for i in 0..512u64 {
            let phys = (gib << 30) | (i << 21);
            mem.write_obj(phys | PRESENT_RW | PAGE_SIZE_2M, GuestAddress(pd + i * 8))?;
        }
    }
    Ok(())
}
