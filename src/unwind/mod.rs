//! Stack capture: the return addresses of the current stack, of an interrupted one (from a
//! signal handler's `ucontext_t`), or of an explicit register state.
//!
//! Two modes ([`UnwindMode`]):
//! * [`UnwindMode::Dwarf`] (default): DWARF CFI from the loaded objects' `.eh_frame`, every rule
//!   that gdb and libunwind follow: a CFA based on any register or given by a DWARF
//!   expression, and `offset`, `val_offset`, `register`, `expression`, `val_expression`,
//!   `same_value` and `undefined` register rules. The callee-saved registers (rbx, rbp,
//!   r12-r15) are tracked across frames and taken from the `ucontext_t` at signal frames, so a
//!   frame whose CFA is based on one of them (ld.so's lazy-binding trampoline, OpenSSL's
//!   assembly) unwinds. Correct through code built without frame pointers (std, libc).
//! * [`UnwindMode::FramePointer`]: frame pointers only, for programs built with
//!   `-C force-frame-pointers=yes`.
//!
//! # Fast path and slow path
//! A frame's rule is derived once from the CFI (gimli, on-stack storage) and compiled into a
//! small form (CFA = register + offset; return address and callee-saved registers at CFA +
//! offset). Compiled rules live in a cache keyed by the pc, shared lock-free by every thread
//! and sized for the working set of a profiler (16384 entries), so a warm frame costs a lookup,
//! an add and a few checked loads. Rules that do not compile (expressions, register-to-register
//! rules, caller-saved registers) are evaluated in full each time, with a bounded evaluator.
//!
//! A thread's walk also reuses the outer frames of its previous walk once it reaches one of
//! them, after checking that the stack still holds every word those frames were read from
//! ([`set_walk_reuse`]): a profiler's samples and repeated captures share most of their stack.
//!
//! # Never silently wrong
//! The frame-pointer rule is used only for pcs that no CFI covers (in DWARF mode), and its
//! result is accepted only when the return address lies in code of a loaded object. When a pc
//! has CFI that cannot be evaluated, or a rule needs a register whose value is unknown, the walk
//! stops there. [`capture_walk`] and its siblings return a [`Walk`] that tells a complete walk
//! ([`WalkEnd::Complete`]) from a truncated one and says why ([`Truncation`]).
//!
//! Every capture function is async-signal-safe and never faults: reads on the thread's own
//! stack are direct, every other read is a copy made by the kernel (`process_vm_readv`), so
//! memory that another thread unmaps in the middle of a walk ends the walk, not the process.
//! Through a signal frame, a walk continues into the interrupted code.
//!
//! # Objects loaded later
//! [`crate::init`] snapshots the loaded objects. After a `dlopen`, call [`crate::refresh`]; or let a capture
//! do it: a capture that finds a pc in an object the snapshot lacks, and that can prove it runs
//! in normal context (the complete walk crossed no signal frame), refreshes the snapshot and
//! walks again. Disable that with [`set_auto_refresh`] where even normal-context allocation is
//! not allowed (for example in a global allocator that records stacks). Objects unloaded with
//! `dlclose` are never read: the unwind tables of objects that can be unloaded are copied when
//! the unwinder is built, and the walk checks with glibc's lock-free `_dl_find_object` that an
//! object is still the one that was loaded before it uses its rules.
//!
//! # Platform
//! x86-64 Linux (glibc; musl and older glibc work without `_dl_find_object`'s checks).

#[cfg(not(target_arch = "x86_64"))]
compile_error!("selftrace's unwinder supports x86-64 Linux only");

mod cfi;
mod dwarf;
mod mem;
mod regs;
mod rules;
mod tail;
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

/// What a capture returns with [`capture_walk`] and its siblings: how many frames it wrote and
/// how the walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Frames written into the buffer.
    pub frames: usize,
    /// Why the walk stopped.
    pub end: WalkEnd,
}

impl Walk {
    /// The walk reached the outermost frame (`_start`, `clone3`, or the end of a
    /// frame-pointer chain).
    pub fn is_complete(&self) -> bool {
        self.end == WalkEnd::Complete
    }

    /// Where and why the walk stopped early, if it did.
    pub fn truncation(&self) -> Option<Truncation> {
        match self.end {
            WalkEnd::Truncated(t) => Some(t),
            _ => None,
        }
    }
}

/// Counters of the unwinder since the process started, for tests and tuning. Each is a relaxed
/// atomic; `frames_reused` is bumped by walks that reuse frames, the others only on the slow
/// paths (never by a walk that the rule cache serves).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Windows of memory copied with `process_vm_readv` (reads off the walking thread's own
    /// stack): each is one system call.
    pub copies: u64,
    /// Rules derived from the CFI (misses of the shared rule cache).
    pub rules_derived: u64,
    /// Walks repeated precisely because a frame needed a register the fast path had dropped.
    pub precise_walks: u64,
    /// Frames taken from the thread's previous walk, their stack words checked unchanged,
    /// instead of stepped (see [`set_walk_reuse`]).
    pub frames_reused: u64,
}

