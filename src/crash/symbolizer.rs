//! file:line for crash reports, from a symbolizer process forked at install time.
//!
//! DWARF line tables cannot be parsed safely in a signal handler (parsing allocates, and the
//! allocator may be the thing that crashed). So [`spawn`] forks, before any crash, a child that
//! shares the parent's address space layout as of the fork, and waits on a pipe. The handler
//! sends it the raw addresses of the crashing stack (a `write(2)`), and reads back, with a
//! timeout (`poll(2)`), `file:line:column` and inlined frames for each. If the child is gone or
//! slow, the report keeps its async-signal-safe names and `[object+offset]`.
//!
//! Limits: objects loaded after `install()` are not mapped in the child (their frames get no
//! file:line); the child is a fork of a possibly multi-threaded process, so `install()` should
//! run early, before threads hold locks (the child only uses the allocator, addr2line and
//! `write(2)`); the child dies with the thread that installed (`PR_SET_PDEATHSIG`) and when the
//! parent's end of the pipe closes.
#![allow(unsafe_code)]

use crate::report::lines::{describe, Explained};
use crate::symbolize::BacktraceFrame;
use crate::sys;
use crate::unwind::{FrameKind, FrameKinds};
use core::sync::atomic::{AtomicI32, Ordering};

static REQ_FD: AtomicI32 = AtomicI32::new(-1);
static RESP_FD: AtomicI32 = AtomicI32::new(-1);

/// How long a report waits for the symbolizer in all.
static TIMEOUT_MS: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(3000);

/// Sets how long a report waits for the answers (see `Builder::symbolizer_timeout`).
pub(crate) fn set_timeout(t: std::time::Duration) {
    let ms = t.as_millis().min(i32::MAX as u128) as i32;
    TIMEOUT_MS.store(ms, core::sync::atomic::Ordering::Relaxed);
}
/// Frames sent to the symbolizer per report.
pub(crate) const MAX_FRAMES: usize = 128;

/// Forks the symbolizer child (once). Normal context.
pub(crate) fn spawn() -> Result<(), crate::error::Error> {
    if REQ_FD.load(Ordering::Relaxed) >= 0 {
        return Ok(());
    }
    let req = sys::pipe_cloexec()?;
    let resp = match sys::pipe_cloexec() {
        Ok(fds) => fds,
        Err(e) => {
            sys::close(req[0]);
            sys::close(req[1]);
            return Err(e);
        }
    };
    // SAFETY: the child only runs `child_main` (the allocator, addr2line and write(2), as the
    // module docs say) and leaves with _exit.
    let pid = unsafe { sys::fork() }?;
    if pid == 0 {
        // The parent's ends closed in the child.
        sys::close(req[1]);
        sys::close(resp[0]);
        sys::set_parent_death_signal(libc::SIGKILL);
        for sig in super::DEFAULT_SIGNALS {
            sys::set_default_action(sig);
        }
        name_this_process();
        child_main(req[0], resp[1]);
        // Leave without running the parent's atexit handlers or destructors.
        sys::exit_now(0);
    }
    // The child's ends closed in the parent.
    sys::close(req[0]);
    sys::close(resp[1]);
    REQ_FD.store(req[1], Ordering::Relaxed);
    RESP_FD.store(resp[0], Ordering::Relaxed);
    FORKED_AWAY.store(false, Ordering::Relaxed);
    Ok(())
}

/// In a forked child: forgets the parent's symbolizer (closing the child's copies of its
/// pipes): it answers the parent, and a child's request on the shared pipes could take the
/// parent's answers, or give the parent the child's. The next `spawn` (a new `install`) forks
/// one for the child.
pub(crate) fn after_fork() {
    for fd in [&REQ_FD, &RESP_FD] {
        let f = fd.swap(-1, Ordering::Relaxed);
        if f >= 0 {
            sys::close(f);
            FORKED_AWAY.store(true, Ordering::Relaxed);
        }
    }
}

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::CRASH, after_fork);

/// Set in a forked child that let the parent's symbolizer go (cleared by a `spawn` of its own).
static FORKED_AWAY: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Whether this process is a forked child without a symbolizer of its own while its parent had
/// one (its reports say why they have no file:line).
pub(crate) fn forked_away() -> bool {
    FORKED_AWAY.load(Ordering::Relaxed)
}

/// What `ps` shows for the symbolizer: its thread name (`comm`) and its command line.
const COMM: &core::ffi::CStr = c"selftrace-sym";
const CMDLINE: &[u8] = b"selftrace-symbolizer";

/// Names the symbolizer process, so that `ps` and `top` tell it from the program it serves (a
/// fork has the program's name and command line): `PR_SET_NAME`, and its command line
/// rewritten in place (the memory `/proc/PID/cmdline` reads, between `arg_start` and `arg_end`
/// of `/proc/self/stat`; this process's own copy after the fork).
fn name_this_process() {
    sys::set_thread_name(COMM);
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    // Fields after the command name (which may hold spaces): state is field 3; arg_start and
    // arg_end are fields 48 and 49 (proc(5)).
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return;
    };
    let fields: Vec<&str> = rest.split(' ').collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<usize>().ok());
    let (Some(start), Some(end)) = (field(48), field(49)) else {
        return;
    };
    if end <= start || end - start > 1 << 20 {
        return;
    }
    let len = end - start;
    let n = CMDLINE.len().min(len - 1);
    // SAFETY: [start, end) is this process's argument area (the kernel's mm->arg_start and
    // arg_end), mapped and writable on the initial stack; this single-threaded child owns its
    // copy, and nothing in it reads the arguments again.
    unsafe {
        let area = core::slice::from_raw_parts_mut(start as *mut u8, len);
        area[..n].copy_from_slice(&CMDLINE[..n]);
        area[n..].fill(0);
    }
}

