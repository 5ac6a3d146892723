//! Stack capture, selftrace against its peers, same process, same stack (a 20-function chain
//! on top of the bench harness), in the same run:
//! - selftrace `capture` (DWARF CFI with frame-pointer fallback) and `Capture` in frame-pointer mode
//! - glibc `backtrace()` (libgcc's unwinder)
//! - the `backtrace` crate's `trace_unsynchronized` (libgcc's `_Unwind_Backtrace`)
//! - libunwind's `unw_backtrace` (nongnu libunwind, `libunwind.so.8`, loaded with `dlopen`
//!   so that its `_Unwind_*` symbols do not replace Rust's)
//!
//! Each benchmark reports the time for one whole capture; the frame counts are printed once
//! at start so that per-frame costs can be compared. `selftrace_capture_dwarf` is the default:
//! a walk reuses the outer frames of the thread's previous walk once it checked the stack words
//! they came from (`selftrace::unwind::set_walk_reuse`); `selftrace_capture_dwarf_no_reuse`
//! steps every frame, the cost of a stack the thread has not walked before.
//!
//! Further groups, selftrace and libunwind side by side:
//! - `capture_2048_sites`: consecutive captures come from different stacks through 2,048
//!   distinct functions (16 of them per stack, a different start each time): the working set
//!   of a profiler, which a small rule cache cannot hold. Then the same comparison interleaved
//!   (rounds of selftrace, libunwind and the stack alone taking turns), printed as one line:
//!   on a VM whose speed drifts over seconds, the side-by-side criterion numbers can differ
//!   by 30% from run to run, the interleaved ratio by much less.
//! - `capture_through_libc_qsort`: the capture runs in a comparator that glibc's `qsort` calls,
//!   so the walk goes through libc's frames (`qsort_no_capture` is the sort alone).
//! - `capture_in_handler_libcrypto_leaf`: a thread runs OpenSSL SHA-512 (assembly whose CFA is
//!   a DWARF expression); the bench signals it and times, inside the handler, one
//!   `Capture::walk_ucontext` or one libunwind `unw_init_local2(UNW_INIT_SIGNAL_FRAME)` + `unw_step`
//!   walk of the interrupted stack (only the walk is timed).
//!
//! And frame-pointer mode where it means something: the `fp_bench` example, built with
//! `-C force-frame-pointers=yes` in release and run from here, prints the frame-pointer capture and a naive
//! unchecked frame-pointer loop over the same chain, ns per frame and the ratio.

#[path = "../tests/support/libunwind.rs"]
mod unw_local;

use criterion::{criterion_group, criterion_main, Criterion};
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type UnwBacktrace = unsafe extern "C" fn(*mut *mut c_void, libc::c_int) -> libc::c_int;

