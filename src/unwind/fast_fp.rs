//! The hot loop of frame-pointer mode: the chain of frame records on the walking thread's own
//! stack, one comparison per return address against the code of the current object.
//!
//! `fp_chain` is over 150 lines for the reason `frames_loop` is (see `fast.rs`): the hot loop
//! whose machine code the unwind benches pin stays whole.
#![allow(unsafe_code)]

use super::arch;
use super::fast::{readable_word, Fast};
use super::objects::{LoadedCheck, State};
use super::regs::RegSet;
use super::step::is_trampoline_at;
use super::types::StopReason;
use crate::sys;

/// The size of a word, and of each half of a frame record.
const W: usize = core::mem::size_of::<usize>();

/// The registers frame-pointer mode walks with: the frame's stack pointer, frame pointer and pc.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FpRegs {
    /// The stack pointer.
    pub(crate) sp: usize,
    /// The frame pointer.
    pub(crate) fp: usize,
    /// The pc.
    pub(crate) pc: usize,
}

/// [`fp_chain`] on a register set: needs the frame pointer known; when it walked a frame,
/// only sp, fp and pc are known after it.
#[inline]
pub(crate) fn fast_fp_frames(
    state: &State,
    loaded: &mut LoadedCheck,
    stack: core::ops::Range<usize>,
    regs: &mut RegSet,
    buf: &mut [usize],
    n: &mut usize,
    limit: usize,
) -> Fast {
    const SP: usize = arch::SP as usize;
    const FP: usize = arch::FP as usize;
    const PC: usize = arch::PC as usize;
    if regs.valid & (1 << FP) == 0 {
        return Fast::Slow;
    }
    let mut r = FpRegs {
        sp: regs.v[SP],
        fp: regs.v[FP],
        pc: regs.v[PC],
    };
    let before = *n;
    let end = fp_chain(state, loaded, stack, &mut r, buf, n, limit);
    if *n != before {
        regs.keep_only(1 << SP | 1 << FP | 1 << PC);
        regs.v[SP] = r.sp;
        regs.v[FP] = r.fp;
        regs.v[PC] = r.pc;
    }
    end
}

