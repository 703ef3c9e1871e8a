//! The driver's side of a split virtqueue, for tests: virtio-queue's `MockSplitQueue` lays out
//! the descriptor table and avail ring and builds the device's `Queue`; `Driver` writes
//! descriptors and avail entries (with index wrap-around) and reads the used ring back.
//!
//! The used ring is placed by `Driver`, not by the mock: `MockSplitQueue` 0.18 computes the end
//! of the avail ring as `ring start + entries` instead of `+ 2 * entries`, so its used ring
//! overlaps the second half of the avail ring (and `used_event`).

use std::sync::atomic::Ordering;

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::virtio::net::VNET_HDR_LEN;

/// Guest memory size used by the tests.
pub const MEM_SIZE: u64 = 0x80_0000;
/// Where [`Driver`] allocates buffers (the rings live below).
const DATA_START: u64 = 0x10_0000;

pub const NEXT: u16 = VRING_DESC_F_NEXT as u16;
pub const WRITE: u16 = VRING_DESC_F_WRITE as u16;
pub const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

/// One region of [`MEM_SIZE`] bytes at guest address 0.
pub fn guest_mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).expect("guest memory")
}

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

/// The driver of one queue.
pub struct Driver<'a> {
    mem: &'a GuestMemoryMmap,
    vq: MockSplitQueue<'a, GuestMemoryMmap>,
    size: u16,
    used_addr: u64,
    next_desc: u16,
    next_data: u64,
    avail_idx: u16,
}

impl<'a> Driver<'a> {
    /// A queue of `size` entries whose rings start at guest address 0.
    pub fn new(mem: &'a GuestMemoryMmap, size: u16) -> Self {
        Self::at(mem, GuestAddress(0), size, DATA_START)
    }

    /// A queue whose rings start at `start`, allocating buffers from `data_start`.
    pub fn at(mem: &'a GuestMemoryMmap, start: GuestAddress, size: u16, data_start: u64) -> Self {
        let vq = MockSplitQueue::create(mem, start, size);
        // avail ring: flags, idx, ring[size], used_event; the used ring follows, 4-aligned.
        let used_addr = (vq.avail_addr().0 + 6 + 2 * u64::from(size) + 3) & !3;
        let used_len = 6 + 8 * usize::from(size);
        mem.write_slice(&vec![0u8; used_len], GuestAddress(used_addr))
            .expect("used ring in memory");
        Driver {
            mem,
            vq,
            size,
            used_addr,
            next_desc: 0,
            next_data: data_start,
            avail_idx: 0,
        }
    }

    /// The device's view of the queue (ready, addresses set, no EVENT_IDX).
    pub fn queue(&self) -> Queue {
        let mut queue: Queue = self.vq.create_queue().expect("valid queue");
        queue
            .try_set_used_ring_address(GuestAddress(self.used_addr))
            .expect("aligned used ring");
        queue
    }

    /// Ring addresses (desc, avail, used) for programming a transport.
    pub fn ring_addrs(&self) -> (u64, u64, u64) {
        (
            self.vq.desc_table_addr().0,
            self.vq.avail_addr().0,
            self.used_addr,
        )
    }

    /// Moves the free-running indexes to `idx` on both sides (for wrap-around tests).
    pub fn start_at(&mut self, queue: &mut Queue, idx: u16) {
        self.avail_idx = idx;
        self.store_u16(self.vq.avail_addr().0 + 2, idx);
        self.store_u16(self.used_addr + 2, idx);
        queue.set_next_avail(idx);
        queue.set_next_used(idx);
    }

    /// Copies `bytes` into fresh guest memory; returns its address.
    pub fn alloc(&mut self, bytes: &[u8]) -> u64 {
        let addr = self.alloc_zeroed(bytes.len());
        self.mem
            .write_slice(bytes, GuestAddress(addr))
            .expect("buffer in memory");
        addr
    }

    /// Reserves `len` zeroed bytes of guest memory; returns the address.
    pub fn alloc_zeroed(&mut self, len: usize) -> u64 {
        let addr = self.next_data;
        self.next_data = (addr + len as u64 + 15) & !15;
        assert!(self.next_data <= MEM_SIZE, "test data area exhausted");
        self.mem
            .write_slice(&vec![0u8; len], GuestAddress(addr))
            .expect("buffer in memory");
        addr
    }

    /// The table slot the next `write_descs` starts at.
    pub fn next_slot(&self) -> u16 {
        self.next_desc
    }

