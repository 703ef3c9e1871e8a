//! Scatter-gather lists handed to `readv`/`writev`/`sendmsg`/`recvmsg` without copying.
//!
//! An [`IovecList`] is the only way to build the raw `iovec`s a [`crate::backend::NetBackend`]
//! passes to the kernel: every entry is either a bounds-checked range of guest memory or a
//! borrowed host buffer, and the list borrows its memory for its whole lifetime `'a`. That is
//! the invariant the backends' `unsafe` syscalls rely on.

#![warn(missing_docs)]

use std::marker::PhantomData;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// The most entries an [`IovecList`] holds: Linux `UIO_MAXIOV` (1024) minus one, which a
/// backend may append (the tap's truncation guard byte).
pub const MAX_IOVECS: usize = 1023;

/// Why a range could not be appended to an [`IovecList`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IovecError {
    /// The range is not entirely backed by guest memory (or wraps around the address space).
    #[error("guest range [{addr:#x}, +{len:#x}) is outside guest memory")]
    OutOfGuestMemory {
        /// Guest physical start of the range.
        addr: u64,
        /// Length of the range in bytes.
        len: u32,
    },
    /// The list would exceed [`MAX_IOVECS`] entries.
    #[error("more than {MAX_IOVECS} scatter-gather segments")]
    TooManySegments,
}

