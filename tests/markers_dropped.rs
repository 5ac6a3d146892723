//! Markers the kernel had to drop are counted, not lost without a word: 8 threads write 10,000
//! sections each (160,000 events) into an instance with a small ring buffer; what
//! `read_markers_counted` returns plus what it says was dropped accounts for every event.
//! The same through a `tracefs::Session`, for its uprobe hits and markers together.
//! Needs root and tracefs (Linux 6.17+ for marker copying); skips otherwise.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "trace", feature = "tracefs"))]

mod markers_util;

use markers_util::*;
use selftrace::trace;
use selftrace::tracefs::{self, Session};
use std::sync::Mutex;

/// One test at a time: each instance copies every process's markers, so the tests of this
/// file would count each other's.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn dropped_markers_are_counted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(inst) = setup_with_buffer("dropped_markers_are_counted", Some(64)) else {
        return;
    };
    if !inst.copies_markers() {
        skip::<()>(
            "dropped_markers_are_counted",
            "no copy_trace_marker (Linux 6.17+)",
        );
        return;
    }
    const THREADS: usize = 8;
    const SECTIONS: usize = 10_000;
    let tag = token("drop");
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            let tag = &tag;
            s.spawn(move || {
                for _ in 0..SECTIONS {
                    trace::begin_section(tag);
                    trace::end_section();
                }
            });
        }
    });
    let written = (THREADS * SECTIONS * 2) as u64;
    let read = inst.read_markers_counted().unwrap();
    let (events, dropped) = (&read.events, read.dropped);
    // What the kernel wrote is parsed whole: the drops are counted, not hidden in bad lines.
    assert!(read.unparsed.is_empty(), "{}", read.unparsed);
    assert!(!read.is_complete());
    let me = std::process::id();
    let ours = events.iter().filter(|e| e.pid == Some(me)).count() as u64;
    println!(
        "{written} marker events written, {ours} read back, {dropped} dropped by the kernel (64 KiB per CPU)"
    );
    assert!(dropped > 0, "a 64 KiB buffer cannot hold {written} events");
    // Every event is either read or counted as dropped (other processes' markers, copied into
    // the instance too, can only add to the dropped count).
    assert!(ours + dropped >= written, "{ours} + {dropped} < {written}");
    assert!(ours < written);
    assert_eq!(inst.dropped_events().unwrap(), dropped);
}

/// The function the session test puts a uprobe on.
#[no_mangle]
#[inline(never)]
pub extern "C" fn markers_dropped_hit(i: u64) -> u64 {
    std::hint::black_box(i) ^ 1
}

#[test]
fn session_counts_dropped_hits_and_markers() {
    const TEST: &str = "session_counts_dropped_hits_and_markers";
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let st = trace::init();
    if st != trace::Status::Enabled {
        skip::<()>(TEST, format_args!("trace markers unavailable: {st}"));
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip::<()>(TEST, "not root");
        return;
    }
    // Removed on drop, also while a failed assertion unwinds: its uprobe event and instance.
    let mut s = match Session::with_options("selftrace-markers-test", true, 16) {
        Ok(s) => s,
        Err(e) => {
            skip::<()>(TEST, format_args!("cannot create a session: {e}"));
            return;
        }
    };
    if !s.instance().copies_markers() {
        skip::<()>(TEST, "no copy_trace_marker (Linux 6.17+)");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    s.add_function(&exe, "markers_dropped_hit", false, "i=%di:u64")
        .unwrap();
    // Hits of this thread only (markers are not filtered).
    s.filter_pids(&[tid()], false).unwrap();
    s.enable().unwrap();
    const N: u64 = 20_000;
    let tag = token("session-drop");
    for i in 0..N {
        trace::instant(&tag);
        std::hint::black_box(markers_dropped_hit(i));
    }
    s.disable().unwrap();
    s.instance()
        .write_file("options/copy_trace_marker", "0")
        .unwrap();
    // The events first, then the count: an event overwritten in between is then counted
    // twice (kept and dropped), never missed by both.
    let text = s.instance().read_trace().unwrap();
    let hits = s.hits(&text);
    let me = tid();
    let markers = tracefs::markers(&text)
        .into_iter()
        .filter(|m| m.tid == me && m.name == tag)
        .count() as u64;
    let dropped = s.dropped_events().unwrap();
    let written = 2 * N;
    let kept = hits.len() as u64 + markers;
    println!(
        "{written} events written ({N} hits, {N} markers), {} hits and {markers} markers read \
         back, {dropped} dropped by the kernel (16 KiB per CPU)",
        hits.len()
    );
    assert!(dropped > 0, "16 KiB per CPU cannot hold {written} events");
    assert!(kept < written);
    // Every hit and marker is either read or counted as dropped (other processes' markers,
    // copied into the instance too, can only add to the count).
    assert!(
        kept + dropped >= written,
        "{kept} read + {dropped} dropped < {written}"
    );
    // The hits read back are this thread's calls, each once, in order.
    let args: Vec<u64> = hits.iter().filter_map(|h| h.arg_u64("i")).collect();
    assert_eq!(args.len(), hits.len());
    assert!(args.windows(2).all(|w| w[0] < w[1]), "{args:?}");
    assert!(args.iter().all(|&i| i < N), "{args:?}");
    assert_eq!(s.instance().dropped_events().unwrap(), dropped);
}