fn read_exact(fd: i32, mut buf: &mut [u8]) -> bool {
    while !buf.is_empty() {
        // sys::read retries on EINTR; an error or the end of the pipe ends the exchange.
        match sys::read(fd, buf) {
            Ok(n) if n > 0 => buf = &mut buf[n..],
            _ => return false,
        }
    }
    true
}

/// The child: answers requests until the pipe closes.
fn child_main(req: i32, resp: i32) {
    loop {
        let mut head = [0u8; 4];
        if !read_exact(req, &mut head) {
            return;
        }
        let n = u32::from_le_bytes(head) as usize;
        let mut reply = Vec::new();
        let mut explained = Explained::default();
        for _ in 0..n {
            let mut item = [0u8; 9];
            if !read_exact(req, &mut item) {
                return;
            }
            let addr = u64::from_le_bytes(item[..8].try_into().unwrap_or_default()) as usize;
            let kind = if item[8] == 1 {
                FrameKind::Exact
            } else {
                FrameKind::Return
            };
            let text = describe(&BacktraceFrame::resolve(addr, kind), &mut explained);
            reply.extend_from_slice(&(text.len() as u32).to_le_bytes());
            reply.extend_from_slice(text.as_bytes());
        }
        if sys::write_all(resp, &reply).is_err() {
            return;
        }
    }
}

/// Asks the symbolizer about the frames at `indices` of `frames` (at most [`MAX_FRAMES`]);
/// writes the answers into `text` and their `(start, len)` into `spans`, in the order of
/// `indices`, each sent with its kind from the walk's record `kinds` (the symbolizer process
/// reads no code to tell it). Returns how many were answered (0 when there is no symbolizer or
/// it timed out).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn ask(
    frames: &[usize],
    indices: &[usize],
    kinds: FrameKinds,
    text: &mut [u8],
    spans: &mut [(u32, u32); MAX_FRAMES],
) -> usize {
    let (req, resp) = (
        REQ_FD.load(Ordering::Relaxed),
        RESP_FD.load(Ordering::Relaxed),
    );
    if req < 0 || resp < 0 {
        return 0;
    }
    let n = indices.len().min(MAX_FRAMES);
    let mut msg = [0u8; 4 + 9 * MAX_FRAMES];
    msg[..4].copy_from_slice(&(n as u32).to_le_bytes());
    for (j, &i) in indices.iter().take(n).enumerate() {
        let addr = frames.get(i).copied().unwrap_or(0);
        let kind = kinds.kind(frames, i);
        let at = 4 + 9 * j;
        msg[at..at + 8].copy_from_slice(&(addr as u64).to_le_bytes());
        msg[at + 8] = u8::from(kind == FrameKind::Exact);
    }
    if !send(req, &msg[..4 + 9 * n]) {
        return 0;
    }
    let mut used = 0usize;
    let mut answered = 0usize;
    let mut waited = 0;
    let mut pending = [0u8; 4];
    while answered < n {
        if !wait_readable(resp, &mut waited) || !read_exact(resp, &mut pending) {
            return answered;
        }
        let len = u32::from_le_bytes(pending) as usize;
        let room = text.len().saturating_sub(used);
        let take = len.min(room);
        if !read_exact(resp, &mut text[used..used + take]) {
            return answered;
        }
        // Drain what did not fit.
        let mut rest = len - take;
        let mut sink = [0u8; 256];
        while rest > 0 {
            let k = rest.min(sink.len());
            if !read_exact(resp, &mut sink[..k]) {
                return answered;
            }
            rest -= k;
        }
        spans[answered] = (used as u32, take as u32);
        used += take;
        answered += 1;
    }
    answered
}

/// Writes `msg` to the pipe `fd` with SIGPIPE blocked, so that a dead symbolizer gives
/// `EPIPE` instead of killing the process by SIGPIPE; a SIGPIPE left pending is consumed.
fn send(fd: i32, msg: &[u8]) -> bool {
    sys::write_all_without_sigpipe(fd, msg).is_ok()
}

/// Waits until `fd` is readable, within what is left of [`TIMEOUT_MS`].
fn wait_readable(fd: i32, waited: &mut i32) -> bool {
    loop {
        let left = TIMEOUT_MS.load(core::sync::atomic::Ordering::Relaxed) - *waited;
        if left <= 0 {
            return false;
        }
        let t0 = sys::monotonic_ns();
        let r = sys::poll_one(fd, libc::POLLIN, left);
        let ms = (sys::monotonic_ns().saturating_sub(t0) / 1_000_000).min(i32::MAX as u64) as i32;
        *waited += ms.max(1);
        match r {
            // No events: the time ran out.
            Ok(revents) => return revents & libc::POLLIN != 0,
            Err(e) if e.errno() == Some(libc::EINTR) => continue,
            Err(_) => return false,
        }
    }
}
