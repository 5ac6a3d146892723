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

use crate::sys;
use core::sync::atomic::{AtomicI32, Ordering};

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

/// In a forked child (one thread): the lock is free, whoever held it in the parent.
pub(crate) fn after_fork() {
    OWNER.store(0, Ordering::Release);
}
