//! The device's counters read by the driver over the control queue
//! (VIRTIO_NET_F_DEVICE_STATS, feature bit 50; control class 8, drafted for virtio 1.4 and
//! implemented by Linux's virtio_net since 6.10, whose `ethtool -S` shows them as `*_hw_*`).
//!
//! - **QUERY** (command 0, no data): the reply is one `le64`, the statistics types the device
//!   supports ([`SUPPORTED`]).
//! - **GET** (command 1): the data is one or more 16-byte requests `{le16 vq_index;
//!   le16 reserved[3]; le64 types_bitmap}`; the reply is, for each request in order and each
//!   type in it by ascending bit, one block: an 8-byte header `{u8 type; u8 reserved;
//!   le16 vq_index; le16 reserved1; le16 size}` (size counts the header) and the block's
//!   `le64` counters.
//!
//! Supported: CVQ on the control queue; RX_BASIC and RX_SPEED on receive queues; TX_BASIC and
//! TX_SPEED on transmit queues. CSUM and GSO are not advertised: the device hands the
//! virtio-net header to the backend without reading it (that would be one more guest-memory
//! read per frame on the hot path), so it cannot count them.
//!
//! Every number is one of the device's metrics (`GET /metrics`, [`NetMetrics`]): the same
//! relaxed atomics the datapath publishes once per batch, read without a lock. Which metric
//! each field is: [`RX_BASIC_FIELDS`], [`TX_BASIC_FIELDS`], [`SPEED_FIELDS`], [`CVQ_FIELDS`].
//!
//! A GET is refused (VIRTIO_NET_ERR, nothing written) when a request names a queue that does
//! not exist, asks for no type, for a type the device does not support or for one of another
//! kind of queue (RX_* of a transmit queue, CVQ of a data queue), when its data is not a whole
//! number of requests or has more requests than the device has queues, or when the writable
//! space is not exactly the reply and the ack.

use super::metrics::{CtrlMetrics, NetMetrics, RxQueueMetrics, TxQueueMetrics};

/// VIRTIO_NET_F_DEVICE_STATS.
pub const VIRTIO_NET_F_DEVICE_STATS: u32 = 50;
/// Control class STATS.
pub const VIRTIO_NET_CTRL_STATS: u8 = 8;
/// STATS QUERY: which types the device supports.
pub const VIRTIO_NET_CTRL_STATS_QUERY: u8 = 0;
/// STATS GET: the counters of some queues.
pub const VIRTIO_NET_CTRL_STATS_GET: u8 = 1;

/// The control queue's counters.
pub const TYPE_CVQ: u64 = 1 << 32;
/// A receive queue's notifications, packets, bytes, interrupts and drops.
pub const TYPE_RX_BASIC: u64 = 1 << 0;
/// A receive queue's frames held back by the rate limiter.
pub const TYPE_RX_SPEED: u64 = 1 << 3;
/// A transmit queue's notifications, packets, bytes, interrupts and drops.
pub const TYPE_TX_BASIC: u64 = 1 << 16;
/// A transmit queue's frames held back by the rate limiter.
pub const TYPE_TX_SPEED: u64 = 1 << 19;
/// Every type this device supports (the QUERY reply).
pub const SUPPORTED: u64 = TYPE_CVQ | TYPE_RX_BASIC | TYPE_RX_SPEED | TYPE_TX_BASIC | TYPE_TX_SPEED;

/// Bytes of one GET request.
pub const REQUEST_LEN: u32 = 16;
/// Bytes of a reply block's header.
pub const HEADER_LEN: u16 = 8;

/// The reply block fields of CVQ, in wire order, with the metric each one is.
pub const CVQ_FIELDS: [(&str, &str); 2] = [
    (
        "command_num",
        "ctrl.commands (the GET being answered included)",
    ),
    ("ok_num", "ctrl.ok (the GET being answered not yet)"),
];
/// The reply block fields of RX_BASIC, in wire order, with the metric each one is.
pub const RX_BASIC_FIELDS: [(&str, &str); 6] = [
    ("rx_notifications", "rx.kicks"),
    ("rx_packets", "rx.frames"),
    ("rx_bytes", "rx.bytes"),
    ("rx_interrupts", "rx.interrupts_raised"),
    ("rx_drops", "rx.dropped_no_buffer + rx.backend_errors"),
    ("rx_drop_overruns", "rx.dropped_no_buffer"),
];
/// The reply block fields of TX_BASIC, in wire order, with the metric each one is.
pub const TX_BASIC_FIELDS: [(&str, &str); 6] = [
    ("tx_notifications", "tx.kicks"),
    ("tx_packets", "tx.frames"),
    ("tx_bytes", "tx.bytes"),
    ("tx_interrupts", "tx.interrupts_raised"),
    ("tx_drops", "tx.backend_errors + tx.malformed_chains"),
    ("tx_drop_malformed", "tx.malformed_chains"),
];
/// The reply block fields of RX_SPEED / TX_SPEED (prefixed `rx_` / `tx_`), in wire order,
/// with the metric each one is.
pub const SPEED_FIELDS: [(&str, &str); 2] = [
    ("packets_allowance_exceeded", "rate_limiter_ops_exceeded"),
    (
        "bytes_allowance_exceeded",
        "rate_limiter_bandwidth_exceeded",
    ),
];

