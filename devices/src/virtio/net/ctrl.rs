//! The control virtqueue (VIRTIO_NET_F_CTRL_VQ, queue 2; virtio 1.2 §5.1.6.5): the wire
//! format, and the parser that turns one command into a validated [`CtrlCommand`] or a
//! [`CtrlError`]. The worker pops the chains, walks them with the ring code's hostile-input-safe
//! walk ([`crate::virtio::vring`]), carries the commands out and writes the ack.
//!
//! A command is a descriptor chain: device-readable `u8 class; u8 command;` and the command's
//! data, then device-writable: one `u8 ack` (`VIRTIO_NET_OK` 0, `VIRTIO_NET_ERR` 1) and the
//! command's result (VQ_GET: 8 bytes; STATS: see [`super::stats`]), in that order (virtio 1.3
//! §5.1.6.5, and how Linux lays it out). The device acks OK only for what it did, and ERR
//! for an unknown class or command, a command whose feature was not negotiated, data or reply
//! space of the wrong length, and values out of range; a chain with no writable byte (or one
//! the ring walk refuses) cannot be acked and goes back with used length 0. Every outcome is
//! counted (`ctrl` in the metrics).
//!
//! Semantics:
//! - **RX** PROMISC / ALLMULTI (`u8` 0 or 1, with CTRL_RX): recorded, acked OK. A tap has no
//!   receive filter: it passes every frame the host bridges or routes to it, so both are
//!   no-ops (the guest sees what it would see in promiscuous mode anyway).
//! - **MAC** TABLE_SET (CTRL_RX; two `le32 entries; u8 macs[entries][6]` tables, exactly):
//!   recorded (the counts), acked OK; no filtering, as above. ADDR_SET (CTRL_MAC_ADDR; 6
//!   bytes, unicast, not all zero): the `mac` config field reads the new address (the
//!   configuration generation moves, no configuration interrupt: the driver set it). A device
//!   reset restores the configured MAC.
//! - **GUEST_OFFLOADS** SET (CTRL_GUEST_OFFLOADS; `le64` of GUEST_CSUM/TSO4/TSO6/ECN/UFO
//!   feature bits, each negotiated): the tap's offloads (TUNSETOFFLOAD); ERR if the tap
//!   refuses them (they stay as they were).
//! - **NOTF_COAL** TX_SET / RX_SET (NOTF_COAL; `le32 max_packets; le32 max_usecs`) and VQ_SET /
//!   VQ_GET on queue 0 (rx) or 1 (tx) (VQ_NOTF_COAL; `le16 vqn; le16 reserved;` then the two
//!   `le32`): the interrupt coalescing of that direction, validated like the operator's knob
//!   ([`InterruptCoalescing::from_guest`]). See `moderation::Coalescing::Split` for
//!   how two directions share the one interrupt line.
//! - **STATS** QUERY / GET (DEVICE_STATS): the device's counters, read from its metrics; the
//!   wire format, the supported types and the checks are in [`super::stats`].

use virtio_bindings::virtio_net::*;

use super::config::MacAddr;
use super::stats;
use super::tuning::InterruptCoalescing;
use crate::backend::Offloads;

/// Size of the control queue.
pub const CTRL_QUEUE_SIZE: u16 = 64;
/// Most bytes a command's readable part may have (header and data): MAC tables of 10 000
/// addresses fit.
pub const MAX_CTRL_READABLE: u32 = 64 * 1024;
/// Chains one call handles before the worker looks at its other events (it comes back
/// without waiting for a kick).
pub const CTRL_CHAINS_PER_CALL: usize = 16;
/// The ack values.
pub const ACK_OK: u8 = VIRTIO_NET_OK as u8;
/// See [`ACK_OK`].
pub const ACK_ERR: u8 = VIRTIO_NET_ERR as u8;

const fn bit(feature: u32) -> u64 {
    1 << feature
}

/// Class STATS and its commands as the parser's match compares them.
const STATS: u32 = stats::VIRTIO_NET_CTRL_STATS as u32;
const STATS_QUERY: u32 = stats::VIRTIO_NET_CTRL_STATS_QUERY as u32;
const STATS_GET: u32 = stats::VIRTIO_NET_CTRL_STATS_GET as u32;

