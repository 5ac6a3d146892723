//! Architectures without a register decoder: the report says so (the signal, its code and the
//! fault address come from `siginfo_t` and are printed on every architecture).
#![allow(unsafe_code)]

use crate::report::Out;

/// Says that the registers are not decoded here (`_innermost`: as the other ports take it).
///
/// # Safety
/// None beyond the other ports' (`uc` is not read).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn registers(out: Out, _uc: *const libc::ucontext_t, _innermost: &[u8]) {
    out.line(|w| {
        w.push_bytes(b"registers: not decoded on this architecture");
    });
}
