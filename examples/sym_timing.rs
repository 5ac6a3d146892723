use std::hint::black_box;
use std::time::Instant;
#[inline(never)]
fn deep<R>(depth: usize, f: &mut dyn FnMut() -> R) -> R {
    if depth == 0 {
        f()
    } else {
        let r = deep(depth - 1, f);
        black_box(depth);
        r
    }
}
fn main() {
    let only = std::env::args().nth(1).unwrap_or_default();
    selftrace::symbolize::prepare().unwrap();
    let mut buf = [0usize; 128];
    let n = deep(12, &mut || selftrace::capture(&mut buf));
    let addrs: Vec<usize> = buf[..n].iter().map(|a| a - 1).collect();
    if only.is_empty() {
        let t = Instant::now();
        let iters = 200_000;
        for _ in 0..iters {
            for &a in &addrs {
                black_box(selftrace::symbolize(black_box(a)));
            }
        }
        println!(
            "symbolize: {:.1} ns/frame ({} frames)",
            t.elapsed().as_nanos() as f64 / (iters * n) as f64,
            n
        );
        let t = Instant::now();
        for _ in 0..20000 {
            black_box(deep(12, &mut || {
                let mut b = [0usize; 128];
                selftrace::capture(&mut b)
            }));
        }
        println!(
            "capture: {:.1} us",
            t.elapsed().as_nanos() as f64 / 20000.0 / 1000.0
        );
    }
    if only.is_empty() || only == "resolve" {
        let t = Instant::now();
        for _ in 0..20000 {
            black_box(selftrace::Backtrace::from_addresses(&buf[..n], false));
        }
        println!(
            "from_addresses: {:.1} us",
            t.elapsed().as_nanos() as f64 / 20000.0 / 1000.0
        );
    }
    if only.is_empty() {
        for _ in 0..3 {
            black_box(deep(12, &mut || selftrace::Backtrace::capture()));
        }
        let t = Instant::now();
        for _ in 0..2000 {
            black_box(deep(12, &mut || selftrace::Backtrace::capture()));
        }
        println!(
            "Backtrace: {:.1} us",
            t.elapsed().as_nanos() as f64 / 2000.0 / 1000.0
        );
        for _ in 0..3 {
            black_box(deep(12, &mut || backtrace::Backtrace::new()));
        }
        let t = Instant::now();
        for _ in 0..2000 {
            black_box(deep(12, &mut || backtrace::Backtrace::new()));
        }
        println!(
            "backtrace crate: {:.1} us",
            t.elapsed().as_nanos() as f64 / 2000.0 / 1000.0
        );
    }
}