/// The queues a GET may name: data queues `0..2 × pairs` (even rx, odd tx) and the control
/// queue at `ctrl_index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatsQueues {
    /// Queue pairs the driver set up.
    pub pairs: u16,
    /// The control queue's index.
    pub ctrl_index: u16,
}

impl StatsQueues {
    /// The types a queue supports; `None` for a queue that does not exist.
    fn types_of(&self, vq: u16) -> Option<u64> {
        if vq == self.ctrl_index {
            Some(TYPE_CVQ)
        } else if u32::from(vq) >= 2 * u32::from(self.pairs) {
            None
        } else if vq.is_multiple_of(2) {
            Some(TYPE_RX_BASIC | TYPE_RX_SPEED)
        } else {
            Some(TYPE_TX_BASIC | TYPE_TX_SPEED)
        }
    }

    /// How many queues may be named (the most requests one GET may carry).
    fn count(&self) -> u32 {
        2 * u32::from(self.pairs) + 1
    }
}

/// The reply type number and block size of one type bit.
fn block(type_bit: u64) -> (u8, u16) {
    let fields = match type_bit {
        TYPE_CVQ => CVQ_FIELDS.len(),
        TYPE_RX_BASIC => RX_BASIC_FIELDS.len(),
        TYPE_TX_BASIC => TX_BASIC_FIELDS.len(),
        _ => SPEED_FIELDS.len(),
    };
    // The type number is the bit's position (VIRTIO_NET_STATS_TYPE_REPLY_*).
    (
        type_bit.trailing_zeros() as u8,
        HEADER_LEN + 8 * fields as u16,
    )
}

/// Bytes of the reply blocks of the types in `types`.
fn blocks_len(types: u64) -> u32 {
    bits(types).map(|b| u32::from(block(b).1)).sum()
}

/// The set bits of `types`, ascending.
fn bits(types: u64) -> impl Iterator<Item = u64> {
    (0..64).map(|i| 1u64 << i).filter(move |b| types & b != 0)
}

/// One GET request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatsRequest {
    /// The queue.
    pub vq: u16,
    /// The types asked for.
    pub types: u64,
}

/// The requests of a GET whose readable bytes (the 2-byte header, then the requests) are
/// `readable`, in order (a partial request at the end is not one).
pub fn requests(readable: &[u8]) -> impl Iterator<Item = StatsRequest> + '_ {
    readable
        .get(2..)
        .unwrap_or_default()
        .chunks_exact(REQUEST_LEN as usize)
        .map(|r| StatsRequest {
            vq: u16::from_le_bytes([r[0], r[1]]),
            types: u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]),
        })
}

/// Why a GET is refused (the control queue acks it VIRTIO_NET_ERR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No request, a partial one, or more requests than the device has queues.
    BadLength,
    /// A queue that does not exist, no type, or a type that queue does not offer.
    OutOfRange,
}

/// Validates a GET (its readable bytes: the 2-byte header, then the requests): the number of
/// requests and the bytes of the reply, or why it is refused.
pub fn parse_get(readable: &[u8], queues: StatsQueues) -> Result<(u16, u32), Refused> {
    let data_len = readable.len().saturating_sub(2);
    let n = data_len / REQUEST_LEN as usize;
    if n == 0 || !data_len.is_multiple_of(REQUEST_LEN as usize) || n > queues.count() as usize {
        return Err(Refused::BadLength);
    }
    let mut reply_len = 0u32;
    for request in requests(readable) {
        let allowed = queues.types_of(request.vq).ok_or(Refused::OutOfRange)?;
        if request.types == 0 || request.types & !allowed != 0 {
            return Err(Refused::OutOfRange);
        }
        reply_len += blocks_len(request.types);
    }
    // n <= 2 × 16 + 1 queues.
    Ok((n as u16, reply_len))
}

