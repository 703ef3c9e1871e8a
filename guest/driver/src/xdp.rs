//! The rx program's verdicts and the XDP_TX bulk queue.
//!
//! A frame the program bounces ([`XdpAction::Tx`]) is sent **without a copy**, from the rx
//! buffers it arrived in: the 12-byte header the device wrote at the start of the first buffer
//! is zeroed in place and becomes the tx header, and the tx chain is made of the frame's rx
//! buffers (one descriptor each, device-readable). The buffers go back to the rx pool, and are
//! re-posted, when the device returns that tx chain (in whatever reclaim path the
//! [`crate::TxCompletion`] mode uses; the rx ring is refilled right then).
//!
//! Bounced frames are queued and flushed — added to the tx ring, one publish, one kick decision
//! — when `xdp_bulk` frames are queued and at the end of every rx poll. `xdp_bulk = 1` is
//! per-frame transmit. A frame that finds no room on the tx ring is dropped and counted
//! (`xdp_tx_errors`, `ring_full`).

/// What the rx program decided for a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAction {
    /// Deliver: the program consumed the frame (counted in `xdp_pass`).
    Pass,
    /// Drop it (counted in `xdp_drop`).
    Drop,
    /// Send it back out of the same device (XDP_TX).
    Tx,
}

/// Swaps the destination and source MAC addresses of an Ethernet frame (a reflector's rewrite
/// before [`XdpAction::Tx`]). Frames shorter than 12 bytes are left alone.
pub fn swap_macs(frame: &mut [u8]) {
    if let Some(addrs) = frame.get_mut(..12) {
        let (dst, src) = addrs.split_at_mut(6);
        dst.swap_with_slice(src);
    }
}
