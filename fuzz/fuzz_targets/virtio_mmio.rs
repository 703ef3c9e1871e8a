//! The virtio-mmio register file in front of a virtio-net device (`MmioTransport` +
//! `NetDevice<PairBackend>`, its worker thread running), driven through arbitrary sequences of
//! register reads and writes, whole driver initialisations (DRIVER_OK with driver-like,
//! overlapping or arbitrary rings), resets and re-activations, kicks, guest memory writes and
//! backend traffic, all while the worker runs.
//!
//! Invariants:
//! - every reset (a 0 written to Status) returns within [`RESET_BOUND`], and leaves Status 0,
//!   InterruptStatus 0 and the device inactive;
//! - the transport stays usable: at the end of every input, a reset and a plain driver
//!   initialisation succeed and a frame queued on tx reaches the backend's peer;
//! - no panic (in this thread or the worker's: a dead worker fails the final check).

#![no_main]

mod common;

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use devices::backend::{PairBackend, PairPeer};
use devices::test_utils::mmio::Registers;
use devices::virtio::net::{MacAddr, NetDevice};
use devices::virtio::MmioTransport;
use devices::BusDevice;
use libfuzzer_sys::fuzz_target;
use virtio_bindings::virtio_config::*;
use virtio_bindings::virtio_mmio::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use common::*;

/// Most a reset may take (it joins the worker).
const RESET_BOUND: Duration = Duration::from_secs(2);
/// Most the final frame may take to come out.
const FRAME_BOUND: Duration = Duration::from_secs(2);
const QUEUE_SIZE: u16 = 256;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Reg {
    Magic,
    Version,
    DeviceId,
    DeviceFeatures,
    DeviceFeaturesSel,
    DriverFeatures,
    DriverFeaturesSel,
    QueueSel,
    QueueNumMax,
    QueueNum,
    QueueReady,
    QueueNotify,
    InterruptStatus,
    InterruptAck,
    Status,
    DescLow,
    DescHigh,
    AvailLow,
    AvailHigh,
    UsedLow,
    UsedHigh,
    ConfigGeneration,
    Config(u8),
    Other(u16),
}

impl Reg {
    fn offset(self) -> u64 {
        u64::from(match self {
            Reg::Magic => VIRTIO_MMIO_MAGIC_VALUE,
            Reg::Version => VIRTIO_MMIO_VERSION,
            Reg::DeviceId => VIRTIO_MMIO_DEVICE_ID,
            Reg::DeviceFeatures => VIRTIO_MMIO_DEVICE_FEATURES,
            Reg::DeviceFeaturesSel => VIRTIO_MMIO_DEVICE_FEATURES_SEL,
            Reg::DriverFeatures => VIRTIO_MMIO_DRIVER_FEATURES,
            Reg::DriverFeaturesSel => VIRTIO_MMIO_DRIVER_FEATURES_SEL,
            Reg::QueueSel => VIRTIO_MMIO_QUEUE_SEL,
            Reg::QueueNumMax => VIRTIO_MMIO_QUEUE_NUM_MAX,
            Reg::QueueNum => VIRTIO_MMIO_QUEUE_NUM,
            Reg::QueueReady => VIRTIO_MMIO_QUEUE_READY,
            Reg::QueueNotify => VIRTIO_MMIO_QUEUE_NOTIFY,
            Reg::InterruptStatus => VIRTIO_MMIO_INTERRUPT_STATUS,
            Reg::InterruptAck => VIRTIO_MMIO_INTERRUPT_ACK,
            Reg::Status => VIRTIO_MMIO_STATUS,
            Reg::DescLow => VIRTIO_MMIO_QUEUE_DESC_LOW,
            Reg::DescHigh => VIRTIO_MMIO_QUEUE_DESC_HIGH,
            Reg::AvailLow => VIRTIO_MMIO_QUEUE_AVAIL_LOW,
            Reg::AvailHigh => VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
            Reg::UsedLow => VIRTIO_MMIO_QUEUE_USED_LOW,
            Reg::UsedHigh => VIRTIO_MMIO_QUEUE_USED_HIGH,
            Reg::ConfigGeneration => VIRTIO_MMIO_CONFIG_GENERATION,
            Reg::Config(o) => VIRTIO_MMIO_CONFIG + u32::from(o),
            Reg::Other(o) => u32::from(o) % 0x1000,
        })
    }
}

