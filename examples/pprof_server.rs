//! A service that serves its own profiles the way Go services do (`net/http/pprof`), so that
//! `go tool pprof` and fleet tools that speak pprof can pull them. std only: no HTTP crate.
//!
//! ```sh
//! cargo run --release --features http,flamegraph --example pprof_server -- 127.0.0.1:6060
//! go tool pprof -top 'http://127.0.0.1:6060/debug/pprof/profile?seconds=5'
//! curl -o flame.svg 'http://127.0.0.1:6060/debug/pprof/flamegraph?seconds=5'
//! ```
//!
//! The routes are the library's (`selftrace::profile::http`):
//! * `GET /debug/pprof/profile?seconds=N[&hz=H][&mode=wall]`: a CPU (or wall-clock) profile of
//!   the next N seconds (default 30, at most 300), gzipped `profile.proto`.
//! * `GET /debug/pprof/flamegraph?seconds=N[&hz=H][&mode=wall]`: the same as an SVG flame graph.
//! * `GET /debug/pprof/`: a short index.
//!
//! One profile at a time (the profiler is per process): a second request meanwhile gets
//! `409 Conflict`. The server prints `listening on ADDR` once it accepts connections (port 0
//! picks a free port), and a line for each profile it took. The program also runs a small
//! CPU-bound workload (`serve_requests` → `parse_request`, `render_page`) so that profiles have
//! something to show.

use std::hint::black_box;
use std::io::Write;
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:6060".into());
    selftrace::init().expect("selftrace::init");
    let listener = match TcpListener::bind(&addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pprof_server: cannot listen on {addr}: {e}");
            std::process::exit(2);
        }
    };
    for i in 0..2 {
        std::thread::Builder::new()
            .name(format!("worker-{i}"))
            .spawn(serve_requests)
            .expect("spawn a worker");
    }
    println!(
        "listening on {}",
        listener.local_addr().expect("local address")
    );
    let _ = std::io::stdout().flush();
    // The library's server; a line per profile taken.
    let served = selftrace::profile::http::serve(listener, |r| {
        if let (Some(p), Some(stats)) = (&r.profile, &r.stats) {
            println!(
                "profiled {} s: {} samples ({} signals), {} dropped",
                p.duration.as_secs_f64().round(),
                p.total(),
                stats.samples,
                p.dropped
            );
            let _ = std::io::stdout().flush();
        } else if r.status == 499 {
            println!("client went away: profile stopped");
            let _ = std::io::stdout().flush();
        }
    });
    if let Err(e) = served {
        eprintln!("pprof_server: {e}");
        std::process::exit(1);
    }
}

/// The workload: two functions with a 1:3 split of the CPU time, in bursts of 100 ms of
/// requests (calls of 0.05 to 0.3 ms, in random order), each followed by 50 ms idle. Not a short sleep after
/// each request: CPU-time timers fire at the kernel's ticks, and on a loaded machine a thread
/// that wakes is often run only at the next tick, so work that sleeps between requests starts
/// in step with the ticks, and the ticks land in the same part of it each time (render_page
/// showed 5 to 6 times parse_request, not 3).
fn serve_requests() {
    let mut x = 0u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    loop {
        let burst = Instant::now();
        while burst.elapsed() < Duration::from_millis(100) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            x ^= if rng.is_multiple_of(2) {
                parse_request(x)
            } else {
                render_page(x)
            };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[inline(never)]
fn parse_request(seed: u64) -> u64 {
    spin(seed, jittered(seed, 50_000))
}

#[inline(never)]
fn render_page(seed: u64) -> u64 {
    spin(seed, jittered(seed >> 20, 150_000))
}

/// `n` scaled by a factor between 0.5 and 1.5 taken from `seed` (the same on average): a loop
/// of fixed-length calls can run in step with the kernel tick, at which CPU-time timers fire,
/// and then the samples land in one function more often than its share of the time.
fn jittered(seed: u64, n: u64) -> u64 {
    n / 2 + seed % (n + 1)
}

fn spin(mut x: u64, n: u64) -> u64 {
    for i in 0..n {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}
