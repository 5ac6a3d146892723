//! The HTTP/1.1 client: `http://` URL parsing, [`post`] over a `std::net::TcpStream` with one
//! deadline, and the parsing of the answer into a [`Response`].

use super::{find, io_error, Form, UploadError};
use std::borrow::Cow;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The most bytes of response headers that [`post`] reads.
const MAX_HEAD: usize = 64 * 1024;
/// The most bytes of response body that [`post`] reads.
const MAX_BODY: usize = 16 << 20;

/// A server's answer to [`post`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    status: u16,
    body: Vec<u8>,
}

impl Response {
    /// The HTTP status code: `200`, `413`, ...
    #[must_use]
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Whether the status is 2xx: the server took the dump.
    #[must_use]
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body, decoded from `Transfer-Encoding: chunked` if it was (Sentry answers with the
    /// event id, other servers with a crash id or an error message).
    #[must_use]
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body as text (invalid UTF-8 replaced by U+FFFD).
    #[must_use]
    pub fn body_text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// The body, owned.
    #[must_use]
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// A parsed `http://` URL.
pub(super) struct Url<'a> {
    /// The host to resolve, without IPv6 brackets.
    host: &'a str,
    port: u16,
    /// `host[:port]` as written: the `Host` header.
    authority: &'a str,
    /// The path and query, `/` when empty.
    target: String,
}

pub(super) fn parse_url(url: &str) -> Result<Url<'_>, UploadError> {
    let bad = |reason| UploadError::InvalidUrl {
        url: url.to_owned(),
        reason,
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("expected http://host[:port]/path[?query]"))?;
    if scheme.eq_ignore_ascii_case("https") {
        return Err(UploadError::Https {
            url: url.to_owned(),
        });
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(bad("only http:// is supported"));
    }
    let rest = rest.split('#').next().unwrap_or_default();
    let (authority, target) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    if authority.contains('@') {
        return Err(bad("user names and passwords in the URL are not supported"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("no ']' after an IPv6 host"))?;
        if !host
            .bytes()
            .all(|c| c.is_ascii_hexdigit() || c == b':' || c == b'.')
        {
            return Err(bad("the IPv6 host is not an address"));
        }
        (host, after)
    } else {
        let at = authority.find(':').unwrap_or(authority.len());
        let host = &authority[..at];
        if !host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-._".contains(&c))
        {
            return Err(bad(
                "the host has a character other than letters, digits, '-', '.' and '_'",
            ));
        }
        (host, &authority[at..])
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let port = match port.strip_prefix(':') {
        None if port.is_empty() => 80,
        Some(digits) if !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()) => {
            match digits.parse() {
                Ok(port) if port != 0 => port,
                _ => return Err(bad("the port is not 1 to 65535")),
            }
        }
        _ => return Err(bad("the port is not a number")),
    };
    if !target.bytes().all(|c| c.is_ascii_graphic()) {
        return Err(bad(
            "the path or query has a space, a control or a non-ASCII character: percent-encode it",
        ));
    }
    let target = match target.strip_prefix('?') {
        Some(_) => format!("/{target}"),
        None if target.is_empty() => "/".to_owned(),
        None => target.to_owned(),
    };
    Ok(Url {
        host,
        port,
        authority,
        target,
    })
}

/// Posts `form` to `url` (`http://host[:port]/path[?query]`) and returns the server's answer,
/// whatever its status.
///
/// The request is HTTP/1.1 with `Host`, `User-Agent: selftrace/VERSION`, `Content-Type`
/// ([`Form::content_type`]), `Content-Length` and `Connection: close`. The answer's body may
/// be sized by `Content-Length`, chunked, or end with the connection; it is read up to 16 MiB.
/// `timeout` bounds connecting, sending and receiving together (not resolving the host name:
/// std's `getaddrinfo` has no timeout). A server that answers before it has read the whole
/// body (`413 Payload Too Large`) and closes is answered with its response, not a send error.
///
/// ```no_run
/// use selftrace::minidump::upload::{self, Form};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), upload::UploadError> {
/// let form = Form::new()
///     .field("prod", "myapp")?
///     .field("ver", "1.4.2")?
///     .minidump("/var/crash/myapp/a.dmp")?;
/// let answer = upload::post("http://crash.internal:8080/submit", &form, Duration::from_secs(30))?;
/// println!("{} {}", answer.status(), answer.body_text());
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`UploadError::Https`] for `https://` URLs, [`UploadError::InvalidUrl`] for other URLs it
/// does not take, [`UploadError::EmptyForm`], [`UploadError::Io`] when resolving, connecting,
/// sending or receiving fails or times out, [`UploadError::BadResponse`] when the answer is not
/// HTTP/1.x.
pub fn post(url: &str, form: &Form, timeout: Duration) -> Result<Response, UploadError> {
    post_to(&parse_url(url)?, form, timeout)
}

