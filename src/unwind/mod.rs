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
//! stops there. [`Capture`]'s walks return a [`Walk`] that tells a complete walk
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
//! Linux on x86-64 and aarch64 (glibc; musl and older glibc work without `_dl_find_object`'s
//! checks). The generic core (the walk, the rule cache, checked memory, walk reuse) reads what it
//! needs of the machine from `arch`; on other targets there is no unwinder, and every capture
//! returns no frames and [`StopReason::Unsupported`].
//!
//! # How the fast path and walk reuse work
//! The rule cache holds 16,384 entries in 4-way buckets keyed by the pc, with a seqlock per entry:
//! a reader never waits, a writer that finds the entry busy gives up. The hot loop restores only
//! the frame pointer of the callee-saved registers; when a later frame needs one it dropped (a CFA
//! based on rbx), the walk is repeated with full tracking, so the common case pays nothing for
//! the rare one. A walk whose frames are all in the cache runs on the caller's stack without
//! claiming a walker slot; a walk that needs the CFI (a miss) continues on a private 256 KiB
//! stack, so the 8 KiB alternate signal stacks std gives its threads are enough.
//!
//! Walk reuse: each thread keeps a record of its last complete walk (per frame the pc, sp and
//! frame pointer it started from, and the addresses of the words its step read). A walk that
//! reaches a recorded frame (same pc and sp, and the same frame pointer where a step above depends
//! on it) checks that the stack still holds every recorded word above it and takes those frames
//! without stepping them; the first word that differs ends the reuse, so the result is always
//! the one a full walk gives. Records live in a fixed table of static memory claimed with one
//! compare-and-swap per walk; only frames in objects that are never unloaded and whose rule is
//! based on the stack or frame pointer are recorded. [`stats`] counts kernel copies, rules
//! derived, precise re-walks and frames reused.
//!
//! # Checked reads without `process_vm_readv`
//! Where `process_vm_readv` is not available (ENOSYS under qemu-user, ENOSYS or EPERM from a
//! container's seccomp profile) a checked read is a `write(2)` of the range into a pipe of
//! selftrace's own, a page at a time, and a `read(2)` back: the kernel reads the memory and fails
//! with EFAULT where it cannot (four pipes, claimed by compare-and-swap, made with `pipe2` on
//! first use and again after `fork`). Code bytes (the signal-trampoline check) are read the same
//! way. The main program, the vDSO and objects mapped at program start (glibc never unloads
//! those) have their unwind tables read in place. The stack pointer must grow at each step; walks
//! are bounded by the buffer and a frame cap.
//!
//! A thread that never called selftrace is walked with direct reads too: its stack bounds come
//! from glibc's `struct pthread` (the `stackblock` fields, located once at `init()` by comparing
//! with `pthread_getattr_np` in a probe thread). Before `init()` a capture still works (frame
//! pointers, `_dl_find_object`) and never allocates.
//!
//! Why not framehop: its x86-64 rules carry rip, rsp and rbp only (no register tracking, so no CFA
//! based on rbx), a rule it cannot translate silently falls back to frame pointers, and its rule
//! cache is per slot and direct-mapped (509 entries). selftrace reads the CFI with gimli and keeps
//! its own cache.
#![allow(unsafe_code)]

