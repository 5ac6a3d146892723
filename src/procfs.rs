//! The one reader of `/proc/self` (and `/sys` CPU lists): what a thread's `task/TID/stat`,
//! `status` and `comm` say (name, scheduler state, whether it can take a signal now), the
//! mappings of `maps`, the online CPUs and the process's start time. Used by the thread dumps,
//! the minidump writer, the watchdog and the profiler.
//!
//! # Async-signal safety
//! Everything here is async-signal-safe: each file is read with `open`/`read`/`close` into a
//! caller's or a stack buffer and parsed in place.
// Without the `threads` feature only the minidump writer's readers are used.
#![cfg_attr(not(feature = "threads"), allow(dead_code))]
#![allow(unsafe_code)]

use crate::symbolize::FixedBuf;
use crate::sys;
use core::ffi::CStr;

/// `/proc/self/task/TID/FILE` and a NUL, built in `buf`; `None` if it does not fit.
fn task_path<'a>(tid: i32, file: &[u8], buf: &'a mut [u8; 64]) -> Option<&'a CStr> {
    let mut w = FixedBuf::new(&mut buf[..]);
    w.push_bytes(b"/proc/self/task/");
    w.push_dec(tid as u64);
    w.push_bytes(b"/");
    w.push_bytes(file);
    w.push_bytes(b"\0");
    let len = w.len();
    CStr::from_bytes_with_nul(&buf[..len]).ok()
}

/// Reads `/proc/self/task/TID/FILE` into `out` (one `read`); the bytes read, 0 if unreadable.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn read_task_file(tid: i32, file: &[u8], out: &mut [u8]) -> usize {
    let mut path = [0u8; 64];
    let Some(path) = task_path(tid, file, &mut path) else {
        return 0;
    };
    let Ok(fd) = sys::open_cloexec(path, libc::O_RDONLY) else {
        return 0;
    };
    let n = sys::read(fd, out).unwrap_or(0);
    sys::close(fd);
    n
}

/// Thread `tid`'s name from `/proc/self/task/TID/comm` into `out`; its length (0 if
/// unreadable).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn thread_name(tid: i32, out: &mut [u8; 16]) -> usize {
    let n = read_task_file(tid, b"comm", out);
    let text = &out[..n];
    text.strip_suffix(b"\n").unwrap_or(text).len()
}

/// What selftrace knows of a thread of this process, read without allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadInfo {
    /// The thread id.
    pub tid: i32,
    name: [u8; 16],
    name_len: u8,
    /// The scheduler state letter of `/proc/PID/task/TID/stat`: `R` running, `S` sleeping,
    /// `D` uninterruptible sleep, `T` stopped, `t` traced, `Z` zombie, `X` dead, `I` idle.
    pub state: u8,
    /// CPU time used so far, in nanoseconds (the thread's CPU clock); `None` if unreadable.
    pub cpu_ns: Option<u64>,
}

impl ThreadInfo {
    /// The thread's name (`comm`, at most 15 bytes; `?` if not valid UTF-8).
    pub fn name(&self) -> &str {
        core::str::from_utf8(&self.name[..self.name_len as usize]).unwrap_or("?")
    }

    /// What the state letter means, in the words of `proc(5)`.
    pub fn state_name(&self) -> &'static str {
        state_name(self.state)
    }
}

/// The meaning of a state letter.
pub(crate) fn state_name(s: u8) -> &'static str {
    match s {
        b'R' => "running",
        b'S' => "sleeping",
        b'D' => "disk sleep",
        b'T' => "stopped",
        b't' => "tracing stop",
        b'Z' => "zombie",
        b'X' => "dead",
        b'I' => "idle",
        b'P' => "parked",
        b'W' => "waking",
        _ => "unknown",
    }
}

