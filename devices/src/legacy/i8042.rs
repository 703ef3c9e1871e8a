//! The i8042 keyboard controller, reduced to what a guest without ACPI needs: status reads that
//! say "nothing pending" (0, not 0xff, or Linux polls for seconds at reboot) and the CPU-reset
//! command (0xfe to port 0x64), which is how a `reboot=k` guest ends the VM.

use vm_superio::I8042Device;
use vmm_sys_util::eventfd::EventFd;

use super::EventFdTrigger;
use crate::BusDevice;

/// The controller, registered on ports 0x60..=0x64 (the command/status register is offset 4).
pub struct I8042 {
    inner: I8042Device<EventFdTrigger>,
}

impl I8042 {
    /// A controller that writes `reset_evt` when the guest asks for a CPU reset.
    pub fn new(reset_evt: EventFd) -> Self {
        I8042 {
            inner: I8042Device::new(EventFdTrigger(reset_evt)),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Ok(off), Some(first)) = (u8::try_from(offset), data.first_mut()) {
            *first = self.inner.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(off), Some(&value)) = (u8::try_from(offset), data.first()) {
            if let Err(e) = self.inner.write(off, value) {
                log::error!("i8042: cannot signal the reset event: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_signals_and_status_reads_zero() {
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut dev = I8042::new(evt.try_clone().unwrap());
        let mut status = [0xffu8];
        dev.read(4, &mut status);
        assert_eq!(status[0], 0);
        dev.write(4, &[0xaa]);
        assert!(evt.read().is_err(), "other commands must not reset");
        dev.write(4, &[0xfe]);
        assert_eq!(evt.read().unwrap(), 1);
    }
}