pub(crate) mod counters {
    use core::sync::atomic::AtomicU64;
    pub(crate) static COPIES: AtomicU64 = AtomicU64::new(0);
    pub(crate) static DERIVED: AtomicU64 = AtomicU64::new(0);
    pub(crate) static PRECISE: AtomicU64 = AtomicU64::new(0);
}

/// The unwinder's counters ([`UnwindStats`]). Async-signal-safe.
pub fn stats() -> UnwindStats {
    use counters::*;
    UnwindStats {
        copies: COPIES.load(Ordering::Relaxed),
        rules_derived: DERIVED.load(Ordering::Relaxed),
        precise_walks: PRECISE.load(Ordering::Relaxed),
        frames_reused: tail::reused(),
    }
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WalkEnd {
    /// It reached the outermost frame: every frame of the stack is in the buffer.
    Complete,
    /// The buffer (or [`MAX_FRAMES`]) was full; the stack goes on.
    BufferFull,
    /// It could not find the caller of the last frame written.
    Truncated(Truncation),
}

/// Where a truncated walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Truncation {
    /// The pc of the last frame written (whose caller could not be found).
    pub pc: usize,
    /// Why.
    pub reason: StopReason,
}

/// Why a walk stopped before the outermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The pc has CFI, but it is malformed or uses something the evaluator does not support.
    NoUnwindRule,
    /// The frame's rule needs a register whose value is unknown in this frame (a caller-saved
    /// register after a call, or one the caller's frame did not save).
    RegisterUnknown,
    /// A rule reads memory that is not readable.
    UnreadableMemory,
    /// The caller's stack pointer would not lie above this frame's (a loop, or a corrupt stack).
    NoProgress,
    /// No CFI covers the pc, and the frame pointer does not lead to code of a loaded object.
    NoFramePointer,
    /// The CFI gave a return address outside the code of every loaded object: the CFI does not
    /// describe the code at the pc (hand-written assembly without complete CFI, say).
    BadReturnAddress,
    /// The `ucontext_t` above a signal trampoline is unreadable or empty.
    BadSignalFrame,
    /// More than [`MAX_SIGNAL_FRAMES`] nested signal frames.
    TooManySignalFrames,
    /// Every walk slot was taken by concurrent walks (see [`crate::init`]), and this frame's
    /// rule was not cached yet.
    Busy,
    /// The stack is deeper than the buffer that kept it (a profile's [`MAX_DEPTH`] frames):
    /// its outermost frames are missing. Walks into a caller's buffer end with
    /// [`WalkEnd::BufferFull`] instead.
    ///
    /// [`MAX_DEPTH`]: crate::profile::MAX_DEPTH
    TooDeep,
}

impl StopReason {
    /// A short lowercase description, as printed in `stack truncated: ...` lines.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::NoUnwindRule => "no unwind rule",
            StopReason::RegisterUnknown => "unwind rule needs an unknown register",
            StopReason::UnreadableMemory => "unreadable stack",
            StopReason::NoProgress => "stack pointer did not advance",
            StopReason::NoFramePointer => "no unwind info and no valid frame pointer",
            StopReason::BadReturnAddress => "unwind rule gives a return address outside code",
            StopReason::BadSignalFrame => "unreadable signal frame",
            StopReason::TooManySignalFrames => "too many nested signal frames",
            StopReason::Busy => "all unwinder slots busy",
            StopReason::TooDeep => "stack deeper than the profile keeps",
        }
    }
}

impl core::fmt::Display for StopReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::fmt::Display for Truncation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} at {:#x}", self.reason, self.pc)
    }
}

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
    // SAFETY: getpid and gettid have no preconditions.
    if unsafe { libc::getpid() == libc::gettid() } {
        if let Some(s) = mem::thread_stack() {
            crate::sys::set_main_stack(s.start, s.end);
        }
    }
    crate::sys::learn_pthread_layout();
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

/// Enables or disables the reuse of a thread's previous walk (enabled by default).
///
/// A DWARF walk that reaches a frame of the same thread's previous complete walk (same pc,
/// stack pointer and rbp) checks that the stack still holds every word the previous walk read
/// above it (each return address and saved rbp) and then takes those frames instead of
/// stepping them again: a profiler's samples and repeated captures share their outer frames.
/// The result is always the one a full walk gives; the first word that differs ends the reuse
/// and the walk steps on from there. Turning it off is for measuring the walk itself.
pub fn set_walk_reuse(enabled: bool) {
    tail::set_enabled(enabled);
}