#[derive(Arbitrary, Debug)]
enum Rings {
    /// Laid out as a driver does.
    Driver,
    /// tx's used ring on its avail ring (flags on avail.idx), or on its descriptor table.
    Overlap { on_desc: bool },
    /// Anywhere.
    Anywhere([u32; 6]),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Read(Reg),
    Write(Reg, u32),
    RawRead {
        offset: u16,
        len: u8,
    },
    RawWrite {
        offset: u16,
        data: Vec<u8>,
    },
    /// A whole driver initialisation up to DRIVER_OK.
    Init {
        features: u64,
        size_log2: u8,
        rings: Rings,
        tx_chains: Vec<ChainSpec>,
        rx_chains: Vec<ChainSpec>,
        tx_published: u16,
        rx_published: u16,
    },
    Reset,
    Kick(u8),
    Patch(Patch),
    Send(Vec<u16>),
    Recv,
    /// Lets the worker run a little.
    Pause(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    layout: Layout,
    ops: Vec<Op>,
}

struct Rig {
    t: MmioTransport,
    mem: GuestMemoryMmap,
    peer: PairPeer,
}

impl Rig {
    /// A 0 written to Status, timed and checked.
    fn reset(&mut self) {
        let start = Instant::now();
        self.t
            .write(u64::from(VIRTIO_MMIO_STATUS), &0u32.to_le_bytes());
        let elapsed = start.elapsed();
        assert!(elapsed < RESET_BOUND, "reset took {elapsed:?}");
        assert_eq!(self.r32(VIRTIO_MMIO_STATUS), 0, "status after reset");
        assert_eq!(
            self.r32(VIRTIO_MMIO_INTERRUPT_STATUS),
            0,
            "interrupt after reset"
        );
        assert!(!self.t.device().is_active(), "device active after reset");
    }
}

/// The driver's steps (`negotiate`, `setup_queue`, `driver_ok`, `device_features`) from
/// devices' test utilities; every reset they write goes through [`Rig::reset`].
impl Registers for Rig {
    fn r32(&mut self, offset: u32) -> u32 {
        self.t.r32(offset)
    }

