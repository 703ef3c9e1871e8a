//! `virtio_net_hdr_v1`: the 12-byte header before every frame in both directions.

/// Size of `virtio_net_hdr_v1` (VERSION_1 is always negotiated).
pub const VNET_HDR_LEN: usize = 12;

/// Offset of `num_buffers` in the header.
pub(crate) const NUM_BUFFERS_OFFSET: usize = 10;

/// `flags`: the checksum from `csum_start` on must be completed.
pub const HDR_F_NEEDS_CSUM: u8 = 1;
/// `flags`: the checksum is already validated.
pub const HDR_F_DATA_VALID: u8 = 2;
/// `gso_type`: not a GSO frame.
pub const HDR_GSO_NONE: u8 = 0;

/// `virtio_net_hdr_v1`, decoded. All fields are little endian on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioNetHdr {
    /// `HDR_F_*`.
    pub flags: u8,
    /// `HDR_GSO_*`.
    pub gso_type: u8,
    /// Length of the headers to copy into each GSO segment.
    pub hdr_len: u16,
    /// Segment size for GSO.
    pub gso_size: u16,
    /// Where checksumming starts (NEEDS_CSUM).
    pub csum_start: u16,
    /// Where the checksum goes, from `csum_start` (NEEDS_CSUM).
    pub csum_offset: u16,
    /// Receive with MRG_RXBUF: how many buffers the frame spans. Zero on transmit.
    pub num_buffers: u16,
}

impl VirtioNetHdr {
    /// The wire form.
    pub fn to_bytes(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b
    }

    /// Decodes the wire form.
    pub fn from_bytes(b: &[u8; VNET_HDR_LEN]) -> VirtioNetHdr {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
            num_buffers: u16_at(NUM_BUFFERS_OFFSET),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout() {
        let hdr = VirtioNetHdr {
            flags: HDR_F_NEEDS_CSUM,
            gso_type: HDR_GSO_NONE,
            hdr_len: 0x0102,
            gso_size: 0x0304,
            csum_start: 0x0506,
            csum_offset: 0x0708,
            num_buffers: 0x090a,
        };
        let bytes = hdr.to_bytes();
        assert_eq!(bytes, [1, 0, 2, 1, 4, 3, 6, 5, 8, 7, 0x0a, 0x09]);
        assert_eq!(VirtioNetHdr::from_bytes(&bytes), hdr);
        assert_eq!(VirtioNetHdr::default().to_bytes(), [0; VNET_HDR_LEN]);
    }
}
