//! A sampling profiler under stress: while it samples at `--hz` for `--secs` seconds, threads
//! panic and catch the panic (libgcc unwinding), `dlopen`/`dlclose` zlib (a library not loaded
//! at the start, checked to be unloaded again after each `dlclose`), churn the allocator,
//! spawn and join short threads, and run `/bin/true` (through `posix_spawn` and through a real
//! `fork` + `exec`), next to one CPU-bound thread in `cpu_bound_work`. The samples of a handler
//! that lands in the middle of any of these are what crash or deadlock a profiler whose handler
//! is not async-signal-safe.
//!
//! ```sh
//! cargo run --release --example profile_stress -- --profiler selftrace --hz 1000 --secs 5
//! cargo run --release --features pprof-rs --example profile_stress -- --profiler pprof-rs --hz 1000 --secs 5
//! cargo run --release --features pprof-rs --example profile_stress -- --profiler pprof-rs-blocklist --hz 1000 --secs 5
//! cargo run --release --example profile_stress -- --profiler none --secs 5
//! ```
//!
//! `--profiler`: `selftrace` (this crate, CPU mode), `pprof-rs` (pprof 0.15, default unwinder:
//! libgcc's `_Unwind_Backtrace` in its SIGPROF handler), `pprof-rs-blocklist` (the same with
//! the blocklist its README recommends: libc, libgcc, pthread, vdso), `none` (the stress alone).
//!
//! At the end it prints one line (and exits 0):
//!
//! ```text
//! RESULT profiler=selftrace hz=1000 secs=5.00 samples=N periods=N cpu_fn=N panics=N
//!   dlopens=N dl_still_loaded=0 allocs=N spawns=N execs=N forks=N cpu_rounds=N dropped=N
//!   truncated=N truncated_reasons=...
//! ```
//!
//! (one line). `samples` is the number of samples (selftrace: signals that produced a sample,
//! `Stats::samples`; pprof-rs: the sum of its report's counts), `periods` the profile's total
//! (selftrace counts a late timer's overruns as periods; pprof-rs has no such thing, so it is
//! `samples`), `cpu_fn` the periods whose stack contains `cpu_bound_work`, then each stress
//! loop's iterations, and for selftrace the samples lost to a full ring (`Profile::dropped`)
//! and the periods whose walk was truncated, by reason. A problem in the stress itself (zlib
//! loaded at the start, a `/bin/true` that failed) exits with status 2. There is no internal
//! timeout: a deadlock hangs the program, and whoever runs it must see that.

use std::ffi::CStr;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The library the dlopen loop loads and unloads.
const LIB: &CStr = c"libz.so.1";

