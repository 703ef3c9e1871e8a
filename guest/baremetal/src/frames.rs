//! The test frames the workloads send and the host-side tests check.
//!
//! Layout (`len` bytes, 20 ≤ len):
//!
//! | bytes   | content                                         |
//! |---------|-------------------------------------------------|
//! | 0..6    | destination MAC (unicast)                       |
//! | 6..12   | source MAC (the device's)                       |
//! | 12..14  | EtherType 0x88b5 (IEEE local experimental 1)    |
//! | 14..18  | sequence number, u32 little endian              |
//! | 18..20  | frame length, u16 little endian                 |
//! | 20..len | byte `i` is `(seq + i) as u8`                   |
//!
//! The experimental EtherType keeps the host from treating the frames as IP. The payload
//! depends on the sequence number, so a stale or shifted buffer shows; it is a slice of a ramp,
//! so building a frame is one copy (cheap where kernel-mode code is emulated).

/// The EtherType of test frames.
pub const ETHERTYPE: u16 = 0x88b5;
/// Bytes before the pattern.
pub const HEADER_LEN: usize = 20;

/// A ramp `0, 1, 2, …` long enough to cut any frame's pattern from.
pub struct Ramp {
    bytes: alloc::vec::Vec<u8>,
    max_len: usize,
}

impl Ramp {
    /// A ramp for frames of up to `max_len` bytes.
    pub fn new(max_len: usize) -> Ramp {
        Ramp {
            bytes: (0..max_len + 256).map(|i| i as u8).collect(),
            max_len,
        }
    }

    /// Writes test frame `seq` into `out` (its length is the frame length, at least
    /// [`HEADER_LEN`] and at most the ramp's `max_len`). Returns false if it does not fit.
    pub fn fill(&self, out: &mut [u8], dst: [u8; 6], src: [u8; 6], seq: u32) -> bool {
        let len = out.len();
        if !(HEADER_LEN..=self.max_len).contains(&len) {
            return false;
        }
        let Ok(len16) = u16::try_from(len) else {
            return false;
        };
        let start = (seq as usize + HEADER_LEN) % 256;
        let Some(pattern) = self.bytes.get(start..start + len - HEADER_LEN) else {
            return false;
        };
        out[0..6].copy_from_slice(&dst);
        out[6..12].copy_from_slice(&src);
        out[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        out[14..18].copy_from_slice(&seq.to_le_bytes());
        out[18..20].copy_from_slice(&len16.to_le_bytes());
        out[HEADER_LEN..].copy_from_slice(pattern);
        true
    }
}

/// True if `frame` carries the test EtherType.
pub fn is_test_frame(frame: &[u8]) -> bool {
    frame.len() >= HEADER_LEN && frame[12..14] == ETHERTYPE.to_be_bytes()
}

/// Checks a received test frame: its EtherType, length field and pattern. Returns its
/// sequence number.
pub fn check(frame: &[u8]) -> Option<u32> {
    if !is_test_frame(frame) {
        return None;
    }
    let seq = u32::from_le_bytes([frame[14], frame[15], frame[16], frame[17]]);
    let len = u16::from_le_bytes([frame[18], frame[19]]);
    if usize::from(len) != frame.len() {
        return None;
    }
    frame
        .iter()
        .enumerate()
        .skip(HEADER_LEN)
        .all(|(i, &b)| b == (seq as usize + i) as u8)
        .then_some(seq)
}

/// What [`SeqCheck`] found in the received test frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeqCounts {
    /// Frames that failed [`check`] (length field, pattern) or came on an unknown pair.
    pub bad: u64,
    /// Frames lost: the sum of the forward gaps in each pair's sequence numbers.
    pub lost: u64,
    /// Frames behind the pair's next expected sequence number (out of order or duplicated).
    pub reordered: u64,
}

/// The `rx=` workload's check of received test frames: each one's pattern ([`check`]) and its
/// sequence number, in one sequence space per queue pair starting at 0 (as the VMM's
/// `backend=source` generates them).
pub struct SeqCheck {
    /// Per pair: the sequence number expected next.
    next: alloc::vec::Vec<u32>,
    /// What was found so far.
    pub counts: SeqCounts,
}

