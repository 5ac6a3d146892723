//! The walk: one loop for every entry point and both modes.
//!
//! Per frame it records the pc, then finds the frame's rule:
//! 1. in DWARF mode, from the shared rule cache, or derived from the object's CFI on a miss
//!    (and cached): a compiled rule (CFA = register + offset, callee-saved registers restored
//!    from their save slots), the full evaluator for anything else (expressions, any register),
//!    the signal trampoline (continue from the `ucontext_t` the kernel saved: the interrupted pc,
//!    exact, and every register), or "no CFI here";
//! 2. where there is no CFI at all (and in frame-pointer mode), the frame-pointer rule, whose
//!    result is accepted only when the return address lies in code of a loaded object.
//!
//! A frame whose CFI exists but cannot be evaluated ends the walk, and the walk says why
//! ([`WalkEnd::Truncated`]); it never guesses with frame pointers there. Every memory read goes
//! through [`CheckedMemory`]; the stack pointer must grow at every step (except across a signal
//! frame, which may switch stacks); walks stop at the buffer's end, after [`MAX_FRAMES`] frames
//! or [`MAX_SIGNAL_FRAMES`] signal frames.
//!
//! A walk first runs the hot loops on the caller's stack ([`super::fast`],
//! [`super::fast_fp`]); if a frame needs more, it claims a slot ([`super::slots`]) and goes on
//! on the slot's private stack, alternating the general step ([`super::step`]) and the hot
//! loops.
#![allow(unsafe_code)]

use super::fast::{fast_frames, Fast};
use super::fast_fp::{fast_fp_frames, fp_chain, FpRegs};
use super::memory::CheckedMemory;
use super::objects::{self, LoadedCheck, State};
use super::outcome::{Outcome, Start};
use super::regs::RegSet;
use super::slots::{Scratch, SlotGuard};
use super::step::{Step, Walker};
use super::types::{
    FrameKinds, StopReason, Truncation, UnwindMode, WalkEnd, MAX_FRAMES, MAX_SIGNAL_FRAMES,
};
use crate::sys;


/// Words of window a walk without a slot copies at a time (it runs on the caller's stack,
/// which may be a small alternate signal stack).
const SMALL_WINDOW: usize = 32;

/// Walks from `start` into `buf` and writes how it went into `out`.
///
/// The outcome is written in place, field by field, and read so by the callers: returned by
/// value, it went through memory as a copy whose wide loads could not take the narrow stores
/// just made from the store buffer (a store-forwarding stall, a tenth of a short capture).
pub(crate) fn walk(
    start: &Start,
    buf: &mut [usize],
    mode: UnwindMode,
    trusted: bool,
    out: &mut Outcome,
) {
    if buf.is_empty() {
        *out = Outcome::default();
        return;
    }
    objects::with_state(|state| {
        let mut resume = None;
        if let Some(s) = state {
            match walk_all_cached(s, start, buf, mode, trusted, out) {
                Cached::Done => return,
                Cached::Partial(r) => resume = Some(r),
                Cached::No => {}
            }
        }
        // A slot from the pool: scratch space and a private stack to walk on. Without one
        // (before init, or all busy for longer than CLAIM_WAIT_NS) the walk runs on the
        // caller's stack with the rule cache and frame pointers only.
        let mut slot = state.and_then(|_| claim_waiting(start.sp() >> 12));
        let top = slot.as_ref().map_or(0, SlotGuard::stack_top);
        let mut job = Job {
            start,
            resume,
            buf,
            state,
            scratch: slot.as_mut().map(SlotGuard::scratch),
            mode,
            trusted,
            out: Outcome {
                initialized: state.is_some(),
                ..Outcome::default()
            },
        };
        if top != 0 {
            // SAFETY: `top` is the high end of the slot's private stack, which we own while we
            // hold the slot; `run_job` does not unwind (nothing in the walk panics).
            unsafe { sys::call_on_stack(top, run_job, (&mut job as *mut Job<'_, '_>).cast()) };
        } else {
            job.run();
        }
        *out = job.out;
    })
}

/// How long a walk waits for a slot when every one is busy: other threads' walks hold them for
/// microseconds, so a burst of more walks than slots (96 threads capturing at once) is not cut
/// short with `StopReason::Busy`; a walk in a signal handler whose own thread holds a slot
/// (the handler interrupted a walk) waits this long at most.
const CLAIM_WAIT_NS: u64 = 2_000_000;

