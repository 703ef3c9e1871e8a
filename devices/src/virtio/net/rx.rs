//! Receive: backend → guest rx buffers, one `readv` per frame straight into guest memory.
//!
//! The backend cannot tell a frame's length before it is read, so the buffers must be in place
//! first. [`process_rx`] keeps a small pool of popped, validated rx chains:
//! - without MRG_RXBUF ([`RxMode::SingleChain`]) a frame is read into the first chain alone;
//! - with MRG_RXBUF ([`RxMode::Mergeable`]) it is read across as many chains as are needed
//!   (the pool holds up to one maximal frame's worth), `num_buffers` says how many were used,
//!   and the chains left over stay in the pool for the next frame.
//!
//! Chains still pooled when the call returns are handed back to the avail ring (un-popped), so
//! nothing is lost and nothing is kept between calls. A frame larger than the buffers offered
//! is truncated by the backend: it is dropped and counted, and the buffers are reused.

use std::io;

use log::debug;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::metrics::RxCounters;
use super::{batch_interrupt, MAX_FRAME_LEN, VNET_HDR_LEN};
use crate::backend::NetBackend;
use crate::iovec::{IovecList, Iovecs, MAX_IOVECS};
use crate::virtio::chain::{parse_chain, Direction};
use crate::virtio::ring::{add_used, pop_chain, unpop_chains, RingError};

/// Most frames one [`process_rx`] call reads before yielding to other work.
pub const RX_BUDGET: usize = 256;

/// Buffer space gathered before each read in mergeable mode: header + the largest frame a
/// backend hands over (64 KiB GSO payload plus Ethernet and VLAN headers).
pub const RX_GATHER_BYTES: u64 = VNET_HDR_LEN as u64 + MAX_FRAME_LEN as u64 + 18;

/// Offset of `num_buffers` in `virtio_net_hdr_v1`.
const NUM_BUFFERS_OFFSET: usize = 10;

/// How a received frame may use rx buffers (from VIRTIO_NET_F_MRG_RXBUF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxMode {
    /// MRG_RXBUF negotiated: a frame may span several chains.
    Mergeable,
    /// One chain per frame; the driver posts chains big enough for any frame.
    SingleChain,
}

impl RxMode {
    /// The mode the negotiated features call for.
    pub fn from_features(acked: u64) -> RxMode {
        if acked & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0 {
            RxMode::Mergeable
        } else {
            RxMode::SingleChain
        }
    }
}

/// Why [`process_rx`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxStop {
    /// The backend has no frame pending.
    BackendEmpty,
    /// The driver has no rx buffer posted. Guest notifications are enabled: stop polling the
    /// backend until the driver kicks the rx queue.
    NoBuffers,
    /// [`RX_BUDGET`] frames were read; the backend may have more.
    Budget,
    /// The backend reached end of file (its peer went away).
    BackendClosed,
    /// Reading the backend failed (counted in `backend_errors`).
    BackendFailed,
}

/// What [`process_rx`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxOutcome {
    /// Used buffers were returned and the driver wants an interrupt for them.
    pub needs_interrupt: bool,
    /// Used buffers were returned but the driver's `used_event` (EVENT_IDX) said it does not
    /// want an interrupt yet (a device may still send one).
    pub suppressed_by_event_idx: bool,
    /// Why processing stopped.
    pub stop: RxStop,
}

/// Moves frames from `backend` into the rx buffers the driver posted on `queue`.
///
/// An error means the ring itself is broken (the device must be marked NEEDS_RESET).
pub fn process_rx<B: NetBackend>(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    backend: &mut B,
    mode: RxMode,
    counters: &mut RxCounters,
) -> Result<RxOutcome, RingError> {
    let mut pool = RxPool::new(mode);
    let mut used = 0usize;
    let mut reads = 0usize;
    queue.disable_notification(mem)?;
    let stop = loop {
        if reads == RX_BUDGET {
            break RxStop::Budget;
        }
        used += pool.fill(queue, mem, counters)?;
        if pool.is_empty() {
            // The standard race: the driver may have posted buffers just before we re-enabled.
            if queue.enable_notification(mem)? {
                queue.disable_notification(mem)?;
                continue;
            }
            counters.no_buffer_stalls += 1;
            break RxStop::NoBuffers;
        }
        let window = pool.window();
        let capacity = window.total_bytes();
        reads += 1;
        match read_frame(backend, window) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break RxStop::BackendEmpty,
            Err(e) => {
                debug!("virtio-net rx: backend read failed: {e}");
                counters.backend_errors += 1;
                break RxStop::BackendFailed;
            }
            Ok(0) => break RxStop::BackendClosed,
            Ok(n) if n < VNET_HDR_LEN => counters.backend_errors += 1,
            Ok(n) if n > capacity => counters.dropped_no_buffer += 1,
            Ok(n) => {
                used += pool.complete_frame(queue, mem, n)?;
                counters.frames += 1;
                counters.bytes += (n - VNET_HDR_LEN) as u64;
            }
        }
    };
    pool.give_back(queue);
    let (needs_interrupt, suppressed_by_event_idx) = batch_interrupt(
        queue,
        mem,
        used,
        &mut counters.interrupts_raised,
        &mut counters.interrupts_suppressed_event_idx,
        &mut counters.interrupts_suppressed_no_interrupt,
    )?;
    Ok(RxOutcome {
        needs_interrupt,
        suppressed_by_event_idx,
        stop,
    })
}

