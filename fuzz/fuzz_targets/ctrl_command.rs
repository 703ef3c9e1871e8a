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
//! - a MAC address accepted is unicast and not zero.

#![no_main]

use devices::virtio::net::ctrl::{parse, CtrlCommand};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<u8>, u32, u64)| {
    let (readable, writable_len, acked) = input;
    match parse(&readable[..], writable_len, acked) {
        Ok(command) => {
            assert!(readable.len() >= 2);
            assert_eq!(writable_len, command.reply_len() + 1);
            match command {
                CtrlCommand::SetCoalescing(dir, bounds) => {
                    assert!(dir < 2);
                    assert!(bounds.validate().is_ok(), "{bounds:?}");
                }
                CtrlCommand::GetCoalescing(dir) => assert!(dir < 2),
                CtrlCommand::MacAddr(mac) => {
                    let bytes = mac.bytes();
                    assert_eq!(bytes[0] & 1, 0);
                    assert_ne!(bytes, [0; 6]);
                }
                _ => {}
            }
        }
        Err(_) => {}
    }
});
