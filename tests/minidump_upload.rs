//! `crash::upload` against a hand-written HTTP server on 127.0.0.1: the request's line and
//! headers, its body byte for byte against one built here from RFC 7578's rules, response
//! bodies sized, chunked and ended by the connection, `send_pending` keeping refused dumps, and
//! the errors for https, bad URLs and names that cannot be written into a header.

use selftrace::crash::upload::{self, Form, Outcome, UploadError, MINIDUMP_FIELD};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A request as the server received it.
struct Request {
    raw: Vec<u8>,
    head: String,
    body: Vec<u8>,
}

impl Request {
    fn request_line(&self) -> &str {
        self.head.split("\r\n").next().unwrap()
    }

    /// The value of header `name` (case-insensitive), which must occur once.
    fn header(&self, name: &str) -> &str {
        let values: Vec<&str> = self
            .head
            .split("\r\n")
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
            .collect();
        assert_eq!(values.len(), 1, "header {name} in {:?}", self.head);
        values[0]
    }
}

/// Reads one request: headers up to the empty line, then `Content-Length` bytes.
fn read_request(stream: &mut TcpStream) -> Request {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "request ended early");
        raw.push(byte[0]);
    }
    let head = String::from_utf8(raw[..raw.len() - 4].to_vec()).unwrap();
    let mut request = Request {
        raw: Vec::new(),
        head,
        body: Vec::new(),
    };
    let length: usize = request.header("Content-Length").parse().unwrap();
    request.body = vec![0; length];
    stream.read_exact(&mut request.body).unwrap();
    raw.extend_from_slice(&request.body);
    request.raw = raw;
    request
}

/// A server on 127.0.0.1 that takes `connections` requests, one at a time, and answers each
/// with the bytes `answer` gives for it, then closes; the thread returns the requests.
fn serve(
    connections: usize,
    answer: impl Fn(&Request) -> Vec<u8> + Send + 'static,
) -> (u16, JoinHandle<Vec<Request>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let thread = std::thread::spawn(move || {
        let mut requests = Vec::new();
        for _ in 0..connections {
            let (mut stream, _) = listener.accept().unwrap();
            let request = read_request(&mut stream);
            stream.write_all(&answer(&request)).unwrap();
            requests.push(request);
        }
        requests
    });
    (port, thread)
}

fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A dump-like file with what could confuse a multipart parser: CRLF, `--`, zeros, 0xff.
fn dump_bytes() -> Vec<u8> {
    let mut bytes = b"MDMP\x93\xa7\0\0\r\n--\r\n--\0\0\0\xff\xfe\r\n\r\n".to_vec();
    bytes.extend((0..=255u8).cycle().take(3000));
    bytes.extend_from_slice(b"\r\n--");
    bytes
}

/// The body RFC 7578 prescribes for `fields` and one file, built by hand.
fn expected_body(boundary: &str, fields: &[(&str, &str)], file: (&str, &str, &[u8])) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    let (name, file_name, content) = file;
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
             filename=\"{file_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn request_and_body_are_rfc7578_byte_for_byte() {
    let fields = [
        ("sentry[release]", "myapp@1.4.2"),
        ("sentry[tags][k]", "Grüße, 日本 ✓"),
        ("guid", "multi\r\nline \"value\" with --dashes"),
    ];
    let dump = dump_bytes();
    let mut form = Form::new();
    for (name, value) in fields {
        form = form.field(name, value).unwrap();
    }
    let form = form
        .file(MINIDUMP_FIELD, "crash 1.dmp", dump.clone())
        .unwrap();
    let (port, server) = serve(1, |_| ok("{\"id\":\"abc\"}"));
    let url = format!("http://127.0.0.1:{port}/api/42/minidump/?sentry_key=0123abcd");

    let response = upload::post(&url, &form, TIMEOUT).unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.is_success());
    assert_eq!(response.body(), b"{\"id\":\"abc\"}");
    assert_eq!(response.body_text(), "{\"id\":\"abc\"}");

    let request = server.join().unwrap().pop().unwrap();
    assert_eq!(
        request.request_line(),
        "POST /api/42/minidump/?sentry_key=0123abcd HTTP/1.1"
    );
    assert_eq!(request.header("Host"), format!("127.0.0.1:{port}"));
    assert_eq!(request.header("Connection"), "close");
    assert_eq!(
        request.header("Content-Length"),
        request.body.len().to_string()
    );
    let content_type = request.header("Content-Type");
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .unwrap_or_else(|| panic!("Content-Type {content_type:?}"));
    // RFC 2046 §5.1.1: 1 to 70 characters of a restricted set, here without quoting.
    assert!((1..=70).contains(&boundary.len()), "{boundary:?}");
    assert!(
        boundary
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"'()+_,-./:=?".contains(&c)),
        "{boundary:?}"
    );
    assert_eq!(boundary, form.boundary());
    assert_eq!(content_type, form.content_type());
    for (name, value) in fields {
        assert!(!name.contains(boundary) && !value.contains(boundary));
    }
    assert!(!contains(&dump, boundary.as_bytes()));

    let expected = expected_body(boundary, &fields, (MINIDUMP_FIELD, "crash 1.dmp", &dump));
    assert_eq!(request.body, expected);
    assert_eq!(form.to_body(), expected);
    // The head ends with the empty line, the body follows it and nothing else.
    assert!(request.raw.ends_with(&expected));
    assert_eq!(request.raw.len(), request.head.len() + 4 + expected.len());
}

