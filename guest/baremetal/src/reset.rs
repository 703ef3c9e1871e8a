//! `reset_queue=rx|tx reset_every=N`: per-queue resets (VIRTIO_F_RING_RESET) in the middle of
//! the `tx=` or `echo=` workload, and how the result line reports them.
//!
//! Every `N` frames sent (`tx=`) or echoed (`echo=`), the workload resets the named queue with
//! [`vnet_driver::VirtioNet::reset_queue`] and brings it back; the last frame is never followed
//! by a reset. A tx queue reset comes between bursts: the workload first waits until the device
//! returned every tx buffer, so no frame is in flight (any that still were would be counted in
//! `tx_not_sent`). An rx queue reset comes at once; frames the device had already written and
//! the workload had not polled are dropped (`rx_dropped`).

use core::fmt;

use vnet_driver::{QueueId, ResetCounters};

/// Most frames between two resets.
pub const MAX_RESET_EVERY: u64 = 1 << 32;

/// What `reset_queue=` and `reset_every=` ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResetPlan {
    /// The queue to reset.
    pub queue: QueueId,
    /// Frames between two resets (≥ 1).
    pub every: u64,
}

impl ResetPlan {
    /// The number of resets a workload of `n` frames makes: one after every `every` frames,
    /// none after the last.
    pub fn resets_for(&self, n: u64) -> u64 {
        n.saturating_sub(1) / self.every
    }
}

/// The result line's `"resets"` member: `null` without a plan, otherwise the plan and the
/// driver's reset counters.
pub struct ResetJson<'a>(pub Option<&'a (ResetPlan, ResetCounters)>);

impl fmt::Display for ResetJson<'_> {
    fn fmt(&self, w: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((plan, c)) = self.0 else {
            return w.write_str("null");
        };
        let queue = match plan.queue {
            QueueId::Rx => "rx",
            QueueId::Tx => "tx",
        };
        write!(
            w,
            "{{\"queue\":\"{queue}\",\"every\":{},\"rx\":{},\"tx\":{},\"failed\":{},\
             \"rx_reclaimed\":{},\"rx_dropped\":{},\"tx_not_sent\":{},\"tx_completed\":{}}}",
            plan.every,
            c.rx_resets,
            c.tx_resets,
            c.failed,
            c.rx_buffers_reclaimed,
            c.rx_buffers_dropped_at_reset,
            c.tx_frames_not_sent,
            c.tx_completed_at_reset,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::{parse, BadValue};
    use std::string::ToString;

    #[test]
    fn words_parse_and_validate() {
        let o = parse("tx=100 reset_queue=rx reset_every=10").expect("valid");
        assert_eq!(
            o.reset,
            Some(ResetPlan {
                queue: QueueId::Rx,
                every: 10
            })
        );
        let o = parse("echo=5 reset_every=0x2 reset_queue=tx").expect("valid");
        assert_eq!(o.reset.map(|p| (p.queue, p.every)), Some((QueueId::Tx, 2)));
        assert_eq!(parse("tx=5").expect("valid").reset, None);
        for (line, key, value) in [
            ("tx=5 reset_queue=ctrl reset_every=1", "reset_queue", "ctrl"),
            ("tx=5 reset_queue=rx reset_every=0", "reset_every", "0"),
            ("tx=5 reset_queue=rx reset_every=x", "reset_every", "x"),
            ("tx=5 reset_queue=rx", "reset_queue", "needs reset_every="),
            ("tx=5 reset_every=3", "reset_every", "needs reset_queue="),
            (
                "reset_queue=rx reset_every=3",
                "reset_queue",
                "only with tx= or echo=",
            ),
        ] {
            assert_eq!(parse(line), Err(BadValue { key, value }), "{line}");
        }
    }

    #[test]
    fn resets_for_a_workload() {
        let plan = ResetPlan {
            queue: QueueId::Rx,
            every: 100,
        };
        assert_eq!(plan.resets_for(0), 0);
        assert_eq!(plan.resets_for(100), 0);
        assert_eq!(plan.resets_for(101), 1);
        assert_eq!(plan.resets_for(1000), 9);
    }

    #[test]
    fn json_member() {
        assert_eq!(ResetJson(None).to_string(), "null");
        let plan = ResetPlan {
            queue: QueueId::Tx,
            every: 50,
        };
        let c = ResetCounters {
            tx_resets: 3,
            tx_completed_at_reset: 0,
            tx_frames_not_sent: 1,
            ..ResetCounters::default()
        };
        assert_eq!(
            ResetJson(Some(&(plan, c))).to_string(),
            "{\"queue\":\"tx\",\"every\":50,\"rx\":0,\"tx\":3,\"failed\":0,\"rx_reclaimed\":0,\
             \"rx_dropped\":0,\"tx_not_sent\":1,\"tx_completed\":0}"
        );
    }
}
