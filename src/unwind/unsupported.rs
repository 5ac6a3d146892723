//! The entry points of [`super`] on a target without an unwinder port: every capture returns no
//! frames and [`StopReason::Unsupported`]; nothing else of the crate depends on a capture.
#![allow(unsafe_code)]

use super::types::{Regs, StopReason, Truncation, UnwindMode, UnwindStats, Walk, WalkEnd};

/// The walk that did not happen.
const NONE: Walk = Walk::new(
    0,
    WalkEnd::Truncated(Truncation {
        pc: 0,
        reason: StopReason::Unsupported,
    }),
);

/// No frames.
#[inline(always)]
pub(crate) fn capture(_buf: &mut [usize], _mode: UnwindMode, out: Option<&mut Walk>) -> usize {
    if let Some(w) = out {
        *w = NONE;
    }
    0
}

/// No frames.
///
/// # Safety
/// None needed; unsafe as on the ported targets.
pub(crate) unsafe fn capture_from_ucontext(
    _uc: *const libc::ucontext_t,
    _buf: &mut [usize],
    _mode: UnwindMode,
) -> Walk {
    NONE
}

/// No frames.
pub(crate) fn capture_from_regs(_regs: Regs, _buf: &mut [usize], _mode: UnwindMode) -> Walk {
    NONE
}

/// Nothing to reuse.
pub(crate) fn set_walk_reuse(_enabled: bool) {}

/// Nothing to refresh.
pub fn set_auto_refresh(_enabled: bool) {}

/// Nothing counted.
pub fn stats() -> UnwindStats {
    UnwindStats::default()
}

/// Nothing to prepare.
pub(crate) fn prepare() {}

/// Nothing to rebuild.
pub(crate) fn rebuild() {}

/// Normal context cannot be proven without a port (the thread's stack is not known): never
/// runs `refresh`.
pub(crate) fn in_normal_context(_refresh: impl FnOnce()) -> bool {
    false
}

/// Unknown.
pub(crate) fn thread_stack() -> Option<core::ops::Range<usize>> {
    None
}

/// No registers known (the crash report prints what its own port of the `ucontext_t` reads).
///
/// # Safety
/// None needed; unsafe as on the ported targets.
pub(crate) unsafe fn regs_from_ucontext(_uc: *const libc::ucontext_t) -> Regs {
    Regs::default()
}

/// No trampoline is known.
pub(crate) fn is_signal_trampoline(_addr: usize) -> bool {
    false
}
