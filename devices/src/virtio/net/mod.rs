//! virtio-net: a device with an rx and a tx queue per queue pair (1..=16, one backend and one
//! worker thread each) and a control queue, in front of a [`NetBackend`].
//!
//! - [`config`] holds the user's description ([`NetConfig`]).
//! - [`device`] is the [`VirtioDevice`](crate::virtio::VirtioDevice) (features, config space,
//!   activation, link status).
//! - [`tx`] and [`rx`] are the datapath, plain functions over (queue, memory, backend, counters),
//!   generic over the backend, usable by the worker, tests, benches and fuzzers.
//! - [`tuning`] holds the runtime knobs (interrupt coalescing, EVENT_IDX suppression) and the
//!   [`TuningControl`] that hands changes to the worker.
//! - `worker` is the per-device thread and its epoll loop.
//! - [`adapt`] moves the busy-poll window and the interrupt coalescing with the traffic
//!   (`adaptive=on`), within the operator's bounds.
//! - [`ctrl`] parses the control queue's commands (CTRL_VQ: RX mode, MAC, guest offloads and
//!   NOTF_COAL, the guest's interrupt coalescing); the worker carries them out.
//! - [`metrics`] holds the counters.
//!
//! Wiring one device (the VMM side; the KVM calls are the VMM's own):
//!
//! ```no_run
//! use devices::virtio::net::{NetConfig, NetDevice};
//! use devices::virtio::MmioTransport;
//! # fn wire(mem: vm_memory::GuestMemoryMmap) -> Result<(), Box<dyn std::error::Error>> {
//! # let mmio_base = 0xd000_0000;
//! let config: NetConfig = "tap=tap0,queue_size=256".parse()?;
//! let mut device = NetDevice::new(&config)?; // opens or creates the tap, starts the worker
//! # let seccomp_filter: Option<std::sync::Arc<seccompiler::BpfProgram>> = None;
//! if let Some(filter) = seccomp_filter {
//!     device.set_worker_seccomp_filter(filter)?; // installed by the worker, before any guest data
//! }
//! let metrics = device.metrics(); // Arc<NetMetrics>; metrics.to_json() is one line
//! let link = device.link_control(); // set_link(LinkState::Down) later, from any thread
//! let tuning = device.tuning_control(); // set(NetTuning { .. }) later: coalescing, EVENT_IDX
//! let transport = MmioTransport::new(mem.clone(), Box::new(device))?;
//! for (eventfd, notify_addr, queue_index) in transport.ioeventfds(mmio_base) {
//!     // vm.register_ioevent(eventfd, &IoEventAddress::Mmio(notify_addr), queue_index)?;
//!     # let _ = (eventfd, notify_addr, queue_index);
//! }
//! // vm.register_irqfd(transport.irqfd(), gsi)?;
//! // Put `transport` on the MMIO bus at mmio_base (size MMIO_WINDOW_SIZE) and tell the guest
//! // (kernel cmdline `virtio_mmio.device=4K@0xd0000000:GSI`).
//! // At exit: drop it (or call `transport.shutdown()`): the worker thread is joined.
//! # let _ = (metrics, link, tuning);
//! # Ok(()) }
//! ```
//!
//! [`NetBackend`]: crate::backend::NetBackend

pub mod adapt;
pub mod config;
pub mod ctrl;
pub mod device;
mod link;
pub mod local_ctrl;
pub mod metrics;
mod moderation;
pub mod rate_limiter;
pub mod rx;
pub mod stats;
pub mod tuning;
pub mod tx;
pub mod vhost_user;
mod worker;

#[cfg(test)]
pub(crate) mod tests;

pub use config::{BackendKind, MacAddr, NetConfig, NetConfigError};
pub use device::{NetDevice, NetError};
pub use link::{LinkControl, LinkState};
pub use metrics::NetMetrics;
pub use rate_limiter::{BucketConfig, RateLimiterConfig, RateLimiterError};
pub use rx::{process_rx, RxMode, RxOutcome, RxQueue, RxStop};
pub use tuning::{
    Adaptive, CoalescingInForce, CoalescingSource, DirectionCoalescing, InterruptCoalescing,
    KickCoalescing, NetTuning, NetTuningUpdate, TuningControl, TuningError, DEFAULT_TX_BUDGET,
    MAX_BUSY_POLL_USECS, MAX_KICK_COALESCE_USECS, MAX_TX_BUDGET,
};
pub use tx::{process_tx, TxOutcome, TxQueue, TxStop};
pub use worker::WorkerThreadError;

