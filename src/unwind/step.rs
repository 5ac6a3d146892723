//! The general step: one frame of any kind, with every check. It handles what the hot loops
//! hand back: a rule not cached yet (derived from the CFI and cached), rules that only the full
//! evaluator handles, signal trampolines (continue from the `ucontext_t` the kernel saved),
//! code without CFI (the frame-pointer rule, accepted only when the return address lies in code
//! of a loaded object), frames read through the kernel's copy, and every error.

use super::arch::{self, BadPcReturn, FP, SP};
use super::cfi::{self, Ctx};
use super::memory::CheckedMemory;
use super::objects::{LoadedCheck, State};
use super::outcome::Outcome;
use super::regs::RegSet;
use super::rule::{self, Kind, Rule, SAME, UNDEF};
use super::stats;
use super::tables::UnwindData;
use super::types::{StopReason, UnwindMode};
use crate::sys;

/// What one step found.
pub(crate) enum Step {
    /// `regs` now holds the caller's frame; `signal` when it came from a `ucontext_t` (its pc
    /// is exact).
    Caller { signal: bool },
    /// The outermost frame.
    End,
    /// The walk cannot go on.
    Stop(StopReason),
}

/// The per-walk state of the stepping.
pub(crate) struct Walker<'s, 'w> {
    pub(crate) state: Option<&'s State>,
    /// The state, in DWARF mode (the fast path's rule cache).
    pub(crate) fast: Option<&'s State>,
    /// The object of the previous frame, checked to be still loaded in this walk.
    pub(crate) current: core::ops::Range<usize>,
    pub(crate) mem: CheckedMemory<'w>,
    pub(crate) ctx: Option<&'w mut Ctx>,
    pub(crate) loaded: LoadedCheck,
    pub(crate) mode: UnwindMode,
}

impl Walker<'_, '_> {
    /// One step of any kind.
    #[inline(never)]
    pub(crate) fn step(&mut self, regs: &mut RegSet, exact: bool, out: &mut Outcome) -> Step {
        let pc = regs.pc();
        let state = match self.state {
            Some(s) if self.mode == UnwindMode::Dwarf => s,
            _ => return self.fp_mode_step(regs, exact, out),
        };
        match state.find_for(pc, &self.loaded) {
            Some(i) => {
                self.loaded.enter(i);
                if self.loaded.still_loaded(state, i, pc) {
                    self.current = state.objects[i].range.clone();
                    return self.cfi_step(state, i, regs, exact, out);
                }
                // Unloaded since the snapshot (and maybe another object loaded there): its
                // tables may be gone or another object's; only the checked frame-pointer rule
                // applies. In normal context the capture refreshes and walks again.
                out.unknown_object = true;
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
                // A trampoline outside every object too: qemu-user's, and a JIT's.
                if !exact && is_trampoline_at(pc) {
                    return self.signal_frame(regs);
                }
                self.no_cfi_step(regs, exact, out, in_object)
            }
        }
    }