#[test]
fn boundary_is_drawn_again_when_a_part_contains_it() {
    let form = Form::new().field("prod", "myapp").unwrap();
    let first = form.boundary().to_owned();
    let mut content = b"before ".to_vec();
    content.extend_from_slice(format!("\r\n--{first}--\r\n").as_bytes());
    let form = form.file(MINIDUMP_FIELD, "a.dmp", content.clone()).unwrap();
    assert_ne!(form.boundary(), first);
    assert!(!contains(&content, form.boundary().as_bytes()));
    assert_eq!(
        form.to_body(),
        expected_body(
            form.boundary(),
            &[("prod", "myapp")],
            (MINIDUMP_FIELD, "a.dmp", &content)
        )
    );
    // A value holding the boundary redraws it too.
    let b = form.boundary().to_owned();
    let form = form.field("ver", &b).unwrap();
    assert_ne!(form.boundary(), b);
    assert!(!contains(&content, form.boundary().as_bytes()));
}

#[test]
fn names_that_cannot_be_written_are_rejected() {
    for bad in [
        "a\"b",
        "x\r\nContent-Type: text/html",
        "a\nb",
        "a\rb",
        "back\\slash",
        "nul\0",
        "",
    ] {
        let e = Form::new().field(bad, "v").unwrap_err();
        assert!(
            matches!(&e, UploadError::InvalidName { name } if name == bad),
            "{e:?}"
        );
        assert!(e.to_string().contains("invalid form name"), "{e}");
        let e = Form::new().file(MINIDUMP_FIELD, bad, b"x".to_vec());
        assert!(matches!(e, Err(UploadError::InvalidName { .. })));
        let e = Form::new().file(bad, "a.dmp", b"x".to_vec());
        assert!(matches!(e, Err(UploadError::InvalidName { .. })));
    }
    // Values hold anything; names may be non-ASCII (RFC 7578 §5.1.1).
    let form = Form::new()
        .field("tags[ü]", "a\"b\r\n\\")
        .unwrap()
        .file("datei", "Prüfung.dmp", b"x".to_vec())
        .unwrap();
    assert!(contains(
        &form.to_body(),
        "name=\"datei\"; filename=\"Prüfung.dmp\"".as_bytes()
    ));
}

#[test]
fn https_and_other_urls_are_refused_clearly() {
    let form = Form::new().field("prod", "myapp").unwrap();
    let e = upload::post(
        "https://o1.ingest.sentry.io/api/1/minidump/?sentry_key=k",
        &form,
        TIMEOUT,
    )
    .unwrap_err();
    assert!(matches!(e, UploadError::Https { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("TLS") && text.contains("to_body") && text.contains("relay"),
        "{text}"
    );
    for bad in [
        "ftp://host/x",
        "host/x",
        "http://",
        "http:///path",
        "http://user:pw@host/x",
        "http://host:0/",
        "http://host:99999/",
        "http://host:x/",
        "http://[::1/",
        "http://ho st/",
        "http://host/a b",
        "http://host/ü",
    ] {
        let e = upload::post(bad, &form, TIMEOUT).unwrap_err();
        assert!(matches!(e, UploadError::InvalidUrl { .. }), "{bad}: {e:?}");
    }
    let e = upload::post("http://127.0.0.1:9/", &Form::new(), TIMEOUT).unwrap_err();
    assert!(matches!(e, UploadError::EmptyForm), "{e:?}");
}

#[test]
fn chunked_and_connection_close_bodies_are_read() {
    let answers: [&[u8]; 4] = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ntransfer-encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
        b"HTTP/1.0 413 Payload Too Large\r\nContent-Type: text/plain\r\n\r\ntoo big\r\nreally",
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ];
    let expected: [(u16, &[u8]); 4] = [
        (200, b"hello, world"),
        (201, b"0123456789"),
        (413, b"too big\r\nreally"),
        (204, b""),
    ];
    let (port, server) = serve(answers.len(), {
        let count = std::sync::atomic::AtomicUsize::new(0);
        move |_| answers[count.fetch_add(1, std::sync::atomic::Ordering::Relaxed)].to_vec()
    });
    let form = Form::new().field("prod", "myapp").unwrap();
    for (status, body) in expected {
        let r = upload::post(&format!("http://127.0.0.1:{port}/submit"), &form, TIMEOUT).unwrap();
        assert_eq!((r.status(), r.body()), (status, body));
        assert_eq!(r.is_success(), status < 300);
    }
    assert_eq!(server.join().unwrap().len(), answers.len());
}

#[test]
fn a_server_that_never_answers_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        read_request(&mut stream);
        // Wait, silent, until the client gives up and closes.
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    });
    let form = Form::new().field("prod", "myapp").unwrap();
    let e = upload::post(
        &format!("http://127.0.0.1:{port}/"),
        &form,
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(
        matches!(&e, UploadError::Io { source, .. } if source.kind() == io::ErrorKind::TimedOut),
        "{e:?}"
    );
    assert!(std::error::Error::source(&e).is_some());
    server.join().unwrap();
}