/// The CPU-bound function the profile must show: `rounds` rounds of arithmetic through a few
/// frames of its own.
#[inline(never)]
fn cpu_bound_work(rounds: u64) -> u64 {
    let mut x = rounds;
    for i in 0..rounds * 10_000 {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

/// Panics `depth` frames down (so that the unwinder has frames to walk).
#[inline(never)]
fn panic_deep(depth: u32) -> u32 {
    if depth == 0 {
        panic!("stress panic");
    }
    black_box(panic_deep(black_box(depth - 1))) + 1
}

/// Whether an object whose name contains `needle` is loaded (`dl_iterate_phdr`).
fn loaded(needle: &[u8]) -> bool {
    struct Search<'a> {
        needle: &'a [u8],
        found: bool,
    }
    extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: data is the &mut Search passed to dl_iterate_phdr below; info is the
        // loader's valid record for this call.
        let (search, name) = unsafe { (&mut *(data as *mut Search<'_>), (*info).dlpi_name) };
        if !name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated string while the callback runs.
            let name = unsafe { CStr::from_ptr(name) }.to_bytes();
            if name
                .windows(search.needle.len())
                .any(|w| w == search.needle)
            {
                search.found = true;
            }
        }
        0
    }
    let mut search = Search {
        needle,
        found: false,
    };
    // SAFETY: the callback only reads the records and writes `search`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut search as *mut Search<'_> as *mut _) };
    search.found
}

/// One `dlopen` / call / `dlclose` of zlib; returns whether it is unloaded afterwards.
fn dlopen_once() -> bool {
    // SAFETY: LIB is a valid C string; loading zlib runs no initializer that matters here.
    let h = unsafe { libc::dlopen(LIB.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        eprintln!("profile_stress: dlopen libz.so.1 failed (is zlib1g installed?)");
        std::process::exit(2);
    }
    // SAFETY: h is a live handle; the symbol name is a valid C string.
    let f = unsafe { libc::dlsym(h, c"zlibVersion".as_ptr()) };
    if !f.is_null() {
        // SAFETY: zlibVersion is `const char *zlibVersion(void)`.
        let version: extern "C" fn() -> *const libc::c_char = unsafe { core::mem::transmute(f) };
        black_box(version());
    }
    // SAFETY: h came from dlopen and is closed once.
    unsafe { libc::dlclose(h) };
    !loaded(b"libz.so")
}

/// Allocates and frees a mix of sizes.
fn alloc_once(i: u64) -> usize {
    let mut v: Vec<Box<[u8]>> = Vec::with_capacity(16);
    for k in 0..16u64 {
        let size = 16 + ((i * 31 + k * 17) % 4096) as usize;
        v.push(vec![k as u8; size].into_boxed_slice());
    }
    let mut s = String::new();
    for b in &v {
        s.push_str(&b.len().to_string());
    }
    black_box(s.len() + v.len())
}

enum Which {
    Selftrace,
    Pprof { blocklist: bool },
    None,
}

struct Args {
    which: Which,
    name: String,
    hz: u32,
    secs: f64,
    folded: Option<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: profile_stress --profiler selftrace|pprof-rs|pprof-rs-blocklist|none \
         [--hz 1000] [--secs 5] [--folded FILE]"
    );
    std::process::exit(2);
}

fn args() -> Args {
    let mut a = Args {
        which: Which::Selftrace,
        name: "selftrace".into(),
        hz: 1000,
        secs: 5.0,
        folded: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--profiler" => {
                a.which = match value.as_str() {
                    "selftrace" => Which::Selftrace,
                    "pprof-rs" => Which::Pprof { blocklist: false },
                    "pprof-rs-blocklist" => Which::Pprof { blocklist: true },
                    "none" => Which::None,
                    _ => usage(),
                };
                a.name = value;
            }
            "--hz" => a.hz = value.parse().unwrap_or_else(|_| usage()),
            "--secs" => a.secs = value.parse().unwrap_or_else(|_| usage()),
            "--folded" => a.folded = Some(value),
            _ => usage(),
        }
    }
    a
}

/// Iterations of each stress loop.
#[derive(Default)]
struct Counters {
    panics: AtomicU64,
    dlopens: AtomicU64,
    dl_still_loaded: AtomicU64,
    allocs: AtomicU64,
    spawns: AtomicU64,
    execs: AtomicU64,
    forks: AtomicU64,
    cpu_rounds: AtomicU64,
}

/// What a profiler reports at the end.
struct Outcome {
    samples: u64,
    periods: u64,
    cpu_fn: u64,
    extra: String,
}

