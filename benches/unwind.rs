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
//! steps every frame, the cost of a stack the thread has not walked before. Then the same three
//! (with reuse, every frame stepped, libunwind) interleaved in rounds, printed as one line with
//! the fastest and the median round of each (on a VM whose neighbours come and go, the median
//! ratio is the one to quote: criterion's side-by-side times can drift apart by half).
//!
//! Further groups, selftrace and libunwind side by side:
//! - `capture_shallow`: the capture in the bench closure itself (13-14 frames, the
//!   harness's): the cost of a capture beyond its frames.
//! - `capture_2048_sites`: consecutive captures come from different stacks through 2,048
//!   distinct functions (16 of them per stack, a different start each time): the working set
//!   of a profiler, which a small rule cache cannot hold. Then the same comparison interleaved
//!   (rounds of selftrace, libunwind and the stack alone taking turns), printed as one line:
//!   on a VM whose speed drifts over seconds, the side-by-side criterion numbers can differ
//!   by 30% from run to run, the interleaved ratio by much less.
//! - `capture_dense_sites`: 64 functions with 32 direct call sites each (return addresses
//!   10-20 bytes apart), a new 22-frame path through them each capture; the same comparison
//!   interleaved with every frame stepped too, printed per frame with the stack's cost out.
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

#[path = "../tests/support/target.rs"]
mod target;
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

// ---- dense call sites: 64 functions x 32 call sites each -------------------------------------

/// A function of the dense-site group: at `depth` 0 it runs `f`; else one of its 32 direct
/// calls, to 32 different functions of the group, chosen by the low 5 bits of `path`. The call
/// sites lie 10-20 bytes apart (an argument move or two, the call, a jump), many return
/// addresses per function, as in code that calls `a(); b(); c();`.
macro_rules! dense_fn {
    ($name:ident; $($k:literal $t:ident),*) => {
        #[inline(never)]
        fn $name(path: u64, depth: usize, f: &mut dyn FnMut()) {
            if depth == 0 {
                f();
            } else {
                let next = dense_next(path);
                match path & 31 {
                    $($k => $t(next, depth - 1, f),)*
                    _ => unreachable!(),
                }
            }
            black_box(path);
        }
    };
}

/// Defines each function of a list with the 32 that follow it as its callees (the list is
/// the 64 names followed by the first 32 again, so every function has 32).
macro_rules! dense_windows {
    ($head:ident $a0:ident $a1:ident $a2:ident $a3:ident $a4:ident $a5:ident $a6:ident $a7:ident $a8:ident $a9:ident $a10:ident $a11:ident $a12:ident $a13:ident $a14:ident $a15:ident $a16:ident $a17:ident $a18:ident $a19:ident $a20:ident $a21:ident $a22:ident $a23:ident $a24:ident $a25:ident $a26:ident $a27:ident $a28:ident $a29:ident $a30:ident $a31:ident $($rest:ident)*) => {
        dense_fn!($head; 0 $a0, 1 $a1, 2 $a2, 3 $a3, 4 $a4, 5 $a5, 6 $a6, 7 $a7, 8 $a8, 9 $a9, 10 $a10, 11 $a11, 12 $a12, 13 $a13, 14 $a14, 15 $a15, 16 $a16, 17 $a17, 18 $a18, 19 $a19, 20 $a20, 21 $a21, 22 $a22, 23 $a23, 24 $a24, 25 $a25, 26 $a26, 27 $a27, 28 $a28, 29 $a29, 30 $a30, 31 $a31);
        dense_windows!($a0 $a1 $a2 $a3 $a4 $a5 $a6 $a7 $a8 $a9 $a10 $a11 $a12 $a13 $a14 $a15 $a16 $a17 $a18 $a19 $a20 $a21 $a22 $a23 $a24 $a25 $a26 $a27 $a28 $a29 $a30 $a31 $($rest)*);
    };
    ($($tail:ident)*) => {};
}

