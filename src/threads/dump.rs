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

use super::request::{self, Answer, Ticket};
use crate::procfs::{self as proc, NoAnswer, ThreadInfo};
use crate::report::lock::OutputLock;
use crate::report::{self, call_trace_with_lines, Lines, Objects, Out};
use crate::sys;

/// The most threads one dump lists (the rest are counted).
pub(crate) const MAX_THREADS: usize = 4096;
/// Requests in flight at once during a dump.
const WINDOW: usize = 16;
/// All the threads of one dump together wait at most this many times one thread's timeout
/// for answers (as the minidump writer does); past that, each thread still asked gets
/// [`GRACE_NS`], so a dump ends in bounded time whatever the threads do.
const OVERALL_TIMEOUTS: u64 = 4;
/// How long a thread has to answer when its `/proc` status says it cannot (the request signal
/// blocked, stopped: often for good, but also for a moment, as while it runs the handler of
/// another request, which blocks the signal until it returns), or when it is asked after the
/// dump's overall deadline. [`WINDOW`] of them wait at once: 1,000 threads that block the
/// signal for good cost about 1.3 s.
const GRACE_NS: u64 = 20_000_000;

/// What one dump saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DumpSummary {
    /// Threads listed.
    pub threads: usize,
    /// Threads whose stack was captured.
    pub stacks: usize,
    /// Threads that did not answer in time (uninterruptible sleep, a handler that does not
    /// return, the dump's overall deadline passed).
    pub timeouts: usize,
    /// Threads that did not answer and could not: the request signal blocked or ignored in
    /// them, or stopped (their `/proc` status said so before they were asked); listed with the
    /// reason (`no stack (request signal blocked)`) after a short grace instead of the timeout.
    pub could_not_answer: usize,
    /// Threads that exited while the dump ran.
    pub gone: usize,
    /// Threads not listed because there were more than the dump holds (4096).
    pub not_listed: usize,
}

/// `thread "worker" tid 4243, state S (sleeping), cpu 0.001s` from what `/proc` said of it.
pub(crate) fn thread_header(out: Out, tid: i32, info: Option<&ThreadInfo>) {
    let state = info.map(|i| (i.state, i.state_name()));
    let name = info.map_or("?", |i| i.name());
    report::thread_header(out, tid, name, state, info.and_then(|i| i.cpu_ns));
}

/// One thread's answer: its stack, or why there is none.
///
/// `lines`: file:line and inlined functions of the frames, where the caller could resolve them
/// (normal context); a dump from a signal handler has none.
pub(crate) fn thread_body(
    out: Out,
    answer: Answer,
    frames: &[usize],
    objects: &mut Objects,
    lines: Lines<'_>,
) {
    match answer {
        Answer::Frames(n, end, kinds) => {
            let f = &frames[..n.min(frames.len())];
            call_trace_with_lines(out, f, kinds.truncated(f.len()), end, lines);
            objects.add(f);
        }
        Answer::Timeout => out.line(|w| w.push_bytes(b" no stack (timeout)")),
        Answer::Gone => out.line(|w| w.push_bytes(b" no stack (exited)")),
        Answer::Cannot(why) => out.line(|w| {
            w.push_bytes(b" no stack (");
            w.push_str(why.as_str());
            w.push_bytes(b")");
        }),
    }
}

/// A request in the dump's window.
#[derive(Clone, Copy)]
enum Pending {
    Empty,
    /// Asked, until the deadline; if it does not answer, why it could not (from its status).
    Posted(Ticket, u64, Option<NoAnswer>),
    Answered(Answer),
    /// Every slot was busy (other requesters): try again when its turn comes.
    NoSlot(Option<NoAnswer>),
    /// The dumping thread itself, with the capture signal blocked: captured directly.
    Myself,
}

/// Captures the calling thread's stack without the signal (when it is blocked here).
#[inline(never)]
fn capture_myself(frames: &mut [usize]) -> Answer {
    let walk = crate::unwind::Capture::new().walk(frames);
    Answer::Frames(walk.frames, walk.end, walk.frame_kinds())
}

