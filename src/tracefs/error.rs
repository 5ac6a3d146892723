//! [`Error`]: what a tracefs operation (or the reading of an ELF file's probes or symbols)
//! failed at, with the file, the event and the kernel's explanation.

use crate::error::write_name;
use std::fmt;
use std::path::{Path, PathBuf};

/// The error of every fallible function of [`tracefs`](super): the crate's `Copy` error as its
/// [`kind`](Self::kind), with what the operation was doing, the file involved (a tracefs file
/// such as `uprobe_events`, or the ELF file read), the event, group, instance, probe or symbol
/// it was for, the kernel's explanation (its tracefs `error_log` entry, or the uprobe event
/// that a new one conflicts with), and the underlying [`std::io::Error`] as its
/// [`source`](std::error::Error::source).
///
/// `Display` is one lowercase line without trailing punctuation, with everything known:
///
/// ```text
/// writing /sys/kernel/tracing/uprobe_events for event selftrace_1_0_5/compute: Invalid argument (os error 22): kernel: Invalid register name at '%zz'
/// reading the symbols of /usr/bin/app: not found: elf file
/// ```
///
/// Match on [`kind`](Self::kind) (`Err(e) if e.kind() == selftrace::Error::NoTracefs`).
/// Unlike the crate's [`Error`](crate::Error) this one allocates: it is made in normal context
/// only, never in a signal handler. [`From`] converts it into the crate's error (its kind,
/// losing the rest) and into a [`std::io::Error`] (with the errno's
/// [`ErrorKind`](std::io::ErrorKind), keeping this error as its payload). The error of
/// [`usdt::read_probes`](crate::usdt::read_probes) converts into it with its path and source,
/// so `read_probes(bin)?` works where this one is returned.
///
/// ```no_run
/// use selftrace::tracefs::uprobe::UprobeEvent;
/// let bin = std::path::Path::new("/usr/bin/true");
/// match UprobeEvent::create("mygroup", "bad", bin, 0x1000, None, "x=%zz") {
///     Ok(_) => {}
///     Err(e) => {
///         // e.g. Some("Invalid register name at '%zz'")
///         eprintln!("{e}; the kernel said: {:?}", e.kernel_message());
///     }
/// }
/// ```
pub struct Error(Box<Inner>);

#[derive(Debug)]
struct Inner {
    kind: crate::error::Error,
    /// What was being done to `path`: `writing`, `reading probes of`.
    op: Option<&'static str>,
    path: Option<PathBuf>,
    /// What the operation was for: (`event`, `GROUP/EVENT`), (`symbol`, `app::parse`).
    subject: Option<(&'static str, String)>,
    /// More about the cause than the kind's static text says.
    detail: Option<String>,
    kernel: Option<String>,
    io: Option<std::io::Error>,
}

impl Error {
    /// An error of kind `kind` without context (see the `with_*` methods).
    pub(crate) fn new(kind: crate::error::Error) -> Error {
        Error(Box::new(Inner {
            kind,
            op: None,
            path: None,
            subject: None,
            detail: None,
            kernel: None,
            io: None,
        }))
    }