/// The hot loop of frame-pointer mode: follows the chain while every frame record lies on
/// this thread's own stack and every return address lies in code of an object this walk may
/// trust; anything else (a signal trampoline, another stack, a strange address) goes back to the
/// general step. `regs` are the frame's; when frames were written, they are the last one's.
#[inline(never)]
pub(crate) fn fp_chain(
    state: &State,
    loaded: &mut LoadedCheck,
    stack: core::ops::Range<usize>,
    regs: &mut FpRegs,
    buf: &mut [usize],
    n: &mut usize,
    limit: usize,
) -> Fast {
    let Some(span) = stack
        .end
        .checked_sub(stack.start)
        .and_then(|l| l.checked_sub(2 * W))
    else {
        return Fast::Slow;
    };
    let (restorer_lo, restorer_hi) = state.restorer_span;
    let (mut sp, mut fp, mut pc) = (regs.sp, regs.fp, regs.pc);
    // A return address into a signal trampoline needs the general step.
    if restorer_lo <= pc && pc <= restorer_hi {
        return Fast::Slow;
    }
    // The code range return addresses are checked against in one comparison: the previous
    // frame's object, without the signal trampolines (so no frame in it needs a check).
    let (mut text_start, mut text_len) = state.objects.get(loaded.last).map_or((0, 0), |o| {
        o.fp_text(state.restorer_span, pc.wrapping_sub(1))
    });
    // The object before: at first the one where the outermost frames are.
    let (mut prev_start, mut prev_len) = state.fp_outer[0];
    let buf = &mut buf[..limit];
    let mut frames = *n;
    // One test for "on the stack and aligned": with `stack.start` aligned, `(fp - start)`
    // rotated right by 3 is at most `span / 8` exactly when fp is aligned and in
    // [start, start + span] (a misaligned fp rotates its low bits to the top). A zero fp
    // wraps and fails it too: the exit below tells the cases apart.
    if !stack.start.is_multiple_of(W) {
        return Fast::Slow;
    }
    let base = stack.start;
    let max_rotated = span / W;
    // The highest address of a frame record, divided by 8 (`base + span` cannot wrap).
    let top_rotated = (base + span) / W;
    /// Why the inner loop stopped.
    enum Exit {
        /// fp is off the stack, misaligned or below sp (or zero).
        Bounds,
        /// The return address `ra` (with caller frame pointer `next`) is outside the current
        /// object's text.
        Other(usize, usize),
        /// The buffer is full; the frame of `ra` (caller fp `next`) was not stored.
        Full(usize, usize),
        /// The caller's frame record is not known to be on the stack below the loop's bound:
        /// the check before the loop decides.
        Again,
    }
    let end = loop {
        let exit = if !readable_word(fp, base, max_rotated) || fp < sp {
            Exit::Bounds
        } else {
            let room = buf.len().saturating_sub(frames);
            if room == 0 {
                // SAFETY: fp was checked just above: aligned, at or above the walk's stack
                // pointer and at most 16 bytes below the stack's high end.
                let (next, ra) = unsafe { read_record(fp) };
                // A zero return address wraps to the top and fails the range test too.
                if ra.wrapping_sub(1).wrapping_sub(text_start) >= text_len {
                    Exit::Other(next, ra)
                } else {
                    Exit::Full(next, ra)
                }
            } else {
                // The hot loop: nothing but the checks, two loads and a store, so that its
                // state (fp and the output position) stays in registers; the rarer cases are
                // handled outside it, then it resumes. It never counts the room left: each
                // record lies at least 16 bytes above the one before, so a loop that takes
                // no fp above `fp + 16 * room - 8` stores at most `room` return addresses (it
                // stops at that bound, and the check above starts it again where the stack
                // goes on).
                let last = fp
                    .saturating_add(room.saturating_mul(2 * W))
                    .saturating_sub(W);
                let top = top_rotated.min(last / W);
                // SAFETY: fp was checked just above (aligned, at or above the walk's stack
                // pointer, at most 16 bytes below the stack's high end); `top` * 8 is at most
                // that last record's address (`top_rotated`) and at most `last`, so fp_run
                // stores at most (last - fp) / 16 + 1 = room addresses, and `buf[frames..]`
                // has room words.
                let (last_fp, end) = unsafe {
                    fp_run(fp, buf[frames..].as_mut_ptr(), text_start, text_len, top)
                };
                frames = ((end & !OTHER) - buf.as_ptr() as usize) / W;
                // The record it stopped at (read again: two registers come back).
                // SAFETY: the record fp_run stopped at is one it read (see its safety).
                let (next, ra) = unsafe { read_record(last_fp) };
                if end & OTHER != 0 {
                    fp = last_fp;
                    Exit::Other(next, ra)
                } else {
                    sp = last_fp + 2 * W;
                    fp = next;
                    Exit::Again
                }
            }
        };
        // The pc is the last return address stored (kept out of the loop: one register less).
        if frames != *n {
            pc = buf[frames - 1];
        }
        let (next, ra) = match exit {
            Exit::Bounds => {
                break if fp == 0 {
                    Fast::End
                } else if !fp.is_multiple_of(W) || fp < sp {
                    Fast::Stop(StopReason::NoFramePointer)
                } else {
                    // Another stack (an alternate signal stack, say): the general step reads it.
                    Fast::Slow
                };
            }
            Exit::Full(next, ra) => {
                sp = fp + 2 * W;
                fp = next;
                pc = ra;
                break Fast::Full;
            }
            Exit::Other(next, ra) => (next, ra),
            Exit::Again => continue,
        };
        if ra == 0 {
            break Fast::End;
        }
        let mut then_slow = false;
        // The object before (a chain often goes back and forth: the program, libc, `_start`).
        let other = if ra.wrapping_sub(1).wrapping_sub(prev_start) < prev_len {
            Other::Code(prev_start, prev_len)
        } else {
            fp_other_object(state, loaded, ra)
        };
        match other {
            Other::Code(start, len) => {
                (prev_start, prev_len) = (text_start, text_len);
                (text_start, text_len) = (start, len);
            }
            Other::Trampoline => then_slow = true,
            Other::Stop => break Fast::Stop(StopReason::NoFramePointer),
            Other::Slow => break Fast::Slow,
        }
        sp = fp + 2 * W;
        fp = next;
        pc = ra;
        let Some(slot) = buf.get_mut(frames) else {
            break Fast::Full;
        };
        *slot = ra;
        frames += 1;
        if then_slow {
            break Fast::Slow;
        }
    };
    if frames != *n {
        *regs = FpRegs { sp, fp, pc };
    }
    *n = frames;
    end
}

/// What [`fp_other_object`] found at a return address outside the current code range.
enum Other {
    /// Code of a trusted object: its range.
    Code(usize, usize),
    /// A signal trampoline.
    Trampoline,
    /// No code there: the chain is broken.
    Stop,
    /// Needs the general step (an object not yet checked in this walk).
    Slow,
}

