//! Test doubles: a HAL over a Vec-like arena where physical address == arena offset, a
//! virtio-mmio register file, and a tiny device that consumes the rings from the same memory.
//! No KVM, no devices crate: the device reads and writes the ring layout from the spec itself
//! (split rings in `device`, packed rings in `packed`).

pub(crate) mod device;
pub(crate) mod hal;
pub(crate) mod packed;
pub(crate) mod transport;

pub(crate) use device::{
    serve_ctrl_from_bring_up, CtrlBehaviour, CtrlRecord, DevQueue, TestDevice,
};
pub(crate) use hal::TestHal;
pub(crate) use transport::{Regs, TestTransport};

/// VIRTQ_DESC_F_WRITE, the same bit in split and packed descriptors.
const F_WRITE: u16 = 2;

/// One descriptor as the device reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Desc {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) flags: u16,
}

impl Desc {
    pub(crate) fn writable(&self) -> bool {
        self.flags & F_WRITE != 0
    }
}
