//! Assembly: the ELF entry point, the interrupt and exception stubs, the user-mode entry and the
//! `ud2` service trampoline.
//!
//! Kept to the few instructions that must be assembly: on hosts that emulate kernel mode every
//! instruction here costs about half a microsecond.

use core::arch::global_asm;

use super::{DEVICE_IRQS, KERNEL_CS, KERNEL_DS, MSIX_IRQS, TICKS};

extern "C" {
    /// The 32 exception stubs, in vector order (each pushes its vector and a zero error code
    /// when the CPU pushes none, then enters [`crate::trap`]).
    pub static exception_stubs: [u64; 32];
    /// Device interrupt: counts in [`DEVICE_IRQS`], EOI, return.
    pub fn irq_device();
    /// MSI-X vectors (`transport=pci`), by table entry: each counts in its [`MSIX_IRQS`] slot
    /// and in [`DEVICE_IRQS`], EOI, return.
    pub static msix_stubs: [u64; super::MSIX_VECTORS];
    /// Timer interrupt: counts in [`TICKS`], EOI, return.
    pub fn irq_timer();
    /// Spurious interrupt: return without EOI.
    pub fn irq_spurious();
    /// The `ud2` of [`service_trap`]; the trap handler recognises a service call by this RIP.
    pub fn service_ud2();
    /// Calls service `nr` with arguments `a`, `b` through a `ud2` (from user mode).
    pub fn service_trap(nr: u64, a: u64, b: u64) -> u64;
    /// Enters user mode at `entry(arg)` on the stack `stack_top`; never returns.
    pub fn enter_user(entry: u64, arg: u64, stack_top: u64, rflags: u64) -> !;
}

global_asm!(
    r#"
    .section .text.entry, "ax"
    .global _start
    .code64
_start:
    cli
    cld
    mov r12, rsi
    /* Zero .bss (the boot stack is in it, so before any call). */
    lea rdi, [rip + __bss_start]
    lea rcx, [rip + __bss_end]
    sub rcx, rdi
    shr rcx, 3
    xor eax, eax
    rep stosq
    lea rsp, [rip + {boot_stack} + {boot_stack_size}]
    xor ebp, ebp
    mov rdi, r12
    call {kmain}
2:
    cli
    hlt
    jmp 2b

    .section .text, "ax"
    .global trap_common
trap_common:
    push rax
    push rbx
    push rcx
    push rdx
    push rsi
    push rdi
    push rbp
    push r8
    push r9
    push r10
    push r11
    push r12
    push r13
    push r14
    push r15
    mov rdi, rsp
    call {trap}
    pop r15
    pop r14
    pop r13
    pop r12
    pop r11
    pop r10
    pop r9
    pop r8
    pop rbp
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rbx
    pop rax
    add rsp, 16
    iretq

    .macro EXC_NOERR num
exc_\num:
    push 0
    push \num
    jmp trap_common
    .endm
    .macro EXC_ERR num
exc_\num:
    push \num
    jmp trap_common
    .endm

    EXC_NOERR 0
    EXC_NOERR 1
    EXC_NOERR 2
    EXC_NOERR 3
    EXC_NOERR 4
    EXC_NOERR 5
    EXC_NOERR 6
    EXC_NOERR 7
    EXC_ERR 8
    EXC_NOERR 9
    EXC_ERR 10
    EXC_ERR 11
    EXC_ERR 12
    EXC_ERR 13
    EXC_ERR 14
    EXC_NOERR 15
    EXC_NOERR 16
    EXC_ERR 17
    EXC_NOERR 18
    EXC_NOERR 19
    EXC_NOERR 20
    EXC_ERR 21
    EXC_NOERR 22
    EXC_NOERR 23
    EXC_NOERR 24
    EXC_NOERR 25
    EXC_NOERR 26
    EXC_NOERR 27
    EXC_NOERR 28
    EXC_ERR 29
    EXC_ERR 30
    EXC_NOERR 31

    .global irq_device
irq_device:
    push rax
    inc qword ptr [rip + {device_irqs}]
    mov eax, 0xfee000b0
    mov dword ptr [rax], 0
    pop rax
    iretq

    /* One stub per MSI-X table entry, generated: EACH_MSIX m, lo, hi invokes macro m for
       the entries lo..hi-1, halving the range (the assembler nests macros at most 20 deep);
       `%(expr)` evaluates an entry number (.altmacro). */
    .altmacro
    .macro EACH_MSIX m, lo, hi
    .if \hi - \lo == 1
    \m \lo
    .elseif \hi - \lo > 1
    EACH_MSIX \m, \lo, %((\lo + \hi) / 2)
    EACH_MSIX \m, %((\lo + \hi) / 2), \hi
    .endif
    .endm
    .macro IRQ_MSIX n
irq_msix_\n:
    push rax
    inc qword ptr [rip + {msix_irqs} + 8 * \n]
    inc qword ptr [rip + {device_irqs}]
    mov eax, 0xfee000b0
    mov dword ptr [rax], 0
    pop rax
    iretq
    .endm
    .macro MSIX_STUB_ADDRESS n
    .quad irq_msix_\n
    .endm
    EACH_MSIX IRQ_MSIX, 0, {msix_vectors}
    .noaltmacro

    .global irq_timer
irq_timer:
    push rax
    inc qword ptr [rip + {ticks}]
    mov eax, 0xfee000b0
    mov dword ptr [rax], 0
    pop rax
    iretq

    .global irq_spurious
irq_spurious:
    iretq

    .global service_trap
    .global service_ud2
service_trap:
    mov rax, rdi
service_ud2:
    ud2
    ret

    /* enter_user(entry, arg, stack_top, rflags) */
    .global enter_user
enter_user:
    mov rax, {user_ds}
    push rax
    push rdx
    push rcx
    mov rax, {user_cs}
    push rax
    push rdi
    mov rdi, rsi
    xor esi, esi
    xor edx, edx
    xor ecx, ecx
    iretq

    .section .rodata, "a"
    .balign 8
    .global exception_stubs
exception_stubs:
    .quad exc_0, exc_1, exc_2, exc_3, exc_4, exc_5, exc_6, exc_7
    .quad exc_8, exc_9, exc_10, exc_11, exc_12, exc_13, exc_14, exc_15
    .quad exc_16, exc_17, exc_18, exc_19, exc_20, exc_21, exc_22, exc_23
    .quad exc_24, exc_25, exc_26, exc_27, exc_28, exc_29, exc_30, exc_31

    .balign 8
    .global msix_stubs
msix_stubs:
    .altmacro
    EACH_MSIX MSIX_STUB_ADDRESS, 0, {msix_vectors}
    .noaltmacro
"#,
    kmain = sym crate::kmain,
    trap = sym crate::trap,
    boot_stack = sym super::BOOT_STACK,
    boot_stack_size = const super::BOOT_STACK_SIZE,
    device_irqs = sym DEVICE_IRQS,
    msix_irqs = sym MSIX_IRQS,
    msix_vectors = const super::MSIX_VECTORS,
    ticks = sym TICKS,
    user_ds = const super::USER_DS | 3,
    user_cs = const super::USER_CS | 3,
);

// The kernel selectors are used by the Rust side; referenced here so a change of layout is
// seen in one place.
const _: () = assert!(KERNEL_CS == 0x10 && KERNEL_DS == 0x18);
