//! System calls about the process as a whole: what the minidump's system streams read
//! (`uname`, `getrusage`), random bytes for dump names (`getrandom`), and what the crash
//! symbolizer needs to fork a child and set it up (`fork`, `prctl`, `signal`, `_exit`). Each
//! returns the crate's [`Error::Sys`] with its own call name where the call can fail.
//!
//! `uname`, `getrusage`, `getrandom`, `prctl`, `signal` and `_exit` are async-signal-safe
//! (raw system calls, no allocation, no lock, no panic); `fork` is called in normal context
//! only.
#![allow(unsafe_code)]

use core::ffi::CStr;

use crate::error::Error;

/// `uname(2)`: the kernel's name, release, version and machine, or [`Error::Sys`] `uname`.
///
/// # References
/// uname(2)
pub(crate) fn uname() -> Result<libc::utsname, Error> {
    // SAFETY: all-zero is a valid utsname; uname fills it.
    let mut uts: libc::utsname = unsafe { core::mem::zeroed() };
    // SAFETY: uts is valid for writing.
    if unsafe { libc::uname(&mut uts) } == 0 {
        Ok(uts)
    } else {
        Err(Error::last_os("uname"))
    }
}

/// `getrusage(2)` of the whole process (`RUSAGE_SELF`), or [`Error::Sys`] `getrusage`.
///
/// # References
/// getrusage(2)
pub(crate) fn getrusage_self() -> Result<libc::rusage, Error> {
    // SAFETY: all-zero is a valid rusage; getrusage fills it.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: ru is valid for writing.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
        Ok(ru)
    } else {
        Err(Error::last_os("getrusage"))
    }
}

/// `getrandom(2)` with `GRND_NONBLOCK` (never waits for the entropy pool): fills `out`.
/// Returns how many bytes it wrote or [`Error::Sys`] `getrandom`. A raw system call (glibc's
/// wrapper is newer than some of the systems this runs on).
///
/// # References
/// getrandom(2)
pub(crate) fn getrandom_nonblock(out: &mut [u8]) -> Result<usize, Error> {
    // SAFETY: out is writable for its length; GRND_NONBLOCK never waits.
    let got = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            out.as_mut_ptr(),
            out.len(),
            libc::GRND_NONBLOCK,
        )
    };
    if got >= 0 {
        Ok(got as usize)
    } else {
        Err(Error::last_os("getrandom"))
    }
}

/// `fork(2)`: the child's pid in the parent, 0 in the child, or [`Error::Sys`] `fork`. Normal
/// context only.
///
/// # Safety
/// In a multi-threaded process the child has only the calling thread: until it `exec`s or
/// `_exit`s, it must not rely on a lock another thread may have held at the fork.
///
/// # References
/// fork(2)
pub(crate) unsafe fn fork() -> Result<i32, Error> {
    // SAFETY: the caller keeps the child to what is safe after a fork.
    let pid = unsafe { libc::fork() };
    if pid >= 0 {
        Ok(pid)
    } else {
        Err(Error::last_os("fork"))
    }
}

/// `_exit(2)`: ends the process at once, without atexit handlers or destructors.
///
/// # References
/// _exit(2)
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(code) }
}

/// `prctl(PR_SET_PDEATHSIG)`: `sig` is sent to this process when the thread that created it
/// ends. The result is ignored (the call cannot fail with a valid signal).
///
/// # References
/// prctl(2)
pub(crate) fn set_parent_death_signal(sig: i32) {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number; no memory effects.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig) };
}

/// `prctl(PR_SET_NAME)`: the calling thread's name (`comm`, at most 15 bytes kept). The result
/// is ignored (the call cannot fail with a valid string).
///
/// # References
/// prctl(2)
pub(crate) fn set_thread_name(name: &CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string (at most 16 bytes of it).
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// `signal(sig, SIG_DFL)`: the default action back for `sig`, for a child that must not run the
/// parent's handlers (the result is ignored: it fails only for an invalid signal).
///
/// # References
/// signal(2)
pub(crate) fn set_default_action(sig: i32) {
    // SAFETY: installs SIG_DFL; no handler code of ours is involved.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}
