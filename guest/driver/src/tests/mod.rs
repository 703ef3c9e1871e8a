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

use crate::testing::TestTransport;
use crate::testing::{serve_ctrl_from_bring_up, CtrlBehaviour, Regs, TestDevice, TestHal};
use crate::{Config, QueueId, QueueResetReport, VirtioNet, XdpAction};

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

/// A driver with `config` on a device whose register file `edit` shapes (multiqueue, say),
/// with the control queue served from bring-up on: the device behind it keeps what the
/// bring-up commands (VQ_PAIRS_SET) set.
pub(crate) fn served_harness(config: Config, edit: impl FnOnce(&mut Regs)) -> Harness {
    let hal = TestHal::new(ARENA);
    let mut regs = Regs::default();
    edit(&mut regs);
    let transport = TestTransport::new(regs);
    let slot = serve_ctrl_from_bring_up(&hal, &transport, CtrlBehaviour::Model);
    let net = VirtioNet::new(hal.clone(), transport.clone(), config).expect("init");
    let dev = TestDevice::attach_with(&hal, &transport, Some(slot));
    Harness {
        net,
        dev,
        hal,
        transport,
    }
}

/// A driver with 256-byte rx buffers, and frame `seq` of `len` bytes that the device wrote
/// across as many of them as it takes, not returned yet: the harness, the frame and each
/// buffer's (head, length).
pub(crate) fn frame_over_small_buffers(
    seq: u32,
    len: usize,
) -> (Harness, Vec<u8>, Vec<(u16, u32)>) {
    let mut h = harness(Config {
        rx_buf_size: 256,
        ..Config::default()
    });
    let big = frame(seq, len);
    let used = h.dev.rx_fill(&big).expect("buffers");
    (h, big, used)
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

/// The sequence numbers of `frames`, in order.
pub(crate) fn seqs(frames: &[Vec<u8>]) -> Vec<u32> {
    frames.iter().map(|f| seq_of(f)).collect()
}

/// One rx poll of the current pair for up to 64 frames, all passed: what `poll_rx` returned
/// and the sequence numbers of the frames it handed over.
pub(crate) fn poll_seqs(net: &mut VirtioNet<TestHal, TestTransport>) -> (usize, Vec<u32>) {
    let mut got = Vec::new();
    let n = net.poll_rx(64, &mut |f: &[u8]| {
        got.push(seq_of(f));
        XdpAction::Pass
    });
    (n, got)
}

/// The sequence numbers one [`poll_seqs`] receives.
pub(crate) fn received(net: &mut VirtioNet<TestHal, TestTransport>) -> Vec<u32> {
    poll_seqs(net).1
}

/// Queues frames 0 to 5 on tx, has the device take all six and return only the first two,
/// then resets the tx queue: that reset's report.
#[track_caller]
pub(crate) fn reset_tx_after_two_of_six(h: &mut Harness) -> QueueResetReport {
    for seq in 0..6 {
        h.net.transmit(&frame(seq, 60)).expect("queued");
    }
    let taken = h.dev.tx_take();
    assert_eq!(taken.len(), 6);
    for (chain, _) in &taken[..2] {
        h.dev.tx.push_used(chain.head, 0);
    }
    h.net.reset_queue(QueueId::Tx).expect("reset")
}

/// Drops the driver and checks that it reset the device and freed all its memory.
#[track_caller]
pub(crate) fn assert_drop_resets_and_frees(h: Harness) {
    let (hal, transport) = (h.hal.clone(), h.transport.clone());
    drop(h);
    assert_eq!(transport.regs().status, 0);
    assert_eq!(hal.live_allocations(), 0);
}

#[test]
fn driver_halves_are_send() {
    fn send<T: Send>() {}
    send::<VirtioNet<TestHal, TestTransport>>();
    send::<crate::XskPort>();
    send::<crate::XskSocket>();
    send::<crate::MmioTransport>();
}