dense_windows!(d0 d1 d2 d3 d4 d5 d6 d7 d8 d9 d10 d11 d12 d13 d14 d15 d16 d17 d18 d19 d20 d21 d22 d23 d24 d25 d26 d27 d28 d29 d30 d31 d32 d33 d34 d35 d36 d37 d38 d39 d40 d41 d42 d43 d44 d45 d46 d47 d48 d49 d50 d51 d52 d53 d54 d55 d56 d57 d58 d59 d60 d61 d62 d63 d0 d1 d2 d3 d4 d5 d6 d7 d8 d9 d10 d11 d12 d13 d14 d15 d16 d17 d18 d19 d20 d21 d22 d23 d24 d25 d26 d27 d28 d29 d30 d31);

/// A function of the dense-site group.
type DenseFn = fn(u64, usize, &mut dyn FnMut());

/// The 64 functions, for a start chosen by the path.
const DENSE: [DenseFn; 64] = [
    d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17, d18, d19, d20,
    d21, d22, d23, d24, d25, d26, d27, d28, d29, d30, d31, d32, d33, d34, d35, d36, d37, d38, d39,
    d40, d41, d42, d43, d44, d45, d46, d47, d48, d49, d50, d51, d52, d53, d54, d55, d56, d57, d58,
    d59, d60, d61, d62, d63,
];
/// Frames of the group per capture (the path's length).
const DENSE_DEPTH: usize = 22;
/// Captures per round of the interleaved comparison: every round a new set of paths.
const DENSE_CAPTURES: usize = 2048;

/// xorshift64: the next part of a path.
fn dense_next(x: u64) -> u64 {
    let x = x ^ (x << 13);
    let x = x ^ (x >> 7);
    x ^ (x << 17)
}

/// Runs `f` at the bottom of a new path through the dense sites (seeded by `seed`).
fn dense_path(seed: &mut u64, f: &mut dyn FnMut()) {
    *seed = dense_next(*seed);
    DENSE[(*seed >> 58) as usize](*seed, DENSE_DEPTH, f);
}

/// Interleaved rounds of [`DENSE_CAPTURES`] captures through the dense sites, each from a new
/// path: selftrace with walk reuse, selftrace stepping every frame, libunwind and the stack
/// alone take turns in a rotating order. Prints per-frame times (the stack's cost taken out)
/// of the fastest and the median round, and selftrace's over libunwind's.
fn bench_dense(c: &mut Criterion, unw: Option<UnwBacktrace>) {
    let mut buf = [0usize; 256];
    let mut seen = std::collections::HashSet::new();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut frames = 0;
    for _ in 0..DENSE_CAPTURES {
        dense_path(&mut seed, &mut || {
            frames = selftrace::capture(&mut buf);
            seen.extend(buf[..frames].iter().copied());
        });
    }
    eprintln!(
        "capture_dense_sites: {frames} frames per capture ({DENSE_DEPTH} in 64 functions with \
         32 call sites each), {} distinct return addresses over {DENSE_CAPTURES} captures",
        seen.len()
    );
    let mut g = c.benchmark_group("capture_dense_sites");
    for (name, reuse) in [
        ("selftrace_capture_dwarf", true),
        ("selftrace_capture_dwarf_no_reuse", false),
    ] {
        g.bench_function(name, |b| {
            let mut seed = 1u64;
            selftrace::unwind::set_walk_reuse(reuse);
            b.iter(|| {
                let mut n = 0;
                dense_path(&mut seed, &mut || n = selftrace::capture(&mut buf));
                black_box(n)
            });
            selftrace::unwind::set_walk_reuse(true);
        });
    }
    if let Some(f) = unw {
        g.bench_function("libunwind_unw_backtrace", |b| {
            let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
            let mut seed = 1u64;
            b.iter(|| {
                let mut n = 0;
                // SAFETY: ptrs is valid for 256 entries.
                dense_path(&mut seed, &mut || n = unsafe { f(ptrs.as_mut_ptr(), 256) });
                black_box(n)
            });
        });
    }
    g.bench_function("stack_only_no_capture", |b| {
        let mut seed = 1u64;
        b.iter(|| dense_path(&mut seed, &mut || black_box(())));
    });
    g.finish();
    let Some(unw) = unw else { return };
    const ROUNDS: usize = 200;
    let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
    let mut ns: [Vec<f64>; 4] = Default::default();
    for round in 0..ROUNDS {
        for turn in 0..4 {
            let which = (turn + round) % 4;
            selftrace::unwind::set_walk_reuse(which != 1);
            // The same paths for all four in a round, new ones every round.
            let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ round as u64;
            let t = Instant::now();
            for _ in 0..DENSE_CAPTURES {
                match which {
                    0 | 1 => dense_path(&mut seed, &mut || {
                        black_box(selftrace::capture(&mut buf));
                    }),
                    // SAFETY: ptrs is valid for 256 entries.
                    2 => dense_path(&mut seed, &mut || {
                        black_box(unsafe { unw(ptrs.as_mut_ptr(), 256) });
                    }),
                    _ => dense_path(&mut seed, &mut || black_box(())),
                }
            }
            ns[which].push(t.elapsed().as_nanos() as f64 / (DENSE_CAPTURES * frames) as f64);
        }
    }
    selftrace::unwind::set_walk_reuse(true);
    for v in &mut ns {
        v.sort_by(f64::total_cmp);
    }
    let pick = |v: &Vec<f64>, median: bool| if median { v[v.len() / 2] } else { v[0] };
    for (label, median) in [("fastest", false), ("median", true)] {
        let st = pick(&ns[3], median);
        let [reuse, step, lu] = [0, 1, 2].map(|i| pick(&ns[i], median) - st);
        eprintln!(
            "capture_dense_sites interleaved, {ROUNDS} rounds of {DENSE_CAPTURES} captures, {label} \
             round, ns per frame without the stack's cost: selftrace {reuse:.2} ({:.2}x \
             libunwind), every frame stepped {step:.2} ({:.2}x), libunwind {lu:.2}",
            reuse / lu,
            step / lu,
        );
    }
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
    let (pc, _) = unsafe { target::interrupted_pc_sp(uc) };
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
    // The workspace's root (this package is benches/).
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ is in the workspace's root");
    let target = root.join("target").join("fp-build");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(&cargo)
        .args(["build", "--quiet", "--release", "-p", "selftrace-examples"])
        .args(["--example", "fp_bench"])
        .env("RUSTFLAGS", "-C force-frame-pointers=yes")
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("fp_bench: building the example with frame pointers failed");
        return;
    }
    match std::process::Command::new(target.join("release/examples/fp_bench")).output() {
        Ok(out) => {
            eprint!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        Err(e) => eprintln!("fp_bench: {e}"),
    }
}

