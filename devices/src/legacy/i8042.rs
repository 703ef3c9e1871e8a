//! The i8042 keyboard controller, reduced to what a guest needs:
//! - status reads that say "nothing pending" (0x10, never 0xff, or Linux polls for seconds at
//!   reboot) and the CPU-reset command (0xfe to port 0x64), which is how a `reboot=k` guest
//!   ends the VM;
//! - enough of the controller (command byte, self-tests, keyboard ACKs) for Linux's i8042 and
//!   atkbd drivers, and [`I8042::trigger_ctrl_alt_del`], which queues the Ctrl+Alt+Del
//!   scancodes and raises the keyboard interrupt (IRQ 1), as Firecracker's `SendCtrlAltDel`
//!   does. A guest with those drivers and a VT reboots (or signals its init).
//!
//! [`I8042::keyboard_driver_ready`] tells whether a guest driver ever enabled the keyboard
//! interrupt: a guest without one (no `CONFIG_SERIO_I8042`) can never see the keys.

use std::collections::VecDeque;
use std::io;

use vmm_sys_util::eventfd::EventFd;

use crate::BusDevice;

/// Offset of the data port (0x60).
const OFS_DATA: u64 = 0;
/// Offset of the status (read) / command (write) port (0x64).
const OFS_STATUS: u64 = 4;

/// Status: a byte waits in the output buffer (port 0x60).
const SB_OUT_DATA_AVAIL: u8 = 0x01;
/// Status: the controller expects a command parameter on port 0x60.
const SB_I8042_CMD_DATA: u8 = 0x08;
/// Status: keyboard not inhibited.
const SB_KBD_ENABLED: u8 = 0x10;

/// Command byte: keyboard interrupt enabled.
const CB_KBD_INT: u8 = 0x01;
/// Command byte: POST passed (always set).
const CB_POST_OK: u8 = 0x04;
/// Command byte: keyboard clock disabled.
const CB_KBD_DISABLED: u8 = 0x10;
/// Command byte: aux (mouse) clock disabled.
const CB_AUX_DISABLED: u8 = 0x20;

const CMD_READ_CTR: u8 = 0x20;
const CMD_WRITE_CTR: u8 = 0x60;
const CMD_DISABLE_AUX: u8 = 0xa7;
const CMD_ENABLE_AUX: u8 = 0xa8;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_KBD_TEST: u8 = 0xab;
const CMD_DISABLE_KBD: u8 = 0xad;
const CMD_ENABLE_KBD: u8 = 0xae;
const CMD_READ_OUTP: u8 = 0xd0;
const CMD_WRITE_OUTP: u8 = 0xd1;
const CMD_RESET_CPU: u8 = 0xfe;

/// Keyboard commands (data port) that answer more than an ACK.
const KBD_GET_ID: u8 = 0xf2;
const KBD_RESET: u8 = 0xff;
const KBD_ACK: u8 = 0xfa;

/// Scancode set 2 make codes (the controller does not translate, as in Firecracker).
const KEY_CTRL: u16 = 0x0014;
const KEY_ALT: u16 = 0x0011;
const KEY_DEL: u16 = 0xe071;

/// Bytes the output buffer holds.
const BUF_SIZE: usize = 16;

/// Why keys could not be injected.
#[derive(Debug, thiserror::Error)]
pub enum I8042Error {
    /// The guest has not read earlier bytes.
    #[error("the i8042 output buffer is full")]
    BufferFull,
    /// Signalling IRQ 1 failed.
    #[error("cannot raise the keyboard interrupt")]
    Interrupt(#[source] io::Error),
}

/// The controller, registered on ports 0x60..=0x64 (the command/status register is offset 4).
pub struct I8042 {
    reset_evt: EventFd,
    kbd_irq: Option<EventFd>,
    status: u8,
    control: u8,
    /// The guest wrote the command byte at least once (a driver initialised the controller).
    control_written: bool,
    /// The command waiting for its parameter on the data port.
    cmd: u8,
    outp: u8,
    buf: VecDeque<u8>,
}

impl I8042 {
    /// A controller that writes `reset_evt` when the guest asks for a CPU reset.
    pub fn new(reset_evt: EventFd) -> Self {
        I8042 {
            reset_evt,
            kbd_irq: None,
            status: SB_KBD_ENABLED,
            control: CB_POST_OK | CB_KBD_INT,
            control_written: false,
            cmd: 0,
            outp: 0,
            buf: VecDeque::with_capacity(BUF_SIZE),
        }
    }

