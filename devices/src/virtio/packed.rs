//! The device side of a packed virtqueue (VIRTIO_F_RING_PACKED, virtio 1.1+ §2.8), over host
//! pointers resolved once per activation, beside the split ring ([`super::vring`]) and with the
//! same shape: the datapath runs on either through [`super::ring`] when the driver negotiated
//! VIRTIO_F_RING_PACKED.
//!
//! # Layout and positions
//!
//! The driver programs three addresses: the descriptor ring (`size` descriptors of 16 bytes:
//! `le64 addr; le32 len; le16 id; le16 flags`, 16-aligned), the driver event suppression area
//! (`le16 desc_event_off_wrap; le16 desc_event_flags`, written by the driver, read by the
//! device, 4-aligned) and the device event suppression area (the same structure, written by
//! the device). [`PackedVirtqueue::new`] checks that each lies inside one guest memory region,
//! aligned, and that the three do not overlap (the device writes the descriptor ring and its
//! own event area; an overlap would let a used descriptor rewrite what the driver asks, or the
//! reverse). Any size from 1 to 32768 is accepted, powers of two or not.
//!
//! The device keeps two positions, each a ring offset and a wrap counter (both counters start
//! at 1): where the next available chain starts (`next_avail`, the driver's avail wrap
//! counter) and where the next used descriptor goes (`next_used`, the device's used wrap
//! counter). A position moves by the number of descriptors a chain occupies in the ring (an
//! indirect chain occupies 1) and flips its counter when it passes the end of the ring.
//!
//! # Guarantees
//!
//! - **Available**: a descriptor is available when its AVAIL flag equals the driver's wrap
//!   counter and its USED flag differs from it; its flags are loaded with acquire before the
//!   rest of the chain is read (the driver writes the head's flags last), and each other
//!   descriptor of the chain is read once per pass (its id and flags together when the pop
//!   looks for the chain's end, the whole descriptor when the walk reads its buffer).
//! - **Chains**: NEXT links the following ring slot (wrapping at the end). A chain's extent and
//!   buffer id (that of its last descriptor) are fixed when it is popped, so a driver that
//!   rewrites it afterwards cannot change what the device later marks used. A chain that runs
//!   on for the whole ring, past [`MAX_CHAIN_DESCRIPTORS`] direct descriptors, or past what the
//!   ring can still hold, or whose id is not below the ring size, cannot be returned and is a
//!   [`PackedRingError`]: the device must stop and ask for a reset. Everything else wrong with
//!   a chain (direction, buffers outside guest memory, bad indirect table, an INDIRECT
//!   descriptor inside a NEXT list, too many segments or bytes) is a [`ChainError`]: the chain
//!   is returned used with length 0 and the queue goes on, as with the split ring.
//! - **Indirect tables**: a lone descriptor with INDIRECT; its table's length must be a whole,
//!   non-zero number of descriptors, the table inside one region, at most
//!   [`MAX_CHAIN_DESCRIPTORS`] − 1 entries, read in order (NEXT inside a table is reserved and
//!   ignored); an INDIRECT entry inside a table is refused.
//! - **Bounded work**: popping reads at most [`MAX_CHAIN_DESCRIPTORS`] descriptors' flags;
//!   walking a chain visits at most [`MAX_CHAIN_DESCRIPTORS`] descriptors and charges them to
//!   the call's `WalkBudget`, as the split ring does.
//! - **Used**: each used descriptor goes at `next_used`, its flags AVAIL and USED both equal to
//!   the used wrap counter, WRITE when the length is meaningful. Each is written whole: its
//!   length, id and flags (bytes 8..16) in one 8-byte store with release, so the driver, which
//!   reads the flags first, sees the id, the length and the buffer's contents with them. No
//!   descriptor waits for a later one and no fence runs per batch (on x86 a release store is a
//!   plain store); the publication (`RingOps::publish_used`) only closes what the next
//!   interrupt decision covers, counting descriptors rather than positions, since a driver that
//!   sees used descriptors at once may make them available again before it.
//!   Positions advance only by what was popped: every completion consumes a [`ChainHead`] the
//!   pop returned. With VIRTIO_F_IN_ORDER a batch of chains is
//!   returned with one used descriptor carrying the last buffer id, and the position skips all
//!   of their descriptors.
//! - **Interrupts** (`RingOps::interrupt_decision`, once over everything published since the
//!   previous decision): the driver's `desc_event_flags` ENABLE raises, DISABLE suppresses,
//!   DESC (with VIRTIO_RING_F_EVENT_IDX) raises when the used position passed
//!   `desc_event_off_wrap` in that range. Its wrap bit is compared with the used wrap counter as
//!   QEMU does (a mismatch puts the offset a ring earlier) before `vring_need_event`, with the
//!   old position tracked across the wrap; a range of more than a ring (descriptors the driver
//!   recycled before the publication) always raises.
//! - **Kicks** (`RingOps::enable_notification` / `disable_notification`): the device writes its
//!   own area: DISABLE, ENABLE, or with EVENT_IDX DESC with `next_avail` as off_wrap (off_wrap
//!   stored, a full fence, then the flags, as QEMU does); enabling then re-checks the next
//!   descriptor (the standard race) and says whether buffers arrived meanwhile.
//!
//! Soundness is the split ring's: the raw pointers stay valid because a [`PackedVirtqueue`] owns
//! a clone of the `GuestMemoryMmap` they were resolved from, and they are private to this
//! module. Guest memory is shared with the running guest, so every access is volatile or
//! atomic, and nothing read from it is trusted without a check; no guest-controlled value can
//! make this module panic.

use std::ptr;
use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, Ordering};

use virtio_bindings::virtio_config::VIRTIO_F_IN_ORDER;
use virtio_bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    VRING_PACKED_DESC_F_AVAIL, VRING_PACKED_DESC_F_USED, VRING_PACKED_EVENT_FLAG_DESC,
    VRING_PACKED_EVENT_FLAG_DISABLE, VRING_PACKED_EVENT_FLAG_ENABLE, VRING_PACKED_EVENT_F_WRAP_CTR,
};
use vm_memory::{GuestMemoryError, GuestMemoryMmap};

use super::chain::{ChainError, Direction};
use super::guest::{
    host_regions, read_unaligned_volatile, vring_need_event, Buffer, ControlWalk, Directed,
    GuestView, InterruptDecision, WalkBudget, MAX_CHAIN_DESCRIPTORS,
};
use crate::iovec::{prefetch, IovecList};

