//! The guest half of the virtio-net datapath: a `no_std` + `alloc` virtio-net driver for the
//! virtio-mmio (virtio 1.x, register layout version 2) and modern virtio-pci transports, on the
//! split virtqueue or, negotiated with [`Config::packed`], the packed one.
//!
//! The same code runs in two places:
//! - on a host thread against the VMM's device model (co-simulation): guest memory is a shared
//!   mapping, a kick writes the queue's eventfd (as a KVM ioeventfd would), and the thread waits
//!   on the device's interrupt eventfd (as a KVM irqfd would) before calling
//!   [`VirtioNet::handle_interrupt`];
//! - inside a bare-metal guest, over [`MmioTransport`] and the guest's own page allocator.
//!
//! It touches the world only through two seams, both instance-based (no global state):
//! - [`Transport`]: the virtio operations (features, status, queue setup, configuration
//!   space, interrupt status, MSI-X vectors) and the queue notification ([`transport`]), over
//!   virtio-mmio ([`MmioTransport`], or any [`MmioRegisters`]) or modern virtio-pci with MSI-X
//!   ([`PciTransport`], [`pci`]);
//! - [`Hal`]: DMA memory and address translation ([`hal`]).
//!
//! What it adds over a plain driver are the knobs this project co-tunes with the device
//! ([`Config`]): the transmit kick threshold, the transmit completion strategy, the XDP_TX bulk
//! size, EVENT_IDX and mergeable rx buffers on or off, plus an AF_XDP-style zero-copy transmit
//! path over a caller-owned umem ([`xsk`]) and plain counters ([`Counters`]). With
//! [`Config::adaptive`] the kick threshold, the XDP_TX bulk and the device's rx coalescing
//! follow what the datapath observes ([`adapt`]). Devices that
//! offer a control queue get synchronous control commands, notification coalescing set from
//! the guest among them ([`ctrl`]), and the device's own per-queue counters ([`stats`]);
//! devices that offer multiqueue get several queue pairs
//! ([`Config::queue_pairs`], [`mq`]), the datapath acting on the pair selected with
//! [`VirtioNet::select_pair`] or [`VirtioNet::on_pair`].
//! Devices that offer VIRTIO_F_RING_RESET get per-queue reset ([`reset`]).
//!
//! Bringing a device up, sending, receiving and taking interrupts:
//!
//! ```no_run
//! use vnet_driver::{Config, Hal, Transport, VirtioNet, XdpAction, QueueId, Rearm};
//!
//! fn run<H: Hal, T: Transport>(hal: H, transport: T) -> Result<(), vnet_driver::InitError> {
//!     let mut net = VirtioNet::new(hal, transport, Config::default())?;
//!     net.transmit(&[0u8; 60]).ok();
//!     // NAPI-style: interrupt → disable → poll until empty → re-enable → re-check.
//!     let status = net.handle_interrupt();
//!     if status.used_buffers {
//!         net.disable_interrupts(QueueId::Rx);
//!         loop {
//!             while net.poll_rx(64, &mut |_frame: &[u8]| XdpAction::Pass) == 64 {}
//!             if net.enable_interrupts(QueueId::Rx) == Rearm::Armed {
//!                 break;
//!             }
//!             net.disable_interrupts(QueueId::Rx);
//!         }
//!         net.reclaim_tx();
//!     }
//!     Ok(())
//! }
//! ```

#![no_std]
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod adapt;
pub mod config;
pub mod counters;
pub mod ctrl;
pub mod error;
pub mod features;
pub mod hal;
pub mod header;
pub mod mq;
mod net;
pub mod pci;
mod queue;
pub mod reset;
mod ring;
mod rx;
pub mod spsc;
pub mod stats;
pub mod transport;
mod tune;
mod tx;
mod vring;
pub mod xdp;
pub mod xsk;

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

pub use config::{Config, TxCompletion};
pub use counters::Counters;
pub use ctrl::{Ack, Coalescing, CtrlWait};
pub use error::{CtrlError, InitError, PairError, TxError, XskError};
pub use hal::{Hal, PhysAddr, PAGE_SIZE};
pub use header::{VirtioNetHdr, VNET_HDR_LEN};
pub use mq::PairCounters;
pub use net::{IrqStatus, QueueId, Rearm, VirtioNet};
pub use pci::{PciError, PciTransport};
pub use reset::{QueueResetError, QueueResetReport, ResetCounters};
pub use ring::vring_need_event;
pub use stats::{DeviceStats, StatsReplyError, StatsTypes};
pub use transport::{MmioRegisters, MmioTransport, QueueSetup, Transport};
pub use tx::TxBatch;
pub use xdp::XdpAction;
pub use xsk::{Umem, XdpDesc, XskConfig, XskMode, XskPort, XskSocket};
