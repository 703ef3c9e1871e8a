//! Guest virtual → physical translation by walking the guest's page tables in guest memory,
//! used to show the instruction bytes at RIP when KVM reports an internal error (KVM's own
//! KVM_TRANSLATE is not implemented everywhere).

use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMemory;

const PRESENT: u64 = 1;
const PAGE_SIZE_BIT: u64 = 1 << 7;
const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_LA57: u64 = 1 << 12;
const EFER_LMA: u64 = 1 << 10;

/// Translates `gva` with paging state (cr0, cr3, cr4, efer). Returns `None` when the address is
/// not mapped or the mode is not 64-bit paging (or paging is off: then it is the identity).
pub fn translate(
    mem: &GuestMemory,
    cr0: u64,
    cr3: u64,
    cr4: u64,
    efer: u64,
    gva: u64,
) -> Option<u64> {
    if cr0 & CR0_PG == 0 {
        return Some(gva);
    }
    if cr4 & CR4_PAE == 0 || efer & EFER_LMA == 0 {
        return None;
    }
    let levels: u32 = if cr4 & CR4_LA57 != 0 { 5 } else { 4 };
    let mut table = cr3 & ADDR_MASK;
    for level in (1..=levels).rev() {
        let shift = 12 + 9 * (level - 1);
        let index = (gva >> shift) & 0x1ff;
        let entry: u64 = mem.read_obj(GuestAddress(table + index * 8)).ok()?;
        if entry & PRESENT == 0 {
            return None;
        }
        // A large page at the PDPT (1 GiB) or PD (2 MiB) level.
        if (level == 2 || level == 3) && entry & PAGE_SIZE_BIT != 0 {
            let page_mask = (1u64 << shift) - 1;
            return Some((entry & ADDR_MASK & !page_mask) | (gva & page_mask));
        }
        table = entry & ADDR_MASK;
    }
    Some(table | (gva & 0xfff))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{create_guest_memory, PML4_START};

    #[test]
    fn walks_4k_and_2m_mappings() {
        let mem = create_guest_memory(32 << 20).unwrap();
        // Kernel-style mapping: 0xffffffff81000000 -> 0x1000000 via a 2 MiB page, and
        // 0xffffffff81200000 -> 0x1234000 via a 4 KiB page.
        let gva_2m = 0xffff_ffff_8100_0000u64;
        let (pml4, pdpt, pd, pt) = (PML4_START, 0x10_0000u64, 0x10_1000u64, 0x10_2000u64);
        let idx = |v: u64, l: u32| (v >> (12 + 9 * (l - 1))) & 0x1ff;
        mem.write_obj(pdpt | 3, GuestAddress(pml4 + idx(gva_2m, 4) * 8))
            .unwrap();
        mem.write_obj(pd | 3, GuestAddress(pdpt + idx(gva_2m, 3) * 8))
            .unwrap();
        mem.write_obj(0x100_0000u64 | 0x83, GuestAddress(pd + idx(gva_2m, 2) * 8))
            .unwrap();
        let gva_4k = 0xffff_ffff_8120_0000u64;
        mem.write_obj(pt | 3, GuestAddress(pd + idx(gva_4k, 2) * 8))
            .unwrap();
        mem.write_obj(0x123_4000u64 | 3, GuestAddress(pt + idx(gva_4k, 1) * 8))
            .unwrap();

        let t = |gva| translate(&mem, CR0_PG, pml4, CR4_PAE, EFER_LMA, gva);
        assert_eq!(t(gva_2m + 0x1234), Some(0x100_1234));
        assert_eq!(t(gva_4k + 0x56), Some(0x123_4056));
        assert_eq!(t(0x4000_0000), None, "unmapped");
        assert_eq!(
            translate(&mem, 0, 0, 0, 0, 0x1234),
            Some(0x1234),
            "paging off"
        );
    }
}
