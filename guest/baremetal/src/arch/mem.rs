//! `memcpy` for this program, in place of the target's (see [`vnet_baremetal::mem`], which
//! has the copy and its tests): short copies in 8-byte words instead of three `rep movs`.

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
