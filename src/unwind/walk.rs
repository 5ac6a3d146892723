//! The walk: one loop for every entry point and both modes.
//!
//! Per frame it records the pc, then
//! 1. if the pc is a signal trampoline (`__restore_rt`), continues from the `ucontext_t` the
//!    kernel saved on the stack: the interrupted pc (exact) and its registers;
//! 2. otherwise steps to the caller with framehop's DWARF CFI (in DWARF mode, for objects still
//!    loaded, with framehop falling back to frame pointers where there is no CFI), or with the
//!    frame-pointer rule.
//!
//! Every memory read goes through [`CheckedMemory`]; the stack pointer must grow at every step
//! (except across a signal frame, which may switch stacks); walks stop at the buffer's end,
//! after [`MAX_FRAMES`] frames or [`MAX_SIGNAL_FRAMES`] signal frames.

use super::dwarf::{self, CacheGuard, DwarfState, FhRegs};
use super::mem::CheckedMemory;
use super::regs::{self, Regs};
use super::UnwindMode;
use crate::sys;
use framehop::{FrameAddress, Unwinder};

/// The most frames one walk produces, whatever the buffer size.
pub const MAX_FRAMES: usize = 1 << 16;
/// The most signal frames one walk crosses.
pub const MAX_SIGNAL_FRAMES: usize = 16;

/// How a walk ended.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Outcome {
    /// Frames written.
    pub(crate) frames: usize,
    /// The walk reached the root of the stack (not cut short by the buffer or an error).
    pub(crate) complete: bool,
    /// The walk crossed a signal trampoline: it ran inside a signal handler.
    pub(crate) signal_frames: usize,
    /// A pc lay in an object the loader knows but the published snapshot does not.
    pub(crate) unknown_object: bool,
    /// `init()` had published an unwinder when the walk ran.
    pub(crate) initialized: bool,
}

/// The first frame of a walk.
#[derive(Clone, Copy)]
pub(crate) enum Start {
    /// `regs.pc` is exact (an interrupted pc or a caller-supplied state).
    Exact(Regs),
    /// `regs.pc` is a return address (the caller of a capture function).
    Return(Regs),
}