    /// Raises the keyboard interrupt (IRQ 1) by writing `evt` (registered as an irqfd).
    pub fn with_keyboard_interrupt(mut self, evt: EventFd) -> Self {
        self.kbd_irq = Some(evt);
        self
    }

    /// True once a guest driver has written the command byte with the keyboard interrupt on:
    /// only then can injected keys reach the guest.
    pub fn keyboard_driver_ready(&self) -> bool {
        self.control_written && self.control & CB_KBD_INT != 0
    }

    /// Queues Ctrl, Alt and Del key presses and interrupts the guest.
    pub fn trigger_ctrl_alt_del(&mut self) -> Result<(), I8042Error> {
        for key in [KEY_CTRL, KEY_ALT, KEY_DEL] {
            self.trigger_key(key)?;
        }
        Ok(())
    }

    fn trigger_key(&mut self, key: u16) -> Result<(), I8042Error> {
        let [prefix, code] = key.to_be_bytes();
        let needed = if prefix != 0 { 2 } else { 1 };
        if BUF_SIZE - self.buf.len() < needed {
            return Err(I8042Error::BufferFull);
        }
        if prefix != 0 {
            self.push_byte(prefix);
        }
        self.push_byte(code);
        self.trigger_kbd_interrupt()
    }

    fn trigger_kbd_interrupt(&self) -> Result<(), I8042Error> {
        if self.control & CB_KBD_INT == 0 {
            return Ok(());
        }
        match &self.kbd_irq {
            Some(evt) => evt.write(1).map_err(I8042Error::Interrupt),
            None => Ok(()),
        }
    }

    /// Appends a byte to the output buffer; a full buffer drops it (the guest is not reading).
    fn push_byte(&mut self, byte: u8) {
        if self.buf.len() < BUF_SIZE {
            self.buf.push_back(byte);
            self.status |= SB_OUT_DATA_AVAIL;
        }
    }

    fn pop_byte(&mut self) -> u8 {
        let byte = self.buf.pop_front().unwrap_or(0);
        if self.buf.is_empty() {
            self.status &= !SB_OUT_DATA_AVAIL;
        }
        byte
    }

    /// A controller command discards pending output (as Firecracker's model does).
    fn flush(&mut self) {
        self.buf.clear();
        self.status &= !SB_OUT_DATA_AVAIL;
    }

    fn command(&mut self, cmd: u8) {
        match cmd {
            CMD_RESET_CPU => {
                if let Err(e) = self.reset_evt.write(1) {
                    log::error!("i8042: cannot signal the reset event: {e}");
                }
            }
            CMD_READ_CTR => {
                self.flush();
                self.push_byte(self.control);
            }
            CMD_WRITE_CTR | CMD_WRITE_OUTP => {
                self.flush();
                self.status |= SB_I8042_CMD_DATA;
                self.cmd = cmd;
            }
            CMD_READ_OUTP => {
                self.flush();
                self.push_byte(self.outp);
            }
            CMD_SELF_TEST => {
                self.flush();
                self.push_byte(0x55);
            }
            CMD_KBD_TEST => {
                self.flush();
                self.push_byte(0x00);
            }
            CMD_DISABLE_KBD => self.control |= CB_KBD_DISABLED,
            CMD_ENABLE_KBD => self.control &= !CB_KBD_DISABLED,
            CMD_DISABLE_AUX => self.control |= CB_AUX_DISABLED,
            CMD_ENABLE_AUX => self.control &= !CB_AUX_DISABLED,
            other => log::debug!("i8042: ignored command {other:#04x}"),
        }
    }

