//! State the vCPU thread (config space, the VMM's API) and the device's workers share: the
//! link status with its configuration generation, and the MAC address the driver set. Both
//! sides hold it through an `Arc`; neither needs the other's module.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use log::error;

use super::config::MacAddr;
use crate::virtio::VirtioInterrupt;

/// Whether the link is up, as reported in the STATUS config field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// VIRTIO_NET_S_LINK_UP set.
    Up,
    /// VIRTIO_NET_S_LINK_UP clear.
    Down,
}

/// Changes a device's link status from outside (e.g. the VMM's API), with a configuration
/// interrupt when the driver is running. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LinkControl {
    shared: Arc<LinkShared>,
}

#[derive(Debug)]
struct LinkShared {
    up: AtomicBool,
    generation: AtomicU32,
    /// The interrupt line while the device is active (slow path only).
    interrupt: Mutex<Option<Arc<VirtioInterrupt>>>,
}

impl LinkControl {
    pub(crate) fn new() -> Self {
        LinkControl {
            shared: Arc::new(LinkShared {
                up: AtomicBool::new(true),
                generation: AtomicU32::new(0),
                interrupt: Mutex::new(None),
            }),
        }
    }

    /// Sets the link state; on a change, bumps the configuration generation and, if the driver
    /// is running, raises a configuration-change interrupt.
    pub fn set_link(&self, state: LinkState) {
        let up = state == LinkState::Up;
        if self.shared.up.swap(up, Ordering::AcqRel) == up {
            return;
        }
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(interrupt) = self.lock().as_ref() {
            if let Err(e) = interrupt.signal_config_change() {
                error!("virtio-net: failed to signal a link change: {e}");
            }
        }
    }

    /// The current link state.
    pub fn link(&self) -> LinkState {
        if self.shared.up.load(Ordering::Acquire) {
            LinkState::Up
        } else {
            LinkState::Down
        }
    }

    pub(crate) fn generation(&self) -> u32 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// Another configuration field changed (no interrupt: the driver changed it itself).
    pub(crate) fn bump_generation(&self) {
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn attach(&self, interrupt: Option<Arc<VirtioInterrupt>>) {
        *self.lock() = interrupt;
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<VirtioInterrupt>>> {
        // The guarded value is a plain Option: a panic elsewhere cannot leave it inconsistent.
        self.shared
            .interrupt
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The MAC address the driver set over the control queue (0: none; else bit 48 set and the
/// address in bits 0..48). Shared by the device (config space) and its worker (ADDR_SET).
#[derive(Debug, Default)]
pub(crate) struct GuestMac(AtomicU64);

impl GuestMac {
    const SET: u64 = 1 << 48;

    pub(crate) fn set(&self, mac: MacAddr) {
        let mut word = [0u8; 8];
        word[..6].copy_from_slice(&mac.bytes());
        self.0
            .store(u64::from_le_bytes(word) | Self::SET, Ordering::Release);
    }

    pub(crate) fn get(&self) -> Option<MacAddr> {
        let word = self.0.load(Ordering::Acquire);
        if word & Self::SET == 0 {
            return None;
        }
        let bytes = word.to_le_bytes();
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&bytes[..6]);
        Some(MacAddr::new(mac))
    }

    /// Forgets it; returns whether one was set.
    pub(crate) fn clear(&self) -> bool {
        self.0.swap(0, Ordering::AcqRel) & Self::SET != 0
    }
}