/// Reads thread `tid`'s name, state and CPU time; `None` if it does not exist (any more).
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn info(tid: i32) -> Option<ThreadInfo> {
    let mut path = [0u8; 64];
    let path = task_path(tid, b"stat", &mut path)?;
    let fd = sys::open_cloexec(path, libc::O_RDONLY).ok()?;
    let mut buf = [0u8; 512];
    let n = sys::read(fd, &mut buf);
    sys::close(fd);
    let stat = &buf[..n.ok()?];
    let (name, state) = parse_stat(stat)?;
    let mut info = ThreadInfo {
        tid,
        name: [0; 16],
        name_len: name.len().min(16) as u8,
        state,
        cpu_ns: sys::thread_cpu_ns(tid),
    };
    info.name[..info.name_len as usize].copy_from_slice(&name[..info.name_len as usize]);
    Some(info)
}

/// `(comm, state)` from a `stat` line: `tid (comm) S ...` (comm may hold spaces and `)`, so it
/// ends at the last `)`).
fn parse_stat(stat: &[u8]) -> Option<(&[u8], u8)> {
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let state = *stat.get(close + 2)?;
    Some((&stat[open + 1..close], state))
}

/// Why a thread cannot answer a signal now, so that asking it would only wait for a timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoAnswer {
    /// The signal is in the thread's blocked mask (`SigBlk`).
    Blocked,
    /// The signal is ignored process-wide (`SigIgn`: someone set `SIG_IGN` over the handler).
    Ignored,
    /// The thread is stopped or traced (`T`, `t`).
    Stopped,
    /// The stack-request handler is not installed.
    NoHandler,
}

impl NoAnswer {
    /// How a report says it: `request signal blocked`, `stopped`, ...
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NoAnswer::Blocked => "request signal blocked",
            NoAnswer::Ignored => "request signal ignored",
            NoAnswer::Stopped => "stopped",
            NoAnswer::NoHandler => "request handler not installed",
        }
    }
}

