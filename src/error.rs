//! The crate's one error type.

use core::fmt;

/// Everything that can go wrong in selftrace.
///
/// `Copy` and free of heap data, so that it can be returned from async-signal-safe paths.
/// `Display` is lowercase, without trailing punctuation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed; carries the call's name and `errno`.
    Sys {
        /// The system call or libc function that failed.
        call: &'static str,
        /// The `errno` it set.
        errno: i32,
    },
    /// An ELF file is malformed or not what was expected; says what was wrong.
    BadElf(&'static str),
    /// No usable unwind information was found for the loaded objects.
    NoUnwindInfo,
    /// tracefs is not mounted (or not reachable) on this machine.
    NoTracefs,
    /// The operation needs a permission the process does not have (typically root).
    PermissionDenied,
    /// The argument is invalid; says which and why.
    InvalidInput(&'static str),
    /// The named thing (symbol, probe, event) was not found.
    NotFound(&'static str),
    /// The named thing already exists.
    AlreadyExists(&'static str),
    /// The kernel lacks a feature this operation needs; says which.
    Unsupported(&'static str),
    /// Another thread did not answer in time (it has the signal blocked, is stopped, or sleeps
    /// uninterruptibly).
    Timeout,
    /// The thread does not exist (any more).
    ThreadGone,
}

impl Error {
    /// An [`Error::Sys`] from the current `errno` (read without allocating: async-signal-safe):
    /// what a `sys` wrapper returns when its call failed.
    pub(crate) fn last_os(call: &'static str) -> Error {
        Error::Sys {
            call,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }

    /// An [`Error::Sys`] from a failed std call (`std::fs`, `std::thread`) that made system call
    /// `call`: its `errno`, or `EIO` when std's error carries none.
    pub(crate) fn from_io(call: &'static str, e: &std::io::Error) -> Error {
        Error::Sys {
            call,
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// The `errno` of an [`Error::Sys`], `None` for every other kind: what a caller compares
    /// (`e.errno() == Some(libc::ESRCH)`) where a failure's cause decides what it does.
    pub(crate) fn errno(&self) -> Option<i32> {
        match *self {
            Error::Sys { errno, .. } => Some(errno),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Sys { call, errno } => {
                write!(
                    f,
                    "{call} failed: {}",
                    std::io::Error::from_raw_os_error(*errno)
                )
            }
            Error::BadElf(what) => write!(f, "malformed elf file: {what}"),
            Error::NoUnwindInfo => f.write_str("no unwind information found"),
            Error::NoTracefs => f.write_str("tracefs is not mounted"),
            Error::PermissionDenied => f.write_str("permission denied"),
            Error::InvalidInput(what) => write!(f, "invalid input: {what}"),
            Error::NotFound(what) => write!(f, "not found: {what}"),
            Error::AlreadyExists(what) => write!(f, "already exists: {what}"),
            Error::Unsupported(what) => write!(f, "unsupported: {what}"),
            Error::Timeout => f.write_str("the thread did not answer in time"),
            Error::ThreadGone => f.write_str("the thread does not exist"),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        match e {
            Error::Sys { errno, .. } => std::io::Error::from_raw_os_error(errno),
            other => std::io::Error::other(other),
        }
    }
}

/// Writes `s` as is when it is one plain word (a path, an event name), else quoted and escaped
/// (`"a b"`, `"x\n"`): the errors that name things stay one unambiguous line.
#[allow(dead_code)]
pub(crate) fn write_name(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    if !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"')
    {
        f.write_str(s)
    } else {
        write!(f, "{s:?}")
    }
}
