//! What a descriptor chain may be refused for. Chains are walked by
//! [`super::vring::Virtqueue`]'s ring half, which reports every way a chain can be malformed
//! (virtio-queue's iterator only ends early), adds what virtio-queue does not check (direction,
//! buffers inside guest memory, segment, length and descriptor-count limits), and bounds the
//! work a chain may cost.

use crate::iovec::IovecError;

/// Which way the device accesses a chain's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The device only reads (e.g. transmit): no descriptor may be write-only.
    DeviceReads,
    /// The device only writes (e.g. receive): every descriptor must be write-only.
    DeviceWrites,
}

/// Why a chain was refused. The chain itself is still returned to the driver (length 0).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    /// The chain ended while a descriptor still had NEXT set: a loop or a next index out of
    /// range.
    #[error("descriptor chain is truncated (loop or bad next index)")]
    Truncated,
    /// An indirect table that is empty, not a whole number of descriptors, outside guest
    /// memory, longer than 65535 entries, or nested.
    #[error("malformed indirect descriptor table")]
    BadIndirectTable,
    /// The chain links more descriptors than any frame needs
    /// ([`super::vring::MAX_CHAIN_DESCRIPTORS`]).
    #[error("descriptor chain links too many descriptors")]
    TooManyDescriptors,
    /// A descriptor's direction contradicts the queue's.
    #[error("descriptor at {addr:#x} has the wrong direction")]
    WrongDirection {
        /// Guest address of the offending buffer.
        addr: u64,
    },
    /// A buffer is not entirely inside guest memory, or has too many segments.
    #[error("bad buffer")]
    Buffer(#[from] IovecError),
    /// The buffers add up to more than the caller allows.
    #[error("descriptor chain longer than {limit} bytes")]
    TooLong {
        /// The limit.
        limit: u32,
    },
}
