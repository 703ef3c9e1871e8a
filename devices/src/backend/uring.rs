//! Batched tap I/O through io_uring: several frames' `writev`s (transmit) or `readv`s
//! (receive) in one system call.
//!
//! On this project's host a tap `writev` of a 64-byte frame costs ~1.1 µs of CPU, of which
//! ~0.3 µs is the system call's entry and exit; 32 `IORING_OP_WRITEV`s submitted with one
//! `io_uring_enter` cost ~0.77 µs each (`docs/benchmarks.md`); reads gain alike. A [`BatchRing`]
//! does exactly that for one tap queue:
//!
//! * **Synchronous.** Every call submits its frames and waits for all their completions before
//!   it returns, so the iovecs and guest buffers the requests point to are only borrowed for the
//!   call, as with `writev`/`readv`. A tap read or write never sleeps (`RWF_NOWAIT`, below), so
//!   the wait is the submission itself.
//! * **Unlinked.** The requests are independent (linking them made the kernel punt them to its
//!   worker threads: 3x slower here). Results come back per frame; the caller decides what a
//!   failure in the middle of a batch means (see `tx.rs`).
//! * **Never waits.** Each request carries `RWF_NOWAIT`: a tap (or pipe) that supports
//!   non-blocking I/O would otherwise have io_uring park the request until the file is
//!   writable (readable), and the call would block. With it, a full (empty) backend completes
//!   the request with `-EAGAIN` at once: a batch of reads ends with the reads that found the
//!   tap empty, which is the "is there more?" probe a reader needs anyway, at a fraction of a
//!   system call each. A file without that support refuses the flag (`-EOPNOTSUPP`): the tap
//!   then drops its ring and does that batch, and every later one, with `writev`/`readv`.
//! * **Confined to its file.** The ring is created with `IORING_SETUP_R_DISABLED`; the file is
//!   registered as its only fixed file, and `IORING_REGISTER_RESTRICTIONS` then allows two
//!   operations, `IORING_OP_WRITEV` and, for a frame in one segment, `IORING_OP_WRITE` (and
//!   `IORING_OP_READV` for [`BatchRing::with_reads`]), each *required* to name a fixed file,
//!   and one registration, the unregistering of that file. io_uring operations are not seen by
//!   seccomp; with this the ring can do nothing but what the worker's filter already allows
//!   (`writev`, `write`, `readv`), on that one file, and that filter adds only
//!   `io_uring_enter`. A fixed file also spares each request taking and dropping a reference
//!   on the file (`fget`/`fput`, ~7 % of a 64-byte frame's cost on a tap with XDP_DROP:
//!   `docs/benchmarks.md`). The ring's reference on the file is dropped with the ring, at
//!   once: dropping a [`BatchRing`] unregisters the file before it closes the ring (a closing
//!   ring releases its files asynchronously, which would keep a tap attached, and a tap the
//!   VMM created in existence, for a moment after the device closed it).
//! * **Transmit only, for now.** [`BatchRing::read`] exists and is measured (`bare io_uring N x
//!   readv` in the datapath bench: at most ~137 ns per 64-byte frame saved at 31 frames per
//!   submission, ~35 at 7, a loss below that), but the device still reads one frame per
//!   `readv`: each read of a batch needs its own window of buffers big enough for any frame
//!   (9 KiB with MRG_RXBUF, 64 KiB once the guest takes GSO frames, as Linux does), so small
//!   frames would leave most of every window unused and out of order, and with GSO a 256-entry
//!   ring holds only ~6 windows, too few for a batch to pay. See `docs/benchmarks.md`.
//! * **Optional.** Where io_uring is missing or disabled (`kernel.io_uring_disabled`, a
//!   container's seccomp profile, an old kernel), [`BatchRing::new`] fails and the tap keeps one
//!   system call per frame.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, register::Restriction, squeue, types, IoUring};
use log::warn;

/// `IORING_UNREGISTER_FILES` (include/uapi/linux/io_uring.h): the one registration a
/// [`BatchRing`] allows itself (and the only `io_uring_register` the net worker's seccomp
/// filter lets through).
pub const IORING_UNREGISTER_FILES: u8 = 3;
/// The file's index among the ring's fixed files (its only one).
const FILE: u32 = 0;

