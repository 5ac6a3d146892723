//! Shared helpers of the trace-marker tests: skip-or-fail, private instances, read-back.
#![allow(dead_code)]

use selftrace::trace;
use selftrace::tracefs::{Instance, MarkerEvent};

/// Whether CI demands tracefs (`SELFTRACE_REQUIRE_TRACEFS=1`): then a missing facility fails.
pub fn required() -> bool {
    std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_some_and(|v| v == "1")
}

/// Skips (returns `None` after saying why) or, under `SELFTRACE_REQUIRE_TRACEFS=1`, fails.
pub fn skip<T>(test: &str, why: impl std::fmt::Display) -> Option<T> {
    if required() {
        panic!("{test}: {why} (SELFTRACE_REQUIRE_TRACEFS=1, so this fails instead of skipping)");
    }
    eprintln!("SKIP {test}: {why}");
    None
}

/// The global marker writer, attached to the default `trace_marker`, and a private instance
/// that records its markers; or a skip.
pub fn setup(test: &str) -> Option<Instance> {
    setup_with_buffer(test, None)
}

/// Like [`setup`], with the instance's ring buffer sized before it starts copying markers
/// (resizing a marker-copying instance makes every process's marker writes fail meanwhile).
#[allow(dead_code)]
pub fn setup_with_buffer(test: &str, kib: Option<u32>) -> Option<Instance> {
    let st = trace::init();
    if st != trace::Status::Enabled {
        return skip(test, format_args!("trace markers unavailable: {st}"));
    }
    let inst = match kib {
        Some(kib) => Instance::for_markers_with_buffer("selftrace-markers-test", kib),
        None => Instance::for_markers("selftrace-markers-test"),
    };
    match inst {
        Ok(i) => Some(i),
        Err(e) => skip(test, format_args!("cannot create a tracefs instance: {e}")),
    }
}

/// A token unique to this test run, to put in names.
pub fn token(test: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{test}-{}", n % 1_000_000_000_000)
}

pub fn pid() -> u32 {
    std::process::id()
}

pub fn tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Every marker recorded by this process's thread `tid`.
pub fn events_of(inst: &Instance, tid: u32) -> Vec<MarkerEvent> {
    inst.read_markers()
        .expect("read markers")
        .into_iter()
        .filter(|e| e.tid == tid)
        .collect()
}

/// The texts of [`events_of`].
pub fn texts_of(inst: &Instance, tid: u32) -> Vec<String> {
    events_of(inst, tid).into_iter().map(|e| e.text).collect()
}
