//! The driver's side of a split virtqueue in guest memory: [`GuestQueue`] lays out the
//! descriptor table, the avail ring and the used ring, builds the device's [`Queue`], writes
//! descriptors and avail entries (with index wrap-around) and reads the used ring back. The
//! avail ring is written through its host address, resolved once, as a guest driver writes it
//! (a store per entry, a release store of the index): cheap enough for the benches' drivers.
//!
//! It plays the guest driver in tests, benches and fuzzers of the device side; it is not the
//! guest driver crate (`vnet-driver`), which has its own rings.

use std::sync::atomic::{AtomicU16, Ordering};

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};

/// Guest memory size of [`guest_mem`].
pub const MEM_SIZE: u64 = 0x80_0000;
/// Where [`GuestQueue::new`] allocates buffers (the rings live below).
pub const DATA_START: u64 = 0x10_0000;

/// Descriptor flag: the chain continues at `next`.
pub const NEXT: u16 = VRING_DESC_F_NEXT as u16;
/// Descriptor flag: the buffer is device-writable.
pub const WRITE: u16 = VRING_DESC_F_WRITE as u16;
/// Descriptor flag: the buffer is an indirect descriptor table.
pub const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

/// The buffer and memory accessors both driver-side queues ([`GuestQueue`] and
/// [`super::packed::GuestPackedQueue`]) have, over their `mem` and `next_data` fields. A
/// macro, because a function cannot give two types the same inherent methods and a trait
/// would make every caller import it.
macro_rules! guest_data_methods {
    () => {
        /// Copies `bytes` into fresh guest memory; returns its address.
        pub fn alloc(&mut self, bytes: &[u8]) -> u64 {
            let addr = self.alloc_zeroed(bytes.len());
            ::vm_memory::Bytes::write_slice(&self.mem, bytes, ::vm_memory::GuestAddress(addr))
                .expect("buffer in memory");
            addr
        }

        /// Reserves `len` zeroed bytes of guest memory; returns the address.
        pub fn alloc_zeroed(&mut self, len: usize) -> u64 {
            let addr = self.next_data;
            self.next_data = (addr + len as u64 + 15) & !15;
            let end = ::vm_memory::GuestMemoryBackend::last_addr(&self.mem).0 + 1;
            assert!(self.next_data <= end, "test data area exhausted");
            let zeroes = vec![0u8; len];
            ::vm_memory::Bytes::write_slice(&self.mem, &zeroes, ::vm_memory::GuestAddress(addr))
                .expect("buffer in memory");
            addr
        }

        /// Reads guest memory.
        pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
            let mut buf = vec![0u8; len];
            ::vm_memory::Bytes::read_slice(&self.mem, &mut buf, ::vm_memory::GuestAddress(addr))
                .expect("in memory");
            buf
        }

        fn store_u16(&self, addr: u64, value: u16) {
            let at = ::vm_memory::GuestAddress(addr);
            ::vm_memory::Bytes::store(
                &self.mem,
                value.to_le(),
                at,
                ::std::sync::atomic::Ordering::Release,
            )
            .expect("ring in memory");
        }

        fn load_u16(&self, addr: u64) -> u16 {
            let at = ::vm_memory::GuestAddress(addr);
            u16::from_le(
                ::vm_memory::Bytes::load(&self.mem, at, ::std::sync::atomic::Ordering::Acquire)
                    .expect("ring in memory"),
            )
        }
    };
}
pub(super) use guest_data_methods;

/// The host address of the `len` bytes of guest memory at `addr`, which must lie inside one
/// region of `mem` (then they stay mapped as long as a clone of `mem` lives).
pub(super) fn host_range(mem: &GuestMemoryMmap, addr: u64, len: usize) -> HostPtr {
    let region = mem.find_region(GuestAddress(addr)).expect("ring in memory");
    let start = addr - region.start_addr().raw_value();
    assert!(
        start + len as u64 <= region.len(),
        "ring inside one memory region"
    );
    let base = region
        .get_host_address(vm_memory::MemoryRegionAddress(0))
        .expect("host address");
    HostPtr(base.wrapping_add(start as usize))
}