fn libunwind() -> Option<UnwBacktrace> {
    // SAFETY: dlopen/dlsym with valid C strings; unw_backtrace has this C signature.
    unsafe {
        let h = libc::dlopen(
            c"libunwind.so.8".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if h.is_null() {
            return None;
        }
        let f = libc::dlsym(h, c"unw_backtrace".as_ptr());
        (!f.is_null()).then(|| std::mem::transmute::<*mut c_void, UnwBacktrace>(f))
    }
}

macro_rules! chain {
    ($name:ident -> $next:ident $(-> $rest:ident)*) => {
        #[inline(never)]
        fn $name(f: &mut dyn FnMut()) {
            $next(f);
            black_box(());
        }
        chain!($next $(-> $rest)*);
    };
    ($last:ident) => {
        #[inline(never)]
        fn $last(f: &mut dyn FnMut()) {
            f();
            black_box(());
        }
    };
}

chain!(c00 -> c01 -> c02 -> c03 -> c04 -> c05 -> c06 -> c07 -> c08 -> c09 -> c10 -> c11 -> c12
    -> c13 -> c14 -> c15 -> c16 -> c17 -> c18 -> c19);

fn count_frames(unw: Option<UnwBacktrace>) {
    let mut buf = [0usize; 256];
    let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
    c00(&mut || {
        let a = selftrace::capture(&mut buf);
        let b = selftrace::Capture::new()
            .mode(selftrace::UnwindMode::FramePointer)
            .walk(&mut buf)
            .frames;
        // SAFETY: ptrs is valid for 256 entries.
        let c = unsafe { libc::backtrace(ptrs.as_mut_ptr(), 256) };
        let mut d = 0;
        // SAFETY: the closure only counts frames.
        unsafe {
            backtrace::trace_unsynchronized(|_| {
                d += 1;
                true
            })
        };
        // SAFETY: ptrs is valid for 256 entries.
        let e = unw.map_or(0, |f| unsafe { f(ptrs.as_mut_ptr(), 256) });
        eprintln!(
            "frames per capture: selftrace dwarf {a}, selftrace fp {b} (no frame pointers in \
             std and this bench), glibc backtrace {c}, backtrace crate {d}, libunwind {e}"
        );
    });
}

// ---- 2,048 distinct call sites ----------------------------------------------------------------

/// One of 2,048 distinct functions (the constant keeps them from being merged): calls the next
/// site of a fixed permutation until `depth` is 0, then `f`.
#[derive(Clone, Copy)]
struct Site(fn(&[Site], usize, usize, &mut dyn FnMut()));

const SITES: usize = 2048;
const SITE_DEPTH: usize = 16;

#[inline(never)]
fn site<const N: usize>(table: &[Site], depth: usize, _id: usize, f: &mut dyn FnMut()) {
    if depth == 0 {
        f();
    } else {
        let next = (N * 1021 + 7) % SITES;
        (table[next].0)(table, depth - 1, next, f);
    }
    black_box(N);
}

macro_rules! push2 {
    ($v:ident, $n:expr) => {
        $v.push(Site(site::<{ $n }>));
        $v.push(Site(site::<{ $n + 1 }>));
    };
}
macro_rules! push4 {
    ($v:ident, $n:expr) => {
        push2!($v, $n);
        push2!($v, $n + 2);
    };
}
macro_rules! push8 {
    ($v:ident, $n:expr) => {
        push4!($v, $n);
        push4!($v, $n + 4);
    };
}
macro_rules! push16 {
    ($v:ident, $n:expr) => {
        push8!($v, $n);
        push8!($v, $n + 8);
    };
}
macro_rules! push32 {
    ($v:ident, $n:expr) => {
        push16!($v, $n);
        push16!($v, $n + 16);
    };
}
macro_rules! push64 {
    ($v:ident, $n:expr) => {
        push32!($v, $n);
        push32!($v, $n + 32);
    };
}
macro_rules! push128 {
    ($v:ident, $n:expr) => {
        push64!($v, $n);
        push64!($v, $n + 64);
    };
}
macro_rules! push256 {
    ($v:ident, $n:expr) => {
        push128!($v, $n);
        push128!($v, $n + 128);
    };
}
macro_rules! push512 {
    ($v:ident, $n:expr) => {
        push256!($v, $n);
        push256!($v, $n + 256);
    };
}
macro_rules! push1024 {
    ($v:ident, $n:expr) => {
        push512!($v, $n);
        push512!($v, $n + 512);
    };
}

fn site_table() -> Vec<Site> {
    let mut v: Vec<Site> = Vec::with_capacity(SITES);
    push1024!(v, 0);
    push1024!(v, 1024);
    v
}

/// Runs `f` at the bottom of a stack through the sites, starting at a different site each call.
fn rotate(table: &[Site], k: &mut usize, f: &mut dyn FnMut()) {
    *k = (*k + 1) % SITES;
    (table[*k].0)(table, SITE_DEPTH, *k, f);
}

fn bench_sites(c: &mut Criterion, unw: Option<UnwBacktrace>) {
    let table = site_table();
    // How many distinct return addresses the rotation really produces.
    let mut seen = std::collections::HashSet::new();
    let mut k = 0;
    let mut buf = [0usize; 256];
    for _ in 0..SITES {
        rotate(&table, &mut k, &mut || {
            let n = selftrace::capture(&mut buf);
            seen.extend(buf[..n].iter().copied());
        });
    }
    let n = {
        let mut n = 0;
        rotate(&table, &mut k, &mut || n = selftrace::capture(&mut buf));
        n
    };
    eprintln!(
        "capture_2048_sites: {n} frames per capture (selftrace), {} distinct return addresses \
         over {SITES} consecutive captures",
        seen.len()
    );
    let mut g = c.benchmark_group("capture_2048_sites");
    g.bench_function("selftrace_capture_dwarf", |b| {
        let mut buf = [0usize; 256];
        let mut k = 0;
        b.iter(|| {
            let mut n = 0;
            rotate(&table, &mut k, &mut || n = selftrace::capture(&mut buf));
            black_box(n)
        });
    });
    g.bench_function("selftrace_capture_dwarf_no_reuse", |b| {
        let mut buf = [0usize; 256];
        let mut k = 0;
        selftrace::unwind::set_walk_reuse(false);
        b.iter(|| {
            let mut n = 0;
            rotate(&table, &mut k, &mut || n = selftrace::capture(&mut buf));
            black_box(n)
        });
        selftrace::unwind::set_walk_reuse(true);
    });
    if let Some(f) = unw {
        g.bench_function("libunwind_unw_backtrace", |b| {
            let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
            let mut k = 0;
            b.iter(|| {
                let mut n = 0;
                // SAFETY: ptrs is valid for 256 entries.
                rotate(&table, &mut k, &mut || {
                    n = unsafe { f(ptrs.as_mut_ptr(), 256) }
                });
                black_box(n)
            });
        });
    }
    g.bench_function("stack_only_no_capture", |b| {
        let mut k = 0;
        b.iter(|| rotate(&table, &mut k, &mut || black_box(())));
    });
    g.finish();
    if let Some(f) = unw {
        sites_interleaved(&table, f);
    }
}

/// The 2,048-site comparison again, interleaved: rounds of 2,048 captures (every site once)
/// by selftrace, by libunwind and by neither (the stack alone) take turns, in a rotating order,
/// so that the machine's slow and fast spells (other tenants of a VM) fall on all three alike.
/// Prints the fastest and the median round of each, per capture, and selftrace's time over
/// libunwind's with the stack's cost taken out of both.
fn sites_interleaved(table: &[Site], unw: UnwBacktrace) {
    const ROUNDS: usize = 300;
    let mut buf = [0usize; 256];
    let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
    let mut k = 0;
    let mut ns: [Vec<f64>; 3] = Default::default();
    for round in 0..ROUNDS {
        for turn in 0..3 {
            let which = (turn + round) % 3;
            let t = Instant::now();
            for _ in 0..SITES {
                match which {
                    0 => rotate(table, &mut k, &mut || {
                        black_box(selftrace::capture(&mut buf));
                    }),
                    // SAFETY: ptrs is valid for 256 entries.
                    1 => rotate(table, &mut k, &mut || {
                        black_box(unsafe { unw(ptrs.as_mut_ptr(), 256) });
                    }),
                    _ => rotate(table, &mut k, &mut || black_box(())),
                }
            }
            ns[which].push(t.elapsed().as_nanos() as f64 / SITES as f64);
        }
    }
    for v in &mut ns {
        v.sort_by(f64::total_cmp);
    }
    let (min, median) = (|v: &Vec<f64>| v[0], |v: &Vec<f64>| v[v.len() / 2]);
    let [me, them, stack] = &ns;
    eprintln!(
        "capture_2048_sites interleaved, {ROUNDS} rounds of {SITES} captures each, ns per \
         capture (fastest round / median round): selftrace {:.0} / {:.0}, libunwind {:.0} / \
         {:.0}, stack alone {:.0} / {:.0}; selftrace / libunwind without the stack: {:.2} / \
         {:.2}",
        min(me),
        median(me),
        min(them),
        median(them),
        min(stack),
        median(stack),
        (min(me) - min(stack)) / (min(them) - min(stack)),
        (median(me) - median(stack)) / (median(them) - median(stack)),
    );
}

// ---- through libc's qsort -------------------------------------------------------------------

/// What the comparator does on each call: 0 nothing, 1 selftrace, 2 libunwind.
static QSORT_MODE: AtomicUsize = AtomicUsize::new(0);
static QSORT_FRAMES: AtomicUsize = AtomicUsize::new(0);
static QSORT_CALLS: AtomicUsize = AtomicUsize::new(0);
static UNW_BT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn cmp_capture(a: *const c_void, b: *const c_void) -> i32 {
    let mut buf = [0usize; 256];
    let n = match QSORT_MODE.load(Ordering::Relaxed) {
        1 => selftrace::capture(&mut buf),
        2 => {
            let f = UNW_BT.load(Ordering::Relaxed);
            // SAFETY: UNW_BT holds unw_backtrace when mode 2 is selected; buf has 256 words.
            unsafe {
                std::mem::transmute::<usize, UnwBacktrace>(f)(buf.as_mut_ptr().cast(), 256) as usize
            }
        }
        _ => 0,
    };
    QSORT_FRAMES.store(n, Ordering::Relaxed);
    QSORT_CALLS.fetch_add(1, Ordering::Relaxed);
    black_box(&buf);
    // SAFETY: qsort passes pointers to two elements of the u32 array.
    let (a, b) = unsafe { (*(a as *const u32), *(b as *const u32)) };
    a.cmp(&b) as i32
}

const QSORT_INPUT: [u32; 8] = [5, 3, 7, 1, 8, 2, 6, 4];

fn sort_once() {
    let mut v = QSORT_INPUT;
    // SAFETY: v holds 8 u32s; cmp_capture compares two of them.
    unsafe { libc::qsort(v.as_mut_ptr().cast(), v.len(), 4, Some(cmp_capture)) };
    black_box(&v);
}

fn bench_qsort(c: &mut Criterion, unw: Option<UnwBacktrace>) {
    if let Some(f) = unw {
        UNW_BT.store(f as usize, Ordering::Relaxed);
    }
    for (mode, name) in [(1, "selftrace"), (2, "libunwind")] {
        if mode == 2 && unw.is_none() {
            continue;
        }
        QSORT_MODE.store(mode, Ordering::Relaxed);
        QSORT_CALLS.store(0, Ordering::Relaxed);
        c00(&mut sort_once);
        eprintln!(
            "capture_through_libc_qsort: {name} {} frames per capture, {} captures per sort",
            QSORT_FRAMES.load(Ordering::Relaxed),
            QSORT_CALLS.load(Ordering::Relaxed)
        );
    }
    let mut g = c.benchmark_group("capture_through_libc_qsort");
    for (mode, name) in [
        (1, "selftrace_capture_dwarf"),
        (2, "libunwind_unw_backtrace"),
        (0, "qsort_no_capture"),
    ] {
        if mode == 2 && unw.is_none() {
            continue;
        }
        g.bench_function(name, |b| {
            QSORT_MODE.store(mode, Ordering::Relaxed);
            c00(&mut || b.iter(sort_once));
        });
    }
    g.finish();
}

// ---- in a handler, interrupting libcrypto assembly ------------------------------------------

/// What the SIGUSR2 handler walks with: 1 selftrace, 2 libunwind.
static SIG_MODE: AtomicUsize = AtomicUsize::new(0);
/// Handler invocations completed (the bench waits for each).
static SIG_DONE: AtomicUsize = AtomicUsize::new(0);
/// Nanoseconds spent in the walks, and frames of the last walk.
static SIG_NS: AtomicU64 = AtomicU64::new(0);
static SIG_FRAMES: AtomicUsize = AtomicUsize::new(0);
/// Whether the last interrupted pc was in libcrypto.
static SIG_IN_LEAF: AtomicUsize = AtomicUsize::new(0);
static LEAF_RANGE: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));
static STOP_WORKER: AtomicBool = AtomicBool::new(false);
static WORKER_TID: AtomicI32 = AtomicI32::new(0);

