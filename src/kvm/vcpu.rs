//! vCPU set-up (CPUID, MSRs, LAPIC, 64-bit boot registers) and the run loop.
//!
//! The loop sends port and MMIO exits to the buses. Everything that ends the VM is returned as a
//! [`VcpuExit`]; nothing here panics on guest behaviour.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use kvm_bindings::{
    kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, Msrs, KVM_EXIT_INTERNAL_ERROR,
    KVM_MAX_CPUID_ENTRIES, KVM_MP_STATE_HALTED, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN,
};
use kvm_ioctls::{VcpuExit as KvmExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress};

use super::{cpuid, io_err, pagewalk, KvmError, Vm};
use crate::boot::layout::{gdt_entry, GDT, GDT_CODE, GDT_DATA, GDT_TSS};
use crate::bus::Bus;
use crate::memory::{
    GuestMemory, BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER, PML4_START, ZERO_PAGE_START,
};

const X86_CR0_PE: u64 = 0x1;
const X86_CR0_ET: u64 = 0x10;
const X86_CR0_PG: u64 = 0x8000_0000;
const X86_CR4_PAE: u64 = 0x20;
const EFER_LME: u64 = 0x100;
const EFER_LMA: u64 = 0x400;
const RFLAGS_IF: u64 = 1 << 9;

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

const OPCODE_INT3: u8 = 0xcc;
const OPCODE_FWAIT: u8 = 0x9b;
const VECTOR_BP: u8 = 3;

/// How many consecutive watchdog probes must find the vCPU stuck before it is reported.
const STUCK_PROBES: u32 = 10;
/// How many consecutive probes must find the vCPU halted with interrupts off.
const HALTED_PROBES: u32 = 2;

/// Why a vCPU stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum VcpuExit {
    /// The guest asked for a reset or power-off: a normal end of the VM.
    Reset,
    /// Something the guest or KVM did ended the VM abnormally.
    Fault(String),
    /// The VMM asked the vCPU to stop.
    Stopped,
}

/// One vCPU and the buses its exits go to.
pub struct Vcpu {
    id: u8,
    fd: VcpuFd,
    mem: GuestMemory,
    pio: Bus,
    mmio: Bus,
    /// Instructions the host could not run that we completed (int3/fwait); for diagnostics.
    fixups: u64,
    /// The host is KVM's PVM module, which cannot emulate `int3`/`fwait` at CPL0: complete
    /// them (only then; elsewhere an internal error is reported as it is).
    complete_unemulated: bool,
    tsc_khz: Option<u32>,
    watchdog: Watchdog,
}

#[derive(Default)]
struct Watchdog {
    halted_probes: u32,
    stuck_probes: u32,
    exits_since_probe: u64,
    last: Option<(u64, u64, u64)>,
}

