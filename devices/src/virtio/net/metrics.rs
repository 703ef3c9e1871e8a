//! virtio-net metrics: relaxed atomic counters, serialisable as one JSON object.
//!
//! The worker counts into plain per-batch structs ([`RxCounters`], [`TxCounters`]) and
//! publishes them once per batch, so the hot path does one atomic add per non-zero field per
//! batch, not per frame. The VMM keeps the `Arc<NetMetrics>` and prints it with serde_json.

use serde::Serialize;

pub use crate::counters::{Counter, Gauge};

/// Declares a metrics struct of [`Counter`]s and its plain per-batch twin with `publish`.
macro_rules! queue_metrics {
    (
        $(#[$meta:meta])*
        $metrics:ident / $counters:ident {
            $( $(#[$fmeta:meta])* $field:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default, Serialize)]
        pub struct $metrics {
            $( $(#[$fmeta])* pub $field: Counter, )*
        }

        #[doc = concat!("Per-batch counts for [`", stringify!($metrics), "`], published once per batch.")]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $counters {
            $( $(#[$fmeta])* pub $field: u64, )*
        }

        impl $counters {
            /// Adds these counts to `metrics` and zeroes them.
            pub fn publish(&mut self, metrics: &$metrics) {
                $( metrics.$field.add(self.$field); )*
                *self = Self::default();
            }
        }
    };
}

queue_metrics! {
    /// Receive queue (queue 0) metrics.
    RxQueueMetrics / RxCounters {
        /// Notifications (kicks) from the driver: it posted buffers while we waited for some.
        kicks,
        /// Frames delivered to the guest.
        frames,
        /// Bytes delivered to the guest, Ethernet frames only (virtio-net headers excluded).
        bytes,
        /// Frames longer than 1514 bytes (Ethernet header + 1500): only segmentation offload
        /// (GSO/GRO from the host) makes them.
        large_frames,
        /// Batches after which the guest needed an interrupt for this queue.
        interrupts_raised,
        /// Batches whose interrupt was suppressed by the driver's `used_event` (EVENT_IDX).
        interrupts_suppressed_event_idx,
        /// Batches whose interrupt was suppressed by `VRING_AVAIL_F_NO_INTERRUPT` (no EVENT_IDX).
        interrupts_suppressed_no_interrupt,
        /// Descriptor chains refused as malformed and returned with length 0.
        malformed_chains,
        /// Frames read from the backend that did not fit in the guest buffers available
        /// (too few, or too small without MRG_RXBUF); the frame is lost.
        dropped_no_buffer,
        /// Times the queue ran out of guest buffers and the backend stopped being polled
        /// until the driver posted more (backpressure onto the backend).
        no_buffer_stalls,
        /// Backend read errors and runt frames (shorter than the virtio-net header).
        backend_errors,
        /// Times the rate limiter stopped this queue (it resumes on a timer).
        rate_limiter_throttled,
        /// Microseconds this queue spent stopped by the rate limiter.
        rate_limiter_throttled_us,
        /// Bytes charged to the rate limiter (Ethernet frames, headers excluded).
        rate_limiter_bytes,
        /// Frames charged to the rate limiter.
        rate_limiter_frames,
        /// Times the rate limiter's ops bucket held a frame back (the device statistic
        /// `*_packets_allowance_exceeded`; the frame waits, it is not dropped).
        rate_limiter_ops_exceeded,
        /// Times the rate limiter's bandwidth bucket held a frame back
        /// (`*_bytes_allowance_exceeded`).
        rate_limiter_bandwidth_exceeded,
    }
}

queue_metrics! {
    /// Transmit queue (queue 1) metrics.
    TxQueueMetrics / TxCounters {
        /// Notifications (kicks) from the driver.
        kicks,
        /// Frames written to the backend.
        frames,
        /// Bytes written to the backend, Ethernet frames only (virtio-net headers excluded).
        bytes,
        /// Frames longer than 1514 bytes (Ethernet header + 1500): only segmentation offload
        /// (the guest's TSO/UFO) makes them.
        large_frames,
        /// Batches after which the guest needed an interrupt for this queue.
        interrupts_raised,
        /// Batches whose interrupt was suppressed by the driver's `used_event` (EVENT_IDX).
        interrupts_suppressed_event_idx,
        /// Batches whose interrupt was suppressed by `VRING_AVAIL_F_NO_INTERRUPT` (no EVENT_IDX).
        interrupts_suppressed_no_interrupt,
        /// Descriptor chains refused as malformed (loop, bad address, wrong direction, frame of
        /// 0 bytes or over 64 KiB + header, bad indirect table) and returned with length 0.
        malformed_chains,
        /// Frames the backend refused with an error; each is dropped (returned to the guest).
        backend_errors,
        /// Times the backend could not take more frames and transmission paused until it
        /// became writable again.
        backend_full,
        /// Kick coalescing (`kick_coalescing`): times the device looked at the ring by itself
        /// after its time bound, the driver not having kicked.
        kick_timer_looks,
        /// Of those looks, the ones that found frames (the rest found the driver quiet).
        kick_timer_found,
        /// Of those, the adapter's looks after which the driver kicks each buffer again: the
        /// last of two in a row that sent one frame each (a trickle, one frame in flight, which
        /// a look only delays).
        kick_timer_trickles,
        /// Batches of several frames handed to the backend in one call (io_uring on a tap:
        /// one `io_uring_enter` each); `frames / batched_writes` is at most the batch size.
        batched_writes,
        /// Times the rate limiter stopped this queue (it resumes on a timer).
        rate_limiter_throttled,
        /// Microseconds this queue spent stopped by the rate limiter.
        rate_limiter_throttled_us,
        /// Bytes charged to the rate limiter (Ethernet frames, headers excluded).
        rate_limiter_bytes,
        /// Frames charged to the rate limiter.
        rate_limiter_frames,
        /// Times the rate limiter's ops bucket held a frame back (the device statistic
        /// `*_packets_allowance_exceeded`; the frame waits, it is not dropped).
        rate_limiter_ops_exceeded,
        /// Times the rate limiter's bandwidth bucket held a frame back
        /// (`*_bytes_allowance_exceeded`).
        rate_limiter_bandwidth_exceeded,
    }
}

queue_metrics! {
    /// Device busy-poll (`busy_poll_us`): what the worker's polling windows found.
    BusyPollMetrics / BusyPollCounters {
        /// Polling windows started (after the queues drained, before sleeping).
        polls,
        /// Windows that ended because the driver queued more (tx or rx buffers) or the
        /// backend or another event became ready: a kick or a wake-up saved.
        found_work,
        /// Microseconds spent polling.
        polled_us,
        /// Waits between looks on the poll timer (`busy_poll_sleep_us` above 0), each one
        /// the worker asleep instead of spinning.
        sleeps,
    }
}

queue_metrics! {
    /// The control queue (queue 2, when VIRTIO_NET_F_CTRL_VQ is negotiated).
    CtrlMetrics / CtrlCounters {
        /// Notifications (kicks) from the driver.
        kicks,
        /// Command chains taken from the queue.
        commands,
        /// Commands acked VIRTIO_NET_OK.
        ok,
        /// Commands acked VIRTIO_NET_ERR (one of the reasons below).
        errors,
        /// ERR: header, data or reply space of the wrong length.
        bad_length,
        /// ERR: unknown class or command.
        unsupported,
        /// ERR: the command's feature was not negotiated.
        not_negotiated,
        /// ERR: a value out of range (flag, MAC, offload, queue number, coalescing bounds).
        out_of_range,
        /// ERR: the backend refused the change (GUEST_OFFLOADS_SET).
        backend_errors,
        /// Chains with no device-writable byte for the ack: returned with used length 0.
        no_ack,
        /// Chains the ring walk refused (loop, bad address or indirect table, a readable
        /// buffer after a writable one, too long): returned with used length 0, not acked.
        malformed_chains,
        /// NOTF_COAL RX_SET / TX_SET / VQ_SET carried out.
        coalescing_sets,
        /// NOTF_COAL VQ_GET answered.
        coalescing_gets,
        /// RX PROMISC / ALLMULTI recorded (no-ops on a tap).
        rx_mode_sets,
        /// MAC TABLE_SET recorded (no filtering on a tap).
        mac_table_sets,
        /// MAC ADDR_SET carried out (the config space's `mac`).
        mac_addr_sets,
        /// GUEST_OFFLOADS_SET carried out (the tap's offloads).
        offloads_sets,
        /// MQ VQ_PAIRS_SET carried out (the active queue pairs).
        mq_pairs_sets,
        /// STATS QUERY answered (VIRTIO_NET_F_DEVICE_STATS).
        stats_queries,
        /// STATS GET answered: the device's counters read by the driver.
        stats_gets,
    }
}

macro_rules! throttled {
    ($($counters:ident),*) => {$(
        impl $counters {
            /// Counts one frame the rate limiter held back, and the buckets that held it.
            #[inline]
            pub(crate) fn throttled(&mut self, blocked: super::rate_limiter::Blocked) {
                self.rate_limiter_throttled += 1;
                self.rate_limiter_ops_exceeded += u64::from(blocked.ops);
                self.rate_limiter_bandwidth_exceeded += u64::from(blocked.bandwidth);
            }
        }
    )*};
}
throttled!(RxCounters, TxCounters);

/// Device-side adaptation (`adaptive=on`): what the device chose and how often it changed.
/// The values are queue pair 0's (each pair adapts on its own); the counts cover all pairs.
#[derive(Debug, Default, Serialize)]
pub struct AdaptiveMetrics {
    /// Adaptation is on.
    pub enabled: Gauge,
    /// The busy-poll window chosen (µs).
    pub busy_poll_us: Gauge,
    /// The interrupt coalescing time bound chosen (µs; 0: off).
    pub coalesce_usecs: Gauge,
    /// The interrupt coalescing packet bound chosen.
    pub coalesce_packets: Gauge,
    /// Intervals looked at (the interval stops while the device is idle).
    pub intervals: Counter,
    /// Changes of the busy-poll window.
    pub busy_poll_changes: Counter,
    /// Changes of the interrupt coalescing.
    pub coalescing_changes: Counter,
    /// The kick coalescing's buffer bound chosen (0: off; the operator's own, where set, is
    /// in force instead).
    pub kick_coalesce_packets: Gauge,
    /// The kick coalescing's look time chosen (µs; 0: off).
    pub kick_coalesce_usecs: Gauge,
    /// Changes of the kick coalescing.
    pub kick_coalescing_changes: Counter,
}

/// One queue pair's datapath counters (multiqueue devices).
#[derive(Debug, Default, Serialize)]
pub struct PairMetrics {
    /// The pair's receive queue (queue 2i).
    pub rx: RxQueueMetrics,
    /// The pair's transmit queue (queue 2i + 1).
    pub tx: TxQueueMetrics,
}

/// All metrics of one virtio-net device.
///
/// With several queue pairs (`queues=N`, N > 1) `rx` and `tx` are the sums over the pairs
/// and `queues[i]` holds pair i's own; with one pair `queues` is empty (and absent from the
/// JSON). Every other counter covers the whole device.
#[derive(Debug, Default, Serialize)]
pub struct NetMetrics {
    /// Receive queues (all pairs).
    pub rx: RxQueueMetrics,
    /// Transmit queues (all pairs).
    pub tx: TxQueueMetrics,
    /// Per queue pair, when the device has more than one (else empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<PairMetrics>,
    /// Writes to the irqfd (one per worker wake-up that completed buffers the guest wants to
    /// hear about; rx and tx share it).
    pub irqfd_signals: Counter,
    /// Rounds whose interrupt was held back by interrupt coalescing (to be merged into a
    /// later one).
    pub interrupts_held: Counter,
    /// Held interrupts released because `max_packets` frames completed.
    pub coalesce_packet_releases: Counter,
    /// Held interrupts released because `max_usecs` passed.
    pub coalesce_timer_releases: Counter,
    /// Batches the driver's `used_event` suppressed that interrupted anyway because EVENT_IDX
    /// interrupt suppression is tuned off.
    pub event_idx_overrides: Counter,
    /// Times the device entered DEVICE_NEEDS_RESET (worker error or failed activation).
    pub needs_reset_events: Counter,
    /// Worker runs started (one per DRIVER_OK).
    pub activations: Counter,
    /// Per-queue resets carried out (VIRTIO_F_RING_RESET), rx and tx queues of every pair.
    pub queue_resets: Counter,
    /// Queues enabled again after their reset.
    pub queue_reenables: Counter,
    /// Device busy-poll.
    pub busy_poll: BusyPollMetrics,
    /// The control queue.
    pub ctrl: CtrlMetrics,
    /// Device-side adaptation.
    pub adaptive: AdaptiveMetrics,
}

impl NetMetrics {
    /// Metrics for a device with `pairs` queue pairs (per-pair counters when more than one).
    pub fn with_pairs(pairs: usize) -> NetMetrics {
        NetMetrics {
            queues: if pairs > 1 {
                (0..pairs).map(|_| PairMetrics::default()).collect()
            } else {
                Vec::new()
            },
            ..NetMetrics::default()
        }
    }

    /// The metrics as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_adds_and_resets() {
        let metrics = NetMetrics::default();
        let mut c = TxCounters {
            frames: 3,
            bytes: 180,
            ..Default::default()
        };
        c.publish(&metrics.tx);
        assert_eq!(c, TxCounters::default());
        c.frames = 1;
        c.publish(&metrics.tx);
        assert_eq!(metrics.tx.frames.get(), 4);
        assert_eq!(metrics.tx.bytes.get(), 180);
        let json: serde_json::Value = serde_json::from_str(&metrics.to_json()).expect("valid JSON");
        assert_eq!(json["tx"]["frames"], 4);
        assert_eq!(json["rx"]["dropped_no_buffer"], 0);
        assert!(
            json.get("queues").is_none(),
            "one pair: no per-pair counters"
        );
    }

    #[test]
    fn pairs_have_their_own_counters() {
        assert!(NetMetrics::with_pairs(1).queues.is_empty());
        let metrics = NetMetrics::with_pairs(3);
        assert_eq!(metrics.queues.len(), 3);
        metrics.queues[2].rx.frames.add(5);
        let json: serde_json::Value = serde_json::from_str(&metrics.to_json()).expect("valid JSON");
        assert_eq!(json["queues"][2]["rx"]["frames"], 5);
        assert_eq!(json["queues"][0]["tx"]["frames"], 0);
    }
}