/// Whether thread `tid` cannot take signal `sig` now, from `/proc/self/task/TID/status`
/// (`State`, `SigBlk`, `SigIgn`): the one check the text dumps and the minidump writer share
/// before they ask a thread for its stack or registers. `None` when it can (or the file cannot
/// be read: then asking is the only way to know).
///
/// # Async-signal safety
/// Async-signal-safe (`open`/`read`/`close` into a stack buffer).
pub(crate) fn cannot_answer(tid: i32, sig: i32) -> Option<NoAnswer> {
    let mut path = [0u8; 64];
    let path = task_path(tid, b"status", &mut path)?;
    let fd = sys::open_cloexec(path, libc::O_RDONLY).ok()?;
    let mut buf = [0u8; 2048];
    // The fields needed (State, SigBlk, SigIgn) sit in the first ~1.2 KiB; read until full.
    let mut n = 0;
    while n < buf.len() {
        match sys::read(fd, &mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    sys::close(fd);
    status_says_cannot_answer(&buf[..n], sig)
}

/// [`cannot_answer`] from the text of a `status` file.
pub(crate) fn status_says_cannot_answer(status: &[u8], sig: i32) -> Option<NoAnswer> {
    let field = |name: &[u8]| {
        status
            .split(|&b| b == b'\n')
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim_ascii())
    };
    if field(b"State:").is_some_and(|v| v.first().is_some_and(|&c| c == b'T' || c == b't')) {
        return Some(NoAnswer::Stopped);
    }
    if mask_has(field(b"SigBlk:"), sig) {
        return Some(NoAnswer::Blocked);
    }
    if mask_has(field(b"SigIgn:"), sig) {
        return Some(NoAnswer::Ignored);
    }
    None
}

/// Whether a `status` signal mask (hex, signal 1 in the lowest bit) holds `sig`.
fn mask_has(mask: Option<&[u8]>, sig: i32) -> bool {
    let Some(mask) = mask else {
        return false;
    };
    if !(1..=64).contains(&sig) {
        return false;
    }
    let bit = (sig - 1) as usize;
    let digit = match mask
        .len()
        .checked_sub(1 + bit / 4)
        .and_then(|i| mask.get(i))
    {
        Some(&d) => (d as char).to_digit(16).unwrap_or(0),
        None => 0,
    };
    digit & (1 << (bit % 4)) != 0
}

// ---- maps, CPUs, start time ----------------------------------------------------------------

/// Reads `/proc/self/maps` into `maps` (start, end, readable, in the file's order: sorted), at
/// most `maps.len()` of them, through `buf` (a line longer than it is skipped); how many it
/// read.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn load_maps(maps: &mut [(usize, usize, bool)], buf: &mut [u8]) -> usize {
    let mut count = 0;
    let Ok(fd) = sys::open_cloexec(c"/proc/self/maps", libc::O_RDONLY) else {
        return 0;
    };
    let mut have = 0usize;
    loop {
        let n = match sys::read(fd, &mut buf[have..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        have += n;
        let mut used = 0;
        while let Some(nl) = buf[used..have].iter().position(|&b| b == b'\n') {
            if let Some(m) = parse_maps_line(&buf[used..used + nl]) {
                if let Some(slot) = maps.get_mut(count) {
                    *slot = m;
                    count += 1;
                }
            }
            used += nl + 1;
        }
        buf.copy_within(used..have, 0);
        have -= used;
        if have == buf.len() {
            // A line longer than the buffer: skip it.
            have = 0;
        }
    }
    sys::close(fd);
    count
}

/// `(start, end, readable)` of a `/proc/PID/maps` line (`start-end perms ...`).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn parse_maps_line(line: &[u8]) -> Option<(usize, usize, bool)> {
    let hex = |s: &[u8]| -> Option<usize> {
        if s.is_empty() || s.len() > 16 {
            return None;
        }
        s.iter().try_fold(0usize, |acc, &b| {
            let d = (b as char).to_digit(16)? as usize;
            Some((acc << 4) | d)
        })
    };
    let dash = line.iter().position(|&b| b == b'-')?;
    let space = line.iter().position(|&b| b == b' ')?;
    if space < dash {
        return None;
    }
    let start = hex(&line[..dash])?;
    let end = hex(&line[dash + 1..space])?;
    let readable = line.get(space + 1) == Some(&b'r');
    (start < end).then_some((start, end, readable))
}

/// The number of online CPUs, from `/sys/devices/system/cpu/online` ("0-3,8-11").
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn online_cpus() -> u32 {
    let Ok(fd) = sys::open_cloexec(c"/sys/devices/system/cpu/online", libc::O_RDONLY) else {
        return 0;
    };
    let mut buf = [0u8; 256];
    let n = sys::read(fd, &mut buf).unwrap_or(0);
    sys::close(fd);
    count_cpu_list(&buf[..n])
}

/// Counts the CPUs of a kernel CPU list ("0-3,8,10-11").
pub(crate) fn count_cpu_list(list: &[u8]) -> u32 {
    let mut total = 0u32;
    for part in list.split(|&b| b == b',') {
        let part = part.trim_ascii();
        let num = |s: &[u8]| sys::parse_decimal(s).map(|v| v as u32);
        match part.iter().position(|&b| b == b'-') {
            Some(dash) => {
                if let (Some(a), Some(b)) = (num(&part[..dash]), num(&part[dash + 1..])) {
                    total += b.saturating_sub(a) + 1;
                }
            }
            None => {
                if num(part).is_some() {
                    total += 1;
                }
            }
        }
    }
    total
}

/// The process's start time in Unix seconds: `starttime` of `/proc/self/stat` (clock ticks
/// since boot) against `CLOCK_BOOTTIME` and `CLOCK_REALTIME` now.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn start_time() -> Option<u64> {
    let fd = sys::open_cloexec(c"/proc/self/stat", libc::O_RDONLY).ok()?;
    let mut buf = [0u8; 1024];
    let n = sys::read(fd, &mut buf);
    sys::close(fd);
    let stat = &buf[..n.ok()?];
    let close = stat.iter().rposition(|&b| b == b')')?;
    // Field 3 (state) follows ") "; starttime is field 22.
    let field = stat.get(close + 2..)?.split(|&b| b == b' ').nth(19)?;
    let ticks = field.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit()
            .then(|| acc.saturating_mul(10).saturating_add((b - b'0') as u64))
    })?;
    // SAFETY: getauxval reads the auxiliary vector the kernel gave the process.
    let hz = (unsafe { libc::getauxval(libc::AT_CLKTCK) } as u64).max(1);
    let up = sys::clock(libc::CLOCK_BOOTTIME).0;
    let now = sys::realtime().0;
    Some(now.saturating_sub(up.saturating_sub(ticks / hz)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_ignored_and_stopped_threads() {
        let status = |state: &str, blk: &str, ign: &str| {
            format!("Name:\tx\nState:\t{state}\nPid:\t1\nSigBlk:\t{blk}\nSigIgn:\t{ign}\n")
        };
        let rt4 = 38; // SIGRTMIN + 4 on glibc
        let zero = "0000000000000000";
        let s =
            |state, blk, ign| status_says_cannot_answer(status(state, blk, ign).as_bytes(), rt4);
        assert_eq!(s("S (sleeping)", zero, zero), None);
        assert_eq!(
            s("S (sleeping)", "fffffffe7fffffff", zero),
            Some(NoAnswer::Blocked)
        );
        assert_eq!(
            s("S (sleeping)", "0000002000000000", zero),
            Some(NoAnswer::Blocked)
        );
        assert_eq!(s("S (sleeping)", "0000001000000000", zero), None);
        assert_eq!(
            s("S (sleeping)", zero, "0000002000000000"),
            Some(NoAnswer::Ignored)
        );
        assert_eq!(s("t (tracing stop)", "0", zero), Some(NoAnswer::Stopped));
        assert_eq!(status_says_cannot_answer(b"", rt4), None);
    }

    #[test]
    fn own_status() {
        // Under qemu-user the status file is the host thread's: its SigBlk is the emulator's
        // mask, not the guest's (which qemu keeps to itself), so a blocked signal does not
        // show; dumps then wait for such a thread's timeout, as before this check.
        if std::fs::read_to_string("/proc/thread-self/maps").is_ok_and(|m| m.contains("/qemu-")) {
            eprintln!("own_status: skipped under qemu-user (SigBlk is the emulator's mask)");
            return;
        }
        let sig = libc::SIGRTMIN() + 7;
        // SAFETY: plain sigset manipulation of this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = core::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, core::ptr::null_mut());
            assert_eq!(cannot_answer(sys::gettid(), sig), Some(NoAnswer::Blocked));
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, core::ptr::null_mut());
        }
        assert_eq!(cannot_answer(sys::gettid(), sig), None);
    }

    #[test]
    fn stat_with_parentheses_in_the_name() {
        let s = b"4243 (a) b (c)) S 1 2 3";
        assert_eq!(parse_stat(s), Some((&b"a) b (c)"[..], b'S')));
        assert_eq!(parse_stat(b"12 (x"), None);
    }

    #[test]
    fn own_thread() {
        let i = info(sys::gettid()).expect("own stat");
        assert_eq!(i.state, b'R');
        assert!(i.cpu_ns.is_some());
    }

    #[test]
    fn maps_lines() {
        assert_eq!(
            parse_maps_line(b"7ffc2405c000-7ffc2407d000 rw-p 00000000 00:00 0  [stack]"),
            Some((0x7ffc2405c000, 0x7ffc2407d000, true))
        );
        assert_eq!(
            parse_maps_line(b"7f735df7b000-7f735df7c000 ---p 00000000 00:00 0"),
            Some((0x7f735df7b000, 0x7f735df7c000, false))
        );
        assert_eq!(parse_maps_line(b"garbage"), None);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list(b"0-3,8-11\n"), 8);
        assert_eq!(count_cpu_list(b"0\n"), 1);
        assert_eq!(count_cpu_list(b"0-1,3"), 3);
        assert_eq!(count_cpu_list(b""), 0);
    }
}
