//! The crash report's text (the oops): the signal and its meaning, who crashed, the
//! registers, the call trace with file:line from the symbolizer process, the objects, every
//! other thread when asked for, and the minidump line. Runs on the report's private stack,
//! under the report lock.
//!
//! # Async-signal safety
//! Everything here is async-signal-safe: fixed buffers (static, used under the report lock),
//! `write(2)`.

#[cfg(feature = "threads")]
use super::ALL_THREADS;
use super::{dump_to, names, symbolizer, OUT_FD};
use crate::context::Fault;
use crate::error::Error;
use crate::report::{self, Out};
use core::cell::UnsafeCell;
use core::sync::atomic::Ordering;

/// Frames of the crashing stack (used by one report at a time, under the report lock).
const MAX_CRASH_FRAMES: usize = 16 * 1024;

struct Shared<T>(UnsafeCell<T>);
// SAFETY: access is serialised by the report lock (or, for PREV, by writing before the handler
// is installed and only reading afterwards), so a value is used by one thread at a time; that
// moves it between threads, hence `T: Send`.
unsafe impl<T: Send> Sync for Shared<T> {}

static CRASH_FRAMES: Shared<[usize; MAX_CRASH_FRAMES]> =
    Shared(UnsafeCell::new([0; MAX_CRASH_FRAMES]));

/// The report's text for the crash `c`.
pub(super) fn write_report(c: &Fault) {
    let out = Out {
        fd: OUT_FD.load(Ordering::Relaxed),
    };
    let (code, addr) = c.code_addr();
    out.line(|w| w.push_bytes(b"------------[ selftrace: fatal signal ]------------"));
    out.line(|w| {
        match names::signal_name(c.sig) {
            Some(n) => w.push_str(n),
            None => {
                w.push_bytes(b"signal ");
                w.push_dec(c.sig as u64);
            }
        }
        w.push_bytes(b" (");
        match names::code_name(c.sig, code) {
            Some((name, what)) => {
                w.push_str(name);
                w.push_bytes(b": ");
                w.push_str(what);
            }
            None => {
                w.push_bytes(b"code ");
                w.push_dec(code as i64 as u64);
            }
        }
        w.push_bytes(b")");
        if names::is_fault(c.sig, code) {
            w.push_bytes(b" at address ");
            w.push_0x(addr);
        }
    });
    report::who(out);
    let regs = if c.uc.is_null() {
        None
    } else {
        // SAFETY: uc is the kernel's ucontext for this signal.
        Some(unsafe { crate::unwind::regs_from_ucontext(c.uc) })
    };
    if let Some(r) = regs {
        if c.sig == libc::SIGSEGV && is_stack_overflow(addr, r.sp) {
            out.line(|w| {
                w.push_bytes(b"stack overflow: the fault address ");
                w.push_0x(addr);
                w.push_bytes(b" lies in the guard area below the stack (sp ");
                w.push_0x(r.sp);
                w.push_bytes(b")");
            });
        }
    }
    // The walk and its file:line first: the pc line names the innermost function inlined
    // at the pc.
    // SAFETY: the frames buffer is used by one report at a time (report lock held).
    let frames = unsafe { &mut *CRASH_FRAMES.0.get() };
    let walk = if c.uc.is_null() {
        crate::unwind::Capture::new().walk(frames)
    } else {
        // SAFETY: uc is the kernel's ucontext for this signal.
        unsafe { crate::unwind::Capture::new().walk_ucontext(c.uc, frames) }
    };
    let n = walk.frames;
    // SAFETY: used by one report at a time (report lock held).
    let (text, spans) = unsafe { (&mut *LINE_TEXT.0.get(), &mut *LINE_SPANS.0.get()) };
    // The frames that get printed: the innermost and the outermost (a deep recursion in
    // between is summarised).
    let mut indices = [0usize; symbolizer::MAX_FRAMES];
    let half = symbolizer::MAX_FRAMES / 2;
    let mut k = 0;
    for i in (0..n.min(half)).chain(n.saturating_sub(half).max(half)..n) {
        indices[k] = i;
        k += 1;
    }
    let answered = symbolizer::ask(&frames[..n], &indices[..k], walk.frame_kinds(), text, spans);
    let lines = report::Lines {
        text,
        indices: &indices[..answered],
        spans: &spans[..answered],
    };
    if !c.uc.is_null() {
        let innermost = report::innermost_inlined(&lines, 0);
        // SAFETY: uc is the kernel's ucontext for this signal.
        unsafe { report::registers(out, c.uc, innermost) };
    }
    report::call_trace_with_lines(out, &frames[..n], walk.frame_kinds(), walk.end, lines);
    if answered == 0 && symbolizer::forked_away() {
        out.line(|w| {
            w.push_bytes(
                b"(no file:line: the symbolizer process serves the parent of this forked child)",
            )
        });
    }
    report::objects(out, &frames[..n]);
    #[cfg(feature = "threads")]
    if ALL_THREADS.load(Ordering::Relaxed) {
        crate::threads::write_other_threads(out.fd, crate::sys::gettid());
    }
    if !c.uc.is_null() {
        dump_to::write_minidump(out, c);
    }
    out.line(|w| w.push_bytes(b"---[ end of report ]---"));
}

/// An [`Error`] in a report line, without `fmt` (async-signal-safe).
pub(super) fn push_error(w: &mut crate::symbolize::FixedBuf<'_>, e: Error) {
    match e {
        Error::Sys { call, errno } => {
            w.push_str(call);
            w.push_bytes(b" failed: errno ");
            w.push_dec(errno as u64);
        }
        Error::InvalidInput(what) | Error::Unsupported(what) | Error::NotFound(what) => {
            w.push_str(what)
        }
        Error::Timeout => w.push_bytes(b"timeout"),
        _ => w.push_bytes(b"error"),
    }
}

/// file:line answers of the symbolizer for the current report.
static LINE_TEXT: Shared<[u8; 64 * 1024]> = Shared(UnsafeCell::new([0; 64 * 1024]));
static LINE_SPANS: Shared<[(u32, u32); symbolizer::MAX_FRAMES]> =
    Shared(UnsafeCell::new([(0, 0); symbolizer::MAX_FRAMES]));

/// A SIGSEGV whose fault address lies just below the stack pointer or in the guard area below
/// the thread's known stack: the stack overflowed.
fn is_stack_overflow(addr: usize, sp: usize) -> bool {
    const GUARD: usize = 1 << 20;
    if let Some(stack) = crate::unwind::thread_stack() {
        if addr < stack.start && stack.start - addr <= GUARD {
            return true;
        }
    }
    addr <= sp.saturating_add(4096) && sp.saturating_sub(addr) <= GUARD && addr != 0
}