/// Size of one descriptor.
const DESC_SIZE: u64 = 16;
/// Size of an event suppression structure.
const EVENT_SIZE: u64 = 4;
/// Byte offset of `desc_event_off_wrap` in an event suppression area.
const OFF_WRAP: usize = 0;
/// Byte offset of `desc_event_flags` in an event suppression area.
const FLAGS: usize = 2;
/// The largest packed ring (the off_wrap offset has 15 bits).
pub const MAX_PACKED_SIZE: u16 = 32768;

const NEXT: u16 = VRING_DESC_F_NEXT as u16;
const WRITE: u16 = VRING_DESC_F_WRITE as u16;
const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;
/// Descriptor flag: made available (compared with the driver's wrap counter).
pub const DESC_F_AVAIL: u16 = 1 << VRING_PACKED_DESC_F_AVAIL;
/// Descriptor flag: used (compared with the device's wrap counter).
pub const DESC_F_USED: u16 = 1 << VRING_PACKED_DESC_F_USED;
/// Event suppression flags: notify on every buffer.
pub const EVENT_FLAG_ENABLE: u16 = VRING_PACKED_EVENT_FLAG_ENABLE as u16;
/// Event suppression flags: do not notify.
pub const EVENT_FLAG_DISABLE: u16 = VRING_PACKED_EVENT_FLAG_DISABLE as u16;
/// Event suppression flags: notify when the position in off_wrap is reached (EVENT_IDX only).
pub const EVENT_FLAG_DESC: u16 = VRING_PACKED_EVENT_FLAG_DESC as u16;
/// The wrap counter's bit in off_wrap.
pub const EVENT_WRAP_BIT: u16 = 1 << VRING_PACKED_EVENT_F_WRAP_CTR;

/// A raw packed descriptor, as the driver lays it out (little endian).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RawDesc {
    addr: u64,
    len: u32,
    id: u16,
    flags: u16,
}

impl RawDesc {
    /// Its buffer, in native byte order.
    #[inline(always)]
    fn buffer(&self) -> Buffer {
        Buffer {
            addr: u64::from_le(self.addr),
            len: u32::from_le(self.len),
            flags: u16::from_le(self.flags),
        }
    }
}

/// Where the driver put a packed queue's three parts, and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedLayout {
    /// Queue size: descriptors in the ring (1..=32768).
    pub size: u16,
    /// Guest address of the descriptor ring (16-aligned).
    pub desc: u64,
    /// Guest address of the driver event suppression area (4-aligned).
    pub driver_event: u64,
    /// Guest address of the device event suppression area (4-aligned).
    pub device_event: u64,
}

/// Which part of a packed queue was refused at activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedPart {
    /// The descriptor ring.
    DescRing,
    /// The driver event suppression area (the device reads it).
    DriverEvent,
    /// The device event suppression area (the device writes it).
    DeviceEvent,
}

impl std::fmt::Display for PackedPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PackedPart::DescRing => "descriptor ring",
            PackedPart::DriverEvent => "driver event suppression area",
            PackedPart::DeviceEvent => "device event suppression area",
        })
    }
}

/// An error that leaves a packed ring unusable: the device must stop and ask for a reset.
#[derive(Debug, thiserror::Error)]
pub enum PackedRingError {
    /// The queue size is 0 or above 32768.
    #[error("packed queue size {0} is invalid")]
    InvalidSize(u16),
    /// A part is not aligned as the spec requires (16 / 4 / 4 bytes).
    #[error("the {0} is misaligned")]
    Misaligned(PackedPart),
    /// A part does not lie inside one guest memory region.
    #[error("the {0} is outside guest memory")]
    OutsideMemory(PackedPart),
    /// Two parts overlap, one of which the device writes.
    #[error("the {written} overlaps the {other}")]
    Overlap {
        /// The part the device writes.
        written: PackedPart,
        /// The part it overlaps.
        other: PackedPart,
    },
    /// Resolving guest memory failed.
    #[error("guest memory access to the ring failed")]
    Memory(#[source] GuestMemoryError),
    /// A chain's NEXT flags run on for the whole ring or past [`MAX_CHAIN_DESCRIPTORS`]
    /// descriptors: its end (where its id is, and where the next chain starts) is unknown.
    #[error("a descriptor chain runs on past {0} descriptors")]
    ChainTooLong(u32),
    /// The driver made more descriptors available than the ring holds with those the device
    /// has not returned yet.
    #[error("more descriptors available than the ring holds")]
    Overrun,
    /// A resume position (SET_VRING_BASE, a snapshot) whose offset is not below the queue
    /// size.
    #[error("ring position {0} is outside the ring")]
    PositionOutOfRange(u16),
    /// A chain's buffer id is not below the queue size (it cannot be returned).
    #[error("buffer id {0} is out of range")]
    IdOutOfRange(u16),
}

/// A ring position: an offset below the queue size and a wrap counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Offset in the descriptor ring.
    pub offset: u16,
    /// Wrap counter.
    pub wrap: bool,
}

impl Position {
    /// The off_wrap encoding of the position.
    #[inline]
    pub fn off_wrap(self) -> u16 {
        self.offset | if self.wrap { EVENT_WRAP_BIT } else { 0 }
    }
}

/// The AVAIL and USED flags together: a wrap counter's bits in a descriptor's flags.
const WRAP_BITS: u16 = DESC_F_AVAIL | DESC_F_USED;

/// A [`Position`] as the datapath keeps it, in one `u32`: the offset in the low half, the wrap
/// counter in the high half as the AVAIL and USED bits of a used descriptor written with it
/// (both set for counter 1, neither for 0). A used descriptor's flags are then those bits, a
/// descriptor the driver made available with the same counter has them with USED flipped, and
/// passing the end of the ring flips both: no branch on the counter on the datapath, and a
/// position moves and compares as one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor(u32);

impl Cursor {
    /// The wrap counter's bits, shifted to the high half.
    const WRAP: u32 = (WRAP_BITS as u32) << 16;

    /// The starting position of both sides: offset 0, wrap counter 1.
    const START: Cursor = Cursor(Cursor::WRAP);

    /// The cursor of `position` (its offset below the queue size).
    fn at(position: Position) -> Cursor {
        Cursor(u32::from(position.offset) | if position.wrap { Cursor::WRAP } else { 0 })
    }

    /// The offset in the descriptor ring.
    #[inline(always)]
    fn offset(self) -> u16 {
        self.0 as u16
    }

    /// The AVAIL and USED bits of a used descriptor written at this position.
    #[inline(always)]
    fn bits(self) -> u16 {
        (self.0 >> 16) as u16
    }

    /// The position it stands for.
    #[inline]
    fn position(self) -> Position {
        Position {
            offset: self.offset(),
            wrap: self.bits() != 0,
        }
    }

