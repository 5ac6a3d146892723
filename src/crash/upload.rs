//! Uploading minidumps to crash servers (Sentry, Breakpad, Crashpad, Socorro, Backtrace), in
//! normal context on the next start of the program: never from a signal handler.
//!
//! These servers all take the same request: an HTTP `POST` whose body is `multipart/form-data`
//! ([RFC 7578]), with the dump in a file part named [`MINIDUMP_FIELD`]
//! (`upload_file_minidump`) and the metadata in text fields:
//!
//! * **Sentry**: the URL is `https://oXXX.ingest.sentry.io/api/PROJECT/minidump/?sentry_key=KEY`
//!   (host, project and key from the DSN `https://KEY@oXXX.ingest.sentry.io/PROJECT`); fields
//!   such as `sentry[release]`, `sentry[environment]`, `sentry[tags][NAME]`, `sentry[user][id]`.
//! * **Crashpad / Breakpad**: fields `prod`, `ver`, `guid` and any other annotations.
//!
//! [`Form`] builds the body; [`post`] sends it over a plain `std::net::TcpStream` (HTTP/1.1,
//! `http://` only: std has no TLS). For `https://` (Sentry's ingest hosts), send
//! [`Form::content_type`] and [`Form::to_body`] with a TLS client of your choice (reqwest,
//! ureq...), or post to a local relay (for Sentry, a [Relay] on `http://127.0.0.1:3000`).
//! [`send_pending`] uploads every `*.dmp` file of a directory and deletes the ones the server
//! accepted: the call to make once at start-up.
//!
//! ```no_run
//! use selftrace::crash::upload::{self, Form};
//! use std::path::Path;
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), upload::UploadError> {
//! let template = Form::new()
//!     .field("sentry[release]", "myapp@1.4.2")?
//!     .field("sentry[tags][host]", "build-7")?;
//! let url = "http://127.0.0.1:3000/api/42/minidump/?sentry_key=0123abcd";
//! for sent in upload::send_pending(Path::new("/var/crash/myapp"), url, &template, Duration::from_secs(30))? {
//!     eprintln!("{}: {:?}", sent.path().display(), sent.outcome());
//! }
//! # Ok(()) }
//! ```
//!
//! [RFC 7578]: https://www.rfc-editor.org/rfc/rfc7578
//! [Relay]: https://docs.sentry.io/product/relay/
#![deny(unsafe_code)]

use std::borrow::Cow;
use std::fmt;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The name of the file part that carries the minidump: `upload_file_minidump`, the name that
/// Sentry, Breakpad, Crashpad and Socorro expect.
pub const MINIDUMP_FIELD: &str = "upload_file_minidump";

/// The most bytes of response headers that [`post`] reads.
const MAX_HEAD: usize = 64 * 1024;
/// The most bytes of response body that [`post`] reads.
const MAX_BODY: usize = 16 << 20;

/// What can go wrong while building a form or uploading it.
///
/// `Display` is lowercase, without trailing punctuation.
#[derive(Debug)]
#[non_exhaustive]
pub enum UploadError {
    /// A field name or file name is empty or has a `"`, a `\` or a control character (CR, LF,
    /// ...): it cannot be written into a `Content-Disposition` header unambiguously.
    InvalidName {
        /// The name as given.
        name: String,
    },
    /// The URL is not `http://host[:port]/path[?query]`.
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An `https://` URL: std has no TLS. Send [`Form::content_type`] and [`Form::to_body`]
    /// with a TLS client, or post to a local `http://` relay.
    Https {
        /// The URL as given.
        url: String,
    },
    /// The form has no part: a `multipart/form-data` body needs at least one.
    EmptyForm,
    /// Reading a file, resolving the host, connecting, sending or receiving failed; a timeout
    /// is an error of kind [`io::ErrorKind::TimedOut`].
    Io {
        /// What was being done: `reading /var/crash/a.dmp`, `connecting to host:80`, ...
        context: String,
        /// The error.
        source: io::Error,
    },
    /// The server's answer is not HTTP/1.x; says what was wrong.
    BadResponse(&'static str),
}

impl fmt::Display for UploadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UploadError::InvalidName { name } => write!(
                f,
                "invalid form name {name:?}: a field or file name must be non-empty, without '\"', \
                 '\\' or control characters"
            ),
            UploadError::InvalidUrl { url, reason } => write!(f, "invalid URL {url:?}: {reason}"),
            UploadError::Https { url } => write!(
                f,
                "cannot post to {url:?}: https:// needs TLS, which std lacks; send \
                 Form::content_type() and Form::to_body() with a TLS client (reqwest, ureq) or \
                 post to a local http:// relay"
            ),
            UploadError::EmptyForm => write!(f, "the form has no part"),
            UploadError::Io { context, source } => write!(f, "{context}: {source}"),
            UploadError::BadResponse(what) => write!(f, "malformed HTTP answer: {what}"),
        }
    }
}

