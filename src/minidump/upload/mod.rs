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
//! use selftrace::minidump::upload::{self, Form};
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

mod form;
mod http;

pub use form::Form;
pub use http::{post, Response};

use http::{parse_url, post_to};
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The name of the file part that carries the minidump: `upload_file_minidump`, the name that
/// Sentry, Breakpad, Crashpad and Socorro expect.
pub const MINIDUMP_FIELD: &str = "upload_file_minidump";

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

/// The position of the first `needle` (not empty) in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
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
/// use selftrace::minidump::upload::{self, Form, Outcome};
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
