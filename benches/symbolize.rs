//! Symbolization costs, selftrace against glibc's `backtrace_symbols` and the `backtrace` crate,
//! in one run:
//!
//! * per frame: the async-signal-safe name lookup (`symbolize`), without and with demangling;
//!   glibc `backtrace_symbols`; `backtrace::resolve` (warm);
//! * a whole stack: `selftrace::Backtrace::capture()` (capture + names + file:line + inlined
//!   frames) against `backtrace::Backtrace::new()` (capture + resolve), warm;
//! * the first `Backtrace` of a fresh process (this binary re-run as a child; each child
//!   reports the time of its first capture).
//!
//! Run: `cargo bench --bench symbolize`.

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use std::ffi::{c_char, c_int, c_void};
use std::hint::black_box;
use std::time::{Duration, Instant};

extern "C" {
    fn backtrace_symbols(buffer: *const *mut c_void, size: c_int) -> *mut *mut c_char;
}

const FIRST_ENV: &str = "SELFTRACE_BENCH_FIRST";

/// Calls `f` at the bottom of a chain of `depth` non-inlined frames.
#[inline(never)]
fn deep<R>(depth: usize, f: &mut dyn FnMut() -> R) -> R {
    if depth == 0 {
        f()
    } else {
        let r = deep(depth - 1, f);
        black_box(depth);
        r
    }
}

/// A captured stack, ~25 frames deep, as return addresses.
fn stack() -> Vec<usize> {
    deep(12, &mut || {
        let mut buf = [0usize; 128];
        let n = selftrace::capture(&mut buf);
        buf[..n].to_vec()
    })
}

fn per_frame(c: &mut Criterion) {
    selftrace::symbolize::prepare().expect("prepare");
    let frames = stack();
    let lookups: Vec<usize> = frames.iter().map(|a| a - 1).collect();
    let n = frames.len();
    let mut g = c.benchmark_group("per_frame");
    g.throughput(Throughput::Elements(n as u64));
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    g.bench_function("selftrace_symbolize", |b| {
        b.iter(|| {
            for &a in &lookups {
                black_box(selftrace::symbolize(black_box(a)));
            }
        })
    });
    g.bench_function("selftrace_symbolize_name", |b| {
        // The raw name copied out, as a crash report or a profile needs it.
        let mut buf = [0u8; 1024];
        b.iter(|| {
            for &a in &lookups {
                if let Some(n) = selftrace::symbolize(black_box(a)).and_then(|s| s.name) {
                    black_box(n.copy_to(&mut buf));
                }
            }
        })
    });
    g.bench_function("selftrace_symbolize_batched", |b| {
        b.iter(|| {
            selftrace::symbolize::with_symbolizer(|s| {
                for &a in &lookups {
                    black_box(s.symbolize(black_box(a)));
                }
            })
        })
    });
    g.bench_function("selftrace_symbolize_demangle", |b| {
        let mut buf = [0u8; 512];
        b.iter(|| {
            for &a in &lookups {
                if let Some(s) = selftrace::symbolize(black_box(a)) {
                    black_box(s.demangle_into(&mut buf));
                }
            }
        })
    });
    g.bench_function("selftrace_backtrace_symbols", |b| {
        b.iter(|| black_box(selftrace::backtrace_symbols(black_box(&frames))))
    });
    g.bench_function("glibc_backtrace_symbols", |b| {
        let ptrs: Vec<*mut c_void> = frames.iter().map(|&a| a as *mut c_void).collect();
        b.iter(|| {
            // SAFETY: ptrs holds n pointers; glibc returns one malloc'd block that we free.
            unsafe {
                let out = backtrace_symbols(ptrs.as_ptr(), n as c_int);
                black_box(*out);
                libc::free(out.cast());
            }
        })
    });
    g.bench_function("backtrace_crate_resolve_warm", |b| {
        for &a in &frames {
            backtrace::resolve(a as *mut c_void, |s| {
                black_box(s.name());
            });
        }
        b.iter(|| {
            for &a in &frames {
                backtrace::resolve(black_box(a) as *mut c_void, |s| {
                    black_box(s.name());
                });
            }
        })
    });
    g.finish();
}

fn whole_stack(c: &mut Criterion) {
    selftrace::symbolize::prepare().expect("prepare");
    let mut g = c.benchmark_group("whole_stack_warm");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    let frames = deep(12, &mut || selftrace::Backtrace::capture().frames().len());
    g.throughput(Throughput::Elements(frames as u64));
    g.bench_function(
        BenchmarkId::new("selftrace_Backtrace_capture", frames),
        |b| b.iter(|| deep(12, &mut || black_box(selftrace::Backtrace::capture()))),
    );
    g.bench_function(
        BenchmarkId::new("backtrace_crate_Backtrace_new", frames),
        |b| b.iter(|| deep(12, &mut || black_box(backtrace::Backtrace::new()))),
    );
    // Where the time goes: the stack walk alone, and the resolution alone.
    g.bench_function(BenchmarkId::new("selftrace_capture_only", frames), |b| {
        b.iter(|| {
            deep(12, &mut || {
                let mut buf = [0usize; 128];
                black_box(selftrace::capture(&mut buf))
            })
        })
    });
    g.bench_function(
        BenchmarkId::new("backtrace_crate_new_unresolved", frames),
        |b| {
            b.iter(|| {
                deep(
                    12,
                    &mut || black_box(backtrace::Backtrace::new_unresolved()),
                )
            })
        },
    );
    let addrs = stack();
    g.bench_function(BenchmarkId::new("selftrace_resolve_only", frames), |b| {
        b.iter(|| {
            black_box(selftrace::Backtrace::from_addresses(
                black_box(&addrs),
                false,
            ))
        })
    });
    let unresolved = deep(12, &mut backtrace::Backtrace::new_unresolved);
    g.bench_function(
        BenchmarkId::new("backtrace_crate_resolve_only", frames),
        |b| {
            b.iter_batched(
                || unresolved.clone(),
                |mut bt| {
                    bt.resolve();
                    bt
                },
                criterion::BatchSize::SmallInput,
            )
        },
    );
    g.finish();
}

/// In a child: the time of the first full backtrace of this process, in nanoseconds.
fn first_in_child(which: &str) -> u128 {
    let t = Instant::now();
    match which {
        "selftrace" => {
            // Everything the first backtrace needs: module map, unwinder, symbol index, DWARF.
            selftrace::symbolize::prepare().expect("prepare");
            let bt = deep(12, &mut || selftrace::Backtrace::capture());
            black_box(bt.to_string());
        }
        _ => {
            let bt = deep(12, &mut || backtrace::Backtrace::new());
            black_box(format!("{bt:?}"));
        }
    }
    t.elapsed().as_nanos()
}

fn first_in_process(c: &mut Criterion) {
    let me = std::env::current_exe().unwrap();
    let mut g = c.benchmark_group("first_in_process");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_millis(1));
    for which in ["selftrace", "backtrace_crate"] {
        g.bench_function(which, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let out = std::process::Command::new(&me)
                        .env(FIRST_ENV, which)
                        .output()
                        .unwrap();
                    let ns: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
                    total += Duration::from_nanos(ns);
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, per_frame, whole_stack, first_in_process);

fn main() {
    if let Ok(which) = std::env::var(FIRST_ENV) {
        println!("{}", first_in_child(&which));
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
