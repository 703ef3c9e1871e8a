//! `driver-guest`: a bare-metal KVM guest program that runs the `vnet-driver` crate against
//! the VMM's virtio-net device, through real ioeventfd kicks and irqfd interrupts.
//!
//! The VMM boots it like a vmlinux (`vmm --kernel driver-guest --net TAP --cmdline "…"`): an
//! ELF linked at 1 MiB, entered in 64-bit mode. It sets up its own page tables, GDT/TSS, IDT,
//! the local APIC and the IOAPIC pin of the device's GSI (from `virtio_mmio.device=` on its
//! command line) — or, with `transport=pci`, finds the virtio-net function on PCI bus 0 and
//! aims its MSI-X vectors at the local APIC (`pci.rs`) — brings the device up with the knobs on its command line, runs one workload
//! (`tx=N`, `echo=N`, `rx=N` or `fwd=N`), prints one JSON result line starting with `{"driver":` on COM1 and
//! resets through the i8042, which ends the VM with status 0.
//!
//! With `calibrate=N` it measures this host's kick, no-op exit and interrupt costs instead
//! (`probe.rs`) and prints a `{"calibrate":` line (see `docs/driver-guest.md`, "calibrate=N").
//!
//! With `hostile=…` it misprograms the device on purpose instead (see `hostile.rs`), then
//! resets the machine the same way: the VMM must refuse the queue and still end by itself.
//!
//! With `ring=3` the driver loop runs in user mode (CPL3): the device window, rings and
//! buffers are mapped user-accessible, and only interrupt entry, set-up and the console run in
//! kernel mode. On a host that emulates guest kernel mode (KVM's PVM module) that is the
//! difference between ~2 M instructions/s and native speed.
//!
//! Built for `x86_64-unknown-none` only (`resources/build-guest.sh`); the host build is a stub.
//!
//! This file holds the program's entries: `kmain` (called by `_start` in `arch/entry.rs`), the
//! trap handler and the panic handler.

#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
extern crate alloc;

#[cfg(target_os = "none")]
mod arch;
#[cfg(target_os = "none")]
mod hostile;
#[cfg(target_os = "none")]
mod memory;
#[cfg(target_os = "none")]
mod pci;
#[cfg(target_os = "none")]
mod probe;
#[cfg(target_os = "none")]
mod run;
#[cfg(target_os = "none")]
mod sys;

#[cfg(target_os = "none")]
use arch::{apic, cpu, entry, TrapFrame, DEVICE_VECTOR};
#[cfg(target_os = "none")]
use vnet_baremetal::cmdline::{self, Ring};

/// Size of the user-mode stack (`ring=3`).
#[cfg(target_os = "none")]
const USER_STACK_SIZE: usize = 128 * 1024;
/// RFLAGS in user mode: interrupts on (bit 1 is always set).
#[cfg(target_os = "none")]
const USER_RFLAGS: u64 = 0x202;

/// Offsets in the zero page (Linux `struct boot_params`).
#[cfg(target_os = "none")]
const BP_E820_ENTRIES: u64 = 0x1e8;
#[cfg(target_os = "none")]
const BP_CMD_LINE_PTR: u64 = 0x228;
#[cfg(target_os = "none")]
const BP_E820_TABLE: u64 = 0x2d0;
#[cfg(target_os = "none")]
const E820_ENTRY_SIZE: u64 = 20;
#[cfg(target_os = "none")]
const E820_MAX_ENTRIES: u64 = 128;
#[cfg(target_os = "none")]
const E820_RAM: u32 = 1;
#[cfg(target_os = "none")]
const CMDLINE_MAX: usize = 2048;

#[cfg(target_os = "none")]
extern "C" {
    static __image_end: u8;
}

/// What the zero page says.
#[cfg(target_os = "none")]
struct Boot {
    cmdline: &'static str,
    /// End of the RAM range that holds the image.
    ram_end: u64,
}

#[cfg(target_os = "none")]
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
#[cfg(target_os = "none")]
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
        Err(e) => sys::fail_early(&alloc::format!("{e}")),
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
            sys::fail_early(&alloc::format!("transport=pci: {e}"));
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
                sys::fail_early("no memory for the user stack");
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
#[cfg(target_os = "none")]
extern "C" fn user_main(options: *const cmdline::Options) -> ! {
    // SAFETY: `kmain` passes a leaked, never-mutated `Options`.
    crate::run::main(unsafe { &*options })
}

/// Every exception and the service `ud2` end here (in kernel mode, interrupts off).
#[cfg(target_os = "none")]
pub extern "C" fn trap(frame: &mut TrapFrame) {
    if frame.vector == 6 && frame.rip == entry::service_ud2 as *const () as u64 {
        frame.rax = sys::dispatch(frame.rax, frame.rsi, frame.rdx);
        frame.rip += 2;
        return;
    }
    sys::fatal_exception(frame);
}

#[cfg(target_os = "none")]
#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    use core::fmt::Write;
    let mut line = sys::LineBuf::new();
    let _ = write!(line, "{}", info.message());
    let mut out = sys::LineBuf::new();
    let msg = core::str::from_utf8(line.as_bytes()).unwrap_or("panic");
    let _ = write!(
        out,
        "{{\"driver\":{{\"status\":\"error\",\"error\":\"panic: "
    );
    for c in msg.chars() {
        let c = if c == '"' || c == '\\' || c.is_control() {
            '\''
        } else {
            c
        };
        let _ = out.write_char(c);
    }
    let _ = out.write_str("\"}}\n");
    sys::write(out.as_bytes());
    sys::power_off()
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "driver-guest runs inside a VM: build it for x86_64-unknown-none \
         (resources/build-guest.sh prints driver_guest=PATH) and boot it with `vmm --kernel PATH --net TAP`"
    );
    std::process::exit(2);
}
