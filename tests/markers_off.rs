//! Tracing off: writes fail with `EBADF`, which is counted and transient (the writer keeps
//! trying and markers flow again once tracing is back on).
//!
//! The writer is pointed at a private instance's own `trace_marker` (without
//! `copy_trace_marker`) whose `tracing_on` is 0, so the global `tracing_on` and other
//! processes' markers are never disturbed. One test: this binary owns the process-wide writer.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "trace", feature = "tracefs"))]

mod markers_util;

use markers_util::*;
use selftrace::trace;
use selftrace::tracefs::Instance;

/// Points the writer away from the instance before the instance is removed (an open
/// `trace_marker` pins its instance), also when the test fails.
struct DetachOnDrop;
impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        trace::detach();
    }
}

#[test]
fn tracing_off_is_a_transient_ebadf() {
    let test = "tracing_off_is_a_transient_ebadf";
    let inst = match Instance::create("selftrace-markers-off") {
        Ok(i) => i,
        Err(e) => {
            return skip(test, format_args!("cannot create a tracefs instance: {e}")).unwrap_or(())
        }
    };
    inst.set_tracing_on(false).unwrap();
    if let Err(e) = trace::set_marker_path(inst.marker_path()) {
        return skip(
            test,
            format_args!("cannot open the instance's trace_marker: {e}"),
        )
        .unwrap_or(());
    }
    let _detach = DetachOnDrop;
    assert_eq!(trace::status(), trace::Status::Enabled);
    assert_eq!(trace::marker_path(), Some(inst.marker_path()));

    let t = token("off");
    let before = trace::stats();
    trace::instant(&format!("{t} lost"));
    {
        let _s = trace::section!("{t} lost section");
    }
    trace::set_counter(&format!("{t} lost counter"), 1);
    let after = trace::stats();
    assert_eq!(after.ebadf, before.ebadf + 4, "{after:?}");
    assert_eq!(after.other_errors, before.other_errors);
    // Transient: still enabled, nothing latched.
    assert!(trace::is_enabled());
    assert_eq!(trace::status(), trace::Status::Enabled);

    inst.set_tracing_on(true).unwrap();
    trace::instant(&format!("{t} back"));
    assert_eq!(trace::stats().ebadf, after.ebadf);
    let texts: Vec<String> = inst
        .read_markers()
        .unwrap()
        .into_iter()
        .filter(|e| e.name.starts_with(&t) || (e.tid == tid() && e.text.starts_with('E')))
        .map(|e| e.text)
        .collect();
    assert_eq!(texts, [format!("I|{}|{t} back", pid())]);

    // Detaching releases the file: the instance can be removed.
    trace::detach();
    assert_eq!(trace::status(), trace::Status::Detached);
    assert!(!trace::is_enabled());
    trace::instant("nothing");
    assert_eq!(trace::stats().ebadf, after.ebadf);
}