impl Vcpu {
    /// Creates vCPU `id` and configures it. The boot vCPU (id 0) starts at `entry` in 64-bit
    /// mode; the others wait for INIT/SIPI in the in-kernel LAPIC.
    pub fn new(
        vm: &Vm,
        id: u8,
        entry: u64,
        mem: GuestMemory,
        pio: Bus,
        mmio: Bus,
        complete_unemulated: bool,
    ) -> Result<Vcpu, KvmError> {
        let err = |what: &'static str| {
            move |e: kvm_ioctls::Error| KvmError::Vcpu {
                id,
                what,
                source: io_err(e),
            }
        };
        let fd = vm
            .fd()
            .create_vcpu(u64::from(id))
            .map_err(err("KVM_CREATE_VCPU"))?;
        let supported = vm
            .kvm()
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| KvmError::SupportedCpuid(io_err(e)))?;
        let tsc_khz = fd.get_tsc_khz().ok().filter(|&k| k > 0);
        fd.set_cpuid2(&cpuid::vcpu_cpuid(&supported, id, tsc_khz))
            .map_err(err("KVM_SET_CPUID2"))?;
        fd.set_msrs(&boot_msrs()).map_err(err("KVM_SET_MSRS"))?;
        let mut lapic = fd.get_lapic().map_err(err("KVM_GET_LAPIC"))?;
        set_lvt_mode(&mut lapic.regs, APIC_LVT0, APIC_MODE_EXTINT);
        set_lvt_mode(&mut lapic.regs, APIC_LVT1, APIC_MODE_NMI);
        fd.set_lapic(&lapic).map_err(err("KVM_SET_LAPIC"))?;
        if id == 0 {
            let mut sregs = fd.get_sregs().map_err(err("KVM_GET_SREGS"))?;
            boot_sregs(&mut sregs);
            fd.set_sregs(&sregs).map_err(err("KVM_SET_SREGS"))?;
            fd.set_regs(&boot_regs(entry))
                .map_err(err("KVM_SET_REGS"))?;
            let fpu = kvm_fpu {
                fcw: 0x37f,
                mxcsr: 0x1f80,
                ..Default::default()
            };
            fd.set_fpu(&fpu).map_err(err("KVM_SET_FPU"))?;
        }
        Ok(Vcpu {
            id,
            fd,
            mem,
            pio,
            mmio,
            fixups: 0,
            complete_unemulated,
            tsc_khz,
            watchdog: Watchdog::default(),
        })
    }

    /// The vCPU's index (and APIC id).
    pub fn id(&self) -> u8 {
        self.id
    }

    /// The guest TSC frequency, when KVM reports one.
    pub fn tsc_khz(&self) -> Option<u32> {
        self.tsc_khz
    }

    /// Runs the vCPU until the VM ends or `stop` is set (the VMM then kicks the thread with a
    /// signal until it notices).
    pub fn run(mut self, stop: &AtomicBool) -> VcpuExit {
        if self.id == 0 {
            crate::log_first_run();
        }
        loop {
            if stop.load(Ordering::Acquire) {
                return VcpuExit::Stopped;
            }
            let exit = match self.fd.run() {
                Ok(exit) => exit,
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    match self.interrupted(stop) {
                        Some(exit) => return exit,
                        None => continue,
                    }
                }
                Err(e) => {
                    return VcpuExit::Fault(format!(
                        "vCPU {}: KVM_RUN failed: {}",
                        self.id,
                        io_err(e)
                    ))
                }
            };
            self.watchdog.exits_since_probe += 1;
            match exit {
                KvmExit::IoIn(port, data) => {
                    if !self.pio.read(u64::from(port), data) {
                        data.fill(0xff);
                    }
                }
                KvmExit::IoOut(port, data) => {
                    self.pio.write(u64::from(port), data);
                }
                KvmExit::MmioRead(addr, data) => {
                    if !self.mmio.read(addr, data) {
                        log::debug!("vCPU {}: read from unmapped MMIO {addr:#x}", self.id);
                        data.fill(0xff);
                    }
                }
                KvmExit::MmioWrite(addr, data) => {
                    if !self.mmio.write(addr, data) {
                        log::debug!("vCPU {}: write to unmapped MMIO {addr:#x}", self.id);
                    }
                }
                KvmExit::Hlt => {
                    return VcpuExit::Fault(format!("vCPU {}: the guest halted", self.id));
                }
                KvmExit::Shutdown => {
                    return VcpuExit::Fault(format!(
                        "vCPU {}: the guest triple-faulted (KVM_EXIT_SHUTDOWN){}",
                        self.id,
                        self.describe_rip()
                    ));
                }
                KvmExit::SystemEvent(kind, _)
                    if kind == KVM_SYSTEM_EVENT_RESET || kind == KVM_SYSTEM_EVENT_SHUTDOWN =>
                {
                    return VcpuExit::Reset;
                }
                KvmExit::FailEntry(reason, cpu) => {
                    return VcpuExit::Fault(format!(
                        "vCPU {}: KVM entry failed: hardware reason {reason:#x} on host CPU {cpu}",
                        self.id
                    ));
                }
                KvmExit::InternalError => {
                    if let Some(fault) = self.handle_internal_error() {
                        return VcpuExit::Fault(fault);
                    }
                }
                other => {
                    return VcpuExit::Fault(format!(
                        "vCPU {}: unexpected KVM exit {other:?}",
                        self.id
                    ));
                }
            }
        }
    }

    /// KVM_RUN was interrupted by a signal: the VMM stopping the VM, or its watchdog asking
    /// whether the vCPU still makes progress. `None`: run on.
    fn interrupted(&mut self, stop: &AtomicBool) -> Option<VcpuExit> {
        if stop.load(Ordering::Acquire) {
            return Some(VcpuExit::Stopped);
        }
        self.probe().map(VcpuExit::Fault)
    }

    /// KVM_EXIT_INTERNAL_ERROR: some hosts (KVM's PVM module in its mode for unmodified guests)
    /// cannot emulate `int3` or `fwait` at CPL0. Complete those two here; report anything else.
    fn handle_internal_error(&mut self) -> Option<String> {
        let run = self.fd.get_kvm_run();
        if run.exit_reason != KVM_EXIT_INTERNAL_ERROR {
            return Some(format!(
                "vCPU {}: internal error with exit reason {}",
                self.id, run.exit_reason
            ));
        }
        // SAFETY: exit_reason is KVM_EXIT_INTERNAL_ERROR, for which KVM fills the `internal`
        // member of the union; it is plain integers, valid for any bit pattern.
        let internal = unsafe { run.__bindgen_anon_1.internal };
        let ndata = (internal.ndata as usize).min(internal.data.len());
        let data = internal.data[..ndata].to_vec();
        let suberror = internal.suberror;

        let (regs, bytes) = match self.rip_bytes() {
            Ok(v) => v,
            Err(e) => {
                return Some(format!(
                    "vCPU {}: KVM internal error (suberror {suberror}, data {data:x?}); cannot read RIP: {e}",
                    self.id
                ))
            }
        };
        let mut regs = regs;
        let opcode = bytes.first().filter(|_| self.complete_unemulated);
        match opcode {
            Some(&OPCODE_INT3) => {
                // int3 is a trap: the #BP handler sees RIP after the instruction.
                regs.rip += 1;
                let injected = self.fd.set_regs(&regs).and_then(|_| {
                    let mut events = self.fd.get_vcpu_events()?;
                    events.exception.injected = 1;
                    events.exception.nr = VECTOR_BP;
                    events.exception.has_error_code = 0;
                    events.exception.pending = 0;
                    events.flags = 0;
                    self.fd.set_vcpu_events(&events)
                });
                if let Err(e) = injected {
                    return Some(format!("vCPU {}: cannot inject #BP for int3: {}", self.id, io_err(e)));
                }
                self.count_fixup("int3");
                None
            }
            Some(&OPCODE_FWAIT) => {
                // fwait only waits for pending x87 exceptions; the kernel masks them.
                regs.rip += 1;
                if let Err(e) = self.fd.set_regs(&regs) {
                    return Some(format!("vCPU {}: cannot skip fwait: {}", self.id, io_err(e)));
                }
                self.count_fixup("fwait");
                None
            }
            _ => Some(format!(
                "vCPU {}: KVM internal error (suberror {suberror}, data {data:x?}) at RIP {:#x}, bytes at RIP: {}",
                self.id,
                regs.rip,
                hex(&bytes)
            )),
        }
    }

    fn count_fixup(&mut self, what: &str) {
        self.fixups += 1;
        if self.fixups == 1 {
            log::info!(
                "vCPU {}: completing `{what}` the host cannot run at CPL0 (logged once)",
                self.id
            );
        }
    }

    /// The registers and up to 16 instruction bytes at RIP (translated through the guest's page
    /// tables).
    fn rip_bytes(&self) -> io::Result<(kvm_regs, Vec<u8>)> {
        let regs = self.fd.get_regs().map_err(io_err)?;
        let sregs = self.fd.get_sregs().map_err(io_err)?;
        let gpa = pagewalk::translate(
            &self.mem, sregs.cr0, sregs.cr3, sregs.cr4, sregs.efer, regs.rip,
        )
        .ok_or_else(|| io::Error::other(format!("RIP {:#x} is not mapped", regs.rip)))?;
        let mut bytes = Vec::with_capacity(16);
        for i in 0..16 {
            match self.mem.read_obj::<u8>(GuestAddress(gpa + i)) {
                Ok(b) => bytes.push(b),
                Err(_) => break,
            }
        }
        Ok((regs, bytes))
    }

    fn describe_rip(&self) -> String {
        match self.rip_bytes() {
            Ok((regs, bytes)) => format!(" at RIP {:#x}, bytes at RIP: {}", regs.rip, hex(&bytes)),
            Err(e) => format!(" ({e})"),
        }
    }

    /// Called on each watchdog signal: a vCPU halted with interrupts disabled, or one whose
    /// registers have not moved without a single exit for [`STUCK_PROBES`] probes, will never
    /// make progress again.
    fn probe(&mut self) -> Option<String> {
        let regs = self.fd.get_regs().ok()?;
        let halted = self
            .fd
            .get_mp_state()
            .is_ok_and(|s| s.mp_state == KVM_MP_STATE_HALTED);
        let w = &mut self.watchdog;
        if halted && regs.rflags & RFLAGS_IF == 0 {
            w.halted_probes += 1;
        } else {
            w.halted_probes = 0;
        }
        let now = (regs.rip, regs.rcx, regs.rdi);
        if !halted
            && w.exits_since_probe == 0
            && w.last == Some(now)
            && regs.rflags & RFLAGS_IF == 0
        {
            w.stuck_probes += 1;
        } else {
            w.stuck_probes = 0;
        }
        w.last = Some(now);
        w.exits_since_probe = 0;
        if w.halted_probes >= HALTED_PROBES {
            return Some(format!(
                "vCPU {}: the guest halted with interrupts disabled at RIP {:#x} and will never wake up \
                 (without ACPI a guest cannot power off: end it with `reboot -f` and reboot=k)",
                self.id, regs.rip
            ));
        }
        if w.stuck_probes >= STUCK_PROBES {
            return Some(format!(
                "vCPU {}: no progress with interrupts disabled{}",
                self.id,
                self.describe_rip()
            ));
        }
        None
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn set_lvt_mode(regs: &mut [std::os::raw::c_char; 1024], offset: usize, mode: u32) {
    let mut raw = [0u8; 4];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = regs[offset + i] as u8;
    }
    let value = (u32::from_le_bytes(raw) & !0x700) | (mode << 8);
    for (i, b) in value.to_le_bytes().iter().enumerate() {
        regs[offset + i] = *b as std::os::raw::c_char;
    }
}