    /// The cursor `n` descriptors further (`n ≤ size`), flipping the counter at the end.
    #[inline(always)]
    fn advance(self, n: u16, size: u16) -> Cursor {
        // `offset < size ≤ 32768` and `n ≤ size`: the sum stays inside the low half.
        let next = self.0 + u32::from(n);
        if next & 0xffff >= u32::from(size) {
            // Once per lap: out of line, so that the common step is an add and a compare
            // (computing both results and picking one cost the datapath 3–4 instructions a
            // step, two steps a frame).
            Cursor::wrapped(next, size)
        } else {
            Cursor(next)
        }
    }

    /// `next` (an offset past the end of the ring, below `2·size`) brought back into the ring,
    /// the wrap counter flipped.
    #[cold]
    #[inline(never)]
    fn wrapped(next: u32, size: u16) -> Cursor {
        Cursor((next - u32::from(size)) ^ Cursor::WRAP)
    }

    /// Descriptors from `self` forward to `later`, if `later` is at most a ring ahead.
    #[inline(always)]
    fn distance_to(self, later: Cursor, size: u16) -> u32 {
        let (from, to) = (u32::from(self.offset()), u32::from(later.offset()));
        if self.bits() == later.bits() {
            if to >= from {
                to - from
            } else {
                // Two wraps ahead: not a distance this ring can have.
                u32::MAX
            }
        } else {
            to + u32::from(size) - from
        }
    }

    /// Whether `later` is exactly one ring ahead (same offset, the other wrap counter).
    #[inline(always)]
    fn lap_behind(self, later: Cursor) -> bool {
        self.0 ^ Cursor::WRAP == later.0
    }

    /// Whether `flags` mark a descriptor available with this cursor's wrap counter: AVAIL equal
    /// to the counter and USED not (AVAIL alone for 1, USED alone for 0).
    #[inline(always)]
    fn sees_avail(self, flags: u16) -> bool {
        self.sees_avail_word(u32::from(flags) << 16)
    }

    /// [`Cursor::sees_avail`] on a descriptor's id (low half) and flags (high half) as one
    /// word: the cursor's high half holds the counter's bits where the flags are, so one
    /// `xor` with the word and one mask compare them (the offset in the low half is masked
    /// out).
    #[inline(always)]
    fn sees_avail_word(self, id_flags: u32) -> bool {
        (id_flags ^ self.0 ^ (u32::from(DESC_F_USED) << 16)) & Cursor::WRAP == 0
    }
}

/// A popped chain: what marking it used needs. Returned by `RingOps::pop_head`, consumed by
/// `RingOps::add_used` (or put back with `RingOps::unpop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainHead {
    id: u16,
    descs: u16,
    start: Cursor,
}

impl Default for ChainHead {
    /// A placeholder for storage that is filled with popped heads before it is read: one
    /// descriptor at the start position (a chain occupies at least one, so the walk needs no
    /// check for none; a placeholder walked by mistake reads descriptor 0, inside the ring).
    fn default() -> ChainHead {
        ChainHead {
            id: 0,
            descs: 1,
            start: Cursor::START,
        }
    }
}

impl ChainHead {
    /// The buffer id (that of the chain's last descriptor).
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Where the chain starts in the ring.
    pub fn start(&self) -> Position {
        self.start.position()
    }

    /// How many ring descriptors the chain occupies (1 for an indirect chain).
    pub fn descriptors(&self) -> u16 {
        self.descs
    }
}

/// The device side of one packed virtqueue for one activation (see the module docs).
#[derive(Debug)]
pub struct PackedVirtqueue {
    /// Keeps every pointer in `ring` valid.
    mem: GuestMemoryMmap,
    regions: Vec<super::guest::HostRegion>,
    ring: RingState,
}

/// Ring pointers and positions. Private to this module: the pointers are only valid while the
/// owning [`PackedVirtqueue`]'s memory lives, so the state never leaves it.
#[derive(Debug)]
struct RingState {
    descs: DescRing,
    driver_event: *mut u8,
    device_event: *mut u8,
    event_idx: bool,
    in_order: bool,
    next_avail: Cursor,
    next_used: Cursor,
    /// `next_used` at the last [`RingOps::publish_used`].
    published: Cursor,
    /// Descriptors used since the last [`RingOps::publish_used`] (a count, not a distance: a
    /// driver that sees used descriptors at once may recycle them before the publication).
    unpublished: u32,
    /// Descriptors used up to `published` since the last interrupt decision.
    unsignalled: u32,
    /// What the device event area's flags hold, as last written.
    kick_flags: Option<u16>,
    /// A full fence ran after the last used descriptor store: the interrupt decision needs none.
    fenced: bool,
}

// SAFETY: the raw pointers point into guest memory owned (through `mem`) by the value itself;
// nothing in it is tied to the thread that built it.
unsafe impl Send for PackedVirtqueue {}

impl PackedVirtqueue {
    /// Resolves the rings of `layout` in `mem`, for the negotiated `features` (EVENT_IDX and
    /// IN_ORDER are read from them). Refuses a size outside 1..=32768, a part outside one
    /// memory region or misaligned, and parts that overlap (see the module docs).
    pub fn new(
        mem: &GuestMemoryMmap,
        layout: &PackedLayout,
        features: u64,
    ) -> Result<PackedVirtqueue, PackedRingError> {
        let size = layout.size;
        if size == 0 || size > MAX_PACKED_SIZE {
            return Err(PackedRingError::InvalidSize(size));
        }
        let parts = [
            (
                PackedPart::DescRing,
                layout.desc,
                DESC_SIZE * u64::from(size),
                16,
            ),
            (PackedPart::DriverEvent, layout.driver_event, EVENT_SIZE, 4),
            (PackedPart::DeviceEvent, layout.device_event, EVENT_SIZE, 4),
        ];
        let regions = host_regions(mem).map_err(PackedRingError::Memory)?;
        let view = GuestView::new(mem, &regions);
        let mut hosts = [ptr::null_mut(); 3];
        for (host, (part, addr, len, align)) in hosts.iter_mut().zip(parts) {
            if !addr.is_multiple_of(align) {
                return Err(PackedRingError::Misaligned(part));
            }
            *host = view
                .host_range(addr, len)
                .ok_or(PackedRingError::OutsideMemory(part))?;
        }
        // Each range lies inside a region, so `addr + len` does not overflow.
        let overlaps = |a: (PackedPart, u64, u64, u64), b: (PackedPart, u64, u64, u64)| {
            a.1 < b.1 + b.2 && b.1 < a.1 + a.2
        };
        for (written, other) in [(0, 1), (2, 0), (2, 1)] {
            if overlaps(parts[written], parts[other]) {
                return Err(PackedRingError::Overlap {
                    written: parts[written].0,
                    other: parts[other].0,
                });
            }
        }
        Ok(PackedVirtqueue {
            mem: mem.clone(),
            regions,
            ring: RingState {
                descs: DescRing {
                    base: hosts[0],
                    size,
                },
                driver_event: hosts[1],
                device_event: hosts[2],
                event_idx: features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0,
                in_order: features & (1 << VIRTIO_F_IN_ORDER) != 0,
                next_avail: Cursor::START,
                next_used: Cursor::START,
                published: Cursor::START,
                unpublished: 0,
                unsignalled: 0,
                kick_flags: None,
                fenced: false,
            },
        })
    }

