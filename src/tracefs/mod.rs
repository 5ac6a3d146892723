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
//!   [`cut_byte_args`] cuts the bytes a session fetched for `&str` / `&[u8]` probe arguments
//!   to the arguments' lengths in a `trace` text, before the text goes into a file.
//!
//! Everything here runs in normal context and may allocate. tracefs is global to the machine:
//! write only into instances you created, with names nobody else uses.
//!
//! Every fallible function returns this module's [`Error`]: the crate's `Copy`
//! [`selftrace::Error`](crate::Error) as its [`kind`](Error::kind), with the tracefs or ELF
//! file, the event and the kernel's explanation of a refused command
//! ([`kernel_message`](Error::kernel_message)).
//!
//! ```no_run
//! use selftrace::{trace, tracefs};
//! let inst = tracefs::Instance::for_markers("example")?;
//! trace::instant("hello");
//! for e in inst.read_markers()? {
//!     println!("{} {:?} {}", e.timestamp_ns, e.kind, e.text);
//! }
//! # Ok::<(), tracefs::Error>(())
//! ```

// Without the `tracefs` feature (and with `trace`) this module is private and only the
// discovery that the trace markers share is compiled: the constants, `ROOT` and `mountinfo`.
#[cfg(feature = "tracefs")]
mod error;
#[cfg(feature = "tracefs")]
mod instance;
pub(crate) mod mountinfo;
#[cfg(feature = "tracefs")]
mod parse;
#[cfg(feature = "tracefs")]
mod session;
#[cfg(feature = "tracefs")]
pub(crate) mod symbols;
#[cfg(feature = "tracefs")]
pub mod uprobe;

use std::path::PathBuf;
#[cfg(feature = "tracefs")]
use std::{ffi::CString, os::unix::ffi::OsStrExt, path::Path};

#[cfg(feature = "tracefs")]
pub use error::Error;
#[cfg(feature = "tracefs")]
pub use instance::{Instance, MarkersRead, OwnedRecord};
#[cfg(feature = "tracefs")]
pub use parse::{
    markers, parse_marker, parse_record, records, unparsed, MarkerEvent, MarkerKind, MarkerParts,
    Record, Unparsed,
};
#[cfg(feature = "tracefs")]
pub use session::{
    cut_byte_args, parse_hit_body, remove_stale_sessions, EventInfo, EventKind, Hit, Session,
};
#[cfg(feature = "tracefs")]
pub use symbols::{find_functions, function_offset, function_symbols, FunctionSymbol};

#[cfg(feature = "tracefs")]
use crate::{sys, Error as Kind};

/// `statfs` magic of tracefs (`TRACEFS_MAGIC`, "trac").
pub const TRACEFS_MAGIC: i64 = 0x7472_6163;

/// The usual mount points, in the order they are tried.
pub const DEFAULT_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs root once found or set (a `fork::OnceBox`, not a `OnceLock`, whose
/// initialisation under way in another thread of the parent would block a forked child for
/// ever).
pub(crate) static ROOT: crate::fork::OnceBox<PathBuf> = crate::fork::OnceBox::new();

#[cfg(feature = "tracefs")]
/// Where tracefs is mounted, found once and cached (see [`discover`]) unless set by
/// [`set_root`]. A failure is not cached: a later call looks again.
///
/// # Errors
/// Those of [`discover`], until a root is found or set.
pub fn root() -> Result<&'static Path, Error> {
    if let Some(p) = ROOT.get() {
        return Ok(p);
    }
    let found = discover()?;
    Ok(ROOT.set(found).0)
}

#[cfg(feature = "tracefs")]
/// Sets the tracefs root explicitly (e.g. a tracefs mounted elsewhere). Must come before the
/// first [`root`] call and before the first trace marker.
///
/// # Errors
/// [`AlreadyExists`](Kind::AlreadyExists) once a root is in use (set before, or found by
/// [`root`]); [`NoTracefs`](Kind::NoTracefs) if `path` is not a tracefs mount (or does not
/// exist); [`PermissionDenied`](Kind::PermissionDenied) or [`Sys`](Kind::Sys) when `statfs`
/// on it fails otherwise; [`InvalidInput`](Kind::InvalidInput) for a path with a nul byte.
/// The error names `path`.
pub fn set_root(path: impl AsRef<Path>) -> Result<(), Error> {
    let path = path.as_ref();
    let fail = |kind| {
        Error::new(kind)
            .with_op("setting the tracefs root to")
            .with_path(path)
    };
    match is_tracefs(path) {
        Ok(true) => {}
        Ok(false) => return Err(fail(Kind::NoTracefs)),
        Err(e) => return Err(e.with_op("setting the tracefs root to")),
    }
    match ROOT.set(path.to_path_buf()) {
        (_, true) => Ok(()),
        (_, false) => Err(fail(Kind::AlreadyExists("tracefs root already in use"))),
    }
}

#[cfg(feature = "tracefs")]
/// Looks for tracefs (uncached): [`DEFAULT_ROOTS`], then the first `tracefs` mount in
/// `/proc/self/mountinfo`.
///
/// # Errors
/// When no tracefs is found: [`PermissionDenied`](Kind::PermissionDenied) (with the path) if
/// `statfs` on one of [`DEFAULT_ROOTS`] was refused (`EACCES`, `EPERM`), else
/// [`NoTracefs`](Kind::NoTracefs).
pub fn discover() -> Result<PathBuf, Error> {
    let mut denied = None;
    for cand in DEFAULT_ROOTS {
        match is_tracefs(Path::new(cand)) {
            Ok(true) => return Ok(PathBuf::from(cand)),
            Ok(false) => {}
            Err(e) if e.kind() == Kind::PermissionDenied => denied = denied.or(Some(e)),
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
    Err(denied.unwrap_or_else(|| {
        Error::new(Kind::NoTracefs).with_detail(
            "not at /sys/kernel/tracing, /sys/kernel/debug/tracing or in /proc/self/mountinfo",
        )
    }))
}

#[cfg(feature = "tracefs")]
/// Whether `path` is the root of a tracefs mount (by `statfs` magic).
fn is_tracefs(path: &Path) -> Result<bool, Error> {
    let fail = |kind| Error::new(kind).with_op("examining").with_path(path);
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| fail(Kind::InvalidInput("path contains a nul byte")))?;
    match sys::statfs_type(&c) {
        Ok(t) => Ok(t == TRACEFS_MAGIC),
        Err(e) if matches!(e.errno(), Some(libc::ENOENT | libc::ENOTDIR)) => Ok(false),
        Err(e) => Err(Error::io(
            "examining",
            path,
            "statfs",
            "tracefs",
            std::io::Error::from_raw_os_error(e.errno().unwrap_or(0)),
        )),
    }
}
