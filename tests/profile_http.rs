//! `examples/pprof_server.rs` against real clients: `go tool pprof` fetches a CPU profile over
//! HTTP the way it does from Go services and lists the workload's hot functions; the flame
//! graph route returns SVG; a second profile meanwhile and a bad query get clear answers; a
//! client that goes away stops its profile (the std server and the async handler).
#![cfg(all(feature = "http", feature = "flamegraph"))]

mod example_build;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

/// Builds the example in a target directory of its own.
fn server_binary() -> PathBuf {
    example_build::build(
        example_build::FIXTURES,
        &[
            "--release",
            "--features",
            example_build::RELEASE_FEATURES,
            "--example",
            "pprof_server",
        ],
    )
    .join("release")
    .join("examples")
    .join("pprof_server")
}

struct Server {
    child: Child,
    addr: String,
    stdout: BufReader<ChildStdout>,
}

impl Server {
    /// The signals (samples taken) of the server's next `profiled ...` line: it prints one per
    /// profile, before it answers.
    fn signals_of_next_profile(&mut self) -> u64 {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the server ended"
            );
            if let Some(rest) = line.strip_prefix("profiled ") {
                let n = rest.split(" (").nth(1).and_then(|r| r.split(' ').next());
                return n
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("unexpected line {line:?}"));
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Server {
    let mut child = Command::new(server_binary())
        .arg("127.0.0.1:0")
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("start pprof_server");
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    Server {
        child,
        addr,
        stdout,
    }
}

/// A plain HTTP GET: (status, body).
fn get(addr: &str, target: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET {target} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let head_end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = String::from_utf8_lossy(&resp[..head_end]).to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, resp[head_end + 4..].to_vec())
}

/// `go tool pprof ARGS` with its caches in a temporary directory.
fn go_pprof(args: &[&str]) -> String {
    let tmp = std::env::temp_dir().join(format!("selftrace-gopprof-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .env("HOME", &tmp)
        .env("GOCACHE", tmp.join("cache"))
        .env("GOPATH", tmp.join("gopath"))
        .env("PPROF_TMPDIR", &tmp)
        .output()
        .expect("go tool pprof (Debian package golang-go; .ci/run installs it)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&tmp);
    text
}

/// The cumulative milliseconds `go tool pprof -top -unit=ms` gives the function whose name
/// ends with `name` (its flat time is in the functions inlined into it).
fn cum_ms(top: &str, name: &str) -> Option<f64> {
    top.lines().find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        if cols.len() >= 6 && cols[5..].join(" ").ends_with(name) {
            cols[3].strip_suffix("ms")?.parse().ok()
        } else {
            None
        }
    })
}

#[test]
fn go_tool_pprof_fetches_a_profile_over_http() {
    let mut server = start_server();
    let url = format!(
        "http://{}/debug/pprof/profile?seconds=5&hz=499",
        server.addr
    );
    let top = go_pprof(&["-top", "-nodecount=30", "-unit=ms", &url]);
    let signals = server.signals_of_next_profile();
    eprintln!("{top}\n{signals} signals");
    assert!(top.contains("Type: cpu"), "{top}");
    let parse = cum_ms(&top, "pprof_server::parse_request").expect("parse_request listed");
    let render = cum_ms(&top, "pprof_server::render_page").expect("render_page listed");
    // The workload splits its CPU time 1:3, so parse_request has a quarter of the two
    // functions' samples: catches the samples of one function given to the other, or a
    // function missing. How close a profile of 5 s comes depends on how many signals it holds:
    // CPU-time timers fire at the kernel's ticks (HZ=100 to 1000), and a loaded machine gives
    // the workers less CPU time (here about 720 signals, 340-390 on one CPU next to three busy
    // loops). So the bound is 4.5 standard errors of a share of that many signals, and at
    // least 0.07 (4.5 of them at 720).
    let share = parse / (parse + render);
    let sigma = (0.25 * 0.75 / signals.max(1) as f64).sqrt();
    let bound = (4.5 * sigma).max(0.07);
    assert!(
        (share - 0.25).abs() < bound,
        "parse_request has {share:.3} of the samples, want 0.25 +- {bound:.3} \
         ({signals} signals)\n{top}"
    );
}

#[test]
fn flame_graph_route_and_errors() {
    let server = start_server();
    let (status, body) = get(&server.addr, "/debug/pprof/flamegraph?seconds=1&hz=499");
    assert_eq!(status, 200);
    let svg = String::from_utf8(body).unwrap();
    // A real SVG document whose frames name the workload's hot functions.
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, opts).expect("the SVG parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for f in ["pprof_server::render_page", "pprof_server::parse_request"] {
        assert!(titles.iter().any(|t| t.starts_with(f)), "{f} in {titles:?}");
    }

    // The text routes: every thread's stack (the workload's threads by name) and the task
    // dump (this server traces none).
    let (status, body) = get(&server.addr, "/debug/pprof/threads");
    assert_eq!(status, 200);
    let threads = String::from_utf8(body).unwrap();
    assert!(
        threads.starts_with("------------[ selftrace: all threads ]")
            && threads.contains("thread \"pprof-http\" tid ")
            && threads.contains("---[ end of all threads ]---"),
        "{threads}"
    );
    let (status, body) = get(&server.addr, "/debug/pprof/tasks");
    assert_eq!(status, 200);
    let tasks = String::from_utf8(body).unwrap();
    assert!(tasks.contains("\n0 tasks: "), "{tasks}");

    let (status, body) = get(&server.addr, "/debug/pprof/profile?seconds=0");
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, _) = get(&server.addr, "/nothing/here");
    assert_eq!(status, 404);

    // One profile at a time: a second request while one runs is refused, not queued.
    let addr = server.addr.clone();
    let first = std::thread::spawn(move || get(&addr, "/debug/pprof/profile?seconds=2").0);
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = get(&server.addr, "/debug/pprof/profile?seconds=1");
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));
    assert_eq!(first.join().unwrap(), 200);
}

