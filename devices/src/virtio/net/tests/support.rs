//! virtio-net test data (headers, frames), and the driver's side of the queues
//! ([`GuestQueue`], shared with benches and fuzzers in `crate::test_utils::queue`).

pub use crate::test_utils::queue::{guest_mem, GuestQueue, INDIRECT, MEM_SIZE, NEXT, WRITE};
use crate::virtio::net::VNET_HDR_LEN;

/// A virtio-net header with distinctive field values (flags NEEDS_CSUM, csum_start 34,
/// csum_offset 16) so tests can see it arrives untouched.
pub fn vnet_hdr() -> [u8; VNET_HDR_LEN] {
    [1, 0, 0, 0, 0, 0, 34, 0, 16, 0, 0, 0]
}

/// `len` bytes of a recognisable Ethernet-ish frame.
pub fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `vnet_hdr()` followed by `payload`.
pub fn wire(payload: &[u8]) -> Vec<u8> {
    let mut bytes = vnet_hdr().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}