/// Most frames one [`BatchRing::write`] or [`BatchRing::read`] call submits.
pub const MAX_TX_BATCH: usize = 32;

/// Most frames one [`BatchRing::read`] call submits (the same ring).
pub const MAX_RX_BATCH: usize = MAX_TX_BATCH;

/// Fewest frames worth a ring submission: below it one `writev` per frame is cheaper. Measured
/// here per 64-byte frame against 1 096 ns for `writev`: 1 641 ns alone, 1 170 ns for 2 per
/// call, 1 048 for 3, 981 for 4, 868 for 8, ~770 for 32.
pub const MIN_RING_BATCH: usize = 4;

/// Submission queue entries: one batch (the completion queue gets twice as many).
const RING_ENTRIES: u32 = MAX_TX_BATCH as u32;

/// An io_uring that can only `writev` to and `readv` from one file (see the module
/// documentation).
pub struct BatchRing {
    ring: IoUring,
    /// A call failed with entries left in the submission queue: they point to memory that
    /// was only borrowed for that call, so the ring is never entered again.
    broken: bool,
}

/// What a batch does.
#[derive(Clone, Copy)]
enum Op {
    Write,
    Read,
}

impl std::fmt::Debug for BatchRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchRing").finish_non_exhaustive()
    }
}

impl Drop for BatchRing {
    fn drop(&mut self) {
        // Drop the ring's reference on the file now, not when the kernel gets round to
        // releasing the closed ring. Nothing is in flight: every call waits for its requests.
        if let Err(e) = self.ring.submitter().unregister_files() {
            warn!("io_uring: unregistering the tap's file failed ({e}); it closes with the ring");
        }
    }
}

impl BatchRing {
    /// A ring that can only write to `fd` (what a tap's transmit uses). The ring takes its own
    /// reference on the file (its fixed file), which it drops when it is dropped.
    pub fn new(fd: RawFd) -> io::Result<BatchRing> {
        Self::build(fd, false)
    }

    /// A ring that can write to and read from `fd` ([`BatchRing::read`]).
    pub fn with_reads(fd: RawFd) -> io::Result<BatchRing> {
        Self::build(fd, true)
    }

    fn build(fd: RawFd, reads: bool) -> io::Result<BatchRing> {
        let ring = IoUring::builder()
            .setup_r_disabled()
            .setup_cqsize(2 * RING_ENTRIES)
            .setup_submit_all()
            .build(RING_ENTRIES)?;
        let submitter = ring.submitter();
        submitter.register_files(&[fd])?;
        let fixed = squeue::Flags::FIXED_FILE.bits();
        let mut allowed = vec![
            Restriction::sqe_op(opcode::Writev::CODE),
            Restriction::sqe_op(opcode::Write::CODE),
            Restriction::sqe_flags_allowed(fixed),
            Restriction::sqe_flags_required(fixed),
            Restriction::register_op(IORING_UNREGISTER_FILES),
        ];
        if reads {
            allowed.push(Restriction::sqe_op(opcode::Readv::CODE));
        }
        submitter.register_restrictions(&mut allowed)?;
        submitter.register_enable_rings()?;
        Ok(BatchRing {
            ring,
            broken: false,
        })
    }

    /// Writes each frame of `frames` to the file with one `IORING_OP_WRITEV` per frame
    /// (`IORING_OP_WRITE` for a frame in one segment), all submitted with one system call, and
    /// stores frame `i`'s result (bytes written, or the error) in `results[i]`. Frame `i` is
    /// the iovecs `iovs[ends[i-1]..ends[i]]` (`ends` is increasing, at most [`MAX_TX_BATCH`]
    /// long, and its last value is at most `iovs.len()`).
    /// The frames are issued in order, but a failure does not stop the ones after it.
    ///
    /// An error means the ring itself failed: no frame of this call was written, and every
    /// later call fails at once (drop the ring and write frames another way).
    ///
    /// # Safety
    ///
    /// Every iovec in `iovs` must point to memory valid for reads of its length for the whole
    /// call.
    pub unsafe fn write(
        &mut self,
        iovs: &[libc::iovec],
        ends: &[usize],
        results: &mut [io::Result<usize>],
    ) -> io::Result<()> {
        // SAFETY: the caller's contract (writes only read the buffers).
        unsafe { self.submit(Op::Write, iovs, ends, results) }
    }