/// The 29-frame capture while a second thread captures the same stack shape without pause
/// (a profiler sampling several threads, logging backtraces on a thread pool): what the two
/// unwinders' shared state costs when two cores use it at once.
fn bench_beside_a_capturing_thread(c: &mut Criterion, unw: Option<UnwBacktrace>) {
    fn beside(
        b: &mut criterion::Bencher<'_>,
        capture: fn(Option<UnwBacktrace>),
        unw: Option<UnwBacktrace>,
    ) {
        b.iter_custom(|iters| {
            let stop = AtomicBool::new(false);
            let started = AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    c00(&mut || {
                        started.store(true, Ordering::Release);
                        while !stop.load(Ordering::Relaxed) {
                            capture(unw);
                        }
                    })
                });
                while !started.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                let mut took = Duration::ZERO;
                c00(&mut || {
                    let t = Instant::now();
                    for _ in 0..iters {
                        capture(unw);
                    }
                    took = t.elapsed();
                });
                stop.store(true, Ordering::Relaxed);
                took
            })
        });
    }
    fn selftrace_capture(_: Option<UnwBacktrace>) {
        let mut buf = [0usize; 256];
        black_box(selftrace::capture(black_box(&mut buf)));
    }
    fn libunwind_capture(unw: Option<UnwBacktrace>) {
        let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
        if let Some(f) = unw {
            // SAFETY: ptrs is valid for 256 entries.
            black_box(unsafe { f(ptrs.as_mut_ptr(), 256) });
        }
    }
    let mut g = c.benchmark_group("capture_20_deep_beside_a_capturing_thread");
    g.bench_function("selftrace_capture_dwarf", |b| {
        beside(b, selftrace_capture, unw)
    });
    g.bench_function("selftrace_capture_dwarf_no_reuse", |b| {
        selftrace::unwind::set_walk_reuse(false);
        beside(b, selftrace_capture, unw);
        selftrace::unwind::set_walk_reuse(true);
    });
    if unw.is_some() {
        g.bench_function("libunwind_unw_backtrace", |b| {
            beside(b, libunwind_capture, unw)
        });
    }
    g.finish();
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
    if let Some(f) = unw {
        deep_interleaved(f);
    }
    bench_shallow(c, unw);
    bench_beside_a_capturing_thread(c, unw);
    bench_sites(c, unw);
    bench_dense(c, unw);
    bench_qsort(c, unw);
    bench_handler_libcrypto(c);
    fp_mode();
}