impl SeqCheck {
    /// A check of `pairs` sequence spaces.
    pub fn new(pairs: usize) -> SeqCheck {
        SeqCheck {
            next: alloc::vec![0; pairs],
            counts: SeqCounts::default(),
        }
    }

    /// Checks one test frame received on `pair`. A sequence number ahead of the expected one
    /// counts the gap as lost and moves on past it; one behind it (less than 2³¹ behind, in
    /// wrapping arithmetic) counts as reordered and leaves the expectation alone.
    pub fn frame(&mut self, pair: usize, frame: &[u8]) {
        let (Some(seq), Some(next)) = (check(frame), self.next.get_mut(pair)) else {
            self.counts.bad += 1;
            return;
        };
        let ahead = seq.wrapping_sub(*next);
        if ahead < 1 << 31 {
            self.counts.lost += u64::from(ahead);
            *next = seq.wrapping_add(1);
        } else {
            self.counts.reordered += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_check() {
        let ramp = Ramp::new(64);
        let mut c = SeqCheck::new(2);
        let mut f = [0u8; 64];
        let mut feed = |c: &mut SeqCheck, pair: usize, seq: u32| {
            assert!(ramp.fill(&mut f, [2, 0, 0, 0, 0, 1], [2, 0x53, 0x52, 0x43, 0, 1], seq));
            c.frame(pair, &f);
        };
        for seq in 0..10 {
            feed(&mut c, 0, seq);
            feed(&mut c, 1, seq);
        }
        assert_eq!(c.counts, SeqCounts::default());
        // Pair 0 loses 10..13, then gets 12 late and 14 twice; pair 1 is unaffected.
        feed(&mut c, 0, 13);
        feed(&mut c, 0, 12);
        feed(&mut c, 0, 14);
        feed(&mut c, 0, 14);
        feed(&mut c, 1, 10);
        assert_eq!(
            c.counts,
            SeqCounts {
                bad: 0,
                lost: 3,
                reordered: 2
            }
        );
        // An unknown pair, a corrupted byte, a wrong length field.
        feed(&mut c, 2, 0);
        let mut bad = [0u8; 64];
        assert!(ramp.fill(&mut bad, [0; 6], [0; 6], 15));
        bad[40] ^= 0x80;
        c.frame(0, &bad);
        assert!(ramp.fill(&mut bad, [0; 6], [0; 6], 15));
        bad[18] = 63;
        c.frame(0, &bad);
        assert_eq!((c.counts.bad, c.counts.lost), (3, 3));
        // Sequence numbers wrap.
        let mut c = SeqCheck::new(1);
        c.next[0] = u32::MAX - 1;
        feed(&mut c, 0, u32::MAX);
        feed(&mut c, 0, 0);
        feed(&mut c, 0, 2);
        feed(&mut c, 0, u32::MAX);
        assert_eq!(
            c.counts,
            SeqCounts {
                bad: 0,
                lost: 2,
                reordered: 1
            }
        );
    }

    #[test]
    fn frames_round_trip() {
        let ramp = Ramp::new(1514);
        for (len, seq) in [(20, 0u32), (60, 7), (1514, 0xdead_beef), (300, 255)] {
            let mut f = alloc::vec![0u8; len];
            assert!(ramp.fill(&mut f, [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], seq));
            assert_eq!(&f[12..14], &[0x88, 0xb5]);
            assert_eq!(check(&f), Some(seq));
            if len > HEADER_LEN {
                f[len - 1] ^= 1;
                assert_eq!(check(&f), None);
            }
        }
        let mut too_long = alloc::vec![0u8; 1600];
        assert!(!ramp.fill(&mut too_long, [0; 6], [0; 6], 0));
        assert!(!ramp.fill(&mut [0u8; 10], [0; 6], [0; 6], 0));
        assert_eq!(check(&[0u8; 10]), None);
    }
}