    /// Reads frame `i` into the iovecs `iovs[ends[i-1]..ends[i]]` with one `IORING_OP_READV`
    /// per frame, all submitted with one system call; `results[i]` gets its length or error
    /// (`WouldBlock` once the file is empty). The reads are issued in order, each after the
    /// one before it completed, but a failure does not stop the ones after it: a frame that
    /// arrives between two reads goes to the later one. Limits and errors as [`Self::write`];
    /// on a ring built by [`BatchRing::new`] every read fails with `EACCES`.
    ///
    /// # Safety
    ///
    /// Every iovec in `iovs` must point to memory valid for writes of its length for the whole
    /// call, which nothing else reads or writes meanwhile.
    pub unsafe fn read(
        &mut self,
        iovs: &[libc::iovec],
        ends: &[usize],
        results: &mut [io::Result<usize>],
    ) -> io::Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.submit(Op::Read, iovs, ends, results) }
    }

    /// # Safety
    ///
    /// As [`Self::read`] for [`Op::Read`], [`Self::write`] for [`Op::Write`].
    unsafe fn submit(
        &mut self,
        op: Op,
        iovs: &[libc::iovec],
        ends: &[usize],
        results: &mut [io::Result<usize>],
    ) -> io::Result<()> {
        assert!(ends.len() <= MAX_TX_BATCH && results.len() >= ends.len());
        if self.broken {
            return Err(io::Error::other("the io_uring failed earlier"));
        }
        // Set until every entry pushed below has been submitted.
        self.broken = true;
        let mut start = 0;
        {
            let mut sq = self.ring.submission();
            for (i, &end) in ends.iter().enumerate() {
                let frame = &iovs[start..end];
                start = end;
                let count = u32::try_from(frame.len()).unwrap_or(u32::MAX);
                let fd = types::Fixed(FILE);
                let entry = match (op, frame) {
                    // One segment: IORING_OP_WRITE, which spares importing an iovec array.
                    (Op::Write, [one]) => {
                        let len = u32::try_from(one.iov_len).unwrap_or(u32::MAX);
                        opcode::Write::new(fd, one.iov_base.cast::<u8>().cast_const(), len)
                            .rw_flags(libc::RWF_NOWAIT)
                            .build()
                    }
                    (Op::Write, _) => opcode::Writev::new(fd, frame.as_ptr(), count)
                        .rw_flags(libc::RWF_NOWAIT)
                        .build(),
                    (Op::Read, _) => opcode::Readv::new(fd, frame.as_ptr(), count)
                        .rw_flags(libc::RWF_NOWAIT)
                        .build(),
                }
                .user_data(i as u64);
                // SAFETY: the entry points to `frame` (an iovec array borrowed for the whole
                // call) and, through it, to buffers the caller guarantees valid for the whole
                // call; this function waits for every completion below before it returns, so
                // nothing the kernel touches outlives the borrows. The queue has room: it holds
                // RING_ENTRIES = MAX_TX_BATCH entries and is empty between calls.
                if unsafe { sq.push(&entry) }.is_err() {
                    return Err(io::Error::other("io_uring submission queue full"));
                }
            }
        }
        let want = ends.len();
        // With IORING_SETUP_SUBMIT_ALL one enter either consumes every entry or fails before
        // consuming any (an entry that fails gets its own completion).
        if let Err(e) = self.ring.submit_and_wait(want) {
            if !self.ring.submission().is_empty() {
                // Nothing was submitted. The entries point into borrows that end with this
                // call, so they must never be submitted: `broken` stays set.
                return Err(e);
            }
        }
        self.broken = false;
        let mut done = 0;
        loop {
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                if let Some(slot) = results.get_mut(i) {
                    *slot = usize::try_from(cqe.result())
                        .map_err(|_| io::Error::from_raw_os_error(-cqe.result()));
                    done += 1;
                }
            }
            if done >= want {
                return Ok(());
            }
            // Submitted: the kernel may still use the iovecs, so this call cannot return
            // before their completions. A tap read or write completes inline, so this is reached only
            // after an interrupted wait; any error is retried (a waiting enter has no other
            // failure that the arguments here can cause).
            let _ = self.ring.submitter().submit_and_wait(want - done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use io_uring::squeue;

    fn pipe() -> (RawFd, RawFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) };
        assert_eq!(ret, 0);
        (fds[0], fds[1])
    }

    fn iov(b: &[u8]) -> libc::iovec {
        libc::iovec {
            iov_base: b.as_ptr() as *mut _,
            iov_len: b.len(),
        }
    }

    fn iov_mut(b: &mut [u8]) -> libc::iovec {
        libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        }
    }

    /// Frame 0 is two segments (`IORING_OP_WRITEV`), frame 1 one (`IORING_OP_WRITE`).
    #[test]
    fn writes_each_frame_in_order_with_one_result_each() {
        let (r, w) = pipe();
        let Ok(mut ring) = BatchRing::new(w) else {
            panic!("io_uring is available on this project's hosts");
        };
        let a = [1u8, 2, 3];
        let b = [4u8];
        let c = [5u8, 6];
        let iovs = [iov(&a), iov(&b), iov(&c)];
        let mut results: Vec<io::Result<usize>> = (0..3).map(|_| Ok(0)).collect();
        // SAFETY: the buffers live for the call.
        unsafe { ring.write(&iovs, &[2, 3], &mut results) }.unwrap();
        assert_eq!(results[0].as_ref().unwrap(), &4);
        assert_eq!(results[1].as_ref().unwrap(), &2);
        let mut out = [0u8; 16];
        // SAFETY: `out` is valid for writes of its length.
        let n = unsafe { libc::read(r, out.as_mut_ptr().cast(), out.len()) };
        assert_eq!(&out[..n as usize], &[1, 2, 3, 4, 5, 6]);
        // SAFETY: both fds are ours.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn a_full_pipe_gives_eagain_per_frame_without_blocking() {
        let (r, w) = pipe();
        let mut ring = BatchRing::new(w).unwrap();
        let big = vec![7u8; 1 << 16];
        let iovs = [iov(&big), iov(&big), iov(&big)];
        let mut results: Vec<io::Result<usize>> = (0..3).map(|_| Ok(0)).collect();
        // SAFETY: the buffers live for the call.
        unsafe { ring.write(&iovs, &[1, 2, 3], &mut results) }.unwrap();
        // A pipe holds 64 KiB: the first write fills it, the others would block.
        assert_eq!(results[0].as_ref().unwrap(), &(1 << 16));
        for r in &results[1..] {
            assert_eq!(r.as_ref().unwrap_err().kind(), io::ErrorKind::WouldBlock);
        }
        // SAFETY: both fds are ours.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn reads_in_order_and_an_empty_file_gives_eagain_per_read() {
        let (r, w) = pipe();
        let mut ring = BatchRing::with_reads(r).unwrap();
        let data = [1u8, 2, 3, 4, 5];
        // SAFETY: `data` is valid for reads of its length.
        assert_eq!(unsafe { libc::write(w, data.as_ptr().cast(), 5) }, 5);
        let (mut a, mut b, mut c) = ([0u8; 3], [0u8; 3], [0u8; 3]);
        let iovs = [iov_mut(&mut a), iov_mut(&mut b), iov_mut(&mut c)];
        let mut results: Vec<io::Result<usize>> = (0..3).map(|_| Ok(0)).collect();
        // SAFETY: the buffers live, unused otherwise, for the call.
        unsafe { ring.read(&iovs, &[1, 2, 3], &mut results) }.unwrap();
        assert_eq!(results[0].as_ref().unwrap(), &3);
        assert_eq!(results[1].as_ref().unwrap(), &2);
        assert_eq!(
            results[2].as_ref().unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!((a, &b[..2], c), ([1, 2, 3], &[4u8, 5][..], [0; 3]));
        // SAFETY: both fds are ours.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn the_ring_refuses_every_other_operation() {
        let (r, w) = pipe();
        let mut ring = BatchRing::new(w).unwrap();
        let mut buf = [0u8; 8];
        let read = opcode::Read::new(types::Fd(r), buf.as_mut_ptr(), 8).build();
        let nop = opcode::Nop::new().build();
        // Write is allowed (a frame in one segment), but not with flags.
        let linked_write = opcode::Write::new(types::Fd(w), buf.as_ptr(), 8)
            .build()
            .flags(squeue::Flags::IO_LINK);
        let iov = [iov(&buf)];
        let linked_writev = opcode::Writev::new(types::Fd(w), iov.as_ptr(), 1)
            .build()
            .flags(squeue::Flags::IO_LINK);
        // A transmit ring does not read either.
        let mut out = [0u8; 8];
        let out_iov = [libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: out.len(),
        }];
        let readv = opcode::Readv::new(types::Fd(r), out_iov.as_ptr(), 1).build();
        // Only its fixed file: a write to a plain descriptor, even the same file's, is refused.
        let plain_write = opcode::Write::new(types::Fd(w), buf.as_ptr(), 8).build();
        let plain_writev = opcode::Writev::new(types::Fd(w), iov.as_ptr(), 1).build();
        let other_fixed = opcode::Write::new(types::Fixed(1), buf.as_ptr(), 8).build();
        for entry in [
            read,
            nop,
            linked_write,
            linked_writev,
            readv,
            plain_write,
            plain_writev,
        ] {
            // SAFETY: `buf` outlives the wait below.
            unsafe { ring.ring.submission().push(&entry) }.unwrap();
            ring.ring.submit_and_wait(1).unwrap();
            let cqe = ring.ring.completion().next().unwrap();
            assert_eq!(cqe.result(), -libc::EACCES, "{entry:?}");
        }
        // A fixed file it does not have: there is only one.
        // SAFETY: `buf` outlives the wait below.
        unsafe { ring.ring.submission().push(&other_fixed) }.unwrap();
        ring.ring.submit_and_wait(1).unwrap();
        let cqe = ring.ring.completion().next().unwrap();
        assert_eq!(cqe.result(), -libc::EBADF);
        // And no registration but the unregistering of its file.
        assert!(ring.ring.submitter().register_files(&[r]).is_err());
        assert!(ring
            .ring
            .submitter()
            .register_files_update(0, &[r])
            .is_err());
        // SAFETY: both fds are ours.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    /// The ring holds its own reference on the file while it lives and drops it with itself,
    /// at once: the pipe's reader sees end-of-file right after the writer and the ring are gone.
    #[test]
    fn the_ring_keeps_its_file_until_it_is_dropped_then_lets_go_at_once() {
        let (r, w) = pipe();
        let mut ring = BatchRing::new(w).unwrap();
        // SAFETY: `w` is ours; the ring has its own reference.
        unsafe { libc::close(w) };
        let data = [9u8; 4];
        let mut results: Vec<io::Result<usize>> = vec![Ok(0)];
        // SAFETY: `data` lives for the call.
        unsafe { ring.write(&[iov(&data)], &[1], &mut results) }.unwrap();
        assert_eq!(
            results[0].as_ref().unwrap(),
            &4,
            "written through the fixed file"
        );
        drop(ring);
        let mut out = [0u8; 8];
        // SAFETY: `out` is valid for writes of its length.
        let n = unsafe { libc::read(r, out.as_mut_ptr().cast(), out.len()) };
        assert_eq!(n, 4);
        // SAFETY: as above. The last writer is gone: end of file, not EAGAIN.
        let n = unsafe { libc::read(r, out.as_mut_ptr().cast(), out.len()) };
        assert_eq!(n, 0, "{}", io::Error::last_os_error());
        // SAFETY: `r` is ours.
        unsafe { libc::close(r) };
    }
}
