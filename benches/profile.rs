//! What sampling costs the profiled program: a fixed CPU-bound job (a 30-frame recursion down
//! to a leaf loop, about 60 ms) timed without a profiler, under selftrace's profiler at 100 Hz
//! and 1 kHz, and under pprof-rs 0.15 (default settings: libgcc's `_Unwind_Backtrace` in its
//! SIGPROF handler, `setitimer(ITIMER_PROF)`) at 100 Hz and 1 kHz.
//!
//! Each job under a profiler is paired with a job without one, run just before it, and both
//! are timed in the CPU time of the job's thread (signal handlers included): the slowdown
//! printed after the group compares each configuration with its own paired jobs, which cancels
//! the drift of a VM's speed over seconds. Starting and stopping the profiler (and building
//! pprof-rs's report) happen outside the timed region; selftrace's aggregation thread runs on
//! another thread and is not in the job's CPU time (its own cost is in the README).
//!
//! Then the time one sample takes inside each profiler's SIGPROF handler, measured by a
//! wrapper installed in front of the handler, at 1 kHz on the same 30-deep stacks: the cost
//! that matters when the slowdown itself is below what a VM can resolve.
//!
//! Note: CPU-time timers expire on scheduler ticks, so on a kernel with HZ=250 a 1 kHz timer
//! yields about 250 signals per second of CPU; selftrace counts the missed periods
//! (`si_overrun`) as weight, which `Stats::samples` (signals handled) does not include.
//!
//! `cargo bench --bench profile`

use criterion::{Criterion, SamplingMode};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

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

