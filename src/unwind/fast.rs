//! The hot loop of DWARF mode: frames whose rule is cached in compiled form and whose reads
//! fall on the walking thread's own stack, stepped with a few loads each, and the reuse of the
//! thread's previous walk (join the record, replay its frames while the stack holds the words
//! they were read from). Anything else goes back to the general step ([`super::step`]).
//!
//! Size: over 600 lines, and `frames_loop` over 150, because that function (about 390 lines) is
//! the hot loop whose machine code the unwind benches pin; it stays whole until a split is shown
//! (by `objdump` of the release build and the benches) to generate the same code.
#![allow(unsafe_code)]

use super::arch::{self, FP, PC, SP};
use super::compact::{self, Compact};
use super::objects::{LoadedCheck, State};
use super::regs::RegSet;
use super::reuse;
use super::rule::{self, Kind, WORDS};
use super::types::{StopReason, Truncation, WalkEnd};

/// How [`fast_frames`] stopped.
pub(crate) enum Fast {
    /// The frame at `regs` (already written) needs the general step.
    Slow,
    /// The buffer is full.
    Full,
    /// The outermost frame.
    End,
    /// The walk cannot go on from the last frame written.
    Stop(StopReason),
}

impl Fast {
    /// How the walk ends, unless the general step goes on (`buf[..frames]` written so far).
    pub(crate) fn end(self, buf: &[usize], frames: usize) -> Option<WalkEnd> {
        match self {
            Fast::Slow => None,
            Fast::Full => Some(WalkEnd::BufferFull),
            Fast::End => Some(WalkEnd::Complete),
            Fast::Stop(reason) => Some(WalkEnd::Truncated(Truncation {
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
    state: &State,
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
    match state.find_for(at, loaded) {
        Some(i) if state.objects[i].permanent || loaded.verified(i) => {
            let o = &state.objects[i];
            if !o.is_code(at, 1) {
                return false;
            }
            loaded.enter(i);
            *start = o.range.start;
            *code = o.range.end - o.range.start;
            *current = o.range.clone();
            true
        }
        _ => false,
    }
}

/// The hot loop: steps frames whose pc (a return address) lies in `current` (an object this
/// walk checked is still loaded), whose rule is cached in compiled form, and whose reads fall
/// on this thread's own stack; writes each caller's pc into `buf`. Anything else goes back to
/// the general step, which handles it (and the errors) in full.
///
/// Unless `precise`, only rbp is restored from a save slot; a callee-saved register that a
/// frame saved becomes unknown (and `dropped` is set), which costs nothing unless a later frame
/// needs it: then the walk is repeated precisely (see `Job::run` in [`super::walk`]).
///
/// Runs of frames with compact rules go through [`compact_run`] unless the walk stages its
/// frames for a new record (then this loop steps them, comparing each with the record and
/// staging it); a walk with a record that does not stage runs up to the record frame where
/// the last walk joined it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn fast_frames(
    precise: bool,
    state: &State,
    loaded: &mut LoadedCheck,
    current: &mut core::ops::Range<usize>,
    stack: core::ops::Range<usize>,
    regs: &mut RegSet,
    buf: &mut [usize],
    n: &mut usize,
    limit: usize,
    dropped: &mut bool,
) -> Fast {
    // Two instances of the loop: the precise one, and one with the compact run.
    if precise {
        return frames_loop::<true, false>(
            None, state, loaded, current, stack, regs, buf, n, limit, dropped,
        );
    }
    // The record of this thread's previous walk (see `tail`): not in the precise walk, which
    // is rare and tracks registers a record does not hold.
    let claim = reuse::Claim::take(stack.end, state.generation);
    if claim.as_ref().is_none_or(reuse::Claim::runs) {
        frames_loop::<false, true>(claim, state, loaded, current, stack, regs, buf, n, limit, dropped)
    } else {
        frames_loop::<false, false>(claim, state, loaded, current, stack, regs, buf, n, limit, dropped)
    }
}

/// [`fast_frames`], with the walk's `claim` on its thread's record; with `RUN` (never with
/// `PRECISE`; the caller chooses it by [`reuse::Claim::runs`]), runs of compact frames go
/// through [`compact_run`]. Two instances, so that the loop of a walk that compares every
/// record frame or stages its own carries no call it does not make.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn frames_loop<const PRECISE: bool, const RUN: bool>(
    mut claim: Option<reuse::Claim>,
    state: &State,
    loaded: &mut LoadedCheck,
    current: &mut core::ops::Range<usize>,
    stack: core::ops::Range<usize>,
    regs: &mut RegSet,
    buf: &mut [usize],
    n: &mut usize,
    limit: usize,
    dropped: &mut bool,
) -> Fast {
    /// The frame pointer's lane bit (see [`arch::SAVED`]).
    const FP_LANE: u64 = 1 << arch::FP_LANE;
    const W: usize = core::mem::size_of::<usize>();
    const SP_: usize = SP as usize;
    const PC_: usize = PC as usize;
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
    // SAFETY: (for every `load` below) `ok` held for the address: aligned and on this thread's
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
    const BP: usize = FP as usize;
    let (mut pc, mut sp, mut bp) = (v[PC_], v[SP_], v[BP]);
    // A stack pointer only bounded from below (after a frame record on aarch64): the general
    // step handles the frame.
    if valid & (1 << SP_) == 0 {
        return Fast::Slow;
    }
    // usize::MAX marks "no record frame" below; sp stays under it in this loop (every step's
    // CFA is within a word or 2 KiB of a checked read, and a joined record's sp is one a
    // walk reached), so only a starting sp could equal it (a general step accepts any larger sp).
    if sp == usize::MAX {
        return Fast::Slow;
    }
    // The first pc's object; every later pc is checked before it is taken.
    if pc.wrapping_sub(start) >= code {
        match state.find_for(pc, loaded) {
            Some(i) if state.objects[i].permanent || loaded.verified(i) => {
                loaded.enter(i);
                let r = &state.objects[i].range;
                start = r.start;
                code = r.end - r.start;
                *current = r.clone();
            }
            _ => return Fast::Slow,
        }
    }
    let (record, mut stage, hint) = match claim.as_mut() {
        Some(c) => c.parts(),
        None => (&[][..], None, None),
    };
    let staging = stage.is_some();
    // One past the record frame to compare next (record frames lie outermost first, so their
    // sp falls as the index grows), and that frame's sp: the walk compares nothing before its
    // sp reaches it. A walk that does not stage starts at the frame where the last one joined
    // (see `Claim::parts`).
    let record_len = record.len();
    let mut cursor = hint.map_or(record_len, |h| h + 1);
    let mut next_sp = match cursor.checked_sub(1) {
        Some(i) => record[i].sp,
        None => usize::MAX,
    };
    // Frames of this loop staged for the next record, and the first that may be recorded.
    let mut staged = 0usize;
    let mut floor = 0usize;
    // Where the walk joined the record: the index of the record frame it reached.
    let mut joined = None;
    let mut reused = 0;
    // The CFA offset (in words) of the last compact frame: the next one's is predicted equal.
    let mut predicted = 0usize;
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
                                st[staged & (reuse::CAP - 1)] = reuse::Frame {
                                    bp,
                                    reads: (e.reads & !reuse::FLAGS)
                                        | (e.reads & reuse::BP_BASE)
                                        | (bp_valid as usize * reuse::BP_VALID),
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
                        let callee_saved = arch::lane_regs(rule::LANE_MASK);
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
        // With `RUN` (nothing to stage and no record frame to compare before the one the last
        // walks joined: see `Claim::runs`, which chose this instance), a run of compact frames
        // below the next record frame to compare (`next_sp`) goes through `compact_run`.
        if compact.is_some() && RUN {
            let mut run = Run {
                pc,
                sp,
                bp,
                valid,
                frames,
                dropped: false,
            };
            compact_run(
                state,
                loaded,
                (&mut start, &mut code, current),
                stack.start,
                // Reads below the next record frame to compare only: the run stops before a
                // frame at or above it, whose return address's slot lies there.
                words.min((next_sp.wrapping_sub(stack.start) / W).saturating_sub(1)),
                buf,
                &mut run,
            );
            if run.frames != frames {
                Run {
                    pc,
                    sp,
                    bp,
                    valid,
                    frames,
                    ..
                } = run;
                *dropped |= run.dropped;
                continue;
            }
        }
        let (cfa, ra_at, reg, slots, w) = match compact {
            Some(c) if c.rbp_based() => {
                if valid & (1 << BP) == 0 {
                    break Fast::Slow;
                }
                let cfa = bp.wrapping_add(c.cfa_words() * W);
                (cfa, cfa.wrapping_sub(W), BP, c.slots(), [0; WORDS])
            }
            Some(c) => {
                let cfa = predicted_cfa(sp, c, &mut predicted);
                (cfa, cfa.wrapping_sub(W), SP_, c.slots(), [0; WORDS])
            }
            None => {
                let Some(key) = rule::key(pc, false) else {
                    break Fast::Slow;
                };
                let w = if PRECISE {
                    cache.get_raw(key)
                } else {
                    cache.get_head(key).map(|[a, b]| {
                        let mut w = [0; WORDS];
                        (w[0], w[1]) = (a, b);
                        w
                    })
                };
                let Some(w) = w else {
                    break Fast::Slow;
                };
                if w[0] & rule::FAST_MASK != Kind::Cfi as u64 {
                    if w[0] & 0xf == Kind::End as u64 {
                        if let Some(st) = stage.as_deref_mut() {
                            st[staged & (reuse::CAP - 1)] = reuse::Frame {
                                pc,
                                sp,
                                bp,
                                reads: (valid >> BP) as usize & reuse::BP_VALID,
                            };
                            staged += 1;
                        }
                        break Fast::End;
                    }
                    break Fast::Slow;
                }
                let reg = rule::packed_reg(w[0]);
                let base = match reg {
                    SP_ => sp,
                    _ if valid & (1 << reg) == 0 => break Fast::Slow,
                    BP => bp,
                    _ => {
                        // A step that depends on a register a record does not hold: this frame and
                        // the ones below it are not recorded.
                        floor = staged + 1;
                        v[reg]
                    }
                };
                let cfa = base.wrapping_add(rule::packed_cfa_off(w[0]) as isize as usize);
                let ra_at = cfa.wrapping_add(rule::packed_ra_off(w[0]) as isize as usize);
                (cfa, ra_at, reg, rule::packed_slots(w[0]), w)
            }
        };
        if cfa <= sp || !ok(ra_at) {
            break Fast::Slow;
        }
        let at = |i: usize| {
            let off = rule::packed_lane(&w, i);
            cfa.wrapping_add(off as isize as usize)
        };
        let ra;
        if PRECISE {
            // Check every save slot before changing any register.
            let mut all = true;
            for i in 0..arch::LANES {
                if slots & (1 << i) != 0 {
                    all &= ok(at(i));
                }
            }
            if !all {
                break Fast::Slow;
            }
            ra = arch::strip_ra(load(ra_at));
            if ra == 0 || !trusted_code(state, loaded, &mut start, &mut code, current, ra) {
                break Fast::Slow;
            }
            v[BP] = bp;
            for (i, &r) in arch::SAVED.iter().enumerate() {
                if slots & (1 << i) != 0 {
                    v[r as usize] = load(at(i));
                    valid |= 1 << r;
                }
            }
            bp = v[BP];
        } else {
            let rbp_at = match compact {
                Some(c) => cfa.wrapping_sub(c.fp_words() * W),
                None => at(arch::FP_LANE),
            };
            if slots & FP_LANE != 0 && !ok(rbp_at) {
                break Fast::Slow;
            }
            ra = arch::strip_ra(load(ra_at));
            if ra == 0 || !trusted_code(state, loaded, &mut start, &mut code, current, ra) {
                break Fast::Slow;
            }
            if let Some(st) = stage.as_deref_mut() {
                let reads = reuse::Frame::reads(
                    ra_at,
                    if slots & FP_LANE != 0 { rbp_at } else { 0 },
                    ((valid >> BP) as usize & reuse::BP_VALID)
                        | ((reg == BP) as usize * reuse::BP_BASE),
                );
                match reads {
                    Some(reads) => {
                        st[staged & (reuse::CAP - 1)] = reuse::Frame { pc, sp, bp, reads };
                    }
                    // Not recordable: neither is anything below.
                    None => floor = staged + 1,
                }
                staged += 1;
            }
            if slots & FP_LANE != 0 {
                bp = load(rbp_at);
                valid |= 1 << BP;
            }
            // The registers of the other lanes become unknown.
            if slots & !FP_LANE != 0 {
                *dropped = true;
                valid &= !arch::lane_regs(slots);
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
                let at = st[f & (reuse::CAP - 1)].pc.wrapping_sub(1);
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
        c.complete(
            joined.is_some() && frames - *n > reused,
            joined.unwrap_or(0),
            hint.is_some(),
        );
    }
    v[PC_] = pc;
    v[SP_] = sp;
    v[BP] = bp;
    regs.valid = valid;
    *n = frames;
    end
}

/// The state [`compact_run`] walks with and leaves behind.
struct Run {
    pc: usize,
    sp: usize,
    bp: usize,
    valid: u64,
    frames: usize,
    /// A frame saved a callee-saved register other than rbp (now unknown).
    dropped: bool,
}

/// The CFA of a frame with compact rule `c` at stack pointer `sp`, the CFA offset predicted to
/// be `predicted` words (the previous compact frame's, which then becomes this one's).
///
/// The prediction is checked by a branch: while it holds, the processor runs ahead on the
/// branch and the CFA (so the next return address's load) does not wait for the load of the
/// rule word, so the frames' loads overlap instead of forming one chain of two dependent loads
/// per frame (the frames of a recursion, or of functions built alike, have equal offsets).
/// Where it fails the branch costs a misprediction. Either way the CFA is the one the rule
/// gives.
#[inline(always)]
fn predicted_cfa(sp: usize, c: Compact, predicted: &mut usize) -> usize {
    let words = c.cfa_words();
    if words == *predicted {
        let mut x = *predicted;
        // SAFETY: an empty asm statement (a comment): it reads and writes nothing but the
        // register that holds x, and leaves that as it was. Not `pure`, so it stays on this
        // branch; it hides that x equals `words`, so the compiler cannot use the loaded value
        // here (and make the branch a conditional move).
        unsafe { core::arch::asm!("/* {0} */", inout(reg) x, options(nomem, nostack, preserves_flags)) };
        sp.wrapping_add(x * core::mem::size_of::<usize>())
    } else {
        *predicted = words;
        sp.wrapping_add(words * core::mem::size_of::<usize>())
    }
}

/// Whether every pc in the code range (`start`, `len`) and its end may have a compact rule
/// (see [`RuleCache::compact_below`](super::cache::RuleCache::compact_below)).
#[inline(always)]
fn compact_range(start: usize, len: usize) -> bool {
    start >= compact::LOW && start.checked_add(len).is_some_and(|end| end < compact::HIGH)
}

/// Steps frames while each one's rule is in the compact table, its reads fall on this thread's
/// stack (at or above the walk's sp, at most `words` words above `stack_start`) and its return address lies in code
/// this walk may trust (the current object's, `start` and `code`, or another's, which then
/// becomes the current one, as in [`trusted_code`]), writing each caller's pc into `buf`;
/// stops at the first frame that is not such, or when `buf` is full, with `run` at that frame
/// (which the caller then steps in full, or joins to its record: the caller bounds `words`
/// below the next record frame it compares). The same steps as the compact case of
/// [`fast_frames`], in a loop of its own whose few values stay in registers, with the CFA
/// offsets predicted ([`predicted_cfa`]).
#[inline(never)]
fn compact_run(
    state: &State,
    loaded: &mut LoadedCheck,
    (start_out, code_out, current): (&mut usize, &mut usize, &mut core::ops::Range<usize>),
    stack_start: usize,
    words: usize,
    buf: &mut [usize],
    run: &mut Run,
) {
    const W: usize = core::mem::size_of::<usize>();
    const FP_LANE: u64 = 1 << arch::FP_LANE;
    const BP: usize = FP as usize;
    // SAFETY: (for every `load` below) the address is aligned and on this thread's own live
    // stack, between the walk's stack pointer and the highest word the caller allows (see the
    // loop's bounds).
    let load = |a: usize| unsafe { core::ptr::read_volatile(a as *const usize) };
    let cache = &state.cache;
    let (mut start, mut code) = (*start_out, *code_out);
    let Run {
        mut pc,
        mut sp,
        bp: bp_in,
        mut valid,
        frames: frames_in,
        mut dropped,
    } = *run;
    // Every pc this loop looks up may have a compact rule (see `RuleCache::compact_below`): the
    // first was found in the table, each later one lies in the current object's code.
    // The reads: a frame's CFA is its base (sp, or rbp at or above sp) plus at least one word,
    // both aligned, so the return address's slot (CFA - 8) and rbp's (between the base and it:
    // a compact rule's slot is within its frame, `Compact::fp_words` at most `cfa_words`) lie
    // at or above sp, which only grows, from at or above `stack_start`; and the CFA is at most
    // `max_cfa`, so that they lie at or below the highest word allowed. Two comparisons a
    // frame, of values in registers.
    let Some(max_cfa) = words
        .checked_mul(W)
        .and_then(|b| stack_start.checked_add(b))
        .and_then(|hi| hi.checked_add(W))
    else {
        return;
    };
    if !compact_range(start, code) || sp < stack_start || !sp.is_multiple_of(W) {
        return;
    }
    // rbp unknown is 0 here, which no base check lets through (sp is above it).
    let mut bp = if valid & (1 << BP) != 0 { bp_in } else { 0 };
    let mut out = buf.get_mut(frames_in..).unwrap_or_default().iter_mut();
    let room = out.len();
    let mut predicted = 0usize;
    // The rules of the run's frames, OR-ed whole (one instruction a frame): their slot bits are
    // the lanes the frames saved, whose registers become unknown, once at the end (the loop
    // reads only rbp, whose validity only a restore changes).
    let mut lost = Compact::NONE;
    // The pc at the end is the last return address stored (or the first pc if none was): the
    // loop keeps no copy of the previous pc for its exits, one value fewer live across it
    // (measured with the OR above: the first walk 0.47-0.48x -> 0.45-0.47x libunwind, median
    // of interleaved rounds).
    let pc_in = pc;
    while let Some(c) = cache.compact_below(pc) {
        let cfa = if c.rbp_based() {
            // rbp known (not 0), aligned and at or above sp.
            if bp < sp || !bp.is_multiple_of(W) {
                break;
            }
            bp.wrapping_add(c.cfa_words() * W)
        } else {
            predicted_cfa(sp, c, &mut predicted)
        };
        if cfa <= sp || cfa > max_cfa {
            break;
        }
        let ra = arch::strip_ra(load(cfa - W));
        // A return address in another object: one this walk may trust (as in the caller),
        // whose code may have compact rules too.
        if ra.wrapping_sub(1).wrapping_sub(start) >= code {
            let go;
            (go, start, code) = enter_code(state, loaded, current, (start, code), ra);
            if !go {
                break;
            }
        }
        let Some(slot) = out.next() else {
            break;
        };
        *slot = ra;
        if c.saves_fp() {
            bp = load(cfa.wrapping_sub(c.fp_words() * W));
        }
        lost = lost.or(c);
        // Registers without a rule keep their values (see `cfi::eval_row`).
        pc = ra;
        sp = cfa;
    }
    let stored = room - out.len();
    let frames = frames_in + stored;
    let pc = if stored == 0 {
        pc_in
    } else {
        // SAFETY: the loop stored `stored` (at least one) return addresses into
        // `buf[frames_in..]`, the last at `frames - 1`, which is inside `buf`.
        unsafe { *buf.get_unchecked(frames - 1) }
    };
    let lost = lost.slots();
    // rbp is known after a frame restored it; the registers of the other lanes are unknown
    // (`lane_regs` leaves rbp out).
    let bp = if lost & FP_LANE != 0 {
        valid |= 1 << BP;
        bp
    } else {
        bp_in
    };
    dropped |= lost & !FP_LANE != 0;
    valid &= !arch::lane_regs(lost);
    (*start_out, *code_out) = (start, code);
    *run = Run {
        pc,
        sp,
        bp,
        valid,
        frames,
        dropped,
    };
}

/// Enters the object of return address `ra` (not in the current object's code, `start` and
/// `code`) if this walk may trust it ([`trusted_code`]): returns whether the run goes on there
/// (its pcs may have compact rules too) and the code range, which moves with `current` (also
/// when the run stops at the new object: then `start`, `code` and `current` are all its).
/// Out of [`compact_run`]'s loop, so that the loop's code range stays in registers.
#[cold]
#[inline(never)]
fn enter_code(
    state: &State,
    loaded: &mut LoadedCheck,
    current: &mut core::ops::Range<usize>,
    (mut start, mut code): (usize, usize),
    ra: usize,
) -> (bool, usize, usize) {
    let go = ra != 0
        && trusted_code(state, loaded, &mut start, &mut code, current, ra)
        && compact_range(start, code);
    (go, start, code)
}

/// Whether `a` is an aligned address of a word that lies within `words` words above `start`
/// (aligned): `a - start`, wrapping, rotated right by 3 so that a misaligned address's low
/// bits become high bits, compared once. The same as `a >= start && a - start <= 8 * words &&
/// a % 8 == 0` for user-space addresses.
#[inline(always)]
pub(crate) fn readable_word(a: usize, start: usize, words: usize) -> bool {
    const W: usize = core::mem::size_of::<usize>();
    a.wrapping_sub(start).rotate_right(W.trailing_zeros()) <= words
}

/// Joins record frame `r`, whose pc and sp are the walk's, if rbp agrees where a step above
/// depends on it (and whether rbp is known): takes the frames above it from the record (see
/// [`replay`]). Returns the record frame joined, the one reached, how the replay stopped and the new frame count.
#[inline(never)]
fn join(
    record: &[reuse::Frame],
    r: usize,
    bp: usize,
    valid: u64,
    ok: &impl Fn(usize) -> bool,
    buf: &mut [usize],
    frames: usize,
) -> Option<(usize, usize, Replayed, usize)> {
    let e = &record[r];
    let bp_valid = valid & (1 << FP) != 0;
    // rbp must be the recorded one only where a step above depends on it (see `tail`).
    let bp_same = e.reads & reuse::BP_NEEDED == 0
        || (e.bp == bp && (e.reads & reuse::BP_VALID != 0) == bp_valid);
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
    record: &[reuse::Frame],
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
            && arch::strip_ra(unsafe { core::ptr::read_volatile(ra_at as *const usize) })
                == caller.pc
            && e.rbp_at().is_none_or(|rbp_at| {
                ok(rbp_at)
                    // SAFETY: `ok(rbp_at)` held (see above).
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
