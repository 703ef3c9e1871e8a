//! The x86-64 machine: entry from the VMM, descriptor and page tables, interrupt controllers,
//! traps, and the switch to user mode.
//!
//! The VMM enters `_start` in 64-bit mode with paging on, interrupts off and RSI pointing at
//! the Linux zero page (`boot_params`). Everything set up here runs once, in kernel mode;
//! afterwards kernel mode only runs interrupt entries (a handful of instructions each) and the
//! services of [`crate::sys`]. The entries call up into the program: `_start` into
//! [`crate::kmain`], every exception into [`crate::trap`].

pub mod apic;
pub mod cpu;
pub mod entry;
pub mod mem;

use core::sync::atomic::AtomicU64;

/// The device's interrupt vector.
pub const DEVICE_VECTOR: u8 = 0x30;
/// The LAPIC vector of MSI-X table entry 0 (`transport=pci`); entry `e` uses
/// `MSIX_VECTOR_BASE + e`, up to [`MSIX_VECTORS`] entries (0x50..=0x71: clear of the device,
/// timer and spurious vectors). The transport assigns entry 0 to configuration changes and
/// entry `q + 1` to queue `q` (rx `2i`, tx `2i + 1` of pair `i`, then the control queue).
pub const MSIX_VECTOR_BASE: u8 = 0x50;
/// MSI-X entries with a handler: configuration, rx and tx of up to
/// [`MAX_QUEUES`](vnet_baremetal::cmdline::MAX_QUEUES) pairs, and the control
/// queue (which sits at `2 · max_virtqueue_pairs`, so a device with up to that many pairs
/// fits whatever `queues=` asks for).
pub const MSIX_VECTORS: usize = 1 + 2 * vnet_baremetal::cmdline::MAX_QUEUES as usize + 1;
/// Entries into each MSI-X vector, by table entry (each handler also counts in
/// [`DEVICE_IRQS`], so waiting works as with the one virtio-mmio vector).
pub static MSIX_IRQS: [AtomicU64; MSIX_VECTORS] = [const { AtomicU64::new(0) }; MSIX_VECTORS];

const _: () = assert!(
    (MSIX_VECTOR_BASE as usize) > DEVICE_VECTOR as usize
        && (MSIX_VECTOR_BASE as usize) > TIMER_VECTOR as usize
        && (MSIX_VECTOR_BASE as usize) + MSIX_VECTORS <= SPURIOUS_VECTOR as usize,
    "the MSI-X vectors overlap another vector"
);

/// The local APIC timer's vector.
pub const TIMER_VECTOR: u8 = 0x40;
/// The local APIC's spurious vector.
pub const SPURIOUS_VECTOR: u8 = 0xff;

/// Entries into the device's interrupt vector (incremented by `irq_device`).
pub static DEVICE_IRQS: AtomicU64 = AtomicU64::new(0);
/// Timer ticks (incremented by `irq_timer`).
pub static TICKS: AtomicU64 = AtomicU64::new(0);

/// 64-bit kernel code selector.
pub const KERNEL_CS: u64 = 0x10;
/// Kernel data selector.
pub const KERNEL_DS: u64 = 0x18;
/// User data selector (RPL added when used).
pub const USER_DS: u64 = 0x28;
/// 64-bit user code selector (RPL added when used).
pub const USER_CS: u64 = 0x30;

/// Size of the boot stack (kernel mode; the driver loop's stack in `ring=0`).
pub const BOOT_STACK_SIZE: usize = 128 * 1024;

#[repr(C, align(16))]
pub struct BootStack([u8; BOOT_STACK_SIZE]);

/// The boot stack (in .bss, zeroed by `_start` before use).
pub static mut BOOT_STACK: BootStack = BootStack([0; BOOT_STACK_SIZE]);

/// Registers saved by `trap_common`, then the vector, the error code and the CPU's frame.
#[repr(C)]
#[derive(Debug)]
pub struct TrapFrame {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rbp: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rbx: u64,
    pub rax: u64,
    pub vector: u64,
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}
