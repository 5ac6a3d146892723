//! The report: written line by line with `write(2)` from fixed buffers, modelled on the
//! kernel's oops and `dump_stack()`.
//! One writer for every report: crash reports, `dump_stack`, thread dumps, the panic report and
//! the watchdog's (frame lines, call traces with recursion folded, objects, thread headers).
//!
//! ```text
//! ------------[ selftrace: fatal signal ]------------
//! SIGSEGV (SEGV_MAPERR: address not mapped to object) at address 0x0
//! pid 4242, tid 4243, thread "worker"
//! RIP: 0x55d0c0a3d1f0 : crash::null_deref+0x1d/0x40 [crash+0x1d1f0]
//! RSP: 0x00007ffd5a3e1f00 RBP: 0x00007ffd5a3e1f40 EFLAGS: 0x0000000000010246
//! ...
//! Call Trace:
//!  #0 0x55d0c0a3d1f0 : crash::null_deref+0x1d/0x40 [crash+0x1d1f0] at src/main.rs:12:5
//!  #1 [inlined] crash::run at src/main.rs:20:5
//!  #1 0x55d0c0a3d2a1 : crash::main+0x51/0x90 [crash+0x1d2a1] at src/main.rs:25:5
//! Objects:
//!  crash /path/to/crash build-id 3f1c...
//! ---[ end of report ]---
//! ```
//!
//! # Async-signal safety
//! Everything here is async-signal-safe: fixed buffers, `write(2)`, lock-free lookups.
#![allow(unsafe_code)]

use crate::fmt::FixedBuf;
use crate::symbolize::{self, KernelOptions};
use crate::sys;
use crate::unwind::{FrameKind, FrameKinds, WalkEnd};

pub(crate) mod arch;
pub(crate) mod lines;
pub(crate) mod lock;
pub(crate) mod spans;

pub(crate) use arch::registers;
pub(crate) use lines::{Lines, OwnedLines};

/// Where a report or a thread dump goes: lines written from a fixed buffer, one `write(2)` each.
#[derive(Clone, Copy)]
pub(crate) struct Out {
    pub(crate) fd: i32,
}

impl Out {
    /// Writes one line (adds the newline).
    pub(crate) fn line(&self, f: impl FnOnce(&mut FixedBuf<'_>)) {
        let mut buf = [0u8; 1024];
        let mut w = FixedBuf::new(&mut buf);
        f(&mut w);
        w.push_bytes(b"\n");
        let _ = sys::write_all(self.fd, w.as_bytes());
    }
}

/// One line of a report's `Objects:` list: ` name path build-id hex`.
pub(crate) fn object_line(out: Out, s: &symbolize::Symbol) {
    out.line(|w| {
        w.push_bytes(b" ");
        w.push_str(s.object_name());
        w.push_bytes(b" ");
        w.push_str(s.path);
        if !s.build_id.is_empty() {
            w.push_bytes(b" build-id ");
            for &b in s.build_id {
                let hex = b"0123456789abcdef";
                w.push_bytes(&[hex[(b >> 4) as usize], hex[(b & 15) as usize]]);
            }
        }
    });
}

pub(crate) const FRAME_OPTS: KernelOptions = KernelOptions {
    demangle: true,
    object_offset: true,
    build_id: false,
};

/// Writes the interrupted pc as a kernel frame line, naming first the innermost function
/// inlined there when there is one: `0x... : inner, inlined into outer+0x1d/0x40 [obj+0x...]`.
pub(crate) fn pc_frame(w: &mut FixedBuf<'_>, pc: usize, innermost: &[u8]) {
    let mut buf = [0u8; 900];
    let n = symbolize::write_kernel_frame(&mut buf, pc, FrameKind::Exact, FRAME_OPTS);
    let line = buf.get(..n).unwrap_or(&[]);
    let sep = line.windows(3).position(|x| x == b" : ");
    match sep {
        Some(at) if !innermost.is_empty() => {
            w.push_bytes(&line[..at + 3]);
            w.push_bytes(innermost);
            w.push_bytes(b", inlined into ");
            w.push_bytes(&line[at + 3..]);
        }
        _ => w.push_bytes(line),
    }
}

/// Writes `#i <kernel frame line>`.
fn frame_line(w: &mut FixedBuf<'_>, i: usize, addr: usize, kind: FrameKind) {
    w.push_bytes(b" #");
    w.push_dec(i as u64);
    w.push_bytes(b" ");
    let mut buf = [0u8; 900];
    let n = symbolize::write_kernel_frame(&mut buf, addr, kind, FRAME_OPTS);
    w.push_bytes(buf.get(..n).unwrap_or(&[]));
    if symbolize::is_signal_trampoline(addr) {
        w.push_bytes(b" <signal handler called>");
    }
}

/// The demangled leaf-ish name of the function at frame `i`, for recursion summaries.
fn short_name<'b>(frames: &[usize], i: usize, kinds: FrameKinds, buf: &'b mut [u8]) -> &'b str {
    let kind = kinds.kind(frames, i);
    let Some(addr) = frames.get(i) else {
        return "?";
    };
    match symbolize::symbolize_frame(*addr, kind).and_then(|s| s.demangle_into(buf)) {
        Some(name) => name,
        None => "?",
    }
}