/// Declares the items only where the unwinder has a port.
macro_rules! ported {
    ($($item:item)*) => {
        $( #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))] $item )*
    };
}

ported! {
    mod arch;
    mod cache;
    mod cfi;
    mod compact;
    mod entry;
    mod fast;
    mod fast_fp;
    mod memory;
    mod objects;
    mod outcome;
    mod refresh;
    mod regs;
    mod reuse;
    mod rule;
    mod slots;
    mod stats;
    mod step;
    mod tables;
    mod walk;
    mod ported;
    use ported as imp;
}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod unsupported;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
use unsupported as imp;

mod types;

pub(crate) use imp::{
    in_normal_context, is_signal_trampoline, prepare, rebuild, regs_from_ucontext, thread_stack,
};
pub use imp::{set_auto_refresh, stats};
pub use types::{
    FrameKind, FrameKinds, Regs, StopReason, Truncation, UnwindMode, UnwindStats, Walk, WalkEnd,
    MAX_FRAMES, MAX_SIGNAL_FRAMES,
};

/// Enables or disables the reuse of a thread's previous walk (enabled by default).
///
/// A DWARF walk that reaches a frame of the same thread's previous complete walk (same pc,
/// stack pointer and rbp) checks that the stack still holds every word the previous walk read
/// above it (each return address and saved rbp) and then takes those frames instead of
/// stepping them again: a profiler's samples and repeated captures share their outer frames.
/// The result is always the one a full walk gives; the first word that differs ends the reuse
/// and the walk steps on from there. Turning it off is for measuring the walk itself.
pub fn set_walk_reuse(enabled: bool) {
    imp::set_walk_reuse(enabled);
}

/// Captures the current stack into `buf`; returns the number of frames written. Frame 0 is the
/// caller of `capture`. Uses [`UnwindMode::Dwarf`]. This is glibc's `backtrace()`; for anything
/// else (another mode, a register state, a signal handler's `ucontext_t`, how the walk ended)
/// use [`Capture`].
///
/// # Async-signal safety
/// Async-signal-safe. Called inside a signal handler, the walk continues through the signal
/// frame: after the handler's frames comes the trampoline, then the interrupted pc (exact, not
/// a return address) and its callers.
///
/// # Stack
/// At most [`crate::SIGNAL_STACK_BUDGET`] bytes of the caller's stack (see the crate docs'
/// stack budget): the hot loops run there, a walk that needs the CFI evaluator moves to a
/// private stack of the unwinder's.
#[inline(always)]
pub fn capture(buf: &mut [usize]) -> usize {
    imp::capture(buf, UnwindMode::Dwarf, None)
}

/// How to walk a stack, and from where: the one way to capture other than [`capture`].
///
/// ```
/// use selftrace::{Capture, UnwindMode};
/// selftrace::init().expect("init");
/// let mut frames = [0usize; 64];
/// // The current stack, saying how the walk ended.
/// let walk = Capture::new().walk(&mut frames);
/// assert!(walk.frames > 0);
/// // Frame pointers only.
/// let walk = Capture::new().mode(UnwindMode::FramePointer).walk(&mut frames);
/// # let _ = walk;
/// ```
///
/// * [`Capture::walk`]: the current stack (frame 0 = the caller of `walk`);
/// * [`Capture::walk_regs`]: the stack a register state describes (frame 0 = its pc, exact);
/// * [`Capture::walk_ucontext`]: the stack a signal interrupted, from a handler's `ucontext_t`;
/// * another thread's stack: [`threads::capture`](crate::threads::capture).
///
/// Each returns a [`Walk`]: the frames written and how the walk ended.
///
/// # Async-signal safety
/// Every method is async-signal-safe and never faults: reads are checked, garbage registers
/// give a short or empty walk. Each takes at most [`crate::SIGNAL_STACK_BUDGET`] bytes of the
/// caller's stack (see the crate docs' stack budget).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use = "a Capture does nothing until one of its walk methods is called"]
pub struct Capture {
    mode: UnwindMode,
}

impl Capture {
    /// A DWARF capture ([`UnwindMode::Dwarf`]).
    pub const fn new() -> Capture {
        Capture {
            mode: UnwindMode::Dwarf,
        }
    }

    /// The walk mode (default [`UnwindMode::Dwarf`]).
    pub const fn mode(self, mode: UnwindMode) -> Capture {
        Capture { mode }
    }

    /// Captures the current stack into `buf`. Frame 0 is the caller of `walk`.
    ///
    /// # Async-signal safety
    /// Async-signal-safe; inside a signal handler the walk continues through the signal frame
    /// into the interrupted code.
    #[inline(always)]
    pub fn walk(self, buf: &mut [usize]) -> Walk {
        let mut w = Walk::new(0, WalkEnd::BufferFull);
        imp::capture(buf, self.mode, Some(&mut w));
        w
    }

    /// Captures the stack described by `regs` (frame 0 = `regs.pc`, exact). Every read of the
    /// stack is checked: garbage registers give a short or empty walk, never a fault.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn walk_regs(self, regs: Regs, buf: &mut [usize]) -> Walk {
        imp::capture_from_regs(regs, buf, self.mode)
    }

    /// Captures the stack that a signal interrupted, from the handler's third argument. Frame 0
    /// is the interrupted pc (exact), then its callers, also through code without frame
    /// pointers. The walk starts from every register the kernel saved. A null `uc` gives an
    /// empty walk ([`StopReason::BadSignalFrame`]).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    ///
    /// # Safety
    /// `uc` must be null or point to a readable `ucontext_t`, such as the one the kernel passes
    /// to an `SA_SIGINFO` handler.
    pub unsafe fn walk_ucontext(self, uc: *const libc::ucontext_t, buf: &mut [usize]) -> Walk {
        // SAFETY: forwarded from the caller.
        unsafe { imp::capture_from_ucontext(uc, buf, self.mode) }
    }
}