struct SigBuf(UnsafeCell<[usize; 256]>);
// SAFETY: used only by the SIGUSR2 handler of the one worker thread, one signal at a time.
unsafe impl Sync for SigBuf {}
static SIG_BUF: SigBuf = SigBuf(UnsafeCell::new([0; 256]));
static UNW_LOCAL: std::sync::OnceLock<unw_local::Libunwind> = std::sync::OnceLock::new();

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is valid for writes; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

extern "C" fn on_usr2(_sig: i32, _info: *mut libc::siginfo_t, uc: *mut c_void) {
    // SAFETY: only this handler, on the worker thread, one signal at a time, uses the buffer.
    let buf = unsafe { &mut *SIG_BUF.0.get() };
    // SAFETY: uc is the ucontext_t of this signal.
    let pc = unsafe { (*(uc as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] }
        as usize;
    let t0 = mono_ns();
    let n = match SIG_MODE.load(Ordering::Relaxed) {
        // SAFETY: as above.
        1 => unsafe {
            selftrace::Capture::new()
                .walk_ucontext(uc.cast(), buf)
                .frames
        },
        // SAFETY: as above.
        2 => UNW_LOCAL
            .get()
            .map_or(0, |u| unsafe { u.walk_ucontext(uc, buf).0 }),
        _ => 0,
    };
    let t1 = mono_ns();
    SIG_NS.fetch_add(t1 - t0, Ordering::Relaxed);
    SIG_FRAMES.store(n, Ordering::Relaxed);
    let in_leaf =
        pc >= LEAF_RANGE.0.load(Ordering::Relaxed) && pc < LEAF_RANGE.1.load(Ordering::Relaxed);
    SIG_IN_LEAF.fetch_add(in_leaf as usize, Ordering::Relaxed);
    SIG_DONE.fetch_add(1, Ordering::Release);
}

type Sha512 = unsafe extern "C" fn(*const u8, usize, *mut u8) -> *mut u8;

fn libcrypto_sha512() -> Option<Sha512> {
    // SAFETY: dlopen/dlsym with valid C strings; SHA512 has this C signature.
    unsafe {
        let h = libc::dlopen(
            c"libcrypto.so.3".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if h.is_null() {
            return None;
        }
        let f = libc::dlsym(h, c"SHA512".as_ptr());
        (!f.is_null()).then(|| std::mem::transmute::<*mut c_void, Sha512>(f))
    }
}

/// Signals the worker once and waits for its handler; returns false if it did not answer.
fn poke(tid: i32) -> bool {
    let before = SIG_DONE.load(Ordering::Acquire);
    // SAFETY: tgkill to a live thread of this process (it runs until STOP_WORKER).
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR2) };
    let t = Instant::now();
    while SIG_DONE.load(Ordering::Acquire) == before {
        if t.elapsed() > Duration::from_secs(2) {
            return false;
        }
        std::hint::spin_loop();
    }
    true
}