enum Running {
    Selftrace(selftrace::profile::Profiler),
    #[cfg(feature = "pprof-rs")]
    Pprof(pprof::ProfilerGuard<'static>),
    None,
}

fn start(a: &Args) -> Running {
    match a.which {
        Which::Selftrace => {
            let p = selftrace::profile::builder()
                .frequency(a.hz)
                .mode(selftrace::profile::Mode::Cpu)
                .start()
                .unwrap_or_else(|e| {
                    eprintln!("profile_stress: selftrace profiler: {e}");
                    std::process::exit(2);
                });
            Running::Selftrace(p)
        }
        Which::Pprof { blocklist } => start_pprof(a.hz, blocklist),
        Which::None => Running::None,
    }
}

/// Starts pprof-rs (the peer).
#[cfg(feature = "pprof-rs")]
fn start_pprof(hz: u32, blocklist: bool) -> Running {
    let mut b = pprof::ProfilerGuardBuilder::default().frequency(hz as i32);
    if blocklist {
        b = b.blocklist(&["libc", "libgcc", "pthread", "vdso"]);
    }
    Running::Pprof(b.build().unwrap_or_else(|e| {
        eprintln!("profile_stress: pprof-rs: {e}");
        std::process::exit(2);
    }))
}

/// Built without the `pprof-rs` feature of examples/Cargo.toml (as the tests build it).
#[cfg(not(feature = "pprof-rs"))]
fn start_pprof(_hz: u32, _blocklist: bool) -> Running {
    eprintln!(
        "profile_stress: built without pprof-rs: run `cargo run --release --features pprof-rs \
         --example profile_stress -- --profiler pprof-rs`"
    );
    std::process::exit(2);
}

/// CPU time the profiler's own threads (`selftrace-prof`, `selftrace-timer`) used so far, in
/// milliseconds.
fn profiler_thread_cpu_ms() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut ns = 0u64;
    for task in dir.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if matches!(comm.trim_end(), "selftrace-prof" | "selftrace-timer") {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            ns += stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns / 1_000_000
}

fn finish(r: Running, folded: Option<&str>) -> Outcome {
    match r {
        Running::Selftrace(p) => {
            let stats = p.stats();
            let prof_cpu_ms = profiler_thread_cpu_ms();
            let profile = p.stop();
            if let Some(path) = folded {
                std::fs::write(path, profile.folded()).expect("write the folded profile");
            }
            let periods = profile.total();
            let cpu_fn = profile
                .samples
                .iter()
                .filter(|s| {
                    profile
                        .function_names(s)
                        .any(|f| f.contains("cpu_bound_work"))
                })
                .map(|s| s.count)
                .sum();
            let mut reasons: std::collections::BTreeMap<&str, u64> = Default::default();
            for s in &profile.samples {
                if let Some(t) = s.truncation {
                    *reasons.entry(t.reason.as_str()).or_default() += s.count;
                }
            }
            let truncated: u64 = reasons.values().sum();
            let list: Vec<String> = reasons
                .iter()
                .map(|(r, n)| format!("{}:{n}", r.replace(' ', "_")))
                .collect();
            Outcome {
                // Read just before stop, after the stress threads ended: only the idle main
                // thread could still be sampled in between.
                samples: stats.samples,
                periods,
                cpu_fn,
                extra: format!(
                    " dropped={} stats_dropped={} threads_seen={} profiler_thread_cpu_ms=\
                     {prof_cpu_ms} truncated={truncated} truncated_reasons={}",
                    profile.dropped,
                    stats.dropped,
                    stats.threads_seen,
                    if list.is_empty() {
                        "-".to_string()
                    } else {
                        list.join(",")
                    }
                ),
            }
        }
        #[cfg(feature = "pprof-rs")]
        Running::Pprof(guard) => {
            let report = guard.report().build().unwrap_or_else(|e| {
                eprintln!("profile_stress: pprof-rs report: {e}");
                std::process::exit(2);
            });
            drop(guard);
            let mut samples = 0u64;
            let mut cpu_fn = 0u64;
            for (frames, &count) in &report.data {
                let count = count.max(0) as u64;
                samples += count;
                if frames
                    .frames
                    .iter()
                    .flatten()
                    .any(|sym| sym.name().contains("cpu_bound_work"))
                {
                    cpu_fn += count;
                }
            }
            Outcome {
                samples,
                periods: samples,
                cpu_fn,
                extra: String::new(),
            }
        }
        Running::None => Outcome {
            samples: 0,
            periods: 0,
            cpu_fn: 0,
            extra: String::new(),
        },
    }
}

/// Spawns a named stress thread that runs `body(i)` for i = 0, 1, ... until `stop`.
fn stress(
    name: &str,
    stop: &Arc<AtomicBool>,
    body: impl Fn(u64) + Send + 'static,
) -> thread::JoinHandle<()> {
    let stop = stop.clone();
    thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                body(i);
                i += 1;
            }
        })
        .expect("spawn a stress thread")
}