/// [`SlotGuard::claim`], yielding the CPU between tries for up to [`CLAIM_WAIT_NS`].
///
/// # Async-signal safety
/// Async-signal-safe: compare-and-swaps, `sched_yield` and the monotonic clock; bounded.
fn claim_waiting(hint: usize) -> Option<SlotGuard> {
    if let Some(s) = SlotGuard::claim(hint) {
        return Some(s);
    }
    let deadline = sys::monotonic_ns().saturating_add(CLAIM_WAIT_NS);
    loop {
        sys::sched_yield();
        if let Some(s) = SlotGuard::claim(hint) {
            return Some(s);
        }
        if sys::monotonic_ns() >= deadline {
            return None;
        }
    }
}

/// The common case without a slot, a stack switch or any setup: a capture whose frames the hot
/// loops handle (rules cached, objects never unloaded, reads on the own stack). Stops at the
/// first frame that needs more; the full walker goes on from there. A whole walk is written
/// into `out`.
#[inline]
fn walk_all_cached(
    state: &State,
    start: &Start,
    buf: &mut [usize],
    mode: UnwindMode,
    trusted: bool,
    out: &mut Outcome,
) -> Cached {
    let Start::Return(entry) = start else {
        return Cached::No;
    };
    if !trusted {
        return Cached::No;
    }
    // A return address's frame knows the callee-saved registers only.
    let mut regs = entry.callee_saved();
    let Some((_, high)) = sys::own_stack_above(regs.sp()) else {
        return Cached::No;
    };
    let mut dropped = false;
    buf[0] = regs.pc();
    let mut frames = 1;
    let limit = buf.len().min(MAX_FRAMES);
    let end = match mode {
        UnwindMode::Dwarf => fast_frames(
            false,
            state,
            &mut LoadedCheck::default(),
            &mut (0..0),
            regs.sp()..high,
            &mut regs,
            buf,
            &mut frames,
            limit,
            &mut dropped,
        ),
        UnwindMode::FramePointer => fast_fp_frames(
            state,
            &mut LoadedCheck::default(),
            regs.sp()..high,
            &mut regs,
            buf,
            &mut frames,
            limit,
        ),
    };
    let Some(end) = end.end(buf, frames) else {
        return Cached::Partial((regs, frames, dropped));
    };
    out.frames = frames;
    out.end = end;
    out.signal_frames = 0;
    out.unknown_object = false;
    out.initialized = true;
    out.kinds.clear();
    Cached::Done
}

/// Frame-pointer mode's capture from the entry's stack pointer, frame pointer and pc (a return
/// address), on the capture's own stack, without a slot: the whole walk when [`fp_chain`]
/// does it (the common case: objects never unloaded, no signal frame), `None` when the general
/// walk must do it (the caller runs that from the start, so that this frame is not on the stack
/// below it: a signal handler's alternate stack is small). Reads neither the other saved
/// registers nor the thread's stack bounds a second time, which is most of the fixed cost of a
/// short capture. Inlined into its one caller, `entry::capture_fp`, which is never inlined.
#[inline]
pub(crate) fn capture_fp(sp: usize, fp: usize, pc: usize, buf: &mut [usize]) -> Option<Outcome> {
    let (_, high) = sys::own_stack_above(sp).filter(|_| !buf.is_empty())?;
    buf[0] = pc;
    let mut frames = 1;
    let limit = buf.len().min(MAX_FRAMES);
    // The closure returns one small value: results written field by field into memory and
    // read back as whole words stall store forwarding (measured: most of this function's time).
    let fast = objects::with_state(|state| {
        Some(fp_chain(
            state?,
            &mut LoadedCheck::default(),
            sp..high,
            &mut FpRegs { sp, fp, pc },
            buf,
            &mut frames,
            limit,
        ))
    })?;
    Some(Outcome {
        frames,
        end: fast.end(buf, frames)?,
        signal_frames: 0,
        unknown_object: false,
        initialized: true,
        kinds: FrameKinds::NONE,
    })
}

/// What [`walk_all_cached`] got done.
enum Cached {
    /// The whole walk (written into the caller's outcome).
    Done,
    /// Frames up to one that needs the full walker, which goes on from there.
    Partial((RegSet, usize, bool)),
    /// Nothing (not a capture from the own stack).
    No,
}

