//! The marker API never allocates: checked under a counting global allocator, in normal
//! context and inside a real signal handler, whose call is also the writer's very first
//! (so opening the marker file is allocation-free too). The events written from the handler
//! are read back.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "trace", feature = "tracefs"))]

mod markers_util;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;

use markers_util::*;
use selftrace::trace;
use selftrace::tracefs::Instance;

thread_local! {
    /// Allocations made by this thread (const-initialised: no allocation to access it).
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocs() -> usize {
    ALLOCS.with(|c| c.get())
}

static TOKEN: OnceLock<String> = OnceLock::new();
static LONG: OnceLock<String> = OnceLock::new();
static IN_HANDLER_ALLOCS: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Every kind of call, with plain and formatted names, a truncated name, counters, guards.
fn every_call(t: &str, long: &str, where_: &str) {
    trace::is_enabled();
    trace::begin_section(t);
    trace::end_section();
    {
        let _s = trace::section(t);
        let _f = trace::section!("{t} {where_} {}", 42);
    }
    trace::begin_async_section(t, 1);
    trace::end_async_section(t, 1);
    trace::begin_async_section_for_track(t, t, 2);
    trace::end_async_section_for_track(t, 2);
    trace::instant(t);
    trace::instant!("{t} {where_} {} {}", -7i64, 3.5f64);
    trace::instant_for_track(t, t);
    trace::set_counter(t, i64::MIN);
    trace::set_counter(long, 5);
    let _ = trace::stats();
    let _ = trace::status();
}

extern "C" fn handler(_sig: i32) {
    let t = TOKEN.get().map(String::as_str).unwrap_or("?");
    let long = LONG.get().map(String::as_str).unwrap_or("?");
    let before = allocs();
    every_call(t, long, "handler");
    IN_HANDLER_ALLOCS.store(allocs() - before, SeqCst);
}

#[test]
fn marker_calls_never_allocate() {
    let test = "marker_calls_never_allocate";
    let inst = match Instance::for_markers("selftrace-markers-alloc") {
        Ok(i) => Some(i),
        Err(e) => skip(test, format_args!("cannot create a tracefs instance: {e}")),
    };
    assert_eq!(trace::status(), trace::Status::Uninitialized);
    // The counter counts.
    let b = allocs();
    drop(std::hint::black_box(vec![1u8; 3]));
    assert_eq!(allocs(), b + 1);
    let t = token("alloc");
    TOKEN.set(t.clone()).unwrap();
    LONG.set(format!("{t} {}", "€".repeat(2000))).unwrap();

    // SAFETY: installing a handler that only calls async-signal-safe code.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        assert_eq!(libc::raise(libc::SIGUSR1), 0);
    }
    assert_eq!(
        IN_HANDLER_ALLOCS.load(SeqCst),
        0,
        "allocations inside the signal handler"
    );

    let long = LONG.get().unwrap();
    let before = allocs();
    every_call(&t, long, "normal");
    let n = allocs() - before;
    assert_eq!(n, 0, "allocations in normal context");

    let Some(inst) = inst else { return };
    if trace::status() != trace::Status::Enabled {
        skip::<()>(
            test,
            format_args!("markers unavailable: {}", trace::status()),
        );
        return;
    }
    let p = pid();
    let texts = texts_of(&inst, tid());
    // 15 events per every_call; the handler's came first, and its first call opened the file.
    assert_eq!(texts.len(), 30, "{texts:#?}");
    assert_eq!(texts[0], format!("B|{p}|{t}"));
    assert_eq!(texts[3], format!("B|{p}|{t} handler 42"));
    assert_eq!(texts[11], format!("I|{p}|{t} handler -7 3.5"));
    assert_eq!(texts[13], format!("C|{p}|{t}|-9223372036854775808"));
    assert!(texts[14].ends_with("€|5"));
    assert_eq!(texts[15 + 3], format!("B|{p}|{t} normal 42"));
}