/// The deadline of a request posted now: its own timeout, cut at the dump's overall deadline
/// (but at least [`GRACE_NS`]); only [`GRACE_NS`] for a thread whose status says it cannot
/// answer (`why`).
fn deadline(timeout_ns: u64, overall: u64, why: Option<NoAnswer>) -> u64 {
    let now = sys::monotonic_ns();
    let grace = now.saturating_add(GRACE_NS);
    if why.is_some() {
        return grace.min(now.saturating_add(timeout_ns));
    }
    now.saturating_add(timeout_ns).min(overall.max(grace))
}

/// A request's answer, with a timeout told apart when the thread's status said why it could
/// not answer.
fn explained(a: Answer, why: Option<NoAnswer>) -> Answer {
    match (a, why) {
        (Answer::Timeout, Some(why)) => Answer::Cannot(why),
        (a, _) => a,
    }
}

/// Posts a request for `tid` (or settles it at once: gone, cannot answer, or the caller
/// itself, captured already when `mine`).
fn post(tid: i32, info: Option<&ThreadInfo>, timeout_ns: u64, overall: u64, mine: bool) -> Pending {
    match info {
        None => return Pending::Answered(Answer::Gone),
        Some(i) if i.state == b'Z' || i.state == b'X' => return Pending::Answered(Answer::Gone),
        _ => {}
    }
    if tid == sys::gettid()
        && (mine || sys::is_blocked(request::SIGNAL.load(core::sync::atomic::Ordering::Relaxed)))
    {
        return Pending::Myself;
    }
    // A thread that blocks the signal (or is stopped) would make us wait for the deadline: it
    // only gets a grace, in case it blocks the signal for a moment.
    let why = super::cannot_answer(tid);
    if why == Some(NoAnswer::NoHandler) {
        return Pending::Answered(Answer::Cannot(NoAnswer::NoHandler));
    }
    match request::post(tid) {
        Ok(Some(t)) => Pending::Posted(t, deadline(timeout_ns, overall, why), why),
        Ok(None) => Pending::NoSlot(why),
        Err(a) => Pending::Answered(explained(a, why)),
    }
}

/// Settles a window entry into an answer, with its frames in `frames`.
fn settle(
    p: Pending,
    tid: i32,
    timeout_ns: u64,
    overall: u64,
    frames: &mut [usize],
    mine: Option<Mine<'_>>,
) -> Answer {
    match p {
        Pending::Posted(t, grace, Some(why)) => {
            // A thread whose status said it blocks the signal gets a grace; its status is read
            // again then, and one that blocked it only for a moment gets the full deadline.
            let full = deadline(timeout_ns, overall, None);
            let mut unblocked = || super::cannot_answer(tid).is_none();
            let (a, extended) =
                request::wait_one_with_grace(&t, grace, full, &mut unblocked, frames);
            explained(a, (!extended).then_some(why))
        }
        Pending::Posted(t, deadline, None) => request::wait_one(&t, deadline, frames),
        Pending::Answered(a) => a,
        Pending::Myself => match mine {
            Some((walk, f)) => {
                let n = walk.frames;
                let k = n.min(f.len()).min(frames.len());
                frames[..k].copy_from_slice(&f[..k]);
                let end = if k < n {
                    crate::unwind::WalkEnd::BufferFull
                } else {
                    walk.end
                };
                Answer::Frames(k, end, walk.frame_kinds().truncated(k))
            }
            None => capture_myself(frames),
        },
        Pending::Empty => Answer::Timeout,
        Pending::NoSlot(why) => {
            let deadline = deadline(timeout_ns, overall, why);
            let answer = loop {
                match request::post(tid) {
                    Ok(Some(t)) => break request::wait_one(&t, deadline, frames),
                    Ok(None) if sys::monotonic_ns() < deadline => sys::sleep_ns(1_000_000),
                    Ok(None) => break Answer::Timeout,
                    Err(a) => break a,
                }
            };
            explained(answer, why)
        }
    }
}

/// The calling thread's stack, captured before a dump moved to a private stack: the walk (its
/// frames, how it ended, which frames are exact) and the buffer.
pub(crate) type Mine<'a> = (crate::unwind::Walk, &'a [usize]);

