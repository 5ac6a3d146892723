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

#[cfg(test)]
mod tests {
    use super::*;

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
