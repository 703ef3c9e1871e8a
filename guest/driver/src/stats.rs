//! Device statistics (VIRTIO_NET_F_DEVICE_STATS, virtio 1.3 §5.1.6.5.10): the device's own
//! per-queue counters, read over the control queue with class STATS.
//!
//! - QUERY ([`crate::VirtioNet::query_stats`]) answers the statistics types the device
//!   supports, a `le64` bitmap ([`StatsTypes`]).
//! - GET ([`crate::VirtioNet::get_stats`]) sends one 16-byte entry
//!   `{le16 vq_index; le16 reserved[3]; le64 types}` and receives one block per type set, in
//!   ascending bit order, each starting with the 8-byte header
//!   `{u8 type; u8 reserved; le16 vq_index; le16 reserved; le16 size}`. The reply buffer is
//!   sized exactly for those blocks (a device refuses a buffer of any other size).
//!
//! The driver asks only for the types it can parse ([`StatsTypes::PARSED`]: CVQ, RX_BASIC,
//! RX_SPEED, TX_BASIC, TX_SPEED) and trusts nothing in the reply: every block's type, queue
//! index and size must be the expected ones, or the whole reply is refused
//! ([`CtrlError::BadStatsReply`]).

use core::fmt;
use core::ops::{BitAnd, BitOr};

use crate::ctrl::REPLY_MAX;
use crate::error::CtrlError;

/// Class STATS (needs VIRTIO_NET_F_DEVICE_STATS).
pub const CLASS_STATS: u8 = 8;
/// STATS: no data; reply `le64 supported_stats_types`.
pub const STATS_QUERY: u8 = 0;
/// STATS: data one or more `{le16 vq_index; le16 reserved[3]; le64 types_bitmap}`; reply the
/// blocks.
pub const STATS_GET: u8 = 1;

/// Bytes of one GET entry.
pub(crate) const ENTRY_LEN: usize = 16;
/// Bytes of a block header.
pub const HEADER_LEN: usize = 8;

/// A set of statistics types (the bitmap of QUERY's reply and of a GET entry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StatsTypes(pub u64);

impl StatsTypes {
    /// The control queue's command counts.
    pub const CVQ: StatsTypes = StatsTypes(1 << 32);
    /// A receive queue's basic counters.
    pub const RX_BASIC: StatsTypes = StatsTypes(1 << 0);
    /// A receive queue's checksum counters (not parsed by this driver).
    pub const RX_CSUM: StatsTypes = StatsTypes(1 << 1);
    /// A receive queue's GSO counters (not parsed by this driver).
    pub const RX_GSO: StatsTypes = StatsTypes(1 << 2);
    /// A receive queue's rate-limit counters.
    pub const RX_SPEED: StatsTypes = StatsTypes(1 << 3);
    /// A transmit queue's basic counters.
    pub const TX_BASIC: StatsTypes = StatsTypes(1 << 16);
    /// A transmit queue's checksum counters (not parsed by this driver).
    pub const TX_CSUM: StatsTypes = StatsTypes(1 << 17);
    /// A transmit queue's GSO counters (not parsed by this driver).
    pub const TX_GSO: StatsTypes = StatsTypes(1 << 18);
    /// A transmit queue's rate-limit counters.
    pub const TX_SPEED: StatsTypes = StatsTypes(1 << 19);
    /// The types [`crate::VirtioNet::get_stats`] can ask for and parse.
    pub const PARSED: StatsTypes = StatsTypes(
        Self::CVQ.0 | Self::RX_BASIC.0 | Self::RX_SPEED.0 | Self::TX_BASIC.0 | Self::TX_SPEED.0,
    );
    /// The receive-queue types this driver parses.
    pub const RX: StatsTypes = StatsTypes(Self::RX_BASIC.0 | Self::RX_SPEED.0);
    /// The transmit-queue types this driver parses.
    pub const TX: StatsTypes = StatsTypes(Self::TX_BASIC.0 | Self::TX_SPEED.0);

    /// No type.
    pub const fn empty() -> StatsTypes {
        StatsTypes(0)
    }