impl std::error::Error for UploadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UploadError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_error(context: impl Into<String>, source: io::Error) -> UploadError {
    UploadError::Io {
        context: context.into(),
        source,
    }
}

/// One part of a form: a text field (`file_name` none) or a file.
#[derive(Clone)]
struct Part {
    name: String,
    file_name: Option<String>,
    content: Vec<u8>,
}

/// A `multipart/form-data` body ([RFC 7578]): text fields and files, in the order added.
///
/// Names (of fields and files) that are empty or hold a `"`, a `\` or a control character are
/// rejected with [`UploadError::InvalidName`], never escaped: servers disagree on how to
/// unescape them (percent-decoding, backslash escapes, or not at all), and a name that reaches
/// the server altered is worse than a clear error. Non-ASCII names are written as UTF-8 (RFC
/// 7578 §5.1). Values and file contents may hold any bytes: the boundary is chosen so that it
/// occurs in none of them.
///
/// ```
/// use selftrace::crash::upload::Form;
///
/// # fn main() -> Result<(), selftrace::crash::upload::UploadError> {
/// let form = Form::new()
///     .field("prod", "myapp")?
///     .field("ver", "1.4.2")?
///     .file("upload_file_minidump", "a.dmp", b"MDMP".to_vec())?;
/// let b = form.boundary();
/// assert_eq!(form.content_type(), format!("multipart/form-data; boundary={b}"));
/// let body = String::from_utf8(form.to_body()).unwrap();
/// assert!(body.starts_with(&format!("--{b}\r\nContent-Disposition: form-data; name=\"prod\"\r\n\r\nmyapp\r\n")));
/// assert!(body.ends_with(&format!("\r\n\r\nMDMP\r\n--{b}--\r\n")));
/// assert!(Form::new().field("a\r\nb", "x").is_err());
/// # Ok(()) }
/// ```
///
/// [RFC 7578]: https://www.rfc-editor.org/rfc/rfc7578
#[derive(Clone)]
pub struct Form {
    parts: Vec<Part>,
    boundary: String,
}

impl Default for Form {
    fn default() -> Form {
        Form::new()
    }
}

impl fmt::Debug for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for part in &self.parts {
            match &part.file_name {
                None => list.entry(&format_args!(
                    "{:?} = {:?}",
                    part.name,
                    String::from_utf8_lossy(&part.content)
                )),
                Some(file) => list.entry(&format_args!(
                    "{:?} = file {file:?} ({} bytes)",
                    part.name,
                    part.content.len()
                )),
            };
        }
        list.finish()
    }
}

impl Form {
    /// An empty form, with a fresh boundary.
    #[must_use]
    pub fn new() -> Form {
        Form {
            parts: Vec::new(),
            boundary: new_boundary(),
        }
    }

    /// Adds the text field `name` = `value` (after the parts added before).
    ///
    /// # Errors
    /// [`UploadError::InvalidName`] if `name` is empty or has a `"`, `\` or control character.
    pub fn field(self, name: &str, value: &str) -> Result<Form, UploadError> {
        check_name(name)?;
        Ok(self.push(Part {
            name: name.to_owned(),
            file_name: None,
            content: value.as_bytes().to_vec(),
        }))
    }

    /// Adds a file part: field `field_name`, `filename="file_name"`, `Content-Type:
    /// application/octet-stream`, the bytes `content`.
    ///
    /// # Errors
    /// [`UploadError::InvalidName`] if `field_name` or `file_name` is empty or has a `"`, `\` or
    /// control character.
    pub fn file(
        self,
        field_name: &str,
        file_name: &str,
        content: impl Into<Vec<u8>>,
    ) -> Result<Form, UploadError> {
        check_name(field_name)?;
        check_name(file_name)?;
        Ok(self.push(Part {
            name: field_name.to_owned(),
            file_name: Some(file_name.to_owned()),
            content: content.into(),
        }))
    }

