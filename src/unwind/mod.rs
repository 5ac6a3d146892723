//! Stack capture: the return addresses of the current stack, of an interrupted one (from a
//! signal handler's `ucontext_t`), or of an explicit register state.
//!
//! Two modes ([`UnwindMode`]):
//! * [`UnwindMode::Dwarf`] (default): DWARF CFI from the loaded objects' in-memory `.eh_frame`
//!   (framehop), with a per-frame frame-pointer fallback where an object has no CFI. Correct
//!   through code built without frame pointers (std, libc).
//! * [`UnwindMode::FramePointer`]: frame pointers only; about ten times faster per frame, for
//!   programs built with `-C force-frame-pointers=yes`.
//!
//! Every capture function is async-signal-safe and never faults: all stack reads are checked
//! (see the crate docs). Through a signal frame, a walk continues into the interrupted code.
//!
//! # Objects loaded later
//! [`crate::init`] snapshots the loaded objects. After a `dlopen`, call [`crate::refresh`]; or let a capture
//! do it: a capture that finds a pc in an object the snapshot lacks, and that can prove it runs
//! in normal context (the complete walk crossed no signal frame), refreshes the snapshot and
//! walks again. Disable that with [`set_auto_refresh`] where even normal-context allocation is
//! not allowed (for example in a global allocator that records stacks). Objects unloaded with
//! `dlclose` are never read: before framehop reads an object's unwind data, the walk checks with
//! glibc's lock-free `_dl_find_object` that the object is still the one that was loaded.

mod dwarf;
mod mem;
mod regs;
mod walk;

pub use regs::Regs;

/// The registers saved in a signal handler's `ucontext_t`.
///
/// # Safety
/// `uc` must point to a readable `ucontext_t`.
pub(crate) unsafe fn regs_from_ucontext(uc: *const libc::ucontext_t) -> Regs {
    // SAFETY: forwarded from the caller.
    unsafe { regs::from_ucontext(uc) }
}

/// The current thread's stack bounds, when known. Async-signal-safe.
pub(crate) fn thread_stack() -> Option<core::ops::Range<usize>> {
    mem::thread_stack()
}
pub use walk::{MAX_FRAMES, MAX_SIGNAL_FRAMES};

use core::sync::atomic::{AtomicBool, Ordering};
use std::cell::Cell;
use walk::Start;

/// How a capture finds each caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnwindMode {
    /// DWARF CFI with a per-frame frame-pointer fallback (the default).
    #[default]
    Dwarf,
    /// Frame pointers only (for programs built with `-C force-frame-pointers=yes`).
    FramePointer,
}

impl UnwindMode {
    fn to_raw(self) -> usize {
        match self {
            UnwindMode::Dwarf => 0,
            UnwindMode::FramePointer => 1,
        }
    }

    fn from_raw(raw: usize) -> UnwindMode {
        match raw {
            1 => UnwindMode::FramePointer,
            _ => UnwindMode::Dwarf,
        }
    }
}

/// Learns the calling thread's stack bounds and builds the DWARF unwinder for the current
/// module snapshot (see [`crate::init`]). Normal context.
pub(crate) fn prepare() {
    mem::learn_thread_stack();
    rebuild();
}

/// Rebuilds the DWARF unwinder if the module snapshot moved on. Normal context.
pub(crate) fn rebuild() {
    crate::modules::with_current(|s| {
        if let Some(s) = s {
            dwarf::rebuild(s);
        }
    });
}

static AUTO_REFRESH: AtomicBool = AtomicBool::new(true);

/// Enables or disables the automatic refresh of a normal-context capture that meets an object
/// loaded after the last snapshot (enabled by default). With it disabled, captures never
/// allocate, in any context.
pub fn set_auto_refresh(enabled: bool) {
    AUTO_REFRESH.store(enabled, Ordering::Relaxed);
}

thread_local! {
    static IN_REFRESH: Cell<bool> = const { Cell::new(false) };
}

/// Captures the current stack into `buf`; returns the number of frames written. Frame 0 is the
/// caller of `capture`. Uses [`UnwindMode::Dwarf`].
///
/// Async-signal-safe. Called inside a signal handler, the walk continues through the signal
/// frame: after the handler's frames comes the trampoline, then the interrupted pc (exact, not
/// a return address) and its callers.
#[inline(always)]
pub fn capture(buf: &mut [usize]) -> usize {
    capture_with(buf, UnwindMode::Dwarf)
}

