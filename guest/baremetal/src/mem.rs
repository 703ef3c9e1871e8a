//! The copy and the fill behind the guest program's `memcpy` and `memset` (its `arch/mem.rs`),
//! in place of the target's.
//! `x86_64-unknown-none` is built without SSE, and its `memcpy` (compiler-builtins) is three
//! `rep movs` instructions whatever the length: an alignment head, the 8-byte body and the
//! tail, each with a start-up cost of tens of cycles. The datapath's copies are short (a
//! 64-byte frame into its transmit buffer, a test frame's pattern), so those start-ups were
//! most of each copy: with this one the driver guest sends ~1.9 × the frames into a sink
//! (`docs/benchmarks.md`). It copies up to 128 bytes with unaligned 8-byte loads and stores
//! (no loop the compiler could turn back into a `memcpy` call), and a longer buffer with one
//! `rep movsq` and an 8-byte tail. Kernel mode runs it too: it uses general-purpose registers
//! and `rep movsq` only, which the emulated kernel mode executes.

use core::arch::asm;

/// The 8 bytes at `p + at`.
///
/// # Safety
/// `p + at .. p + at + 8` is readable.
#[inline(always)]
unsafe fn load(p: *const u8, at: usize) -> u64 {
    // SAFETY: the caller's contract; `read_unaligned` needs no alignment.
    unsafe { p.add(at).cast::<u64>().read_unaligned() }
}

/// Writes `v` at `p + at`.
///
/// # Safety
/// `p + at .. p + at + 8` is writable.
#[inline(always)]
unsafe fn store(p: *mut u8, at: usize, v: u64) {
    // SAFETY: the caller's contract; `write_unaligned` needs no alignment.
    unsafe { p.add(at).cast::<u64>().write_unaligned(v) }
}

/// Copies the 32 bytes at offset `at`.
///
/// # Safety
/// `src + at .. + 32` is readable, `dest + at .. + 32` writable, and they do not overlap.
#[inline(always)]
unsafe fn copy32(dest: *mut u8, src: *const u8, at: usize) {
    // SAFETY: the caller's contract covers the four 8-byte words.
    unsafe {
        let (a, b, c, d) = (
            load(src, at),
            load(src, at + 8),
            load(src, at + 16),
            load(src, at + 24),
        );
        store(dest, at, a);
        store(dest, at + 8, b);
        store(dest, at + 16, c);
        store(dest, at + 24, d);
    }
}

/// Copies `n` bytes from `src` to `dest` (which must not overlap). Short lengths copy a head
/// and a tail that may overlap each other inside `dest`, which writes some bytes twice with
/// the same value.
///
/// # Safety
/// C's `memcpy` contract: `src .. src + n` readable, `dest .. dest + n` writable, no overlap.
#[inline(always)]
pub unsafe fn copy(dest: *mut u8, src: *const u8, n: usize) {
    // SAFETY: every access below lies inside `src .. src + n` or `dest .. dest + n` (the
    // caller's contract): each arm's offsets and widths end at or before `n`.
    unsafe {
        match n {
            0 => {}
            1..=3 => {
                let (a, b, c) = (*src, *src.add(n / 2), *src.add(n - 1));
                *dest = a;
                *dest.add(n / 2) = b;
                *dest.add(n - 1) = c;
            }
            4..=7 => {
                let a = src.cast::<u32>().read_unaligned();
                let b = src.add(n - 4).cast::<u32>().read_unaligned();
                dest.cast::<u32>().write_unaligned(a);
                dest.add(n - 4).cast::<u32>().write_unaligned(b);
            }
            8..=16 => {
                let (a, b) = (load(src, 0), load(src, n - 8));
                store(dest, 0, a);
                store(dest, n - 8, b);
            }
            17..=32 => {
                let (a, b) = (load(src, 0), load(src, 8));
                let (c, d) = (load(src, n - 16), load(src, n - 8));
                store(dest, 0, a);
                store(dest, 8, b);
                store(dest, n - 16, c);
                store(dest, n - 8, d);
            }
            33..=64 => {
                copy32(dest, src, 0);
                copy32(dest, src, n - 32);
            }
            65..=128 => {
                copy32(dest, src, 0);
                copy32(dest, src, 32);
                copy32(dest, src, n - 64);
                copy32(dest, src, n - 32);
            }
            _ => {
                // The direction flag is clear at every call (the ABI's rule, which the
                // interrupt entries keep).
                asm!(
                    "rep movsq",
                    inout("rcx") n / 8 => _,
                    inout("rdi") dest => _,
                    inout("rsi") src => _,
                    options(nostack, preserves_flags)
                );
                let tail = load(src, n - 8);
                store(dest, n - 8, tail);
            }
        }
    }
}

