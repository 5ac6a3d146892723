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

use super::cfi::UnwindData;
use super::dwarf::{self, DwarfState, Scratch, SlotGuard};
use super::mem::CheckedMemory;
use super::regs::{self, dw, EntryRegs, RegSet};
use super::rules::{self, Kind, Rule, SAME, SAVED, UNDEF};
use super::tail;
use super::{StopReason, UnwindMode, WalkEnd};
use crate::sys;

/// The most frames one walk produces, whatever the buffer size.
pub const MAX_FRAMES: usize = 1 << 16;
/// The most signal frames one walk crosses.
pub const MAX_SIGNAL_FRAMES: usize = 16;

/// How a walk ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outcome {
    /// Frames written.
    pub(crate) frames: usize,
    /// Why the walk stopped.
    pub(crate) end: WalkEnd,
    /// The walk crossed a signal trampoline: it ran inside a signal handler.
    pub(crate) signal_frames: usize,
    /// A pc lay in an object the loader knows but the published snapshot does not.
    pub(crate) unknown_object: bool,
    /// `init()` had published an unwinder when the walk ran.
    pub(crate) initialized: bool,
}

impl Default for Outcome {
    fn default() -> Outcome {
        Outcome {
            frames: 0,
            end: WalkEnd::BufferFull,
            signal_frames: 0,
            unknown_object: false,
            initialized: false,
        }
    }
}

/// The first frame of a walk.
#[derive(Clone, Copy)]
pub(crate) enum Start {
    /// The pc is exact (an interrupted pc or a caller-supplied state).
    Exact(RegSet),
    /// The pc is a return address (the caller of a capture function).
    Return(RegSet),
}

impl Start {
    pub(crate) fn sp(&self) -> usize {
        match self {
            Start::Exact(r) | Start::Return(r) => r.sp(),
        }
    }
}

/// Words of window a walk without a slot copies at a time (it runs on the caller's stack,
/// which may be a small alternate signal stack).
const SMALL_WINDOW: usize = 32;

pub(crate) fn walk(start: &Start, buf: &mut [usize], mode: UnwindMode, trusted: bool) -> Outcome {
    if buf.is_empty() {
        return Outcome::default();
    }
    dwarf::with_state(|state| {
        let mut resume = None;
        if let Some(s) = state {
            match walk_all_cached(s, start, buf, mode, trusted) {
                Cached::Done(out) => return out,
                Cached::Partial(r) => resume = Some(r),
                Cached::No => {}
            }
        }
        // A slot from the pool: scratch space and a private stack to walk on. Without one
        // (before init, or all busy) the walk runs on the caller's stack with the rule cache
        // and frame pointers only.
        let mut slot = state.and_then(|_| SlotGuard::claim(start.sp() >> 12));
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
        job.out
    })
}

