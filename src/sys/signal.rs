//! One policy for every signal handler selftrace installs (the crash handler, the stack-request
//! and dump handlers of `threads`, the profiler's sampling handler):
//!
//! * **Take**: the action that was installed is saved, then ours is installed.
//! * **Chain**: a signal that is not selftrace's (no request for this thread, not our timer),
//!   and every crash signal after its report, goes on to the saved action when it is a function
//!   (`SA_SIGINFO` or plain), as signal-hook does; `SIG_DFL` and `SIG_IGN` are not emulated.
//! * **Give back**: removing our handler puts the saved action back, or `SIG_IGN` where the
//!   saved one was `SIG_DFL` and a late signal of ours (a timer's, an abandoned request's) would
//!   then kill the process.
//!
//! Every function here is async-signal-safe (atomics and `sigaction` only): the stack-request
//! handler may be installed from inside the crash handler.
//!
//! Every handler keeps the interrupted code's `errno` with an [`ErrnoGuard`].

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use crate::error::Error;

/// Blocks every signal in the calling thread except those in `keep` (bit `n - 1` for signal
/// `n`). Inside a signal handler this lasts until the handler returns (`sigreturn` puts the
/// interrupted code's mask back).
///
/// # Async-signal safety
/// Async-signal-safe (`sigfillset`, `sigdelset`, `pthread_sigmask`).
pub(crate) fn block_all_except(keep: u64) {
    let set = all_except(keep);
    // SAFETY: pthread_sigmask only reads the valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, core::ptr::null_mut()) };
}

/// Every signal except those in `keep` (bit `n - 1` for signal `n`).
fn all_except(keep: u64) -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is valid storage; sigfillset and sigdelset write only into it.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in 1..SIGNALS as i32 {
            if keep & (1 << (sig - 1)) != 0 {
                libc::sigdelset(&mut set, sig);
            }
        }
        set
    }
}

/// An `SA_SIGINFO` handler.
pub(crate) type Handler = extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

/// Signal numbers 1..=64.
const SIGNALS: usize = 65;

/// The saved action of one signal.
struct Saved {
    /// 0 free, 1 being changed, 2 holds the action that was there before ours.
    state: AtomicU8,
    /// The saved handler and flags, readable from a signal handler without the full action.
    handler: AtomicUsize,
    flags: AtomicUsize,
    /// The whole action, for giving it back (mask included).
    action: UnsafeCell<libc::sigaction>,
}

// SAFETY: `action` is written only by the thread that moved `state` from 0 or 2 to 1 (a CAS),
// and read only by the thread that moved it from 2 to 1; `handler` and `flags` are atomics.
unsafe impl Sync for Saved {}

static SAVED: [Saved; SIGNALS] = [const {
    Saved {
        state: AtomicU8::new(0),
        handler: AtomicUsize::new(libc::SIG_DFL),
        flags: AtomicUsize::new(0),
        // SAFETY: all-zero is a valid sigaction (SIG_DFL, empty mask, no flags).
        action: UnsafeCell::new(unsafe { core::mem::zeroed() }),
    }
}; SIGNALS];

/// What [`take`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Our handler was installed now; the previous action was saved.
    Now,
    /// Our handler was installed already.
    Already,
}

fn slot(sig: i32) -> Option<&'static Saved> {
    if (1..SIGNALS as i32).contains(&sig) {
        SAVED.get(sig as usize)
    } else {
        None
    }
}

/// Claims `s` for a change (from free or saved); `EAGAIN` while another thread changes it.
fn claim(s: &Saved) -> Result<u8, i32> {
    for from in [0u8, 2] {
        if s.state
            .compare_exchange(from, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return Ok(from);
        }
    }
    Err(libc::EAGAIN)
}

/// The error every failure of [`take`], [`take_masked`] and [`give_back`] reports: `sigaction`
/// with the `errno` (also for the `EINVAL` and `EAGAIN` they decide themselves).
fn sigaction_err(errno: i32) -> Error {
    Error::Sys {
        call: "sigaction",
        errno,
    }
}

fn query(sig: i32) -> Result<libc::sigaction, i32> {
    // SAFETY: all-zero is a valid sigaction.
    let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: a null new action only queries.
    if unsafe { libc::sigaction(sig, core::ptr::null(), &mut old) } != 0 {
        return Err(super::errno());
    }
    Ok(old)
}

