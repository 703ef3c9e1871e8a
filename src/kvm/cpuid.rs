//! The CPUID table each vCPU gets: what KVM supports, plus its APIC id, the hypervisor bit and
//! leaf 0x15 (TSC/crystal ratio and frequency). Without leaf 0x15 Linux calibrates the TSC
//! against the PIT (seconds when guest kernel code is emulated) and may mark it unstable.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

const LEAF_TSC: u32 = 0x15;
const HYPERVISOR_BIT: u32 = 1 << 31;

/// Patches a KVM-supported CPUID table for vCPU `apic_id` with the TSC running at `tsc_khz`.
pub fn patch_entries(entries: &mut Vec<kvm_cpuid_entry2>, apic_id: u8, tsc_khz: Option<u32>) {
    for e in entries.iter_mut() {
        match e.function {
            0 if tsc_khz.is_some() => e.eax = e.eax.max(LEAF_TSC),
            1 => {
                e.ebx = (e.ebx & 0x00ff_ffff) | (u32::from(apic_id) << 24);
                e.ecx |= HYPERVISOR_BIT;
            }
            0xb | 0x1f => e.edx = u32::from(apic_id),
            _ => {}
        }
    }
    if let Some(khz) = tsc_khz {
        entries.retain(|e| e.function != LEAF_TSC);
        // TSC frequency = ecx × ebx / eax: a 1:1 ratio over a "crystal" at the TSC frequency.
        entries.push(kvm_cpuid_entry2 {
            function: LEAF_TSC,
            index: 0,
            flags: 0,
            eax: 1,
            ebx: 1,
            ecx: khz.saturating_mul(1000),
            edx: 0,
            ..Default::default()
        });
    }
}

/// Builds the vCPU's table from KVM's supported one.
pub fn vcpu_cpuid(supported: &CpuId, apic_id: u8, tsc_khz: Option<u32>) -> CpuId {
    let mut entries = supported.as_slice().to_vec();
    patch_entries(&mut entries, apic_id, tsc_khz);
    // Leaves 0xb and 0x1f are indexed; keep KVM's flags, which say so.
    debug_assert!(entries
        .iter()
        .filter(|e| e.function == 0xb)
        .all(|e| e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX != 0));
    CpuId::from_entries(&entries).unwrap_or_else(|_| supported.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, eax: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            eax,
            ..Default::default()
        }
    }

    #[test]
    fn adds_leaf_0x15_and_raises_max_leaf() {
        let mut e = vec![entry(0, 0xd), entry(1, 0), entry(0x15, 7)];
        patch_entries(&mut e, 3, Some(2_100_000));
        assert_eq!(e[0].eax, 0x15);
        assert_eq!(e[1].ebx >> 24, 3);
        assert_ne!(e[1].ecx & HYPERVISOR_BIT, 0);
        let tsc: Vec<_> = e.iter().filter(|x| x.function == 0x15).collect();
        assert_eq!(tsc.len(), 1);
        assert_eq!((tsc[0].eax, tsc[0].ebx, tsc[0].ecx), (1, 1, 2_100_000_000));
    }

    #[test]
    fn without_tsc_frequency_leaf_0x15_is_untouched() {
        let mut e = vec![entry(0, 0xd), entry(1, 0)];
        patch_entries(&mut e, 0, None);
        assert_eq!(e[0].eax, 0xd);
        assert!(e.iter().all(|x| x.function != 0x15));
    }
}
