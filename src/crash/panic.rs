//! The panic hook: a panic printed in the report's format, with file:line, and whether it is
//! caught (so that a tokio task's panic is not read as a crash).

use super::OUT_FD;
use crate::report::lock::OutputLock;
use crate::report::{self, Out};
use crate::symbolize;
use core::sync::atomic::{AtomicBool, Ordering};

/// Whether the panic hook reports (cleared by [`uninstall`](super::uninstall); the hook itself
/// stays and then only calls the hook installed before it).
pub(super) static PANIC_REPORTS: AtomicBool = AtomicBool::new(false);
/// Whether panics that a `catch_unwind` below the thread's start catches are reported too
/// ([`Builder::caught_panics`](super::Builder::caught_panics)).
pub(super) static CAUGHT_PANICS: AtomicBool = AtomicBool::new(true);
/// Whether [`install_hook`] ran (a second install must not chain the report twice).
static PANIC_HOOK: AtomicBool = AtomicBool::new(false);

/// Puts the report's panic hook in front of the hook installed before it (std's default hook,
/// which prints `thread '...' panicked at ...`, or the program's own), which then runs as it
/// would have.
pub(super) fn install_hook() {
    if PANIC_HOOK.swap(true, Ordering::SeqCst) {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if PANIC_REPORTS.load(Ordering::SeqCst) {
            report(info);
        }
        previous(info);
    }));
}

/// Prints the `selftrace: panic` report of a panic (normal context: allocates).
fn report(info: &std::panic::PanicHookInfo<'_>) {
    let mut frames = [0usize; 256];
    let walk = crate::unwind::Capture::new().walk(&mut frames);
    let n = walk.frames;
    let frames = &frames[..n];
    // Resolve in normal context (file:line included), then skip the panic machinery.
    let kinds = walk.frame_kinds();
    let resolved: Vec<_> = (0..n)
        .map(|i| symbolize::BacktraceFrame::resolve(frames[i], kinds.kind(frames, i)))
        .collect();
    // The first run of panic machinery frames ends where the panicking code begins.
    let machinery = |f: &symbolize::BacktraceFrame| {
        f.symbols.iter().any(|s| {
            s.name.as_deref().is_some_and(|n| {
                n.starts_with("core::panicking::")
                    || n.starts_with("std::panicking::")
                    || n.starts_with("std::sys::backtrace::__rust_end_short_backtrace")
                    || n.ends_with("rust_begin_unwind")
            })
        })
    };
    let skip = match resolved.iter().position(machinery) {
        Some(first) => {
            first
                + resolved[first..]
                    .iter()
                    .take_while(|f| machinery(f))
                    .count()
        }
        None => 0,
    };
    let catch = catch_of(&resolved[skip..]);
    if matches!(catch, Catch::Caught(_)) && !CAUGHT_PANICS.load(Ordering::SeqCst) {
        return;
    }
    let frames = &frames[skip..];
    let kinds = kinds.after(skip);
    let lines = report::OwnedLines::new(&resolved[skip..]);
    let msg = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "Box<dyn Any>".to_string());
    let out = Out {
        fd: OUT_FD.load(Ordering::Relaxed),
    };
    let _lock = OutputLock::acquire();
    out.line(|w| w.push_bytes(b"------------[ selftrace: panic ]------------"));
    out.line(|w| {
        w.push_bytes(b"panic: ");
        w.push_str(&msg);
        if let Some(l) = info.location() {
            w.push_bytes(b" at ");
            w.push_str(l.file());
            w.push_bytes(b":");
            w.push_dec(l.line() as u64);
            w.push_bytes(b":");
            w.push_dec(l.column() as u64);
        }
    });
    out.line(|w| match &catch {
        Catch::Caught(by) => {
            w.push_bytes(b"caught: by catch_unwind in ");
            w.push_str(by);
            w.push_bytes(b": not fatal, the program goes on");
        }
        Catch::EndsThread => w.push_bytes(
            b"not caught: the thread ends with it (its JoinHandle gets the panic); \
              the process goes on",
        ),
        Catch::EndsProcess => w.push_bytes(b"not caught: the process exits"),
        Catch::Aborts => w.push_bytes(b"panic = \"abort\": the process aborts"),
        Catch::Unknown => w.push_bytes(
            b"whether it is caught is unknown: no catch_unwind found on the stack as walked",
        ),
    });
    report::who(out);
    report::call_trace_with_lines(out, frames, kinds, walk.end, lines.lines());
    report::objects(out, frames);
    out.line(|w| w.push_bytes(b"---[ end of report ]---"));
}

/// What will become of a panic, as far as its stack tells.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Catch {
    /// A `catch_unwind` below the thread's start catches it, in this function (a runtime's
    /// task poll, the program's own): the program goes on.
    Caught(String),
    /// Only the thread's start (std's spawn) catches it: the thread ends.
    EndsThread,
    /// Only the start of `main` (`std::rt::lang_start`) catches it: the process exits.
    EndsProcess,
    /// Built with `panic = "abort"`.
    Aborts,
    /// No `catch_unwind` on the stack as walked (cut short, or without names).
    Unknown,
}

/// Whether `name` is the `catch_unwind` that runs a closure under a landing pad (not its
/// helpers `do_call`, `cleanup`): `std::panicking::catch_unwind` (`std::panicking::try`
/// before Rust 1.86), with or without generic arguments.
fn is_catch(name: &str) -> bool {
    ["std::panicking::catch_unwind", "std::panicking::try"]
        .iter()
        .any(|p| {
            name.strip_prefix(p).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with("::<") || rest.starts_with('<')
            })
        })
}

/// Frames of the unwinding machinery between a `catch_unwind` and the function that called it.
fn is_machinery(name: &str) -> bool {
    name.starts_with("std::panicking::")
        || name.starts_with("std::panic::")
        || name.starts_with("core::panic::")
        || name.starts_with("<core::panic::unwind_safe::AssertUnwindSafe")
        || name.starts_with("__rust_try")
}

/// Finds the innermost `catch_unwind` in `frames` (the stack from the panicking code outward,
/// functions innermost first) and says who called it.
fn catch_of(frames: &[symbolize::BacktraceFrame]) -> Catch {
    if cfg!(panic = "abort") {
        return Catch::Aborts;
    }
    let mut names = frames
        .iter()
        .flat_map(|f| f.symbols().iter())
        .filter_map(|s| s.name.as_deref());
    if !names.by_ref().any(is_catch) {
        return Catch::Unknown;
    }
    match names.find(|n| !is_machinery(n)) {
        Some(n) if n.starts_with("std::rt::lang_start") => Catch::EndsProcess,
        Some(n) if n.starts_with("std::thread::") || n.starts_with("<std::thread::") => {
            Catch::EndsThread
        }
        Some(n) => Catch::Caught(n.to_string()),
        None => Catch::Unknown,
    }
}