fn boot_msrs() -> Msrs {
    let entry = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    let entries = [
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_TSC, 0),
        entry(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
    ];
    // The entry count is a constant far below the FAM limit.
    Msrs::from_entries(&entries).expect("boot MSR list fits")
}

fn segment(index: usize) -> kvm_segment {
    let (flags, base, limit) = GDT[index];
    let raw = gdt_entry(flags, base, limit);
    let g = ((raw >> 55) & 1) as u8;
    kvm_segment {
        base: u64::from(base),
        limit: if g == 1 { (limit << 12) | 0xfff } else { limit },
        selector: (index * 8) as u16,
        type_: ((raw >> 40) & 0xf) as u8,
        present: ((raw >> 47) & 1) as u8,
        dpl: ((raw >> 45) & 0x3) as u8,
        db: ((raw >> 54) & 1) as u8,
        s: ((raw >> 44) & 1) as u8,
        l: ((raw >> 53) & 1) as u8,
        g,
        avl: ((raw >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

/// Long mode with paging on, flat segments from the boot GDT, the identity page tables.
fn boot_sregs(sregs: &mut kvm_sregs) {
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = 7;
    let code = segment(GDT_CODE);
    let data = segment(GDT_DATA);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(GDT_TSS);
    sregs.cr3 = PML4_START;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.cr0 |= X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
}

/// The 64-bit boot protocol: RIP at the entry, RSI at the zero page.
fn boot_regs(entry: u64) -> kvm_regs {
    kvm_regs {
        rflags: 0x2,
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_START,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_segments_are_flat_long_mode() {
        let cs = segment(GDT_CODE);
        assert_eq!(
            (cs.selector, cs.l, cs.db, cs.present, cs.s),
            (0x8, 1, 0, 1, 1)
        );
        assert_eq!(cs.limit, 0xffff_ffff);
        let ds = segment(GDT_DATA);
        assert_eq!((ds.selector, ds.l, ds.db, ds.type_), (0x10, 0, 1, 3));
        let tr = segment(GDT_TSS);
        assert_eq!((tr.selector, tr.type_, tr.s), (0x18, 0xb, 0));
    }

    #[test]
    fn lvt_mode_is_set_without_touching_other_bits() {
        let mut regs = [0 as std::os::raw::c_char; 1024];
        regs[APIC_LVT0] = 0x10u8 as std::os::raw::c_char;
        regs[APIC_LVT0 + 2] = 0x01;
        set_lvt_mode(&mut regs, APIC_LVT0, APIC_MODE_EXTINT);
        assert_eq!(regs[APIC_LVT0] as u8, 0x10);
        assert_eq!(regs[APIC_LVT0 + 1] as u8, 0x07);
        assert_eq!(regs[APIC_LVT0 + 2] as u8, 0x01);
    }

    #[test]
    fn boot_registers_follow_the_protocol() {
        let r = boot_regs(0x100_0000);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x100_0000, ZERO_PAGE_START, 2));
        let mut s = kvm_sregs::default();
        boot_sregs(&mut s);
        assert_eq!(s.cr3, PML4_START);
        assert_ne!(s.cr0 & X86_CR0_PG, 0);
        assert_ne!(s.efer & EFER_LMA, 0);
    }

    #[test]
    fn fault_messages_show_instruction_bytes_in_hex() {
        assert_eq!(hex(&[0xcc, 0x9b, 0x0f]), "cc 9b 0f");
    }
}