/// Writes `v` at offset `at` and at the same distance from the end, `n - 8 - at`.
///
/// # Safety
/// `dest .. dest + n` is writable and `at + 8 <= n`.
#[inline(always)]
unsafe fn fill_both_ends(dest: *mut u8, n: usize, at: usize, v: u64) {
    // SAFETY: both words lie inside `dest .. dest + n` (the caller's contract).
    unsafe {
        store(dest, at, v);
        store(dest, n - 8 - at, v);
    }
}

/// Sets `n` bytes at `dest` to `byte`, as [`copy`] copies: up to 128 bytes in 8-byte words
/// (a head and a tail that may overlap), longer with one `rep stosq` and an 8-byte tail. (The
/// forwarding path zeroes each bounced frame's 12-byte header through `memset`.)
///
/// # Safety
/// C's `memset` contract: `dest .. dest + n` writable.
#[inline(always)]
pub unsafe fn fill(dest: *mut u8, byte: u8, n: usize) {
    let v = u64::from(byte) * 0x0101_0101_0101_0101;
    // SAFETY: every store below lies inside `dest .. dest + n` (the caller's contract).
    unsafe {
        match n {
            0 => {}
            1..=3 => {
                *dest = byte;
                *dest.add(n / 2) = byte;
                *dest.add(n - 1) = byte;
            }
            4..=7 => {
                dest.cast::<u32>().write_unaligned(v as u32);
                dest.add(n - 4).cast::<u32>().write_unaligned(v as u32);
            }
            8..=128 => {
                // Words from both ends until they meet: 2, 4, 8 or 16 of them.
                fill_both_ends(dest, n, 0, v);
                if n > 16 {
                    fill_both_ends(dest, n, 8, v);
                }
                if n > 32 {
                    fill_both_ends(dest, n, 16, v);
                    fill_both_ends(dest, n, 24, v);
                }
                if n > 64 {
                    fill_both_ends(dest, n, 32, v);
                    fill_both_ends(dest, n, 40, v);
                    fill_both_ends(dest, n, 48, v);
                    fill_both_ends(dest, n, 56, v);
                }
            }
            _ => {
                // The direction flag is clear at every call (as for `copy`).
                asm!(
                    "rep stosq",
                    inout("rcx") n / 8 => _,
                    inout("rdi") dest => _,
                    in("rax") v,
                    options(nostack, preserves_flags)
                );
                store(dest, n - 8, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{copy, fill};
    use alloc::vec;
    use alloc::vec::Vec;

    /// Every length from 0 to 300 at every source and destination alignment mod 8 copies
    /// exactly its bytes: nothing before or after the destination range changes.
    #[test]
    fn copies_every_length_and_alignment_exactly() {
        const GUARD: usize = 16;
        for n in 0..=300usize {
            for src_at in 0..8 {
                for dest_at in 0..8 {
                    let src: Vec<u8> = (0..n + 8).map(|i| (i * 7 + n) as u8 | 1).collect();
                    let mut dest = vec![0u8; GUARD + 8 + n + GUARD];
                    let at = GUARD + dest_at;
                    // SAFETY: `src[src_at..]` holds at least `n` bytes, `dest[at..]` at least
                    // `n + GUARD`; two distinct vectors do not overlap.
                    unsafe { copy(dest.as_mut_ptr().add(at), src.as_ptr().add(src_at), n) };
                    assert_eq!(&dest[at..at + n], &src[src_at..src_at + n], "n {n}");
                    assert!(dest[..at].iter().all(|&b| b == 0), "before, n {n}");
                    assert!(dest[at + n..].iter().all(|&b| b == 0), "after, n {n}");
                }
            }
        }
    }

    /// Every length from 0 to 300 at every alignment mod 8 sets exactly its bytes.
    #[test]
    fn fills_every_length_and_alignment_exactly() {
        const GUARD: usize = 16;
        for n in 0..=300usize {
            for dest_at in 0..8 {
                let mut dest = vec![0u8; GUARD + 8 + n + GUARD];
                let at = GUARD + dest_at;
                // SAFETY: `dest[at..]` holds at least `n + GUARD` bytes.
                unsafe { fill(dest.as_mut_ptr().add(at), 0xa5, n) };
                assert!(dest[at..at + n].iter().all(|&b| b == 0xa5), "n {n}");
                assert!(dest[..at].iter().all(|&b| b == 0), "before, n {n}");
                assert!(dest[at + n..].iter().all(|&b| b == 0), "after, n {n}");
            }
        }
    }

    /// Long copies (the `rep movsq` path), their lengths not all multiples of 8.
    #[test]
    fn copies_long_buffers() {
        for n in [129, 1514, 4096, 4097, 65_543] {
            let src: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let mut dest = vec![0u8; n + 1];
            // SAFETY: both hold at least `n` bytes and are distinct.
            unsafe { copy(dest.as_mut_ptr(), src.as_ptr(), n) };
            assert_eq!(&dest[..n], &src[..], "n {n}");
            assert_eq!(dest[n], 0, "n {n}");
        }
    }
}