/// The guest offload feature bits GUEST_OFFLOADS_SET may carry.
const GUEST_OFFLOAD_BITS: [(u32, Offloads); 5] = [
    (VIRTIO_NET_F_GUEST_CSUM, Offloads::CSUM),
    (VIRTIO_NET_F_GUEST_TSO4, Offloads::TSO4),
    (VIRTIO_NET_F_GUEST_TSO6, Offloads::TSO6),
    (VIRTIO_NET_F_GUEST_ECN, Offloads::TSO_ECN),
    (VIRTIO_NET_F_GUEST_UFO, Offloads::UFO),
];

/// A validated control command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlCommand {
    /// RX PROMISC.
    Promisc(bool),
    /// RX ALLMULTI.
    AllMulti(bool),
    /// MAC TABLE_SET: the number of unicast and multicast entries.
    MacTable {
        /// Unicast entries.
        unicast: u32,
        /// Multicast entries.
        multicast: u32,
    },
    /// MAC ADDR_SET.
    MacAddr(MacAddr),
    /// GUEST_OFFLOADS SET, as tap offloads.
    GuestOffloads(Offloads),
    /// NOTF_COAL RX_SET / TX_SET / VQ_SET: direction (0 rx, 1 tx) and bounds.
    SetCoalescing(usize, InterruptCoalescing),
    /// NOTF_COAL VQ_GET: direction (0 rx, 1 tx).
    GetCoalescing(usize),
    /// MQ VQ_PAIRS_SET: the queue pairs the device must use (1..=max_virtqueue_pairs).
    SetPairs(u16),
    /// STATS QUERY: the statistics types the device supports.
    QueryStats,
    /// STATS GET: `requests` validated requests (read again from the same bytes with
    /// [`stats::requests`]) whose reply takes `reply_len` bytes.
    GetStats {
        /// Requests.
        requests: u16,
        /// Bytes of the reply.
        reply_len: u32,
    },
}

impl CtrlCommand {
    /// Bytes of reply the command writes before the ack.
    pub fn reply_len(&self) -> u32 {
        match self {
            CtrlCommand::GetCoalescing(_) | CtrlCommand::QueryStats => 8,
            CtrlCommand::GetStats { reply_len, .. } => *reply_len,
            _ => 0,
        }
    }
}

/// Why a command is acked ERR (or cannot be acked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CtrlError {
    /// The readable part is shorter than the 2-byte header.
    #[error("command shorter than its header")]
    ShortHeader,
    /// Unknown class or command.
    #[error("unknown command {class}.{command}")]
    Unsupported {
        /// Class.
        class: u8,
        /// Command.
        command: u8,
    },
    /// The command's feature was not negotiated.
    #[error("command {class}.{command} needs a feature the driver did not negotiate")]
    NotNegotiated {
        /// Class.
        class: u8,
        /// Command.
        command: u8,
    },
    /// The data (or the writable reply space) has the wrong length.
    #[error("command {class}.{command}: wrong data or reply length")]
    BadLength {
        /// Class.
        class: u8,
        /// Command.
        command: u8,
    },
    /// A value out of range (a flag other than 0/1, a multicast or zero MAC, an offload not
    /// negotiated, a queue that is not rx or tx, coalescing bounds the device refuses).
    #[error("command {class}.{command}: value out of range")]
    OutOfRange {
        /// Class.
        class: u8,
        /// Command.
        command: u8,
    },
    /// The backend refused the change (GUEST_OFFLOADS_SET).
    #[error("the backend refused the change")]
    Backend,
}

fn read_array<const N: usize>(bytes: &[u8], offset: u32) -> Option<[u8; N]> {
    let start = usize::try_from(offset).ok()?;
    bytes.get(start..start.checked_add(N)?)?.try_into().ok()
}

/// Parses and validates one command: `readable` is the chain's device-readable part (header
/// and data), `writable_len` the device-writable bytes (reply and ack, at least 1: a chain
/// without them is not parsed), `acked` the negotiated features. Never panics. For a device
/// with one queue pair; see [`parse_mq`].
pub fn parse(readable: &[u8], writable_len: u32, acked: u64) -> Result<CtrlCommand, CtrlError> {
    parse_mq(readable, writable_len, acked, 1)
}

