//! One driver interface over both ring kinds ([`DriverRing`], for the split [`GuestQueue`] and
//! the packed [`GuestPackedQueue`]), so that a test body written once runs on either: the
//! device's guarantees (rate limits, busy-poll, coalescing, sparse reads, bounds, statistics)
//! must hold whichever ring the driver negotiated.

use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_NEEDS_RESET};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::support::{frame, wire, GuestQueue, NEXT};
use super::worker::{kick, rig_with, Rig, TIMEOUT};
use crate::backend::PairBackend;
use crate::test_utils::mmio::{wait_until, Registers};
use crate::test_utils::packed::{advance, GuestPackedQueue};
use crate::virtio::net::NetDevice;
use crate::virtio::packed::{
    PackedLayout, PackedVirtqueue, EVENT_FLAG_DESC, EVENT_FLAG_DISABLE, EVENT_FLAG_ENABLE,
    EVENT_WRAP_BIT,
};
use crate::virtio::ring::{vring_need_event, AnyRing};
use crate::virtio::vring::Virtqueue;
use crate::virtio::MmioTransport;

/// The driver's side of one queue, of either ring kind.
pub(super) trait DriverRing: Sized + Send {
    /// The feature bits that select this ring kind (VIRTIO_F_RING_PACKED, or none).
    const RING_FEATURES: u64;

    /// A queue of `size` entries with its rings from `base` and its buffers from `data`.
    fn at(mem: &GuestMemoryMmap, base: u64, size: u16, data: u64) -> Self;
    /// The three addresses to program.
    fn addrs(&self) -> (u64, u64, u64);
    /// Queue size.
    fn queue_size(&self) -> u16;
    /// Copies `bytes` into fresh guest memory; returns its address.
    fn put(&mut self, bytes: &[u8]) -> u64;
    /// Reserves `len` zeroed bytes of guest memory; returns the address.
    fn reserve(&mut self, len: usize) -> u64;
    /// Makes a chain of `bufs` (address, length, flags: 0 or WRITE) available; returns its id
    /// (the head descriptor on a split ring, the buffer id on a packed one).
    fn offer(&mut self, bufs: &[(u64, u32, u16)]) -> u16;
    /// Makes a device-writable chain of buffers of the given lengths available; returns its
    /// id and the buffer addresses.
    fn offer_rx(&mut self, lens: &[u32]) -> (u16, Vec<u64>);
    /// The next used entry the driver has not taken yet: (id, length).
    fn next_used(&mut self) -> Option<(u32, u32)>;
    /// Whether the driver must kick after making `added` descriptors available, from what
    /// the device wrote (`event_idx`: VIRTIO_RING_F_EVENT_IDX negotiated).
    fn wants_kick(&self, added: u16, event_idx: bool) -> bool;
    /// Reads guest memory.
    fn peek(&self, addr: u64, len: usize) -> Vec<u8>;
    /// The device's ring over this queue (for tests that drive the datapath directly), with
    /// VIRTIO_RING_F_EVENT_IDX as `features` say, starting where the ring's used side is.
    fn device_ring(&self, features: u64) -> AnyRing;
    /// Starts the split ring's free-running indexes at `idx` (for their 16-bit wrap); a
    /// packed ring has none (its positions wrap every lap): nothing.
    fn start_at_index(&mut self, idx: u16);
    /// Asks for an interrupt when the device uses the `at`-th entry from the driver's next
    /// used one (0: the next), or for none (`at` `None`): with EVENT_IDX (`event_idx`) through
    /// `used_event` (split; `None`: the entry just behind) or DESC at that position (packed;
    /// `None`: DISABLE); without it, any `at` enables interrupts and `None` sets
    /// NO_INTERRUPT (split) or DISABLE (packed).
    fn want_interrupt_at(&self, at: Option<u16>, event_idx: bool);

    /// The rx and tx queues of pair 0 at the addresses [`super::worker::queues`] uses.
    fn pair(mem: &GuestMemoryMmap) -> (Self, Self) {
        (
            Self::at(mem, 0, 256, 0x10_0000),
            Self::at(mem, 0x1_0000, 256, 0x40_0000),
        )
    }

    /// Programs this queue as queue `index` of `t`.
    fn program(&self, t: &mut MmioTransport, index: u32) {
        t.setup_queue(index, self.queue_size(), self.addrs());
    }