/// An owned, growable list of iovecs, each valid for reads and writes during `'a`.
///
/// Not `Send`: it holds raw pointers and is meant to live on one thread for one batch.
#[derive(Debug, Default)]
pub struct IovecList<'a> {
    iovecs: Vec<libc::iovec>,
    bytes: usize,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> IovecList<'a> {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty list with room for `n` entries.
    pub fn with_capacity(n: usize) -> Self {
        IovecList {
            iovecs: Vec::with_capacity(n),
            bytes: 0,
            _borrow: PhantomData,
        }
    }

    /// Appends the guest range `[addr, addr + len)`, split where it crosses memory regions.
    ///
    /// On error nothing is appended. A zero-length range appends nothing.
    pub fn push_guest_range(
        &mut self,
        mem: &'a GuestMemoryMmap,
        addr: GuestAddress,
        len: u32,
    ) -> Result<(), IovecError> {
        let before = self.iovecs.len();
        let out_of_memory = IovecError::OutOfGuestMemory { addr: addr.0, len };
        for slice in GuestMemoryBackend::get_slices(mem, addr, len as usize) {
            let Ok(slice) = slice else {
                self.truncate(before);
                return Err(out_of_memory);
            };
            if self.iovecs.len() == MAX_IOVECS {
                self.truncate(before);
                return Err(IovecError::TooManySegments);
            }
            // `GuestMemoryMmap<()>` has no Xen mapping, so the guard is a plain pointer that
            // stays valid as long as `mem` (borrowed for `'a`) keeps its regions mapped.
            self.iovecs.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: slice.len(),
            });
            self.bytes += slice.len();
        }
        Ok(())
    }

    /// An empty list that reuses `storage`'s allocation (see [`into_storage`](Self::into_storage)):
    /// the datapath keeps one per queue, so building a frame's list allocates nothing.
    pub fn reuse(mut storage: Vec<libc::iovec>) -> Self {
        storage.clear();
        IovecList {
            iovecs: storage,
            bytes: 0,
            _borrow: PhantomData,
        }
    }

    /// A list over entries kept from an earlier [`into_storage`](Self::into_storage) that
    /// covered `bytes` bytes.
    ///
    /// # Safety
    /// Every entry must point to memory valid for reads and writes for all of `'a`.
    pub(crate) unsafe fn from_parts(storage: Vec<libc::iovec>, bytes: usize) -> Self {
        IovecList {
            iovecs: storage,
            bytes,
            _borrow: PhantomData,
        }
    }

    /// Gives the allocation back, for [`reuse`](Self::reuse).
    pub fn into_storage(self) -> Vec<libc::iovec> {
        self.iovecs
    }

    /// Appends `len` bytes at `host` (one entry; nothing for `len == 0`).
    ///
    /// # Safety
    /// `host..host + len` must be valid for reads and writes for all of `'a` (guest memory that
    /// a borrow of `'a` keeps mapped).
    #[inline]
    pub(crate) unsafe fn push_raw(&mut self, host: *mut u8, len: usize) -> Result<(), IovecError> {
        if len == 0 {
            return Ok(());
        }
        if self.iovecs.len() == MAX_IOVECS {
            return Err(IovecError::TooManySegments);
        }
        self.iovecs.push(libc::iovec {
            iov_base: host.cast(),
            iov_len: len,
        });
        self.bytes += len;
        Ok(())
    }

    /// Appends a host buffer, borrowed mutably for `'a`.
    pub fn push_slice(&mut self, buf: &'a mut [u8]) -> Result<(), IovecError> {
        if self.iovecs.len() == MAX_IOVECS {
            return Err(IovecError::TooManySegments);
        }
        if !buf.is_empty() {
            self.bytes += buf.len();
            self.iovecs.push(libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            });
        }
        Ok(())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.iovecs.len()
    }

    /// True when the list has no entries.
    pub fn is_empty(&self) -> bool {
        self.iovecs.is_empty()
    }

    /// Total bytes covered by all entries.
    pub fn total_bytes(&self) -> usize {
        self.bytes
    }

    /// Removes every entry (keeps the allocation).
    pub fn clear(&mut self) {
        self.iovecs.clear();
        self.bytes = 0;
    }

    /// Keeps the first `n` entries.
    pub fn truncate(&mut self, n: usize) {
        for iov in self.iovecs.iter().skip(n) {
            self.bytes -= iov.iov_len;
        }
        self.iovecs.truncate(n);
    }

    /// Merges each entry from `from` on into the entry before it where it starts at that one's
    /// end (host addresses), never into an entry before `floor`: fewer entries for the kernel
    /// to import (a guest's rx buffers are usually carved one after the other).
    ///
    /// One entry to merge (a two-buffer chain, a receive buffer joining the pool: the
    /// datapath's cases) is a compare inline; more go through an out-of-line loop.
    #[inline]
    pub(crate) fn merge_from(&mut self, from: usize, floor: usize) {
        let start = from.max(floor + 1);
        let len = self.iovecs.len();
        if start >= len {
            return;
        }
        if start + 1 == len {
            let next = self.iovecs[start];
            let last = &mut self.iovecs[start - 1];
            if last.iov_base.cast::<u8>().wrapping_add(last.iov_len) == next.iov_base.cast() {
                last.iov_len += next.iov_len;
                self.iovecs.truncate(start);
            }
            return;
        }
        self.merge_entries(start);
    }

    /// [`merge_from`](Self::merge_from)'s loop, from entry `start` (≥ 1) on.
    #[inline(never)]
    fn merge_entries(&mut self, start: usize) {
        let mut kept = start;
        for i in start..self.iovecs.len() {
            let next = self.iovecs[i];
            let last = &mut self.iovecs[kept - 1];
            if last.iov_base.cast::<u8>().wrapping_add(last.iov_len) == next.iov_base.cast() {
                last.iov_len += next.iov_len;
            } else {
                self.iovecs[kept] = next;
                kept += 1;
            }
        }
        self.iovecs.truncate(kept);
    }

    /// Consumes `bytes` from the front of the entries from `*first` on: `*first` moves past
    /// each whole entry consumed (it stays in the list until [`Self::remove_prefix`]), and a
    /// partly consumed one keeps only its rest.
    pub(crate) fn consume_front(&mut self, first: &mut usize, mut bytes: usize) {
        while bytes > 0 && *first < self.iovecs.len() {
            let entry = &mut self.iovecs[*first];
            if entry.iov_len <= bytes {
                bytes -= entry.iov_len;
                *first += 1;
            } else {
                // The rest of an entry is a sub-range of it: valid as long as it was.
                entry.iov_base = entry.iov_base.cast::<u8>().wrapping_add(bytes).cast();
                entry.iov_len -= bytes;
                self.bytes -= bytes;
                bytes = 0;
            }
        }
    }

    /// Removes the first `n` entries (or all of them if there are fewer).
    pub fn remove_prefix(&mut self, n: usize) {
        let n = n.min(self.iovecs.len());
        for iov in &self.iovecs[..n] {
            self.bytes -= iov.iov_len;
        }
        self.iovecs.drain(..n);
    }

    /// Entries `start..end` whose lengths the caller already knows to add up to `bytes`
    /// (checked in debug builds): [`IovecList::range`] without the sum.
    #[inline]
    pub(crate) fn range_of(&self, start: usize, end: usize, bytes: usize) -> Iovecs<'_> {
        let raw = &self.iovecs[start..end];
        debug_assert_eq!(raw.iter().map(|iov| iov.iov_len).sum::<usize>(), bytes);
        Iovecs { raw, bytes }
    }

    /// Writes `bytes` at `offset` of entry `index`, as one store, when they lie inside that
    /// entry; false (nothing written) otherwise. The one-entry case of [`Iovecs::write_at`],
    /// kept apart for the rx hot path (`num_buffers` in a frame's first buffer).
    #[inline]
    pub(crate) fn write_in_entry<const N: usize>(
        &self,
        index: usize,
        offset: usize,
        bytes: [u8; N],
    ) -> bool {
        let Some(iov) = self.iovecs.get(index) else {
            return false;
        };
        if offset.checked_add(N).is_none_or(|end| end > iov.iov_len) {
            return false;
        }
        // SAFETY: `offset + N ≤ iov_len`, and the entry points to memory valid for writes
        // during `'a` (IovecList invariant); `[u8; N]` has alignment 1. Guest memory may be
        // accessed concurrently by the guest, hence the volatile write.
        unsafe {
            std::ptr::write_volatile(
                iov.iov_base.cast::<u8>().add(offset).cast::<[u8; N]>(),
                bytes,
            )
        };
        true
    }

    /// Prefetches the first and last cache line of each entry from `from` on: all of a small
    /// frame, for bytes the kernel reads a while later (a batch's frames, copied once the
    /// batch is submitted, which the driver's CPU wrote).
    #[inline]
    pub(crate) fn prefetch_from(&self, from: usize) {
        for iov in self.iovecs.get(from..).unwrap_or_default() {
            let p = iov.iov_base.cast::<u8>().cast_const();
            prefetch(p);
            prefetch(p.wrapping_add(iov.iov_len.saturating_sub(1)));
        }
    }

    /// A view of all entries.
    pub fn as_iovecs(&self) -> Iovecs<'_> {
        Iovecs {
            raw: &self.iovecs,
            bytes: self.bytes,
        }
    }

    /// A view of entries `start..end` (clamped to the list).
    pub fn range(&self, start: usize, end: usize) -> Iovecs<'_> {
        let end = end.min(self.iovecs.len());
        let start = start.min(end);
        let raw = &self.iovecs[start..end];
        Iovecs {
            raw,
            bytes: raw.iter().map(|iov| iov.iov_len).sum(),
        }
    }
}

