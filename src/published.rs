//! A value published for lock-free readers, including signal handlers.
//!
//! Readers announce themselves on a counter, then load the pointer; a writer (normal context
//! only) swaps in a new value and frees the old one once no reader is left. A reader never sees
//! freed memory, never blocks and never allocates.
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A lock-free published `T`.
pub(crate) struct Published<T> {
    ptr: AtomicPtr<T>,
    readers: AtomicUsize,
    writer: Mutex<()>,
}

/// How long a writer waits for readers of the old value before it gives up and leaks it.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

impl<T> Published<T> {
    /// An empty cell.
    pub(crate) const fn new() -> Self {
        Published {
            ptr: AtomicPtr::new(core::ptr::null_mut()),
            readers: AtomicUsize::new(0),
            writer: Mutex::new(()),
        }
    }

    /// Runs `f` on the current value (`None` before the first publish).
    ///
    /// # Async-signal safety
    /// Async-signal-safe: two atomic increments, a load, no lock, no allocation.
    #[inline]
    pub(crate) fn read<R>(&self, f: impl FnOnce(Option<&T>) -> R) -> R {
        self.readers.fetch_add(1, Ordering::SeqCst);
        let p = self.ptr.load(Ordering::SeqCst);
        // SAFETY: p is null or a Box-allocated T published by `publish`; it is not freed while
        // `readers` is non-zero, and we hold one count until `f` returns.
        let r = f(unsafe { p.as_ref() });
        self.readers.fetch_sub(1, Ordering::Release);
        r
    }

    /// Builds and publishes a new value under the writer lock; `build` sees the old value.
    /// Returns `false` without building when `try_only` is set and another writer is busy.
    ///
    /// Not async-signal-safe: call in normal context only.
    pub(crate) fn update(
        &self,
        try_only: bool,
        build: impl FnOnce(Option<&T>) -> Option<T>,
    ) -> bool {
        let _guard = if try_only {
            match self.writer.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return false,
            }
        } else {
            self.writer.lock().unwrap_or_else(|p| p.into_inner())
        };
        let old = self.ptr.load(Ordering::Acquire);
        // SAFETY: only writers (serialised by the lock we hold) free values, so `old` is live.
        let Some(new) = build(unsafe { old.as_ref() }) else {
            return false;
        };
        let new = Box::into_raw(Box::new(new));
        let old = self.ptr.swap(new, Ordering::SeqCst);
        if !old.is_null() {
            let start = Instant::now();
            while self.readers.load(Ordering::SeqCst) != 0 {
                if start.elapsed() > DRAIN_LIMIT {
                    // Readers never drained (a handler stuck mid-walk?): leak rather than free
                    // memory that someone may still read.
                    return true;
                }
                std::thread::yield_now();
            }
            // SAFETY: `old` came from Box::into_raw, is no longer reachable through `ptr`, and
            // every reader that could have loaded it has finished.
            drop(unsafe { Box::from_raw(old) });
        }
        true
    }
}
