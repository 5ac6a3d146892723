//! What the unwinder does in normal context: learning the thread's stack and glibc's layout,
//! building the published state, and the automatic refresh of a capture that met an object
//! loaded after the snapshot (only when it can prove it runs in normal context).
#![allow(unsafe_code)]

use super::memory;
use super::outcome::{Outcome, Start};
use super::types::{UnwindMode, WalkEnd};
use super::walk;
use core::sync::atomic::{AtomicBool, Ordering};
use std::cell::Cell;

/// Learns the calling thread's stack bounds and builds the DWARF unwinder for the current
/// module snapshot (see [`crate::init`]). Normal context.
pub(crate) fn prepare() {
    memory::learn_thread_stack();
    // SAFETY: getpid and gettid have no preconditions.
    if unsafe { libc::getpid() == libc::gettid() } {
        if let Some(s) = memory::thread_stack() {
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
            super::objects::rebuild(s);
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

/// Runs a walk for the capture entry points, then, in proven normal context, refreshes and
/// walks again when the walk met an object loaded after the snapshot. How it went is written
/// into `out` (see [`walk::walk`]).
#[inline(never)]
pub(crate) fn finish(start: &Start, buf: &mut [usize], mode: UnwindMode, out: &mut Outcome) {
    walk::walk(start, buf, mode, true, out);
    let complete = out.end == WalkEnd::Complete;
    if !out.initialized || out.signal_frames != 0 || !AUTO_REFRESH.load(Ordering::Relaxed) {
        return;
    }
    let sp = start.sp();
    // A complete walk that crossed no signal frame proves normal context; so does a stack with
    // no signal-return address between sp and its top (needed when the walk broke in an object
    // without frame pointers that the snapshot does not know yet). The thread-locals are read
    // only when there may be something to do (they cost a `__tls_get_addr` call each).
    let learn_stack =
        complete && crate::sys::own_stack_above(sp).is_none() && memory::thread_stack().is_none();
    let refresh = out.unknown_object && (complete || no_signal_frame_above(sp));
    if (!learn_stack && !refresh) || IN_REFRESH.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    let _ = IN_REFRESH.try_with(|c| c.set(true));
    if learn_stack {
        memory::learn_thread_stack();
    }
    // Also when another thread refreshed the snapshot (the symbolizer's catch-up, say) and this
    // unwinder has not followed it yet.
    let refreshed = refresh && (crate::modules::try_refresh() || behind_snapshot());
    if refreshed {
        rebuild();
    }
    let _ = IN_REFRESH.try_with(|c| c.set(false));
    if refreshed {
        walk::walk(start, buf, mode, true, out);
    }
}

/// Whether the published unwinder was built from an older module snapshot than the current
/// one (or not built at all while there is one). Normal context.
fn behind_snapshot() -> bool {
    let current = crate::modules::with_current(|s| s.map(|s| s.generation()));
    let built = super::objects::with_state(|s| s.map(|s| s.generation));
    current.is_some() && current != built
}

/// Runs `refresh` if the calling thread is in proven normal context: automatic refresh is on,
/// this thread is not refreshing already, and no signal handler runs below on its stack (see
/// [`no_signal_frame_above`]). Returns whether it ran. For the lookups of names that find an
/// object changed since the snapshot (`symbolize`), which are async-signal-safe otherwise.
#[inline(never)]
pub(crate) fn in_normal_context(refresh: impl FnOnce()) -> bool {
    if !AUTO_REFRESH.load(Ordering::Relaxed) || IN_REFRESH.try_with(Cell::get).unwrap_or(true) {
        return false;
    }
    let here = 0u8;
    let sp = core::hint::black_box(&here) as *const u8 as usize;
    if !no_signal_frame_above(sp) {
        return false;
    }
    let _ = IN_REFRESH.try_with(|c| c.set(true));
    refresh();
    let _ = IN_REFRESH.try_with(|c| c.set(false));
    true
}

/// Whether the current thread's stack, from `sp` to its top, holds no return address into a
/// signal trampoline, i.e. no signal handler is running below us on this stack. `false` when
/// unsure (stack bounds unknown, `sp` on another stack such as an alternate signal stack).
fn no_signal_frame_above(sp: usize) -> bool {
    let stack = crate::sys::own_stack_above(sp)
        .map(|(low, high)| low..high)
        .or_else(memory::thread_stack);
    let Some(stack) = stack else {
        return false;
    };
    if !stack.contains(&sp) {
        return false;
    }
    // The handlers' `sa_restorer`s, and the vDSO's trampoline where the kernel returns through
    // it (aarch64: glibc installs no `sa_restorer` there).
    let mut restorers = [0usize; 16];
    let mut n = crate::sys::signal_restorers(&mut restorers[..8]);
    super::objects::with_state(|s| {
        for &r in s.map_or(&[][..], |s| &s.restorers[..]) {
            if r != 0 && !restorers[..n].contains(&r) && n < restorers.len() {
                restorers[n] = r;
                n += 1;
            }
        }
    });
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
