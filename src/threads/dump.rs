//! All-thread dumps: every thread's name, tid, state, CPU time and symbolized stack, in
//! `dump_stack()`'s frame format, written with `write(2)` from fixed buffers.
//!
//! ```text
//! ------------[ selftrace: all threads ]------------
//! pid 4242, 3 threads, requested by tid 4242 "main"
//!
//! thread "main" tid 4242, state R (running), cpu 0.120s
//! Call Trace:
//!  #0 0x7f0e2a8f1d3a : syscall+0x1a/0x30 [libc.so.6+0x10ed3a]
//!  ...
//!
//! thread "worker" tid 4243, state S (sleeping), cpu 0.001s
//!  no stack (timeout)
//! Objects:
//!  libc.so.6 /lib/x86_64-linux-gnu/libc.so.6 build-id 3f1c...
//! ---[ end of all threads ]---
//! ```
//!
//! # Async-signal safety
//! Everything here is async-signal-safe: the thread list is read with `getdents64`, each stack
//! is requested through [`super::request`], and output goes through fixed buffers and `write(2)`.

use super::proc::{self, ThreadInfo};
use super::request::{self, Answer, Ticket};
pub(crate) use crate::crash::lock::OutputLock;
use crate::crash::report::{call_trace_with_lines, Lines};
pub(crate) use crate::crash::report::{object_line, Out};
use crate::symbolize::{self, FixedBuf};
use crate::sys;

/// The most threads one dump lists (the rest are counted).
pub(crate) const MAX_THREADS: usize = 4096;
/// Requests in flight at once during a dump.
const WINDOW: usize = 16;

/// What one dump saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DumpSummary {
    /// Threads listed.
    pub threads: usize,
    /// Threads whose stack was captured.
    pub stacks: usize,
    /// Threads that did not answer in time (signal blocked, stopped, uninterruptible sleep).
    pub timeouts: usize,
    /// Threads that exited while the dump ran.
    pub gone: usize,
    /// Threads not listed because there were more than the dump holds (4096).
    pub not_listed: usize,
}

/// The objects met in a dump, each listed once at its end.
pub(crate) struct Objects {
    /// (bias, an address in the object)
    seen: [(usize, usize); 32],
    n: usize,
}

impl Objects {
    pub(crate) const fn new() -> Objects {
        Objects {
            seen: [(0, 0); 32],
            n: 0,
        }
    }

    fn add(&mut self, frames: &[usize]) {
        for &addr in frames {
            let Some(s) =
                symbolize::symbolize(addr.saturating_sub(1)).filter(|s| !s.source.is_stale())
            else {
                continue;
            };
            if self.n == self.seen.len() || self.seen[..self.n].iter().any(|e| e.0 == s.bias) {
                continue;
            }
            self.seen[self.n] = (s.bias, addr.saturating_sub(1));
            self.n += 1;
        }
    }

    pub(crate) fn write(&self, out: Out) {
        out.line(|w| w.push_bytes(b"Objects:"));
        for &(_, addr) in &self.seen[..self.n] {
            // (An object unloaded since: not listed, its path would be another's.)
            let Some(s) = symbolize::symbolize(addr).filter(|s| !s.source.is_stale()) else {
                continue;
            };
            object_line(out, &s);
        }
    }
}

/// `thread "worker" tid 4243, state S (sleeping), cpu 0.001s`
pub(crate) fn thread_header(out: Out, tid: i32, info: Option<&ThreadInfo>) {
    out.line(|w| {
        w.push_bytes(b"thread \"");
        w.push_str(info.map_or("?", |i| i.name()));
        w.push_bytes(b"\" tid ");
        w.push_dec(tid as u64);
        if let Some(i) = info {
            w.push_bytes(b", state ");
            w.push_bytes(&[i.state]);
            w.push_bytes(b" (");
            w.push_str(i.state_name());
            w.push_bytes(b")");
            if let Some(ns) = i.cpu_ns {
                w.push_bytes(b", cpu ");
                push_seconds(w, ns);
            }
        }
    });
}

/// `ns` as seconds with three decimals: `1.234s`.
pub(crate) fn push_seconds(w: &mut FixedBuf<'_>, ns: u64) {
    let ms = ns / 1_000_000;
    w.push_dec(ms / 1000);
    w.push_bytes(b".");
    let frac = ms % 1000;
    if frac < 100 {
        w.push_bytes(b"0");
    }
    if frac < 10 {
        w.push_bytes(b"0");
    }
    w.push_dec(frac);
    w.push_bytes(b"s");
}

/// One thread's answer: its stack, or why there is none.
///
/// `lines`: file:line and inlined functions of the frames, where the caller could resolve them
/// (normal context); a dump from a signal handler has none.
pub(crate) fn thread_body(
    out: Out,
    answer: Answer,
    frames: &[usize],
    first_exact: bool,
    objects: &mut Objects,
    lines: Lines<'_>,
) {
    match answer {
        Answer::Frames(n, end) => {
            let f = &frames[..n.min(frames.len())];
            call_trace_with_lines(out, f, first_exact, end, lines);
            objects.add(f);
        }
        Answer::Timeout => out.line(|w| w.push_bytes(b" no stack (timeout)")),
        Answer::Gone => out.line(|w| w.push_bytes(b" no stack (exited)")),
    }
}

/// A request in the dump's window.
#[derive(Clone, Copy)]
enum Pending {
    Empty,
    Posted(Ticket, u64),
    Answered(Answer),
    /// Every slot was busy (other requesters): try again when its turn comes.
    NoSlot,
    /// The dumping thread itself, with the capture signal blocked: captured directly.
    Myself,
}