    /// A frame in object `i` of the state, by its (cached) CFI rule.
    fn cfi_step(
        &mut self,
        state: &State,
        i: usize,
        regs: &mut RegSet,
        exact: bool,
        out: &mut Outcome,
    ) -> Step {
        let pc = regs.pc();
        let o = &state.objects[i];
        let lookup = if exact { pc } else { pc.wrapping_sub(1) };
        let Some(key) = rule::key(pc, exact) else {
            // No instruction starts there.
            return Step::Stop(StopReason::BadReturnAddress);
        };
        let mut evaluated = None;
        let mut new = *regs;
        let rule = match state.cache.get(key) {
            Some(r) => r,
            None => {
                let r = if !exact && o.is_code(pc, arch::TRAMPOLINE.len()) && is_trampoline_at(pc) {
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
                                cfi::Found::Rule(r) => r,
                                cfi::Found::NoCfi => Rule::of(Kind::NoCfi),
                                cfi::Found::Bad => Rule::of(Kind::Bad),
                            }
                        }
                    }
                };
                stats::bump(&stats::DERIVED);
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
                Some(result) => self.accept_full(result, new, regs, exact, out),
                None => self.full_step(o.unwind.as_ref(), lookup, regs, exact, out),
            },
        }
    }

    /// Applies a compiled rule, in place.
    #[inline(always)]
    fn apply(&mut self, rule: &Rule, regs: &mut RegSet, out: &mut Outcome) -> Step {
        let cfa = match regs.get(rule.cfa_reg as u16) {
            Some(base) => base.wrapping_add(rule.cfa_off as isize as usize),
            None => match cfa_from_frame_record(rule, regs) {
                Some(cfa) => cfa,
                None => return Step::Stop(StopReason::RegisterUnknown),
            },
        };
        if cfa <= regs.sp() {
            return Step::Stop(StopReason::NoProgress);
        }
        let Some(ra) = self
            .mem
            .read_word(cfa.wrapping_add(rule.ra_off as isize as usize))
        else {
            return Step::Stop(StopReason::UnreadableMemory);
        };
        let ra = arch::strip_ra(ra);
        // Read every save slot before changing a register.
        let mut saved = [0usize; arch::LANES];
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
        for ((&r, &how), &v) in arch::SAVED.iter().zip(&rule.saved).zip(&saved) {
            match how {
                SAME => {}
                UNDEF => regs.forget(r),
                _ => regs.set(r, v),
            }
        }
        regs.set(SP, cfa);
        regs.set_return(ra);
        Step::Caller { signal: false }
    }

    /// The full CFI evaluator, for rules that do not compile.
    fn full_step(
        &mut self,
        data: Option<&UnwindData>,
        lookup: usize,
        regs: &mut RegSet,
        exact: bool,
        out: &mut Outcome,
    ) -> Step {
        let (Some(data), Some(ctx)) = (data, self.ctx.as_deref_mut()) else {
            return Step::Stop(StopReason::Busy);
        };
        let mut new = *regs;
        let result = data.step_full(ctx, lookup, &mut new, &mut self.mem);
        self.accept_full(result, new, regs, exact, out)
    }

    /// Takes the full evaluator's result for the frame at `regs` (`new`: the caller's
    /// registers) if it is sane. The stack pointer must grow, except from an exact frame (frame
    /// 0, or an interrupted one) on a machine with a link register: a leaf that has not touched
    /// the stack returns to the link register with the same sp. The frame after it is a return
    /// address's, which must make progress again, so a walk cannot stand still.
    fn accept_full(
        &mut self,
        result: Result<bool, StopReason>,
        new: RegSet,
        regs: &mut RegSet,
        exact: bool,
        out: &mut Outcome,
    ) -> Step {
        let old_sp = regs.sp();
        match result {
            Ok(false) => Step::End,
            Ok(true) => {
                let leaf = exact && arch::LR.is_some() && new.sp() == old_sp;
                if new.sp() <= old_sp && !leaf {
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
        let uc = regs.sp().wrapping_add(arch::UC_FROM_TRAMPOLINE_SP);
        let mem = &mut self.mem;
        match RegSet::from_ucontext(|off| mem.read_word(uc.wrapping_add(off))) {
            Some(r) if r.pc() != 0 && r.sp() != 0 => {
                *regs = r;
                Step::Caller { signal: true }
            }
            _ => Step::Stop(StopReason::BadSignalFrame),
        }
    }

    /// A pc with no CFI: the frame-pointer rule, accepted only when the return address it
    /// finds lies in code of a loaded object. A first frame outside any object (a call through
    /// a bad function pointer) has its return address where the call left it
    /// ([`arch::BAD_PC_RETURN`]: on top of the stack, or in the link register).
    fn no_cfi_step(
        &mut self,
        regs: &mut RegSet,
        exact: bool,
        out: &mut Outcome,
        in_object: bool,
    ) -> Step {
        const W: usize = core::mem::size_of::<usize>();
        if exact && in_object {
            if let Some(step) = self.link_stub_step(regs, out) {
                return step;
            }
        }
        if exact && out.frames == 1 && !in_object {
            let (ra, sp) = match (arch::BAD_PC_RETURN, arch::LR) {
                (BadPcReturn::LinkRegister, Some(lr)) => match regs.get(lr) {
                    Some(ra) => (arch::strip_ra(ra), regs.sp()),
                    None => return Step::Stop(StopReason::RegisterUnknown),
                },
                _ => match self.mem.read_word(regs.sp()) {
                    Some(ra) => (ra, regs.sp().wrapping_add(W)),
                    None => return Step::Stop(StopReason::UnreadableMemory),
                },
            };
            if !self.plausible(ra, out) {
                return Step::Stop(StopReason::NoFramePointer);
            }
            regs.keep_only(arch::CALLEE_SAVED);
            regs.set(SP, sp);
            regs.set_return(ra);
            return Step::Caller { signal: false };
        }
        let (fp, next_fp, ra) =
            match self.frame_record(regs, Step::Stop(StopReason::NoFramePointer)) {
                Ok(r) => r,
                Err(step) => return step,
            };
        // An interrupted pc on a machine with a link register: a function without a frame
        // record of its own (a leaf) returns through the link register, and the record at the
        // frame pointer is its caller's; one with a record has its return address there.
        if let Some(lr) = arch::LR.filter(|_| exact) {
            let x30 = regs.get(lr).map(arch::strip_ra);
            if let Some(x30) = x30.filter(|&x| x != ra) {
                let state = self.state;
                let has_cfi = |at: usize| {
                    state.is_some_and(|s| {
                        s.find_near(at, 0).is_some_and(|i| {
                            s.objects[i].unwind.as_ref().is_some_and(|u| u.covers(at))
                        })
                    })
                };
                match leaf_or_record(regs.pc(), x30, ra, has_cfi) {
                    Some(true) => {
                        if !self.plausible(x30, out) {
                            return Step::Stop(StopReason::BadReturnAddress);
                        }
                        regs.keep_only(arch::CALLEE_SAVED);
                        regs.set_return(x30);
                        return Step::Caller { signal: false };
                    }
                    Some(false) => {}
                    None => return Step::Stop(StopReason::AmbiguousReturn),
                }
            }
        }
        if !self.plausible(ra, out) {
            return Step::Stop(StopReason::NoFramePointer);
        }
        Self::take_frame_record(regs, fp, next_fp, ra)
    }

    /// An exact pc in a PLT entry (aarch64's have no CFI): the caller's return address is still
    /// in the link register, and the stack is untouched. The frame-pointer rule would take the
    /// caller's own frame record and leave the caller out. `None` where the pc is not in one.
    fn link_stub_step(&mut self, regs: &mut RegSet, out: &mut Outcome) -> Option<Step> {
        let lr = arch::LR.filter(|_| in_link_stub(regs.pc()))?;
        let Some(ra) = regs.get(lr) else {
            return Some(Step::Stop(StopReason::RegisterUnknown));
        };
        let ra = arch::strip_ra(ra);
        if !self.plausible(ra, out) {
            return Some(Step::Stop(StopReason::BadReturnAddress));
        }
        regs.keep_only(arch::CALLEE_SAVED);
        regs.set_return(ra);
        Some(Step::Caller { signal: false })
    }

    /// Whether a return address lies in executable code of a loaded object, or is a signal
    /// trampoline.
    fn plausible(&mut self, ra: usize, out: &mut Outcome) -> bool {
        if ra == 0 || !ra.is_multiple_of(arch::CODE_ALIGN) {
            return false;
        }
        if let Some(state) = self.state {
            if let Some(i) = state.find_for(ra, &self.loaded) {
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
            // Outside every object: only a signal trampoline there is code we know (qemu-user
            // maps its own on an anonymous page; so can a JIT).
            Ok(None) => is_trampoline_at(ra),
            // Without `_dl_find_object` (musl, glibc < 2.35) and before `init()` nothing can
            // tell; the checked reads keep the walk safe.
            Err(()) => self.state.is_none(),
        }
    }

    /// The frame record at the frame pointer: `[fp]` is the caller's frame pointer, `[fp + 8]`
    /// the return address (x86-64's `push rbp; mov rbp, rsp`, aarch64's `stp x29, x30`). `Err`
    /// carries the step that ends the walk; a zero frame pointer or return address is `zero`
    /// (the end of the chain, or no frame pointer).
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
        let ra_at = fp.checked_add(W);
        let (Some(next_fp), Some(ra)) = (
            self.mem.read_word(fp),
            ra_at.and_then(|a| self.mem.read_word(a)),
        ) else {
            return Err(Step::Stop(StopReason::UnreadableMemory));
        };
        let ra = arch::strip_ra(ra);
        if ra == 0 {
            return Err(zero);
        }
        Ok((fp, next_fp, ra))
    }

    /// Moves `regs` to the caller found by [`Self::frame_record`]: where the other
    /// callee-saved registers were saved is unknown. The caller's stack pointer is the record's
    /// end where the record sits at the top of the frame (x86-64); elsewhere it is unknown, the
    /// record's end only a lower bound (kept for the progress checks; a rule based on it stops).
    fn take_frame_record(regs: &mut RegSet, fp: usize, next_fp: usize, ra: usize) -> Step {
        regs.keep_only(1 << SP | 1 << FP);
        regs.set(SP, fp + 2 * core::mem::size_of::<usize>());
        if !arch::RECORD_GIVES_SP {
            regs.forget(SP);
        }
        regs.set(FP, next_fp);
        regs.set_return(ra);
        Step::Caller { signal: false }
    }

    /// Frame-pointer mode (and any walk before `init()`): signal frames are recognised by the
    /// known trampolines, callers by the frame-pointer chain.
    fn fp_mode_step(&mut self, regs: &mut RegSet, exact: bool, out: &mut Outcome) -> Step {
        let pc = regs.pc();
        if !exact {
            let trampoline = match self.state {
                Some(s) => s.is_restorer(pc) || (s.find(pc).is_none() && is_trampoline_at(pc)),
                None => is_trampoline_at(pc),
            };
            if trampoline {
                return self.signal_frame(regs);
            }
        }
        if exact && out.frames == 1 && !matches!(sys::dl_find_object(pc), Ok(Some(_)) | Err(())) {
            return self.no_cfi_step(regs, exact, out, false);
        }
        if exact {
            if let Some(step) = self.link_stub_step(regs, out) {
                return step;
            }
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

/// For an interrupted pc without CFI whose link register (`lr`) and frame record (`record`)
/// hold different return addresses: `Some(true)` when the function is a leaf without a record
/// of its own (it returns through the link register), `Some(false)` when the record is its own,
/// `None` when nothing tells. Told by the calls before the two return addresses: a `bl` (or a
/// `bl` to a PLT entry, followed through its GOT slot) whose target starts the function at `pc`
/// (at or below it, within 64 KiB, and without CFI: `pc` has none, so a function that has CFI
/// at its start is another one) entered it; one whose target lies elsewhere did not; an
/// indirect call (`blr`) proves nothing. The nearest start wins where both entered one.
/// (`has_cfi` tells whether an FDE covers an address.)
fn leaf_or_record(
    pc: usize,
    lr: usize,
    record: usize,
    has_cfi: impl Fn(usize) -> bool,
) -> Option<bool> {
    use Entered::*;
    match (entered(lr, pc, &has_cfi), entered(record, pc, &has_cfi)) {
        (Yes(l), Yes(r)) => Some(l > r),
        (Yes(_), _) | (Unknown, No) => Some(true),
        (_, Yes(_)) | (No, Unknown) => Some(false),
        (No, No) | (Unknown, Unknown) => None,
    }
}

/// Whether the call before a return address entered the function at a pc.
enum Entered {
    /// A call to this start, at or below the pc.
    Yes(usize),
    /// A direct call to somewhere else.
    No,
    /// An indirect call, or no call to decode.
    Unknown,
}

/// What the call before return address `ret` says of the function at `pc` (aarch64 code, read
/// through the kernel), which no CFI covers.
fn entered(ret: usize, pc: usize, has_cfi: &impl Fn(usize) -> bool) -> Entered {
    let word = |at: usize| {
        let mut b = [0u8; 4];
        (sys::read_memory(at, &mut b) == 4).then(|| u32::from_le_bytes(b))
    };
    let Some(w) = ret.checked_sub(4).and_then(word) else {
        return Entered::Unknown;
    };
    // bl imm26
    if w & 0xfc00_0000 != 0x9400_0000 {
        return Entered::Unknown;
    }
    let at = ret - 4;
    let mut target = at.wrapping_add((((w << 6) as i32 >> 6) as isize * 4) as usize);
    // A PLT entry: where its GOT slot points (the resolved function, or the lazy resolver).
    let stub = arch::LINK_STUB;
    if let (Some(adrp), Some(ldr)) = (word(target), word(target.wrapping_add(4))) {
        if stub.len() >= 2 && adrp & stub[0].0 == stub[0].1 && ldr & stub[1].0 == stub[1].1 {
            let imm = ((adrp >> 5) & 0x7ffff) << 2 | (adrp >> 29) & 3;
            let pages = ((imm << 11) as i32 >> 11) as isize;
            let page = (target & !0xfff).wrapping_add((pages << 12) as usize);
            let slot = page.wrapping_add(((ldr >> 10) & 0xfff) as usize * 8);
            let mut b = [0u8; 8];
            if sys::read_memory(slot, &mut b) != 8 {
                return Entered::Unknown;
            }
            target = usize::from_le_bytes(b);
        }
    }
    // A call to a function with CFI did not enter the one at pc (libcrypto's GHASH leaves,
    // without CFI, follow CRYPTO_gcm128_finish, which has it, within 64 KiB).
    if target <= pc && pc - target < 1 << 16 && !has_cfi(target) {
        Entered::Yes(target)
    } else {
        Entered::No
    }
}

/// Whether `pc` lies in a stub without CFI that returns through the link register
/// ([`arch::LINK_STUB`]): the instructions around it (read through the kernel) are the stub's,
/// `pc` on one of them.
fn in_link_stub(pc: usize) -> bool {
    let stub = arch::LINK_STUB;
    if stub.is_empty() {
        return false;
    }
    let n = stub.len();
    let mut bytes = [0u8; 8 * 4];
    let start = pc.wrapping_sub(4 * (n - 1));
    let got = sys::read_memory(start, &mut bytes[..4 * (2 * n - 1)]);
    let word = |i: usize| {
        bytes
            .get(4 * i..4 * i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    // The stub starting at one of the n instruction slots up to pc.
    (0..n).any(|first| {
        (0..n).all(|k| {
            let i = first + k;
            4 * i + 4 <= got && word(i).is_some_and(|w| w & stub[k].0 == stub[k].1)
        })
    })
}

/// The CFA of a frame whose stack pointer is unknown (after a frame-record step on aarch64,
/// where a record does not say where the caller's frame ends), from its frame pointer: when the
/// frame's rule is sp-based and saves the frame pointer and, just above it, the return address
/// (a frame record: `stp x29, x30`), the frame pointer holds the address of that record, as the
/// frame-pointer rule that led here assumed of the frame below.
fn cfa_from_frame_record(rule: &Rule, regs: &RegSet) -> Option<usize> {
    if arch::RECORD_GIVES_SP || rule.cfa_reg as u16 != SP {
        return None;
    }
    let fp_slot = rule.saved[arch::FP_LANE];
    if fp_slot == SAME || fp_slot == UNDEF || rule.ra_off as i32 != fp_slot as i32 + 8 {
        return None;
    }
    let fp = regs.fp()?;
    // The record lies at or above the lower bound the record step left for sp.
    (fp >= regs.sp()).then(|| fp.wrapping_sub(fp_slot as isize as usize))
}

/// Whether the code at `pc` is the signal-return trampoline. The bytes are copied by the
/// kernel (`process_vm_readv`), so an object unmapped meanwhile gives `false`, never a fault.
pub(crate) fn is_trampoline_at(pc: usize) -> bool {
    const N: usize = arch::TRAMPOLINE.len();
    let mut bytes = [0u8; N];
    pc.is_multiple_of(arch::CODE_ALIGN)
        && sys::read_memory(pc, &mut bytes) == N
        && bytes[..] == *arch::TRAMPOLINE
}
