//! System calls on files and descriptors beyond plain `read`/`write`: the ones a minidump
//! written from a crash handler and the crash symbolizer's pipes need (`openat`, `renameat`,
//! `unlinkat`, `fsync`, `pwrite`, `lseek`, `fcntl`, `pipe2`, `poll`). Each returns the crate's
//! [`Error::Sys`] with its own call name. Every wrapper is async-signal-safe: a raw system
//! call, no allocation, no lock, no panic.
#![allow(unsafe_code)]

use core::ffi::CStr;

use crate::error::Error;

/// `openat(2)` of `path` relative to the directory `dir`. Returns the fd or [`Error::Sys`]
/// `openat`.
///
/// # References
/// openat(2)
pub(crate) fn openat(dir: i32, path: &CStr, flags: i32, mode: libc::mode_t) -> Result<i32, Error> {
    // SAFETY: path is NUL-terminated and outlives the call; no other memory effects.
    let fd = unsafe { libc::openat(dir, path.as_ptr(), flags, mode) };
    if fd >= 0 {
        Ok(fd)
    } else {
        Err(Error::last_os("openat"))
    }
}

/// `renameat(2)` of `from` to `to`, both relative to the directory `dir`. Fails with
/// [`Error::Sys`] `renameat`.
///
/// # References
/// renameat(2)
pub(crate) fn renameat(dir: i32, from: &CStr, to: &CStr) -> Result<(), Error> {
    // SAFETY: both names are NUL-terminated and outlive the call; no other memory effects.
    if unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(Error::last_os("renameat"))
    }
}

/// `unlinkat(2)` of the file `path` relative to the directory `dir`. Fails with
/// [`Error::Sys`] `unlinkat`.
///
/// # References
/// unlinkat(2)
pub(crate) fn unlinkat(dir: i32, path: &CStr) -> Result<(), Error> {
    // SAFETY: path is NUL-terminated and outlives the call; no other memory effects.
    if unsafe { libc::unlinkat(dir, path.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(Error::last_os("unlinkat"))
    }
}

/// `fsync(2)`: flushes `fd`'s data and metadata to the device. Fails with [`Error::Sys`]
/// `fsync`.
///
/// # References
/// fsync(2)
pub(crate) fn fsync(fd: i32) -> Result<(), Error> {
    // SAFETY: fsync has no memory effects.
    if unsafe { libc::fsync(fd) } == 0 {
        Ok(())
    } else {
        Err(Error::last_os("fsync"))
    }
}

/// One `pwrite(2)` of `buf` at `offset` (no retry: the caller decides on `EINTR` and short
/// writes). Returns the count written or [`Error::Sys`] `pwrite`.
///
/// # References
/// pwrite(2)
pub(crate) fn pwrite(fd: i32, buf: &[u8], offset: i64) -> Result<usize, Error> {
    // SAFETY: buf is readable for its length; pwrite has no other memory effects.
    let n = unsafe { libc::pwrite64(fd, buf.as_ptr().cast(), buf.len(), offset) };
    if n >= 0 {
        Ok(n as usize)
    } else {
        Err(Error::last_os("pwrite"))
    }
}

/// `lseek(2)`: moves `fd`'s position (`whence`: `SEEK_SET`, `SEEK_CUR`, ...). Returns the new
/// position or [`Error::Sys`] `lseek` (`ESPIPE` on a pipe or socket).
///
/// # References
/// lseek(2)
pub(crate) fn lseek(fd: i32, offset: i64, whence: i32) -> Result<i64, Error> {
    // SAFETY: lseek has no memory effects.
    let at = unsafe { libc::lseek64(fd, offset, whence) };
    if at >= 0 {
        Ok(at)
    } else {
        Err(Error::last_os("lseek"))
    }
}

/// `memfd_create(2)` with `MFD_CLOEXEC`: an anonymous in-memory file named `name` (shown in
/// `/proc/self/fd`), or [`Error::Sys`] `memfd_create` (`ENOSYS` before Linux 3.17, `EPERM`
/// under a seccomp filter).
///
/// # References
/// memfd_create(2)
#[cfg_attr(not(feature = "threads"), allow(dead_code))] // Used by threads::dump_all_to.
pub(crate) fn memfd_create(name: &core::ffi::CStr) -> Result<std::os::fd::OwnedFd, Error> {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name and valid flags; no memory effects otherwise.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::last_os("memfd_create"));
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `fcntl(2)` `F_GETFL`: `fd`'s file status flags and access mode, or [`Error::Sys`] `fcntl`.
///
/// # References
/// fcntl(2)
pub(crate) fn status_flags(fd: i32) -> Result<i32, Error> {
    // SAFETY: F_GETFL reads the descriptor's flags; no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags >= 0 {
        Ok(flags)
    } else {
        Err(Error::last_os("fcntl"))
    }
}

/// `pipe2(2)` with `O_CLOEXEC`: a new pipe as `[read end, write end]`, or [`Error::Sys`]
/// `pipe2`.
///
/// # References
/// pipe2(2)
pub(crate) fn pipe_cloexec() -> Result<[i32; 2], Error> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
        Ok(fds)
    } else {
        Err(Error::last_os("pipe2"))
    }
}

/// One `poll(2)` of `fd` for `events`, waiting at most `timeout_ms` (no retry on `EINTR`: the
/// caller decides with the time it has left). Returns the returned events (0 when the time ran
/// out) or [`Error::Sys`] `poll`.
///
/// # References
/// poll(2)
pub(crate) fn poll_one(fd: i32, events: i16, timeout_ms: i32) -> Result<i16, Error> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd for the call.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    match r {
        r if r > 0 => Ok(p.revents),
        0 => Ok(0),
        _ => Err(Error::last_os("poll")),
    }
}

/// [`super::write_all`] with `SIGPIPE` blocked in the calling thread, so that a pipe whose
/// reader is gone fails with `EPIPE` instead of killing the process; a `SIGPIPE` the write left
/// pending is consumed, and the thread's mask put back.
///
/// # References
/// pthread_sigmask(3), sigtimedwait(2)
pub(crate) fn write_all_without_sigpipe(fd: i32, msg: &[u8]) -> Result<(), Error> {
    // SAFETY: sigset manipulation and pthread_sigmask/sigtimedwait are async-signal-safe; all
    // sets are valid.
    unsafe {
        let mut pipe: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old);
        let r = super::write_all(fd, msg);
        if r.is_err() {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&pipe, core::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        r
    }
}
