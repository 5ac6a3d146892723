//! The entry of every `capture*` function: a naked trampoline (its instructions come from
//! [`super::arch`]) that saves the caller's registers exactly as they are at the call, and the
//! function it calls.
#![allow(unsafe_code)]

use super::arch::{self, ENTRY_REGS};
use super::outcome::{Outcome, Start};
use super::regs::RegSet;
use super::types::{UnwindMode, Walk};
use super::walk;

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
    let words = unsafe { &*words };
    let mode = UnwindMode::from_raw(mode);
    if mode == UnwindMode::FramePointer {
        // SAFETY: `out` is what the public entry points passed: null or their live `Walk`.
        if let Some(frames) = unsafe { capture_fp(words, buf, out) } {
            return frames;
        }
    }
    let mut o = Outcome::default();
    super::refresh::finish(&Start::Return(RegSet::from_entry(words)), buf, mode, &mut o);
    // SAFETY: `out` is what the public entry points passed: null or their live `Walk`.
    unsafe { write_walk(out, &o) };
    o.frames
}

/// Frame-pointer mode's common case ([`walk::capture_fp`]), which needs three of the saved
/// words and nothing else: the number of frames, `out` written; `None` when the general walk
/// must do it (run by the caller, so that this frame is not below it on a handler's small
/// alternate stack).
///
/// # Safety
/// `out` is null or points to a live [`Walk`].
#[inline(never)]
unsafe fn capture_fp(
    words: &[usize; ENTRY_REGS.len()],
    buf: &mut [usize],
    out: *mut Walk,
) -> Option<usize> {
    const SP: usize = entry_word(arch::SP);
    const FP: usize = entry_word(arch::FP);
    const PC: usize = entry_word(arch::PC);
    let o = walk::capture_fp(words[SP], words[FP], words[PC], buf)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_walk(out, &o) };
    Some(o.frames)
}

/// Writes how the walk ended into `out` unless it is null.
///
/// # Safety
/// `out` is null or points to a live [`Walk`].
unsafe fn write_walk(out: *mut Walk, o: &Outcome) {
    if !out.is_null() {
        // SAFETY: the caller guarantees that a non-null `out` points to a live `Walk`.
        unsafe { *out = o.walk() };
    }
}

/// Which word of [`ENTRY_REGS`] holds register slot `r` (a compile-time error if none does).
const fn entry_word(r: u16) -> usize {
    let mut i = 0;
    while i < ENTRY_REGS.len() {
        if ENTRY_REGS[i] == r {
            return i;
        }
        i += 1;
    }
    panic!("the capture entry does not save this register")
}
