//! [`Counters`]: what the driver did, as plain numbers (the driver is single-threaded; copy them
//! out with [`crate::VirtioNet::counters`]).

/// Driver counters. All start at 0 and only grow, except the three values in use
/// (`kick_threshold_now`, `xdp_bulk_now`, `rx_coal_level`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames queued by the transmit paths (copy transmit and AF_XDP); XDP_TX is in `xdp_tx`.
    pub tx_frames: u64,
    /// Bytes of those frames (headers excluded).
    pub tx_bytes: u64,
    /// Frames received (before the XDP verdict).
    pub rx_frames: u64,
    /// Bytes of those frames (headers excluded).
    pub rx_bytes: u64,
    /// Tx queue notifications issued.
    pub kicks: u64,
    /// Tx kicks skipped because EVENT_IDX (`avail_event`) said the device needs none.
    pub kicks_suppressed: u64,
    /// Tx kicks skipped because the device set VRING_USED_F_NO_NOTIFY (EVENT_IDX off).
    pub kicks_suppressed_no_notify: u64,
    /// Stores of the tx avail index (each publishes one or more frames).
    pub tx_publishes: u64,
    /// Rx queue notifications issued (after posting buffers).
    pub rx_kicks: u64,
    /// Rx kicks skipped (EVENT_IDX or NO_NOTIFY).
    pub rx_kicks_suppressed: u64,
    /// Calls of [`crate::VirtioNet::handle_interrupt`] that found InterruptStatus bits.
    pub interrupts: u64,
    /// Tx chains reclaimed from the used ring.
    pub tx_reclaimed: u64,
    /// Tx reclaim passes (`tx_reclaimed / tx_reclaim_polls` is reclaimed-per-poll).
    pub tx_reclaim_polls: u64,
    /// Times a transmit path found no room on the tx ring.
    pub ring_full: u64,
    /// Frames the rx program bounced that were queued on the tx ring.
    pub xdp_tx: u64,
    /// Frames the rx program bounced that found no room on the tx ring (dropped).
    pub xdp_tx_errors: u64,
    /// XDP_TX bulk flushes that queued at least one frame.
    pub xdp_flushes: u64,
    /// Frames the rx program dropped.
    pub xdp_drop: u64,
    /// Frames the rx program passed.
    pub xdp_pass: u64,
    /// AF_XDP tx descriptors refused (outside the umem, crossing a frame, no headroom, empty,
    /// too large); they are consumed and not completed, as Linux does.
    pub xsk_invalid_descs: u64,
    /// Device protocol violations, each ignored: used ids out of range or not in flight, used
    /// lengths larger than the buffer, bad `num_buffers`, a used index jumping past the ring.
    pub device_errors: u64,
    /// Control commands queued to the device ([`crate::VirtioNet::control`]).
    pub ctrl_commands: u64,
    /// Control commands that did not end in VIRTIO_NET_OK (refused, unanswered, malformed
    /// answers).
    pub ctrl_failed: u64,
    /// Control commands the device did not answer within the wait bound (also in
    /// `ctrl_failed`).
    pub ctrl_timeouts: u64,
    /// The kick threshold in use on the current pair ([`crate::Config::kick_threshold`], or
    /// the adaptive one with [`crate::Config::adaptive`]).
    pub kick_threshold_now: u64,
    /// The XDP_TX bulk in use on the current pair (as above, [`crate::Config::xdp_bulk`]).
    pub xdp_bulk_now: u64,
    /// The rx coalescing level in use on the device, an index into
    /// [`crate::adapt::RX_COAL_PROFILES`] (0, the device's default, unless adaptive).
    pub rx_coal_level: u64,
    /// Changes of the adaptive kick threshold (all pairs).
    pub kick_threshold_changes: u64,
    /// Changes of the adaptive XDP_TX bulk (all pairs).
    pub xdp_bulk_changes: u64,
    /// Rx coalescing levels the device accepted from the adaptation.
    pub rx_coal_changes: u64,
    /// Rx coalescing commands that failed (refused or unanswered); the first one stops the
    /// rx adaptation.
    pub rx_coal_errors: u64,
}

impl Counters {
    /// Average tx chains reclaimed per reclaim pass (0 before the first pass).
    pub fn reclaimed_per_poll(&self) -> f64 {
        if self.tx_reclaim_polls == 0 {
            0.0
        } else {
            self.tx_reclaimed as f64 / self.tx_reclaim_polls as f64
        }
    }
}
