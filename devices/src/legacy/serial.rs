//! COM1: vm-superio's 16550 model on the port bus, its interrupt line an irqfd.

use std::io::{self, Write};

use vm_superio::{Serial as Uart, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::BusDevice;

/// A [`Trigger`] that writes an eventfd; the VMM registers that eventfd as an irqfd, so raising
/// the UART interrupt never leaves the kernel.
#[derive(Debug)]
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// A 16550 UART whose transmitter writes to `W` (the VMM's stdout).
pub struct Serial<W: Write + Send> {
    uart: Uart<EventFdTrigger, vm_superio::serial::NoEvents, W>,
}

impl<W: Write + Send> Serial<W> {
    /// A UART that raises its interrupt by writing `irq` and sends its output to `out`.
    pub fn new(irq: EventFd, out: W) -> Self {
        Serial {
            uart: Uart::new(EventFdTrigger(irq), out),
        }
    }

    /// Feeds bytes typed on the host into the receive FIFO. Returns how many fit; the rest must
    /// be offered again later (the FIFO holds 64 bytes).
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.uart
            .enqueue_raw_bytes(bytes)
            .map_err(|e| io::Error::other(format!("serial input: {e:?}")))
    }

    /// Free space in the receive FIFO.
    pub fn input_capacity(&self) -> usize {
        self.uart.fifo_capacity()
    }

    /// The output sink (for tests).
    pub fn output(&self) -> &W {
        self.uart.writer()
    }
}

impl<W: Write + Send> BusDevice for Serial<W> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Ok(off), Some(first)) = (u8::try_from(offset), data.first_mut()) {
            *first = self.uart.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(off), Some(&value)) = (u8::try_from(offset), data.first()) {
            if let Err(e) = self.uart.write(off, value) {
                // Output to a closed stdout must not stop the guest.
                log::debug!("serial write at offset {off}: {e:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transmit_reaches_the_sink_and_raises_the_interrupt() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut serial = Serial::new(irq.try_clone().unwrap(), Vec::new());
        // Enable the THR-empty interrupt (IER bit 1), then send two bytes.
        serial.write(1, &[0x02]);
        serial.write(0, b"o");
        serial.write(0, b"k");
        assert_eq!(serial.output().as_slice(), b"ok");
        assert!(irq.read().unwrap() >= 1);
    }

    #[test]
    fn input_is_read_back_by_the_guest() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut serial = Serial::new(irq, Vec::new());
        assert_eq!(serial.enqueue_input(b"x").unwrap(), 1);
        let mut lsr = [0u8];
        serial.read(5, &mut lsr);
        assert_eq!(lsr[0] & 1, 1, "data-ready bit");
        let mut rbr = [0u8];
        serial.read(0, &mut rbr);
        assert_eq!(rbr[0], b'x');
    }
}