    /// Makes a device-readable chain carrying `bytes` available, cut at the `cuts` offsets.
    fn offer_tx(&mut self, bytes: &[u8], cuts: &[usize]) -> u16 {
        let mut bufs = Vec::new();
        let mut start = 0;
        for &end in cuts.iter().chain([bytes.len()].iter()) {
            bufs.push((self.put(&bytes[start..end]), (end - start) as u32, 0));
            start = end;
        }
        self.offer(&bufs)
    }

    /// Takes every used entry the device has published so far, unread.
    fn skip_used(&mut self) {
        while self.next_used().is_some() {}
    }

    /// Waits (up to [`TIMEOUT`]) for the next used entry.
    fn wait_used(&mut self) -> (u32, u32) {
        let mut used = None;
        assert!(
            wait_until(TIMEOUT, || {
                used = self.next_used();
                used.is_some()
            }),
            "a used entry"
        );
        used.expect("used entry")
    }

    /// Waits (up to [`TIMEOUT`]) for the next used entry without sleeping (yielding the CPU
    /// between looks): for a driver whose timing a test measures, where the 1 ms sleeps of
    /// [`DriverRing::wait_used`] would stretch its pauses past a device's busy-poll window.
    fn spin_used(&mut self) -> (u32, u32) {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            match self.next_used() {
                Some(used) => return used,
                None if std::time::Instant::now() < deadline => std::thread::yield_now(),
                None => panic!("no used entry"),
            }
        }
    }
}

/// The [`DriverRing`] methods both queue kinds answer with inherent methods of their own (a
/// macro: the two impls call methods of the same names on different types).
macro_rules! forward_to_inherent {
    () => {
        fn addrs(&self) -> (u64, u64, u64) {
            self.ring_addrs()
        }
        fn queue_size(&self) -> u16 {
            self.size()
        }
        fn put(&mut self, bytes: &[u8]) -> u64 {
            self.alloc(bytes)
        }
        fn reserve(&mut self, len: usize) -> u64 {
            self.alloc_zeroed(len)
        }
        fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
            self.read(addr, len)
        }
    };
}

impl DriverRing for GuestQueue {
    const RING_FEATURES: u64 = 0;

    fn at(mem: &GuestMemoryMmap, base: u64, size: u16, data: u64) -> Self {
        GuestQueue::at(mem, GuestAddress(base), size, data)
    }
    forward_to_inherent!();
    fn offer(&mut self, bufs: &[(u64, u32, u16)]) -> u16 {
        let first = self.next_slot();
        let size = self.size();
        let descs: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| {
                let last = i + 1 == bufs.len();
                let next = (first + i as u16 + 1) % size;
                (addr, len, if last { flags } else { flags | NEXT }, next)
            })
            .collect();
        let head = self.write_descs(&descs)[0];
        self.publish(head);
        head
    }
    fn offer_rx(&mut self, lens: &[u32]) -> (u16, Vec<u64>) {
        self.push_rx(lens)
    }
    fn next_used(&mut self) -> Option<(u32, u32)> {
        self.take_used()
    }
    fn wants_kick(&self, added: u16, event_idx: bool) -> bool {
        if event_idx {
            let new = self.avail_idx();
            vring_need_event(self.avail_event(), new, new.wrapping_sub(added))
        } else {
            self.used_flags() & 1 == 0
        }
    }
    fn device_ring(&self, features: u64) -> AnyRing {
        let mut queue = self.queue();
        queue.set_event_idx(features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0);
        queue.set_next_avail(self.used_idx());
        queue.set_next_used(self.used_idx());
        Virtqueue::new(&queue, self.mem()).expect("ring").into()
    }
    fn start_at_index(&mut self, idx: u16) {
        self.start_indexes_at(idx);
    }
    fn want_interrupt_at(&self, at: Option<u16>, event_idx: bool) {
        let next = self.used_idx();
        if event_idx {
            self.set_used_event(match at {
                Some(k) => next.wrapping_add(k),
                None => next.wrapping_sub(1),
            });
        } else {
            self.set_avail_flags(u16::from(at.is_none()));
        }
    }
}

impl DriverRing for GuestPackedQueue {
    const RING_FEATURES: u64 = 1 << VIRTIO_F_RING_PACKED;

