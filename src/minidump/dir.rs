//! The `<uuid>.dmp` lifecycle of dumps written into a directory: the directory opened once
//! (at install time), each dump created exclusively as `<uuid>.dmp.tmp`, then renamed to
//! `<uuid>.dmp` when it was written (or removed when not), so that a reader never takes a dump
//! being written for a finished one.

use super::SUPPORTED;
use super::{Fault, Options, Summary};
use crate::error::Error;
use crate::report::lock::OutputLock;
use crate::symbolize::FixedBuf;
use crate::sys;

/// Opens the directory dumps go to (normal context: at install time); the fd is never closed
/// (a handler may write into it at any time).
///
/// # Errors
/// [`Error::Unsupported`] where dumps are not written, [`Error::Sys`] when it cannot be opened.
pub(crate) fn open_dir(dir: &std::path::Path) -> Result<i32, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    if !SUPPORTED {
        return Err(Error::Unsupported("minidumps on this architecture"));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| Error::from_io("open", &e))?;
    Ok(sys::keep_open(std::os::fd::OwnedFd::from(file)))
}

/// A new file for a dump in `dir_fd`, to be named `<uuid>.dmp` by [`finish_in`]: created
/// exclusively, mode 0600, as `<uuid>.dmp.tmp` (so that a dump being written, or cut short, is
/// never taken for a finished one, by `minidump::upload::send_pending` for one). Returns the fd and
/// writes the final name (NUL-free) into `name`, returning its length too.
///
/// # Errors
/// [`Error::Sys`] `openat` (`EEXIST` when eight random names were all taken).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn create_in(dir_fd: i32, name: &mut [u8; 48]) -> Result<(i32, usize), Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut id = [0u8; 16];
        random(&mut id);
        // A version 4 UUID, as Breakpad names its dumps.
        id[6] = (id[6] & 0x0f) | 0x40;
        id[8] = (id[8] & 0x3f) | 0x80;
        let mut w = FixedBuf::new(&mut name[..]);
        for (k, b) in id.iter().enumerate() {
            if matches!(k, 4 | 6 | 8 | 10) {
                w.push_bytes(b"-");
            }
            let hex = b"0123456789abcdef";
            w.push_bytes(&[hex[(b >> 4) as usize], hex[(b & 15) as usize]]);
        }
        w.push_bytes(b".dmp");
        let len = w.len();
        let tmp = temporary_name(&name[..len]);
        match sys::openat(
            dir_fd,
            nul_terminated(&tmp),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o600,
        ) {
            Ok(fd) => return Ok((fd, len)),
            // Taken: another name, eight times at most.
            Err(e) if e.errno() == Some(libc::EEXIST) && attempt < 8 => {}
            Err(e) => return Err(e),
        }
    }
}

/// `NAME.tmp` and a NUL, for a name from [`create_in`].
fn temporary_name(name: &[u8]) -> [u8; 56] {
    let mut tmp = [0u8; 56];
    let n = name.len().min(48);
    tmp[..n].copy_from_slice(&name[..n]);
    tmp[n..n + 4].copy_from_slice(b".tmp");
    tmp
}

/// Ends a dump made with [`create_in`]: renames `NAME.tmp` to `NAME` when it was written
/// (`ok`), removes it otherwise.
///
/// # Errors
/// [`Error::Sys`] `renameat` or `unlinkat`.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn finish_in(dir_fd: i32, name: &[u8], ok: bool) -> Result<(), Error> {
    let tmp = temporary_name(name);
    let mut done = [0u8; 49];
    let n = name.len().min(48);
    done[..n].copy_from_slice(&name[..n]);
    let tmp = nul_terminated(&tmp);
    if ok {
        sys::renameat(dir_fd, tmp, nul_terminated(&done))
    } else {
        sys::unlinkat(dir_fd, tmp)
    }
}

/// `buf` up to its first NUL as a C string. The names above always have one; without, the
/// empty name makes the call fail (`ENOENT`) rather than anything panic.
fn nul_terminated(buf: &[u8]) -> &core::ffi::CStr {
    core::ffi::CStr::from_bytes_until_nul(buf).unwrap_or(c"")
}

/// Random bytes from `getrandom` (not blocking), or, should that fail, from the clock, pid
/// and tid.
fn random(out: &mut [u8; 16]) {
    if sys::getrandom_nonblock(out) == Ok(out.len()) {
        return;
    }
    let (s, ns) = sys::realtime();
    let mix = s.wrapping_mul(1_000_000_007) ^ ns ^ ((sys::getpid() as u64) << 32);
    out[..8].copy_from_slice(&mix.to_le_bytes());
    out[8..].copy_from_slice(&(sys::gettid() as u64 ^ ns.rotate_left(17)).to_le_bytes());
}

/// One dump in a directory, start to end (the crash handler's and the watchdog's): a new file
/// under a temporary name, the dump written into it under the output lock, `fsync`, then renamed
/// to its `<uuid>.dmp` name, or removed when the dump failed. Async-signal-safe, as
/// [`super::write`] is.
///
/// Writes a minidump into a new file of the directory `dir` (an fd from
/// [`open_dir`]), its name into `name`. Returns the name's length and how the
/// dump went (a failed rename fails it too), or the `errno` when no file could be created.
pub(crate) fn write_in(
    dir: i32,
    name: &mut [u8; 48],
    fault: Option<&Fault>,
    options: &Options,
    timeout_ns: u64,
) -> Result<(usize, Result<Summary, Error>), i32> {
    let (fd, len) = create_in(dir, name).map_err(|e| e.errno().unwrap_or(libc::EIO))?;
    let mut result = {
        // Held already by a crash report (then this takes nothing).
        let _lock = OutputLock::acquire();
        super::write(fd, fault, options, timeout_ns)
    };
    // The dump should survive a power cut; a failed fsync leaves it as good as it was.
    let _ = sys::fsync(fd);
    sys::close(fd);
    if let Err(e) = finish_in(dir, &name[..len], result.is_ok()) {
        if result.is_ok() {
            result = Err(e);
        }
    }
    Ok((len, result))
}