    /// The bitmap.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// True if no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True if every type of `other` is in `self`.
    pub const fn contains(self, other: StatsTypes) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for StatsTypes {
    type Output = StatsTypes;
    fn bitor(self, rhs: StatsTypes) -> StatsTypes {
        StatsTypes(self.0 | rhs.0)
    }
}

impl BitAnd for StatsTypes {
    type Output = StatsTypes;
    fn bitand(self, rhs: StatsTypes) -> StatsTypes {
        StatsTypes(self.0 & rhs.0)
    }
}

impl fmt::Display for StatsTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Bytes of the block of the type with bit `bit` (header included), for the types this driver
/// parses.
const fn block_size(bit: u32) -> Option<usize> {
    match bit {
        // CVQ: command_num, ok_num.
        32 => Some(HEADER_LEN + 2 * 8),
        // RX_BASIC, TX_BASIC: six counters each.
        0 | 16 => Some(HEADER_LEN + 6 * 8),
        // RX_SPEED, TX_SPEED: two counters each.
        3 | 19 => Some(HEADER_LEN + 2 * 8),
        _ => None,
    }
}

/// Reply bytes of a GET of `types` (all parsed types), blocks in ascending bit order.
pub(crate) fn reply_len(types: StatsTypes) -> usize {
    (0..64)
        .filter(|bit| types.0 & (1 << bit) != 0)
        .filter_map(block_size)
        .sum()
}

/// The longest reply of one GET entry (every parsed type at once, which no queue has): it fits
/// the control queue's reply buffer.
pub(crate) const MAX_REPLY_LEN: usize = 24 + 56 + 24 + 56 + 24;
const _: () = assert!(MAX_REPLY_LEN <= REPLY_MAX);

/// The control queue's block (CVQ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CvqStats {
    /// Commands the device took from the control queue (the GET being answered included).
    pub command_num: u64,
    /// Commands it acknowledged with VIRTIO_NET_OK (the GET being answered excluded).
    pub ok_num: u64,
}

/// A receive queue's basic counters (RX_BASIC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxBasic {
    /// Notifications (kicks) the device received on the queue.
    pub rx_notifications: u64,
    /// Frames delivered to the driver.
    pub rx_packets: u64,
    /// Bytes of those frames (the device says which bytes it counts).
    pub rx_bytes: u64,
    /// Interrupts the device raised for the queue.
    pub rx_interrupts: u64,
    /// Frames dropped for any reason.
    pub rx_drops: u64,
    /// Frames dropped for want of driver buffers.
    pub rx_drop_overruns: u64,
}

/// A transmit queue's basic counters (TX_BASIC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxBasic {
    /// Notifications (kicks) the device received on the queue.
    pub tx_notifications: u64,
    /// Frames the device sent.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Interrupts the device raised for the queue.
    pub tx_interrupts: u64,
    /// Frames dropped for any reason.
    pub tx_drops: u64,
    /// Frames dropped as malformed.
    pub tx_drop_malformed: u64,
}

/// A receive queue's rate-limit counters (RX_SPEED).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxSpeed {
    /// Frames held back by the packets-per-second limit.
    pub rx_packets_allowance_exceeded: u64,
    /// Frames held back by the bytes-per-second limit.
    pub rx_bytes_allowance_exceeded: u64,
}

/// A transmit queue's rate-limit counters (TX_SPEED).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxSpeed {
    /// Frames held back by the packets-per-second limit.
    pub tx_packets_allowance_exceeded: u64,
    /// Frames held back by the bytes-per-second limit.
    pub tx_bytes_allowance_exceeded: u64,
}

/// One queue's statistics as one GET answered them: a block per type asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// The queue.
    pub vq_index: u16,
    /// CVQ, if asked for.
    pub cvq: Option<CvqStats>,
    /// RX_BASIC, if asked for.
    pub rx_basic: Option<RxBasic>,
    /// RX_SPEED, if asked for.
    pub rx_speed: Option<RxSpeed>,
    /// TX_BASIC, if asked for.
    pub tx_basic: Option<TxBasic>,
    /// TX_SPEED, if asked for.
    pub tx_speed: Option<TxSpeed>,
}

/// What was wrong with a GET reply the device acknowledged with VIRTIO_NET_OK
/// ([`CtrlError::BadStatsReply`]). `offset` is the block's byte offset in the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsReplyError {
    /// A block of another type than the next one asked for (blocks come in ascending bit
    /// order).
    Type {
        /// The block's offset.
        offset: usize,
        /// The type number expected.
        expected: u8,
        /// The type number found.
        found: u8,
    },
    /// A block for another queue than the one asked for.
    VqIndex {
        /// The block's offset.
        offset: usize,
        /// The queue asked for.
        expected: u16,
        /// The queue named in the block.
        found: u16,
    },
    /// A block whose size is not its type's (0, past the reply, or any other).
    Size {
        /// The block's offset.
        offset: usize,
        /// The block's type number.
        ty: u8,
        /// Its size in this driver's layout.
        expected: u16,
        /// The size in the header.
        found: u16,
    },
}