pub(super) fn post_to(
    url: &Url<'_>,
    form: &Form,
    timeout: Duration,
) -> Result<Response, UploadError> {
    if form.is_empty() {
        return Err(UploadError::EmptyForm);
    }
    let deadline = Instant::now() + timeout;
    let to = url.authority;
    let addrs = (url.host, url.port)
        .to_socket_addrs()
        .map_err(|e| io_error(format!("resolving {}", url.host), e))?;
    let mut failure = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
    let mut stream = None;
    for addr in addrs {
        match left(deadline).and_then(|t| TcpStream::connect_timeout(&addr, t)) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => failure = e,
        }
    }
    let stream = stream.ok_or_else(|| io_error(format!("connecting to {to}"), failure))?;
    // Headers and body go in two writes: without this, Nagle's algorithm would hold the
    // second until the first is acknowledged (a delayed ACK: up to 40 ms).
    let _ = stream.set_nodelay(true);
    let mut conn = Conn { stream, deadline };
    let body = form.to_body();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {to}\r\nUser-Agent: selftrace/{}\r\nContent-Type: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        url.target,
        env!("CARGO_PKG_VERSION"),
        form.content_type(),
        body.len()
    );
    let sent = conn
        .write_all(head.as_bytes())
        .and_then(|()| conn.write_all(&body));
    let answer = read_response(&mut Input {
        conn: &mut conn,
        buf: Vec::new(),
        pos: 0,
        from: to,
    });
    match (sent, answer) {
        (Err(e), Err(_)) => Err(io_error(format!("sending the request to {to}"), e)),
        (_, answer) => answer,
    }
}

/// The time left until `deadline`, or a timeout error.
fn left(deadline: Instant) -> io::Result<Duration> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(t) if !t.is_zero() => Ok(t),
        _ => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// A connection whose every read and write ends by one deadline.
struct Conn {
    stream: TcpStream,
    deadline: Instant,
}

/// A socket timeout is `EAGAIN` (`WouldBlock`) on Linux: said as a timeout.
fn timed_out(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock => io::ErrorKind::TimedOut.into(),
        _ => e,
    }
}

impl Conn {
    fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            self.stream.set_write_timeout(Some(left(self.deadline)?))?;
            match self.stream.write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(timed_out(e)),
            }
        }
        Ok(())
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            self.stream.set_read_timeout(Some(left(self.deadline)?))?;
            match self.stream.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r.map_err(timed_out),
            }
        }
    }
}

/// The answer as it arrives: `buf[pos..]` is read and not yet consumed.
struct Input<'a> {
    conn: &'a mut Conn,
    buf: Vec<u8>,
    pos: usize,
    from: &'a str,
}