    /// Reads the minidump at `path` and adds it as the file part [`MINIDUMP_FIELD`], with the
    /// file's name (its last path component) as `filename`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), selftrace::crash::upload::UploadError> {
    /// let form = selftrace::crash::upload::Form::new()
    ///     .field("guid", "6c1f0b3e")?
    ///     .minidump("/var/crash/myapp/2024-05-01T10-00-00.dmp")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`UploadError::Io`] if the file cannot be read; [`UploadError::InvalidName`] if its
    /// name is not UTF-8 or has a `"`, `\` or control character.
    pub fn minidump(self, path: impl AsRef<Path>) -> Result<Form, UploadError> {
        let path = path.as_ref();
        let name = match path.file_name() {
            Some(name) => name.to_str().ok_or_else(|| UploadError::InvalidName {
                name: name.to_string_lossy().into_owned(),
            })?,
            None => {
                return Err(UploadError::InvalidName {
                    name: path.display().to_string(),
                })
            }
        };
        check_name(name)?;
        let content =
            fs::read(path).map_err(|e| io_error(format!("reading {}", path.display()), e))?;
        self.file(MINIDUMP_FIELD, name, content)
    }

    /// The boundary between the parts: `selftrace-` and 32 hex digits, drawn from the time,
    /// the pid and std's per-process random hash keys, and drawn again whenever a part added
    /// contains it.
    #[must_use]
    pub fn boundary(&self) -> &str {
        &self.boundary
    }

    /// The request's `Content-Type`: `multipart/form-data; boundary=...`.
    #[must_use]
    pub fn content_type(&self) -> String {
        format!("multipart/form-data; boundary={}", self.boundary)
    }

    /// The body: for each part `--BOUNDARY\r\n`, `Content-Disposition: form-data;
    /// name="NAME"` (with `; filename="FILE"` and a line `Content-Type:
    /// application/octet-stream` for a file), an empty line, the content and `\r\n`; then
    /// `--BOUNDARY--\r\n`.
    ///
    /// An empty form gives just the closing line, which is not a valid body ([`post`] refuses
    /// to send it).
    #[must_use]
    pub fn to_body(&self) -> Vec<u8> {
        let b = self.boundary.as_bytes();
        let size: usize = self.parts.iter().map(|p| p.content.len() + 200).sum();
        let mut body = Vec::with_capacity(size + b.len() + 8);
        for part in &self.parts {
            body.extend_from_slice(b"--");
            body.extend_from_slice(b);
            body.extend_from_slice(b"\r\nContent-Disposition: form-data; name=\"");
            body.extend_from_slice(part.name.as_bytes());
            body.push(b'"');
            if let Some(file) = &part.file_name {
                body.extend_from_slice(b"; filename=\"");
                body.extend_from_slice(file.as_bytes());
                body.extend_from_slice(b"\"\r\nContent-Type: application/octet-stream");
            }
            body.extend_from_slice(b"\r\n\r\n");
            body.extend_from_slice(&part.content);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"--");
        body.extend_from_slice(b);
        body.extend_from_slice(b"--\r\n");
        body
    }

    fn push(mut self, part: Part) -> Form {
        let clashes = |part: &Part, b: &str| {
            contains(part.name.as_bytes(), b.as_bytes())
                || part
                    .file_name
                    .as_ref()
                    .is_some_and(|f| contains(f.as_bytes(), b.as_bytes()))
                || contains(&part.content, b.as_bytes())
        };
        let redraw = clashes(&part, &self.boundary);
        self.parts.push(part);
        while redraw && self.parts.iter().any(|p| clashes(p, &self.boundary)) {
            self.boundary = new_boundary();
        }
        self
    }
}

