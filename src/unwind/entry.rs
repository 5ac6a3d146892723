//! The entry of every `capture*` function: a naked trampoline (its instructions come from
//! [`super::arch`]) that saves the caller's registers exactly as they are at the call, and the
//! function it calls.
#![allow(unsafe_code)]

use super::arch::{self, ENTRY_REGS};
use super::outcome::Start;
use super::regs::RegSet;
use super::types::{UnwindMode, Walk};

/// Saves the caller's return address, stack pointer and callee-saved registers
/// ([`arch::ENTRY_REGS`]) on its own stack, then calls [`capture_inner`]`(buf, len, mode,
/// &words, out)` and returns what it returns. Being naked, it sees the registers exactly as
/// they are at the call, with or without frame pointers.
#[unsafe(naked)]
pub(crate) extern "C" fn capture_entry(
    buf: *mut usize,
    len: usize,
    mode: usize,
    out: *mut Walk,
) -> usize {
    core::arch::naked_asm!(arch::entry_asm!(), inner = sym capture_inner)
}

/// Target of the naked capture entry: `(buf, len, mode, out)` from the caller, plus the
/// caller's registers as they were at the call. Writes how the walk ended into `out` when it
/// is not null; returns the number of frames.
///
/// # Safety
/// Called only by [`capture_entry`]: `buf` and `len` are a live `&mut [usize]` split into
/// pointer and length (or null and 0), `words` points to the words the entry saved, `out` is
/// null or points to a live [`Walk`].
unsafe extern "C" fn capture_inner(
    buf: *mut usize,
    len: usize,
    mode: usize,
    words: *const [usize; ENTRY_REGS.len()],
    out: *mut Walk,
) -> usize {
    let buf = if buf.is_null() || len == 0 {
        &mut [][..]
    } else {
        // SAFETY: the public wrappers pass a valid &mut [usize] split into pointer and length.
        unsafe { core::slice::from_raw_parts_mut(buf, len) }
    };
    // SAFETY: the naked entry passes a pointer to the words it saved on its stack.
    let regs = RegSet::from_entry(unsafe { &*words });
    let o = super::refresh::finish(&Start::Return(regs), buf, UnwindMode::from_raw(mode));
    if !out.is_null() {
        // SAFETY: the status entry points pass a pointer to their own live `Walk`.
        unsafe {
            *out = Walk {
                frames: o.frames,
                end: o.end,
            }
        };
    }
    o.frames
}