/// The cold part of [`fast_fp_frames`]: a return address outside the current code range.
#[cold]
#[inline(never)]
fn fp_other_object(state: &State, loaded: &mut LoadedCheck, ra: usize) -> Other {
    let (lo, hi) = state.restorer_span;
    if lo <= ra && ra <= hi {
        return Other::Trampoline;
    }
    // The C library's code (permanent), where a stack's outermost frames are.
    for &(start, len) in &state.fp_outer {
        if ra.wrapping_sub(1).wrapping_sub(start) < len {
            return Other::Code(start, len);
        }
    }
    match state.find_for(ra - 1, loaded) {
        Some(i) if state.objects[i].permanent || loaded.verified(i) => {
            let o = &state.objects[i];
            if !o.is_code(ra - 1, 1) {
                return Other::Stop;
            }
            loaded.enter(i);
            // (0, 0) outside the first executable segment: fine, checked again next time.
            let (start, len) = o.fp_text((lo, hi), ra - 1);
            Other::Code(start, len)
        }
        Some(_) => Other::Slow,
        None => match sys::dl_find_object(ra) {
            // Outside every object: a trampoline there is qemu-user's (or a JIT's).
            Ok(None) if is_trampoline_at(ra) => Other::Trampoline,
            Ok(None) => Other::Stop,
            _ => Other::Slow,
        },
    }
}

/// The frame record at `fp`: the caller's frame pointer and the return address (its
/// pointer-authentication bits stripped).
///
/// # Safety
/// `fp` and `fp + 8` are readable: `fp` aligned, on this thread's own live stack, at or above
/// the walk's stack pointer and at least 16 bytes below the stack's high end.
#[inline(always)]
unsafe fn read_record(fp: usize) -> (usize, usize) {
    // SAFETY: the caller guarantees that both words are readable (see above).
    unsafe {
        (
            core::ptr::read_volatile(fp as *const usize),
            arch::strip_ra(core::ptr::read_volatile((fp + W) as *const usize)),
        )
    }
}

/// The bit of [`fp_run`]'s second result that says it stopped at a return address outside the
/// code range (the rest is an aligned address).
const OTHER: usize = 1;

/// The hot loop of [`fp_chain`], alone in its function so that its values stay in registers
/// (inlined, the function's other values pushed one of them to memory): from frame record `fp`
/// (aligned, on this thread's own stack), stores the return addresses at `out` while they are
/// in `text_start..text_start + text_len` (`ra - 1` is) and the caller's record lies above the
/// current one's end, aligned and at most at `top` * 8 (on the same stack). Returns the record
/// it stopped at and the end of what it stored, with [`OTHER`] set when it stopped because that
/// record's return address is outside the range (not stored).
///
/// Stores at most `(top * 8 - fp) / 16 + 1` return addresses: each record lies at least 16
/// bytes above the one before.
///
/// # Safety
/// `fp` is aligned, on this thread's own live stack, at or above the walk's stack pointer;
/// `top * 8` is at least `fp` and at most the address of the stack's last frame record (16
/// bytes below its high end); `out` is valid for `(top * 8 - fp) / 16 + 1` writes, which
/// nothing else reads or writes while this runs.
#[inline(never)]
unsafe fn fp_run(
    mut fp: usize,
    mut out: *mut usize,
    text_start: usize,
    text_len: usize,
    top: usize,
) -> (usize, usize) {
    loop {
        // SAFETY: the first fp is the caller's (see the safety section); every later one was
        // checked below to be aligned, above the one before (so above the walk's stack
        // pointer) and at most `top` * 8, which the caller keeps at or below the stack's last
        // record.
        let (next, ra) = unsafe { read_record(fp) };
        // A zero return address wraps to the top and fails the range test too.
        if ra.wrapping_sub(1).wrapping_sub(text_start) >= text_len {
            return (fp, out as usize | OTHER);
        }
        // SAFETY: this is at most the ((top * 8 - fp0) / 16 + 1)-th store since the call (each
        // fp taken is at least 16 bytes above the one before and at most `top` * 8), and the
        // caller made `out` valid for that many.
        unsafe {
            out.write(ra);
            out = out.add(1);
        }
        // The caller's frame record: above this one (at or above this frame's end, fp + 16,
        // the caller's stack pointer), aligned and at most at `top` * 8, in one comparison for
        // the last two (`next` rotated right by 3 is at most `top` exactly when it is aligned
        // and at most `top` * 8).
        if next <= fp + W || next.rotate_right(W.trailing_zeros()) > top {
            return (fp, out as usize);
        }
        fp = next;
    }
}
