//! The x86-64 machine: entry from the VMM, descriptor and page tables, interrupt controllers,
//! traps, and the switch to user mode.
//!
//! The VMM enters `_start` in 64-bit mode with paging on, interrupts off and RSI pointing at
//! the Linux zero page (`boot_params`). Everything set up here runs once, in kernel mode;
//! afterwards kernel mode only runs interrupt entries (a handful of instructions each) and the
//! services of [`crate::sys`].

pub mod apic;
pub mod cpu;
pub mod entry;

use core::sync::atomic::AtomicU64;

use vnet_baremetal::cmdline::{self, Ring};

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

/// Size of the boot stack (kernel mode; the driver loop's stack in `ring=0`).
pub const BOOT_STACK_SIZE: usize = 128 * 1024;
/// Size of the user-mode stack (`ring=3`).
const USER_STACK_SIZE: usize = 128 * 1024;
/// RFLAGS in user mode: interrupts on (bit 1 is always set).
const USER_RFLAGS: u64 = 0x202;

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

/// Offsets in the zero page (Linux `struct boot_params`).
const BP_E820_ENTRIES: u64 = 0x1e8;
const BP_CMD_LINE_PTR: u64 = 0x228;
const BP_E820_TABLE: u64 = 0x2d0;
const E820_ENTRY_SIZE: u64 = 20;
const E820_MAX_ENTRIES: u64 = 128;
const E820_RAM: u32 = 1;
const CMDLINE_MAX: usize = 2048;

extern "C" {
    static __image_end: u8;
}

/// What the zero page says.
struct Boot {
    cmdline: &'static str,
    /// End of the RAM range that holds the image.
    ram_end: u64,
}

fn read_boot(zero_page: u64, image_end: u64) -> Boot {
    // SAFETY: the VMM passes the zero page's address in RSI; it and the command line it points
    // at are identity-mapped, written before entry, and never written again. Every read stays
    // inside the 4 KiB zero page or the 2 KiB command line limit.
    unsafe {
        let ptr = core::ptr::read_unaligned((zero_page + BP_CMD_LINE_PTR) as *const u32);
        let cmdline = if ptr == 0 {
            ""
        } else {
            let bytes = core::slice::from_raw_parts(ptr as usize as *const u8, CMDLINE_MAX);
            let len = bytes.iter().position(|&b| b == 0).unwrap_or(CMDLINE_MAX);
            core::str::from_utf8(&bytes[..len]).unwrap_or("")
        };
        let entries =
            u64::from(*((zero_page + BP_E820_ENTRIES) as *const u8)).min(E820_MAX_ENTRIES);
        let mut ram_end = 0;
        for i in 0..entries {
            let e = zero_page + BP_E820_TABLE + i * E820_ENTRY_SIZE;
            let addr = core::ptr::read_unaligned(e as *const u64);
            let size = core::ptr::read_unaligned((e + 8) as *const u64);
            let kind = core::ptr::read_unaligned((e + 16) as *const u32);
            if kind == E820_RAM && addr <= image_end && image_end < addr.saturating_add(size) {
                ram_end = addr + size;
            }
        }
        Boot { cmdline, ram_end }
    }
}

/// The Rust entry, called by `_start` on the boot stack.
pub extern "C" fn kmain(zero_page: u64) -> ! {
    cpu::init();
    let image_end = core::ptr::addr_of!(__image_end) as u64;
    let boot = read_boot(zero_page, image_end);
    // The VMM's memory map keeps RAM below its MMIO hole; without an e820 entry assume 32 MiB.
    let ram_end = if boot.ram_end > image_end {
        boot.ram_end.min(cpu::MMIO_START)
    } else {
        32 << 20
    };
    crate::memory::init(image_end, ram_end);
    let options = match cmdline::parse(boot.cmdline) {
        Ok(o) => o,
        Err(e) => crate::run::fail_early(&alloc::format!("{e}")),
    };
    // virtio-pci signals through MSI-X, not an IOAPIC pin.
    let gsi = match options.transport {
        cmdline::TransportChoice::Mmio => options.device.map(|d| d.gsi),
        cmdline::TransportChoice::Pci => None,
    };
    apic::init(gsi, DEVICE_VECTOR);
    if options.transport == cmdline::TransportChoice::Pci && options.hostile.is_none() {
        // Port I/O (configuration space) is kernel-only: find and set the function up here.
        if let Err(e) = crate::pci::init(apic::apic_id()) {
            crate::run::fail_early(&alloc::format!("transport=pci: {e}"));
        }
    }
    let options: &'static cmdline::Options =
        alloc::boxed::Box::leak(alloc::boxed::Box::new(options));
    match options.ring {
        Ring::Kernel => {
            cpu::enable_interrupts();
            crate::run::main(options)
        }
        Ring::User => {
            let Some(stack) = crate::memory::alloc_pages(USER_STACK_SIZE / 4096) else {
                crate::run::fail_early("no memory for the user stack");
            };
            // Entered as if called: the return-address slot keeps the ABI's stack alignment.
            let top = stack + USER_STACK_SIZE as u64 - 8;
            // SAFETY: `user_main` never returns; its stack is fresh memory of this program,
            // mapped user-accessible like everything else; `options` is leaked, so it lives on.
            unsafe {
                entry::enter_user(
                    user_main as *const () as u64,
                    options as *const cmdline::Options as u64,
                    top,
                    USER_RFLAGS,
                )
            }
        }
    }
}

/// The user-mode entry (`ring=3`).
extern "C" fn user_main(options: *const cmdline::Options) -> ! {
    // SAFETY: `kmain` passes a leaked, never-mutated `Options`.
    crate::run::main(unsafe { &*options })
}
