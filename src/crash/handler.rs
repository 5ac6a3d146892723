//! The crash signals: taking them ([`install_signal`]), giving them back ([`uninstall`]), the
//! handler itself ([`on_fatal_signal`]: waits for the report lock, runs the report on the
//! private stack), then chaining to the action installed before and dying by the signal.
//!
//! The handler calls down into [`super::oops`] for the report; nothing there calls back.

use super::oops::write_report;
use super::panic::PANIC_REPORTS;
use super::REPORT_STACK;
use crate::context::Fault;
use crate::error::Error;
use crate::report::lock::{self, OutputLock};
use crate::symbolize;
use crate::sys;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

/// The signals whose handler is ours (bit `sig - 1`), for [`uninstall`].
pub(super) static TAKEN: AtomicU64 = AtomicU64::new(0);
/// Signals whose previous handler is std's stack-overflow handler: not chained (it would
/// abort, and the process would die by SIGABRT instead of the original signal; selftrace
/// reports stack overflows itself).
static SKIP_CHAIN: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

/// Takes `sig` for the crash handler, which runs with every signal but those in `open` (bit
/// `n - 1` for signal `n`) blocked from the moment the kernel delivers it.
pub(super) fn install_signal(sig: i32, open: u64) -> Result<(), Error> {
    let ours = on_fatal_signal as *const () as usize;
    let current = sys::current_handler(sig)?;
    if current != ours {
        let is_std = symbolize::symbolize(current).is_some_and(|s| {
            let mut buf = [0u8; 256];
            s.demangle_into(&mut buf)
                .is_some_and(|n| n.starts_with("std::") && n.contains("stack_overflow"))
        });
        SKIP_CHAIN[sig as usize].store(is_std, Ordering::Relaxed);
    }
    // The action that was there is kept and called after the report (`sys::signal`).
    sys::signal::take_masked(sig, on_fatal_signal, libc::SA_ONSTACK, Some(open))?;
    TAKEN.fetch_or(1 << (sig - 1), Ordering::SeqCst);
    sys::signal::set_owner(sig, Some(sys::signal::Owner::Crash));
    Ok(())
}

/// Removes the crash handler: every signal [`Builder::install`](super::Builder::install) took
/// gets back the action it had before (std's stack-overflow handler, the program's handler, or
/// the default), and the panic hook of [`Builder::panic_hook`](super::Builder::panic_hook) stops
/// reporting (it stays installed and calls the hook that was there before it: a hook cannot be
/// taken out from under hooks set after it). The alternate signal stacks, the report's fd and
/// the symbolizer process (idle) stay. A signal whose handler someone replaced after ours keeps
/// theirs. Installing again works.
///
/// # Errors
/// [`Error::Sys`] when `sigaction` fails (the other signals are still given back).
pub fn uninstall() -> Result<(), Error> {
    PANIC_REPORTS.store(false, Ordering::SeqCst);
    let taken = TAKEN.swap(0, Ordering::SeqCst);
    let mut result = Ok(());
    for sig in 1..=64 {
        if taken & (1 << (sig - 1)) != 0 {
            match sys::signal::give_back(sig, on_fatal_signal, false) {
                Ok(()) => sys::signal::set_owner(sig, None),
                Err(e) => {
                    TAKEN.fetch_or(1 << (sig - 1), Ordering::SeqCst);
                    result = Err(e);
                }
            }
        }
    }
    result
}

extern "C" fn on_fatal_signal(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let errno = sys::signal::ErrnoGuard::new();
    let tid = sys::gettid();
    if lock::owner() == tid && IN_CRASH.load(Ordering::Relaxed) == tid {
        // A crash inside our own report: give up at once, die by the default action.
        die(sig);
        return;
    }
    // Nothing asynchronous runs on this thread from here on: a stack request or a profiler
    // tick nested on a small alternate stack (std gives its threads 8 KiB; two signal frames
    // take 6.8 KiB of it with AVX-512) could overflow it, and a fault with the crash signal
    // blocked kills the process without any report. The handler's `sa_mask` blocks them as
    // the kernel delivers the crash (a signal pending at that moment would otherwise run
    // first, nested: seen as a crash with no report in the two-crashes minidump test); a crash
    // signal that a later `install` took stays blocked here. Another thread's request
    // for this thread's stack times out instead; a minidump takes the context from
    // `lock::publish_waiting` below. The crash signals stay open.
    sys::signal::block_all_except(TAKEN.load(Ordering::Relaxed));
    // While this thread waits for the report lock, a minidump being written (which holds it)
    // takes this thread's context at its own fault from here (`lock::waiting_fault`).
    let waiting = lock::publish_waiting(tid, uc as *const libc::ucontext_t);
    let lock = OutputLock::acquire();
    lock::unpublish_waiting(waiting);
    IN_CRASH.store(tid, Ordering::Relaxed);
    let crash = Fault {
        sig,
        info,
        uc: uc as *const libc::ucontext_t,
        tid,
    };
    let top = REPORT_STACK.load(Ordering::Relaxed);
    if top != 0 && lock.release {
        // SAFETY: the report stack is ours while we hold the report lock; `report_entry` does
        // not unwind.
        unsafe {
            sys::call_on_stack(
                top,
                report_entry,
                &crash as *const Fault as *mut libc::c_void,
            )
        };
    } else {
        write_report(&crash);
    }
    chain(sig, info, uc);
    // Keep the lock: other crashing threads wait while this one dies.
    core::mem::forget(lock);
    // errno restored for the (unlikely) case that the process survives.
    drop(errno);
    die(sig);
}

/// The thread inside a crash report (to detect a crash in the handler itself).
static IN_CRASH: AtomicI32 = AtomicI32::new(0);

extern "C" fn report_entry(crash: *mut libc::c_void) {
    // SAFETY: on_fatal_signal passes a pointer to its live Crash and waits for us.
    let crash = unsafe { &*(crash as *const Fault) };
    write_report(crash);
}

/// Calls the action that was installed before ours (a function; not `SIG_DFL` or `SIG_IGN`).
fn chain(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    if SKIP_CHAIN[sig as usize].load(Ordering::Relaxed) {
        return;
    }
    sys::signal::call_previous(sig, info, uc);
}

/// Restores the default action and re-raises `sig` at this thread. The signal stays pending
/// (blocked while the handler runs) and kills the process when the handler returns.
fn die(sig: i32) {
    // SAFETY: all-zero is a valid sigaction; SIG_DFL is 0.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_DFL;
    // SAFETY: sa is valid; sigaction and tgkill are async-signal-safe.
    unsafe {
        libc::sigaction(sig, &sa, core::ptr::null_mut());
        libc::syscall(libc::SYS_tgkill, libc::getpid(), sys::gettid(), sig);
    }
}
