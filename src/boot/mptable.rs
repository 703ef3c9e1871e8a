//! An Intel MultiProcessor Specification 1.4 table.
//!
//! Linux without ACPI finds CPUs, the IOAPIC and the ISA interrupt routing here; without one it
//! scans the BIOS area 16 bytes at a time (seconds when guest kernel code is emulated). The
//! floating pointer goes in the last KiB of base memory, one of the places Linux looks first.

use vm_memory::{Bytes, GuestAddress};

use crate::memory::{GuestMemory, EBDA_START};

/// The IOAPIC's guest physical address (KVM's in-kernel IOAPIC).
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// The local APIC's guest physical address.
pub const APIC_ADDR: u32 = 0xfee0_0000;
/// IOAPIC pins the table routes (KVM's IOAPIC has 24).
pub const IOAPIC_PINS: u8 = 24;
const APIC_VERSION: u8 = 0x14;
const MPC_SPEC: u8 = 4;

/// Why the table could not be written.
#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    #[error("{0} vCPUs do not fit in the MP table")]
    TooManyCpus(u8),
    #[error("the MP table does not fit in the EBDA")]
    TooLarge,
    #[error("cannot write the MP table to guest memory")]
    Write(#[source] vm_memory::GuestMemoryError),
}

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |s, b| s.wrapping_add(*b))
        .wrapping_neg()
}

/// Builds the table (floating pointer followed by the configuration table) for a table placed
/// at `base`.
pub fn build_mptable(base: u32, vcpus: u8) -> Result<Vec<u8>, MpTableError> {
    // IDs: CPUs 0..n-1, the IOAPIC takes id n.
    if vcpus == 0 || vcpus >= 0xfe {
        return Err(MpTableError::TooManyCpus(vcpus));
    }
    let ioapic_id = vcpus;
    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for cpu in 0..vcpus {
        // Processor entry (20 bytes): type 0, APIC id, version, flags (enabled, BSP), signature,
        // feature flags.
        entries.push(0);
        entries.push(cpu);
        entries.push(APIC_VERSION);
        entries.push(if cpu == 0 { 0x3 } else { 0x1 });
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // family 6
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // FPU + APIC
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    // Bus entry (8 bytes): ISA bus 0.
    entries.push(1);
    entries.push(0);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    // IOAPIC entry (8 bytes): enabled.
    entries.push(2);
    entries.push(ioapic_id);
    entries.push(APIC_VERSION);
    entries.push(1);
    entries.extend_from_slice(&IOAPIC_ADDR.to_le_bytes());
    count += 1;
    // I/O interrupt entries (8 bytes each): ISA IRQ n -> IOAPIC pin n, conforming polarity and
    // trigger (edge for ISA), type INT.
    for irq in 0..IOAPIC_PINS {
        entries.extend_from_slice(&[3, 0, 0, 0, 0, irq, ioapic_id, irq]);
        count += 1;
    }
    // Local interrupt entries: LINT0 = ExtINT, LINT1 = NMI, to all local APICs.
    entries.extend_from_slice(&[4, 3, 0, 0, 0, 0, 0xff, 0]);
    entries.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0xff, 1]);
    count += 2;

    // Configuration table header (44 bytes).
    let table_len = 44 + entries.len();
    let mut table = Vec::with_capacity(table_len);
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&(table_len as u16).to_le_bytes());
    table.push(MPC_SPEC);
    table.push(0); // checksum, filled below
    table.extend_from_slice(b"VMM     "); // OEM id
    table.extend_from_slice(b"000000000000"); // product id
    table.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    table.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&APIC_ADDR.to_le_bytes());
    table.extend_from_slice(&[0; 4]); // extended table length, checksum, reserved
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    // Floating pointer structure (16 bytes), immediately before the table.
    let mut mpf = Vec::with_capacity(16 + table.len());
    mpf.extend_from_slice(b"_MP_");
    mpf.extend_from_slice(&(base + 16).to_le_bytes());
    mpf.push(1); // length in 16-byte units
    mpf.push(MPC_SPEC);
    mpf.push(0); // checksum
    mpf.extend_from_slice(&[0; 5]); // feature bytes: 0 = a configuration table is present
    mpf[10] = checksum(&mpf[..16]);
    mpf.extend_from_slice(&table);
    Ok(mpf)
}

/// Writes the MP table for `vcpus` CPUs at the start of the EBDA.
pub fn setup_mptable(mem: &GuestMemory, vcpus: u8) -> Result<(), MpTableError> {
    let bytes = build_mptable(EBDA_START as u32, vcpus)?;
    if bytes.len() > 0x400 {
        return Err(MpTableError::TooLarge);
    }
    mem.write_slice(&bytes, GuestAddress(EBDA_START))
        .map_err(MpTableError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |s, x| s.wrapping_add(*x))
    }

    #[test]
    fn checksums_and_pointers_are_consistent() {
        for vcpus in [1u8, 2, 32] {
            let t = build_mptable(0x9fc00, vcpus).unwrap();
            assert_eq!(&t[0..4], b"_MP_");
            assert_eq!(sum(&t[..16]), 0, "floating pointer checksum");
            let ptr = u32::from_le_bytes(t[4..8].try_into().unwrap());
            assert_eq!(ptr, 0x9fc10);
            let table = &t[16..];
            assert_eq!(&table[0..4], b"PCMP");
            let len = u16::from_le_bytes(table[4..6].try_into().unwrap()) as usize;
            assert_eq!(len, table.len());
            assert_eq!(sum(table), 0, "table checksum");
            let count = u16::from_le_bytes(table[34..36].try_into().unwrap());
            assert_eq!(count, u16::from(vcpus) + 2 + u16::from(IOAPIC_PINS) + 2);
            // Exactly one bootstrap processor.
            let bsp = (0..vcpus as usize)
                .filter(|i| table[44 + i * 20 + 3] & 2 != 0)
                .count();
            assert_eq!(bsp, 1);
            assert!(t.len() <= 0x400);
        }
    }

    #[test]
    fn rejects_zero_or_too_many_cpus() {
        assert!(build_mptable(0x9fc00, 0).is_err());
        assert!(build_mptable(0x9fc00, 0xfe).is_err());
    }
}
