//! Test frames: Ethernet frames of a given size with a recognisable payload.

/// Source MAC of generated frames (locally administered).
pub const SRC_MAC: [u8; 6] = [0x02, 0xc0, 0x70, 0x00, 0x00, 0x01];
/// Destination MAC of generated frames: nobody's, so a tap's host side drops them cheaply.
pub const DST_MAC: [u8; 6] = [0x02, 0xc0, 0x70, 0x00, 0x00, 0x02];
/// An experimental EtherType (IEEE 802 local experimental 1).
pub const ETHERTYPE: u16 = 0x88b5;
/// Smallest frame we generate (Ethernet header + sequence number).
pub const MIN_FRAME: usize = 14 + 4;

/// A `size`-byte Ethernet frame carrying `seq` after the header and a pattern after that.
pub fn test_frame(size: usize, seq: u32) -> Vec<u8> {
    let mut f = vec![0u8; size.max(MIN_FRAME)];
    write_test_frame(&mut f, seq);
    f
}

/// Makes `out` (at least [`MIN_FRAME`] bytes; false if shorter) the [`test_frame`] of its
/// length carrying `seq`, in place.
pub fn write_test_frame(out: &mut [u8], seq: u32) -> bool {
    if out.len() < MIN_FRAME {
        return false;
    }
    out[0..6].copy_from_slice(&DST_MAC);
    out[6..12].copy_from_slice(&SRC_MAC);
    out[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    out[14..18].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in out.iter_mut().enumerate().skip(MIN_FRAME) {
        *b = (i as u32).wrapping_add(seq) as u8;
    }
    true
}

/// The sequence number of a frame made by [`test_frame`], if it is one and intact.
pub fn check_frame(frame: &[u8]) -> Option<u32> {
    if frame.len() < MIN_FRAME || frame[12..14] != ETHERTYPE.to_be_bytes() {
        return None;
    }
    let seq = u32::from_le_bytes(frame[14..18].try_into().ok()?);
    let intact = frame
        .iter()
        .enumerate()
        .skip(MIN_FRAME)
        .all(|(i, b)| *b == (i as u32).wrapping_add(seq) as u8);
    intact.then_some(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_corruption_is_detected() {
        let f = test_frame(64, 77);
        assert_eq!(f.len(), 64);
        assert_eq!(check_frame(&f), Some(77));
        let mut bad = f.clone();
        bad[40] ^= 1;
        assert_eq!(check_frame(&bad), None);
        assert_eq!(check_frame(&f[..10]), None);
        let mut again = bad;
        assert!(write_test_frame(&mut again, 78));
        assert_eq!(again, test_frame(64, 78));
        assert!(!write_test_frame(&mut [0u8; 10], 1));
    }
}
