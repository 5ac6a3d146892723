//! The sampling profiler against real work: shares of CPU time measured with each thread's CPU
//! clock, sample counts against CPU time x frequency, wall-clock samples of blocked threads,
//! threads created after the start, continuous profiles without gaps, no allocation in the
//! handler, clear errors.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "profile")]

use selftrace::profile::{self, Mode, Profile, Threads};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// Counts allocations made on threads that asked to be watched.
struct Counting;

thread_local! {
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}
static WATCHED_ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to System; the counter is an atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if WATCHED.try_with(Cell::get).unwrap_or(false) {
            WATCHED_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if WATCHED.try_with(Cell::get).unwrap_or(false) {
            WATCHED_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// One profiler at a time per process: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is valid.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Spins for `units` rounds of arithmetic.
#[inline(always)]
fn spin(units: u64) -> u64 {
    spin_iterations(units * 20_000)
}

/// Spins for `n` steps of arithmetic.
#[inline(always)]
fn spin_iterations(n: u64) -> u64 {
    let mut x = n;
    for i in 0..n {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

/// A per-thread random number (xorshift).
fn random() -> u64 {
    thread_local! {
        static RNG: std::cell::Cell<u64> = std::cell::Cell::new(
            0x9e37_79b9_7f4a_7c15 ^ u64::from(selftrace::threads::current_tid() as u32),
        );
    }
    RNG.with(|c| {
        let mut x = c.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.set(x);
        x
    })
}

/// `n` scaled by a random factor between 0.5 and 1.5: a loop of calls with fixed lengths
/// can run in step with the kernel's tick (CPU-time timers are checked at ticks, every 4 ms at
/// HZ=250), and then the ticks land in one function more often than its share of the time.
fn jittered(n: u64) -> u64 {
    (n * (500 + random() % 1001)).div_ceil(1000)
}

macro_rules! measured {
    ($name:ident, $k:expr) => {
        #[inline(never)]
        fn $name(cpu: &AtomicU64) -> u64 {
            let iterations = jittered($k * 20_000);
            let t = thread_cpu_ns();
            let x = spin_iterations(iterations);
            cpu.fetch_add(thread_cpu_ns() - t, Ordering::Relaxed);
            x
        }
    };
}
measured!(share_one_part, 1);
measured!(share_two_parts, 2);
measured!(share_three_parts, 3);

fn tid() -> i32 {
    selftrace::threads::current_tid()
}

fn samples_of(p: &Profile, tids: &[i32], needle: &str) -> u64 {
    p.samples
        .iter()
        .filter(|s| tids.contains(&s.thread_id))
        .filter(|s| p.function_names(s).any(|f| f.contains(needle)))
        .map(|s| s.count)
        .sum()
}

/// A bound on waits for a count the machine reaches at its own pace: it only turns a hang into a
/// failure. (The share test, the longest, took 6 s on an idle 2-CPU machine with HZ=250 and 44 s
/// squeezed onto one CPU next to two busy loops; with HZ=100 it needs 2.5 times as long.)
const HANG: Duration = Duration::from_secs(300);

/// Signals the share test waits for. CPU-time timers fire at the kernel's ticks (HZ=100 to
/// 1000), so the fixed 2.5 s the test used to run gave 2.5 s x HZ x 2 workers x (the share of
/// a CPU each gets) signals: 500 on an idle machine with HZ=100, fewer on a loaded one. The
/// shares' statistical error depends on the number of signals, not on the time: at 3,000 the
/// standard error of a share is at most 0.009 (0.5 / sqrt(3000)), so 0.05 is 5.5 of them (the
/// largest difference in 14 runs here, idle and loaded, was 0.025).
const SHARE_SIGNALS: u64 = 3000;

#[test]
fn shares_and_sample_count_match_cpu_time() {
    let _g = serial();
    selftrace::init().unwrap();
    const HZ: u32 = 1000;
    let cpu = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let total_cpu = Arc::new(AtomicU64::new(0));
    let go = Arc::new(Barrier::new(3));
    let done = Arc::new(Barrier::new(3));
    let stop = Arc::new(AtomicBool::new(false));
    let tids = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (cpu, total_cpu, go, done, stop, tids) = (
                cpu.clone(),
                total_cpu.clone(),
                go.clone(),
                done.clone(),
                stop.clone(),
                tids.clone(),
            );
            std::thread::spawn(move || {
                tids.lock().unwrap().push(tid());
                go.wait();
                let t0 = thread_cpu_ns();
                let mut x = 0;
                // The functions in random order, not in turn: a unit takes about 0.16 ms in a
                // debug build, so a tick (4 ms at HZ=250) is only a few rounds of three after
                // the one before, and in turn the function of one sample told much about the
                // next one's (the shares spread 1.5 times as much as independent samples'
                // would).
                while !stop.load(Ordering::Relaxed) {
                    x ^= match random() % 3 {
                        0 => share_one_part(&cpu[0]),
                        1 => share_two_parts(&cpu[1]),
                        _ => share_three_parts(&cpu[2]),
                    };
                }
                total_cpu.fetch_add(thread_cpu_ns() - t0, Ordering::Relaxed);
                black_box(x);
                done.wait();
            })
        })
        .collect();
    // The workers exist before the start: their timers are armed by the first scan.
    while tids.lock().unwrap().len() < 2 {
        std::thread::yield_now();
    }
    let p = profile::builder()
        .frequency(HZ)
        .mode(Mode::Cpu)
        .start()
        .unwrap();
    go.wait();
    // Until the workers' timers fired SHARE_SIGNALS times (only they use CPU time).
    let start = Instant::now();
    while p.stats().samples < SHARE_SIGNALS {
        assert!(
            start.elapsed() < HANG,
            "only {:?} in {HANG:?}: the timers hardly fire",
            p.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    done.wait();
    let stats = p.stats();
    let profile = p.stop();
    for w in workers {
        w.join().unwrap();
    }
    let tids = tids.lock().unwrap().clone();
    let counts = [
        samples_of(&profile, &tids, "share_one_part"),
        samples_of(&profile, &tids, "share_two_parts"),
        samples_of(&profile, &tids, "share_three_parts"),
    ];
    let measured: Vec<f64> = cpu
        .iter()
        .map(|c| c.load(Ordering::Relaxed) as f64)
        .collect();
    let measured_sum: f64 = measured.iter().sum();
    let counted: u64 = counts.iter().sum();
    let report = format!(
        "counts {counts:?}, cpu ns {measured:?}, dropped {}, total {}; {stats:?} in {:?}",
        profile.dropped,
        profile.total(),
        start.elapsed()
    );
    eprintln!("{report}");
    // Each function's share of the samples is its share of the CPU time (1:2:3, jittered):
    // catches samples attributed to the wrong code (a name lookup that gives a neighbour's
    // name, a ring slot read while it is rewritten) or sampled in proportion to something else
    // than CPU time. A sample counts for a function when any of its frames is in it (in a debug
    // build `black_box` and the arithmetic are calls of their own, so frame 0 is often a
    // callee).
    for i in 0..3 {
        let want = measured[i] / measured_sum;
        let got = counts[i] as f64 / counted as f64;
        assert!(
            (want - got).abs() < 0.05,
            "function {i}: profile share {got:.3}, CPU-time share {want:.3}; {report}"
        );
    }
    // Every sample of the workers, against their CPU time x frequency: catches lost periods
    // (overruns not counted, timers not re-armed). The kernel counts the periods exactly, so
    // this holds whatever the tick and the load.
    let worker_samples: u64 = profile
        .samples
        .iter()
        .filter(|s| tids.contains(&s.thread_id))
        .map(|s| s.count)
        .sum();
    let expected = total_cpu.load(Ordering::Relaxed) as f64 * f64::from(HZ) / 1e9;
    assert!(
        (worker_samples as f64 - expected).abs() < 0.1 * expected,
        "{worker_samples} samples for {expected:.0} periods of CPU time; {report}"
    );
    assert_eq!(profile.dropped, 0, "{report}");
    // Mappings: the program first (pprof's convention), with its build-id; every located
    // address inside its mapping.
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    assert_eq!(*profile.mappings[0].path, *exe.to_string_lossy());
    assert!(profile.mappings[0]
        .build_id
        .as_ref()
        .is_some_and(|b| b.len() >= 16));
    for l in &profile.locations {
        if let Some(m) = l.mapping.map(|m| &profile.mappings[m]) {
            assert!(
                (m.start..m.limit).contains(&l.lookup_address()),
                "{l:?} {m:?}"
            );
        }
    }
    // Named by the thread, complete stacks down to the thread's start.
    let s = profile
        .samples
        .iter()
        .find(|s| tids.contains(&s.thread_id) && s.truncation.is_none())
        .expect("a complete worker stack");
    let names: Vec<&str> = profile.function_names(s).collect();
    assert!(
        names.iter().any(|n| n.contains("shares_and_sample_count")),
        "{names:?}"
    );
}

#[inline(never)]
fn wait_on_lock(m: &Mutex<()>) {
    drop(black_box(m.lock().unwrap()));
}

#[test]
fn wall_mode_samples_blocked_threads() {
    let _g = serial();
    selftrace::init().unwrap();
    let m = Arc::new(Mutex::new(()));
    let held = m.lock().unwrap();
    let m2 = m.clone();
    let waiter_tid = Arc::new(AtomicU64::new(0));
    let wt = waiter_tid.clone();
    let waiter = std::thread::Builder::new()
        .name("lock-waiter".into())
        .spawn(move || {
            wt.store(tid() as u64, Ordering::SeqCst);
            wait_on_lock(&m2);
        })
        .unwrap();
    while waiter_tid.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    let wtid = waiter_tid.load(Ordering::SeqCst) as i32;
    let p = profile::builder()
        .frequency(200)
        .mode(Mode::Wall)
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let profile = p.stop();
    drop(held);
    waiter.join().unwrap();
    let mine: u64 = profile
        .samples
        .iter()
        .filter(|s| s.thread_id == wtid)
        .map(|s| s.count)
        .sum();
    // One sample per 5 ms of the profile's real time (about 120 in 600 ms) of a thread that
    // used no CPU: catches blocked threads not sampled, or sampled on CPU time, and overruns
    // not counted. Against the profile's own duration, which the sleep can overrun on a loaded
    // machine; the waiter's timer is armed a little after the start, and a signal still in
    // flight at the stop is lost.
    let expected = profile.duration.as_secs_f64() * 200.0;
    assert!(
        (mine as f64) >= 0.8 * expected && (mine as f64) <= 1.1 * expected,
        "{mine} wall samples of the waiter in {:?} ({expected:.0} periods)",
        profile.duration
    );
    let in_wait = samples_of(&profile, &[wtid], "wait_on_lock");
    assert!(
        in_wait * 10 >= mine * 9,
        "{in_wait} of {mine} in wait_on_lock"
    );
    let s = profile
        .samples
        .iter()
        .find(|s| s.thread_id == wtid)
        .unwrap();
    assert_eq!(&*s.thread_name, "lock-waiter");
    assert_eq!(profile.mode, Mode::Wall);
}

#[inline(never)]
fn late_thread_work() -> u64 {
    spin(200)
}

#[test]
fn threads_created_after_the_start_are_sampled() {
    let _g = serial();
    let p = profile::builder()
        .frequency(500)
        .rescan_interval(Duration::from_millis(5))
        .start()
        .unwrap();
    // 400 ms of the new thread's CPU time (200 periods at 500 Hz), however long that takes on
    // a loaded machine.
    let t = std::thread::spawn(|| {
        let id = tid();
        let t0 = thread_cpu_ns();
        let start = Instant::now();
        while thread_cpu_ns() - t0 < 400_000_000 && start.elapsed() < HANG {
            black_box(late_thread_work());
        }
        id
    });
    let late = t.join().unwrap();
    let stats = p.stats();
    let profile = p.stop();
    assert!(stats.threads_seen >= 2, "{stats:?}");
    // Catches a new thread that gets no timer (0 samples) or one much later than the next
    // rescan (5 ms); half the periods leave room for a profiler thread that a loaded machine
    // wakes late.
    let n = samples_of(&profile, &[late], "late_thread_work");
    assert!(n >= 100, "{n} samples of the late thread; {stats:?}");
}

#[inline(never)]
fn after_ignored_work() -> u64 {
    spin(5)
}

/// A profiler started after other code set the sampling signal to `SIG_IGN` (what pprof-rs
/// does when it stops) installs its handler again instead of sampling into the void, and one
/// started while the program has a handler for the signal keeps it (chains to it) and puts it
/// back at stop.
#[test]
fn a_handler_replaced_between_profilers_is_noticed() {
    let _g = serial();
    drop(profile::start(499).unwrap().stop());
    // SAFETY: SIGPROF has no handler of ours running (the profiler stopped); ignoring it is
    // what another profiler does at its end.
    unsafe { libc::signal(libc::SIGPROF, libc::SIG_IGN) };
    let p = profile::start(499).unwrap();
    let me = tid();
    // 300 ms of this thread's CPU time, however long that takes on a loaded machine.
    let t0 = thread_cpu_ns();
    while thread_cpu_ns() - t0 < 300_000_000 {
        black_box(after_ignored_work());
    }
    let profile = p.stop();
    let n = samples_of(&profile, &[me], "after_ignored_work");
    assert!(n >= 10, "{n} samples after SIGPROF was set to SIG_IGN");

    // A handler the program installed is kept: the profiler samples, the program's own
    // SIGPROF (not from a profiler timer) still reaches its handler, and stopping puts the
    // handler back.
    static THEIRS: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn theirs(_: i32) {
        THEIRS.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: a plain handler for SIGPROF; no profiler runs, and it is reset below.
    unsafe { libc::signal(libc::SIGPROF, theirs as *const () as usize) };
    let p = profile::start(499).unwrap();
    // SAFETY: a signal to this thread; both handlers are async-signal-safe.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), me, libc::SIGPROF) };
    let t0 = thread_cpu_ns();
    while thread_cpu_ns() - t0 < 300_000_000 {
        black_box(after_ignored_work());
    }
    let profile = p.stop();
    let chained = THEIRS.load(Ordering::SeqCst);
    // SAFETY: queries SIGPROF's action, then back to the default (no timer sends SIGPROF now).
    let after_stop = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPROF, std::ptr::null(), &mut sa);
        libc::signal(libc::SIGPROF, libc::SIG_DFL);
        sa.sa_sigaction
    };
    assert_eq!(chained, 1, "the program's own SIGPROF reached its handler");
    assert_eq!(
        after_stop, theirs as *const () as usize,
        "stopping put the program's handler back"
    );
    let n = samples_of(&profile, &[me], "after_ignored_work");
    assert!(n >= 10, "{n} samples with the program's handler kept");
    drop(profile::start(499).unwrap().stop());
}

#[inline(never)]
fn continuous_work() -> u64 {
    spin(5)
}

#[test]
fn continuous_profiles_have_no_gaps() {
    let _g = serial();
    const HZ: u32 = 1000;
    let me = tid();
    let p = profile::builder()
        .frequency(HZ)
        .threads(Threads::Only(vec![me]))
        .start()
        .unwrap();
    let t0 = thread_cpu_ns();
    let start = Instant::now();
    let mut profiles = Vec::new();
    for _ in 0..6 {
        // 100 ms of this thread's CPU time per interval (100 periods), however long that
        // takes on a loaded machine.
        let t = thread_cpu_ns();
        while thread_cpu_ns() - t < 100_000_000 && start.elapsed() < HANG {
            black_box(continuous_work());
        }
        profiles.push(p.take());
    }
    let cpu = thread_cpu_ns() - t0;
    let last = p.stop();
    let total: u64 = profiles.iter().map(Profile::total).sum::<u64>() + last.total();
    let expected = cpu as f64 * f64::from(HZ) / 1e9;
    assert!(
        (total as f64 - expected).abs() < 0.1 * expected,
        "{total} samples over the intervals for {expected:.0} periods"
    );
    for w in profiles.windows(2) {
        let end = w[0].start + w[0].duration;
        let gap = w[1].start.duration_since(end).unwrap_or_default();
        assert!(gap < Duration::from_millis(5), "{gap:?} between intervals");
        assert!(w[1].total() > 0);
    }
    for p in &profiles {
        assert!(p.samples.iter().all(|s| s.thread_id == me));
    }
}

#[test]
fn the_handler_does_not_allocate() {
    let _g = serial();
    selftrace::init().unwrap();
    let me = tid();
    // Warm up: the first samples of a stack resolve nothing in the handler anyway, but make
    // every rule cached and every lazy initialization done.
    let p = profile::start(1000).unwrap();
    black_box(spin(500));
    drop(p);
    let p = profile::builder()
        .frequency(2000)
        .threads(Threads::Only(vec![me]))
        .start()
        .unwrap();
    WATCHED.with(|w| w.set(true));
    let before = WATCHED_ALLOCS.load(Ordering::Relaxed);
    // Until the handler ran 100 times in this thread (CPU-time timers fire at the kernel's
    // ticks: 0.4 s of CPU time with HZ=250, 1 s with HZ=100), so that the check below covers
    // many samples whatever the tick. Neither `stats` nor the clocks allocate.
    let start = Instant::now();
    let mut x = 0;
    while p.stats().samples < 100 && start.elapsed() < HANG {
        x ^= spin(1);
    }
    let after = WATCHED_ALLOCS.load(Ordering::Relaxed);
    WATCHED.with(|w| w.set(false));
    black_box(x);
    let stats = p.stats();
    drop(p);
    assert!(stats.samples >= 100, "{stats:?} in {HANG:?}");
    assert_eq!(
        after - before,
        0,
        "allocations in {} samples",
        stats.samples
    );
}

#[test]
fn clear_errors() {
    let _g = serial();
    use selftrace::Error;
    assert!(matches!(
        profile::builder().frequency(0).start(),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        profile::builder().frequency(20_000).start(),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        profile::builder().signal(libc::SIGSEGV).start(),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        profile::builder().ring_capacity(1).start(),
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(
        profile::builder()
            .threads(Threads::Only(vec![i32::MAX]))
            .start()
            .unwrap_err(),
        Error::ThreadGone
    );
    let p = profile::start(99).unwrap();
    assert_eq!(
        profile::start(99).unwrap_err(),
        Error::AlreadyExists("a running profiler")
    );
    drop(p);
    // A signal the program handles itself is shared (chained) and given back at stop.
    extern "C" fn mine(_: i32) {}
    // SAFETY: installs a plain handler for SIGUSR2, which nothing else in this test uses.
    unsafe { libc::signal(libc::SIGUSR2, mine as *const () as usize) };
    drop(
        profile::builder()
            .signal(libc::SIGUSR2)
            .start()
            .unwrap()
            .stop(),
    );
    // SAFETY: queries SIGUSR2's action.
    let back = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGUSR2, std::ptr::null(), &mut sa);
        sa.sa_sigaction
    };
    assert_eq!(back, mine as *const () as usize);
    // After all that, a profiler starts.
    let stop = AtomicBool::new(false);
    let p = profile::start(99).unwrap();
    stop.store(true, Ordering::Relaxed);
    drop(p.stop());
}

/// Issue 45: a dump signal equal to a running profiler's was accepted, and every tick then
/// dumped every thread. Each part of selftrace refuses a signal another part holds, naming it;
/// a fault signal does not sample; thread ids must be positive.
#[test]
fn signals_held_elsewhere_and_bad_tids_are_refused() {
    let _g = serial();
    use selftrace::{threads, Error};
    selftrace::init().unwrap();
    let message = |r: Result<(), Error>| match r {
        Err(Error::InvalidInput(m)) => m.to_string(),
        other => format!("not refused: {other:?}"),
    };
    let p = profile::start(99).unwrap();
    let dump = message(threads::install_dump_signal(libc::SIGPROF));
    let request = message(threads::builder().signal(libc::SIGPROF).install());
    drop(p);
    let _ = threads::uninstall_dump_signal();
    assert!(dump.contains("the running profiler's"), "{dump}");
    assert!(request.contains("the running profiler's"), "{request}");
    // The reverse: the profiler does not take the dump signal, nor the request signal.
    threads::install_dump_signal(libc::SIGUSR1).unwrap();
    let on_dump = message(profile::builder().signal(libc::SIGUSR1).start().map(drop));
    threads::uninstall_dump_signal().unwrap();
    assert!(on_dump.contains("dump signal"), "{on_dump}");
    let on_request = message(
        profile::builder()
            .signal(threads::default_signal())
            .start()
            .map(drop),
    );
    assert!(on_request.contains("stack-request signal"), "{on_request}");
    // Once the dump signal is given back, the profiler may use it.
    drop(profile::builder().signal(libc::SIGUSR1).start().unwrap());
    for sig in [libc::SIGTRAP, libc::SIGSYS] {
        let m = message(profile::builder().signal(sig).start().map(drop));
        assert!(m.contains("cannot be used for sampling"), "{sig}: {m}");
    }
    for tid in [0, -1, i32::MIN] {
        let m = message(
            profile::builder()
                .threads(Threads::Only(vec![tid]))
                .start()
                .map(drop),
        );
        assert!(m.contains("thread ids must be positive"), "{tid}: {m}");
    }
    // After all that, SIGPROF is free again for the profiler.
    drop(profile::start(99).unwrap().stop());
}

#[inline(never)]
fn named_thread_work() -> u64 {
    spin(50)
}

#[test]
fn a_name_prefix_selects_threads() {
    let _g = serial();
    let stop = Arc::new(AtomicBool::new(false));
    let spawn = |name: &str| {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let id = tid();
                while !stop.load(Ordering::Relaxed) {
                    black_box(named_thread_work());
                }
                id
            })
            .unwrap()
    };
    let alpha = spawn("alpha-worker");
    let beta = spawn("beta-worker");
    std::thread::sleep(Duration::from_millis(50));
    let p = profile::builder()
        .frequency(500)
        .threads(Threads::NamePrefix("alpha".into()))
        .start()
        .unwrap();
    // Until alpha's timer fired 50 times (however much CPU time the two get on a loaded
    // machine, and at whatever tick): beta, as busy, would have been sampled as often.
    let start = Instant::now();
    while p.stats().samples < 50 && start.elapsed() < HANG {
        std::thread::sleep(Duration::from_millis(10));
    }
    let profile = p.stop();
    stop.store(true, Ordering::Relaxed);
    let (a, b) = (alpha.join().unwrap(), beta.join().unwrap());
    let of = |t: i32| -> u64 {
        profile
            .samples
            .iter()
            .filter(|s| s.thread_id == t)
            .map(|s| s.count)
            .sum()
    };
    assert!(of(a) >= 50, "{} samples of alpha", of(a));
    assert_eq!(of(b), 0, "beta was not selected");
    assert!(profile
        .samples
        .iter()
        .all(|s| s.thread_name.starts_with("alpha")));
}

#[test]
fn a_small_ring_accounts_for_every_period() {
    let _g = serial();
    const HZ: u32 = 1000;
    let cpu = Arc::new(AtomicU64::new(0));
    let tids = Arc::new(Mutex::new(Vec::new()));
    let go = Arc::new(Barrier::new(5));
    let p = {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (cpu, tids, go) = (cpu.clone(), tids.clone(), go.clone());
                std::thread::spawn(move || {
                    tids.lock().unwrap().push(tid());
                    go.wait();
                    let t0 = thread_cpu_ns();
                    let end = Instant::now() + Duration::from_millis(1500);
                    while Instant::now() < end {
                        black_box(continuous_work());
                    }
                    cpu.fetch_add(thread_cpu_ns() - t0, Ordering::Relaxed);
                })
            })
            .collect();
        while tids.lock().unwrap().len() < 4 {
            std::thread::yield_now();
        }
        let p = profile::builder()
            .frequency(HZ)
            .ring_capacity(16)
            .rescan_interval(Duration::from_secs(1))
            .threads(Threads::Only(tids.lock().unwrap().clone()))
            .start()
            .unwrap();
        go.wait();
        for w in workers {
            w.join().unwrap();
        }
        p
    };
    let stats = p.stats();
    let profile = p.stop();
    let expected = cpu.load(Ordering::Relaxed) as f64 * f64::from(HZ) / 1e9;
    let accounted = (profile.total() + profile.dropped) as f64;
    eprintln!(
        "total {} dropped {} expected {expected:.0}; {stats:?}",
        profile.total(),
        profile.dropped
    );
    assert!(
        (accounted - expected).abs() < 0.1 * expected,
        "{} kept + {} dropped periods for {expected:.0} periods of CPU time",
        profile.total(),
        profile.dropped
    );
    assert_eq!(profile.dropped, stats.dropped);
}

