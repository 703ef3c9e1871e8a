//! `reset_queue=` and `reset_every=` as they are met on the command line, turned into a
//! [`ResetPlan`] once the whole line is read.

use vnet_driver::QueueId;

use super::{BadValue, Workload};
use crate::reset::{ResetPlan, MAX_RESET_EVERY};

/// The two words as they are met on the command line.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResetWords {
    queue: Option<QueueId>,
    every: Option<u64>,
}

impl ResetWords {
    /// Takes `key=value` if it is one of the two words: `None` if `key` is another word,
    /// `Some(false)` for a bad value.
    pub fn take(&mut self, key: &str, value: &str) -> Option<bool> {
        match key {
            "reset_queue" => {
                self.queue = match value {
                    "rx" => Some(QueueId::Rx),
                    "tx" => Some(QueueId::Tx),
                    _ => return Some(false),
                };
            }
            "reset_every" => {
                let every = parse_u64(value).filter(|n| (1..=MAX_RESET_EVERY).contains(n));
                if every.is_none() {
                    return Some(false);
                }
                self.every = every;
            }
            _ => return None,
        }
        Some(true)
    }

    /// The plan, once the whole command line is read: both words or neither, and only with a
    /// `tx=` or `echo=` workload.
    pub fn finish(self, workload: Workload) -> Result<Option<ResetPlan>, BadValue<'static>> {
        let plan = match (self.queue, self.every) {
            (None, None) => return Ok(None),
            (Some(queue), Some(every)) => ResetPlan { queue, every },
            (Some(_), None) => {
                return Err(BadValue {
                    key: "reset_queue",
                    value: "needs reset_every=",
                })
            }
            (None, Some(_)) => {
                return Err(BadValue {
                    key: "reset_every",
                    value: "needs reset_queue=",
                })
            }
        };
        match workload {
            Workload::Tx(_) | Workload::Echo(_) => Ok(Some(plan)),
            _ => Err(BadValue {
                key: "reset_queue",
                value: "only with tx= or echo=",
            }),
        }
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}