    /// Moves the ring to resume at `next_avail` (where the driver's next chain starts, with
    /// the driver's wrap counter) and `next_used` (where the next used descriptor goes, with
    /// the device's): vhost-user's SET_VRING_BASE, a restored snapshot. Refuses an offset not
    /// below the queue size, and a used position more than a ring behind the avail one.
    pub fn set_position(
        &mut self,
        next_avail: Position,
        next_used: Position,
    ) -> Result<(), PackedRingError> {
        let size = self.ring.descs.size;
        for position in [next_avail, next_used] {
            if position.offset >= size {
                return Err(PackedRingError::PositionOutOfRange(position.offset));
            }
        }
        let (avail, used) = (Cursor::at(next_avail), Cursor::at(next_used));
        // At most the whole ring in flight (a used position exactly a lap behind).
        if used.distance_to(avail, size) > u32::from(size) {
            return Err(PackedRingError::Overrun);
        }
        self.ring.next_avail = avail;
        self.ring.next_used = used;
        self.ring.published = used;
        self.ring.unpublished = 0;
        self.ring.unsignalled = 0;
        self.ring.kick_flags = None;
        self.ring.fenced = false;
        Ok(())
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.ring.descs.size
    }

    /// Whether EVENT_IDX was negotiated.
    pub fn event_idx(&self) -> bool {
        self.ring.event_idx
    }

    /// Whether IN_ORDER was negotiated.
    pub fn in_order(&self) -> bool {
        self.ring.in_order
    }

    /// Where the next available chain starts (driver's wrap counter).
    pub fn next_avail(&self) -> Position {
        self.ring.next_avail.position()
    }

    /// Where the next used descriptor goes (device's wrap counter).
    pub fn next_used(&self) -> Position {
        self.ring.next_used.position()
    }

    /// Ring descriptors popped and not used yet.
    pub fn in_flight(&self) -> u32 {
        self.ring.in_flight()
    }

    /// Whether the descriptor at `next_avail` is available: one load and no state change (the
    /// busy-poll's probe).
    #[inline]
    pub fn avail_pending(&self) -> bool {
        self.ring.next_available()
    }

    /// Guest memory and ring, borrowed apart: iovecs into the former while the latter moves.
    pub(crate) fn split(&mut self) -> (GuestView<'_>, RingOps<'_>) {
        (
            GuestView::new(&self.mem, &self.regions),
            RingOps {
                descs: self.ring.descs,
                ring: &mut self.ring,
            },
        )
    }
}

/// The descriptor ring: its host address and size. Small and `Copy`: the hot paths take a
/// copy into a local, which the compiler keeps in registers across the stores they make (a
/// field read through the queue's state would be read again after each).
#[derive(Clone, Copy, Debug)]
struct DescRing {
    /// Host address of descriptor 0 (16·size bytes, checked in `PackedVirtqueue::new`).
    base: *mut u8,
    size: u16,
}

impl DescRing {
    /// Host address of descriptor `offset`'s first byte.
    #[inline(always)]
    fn ptr(self, offset: u16) -> *mut u8 {
        debug_assert!(offset < self.size);
        // SAFETY: `offset < size` (every caller passes a `Position` offset or one reduced
        // below `size`), so the result is inside the 16·size-byte ring checked in `new`.
        unsafe { self.base.add(usize::from(offset) * DESC_SIZE as usize) }
    }

    /// The offset after `offset`, wrapping at the end of the ring.
    #[inline(always)]
    fn next(self, offset: u16) -> u16 {
        if offset + 1 == self.size {
            0
        } else {
            offset + 1
        }
    }

    /// Descriptor `offset`'s flags, acquire: the rest of the chain is read after it.
    #[inline(always)]
    fn load_flags(self, offset: u16) -> u16 {
        // SAFETY: the descriptor is inside the ring (ptr), 16-aligned, so its u16 flags at
        // byte 14 are 2-aligned; guest memory is plain shared memory, valid for atomic access.
        let flags = unsafe { AtomicU16::from_ptr(self.ptr(offset).add(14).cast()) };
        u16::from_le(flags.load(Ordering::Acquire))
    }

    /// The id (low half) and flags (high half) of descriptor `offset`, in one acquire load:
    /// a chain's head (the rest of the chain is read after it).
    #[inline(always)]
    fn load_id_flags(self, offset: u16) -> u32 {
        // SAFETY: the descriptor is inside the ring (ptr), 16-aligned: its id and flags, bytes
        // 12..16, are inside it and 4-aligned; guest memory is plain shared memory, valid for
        // atomic access.
        let word = unsafe { AtomicU32::from_ptr(self.ptr(offset).add(12).cast()) };
        u32::from_le(word.load(Ordering::Acquire))
    }

    /// The id (low half) and flags (high half) of descriptor `offset`, in one load (read after
    /// an acquire load of the chain's first flags).
    #[inline(always)]
    fn read_id_flags(self, offset: u16) -> u32 {
        // SAFETY: the descriptor is inside the ring (ptr), 16-aligned: its id and flags,
        // bytes 12..16, are inside it and 4-aligned.
        u32::from_le(unsafe { ptr::read_volatile(self.ptr(offset).add(12).cast::<u32>()) })
    }

