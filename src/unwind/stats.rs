//! The unwinder's counters ([`super::UnwindStats`]): relaxed atomics bumped on the slow paths.

use super::types::UnwindStats;
use core::sync::atomic::{AtomicU64, Ordering};

/// Windows copied through the kernel.
pub(crate) static COPIES: AtomicU64 = AtomicU64::new(0);
/// Rules derived from the CFI.
pub(crate) static DERIVED: AtomicU64 = AtomicU64::new(0);
/// Walks repeated precisely.
pub(crate) static PRECISE: AtomicU64 = AtomicU64::new(0);

/// Adds one to a counter.
#[inline]
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The unwinder's counters ([`UnwindStats`]).
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn stats() -> UnwindStats {
    UnwindStats {
        copies: COPIES.load(Ordering::Relaxed),
        rules_derived: DERIVED.load(Ordering::Relaxed),
        precise_walks: PRECISE.load(Ordering::Relaxed),
        frames_reused: super::reuse::reused(),
    }
}