/// [`parse`] for a device with `max_pairs` queue pairs (its `max_virtqueue_pairs`): with
/// VIRTIO_NET_F_MQ negotiated, MQ VQ_PAIRS_SET takes 1..=`max_pairs` and VQ_SET / VQ_GET
/// any data queue (0..2 × `max_pairs`; even is rx, odd tx), STATS GET those and the control
/// queue after them. Never panics.
pub fn parse_mq(
    readable: &[u8],
    writable_len: u32,
    acked: u64,
    max_pairs: u16,
) -> Result<CtrlCommand, CtrlError> {
    let mq = acked & bit(VIRTIO_NET_F_MQ) != 0;
    let ctrl_index = if mq { 2 * max_pairs.max(1) } else { 2 };
    parse_at(readable, writable_len, acked, max_pairs, ctrl_index)
}

/// [`parse_mq`] for a device whose driver set up `max_pairs` queue pairs and whose control
/// queue is `ctrl_index` (`2 × max_virtqueue_pairs` with MQ, else 2). Never panics.
pub fn parse_at(
    readable: &[u8],
    writable_len: u32,
    acked: u64,
    max_pairs: u16,
    ctrl_index: u16,
) -> Result<CtrlCommand, CtrlError> {
    let [class, command] = read_array::<2>(readable, 0).ok_or(CtrlError::ShortHeader)?;
    let p = Parser {
        readable,
        class,
        command,
        acked,
        max_pairs,
        ctrl_index,
    };
    let parsed = match (class as u32, command as u32) {
        (VIRTIO_NET_CTRL_RX, c @ (VIRTIO_NET_CTRL_RX_PROMISC | VIRTIO_NET_CTRL_RX_ALLMULTI)) => {
            p.rx_mode(c == VIRTIO_NET_CTRL_RX_PROMISC)?
        }
        // ALLUNI, NOMULTI, NOUNI, NOBCAST: VIRTIO_NET_F_CTRL_RX_EXTRA, not offered.
        (VIRTIO_NET_CTRL_RX, 2..=5) => return Err(p.not_negotiated()),
        (VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET) => p.mac_table()?,
        (VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET) => p.mac_addr()?,
        (VIRTIO_NET_CTRL_GUEST_OFFLOADS, VIRTIO_NET_CTRL_GUEST_OFFLOADS_SET) => {
            p.guest_offloads()?
        }
        (
            VIRTIO_NET_CTRL_NOTF_COAL,
            c @ (VIRTIO_NET_CTRL_NOTF_COAL_TX_SET | VIRTIO_NET_CTRL_NOTF_COAL_RX_SET),
        ) => p.coalescing(usize::from(c == VIRTIO_NET_CTRL_NOTF_COAL_TX_SET))?,
        (
            VIRTIO_NET_CTRL_NOTF_COAL,
            c @ (VIRTIO_NET_CTRL_NOTF_COAL_VQ_SET | VIRTIO_NET_CTRL_NOTF_COAL_VQ_GET),
        ) => p.vq_coalescing(c == VIRTIO_NET_CTRL_NOTF_COAL_VQ_SET)?,
        (VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET) => p.pairs_set()?,
        // RSS_CONFIG, HASH_CONFIG: VIRTIO_NET_F_RSS / HASH_REPORT, not offered.
        (VIRTIO_NET_CTRL_MQ, 1 | 2) => return Err(p.not_negotiated()),
        (STATS, STATS_QUERY) => {
            p.needs(stats::VIRTIO_NET_F_DEVICE_STATS)?;
            p.exact(0)?;
            CtrlCommand::QueryStats
        }
        (STATS, STATS_GET) => p.stats_get()?,
        _ => return Err(CtrlError::Unsupported { class, command }),
    };
    if writable_len != parsed.reply_len() + 1 {
        return Err(p.bad_length());
    }
    Ok(parsed)
}

/// One command being parsed: its bytes and what the device and the driver agreed on.
struct Parser<'a> {
    readable: &'a [u8],
    class: u8,
    command: u8,
    acked: u64,
    max_pairs: u16,
    ctrl_index: u16,
}