/// Per configuration: jobs run, CPU time they took with the profiler and the paired jobs
/// without it, samples (signals handled), periods, frames.
#[derive(Default, Clone, Copy)]
struct Totals {
    jobs: u64,
    time: Duration,
    base: Duration,
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
            a.base += t.base;
            a.samples += t.samples;
            a.periods += t.periods;
            a.frames += t.frames;
        }
        None => all.push((name.to_string(), t)),
    }
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One job; the CPU time of this thread it took, signal handlers included. (CPU time, not
/// wall time: what the profiled thread pays, without the noise of other processes;
/// selftrace's aggregation thread runs on another thread and is measured on its own.)
fn timed_job() -> Duration {
    let t = thread_cpu();
    black_box(job());
    thread_cpu() - t
}

/// A profiler under test: started before a job and stopped after it (outside the timing),
/// returning (signals handled, periods, frames).
trait Profiler {
    fn start(&self) -> Box<dyn FnOnce() -> (u64, u64, u64)>;
}

struct Selftrace(u32);

impl Profiler for Selftrace {
    fn start(&self) -> Box<dyn FnOnce() -> (u64, u64, u64)> {
        let p = selftrace::profile::builder()
            .frequency(self.0)
            .start()
            .expect("selftrace profiler");
        Box::new(move || {
            let samples = p.stats().samples;
            let profile = p.stop();
            let frames = profile
                .samples
                .iter()
                .map(|s| s.locations.len() as u64 * s.count)
                .sum();
            (samples, profile.total(), frames)
        })
    }
}

struct PprofRs(u32);

impl Profiler for PprofRs {
    fn start(&self) -> Box<dyn FnOnce() -> (u64, u64, u64)> {
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(self.0 as i32)
            .build()
            .expect("pprof-rs profiler");
        Box::new(move || {
            let report = guard.report().build().expect("pprof-rs report");
            drop(guard);
            let (mut samples, mut frames) = (0u64, 0u64);
            for (f, &count) in &report.data {
                samples += count.max(0) as u64;
                frames += f.frames.len() as u64 * count.max(0) as u64;
            }
            (samples, samples, frames)
        })
    }
}

/// `iters` paired jobs: one without a profiler, then one under `profiler`. Returns the
/// profiled jobs' time (what criterion reports); the pairs give the slowdown in `report`,
/// with the machine's drift cancelled (a VM's CPU time per job drifts by several percent over
/// seconds, more than the effect measured).
fn paired(name: &str, profiler: Option<&dyn Profiler>, iters: u64) -> Duration {
    let mut t = Totals {
        jobs: iters,
        ..Totals::default()
    };
    for _ in 0..iters {
        t.base += timed_job();
        match profiler {
            None => t.time += timed_job(),
            Some(p) => {
                let stop = p.start();
                t.time += timed_job();
                let (samples, periods, frames) = stop();
                t.samples += samples;
                t.periods += periods;
                t.frames += frames;
            }
        }
    }
    add(name, t);
    t.time
}

fn bench(c: &mut Criterion) {
    selftrace::init().expect("selftrace::init");
    let mut g = c.benchmark_group("profile_overhead");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.bench_function("none", |b| b.iter_custom(|n| paired("none", None, n)));
    for hz in [100, 1000] {
        let name = format!("selftrace_{hz}hz");
        g.bench_function(&name, |b| {
            b.iter_custom(|n| paired(&name, Some(&Selftrace(hz)), n))
        });
    }
    for hz in [100, 1000] {
        let name = format!("pprof-rs_{hz}hz");
        g.bench_function(&name, |b| {
            b.iter_custom(|n| paired(&name, Some(&PprofRs(hz)), n))
        });
    }
    g.finish();
}

/// The original handler a [`timing`] wrapper calls.
static ORIGINAL: AtomicUsize = AtomicUsize::new(0);
/// Nanoseconds spent in the wrapped handler, and calls.
static HANDLER_NS: AtomicU64 = AtomicU64::new(0);
static HANDLER_CALLS: AtomicU64 = AtomicU64::new(0);
/// Each call's nanoseconds, for the median.
static HANDLER_EACH: [AtomicU64; 4096] = [const { AtomicU64::new(0) }; 4096];

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec (vDSO call, async-signal-safe).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Times the profiler's own SIGPROF handler around each call.
extern "C" fn timing(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let t = mono_ns();
    let f = ORIGINAL.load(Ordering::Relaxed);
    // SAFETY: ORIGINAL is the SA_SIGINFO handler that `wrap` replaced (selftrace's or
    // pprof-rs's), called with the kernel's arguments.
    let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
        unsafe { core::mem::transmute(f) };
    f(sig, info, uc);
    let ns = mono_ns() - t;
    HANDLER_NS.fetch_add(ns, Ordering::Relaxed);
    let i = HANDLER_CALLS.fetch_add(1, Ordering::Relaxed) as usize;
    if let Some(slot) = HANDLER_EACH.get(i) {
        slot.store(ns, Ordering::Relaxed);
    }
}

/// Puts [`timing`] in front of the installed SIGPROF handler; returns the original action.
fn wrap() -> libc::sigaction {
    // SAFETY: all-zero is a valid sigaction; the query and the replacement are plain
    // sigaction calls.
    unsafe {
        let mut old: libc::sigaction = core::mem::zeroed();
        libc::sigaction(libc::SIGPROF, core::ptr::null(), &mut old);
        assert!(
            old.sa_flags & libc::SA_SIGINFO != 0,
            "an SA_SIGINFO handler"
        );
        ORIGINAL.store(old.sa_sigaction, Ordering::Relaxed);
        let mut new = old;
        new.sa_sigaction = timing as *const () as usize;
        libc::sigaction(libc::SIGPROF, &new, core::ptr::null_mut());
        old
    }
}

fn unwrap(old: &libc::sigaction) {
    // SAFETY: restores the action `wrap` read.
    unsafe { libc::sigaction(libc::SIGPROF, old, core::ptr::null_mut()) };
}

/// The time one sample takes in each profiler's SIGPROF handler, measured around the handler
/// itself (a wrapper in front of it), while the job runs at 1 kHz. The same stacks (the job's
/// 30-frame recursion) for both; the kernel's delivery of the signal is not included.
fn handler_cost() {
    const JOBS: u32 = 10;
    let run = || {
        for _ in 0..JOBS {
            black_box(job());
        }
    };
    // (median, mean) in microseconds, and the number of calls.
    let take = || {
        let n = HANDLER_CALLS.swap(0, Ordering::Relaxed);
        let ns = HANDLER_NS.swap(0, Ordering::Relaxed);
        let mut each: Vec<u64> = HANDLER_EACH[..(n as usize).min(HANDLER_EACH.len())]
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        each.sort_unstable();
        let median = each.get(each.len() / 2).copied().unwrap_or(0) as f64 / 1e3;
        (median, ns as f64 / n.max(1) as f64 / 1e3, n)
    };
    eprintln!();
    eprintln!(
        "time in the SIGPROF handler per sample (1 kHz, {JOBS} jobs of the 30-deep recursion):"
    );
    for round in 0..3 {
        let p = selftrace::profile::builder()
            .frequency(1000)
            .start()
            .expect("selftrace profiler");
        let old = wrap();
        run();
        unwrap(&old);
        let prof = p.stop();
        let frames = prof
            .samples
            .iter()
            .map(|s| s.locations.len() as u64 * s.count)
            .sum::<u64>() as f64
            / prof.total().max(1) as f64;
        let (st, st_mean, st_n) = take();
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(1000)
            .build()
            .expect("pprof-rs");
        let old = wrap();
        run();
        unwrap(&old);
        drop(guard.report().build());
        drop(guard);
        let (pp, pp_mean, pp_n) = take();
        eprintln!(
            "  round {round}: selftrace median {st:.2} us, mean {st_mean:.2} us ({st_n} samples, \
             {frames:.0} frames each); pprof-rs median {pp:.2} us, mean {pp_mean:.2} us \
             ({pp_n} samples)"
        );
    }
}

fn report() {
    let all = TOTALS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!();
    eprintln!(
        "profile overhead ({DEPTH} frames deep; each profiled job paired with one without; \
         CPU time of the job's thread):"
    );
    for (name, t) in &all {
        let jobs = t.jobs.max(1) as f64;
        let job = t.time.as_secs_f64() / jobs;
        let base = t.base.as_secs_f64() / jobs;
        let samples = t.samples as f64 / jobs;
        eprintln!(
            "  {name:<18} {:.2} ms per job vs {:.2} ms paired without ({:+.2}%), {} jobs, \
             {samples:.1} samples per job ({:.0}/s of CPU; {:.1} periods), {:.1} frames each",
            job * 1e3,
            base * 1e3,
            (job / base - 1.0) * 100.0,
            t.jobs,
            samples / job,
            t.periods as f64 / jobs,
            t.frames as f64 / t.periods.max(1) as f64,
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    report();
    handler_cost();
}