pub(crate) fn walk(start: Start, buf: &mut [usize], mode: UnwindMode) -> Outcome {
    if buf.is_empty() {
        return Outcome::default();
    }
    let sp = match start {
        Start::Exact(r) | Start::Return(r) => r.sp,
    };
    dwarf::with_state(|state| {
        // A slot from the pool: a rule cache and a private stack to walk on. Without one (before
        // init, or all busy) the walk uses frame pointers, on the caller's stack.
        let mut slot = state.and_then(|_| CacheGuard::claim(sp >> 12));
        let top = slot.as_ref().map_or(0, CacheGuard::stack_top);
        let mut job = Job {
            start,
            buf,
            state,
            cache: if mode == UnwindMode::Dwarf {
                slot.as_mut()
            } else {
                None
            },
            out: Outcome::default(),
        };
        job.out.initialized = state.is_some();
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

/// Everything one walk needs, passed through [`sys::call_on_stack`].
struct Job<'a, 'b> {
    start: Start,
    buf: &'a mut [usize],
    state: Option<&'b DwarfState>,
    cache: Option<&'a mut CacheGuard>,
    out: Outcome,
}

extern "C" fn run_job(job: *mut libc::c_void) {
    // SAFETY: `walk` passes a pointer to its live Job and waits for us to return.
    let job = unsafe { &mut *(job as *mut Job<'_, '_>) };
    job.run();
}

impl Job<'_, '_> {
    fn run(&mut self) {
        let (mut regs, mut exact) = match self.start {
            Start::Exact(r) => (r, true),
            Start::Return(r) => (r, false),
        };
        let mut mem = CheckedMemory::new(regs.sp);
        let state = self.state;
        let buf = &mut *self.buf;
        let out = &mut self.out;
        let mut cache = self.cache.as_deref_mut();
        let mut loaded = LoadedCheck::default();
        let mut fh = to_framehop(&regs);
        let limit = buf.len().min(MAX_FRAMES);
        loop {
            buf[out.frames] = regs.pc;
            out.frames += 1;
            let known = classify(state, &mut loaded, &mut mem, regs.pc, out);
            if !exact && known.is_code && is_trampoline(regs.pc) {
                if out.signal_frames == MAX_SIGNAL_FRAMES || out.frames == limit {
                    break;
                }
                let uc = regs.sp + regs::uc::FROM_TRAMPOLINE_SP;
                match read_ucontext(&mut mem, uc) {
                    Some(r) => {
                        out.signal_frames += 1;
                        regs = r;
                        exact = true;
                        continue;
                    }
                    None => break,
                }
            }
            if out.frames == limit {
                break;
            }
            let step = match (state, cache.as_deref_mut()) {
                (Some(state), Some(cache)) if known.usable => {
                    dwarf_step(state, cache, &mut mem, &mut regs, &mut fh, exact)
                }
                _ => fp_step(&mut mem, &mut regs, exact),
            };
            // A first frame outside any object (a call through a bad function pointer): the
            // return address is still on top of the stack.
            let step = match step {
                Step::Failed if exact && out.frames == 1 && !known.in_object => {
                    call_through_bad_pointer(&mut mem, &mut regs)
                }
                s => s,
            };
            match step {
                Step::Caller(ra) => {
                    regs.pc = ra;
                    exact = false;
                }
                Step::End => {
                    out.complete = true;
                    break;
                }
                Step::Failed => break,
            }
        }
    }
}

/// What is known about a pc.
struct Known {
    /// framehop may read the unwind data of the object containing the pc (it is still loaded),
    /// or the pc is in no object of the snapshot (framehop then uses frame pointers).
    usable: bool,
    /// The pc lies in executable code of a loaded object (checked), so its bytes can be read.
    is_code: bool,
    /// The pc lies in some loaded object.
    in_object: bool,
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

fn classify(
    state: Option<&DwarfState>,
    loaded: &mut LoadedCheck,
    mem: &mut CheckedMemory,
    pc: usize,
    out: &mut Outcome,
) -> Known {
    const N: usize = regs::uc::TRAMPOLINE.len();
    if let Some(state) = state {
        if let Some(i) = state.find_near(pc, loaded.last) {
            loaded.last = i;
            let usable = loaded.still_loaded(state, i, pc);
            let o = &state.objects[i];
            return Known {
                usable,
                is_code: usable && o.is_code(pc, N),
                in_object: usable,
            };
        }
    }
    let in_object = match sys::dl_find_object(pc) {
        Ok(Some(_)) => {
            if state.is_some() {
                out.unknown_object = true;
            }
            true
        }
        Ok(None) => false,
        // Without _dl_find_object we cannot tell; the checked reads keep the walk safe.
        Err(()) => true,
    };
    Known {
        usable: true,
        is_code: in_object && mem.check(pc, N),
        in_object,
    }
}

/// Whether the code at `pc` is the signal-return trampoline. The caller has checked that the
/// bytes are readable (`Known::is_code`).
fn is_trampoline(pc: usize) -> bool {
    const N: usize = regs::uc::TRAMPOLINE.len();
    // SAFETY: `Known::is_code` established that N bytes at pc lie in a mapped executable
    // segment of a loaded object (or in pages validated as readable during this walk).
    let bytes = unsafe { core::ptr::read_unaligned(pc as *const [u8; N]) };
    bytes[..] == *regs::uc::TRAMPOLINE
}

fn read_ucontext(mem: &mut CheckedMemory, uc: usize) -> Option<Regs> {
    let pc = mem.read_word(uc + regs::uc::PC)?;
    let sp = mem.read_word(uc + regs::uc::SP)?;
    let fp = mem.read_word(uc + regs::uc::FP)?;
    let lr = match regs::uc::LR {
        Some(off) => mem.read_word(uc + off)?,
        None => 0,
    };
    (pc != 0 && sp != 0).then_some(Regs { pc, sp, fp, lr })
}

enum Step {
    Caller(usize),
    End,
    Failed,
}

fn dwarf_step(
    state: &DwarfState,
    cache: &mut CacheGuard,
    mem: &mut CheckedMemory,
    regs: &mut Regs,
    fh: &mut FhRegs,
    exact: bool,
) -> Step {
    let address = if exact {
        FrameAddress::from_instruction_pointer(regs.pc as u64)
    } else {
        match FrameAddress::from_return_address(regs.pc as u64) {
            Some(a) => a,
            None => return Step::Failed,
        }
    };
    sync_framehop(regs, fh);
    let old_sp = regs.sp;
    let mut read = |addr: u64| mem.read_word(addr as usize).map(|w| w as u64).ok_or(());
    match state.unwinder.unwind_frame(
        address,
        fh,
        cache.get(address.address_for_lookup() as usize),
        &mut read,
    ) {
        Ok(Some(ra)) => {
            from_framehop(fh, regs);
            if regs.sp <= old_sp {
                return Step::Failed;
            }
            Step::Caller(ra as usize)
        }
        Ok(None) => Step::End,
        Err(_) => Step::Failed,
    }
}

#[cfg(target_arch = "x86_64")]
fn to_framehop(r: &Regs) -> FhRegs {
    FhRegs::new(r.pc as u64, r.sp as u64, r.fp as u64)
}

/// Brings framehop's registers in line with `r` (cheaper than building them anew).
#[cfg(target_arch = "x86_64")]
#[inline]
fn sync_framehop(r: &Regs, fh: &mut FhRegs) {
    fh.set_ip(r.pc as u64);
    fh.set_sp(r.sp as u64);
    fh.set_bp(r.fp as u64);
}

#[cfg(target_arch = "aarch64")]
#[inline]
fn sync_framehop(r: &Regs, fh: &mut FhRegs) {
    fh.set_sp(r.sp as u64);
    fh.set_fp(r.fp as u64);
    fh.set_lr(r.lr as u64);
}

#[cfg(target_arch = "x86_64")]
fn from_framehop(fh: &FhRegs, r: &mut Regs) {
    r.sp = fh.sp() as usize;
    r.fp = fh.bp() as usize;
}

#[cfg(target_arch = "aarch64")]
fn to_framehop(r: &Regs) -> FhRegs {
    FhRegs::new_with_ptr_auth_mask(
        framehop::aarch64::PtrAuthMask::new_24_40(),
        r.lr as u64,
        r.sp as u64,
        r.fp as u64,
    )
}

#[cfg(target_arch = "aarch64")]
fn from_framehop(fh: &FhRegs, r: &mut Regs) {
    r.sp = fh.sp() as usize;
    r.fp = fh.fp() as usize;
    r.lr = fh.lr() as usize;
}

/// One frame-pointer step: `[fp]` is the caller's frame pointer and `[fp + 8]` the return
/// address (x86-64 `push rbp; mov rbp, rsp`, aarch64 `stp x29, x30, [sp, #-16]!`).
fn fp_step(mem: &mut CheckedMemory, regs: &mut Regs, exact: bool) -> Step {
    const W: usize = core::mem::size_of::<usize>();
    // aarch64: in the first frame the return address may still be in the link register; frame
    // pointer chains are only trusted from the frame record on.
    let _ = exact;
    let fp = regs.fp;
    if fp == 0 {
        return Step::End;
    }
    if !fp.is_multiple_of(W) || fp < regs.sp {
        return Step::Failed;
    }
    let (Some(next_fp), Some(ra)) = (mem.read_word(fp), mem.read_word(fp + W)) else {
        return Step::Failed;
    };
    let ra = strip_pac(ra);
    if ra == 0 {
        return Step::End;
    }
    regs.sp = fp + 2 * W;
    regs.fp = next_fp;
    Step::Caller(ra)
}

/// Recovers from a first frame whose pc is in no object (a jump or call to a bad address): the
/// return address of the call is on top of the stack.
fn call_through_bad_pointer(mem: &mut CheckedMemory, regs: &mut Regs) -> Step {
    #[cfg(target_arch = "x86_64")]
    {
        let Some(ra) = mem.read_word(regs.sp) else {
            return Step::Failed;
        };
        if ra == 0 {
            return Step::Failed;
        }
        regs.sp += core::mem::size_of::<usize>();
        Step::Caller(ra)
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _ = mem;
        // The call (`blr`) left the return address in the link register.
        let ra = strip_pac(regs.lr);
        if ra == 0 {
            return Step::Failed;
        }
        Step::Caller(ra)
    }
}

/// Removes a pointer-authentication code from a return address (aarch64; identity on x86-64).
#[inline]
fn strip_pac(ra: usize) -> usize {
    #[cfg(target_arch = "aarch64")]
    {
        // User addresses have at most 48 significant bits here (VA_BITS 48); PAC bits sit above.
        ra & ((1usize << 48) - 1)
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        ra
    }
}

/// Target of the naked capture entry: `(buf, len, mode)` from the caller, plus the caller's
/// return address, stack pointer and frame pointer as they were at the call.
pub(crate) extern "C" fn capture_inner(
    buf: *mut usize,
    len: usize,
    mode: usize,
    ra: usize,
    sp: usize,
    fp: usize,
) -> usize {
    let buf = if buf.is_null() || len == 0 {
        &mut [][..]
    } else {
        // SAFETY: the public wrappers pass a valid &mut [usize] split into pointer and length.
        unsafe { core::slice::from_raw_parts_mut(buf, len) }
    };
    let mode = UnwindMode::from_raw(mode);
    let start = Start::Return(Regs {
        pc: ra,
        sp,
        fp,
        lr: 0,
    });
    super::finish(start, buf, mode)
}