/// Installs `ours` for `sig` (`SA_SIGINFO | flags`, empty mask), saving the action that was
/// there so that [`call_previous`] can chain to it and [`give_back`] restore it. Fails with
/// [`Error::Sys`] `sigaction` and the `errno` (`EINVAL` for a signal that cannot be caught,
/// `EAGAIN` while another thread changes the same signal).
pub(crate) fn take(sig: i32, ours: Handler, flags: i32) -> Result<Taken, Error> {
    take_masked(sig, ours, flags, None)
}

/// [`take`], and with `block_all_but: Some(keep)` the handler runs with every signal blocked
/// except those in `keep` (bit `n - 1` for signal `n`): the kernel blocks them as it delivers
/// `sig`, so no other signal that was pending then runs nested before the handler's first
/// instruction.
pub(crate) fn take_masked(
    sig: i32,
    ours: Handler,
    flags: i32,
    block_all_but: Option<u64>,
) -> Result<Taken, Error> {
    let Some(s) = slot(sig) else {
        return Err(sigaction_err(libc::EINVAL));
    };
    if sig == libc::SIGKILL || sig == libc::SIGSTOP {
        return Err(sigaction_err(libc::EINVAL));
    }
    let was = claim(s).map_err(sigaction_err)?;
    let result = (|| {
        let old = query(sig)?;
        if old.sa_sigaction == ours as *const () as usize {
            return Ok(Taken::Already);
        }
        // SAFETY: state 1 makes `action` ours (see `Saved`).
        unsafe { *s.action.get() = old };
        s.handler.store(old.sa_sigaction, Ordering::Relaxed);
        s.flags.store(old.sa_flags as usize, Ordering::Relaxed);
        // SAFETY: all-zero is a valid sigaction.
        let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
        sa.sa_sigaction = ours as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | flags;
        match block_all_but {
            Some(keep) => sa.sa_mask = all_except(keep),
            // SAFETY: sa.sa_mask is a valid sigset_t.
            None => unsafe {
                libc::sigemptyset(&mut sa.sa_mask);
            },
        }
        // SAFETY: sa is fully initialised. Until `state` is 2 (stored below), a signal that
        // reaches our handler meanwhile does not chain.
        if unsafe { libc::sigaction(sig, &sa, core::ptr::null_mut()) } != 0 {
            return Err(super::errno());
        }
        Ok(Taken::Now)
    })();
    let now = match result {
        Ok(Taken::Now) => 2,
        _ => was,
    };
    s.state.store(now, Ordering::Release);
    result.map_err(sigaction_err)
}

/// In a forked child (one thread): a signal whose action a thread of the parent was changing
/// at the fork (state 1, a claim nobody will end) is settled from the action the kernel has
/// now: the saved previous handler there means ours was not installed (or was given back):
/// nothing saved; anything else means ours is installed over the saved action (which `take`
/// writes before it installs). Without this, every later change of that signal failed with
/// `EAGAIN` in the child.
pub(crate) fn after_fork() {
    for (sig, s) in SAVED.iter().enumerate().skip(1) {
        if s.state.load(Ordering::Acquire) != 1 {
            continue;
        }
        let now = match query(sig as i32) {
            Ok(a) if a.sa_sigaction == s.handler.load(Ordering::Relaxed) => 0,
            Ok(_) => 2,
            Err(_) => 0,
        };
        s.state.store(now, Ordering::Release);
    }
}

/// The handler that was installed before ours (`SIG_DFL` when none was saved).
pub(crate) fn previous_handler(sig: i32) -> usize {
    match slot(sig) {
        Some(s) if s.state.load(Ordering::Acquire) == 2 => s.handler.load(Ordering::Relaxed),
        _ => libc::SIG_DFL,
    }
}

/// Calls the saved action of `sig` if it is a function; returns whether one was called.
pub(crate) fn call_previous(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) -> bool {
    let Some(s) = slot(sig) else {
        return false;
    };
    if s.state.load(Ordering::Acquire) != 2 {
        return false;
    }
    let h = s.handler.load(Ordering::Relaxed);
    let flags = s.flags.load(Ordering::Relaxed) as i32;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return false;
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the saved handler was installed with SA_SIGINFO, so it has this signature.
        let f: Handler = unsafe { core::mem::transmute::<usize, Handler>(h) };
        f(sig, info, uc);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO takes the signal number.
        let f: extern "C" fn(i32) = unsafe { core::mem::transmute::<usize, extern "C" fn(i32)>(h) };
        f(sig);
    }
    true
}