    /// The error of an I/O operation `op` (`opening`, `writing`) on `path` that failed with
    /// `e`: its kind from the errno (`ENOENT`: [`NotFound`](crate::Error::NotFound)`(what)`,
    /// `EACCES`/`EPERM`: [`PermissionDenied`](crate::Error::PermissionDenied), `EEXIST`:
    /// [`AlreadyExists`](crate::Error::AlreadyExists)`(what)`, any other:
    /// [`Sys`](crate::Error::Sys) with `call`), and `e` as its source.
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        call: &'static str,
        what: &'static str,
        e: std::io::Error,
    ) -> Error {
        let kind = match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => crate::error::Error::NotFound(what),
            Some(libc::EACCES) | Some(libc::EPERM) => crate::error::Error::PermissionDenied,
            Some(libc::EEXIST) => crate::error::Error::AlreadyExists(what),
            Some(errno) => crate::error::Error::Sys { call, errno },
            None => crate::error::Error::InvalidInput(what),
        };
        let mut err = Error::new(kind).with_op(op).with_path(path);
        err.0.io = Some(e);
        err
    }

    /// Says what was being done (`writing`, `reading probes of`): printed before the path.
    pub(crate) fn with_op(mut self, op: &'static str) -> Error {
        self.0.op = Some(op);
        self
    }

    /// The file involved.
    pub(crate) fn with_path(mut self, path: impl Into<PathBuf>) -> Error {
        self.0.path = Some(path.into());
        self
    }

    /// What the operation was for: `label` is `event`, `group`, `instance`, `symbol`... and
    /// `name` what [`event`](Self::event) returns. Replaces a subject set before.
    pub(crate) fn with_subject(mut self, label: &'static str, name: impl Into<String>) -> Error {
        self.0.subject = Some((label, name.into()));
        self
    }

    /// More about the cause, printed after the kind.
    pub(crate) fn with_detail(mut self, detail: impl Into<String>) -> Error {
        self.0.detail = Some(detail.into());
        self
    }

    /// The kernel's explanation, when it gave one.
    pub(crate) fn with_kernel_message(mut self, message: Option<String>) -> Error {
        self.0.kernel = message;
        self
    }

    /// What went wrong, as the crate's `Copy` error: [`NotFound`](crate::Error::NotFound),
    /// [`PermissionDenied`](crate::Error::PermissionDenied),
    /// [`NoTracefs`](crate::Error::NoTracefs), [`AlreadyExists`](crate::Error::AlreadyExists),
    /// [`InvalidInput`](crate::Error::InvalidInput), [`Unsupported`](crate::Error::Unsupported),
    /// [`BadElf`](crate::Error::BadElf), or [`Sys`](crate::Error::Sys) with the errno of any
    /// other failed call (a command the kernel refused in `uprobe_events` is
    /// `Sys { call: "write", errno: EINVAL }`, with the reason in
    /// [`kernel_message`](Self::kernel_message)).
    pub fn kind(&self) -> crate::error::Error {
        self.0.kind
    }

    /// The file involved: the tracefs file read or written (`.../uprobe_events`,
    /// `.../instances/NAME/events/GROUP/EVENT/enable`), or the ELF file whose probes or
    /// symbols were read. `None` when no file was (e.g. a name refused before anything was
    /// written, or no tracefs found at all).
    pub fn path(&self) -> Option<&Path> {
        self.0.path.as_deref()
    }

    /// The name of what the operation was for: a uprobe event (`GROUP/EVENT`), a group, an
    /// instance, a symbol, a probe (`provider:name`) or an offset (`0x1f40`).
    pub fn event(&self) -> Option<&str> {
        self.0.subject.as_ref().map(|(_, name)| name.as_str())
    }

    /// The kernel's explanation of a command it refused: the message of its tracefs
    /// `error_log` entry with the word it points at (`Invalid register name at '%zz'`), or the
    /// existing uprobe event on the same address with another reference counter (the kernel
    /// allows one per address). `None` when the kernel gave no reason.
    pub fn kernel_message(&self) -> Option<&str> {
        self.0.kernel.as_deref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &*self.0;
        let mut head = false;
        if let Some(op) = e.op {
            f.write_str(op)?;
            head = true;
        }
        if let Some(p) = &e.path {
            if head {
                f.write_str(" ")?;
            }
            write_name(f, &p.to_string_lossy())?;
            head = true;
        }
        if let Some((label, name)) = &e.subject {
            if head {
                f.write_str(" for ")?;
            }
            write!(f, "{label} ")?;
            write_name(f, name)?;
            head = true;
        }
        if head {
            f.write_str(": ")?;
        }
        match (&e.kind, &e.io) {
            // The operation already says which call: the OS's message is the cause.
            (crate::error::Error::Sys { .. }, Some(io)) => write!(f, "{io}")?,
            (kind, _) => write!(f, "{kind}")?,
        }
        if let Some(d) = &e.detail {
            write!(f, ": {d}")?;
        }
        if let Some(k) = &e.kernel {
            write!(f, ": kernel: {k}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &*self.0;
        let mut d = f.debug_struct("Error");
        d.field("kind", &e.kind);
        if let Some(op) = e.op {
            d.field("op", &op);
        }
        if let Some(p) = &e.path {
            d.field("path", p);
        }
        if let Some((label, name)) = &e.subject {
            d.field(label, name);
        }
        if let Some(x) = &e.detail {
            d.field("detail", x);
        }
        if let Some(k) = &e.kernel {
            d.field("kernel_message", k);
        }
        if let Some(io) = &e.io {
            d.field("source", io);
        }
        d.finish()
    }
}

impl std::error::Error for Error {
    /// The [`std::io::Error`] of the failed file operation when there was one, else the
    /// [`kind`](Error::kind).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0.io {
            Some(io) => Some(io),
            None => Some(&self.0.kind),
        }
    }
}