thread_local! {
    static IN_REFRESH: Cell<bool> = const { Cell::new(false) };
}

/// Captures the current stack into `buf`; returns the number of frames written. Frame 0 is the
/// caller of `capture`. Uses [`UnwindMode::Dwarf`]. [`capture_walk`] also says whether the walk
/// was complete.
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
    regs::capture_entry(
        buf.as_mut_ptr(),
        buf.len(),
        mode.to_raw(),
        core::ptr::null_mut(),
    )
}

/// Like [`capture_with`], and says how the walk ended. Async-signal-safe.
#[inline(always)]
pub fn capture_walk_with(buf: &mut [usize], mode: UnwindMode) -> Walk {
    let mut w = Walk {
        frames: 0,
        end: WalkEnd::BufferFull,
    };
    regs::capture_entry(buf.as_mut_ptr(), buf.len(), mode.to_raw(), &mut w);
    w
}

/// Like [`capture`], and says how the walk ended. Async-signal-safe.
#[inline(always)]
pub fn capture_walk(buf: &mut [usize]) -> Walk {
    capture_walk_with(buf, UnwindMode::Dwarf)
}

/// Captures the stack that a signal interrupted, from the handler's third argument. Frame 0 is
/// the interrupted pc (exact), then its callers, also through code without frame pointers.
/// The walk starts from every register the kernel saved.
///
/// Async-signal-safe.
///
/// # Safety
/// `uc` must point to a readable `ucontext_t`, such as the one the kernel passes to an
/// `SA_SIGINFO` handler.
pub unsafe fn capture_from_ucontext(uc: *const libc::ucontext_t, buf: &mut [usize]) -> usize {
    // SAFETY: forwarded from the caller.
    unsafe { capture_walk_from_ucontext(uc, buf) }.frames
}

/// Like [`capture_from_ucontext`], and says how the walk ended. Async-signal-safe.
///
/// # Safety
/// As for [`capture_from_ucontext`].
pub unsafe fn capture_walk_from_ucontext(uc: *const libc::ucontext_t, buf: &mut [usize]) -> Walk {
    let none = Walk {
        frames: 0,
        end: WalkEnd::Truncated(Truncation {
            pc: 0,
            reason: StopReason::BadSignalFrame,
        }),
    };
    if uc.is_null() {
        return none;
    }
    let base = uc as usize;
    // SAFETY: the caller guarantees a readable ucontext_t; the offsets lie inside it.
    let r = regs::RegSet::from_gregs(|off| {
        Some(unsafe { core::ptr::read_unaligned((base + off) as *const usize) })
    });
    let Some(r) = r else {
        return none;
    };
    let o = walk::walk(&walk::Start::Exact(r), buf, UnwindMode::Dwarf, true);
    Walk {
        frames: o.frames,
        end: o.end,
    }
}

/// Captures the stack described by `regs` (frame 0 = `regs.pc`, exact). Every read of the
/// stack is checked: garbage registers give a short or empty result, never a fault.
///
/// Async-signal-safe.
pub fn capture_from_regs(regs: Regs, buf: &mut [usize], mode: UnwindMode) -> usize {
    capture_walk_from_regs(regs, buf, mode).frames
}

/// Like [`capture_from_regs`], and says how the walk ended. Async-signal-safe.
pub fn capture_walk_from_regs(regs: Regs, buf: &mut [usize], mode: UnwindMode) -> Walk {
    let o = walk::walk(
        &walk::Start::Exact(regs::RegSet::from_regs(regs)),
        buf,
        mode,
        false,
    );
    Walk {
        frames: o.frames,
        end: o.end,
    }
}

/// Runs a walk for the capture entry points, then, in proven normal context, refreshes and
/// walks again when the walk met an object loaded after the snapshot.
#[inline(never)]
fn finish(start: &Start, buf: &mut [usize], mode: UnwindMode) -> walk::Outcome {
    let out = walk::walk(start, buf, mode, true);
    let complete = out.end == WalkEnd::Complete;
    if !out.initialized || out.signal_frames != 0 || !AUTO_REFRESH.load(Ordering::Relaxed) {
        return out;
    }
    let sp = start.sp();
    // A complete walk that crossed no signal frame proves normal context; so does a stack with
    // no signal-return address between sp and its top (needed when the walk broke in an object
    // without frame pointers that the snapshot does not know yet). The thread-locals are read
    // only when there may be something to do (they cost a `__tls_get_addr` call each).
    let learn_stack =
        complete && crate::sys::own_stack_above(sp).is_none() && mem::thread_stack().is_none();
    let refresh = out.unknown_object && (complete || no_signal_frame_above(sp));
    if (!learn_stack && !refresh) || IN_REFRESH.try_with(Cell::get).unwrap_or(true) {
        return out;
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
        walk::walk(start, buf, mode, true)
    } else {
        out
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
