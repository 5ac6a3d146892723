//! Benches measured in the calling thread's CPU time (user + system) instead of wall time:
//! the other processes of a busy machine stay out of the numbers; the system calls under test
//! are still counted (their kernel time is this thread's system time).

use criterion::Bencher;
use std::hint::black_box;
use std::time::Duration;

/// This thread's CPU time.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `f` `iters` times and reports the thread CPU time it took.
pub fn cpu<R>(b: &mut Bencher<'_>, mut f: impl FnMut() -> R) {
    b.iter_custom(|iters| {
        let t0 = thread_cpu_time();
        for _ in 0..iters {
            black_box(f());
        }
        thread_cpu_time() - t0
    })
}
