//! Ring-level errors and the ring's public vocabulary, re-exported from [`super::vring`] where
//! the ring lives (this module depends on it, never the other way round).

pub use super::vring::{vring_need_event, InterruptDecision, RingError, RingPart};