fn check_name(name: &str) -> Result<(), UploadError> {
    if name.is_empty()
        || name
            .chars()
            .any(|c| c == '"' || c == '\\' || c.is_control())
    {
        return Err(UploadError::InvalidName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

fn new_boundary() -> String {
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    h.write_u128(now.map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    h.write_u64(DRAWN.fetch_add(1, Ordering::Relaxed));
    let first = h.finish();
    h.write_u64(first);
    format!("selftrace-{first:016x}{:016x}", h.finish())
}

/// Whether `needle` (not empty) occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

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
struct Url<'a> {
    /// The host to resolve, without IPv6 brackets.
    host: &'a str,
    port: u16,
    /// `host[:port]` as written: the `Host` header.
    authority: &'a str,
    /// The path and query, `/` when empty.
    target: String,
}

fn parse_url(url: &str) -> Result<Url<'_>, UploadError> {
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
/// use selftrace::crash::upload::{self, Form};
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

fn post_to(url: &Url<'_>, form: &Form, timeout: Duration) -> Result<Response, UploadError> {
    if form.parts.is_empty() {
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

/// What became of one dump in [`send_pending`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// The server took it (2xx) and the file was deleted.
    Uploaded(Response),
    /// The server took it (2xx) but the file could not be deleted: it will be sent again.
    UploadedNotDeleted(Response, io::Error),
    /// The server answered with another status (a 4xx or 5xx); the file is kept.
    Refused(Response),
    /// The file could not be read or sent, or there was no valid answer; the file is kept.
    Failed(UploadError),
}

/// One dump of [`send_pending`] and what became of it.
#[derive(Debug)]
pub struct Sent {
    path: PathBuf,
    outcome: Outcome,
}

impl Sent {
    /// The dump's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What became of it.
    #[must_use]
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// Whether the file is gone (uploaded and deleted).
    #[must_use]
    pub fn is_deleted(&self) -> bool {
        matches!(self.outcome, Outcome::Uploaded(_))
    }

    /// What became of it, owned.
    #[must_use]
    pub fn into_outcome(self) -> Outcome {
        self.outcome
    }
}

/// Uploads every minidump waiting in `dir` and deletes those the server took: the call to make
/// once, at start-up, in normal context.
///
/// Takes the regular files of `dir` whose name ends in `.dmp` (not following symbolic links),
/// sorted by name, and [`post`]s each to `url` as `form_template`'s parts followed by the dump
/// as [`MINIDUMP_FIELD`] (see [`Form::minidump`]), one at a time, each with `timeout`. A 2xx
/// answer deletes the file; any other answer or error keeps it for the next start. A dump
/// writer should write under another name (`*.dmp.tmp`) and rename, so that a dump still being
/// written is never sent. A `dir` that does not exist holds no dumps.
///
/// Sentry's minidump endpoint is `https://oXXX.ingest.sentry.io/api/PROJECT/minidump/?sentry_key=KEY`,
/// which needs TLS: give the `http://` URL of a relay, or send [`Form::to_body`] with a TLS
/// client.
///
/// ```no_run
/// use selftrace::crash::upload::{self, Form, Outcome};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), upload::UploadError> {
/// let template = Form::new().field("prod", "myapp")?.field("ver", "1.4.2")?;
/// let dir = std::path::Path::new("/var/crash/myapp");
/// for sent in upload::send_pending(dir, "http://crash.internal:8080/submit", &template, Duration::from_secs(30))? {
///     match sent.outcome() {
///         Outcome::Uploaded(r) => eprintln!("sent {}: {}", sent.path().display(), r.body_text()),
///         other => eprintln!("kept {}: {other:?}", sent.path().display()),
///     }
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`UploadError::Https`] or [`UploadError::InvalidUrl`] for the URL (before any file is
/// touched), [`UploadError::Io`] if `dir` cannot be listed. Errors of single dumps are in
/// their [`Outcome`].
pub fn send_pending(
    dir: &Path,
    url: &str,
    form_template: &Form,
    timeout: Duration,
) -> Result<Vec<Sent>, UploadError> {
    let url = parse_url(url)?;
    let listing = |e| io_error(format!("listing {}", dir.display()), e);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(listing(e)),
    };
    let mut dumps = Vec::new();
    for entry in entries {
        let entry = entry.map_err(listing)?;
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_file())
            && path.extension().is_some_and(|e| e == "dmp")
        {
            dumps.push(path);
        }
    }
    dumps.sort();
    let send = |path: &Path| {
        let form = match form_template.clone().minidump(path) {
            Ok(form) => form,
            Err(e) => return Outcome::Failed(e),
        };
        match post_to(&url, &form, timeout) {
            Ok(r) if r.is_success() => match fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Outcome::UploadedNotDeleted(r, e),
                _ => Outcome::Uploaded(r),
            },
            Ok(r) => Outcome::Refused(r),
            Err(e) => Outcome::Failed(e),
        }
    };
    Ok(dumps
        .into_iter()
        .map(|path| Sent {
            outcome: send(&path),
            path,
        })
        .collect())
}