fn read_frame<B: NetBackend>(backend: &mut B, iovs: Iovecs<'_>) -> io::Result<usize> {
    loop {
        match backend.read_frame(iovs) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            result => return result,
        }
    }
}

/// A popped, validated rx chain waiting for a frame.
#[derive(Clone, Copy, Debug)]
struct PooledChain {
    head: u16,
    len: u32,
    iov_count: usize,
}

/// The rx chains popped during one [`process_rx`] call, in avail-ring order. Chains
/// `first..` are unused; their iovecs are `iovecs[first_iov..]`.
struct RxPool<'m> {
    mode: RxMode,
    chains: Vec<PooledChain>,
    first: usize,
    iovecs: IovecList<'m>,
    first_iov: usize,
    free_bytes: u64,
}

impl<'m> RxPool<'m> {
    fn new(mode: RxMode) -> Self {
        RxPool {
            mode,
            chains: Vec::new(),
            first: 0,
            iovecs: IovecList::with_capacity(64),
            first_iov: 0,
            free_bytes: 0,
        }
    }

    fn unused(&self) -> usize {
        self.chains.len() - self.first
    }

    fn is_empty(&self) -> bool {
        self.unused() == 0
    }

    fn has_enough(&self) -> bool {
        match self.mode {
            RxMode::SingleChain => !self.is_empty(),
            RxMode::Mergeable => {
                self.free_bytes >= RX_GATHER_BYTES
                    || self.iovecs.len() - self.first_iov >= MAX_IOVECS
            }
        }
    }

    /// Pops chains until the pool can take a maximal frame or the driver has no more.
    /// Returns how many malformed chains were returned to the driver.
    fn fill(
        &mut self,
        queue: &mut Queue,
        mem: &'m GuestMemoryMmap,
        counters: &mut RxCounters,
    ) -> Result<usize, RingError> {
        let mut refused = 0;
        while !self.has_enough() {
            let Some(chain) = pop_chain(queue, mem)? else {
                break;
            };
            let head = chain.head_index();
            let before = self.iovecs.len();
            let result = parse_chain(
                chain,
                mem,
                Direction::DeviceWrites,
                u32::MAX,
                &mut self.iovecs,
            );
            match result {
                Ok(len) if len as usize >= VNET_HDR_LEN => {
                    self.chains.push(PooledChain {
                        head,
                        len,
                        iov_count: self.iovecs.len() - before,
                    });
                    self.free_bytes += u64::from(len);
                    continue;
                }
                Ok(len) => {
                    self.iovecs.truncate(before);
                    debug!("virtio-net rx: chain {head} of {len} bytes cannot hold a header");
                }
                Err(e) => debug!("virtio-net rx: chain {head} refused: {e}"),
            }
            if !self.is_empty() {
                // Return it only once the chains popped before it are used, so that the
                // chains left in the pool always form the tail of what was popped.
                unpop_chains(queue, 1);
                break;
            }
            add_used(queue, mem, head, 0)?;
            counters.malformed_chains += 1;
            refused += 1;
        }
        Ok(refused)
    }

    /// The buffers the next frame is read into.
    fn window(&self) -> Iovecs<'_> {
        let end = match self.mode {
            RxMode::SingleChain => self.first_iov + self.chains[self.first].iov_count,
            RxMode::Mergeable => self.first_iov + MAX_IOVECS,
        };
        self.iovecs.range(self.first_iov, end)
    }

    /// A frame of `n` bytes (≤ the window) was read: returns the chains holding it to the
    /// driver, with `num_buffers` set. Returns how many chains were used.
    fn complete_frame(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        n: usize,
    ) -> Result<usize, RingError> {
        let mut count = 0;
        let mut remaining = n;
        while remaining > 0 && self.first + count < self.chains.len() {
            remaining = remaining.saturating_sub(self.chains[self.first + count].len as usize);
            count += 1;
            if self.mode == RxMode::SingleChain {
                break;
            }
        }
        let head_chain = self.chains[self.first];
        let num_buffers = u16::try_from(count).unwrap_or(u16::MAX);
        let header = self
            .iovecs
            .range(self.first_iov, self.first_iov + head_chain.iov_count);
        // Cannot fail: every pooled chain holds at least a full header.
        let written = header.write_at(NUM_BUFFERS_OFFSET, &num_buffers.to_le_bytes());
        debug_assert!(written, "pooled rx chain shorter than the header");

        let mut remaining = n;
        for chain in &self.chains[self.first..self.first + count] {
            let len = remaining.min(chain.len as usize);
            remaining -= len;
            // `len` ≤ chain.len, a u32.
            add_used(queue, mem, chain.head, len as u32)?;
            self.first_iov += chain.iov_count;
            self.free_bytes -= u64::from(chain.len);
        }
        self.first += count;
        if self.is_empty() {
            self.chains.clear();
            self.iovecs.clear();
            self.first = 0;
            self.first_iov = 0;
        } else if self.first >= 64 {
            self.chains.drain(..self.first);
            self.iovecs.remove_prefix(self.first_iov);
            self.first = 0;
            self.first_iov = 0;
        }
        Ok(count)
    }

    /// Puts the chains still unused back on the avail ring.
    fn give_back(&mut self, queue: &mut Queue) {
        // The pool never holds more chains than the queue size (≤ 32768).
        unpop_chains(queue, u16::try_from(self.unused()).unwrap_or(u16::MAX));
    }
}