    /// Follows the NEXT flags of the chain whose head, at `head` with NEXT set, was found
    /// available: the chain's buffer id (that of its last descriptor) and its length in
    /// descriptors. `used` is the offset of the oldest descriptor in flight (`next_used`): the
    /// chain may take every descriptor up to it, and if none is in flight (it is `head`
    /// itself), the whole ring. A chain that reaches it, or runs on past
    /// [`MAX_CHAIN_DESCRIPTORS`] descriptors, is refused.
    #[inline]
    fn chain_end(self, head: u16, used: u16) -> Result<(u16, u16), PackedRingError> {
        let mut offset = head;
        let mut descs = 1u32;
        loop {
            offset = self.next(offset);
            if offset == used || descs == MAX_CHAIN_DESCRIPTORS {
                return Err(if descs == MAX_CHAIN_DESCRIPTORS || used == head {
                    PackedRingError::ChainTooLong(descs)
                } else {
                    PackedRingError::Overrun
                });
            }
            descs += 1;
            let id_flags = self.read_id_flags(offset);
            if (id_flags >> 16) as u16 & NEXT == 0 {
                // `descs ≤ min(size, MAX_CHAIN_DESCRIPTORS) ≤ 32768`.
                return Ok((id_flags as u16, descs as u16));
            }
        }
    }

    /// Descriptor `offset`'s buffer address and length alone (read after an acquire load of
    /// its flags).
    #[inline(always)]
    fn read_buffer(self, offset: u16) -> (u64, u32) {
        let p = self.ptr(offset);
        // SAFETY: the descriptor is inside the ring (ptr), 16-aligned: its u64 address at byte
        // 0 and u32 length at byte 8 are inside it and aligned.
        unsafe {
            (
                u64::from_le(ptr::read_volatile(p.cast::<u64>())),
                u32::from_le(ptr::read_volatile(p.add(8).cast::<u32>())),
            )
        }
    }

    /// Descriptor `offset` (read after an acquire load of the chain's first flags).
    #[inline(always)]
    fn read_desc(self, offset: u16) -> RawDesc {
        // SAFETY: the 16 bytes are inside the ring (ptr), 16-aligned.
        unsafe { ptr::read_volatile(self.ptr(offset).cast::<RawDesc>()) }
    }
}

impl RingState {
    /// Ring descriptors popped and not used yet (at most `size`): the used position trails the
    /// avail one by exactly those, since each moves only by the chains popped and used.
    #[inline(always)]
    fn in_flight(&self) -> u32 {
        self.next_used.distance_to(self.next_avail, self.descs.size)
    }

    /// Every descriptor of the ring is in flight: the one at `next_avail` is the device's.
    #[inline(always)]
    fn full(&self) -> bool {
        self.next_used.lap_behind(self.next_avail)
    }

    /// Whether the descriptor at `next_avail` is available to pop (one load, no state change).
    #[inline(always)]
    fn next_available(&self) -> bool {
        !self.full()
            && self
                .next_avail
                .sees_avail(self.descs.load_flags(self.next_avail.offset()))
    }

    /// A u16 of an event suppression area: the device's own (`device`) or the driver's; `word`
    /// [`OFF_WRAP`] or [`FLAGS`].
    #[inline]
    fn event_word(&self, device: bool, word: usize) -> &AtomicU16 {
        let area = if device {
            self.device_event
        } else {
            self.driver_event
        };
        // SAFETY: both areas are 4 bytes inside mapped guest memory, 4-aligned (checked in
        // `new`), and `word` is 0 or 2, so the u16 is inside and 2-aligned; guest memory is
        // plain shared memory, valid for atomic access. The reference borrows `self`, and the
        // memory stays mapped while the owning queue (hence `self`) lives.
        unsafe { AtomicU16::from_ptr(area.add(word & 2).cast()) }
    }
}

/// The ring half of a split [`PackedVirtqueue`] borrow: pops, walks chains, marks them used.
#[derive(Debug)]
pub(crate) struct RingOps<'m> {
    /// A copy of `ring.descs` (fixed for the activation): one load less per use on the
    /// datapath than reading it through `ring`.
    descs: DescRing,
    ring: &'m mut RingState,
}

