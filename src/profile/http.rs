//! Go's `net/http/pprof` routes, for any HTTP server: [`handle`] answers a request given its
//! method and target, and [`serve`] is a ready `std::net` server (feature `http`).
//!
//! * `GET /debug/pprof/profile?seconds=N[&hz=H][&mode=cpu|wall]`: a profile of the next N
//!   seconds (default 30, 1 to 300; 99 Hz unless `hz`, CPU time unless `mode=wall`), as the
//!   gzipped `profile.proto` that `go tool pprof` fetches.
//! * `GET /debug/pprof/flamegraph?...`: the same as an SVG flame graph (with the
//!   `flamegraph` feature; `501` without it).
//! * `GET /debug/pprof/threads`: every thread's stack, as text ([`crate::threads::dump_all_to`]).
//! * `GET /debug/pprof/tasks`: every traced async task and where it waits, as text
//!   ([`crate::tasks::dump_to`]; Go's `/debug/pprof/goroutine?debug=2`).
//! * `GET /debug/pprof/`: a short index.
//!
//! One profile at a time (the profiler is per process): a request while one is being taken
//! gets `409 Conflict`; a bad query `400` with what is wrong. A profile stops as soon as its
//! client goes away: [`serve`] watches the connection, and the future of [`handle_async`]
//! stops the profiler when it is dropped (an async server drops a handler whose client
//! disconnected), so the next request does not find the profiler taken.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! // With any server: route /debug/pprof/* to `handle` (it blocks for the profile's seconds).
//! let r = selftrace::profile::http::handle("GET", "/debug/pprof/profile?seconds=5");
//! assert_eq!(r.status, 200);
//! // In an async handler (axum, hyper, ...): it blocks no thread.
//! # async fn f() {
//! let r = selftrace::profile::http::handle_async("GET", "/debug/pprof/profile?seconds=5").await;
//! # }
//! # Ok(()) }
//! ```

use super::{Mode, Profile, Profiler, Stats};
use core::future::Future;
use core::pin::Pin;
use core::sync::atomic::{AtomicBool, Ordering};
use core::task::{Context, Poll, Waker};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An answer to a request.
#[derive(Debug)]
#[non_exhaustive]
pub struct Response {
    /// The HTTP status: 200, or 400, 404, 405, 409, 500, 501; 499 (nginx's "client closed
    /// request") when [`serve`]'s client went away before the profile was done.
    pub status: u16,
    /// The `Content-Type` of `body`.
    pub content_type: &'static str,
    /// The body: a gzipped `profile.proto`, an SVG, or a line of text saying what went wrong.
    pub body: Vec<u8>,
    /// The profile taken, for a request that took one (to keep or log).
    pub profile: Option<Profile>,
    /// The profiler's counters at the end of that profile.
    pub stats: Option<Stats>,
}

impl Response {
    fn text(status: u16, text: &str) -> Response {
        Response {
            status,
            content_type: "text/plain",
            body: text.as_bytes().to_vec(),
            profile: None,
            stats: None,
        }
    }

    /// The reason phrase of [`Response::status`] (`OK`, `Conflict`, ...).
    pub fn reason(&self) -> &'static str {
        match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            409 => "Conflict",
            499 => "Client Closed Request",
            501 => "Not Implemented",
            _ => "Internal Server Error",
        }
    }
}

/// What a request asks for.
struct Query {
    seconds: u64,
    hz: u32,
    mode: Mode,
}

fn parse_query(query: &str) -> Result<Query, &'static str> {
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
                    .filter(|h| (1..=super::MAX_FREQUENCY_HZ).contains(h))
                    .ok_or("hz must be 1 to 10000")?
            }
            "mode" => {
                q.mode = match v {
                    "cpu" => Mode::Cpu,
                    "wall" => Mode::Wall,
                    _ => return Err("mode must be cpu or wall"),
                }
            }
            _ => {}
        }
    }
    Ok(q)
}

/// A profile request that passed the checks: what to take and how to answer.
struct Taking {
    profiler: Profiler,
    seconds: u64,
    svg: bool,
}