/// Lists every thread but `skip` (0: none) with its stack. Returns what it saw. `mine`: the
/// calling thread's stack, captured already (else it is asked for like any other).
pub(crate) fn threads_section(
    out: Out,
    skip: i32,
    timeout_ns: u64,
    objects: &mut Objects,
    mine: Option<Mine<'_>>,
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
            w.push_dec(e.errno().unwrap_or(0) as u64);
        });
        return summary;
    }
    let tids = &mut tids[..n];
    tids.sort_unstable();
    let overall = sys::monotonic_ns().saturating_add(timeout_ns.saturating_mul(OVERALL_TIMEOUTS));
    let mut window = [Pending::Empty; WINDOW];
    let mut infos: [Option<ThreadInfo>; WINDOW] = [None; WINDOW];
    let mut frames = [0usize; request::SLOT_FRAMES];
    let mut posted = 0;
    for printed in 0..n {
        while posted < n && posted - printed < WINDOW {
            let info = proc::info(tids[posted]);
            infos[posted % WINDOW] = info;
            window[posted % WINDOW] = post(
                tids[posted],
                info.as_ref(),
                timeout_ns,
                overall,
                mine.is_some(),
            );
            posted += 1;
        }
        let k = printed % WINDOW;
        let answer = settle(
            window[k],
            tids[printed],
            timeout_ns,
            overall,
            &mut frames,
            mine,
        );
        window[k] = Pending::Empty;
        out.line(|_| {});
        thread_header(out, tids[printed], infos[k].as_ref());
        thread_body(out, answer, &frames, objects, Lines::NONE);
        summary.threads += 1;
        match answer {
            Answer::Frames(..) => summary.stacks += 1,
            Answer::Timeout => summary.timeouts += 1,
            Answer::Gone => summary.gone += 1,
            Answer::Cannot(_) => summary.could_not_answer += 1,
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

/// Bytes of stack the dump takes (37 KiB measured in a debug build, with room to spare) when it
/// cannot move to a private stack.
const DUMP_STACK_NEED: usize = 64 * 1024;

/// The whole dump, under the output lock. The calling thread's stack is captured here, on its
/// own stack; the rest runs on one of selftrace's private stacks when one is free, else here
/// when [`DUMP_STACK_NEED`] bytes are left, else the dump says that it has too little stack
/// and lists nothing.
#[inline(never)]
pub(crate) fn dump_all(fd: i32, timeout_ns: u64) -> DumpSummary {
    let out = Out { fd };
    if let Some(mut stack) = sys::stack::claim() {
        let (frames, on) = stack.parts();
        let walk = crate::unwind::Capture::new().walk(frames);
        let own = Some((walk, &frames[..]));
        let mut summary = DumpSummary::default();
        on.run(&mut || summary = dump_all_here(out, timeout_ns, own));
        return summary;
    }
    match sys::stack::room() {
        Some(room) if room < DUMP_STACK_NEED => {
            let lock = OutputLock::acquire();
            out.line(|w| w.push_bytes(b"------------[ selftrace: all threads ]------------"));
            out.line(|w| {
                w.push_bytes(b"not listed: ");
                w.push_dec(room as u64);
                w.push_bytes(b" bytes of stack left, and no private stack free");
            });
            out.line(|w| w.push_bytes(b"---[ end of all threads ]---"));
            drop(lock);
            DumpSummary::default()
        }
        _ => dump_all_here(out, timeout_ns, None),
    }
}

fn dump_all_here(out: Out, timeout_ns: u64, own: Option<Mine<'_>>) -> DumpSummary {
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
        let unrecorded = crate::report::spans::threads_without_record();
        if unrecorded > 0 {
            w.push_bytes(b" (spans of ");
            w.push_dec(unrecorded as u64);
            w.push_bytes(b" threads not recorded: every record was taken)");
        }
    });
    let mut objects = Objects::new();
    let summary = threads_section(out, 0, timeout_ns, &mut objects, own);
    objects.write(out);
    out.line(|w| w.push_bytes(b"---[ end of all threads ]---"));
    drop(lock);
    summary
}
