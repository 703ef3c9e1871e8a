//! Descriptor tables, page tables and the trap handler.
//!
//! - Page tables: the first 4 GiB identity-mapped with 2 MiB pages, **all user-accessible**
//!   (so a user-mode driver loop reaches the device window, rings and buffers); from
//!   [`MMIO_START`] up they are uncached (device windows, IOAPIC, local APIC). This program
//!   trusts its own user-mode half: nothing here protects kernel memory from it.
//! - GDT in Linux's x86-64 layout (kernel code 0x10, data 0x18, user data 0x2b, user code 0x33,
//!   TSS 0x40), so the host sees the selectors a Linux guest would use.
//! - TSS: only RSP0, the stack interrupts from user mode switch to.
//! - IDT: the 32 exceptions, the device vector, the MSI-X vectors, the timer vector and the
//!   spurious vector.

use core::arch::asm;
use core::ptr::addr_of_mut;

use super::entry;
use super::{DEVICE_VECTOR, KERNEL_CS, KERNEL_DS, MSIX_VECTOR_BASE, SPURIOUS_VECTOR, TIMER_VECTOR};

/// TSS selector.
const TSS_SEL: u16 = 0x40;
/// Where device windows and the interrupt controllers start (the VMM's MMIO hole).
pub const MMIO_START: u64 = 0xd000_0000;

const PTE_PRESENT: u64 = 1;
const PTE_WRITE: u64 = 1 << 1;
const PTE_USER: u64 = 1 << 2;
const PTE_PWT: u64 = 1 << 3;
const PTE_PCD: u64 = 1 << 4;
const PTE_HUGE: u64 = 1 << 7;

/// Interrupt stack for entries from user mode (TSS.RSP0).
const IRQ_STACK_SIZE: usize = 16 * 1024;

#[repr(C, align(4096))]
struct PageTables {
    pml4: [u64; 512],
    pdpt: [u64; 512],
    pd: [[u64; 512]; 4],
}

#[repr(C, align(16))]
struct Tables {
    gdt: [u64; 10],
    /// 104-byte 64-bit TSS, as 32-bit words (its 64-bit fields are only 4-aligned).
    tss: [u32; 26],
    idt: [[u64; 2]; 256],
}

#[repr(C, align(16))]
struct Stack([u8; IRQ_STACK_SIZE]);

static mut PAGE_TABLES: PageTables = PageTables {
    pml4: [0; 512],
    pdpt: [0; 512],
    pd: [[0; 512]; 4],
};
static mut TABLES: Tables = Tables {
    gdt: [0; 10],
    tss: [0; 26],
    idt: [[0; 2]; 256],
};
static mut IRQ_STACK: Stack = Stack([0; IRQ_STACK_SIZE]);

#[repr(C, packed)]
struct DescriptorPointer {
    limit: u16,
    base: u64,
}

/// Builds and loads the page tables, GDT, TSS and IDT. Runs once, in kernel mode, with
/// interrupts off.
pub fn init() {
    // SAFETY: called once at start-up, before interrupts are enabled and before anything else
    // references these statics, so the mutable borrows are exclusive.
    let (pt, t, stack) = unsafe {
        (
            &mut *addr_of_mut!(PAGE_TABLES),
            &mut *addr_of_mut!(TABLES),
            &*addr_of_mut!(IRQ_STACK),
        )
    };
    build_page_tables(pt);
    build_gdt(t, stack);
    build_idt(t);
    // SAFETY: the tables were just built as `load` needs, and interrupts are off.
    unsafe { load(pt, t) };
}

/// Identity-maps the first 4 GiB in 2 MiB pages, user-accessible, uncached from
/// `MMIO_START` up.
fn build_page_tables(pt: &mut PageTables) {
    let flags = PTE_PRESENT | PTE_WRITE | PTE_USER;
    for (gib, pd) in pt.pd.iter_mut().enumerate() {
        for (i, entry) in pd.iter_mut().enumerate() {
            let addr = ((gib as u64) << 30) | ((i as u64) << 21);
            let cache = if addr >= MMIO_START {
                PTE_PCD | PTE_PWT
            } else {
                0
            };
            *entry = addr | flags | PTE_HUGE | cache;
        }
        pt.pdpt[gib] = pd.as_ptr() as u64 | flags;
    }
    pt.pml4[0] = pt.pdpt.as_ptr() as u64 | flags;
}