/// A borrowed view of (part of) an [`IovecList`]: what the backends pass to the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Iovecs<'a> {
    raw: &'a [libc::iovec],
    bytes: usize,
}

impl<'a> Iovecs<'a> {
    /// The raw entries. Every one points to memory valid for reads and writes while `'a` lasts.
    pub fn as_raw(&self) -> &'a [libc::iovec] {
        self.raw
    }

    /// Total bytes covered.
    pub fn total_bytes(&self) -> usize {
        self.bytes
    }

    /// True when the view covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Reads `buf.len()` bytes at logical byte `offset` of the view (volatile, may straddle
    /// entries).
    ///
    /// Returns false, reading nothing, if the view is too short.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> bool {
        if offset
            .checked_add(buf.len())
            .is_none_or(|end| end > self.bytes)
        {
            return false;
        }
        let mut skip = offset;
        let mut dst = &mut buf[..];
        for iov in self.raw {
            if dst.is_empty() {
                break;
            }
            if skip >= iov.iov_len {
                skip -= iov.iov_len;
                continue;
            }
            let n = (iov.iov_len - skip).min(dst.len());
            for (i, b) in dst[..n].iter_mut().enumerate() {
                // SAFETY: `skip + i < iov_len`, and the entry points to memory valid for reads
                // during `'a` (IovecList invariant). Guest memory may be written concurrently
                // by the guest, hence the volatile read.
                *b = unsafe { std::ptr::read_volatile(iov.iov_base.cast::<u8>().add(skip + i)) };
            }
            dst = &mut dst[n..];
            skip = 0;
        }
        true
    }

    /// Writes `bytes` at logical byte `offset` of the view (volatile, may straddle entries).
    ///
    /// Returns false, writing nothing, if the view is too short.
    pub fn write_at(&self, offset: usize, bytes: &[u8]) -> bool {
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > self.bytes)
        {
            return false;
        }
        let mut skip = offset;
        let mut src = bytes;
        for iov in self.raw {
            if src.is_empty() {
                break;
            }
            if skip >= iov.iov_len {
                skip -= iov.iov_len;
                continue;
            }
            let n = (iov.iov_len - skip).min(src.len());
            for (i, b) in src[..n].iter().enumerate() {
                // SAFETY: `skip + i < iov_len`, and the entry points to memory valid for writes
                // during `'a` (IovecList invariant). Guest memory may be accessed concurrently
                // by the guest, hence the volatile write.
                unsafe {
                    std::ptr::write_volatile(iov.iov_base.cast::<u8>().add(skip + i), *b);
                }
            }
            src = &src[n..];
            skip = 0;
        }
        true
    }
}