/// Checks the request and starts its profiler, or answers it at once (an index, an error, a
/// profile being taken).
fn begin(method: &str, target: &str) -> Result<Taking, Box<Response>> {
    if method != "GET" {
        return Err(Box::new(Response::text(405, "only GET\n")));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let svg =
        match path {
            "/debug/pprof/profile" => false,
            "/debug/pprof/flamegraph" => true,
            "/debug/pprof" | "/debug/pprof/" => return Err(Box::new(Response::text(
                200,
                "/debug/pprof/profile?seconds=N[&hz=H][&mode=cpu|wall]: gzipped profile.proto\n\
                 /debug/pprof/flamegraph?seconds=N[&hz=H][&mode=cpu|wall]: SVG flame graph\n\
                 /debug/pprof/threads: every thread's stack\n\
                 /debug/pprof/tasks: every traced async task and where it waits\n",
            ))),
            "/debug/pprof/threads" => {
                return Err(Box::new(text_of(|w| {
                    crate::threads::dump_all_to(w).map(drop)
                })))
            }
            "/debug/pprof/tasks" => {
                return Err(Box::new(text_of(|w| crate::tasks::dump_to(w).map(drop))))
            }
            _ => return Err(Box::new(Response::text(404, "not found\n"))),
        };
    if svg && !cfg!(feature = "flamegraph") {
        return Err(Box::new(Response::text(
            501,
            "built without the flamegraph feature\n",
        )));
    }
    let q = parse_query(query).map_err(|e| Box::new(Response::text(400, &format!("{e}\n"))))?;
    let profiler = match super::builder().frequency(q.hz).mode(q.mode).start() {
        Ok(p) => p,
        Err(crate::error::Error::AlreadyExists(_)) => {
            return Err(Box::new(Response::text(409, "a profile is being taken\n")))
        }
        Err(e) => return Err(Box::new(Response::text(500, &format!("{e}\n")))),
    };
    Ok(Taking {
        profiler,
        seconds: q.seconds,
        svg,
    })
}

/// A text answer written by `write`, or a 500 saying what failed.
fn text_of(write: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Response {
    let mut body = Vec::new();
    match write(&mut body) {
        Ok(()) => Response {
            status: 200,
            content_type: "text/plain; charset=utf-8",
            body,
            profile: None,
            stats: None,
        },
        Err(e) => Response::text(500, &format!("{e}\n")),
    }
}

/// Stops the profiler and encodes the answer.
fn finish(t: Taking) -> Response {
    let stats = t.profiler.stats();
    let profile = t.profiler.stop();
    let (content_type, body) = if t.svg {
        ("image/svg+xml", flame(&profile))
    } else {
        ("application/octet-stream", profile.to_pprof())
    };
    Response {
        status: 200,
        content_type,
        body,
        profile: Some(profile),
        stats: Some(stats),
    }
}

/// Answers one request: `method` (`GET`) and `target` (the path and query of the request line,
/// `/debug/pprof/profile?seconds=5`). Takes the profile the request asks for, so it blocks for
/// that many seconds. Normal context.
pub fn handle(method: &str, target: &str) -> Response {
    match begin(method, target) {
        Ok(t) => {
            std::thread::sleep(Duration::from_secs(t.seconds));
            finish(t)
        }
        Err(r) => *r,
    }
}

/// [`handle`] for async servers: the profile is taken while the future waits (on a timer
/// thread of its own, whatever the runtime), and stops when the future is dropped, so a client
/// that goes away (its handler dropped) ends it and frees the profiler for the next request.
/// The future is `Send` and `'static`.
pub fn handle_async(method: &str, target: &str) -> impl Future<Output = Response> + Send + 'static {
    let begun = begin(method, target);
    async move {
        match begun {
            Ok(t) => {
                Delay::new(Duration::from_secs(t.seconds)).await;
                finish(t)
            }
            Err(r) => *r,
        }
    }
}

/// A timer future that needs no runtime: a thread waits out the time and wakes the task;
/// dropping the future ends the thread at once.
struct Delay {
    deadline: Instant,
    shared: Arc<DelayShared>,
    thread: Option<std::thread::Thread>,
}

struct DelayShared {
    waker: Mutex<Option<Waker>>,
    done: AtomicBool,
    dropped: AtomicBool,
}

impl Delay {
    fn new(d: Duration) -> Delay {
        Delay {
            deadline: Instant::now() + d,
            shared: Arc::new(DelayShared {
                waker: Mutex::new(None),
                done: AtomicBool::new(false),
                dropped: AtomicBool::new(false),
            }),
            thread: None,
        }
    }
}

impl Future for Delay {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.shared.done.load(Ordering::Acquire) || Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        *self.shared.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        if self.thread.is_none() {
            let shared = self.shared.clone();
            let deadline = self.deadline;
            let spawned = std::thread::Builder::new()
                .name("pprof-timer".into())
                .spawn(move || loop {
                    if shared.dropped.load(Ordering::Acquire) {
                        return;
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        shared.done.store(true, Ordering::Release);
                        let w = shared
                            .waker
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .take();
                        if let Some(w) = w {
                            w.wake();
                        }
                        return;
                    }
                    std::thread::park_timeout(deadline - now);
                });
            match spawned {
                Ok(h) => self.thread = Some(h.thread().clone()),
                // No thread: wait here instead (blocks this poll, never loses the answer).
                Err(_) => {
                    std::thread::sleep(self.deadline.saturating_duration_since(Instant::now()));
                    return Poll::Ready(());
                }
            }
        }
        // Done between the first check and the waker's store: not woken again.
        if self.shared.done.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Delay {
    fn drop(&mut self) {
        self.shared.dropped.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.unpark();
        }
    }
}

#[cfg(feature = "flamegraph")]
fn flame(p: &Profile) -> Vec<u8> {
    p.flamegraph_svg()
}

#[cfg(not(feature = "flamegraph"))]
fn flame(_: &Profile) -> Vec<u8> {
    Vec::new()
}

/// Serves the routes on `listener` until accepting fails, a thread per connection (HTTP/1.1,
/// one request per connection). `log` sees every answer before it is sent (the profile, its
/// counters), for example to print a line per profile. Normal context; blocks.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// let listener = std::net::TcpListener::bind("127.0.0.1:6060")?;
/// std::thread::spawn(move || selftrace::profile::http::serve(listener, |_| {}));
/// # Ok(()) }
/// ```
///
/// # Errors
/// The error of `accept` that ended the loop.
#[cfg(feature = "http")]
pub fn serve(
    listener: std::net::TcpListener,
    log: impl Fn(&Response) + Send + Sync + 'static,
) -> std::io::Result<()> {
    let log = std::sync::Arc::new(log);
    loop {
        let (conn, _) = listener.accept()?;
        let log = log.clone();
        let _ = std::thread::Builder::new()
            .name("pprof-http".into())
            .spawn(move || {
                let _ = answer(conn, &*log);
            });
    }
}

/// Waits `d` while the client stays connected: `false` as soon as it closes the connection
/// (or it fails), `true` after `d`.
#[cfg(feature = "http")]
fn wait_for(conn: &std::net::TcpStream, d: Duration) -> bool {
    let deadline = Instant::now() + d;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        // Wakes when the client sends or closes, or after `left` (at least 1 ms: 0 is refused).
        if conn
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .is_err()
        {
            std::thread::sleep(left);
            return true;
        }
        match conn.peek(&mut [0u8; 1]) {
            Ok(0) => return false,
            // The client sent more (a pipelined request): keep waiting, checking now and then.
            Ok(_) => std::thread::sleep(left.min(Duration::from_millis(100))),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return false,
        }
    }
}

#[cfg(feature = "http")]
fn answer(mut conn: std::net::TcpStream, log: &dyn Fn(&Response)) -> std::io::Result<()> {
    use std::io::{BufRead, Write};
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = std::io::BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The headers are not needed.
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let r = match begin(method, target) {
        Ok(t) => {
            if wait_for(&conn, Duration::from_secs(t.seconds)) {
                finish(t)
            } else {
                // Stopped now: the profiler is free for the next request.
                drop(t);
                Response::text(499, "the client went away before the profile was done\n")
            }
        }
        Err(r) => *r,
    };
    log(&r);
    if r.status == 499 {
        return Ok(());
    }
    write!(
        conn,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        r.reason(),
        r.content_type,
        r.body.len()
    )?;
    conn.write_all(&r.body)?;
    conn.flush()
}
