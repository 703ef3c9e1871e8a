//! The target-independent parts of the bare-metal guest program `driver-guest` (see
//! `main.rs`): its command line, its test frames and its result line. They are unit-tested on
//! the host; the program itself only runs inside a VM.

#![no_std]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod calibrate;
pub mod cmdline;
pub mod devstats;
pub mod frames;
pub mod latency;
pub mod mem;
pub mod mixed;
pub mod report;
pub mod reset;
