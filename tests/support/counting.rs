//! A counting global allocator for the zero-allocation tests. It counts only calls made by a
//! thread that asked for it ([`counting`]), because the test harness's other threads allocate.
//!
//! Use: `#[global_allocator] static GLOBAL: counting::Counting = counting::Counting;`

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Forwards to the system allocator and counts allocations, reallocations and frees.
pub struct Counting;

thread_local! {
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
}
static CALLS: AtomicUsize = AtomicUsize::new(0);

fn note() {
    if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
        CALLS.fetch_add(1, Ordering::SeqCst);
    }
}

// SAFETY: forwards every call to the system allocator; only adds a counter.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

/// Runs `f` on this thread with counting on; returns its result and the number of allocator
/// calls it made. Async-signal-safe (a signal handler may use it).
#[allow(dead_code)]
pub fn counting<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let was = COUNT_HERE.try_with(|c| c.replace(true)).unwrap_or(false);
    let before = CALLS.load(Ordering::SeqCst);
    let r = f();
    let calls = CALLS.load(Ordering::SeqCst) - before;
    let _ = COUNT_HERE.try_with(|c| c.set(was));
    (r, calls)
}

/// Starts counting on this thread (for code that must not run inside a closure, e.g. to keep
/// its stack shape); returns the token for [`stop`].
#[allow(dead_code)]
pub fn start() -> usize {
    let _ = COUNT_HERE.try_with(|c| c.set(true));
    CALLS.load(Ordering::SeqCst)
}

/// Stops counting on this thread; returns the allocator calls since [`start`].
#[allow(dead_code)]
pub fn stop(token: usize) -> usize {
    let calls = CALLS.load(Ordering::SeqCst) - token;
    let _ = COUNT_HERE.try_with(|c| c.set(false));
    calls
}