/// The shortest period `p` (1..=8) with which `frames[start..]` repeats at least `min_reps`
/// times, and how many frames that run covers.
fn repeat_at(frames: &[usize], start: usize) -> Option<(usize, usize)> {
    const MIN_RUN: usize = 12;
    for p in 1..=8usize {
        let mut end = start + p;
        while end < frames.len() && frames[end] == frames[end - p] {
            end += 1;
        }
        let run = end - start;
        if run >= MIN_RUN && run >= 3 * p {
            return Some((p, run - run % p));
        }
    }
    None
}

/// Prints frame `k`: first the functions inlined into it, innermost first, each on its own
/// line (` #k [inlined] name at file:line:col`), then the physical function with the frame's
/// address and its own file:line, as std's backtraces, gdb and minidump-stackwalk order them.
fn frame_with_lines(out: Out, frames: &[usize], k: usize, kinds: FrameKinds, lines: Lines<'_>) {
    let kind = kinds.kind(frames, k);
    let text = lines.get(k);
    let mut parts = text.split(|&b| b == b'\n');
    let physical = parts.next().unwrap_or(&[]);
    for inlined in parts {
        out.line(|w| {
            w.push_bytes(b" #");
            w.push_dec(k as u64);
            w.push_bytes(b" [inlined] ");
            for (i, piece) in inlined.split(|&b| b == b'\t').enumerate() {
                if i > 0 {
                    w.push_bytes(b" ");
                }
                w.push_bytes(piece);
            }
        });
    }
    out.line(|w| {
        frame_line(w, k, frames[k], kind);
        if !physical.is_empty() {
            w.push_bytes(b" ");
            w.push_bytes(physical);
        }
    });
}

/// The innermost function inlined at frame `k`, from the symbolizer's text: its name, or
/// nothing when no function is inlined there (or the frame was not answered).
pub(crate) fn innermost_inlined<'t>(lines: &Lines<'t>, k: usize) -> &'t [u8] {
    let text = lines.get(k);
    let inlined = text.split(|&b| b == b'\n').nth(1).unwrap_or(&[]);
    inlined.split(|&b| b == b'\t').next().unwrap_or(&[])
}

/// Prints a call trace, compressing recursion: `frames 12-4000 repeat: f -> g`. `kinds` is
/// the walk's record of which frames are exact pcs ([`crate::Walk::frame_kinds`]).
pub(crate) fn call_trace(out: Out, frames: &[usize], kinds: FrameKinds, end: WalkEnd) {
    call_trace_with_lines(out, frames, kinds, end, Lines::NONE);
}

/// [`call_trace`] with file:line for the first frames.
pub(crate) fn call_trace_with_lines(
    out: Out,
    frames: &[usize],
    kinds: FrameKinds,
    end: WalkEnd,
    lines: Lines<'_>,
) {
    out.line(|w| w.push_bytes(b"Call Trace:"));
    let mut i = 0;
    while i < frames.len() {
        if let Some((p, run)) = repeat_at(frames, i) {
            // Print one cycle, then the summary.
            for k in i..i + p {
                frame_with_lines(out, frames, k, kinds, lines);
            }
            let last = i + run - 1;
            out.line(|w| {
                w.push_bytes(b" frames ");
                w.push_dec((i + p) as u64);
                w.push_bytes(b"-");
                w.push_dec(last as u64);
                w.push_bytes(b" repeat: ");
                for k in i..i + p {
                    if k > i {
                        w.push_bytes(b" -> ");
                    }
                    let mut nb = [0u8; 256];
                    w.push_str(short_name(frames, k, kinds, &mut nb));
                }
            });
            i += run;
            continue;
        }
        frame_with_lines(out, frames, i, kinds, lines);
        i += 1;
    }
    match end {
        WalkEnd::Complete => {}
        WalkEnd::BufferFull => out.line(|w| {
            w.push_bytes(b" (trace cut at ");
            w.push_dec(frames.len() as u64);
            w.push_bytes(b" frames)");
        }),
        WalkEnd::Truncated(t) => out.line(|w| symbolize::write_truncation(w, &t)),
    }
}