#[inline(never)]
fn hog_work(stop: &AtomicBool) -> u64 {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n = black_box(n.wrapping_add(spin(1000)));
    }
    n
}

/// In a child process (`SELFTRACE_FIRST_PROFILE` = `wall` or `cpu`): the process's first
/// profile, taken while four threads spin (more than this machine's cores, or as many), with
/// nothing symbolized before it: the profiler reads this binary's DWARF while samples arrive.
/// Prints `dropped=D total=T hog=H`.
#[test]
fn first_profile_child() {
    let Ok(mode) = std::env::var("SELFTRACE_FIRST_PROFILE") else {
        return;
    };
    selftrace::init().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let hogs: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || hog_work(&stop))
        })
        .collect();
    let p = profile::builder()
        .frequency(250)
        .mode(if mode == "wall" {
            Mode::Wall
        } else {
            Mode::Cpu
        })
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let profile = p.stop();
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    let hog: u64 = profile
        .samples
        .iter()
        .filter(|s| profile.function_names(s).any(|n| n.contains("hog_work")))
        .map(|s| s.count)
        .sum();
    println!(
        "dropped={} total={} hog={hog}",
        profile.dropped,
        profile.total()
    );
    std::process::exit(0);
}

#[test]
fn the_first_profile_under_load_drops_nothing() {
    for mode in ["wall", "cpu"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "first_profile_child", "--nocapture"])
            .env("SELFTRACE_FIRST_PROFILE", mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find(|l| l.starts_with("dropped="))
            .unwrap_or_else(|| panic!("{mode}: no result line:\n{stdout}"));
        let field = |name: &str| -> u64 {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                .unwrap_or_else(|| panic!("{mode}: no {name} in {line}"))
        };
        // The profile covered the hogs, named from the DWARF read meanwhile: most samples (in
        // wall mode the main thread's sleep is the rest), and at least 0.4 s of their time
        // whatever else the machine runs (4 x 1.5 s of spinning, 250 Hz).
        assert!(field("hog") >= 100, "{mode}: {line}");
        assert!(field("hog") * 2 >= field("total"), "{mode}: {line}");
        assert_eq!(field("dropped"), 0, "{mode}: {line}");
    }
}
