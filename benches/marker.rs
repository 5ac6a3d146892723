//! Trace-marker costs: a disabled call; an enabled `begin_section` against the limit (a raw
//! `libc::write` of the same preformatted bytes to the same `trace_marker`); and the naive
//! `writeln!(file, "B|{}|{}", std::process::id(), name)`.
//!
//! The enabled benches write into a private tracefs instance's own `trace_marker`, so the
//! machine's global buffer is not flooded. Needs root and tracefs for those (skipped otherwise).
//!
//! `cargo bench --bench marker`

use std::hint::black_box;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use criterion::Criterion;
use selftrace::trace;
use selftrace::tracefs::Instance;

fn disabled(c: &mut Criterion) {
    let mut g = c.benchmark_group("disabled");
    trace::set_tags(0);
    g.bench_function("begin_section", |b| {
        b.iter(|| trace::begin_section(black_box("frame 1234")))
    });
    g.bench_function("section! formatted", |b| {
        b.iter(|| trace::section!("frame {}", black_box(1234)))
    });
    g.bench_function("is_enabled", |b| b.iter(trace::is_enabled));
    trace::set_tags(trace::TAG_ALL);
    g.finish();
}

fn enabled(c: &mut Criterion, inst: &Instance) {
    let mut g = c.benchmark_group("enabled");
    let name = "frame 1234";
    let line = format!("B|{}|{name}", std::process::id());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(inst.marker_path())
        .expect("open trace_marker");
    let fd = file.as_raw_fd();
    g.bench_function("raw libc::write (the limit)", |b| {
        b.iter(|| {
            // SAFETY: fd is open for the whole bench; the buffer is valid.
            unsafe { libc::write(fd, black_box(line.as_ptr()).cast(), line.len()) }
        })
    });
    g.bench_function("selftrace begin_section", |b| {
        b.iter(|| trace::begin_section(black_box(name)))
    });
    g.bench_function("selftrace begin_section! formatted", |b| {
        b.iter(|| trace::begin_section!("frame {}", black_box(1234)))
    });
    let mut naive = &file;
    g.bench_function("naive writeln!(file, ..)", |b| {
        b.iter(|| writeln!(naive, "B|{}|{}", std::process::id(), black_box(name)))
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
        .configure_from_args();
    let inst = match Instance::create("selftrace-bench") {
        Ok(inst) => match trace::set_marker_path(inst.marker_path()) {
            Ok(()) => Some(inst),
            Err(e) => {
                eprintln!("enabled benches skipped: {e}");
                None
            }
        },
        Err(e) => {
            eprintln!("enabled benches skipped: no tracefs instance: {e}");
            None
        }
    };
    disabled(&mut c);
    if let Some(inst) = &inst {
        enabled(&mut c, inst);
    }
    c.final_summary();
    // Release the instance's trace_marker so that the instance can be removed.
    trace::detach();
    drop(inst);
}
