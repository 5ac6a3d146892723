//! What `/proc/self/task/TID/stat` says of a thread: its name and scheduler state; and its CPU
//! time from the thread's CPU clock.
//!
//! # Async-signal safety
//! Everything here is async-signal-safe: the file is read with `open`/`read`/`close` into a
//! stack buffer and parsed in place.

use crate::symbolize::FixedBuf;
use crate::sys;

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
    let mut path = [0u8; 48];
    let mut w = FixedBuf::new(&mut path);
    w.push_bytes(b"/proc/self/task/");
    w.push_dec(tid as u64);
    w.push_bytes(b"/stat\0");
    let len = w.len();
    let path = core::ffi::CStr::from_bytes_with_nul(&path[..len]).ok()?;
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
    let mut path = [0u8; 48];
    let mut w = FixedBuf::new(&mut path);
    w.push_bytes(b"/proc/self/task/");
    w.push_dec(tid as u64);
    w.push_bytes(b"/status\0");
    let len = w.len();
    let path = core::ffi::CStr::from_bytes_with_nul(&path[..len]).ok()?;
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
}