/// Everything one walk needs, passed through [`sys::call_on_stack`].
struct Job<'a, 'b> {
    start: &'a Start,
    /// Where the slot-free attempt stopped: its registers, frames written, and whether it
    /// dropped registers.
    resume: Option<(RegSet, usize, bool)>,
    buf: &'a mut [usize],
    state: Option<&'b State>,
    scratch: Option<&'a mut Scratch>,
    mode: UnwindMode,
    /// The start's stack pointer is genuine (a capture's own, or the kernel's ucontext).
    trusted: bool,
    out: Outcome,
}

extern "C" fn run_job(job: *mut libc::c_void) {
    // SAFETY: `walk` passes a pointer to its live Job and waits for us to return.
    let job = unsafe { &mut *(job as *mut Job<'_, '_>) };
    job.run();
}

impl Job<'_, '_> {
    fn run(&mut self) {
        // Optimistic first: the fast path restores only rbp of the callee-saved registers. If
        // a frame then needs one it dropped (a CFA based on rbx, say), walk again precisely.
        if self.run_once(false) {
            super::stats::bump(&super::stats::PRECISE);
            let initialized = self.out.initialized;
            self.out = Outcome {
                initialized,
                ..Outcome::default()
            };
            self.run_once(true);
        }
    }

    /// One walk; returns true when it stopped for an unknown register that the optimistic
    /// fast path had dropped (a precise walk would know it).
    fn run_once(&mut self, precise: bool) -> bool {
        let (mut regs, mut exact) = match *self.start {
            Start::Exact(r) => (r, true),
            Start::Return(r) => (r, false),
        };
        let mut small = [0usize; SMALL_WINDOW];
        let (window, ctx) = match self.scratch.as_deref_mut() {
            Some(s) => (&mut s.window[..], Some(&mut *s.ctx)),
            None => (&mut small[..], None),
        };
        let sp = regs.sp();
        let mut w = Walker {
            state: self.state,
            fast: self.state.filter(|_| self.mode == UnwindMode::Dwarf),
            current: 0..0,
            mem: if self.trusted {
                CheckedMemory::new(sp, window)
            } else {
                CheckedMemory::untrusted(window)
            },
            ctx,
            loaded: LoadedCheck::default(),
            mode: self.mode,
        };
        let buf = &mut *self.buf;
        let out = &mut self.out;
        let limit = buf.len().min(MAX_FRAMES);
        let mut dropped = false;
        match self.resume.take().filter(|_| !precise) {
            Some((r, frames, d)) => {
                regs = r;
                out.frames = frames;
                dropped = d;
            }
            None => {
                buf[0] = regs.pc();
                out.frames = 1;
                if exact {
                    out.kinds.push(0);
                }
            }
        }
        loop {
            let fast = match (w.state, w.fast, w.mode) {
                (Some(state), _, UnwindMode::FramePointer) => fast_fp_frames(
                    state,
                    &mut w.loaded,
                    w.mem.stack(),
                    &mut regs,
                    buf,
                    &mut out.frames,
                    limit,
                ),
                (_, Some(state), _) if !exact => fast_frames(
                    precise,
                    state,
                    &mut w.loaded,
                    &mut w.current,
                    w.mem.stack(),
                    &mut regs,
                    buf,
                    &mut out.frames,
                    limit,
                    &mut dropped,
                ),
                _ => Fast::Slow,
            };
            if let Some(end) = fast.end(buf, out.frames) {
                out.end = end;
                break;
            }
            let pc = regs.pc();
            match w.step(&mut regs, exact, out) {
                Step::Caller { signal } => {
                    if signal {
                        if out.signal_frames == MAX_SIGNAL_FRAMES {
                            out.end = WalkEnd::Truncated(Truncation {
                                pc,
                                reason: StopReason::TooManySignalFrames,
                            });
                            break;
                        }
                        out.signal_frames += 1;
                        w.mem.enter_stack(regs.sp());
                    }
                    exact = signal;
                    if out.frames == limit {
                        out.end = WalkEnd::BufferFull;
                        break;
                    }
                    buf[out.frames] = regs.pc();
                    // The walk's record of exact frames, on this rare branch only (the hot
                    // loops never cross a signal frame).
                    if signal {
                        out.kinds.push(out.frames);
                    }
                    out.frames += 1;
                }
                Step::End => {
                    out.end = WalkEnd::Complete;
                    break;
                }
                Step::Stop(reason) => {
                    out.end = WalkEnd::Truncated(Truncation { pc, reason });
                    return reason == StopReason::RegisterUnknown && dropped;
                }
            }
        }
        false
    }
}
