//! The guest driver's side of the virtio-mmio registers: register access, the initialisation
//! steps, and waits for the device's worker (interrupts, state changes).

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio::*;
use vmm_sys_util::eventfd::EventFd;

use crate::virtio::MmioTransport;
use crate::BusDevice;

/// 32-bit register access and the driver's initialisation steps.
pub trait Registers {
    /// Reads a 32-bit register.
    fn r32(&mut self, offset: u32) -> u32;
    /// Writes a 32-bit register.
    fn w32(&mut self, offset: u32, value: u32);

    /// Resets, then ACKNOWLEDGE, DRIVER, writes `features`, FEATURES_OK. True if it stuck.
    fn negotiate(&mut self, features: u64) -> bool {
        self.w32(VIRTIO_MMIO_STATUS, 0);
        self.w32(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        self.w32(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
        );
        for sel in 0..2u32 {
            self.w32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, sel);
            self.w32(VIRTIO_MMIO_DRIVER_FEATURES, (features >> (32 * sel)) as u32);
        }
        let status = self.r32(VIRTIO_MMIO_STATUS) | VIRTIO_CONFIG_S_FEATURES_OK;
        self.w32(VIRTIO_MMIO_STATUS, status);
        self.r32(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK != 0
    }

    /// Programs queue `index` with `size` entries at (desc, avail, used) and marks it ready.
    fn setup_queue(&mut self, index: u32, size: u16, (desc, avail, used): (u64, u64, u64)) {
        self.w32(VIRTIO_MMIO_QUEUE_SEL, index);
        self.w32(VIRTIO_MMIO_QUEUE_NUM, u32::from(size));
        for (low, addr) in [
            (VIRTIO_MMIO_QUEUE_DESC_LOW, desc),
            (VIRTIO_MMIO_QUEUE_AVAIL_LOW, avail),
            (VIRTIO_MMIO_QUEUE_USED_LOW, used),
        ] {
            self.w32(low, addr as u32);
            self.w32(low + 4, (addr >> 32) as u32);
        }
        self.w32(VIRTIO_MMIO_QUEUE_READY, 1);
    }

    /// Sets DRIVER_OK.
    fn driver_ok(&mut self) {
        let status = self.r32(VIRTIO_MMIO_STATUS) | VIRTIO_CONFIG_S_DRIVER_OK;
        self.w32(VIRTIO_MMIO_STATUS, status);
    }

    /// The features the device offers (both DeviceFeatures words).
    fn device_features(&mut self) -> u64 {
        let mut features = 0u64;
        for sel in 0..2u32 {
            self.w32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, sel);
            features |= u64::from(self.r32(VIRTIO_MMIO_DEVICE_FEATURES)) << (32 * sel);
        }
        features
    }
}

impl Registers for MmioTransport {
    fn r32(&mut self, offset: u32) -> u32 {
        let mut data = [0u8; 4];
        BusDevice::read(self, u64::from(offset), &mut data);
        u32::from_le_bytes(data)
    }

    fn w32(&mut self, offset: u32, value: u32) {
        BusDevice::write(self, u64::from(offset), &value.to_le_bytes());
    }
}

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits for `fd` to be signalled and consumes its count; returns the count (0 on timeout).
pub fn wait_eventfd(fd: &EventFd, timeout: Duration) -> u64 {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is one valid pollfd living across the call.
    let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
    if ready == 1 {
        fd.read().unwrap_or(0)
    } else {
        0
    }
}

/// A xorshift64 generator from `seed` (not zero): the same sequence every run, for tests that
/// hammer a device with pseudo-random guest accesses.
pub fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}