/// The 30-frame capture again, interleaved: rounds of [`DEEP_CAPTURES`] captures by selftrace
/// (walk reuse on), by selftrace stepping every frame (reuse off: a stack walked for the
/// first time) and by libunwind take turns in a rotating order, so that a VM's slow and fast
/// spells fall on all three alike. Prints the fastest and the median round of each, per
/// capture, and selftrace's time over libunwind's (the same frames, the same place).
fn deep_interleaved(unw: UnwBacktrace) {
    const ROUNDS: usize = 300;
    const DEEP_CAPTURES: usize = 1000;
    let mut buf = [0usize; 256];
    let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
    let mut ns: [Vec<f64>; 3] = Default::default();
    c00(&mut || {
        for round in 0..ROUNDS {
            for turn in 0..3 {
                let which = (turn + round) % 3;
                selftrace::unwind::set_walk_reuse(which != 1);
                let t = Instant::now();
                for _ in 0..DEEP_CAPTURES {
                    if which == 2 {
                        // SAFETY: ptrs is valid for 256 entries.
                        black_box(unsafe { unw(ptrs.as_mut_ptr(), 256) });
                    } else {
                        black_box(selftrace::capture(&mut buf));
                    }
                }
                ns[which].push(t.elapsed().as_nanos() as f64 / DEEP_CAPTURES as f64);
            }
        }
    });
    selftrace::unwind::set_walk_reuse(true);
    for v in &mut ns {
        v.sort_by(f64::total_cmp);
    }
    let (min, median) = (|v: &Vec<f64>| v[0], |v: &Vec<f64>| v[v.len() / 2]);
    let [reuse, stepped, them] = &ns;
    eprintln!(
        "capture_20_deep interleaved, {ROUNDS} rounds of {DEEP_CAPTURES} captures, ns per capture \
         (fastest round / median round): selftrace {:.1} / {:.1} ({:.2} / {:.2}x libunwind), \
         every frame stepped {:.1} / {:.1} ({:.2} / {:.2}x), libunwind {:.1} / {:.1}",
        min(reuse),
        median(reuse),
        min(reuse) / min(them),
        median(reuse) / median(them),
        min(stepped),
        median(stepped),
        min(stepped) / min(them),
        median(stepped) / median(them),
        min(them),
        median(them),
    );
}

/// `capture_shallow`: the capture right in the bench closure (the harness's frames only, 13-14):
/// what a walk costs beyond its frames (the entry, the published tables, the walk's setup
/// and its end), selftrace beside libunwind.
fn bench_shallow(c: &mut Criterion, unw: Option<UnwBacktrace>) {
    static PRINTED: AtomicBool = AtomicBool::new(false);
    let mut g = c.benchmark_group("capture_shallow");
    let mut buf = [0usize; 256];
    for (name, reuse) in [
        ("selftrace_capture_dwarf", true),
        ("selftrace_capture_dwarf_no_reuse", false),
    ] {
        g.bench_function(name, |b| {
            if !PRINTED.swap(true, Ordering::Relaxed) {
                // Criterion's frames differ by one or two between its calls of this closure.
                let n = selftrace::capture(&mut buf);
                eprintln!("capture_shallow: {n} frames (selftrace, the first call)");
            }
            selftrace::unwind::set_walk_reuse(reuse);
            b.iter(|| black_box(selftrace::capture(&mut buf)));
            selftrace::unwind::set_walk_reuse(true);
        });
    }
    if let Some(f) = unw {
        g.bench_function("libunwind_unw_backtrace", |b| {
            let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
            // SAFETY: ptrs is valid for 256 entries.
            b.iter(|| black_box(unsafe { f(ptrs.as_mut_ptr(), 256) }));
        });
    }
    g.finish();
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
