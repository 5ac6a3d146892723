//! What sampling costs the profiled program: a fixed CPU-bound job (a 30-frame recursion down
//! to a leaf loop, about 60 ms) timed without a profiler, under selftrace's profiler at 100 Hz
//! and 1 kHz, and under pprof-rs 0.15 (default settings: libgcc's `_Unwind_Backtrace` in its
//! SIGPROF handler, `setitimer(ITIMER_PROF)`) at 100 Hz and 1 kHz.
//!
//! Each measurement batch (`iter_custom`) starts a profiler, times the batch's jobs, reads the
//! profiler's sample count and stops it; starting, stopping and building the report are
//! outside the timed region. The profiler's own work that runs on another thread meanwhile
//! (selftrace's aggregation thread) is not on the timed thread, but it is in the run: on a
//! machine with a free core it costs the job nothing, on a busy one it competes for the CPU.
//!
//! After the group it prints, for each profiler and frequency, the samples taken per job, the
//! slowdown against the run without a profiler, and the cost of one sample: (time per job with
//! the profiler - time per job without) / samples per job, from the jobs of all batches
//! (warm-up included) of this same run.
//!
//! Note: CPU-time timers expire on scheduler ticks, so on a kernel with HZ=250 a 1 kHz timer
//! yields about 250 signals per second of CPU; selftrace counts the missed periods
//! (`si_overrun`) as weight, which `Stats::samples` (signals handled) does not include.
//!
//! `cargo bench --bench profile`

use criterion::{Criterion, SamplingMode};
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Depth of the recursion above the leaf loop.
const DEPTH: u32 = 30;
/// Rounds of the leaf loop per job (about 60 ms).
const ROUNDS: u64 = 60_000_000;

#[inline(never)]
fn leaf(rounds: u64) -> u64 {
    let mut x = rounds;
    for i in 0..rounds {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

#[inline(never)]
fn recurse(depth: u32, rounds: u64) -> u64 {
    if depth == 0 {
        return leaf(rounds);
    }
    // black_box on the result keeps the call a real (non-tail) call: 30 frames on the stack.
    black_box(recurse(black_box(depth - 1), rounds)).wrapping_add(1)
}

/// One job.
fn job() -> u64 {
    recurse(DEPTH, ROUNDS)
}

/// Per configuration: jobs run, time they took, samples taken, frames per sample.
#[derive(Default, Clone, Copy)]
struct Totals {
    jobs: u64,
    time: Duration,
    samples: u64,
    periods: u64,
    frames: u64,
}

static TOTALS: Mutex<Vec<(String, Totals)>> = Mutex::new(Vec::new());

fn add(name: &str, t: Totals) {
    let mut all = TOTALS.lock().unwrap_or_else(|p| p.into_inner());
    match all.iter_mut().find(|(n, _)| n == name) {
        Some((_, a)) => {
            a.jobs += t.jobs;
            a.time += t.time;
            a.samples += t.samples;
            a.periods += t.periods;
            a.frames += t.frames;
        }
        None => all.push((name.to_string(), t)),
    }
}

fn timed(iters: u64) -> Duration {
    let t = Instant::now();
    for _ in 0..iters {
        black_box(job());
    }
    t.elapsed()
}

fn none(iters: u64) -> Duration {
    let time = timed(iters);
    add(
        "none",
        Totals {
            jobs: iters,
            time,
            ..Totals::default()
        },
    );
    time
}

fn selftrace(hz: u32, iters: u64) -> Duration {
    let p = selftrace::profile::builder()
        .frequency(hz)
        .start()
        .expect("selftrace profiler");
    let time = timed(iters);
    let samples = p.stats().samples;
    let profile = p.stop();
    let frames = profile
        .samples
        .iter()
        .map(|s| s.locations.len() as u64 * s.count)
        .sum();
    add(
        &format!("selftrace_{hz}hz"),
        Totals {
            jobs: iters,
            time,
            samples,
            periods: profile.total(),
            frames,
        },
    );
    time
}

fn pprof(hz: u32, iters: u64) -> Duration {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(hz as i32)
        .build()
        .expect("pprof-rs profiler");
    let time = timed(iters);
    let report = guard.report().build().expect("pprof-rs report");
    drop(guard);
    let mut samples = 0u64;
    let mut frames = 0u64;
    for (f, &count) in &report.data {
        samples += count.max(0) as u64;
        frames += f.frames.len() as u64 * count.max(0) as u64;
    }
    add(
        &format!("pprof-rs_{hz}hz"),
        Totals {
            jobs: iters,
            time,
            samples,
            periods: samples,
            frames,
        },
    );
    time
}

fn bench(c: &mut Criterion) {
    selftrace::init().expect("selftrace::init");
    let mut g = c.benchmark_group("profile_overhead");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    g.bench_function("none", |b| b.iter_custom(none));
    for hz in [100, 1000] {
        g.bench_function(format!("selftrace_{hz}hz"), |b| {
            b.iter_custom(|n| selftrace(hz, n))
        });
    }
    for hz in [100, 1000] {
        g.bench_function(format!("pprof-rs_{hz}hz"), |b| {
            b.iter_custom(|n| pprof(hz, n))
        });
    }
    g.finish();
}

fn report() {
    let all = TOTALS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(base) = all.iter().find(|(n, _)| n == "none").map(|(_, t)| *t) else {
        return;
    };
    let per_job = |t: &Totals| t.time.as_secs_f64() / t.jobs.max(1) as f64;
    let base_job = per_job(&base);
    eprintln!();
    eprintln!(
        "profile overhead ({} frames deep, {:.1} ms per job without a profiler, {} jobs):",
        DEPTH,
        base_job * 1e3,
        base.jobs
    );
    for (name, t) in all.iter().filter(|(n, _)| n != "none") {
        let job = per_job(t);
        let samples = t.samples as f64 / t.jobs.max(1) as f64;
        let periods = t.periods as f64 / t.jobs.max(1) as f64;
        let extra = job - base_job;
        let cost = if samples > 0.0 {
            format!("{:.1} us", extra / samples * 1e6)
        } else {
            "n/a (no samples)".to_string()
        };
        eprintln!(
            "  {name:<18} {:.2} ms per job ({:+.2}%), {samples:.1} samples per job \
             ({:.0}/s of CPU; {periods:.1} periods), {:.1} frames per sample, \
             cost per sample {cost}",
            job * 1e3,
            extra / base_job * 100.0,
            samples / job,
            t.frames as f64 / t.periods.max(1) as f64,
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    report();
}