/// A host address inside the guest memory a driver-side queue holds a handle of: resolved
/// once, so that the driver's hot accesses (the avail ring, the packed descriptor ring) cost a
/// plain store or load as a guest driver's do, not vm-memory's per-access region lookup.
#[derive(Clone, Copy)]
pub(super) struct HostPtr(pub(super) *mut u8);

// SAFETY: the pointer is into a mapping of the guest memory the owning queue holds a handle
// of (`GuestMemoryMmap` is `Send` and `Sync` and keeps the mapping alive); the queue accesses
// it only with volatile or atomic operations, as it accesses guest memory anyway.
unsafe impl Send for HostPtr {}
// SAFETY: as for `Send`.
unsafe impl Sync for HostPtr {}

/// The rings of a split queue of `size` entries laid out contiguously from `start`, as
/// (desc, avail, used): the descriptor table, the avail ring right after it, then the used ring
/// 4-aligned; none overlapping.
pub fn split_rings(start: u64, size: u16) -> (u64, u64, u64) {
    let desc = start;
    let avail = desc + 16 * u64::from(size);
    // avail ring: flags, idx, ring[size], used_event; the used ring follows, 4-aligned.
    let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
    (desc, avail, used)
}

/// One region of [`MEM_SIZE`] bytes at guest address 0.
pub fn guest_mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).expect("guest memory")
}

/// The driver's side of one split queue (it holds a clone of the guest memory handle, which
/// shares the mappings).
pub struct GuestQueue {
    mem: GuestMemoryMmap,
    size: u16,
    desc_addr: u64,
    avail_addr: u64,
    /// Host address of the avail ring.
    avail_host: HostPtr,
    used_addr: u64,
    next_desc: u16,
    next_data: u64,
    avail_idx: u16,
    /// The used index up to which [`GuestQueue::take_used`] has read.
    seen_used: u16,
}

impl GuestQueue {
    /// A queue of `size` entries whose rings start at guest address 0, allocating buffers from
    /// [`DATA_START`].
    pub fn new(mem: &GuestMemoryMmap, size: u16) -> Self {
        Self::at(mem, GuestAddress(0), size, DATA_START)
    }

    /// A queue whose rings are laid out contiguously from `start` (descriptor table, avail
    /// ring, then the used ring 4-aligned), allocating buffers from `data_start`.
    pub fn at(mem: &GuestMemoryMmap, start: GuestAddress, size: u16, data_start: u64) -> Self {
        Self::with_rings(mem, size, split_rings(start.0, size), data_start)
    }

    /// A queue of `size` entries with its rings at (desc, avail, used), allocating buffers from
    /// `data_start`. Both rings start zeroed; the descriptor table is left as it is.
    pub fn with_rings(
        mem: &GuestMemoryMmap,
        size: u16,
        (desc, avail, used): (u64, u64, u64),
        data_start: u64,
    ) -> Self {
        let avail_len = 6 + 2 * usize::from(size);
        let used_len = 6 + 8 * usize::from(size);
        mem.write_slice(&vec![0u8; avail_len], GuestAddress(avail))
            .expect("avail ring in memory");
        mem.write_slice(&vec![0u8; used_len], GuestAddress(used))
            .expect("used ring in memory");
        Self::over_rings(mem, size, (desc, avail, used), data_start)
    }

    /// A queue of `size` entries over rings already at (desc, avail, used), left as they are
    /// (a driver taking over memory a test wrote or patched); the driver's avail index starts
    /// at 0. The avail ring must be 2-aligned, inside one memory region.
    pub fn over_rings(
        mem: &GuestMemoryMmap,
        size: u16,
        (desc, avail, used): (u64, u64, u64),
        data_start: u64,
    ) -> Self {
        assert_eq!(avail % 2, 0, "avail ring 2-aligned");
        GuestQueue {
            mem: mem.clone(),
            size,
            desc_addr: desc,
            avail_addr: avail,
            avail_host: host_range(mem, avail, 6 + 2 * usize::from(size)),
            used_addr: used,
            next_desc: 0,
            next_data: data_start,
            avail_idx: 0,
            seen_used: 0,
        }
    }