    fn w32(&mut self, offset: u32, value: u32) {
        if offset == VIRTIO_MMIO_STATUS && value & !VIRTIO_CONFIG_S_NEEDS_RESET == 0 {
            self.reset();
        } else {
            self.t.w32(offset, value);
        }
    }
}

/// Ring addresses of the driver-like layout: rx at 0, tx at 0x4000, buffers above 0x8000.
const RX_BASE: u64 = 0;
const TX_BASE: u64 = 0x4000;

fuzz_target!(|input: Input| {
    let mem = input.layout.memory();
    let (backend, peer) = PairBackend::new().expect("socketpair");
    let device = NetDevice::with_backend(backend, MacAddr::new([2, 0, 0, 0, 0, 1]), QUEUE_SIZE);
    let t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    let mut rig = Rig { t, mem, peer };

    for op in input.ops.iter().take(48) {
        match op {
            Op::Read(reg) => {
                let mut d = [0u8; 4];
                rig.t.read(reg.offset(), &mut d);
            }
            Op::Write(reg, value) => {
                let offset = reg.offset();
                if offset == u64::from(VIRTIO_MMIO_STATUS) {
                    rig.w32(VIRTIO_MMIO_STATUS, *value);
                } else {
                    rig.t.write(offset, &value.to_le_bytes());
                }
            }
            Op::RawRead { offset, len } => {
                let mut d = vec![0u8; [1, 2, 4, 8][usize::from(*len % 4)]];
                rig.t.read(u64::from(*offset % 0x1000), &mut d);
            }
            Op::RawWrite { offset, data } => {
                let offset = u64::from(*offset % 0x1000);
                let data = &data[..data.len().min(8)];
                if offset == u64::from(VIRTIO_MMIO_STATUS)
                    && data.len() == 4
                    && data.iter().all(|b| *b == 0)
                {
                    rig.reset();
                } else {
                    rig.t.write(offset, data);
                }
            }
            Op::Init {
                features,
                size_log2,
                rings,
                tx_chains,
                rx_chains,
                tx_published,
                rx_published,
            } => {
                let offered = rig.device_features();
                let acked = (features & offered) | (1 << VIRTIO_F_VERSION_1);
                if !rig.negotiate(acked) {
                    continue;
                }
                let size = 1u16 << (size_log2 % 9);
                let (rx_rings, tx_rings) = match rings {
                    Rings::Driver => (driver_rings(RX_BASE, size), driver_rings(TX_BASE, size)),
                    Rings::Overlap { on_desc } => {
                        let (d, a, _) = driver_rings(TX_BASE, size);
                        let used = if *on_desc { d } else { a + 2 };
                        (driver_rings(RX_BASE, size), (d, a, used & !3))
                    }
                    Rings::Anywhere(a) => {
                        let f = |x: u32| u64::from(x) % (3 * REGION_A);
                        ((f(a[0]), f(a[1]), f(a[2])), (f(a[3]), f(a[4]), f(a[5])))
                    }
                };
                if matches!(rings, Rings::Driver | Rings::Overlap { .. }) {
                    let (tp, rp) = (tx_published % (size + 1), rx_published % (size + 1));
                    write_driver_chains(
                        &rig.mem, tx_rings, size, false, tx_chains, 0x8000, 0x4000, 0, tp,
                    );
                    write_driver_chains(
                        &rig.mem, rx_rings, size, true, rx_chains, 0xc000, 0x4000, 0, rp,
                    );
                }
                rig.setup_queue(0, size, rx_rings);
                rig.setup_queue(1, size, tx_rings);
                rig.driver_ok();
            }
            Op::Reset => rig.reset(),
            Op::Kick(q) => rig.t.write(
                u64::from(VIRTIO_MMIO_QUEUE_NOTIFY),
                &u32::from(q % 3).to_le_bytes(),
            ),
            Op::Patch(p) => p.apply(&rig.mem),
            Op::Send(lens) => {
                for &len in lens.iter().take(16) {
                    if rig
                        .peer
                        .try_send_frame(&vec![0x5a; usize::from(len).max(1)])
                        .is_err()
                    {
                        break;
                    }
                }
            }
            Op::Recv => while let Ok(Some(_)) = rig.peer.try_recv_frame() {},
            Op::Pause(n) => std::thread::sleep(Duration::from_micros(u64::from(*n % 8) * 100)),
        }
    }

    // The transport is still usable: a plain driver brings the device up and sends a frame.
    assert!(
        rig.negotiate(1 << VIRTIO_F_VERSION_1),
        "FEATURES_OK after reset"
    );
    let _ = rig.mem.write_slice(&[0u8; 0x8000], GuestAddress(0));
    let size = 16;
    let (rx_rings, tx_rings) = (driver_rings(RX_BASE, size), driver_rings(TX_BASE, size));
    let marker: Vec<u8> = (0..72u8).collect();
    let _ = rig.mem.write_slice(&marker, GuestAddress(0x8000));
    let chain = ChainSpec {
        segs: vec![Seg {
            offset: 0,
            len: marker.len() as u16,
            wrong_direction: false,
        }],
        indirect: false,
    };
    write_driver_chains(
        &rig.mem,
        tx_rings,
        size,
        false,
        &[chain],
        0x8000,
        0x4000,
        0,
        1,
    );
    write_driver_chains(&rig.mem, rx_rings, size, true, &[], 0xc000, 0x4000, 0, 0);
    rig.setup_queue(0, size, rx_rings);
    rig.setup_queue(1, size, tx_rings);
    rig.driver_ok();
    let status = rig.r32(VIRTIO_MMIO_STATUS);
    assert_eq!(
        status & (VIRTIO_CONFIG_S_DRIVER_OK | VIRTIO_CONFIG_S_NEEDS_RESET),
        VIRTIO_CONFIG_S_DRIVER_OK,
        "re-activation: status {status:#x}"
    );
    rig.t
        .write(u64::from(VIRTIO_MMIO_QUEUE_NOTIFY), &1u32.to_le_bytes());
    rig.peer.set_timeout(FRAME_BOUND).expect("timeout");
    let deadline = Instant::now() + FRAME_BOUND;
    loop {
        let frame = rig
            .peer
            .recv_frame()
            .unwrap_or_else(|e| panic!("no marker frame within {FRAME_BOUND:?}: {e}"));
        if frame == marker {
            break;
        }
        assert!(Instant::now() < deadline, "marker frame not sent");
    }
    rig.reset();
});
