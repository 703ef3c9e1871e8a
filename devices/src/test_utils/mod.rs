//! Helpers for tests, benches, fuzzers and test harnesses (the `test-utils` feature; always
//! built for this crate's own tests). Not part of the device API.
//!
//! - [`queue`]: the driver's side of a split virtqueue in guest memory ([`queue::GuestQueue`]).
//! - [`packed`]: the driver's side of a packed virtqueue in guest memory
//!   ([`packed::GuestPackedQueue`]).
//! - [`mmio`]: the driver's side of the virtio-mmio registers ([`mmio::Registers`]) and waits.
//! - [`netns`]: network namespaces: a per-thread private one ([`netns::in_netns`]) and named
//!   ones managed with `ip netns` ([`netns::NetNs`]).
//! - [`link`]: interface helpers: link state, `ifreq`s, packet sockets.

#![warn(missing_docs)]

pub mod link;
pub mod mmio;
pub mod netns;
pub mod packed;
pub mod queue;