    /// The guest memory the queue lives in.
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The device's view of the queue (ready, addresses set, no EVENT_IDX).
    pub fn queue(&self) -> Queue {
        let mut queue = Queue::new(self.size).expect("valid queue size");
        queue.set_size(self.size);
        queue.set_ready(true);
        queue
            .try_set_desc_table_address(GuestAddress(self.desc_addr))
            .expect("aligned descriptor table");
        queue
            .try_set_avail_ring_address(GuestAddress(self.avail_addr))
            .expect("aligned avail ring");
        queue
            .try_set_used_ring_address(GuestAddress(self.used_addr))
            .expect("aligned used ring");
        queue
    }

    /// Ring addresses (desc, avail, used) for programming a transport.
    pub fn ring_addrs(&self) -> (u64, u64, u64) {
        (self.desc_addr, self.avail_addr, self.used_addr)
    }

    /// Moves the free-running indexes to `idx` on both sides (for wrap-around tests).
    pub fn start_at(&mut self, queue: &mut Queue, idx: u16) {
        self.start_indexes_at(idx);
        queue.set_next_avail(idx);
        queue.set_next_used(idx);
    }

    /// Moves the driver's free-running indexes and the ring's avail and used indexes to `idx`
    /// (a device's queue then starts at the used index, [`GuestQueue::used_idx`]).
    pub fn start_indexes_at(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.seen_used = idx;
        self.store_u16(self.avail_addr + 2, idx);
        self.store_u16(self.used_addr + 2, idx);
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
                let desc = split_desc(addr, len, flags, next);
                self.mem
                    .write_slice(&desc, GuestAddress(self.desc_addr + 16 * u64::from(index)))
                    .expect("descriptor slot");
                index
            })
            .collect()
    }

    /// Writes descriptors for `bufs` (address, length, flags) into consecutive free table
    /// slots, NEXT added to all but the last, each `next` the following slot (the last one's,
    /// which the device does not follow, one past it); returns the head's slot. Nothing is
    /// published.
    pub fn write_chain(&mut self, bufs: &[(u64, u32, u16)]) -> u16 {
        let first = self.next_desc;
        let descs: Vec<_> = (0u16..)
            .zip(bufs)
            .map(|(i, &(addr, len, flags))| {
                let next = first.wrapping_add(i + 1);
                if usize::from(i) + 1 < bufs.len() {
                    (addr, len, flags | NEXT, next % self.size)
                } else {
                    (addr, len, flags, next)
                }
            })
            .collect();
        self.write_descs(&descs)[0]
    }

    /// Writes `bufs` (address, length, flags) as an indirect table at guest address `table`
    /// (NEXT added to all but the last, `next` fields 1, 2, …) and one INDIRECT descriptor
    /// pointing to it into the next free slot; returns that slot. Nothing is published.
    pub fn write_indirect(&mut self, table: u64, bufs: &[(u64, u32, u16)]) -> u16 {
        for (i, &(addr, len, flags)) in (0u16..).zip(bufs) {
            let last = usize::from(i) + 1 == bufs.len();
            let flags = if last { flags } else { flags | NEXT };
            let raw = split_desc(addr, len, flags, i + 1);
            self.mem
                .write_slice(&raw, GuestAddress(table + 16 * u64::from(i)))
                .expect("indirect table in memory");
        }
        let len = 16 * bufs.len() as u32;
        self.write_descs(&[(table, len, INDIRECT, 0)])[0]
    }

    /// Puts `head` in the avail ring and publishes it.
    pub fn publish(&mut self, head: u16) {
        self.publish_all([head]);
    }

    /// Puts every one of `heads` in the avail ring, then publishes them with one store of the
    /// avail index.
    pub fn publish_all(&mut self, heads: impl IntoIterator<Item = u16>) {
        for head in heads {
            self.push_avail(head);
        }
        self.publish_avail();
    }

    /// Makes the `n` table slots after the last one published available, in turn (for a
    /// table whose slot `i` always holds a one-descriptor chain: a driver re-posting fixed
    /// buffers).
    pub fn publish_slots(&mut self, n: u16) {
        let (first, size) = (self.avail_idx, self.size);
        self.publish_all((0..n).map(|k| first.wrapping_add(k) % size));
    }

    /// Writes the next avail entry, `head`, without publishing it ([`GuestQueue::publish_avail`]
    /// does): a plain store through the avail ring's host address.
    #[inline]
    pub fn push_avail(&mut self, head: u16) {
        let slot = 4 + 2 * usize::from(self.avail_idx % self.size);
        // SAFETY: `avail_host` is the host address of the 6 + 2·size-byte avail ring, inside
        // one region of the memory `self.mem` keeps mapped (`host_range`), 2-aligned
        // (`over_rings`); `slot + 2 ≤ 4 + 2·size`. Guest memory is shared with the device,
        // hence the volatile store.
        unsafe {
            std::ptr::write_volatile(self.avail_host.0.add(slot).cast::<u16>(), head.to_le())
        };
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Publishes the entries pushed so far: a release store of the avail index.
    #[inline]
    pub fn publish_avail(&self) {
        // SAFETY: as in `push_avail`; offset 2 is the 2-aligned u16 `idx`, and guest memory is
        // plain shared memory, valid for atomic access.
        let idx = unsafe { AtomicU16::from_ptr(self.avail_host.0.add(2).cast()) };
        idx.store(self.avail_idx.to_le(), Ordering::Release);
    }

    /// The avail index the driver has published (free-running).
    pub fn avail_idx(&self) -> u16 {
        self.avail_idx
    }

    /// Publishes a chain of `bufs` (address, length), all with `flags` (0 or WRITE).
    pub fn add_chain(&mut self, bufs: &[(u64, u32)], flags: u16) -> u16 {
        let bufs: Vec<_> = bufs.iter().map(|&(addr, len)| (addr, len, flags)).collect();
        let head = self.write_chain(&bufs);
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
        self.store_u16(self.avail_addr + 2, idx);
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
        (u32::from_le(id), u32::from_le(len))
    }

    /// The next used entry the driver has not taken yet, if the device published one: (id,
    /// length).
    pub fn take_used(&mut self) -> Option<(u32, u32)> {
        if self.used_idx() == self.seen_used {
            return None;
        }
        let entry = self.used(self.seen_used);
        self.seen_used = self.seen_used.wrapping_add(1);
        Some(entry)
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.size
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
        self.store_u16(self.avail_addr + 4 + 2 * u64::from(self.size), value);
    }

    /// Sets the avail ring flags (VRING_AVAIL_F_NO_INTERRUPT).
    pub fn set_avail_flags(&self, flags: u16) {
        self.store_u16(self.avail_addr, flags);
    }

    /// The used ring flags (VRING_USED_F_NO_NOTIFY).
    pub fn used_flags(&self) -> u16 {
        self.load_u16(self.used_addr)
    }

    /// `avail_event` (EVENT_IDX: the device wants a kick when the avail index passes this).
    pub fn avail_event(&self) -> u16 {
        self.load_u16(self.used_addr + 4 + 8 * u64::from(self.size))
    }

    guest_data_methods!();
}

/// A split descriptor's 16 bytes: a packed descriptor's layout, with the flags where the
/// packed one has its id and `next` where it has its flags.
fn split_desc(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    desc_bytes(addr, len, flags, next)
}

/// A descriptor's 16 bytes: the address, the length, then two 16-bit words (a split
/// descriptor's flags and `next`, a packed one's id and flags).
pub(super) fn desc_bytes(addr: u64, len: u32, a: u16, b: u16) -> [u8; 16] {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&addr.to_le_bytes());
    raw[8..12].copy_from_slice(&len.to_le_bytes());
    raw[12..14].copy_from_slice(&a.to_le_bytes());
    raw[14..].copy_from_slice(&b.to_le_bytes());
    raw
}
