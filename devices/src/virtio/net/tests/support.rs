//! virtio-net test data (headers, frames), the driver's side of the queues ([`GuestQueue`],
//! shared with benches and fuzzers in `crate::test_utils::queue`), and [`Ring`]: one queue the
//! tests drive directly, without the worker.

use virtio_queue::Queue;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::backend::{NetBackend, PairBackend, PairPeer};
pub use crate::test_utils::queue::{guest_mem, GuestQueue, INDIRECT, MEM_SIZE, NEXT, WRITE};
use crate::virtio::net::metrics::{RxCounters, TxCounters};
use crate::virtio::net::rx::RX_GATHER_NO_GSO_BYTES;
use crate::virtio::net::{
    process_rx, process_tx, RxMode, RxOutcome, RxQueue, TxOutcome, TxQueue, TxStop, VNET_HDR_LEN,
};
use crate::virtio::ring::RingError;
use crate::virtio::vring::Virtqueue;

/// A virtio-net header with distinctive field values (flags NEEDS_CSUM, csum_start 34,
/// csum_offset 16) so tests can see it arrives untouched.
pub fn vnet_hdr() -> [u8; VNET_HDR_LEN] {
    [1, 0, 0, 0, 0, 0, 34, 0, 16, 0, 0, 0]
}

/// `len` bytes of a recognisable Ethernet-ish frame.
pub fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `vnet_hdr()` followed by `payload`.
pub fn wire(payload: &[u8]) -> Vec<u8> {
    let mut bytes = vnet_hdr().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// One descriptor as it lies in a descriptor table (for building indirect tables).
pub fn desc_bytes(addr: u64, len: u32, flags: u16, next: u16) -> Vec<u8> {
    let mut bytes = addr.to_le_bytes().to_vec();
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(&flags.to_le_bytes());
    bytes.extend_from_slice(&next.to_le_bytes());
    bytes
}

/// Reads whatever frames wait at `peer`; returns how many there were.
pub fn drain(peer: &PairPeer) -> usize {
    let mut n = 0;
    while peer.try_recv_frame().expect("recv").is_some() {
        n += 1;
    }
    n
}

/// A socket-pair backend and its far end.
pub fn pair() -> (PairBackend, PairPeer) {
    PairBackend::new().expect("socketpair")
}

/// `n` copies of an 8000-byte frame queued on a 256-entry [`Ring`] and one `process_tx` call
/// into a socket pair that fills up before they are all sent: the frame, the ring, the
/// backend and its far end, and the call's counters.
#[track_caller]
pub fn tx_into_full_backend(n: usize) -> (Vec<u8>, Ring, PairBackend, PairPeer, TxCounters) {
    let bytes = wire(&frame(8000, 4));
    let mut ring = Ring::with_copies(256, &bytes, n);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::BackendFull);
    (bytes, ring, backend, peer, counters)
}

/// One queue driven directly by `process_tx` / `process_rx`: the driver's side in guest memory
/// and the device's [`Queue`] over it.
pub struct Ring {
    pub mem: GuestMemoryMmap,
    pub driver: GuestQueue,
    pub queue: Queue,
}

impl Ring {
    /// A `size`-entry queue at the start of fresh guest memory.
    pub fn new(size: u16) -> Ring {
        let mem = guest_mem();
        let driver = GuestQueue::new(&mem, size);
        Ring::over(mem, driver)
    }

    /// A `size`-entry queue like [`Ring::new`]'s with `n` copies of `bytes` queued for
    /// transmission, each in one descriptor.
    pub fn with_copies(size: u16, bytes: &[u8], n: usize) -> Ring {
        let mut ring = Ring::new(size);
        ring.push_copies(bytes, n);
        ring
    }

    /// A second 16-entry queue in the same guest memory, clear of this one's rings and
    /// buffers (the rx side of a test that started on tx).
    pub fn second(&self) -> Ring {
        self.beside(0x8000, 16, 0x40_0000)
    }

    /// Another `size`-entry queue in the same guest memory, its rings from `start` and its
    /// buffers from `data_start` (see [`GuestQueue::at`]).
    pub fn beside(&self, start: u64, size: u16, data_start: u64) -> Ring {
        let driver = GuestQueue::at(&self.mem, GuestAddress(start), size, data_start);
        Ring::over(self.mem.clone(), driver)
    }

    fn over(mem: GuestMemoryMmap, driver: GuestQueue) -> Ring {
        let queue = driver.queue();
        Ring { mem, driver, queue }
    }

    /// Queues each of `frames` for transmission, each in one descriptor.
    pub fn push_frames(&mut self, frames: &[Vec<u8>]) {
        for bytes in frames {
            self.driver.push_tx(bytes, &[]);
        }
    }

    /// Queues `n` copies of `bytes` for transmission, each in one descriptor.
    pub fn push_copies(&mut self, bytes: &[u8], n: usize) {
        for _ in 0..n {
            self.driver.push_tx(bytes, &[]);
        }
    }

    /// The worker's receive queue over this ring, gathering for frames without GSO.
    pub fn rx_queue(&self, mode: RxMode) -> RxQueue {
        let vq = Virtqueue::new(&self.queue, &self.mem).expect("ring");
        RxQueue::new(vq, mode, RX_GATHER_NO_GSO_BYTES)
    }

    /// The worker's transmit queue over this ring.
    pub fn tx_queue(&self) -> TxQueue {
        TxQueue::new(Virtqueue::new(&self.queue, &self.mem).expect("ring"))
    }

    /// One `process_tx` call into `backend`.
    pub fn try_tx(
        &mut self,
        backend: &mut impl NetBackend,
        counters: &mut TxCounters,
    ) -> Result<TxOutcome, RingError> {
        process_tx(&mut self.queue, &self.mem, backend, counters)
    }

    /// One `process_tx` call on a ring that must stay sound.
    pub fn tx(&mut self, backend: &mut impl NetBackend, counters: &mut TxCounters) -> TxOutcome {
        self.try_tx(backend, counters).expect("ring ok")
    }

    /// One `process_rx` call from `backend`.
    pub fn try_rx(
        &mut self,
        backend: &mut impl NetBackend,
        mode: RxMode,
        counters: &mut RxCounters,
    ) -> Result<RxOutcome, RingError> {
        process_rx(&mut self.queue, &self.mem, backend, mode, counters)
    }

    /// One `process_rx` call on a ring that must stay sound.
    pub fn rx(
        &mut self,
        backend: &mut impl NetBackend,
        mode: RxMode,
        counters: &mut RxCounters,
    ) -> RxOutcome {
        self.try_rx(backend, mode, counters).expect("ring ok")
    }
}

/// Held by the tests whose device busy-polls for long windows: two such tests at once on a
/// small machine starve each other's driver threads (a 0.5 ms pause then lasts past a 5 ms
/// window), so they take turns.
pub(crate) fn spinning_device() -> std::sync::MutexGuard<'static, ()> {
    static SPINNING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that panicked while holding it leaves nothing to repair.
    SPINNING.lock().unwrap_or_else(|p| p.into_inner())
}
