//! Go's `net/http/pprof` routes, for any HTTP server: [`handle`] answers a request given its
//! method and target, and [`serve`] is a ready `std::net` server (feature `http`).
//!
//! * `GET /debug/pprof/profile?seconds=N[&hz=H][&mode=cpu|wall]`: a profile of the next N
//!   seconds (default 30, 1 to 300; 99 Hz unless `hz`, CPU time unless `mode=wall`), as the
//!   gzipped `profile.proto` that `go tool pprof` fetches.
//! * `GET /debug/pprof/flamegraph?...`: the same as an SVG flame graph (with the
//!   `flamegraph` feature; `501` without it).
//! * `GET /debug/pprof/`: a short index.
//!
//! One profile at a time (the profiler is per process): a request while one is being taken
//! gets `409 Conflict`; a bad query `400` with what is wrong.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! // With any server: route /debug/pprof/* to `handle` (it blocks for the profile's seconds).
//! let r = selftrace::profile::http::handle("GET", "/debug/pprof/profile?seconds=5");
//! assert_eq!(r.status, 200);
//! # Ok(()) }
//! ```

use super::{Mode, Profile, Stats};
use std::time::Duration;

/// An answer to a request.
#[derive(Debug)]
#[non_exhaustive]
pub struct Response {
    /// The HTTP status: 200, or 400, 404, 405, 409, 500, 501.
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

/// Answers one request: `method` (`GET`) and `target` (the path and query of the request line,
/// `/debug/pprof/profile?seconds=5`). Takes the profile the request asks for, so it blocks for
/// that many seconds. Normal context.
pub fn handle(method: &str, target: &str) -> Response {
    if method != "GET" {
        return Response::text(405, "only GET\n");
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let svg =
        match path {
            "/debug/pprof/profile" => false,
            "/debug/pprof/flamegraph" => true,
            "/debug/pprof" | "/debug/pprof/" => return Response::text(
                200,
                "/debug/pprof/profile?seconds=N[&hz=H][&mode=cpu|wall]: gzipped profile.proto\n\
                 /debug/pprof/flamegraph?seconds=N[&hz=H][&mode=cpu|wall]: SVG flame graph\n",
            ),
            _ => return Response::text(404, "not found\n"),
        };
    if svg && !cfg!(feature = "flamegraph") {
        return Response::text(501, "built without the flamegraph feature\n");
    }
    let q = match parse_query(query) {
        Ok(q) => q,
        Err(e) => return Response::text(400, &format!("{e}\n")),
    };
    let profiler = match super::builder().frequency(q.hz).mode(q.mode).start() {
        Ok(p) => p,
        Err(crate::error::Error::AlreadyExists(_)) => {
            return Response::text(409, "a profile is being taken\n")
        }
        Err(e) => return Response::text(500, &format!("{e}\n")),
    };
    std::thread::sleep(Duration::from_secs(q.seconds));
    let stats = profiler.stats();
    let profile = profiler.stop();
    let (content_type, body) = if svg {
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
    let r = handle(method, target);
    log(&r);
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
