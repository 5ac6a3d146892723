//! A service that serves its own profiles the way Go services do (`net/http/pprof`), so that
//! `go tool pprof` and fleet tools that speak pprof can pull them. std only: no HTTP crate.
//!
//! ```sh
//! cargo run --release --features pprof,flamegraph --example pprof_server -- 127.0.0.1:6060
//! go tool pprof -top 'http://127.0.0.1:6060/debug/pprof/profile?seconds=5'
//! curl -o flame.svg 'http://127.0.0.1:6060/debug/pprof/flamegraph?seconds=5'
//! ```
//!
//! Routes:
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

use selftrace::profile::{self, Mode};
use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
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
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let _ = std::thread::Builder::new()
            .name("pprof-http".into())
            .spawn(move || {
                if let Err(e) = handle(conn) {
                    eprintln!("pprof_server: {e}");
                }
            });
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

/// What a request asks for.
struct Query {
    seconds: u64,
    hz: u32,
    mode: Mode,
}

fn parse_query(query: &str) -> Result<Query, String> {
    let mut q = Query {
        seconds: 30,
        hz: 99,
        mode: Mode::Cpu,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "seconds" => {
                q.seconds = v
                    .parse()
                    .ok()
                    .filter(|s| (1..=300).contains(s))
                    .ok_or("seconds must be 1 to 300")?
            }
            "hz" => {
                q.hz = v
                    .parse()
                    .ok()
                    .filter(|h| (1..=profile::MAX_FREQUENCY_HZ).contains(h))
                    .ok_or("hz must be 1 to 10000")?
            }
            "mode" => {
                q.mode = match v {
                    "cpu" => Mode::Cpu,
                    "wall" => Mode::Wall,
                    _ => return Err("mode must be cpu or wall".into()),
                }
            }
            _ => {}
        }
    }
    Ok(q)
}

fn handle(mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Skip the headers.
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut conn, 405, "text/plain", b"only GET\n");
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let svg =
        match path {
            "/debug/pprof/profile" => false,
            "/debug/pprof/flamegraph" => true,
            "/debug/pprof" | "/debug/pprof/" => return respond(
                &mut conn,
                200,
                "text/plain",
                b"/debug/pprof/profile?seconds=N[&hz=H][&mode=cpu|wall]: gzipped profile.proto\n\
                  /debug/pprof/flamegraph?seconds=N[&hz=H][&mode=cpu|wall]: SVG flame graph\n",
            ),
            _ => return respond(&mut conn, 404, "text/plain", b"not found\n"),
        };
    let q = match parse_query(query) {
        Ok(q) => q,
        Err(e) => return respond(&mut conn, 400, "text/plain", format!("{e}\n").as_bytes()),
    };
    let profiler = match profile::builder().frequency(q.hz).mode(q.mode).start() {
        Ok(p) => p,
        Err(selftrace::Error::AlreadyExists(_)) => {
            return respond(&mut conn, 409, "text/plain", b"a profile is being taken\n")
        }
        Err(e) => {
            return respond(&mut conn, 500, "text/plain", format!("{e}\n").as_bytes());
        }
    };
    std::thread::sleep(Duration::from_secs(q.seconds));
    let stats = profiler.stats();
    let p = profiler.stop();
    println!(
        "profiled {} s: {} samples ({} signals), {} dropped",
        q.seconds,
        p.total(),
        stats.samples,
        p.dropped
    );
    let _ = std::io::stdout().flush();
    if svg {
        let mut body = Vec::new();
        p.write_flamegraph(&mut body)?;
        respond(&mut conn, 200, "image/svg+xml", &body)
    } else {
        respond(&mut conn, 200, "application/octet-stream", &p.to_pprof())
    }
}

fn respond(conn: &mut TcpStream, status: u16, kind: &str, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        _ => "Internal Server Error",
    };
    write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )?;
    conn.write_all(body)?;
    conn.flush()
}