/// The common case without a slot, a stack switch or any setup: a capture whose frames the hot
/// loops handle (rules cached, objects never unloaded, reads on the own stack). Stops at the
/// first frame that needs more; the full walker goes on from there.
#[inline]
fn walk_all_cached(
    state: &DwarfState,
    start: &Start,
    buf: &mut [usize],
    mode: UnwindMode,
    trusted: bool,
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
        UnwindMode::Dwarf => fast_frames::<false>(
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
    Cached::Done(Outcome {
        frames,
        end,
        signal_frames: 0,
        unknown_object: false,
        initialized: true,
    })
}

/// What [`walk_all_cached`] got done.
enum Cached {
    /// The whole walk.
    Done(Outcome),
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
    state: Option<&'b DwarfState>,
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

/// What one step found.
enum Step {
    /// `regs` now holds the caller's frame; `signal` when it came from a `ucontext_t` (its pc
    /// is exact).
    Caller { signal: bool },
    /// The outermost frame.
    End,
    /// The walk cannot go on.
    Stop(StopReason),
}

impl Job<'_, '_> {
    fn run(&mut self) {
        // Optimistic first: the fast path restores only rbp of the callee-saved registers. If
        // a frame then needs one it dropped (a CFA based on rbx, say), walk again precisely.
        if self.run_once(false) {
            super::counters::PRECISE.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
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
                (_, Some(state), _) if !exact => (if precise {
                    fast_frames::<true>
                } else {
                    fast_frames::<false>
                })(
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
                            out.end = WalkEnd::Truncated(super::Truncation {
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
                    out.frames += 1;
                }
                Step::End => {
                    out.end = WalkEnd::Complete;
                    break;
                }
                Step::Stop(reason) => {
                    out.end = WalkEnd::Truncated(super::Truncation { pc, reason });
                    return reason == StopReason::RegisterUnknown && dropped;
                }
            }
        }
        false
    }
}

impl Fast {
    /// How the walk ends, unless the general step goes on (`buf[..frames]` written so far).
    fn end(self, buf: &[usize], frames: usize) -> Option<WalkEnd> {
        match self {
            Fast::Slow => None,
            Fast::Full => Some(WalkEnd::BufferFull),
            Fast::End => Some(WalkEnd::Complete),
            Fast::Stop(reason) => Some(WalkEnd::Truncated(super::Truncation {
                pc: buf[frames - 1],
                reason,
            })),
        }
    }
}

/// Whether return address `ra` lies in code of an object this walk may trust without another
/// check (never unloaded, or checked in this walk); switches `current` to that object.
#[inline(always)]
fn trusted_code(
    state: &DwarfState,
    loaded: &mut LoadedCheck,
    start: &mut usize,
    code: &mut usize,
    current: &mut core::ops::Range<usize>,
    ra: usize,
) -> bool {
    let at = ra - 1;
    if at.wrapping_sub(*start) < *code {
        return true;
    }
    match state.find_near(at, loaded.last) {
        Some(i) if state.objects[i].permanent || loaded.verified(i) => {
            let o = &state.objects[i];
            if !o.is_code(at, 1) {
                return false;
            }
            loaded.last = i;
            *start = o.range.start;
            *code = o.range.end - o.range.start;
            *current = o.range.clone();
            true
        }
        _ => false,
    }
}

/// How [`fast_frames`] stopped.
enum Fast {
    /// The frame at `regs` (already written) needs the general step.
    Slow,
    /// The buffer is full.
    Full,
    /// The outermost frame.
    End,
    /// The walk cannot go on from the last frame written.
    Stop(StopReason),
}

/// The hot loop: steps frames whose pc (a return address) lies in `current` (an object this
/// walk checked is still loaded), whose rule is cached in compiled form, and whose reads fall
/// on this thread's own stack; writes each caller's pc into `buf`. Anything else goes back to
/// the general step, which handles it (and the errors) in full.
///
/// Unless `PRECISE`, only rbp is restored from a save slot; a callee-saved register that a
/// frame saved becomes unknown (and `dropped` is set), which costs nothing unless a later frame
/// needs it: then the walk is repeated precisely (see [`Job::run`]).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn fast_frames<const PRECISE: bool>(
    state: &DwarfState,
    loaded: &mut LoadedCheck,
    current: &mut core::ops::Range<usize>,
    stack: core::ops::Range<usize>,
    regs: &mut RegSet,
    buf: &mut [usize],
    n: &mut usize,
    limit: usize,
    dropped: &mut bool,
) -> Fast {
    /// The lane of rbp in [`SAVED`].
    const RBP_LANE: u64 = 1 << 1;
    const W: usize = core::mem::size_of::<usize>();
    const SP: usize = dw::RSP as usize;
    const PC: usize = dw::RA as usize;
    // A read is allowed when `a - start <= span` (wrapping) and `a` is aligned: with `start`
    // aligned, one comparison of `a - start` rotated right by 3 (a misaligned address's low
    // bits become high bits) with `span / 8`. No known stack (a walk from untrusted registers)
    // or an unaligned one: nothing is read directly.
    let Some(span) = stack
        .end
        .checked_sub(stack.start)
        .and_then(|l| l.checked_sub(W))
        .filter(|_| stack.start.is_multiple_of(W))
    else {
        return Fast::Slow;
    };
    let words = span / W;
    let ok = |a: usize| readable_word(a, stack.start, words);
    // SAFETY (for every `load` below): `ok` held for the address: aligned and on this thread's
    // own live stack, between the walk's stack pointer and the stack's high end.
    let load = |a: usize| unsafe { core::ptr::read_volatile(a as *const usize) };
    let cache = &state.cache;
    let mut start = current.start;
    let mut code = current.end.wrapping_sub(current.start);
    let buf = &mut buf[..limit];
    let v = &mut regs.v;
    let mut valid = regs.valid;
    let mut frames = *n;
    // pc, sp and rbp live in locals: the next frame's CFA base is one of them nearly always, and
    // a register beats a store-and-reload through `v` on the walk's critical path.
    const BP: usize = dw::RBP as usize;
    let (mut pc, mut sp, mut bp) = (v[PC], v[SP], v[BP]);
    // usize::MAX marks "no record frame" below; sp stays under it in this loop (every step's
    // CFA is within a word or 2 KiB of a checked read, and a joined record's sp is one a
    // walk reached), so only a starting sp could equal it (a general step accepts any larger sp).
    if sp == usize::MAX {
        return Fast::Slow;
    }
    // The first pc's object; every later pc is checked before it is taken.
    if pc.wrapping_sub(start) >= code {
        match state.find_near(pc, loaded.last) {
            Some(i) if state.objects[i].permanent || loaded.verified(i) => {
                loaded.last = i;
                let r = &state.objects[i].range;
                start = r.start;
                code = r.end - r.start;
                *current = r.clone();
            }
            _ => return Fast::Slow,
        }
    }
    // The record of this thread's previous walk (see `tail`): not in the precise walk, which
    // is rare and tracks registers a record does not hold.
    let mut claim = if PRECISE {
        None
    } else {
        tail::Claim::take(stack.end, state.generation)
    };
    let (record, mut stage) = match claim.as_mut() {
        Some(c) => c.parts(),
        None => (&[][..], None),
    };
    let staging = stage.is_some();
    // One past the record frame to compare next (record frames lie outermost first, so their
    // sp falls as the index grows), and that frame's sp: the walk compares nothing before its
    // sp reaches it.
    let mut cursor = record.len();
    let record_len = record.len();
    let mut next_sp = record.last().map_or(usize::MAX, |f| f.sp);
    // Frames of this loop staged for the next record, and the first that may be recorded.
    let mut staged = 0usize;
    let mut floor = 0usize;
    // Where the walk joined the record: the index of the record frame it reached.
    let mut joined = None;
    let mut reused = 0;
    let end = loop {
        if sp >= next_sp {
            // Record frames below this one are no longer on the stack. (`next_sp` is the sp of
            // record frame `cursor - 1`, or usize::MAX if there is none: below `sp`, there is.)
            while next_sp < sp {
                cursor -= 1;
                next_sp = match cursor.checked_sub(1) {
                    // SAFETY: `cursor` never exceeds the record's length (it starts there and
                    // only falls), so `i` is in bounds.
                    Some(i) => unsafe { record.get_unchecked(i) }.sp,
                    None => usize::MAX,
                };
            }
            // SAFETY: `next_sp == sp` only when `cursor - 1` is a record frame: else `next_sp`
            // is usize::MAX, which sp never is here (see above).
            let hit = (next_sp == sp && unsafe { record.get_unchecked(cursor - 1) }.pc == pc)
                .then(|| cursor - 1);
            if let Some((r, at, how, n)) =
                hit.and_then(|r| join(record, r, bp, valid, &ok, buf, frames))
            {
                frames = n;
                reused += r - at;
                match how {
                    Replayed::End => {
                        joined = Some(r);
                        break Fast::End;
                    }
                    Replayed::Full => break Fast::Full,
                    Replayed::Differs => {
                        // Go on from the record frame whose words changed, with the walk's
                        // state there: its pc and sp are the record's; rbp is the one the
                        // last replayed step restored, or the walk's own if none did (the
                        // record's may differ where no step depended on it). The registers
                        // a frame saved become unknown, as in a step below. The frames taken
                        // from the record are staged as if stepped, with their true rbp.
                        let mut bp_valid = valid & (1 << BP) != 0;
                        for i in (at + 1..=r).rev() {
                            let e = &record[i];
                            if let Some(st) = stage.as_deref_mut() {
                                st[staged & (tail::CAP - 1)] = tail::Frame {
                                    bp,
                                    reads: (e.reads & !tail::FLAGS)
                                        | (e.reads & tail::BP_BASE)
                                        | (bp_valid as usize * tail::BP_VALID),
                                    ..*e
                                };
                                staged += 1;
                            }
                            if e.rbp_at().is_some() {
                                bp = record[i - 1].bp;
                                bp_valid = true;
                            }
                        }
                        (pc, sp) = (record[at].pc, record[at].sp);
                        if bp_valid {
                            valid |= 1 << BP;
                        }
                        let callee_saved = (1 << dw::RBX) | (0xf << dw::R12);
                        if valid & callee_saved != 0 {
                            valid &= !callee_saved;
                            *dropped = true;
                        }
                        // Record frames further out may still be joined (the stack may be
                        // the same again above the frames that changed).
                        cursor = at;
                        next_sp = cursor.checked_sub(1).map_or(usize::MAX, |i| record[i].sp);
                    }
                }
            }
        }
        // The step: the CFA, the return address's slot, the CFA's base register, which of
        // [`SAVED`] the frame saves and the packed rule (the precise walk reads every save slot
        // from it). A return address whose rule has the compact form costs one load of one
        // word; any other pc is looked up in the buckets.
        let compact = if PRECISE { None } else { cache.compact(pc) };
        let (cfa, ra_at, reg, slots, w) = match compact {
            Some(c) => {
                let cfa = sp.wrapping_add(c.cfa_words() * W);
                (cfa, cfa.wrapping_sub(W), SP, c.slots(), [0; 3])
            }
            None => {
                let key = rules::key(pc, false);
                let w = if PRECISE {
                    cache.get_raw(key)
                } else {
                    cache.get_head(key).map(|[a, b]| [a, b, 0])
                };
                let Some(w) = w else {
                    break Fast::Slow;
                };
                if w[0] & rules::FAST_MASK != Kind::Cfi as u64 {
                    if w[0] & 0xf == Kind::End as u64 {
                        if let Some(st) = stage.as_deref_mut() {
                            st[staged & (tail::CAP - 1)] = tail::Frame {
                                pc,
                                sp,
                                bp,
                                reads: (valid >> BP) as usize & tail::BP_VALID,
                            };
                            staged += 1;
                        }
                        break Fast::End;
                    }
                    break Fast::Slow;
                }
                let reg = ((w[0] >> 4) & 0xf) as usize;
                let base = match reg {
                    SP => sp,
                    _ if valid & (1 << reg) == 0 => break Fast::Slow,
                    BP => bp,
                    _ => {
                        // A step that depends on a register a record does not hold: this frame and
                        // the ones below it are not recorded.
                        floor = staged + 1;
                        v[reg]
                    }
                };
                let cfa = base.wrapping_add(rules::packed_cfa_off(w[0]) as isize as usize);
                let ra_at = cfa.wrapping_add(rules::packed_ra_off(w[0]) as isize as usize);
                (cfa, ra_at, reg, (w[0] >> 8) & 0x3f, w)
            }
        };
        if cfa <= sp || !ok(ra_at) {
            break Fast::Slow;
        }
        let at = |i: usize| {
            let off = (w[1 + i / 4] >> (16 * (i % 4))) as u16 as i16;
            cfa.wrapping_add(off as isize as usize)
        };
        let ra;
        if PRECISE {
            // Check every save slot before changing any register.
            let mut all = true;
            for i in 0..SAVED.len() {
                if slots & (1 << i) != 0 {
                    all &= ok(at(i));
                }
            }
            if !all {
                break Fast::Slow;
            }
            ra = load(ra_at);
            if ra == 0 || !trusted_code(state, loaded, &mut start, &mut code, current, ra) {
                break Fast::Slow;
            }
            v[BP] = bp;
            for (i, &r) in SAVED.iter().enumerate() {
                if slots & (1 << i) != 0 {
                    v[r as usize] = load(at(i));
                    valid |= 1 << r;
                }
            }
            bp = v[BP];
        } else {
            let rbp_at = match compact {
                Some(c) => cfa.wrapping_sub(c.rbp_words() * W),
                None => at(1),
            };
            if slots & RBP_LANE != 0 && !ok(rbp_at) {
                break Fast::Slow;
            }
            ra = load(ra_at);
            if ra == 0 || !trusted_code(state, loaded, &mut start, &mut code, current, ra) {
                break Fast::Slow;
            }
            if let Some(st) = stage.as_deref_mut() {
                let reads = tail::Frame::reads(
                    ra_at,
                    if slots & RBP_LANE != 0 { rbp_at } else { 0 },
                    ((valid >> BP) as usize & tail::BP_VALID)
                        | ((reg == BP) as usize * tail::BP_BASE),
                );
                match reads {
                    Some(reads) => {
                        st[staged & (tail::CAP - 1)] = tail::Frame { pc, sp, bp, reads };
                    }
                    // Not recordable: neither is anything below.
                    None => floor = staged + 1,
                }
                staged += 1;
            }
            if slots & RBP_LANE != 0 {
                bp = load(rbp_at);
                valid |= 1 << dw::RBP;
            }
            // The registers of the other lanes (rbx: lane 0; r12-r15: lanes 2-5) become
            // unknown.
            if slots & !RBP_LANE != 0 {
                let others = (slots & 1) << dw::RBX | (slots >> 2) << dw::R12;
                *dropped = true;
                valid &= !(others as u32);
            }
        }
        // Registers without a rule keep their values (see `cfi::eval_row`).
        pc = ra;
        sp = cfa;
        match buf.get_mut(frames) {
            Some(slot) => *slot = ra,
            None => break Fast::Full,
        }
        frames += 1;
    };
    if reused != 0 {
        if let Some(c) = claim.as_mut() {
            c.count(reused);
        }
    }
    if let (Fast::End, Some(c)) = (&end, claim.as_mut()) {
        if staging {
            // A complete walk becomes the thread's record: the frames of this loop above the
            // last one that may not be recorded (a pc in an object that can be unloaded), on
            // top of the record frames it joined.
            let keep = joined.map_or(0, |r| r + 1);
            let st = c.stage();
            let mut hint = loaded.last;
            for f in (floor..staged).rev() {
                let at = st[f & (tail::CAP - 1)].pc.wrapping_sub(1);
                match state.find_near(at, hint) {
                    Some(i) if state.objects[i].permanent => hint = i,
                    _ => {
                        floor = f + 1;
                        break;
                    }
                }
            }
            // (Unchanged when the walk joined the innermost recorded frame and stepped none.)
            if floor < staged || keep != record_len {
                c.commit(keep, floor, staged);
            }
        }
        // Whether the walk joined the record after stepping frames of its own.
        c.complete(joined.is_some() && frames - *n > reused);
    }
    v[PC] = pc;
    v[SP] = sp;
    v[BP] = bp;
    regs.valid = valid;
    *n = frames;
    end
}

/// Whether `a` is an aligned address of a word that lies within `words` words above `start`
/// (aligned): `a - start`, wrapping, rotated right by 3 so that a misaligned address's low
/// bits become high bits, compared once. The same as `a >= start && a - start <= 8 * words &&
/// a % 8 == 0` for user-space addresses.
#[inline(always)]
fn readable_word(a: usize, start: usize, words: usize) -> bool {
    const W: usize = core::mem::size_of::<usize>();
    a.wrapping_sub(start).rotate_right(W.trailing_zeros()) <= words
}

/// Joins record frame `r`, whose pc and sp are the walk's, if rbp agrees where a step above
/// depends on it (and whether rbp is known): takes the frames above it from the record (see
/// [`replay`]). Returns the record frame joined, the one reached, how the replay stopped and the new frame count.
#[inline(never)]
fn join(
    record: &[tail::Frame],
    r: usize,
    bp: usize,
    valid: u32,
    ok: &impl Fn(usize) -> bool,
    buf: &mut [usize],
    frames: usize,
) -> Option<(usize, usize, Replayed, usize)> {
    let e = &record[r];
    let bp_valid = valid & (1 << dw::RBP) != 0;
    // rbp must be the recorded one only where a step above depends on it (see `tail`).
    let bp_same = e.reads & tail::BP_NEEDED == 0
        || (e.bp == bp && (e.reads & tail::BP_VALID != 0) == bp_valid);
    if !bp_same {
        return None;
    }
    let (at, how, frames) = replay(record, r, ok, buf, frames);
    Some((r, at, how, frames))
}

/// How [`replay`] stopped.
enum Replayed {
    /// At the record's outermost frame: the walk is complete.
    End,
    /// The buffer is full.
    Full,
    /// The words the step of the frame reached were not those recorded.
    Differs,
}

/// Takes the frames above record frame `r` (the walk's current frame, `buf[frames - 1]`)
/// from the record while the stack still holds the words their steps read, each read allowed
/// by `ok`; writes their pcs into `buf`. Returns the index of the record frame reached, how it stopped and the new frame count.
#[inline(always)]
fn replay(
    record: &[tail::Frame],
    r: usize,
    ok: &impl Fn(usize) -> bool,
    buf: &mut [usize],
    mut frames: usize,
) -> (usize, Replayed, usize) {
    let mut i = r;
    loop {
        if i == 0 {
            return (0, Replayed::End, frames);
        }
        let (e, caller) = (&record[i], &record[i - 1]);
        let ra_at = e.ra_at();
        // SAFETY: each address passed `ok`: aligned, on this thread's own live stack between
        // the walk's stack pointer and the stack's high end.
        let same = ok(ra_at)
            && unsafe { core::ptr::read_volatile(ra_at as *const usize) } == caller.pc
            && e.rbp_at().is_none_or(|rbp_at| {
                ok(rbp_at)
                    && unsafe { core::ptr::read_volatile(rbp_at as *const usize) } == caller.bp
            });
        if !same {
            return (i, Replayed::Differs, frames);
        }
        if frames == buf.len() {
            return (i, Replayed::Full, frames);
        }
        buf[frames] = caller.pc;
        frames += 1;
        i -= 1;
    }
}

/// The hot loop of frame-pointer mode: follows the chain while every frame record lies on
/// this thread's own stack and every return address lies in code of an object this walk may
/// trust; anything else (a signal trampoline, another stack, a strange address) goes back to the
/// general step.
#[inline(never)]
fn fast_fp_frames(
    state: &DwarfState,
    loaded: &mut LoadedCheck,
    stack: core::ops::Range<usize>,
    regs: &mut RegSet,
    buf: &mut [usize],
    n: &mut usize,
    limit: usize,
) -> Fast {
    const W: usize = core::mem::size_of::<usize>();
    const SP: usize = dw::RSP as usize;
    const FP: usize = dw::RBP as usize;
    const PC: usize = dw::RA as usize;
    let Some(span) = stack
        .end
        .checked_sub(stack.start)
        .and_then(|l| l.checked_sub(2 * W))
    else {
        return Fast::Slow;
    };
    if regs.valid & (1 << FP) == 0 {
        return Fast::Slow;
    }
    let (restorer_lo, restorer_hi) = state.restorer_span;
    let (mut sp, mut fp, mut pc) = (regs.v[SP], regs.v[FP], regs.v[PC]);
    // A return address into a signal trampoline needs the general step.
    if restorer_lo <= pc && pc <= restorer_hi {
        return Fast::Slow;
    }
    // The code range return addresses are checked against in one comparison: the previous
    // frame's object, without the signal trampolines (so no frame in it needs a check).
    let (mut text_start, mut text_len) = state.objects.get(loaded.last).map_or((0, 0), |o| {
        fp_text(o, state.restorer_span, pc.wrapping_sub(1))
    });
    let (mut prev_start, mut prev_len) = (0, 0);
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
    /// Why the inner loop stopped.
    enum Exit {
        /// fp is off the stack, misaligned or below sp (or zero).
        Bounds,
        /// The return address `ra` (with caller frame pointer `next`) is outside the current
        /// object's text.
        Other(usize, usize),
        /// The buffer is full; the frame of `ra` (caller fp `next`) was not stored.
        Full(usize, usize),
    }
    let end = loop {
        let exit = if !readable_word(fp, base, max_rotated) || fp < sp {
            Exit::Bounds
        } else {
            // The hot loop: nothing but the checks, two loads and a store, so that its state
            // (fp and the frame count) stays in registers; the rarer cases are handled outside
            // it, then it resumes. fp was checked before it was taken.
            loop {
                // SAFETY: fp and fp + 8 are aligned and on this thread's own live stack,
                // between the walk's stack pointer and the stack's high end.
                let (next, ra) = unsafe {
                    (
                        core::ptr::read_volatile(fp as *const usize),
                        core::ptr::read_volatile((fp + W) as *const usize),
                    )
                };
                // A zero return address wraps to the top and fails the range test too.
                if ra.wrapping_sub(1).wrapping_sub(text_start) >= text_len {
                    break Exit::Other(next, ra);
                }
                let Some(slot) = buf.get_mut(frames) else {
                    break Exit::Full(next, ra);
                };
                *slot = ra;
                frames += 1;
                // The caller's frame record: on the stack, aligned, and above this one
                // (at or above this frame's end, fp + 16, the caller's stack pointer).
                if !readable_word(next, base, max_rotated) || next <= fp + W {
                    sp = fp + 2 * W;
                    fp = next;
                    break Exit::Bounds;
                }
                fp = next;
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
        regs.keep_only(1 << SP | 1 << FP | 1 << PC);
        regs.v[SP] = sp;
        regs.v[FP] = fp;
        regs.v[PC] = pc;
    }
    *n = frames;
    end
}

/// The code range that frame-pointer mode checks `ra - 1` against in one comparison, as
/// (start, length): the part of `o`'s first executable segment around `at` that holds no
/// return address into a signal trampoline (`restorers`, the lowest and highest; empty when
/// lowest > highest). `(0, 0)` when `at` is not in it.
fn fp_text(o: &super::dwarf::ObjectCheck, (lo, hi): (usize, usize), at: usize) -> (usize, usize) {
    let (mut start, mut end) = (o.text.start, o.text.end);
    // Return addresses lo..=hi are `at` values lo - 1..=hi - 1.
    if lo <= hi && lo <= end && hi > start {
        if at.wrapping_add(1) < lo {
            end = end.min(lo - 1);
        } else if at >= hi {
            start = start.max(hi);
        } else {
            return (0, 0);
        }
    }
    if at < start || at >= end {
        return (0, 0);
    }
    (start, end - start)
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
fn fp_other_object(state: &DwarfState, loaded: &mut LoadedCheck, ra: usize) -> Other {
    let (lo, hi) = state.restorer_span;
    if lo <= ra && ra <= hi {
        return Other::Trampoline;
    }
    match state.find_near(ra - 1, loaded.last) {
        Some(i) if state.objects[i].permanent || loaded.verified(i) => {
            let o = &state.objects[i];
            if !o.is_code(ra - 1, 1) {
                return Other::Stop;
            }
            loaded.last = i;
            // (0, 0) outside the first executable segment: fine, checked again next time.
            let (start, len) = fp_text(o, (lo, hi), ra - 1);
            Other::Code(start, len)
        }
        Some(_) => Other::Slow,
        None => match sys::dl_find_object(ra) {
            Ok(None) => Other::Stop,
            _ => Other::Slow,
        },
    }
}

/// The per-walk state of the stepping.
struct Walker<'s, 'w> {
    state: Option<&'s DwarfState>,
    /// The state, in DWARF mode (the fast path's rule cache).
    fast: Option<&'s DwarfState>,
    /// The object of the previous frame, checked to be still loaded in this walk.
    current: core::ops::Range<usize>,
    mem: CheckedMemory<'w>,
    ctx: Option<&'w mut super::cfi::Ctx>,
    loaded: LoadedCheck,
    mode: UnwindMode,
}

impl Walker<'_, '_> {
    /// One step of any kind.
    #[inline(never)]
    fn step(&mut self, regs: &mut RegSet, exact: bool, out: &mut Outcome) -> Step {
        let pc = regs.pc();
        let state = match self.state {
            Some(s) if self.mode == UnwindMode::Dwarf => s,
            _ => return self.fp_mode_step(regs, exact, out),
        };
        match state.find_near(pc, self.loaded.last) {
            Some(i) => {
                self.loaded.last = i;
                if self.loaded.still_loaded(state, i, pc) {
                    self.current = state.objects[i].range.clone();
                    return self.cfi_step(state, i, regs, exact, out);
                }
                // Unloaded since the snapshot: its tables may be gone; only the checked
                // frame-pointer rule applies.
                self.no_cfi_step(regs, exact, out, false)
            }
            None => {
                let in_object = match sys::dl_find_object(pc) {
                    Ok(Some(_)) => {
                        out.unknown_object = true;
                        true
                    }
                    Ok(None) => false,
                    Err(()) => true,
                };
                if !exact && in_object && is_trampoline_at(pc) {
                    return self.signal_frame(regs);
                }
                self.no_cfi_step(regs, exact, out, in_object)
            }
        }
    }

    /// A frame in object `i` of the state, by its (cached) CFI rule.
    fn cfi_step(
        &mut self,
        state: &DwarfState,
        i: usize,
        regs: &mut RegSet,
        exact: bool,
        out: &mut Outcome,
    ) -> Step {
        let pc = regs.pc();
        let o = &state.objects[i];
        let lookup = if exact { pc } else { pc.wrapping_sub(1) };
        let key = rules::key(pc, exact);
        let mut evaluated = None;
        let mut new = *regs;
        let rule = match state.cache.get(key) {
            Some(r) => r,
            None => {
                let r = if !exact
                    && o.is_code(pc, regs::uc::TRAMPOLINE.len())
                    && is_trampoline_at(pc)
                {
                    Rule::of(Kind::Trampoline)
                } else {
                    match (&o.unwind, self.ctx.as_deref_mut()) {
                        (None, _) => Rule::of(Kind::NoCfi),
                        (Some(_), None) => return Step::Stop(StopReason::Busy),
                        (Some(data), Some(ctx)) => {
                            let (found, eval) =
                                data.find_and_eval(ctx, lookup, &mut new, &mut self.mem);
                            evaluated = eval;
                            match found {
                                super::cfi::Found::Rule(r) => r,
                                super::cfi::Found::NoCfi => Rule::of(Kind::NoCfi),
                                super::cfi::Found::Bad => Rule::of(Kind::Bad),
                            }
                        }
                    }
                };
                super::counters::DERIVED.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
                state.cache.put(key, &r);
                r
            }
        };
        match rule.kind {
            Kind::Cfi => self.apply(&rule, regs, out),
            Kind::End => Step::End,
            Kind::Trampoline => self.signal_frame(regs),
            Kind::NoCfi => self.no_cfi_step(regs, exact, out, true),
            Kind::Bad => Step::Stop(StopReason::NoUnwindRule),
            Kind::Slow => match evaluated {
                Some(result) => self.accept_full(result, new, regs, out),
                None => self.full_step(o.unwind.as_ref(), lookup, regs, out),
            },
        }
    }

    /// Applies a compiled rule, in place.
    #[inline(always)]
    fn apply(&mut self, rule: &Rule, regs: &mut RegSet, out: &mut Outcome) -> Step {
        let Some(base) = regs.get(rule.cfa_reg as u16) else {
            return Step::Stop(StopReason::RegisterUnknown);
        };
        let cfa = base.wrapping_add(rule.cfa_off as isize as usize);
        if cfa <= regs.sp() {
            return Step::Stop(StopReason::NoProgress);
        }
        let Some(ra) = self
            .mem
            .read_word(cfa.wrapping_add(rule.ra_off as isize as usize))
        else {
            return Step::Stop(StopReason::UnreadableMemory);
        };
        // Read every save slot before changing a register.
        let mut saved = [0usize; SAVED.len()];
        for (v, &how) in saved.iter_mut().zip(&rule.saved) {
            if how != SAME && how != UNDEF {
                match self.mem.read_word(cfa.wrapping_add(how as isize as usize)) {
                    Some(x) => *v = x,
                    None => return Step::Stop(StopReason::UnreadableMemory),
                }
            }
        }
        if ra == 0 {
            return Step::End;
        }
        if !self.plausible(ra, out) {
            return Step::Stop(StopReason::BadReturnAddress);
        }
        for ((&r, &how), &v) in SAVED.iter().zip(&rule.saved).zip(&saved) {
            match how {
                SAME => {}
                UNDEF => regs.forget(r),
                _ => regs.set(r, v),
            }
        }
        regs.set(dw::RSP, cfa);
        regs.set(dw::RA, ra);
        Step::Caller { signal: false }
    }

    /// The full CFI evaluator, for rules that do not compile.
    fn full_step(
        &mut self,
        data: Option<&UnwindData>,
        lookup: usize,
        regs: &mut RegSet,
        out: &mut Outcome,
    ) -> Step {
        let (Some(data), Some(ctx)) = (data, self.ctx.as_deref_mut()) else {
            return Step::Stop(StopReason::Busy);
        };
        let mut new = *regs;
        let result = data.step_full(ctx, lookup, &mut new, &mut self.mem);
        self.accept_full(result, new, regs, out)
    }

    /// Takes the full evaluator's result for the frame at `regs` (`new`: the caller's
    /// registers) if it is sane.
    fn accept_full(
        &mut self,
        result: Result<bool, StopReason>,
        new: RegSet,
        regs: &mut RegSet,
        out: &mut Outcome,
    ) -> Step {
        let old_sp = regs.sp();
        match result {
            Ok(false) => Step::End,
            Ok(true) => {
                if new.sp() <= old_sp {
                    return Step::Stop(StopReason::NoProgress);
                }
                if new.pc() == 0 {
                    return Step::End;
                }
                if !self.plausible(new.pc(), out) {
                    return Step::Stop(StopReason::BadReturnAddress);
                }
                *regs = new;
                Step::Caller { signal: false }
            }
            Err(reason) => Step::Stop(reason),
        }
    }

    /// Continues from the `ucontext_t` the kernel saved above the signal trampoline.
    fn signal_frame(&mut self, regs: &mut RegSet) -> Step {
        let uc = regs.sp() + regs::uc::FROM_TRAMPOLINE_SP;
        let mem = &mut self.mem;
        match RegSet::from_gregs(|off| mem.read_word(uc + off)) {
            Some(r) if r.pc() != 0 && r.sp() != 0 => {
                *regs = r;
                Step::Caller { signal: true }
            }
            _ => Step::Stop(StopReason::BadSignalFrame),
        }
    }

    /// A pc with no CFI: the frame-pointer rule, accepted only when the return address it
    /// finds lies in code of a loaded object. A first frame outside any object (a call through
    /// a bad function pointer) has its return address on top of the stack.
    fn no_cfi_step(
        &mut self,
        regs: &mut RegSet,
        exact: bool,
        out: &mut Outcome,
        in_object: bool,
    ) -> Step {
        const W: usize = core::mem::size_of::<usize>();
        if exact && out.frames == 1 && !in_object {
            let Some(ra) = self.mem.read_word(regs.sp()) else {
                return Step::Stop(StopReason::UnreadableMemory);
            };
            if !self.plausible(ra, out) {
                return Step::Stop(StopReason::NoFramePointer);
            }
            let sp = regs.sp() + W;
            regs.keep_only(dw::CALLEE_SAVED);
            regs.set(dw::RSP, sp);
            regs.set(dw::RA, ra);
            return Step::Caller { signal: false };
        }
        let (fp, next_fp, ra) =
            match self.frame_record(regs, Step::Stop(StopReason::NoFramePointer)) {
                Ok(r) => r,
                Err(step) => return step,
            };
        if !self.plausible(ra, out) {
            return Step::Stop(StopReason::NoFramePointer);
        }
        Self::take_frame_record(regs, fp, next_fp, ra)
    }

    /// Whether a return address found by the frame-pointer rule lies in executable code of a
    /// loaded object.
    fn plausible(&mut self, ra: usize, out: &mut Outcome) -> bool {
        if ra == 0 {
            return false;
        }
        if let Some(state) = self.state {
            if let Some(i) = state.find_near(ra, self.loaded.last) {
                return state.objects[i].is_code(ra - 1, 1);
            }
        }
        match sys::dl_find_object(ra) {
            Ok(Some(_)) => {
                if self.state.is_some() {
                    out.unknown_object = true;
                }
                true
            }
            Ok(None) => false,
            // Without `_dl_find_object` (musl, glibc < 2.35) and before `init()` nothing can
            // tell; the checked reads keep the walk safe.
            Err(()) => self.state.is_none(),
        }
    }

    /// The frame record at rbp: `[fp]` is the caller's frame pointer, `[fp + 8]` the return
    /// address (`push rbp; mov rbp, rsp`). `Err` carries the step that ends the walk; a zero
    /// frame pointer or return address is `zero` (the end of the chain, or no frame pointer).
    fn frame_record(&mut self, regs: &RegSet, zero: Step) -> Result<(usize, usize, usize), Step> {
        const W: usize = core::mem::size_of::<usize>();
        let Some(fp) = regs.fp() else {
            return Err(Step::Stop(StopReason::NoFramePointer));
        };
        if fp == 0 {
            return Err(zero);
        }
        if !fp.is_multiple_of(W) || fp < regs.sp() {
            return Err(Step::Stop(StopReason::NoFramePointer));
        }
        let (Some(next_fp), Some(ra)) = (self.mem.read_word(fp), self.mem.read_word(fp + W)) else {
            return Err(Step::Stop(StopReason::UnreadableMemory));
        };
        if ra == 0 {
            return Err(zero);
        }
        Ok((fp, next_fp, ra))
    }

    /// Moves `regs` to the caller found by [`Self::frame_record`]: where the other
    /// callee-saved registers were saved is unknown.
    fn take_frame_record(regs: &mut RegSet, fp: usize, next_fp: usize, ra: usize) -> Step {
        regs.keep_only(1 << dw::RSP | 1 << dw::RBP | 1 << dw::RA);
        regs.set(dw::RSP, fp + 2 * core::mem::size_of::<usize>());
        regs.set(dw::RBP, next_fp);
        regs.set(dw::RA, ra);
        Step::Caller { signal: false }
    }

    /// Frame-pointer mode (and any walk before `init()`): signal frames are recognised by the
    /// known trampolines, callers by the frame-pointer chain.
    fn fp_mode_step(&mut self, regs: &mut RegSet, exact: bool, out: &mut Outcome) -> Step {
        let pc = regs.pc();
        if !exact {
            let trampoline = match self.state {
                Some(s) => s.is_restorer(pc),
                None => {
                    matches!(sys::dl_find_object(pc), Ok(Some(_)) | Err(())) && is_trampoline_at(pc)
                }
            };
            if trampoline {
                return self.signal_frame(regs);
            }
        }
        if exact && out.frames == 1 && !matches!(sys::dl_find_object(pc), Ok(Some(_)) | Err(())) {
            return self.no_cfi_step(regs, exact, out, false);
        }
        let (fp, next_fp, ra) = match self.frame_record(regs, Step::End) {
            Ok(r) => r,
            Err(step) => return step,
        };
        if !self.plausible(ra, out) {
            return Step::Stop(StopReason::NoFramePointer);
        }
        Self::take_frame_record(regs, fp, next_fp, ra)
    }
}

/// Which objects of the snapshot this walk already checked with `_dl_find_object`.
#[derive(Default)]
struct LoadedCheck {
    checked: u64,
    failed: u64,
    /// The object of the previous frame (most frames are in the same object as their callee).
    last: usize,
}

impl LoadedCheck {
    /// Whether this walk already found object `i` still loaded.
    #[inline]
    fn verified(&self, i: usize) -> bool {
        i < 64 && (self.checked & !self.failed) & (1 << i) != 0
    }

    fn still_loaded(&mut self, state: &DwarfState, i: usize, pc: usize) -> bool {
        if i >= 64 {
            return state.still_loaded(i, pc);
        }
        let bit = 1u64 << i;
        if self.checked & bit == 0 {
            self.checked |= bit;
            if !state.still_loaded(i, pc) {
                self.failed |= bit;
            }
        }
        self.failed & bit == 0
    }
}

/// Whether the code at `pc` is the signal-return trampoline. The bytes are copied by the
/// kernel (`process_vm_readv`), so an object unmapped meanwhile gives `false`, never a fault.
fn is_trampoline_at(pc: usize) -> bool {
    const N: usize = regs::uc::TRAMPOLINE.len();
    let mut bytes = [0u8; N];
    sys::read_memory(pc, &mut bytes) == N && bytes[..] == *regs::uc::TRAMPOLINE
}

/// Target of the naked capture entry: `(buf, len, mode, out)` from the caller, plus the
/// caller's registers as they were at the call. Writes how the walk ended into `out` when it
/// is not null; returns the number of frames.
pub(crate) extern "C" fn capture_inner(
    buf: *mut usize,
    len: usize,
    mode: usize,
    regs: *const EntryRegs,
    out: *mut super::Walk,
) -> usize {
    let buf = if buf.is_null() || len == 0 {
        &mut [][..]
    } else {
        // SAFETY: the public wrappers pass a valid &mut [usize] split into pointer and length.
        unsafe { core::slice::from_raw_parts_mut(buf, len) }
    };
    // SAFETY: the naked entry passes a pointer to the EntryRegs it filled on its stack.
    let regs = unsafe { &*regs };
    let o = super::finish(
        &Start::Return(regs.to_set()),
        buf,
        UnwindMode::from_raw(mode),
    );
    if !out.is_null() {
        // SAFETY: the status entry points pass a pointer to their own live `Walk`.
        unsafe {
            *out = super::Walk {
                frames: o.frames,
                end: o.end,
            }
        };
    }
    o.frames
}

#[cfg(test)]
mod tests {
    use super::readable_word;

    #[test]
    fn the_one_comparison_stack_check_is_the_plain_one() {
        let start = 0x7ffd_1234_5000usize;
        for words in [0usize, 1, 7, 512, 1 << 20] {
            let span = words * 8;
            let mut probes = vec![0, 1, 7, 8, usize::MAX, usize::MAX - 7, 1 << 47, 1 << 63];
            for d in -80isize..=80 {
                probes.push(start.wrapping_add_signed(d));
                probes.push((start + span).wrapping_add_signed(d));
            }
            for a in probes {
                let plain = a >= start && a - start <= span && a % 8 == 0;
                assert_eq!(
                    readable_word(a, start, words),
                    plain,
                    "{a:#x}, {words} words"
                );
            }
        }
    }
}