/// Removes `ours` from `sig`: puts the saved action back, or `SIG_IGN` if the saved action was
/// `SIG_DFL` and `ignore_instead_of_default` (a late signal of ours would kill). Does nothing
/// if `ours` is not installed (someone replaced it: theirs stays). Fails with [`Error::Sys`]
/// `sigaction` and the `errno`.
pub(crate) fn give_back(
    sig: i32,
    ours: Handler,
    ignore_instead_of_default: bool,
) -> Result<(), Error> {
    let Some(s) = slot(sig) else {
        return Err(sigaction_err(libc::EINVAL));
    };
    let was = claim(s).map_err(sigaction_err)?;
    let result = (|| {
        let cur = query(sig)?;
        if cur.sa_sigaction != ours as *const () as usize {
            return Ok(false);
        }
        let mut back = if was == 2 {
            // SAFETY: state 1 makes `action` ours (see `Saved`).
            unsafe { *s.action.get() }
        } else {
            // SAFETY: all-zero is a valid sigaction (SIG_DFL).
            unsafe { core::mem::zeroed() }
        };
        if back.sa_sigaction == libc::SIG_DFL && ignore_instead_of_default {
            back.sa_sigaction = libc::SIG_IGN;
            back.sa_flags = 0;
        }
        // SAFETY: `back` is a valid action (the kernel gave it to us, or built above).
        if unsafe { libc::sigaction(sig, &back, core::ptr::null_mut()) } != 0 {
            return Err(super::errno());
        }
        Ok(true)
    })();
    // Given back: nothing saved any more (a later take saves what is there then).
    let now = match result {
        Ok(true) => 0,
        _ => was,
    };
    s.state.store(now, Ordering::Release);
    result.map(|_| ()).map_err(sigaction_err)
}

/// Whether `ours` is the installed handler of `sig`.
pub(crate) fn is_installed(sig: i32, ours: Handler) -> bool {
    query(sig).is_ok_and(|a| a.sa_sigaction == ours as *const () as usize)
}

/// Which part of selftrace holds a signal: one signal serves one purpose, and a second use is
/// refused with an error that names the conflict ([`check_use`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Owner {
    /// The crash handler (`crash::Builder::signals`).
    Crash = 1,
    /// The stack-request handler of `threads`.
    Request = 2,
    /// The dump handler of `threads::install_dump_signal`.
    Dump = 3,
    /// A running profiler's sampling handler.
    Profiler = 4,
}

/// The owner of each signal (0 = none).
static OWNERS: [AtomicU8; SIGNALS] = [const { AtomicU8::new(0) }; SIGNALS];

/// Records that `owner` holds `sig` (`None`: nobody any more).
///
/// # Async-signal safety
/// Async-signal-safe (an atomic store).
pub(crate) fn set_owner(sig: i32, owner: Option<Owner>) {
    if (1..SIGNALS as i32).contains(&sig) {
        OWNERS[sig as usize].store(owner.map_or(0, |o| o as u8), Ordering::Release);
    }
}

/// Who holds `sig`, if any part of selftrace does.
pub(crate) fn owner(sig: i32) -> Option<Owner> {
    if !(1..SIGNALS as i32).contains(&sig) {
        return None;
    }
    match OWNERS[sig as usize].load(Ordering::Acquire) {
        1 => Some(Owner::Crash),
        2 => Some(Owner::Request),
        3 => Some(Owner::Dump),
        4 => Some(Owner::Profiler),
        _ => None,
    }
}

/// Whether `sig` is a synchronous fault signal: the kernel sends it to a thread for the
/// instruction it ran (a bad access, an illegal or trapping instruction, a bad system call),
/// so it means a crash, not a request.
pub(crate) fn is_fault_signal(sig: i32) -> bool {
    [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGSYS,
    ]
    .contains(&sig)
}

