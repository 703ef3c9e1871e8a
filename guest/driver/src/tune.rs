//! The datapath side of [`crate::Config::adaptive`]: the per-interval counts the controllers
//! of [`crate::adapt`] are fed with, and applying what they decide (the send queue's kick
//! threshold and XDP_TX bulk; the device's rx coalescing, over the control queue).
//!
//! Per frame the datapath pays at most a counter increment (an XDP_TX bounce, a threshold
//! cut); the interval checks run once per publish (transmit) and once per rx poll.

use crate::adapt::RxDim;
use crate::features::{NET_F_CTRL_VQ, NET_F_NOTF_COAL, NET_F_VQ_NOTF_COAL};

/// How the rx coalescing is set on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CoalCommand {
    /// NOTF_COAL RX_SET: every rx queue at once.
    RxSet,
    /// NOTF_COAL VQ_SET on each rx queue.
    VqSet,
}

/// The device-wide rx coalescing adaptation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RxTuning {
    pub(crate) dim: RxDim,
    pub(crate) command: CoalCommand,
    /// False once the device refused a command (or did not answer): adaptation stops there.
    pub(crate) active: bool,
    /// Rx polls in the current interval.
    pub(crate) polls: u32,
    /// Rx frames, interrupts and clock at the start of the current interval.
    pub(crate) start: (u64, u64, u64),
    /// The level the device last accepted (0, its default, before any command).
    pub(crate) applied: u8,
    pub(crate) changes: u64,
    pub(crate) errors: u64,
}

impl RxTuning {
    /// The adaptation for a device with `features`, if it can set rx coalescing.
    pub(crate) fn new(features: u64) -> Option<RxTuning> {
        if features & NET_F_CTRL_VQ == 0 {
            return None;
        }
        let command = if features & NET_F_NOTF_COAL != 0 {
            CoalCommand::RxSet
        } else if features & NET_F_VQ_NOTF_COAL != 0 {
            CoalCommand::VqSet
        } else {
            return None;
        };
        Some(RxTuning {
            dim: RxDim::new(),
            command,
            active: true,
            polls: 0,
            start: (0, 0, 0),
            applied: 0,
            changes: 0,
            errors: 0,
        })
    }

    /// The level in use on the device.
    pub(crate) fn level(&self) -> u8 {
        self.applied
    }
}