/// Appends the reply to a GET that [`parse_get`] accepted to `out`: the blocks of each
/// request, read from `metrics` (`pair_metrics(i)` gives pair i's queues).
pub fn write_reply(
    metrics: &NetMetrics,
    requests: impl Iterator<Item = StatsRequest>,
    out: &mut Vec<u8>,
) {
    for request in requests {
        let pair = usize::from(request.vq / 2);
        let (rx, tx) = pair_metrics(metrics, pair);
        for type_bit in bits(request.types) {
            let (reply_type, size) = block(type_bit);
            out.push(reply_type);
            out.push(0);
            out.extend_from_slice(&request.vq.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            let fields = match type_bit {
                TYPE_CVQ => cvq(&metrics.ctrl).to_vec(),
                TYPE_RX_BASIC => rx_basic(rx).to_vec(),
                TYPE_TX_BASIC => tx_basic(tx).to_vec(),
                TYPE_RX_SPEED => vec![
                    rx.rate_limiter_ops_exceeded.get(),
                    rx.rate_limiter_bandwidth_exceeded.get(),
                ],
                _ => vec![
                    tx.rate_limiter_ops_exceeded.get(),
                    tx.rate_limiter_bandwidth_exceeded.get(),
                ],
            };
            for value in fields {
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
    }
}

/// Pair `pair`'s queue metrics: its own with several pairs, the device's with one.
fn pair_metrics(metrics: &NetMetrics, pair: usize) -> (&RxQueueMetrics, &TxQueueMetrics) {
    match metrics.queues.get(pair) {
        Some(p) => (&p.rx, &p.tx),
        None => (&metrics.rx, &metrics.tx),
    }
}

fn cvq(c: &CtrlMetrics) -> [u64; 2] {
    [c.commands.get(), c.ok.get()]
}

fn rx_basic(rx: &RxQueueMetrics) -> [u64; 6] {
    let overruns = rx.dropped_no_buffer.get();
    [
        rx.kicks.get(),
        rx.frames.get(),
        rx.bytes.get(),
        rx.interrupts_raised.get(),
        overruns + rx.backend_errors.get(),
        overruns,
    ]
}

fn tx_basic(tx: &TxQueueMetrics) -> [u64; 6] {
    let malformed = tx.malformed_chains.get();
    [
        tx.kicks.get(),
        tx.frames.get(),
        tx.bytes.get(),
        tx.interrupts_raised.get(),
        tx.backend_errors.get() + malformed,
        malformed,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(requests: &[(u16, u64)]) -> Vec<u8> {
        let mut bytes = vec![VIRTIO_NET_CTRL_STATS, VIRTIO_NET_CTRL_STATS_GET];
        for &(vq, types) in requests {
            bytes.extend_from_slice(&vq.to_le_bytes());
            bytes.extend_from_slice(&[0; 6]);
            bytes.extend_from_slice(&types.to_le_bytes());
        }
        bytes
    }

    const BAD: Refused = Refused::BadLength;
    const OOR: Refused = Refused::OutOfRange;
    const ONE: StatsQueues = StatsQueues {
        pairs: 1,
        ctrl_index: 2,
    };

    fn parse(bytes: &[u8], queues: StatsQueues) -> Result<(u16, u32), Refused> {
        parse_get(bytes, queues)
    }

    #[test]
    fn block_sizes_are_the_uapi_structs() {
        assert_eq!(block(TYPE_CVQ), (32, 24));
        assert_eq!(block(TYPE_RX_BASIC), (0, 56));
        assert_eq!(block(TYPE_RX_SPEED), (3, 24));
        assert_eq!(block(TYPE_TX_BASIC), (16, 56));
        assert_eq!(block(TYPE_TX_SPEED), (19, 24));
        assert_eq!(SUPPORTED, 0x1_0009_0009);
    }

    #[test]
    fn linux_request_is_accepted_and_sized() {
        // What Linux asks for with every supported type: rx0, tx0, then the control queue.
        let bytes = get(&[
            (0, TYPE_RX_BASIC | TYPE_RX_SPEED),
            (1, TYPE_TX_BASIC | TYPE_TX_SPEED),
            (2, TYPE_CVQ),
        ]);
        assert_eq!(parse(&bytes, ONE), Ok((3, 80 + 80 + 24)));
        let mq = StatsQueues {
            pairs: 4,
            ctrl_index: 8,
        };
        assert_eq!(parse(&get(&[(7, TYPE_TX_BASIC)]), mq), Ok((1, 56)));
        assert_eq!(parse(&get(&[(8, TYPE_CVQ)]), mq), Ok((1, 24)));
    }

    #[test]
    fn malformed_requests_are_refused() {
        let cases: &[(Vec<u8>, Refused, &str)] = &[
            (get(&[]), BAD, "no request"),
            (
                get(&[(0, TYPE_RX_BASIC)])[..17].to_vec(),
                BAD,
                "partial request",
            ),
            (
                [get(&[(0, TYPE_RX_BASIC)]), vec![0]].concat(),
                BAD,
                "trailing byte",
            ),
            (
                get(&[(0, TYPE_RX_BASIC); 4]),
                BAD,
                "more requests than queues",
            ),
            (get(&[(3, TYPE_TX_BASIC)]), OOR, "no such queue"),
            (get(&[(0xffff, TYPE_RX_BASIC)]), OOR, "no such queue"),
            (get(&[(0, 0)]), OOR, "no type"),
            (get(&[(0, TYPE_TX_BASIC)]), OOR, "tx type of an rx queue"),
            (get(&[(1, TYPE_RX_SPEED)]), OOR, "rx type of a tx queue"),
            (get(&[(0, TYPE_CVQ)]), OOR, "cvq of a data queue"),
            (
                get(&[(2, TYPE_RX_BASIC)]),
                OOR,
                "data type of the control queue",
            ),
            (get(&[(0, 1 << 1)]), OOR, "RX_CSUM is not supported"),
            (get(&[(1, 1 << 18)]), OOR, "TX_GSO is not supported"),
            (get(&[(0, 1 << 63)]), OOR, "unknown type"),
        ];
        for (bytes, want, what) in cases {
            assert_eq!(parse(bytes, ONE), Err(*want), "{what}");
        }
    }

    #[test]
    fn reply_carries_the_metrics() {
        let metrics = NetMetrics::with_pairs(2);
        let q = &metrics.queues[1];
        q.tx.kicks.add(3);
        q.tx.frames.add(10);
        q.tx.bytes.add(640);
        q.tx.interrupts_raised.add(2);
        q.tx.backend_errors.add(1);
        q.tx.malformed_chains.add(4);
        q.tx.rate_limiter_bandwidth_exceeded.add(7);
        q.rx.dropped_no_buffer.add(5);
        q.rx.backend_errors.add(6);
        metrics.ctrl.commands.add(9);
        metrics.ctrl.ok.add(8);
        let bytes = get(&[
            (3, TYPE_TX_BASIC | TYPE_TX_SPEED),
            (2, TYPE_RX_BASIC),
            (4, TYPE_CVQ),
        ]);
        let queues = StatsQueues {
            pairs: 2,
            ctrl_index: 4,
        };
        let (n, len) = parse(&bytes, queues).expect("valid");
        let mut out = Vec::new();
        write_reply(&metrics, requests(&bytes), &mut out);
        assert_eq!((n, out.len() as u32), (3, len));
        let le = |at: usize| u64::from_le_bytes(out[at..at + 8].try_into().unwrap());
        // TX_BASIC of queue 3.
        assert_eq!(out[..8], [16, 0, 3, 0, 0, 0, 56, 0]);
        assert_eq!(
            (8..56).step_by(8).map(le).collect::<Vec<_>>(),
            [3, 10, 640, 2, 5, 4]
        );
        // TX_SPEED of queue 3.
        assert_eq!(out[56..64], [19, 0, 3, 0, 0, 0, 24, 0]);
        assert_eq!((le(64), le(72)), (0, 7));
        // RX_BASIC of queue 2: drops = overruns + backend errors.
        assert_eq!(out[80..88], [0, 0, 2, 0, 0, 0, 56, 0]);
        assert_eq!((le(120), le(128)), (11, 5));
        // CVQ.
        assert_eq!(out[136..144], [32, 0, 4, 0, 0, 0, 24, 0]);
        assert_eq!((le(144), le(152)), (9, 8));
    }

    #[test]
    fn one_pair_reads_the_device_totals() {
        let metrics = NetMetrics::with_pairs(1);
        metrics.rx.frames.add(12);
        let mut out = Vec::new();
        write_reply(
            &metrics,
            [StatsRequest {
                vq: 0,
                types: TYPE_RX_BASIC,
            }]
            .into_iter(),
            &mut out,
        );
        assert_eq!(u64::from_le_bytes(out[16..24].try_into().unwrap()), 12);
    }
}