/// A fresh directory under the system's temporary one, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("selftrace-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn send_pending_deletes_accepted_dumps_and_keeps_refused_ones() {
    let dir = TempDir::new("upload");
    let dump = dump_bytes();
    std::fs::write(dir.0.join("b.dmp"), b"refused").unwrap();
    std::fs::write(dir.0.join("a.dmp"), &dump).unwrap();
    std::fs::write(dir.0.join("c.dmp.tmp"), b"still being written").unwrap();
    std::fs::write(dir.0.join("notes.txt"), b"not a dump").unwrap();
    std::fs::create_dir(dir.0.join("d.dmp")).unwrap();

    // 200 for a.dmp, 500 for anything else.
    let (port, server) = serve(2, |request| {
        if contains(&request.body, b"filename=\"a.dmp\"") {
            ok("{\"id\":\"a\"}")
        } else {
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nnope".to_vec()
        }
    });
    let template = Form::new()
        .field("sentry[release]", "myapp@1.4.2")
        .unwrap()
        .field("sentry[tags][k]", "vä")
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/api/7/minidump/?sentry_key=k");
    let sent = upload::send_pending(&dir.0, &url, &template, TIMEOUT).unwrap();

    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0].path(), dir.0.join("a.dmp"));
    assert!(
        matches!(sent[0].outcome(), Outcome::Uploaded(r) if r.status() == 200 && r.body() == b"{\"id\":\"a\"}"),
        "{sent:?}"
    );
    assert!(sent[0].is_deleted());
    assert_eq!(sent[1].path(), dir.0.join("b.dmp"));
    assert!(
        matches!(sent[1].outcome(), Outcome::Refused(r) if r.status() == 500 && r.body() == b"nope"),
        "{sent:?}"
    );
    assert!(!sent[1].is_deleted());

    assert!(!dir.0.join("a.dmp").exists());
    assert_eq!(std::fs::read(dir.0.join("b.dmp")).unwrap(), b"refused");
    assert!(dir.0.join("c.dmp.tmp").exists());
    assert!(dir.0.join("notes.txt").exists());
    assert!(dir.0.join("d.dmp").is_dir());

    let requests = server.join().unwrap();
    let fields = [
        ("sentry[release]", "myapp@1.4.2"),
        ("sentry[tags][k]", "vä"),
    ];
    for (request, (name, content)) in requests
        .iter()
        .zip([("a.dmp", &dump[..]), ("b.dmp", b"refused")])
    {
        assert_eq!(
            request.request_line(),
            "POST /api/7/minidump/?sentry_key=k HTTP/1.1"
        );
        let boundary = request
            .header("Content-Type")
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap();
        assert_eq!(
            request.body,
            expected_body(boundary, &fields, (MINIDUMP_FIELD, name, content))
        );
    }

    // Again: only the refused one is left, and this time it is taken.
    let (port, server) = serve(1, |_| ok(""));
    let url = format!("http://127.0.0.1:{port}/submit");
    let sent = upload::send_pending(&dir.0, &url, &template, TIMEOUT).unwrap();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].is_deleted(), "{sent:?}");
    assert!(!dir.0.join("b.dmp").exists());
    server.join().unwrap();
}

#[test]
fn send_pending_checks_the_url_first_and_takes_a_missing_dir_as_empty() {
    let dir = TempDir::new("upload-https");
    std::fs::write(dir.0.join("a.dmp"), b"x").unwrap();
    let template = Form::new();
    let e = upload::send_pending(
        &dir.0,
        "https://o1.ingest.sentry.io/api/1/minidump/?sentry_key=k",
        &template,
        TIMEOUT,
    )
    .unwrap_err();
    assert!(matches!(e, UploadError::Https { .. }), "{e:?}");
    assert!(dir.0.join("a.dmp").exists());

    let missing = dir.0.join("no-such-dir");
    let sent = upload::send_pending(&missing, "http://127.0.0.1:9/", &template, TIMEOUT).unwrap();
    assert!(sent.is_empty());
}
