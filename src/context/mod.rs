//! A thread's registers as the minidump format's `CONTEXT_*` record, one file per
//! architecture: the interrupted `ucontext_t` (or the calling function's own registers) turned
//! into the record the machine's minidump consumers read, and the little-endian field writers
//! the records are built with.
//!
//! The aarch64 codec and its `__reserved` record walker are plain data code, compiled and
//! type-checked on every host (only reading the current machine's real `ucontext_t` and the
//! inline assembly keep their `cfg`); the walker is the one the crash report's oops block uses
//! too (`aarch64::find_record`).

// Compiled on every host: what does not read this machine's own structures is data.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code, unused_imports))]
pub(crate) mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod other;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) use other::*;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;

/// Writes `v` little-endian at `b[off..off + 2]`.
pub(crate) fn le16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` little-endian at `b[off..off + 4]`.
pub(crate) fn le32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` little-endian at `b[off..off + 8]`.
pub(crate) fn le64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// The little-endian `u64` at `b[off..off + 8]`, `None` past the end.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn rd64(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}
