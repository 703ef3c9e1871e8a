//! The privileged services the driver loop needs — console output, waiting for an interrupt,
//! power-off — callable from either ring. In kernel mode they run directly; from user mode a
//! call goes through `ud2` at a known address, which the #UD handler turns into the service
//! (this host's KVM mis-emulates `syscall` and refuses `int n` from user mode, but delivers
//! exceptions correctly).

use alloc::string::String;
use core::fmt::Write;
use core::sync::atomic::Ordering;

use vnet_baremetal::report;

use crate::arch::{cpu, entry, TrapFrame, DEVICE_IRQS};

const COM1_THR: u16 = 0x3f8;
const I8042_COMMAND: u16 = 0x64;
const I8042_RESET_CPU: u8 = 0xfe;

/// Service numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
enum Service {
    /// Write bytes (pointer, length) to COM1.
    Write = 1,
    /// Halt until the next interrupt unless the device-interrupt count differs from the
    /// argument.
    Wait = 2,
    /// Reset through the i8042 (the VMM then exits with status 0).
    PowerOff = 3,
}

fn call(service: Service, a: u64, b: u64) -> u64 {
    if cpu::cpl() == 0 {
        dispatch(service as u64, a, b)
    } else {
        // SAFETY: `service_trap` only executes `ud2`, which the #UD handler completes as
        // `dispatch(rax, rsi, rdx)` and resumes after; registers follow the C ABI.
        unsafe { entry::service_trap(service as u64, a, b) }
    }
}

/// Writes `bytes` to the console.
pub fn write(bytes: &[u8]) {
    call(Service::Write, bytes.as_ptr() as u64, bytes.len() as u64);
}

/// Waits for an interrupt, unless the device has interrupted since the caller saw `seen`
/// interrupts. The periodic tick bounds the wait.
pub fn wait(seen: u64) {
    call(Service::Wait, seen, 0);
}

/// Ends the VM.
pub fn power_off() -> ! {
    call(Service::PowerOff, 0, 0);
    // Not reached: the reset ends the VM.
    loop {
        core::hint::spin_loop();
    }
}

/// Prints a result line with just `error` and powers off.
pub fn fail_early(error: &str) -> ! {
    let mut line = String::new();
    let _ = report::write_error(&mut line, error);
    line.push('\n');
    write(line.as_bytes());
    power_off()
}

/// Runs service `nr` in kernel mode.
pub fn dispatch(nr: u64, a: u64, b: u64) -> u64 {
    match nr {
        n if n == Service::Write as u64 => {
            // SAFETY: the caller is this program (`write` above, from either ring) passing a
            // live byte slice; all memory is identity-mapped and readable in kernel mode.
            let bytes = unsafe { core::slice::from_raw_parts(a as *const u8, b as usize) };
            for &byte in bytes {
                cpu::outb(COM1_THR, byte);
            }
            0
        }
        n if n == Service::Wait as u64 => {
            cpu::halt_if(|| DEVICE_IRQS.load(Ordering::Relaxed) == a);
            0
        }
        n if n == Service::PowerOff as u64 => {
            cpu::outb(I8042_COMMAND, I8042_RESET_CPU);
            loop {
                cpu::disable_interrupts();
                core::hint::spin_loop();
            }
        }
        _ => u64::MAX,
    }
}

/// Any exception other than a service call: report it as the result line and power off.
pub fn fatal_exception(frame: &TrapFrame) -> ! {
    let cr2: u64;
    // SAFETY: reading CR2 (the last page-fault address) has no side effects; kernel mode.
    unsafe { core::arch::asm!("mov {}, cr2", out(reg) cr2, options(nomem, nostack)) };
    let mut line = LineBuf::new();
    let _ = writeln!(
        line,
        "{{\"driver\":{{\"status\":\"error\",\"error\":\"exception {} (error code {:#x}) at RIP {:#x} \
         CS {:#x} RSP {:#x} CR2 {:#x}\"}}}}",
        frame.vector, frame.error, frame.rip, frame.cs, frame.rsp, cr2
    );
    write(line.as_bytes());
    power_off()
}

/// A fixed-size line buffer (no heap: usable when the heap is the problem).
pub struct LineBuf {
    buf: [u8; 512],
    len: usize,
}

impl LineBuf {
    /// An empty line.
    pub fn new() -> LineBuf {
        LineBuf {
            buf: [0; 512],
            len: 0,
        }
    }

    /// The bytes written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Write for LineBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}