impl Input<'_> {
    /// Reads more; `false` at the end of the stream.
    fn more(&mut self) -> Result<bool, UploadError> {
        if self.buf.len() > MAX_HEAD + MAX_BODY + 64 * 1024 {
            return Err(UploadError::BadResponse("the answer is over 16 MiB"));
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self
            .conn
            .read(&mut chunk)
            .map_err(|e| io_error(format!("reading the answer from {}", self.from), e))?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// The bytes before the next `delim` (consumed with it), `None` if the stream ends first.
    fn until(&mut self, delim: &[u8], limit: usize) -> Result<Option<Vec<u8>>, UploadError> {
        let mut from = self.pos;
        loop {
            if let Some(i) = find(&self.buf[from..], delim) {
                let line = self.buf[self.pos..from + i].to_vec();
                self.pos = from + i + delim.len();
                return Ok(Some(line));
            }
            if self.buf.len() - self.pos > limit {
                return Err(UploadError::BadResponse("a header line is too long"));
            }
            from = self.buf.len().saturating_sub(delim.len() - 1).max(self.pos);
            if !self.more()? {
                return Ok(None);
            }
        }
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<Vec<u8>, UploadError> {
        while self.buf.len() - self.pos < n {
            if !self.more()? {
                return Err(UploadError::BadResponse("the answer ended inside its body"));
            }
        }
        self.pos += n;
        Ok(self.buf[self.pos - n..self.pos].to_vec())
    }
}

const ENDED_IN_HEAD: UploadError = UploadError::BadResponse("the answer ended inside its headers");

/// The status code of an HTTP/1.x status line.
fn status_code(line: &str) -> Option<u16> {
    let mut words = line.strip_prefix("HTTP/1.")?.splitn(3, ' ');
    let (minor, code) = (words.next()?, words.next()?);
    let digits = |s: &str, n| s.len() == n && s.bytes().all(|c| c.is_ascii_digit());
    (digits(minor, 1) && digits(code, 3)).then(|| code.parse().ok())?
}

fn read_response(input: &mut Input<'_>) -> Result<Response, UploadError> {
    loop {
        let head = input.until(b"\r\n\r\n", MAX_HEAD)?.ok_or(ENDED_IN_HEAD)?;
        let head = String::from_utf8_lossy(&head);
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(status_code)
            .ok_or(UploadError::BadResponse(
                "the status line is not HTTP/1.x NNN",
            ))?;
        if status == 101 {
            return Err(UploadError::BadResponse("101 Switching Protocols"));
        }
        let (mut chunked, mut encoded, mut length) = (false, false, None);
        for line in lines {
            let (name, value) = line
                .split_once(':')
                .ok_or(UploadError::BadResponse("a header line has no ':'"))?;
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding") {
                // RFC 9112 §6.3: chunked when it is the last coding, else the body ends with
                // the connection.
                encoded = true;
                let last = value.rsplit(',').next().unwrap_or_default();
                chunked = last.trim().eq_ignore_ascii_case("chunked");
            } else if name.eq_ignore_ascii_case("content-length") {
                let n = value
                    .parse::<usize>()
                    .map_err(|_| UploadError::BadResponse("Content-Length is not a number"))?;
                if length.is_some_and(|m| m != n) {
                    return Err(UploadError::BadResponse("two different Content-Lengths"));
                }
                length = Some(n);
            }
        }
        if (100..200).contains(&status) {
            continue; // 100 Continue, 103 Early Hints: the answer follows
        }
        let body = if status == 204 || status == 304 {
            Vec::new()
        } else if chunked {
            read_chunked(input)?
        } else if let (Some(n), false) = (length, encoded) {
            if n > MAX_BODY {
                return Err(UploadError::BadResponse("the answer is over 16 MiB"));
            }
            input.take(n)?
        } else {
            while input.more()? {}
            input.buf.split_off(input.pos)
        };
        return Ok(Response { status, body });
    }
}

fn read_chunked(input: &mut Input<'_>) -> Result<Vec<u8>, UploadError> {
    const ENDED_IN_CHUNK: UploadError = UploadError::BadResponse("the answer ended inside a chunk");
    let mut body = Vec::new();
    loop {
        let line = input.until(b"\r\n", 4096)?.ok_or(ENDED_IN_CHUNK)?;
        let size = line.split(|&c| c == b';').next().unwrap_or_default();
        let size = std::str::from_utf8(size).unwrap_or_default().trim();
        let size = Some(size)
            .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_hexdigit()))
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            .ok_or(UploadError::BadResponse("a chunk size is not a hex number"))?;
        if size == 0 {
            // Trailer fields until an empty line; a server that closes instead is forgiven.
            while let Some(line) = input.until(b"\r\n", MAX_HEAD)? {
                if line.is_empty() {
                    break;
                }
            }
            return Ok(body);
        }
        if body.len() + size > MAX_BODY {
            return Err(UploadError::BadResponse("the answer is over 16 MiB"));
        }
        body.extend_from_slice(&input.take(size)?);
        if input.take(2)? != b"\r\n" {
            return Err(UploadError::BadResponse("a chunk does not end with CRLF"));
        }
    }
}