/// The GDT (kernel and user segments, the TSS's descriptor) and the TSS, whose RSP0 is the
/// top of `stack`.
fn build_gdt(t: &mut Tables, stack: &Stack) {
    t.gdt = [
        0,
        0x00cf_9b00_0000_ffff, // 0x08: 32-bit kernel code (Linux's KERNEL32_CS, unused)
        0x00af_9b00_0000_ffff, // 0x10: 64-bit kernel code
        0x00cf_9300_0000_ffff, // 0x18: kernel data
        0x00cf_fb00_0000_ffff, // 0x20: 32-bit user code (unused)
        0x00cf_f300_0000_ffff, // 0x28: user data
        0x00af_fb00_0000_ffff, // 0x30: 64-bit user code
        0,
        0, // 0x40: TSS, low half (below)
        0, // TSS, high half
    ];
    let stack_top = stack.0.as_ptr() as u64 + IRQ_STACK_SIZE as u64;
    t.tss = [0; 26];
    t.tss[1] = stack_top as u32; // RSP0
    t.tss[2] = (stack_top >> 32) as u32;
    t.tss[25] = 104 << 16; // I/O map base past the limit: no I/O bitmap
    let base = t.tss.as_ptr() as u64;
    let limit = 103u64;
    t.gdt[8] = (limit & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | (0x89 << 40) // present, available 64-bit TSS
        | (((limit >> 16) & 0xf) << 48)
        | (((base >> 24) & 0xff) << 56);
    t.gdt[9] = base >> 32;
}

/// The IDT: the exception stubs, the device's, the MSI-X vectors', the timer's and the
/// spurious vector's entries.
fn build_idt(t: &mut Tables) {
    // SAFETY: `exception_stubs` is an immutable table of 32 code addresses in the image.
    let stubs = unsafe { &entry::exception_stubs };
    for (vector, &stub) in stubs.iter().enumerate() {
        t.idt[vector] = gate(stub);
    }
    t.idt[usize::from(DEVICE_VECTOR)] = gate(entry::irq_device as *const () as u64);
    // SAFETY: `msix_stubs` is an immutable table of MSIX_VECTORS code addresses in the image.
    let msix = unsafe { &entry::msix_stubs };
    for (i, &stub) in msix.iter().enumerate() {
        t.idt[usize::from(MSIX_VECTOR_BASE) + i] = gate(stub);
    }
    t.idt[usize::from(TIMER_VECTOR)] = gate(entry::irq_timer as *const () as u64);
    t.idt[usize::from(SPURIOUS_VECTOR)] = gate(entry::irq_spurious as *const () as u64);
}

/// Loads the page tables, GDT, IDT and TSS, and reloads the segment registers.
///
/// # Safety
///
/// `pt` and `t` are the tables `build_page_tables`, `build_gdt` and `build_idt` built, in
/// statics (they stay in use), and interrupts are off.
unsafe fn load(pt: &PageTables, t: &Tables) {
    let gdtr = DescriptorPointer {
        limit: (core::mem::size_of_val(&t.gdt) - 1) as u16,
        base: t.gdt.as_ptr() as u64,
    };
    let idtr = DescriptorPointer {
        limit: (core::mem::size_of_val(&t.idt) - 1) as u16,
        base: t.idt.as_ptr() as u64,
    };
    let cr3 = pt.pml4.as_ptr() as u64;
    // SAFETY: the page tables identity-map all memory this program and the VMM's boot
    // structures use (as the VMM's tables did), so execution continues at the same addresses;
    // the GDT keeps a 64-bit code segment at the selector reloaded by the far return and data
    // segments for the others; the TSS descriptor is valid and not busy; the IDT's gates point
    // at the stubs in this image. Interrupts are off throughout.
    unsafe {
        asm!("mov cr3, {}", in(reg) cr3, options(nostack));
        asm!(
            "lgdt [{gdtr}]",
            "lidt [{idtr}]",
            "push {cs}",
            "lea {tmp}, [rip + 2f]",
            "push {tmp}",
            "retfq",
            "2:",
            "mov {tmp:e}, {ds}",
            "mov ds, {tmp:e}",
            "mov es, {tmp:e}",
            "mov ss, {tmp:e}",
            "xor {tmp:e}, {tmp:e}",
            "mov fs, {tmp:e}",
            "mov gs, {tmp:e}",
            "mov {tmp:e}, {tss}",
            "ltr {tmp:x}",
            gdtr = in(reg) &gdtr,
            idtr = in(reg) &idtr,
            cs = const KERNEL_CS,
            ds = const KERNEL_DS,
            tss = const TSS_SEL,
            tmp = out(reg) _,
        );
    }
}

/// A present, DPL 0, 64-bit interrupt gate (interrupts off on entry) to `handler`.
fn gate(handler: u64) -> [u64; 2] {
    let low =
        (handler & 0xffff) | (KERNEL_CS << 16) | (0x8e << 40) | (((handler >> 16) & 0xffff) << 48);
    [low, handler >> 32]
}

/// The current privilege level.
pub fn cpl() -> u8 {
    let cs: u64;
    // SAFETY: reading CS has no side effects.
    unsafe { asm!("mov {:r}, cs", out(reg) cs, options(nomem, nostack, preserves_flags)) };
    (cs & 3) as u8
}

/// The time-stamp counter.
pub fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc only reads the TSC (CR4.TSD is clear, so also in user mode).
    unsafe {
        asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// The time-stamp counter, read after every earlier instruction has completed and before any
/// later one starts (`lfence; rdtsc; lfence`): for timing one operation.
pub fn rdtsc_fenced() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: lfence and rdtsc only order execution and read the TSC (CR4.TSD is clear, so
    // also in user mode).
    unsafe {
        asm!(
            "lfence",
            "rdtsc",
            "lfence",
            out("eax") lo,
            out("edx") hi,
            options(nostack, preserves_flags)
        )
    };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// CPUID leaf `leaf`: (eax, ebx, ecx, edx).
pub fn cpuid(leaf: u32) -> (u32, u32, u32, u32) {
    let r = core::arch::x86_64::__cpuid(leaf);
    (r.eax, r.ebx, r.ecx, r.edx)
}

/// Writes `value` to I/O port `port`. Kernel mode only.
pub fn outb(port: u16, value: u8) {
    // SAFETY: the ports this program writes (COM1's THR, the PICs' masks, the i8042 command
    // port) have no effect on memory; the caller runs in kernel mode.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    };
}

/// Halts until the next interrupt if `still_idle()` (checked with interrupts off) says there
/// is nothing to do. Returns with interrupts enabled (the driver loop runs with them on).
/// Kernel mode only.
pub fn halt_if(still_idle: impl FnOnce() -> bool) {
    // SAFETY: cli/sti/hlt only change the interrupt flag and wait; `sti; hlt` lets an interrupt
    // that became pending after the check wake the `hlt` (sti's one-instruction shadow). The
    // IDT and interrupt controllers are set up before the first call.
    unsafe {
        asm!("cli", options(nomem, nostack));
        if still_idle() {
            asm!("sti", "hlt", options(nomem, nostack));
        } else {
            asm!("sti", options(nomem, nostack));
        }
    }
}

/// Enables interrupts. Kernel mode only.
pub fn enable_interrupts() {
    // SAFETY: the IDT, TSS and interrupt controllers are set up before this is called.
    unsafe { asm!("sti", options(nomem, nostack)) };
}

/// Disables interrupts. Kernel mode only.
pub fn disable_interrupts() {
    // SAFETY: cli only clears the interrupt flag.
    unsafe { asm!("cli", options(nomem, nostack)) };
}