impl fmt::Display for StatsReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatsReplyError::Type {
                offset,
                expected,
                found,
            } => write!(
                f,
                "block at byte {offset} has type {found} (expected {expected})"
            ),
            StatsReplyError::VqIndex {
                offset,
                expected,
                found,
            } => write!(
                f,
                "block at byte {offset} is for queue {found} (asked for {expected})"
            ),
            StatsReplyError::Size {
                offset,
                ty,
                expected,
                found,
            } => write!(
                f,
                "block of type {ty} at byte {offset} has size {found} (expected {expected})"
            ),
        }
    }
}

/// `le64` number `i` after the header of the block at `at`.
fn counter(reply: &[u8], at: usize, i: usize) -> u64 {
    let start = at + HEADER_LEN + 8 * i;
    let mut b = [0u8; 8];
    b.copy_from_slice(&reply[start..start + 8]);
    u64::from_le_bytes(b)
}

/// Parses the reply of a GET of `types` for queue `vq`: one block per type, in ascending bit
/// order, each header checked before its counters are read. `reply` is exactly
/// [`reply_len`]`(types)` bytes.
pub(crate) fn parse(vq: u16, types: StatsTypes, reply: &[u8]) -> Result<DeviceStats, CtrlError> {
    let mut stats = DeviceStats {
        vq_index: vq,
        ..DeviceStats::default()
    };
    let mut at = 0usize;
    for bit in (0..64u32).filter(|bit| types.0 & (1 << bit) != 0) {
        // Only parsed types reach here (checked by the caller); the reply was sized for them.
        let Some(size) = block_size(bit) else {
            return Err(CtrlError::UnsupportedStats(types.0));
        };
        check_header(&reply[at..at + HEADER_LEN], at, bit, vq, size)?;
        fill(&mut stats, bit, |i| counter(reply, at, i));
        at += size;
    }
    Ok(stats)
}

/// Checks the header of the block at `at` (type `bit`, queue `vq`, `size` bytes).
fn check_header(header: &[u8], at: usize, bit: u32, vq: u16, size: usize) -> Result<(), CtrlError> {
    let bad = |e| Err::<(), _>(CtrlError::BadStatsReply(e));
    let (ty, index) = (header[0], u16::from_le_bytes([header[2], header[3]]));
    let found_size = u16::from_le_bytes([header[6], header[7]]);
    // `bit` < 64: fits a u8.
    let expected_ty = bit as u8;
    if ty != expected_ty {
        return bad(StatsReplyError::Type {
            offset: at,
            expected: expected_ty,
            found: ty,
        });
    }
    if index != vq {
        return bad(StatsReplyError::VqIndex {
            offset: at,
            expected: vq,
            found: index,
        });
    }
    if usize::from(found_size) != size {
        return bad(StatsReplyError::Size {
            offset: at,
            ty,
            // Block sizes are at most 56.
            expected: size as u16,
            found: found_size,
        });
    }
    Ok(())
}

/// Puts the block of type `bit` into `stats`, its counter `i` read by `c(i)`.
fn fill(stats: &mut DeviceStats, bit: u32, c: impl Fn(usize) -> u64) {
    match bit {
        32 => {
            stats.cvq = Some(CvqStats {
                command_num: c(0),
                ok_num: c(1),
            })
        }
        0 => {
            stats.rx_basic = Some(RxBasic {
                rx_notifications: c(0),
                rx_packets: c(1),
                rx_bytes: c(2),
                rx_interrupts: c(3),
                rx_drops: c(4),
                rx_drop_overruns: c(5),
            })
        }
        3 => {
            stats.rx_speed = Some(RxSpeed {
                rx_packets_allowance_exceeded: c(0),
                rx_bytes_allowance_exceeded: c(1),
            })
        }
        16 => {
            stats.tx_basic = Some(TxBasic {
                tx_notifications: c(0),
                tx_packets: c(1),
                tx_bytes: c(2),
                tx_interrupts: c(3),
                tx_drops: c(4),
                tx_drop_malformed: c(5),
            })
        }
        _ => {
            stats.tx_speed = Some(TxSpeed {
                tx_packets_allowance_exceeded: c(0),
                tx_bytes_allowance_exceeded: c(1),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_sizes_follow_the_spec() {
        assert_eq!(reply_len(StatsTypes::CVQ), 24);
        assert_eq!(reply_len(StatsTypes::RX_BASIC), 56);
        assert_eq!(reply_len(StatsTypes::RX), 80);
        assert_eq!(reply_len(StatsTypes::TX), 80);
        assert_eq!(reply_len(StatsTypes::PARSED), MAX_REPLY_LEN);
        assert_eq!(StatsTypes::PARSED.bits(), 0x1_0009_0009);
    }
}
