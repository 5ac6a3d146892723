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

#[path = "cpu_time.rs"]
mod cpu_time;
use cpu_time::{cpu, thread_cpu_time};

fn disabled(c: &mut Criterion) {
    let mut g = c.benchmark_group("disabled");
    trace::set_tags(0);
    g.bench_function("begin_section", |b| {
        cpu(b, || trace::begin_section(black_box("frame 1234")))
    });
    g.bench_function("section! formatted", |b| {
        cpu(b, || trace::section!("frame {}", black_box(1234)))
    });
    g.bench_function("is_enabled", |b| cpu(b, trace::is_enabled));
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
        cpu(b, || {
            // SAFETY: fd is open for the whole bench; the buffer is valid.
            unsafe { libc::write(fd, black_box(line.as_ptr()).cast(), line.len()) }
        })
    });
    g.bench_function("selftrace begin_section", |b| {
        cpu(b, || trace::begin_section(black_box(name)))
    });
    g.bench_function("selftrace begin_section! formatted", |b| {
        cpu(b, || trace::begin_section!("frame {}", black_box(1234)))
    });
    let mut naive = &file;
    g.bench_function("naive writeln!(file, ..)", |b| {
        cpu(b, || {
            writeln!(naive, "B|{}|{}", std::process::id(), black_box(name))
        })
    });
    g.finish();
    interleaved(fd, &line, name);
}

/// The ratio begin_section / raw write, robust to a busy machine: short batches of each,
/// alternated, keeping the fastest batch of each.
fn interleaved(fd: i32, line: &str, name: &str) {
    const BATCH: u32 = 2000;
    let (mut raw, mut ours) = (Duration::MAX, Duration::MAX);
    for _ in 0..200 {
        let t0 = thread_cpu_time();
        for _ in 0..BATCH {
            // SAFETY: fd is open; the buffer is valid.
            unsafe { libc::write(fd, black_box(line.as_ptr()).cast(), line.len()) };
        }
        let t1 = thread_cpu_time();
        for _ in 0..BATCH {
            trace::begin_section(black_box(name));
        }
        let t2 = thread_cpu_time();
        raw = raw.min(t1 - t0);
        ours = ours.min(t2 - t1);
    }
    println!(
        "interleaved, fastest of 200 batches of {BATCH}: raw write {:.1} ns, begin_section {:.1} ns, ratio {:.3}",
        raw.as_nanos() as f64 / BATCH as f64,
        ours.as_nanos() as f64 / BATCH as f64,
        ours.as_nanos() as f64 / raw.as_nanos() as f64
    );
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