impl RingOps<'_> {
    /// Pops the next available chain, or `None` when the descriptor at `next_avail` is not
    /// available. Reads the flags of the chain's descriptors (at most
    /// [`MAX_CHAIN_DESCRIPTORS`]) to find its end and its id; the buffers are walked later.
    /// On error nothing moves.
    #[inline(always)]
    pub(crate) fn pop_head(&mut self) -> Result<Option<ChainHead>, PackedRingError> {
        let ring = &*self.ring;
        let (ring_descs, start) = (self.descs, ring.next_avail);
        let size = ring_descs.size;
        if ring.full() {
            return Ok(None);
        }
        let id_flags = ring_descs.load_id_flags(start.offset());
        if !start.sees_avail_word(id_flags) {
            return Ok(None);
        }
        let flags = (id_flags >> 16) as u16;
        // A lone descriptor (every 1-descriptor chain) holds its own id; a chain's end is
        // found from the id-and-flags word of each following descriptor, read once.
        let (id, descs) = if flags & NEXT == 0 {
            (id_flags as u16, 1)
        } else {
            ring_descs.chain_end(start.offset(), ring.next_used.offset())?
        };
        if id >= size {
            return Err(PackedRingError::IdOutOfRange(id));
        }
        self.ring.next_avail = start.advance(descs, size);
        Ok(Some(ChainHead { id, descs, start }))
    }

    /// Pops up to `heads.len()` chains of one direct descriptor each (NEXT and INDIRECT
    /// clear, an id in range) into the front of `heads`, in order, and returns how many. It
    /// stops at the first descriptor that is not available or not such a chain (left to
    /// [`RingOps::pop_head`], which pops it or reports what is wrong) and never pops more than
    /// the ring has room for. The positions move once for the batch: receive buffers are lone
    /// descriptors, and this is their pop without the per-chain checks and state updates.
    #[inline(always)]
    pub(crate) fn pop_lone(&mut self, heads: &mut [ChainHead]) -> usize {
        let ring_descs = self.descs;
        let size = ring_descs.size;
        let mut at = self.ring.next_avail;
        // What is in flight is at most `size`.
        let room = u32::from(size).saturating_sub(self.ring.in_flight()) as usize;
        let n = heads.len().min(room);
        let mut popped = 0;
        while popped < n {
            let id_flags = ring_descs.load_id_flags(at.offset());
            let (id, flags) = (id_flags as u16, (id_flags >> 16) as u16);
            if !at.sees_avail_word(id_flags) || flags & (NEXT | INDIRECT) != 0 || id >= size {
                break;
            }
            heads[popped] = ChainHead {
                id,
                descs: 1,
                start: at,
            };
            at = at.advance(1, size);
            popped += 1;
        }
        self.ring.next_avail = at;
        popped
    }

    /// Puts back `head` and every chain popped after it (they are popped again next time).
    /// `head` must be popped and not used; anything else is ignored.
    #[inline]
    pub(crate) fn unpop(&mut self, head: &ChainHead) {
        let back = head
            .start
            .distance_to(self.ring.next_avail, self.descs.size);
        let in_flight = self.ring.in_flight();
        debug_assert!(back <= in_flight, "unpop of a chain not in flight");
        if back <= in_flight {
            self.ring.next_avail = head.start;
        }
    }

    /// Whether the descriptor `n − 1` slots after `next_avail` is available (one load): at
    /// least `n` descriptors, hence probably `n` chains, wait to be popped. True for `n` 0;
    /// false past what the ring can hold with the chains in flight: such a slot is a chain in
    /// flight from the lap before, whose flags carry the other wrap counter.
    #[inline]
    pub(crate) fn pending_at_least(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        if n > usize::from(self.descs.size) {
            return false;
        }
        // `n − 1 < size`.
        let at = self
            .ring
            .next_avail
            .advance((n - 1) as u16, self.descs.size);
        at.sees_avail(self.descs.load_flags(at.offset()))
    }

    /// Warms the caches for the next chain, if it is available: its first descriptor's buffer
    /// (the descriptor itself was just read by the pop's probe or will be).
    #[inline]
    pub(crate) fn prefetch_ahead(&self, guest: &GuestView<'_>) {
        let (ring_descs, next) = (self.descs, self.ring.next_avail);
        if !next.sees_avail(ring_descs.load_flags(next.offset())) {
            return;
        }
        let (addr, len) = ring_descs.read_buffer(next.offset());
        let len = u64::from(len).min(128);
        if let Some(p) = guest.host_range(addr, len.max(1)) {
            prefetch(p);
            if len > 64 {
                prefetch(p.wrapping_add(64));
            }
        }
    }

    /// Prefetches the ring lines holding the next `n` descriptors from `next_avail` (a batch's
    /// worth), wrapping at the end of the ring.
    #[inline]
    pub(crate) fn prefetch_descriptors(&self, n: u16) {
        let size = self.descs.size;
        let n = n.min(size);
        let mut offset = self.ring.next_avail.offset();
        let mut left = n;
        while left > 0 {
            prefetch(self.descs.ptr(offset));
            // Four descriptors per 64-byte line; step to the next line.
            let step = (4 - offset % 4).min(left);
            left -= step;
            offset = ((u32::from(offset) + u32::from(step)) % u32::from(size)) as u16;
        }
    }

    // As helpers, the short chains' paths cost them 6–12 instructions a frame (callgrind).
    // long: the short chains' paths are written out
    /// Walks `head`'s buffers, appending them to `iovs` (those that follow each other in memory
    /// as one entry), and returns their total length. On error `iovs` is left as it was. Every
    /// descriptor visited is charged to `budget`.
    ///
    /// Chains of one or two direct descriptors (the datapath's) have their own paths, with no
    /// loop; longer ones are walked in one short loop, each descriptor read once; a lone
    /// descriptor pointing to an indirect table continues out of line ([`walk_indirect`]).
    #[inline(always)]
    pub(crate) fn walk_chain<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &ChainHead,
        direction: Direction,
        limit: u32,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        let rule = Directed::new(direction, limit);
        // At least 1: every chain popped, and the placeholder, occupy one descriptor or more.
        debug_assert!(head.descs > 0, "a chain of no descriptors");
        if head.descs == 1 {
            // A lone direct descriptor (a receive buffer, a frame with its header): one buffer,
            // nothing to follow or join: the datapath's chains are lone descriptors (Linux's
            // modern transmit, every receive buffer).
            let buf = self.descs.read_desc(head.start.offset()).buffer();
            if buf.flags & INDIRECT == 0 {
                return rule.push_lone(guest, buf, iovs, budget);
            }
        } else if head.descs == 2 {
            // Two direct descriptors (a header in its own buffer, then the frame: a legacy
            // driver's transmit): the pop knows the chain's length, so no loop (the loop's
            // registers cost such a chain ~50 instructions).
            let first = self.descs.read_desc(head.start.offset()).buffer();
            let second = self
                .descs
                .read_desc(self.descs.next(head.start.offset()))
                .buffer();
            if (first.flags | second.flags) & INDIRECT == 0 {
                budget.charge(2);
                let start = iovs.len();
                let pushed = rule
                    .push(guest, first, 0, iovs)
                    .and_then(|total| rule.push(guest, second, total, iovs));
                match pushed {
                    Ok(_) => iovs.merge_from(start + 1, start),
                    Err(_) => iovs.truncate(start),
                }
                return pushed;
            }
        }
        let ring_descs = self.descs;
        let start = iovs.len();
        let mut visited = 0u32;
        let mut total = 0u32;
        let mut offset = head.start.offset();
        let mut left = head.descs;
        let walked = loop {
            let desc = ring_descs.read_desc(offset);
            visited += 1;
            let buf = desc.buffer();
            if buf.flags & INDIRECT != 0 {
                // Only a lone descriptor may point to a table (virtio 1.1 §2.8.19).
                if head.descs != 1 {
                    break Err(ChainError::BadIndirectTable);
                }
                // A copy of the count, so that `visited` stays out of memory on the ring's path.
                let mut seen = visited;
                let walked = walk_indirect(guest, desc, rule, iovs, &mut seen);
                visited = seen;
                break walked;
            }
            match rule.push(guest, buf, total, iovs) {
                Ok(t) => total = t,
                Err(e) => break Err(e),
            }
            left -= 1;
            if left == 0 {
                // Every chain's path ends here, apart from the indirect one and the errors.
                budget.charge(visited);
                // Buffers that follow each other in memory (a header in its own descriptor
                // just before the frame, say) become one entry: a frame in one segment is one
                // `write`.
                if iovs.len() > start + 1 {
                    iovs.merge_from(start + 1, start);
                }
                return Ok(total);
            }
            offset = ring_descs.next(offset);
        };
        budget.charge(visited);
        match walked {
            Ok(_) if iovs.len() > start + 1 => iovs.merge_from(start + 1, start),
            Ok(_) => {}
            Err(_) => iovs.truncate(start),
        }
        walked
    }

    /// [`RingOps::walk_chain`] for a head [`RingOps::pop_lone`] returned: its one descriptor's
    /// buffer, with no check of the chain's shape (the pop made it). A driver that has since
    /// rewritten the descriptor's flags gets it used as the direct buffer it was when popped;
    /// its address and length are checked as any buffer's.
    #[inline(always)]
    pub(crate) fn walk_lone<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &ChainHead,
        direction: Direction,
        iovs: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<u32, ChainError> {
        debug_assert_eq!(head.descs, 1, "not a lone descriptor");
        let buf = self.descs.read_desc(head.start.offset()).buffer();
        Directed::new(direction, u32::MAX).push_lone(guest, buf, iovs, budget)
    }

    /// Walks a control-style chain: device-readable buffers first (appended to `readable`),
    /// then device-writable ones (appended to `writable`); a readable buffer after a writable
    /// one is refused, as are bad indirect tables, buffers outside guest memory, and parts of
    /// more than `limit` bytes. Returns the (readable, writable) byte counts; on error both
    /// lists are left as they were. Every descriptor visited is charged to `budget`.
    pub(crate) fn walk_chain_split<'g>(
        &self,
        guest: &GuestView<'g>,
        head: &ChainHead,
        limit: u32,
        readable: &mut IovecList<'g>,
        writable: &mut IovecList<'g>,
        budget: &mut WalkBudget,
    ) -> Result<(u32, u32), ChainError> {
        let mut visited = 0u32;
        let mut walk = ControlWalk::new(guest, limit, readable, writable);
        let traversed = self.traverse(guest, head, &mut visited, &mut |desc: &RawDesc| {
            walk.push(desc.buffer())
        });
        budget.charge(visited.max(1));
        walk.finish(traversed)
    }

    /// Visits `head`'s descriptors in order: its ring descriptors, or the entries of the
    /// indirect table its lone descriptor points to.
    #[inline]
    fn traverse<F: FnMut(&RawDesc) -> Result<(), ChainError>>(
        &self,
        guest: &GuestView<'_>,
        head: &ChainHead,
        visited: &mut u32,
        visit: &mut F,
    ) -> Result<(), ChainError> {
        let ring_descs = self.descs;
        let mut offset = head.start.offset();
        for i in 0..head.descs {
            if i > 0 {
                offset = ring_descs.next(offset);
            }
            let desc = ring_descs.read_desc(offset);
            *visited += 1;
            if u16::from_le(desc.flags) & INDIRECT != 0 {
                // Only a lone descriptor may point to a table (virtio 1.1 §2.8.19).
                if head.descs != 1 {
                    return Err(ChainError::BadIndirectTable);
                }
                return traverse_indirect(guest, desc, visited, visit);
            }
            visit(&desc)?;
        }
        Ok(())
    }

    /// Writes the used descriptor for `head` (`len` bytes written into its device-writable
    /// buffers) at `next_used` and moves past the descriptors the chain occupies. The driver
    /// sees it once `publish_used` runs, which also marks what the next interrupt decision
    /// covers.
    #[inline]
    pub(crate) fn add_used(&mut self, head: ChainHead, len: u32) {
        self.write_used(head.id, len, head.descs);
    }

    /// Marks a batch of chains used, in the order they were popped (the first one starting at
    /// `next_used`), the last one with `len`. With IN_ORDER this is one used descriptor
    /// carrying the last chain's id, and the position skips the descriptors of them all;
    /// without it, each chain gets its own (length 0 but the last).
    pub(crate) fn add_used_batch(&mut self, batch: &[ChainHead], len: u32) {
        let Some((last, rest)) = batch.split_last() else {
            return;
        };
        if !self.ring.in_order {
            for head in rest {
                self.add_used(*head, 0);
            }
            self.add_used(*last, len);
            return;
        }
        debug_assert_eq!(batch[0].start, self.ring.next_used, "batch out of order");
        // Chains popped in order lie one after the other: the batch ends where its last one
        // does (no sum over the batch).
        let size = self.descs.size;
        let end = last.start.advance(last.descs, size);
        debug_assert_eq!(
            batch[0].start.distance_to(end, size),
            batch.iter().map(|h| u32::from(h.descs)).sum::<u32>(),
            "batch not contiguous"
        );
        // What is in flight is at most `size` ≤ 32768 descriptors.
        let descs = batch[0]
            .start
            .distance_to(end, size)
            .min(self.ring.in_flight())
            .min(u32::from(size)) as u16;
        if descs > 0 {
            self.write_used(last.id, len, descs);
        }
    }

    /// Writes one used descriptor at `next_used` and advances by `descs`: its length, id and
    /// flags (bytes 8..16) in one 8-byte store with release, so a driver that sees the flags
    /// sees the id and length with them, and the buffers' contents written before. On x86 a
    /// release store is a plain store: no fence per descriptor, and none per batch either.
    ///
    /// `descs` (one at least) are in flight: those of one popped chain, or of a batch counted
    /// against what is in flight (`add_used_batch`), so the used position never overtakes the
    /// avail one.
    #[inline]
    fn write_used(&mut self, id: u16, len: u32, descs: u16) {
        debug_assert!(
            u32::from(descs) <= self.ring.in_flight(),
            "used more than popped"
        );
        // A popped chain occupies one descriptor at least (`ChainHead`'s placeholder too).
        debug_assert!(descs > 0, "a used descriptor for no descriptors");
        let (ring_descs, at) = (self.descs, self.ring.next_used);
        // The spec reserves the length of a used descriptor without WRITE.
        let flags = at.bits() | if len > 0 { WRITE } else { 0 };
        // Bytes 8..16: `len`, `id`, `flags` (little endian).
        let word = u64::from(len) | u64::from(id) << 32 | u64::from(flags) << 48;
        // SAFETY: the descriptor is inside the ring (ptr), 16-aligned: its bytes 8..16 are
        // inside it and 8-aligned; guest memory is plain shared memory, valid for atomic access.
        let used = unsafe { AtomicU64::from_ptr(ring_descs.ptr(at.offset()).add(8).cast()) };
        used.store(word.to_le(), Ordering::Release);
        self.ring.next_used = at.advance(descs, ring_descs.size);
        // Every call that uses chains publishes them before it returns, and a call pops a
        // bounded number: no wrap.
        self.ring.unpublished = self.ring.unpublished.wrapping_add(u32::from(descs));
    }

    /// Closes a burst: makes the used descriptors written since the last publication what the
    /// next interrupt decision covers (the driver may have seen them already: each is whole
    /// once its store is visible).
    #[inline]
    pub(crate) fn publish_used(&mut self) {
        let used = std::mem::take(&mut self.ring.unpublished);
        if used > 0 {
            // Stores since the last fence: the interrupt decision needs one again.
            self.ring.fenced = false;
        }
        self.ring.published = self.ring.next_used;
        self.ring.unsignalled = self.ring.unsignalled.saturating_add(used);
    }

    /// Decides whether the used descriptors published since the last decision warrant an
    /// interrupt, from the driver event suppression area (see the module docs). `None` when
    /// nothing was published.
    pub(crate) fn interrupt_decision(&mut self) -> Option<InterruptDecision> {
        let delta = std::mem::take(&mut self.ring.unsignalled);
        if delta == 0 {
            return None;
        }
        // The used flags must be visible before we read the driver's event area (the driver
        // writes that, then reads the used flags): a store→load barrier, unless one already ran
        // after those stores (`enable_notification`).
        if !std::mem::replace(&mut self.ring.fenced, false) {
            fence(Ordering::SeqCst);
        }
        let flags = self.ring.event_word(false, FLAGS).load(Ordering::Acquire);
        let flags = u16::from_le(flags) & 3;
        Some(match flags {
            EVENT_FLAG_DISABLE => InterruptDecision::SuppressedByFlag,
            EVENT_FLAG_DESC if self.ring.event_idx => {
                let off_wrap = self.ring.event_word(false, OFF_WRAP);
                let off_wrap = u16::from_le(off_wrap.load(Ordering::Relaxed));
                if packed_need_event(
                    off_wrap,
                    self.ring.published.position(),
                    delta,
                    self.descs.size,
                ) {
                    InterruptDecision::Raise
                } else {
                    InterruptDecision::SuppressedByEventIdx
                }
            }
            // ENABLE, DESC without EVENT_IDX, and the reserved value: interrupt.
            _ => InterruptDecision::Raise,
        })
    }

    /// Asks the driver not to notify (DISABLE in the device event area).
    #[inline]
    pub(crate) fn disable_notification(&mut self) {
        if self.ring.kick_flags != Some(EVENT_FLAG_DISABLE) {
            self.store_kick_flags(EVENT_FLAG_DISABLE);
        }
    }

    /// Asks the driver to notify for new buffers (with EVENT_IDX: once it makes `next_avail`
    /// available), then re-checks the next descriptor (the standard race). Returns true if a
    /// buffer arrived meanwhile: keep processing.
    ///
    /// With EVENT_IDX, the driver notifies only once it makes the descriptor `ahead` slots
    /// past `next_avail` available (at most the ring size less one; kick coalescing: the
    /// device must look by itself for fewer). Without EVENT_IDX `ahead` is ignored.
    pub(crate) fn enable_notification(&mut self, ahead: u16) -> bool {
        if self.ring.event_idx {
            let size = self.descs.size;
            let off_wrap = self
                .ring
                .next_avail
                .advance(ahead.min(size - 1), size)
                .position()
                .off_wrap();
            self.ring
                .event_word(true, OFF_WRAP)
                .store(off_wrap.to_le(), Ordering::Relaxed);
            // off_wrap must be visible before the flags that make the driver read it.
            fence(Ordering::SeqCst);
            if self.ring.kick_flags != Some(EVENT_FLAG_DESC) {
                self.store_kick_flags(EVENT_FLAG_DESC);
            }
        } else if self.ring.kick_flags != Some(EVENT_FLAG_ENABLE) {
            self.store_kick_flags(EVENT_FLAG_ENABLE);
        }
        // The enable must be visible before we re-read the ring (store→load); the same fence
        // orders the used descriptors written before it.
        fence(Ordering::SeqCst);
        self.ring.fenced = true;
        self.ring.next_available()
    }

    fn store_kick_flags(&mut self, flags: u16) {
        self.ring
            .event_word(true, FLAGS)
            .store(flags.to_le(), Ordering::Relaxed);
        self.ring.kick_flags = Some(flags);
    }
}