use crate::virtio::vring::InterruptDecision;

/// Size of `virtio_net_hdr_v1` (VERSION_1 is always negotiated).
pub const VNET_HDR_LEN: usize = 12;
/// Largest Ethernet frame (including GSO frames) a tx chain may carry after its header.
pub const MAX_FRAME_LEN: u32 = 65536;

/// The longest frame without segmentation offload: Ethernet header + a 1500-byte MTU. Longer
/// frames are counted in `large_frames`.
pub const MTU_FRAME_LEN: u64 = 1514;
/// Index of the receive queue.
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue.
pub const TX_QUEUE: usize = 1;
/// Number of datapath queues of one queue pair (rx and tx).
pub const NUM_QUEUES: usize = 2;
/// Index of the control queue with one queue pair (VIRTIO_NET_F_CTRL_VQ: it follows tx; with N
/// pairs under VIRTIO_NET_F_MQ it is queue 2N).
pub const CTRL_QUEUE: usize = 2;

/// Rate-limits a log line about repeated failures: the first failure of a burst is reported
/// at once, later ones at most every [`BurstLog::QUIET`] with how many went unreported.
#[derive(Debug, Default)]
pub(crate) struct BurstLog {
    last: Option<std::time::Instant>,
    unreported: u64,
}

impl BurstLog {
    /// Minimum time between two reports.
    pub(crate) const QUIET: std::time::Duration = std::time::Duration::from_secs(10);

    /// Records a failure at `now`; `Some(n)` if it should be reported, `n` being the failures
    /// since the last report that were not.
    pub(crate) fn failure(&mut self, now: std::time::Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < Self::QUIET => {
                self.unreported += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.unreported))
            }
        }
    }
}

/// Used entries written before the used index is stored (and the driver sees them) within a
/// call; the interrupt decision is still taken once per call.
pub const USED_PUBLISH_BATCH: usize = 32;

/// A queue's counters of interrupt decisions.
trait CountInterrupts {
    /// Counts a call's decision; returns (needs interrupt, suppressed by EVENT_IDX).
    fn count_interrupt(&mut self, decision: Option<InterruptDecision>) -> (bool, bool);
}

macro_rules! count_interrupts {
    ($($counters:ty),*) => {$(
        impl CountInterrupts for $counters {
            fn count_interrupt(&mut self, decision: Option<InterruptDecision>) -> (bool, bool) {
                match decision {
                    None => (false, false),
                    Some(InterruptDecision::Raise) => {
                        self.interrupts_raised += 1;
                        (true, false)
                    }
                    Some(InterruptDecision::SuppressedByEventIdx) => {
                        self.interrupts_suppressed_event_idx += 1;
                        (false, true)
                    }
                    Some(InterruptDecision::SuppressedByFlag) => {
                        self.interrupts_suppressed_no_interrupt += 1;
                        (false, false)
                    }
                }
            }
        }
    )*};
}

count_interrupts!(metrics::RxCounters, metrics::TxCounters);

#[cfg(test)]
mod burst_log_tests {
    use std::time::{Duration, Instant};

    use super::BurstLog;

    #[test]
    fn the_first_failure_of_a_burst_is_reported_then_one_per_quiet_period() {
        let t0 = Instant::now();
        let mut log = BurstLog::default();
        assert_eq!(log.failure(t0), Some(0));
        for ms in 1..100 {
            assert_eq!(log.failure(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(log.failure(t0 + BurstLog::QUIET), Some(99));
        assert_eq!(log.failure(t0 + BurstLog::QUIET), None);
        // A new burst after a quiet spell is reported at once.
        assert_eq!(log.failure(t0 + BurstLog::QUIET * 3), Some(1));
    }
}