/// A client that hangs up during a 20 s profile stops it: the next request is served, not
/// refused with 409.
#[test]
fn a_client_that_goes_away_stops_its_profile() {
    let mut server = start_server();
    let mut s = TcpStream::connect(&server.addr).unwrap();
    write!(
        s,
        "GET /debug/pprof/profile?seconds=20 HTTP/1.1\r\nHost: {}\r\n\r\n",
        server.addr
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(s);
    // The server says it stopped, then serves the next profile.
    let mut line = String::new();
    while !line.starts_with("client went away") {
        line.clear();
        assert!(
            server.stdout.read_line(&mut line).unwrap() > 0,
            "the server ended"
        );
    }
    let (status, body) = get(&server.addr, "/debug/pprof/profile?seconds=1");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// The async handler: dropped (its client gone, as an async server drops the handler), its
/// profile stops and the next request gets a profile; a 409 while one is running.
#[test]
fn the_async_handler_stops_its_profile_when_dropped() {
    use selftrace::profile::http::handle_async;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let long = handle_async("GET", "/debug/pprof/profile?seconds=20");
        let dropped = tokio::time::timeout(Duration::from_millis(500), long).await;
        assert!(dropped.is_err(), "a 20 s profile answered in 0.5 s");
        // Spawned (the future is Send + 'static), with a second request while it runs.
        let next = tokio::spawn(handle_async("GET", "/debug/pprof/profile?seconds=1&hz=199"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let busy = handle_async("GET", "/debug/pprof/profile?seconds=1").await;
        assert_eq!(busy.status, 409);
        let r = next.await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        // A real profile.proto: gzip, decoded by the same reader the other tests use.
        assert_eq!(&r.body[..2], &[0x1f, 0x8b]);
        assert!(r.profile.is_some());
    });
}
