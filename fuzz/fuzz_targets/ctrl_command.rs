//! The virtio-net control queue's command parser (`devices::virtio::net::ctrl::parse`): the
//! readable bytes of one command (header and data), the writable length and the negotiated
//! features, all arbitrary.
//!
//! Invariants:
//! - no panic, whatever the bytes;
//! - a command is accepted only with exactly its reply space and ack byte writable;
//! - a command is accepted only if CTRL_VQ-dependent features allow it: nothing is accepted
//!   without a 2-byte header;
//! - NOTF_COAL bounds accepted are within the device's limits (validate() holds);
//! - a MAC address accepted is unicast and not zero;
//! - a STATS GET accepted (class 8, with 1..=16 queue pairs) names only queues that exist, and
//!   the reply the device then writes is exactly the reply space it accepted, block by block
//!   with headers whose sizes add up.

#![no_main]

use devices::virtio::net::ctrl::{parse_mq, CtrlCommand};
use devices::virtio::net::metrics::NetMetrics;
use devices::virtio::net::stats::{
    parse_get, requests, write_reply, StatsQueues, VIRTIO_NET_CTRL_STATS,
    VIRTIO_NET_CTRL_STATS_GET, VIRTIO_NET_F_DEVICE_STATS,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<u8>, u32, u64, u8)| {
    let (mut readable, mut writable_len, mut acked, pairs) = input;
    let pairs = u16::from(pairs % 16) + 1;
    // Readable bytes starting 0xff are read as a STATS GET's requests, with the reply space they
    // need: arbitrary bytes seldom make a GET whose requests and reply length all agree.
    if readable.first() == Some(&0xff) {
        readable[0] = VIRTIO_NET_CTRL_STATS;
        if readable.len() > 1 {
            readable[1] = VIRTIO_NET_CTRL_STATS_GET;
        }
        acked |= 1 << VIRTIO_NET_F_DEVICE_STATS | 1 << 17; // and CTRL_VQ
        let mq = acked & 1 << 22 != 0;
        let queues = StatsQueues {
            pairs: if mq { pairs } else { 1 },
            ctrl_index: if mq { 2 * pairs } else { 2 },
        };
        if let Ok((_, reply_len)) = parse_get(&readable, queues) {
            writable_len = reply_len + 1;
            assert!(
                parse_mq(&readable[..], writable_len, acked, pairs).is_ok(),
                "a GET parse_get accepts is accepted with its reply space"
            );
        }
    }
    if let Ok(command) = parse_mq(&readable[..], writable_len, acked, pairs) {
        assert!(readable.len() >= 2);
        assert_eq!(writable_len, command.reply_len() + 1);
        match command {
            CtrlCommand::SetCoalescing(dir, bounds) => {
                assert!(dir < 2);
                assert!(bounds.validate().is_ok(), "{bounds:?}");
            }
            CtrlCommand::GetCoalescing(dir) => assert!(dir < 2),
            CtrlCommand::GetStats {
                requests: n,
                reply_len,
            } => {
                let metrics = NetMetrics::with_pairs(usize::from(pairs));
                let mut reply = Vec::new();
                let asked: Vec<_> = requests(&readable[..]).collect();
                assert_eq!(asked.len(), usize::from(n));
                assert!(asked.iter().all(|r| r.vq <= 2 * pairs));
                write_reply(&metrics, asked.into_iter(), &mut reply);
                assert_eq!(reply.len(), reply_len as usize);
                let mut at = 0;
                while at < reply.len() {
                    let size = u16::from_le_bytes([reply[at + 6], reply[at + 7]]);
                    assert!(size >= 8);
                    at += usize::from(size);
                }
                assert_eq!(at, reply.len(), "block sizes add up to the reply");
            }
            CtrlCommand::MacAddr(mac) => {
                let bytes = mac.bytes();
                assert_eq!(bytes[0] & 1, 0);
                assert_ne!(bytes, [0; 6]);
            }
            _ => {}
        }
    }
});
