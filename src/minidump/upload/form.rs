//! The `multipart/form-data` body ([RFC 7578]): [`Form`], its parts, names and boundary, and
//! its encoding.
//!
//! [RFC 7578]: https://www.rfc-editor.org/rfc/rfc7578

use super::{find, io_error, UploadError, MINIDUMP_FIELD};
use std::fmt;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

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
/// use selftrace::minidump::upload::Form;
///
/// # fn main() -> Result<(), selftrace::minidump::upload::UploadError> {
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
    /// # fn main() -> Result<(), selftrace::minidump::upload::UploadError> {
    /// let form = selftrace::minidump::upload::Form::new()
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
    /// An empty form gives just the closing line, which is not a valid body
    /// ([`post`](super::post) refuses to send it).
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

    /// Whether the form has no part ([`post`](super::post) refuses to send it).
    pub(super) fn is_empty(&self) -> bool {
        self.parts.is_empty()
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
