//! A config file's text into a validated `VmConfig`.
//!
//! Invariants: no panic; an accepted configuration is valid, and written out as JSON it
//! reads back to itself (what `GET /vm/config` shows can be used as a config file).

#![no_main]

use libfuzzer_sys::fuzz_target;
use vmm::config::{VmConfig, MAX_CONFIG_FILE_BYTES};

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_CONFIG_FILE_BYTES {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = VmConfig::from_json(text) {
        assert_eq!(config.validate(), Ok(()));
        let written = serde_json::to_string(&config).expect("serialisable");
        let again = VmConfig::from_json(&written).expect("reads back");
        assert_eq!(again, config);
    }
});
