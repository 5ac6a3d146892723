//! System calls about threads (tasks): signalling one thread, listing `/proc/self/task`,
//! futexes, clocks and signal actions. Every wrapper is async-signal-safe (raw system calls,
//! no allocation, no lock).
#![allow(unsafe_code)]

use core::sync::atomic::AtomicU32;

use crate::error::Error;

/// `tgkill(2)`: sends `sig` to thread `tid` of this process (`sig` 0 only checks that the thread
/// exists). Fails with [`Error::Sys`] `tgkill` and the `errno` (`ESRCH`: no such thread).
///
/// # References
/// tgkill(2)
pub(crate) fn tgkill(tid: i32, sig: i32) -> Result<(), Error> {
    // SAFETY: tgkill has no memory-safety preconditions.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, super::getpid(), tid, sig) };
    if r == 0 {
        Ok(())
    } else {
        Err(Error::last_os("tgkill"))
    }
}

/// `getdents64(2)` on an open directory: fills `buf` with `linux_dirent64` records; returns the
/// number of bytes filled (0 at the end), or [`Error::Sys`] `getdents64`. Retries on `EINTR`.
///
/// # References
/// getdents64(2)
pub(crate) fn getdents64(fd: i32, buf: &mut [u8]) -> Result<usize, Error> {
    loop {
        // SAFETY: buf is valid for writes of buf.len() bytes.
        let r = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = super::errno();
        if e != libc::EINTR {
            return Err(Error::Sys {
                call: "getdents64",
                errno: e,
            });
        }
    }
}

/// Calls `f` with each numeric entry (a thread id) of `/proc/self/task`, read with `open(2)` and
/// `getdents64(2)` into a stack buffer. Fails with the [`Error::Sys`] of the failed call.
pub(crate) fn for_each_task(f: impl FnMut(i32)) -> Result<(), Error> {
    let fd = super::open_cloexec(c"/proc/self/task", libc::O_RDONLY | libc::O_DIRECTORY)?;
    let res = tasks_of(fd, f);
    super::close(fd);
    res
}

/// Like [`for_each_task`] on a `/proc/self/task` directory the caller keeps open: rewinds it
/// and lists it again (the kernel builds the listing afresh on each pass), without the path
/// lookup of an `open`.
pub(crate) fn for_each_task_in(fd: i32, f: impl FnMut(i32)) -> Result<(), Error> {
    // SAFETY: lseek on a descriptor has no memory effects.
    if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
        return Err(Error::last_os("lseek"));
    }
    tasks_of(fd, f)
}

fn tasks_of(fd: i32, mut f: impl FnMut(i32)) -> Result<(), Error> {
    let mut buf = [0u8; 4096];
    loop {
        let n = match getdents64(fd, &mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) => return Err(e),
        };
        let mut off = 0;
        // linux_dirent64: u64 d_ino, i64 d_off, u16 d_reclen, u8 d_type, char d_name[].
        while off + 19 < n {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 || off + reclen > n {
                break;
            }
            let name = &buf[off + 19..off + reclen];
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            if let Some(tid) = parse_decimal(&name[..len]) {
                f(tid);
            }
            off += reclen;
        }
    }
}

/// A positive decimal `i32` (no sign, no spaces), or `None`.
pub(crate) fn parse_decimal(s: &[u8]) -> Option<i32> {
    if s.is_empty() || s.len() > 10 {
        return None;
    }
    let mut v: i64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (b - b'0') as i64;
    }
    i32::try_from(v).ok()
}

/// `FUTEX_WAIT_PRIVATE`: sleeps while `*word == expected`, at most `timeout_ns`. Returns when
/// woken, when the value differs, on a signal (`EINTR`) or at the timeout; the caller re-checks.
///
/// # References
/// futex(2)
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: word is a valid, aligned u32 for the call's duration; ts is a valid timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// `FUTEX_WAKE_PRIVATE`: wakes up to `n` waiters on `word`.
///
/// # References
/// futex(2)
pub(crate) fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: word is a valid, aligned u32; FUTEX_WAKE reads nothing else.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        )
    };
}

/// `clock_gettime(CLOCK_MONOTONIC)` in nanoseconds (the vDSO; async-signal-safe per POSIX).
///
/// # References
/// clock_gettime(2)
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// `sched_yield(2)`: lets another runnable thread run on this CPU (async-signal-safe: a
/// system call that takes no user-space lock).
///
/// # References
/// sched_yield(2)
pub(crate) fn sched_yield() {
    // SAFETY: sched_yield has no preconditions; it cannot fail on Linux.
    unsafe { libc::sched_yield() };
}

/// The CPU time thread `tid` of this process has used, in nanoseconds, from its per-thread CPU
/// clock (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)` of the kernel's `posix-timers.h`, what
/// `pthread_getcpuclockid` returns); `None` if the thread is gone.
///
/// # References
/// clock_gettime(2), pthread_getcpuclockid(3)
pub(crate) fn thread_cpu_ns(tid: i32) -> Option<u64> {
    // CPUCLOCK_PERTHREAD_MASK (4) | CPUCLOCK_SCHED (2), with the inverted tid above bit 3.
    let clock = ((!(tid as u32)) << 3 | 6) as libc::clockid_t;
    clock_ns(clock)
}

/// `clock_gettime(id)` as (seconds, nanoseconds); zeros when it fails.
///
/// # References
/// clock_gettime(2)
pub(crate) fn clock(id: libc::clockid_t) -> (u64, u64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64, ts.tv_nsec as u64)
}

/// `CLOCK_REALTIME` as (seconds, nanoseconds).
///
/// # References
/// clock_gettime(2)
pub(crate) fn realtime() -> (u64, u64) {
    clock(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// `nanosleep(2)` for `ns` nanoseconds; an interrupting signal ends it early.
///
/// # References
/// nanosleep(2)
pub(crate) fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: ts is a valid timespec; the remainder is not wanted.
    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
}

/// The handler currently installed for `sig` (its `sa_sigaction`), or [`Error::Sys`] `sigaction`.
///
/// # References
/// sigaction(2)
pub(crate) fn current_handler(sig: i32) -> Result<usize, Error> {
    // SAFETY: all-zero is a valid sigaction.
    let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: a null new action only queries.
    if unsafe { libc::sigaction(sig, core::ptr::null(), &mut old) } != 0 {
        return Err(Error::last_os("sigaction"));
    }
    Ok(old.sa_sigaction)
}

/// Whether `sig` is blocked in the calling thread's signal mask (`pthread_sigmask(3)` query).
///
/// # References
/// pthread_sigmask(3)
pub(crate) fn is_blocked(sig: i32) -> bool {
    // SAFETY: all-zero is a valid sigset_t; a null new set only queries.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, core::ptr::null(), &mut set);
        libc::sigismember(&set, sig) == 1
    }
}

/// `abort(3)`.
pub(crate) fn abort() -> ! {
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}