/// Captures the calling thread's stack without the signal (when it is blocked here).
#[inline(never)]
fn capture_myself(frames: &mut [usize]) -> Answer {
    let walk = crate::Capture::new().walk(frames);
    Answer::Frames(walk.frames, walk.end)
}

/// Posts a request for `tid` (or settles it at once: gone, or the caller itself).
fn post(tid: i32, info: Option<&ThreadInfo>, timeout_ns: u64) -> Pending {
    match info {
        None => return Pending::Answered(Answer::Gone),
        Some(i) if i.state == b'Z' || i.state == b'X' => return Pending::Answered(Answer::Gone),
        _ => {}
    }
    if tid == sys::gettid()
        && sys::is_blocked(request::SIGNAL.load(core::sync::atomic::Ordering::Relaxed))
    {
        return Pending::Myself;
    }
    match request::post(tid) {
        Ok(Some(t)) => Pending::Posted(t, sys::monotonic_ns().saturating_add(timeout_ns)),
        Ok(None) => Pending::NoSlot,
        Err(a) => Pending::Answered(a),
    }
}

/// Settles a window entry into an answer, with its frames in `frames`.
fn settle(p: Pending, tid: i32, timeout_ns: u64, frames: &mut [usize]) -> (Answer, bool) {
    match p {
        Pending::Posted(t, deadline) => (request::wait_one(&t, deadline, frames), true),
        Pending::Answered(a) => (a, true),
        Pending::Myself => (capture_myself(frames), false),
        Pending::Empty => (Answer::Timeout, true),
        Pending::NoSlot => {
            let deadline = sys::monotonic_ns().saturating_add(timeout_ns);
            loop {
                match request::post(tid) {
                    Ok(Some(t)) => return (request::wait_one(&t, deadline, frames), true),
                    Ok(None) if sys::monotonic_ns() < deadline => sys::sleep_ns(1_000_000),
                    Ok(None) => return (Answer::Timeout, true),
                    Err(a) => return (a, true),
                }
            }
        }
    }
}

/// Lists every thread but `skip` (0: none) with its stack. Returns what it saw.
pub(crate) fn threads_section(
    out: Out,
    skip: i32,
    timeout_ns: u64,
    objects: &mut Objects,
) -> DumpSummary {
    let mut tids = [0i32; MAX_THREADS];
    let mut n = 0;
    let mut summary = DumpSummary::default();
    let listed = sys::for_each_task(|t| {
        if t == skip {
            return;
        }
        if n < MAX_THREADS {
            tids[n] = t;
            n += 1;
        } else {
            summary.not_listed += 1;
        }
    });
    if let Err(e) = listed {
        out.line(|w| {
            w.push_bytes(b"cannot list /proc/self/task: errno ");
            w.push_dec(e as u64);
        });
        return summary;
    }
    let tids = &mut tids[..n];
    tids.sort_unstable();
    let mut window = [Pending::Empty; WINDOW];
    let mut infos: [Option<ThreadInfo>; WINDOW] = [None; WINDOW];
    let mut frames = [0usize; request::SLOT_FRAMES];
    let mut posted = 0;
    for printed in 0..n {
        while posted < n && posted - printed < WINDOW {
            let info = proc::info(tids[posted]);
            infos[posted % WINDOW] = info;
            window[posted % WINDOW] = post(tids[posted], info.as_ref(), timeout_ns);
            posted += 1;
        }
        let k = printed % WINDOW;
        let (answer, first_exact) = settle(window[k], tids[printed], timeout_ns, &mut frames);
        window[k] = Pending::Empty;
        out.line(|_| {});
        thread_header(out, tids[printed], infos[k].as_ref());
        thread_body(out, answer, &frames, first_exact, objects, Lines::NONE);
        summary.threads += 1;
        match answer {
            Answer::Frames(..) => summary.stacks += 1,
            Answer::Timeout => summary.timeouts += 1,
            Answer::Gone => summary.gone += 1,
        }
    }
    if summary.not_listed > 0 {
        out.line(|w| {
            w.push_bytes(b"(");
            w.push_dec(summary.not_listed as u64);
            w.push_bytes(b" more threads not listed)");
        });
    }
    summary
}

/// The whole dump, under the output lock.
pub(crate) fn dump_all(fd: i32, timeout_ns: u64) -> DumpSummary {
    let out = Out { fd };
    let lock = OutputLock::acquire();
    out.line(|w| w.push_bytes(b"------------[ selftrace: all threads ]------------"));
    let me = sys::gettid();
    let mine = proc::info(me);
    // Counted before the stacks are asked for; the list below may differ (threads come and go).
    let mut count = 0usize;
    let _ = sys::for_each_task(|_| count += 1);
    out.line(|w| {
        w.push_bytes(b"pid ");
        w.push_dec(sys::getpid() as u64);
        w.push_bytes(b", ");
        w.push_dec(count as u64);
        w.push_bytes(b" threads, requested by tid ");
        w.push_dec(me as u64);
        w.push_bytes(b" \"");
        w.push_str(mine.as_ref().map_or("?", |i| i.name()));
        w.push_bytes(b"\"");
    });
    let mut objects = Objects::new();
    let summary = threads_section(out, 0, timeout_ns, &mut objects);
    objects.write(out);
    out.line(|w| w.push_bytes(b"---[ end of all threads ]---"));
    drop(lock);
    summary
}