/// A cache prefetch hint; never faults, whatever the address.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it neither faults nor changes memory, for any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1000)])
            .expect("guest memory")
    }

    /// A list over `spans` (offset, length) of `buf`.
    fn list_over<'a>(buf: &'a mut [u8], spans: &[(usize, usize)]) -> IovecList<'a> {
        let mut list = IovecList::new();
        let base = buf.as_mut_ptr();
        for &(off, len) in spans {
            assert!(off + len <= buf.len());
            // SAFETY: `off + len ≤ buf.len()` (asserted), and `buf` is borrowed mutably for
            // the list's lifetime.
            unsafe { list.push_raw(base.add(off), len) }.expect("room for the entry");
        }
        list
    }

    /// The (offset into `buf`, length) of each entry.
    fn spans_of(list: &IovecList<'_>, buf: *const u8) -> Vec<(usize, usize)> {
        list.iovecs
            .iter()
            .map(|iov| (iov.iov_base as usize - buf as usize, iov.iov_len))
            .collect()
    }

    #[test]
    fn merge_joins_only_adjacent_entries_after_the_floor() {
        let mut buf = [0u8; 256];
        let base = buf.as_ptr();
        // One entry to merge: adjacent, then not.
        let mut list = list_over(&mut buf, &[(0, 10), (10, 20)]);
        list.merge_from(1, 0);
        assert_eq!(spans_of(&list, base), [(0, 30)]);
        assert_eq!(list.total_bytes(), 30);
        let mut buf = [0u8; 256];
        let base = buf.as_ptr();
        let mut list = list_over(&mut buf, &[(0, 10), (11, 20)]);
        list.merge_from(1, 0);
        assert_eq!(spans_of(&list, base), [(0, 10), (11, 20)]);
        // Never into an entry before the floor.
        let mut buf = [0u8; 256];
        let base = buf.as_ptr();
        let mut list = list_over(&mut buf, &[(0, 10), (10, 20)]);
        list.merge_from(1, 1);
        assert_eq!(spans_of(&list, base), [(0, 10), (10, 20)]);
        // Several: runs join, a gap starts a new entry, the floor holds.
        let mut buf = [0u8; 256];
        let base = buf.as_ptr();
        let spans = [(0, 8), (8, 8), (16, 8), (24, 8), (40, 8), (48, 8), (100, 1)];
        let mut list = list_over(&mut buf, &spans);
        list.merge_from(2, 1);
        assert_eq!(spans_of(&list, base), [(0, 8), (8, 24), (40, 16), (100, 1)]);
        assert_eq!(list.total_bytes(), 49);
        // Nothing from past the end.
        list.merge_from(4, 0);
        assert_eq!(list.len(), 4);
    }

    #[test]
    fn guest_range_splits_at_region_boundary() {
        let mem = mem();
        let mut list = IovecList::new();
        list.push_guest_range(&mem, GuestAddress(0xff0), 0x20)
            .expect("range in memory");
        assert_eq!(list.len(), 2);
        assert_eq!(list.total_bytes(), 0x20);
    }

    #[test]
    fn out_of_memory_range_appends_nothing() {
        let mem = mem();
        let mut list = IovecList::new();
        list.push_guest_range(&mem, GuestAddress(0x10), 0x10)
            .expect("range in memory");
        let err = list.push_guest_range(&mem, GuestAddress(0x1ff0), 0x20);
        assert_eq!(
            err,
            Err(IovecError::OutOfGuestMemory {
                addr: 0x1ff0,
                len: 0x20
            })
        );
        let err = list.push_guest_range(&mem, GuestAddress(u64::MAX - 4), 0x20);
        assert!(err.is_err());
        assert_eq!(list.len(), 1);
        assert_eq!(list.total_bytes(), 0x10);
    }

    #[test]
    fn write_at_straddles_entries() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 3];
        {
            let mut list = IovecList::new();
            list.push_slice(&mut a).expect("room");
            list.push_slice(&mut b).expect("room");
            let view = list.as_iovecs();
            assert!(view.write_at(2, &[1, 2]));
            assert!(!view.write_at(5, &[1, 2]));
        }
        assert_eq!(a, [0, 0, 1]);
        assert_eq!(b, [2, 0, 0]);
    }

    #[test]
    fn segment_limit_is_enforced() {
        let mut bufs = vec![[0u8; 1]; MAX_IOVECS + 1];
        let mut list = IovecList::new();
        let mut iter = bufs.iter_mut();
        for buf in iter.by_ref().take(MAX_IOVECS) {
            list.push_slice(buf).expect("room");
        }
        let last = iter.next().expect("one more buffer");
        assert_eq!(list.push_slice(last), Err(IovecError::TooManySegments));
    }

    #[test]
    fn prefix_removal_keeps_byte_count() {
        let mem = mem();
        let mut list = IovecList::new();
        for i in 0..4u64 {
            list.push_guest_range(&mem, GuestAddress(i * 0x100), 0x10)
                .expect("range in memory");
        }
        list.remove_prefix(3);
        assert_eq!(list.len(), 1);
        assert_eq!(list.total_bytes(), 0x10);
        assert_eq!(list.range(0, 10).total_bytes(), 0x10);
    }
}