/// Like [`capture`], following frame pointers only. Async-signal-safe.
#[inline(always)]
pub fn capture_fp(buf: &mut [usize]) -> usize {
    capture_with(buf, UnwindMode::FramePointer)
}

/// Like [`capture`], with an explicit [`UnwindMode`]. Async-signal-safe.
#[inline(always)]
pub fn capture_with(buf: &mut [usize], mode: UnwindMode) -> usize {
    regs::capture_entry(buf.as_mut_ptr(), buf.len(), mode.to_raw())
}

/// Captures the stack that a signal interrupted, from the handler's third argument. Frame 0 is
/// the interrupted pc (exact), then its callers, also through code without frame pointers.
///
/// Async-signal-safe.
///
/// # Safety
/// `uc` must point to a readable `ucontext_t`, such as the one the kernel passes to an
/// `SA_SIGINFO` handler.
pub unsafe fn capture_from_ucontext(uc: *const libc::ucontext_t, buf: &mut [usize]) -> usize {
    if uc.is_null() {
        return 0;
    }
    // SAFETY: the caller guarantees a readable ucontext_t.
    let r = unsafe { regs::from_ucontext(uc) };
    walk::walk(Start::Exact(r), buf, UnwindMode::Dwarf).frames
}

/// Captures the stack described by `regs` (frame 0 = `regs.pc`, exact). Every read of the
/// stack is checked: garbage registers give a short or empty result, never a fault.
///
/// Async-signal-safe.
pub fn capture_from_regs(regs: Regs, buf: &mut [usize], mode: UnwindMode) -> usize {
    walk::walk(Start::Exact(regs), buf, mode).frames
}

/// Runs a walk for the capture entry points, then, in proven normal context, refreshes and
/// walks again when the walk met an object loaded after the snapshot.
#[inline(never)]
fn finish(start: Start, buf: &mut [usize], mode: UnwindMode) -> usize {
    let out = walk::walk(start, buf, mode);
    if !out.initialized
        || out.signal_frames != 0
        || !AUTO_REFRESH.load(Ordering::Relaxed)
        || IN_REFRESH.try_with(Cell::get).unwrap_or(true)
    {
        return out.frames;
    }
    let sp = match start {
        Start::Exact(r) | Start::Return(r) => r.sp,
    };
    // A complete walk that crossed no signal frame proves normal context; so does a stack with
    // no signal-return address between sp and its top (needed when the walk broke in an object
    // without frame pointers that the snapshot does not know yet).
    let learn_stack = out.complete && mem::thread_stack().is_none();
    let refresh = out.unknown_object && (out.complete || no_signal_frame_above(sp));
    if !learn_stack && !refresh {
        return out.frames;
    }
    let _ = IN_REFRESH.try_with(|c| c.set(true));
    if learn_stack {
        mem::learn_thread_stack();
    }
    let refreshed = refresh && crate::modules::try_refresh();
    if refreshed {
        rebuild();
    }
    let _ = IN_REFRESH.try_with(|c| c.set(false));
    if refreshed {
        walk::walk(start, buf, mode).frames
    } else {
        out.frames
    }
}

/// Whether the current thread's stack, from `sp` to its top, holds no return address into a
/// signal trampoline, i.e. no signal handler is running below us on this stack. `false` when
/// unsure (stack bounds unknown, `sp` on another stack such as an alternate signal stack).
fn no_signal_frame_above(sp: usize) -> bool {
    let Some(stack) = mem::thread_stack() else {
        return false;
    };
    if !stack.contains(&sp) {
        return false;
    }
    let mut restorers = [0usize; 8];
    let n = crate::sys::signal_restorers(&mut restorers);
    let restorers = &restorers[..n];
    let mut addr = sp & !(core::mem::size_of::<usize>() - 1);
    while addr + core::mem::size_of::<usize>() <= stack.end {
        // SAFETY: [sp, stack.end) is the live part of this thread's own stack: mapped, readable
        // and aligned.
        let word = unsafe { core::ptr::read_volatile(addr as *const usize) };
        if restorers.contains(&word) {
            return false;
        }
        addr += core::mem::size_of::<usize>();
    }
    true
}