fn bench_handler_libcrypto(c: &mut Criterion) {
    let Some(sha) = libcrypto_sha512() else {
        eprintln!("libcrypto.so.3 not found: install libssl-dev to bench a libcrypto leaf");
        return;
    };
    selftrace::refresh();
    if let Some(s) = selftrace::symbolize(sha as *const () as usize) {
        // The whole object: the SHA-512 block functions are local symbols.
        if let Some(o) = selftrace::modules::snapshot()
            .objects()
            .iter()
            .find(|o| o.path == s.path)
        {
            LEAF_RANGE.0.store(o.range.start, Ordering::Relaxed);
            LEAF_RANGE.1.store(o.range.end, Ordering::Relaxed);
        }
    }
    if let Ok(u) = unw_local::Libunwind::load() {
        let _ = UNW_LOCAL.set(u);
    }
    // SAFETY: a SA_SIGINFO handler that only walks into a static buffer and bumps atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr2 as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
    }
    STOP_WORKER.store(false, Ordering::SeqCst);
    let worker = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        WORKER_TID.store(unsafe { libc::gettid() }, Ordering::SeqCst);
        let data = vec![0xa5u8; 64 << 10];
        let mut md = [0u8; 64];
        while !STOP_WORKER.load(Ordering::Relaxed) {
            // SAFETY: data is valid for its length; md has 64 bytes.
            unsafe { sha(data.as_ptr(), data.len(), md.as_mut_ptr()) };
            black_box(&md);
        }
    });
    while WORKER_TID.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    let tid = WORKER_TID.load(Ordering::SeqCst);
    let modes: &[(usize, &str)] = if UNW_LOCAL.get().is_some() {
        &[
            (1, "selftrace_capture_from_ucontext"),
            (2, "libunwind_init_local2_step"),
        ]
    } else {
        &[(1, "selftrace_capture_from_ucontext")]
    };
    for &(mode, name) in modes {
        SIG_MODE.store(mode, Ordering::SeqCst);
        SIG_IN_LEAF.store(0, Ordering::SeqCst);
        let before = SIG_DONE.load(Ordering::SeqCst);
        let mut frames = 0;
        for _ in 0..200 {
            poke(tid);
            frames += SIG_FRAMES.load(Ordering::Relaxed);
        }
        let n = (SIG_DONE.load(Ordering::SeqCst) - before).max(1);
        eprintln!(
            "capture_in_handler_libcrypto_leaf: {name}: {:.1} frames per walk, {} of {n} \
             interrupted pcs in libcrypto",
            frames as f64 / n as f64,
            SIG_IN_LEAF.load(Ordering::SeqCst)
        );
    }
    let mut g = c.benchmark_group("capture_in_handler_libcrypto_leaf");
    for &(mode, name) in modes {
        g.bench_function(name, |b| {
            SIG_MODE.store(mode, Ordering::SeqCst);
            b.iter_custom(|iters| {
                SIG_NS.store(0, Ordering::SeqCst);
                for _ in 0..iters {
                    if !poke(tid) {
                        break;
                    }
                }
                Duration::from_nanos(SIG_NS.load(Ordering::SeqCst))
            });
        });
    }
    g.finish();
    STOP_WORKER.store(true, Ordering::SeqCst);
    let _ = worker.join();
    SIG_MODE.store(0, Ordering::SeqCst);
}

