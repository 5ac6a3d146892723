//! The output lock: one report at a time (crash reports, `dump_stack`, all-thread dumps, watchdog
//! reports), across threads, so that each stays one uninterleaved block.
//!
//! # Async-signal safety
//! [`OutputLock::acquire`] is async-signal-safe: a compare-and-swap, and `nanosleep` while
//! another thread holds the lock. A thread that already holds it (a crash while reporting,
//! `dump_stack` inside a report, a dump signal during a dump) goes on without waiting, and a
//! holder that does not release it within 10 s is presumed dead. A holder that is not a thread
//! of this process (a thread of the parent of a forked child, or one that exited) holds nothing:
//! its lock is taken over at once (`tgkill(tid, 0)`), and a forked child starts with it free
//! ([`after_fork`]).
//!
//! The lock also keeps the table of crashed threads waiting for it ([`publish_waiting`],
//! [`waiting_fault`]): only a holder of the lock reads it (the minidump writer, for the
//! context of each thread at its own fault).

use crate::sys;
use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// The thread writing a report (0 = nobody).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// The thread that holds the output lock now (0 = nobody).
pub(crate) fn owner() -> i32 {
    OWNER.load(Ordering::Acquire)
}

/// A held output lock; released on drop (unless it was taken recursively or by force).
pub(crate) struct OutputLock {
    pub(crate) release: bool,
}

impl OutputLock {
    /// Takes the lock, waiting up to 10 s for another thread's report to end.
    pub(crate) fn acquire() -> OutputLock {
        let tid = sys::gettid();
        let mut waited_ms = 0u32;
        loop {
            match OWNER.compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return OutputLock { release: true },
                Err(t) if t == tid => return OutputLock { release: false },
                Err(t) if crate::fork::holder_gone(t) => {
                    if OWNER
                        .compare_exchange(t, tid, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return OutputLock { release: true };
                    }
                }
                Err(_) => {
                    // Another thread reports; wait (a report takes milliseconds), but not
                    // forever: after 10 s assume it died and go on.
                    if waited_ms >= 10_000 {
                        return OutputLock { release: false };
                    }
                    sys::sleep_ns(5_000_000);
                    waited_ms += 5;
                }
            }
        }
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        if self.release {
            OWNER.store(0, Ordering::Release);
        }
    }
}

/// In a forked child (one thread): the lock is free, whoever held it in the parent, and no
/// thread of the parent waits for it.
pub(crate) fn after_fork() {
    OWNER.store(0, Ordering::Release);
    for (t, _) in &WAITING {
        t.store(0, Ordering::Relaxed);
    }
}

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::CRASH, after_fork);

/// Threads that crashed while another held the report lock, with their fault's ucontext
/// (tid 0: free).
static WAITING: [(AtomicI32, AtomicUsize); 8] =
    [const { (AtomicI32::new(0), AtomicUsize::new(0)) }; 8];

/// Publishes a crashing thread's ucontext while it waits for the report lock; the slot used.
pub(crate) fn publish_waiting(tid: i32, uc: *const libc::ucontext_t) -> Option<usize> {
    if uc.is_null() {
        return None;
    }
    for (i, (t, u)) in WAITING.iter().enumerate() {
        if t.load(Ordering::Relaxed) == 0 {
            u.store(uc as usize, Ordering::Relaxed);
            if t.compare_exchange(0, tid, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                return Some(i);
            }
        }
    }
    None
}

/// Takes a crashing thread out of the table once it holds the report lock.
pub(crate) fn unpublish_waiting(slot: Option<usize>) {
    if let Some(i) = slot {
        WAITING[i].0.store(0, Ordering::Release);
    }
}

/// The ucontext of thread `tid` if it crashed and waits for the report lock (which the caller
/// holds, so the thread stays in its handler and the ucontext on its signal frame).
pub(crate) fn waiting_fault(tid: i32) -> Option<*const libc::ucontext_t> {
    WAITING.iter().find_map(|(t, u)| {
        (t.load(Ordering::Acquire) == tid).then(|| u.load(Ordering::Relaxed) as *const _)
    })
}
