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
