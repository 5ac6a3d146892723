//! Markers the kernel had to drop are counted, not lost without a word: 8 threads write 10,000
//! sections each (160,000 events) into an instance with a small ring buffer; what
//! `read_markers_counted` returns plus what it says was dropped accounts for every event.
//! Needs root and tracefs (Linux 6.17+ for marker copying); skips otherwise.

mod markers_util;

use markers_util::*;
use selftrace::trace;

#[test]
fn dropped_markers_are_counted() {
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
    let (events, dropped) = inst.read_markers_counted().unwrap();
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
