//! The entry points of [`super`] on a target with an unwinder port.
#![allow(unsafe_code)]

use super::outcome::{Outcome, Start};
use super::regs::RegSet;
use super::types::{Regs, StopReason, Truncation, UnwindMode, Walk, WalkEnd};
use super::{entry, walk};

pub(crate) use super::memory::thread_stack;
pub use super::refresh::set_auto_refresh;
pub(crate) use super::refresh::{in_normal_context, prepare, rebuild};
pub use super::stats::stats;

/// Captures the caller's stack (see [`super::Capture::walk`]); writes how the walk ended
/// into `out`. Inlined into the public functions, so that the naked entry's caller is theirs.
#[inline(always)]
pub(crate) fn capture(buf: &mut [usize], mode: UnwindMode, out: Option<&mut Walk>) -> usize {
    entry::capture_entry(
        buf.as_mut_ptr(),
        buf.len(),
        mode.to_raw(),
        out.map_or(core::ptr::null_mut(), |w| w as *mut Walk),
    )
}

/// See [`super::Capture::walk_ucontext`].
///
/// # Safety
/// `uc` is null or points to a readable `ucontext_t`.
pub(crate) unsafe fn capture_from_ucontext(
    uc: *const libc::ucontext_t,
    buf: &mut [usize],
    mode: UnwindMode,
) -> Walk {
    let none = Walk::new(
        0,
        WalkEnd::Truncated(Truncation {
            pc: 0,
            reason: StopReason::BadSignalFrame,
        }),
    );
    if uc.is_null() {
        return none;
    }
    let base = uc as usize;
    let r = RegSet::from_ucontext(|off| {
        // SAFETY: the caller guarantees a readable ucontext_t; the offsets lie inside it.
        Some(unsafe { core::ptr::read_unaligned((base + off) as *const usize) })
    });
    let Some(r) = r else {
        return none;
    };
    let mut o = Outcome::default();
    walk::walk(&Start::Exact(r), buf, mode, true, &mut o);
    o.walk()
}

/// See [`super::Capture::walk_regs`].
pub(crate) fn capture_from_regs(regs: Regs, buf: &mut [usize], mode: UnwindMode) -> Walk {
    let mut o = Outcome::default();
    walk::walk(
        &Start::Exact(RegSet::from_regs(regs)),
        buf,
        mode,
        false,
        &mut o,
    );
    o.walk()
}

/// See [`super::set_walk_reuse`].
pub(crate) fn set_walk_reuse(enabled: bool) {
    super::reuse::set_enabled(enabled);
}

/// The registers saved in a signal handler's `ucontext_t`.
///
/// # Safety
/// `uc` must point to a readable `ucontext_t`.
pub(crate) unsafe fn regs_from_ucontext(uc: *const libc::ucontext_t) -> Regs {
    // SAFETY: forwarded from the caller.
    unsafe { super::regs::from_ucontext(uc) }
}

/// Whether `addr` is the start of a signal trampoline (the frame after it in a captured stack is
/// an exact pc): one of the known restorers; else what the walk that stepped through it as a
/// return address derived and cached; else the bytes there, copied by the kernel. The first
/// two cost no system call: symbolizing a stack asks this of every frame.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn is_signal_trampoline(addr: usize) -> bool {
    use super::rule::{self, Kind};
    let known = super::objects::with_state(|s| {
        let s = s?;
        if s.is_restorer(addr) {
            return Some(true);
        }
        let rule = s.cache.get(rule::key(addr, false)?)?;
        Some(matches!(rule.kind, Kind::Trampoline))
    });
    known.unwrap_or_else(|| super::step::is_trampoline_at(addr))
}

/// In a forked child (one thread): what the parent's other threads held is free (see
/// `crate::fork`): their reads of the objects snapshot, their walk slots and reuse records.
pub(crate) fn after_fork() {
    super::objects::after_fork();
    super::slots::after_fork();
    super::reuse::after_fork();
}

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::UNWIND, after_fork);
