//! Co-simulation of the `vnet-driver` guest driver against the real virtio-net device model
//! (the same code the VMM runs), on host threads over the same eventfd kick/interrupt paths KVM
//! uses, and the `cotune` sweeps built on it.

pub mod autotune;
pub mod baseline;
pub mod calib;
pub mod check;
pub mod cost;
pub mod env;
pub mod frames;
pub mod hal;
pub mod injector;
pub mod mixed;
pub mod noise;
pub mod point;
pub mod report;
pub mod rig;
pub mod sweep;
pub mod transport;
pub mod vm;
pub mod workloads;
pub mod xdp;
