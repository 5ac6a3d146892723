//! Cost of a disabled USDT probe: a loop of 1000 iterations with and without a probe, for
//! selftrace's `probe!`, `probe_lazy!` and `probe_enabled!`, the `probe` crate's `probe!`, the
//! `usdt` crate's probes, and a C loop with SystemTap's `DTRACE_PROBE1` (built with gcc at
//! start-up into a shared library, skipped when gcc or sys/sdt.h is missing). Nobody traces.
//! The `usdt` crate's probes are x86-64 assembly on Linux: on other targets that peer is left
//! out.

use criterion::{criterion_group, Criterion};
use std::hint::black_box;

const N: u64 = 1000;

#[cfg(target_arch = "x86_64")]
#[usdt::provider]
mod peer {
    fn tick(i: u64) {}
}

#[inline(never)]
fn baseline(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
    }
    acc
}

#[inline(never)]
fn selftrace_probe(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        selftrace::probe!(bench, tick, i);
    }
    acc
}

#[inline(never)]
fn selftrace_probe_lazy(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        selftrace::probe_lazy!(bench, lazy_tick, i);
    }
    acc
}

#[inline(never)]
fn selftrace_enabled(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        if selftrace::probe_enabled!(bench, tick) {
            // A side effect off the `acc` chain keeps this a branch (a branchless select into
            // `acc` would measure a dependency chain rather than the check).
            black_box(i);
        }
    }
    acc
}

#[inline(never)]
fn probe_crate(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        probe::probe!(bench, tick, i);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn usdt_crate(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        peer::tick!(|| i);
    }
    acc
}

const C_SOURCE: &str = r#"
#include <sys/sdt.h>
unsigned long c_baseline(unsigned long n) {
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) {
        __asm__ volatile("" : : "r"(i));
        acc += i;
    }
    return acc;
}
unsigned long c_probe(unsigned long n) {
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) {
        __asm__ volatile("" : : "r"(i));
        acc += i;
        DTRACE_PROBE1(cbench, tick, i);
    }
    return acc;
}
"#;

type CLoop = extern "C" fn(u64) -> u64;

/// Builds the C loops with gcc into a shared library and loads them.
fn c_loops() -> Option<(CLoop, CLoop)> {
    let dir = std::env::temp_dir().join(format!("selftrace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("loops.c");
    let lib = dir.join("libloops.so");
    std::fs::write(&src, C_SOURCE).ok()?;
    let ok = std::process::Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipping the C sys/sdt.h peer: gcc or sys/sdt.h missing");
        return None;
    }
    let path = std::ffi::CString::new(lib.to_str()?).ok()?;
    // SAFETY: dlopen of the library just built; it has no initializers.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        return None;
    }
    // SAFETY: symbol names are valid C strings; the functions have the CLoop signature.
    let (b, p) = unsafe {
        (
            libc::dlsym(h, c"c_baseline".as_ptr()),
            libc::dlsym(h, c"c_probe".as_ptr()),
        )
    };
    let _ = std::fs::remove_dir_all(&dir);
    if b.is_null() || p.is_null() {
        return None;
    }
    // SAFETY: both are `unsigned long f(unsigned long)`, i.e. extern "C" fn(u64) -> u64.
    unsafe {
        Some((
            std::mem::transmute::<*mut libc::c_void, CLoop>(b),
            std::mem::transmute::<*mut libc::c_void, CLoop>(p),
        ))
    }
}

fn bench(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    usdt::register_probes().expect("usdt::register_probes");
    let mut g = c.benchmark_group("disabled probe, loop of 1000");
    g.bench_function("no probe", |b| b.iter(|| baseline(black_box(N))));
    g.bench_function("selftrace probe!", |b| {
        b.iter(|| selftrace_probe(black_box(N)))
    });
    g.bench_function("selftrace probe_lazy!", |b| {
        b.iter(|| selftrace_probe_lazy(black_box(N)))
    });
    g.bench_function("selftrace probe_enabled!", |b| {
        b.iter(|| selftrace_enabled(black_box(N)))
    });
    g.bench_function("probe crate probe!", |b| {
        b.iter(|| probe_crate(black_box(N)))
    });
    #[cfg(target_arch = "x86_64")]
    g.bench_function("usdt crate", |b| b.iter(|| usdt_crate(black_box(N))));
    if let Some((c_base, c_probe)) = c_loops() {
        g.bench_function("C no probe", |b| b.iter(|| c_base(black_box(N))));
        g.bench_function("C sys/sdt.h DTRACE_PROBE1", |b| {
            b.iter(|| c_probe(black_box(N)))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
/// Fastest of many alternated batches per variant: other processes on a shared machine only
/// ever make a batch slower, so the minimum is what the code itself costs.
fn fastest_batches() {
    type Variant = (&'static str, Box<dyn Fn(u64) -> u64>);
    let mut variants: Vec<Variant> = vec![
        ("no probe", Box::new(baseline)),
        ("selftrace probe!", Box::new(selftrace_probe)),
        ("selftrace probe_lazy!", Box::new(selftrace_probe_lazy)),
        ("selftrace probe_enabled!", Box::new(selftrace_enabled)),
        ("probe crate probe!", Box::new(probe_crate)),
    ];
    #[cfg(target_arch = "x86_64")]
    variants.push(("usdt crate", Box::new(usdt_crate)));
    if let Some((c_base, c_probe)) = c_loops() {
        variants.push(("C no probe", Box::new(move |n| c_base(n))));
        variants.push(("C sys/sdt.h DTRACE_PROBE1", Box::new(move |n| c_probe(n))));
    }
    let mut best = vec![u128::MAX; variants.len()];
    for _ in 0..3000 {
        for (i, (_, f)) in variants.iter().enumerate() {
            let t = std::time::Instant::now();
            black_box(f(black_box(N)));
            best[i] = best[i].min(t.elapsed().as_nanos());
        }
    }
    println!("fastest of 3000 alternated loops of {N} (ns per loop):");
    for ((name, _), ns) in variants.iter().zip(&best) {
        println!("  {name:<28} {ns:>6} ns");
    }
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    fastest_batches();
}