fn main() {
    let a = args();
    // Panics are the point of one loop: keep them quiet.
    std::panic::set_hook(Box::new(|_| {}));
    if loaded(b"libz.so") {
        eprintln!(
            "profile_stress: libz is loaded at the start; the dlopen loop would not unload it"
        );
        std::process::exit(2);
    }
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let profiler = start(&a);
    let began = Instant::now();

    let c = counters.clone();
    let mut threads = vec![stress("stress-panic", &stop, move |i| {
        let r = std::panic::catch_unwind(|| panic_deep(8 + (i % 8) as u32));
        assert!(r.is_err(), "panic_deep returned");
        c.panics.fetch_add(1, Ordering::Relaxed);
    })];
    let c = counters.clone();
    threads.push(stress("stress-dlopen", &stop, move |_| {
        if !dlopen_once() {
            c.dl_still_loaded.fetch_add(1, Ordering::Relaxed);
        }
        c.dlopens.fetch_add(1, Ordering::Relaxed);
    }));
    let c = counters.clone();
    threads.push(stress("stress-alloc", &stop, move |i| {
        black_box(alloc_once(i));
        c.allocs.fetch_add(1, Ordering::Relaxed);
    }));
    let c = counters.clone();
    threads.push(stress("stress-spawn", &stop, move |i| {
        let t = thread::Builder::new()
            .name("stress-short".into())
            .spawn(move || black_box(cpu_bound_work(1 + i % 4)))
            .expect("spawn a short thread");
        black_box(t.join().expect("short thread"));
        c.spawns.fetch_add(1, Ordering::Relaxed);
    }));
    let c = counters.clone();
    threads.push(stress("stress-exec", &stop, move |i| {
        let mut cmd = std::process::Command::new("/bin/true");
        if i % 2 == 1 {
            // A pre_exec closure makes std fork() + exec instead of posix_spawn (a vfork-like
            // clone): the child then runs Rust code, with the parent's handlers, before exec.
            // SAFETY: the closure does nothing, which is async-signal-safe.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || Ok(()));
            }
            c.forks.fetch_add(1, Ordering::Relaxed);
        }
        match cmd.status() {
            Ok(s) if s.success() => {}
            other => {
                eprintln!("profile_stress: /bin/true: {other:?}");
                std::process::exit(2);
            }
        }
        c.execs.fetch_add(1, Ordering::Relaxed);
    }));
    let c = counters.clone();
    threads.push(stress("stress-cpu", &stop, move |i| {
        black_box(cpu_bound_work(100 + i % 3));
        c.cpu_rounds.fetch_add(1, Ordering::Relaxed);
    }));

    thread::sleep(Duration::from_secs_f64(a.secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .expect("a stress thread panicked outside catch_unwind");
    }
    let secs = began.elapsed().as_secs_f64();
    let out = finish(profiler, a.folded.as_deref());
    let n = |x: &AtomicU64| x.load(Ordering::Relaxed);
    let c = &counters;
    println!(
        "RESULT profiler={} hz={} secs={secs:.2} samples={} periods={} cpu_fn={} panics={} \
         dlopens={} dl_still_loaded={} allocs={} spawns={} execs={} forks={} cpu_rounds={}{}",
        a.name,
        a.hz,
        out.samples,
        out.periods,
        out.cpu_fn,
        n(&c.panics),
        n(&c.dlopens),
        n(&c.dl_still_loaded),
        n(&c.allocs),
        n(&c.spawns),
        n(&c.execs),
        n(&c.forks),
        n(&c.cpu_rounds),
        out.extra
    );
}