// ---- frame pointers, in a build that has them ----------------------------------------------

/// Builds the `fp_bench` example with frame pointers (release, its own target directory) and
/// runs it; prints its line.
fn fp_mode() {
    let root = env!("CARGO_MANIFEST_DIR");
    let target = format!("{root}/target/fp-build");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(&cargo)
        .args(["build", "--quiet", "--release", "--example", "fp_bench"])
        .env("RUSTFLAGS", "-C force-frame-pointers=yes")
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("fp_bench: building the example with frame pointers failed");
        return;
    }
    match std::process::Command::new(format!("{target}/release/examples/fp_bench")).output() {
        Ok(out) => {
            eprint!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        Err(e) => eprintln!("fp_bench: {e}"),
    }
}

fn bench(c: &mut Criterion) {
    selftrace::init().expect("init");
    let unw = libunwind();
    count_frames(unw);
    let mut g = c.benchmark_group("capture_20_deep");
    g.bench_function("selftrace_capture_dwarf", |b| {
        let mut buf = [0usize; 256];
        c00(&mut || b.iter(|| black_box(selftrace::capture(&mut buf))));
    });
    g.bench_function("selftrace_capture_dwarf_no_reuse", |b| {
        let mut buf = [0usize; 256];
        selftrace::unwind::set_walk_reuse(false);
        c00(&mut || b.iter(|| black_box(selftrace::capture(&mut buf))));
        selftrace::unwind::set_walk_reuse(true);
    });
    g.bench_function("selftrace_capture_fp", |b| {
        let mut buf = [0usize; 256];
        c00(&mut || {
            b.iter(|| {
                black_box(
                    selftrace::Capture::new()
                        .mode(selftrace::UnwindMode::FramePointer)
                        .walk(&mut buf)
                        .frames,
                )
            })
        });
    });
    g.bench_function("glibc_backtrace", |b| {
        let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
        // SAFETY: ptrs is valid for 256 entries.
        c00(&mut || b.iter(|| black_box(unsafe { libc::backtrace(ptrs.as_mut_ptr(), 256) })));
    });
    g.bench_function("backtrace_crate_trace", |b| {
        let mut buf = [0usize; 256];
        c00(&mut || {
            b.iter(|| {
                let mut n = 0;
                // SAFETY: single-threaded use; the closure only stores ips.
                unsafe {
                    backtrace::trace_unsynchronized(|f| {
                        buf[n] = f.ip() as usize;
                        n += 1;
                        n < buf.len()
                    })
                };
                black_box(n)
            })
        });
    });
    if let Some(f) = unw {
        g.bench_function("libunwind_unw_backtrace", |b| {
            let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
            // SAFETY: ptrs is valid for 256 entries.
            c00(&mut || b.iter(|| black_box(unsafe { f(ptrs.as_mut_ptr(), 256) })));
        });
    } else {
        eprintln!("libunwind.so.8 not found: install libunwind-dev (or libunwind8) to compare");
    }
    g.finish();
    bench_sites(c, unw);
    bench_qsort(c, unw);
    bench_handler_libcrypto(c);
    fp_mode();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