    fn data(&mut self, value: u8) {
        if self.status & SB_I8042_CMD_DATA != 0 {
            match self.cmd {
                CMD_WRITE_CTR => {
                    self.control = value;
                    self.control_written = true;
                }
                CMD_WRITE_OUTP => self.outp = value,
                _ => {}
            }
            self.status &= !SB_I8042_CMD_DATA;
            self.cmd = 0;
            return;
        }
        // A byte for the keyboard: acknowledge it like an AT keyboard would.
        self.flush();
        self.push_byte(KBD_ACK);
        match value {
            KBD_RESET => self.push_byte(0xaa),
            KBD_GET_ID => {
                self.push_byte(0xab);
                self.push_byte(0x83);
            }
            _ => {}
        }
        if let Err(e) = self.trigger_kbd_interrupt() {
            log::warn!("i8042: {e}");
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let value = match offset {
            OFS_STATUS => self.status,
            OFS_DATA => {
                let byte = self.pop_byte();
                // More bytes queued: interrupt again so the guest reads the next one.
                if self.status & SB_OUT_DATA_AVAIL != 0 {
                    if let Err(e) = self.trigger_kbd_interrupt() {
                        log::warn!("i8042: {e}");
                    }
                }
                byte
            }
            _ => 0,
        };
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else {
            return;
        };
        match offset {
            OFS_STATUS => self.command(value),
            OFS_DATA => self.data(value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dev: &mut I8042, offset: u64) -> u8 {
        let mut b = [0xffu8];
        dev.read(offset, &mut b);
        b[0]
    }

    #[test]
    fn reset_command_signals_and_status_reads_idle() {
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut dev = I8042::new(evt.try_clone().unwrap());
        assert_eq!(
            read(&mut dev, 4),
            SB_KBD_ENABLED,
            "nothing pending, input buffer empty"
        );
        dev.write(4, &[0xa7]);
        assert!(evt.read().is_err(), "other commands must not reset");
        dev.write(4, &[0xfe]);
        assert_eq!(evt.read().unwrap(), 1);
    }

    #[test]
    fn linux_driver_handshake_and_readiness() {
        let mut dev = I8042::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
        dev.write(4, &[CMD_SELF_TEST]);
        assert_eq!(read(&mut dev, 4) & SB_OUT_DATA_AVAIL, SB_OUT_DATA_AVAIL);
        assert_eq!(read(&mut dev, 0), 0x55);
        assert_eq!(read(&mut dev, 4) & SB_OUT_DATA_AVAIL, 0);
        dev.write(4, &[CMD_READ_CTR]);
        let ctr = read(&mut dev, 0);
        assert_eq!(ctr, CB_POST_OK | CB_KBD_INT);
        assert!(
            !dev.keyboard_driver_ready(),
            "no driver wrote the command byte yet"
        );
        dev.write(4, &[CMD_WRITE_CTR]);
        dev.write(0, &[ctr & !CB_KBD_INT]);
        assert!(
            !dev.keyboard_driver_ready(),
            "written with the interrupt off"
        );
        dev.write(4, &[CMD_WRITE_CTR]);
        dev.write(0, &[ctr]);
        assert!(dev.keyboard_driver_ready());
        // A keyboard command is acknowledged; GET ID answers an MF2 keyboard.
        dev.write(0, &[KBD_GET_ID]);
        assert_eq!(
            [read(&mut dev, 0), read(&mut dev, 0), read(&mut dev, 0)],
            [KBD_ACK, 0xab, 0x83]
        );
    }

    #[test]
    fn ctrl_alt_del_queues_scancodes_and_interrupts() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut dev = I8042::new(EventFd::new(libc::EFD_NONBLOCK).unwrap())
            .with_keyboard_interrupt(irq.try_clone().unwrap());
        dev.trigger_ctrl_alt_del().unwrap();
        assert_eq!(irq.read().unwrap(), 3, "one interrupt per key");
        let bytes: Vec<u8> = (0..4).map(|_| read(&mut dev, 0)).collect();
        assert_eq!(bytes, [0x14, 0x11, 0xe0, 0x71]);
        assert_eq!(irq.read().unwrap(), 3, "re-raised while bytes were left");
        assert_eq!(read(&mut dev, 4) & SB_OUT_DATA_AVAIL, 0);
        // A guest that never reads: the buffer fills and the injection is refused, no panic.
        for _ in 0..4 {
            let _ = dev.trigger_ctrl_alt_del();
        }
        assert!(matches!(
            dev.trigger_ctrl_alt_del(),
            Err(I8042Error::BufferFull)
        ));
    }
}
