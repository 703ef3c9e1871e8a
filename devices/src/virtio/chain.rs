//! Turning one descriptor chain into bounds-checked iovecs, refusing malformed chains.
//!
//! virtio-queue's `DescriptorChain` iterator already bounds a chain to `queue size` links
//! (so a loop ends), refuses nested indirect tables, misaligned or oversized indirect tables,
//! and a total length overflowing u32 — but it reports each of these by *ending the
//! iteration early*, indistinguishable from a chain's normal end. [`parse_chain`] detects that
//! (the last descriptor still has NEXT set, or nothing was yielded), and adds what virtio-queue
//! does not check: direction, buffer addresses inside guest memory, segment and length limits.

use vm_memory::GuestMemoryMmap;

use super::ring::Chain;
use crate::iovec::{IovecError, IovecList};

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
    /// No descriptor could be read: head out of range, or an unreadable/malformed indirect table.
    #[error("descriptor chain is empty or unreadable")]
    Empty,
    /// The chain ended while a descriptor still had NEXT set: a loop, a next index out of
    /// range, an unreadable or nested indirect table, or a total length overflowing u32.
    #[error("descriptor chain is truncated (loop, bad next index or malformed indirect table)")]
    Truncated,
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

/// Appends the buffers of `chain` to `iovs` and returns their total length.
///
/// On error, `iovs` is left as it was. `limit` bounds the total length.
pub fn parse_chain<'m>(
    chain: Chain<'m>,
    mem: &'m GuestMemoryMmap,
    direction: Direction,
    limit: u32,
    iovs: &mut IovecList<'m>,
) -> Result<u32, ChainError> {
    let start = iovs.len();
    let result = append_buffers(chain, mem, direction, limit, iovs);
    if result.is_err() {
        iovs.truncate(start);
    }
    result
}

fn append_buffers<'m>(
    chain: Chain<'m>,
    mem: &'m GuestMemoryMmap,
    direction: Direction,
    limit: u32,
    iovs: &mut IovecList<'m>,
) -> Result<u32, ChainError> {
    let mut total: u32 = 0;
    let mut any = false;
    let mut pending_next = false;
    for desc in chain {
        any = true;
        pending_next = desc.has_next();
        let writes = direction == Direction::DeviceWrites;
        if desc.is_write_only() != writes {
            return Err(ChainError::WrongDirection {
                addr: desc.addr().0,
            });
        }
        total = total
            .checked_add(desc.len())
            .filter(|t| *t <= limit)
            .ok_or(ChainError::TooLong { limit })?;
        iovs.push_guest_range(mem, desc.addr(), desc.len())?;
    }
    if !any {
        return Err(ChainError::Empty);
    }
    if pending_next {
        return Err(ChainError::Truncated);
    }
    Ok(total)
}
