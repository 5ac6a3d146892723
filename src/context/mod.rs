//! A thread's registers from the `ucontext_t` a signal handler gets, one file per architecture:
//! the layout of the kernel's `ucontext_t` (the one table of where each register lies, which
//! the unwinder's `UC_OFFSETS` and the crash report's register block read), the minidump
//! format's `CONTEXT_*` record built from it (or from the calling function's own registers),
//! the little-endian field writers the records are built with, and the crash context ([`Fault`]).
//!
//! Both architectures' layouts, codecs and aarch64's `__reserved` record walker are plain data
//! code, compiled and type-checked on every host (only the checks against this machine's real
//! `libc::ucontext_t` and the inline assembly keep their `cfg`); the walker is the one the
//! crash report's oops block uses too (`aarch64::find_record`).

#![allow(unsafe_code)]

// Compiled on every host: what does not read this machine's own structures is data.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code, unused_imports))]
pub(crate) mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod other;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) use other::*;
// Compiled on every host, as aarch64.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]
pub(crate) mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;

/// The 64-bit word at byte `off` of the `ucontext_t` at `uc` (a layout table's offset).
///
/// # Safety
/// `uc` points to a readable `ucontext_t` of the architecture whose layout gave `off`, and
/// `off + 8` lies inside it.
///
/// # Async-signal safety
/// Async-signal-safe.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) unsafe fn read_word(uc: *const libc::ucontext_t, off: usize) -> u64 {
    // SAFETY: the caller vouches that the word lies inside a readable ucontext_t.
    unsafe { core::ptr::read_unaligned(uc.cast::<u8>().add(off).cast::<u64>()) }
}

/// A crash, as the fatal signal's handler got it: the one description the handler, the oops
/// report and the minidump writer share (crash-handling's `CrashContext`).
#[derive(Clone, Copy)]
pub(crate) struct Fault {
    /// The signal.
    pub(crate) sig: i32,
    /// The kernel's `siginfo_t` for it (null when not known).
    pub(crate) info: *const libc::siginfo_t,
    /// The interrupted context (null when not known).
    pub(crate) uc: *const libc::ucontext_t,
    /// The crashing thread.
    pub(crate) tid: i32,
}

impl Fault {
    /// `si_code` and `si_addr` (0, 0 without a `siginfo_t`). Async-signal-safe.
    pub(crate) fn code_addr(&self) -> (i32, usize) {
        // SAFETY: `info` is the kernel's siginfo for this signal, or null (the type's contract,
        // upheld by the handler that builds it).
        match unsafe { self.info.as_ref() } {
            // SAFETY: si_addr is meaningful for the fault signals, harmless to read otherwise.
            Some(i) => (i.si_code, unsafe { i.si_addr() } as usize),
            None => (0, 0),
        }
    }
}

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
