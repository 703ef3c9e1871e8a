//! Driver tests against the in-crate test device ([`crate::testing`]): no KVM, no devices crate.

mod adapt;
mod adaptive;
mod concurrent;
mod ctrl;
mod init;
mod mq;
mod packed;
mod pci;
mod queue;
mod reset;
mod rx;
mod stats;
mod tx;
mod xdp;
mod xsk;

use std::vec::Vec;

use crate::testing::{Regs, TestDevice, TestHal, TestTransport};
use crate::{Config, VirtioNet};

/// Arena per test (lazily zeroed by the OS, so cheap).
pub(crate) const ARENA: usize = 16 << 20;

pub(crate) struct Harness {
    pub(crate) net: VirtioNet<TestHal, TestTransport>,
    pub(crate) dev: TestDevice,
    pub(crate) hal: TestHal,
    pub(crate) transport: TestTransport,
}

impl Harness {
    /// Notifications of queue `q` so far.
    pub(crate) fn kicks(&self, q: u16) -> usize {
        self.transport.regs().kicks(q)
    }
}

pub(crate) fn harness(config: Config) -> Harness {
    harness_with(config, |_| {})
}

/// A driver brought up against a register file edited by `edit`, and the device behind it.
pub(crate) fn harness_with(config: Config, edit: impl FnOnce(&mut Regs)) -> Harness {
    let hal = TestHal::new(ARENA);
    let mut regs = Regs::default();
    edit(&mut regs);
    let transport = TestTransport::new(regs);
    let net = VirtioNet::new(hal.clone(), transport.clone(), config).expect("driver init");
    let dev = TestDevice::attach(&hal, &transport);
    Harness {
        net,
        dev,
        hal,
        transport,
    }
}

/// A recognisable frame: `len` bytes, starting with the big-endian sequence number `seq`.
pub(crate) fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(7) ^ seq as u8)
        .collect();
    let n = len.min(4);
    f[..n].copy_from_slice(&seq.to_be_bytes()[..n]);
    f
}

/// The sequence number of a [`frame`].
pub(crate) fn seq_of(frame: &[u8]) -> u32 {
    u32::from_be_bytes(frame[..4].try_into().expect("frame of at least 4 bytes"))
}

#[test]
fn driver_halves_are_send() {
    fn send<T: Send>() {}
    send::<VirtioNet<TestHal, TestTransport>>();
    send::<crate::XskPort>();
    send::<crate::XskSocket>();
    send::<crate::MmioTransport>();
}
