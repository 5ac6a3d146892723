//! Frame-pointer walking measured where it means something: benches/unwind.rs builds this
//! example with `-C force-frame-pointers=yes` (release) and runs it. At the bottom of a
//! 64-deep recursion it times the frame-pointer `selftrace::Capture` and a naive, unchecked frame-pointer loop
//! over the same chain (the same number of frames), fastest of 250 rounds each, the rounds of
//! the two alternating, and prints ns per frame and the ratio:
//!
//! `fp_bench: frames N capture_fp X ns/frame naive Y ns/frame ratio R`

use std::arch::asm;
use std::hint::black_box;
use std::time::{Duration, Instant};

const DEPTH: usize = 64;
const ITERS: u32 = 4_000;
const ROUNDS: usize = 250;

/// The naive walk: no bounds, no checks (only safe on a chain known to be intact, and only
/// for `max` frames, the count `capture_fp` found).
#[inline(never)]
fn naive_fp(buf: &mut [usize], max: usize) -> usize {
    let mut fp: usize;
    // SAFETY: reads rbp; with force-frame-pointers it holds this function's frame address.
    unsafe { asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags)) };
    let mut n = 0;
    while n < max {
        // SAFETY: for `max` frames the chain was validated by capture_fp on the same stack:
        // fp points to a saved (rbp, return address) pair.
        unsafe {
            let ra = *((fp + 8) as *const usize);
            buf[n] = ra;
            fp = *(fp as *const usize);
        }
        n += 1;
    }
    n
}

/// The fastest of [`ROUNDS`] rounds of `a` and of `b`, the rounds of the two alternating, so
/// that the machine's slow and fast spells (other tenants of a VM) fall on both alike.
fn fastest_interleaved(
    mut a: impl FnMut() -> Duration,
    mut b: impl FnMut() -> Duration,
) -> (Duration, Duration) {
    let (mut fa, mut fb) = (Duration::MAX, Duration::MAX);
    for _ in 0..ROUNDS {
        fa = fa.min(a());
        fb = fb.min(b());
    }
    (fa, fb)
}

#[inline(never)]
fn measure() -> (usize, f64, f64) {
    let mut buf = [0usize; 256];
    let mut other = [0usize; 256];
    let n = selftrace::Capture::new()
        .mode(selftrace::UnwindMode::FramePointer)
        .walk(&mut buf)
        .frames;
    assert!(
        n >= DEPTH,
        "capture_fp found {n} frames; frame pointers missing?"
    );
    // Both walks cover the same frames: each starts with a return address into this function
    // (two different call sites), then the same chain.
    let m = naive_fp(&mut other, n);
    assert_eq!(
        &buf[1..n],
        &other[1..m],
        "the naive loop walks the same chain"
    );
    let (fp, naive) = fastest_interleaved(
        || {
            let t = Instant::now();
            for _ in 0..ITERS {
                black_box(
                    selftrace::Capture::new()
                        .mode(selftrace::UnwindMode::FramePointer)
                        .walk(black_box(&mut buf))
                        .frames,
                );
            }
            t.elapsed()
        },
        || {
            let t = Instant::now();
            for _ in 0..ITERS {
                black_box(naive_fp(black_box(&mut other), n));
            }
            t.elapsed()
        },
    );
    let per = |d: Duration| d.as_nanos() as f64 / (ITERS as f64 * n as f64);
    (n, per(fp), per(naive))
}

#[inline(never)]
fn recurse(d: usize, out: &mut Option<(usize, f64, f64)>) {
    if d == 0 {
        *out = Some(measure());
    } else {
        recurse(black_box(d - 1), out);
    }
    black_box(());
}

fn main() {
    selftrace::init().expect("init");
    let mut out = None;
    recurse(DEPTH, &mut out);
    let (n, fp, naive) = out.expect("measured");
    println!(
        "fp_bench: frames {n} capture_fp {fp:.2} ns/frame naive {naive:.2} ns/frame ratio {:.2}",
        fp / naive
    );
}
