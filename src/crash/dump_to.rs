//! Where the crash's minidump goes ([`super::Builder::minidump`],
//! [`super::Builder::minidump_fd`]): the destination set at install, and writing the dump
//! there from the report (a new file of the directory, or the file given), with the line that
//! says where it went.

use super::oops::push_error;
use crate::error::Error;
use crate::report::Out;
use crate::sys;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

/// Where crash dumps go.
#[derive(Clone, Debug)]
pub(super) enum MinidumpTo {
    Dir(PathBuf),
    Fd(Arc<OwnedFd>),
}

/// The directory crash dumps go to (-1: none).
static MINIDUMP_DIR: AtomicI32 = AtomicI32::new(-1);
/// The file crash dumps go to (-1: none).
static MINIDUMP_FD: AtomicI32 = AtomicI32::new(-1);
static MINIDUMP_STACK: AtomicUsize = AtomicUsize::new(crate::minidump::DEFAULT_STACK_SIZE);
static MINIDUMP_ENVIRON: AtomicBool = AtomicBool::new(false);
/// The directory's path as given, for the report (`MINIDUMP_DIR_LEN` bytes; atomics, since a
/// second install may write it while a crash reads it).
static MINIDUMP_DIR_PATH: [AtomicU8; 512] = [const { AtomicU8::new(0) }; 512];
static MINIDUMP_DIR_LEN: AtomicUsize = AtomicUsize::new(0);

pub(super) fn install_minidump(
    to: &MinidumpTo,
    options: crate::minidump::Options,
) -> Result<(), Error> {
    if !crate::minidump::SUPPORTED {
        return Err(Error::Unsupported("minidumps on this architecture"));
    }
    options.check()?;
    #[cfg(feature = "threads")]
    crate::threads::install()?;
    MINIDUMP_STACK.store(options.get_stack_size(), Ordering::Relaxed);
    MINIDUMP_ENVIRON.store(options.get_environ(), Ordering::Relaxed);
    match to {
        MinidumpTo::Dir(dir) => {
            let dir_fd = crate::minidump::open_dir(dir)?;
            let path = dir.as_os_str().as_bytes();
            let len = path.len().min(512);
            for (slot, &b) in MINIDUMP_DIR_PATH.iter().zip(&path[..len]) {
                slot.store(b, Ordering::Relaxed);
            }
            MINIDUMP_DIR_LEN.store(len, Ordering::Release);
            // The one before is never closed: a handler may be using it.
            MINIDUMP_DIR.store(dir_fd, Ordering::Release);
            MINIDUMP_FD.store(-1, Ordering::Release);
        }
        MinidumpTo::Fd(fd) => {
            if sys::lseek(fd.as_raw_fd(), 0, libc::SEEK_CUR).is_err() {
                return Err(Error::InvalidInput(
                    "a minidump needs a seekable file, not a pipe or socket",
                ));
            }
            if crate::minidump::appends(fd.as_raw_fd()) {
                return Err(Error::InvalidInput(
                    "a minidump cannot be written to an O_APPEND file (pwrite would append)",
                ));
            }
            MINIDUMP_FD.store(sys::keep_open(Arc::clone(fd)), Ordering::Release);
            MINIDUMP_DIR.store(-1, Ordering::Release);
        }
    }
    Ok(())
}

/// Writes the crash's minidump, if configured, and says so in the report.
pub(super) fn write_minidump(out: Out, fault: &crate::minidump::Fault) {
    let dir = MINIDUMP_DIR.load(Ordering::Acquire);
    let file = MINIDUMP_FD.load(Ordering::Acquire);
    if dir < 0 && file < 0 {
        return;
    }
    let mut name = [0u8; 48];
    let options = crate::minidump::Options::new()
        .stack_size(MINIDUMP_STACK.load(Ordering::Relaxed))
        .environ(MINIDUMP_ENVIRON.load(Ordering::Relaxed));
    #[cfg(feature = "threads")]
    let timeout = crate::threads::timeout().as_nanos() as u64;
    #[cfg(not(feature = "threads"))]
    let timeout = 0;
    let (name_len, result) = if dir >= 0 {
        match crate::minidump::write_in(dir, &mut name, Some(fault), &options, timeout) {
            Ok(written) => written,
            Err(errno) => {
                out.line(|w| {
                    w.push_bytes(b"minidump: not written: cannot create a file: errno ");
                    w.push_dec(errno as u64);
                });
                return;
            }
        }
    } else {
        (
            0,
            crate::minidump::write(file, Some(fault), &options, timeout),
        )
    };
    out.line(|w| {
        match result {
            Ok(s) => {
                w.push_bytes(b"minidump: ");
                if dir >= 0 {
                    let len = MINIDUMP_DIR_LEN.load(Ordering::Acquire);
                    for b in &MINIDUMP_DIR_PATH[..len] {
                        w.push_bytes(&[b.load(Ordering::Relaxed)]);
                    }
                    w.push_bytes(b"/");
                    w.push_bytes(&name[..name_len]);
                } else {
                    w.push_bytes(b"fd ");
                    w.push_dec(file as u64);
                }
                w.push_bytes(b" (");
                w.push_dec(s.threads() as u64);
                w.push_bytes(b" threads, ");
                if s.threads_left_out() > 0 {
                    w.push_dec(s.threads_left_out() as u64);
                    w.push_bytes(b" more left out (a dump holds at most ");
                    w.push_dec(crate::minidump::MAX_THREADS as u64);
                    w.push_bytes(b"), ");
                }
                w.push_dec(s.threads_with_context() as u64);
                w.push_bytes(b" with registers and stack, ");
                w.push_dec(s.modules() as u64);
                w.push_bytes(b" modules, ");
                w.push_dec(s.bytes());
                w.push_bytes(b" bytes)");
            }
            Err(e) => {
                w.push_bytes(b"minidump: not written: ");
                push_error(w, e);
            }
        };
    });
}

/// Whether crash dumps are configured ([`super::Builder::minidump`],
/// [`super::Builder::minidump_fd`]).
#[cfg(feature = "threads")]
pub(crate) fn minidump_configured() -> bool {
    MINIDUMP_DIR.load(Ordering::Relaxed) >= 0 || MINIDUMP_FD.load(Ordering::Relaxed) >= 0
}