/// A call trace of raw addresses, for a stack with `room` bytes left, too few to symbolize on:
/// says so, then ` #0 0x55d0c0a3d1f0` per frame (`addr2line` or a later `symbolize` names
/// them).
pub(crate) fn raw_call_trace(out: Out, frames: &[usize], end: WalkEnd, room: usize) {
    out.line(|w| {
        w.push_bytes(b"Call Trace (raw addresses, not symbolized: ");
        w.push_dec(room as u64);
        w.push_bytes(b" bytes of stack left):");
    });
    for (i, &addr) in frames.iter().enumerate() {
        out.line(|w| {
            w.push_bytes(b" #");
            w.push_dec(i as u64);
            w.push_bytes(b" ");
            w.push_0x(addr);
        });
    }
    if let WalkEnd::Truncated(t) = end {
        out.line(|w| {
            w.push_bytes(b" stack truncated at ");
            w.push_0x(t.pc);
        });
    } else if end == WalkEnd::BufferFull {
        out.line(|w| w.push_bytes(b" (trace cut)"));
    }
}

/// Lists each object of the trace once, with path and build-id, so that
/// `addr2line -e PATH OFFSET` works offline on the `[name+0xOFFSET]` of each frame.
pub(crate) fn objects(out: Out, frames: &[usize]) {
    let mut objects = Objects::new();
    objects.add(frames);
    objects.write(out);
}

/// The objects met in a report or a dump, each listed once at its end.
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

    /// Records the objects of `frames` not met yet (at most 32 in all).
    pub(crate) fn add(&mut self, frames: &[usize]) {
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

    /// Writes `Objects:` and one [`object_line`] per object recorded.
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

/// The calling thread's name (`PR_GET_NAME`), into `buf`.
pub(crate) fn thread_name(buf: &mut [u8; 17]) -> &str {
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL-terminated, into buf.
    unsafe { libc::prctl(libc::PR_GET_NAME, buf.as_mut_ptr(), 0, 0, 0) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(16);
    core::str::from_utf8(buf.get(..len).unwrap_or(&[])).unwrap_or("?")
}

/// `pid 4242, tid 4243, thread "worker"`.
pub(crate) fn who(out: Out) {
    let mut name = [0u8; 17];
    let name = thread_name(&mut name);
    out.line(|w| {
        w.push_bytes(b"pid ");
        // SAFETY: getpid has no preconditions.
        w.push_dec(unsafe { libc::getpid() } as u64);
        w.push_bytes(b", tid ");
        w.push_dec(sys::gettid() as u64);
        w.push_bytes(b", thread \"");
        w.push_str(name);
        w.push_bytes(b"\"");
    });
    spans_line(out, sys::gettid());
}

/// `thread "worker" tid 4243, state S (sleeping), cpu 0.001s`: `state` is the thread's state
/// letter and its name, `cpu_ns` its CPU time, where known (from `/proc`).
#[cfg_attr(not(feature = "threads"), allow(dead_code))] // Used by thread dumps.
pub(crate) fn thread_header(
    out: Out,
    tid: i32,
    name: &str,
    state: Option<(u8, &str)>,
    cpu_ns: Option<u64>,
) {
    out.line(|w| {
        w.push_bytes(b"thread \"");
        w.push_str(name);
        w.push_bytes(b"\" tid ");
        w.push_dec(tid as u64);
        if let Some((state, state_name)) = state {
            w.push_bytes(b", state ");
            w.push_bytes(&[state]);
            w.push_bytes(b" (");
            w.push_str(state_name);
            w.push_bytes(b")");
            if let Some(ns) = cpu_ns {
                w.push_bytes(b", cpu ");
                push_seconds(w, ns);
            }
        }
    });
    spans_line(out, tid);
}

/// ` in span: request > handler (task 17)`: the tracing spans thread `tid` is in (see
/// [`spans`]); no line when it is in none.
pub(crate) fn spans_line(out: Out, tid: i32) {
    if spans::in_span(tid) {
        out.line(|w| {
            w.push_bytes(b" in span: ");
            spans::write_span_names(w, tid);
        });
    }
}

/// `ns` as seconds with three decimals: `1.234s`.
#[cfg_attr(not(feature = "threads"), allow(dead_code))] // Used by thread dumps.
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

/// `n` as 16 hex digits with `0x`.
// Used by the register blocks of the ported architectures.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn push_hex16(w: &mut FixedBuf<'_>, n: usize) {
    w.push_bytes(b"0x");
    let hex = b"0123456789abcdef";
    for shift in (0..16).rev() {
        w.push_bytes(&[hex[(n >> (shift * 4)) & 15]]);
    }
}