/// Whether `sig` can serve `wanted`: not a signal that cannot be caught, not a synchronous
/// fault signal for anything but the crash handler, and not held by another part of selftrace.
/// The error names the conflict.
///
/// # Async-signal safety
/// Async-signal-safe (atomic loads).
pub(crate) fn check_use(sig: i32, wanted: Owner) -> Result<(), crate::error::Error> {
    use crate::error::Error::InvalidInput as Invalid;
    if !(1..SIGNALS as i32).contains(&sig) || sig == libc::SIGKILL || sig == libc::SIGSTOP {
        return Err(Invalid("signal cannot be handled"));
    }
    if wanted != Owner::Crash && is_fault_signal(sig) {
        return Err(Invalid(match wanted {
            Owner::Request => {
                "a synchronous fault signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS) \
                 cannot request stacks: a request would be taken for a crash"
            }
            Owner::Dump => {
                "a synchronous fault signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS) \
                 cannot be the dump signal"
            }
            _ => {
                "a synchronous fault signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS) \
                 cannot sample"
            }
        }));
    }
    let Some(held) = owner(sig) else {
        return Ok(());
    };
    if held == wanted {
        return Ok(());
    }
    Err(Invalid(match (held, wanted) {
        (Owner::Crash, Owner::Request) => {
            "the signal is the crash handler's (crash::Builder::signals): it cannot also \
             request stacks"
        }
        (Owner::Crash, Owner::Dump) => {
            "the signal is the crash handler's (crash::Builder::signals): it cannot also be \
             the dump signal"
        }
        (Owner::Crash, _) => {
            "the signal is the crash handler's (crash::Builder::signals): it cannot also sample"
        }
        (Owner::Request, Owner::Crash) => {
            "the signal is the stack-request signal of selftrace::threads: it cannot also be a \
             crash signal"
        }
        (Owner::Request, Owner::Dump) => "the stack-request signal cannot also be the dump signal",
        (Owner::Request, _) => "the stack-request signal of selftrace::threads cannot also sample",
        (Owner::Dump, Owner::Crash) => {
            "the signal is the dump signal of selftrace::threads: it cannot also be a crash \
             signal"
        }
        (Owner::Dump, Owner::Request) => "the dump signal cannot also request stacks",
        (Owner::Dump, _) => "the dump signal of selftrace::threads cannot also sample",
        (Owner::Profiler, Owner::Crash) => {
            "the signal is the running profiler's: it cannot also be a crash signal"
        }
        (Owner::Profiler, Owner::Request) => {
            "the signal is the running profiler's: it cannot also request stacks"
        }
        (Owner::Profiler, _) => {
            "the signal is the running profiler's: it cannot also be the \
                                 dump signal"
        }
    }))
}

/// Saves the calling thread's `errno` and puts it back when dropped (pprof-rs's
/// `ErrnoProtector`). Every handler selftrace installs holds one for its whole run, so that the
/// interrupted code finds `errno` as it left it, whatever the handler's system calls did.
///
/// # Async-signal safety
/// Async-signal-safe (`__errno_location` only).
pub(crate) struct ErrnoGuard(i32);

impl ErrnoGuard {
    /// Saves `errno` now.
    pub(crate) fn new() -> ErrnoGuard {
        ErrnoGuard(super::errno())
    }
}

impl Drop for ErrnoGuard {
    fn drop(&mut self) {
        // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

#[cfg(test)]
mod fork_tests {
    use super::*;

    extern "C" fn ours(_: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

    /// A claim left by a thread of the parent (state 1) is settled in the child: changes of
    /// the signal work again instead of failing with EAGAIN.
    #[test]
    fn a_change_under_way_at_the_fork_is_settled_in_the_child() {
        let sig = libc::SIGRTMIN() + 11;
        let s = slot(sig).unwrap();
        // Ours installed, previous saved, then a give_back under way in a parent thread.
        assert_eq!(take(sig, ours, 0), Ok(Taken::Now));
        s.state.store(1, Ordering::Release);
        assert_eq!(take(sig, ours, 0), Err(sigaction_err(libc::EAGAIN)));
        after_fork();
        assert_eq!(s.state.load(Ordering::Acquire), 2);
        assert_eq!(give_back(sig, ours, false), Ok(()));
        assert_eq!(s.state.load(Ordering::Acquire), 0);
        // A take under way before it installed ours: the kernel still has the previous one.
        s.handler
            .store(query(sig).unwrap().sa_sigaction, Ordering::Relaxed);
        s.state.store(1, Ordering::Release);
        after_fork();
        assert_eq!(s.state.load(Ordering::Acquire), 0);
        assert_eq!(take(sig, ours, 0), Ok(Taken::Now));
        assert_eq!(give_back(sig, ours, false), Ok(()));
    }
}

#[cfg(test)]
mod errno_tests {
    use super::ErrnoGuard;

    #[test]
    fn errno_guard_puts_errno_back() {
        // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
        let set = |v| unsafe { *libc::__errno_location() = v };
        set(libc::EINTR);
        let guard = ErrnoGuard::new();
        set(libc::EBADF);
        drop(guard);
        assert_eq!(crate::sys::errno(), libc::EINTR);
    }
}
