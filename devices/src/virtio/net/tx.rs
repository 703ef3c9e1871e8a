//! Transmit: guest tx chains → backend, one `writev` per frame, no copy.
//!
//! Each chain is the 12-byte `virtio_net_hdr_v1` followed by the Ethernet frame, split across
//! any number of device-readable descriptors. The whole chain goes to the backend as-is (a tap
//! with `IFF_VNET_HDR` consumes the header itself). A chain whose frame is empty or longer than
//! [`MAX_FRAME_LEN`] is malformed.

use std::io;

use log::debug;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::metrics::TxCounters;
use super::{batch_interrupt, MAX_FRAME_LEN, VNET_HDR_LEN};
use crate::backend::NetBackend;
use crate::iovec::{IovecList, Iovecs};
use crate::virtio::chain::{parse_chain, Direction};
use crate::virtio::ring::{add_used, pop_chain, unpop_chains, RingError};

/// Most frames one [`process_tx`] call sends before yielding to other work.
pub const TX_BUDGET: usize = 256;

/// Longest tx chain: header + largest frame.
pub const MAX_TX_CHAIN_LEN: u32 = VNET_HDR_LEN as u32 + MAX_FRAME_LEN;

/// Why [`process_tx`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStop {
    /// The driver has nothing more queued (notifications re-enabled, race re-checked).
    Drained,
    /// The backend would block; the unsent chain is still queued. Call again once the backend
    /// is writable.
    BackendFull,
    /// [`TX_BUDGET`] frames were sent and more may be queued. Call again soon: the driver will
    /// not notify for them (notifications stay disabled).
    Budget,
}

/// What [`process_tx`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxOutcome {
    /// Used buffers were returned and the driver wants an interrupt for them.
    pub needs_interrupt: bool,
    /// Used buffers were returned but the driver's `used_event` (EVENT_IDX) said it does not
    /// want an interrupt yet (a device may still send one).
    pub suppressed_by_event_idx: bool,
    /// Why processing stopped.
    pub stop: TxStop,
}

/// Sends the frames the driver queued on `queue` to `backend`.
///
/// Malformed chains are returned with length 0 and counted; the driver's notifications are
/// disabled while the queue is drained. An error means the ring itself is broken (the device
/// must be marked NEEDS_RESET).
pub fn process_tx<B: NetBackend>(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    backend: &mut B,
    counters: &mut TxCounters,
) -> Result<TxOutcome, RingError> {
    let mut iovs = IovecList::with_capacity(16);
    let mut used = 0usize;
    queue.disable_notification(mem)?;
    let stop = loop {
        if used == TX_BUDGET {
            break TxStop::Budget;
        }
        let Some(chain) = pop_chain(queue, mem)? else {
            // The standard race: the driver may have queued more just before we re-enabled.
            if queue.enable_notification(mem)? {
                queue.disable_notification(mem)?;
                continue;
            }
            break TxStop::Drained;
        };
        let head = chain.head_index();
        iovs.clear();
        match parse_chain(
            chain,
            mem,
            Direction::DeviceReads,
            MAX_TX_CHAIN_LEN,
            &mut iovs,
        ) {
            Ok(len) if len as usize > VNET_HDR_LEN => {
                match write_frame(backend, iovs.as_iovecs()) {
                    Ok(_) => {
                        counters.frames += 1;
                        counters.bytes += u64::from(len) - VNET_HDR_LEN as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        unpop_chains(queue, 1);
                        counters.backend_full += 1;
                        break TxStop::BackendFull;
                    }
                    Err(e) => {
                        debug!("virtio-net tx: backend refused a {len}-byte frame: {e}");
                        counters.backend_errors += 1;
                    }
                }
            }
            Ok(len) => {
                debug!("virtio-net tx: chain {head} of {len} bytes holds no frame");
                counters.malformed_chains += 1;
            }
            Err(e) => {
                debug!("virtio-net tx: chain {head} refused: {e}");
                counters.malformed_chains += 1;
            }
        }
        add_used(queue, mem, head, 0)?;
        used += 1;
    };
    let (needs_interrupt, suppressed_by_event_idx) = batch_interrupt(
        queue,
        mem,
        used,
        &mut counters.interrupts_raised,
        &mut counters.interrupts_suppressed_event_idx,
        &mut counters.interrupts_suppressed_no_interrupt,
    )?;
    Ok(TxOutcome {
        needs_interrupt,
        suppressed_by_event_idx,
        stop,
    })
}

fn write_frame<B: NetBackend>(backend: &mut B, iovs: Iovecs<'_>) -> io::Result<usize> {
    loop {
        match backend.write_frame(iovs) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            result => return result,
        }
    }
}
