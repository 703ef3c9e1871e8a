//! `memcpy` and `memset` for this program, in place of the target's (see
//! [`vnet_baremetal::mem`], which has them and their tests): short ones in 8-byte words
//! instead of three `rep movs` / `rep stos`.

/// C's `memcpy`: copies `n` bytes from `src` to `dest` and returns `dest`.
///
/// # Safety
/// C's contract: `src .. src + n` readable, `dest .. dest + n` writable, no overlap.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract is `copy`'s.
    unsafe { vnet_baremetal::mem::copy(dest, src, n) };
    dest
}

/// C's `memset`: sets `n` bytes at `dest` to the low byte of `c` and returns `dest`.
///
/// # Safety
/// C's contract: `dest .. dest + n` writable.
#[no_mangle]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract is `fill`'s.
    unsafe { vnet_baremetal::mem::fill(dest, c as u8, n) };
    dest
}