impl Parser<'_> {
    fn not_negotiated(&self) -> CtrlError {
        let (class, command) = (self.class, self.command);
        CtrlError::NotNegotiated { class, command }
    }

    fn bad_length(&self) -> CtrlError {
        let (class, command) = (self.class, self.command);
        CtrlError::BadLength { class, command }
    }

    fn out_of_range(&self) -> CtrlError {
        let (class, command) = (self.class, self.command);
        CtrlError::OutOfRange { class, command }
    }

    /// Bytes of data after the 2-byte header.
    fn data_len(&self) -> u32 {
        u32::try_from(self.readable.len() - 2).unwrap_or(u32::MAX)
    }

    fn needs(&self, feature: u32) -> Result<(), CtrlError> {
        if self.acked & bit(feature) != 0 {
            Ok(())
        } else {
            Err(self.not_negotiated())
        }
    }

    fn exact(&self, len: u32) -> Result<(), CtrlError> {
        if self.data_len() == len {
            Ok(())
        } else {
            Err(self.bad_length())
        }
    }

    /// `N` bytes of data at `offset` (after the header).
    fn array<const N: usize>(&self, offset: u32) -> Result<[u8; N], CtrlError> {
        let at = offset.checked_add(2).ok_or(self.bad_length())?;
        read_array::<N>(self.readable, at).ok_or(self.bad_length())
    }

    fn u32_at(&self, offset: u32) -> Result<u32, CtrlError> {
        self.array::<4>(offset).map(u32::from_le_bytes)
    }

    /// Queue pairs the commands may name: the driver's with MQ, else one.
    fn pairs(&self) -> u16 {
        if self.acked & bit(VIRTIO_NET_F_MQ) != 0 {
            self.max_pairs.max(1)
        } else {
            1
        }
    }

    /// RX PROMISC / ALLMULTI: one `u8`, 0 or 1.
    fn rx_mode(&self, promisc: bool) -> Result<CtrlCommand, CtrlError> {
        self.needs(VIRTIO_NET_F_CTRL_RX)?;
        self.exact(1)?;
        let on = match self.array::<1>(0)? {
            [0] => false,
            [1] => true,
            _ => return Err(self.out_of_range()),
        };
        Ok(if promisc {
            CtrlCommand::Promisc(on)
        } else {
            CtrlCommand::AllMulti(on)
        })
    }

    /// MAC TABLE_SET: two `le32 entries; u8 macs[entries][6]` tables, exactly.
    fn mac_table(&self) -> Result<CtrlCommand, CtrlError> {
        self.needs(VIRTIO_NET_F_CTRL_RX)?;
        let unicast = self.u32_at(0)?;
        let mc_at = 4u64 + 6 * u64::from(unicast);
        let mc_at = u32::try_from(mc_at).map_err(|_| self.bad_length())?;
        let multicast = self.u32_at(mc_at)?;
        let end = u64::from(mc_at) + 4 + 6 * u64::from(multicast);
        if end != u64::from(self.data_len()) {
            return Err(self.bad_length());
        }
        Ok(CtrlCommand::MacTable { unicast, multicast })
    }

    /// MAC ADDR_SET: 6 bytes, unicast, not all zero.
    fn mac_addr(&self) -> Result<CtrlCommand, CtrlError> {
        self.needs(VIRTIO_NET_F_CTRL_MAC_ADDR)?;
        self.exact(6)?;
        let mac = self.array::<6>(0)?;
        if mac[0] & 1 != 0 || mac == [0; 6] {
            return Err(self.out_of_range());
        }
        Ok(CtrlCommand::MacAddr(MacAddr::new(mac)))
    }

    /// GUEST_OFFLOADS SET: `le64` of negotiated guest offload feature bits.
    fn guest_offloads(&self) -> Result<CtrlCommand, CtrlError> {
        self.needs(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS)?;
        self.exact(8)?;
        let bits = u64::from_le_bytes(self.array::<8>(0)?);
        let mut allowed = 0u64;
        let mut offloads = Offloads::NONE;
        for (feature, offload) in GUEST_OFFLOAD_BITS {
            if self.acked & bit(feature) != 0 {
                allowed |= bit(feature);
                if bits & bit(feature) != 0 {
                    offloads = offloads | offload;
                }
            }
        }
        if bits & !allowed != 0 {
            return Err(self.out_of_range());
        }
        Ok(CtrlCommand::GuestOffloads(offloads))
    }

    /// The coalescing bounds `le32 max_packets; le32 max_usecs` at `offset`.
    fn bounds(&self, offset: u32) -> Result<InterruptCoalescing, CtrlError> {
        let (packets, usecs) = (self.u32_at(offset)?, self.u32_at(offset + 4)?);
        InterruptCoalescing::from_guest(packets, usecs).map_err(|_| self.out_of_range())
    }

    /// NOTF_COAL TX_SET / RX_SET of direction `dir` (0 rx, 1 tx).
    fn coalescing(&self, dir: usize) -> Result<CtrlCommand, CtrlError> {
        self.needs(VIRTIO_NET_F_NOTF_COAL)?;
        self.exact(8)?;
        Ok(CtrlCommand::SetCoalescing(dir, self.bounds(0)?))
    }

    /// NOTF_COAL VQ_SET / VQ_GET: `le16 vqn; le16 reserved` (then the bounds, to set).
    fn vq_coalescing(&self, set: bool) -> Result<CtrlCommand, CtrlError> {
        self.needs(VIRTIO_NET_F_VQ_NOTF_COAL)?;
        self.exact(if set { 12 } else { 4 })?;
        let vqn = u16::from_le_bytes(self.array::<2>(0)?);
        // Queue 2i is rx, 2i + 1 tx; the control queue (after them) has no coalescing.
        if u32::from(vqn) >= 2 * u32::from(self.pairs()) {
            return Err(self.out_of_range());
        }
        let dir = usize::from(vqn & 1);
        Ok(if set {
            CtrlCommand::SetCoalescing(dir, self.bounds(4)?)
        } else {
            CtrlCommand::GetCoalescing(dir)
        })
    }

    /// MQ VQ_PAIRS_SET: `le16`, 1..=the pairs the driver set up.
    fn pairs_set(&self) -> Result<CtrlCommand, CtrlError> {
        self.needs(VIRTIO_NET_F_MQ)?;
        self.exact(2)?;
        let pairs = u16::from_le_bytes(self.array::<2>(0)?);
        if pairs == 0 || pairs > self.max_pairs {
            return Err(self.out_of_range());
        }
        Ok(CtrlCommand::SetPairs(pairs))
    }

    /// STATS GET: see [`stats::parse_get`].
    fn stats_get(&self) -> Result<CtrlCommand, CtrlError> {
        self.needs(stats::VIRTIO_NET_F_DEVICE_STATS)?;
        let queues = stats::StatsQueues {
            pairs: self.pairs(),
            ctrl_index: self.ctrl_index,
        };
        let (requests, reply_len) =
            stats::parse_get(self.readable, queues).map_err(|e| match e {
                stats::Refused::BadLength => self.bad_length(),
                stats::Refused::OutOfRange => self.out_of_range(),
            })?;
        Ok(CtrlCommand::GetStats {
            requests,
            reply_len,
        })
    }
}