    /// Writes raw descriptors `(addr, len, flags, next)` into consecutive free table slots
    /// without touching flags or next fields; returns the slot indexes.
    pub fn write_descs(&mut self, descs: &[(u64, u32, u16, u16)]) -> Vec<u16> {
        descs
            .iter()
            .map(|&(addr, len, flags, next)| {
                let index = self.next_desc;
                self.next_desc = (self.next_desc + 1) % self.size;
                let desc = RawDescriptor::from(Descriptor::new(addr, len, flags, next));
                self.vq
                    .desc_table()
                    .store(index, desc)
                    .expect("descriptor slot");
                index
            })
            .collect()
    }

    /// Puts `head` in the avail ring and publishes it.
    pub fn publish(&mut self, head: u16) {
        let slot = self.vq.avail_addr().0 + 4 + 2 * u64::from(self.avail_idx % self.size);
        self.store_u16(slot, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.store_u16(self.vq.avail_addr().0 + 2, self.avail_idx);
    }

    /// Publishes a chain of `bufs` (address, length), all with `flags` (0 or WRITE).
    pub fn add_chain(&mut self, bufs: &[(u64, u32)], flags: u16) -> u16 {
        let first = self.next_desc;
        let descs: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len))| {
                let last = i + 1 == bufs.len();
                let next = (first + i as u16 + 1) % self.size;
                (addr, len, if last { flags } else { flags | NEXT }, next)
            })
            .collect();
        let head = self.write_descs(&descs)[0];
        self.publish(head);
        head
    }

    /// Publishes a tx chain carrying `bytes` (header included), cut at the `cuts` offsets.
    pub fn push_tx(&mut self, bytes: &[u8], cuts: &[usize]) -> u16 {
        let mut bufs = Vec::new();
        let mut start = 0;
        for &end in cuts.iter().chain([bytes.len()].iter()) {
            bufs.push((self.alloc(&bytes[start..end]), (end - start) as u32));
            start = end;
        }
        self.add_chain(&bufs, 0)
    }

    /// Publishes a device-writable chain of buffers of the given lengths; returns the head and
    /// the buffer addresses.
    pub fn push_rx(&mut self, lens: &[u32]) -> (u16, Vec<u64>) {
        let bufs: Vec<_> = lens
            .iter()
            .map(|&len| (self.alloc_zeroed(len as usize), len))
            .collect();
        let head = self.add_chain(&bufs, WRITE);
        (head, bufs.iter().map(|b| b.0).collect())
    }

    /// Sets the avail index without adding entries (hostile driver).
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.store_u16(self.vq.avail_addr().0 + 2, idx);
    }

    /// The used ring index.
    pub fn used_idx(&self) -> u16 {
        self.load_u16(self.used_addr + 2)
    }

    /// Used ring entry `i` (free-running index): (descriptor id, length).
    pub fn used(&self, i: u16) -> (u32, u32) {
        let entry = self.used_addr + 4 + 8 * u64::from(i % self.size);
        let id: u32 = self.mem.read_obj(GuestAddress(entry)).expect("used entry");
        let len: u32 = self
            .mem
            .read_obj(GuestAddress(entry + 4))
            .expect("used entry");
        (id, len)
    }

    /// All used entries from index `from` up to the used index.
    pub fn used_since(&self, from: u16) -> Vec<(u32, u32)> {
        let to = self.used_idx();
        (0..to.wrapping_sub(from))
            .map(|k| self.used(from.wrapping_add(k)))
            .collect()
    }

    /// Sets `used_event` (EVENT_IDX: interrupt me when the used index passes this).
    pub fn set_used_event(&self, value: u16) {
        self.store_u16(self.vq.avail_addr().0 + 4 + 2 * u64::from(self.size), value);
    }

    /// Sets the avail ring flags (VRING_AVAIL_F_NO_INTERRUPT).
    pub fn set_avail_flags(&self, flags: u16) {
        self.store_u16(self.vq.avail_addr().0, flags);
    }

    /// The used ring flags (VRING_USED_F_NO_NOTIFY).
    pub fn used_flags(&self) -> u16 {
        self.load_u16(self.used_addr)
    }

    /// `avail_event` (EVENT_IDX: the device wants a kick when the avail index passes this).
    pub fn avail_event(&self) -> u16 {
        self.load_u16(self.used_addr + 4 + 8 * u64::from(self.size))
    }

    /// Reads guest memory.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.mem
            .read_slice(&mut buf, GuestAddress(addr))
            .expect("in memory");
        buf
    }

    fn store_u16(&self, addr: u64, value: u16) {
        self.mem
            .store(value.to_le(), GuestAddress(addr), Ordering::Release)
            .expect("ring in memory");
    }

    fn load_u16(&self, addr: u64) -> u16 {
        u16::from_le(
            self.mem
                .load(GuestAddress(addr), Ordering::Acquire)
                .expect("ring in memory"),
        )
    }
}