/// The rest of [`RingOps::walk_chain`] for a lone descriptor pointing to the indirect table
/// `table`: its entries appended as ring descriptors are; returns their total length.
// Out of line: keeps the ring-descriptor walk (every chain's path) short in the cache.
#[inline(never)]
fn walk_indirect<'g>(
    guest: &GuestView<'g>,
    table: RawDesc,
    rule: Directed,
    iovs: &mut IovecList<'g>,
    visited: &mut u32,
) -> Result<u32, ChainError> {
    let mut total = 0;
    traverse_indirect(guest, table, visited, &mut |desc: &RawDesc| {
        total = rule.push(guest, desc.buffer(), total, iovs)?;
        Ok(())
    })?;
    Ok(total)
}

/// Visits the entries of the indirect table `table` points to, in order: its length a whole,
/// non-zero number of descriptors, inside one region, at most what the chain may still visit;
/// no nested INDIRECT.
#[inline(never)]
fn traverse_indirect<F: FnMut(&RawDesc) -> Result<(), ChainError>>(
    guest: &GuestView<'_>,
    table: RawDesc,
    visited: &mut u32,
    visit: &mut F,
) -> Result<(), ChainError> {
    let table_len = u32::from_le(table.len);
    let count = table_len / DESC_SIZE as u32;
    if !table_len.is_multiple_of(DESC_SIZE as u32) || count == 0 {
        return Err(ChainError::BadIndirectTable);
    }
    if count > MAX_CHAIN_DESCRIPTORS.saturating_sub(*visited) {
        return Err(ChainError::TooManyDescriptors);
    }
    let base = guest
        .host_range(u64::from_le(table.addr), u64::from(table_len))
        .ok_or(ChainError::BadIndirectTable)?;
    for index in 0..count as usize {
        // SAFETY: `index < count`, so the 16 bytes are inside the table, which lies inside one
        // mapped region (host_range above).
        let desc =
            unsafe { read_unaligned_volatile::<RawDesc>(base.add(index * DESC_SIZE as usize)) };
        *visited += 1;
        if u16::from_le(desc.flags) & INDIRECT != 0 {
            return Err(ChainError::BadIndirectTable);
        }
        visit(&desc)?;
    }
    Ok(())
}

/// Whether used descriptors written over the `delta` descriptors before `new` (the used
/// position after them) reached the driver's `off_wrap`: the wrap bit compared with `new`'s
/// counter as QEMU does (a mismatch puts the offset one ring earlier), then the spec's
/// `vring_need_event` with the old position tracked across the wrap (`new − delta`, which may
/// lie in the previous lap). A range of exactly a ring covers each offset once, with a known
/// counter, so it is decided as any other; one of more than a ring (descriptors the driver
/// recycled before a publication) always raises.
pub fn packed_need_event(off_wrap: u16, new: Position, delta: u32, size: u16) -> bool {
    if delta > u32::from(size) {
        return true;
    }
    let off = off_wrap & !EVENT_WRAP_BIT;
    let event = if (off_wrap & EVENT_WRAP_BIT != 0) == new.wrap {
        off
    } else {
        off.wrapping_sub(size)
    };
    // `delta ≤ size ≤ 32768`: `new − old` is `delta` on the u16 circle.
    let old = new.offset.wrapping_sub(delta as u16);
    vring_need_event(event, new.offset, old)
}

#[cfg(test)]
mod tests;