    /// The descriptor ring at `base`, both event areas right after it.
    fn at(mem: &GuestMemoryMmap, base: u64, size: u16, data: u64) -> Self {
        let ring = 16 * u64::from(size);
        let layout = PackedLayout {
            size,
            desc: base,
            driver_event: base + ring,
            device_event: base + ring + 4,
        };
        GuestPackedQueue::with_layout(mem, layout).with_data_at(data)
    }
    forward_to_inherent!();
    fn offer(&mut self, bufs: &[(u64, u32, u16)]) -> u16 {
        self.add_chain(bufs)
    }
    fn offer_rx(&mut self, lens: &[u32]) -> (u16, Vec<u64>) {
        self.push_writable(lens)
    }
    fn next_used(&mut self) -> Option<(u32, u32)> {
        self.take_used().map(|u| (u32::from(u.id), u.len))
    }
    fn wants_kick(&self, added: u16, _event_idx: bool) -> bool {
        // The device's event area says DESC only with EVENT_IDX.
        GuestPackedQueue::kick_needed(self, added)
    }
    fn device_ring(&self, features: u64) -> AnyRing {
        PackedVirtqueue::new(self.mem(), &self.layout(), features | Self::RING_FEATURES)
            .expect("ring")
            .into()
    }
    fn start_at_index(&mut self, _idx: u16) {}
    fn want_interrupt_at(&self, at: Option<u16>, event_idx: bool) {
        match at {
            None => self.set_driver_event(0, EVENT_FLAG_DISABLE),
            Some(k) if event_idx => {
                let (offset, wrap) = advance(self.used_position(), k, self.size());
                let off_wrap = offset | if wrap { EVENT_WRAP_BIT } else { 0 };
                self.set_driver_event(off_wrap, EVENT_FLAG_DESC);
            }
            Some(_) => self.set_driver_event(0, EVENT_FLAG_ENABLE),
        }
    }
}

/// A rig whose device offers `Q`'s ring kind; `configure` sees the device before it goes
/// behind the transport.
pub(super) fn rig_for<Q: DriverRing>(
    mem: &GuestMemoryMmap,
    configure: impl FnOnce(&mut NetDevice<PairBackend>),
) -> Rig {
    rig_with(mem, |d| {
        d.offer_ring_features(Q::RING_FEATURES != 0, false);
        configure(d);
    })
}

/// A [`rig_for`] `Q` (with `configure`) on `mem` whose queues of [`DriverRing::pair`] are
/// started with `features` ([`start_rings`]).
pub(super) fn started_rings<Q: DriverRing>(
    mem: &GuestMemoryMmap,
    features: u64,
    configure: impl FnOnce(&mut NetDevice<PairBackend>),
) -> (Rig, Q, Q) {
    let mut rig = rig_for::<Q>(mem, configure);
    let (rx, tx) = Q::pair(mem);
    start_rings(&mut rig.transport, features, &[&rx, &tx]);
    (rig, rx, tx)
}

/// Negotiates `features` and `Q`'s ring kind, programs queue i from `queues[i]` and sets
/// DRIVER_OK; the device must be running.
pub(super) fn start_rings<Q: DriverRing>(t: &mut MmioTransport, features: u64, queues: &[&Q]) {
    assert!(
        t.negotiate(features | Q::RING_FEATURES),
        "FEATURES_OK accepted"
    );
    for (i, q) in queues.iter().enumerate() {
        q.program(t, i as u32);
    }
    t.driver_ok();
    assert_eq!(
        t.status() & (VIRTIO_CONFIG_S_DRIVER_OK | VIRTIO_CONFIG_S_NEEDS_RESET),
        VIRTIO_CONFIG_S_DRIVER_OK
    );
}

/// Sends one frame on queue 1 and waits for the peer to get it and the device to return
/// its buffer.
pub(super) fn send_frame<Q: DriverRing>(rig: &Rig, tx: &mut Q, seed: u8) {
    let out = wire(&frame(64, seed));
    let id = tx.offer_tx(&out, &[]);
    kick(&rig.transport, 1);
    assert_eq!(rig.peer.recv_frame().expect("frame"), out);
    assert_eq!(tx.wait_used(), (u32::from(id), 0));
}
