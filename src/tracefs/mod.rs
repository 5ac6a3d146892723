//! tracefs: finding the mount, private instances, and reading the trace back.
//!
//! * [`root`] finds (once) where tracefs is mounted: `/sys/kernel/tracing`, then
//!   `/sys/kernel/debug/tracing`, then the first `tracefs` line of `/proc/self/mountinfo`;
//!   [`set_root`] overrides it.
//! * [`Instance`] is a private ftrace instance, created with a unique name and removed on drop.
//!   [`Instance::for_markers`] makes one that records the program's trace markers
//!   (`options/copy_trace_marker`, Linux 6.17+).
//! * [`parse_record`] / [`records`] parse any line of a `trace` file into a [`Record`] (task,
//!   tid, CPU, timestamp, event, body); [`markers`] turns `tracing_mark_write` lines into
//!   [`MarkerEvent`]s.
//! * [`Session`] is a set of uprobe events (USDT probes, function entries and returns, raw
//!   offsets) in a private group, enabled in a private instance, whose hits read back as
//!   [`Hit`]s; [`function_offset`] finds where a function symbol sits in an ELF file.
//!
//! Everything here runs in normal context and may allocate. tracefs is global to the machine:
//! write only into instances you created, with names nobody else uses.
//!
//! ```no_run
//! use selftrace::{trace, tracefs};
//! let inst = tracefs::Instance::for_markers("example")?;
//! trace::instant("hello");
//! for e in inst.read_markers()? {
//!     println!("{} {:?} {}", e.timestamp_ns, e.kind, e.text);
//! }
//! # Ok::<(), selftrace::Error>(())
//! ```

mod instance;
pub(crate) mod mountinfo;
mod parse;
mod session;
mod symbols;
pub mod uprobe;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use instance::{Instance, OwnedRecord};
pub use parse::{
    markers, parse_marker, parse_record, records, MarkerEvent, MarkerKind, MarkerParts, Record,
};
pub use session::{parse_hit_body, remove_stale_sessions, EventInfo, EventKind, Hit, Session};
pub use symbols::{find_functions, function_offset, function_symbols, FunctionSymbol};

use crate::{sys, Error};

/// `statfs` magic of tracefs (`TRACEFS_MAGIC`, "trac").
pub const TRACEFS_MAGIC: i64 = 0x7472_6163;

/// The usual mount points, in the order they are tried.
pub const DEFAULT_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

pub(crate) static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Where tracefs is mounted, found once and cached (see [`discover`]) unless set by
/// [`set_root`]. A failure is not cached: a later call looks again.
pub fn root() -> Result<&'static Path, Error> {
    if let Some(p) = ROOT.get() {
        return Ok(p);
    }
    let found = discover()?;
    Ok(ROOT.get_or_init(|| found))
}

/// Sets the tracefs root explicitly (e.g. a tracefs mounted elsewhere). Must come before the
/// first [`root`] call and before the first trace marker; fails with
/// [`Error::AlreadyExists`] once a root is in use, and with [`Error::NoTracefs`] if `path` is
/// not a tracefs mount.
pub fn set_root(path: impl AsRef<Path>) -> Result<(), Error> {
    let path = path.as_ref();
    match is_tracefs(path) {
        Ok(true) => {}
        Ok(false) => return Err(Error::NoTracefs),
        Err(e) => return Err(e),
    }
    ROOT.set(path.to_path_buf())
        .map_err(|_| Error::AlreadyExists("tracefs root already in use"))
}

/// Looks for tracefs (uncached): [`DEFAULT_ROOTS`], then the first `tracefs` mount in
/// `/proc/self/mountinfo`. [`Error::PermissionDenied`] if a candidate exists but cannot be
/// examined, [`Error::NoTracefs`] if there is none.
pub fn discover() -> Result<PathBuf, Error> {
    let mut denied = false;
    for cand in DEFAULT_ROOTS {
        match is_tracefs(Path::new(cand)) {
            Ok(true) => return Ok(PathBuf::from(cand)),
            Ok(false) => {}
            Err(Error::PermissionDenied) => denied = true,
            Err(_) => {}
        }
    }
    let mut buf = [0u8; 4096];
    if let Some(n) = mountinfo::first_tracefs_mount(&mut buf) {
        let p = PathBuf::from(std::ffi::OsStr::from_bytes(&buf[..n]));
        if let Ok(true) = is_tracefs(&p) {
            return Ok(p);
        }
    }
    if denied {
        Err(Error::PermissionDenied)
    } else {
        Err(Error::NoTracefs)
    }
}

/// Whether `path` is the root of a tracefs mount (by `statfs` magic).
fn is_tracefs(path: &Path) -> Result<bool, Error> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::InvalidInput("path contains a nul byte"))?;
    match sys::statfs_type(&c) {
        Ok(t) => Ok(t == TRACEFS_MAGIC),
        Err(libc::EACCES) | Err(libc::EPERM) => Err(Error::PermissionDenied),
        Err(libc::ENOENT) | Err(libc::ENOTDIR) => Ok(false),
        Err(errno) => Err(Error::Sys {
            call: "statfs",
            errno,
        }),
    }
}

thread_local! {
    static KERNEL_ERROR: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

pub(crate) fn set_kernel_error(why: Option<String>) {
    KERNEL_ERROR.with(|k| *k.borrow_mut() = why);
}

/// The kernel's explanation of the last tracefs command of this thread that failed, taken (and
/// cleared): the message of its `error_log` entry and the word it points at
/// (`Invalid register name at 'x=%zz'`), or the existing uprobe event that a new one conflicts
/// with. `None` when the kernel gave no reason. [`Error`] is `Copy` and cannot carry it; call
/// this right after a failed [`Session`] or [`uprobe::UprobeEvent`] call.
pub fn last_kernel_error() -> Option<String> {
    KERNEL_ERROR.with(|k| k.borrow_mut().take())
}

/// Maps an `io::Error` from a tracefs file operation onto [`Error`].
pub(crate) fn io_error(call: &'static str, e: std::io::Error, what: &'static str) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) => Error::NotFound(what),
        Some(libc::EACCES) | Some(libc::EPERM) => Error::PermissionDenied,
        Some(libc::EEXIST) => Error::AlreadyExists(what),
        Some(errno) => Error::Sys { call, errno },
        None => Error::InvalidInput(what),
    }
}