/// The kind, the file and the `io::Error` of a failed
/// [`usdt::read_probes`](crate::usdt::read_probes) (or of the reading of an ELF file's symbols).
impl From<crate::usdt::notes::ReadError> for Error {
    fn from(e: crate::usdt::notes::ReadError) -> Error {
        let (kind, op, path, io) = e.into_parts();
        let mut err = Error::new(kind).with_op(op).with_path(path);
        err.0.io = io;
        err
    }
}

/// An error with nothing but its kind.
impl From<crate::error::Error> for Error {
    fn from(kind: crate::error::Error) -> Error {
        Error::new(kind)
    }
}

/// The kind alone ([`Error::kind`]); the path, event and kernel message are lost. For code
/// that must keep the crate's `Copy` error.
impl From<Error> for crate::error::Error {
    fn from(e: Error) -> crate::error::Error {
        e.kind()
    }
}

/// An [`std::io::Error`] whose [`kind`](std::io::Error::kind) is the errno's (or the
/// [`kind`](Error::kind)'s: `NotFound`, `PermissionDenied`, `AlreadyExists`,
/// `InvalidInput`, `Unsupported`, else `Other`) and whose payload
/// ([`get_ref`](std::io::Error::get_ref)) is this error, with all its context.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        use std::io::ErrorKind as K;
        let kind = match (&e.0.io, e.0.kind) {
            (Some(io), _) => io.kind(),
            (None, crate::error::Error::Sys { errno, .. }) => {
                std::io::Error::from_raw_os_error(errno).kind()
            }
            (None, crate::error::Error::NotFound(_)) => K::NotFound,
            (None, crate::error::Error::PermissionDenied) => K::PermissionDenied,
            (None, crate::error::Error::AlreadyExists(_)) => K::AlreadyExists,
            (None, crate::error::Error::InvalidInput(_)) => K::InvalidInput,
            (None, crate::error::Error::BadElf(_)) => K::InvalidData,
            (None, crate::error::Error::Unsupported(_)) => K::Unsupported,
            (None, _) => K::Other,
        };
        std::io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn display_has_everything_on_one_line() {
        let io = std::io::Error::from_raw_os_error(libc::EINVAL);
        let e = Error::io(
            "writing",
            "/sys/kernel/tracing/uprobe_events",
            "write",
            "uprobe_events",
            io,
        )
        .with_subject("event", "g_1/foo")
        .with_kernel_message(Some("Invalid register name at '%zz'".into()));
        assert_eq!(
            e.to_string(),
            "writing /sys/kernel/tracing/uprobe_events for event g_1/foo: Invalid argument \
             (os error 22): kernel: Invalid register name at '%zz'"
        );
        assert_eq!(
            e.kind(),
            crate::error::Error::Sys {
                call: "write",
                errno: libc::EINVAL
            }
        );
        assert_eq!(e.event(), Some("g_1/foo"));
        assert_eq!(
            e.path(),
            Some(Path::new("/sys/kernel/tracing/uprobe_events"))
        );
        let src = e.source().unwrap();
        let io = src.downcast_ref::<std::io::Error>().unwrap();
        assert_eq!(io.raw_os_error(), Some(libc::EINVAL));
        let io: std::io::Error = e.into();
        assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
        assert!(io.to_string().contains("for event g_1/foo"), "{io}");

        let e = Error::new(crate::error::Error::BadElf("bad elf header"))
            .with_op("reading probes of")
            .with_path("/tmp/a b");
        assert_eq!(
            e.to_string(),
            "reading probes of \"/tmp/a b\": malformed elf file: bad elf header"
        );
        assert_eq!(
            e.source()
                .unwrap()
                .downcast_ref::<crate::error::Error>()
                .copied(),
            Some(crate::error::Error::BadElf("bad elf header"))
        );
        assert_eq!(
            crate::error::Error::from(e),
            crate::error::Error::BadElf("bad elf header")
        );

        let e =
            Error::new(crate::error::Error::InvalidInput("bad name")).with_subject("group", "a\nb");
        assert_eq!(e.to_string(), "group \"a\\nb\": invalid input: bad name");
        assert_eq!(
            Error::from(crate::error::Error::NoTracefs).to_string(),
            "tracefs is not mounted"
        );
        let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
        let e = Error::io("opening", "/x", "open", "elf file", enoent).with_subject("symbol", "f");
        assert_eq!(e.kind(), crate::error::Error::NotFound("elf file"));
        assert_eq!(
            e.to_string(),
            "opening /x for symbol f: not found: elf file"
        );
        assert_eq!(e.event(), Some("f"));
        assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::NotFound);
    }
}
