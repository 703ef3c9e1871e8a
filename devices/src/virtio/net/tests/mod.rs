//! virtio-net device tests: guest memory, a driver playing the other side of the rings
//! (`support`), and the socket-pair backend. No KVM, no root.

mod adaptive;
mod bounds;
mod ctrl;
mod driver;
mod hostile;
mod kicks;
mod limits;
mod measure;
mod mq;
mod notify;
mod packed;
mod reset;
mod rx;
pub(crate) mod support;
mod tuning;
mod tx;
mod worker;
