//! Decoding of an API request (method, path, body) into the typed `VmmRequest`.
//!
//! Input: `METHOD PATH\nBODY`. Invariants: no panic; a refusal is a 4xx with a JSON fault
//! body, and a 405 names the allowed methods.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vmm::api::{parse_request, MAX_BODY_BYTES};

fuzz_target!(|data: &[u8]| {
    let (line, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    if body.len() > MAX_BODY_BYTES {
        return; // The HTTP layer never passes more.
    }
    let line = String::from_utf8_lossy(line);
    let (method, path) = line.split_once(' ').unwrap_or((&line, "/"));
    if let Err(e) = parse_request(method, path, body) {
        assert!((400..500).contains(&e.status), "{e:?}");
        assert_eq!(e.status == 405, e.allow.is_some(), "{e:?}");
        let fault: serde_json::Value = serde_json::from_str(&e.body()).expect("JSON");
        assert!(fault["fault_message"].is_string());
    }
});