impl CtrlError {
    /// Counts an ERR ack and its reason.
    pub(crate) fn count(&self, c: &mut super::metrics::CtrlCounters) {
        c.errors += 1;
        match self {
            CtrlError::ShortHeader | CtrlError::BadLength { .. } => c.bad_length += 1,
            CtrlError::Unsupported { .. } => c.unsupported += 1,
            CtrlError::NotNegotiated { .. } => c.not_negotiated += 1,
            CtrlError::OutOfRange { .. } => c.out_of_range += 1,
            CtrlError::Backend => c.backend_errors += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = bit(VIRTIO_NET_F_CTRL_VQ)
        | bit(VIRTIO_NET_F_CTRL_RX)
        | bit(VIRTIO_NET_F_CTRL_MAC_ADDR)
        | bit(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS)
        | bit(VIRTIO_NET_F_GUEST_CSUM)
        | bit(VIRTIO_NET_F_NOTF_COAL)
        | bit(VIRTIO_NET_F_VQ_NOTF_COAL);

    fn cmd(class: u32, command: u32, data: &[u8]) -> Vec<u8> {
        let mut bytes = vec![class as u8, command as u8];
        bytes.extend_from_slice(data);
        bytes
    }

    fn coal(vqn: Option<u16>, packets: u32, usecs: u32) -> Vec<u8> {
        let mut data = vqn.map_or(vec![], |v| [v.to_le_bytes(), [0, 0]].concat());
        data.extend_from_slice(&packets.to_le_bytes());
        data.extend_from_slice(&usecs.to_le_bytes());
        data
    }

    #[test]
    fn notf_coal_commands_map_to_directions_and_validated_bounds() {
        let bounds = |p, u| InterruptCoalescing {
            max_packets: p,
            max_usecs: u,
        };
        let set = |c, data: Vec<u8>| parse(&cmd(VIRTIO_NET_CTRL_NOTF_COAL, c, &data)[..], 1, ALL);
        assert_eq!(
            set(VIRTIO_NET_CTRL_NOTF_COAL_TX_SET, coal(None, 32, 100)),
            Ok(CtrlCommand::SetCoalescing(1, bounds(32, 100)))
        );
        assert_eq!(
            set(VIRTIO_NET_CTRL_NOTF_COAL_RX_SET, coal(None, 0, 0)),
            Ok(CtrlCommand::SetCoalescing(0, InterruptCoalescing::OFF))
        );
        assert_eq!(
            set(VIRTIO_NET_CTRL_NOTF_COAL_RX_SET, coal(None, 1, 0)),
            Ok(CtrlCommand::SetCoalescing(0, bounds(1, 0))),
            "1 frame, no time bound: off, as ethtool means it"
        );
        assert_eq!(
            set(VIRTIO_NET_CTRL_NOTF_COAL_RX_SET, coal(None, 0, 50)),
            Ok(CtrlCommand::SetCoalescing(0, bounds(0, 50))),
            "time bound only"
        );
        assert_eq!(
            set(
                VIRTIO_NET_CTRL_NOTF_COAL_VQ_SET,
                coal(Some(1), 65_535, 1_000_000)
            ),
            Ok(CtrlCommand::SetCoalescing(1, bounds(65_535, 1_000_000)))
        );
        let oor = Err(CtrlError::OutOfRange {
            class: 6,
            command: 0,
        });
        assert_eq!(set(VIRTIO_NET_CTRL_NOTF_COAL_TX_SET, coal(None, 2, 0)), oor);
        assert_eq!(
            set(VIRTIO_NET_CTRL_NOTF_COAL_TX_SET, coal(None, 65_536, 10)),
            oor
        );
        assert_eq!(
            set(VIRTIO_NET_CTRL_NOTF_COAL_TX_SET, coal(None, 4, 1_000_001)),
            oor
        );
        assert_eq!(
            set(VIRTIO_NET_CTRL_NOTF_COAL_VQ_SET, coal(Some(2), 4, 10)),
            Err(CtrlError::OutOfRange {
                class: 6,
                command: 2
            }),
            "the control queue has no coalescing"
        );
        let get = cmd(
            VIRTIO_NET_CTRL_NOTF_COAL,
            VIRTIO_NET_CTRL_NOTF_COAL_VQ_GET,
            &[0, 0, 0, 0],
        );
        assert_eq!(parse(&get[..], 9, ALL), Ok(CtrlCommand::GetCoalescing(0)));
        assert!(matches!(
            parse(&get[..], 1, ALL),
            Err(CtrlError::BadLength { .. })
        ));
        assert!(matches!(
            parse(&get[..], 9, ALL & !bit(VIRTIO_NET_F_VQ_NOTF_COAL)),
            Err(CtrlError::NotNegotiated { .. })
        ));
    }

    #[test]
    fn other_commands_and_their_errors() {
        assert_eq!(parse(&[][..], 1, ALL), Err(CtrlError::ShortHeader));
        assert_eq!(parse(&[0][..], 1, ALL), Err(CtrlError::ShortHeader));
        assert_eq!(
            parse(&cmd(0, 0, &[1])[..], 1, ALL),
            Ok(CtrlCommand::Promisc(true))
        );
        assert_eq!(
            parse(&cmd(0, 1, &[0])[..], 1, ALL),
            Ok(CtrlCommand::AllMulti(false))
        );
        assert!(matches!(
            parse(&cmd(0, 0, &[1])[..], 1, ALL & !bit(VIRTIO_NET_F_CTRL_RX)),
            Err(CtrlError::NotNegotiated { .. })
        ));
        let table = [
            1u32.to_le_bytes().to_vec(),
            vec![2; 6],
            0u32.to_le_bytes().to_vec(),
        ]
        .concat();
        assert_eq!(
            parse(&cmd(1, 0, &table)[..], 1, ALL),
            Ok(CtrlCommand::MacTable {
                unicast: 1,
                multicast: 0
            })
        );
        let long = [table.clone(), vec![0]].concat();
        assert!(matches!(
            parse(&cmd(1, 0, &long)[..], 1, ALL),
            Err(CtrlError::BadLength { .. })
        ));
        assert_eq!(
            parse(&cmd(1, 1, &[2, 1, 2, 3, 4, 5])[..], 1, ALL),
            Ok(CtrlCommand::MacAddr(MacAddr::new([2, 1, 2, 3, 4, 5])))
        );
        let offloads = bit(VIRTIO_NET_F_GUEST_CSUM).to_le_bytes();
        assert_eq!(
            parse(&cmd(5, 0, &offloads)[..], 1, ALL),
            Ok(CtrlCommand::GuestOffloads(Offloads::CSUM))
        );
        let tso = bit(VIRTIO_NET_F_GUEST_TSO4).to_le_bytes();
        assert!(matches!(
            parse(&cmd(5, 0, &tso)[..], 1, ALL),
            Err(CtrlError::OutOfRange { .. })
        ));
        // MQ (4) without VIRTIO_NET_F_MQ negotiated (a one-pair device does not offer it).
        assert_eq!(
            parse(&cmd(4, 0, &[1, 0])[..], 1, ALL),
            Err(CtrlError::NotNegotiated {
                class: 4,
                command: 0
            })
        );
    }

    #[test]
    fn mq_vq_pairs_set_and_per_queue_coalescing() {
        let mq = ALL | bit(VIRTIO_NET_F_MQ);
        let pairs = |n: u16| cmd(4, 0, &n.to_le_bytes());
        assert_eq!(
            parse_mq(&pairs(1)[..], 1, mq, 4),
            Ok(CtrlCommand::SetPairs(1))
        );
        assert_eq!(
            parse_mq(&pairs(4)[..], 1, mq, 4),
            Ok(CtrlCommand::SetPairs(4))
        );
        let oor = Err(CtrlError::OutOfRange {
            class: 4,
            command: 0,
        });
        assert_eq!(parse_mq(&pairs(0)[..], 1, mq, 4), oor, "0 pairs");
        assert_eq!(parse_mq(&pairs(5)[..], 1, mq, 4), oor, "over max");
        assert_eq!(parse_mq(&pairs(0x8000)[..], 1, mq, 4), oor);
        let bad_length = Err(CtrlError::BadLength {
            class: 4,
            command: 0,
        });
        assert_eq!(parse_mq(&cmd(4, 0, &[2])[..], 1, mq, 4), bad_length);
        assert_eq!(parse_mq(&cmd(4, 0, &[2, 0, 0])[..], 1, mq, 4), bad_length);
        assert_eq!(parse_mq(&pairs(2)[..], 2, mq, 4), bad_length, "reply space");
        assert_eq!(
            parse_mq(&pairs(2)[..], 1, ALL, 4),
            Err(CtrlError::NotNegotiated {
                class: 4,
                command: 0
            }),
            "MQ not negotiated"
        );
        // RSS_CONFIG / HASH_CONFIG are not offered; 3 is unknown.
        for (command, error) in [
            (
                1,
                CtrlError::NotNegotiated {
                    class: 4,
                    command: 1,
                },
            ),
            (
                2,
                CtrlError::NotNegotiated {
                    class: 4,
                    command: 2,
                },
            ),
            (
                3,
                CtrlError::Unsupported {
                    class: 4,
                    command: 3,
                },
            ),
        ] {
            assert_eq!(
                parse_mq(&cmd(4, command, &[1, 0])[..], 1, mq, 4),
                Err(error)
            );
        }
        // VQ_SET / VQ_GET: any data queue of the pairs (even rx, odd tx), not the control one.
        let vq_get = |vqn: u16| {
            let mut data = vqn.to_le_bytes().to_vec();
            data.extend([0, 0]);
            cmd(6, 3, &data)
        };
        assert_eq!(
            parse_mq(&vq_get(6)[..], 9, mq, 4),
            Ok(CtrlCommand::GetCoalescing(0))
        );
        assert_eq!(
            parse_mq(&vq_get(7)[..], 9, mq, 4),
            Ok(CtrlCommand::GetCoalescing(1))
        );
        assert!(matches!(
            parse_mq(&vq_get(8)[..], 9, mq, 4),
            Err(CtrlError::OutOfRange { .. })
        ));
        assert!(
            matches!(
                parse_mq(&vq_get(2)[..], 9, ALL, 4),
                Err(CtrlError::OutOfRange { .. })
            ),
            "without MQ only queues 0 and 1"
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic sweep; the fuzz target goes further.
        let mut x: u32 = 1;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let len = (x % 40) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (x >> (i % 24)) as u8 % 8).collect();
            let _ = parse(&bytes[..], x % 12, u64::from(x) << 32 | u64::from(x));
        }
    }
}
