//! Other threads' stacks and the watchdog's check-in:
//!
//! * `remote_capture`: the round trip of [`selftrace::threads::capture`] (request, signal,
//!   the target's walk, futex wake, copy) for a thread blocked in a futex and for one spinning,
//!   next to the same walk of the caller's own stack (`selftrace::capture`), the `backtrace`
//!   crate's unresolved capture of the caller's own stack (what a program without a way to ask
//!   another thread can do), and a bare signal round trip (tgkill, an empty `SA_SIGINFO`
//!   handler that bumps a futex word, futex wait): the floor of any signal-based design.
//! * `dump_all_100_threads`: [`selftrace::threads::dump_all`] of 100 parked threads (plus the
//!   harness's) to `/dev/null`, symbolized, next to only listing `/proc/self/task`.
//! * `pet`: [`selftrace::watchdog::Watch::pet`] and the free `pet()`, next to what a naive
//!   watchdog does (store `Instant::now()`) and an atomic counter increment.
//!
//! Wall time (the round trip involves two threads). `cargo bench --bench threads`

use criterion::{criterion_group, criterion_main, Criterion};
use selftrace::threads;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[inline(never)]
fn parked(stop: Arc<AtomicBool>, b: Arc<Barrier>) {
    b.wait();
    while !stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

#[inline(never)]
fn spinning(stop: Arc<AtomicBool>, b: Arc<Barrier>) {
    b.wait();
    while !stop.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
}

/// Spawns `n` threads running `f`; returns their tids and the stop flag.
fn spawn(
    n: usize,
    f: fn(Arc<AtomicBool>, Arc<Barrier>),
) -> (Vec<i32>, Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let b = Arc::new(Barrier::new(n + 1));
    let mut tids = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..n {
        let tid = Arc::new(AtomicI32::new(0));
        let (t2, s2, b2) = (tid.clone(), stop.clone(), b.clone());
        handles.push(std::thread::spawn(move || {
            t2.store(threads::current_tid(), Ordering::SeqCst);
            f(s2, b2)
        }));
        while tid.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        tids.push(tid.load(Ordering::SeqCst));
    }
    b.wait();
    (tids, stop, handles)
}

fn stop_all(stop: Arc<AtomicBool>, handles: Vec<std::thread::JoinHandle<()>>) {
    stop.store(true, Ordering::SeqCst);
    for h in handles {
        h.thread().unpark();
        let _ = h.join();
    }
}

static BARE: AtomicU32 = AtomicU32::new(0);

extern "C" fn bare_handler(_: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    BARE.fetch_add(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on a static word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            BARE.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}

/// tgkill + an empty handler that wakes the sender + futex wait.
fn bare_round_trip(tid: i32, sig: i32) {
    let seen = BARE.load(Ordering::Acquire);
    // SAFETY: signals a thread of this process.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) };
    while BARE.load(Ordering::Acquire) == seen {
        let ts = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: FUTEX_WAIT on a static word with a valid timeout.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                BARE.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                &ts as *const libc::timespec,
            )
        };
    }
}

fn remote_capture(c: &mut Criterion) {
    selftrace::init().expect("init");
    threads::install().expect("install");
    let (tids, stop, handles) = spawn(2, parked);
    let (spin_tids, spin_stop, spin_handles) = spawn(1, spinning);
    let bare_sig = libc::SIGRTMIN() + 6;
    // SAFETY: installs a handler for a signal nothing else uses in this bench.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = bare_handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(bare_sig, &sa, std::ptr::null_mut());
    }
    let mut g = c.benchmark_group("remote_capture");
    g.measurement_time(Duration::from_secs(2)).sample_size(30);
    let mut frames = [0usize; 128];
    g.bench_function("selftrace threads::capture (blocked in futex)", |b| {
        b.iter(|| {
            threads::capture(tids[0], &mut frames, Duration::from_secs(1))
                .map(|w| w.frames)
                .expect("capture")
        })
    });
    g.bench_function("selftrace threads::capture (spinning)", |b| {
        b.iter(|| {
            threads::capture(spin_tids[0], &mut frames, Duration::from_secs(1))
                .map(|w| w.frames)
                .expect("capture")
        })
    });
    g.bench_function("bare signal round trip (floor)", |b| {
        b.iter(|| bare_round_trip(tids[1], bare_sig))
    });
    g.bench_function("selftrace capture (own stack)", |b| {
        b.iter(|| selftrace::capture(black_box(&mut frames)))
    });
    g.bench_function("backtrace::Backtrace::new_unresolved (own stack)", |b| {
        b.iter(backtrace::Backtrace::new_unresolved)
    });
    g.finish();
    stop_all(stop, handles);
    stop_all(spin_stop, spin_handles);
}

fn dump_all(c: &mut Criterion) {
    selftrace::init().expect("init");
    let (_tids, stop, handles) = spawn(100, parked);
    let devnull = std::fs::File::create("/dev/null").unwrap();
    let mut g = c.benchmark_group("dump_all_100_threads");
    g.measurement_time(Duration::from_secs(5)).sample_size(10);
    g.bench_function("selftrace dump_all to /dev/null", |b| {
        b.iter(|| {
            let s = threads::dump_all(&devnull);
            assert!(s.stacks >= 100);
            s
        })
    });
    g.bench_function("list /proc/self/task only", |b| {
        let mut buf = [0i32; 256];
        b.iter(|| threads::list(&mut buf).unwrap())
    });
    g.finish();
    stop_all(stop, handles);
}

fn pet(c: &mut Criterion) {
    let w =
        selftrace::watchdog::watch_with_timeout("bench", Duration::from_secs(3600)).expect("watch");
    let mut g = c.benchmark_group("pet");
    g.measurement_time(Duration::from_secs(1)).sample_size(30);
    g.bench_function("selftrace Watch::pet", |b| b.iter(|| black_box(&w).pet()));
    g.bench_function("selftrace watchdog::pet()", |b| {
        b.iter(selftrace::watchdog::pet)
    });
    let start = Instant::now();
    let last = AtomicU64::new(0);
    g.bench_function("store Instant::now() (naive)", |b| {
        b.iter(|| last.store(start.elapsed().as_nanos() as u64, Ordering::Relaxed))
    });
    let count = AtomicU64::new(0);
    g.bench_function("fetch_add counter", |b| {
        b.iter(|| black_box(&count).fetch_add(1, Ordering::Relaxed))
    });
    g.finish();
    drop(w);
}

criterion_group!(benches, remote_capture, dump_all, pet);
criterion_main!(benches);
