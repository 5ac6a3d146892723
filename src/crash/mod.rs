//! Crash handler and `dump_stack()`.
//!
//! [`install`] (or [`builder`]) installs a handler for SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT
//! and SIGTRAP (configurable). When one arrives, the handler writes a report modelled on the
//! kernel's oops with raw `write(2)`s: the signal and the meaning of its `si_code`, the fault
//! address, pid, tid and thread name, the registers, and the symbolized call trace of the
//! interrupted code (demangled names, `[object+offset]` that `addr2line -e` takes, and each
//! object's path and build-id). A stack overflow is recognised and said; recursion is printed
//! once and summarised (`frames 12-4000 repeat: f -> g`).
//!
//! With [`Builder::minidump`] it then writes a minidump of the process (every thread's
//! registers and stack, the modules with their build-ids: see [`crate::minidump`]) into a new
//! file of a directory, itself, without ptrace or a helper process; [`crate::minidump::upload`]
//! sends such files to a crash server on the next start.
//!
//! Then it calls the handler that was installed before (if any: chaining), restores the
//! default action and re-raises the signal, so the process dies by the same signal and a core
//! dump is still written. [`uninstall`] gives every signal its previous action back.
//!
//! # Safety of the handler
//! * It runs on an alternate signal stack: [`install`] gives the installing thread one of
//!   [`Builder::alt_stack_size`] bytes; threads spawned by std already have one (std installs
//!   it for its own stack-overflow handler); other threads call [`install_thread`]. The report
//!   itself runs on a private stack mapped at install time, so even std's small alternate
//!   stacks suffice.
//! * Everything it does is async-signal-safe: lock-free lookups in tables built by
//!   `selftrace::init()`, fixed buffers, `write(2)`. It does not allocate, so a crash inside
//!   `malloc` (with the allocator's lock held) or while another thread is inside `dlopen` is
//!   reported like any other.
//! * Two threads crashing at once: the first reports, the second waits for it (and reports
//!   after it if the process is still alive). A crash inside the handler itself falls back to
//!   the default action at once.
//!
//! # file:line
//! Parsing DWARF line tables allocates, which is not safe in a signal handler. The report gets
//! file:line and inlined frames from a symbolizer process forked at install time (see
//! [`Builder::symbolizer`]): the handler writes the raw addresses to it over a pipe and waits at
//! most 3 seconds for the answers. Without it (disabled, dead, slow, or for objects loaded
//! after install), frames keep their async-signal-safe names and `[object+offset]`, which
//! `addr2line -f -C -i -e OBJECT OFFSET` resolves offline with the listed build-ids.
//!
//! # Inlined frames, overflows, recursion
//!
//! In a release build functions are inlined into their callers; each frame then lists the
//! functions inlined at its address first, innermost first, each with its own file:line, and the
//! physical function last with the frame's address (the order of std's backtraces, gdb and
//! minidump-stackwalk); the pc line names the innermost function
//! (`cargo run --release --example crash -- inlined`):
//!
//! ```text
//! RIP: 0x56476fec1efd : core::ptr::read_volatile, inlined into crash::scenarios::crash_inlined+0x2cd/0x38b [crash+0x4eefd]
//! ...
//! Call Trace:
//!  #0 [inlined] core::ptr::read_volatile at .../library/core/src/ptr/mod.rs:2091:9
//!  #0 [inlined] crash::scenarios::inlined_leaf at tests/support/crash_scenarios.rs:363:14
//!  #0 [inlined] crash::scenarios::inlined_mid at tests/support/crash_scenarios.rs:368:5
//!  #0 0x56476fec1efd : crash::scenarios::crash_inlined+0x2cd/0x38b [crash+0x4eefd] at tests/support/crash_scenarios.rs:373:15
//!  #1 0x56476fec2026 : crash::scenarios::caller_inlined+0x6/0x8 [crash+0x4f026] at tests/support/crash_scenarios.rs:378:5
//! ```
//!
//! The watchdog's reports (normal context) list frames the same way; thread dumps written from a
//! signal handler (`dump_all`, the dump signal) have names and offsets only. A stack overflow
//! says so, and recursion is printed once:
//!
//! ```text
//! stack overflow: the fault address 0x7f32043fffa8 lies in the guard area below the stack (sp 0x7f32043fff90)
//! ...
//!  #1 0x55c31f852647 : crash::scenarios::crash_recurse+0x87/0xc3 [crash+0xf2647]
//!  frames 2-10895 repeat: crash::scenarios::crash_recurse
//!  #10896 0x55c31f852a7a : crash::scenarios::caller_overflow+0xa/0x14 [crash+0xf2a7a]
//! ```
//!
//! `examples/crash.rs` shows every kind of crash: `cargo run --example crash -- list`. The build
//! settings that give reports names, file:line and inlined frames (the release profile's `debug`,
//! `split-debuginfo`, `strip`, `panic`; debug files by build-id) are in the repository's
//! docs/crash.md.
#![allow(unsafe_code)]

mod dump_to;
mod handler;
mod names;
mod oops;
mod panic;
mod symbolizer;

/// Moved to [`crate::minidump::upload`] (the uploads of what the minidump writer wrote); this path
/// keeps working.
pub use crate::minidump::upload;
pub use handler::uninstall;

use crate::error::Error;
use crate::report::lock::OutputLock;
use crate::report::{self, Out};
use crate::sys;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
#[cfg(feature = "threads")]
pub(crate) use dump_to::minidump_configured;
use dump_to::{install_minidump, MinidumpTo};
use handler::{install_signal, TAKEN};
use panic::{CAUGHT_PANICS, PANIC_REPORTS};
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

/// The signals handled by default.
pub const DEFAULT_SIGNALS: [i32; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGTRAP,
];

/// Options for [`install`]. Create with [`builder`].
#[must_use = "a builder does nothing until `install` is called"]
#[derive(Clone, Debug)]
pub struct Builder {
    signals: Vec<i32>,
    fd: Option<Arc<OwnedFd>>,
    path: Option<PathBuf>,
    alt_stack_size: usize,
    panic_hook: bool,
    caught_panics: bool,
    symbolizer: bool,
    symbolizer_timeout: std::time::Duration,
    all_threads: bool,
    minidump: Option<MinidumpTo>,
    minidump_options: crate::minidump::Options,
}

/// Options with their defaults: [`DEFAULT_SIGNALS`], stderr, a 64 KiB alternate stack, no
/// panic hook.
pub fn builder() -> Builder {
    Builder {
        signals: DEFAULT_SIGNALS.to_vec(),
        fd: None,
        path: None,
        alt_stack_size: 64 * 1024,
        panic_hook: false,
        caught_panics: true,
        symbolizer: true,
        symbolizer_timeout: std::time::Duration::from_secs(3),
        all_threads: false,
        minidump: None,
        minidump_options: crate::minidump::Options::new(),
    }
}

/// Installs the crash handler with default options (see [`builder`]).
///
/// # Errors
/// As [`Builder::install`].
pub fn install() -> Result<(), Error> {
    builder().install()
}

impl Builder {
    /// The signals to handle (replaces the default list).
    pub fn signals(mut self, signals: &[i32]) -> Builder {
        self.signals = signals.to_vec();
        self
    }

    /// Write reports to this file descriptor (default: stderr), for example a [`std::fs::File`]
    /// or a pipe's write end. [`Builder::install`] keeps it open for the rest of the process
    /// (a handler may write to it at any time), also if the handler is installed again with
    /// another fd.
    pub fn fd(mut self, fd: impl Into<OwnedFd>) -> Builder {
        self.fd = Some(Arc::new(fd.into()));
        self.path = None;
        self
    }

    /// Write reports to this file, opened (created, appended to) at install time.
    pub fn file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.path = Some(path.into());
        self.fd = None;
        self
    }

    /// Size of the alternate signal stack given to the installing thread (and by
    /// [`install_thread`]) when it has none or a smaller one.
    pub fn alt_stack_size(mut self, bytes: usize) -> Builder {
        self.alt_stack_size = bytes.max(libc::MINSIGSTKSZ * 2);
        self
    }

    /// Also print panics in the report's format (file:line included). The panic hook installed
    /// before (std's default hook, with its `thread '...' panicked at` message, or the
    /// program's own) still runs after the report, and unwinding or aborting is unchanged.
    /// Install the program's own hook first if it should be chained; a hook set later with
    /// [`std::panic::set_hook`] replaces this one.
    ///
    /// Each panic report says whether the panic will be caught, as its stack tells: by a
    /// `catch_unwind` of a runtime or of the program (`caught: by catch_unwind in
    /// tokio::runtime::task::harness::poll_future: not fatal, the program goes on`), only by
    /// the start of its thread (the thread ends), only by the start of `main` (the process
    /// exits), or that it aborts (`panic = "abort"`); see [`Builder::caught_panics`].
    pub fn panic_hook(mut self, enabled: bool) -> Builder {
        self.panic_hook = enabled;
        self
    }

    /// Whether the panic hook also reports panics that are caught below their thread's start
    /// (a tokio task's panic, `std::panic::catch_unwind` in the program): default `true`, the
    /// report then says `caught: ...: not fatal`; `false` writes no report for them (the hook
    /// installed before still runs).
    pub fn caught_panics(mut self, enabled: bool) -> Builder {
        self.caught_panics = enabled;
        self
    }

    /// Fork a symbolizer process now, so that crash reports can give file:line (default: on).
    /// See the module docs for how it works and its limits.
    pub fn symbolizer(mut self, enabled: bool) -> Builder {
        self.symbolizer = enabled;
        self
    }

    /// How long a crash report waits for the symbolizer's answers, all together (default: 3 s;
    /// 1 ms to 10 minutes, [`Builder::install`] refuses another; to not wait at all, turn the
    /// symbolizer off with [`Builder::symbolizer`]). A report whose answers do not come in time keeps names and offsets.
    /// A longer bound costs nothing while the symbolizer is quick; it is for slow machines and
    /// emulators, where parsing a large program's DWARF takes longer.
    pub fn symbolizer_timeout(mut self, timeout: std::time::Duration) -> Builder {
        self.symbolizer_timeout = timeout;
        self
    }

    /// After the crashing thread, list every other thread with its stack, like an Android
    /// tombstone (default: off). Each thread gets [`crate::threads::timeout`] to answer; one
    /// that does not is listed with its state and `no stack (timeout)`. Installs the
    /// stack-request handler of [`crate::threads`].
    #[cfg(feature = "threads")]
    #[cfg_attr(docsrs, doc(cfg(feature = "threads")))]
    pub fn all_threads(mut self, enabled: bool) -> Builder {
        self.all_threads = enabled;
        self
    }

    /// Also write a minidump of each crash into directory `dir` (see [`crate::minidump`]): a new
    /// file `<uuid>.dmp` (mode 0600) per crash, written by the handler itself (no ptrace, no
    /// helper process), after the text report, which names the file. The directory is opened
    /// at install time (so it must exist then; a later rename still works). With the
    /// `threads` feature the dump has every thread's registers and stack (this installs the
    /// stack-request handler of [`crate::threads`]); without it, only the crashing thread's.
    pub fn minidump(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.minidump = Some(MinidumpTo::Dir(dir.into()));
        self
    }

    /// Like [`Builder::minidump`], writing the dump to this file (a regular file, not opened
    /// for appending: dumps are written with `pwrite`), from its position at the time of the
    /// crash. One crash ends the process, so one dump is written.
    pub fn minidump_fd(mut self, fd: impl Into<OwnedFd>) -> Builder {
        self.minidump = Some(MinidumpTo::Fd(Arc::new(fd.into())));
        self
    }

    /// What crash dumps copy (stack bytes per thread, the environment): see
    /// [`crate::minidump::Options`].
    pub fn minidump_options(mut self, options: crate::minidump::Options) -> Builder {
        self.minidump_options = options;
        self
    }

    /// Installs the handler. Calls `selftrace::init()` first (symbol tables and unwinder must
    /// exist before any crash). Not async-signal-safe; call it early in `main`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a symbolizer timeout out of range, a signal that cannot be
    /// caught or that selftrace uses for
    /// something else (the stack-request or dump signal of [`crate::threads`], a running
    /// profiler's; the message names it), [`Error::NoUnwindInfo`] from
    /// [`crate::init`], [`Error::Sys`] when opening the report file, mapping the report stack,
    /// `sigaltstack`, `sigaction` or forking the symbolizer failed, and the errors of
    /// [`crate::threads::install`] with [`Builder::all_threads`]. With [`Builder::minidump`]:
    /// [`Error::Sys`] when the directory cannot be opened, [`Error::InvalidInput`] for a
    /// [`Builder::minidump_fd`] that is not seekable or appends or a
    /// [`crate::minidump::Options::stack_size`] out of range, [`Error::Unsupported`] on a machine
    /// without minidump support.
    pub fn install(self) -> Result<(), Error> {
        let timeout = self.symbolizer_timeout;
        if timeout < std::time::Duration::from_millis(1)
            || timeout > std::time::Duration::from_secs(600)
        {
            return Err(Error::InvalidInput(
                "the symbolizer timeout must be 1 ms to 10 minutes",
            ));
        }
        crate::setup::init()?;
        for &sig in &self.signals {
            // Not the stack-request signal, the dump signal or a running profiler's.
            sys::signal::check_use(sig, sys::signal::Owner::Crash)?;
        }
        if let Some(to) = &self.minidump {
            install_minidump(to, self.minidump_options)?;
        }
        let fd = match (&self.path, self.fd) {
            (Some(path), _) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| Error::from_io("open", &e))?
                .into_raw_fd(),
            // Never closed: a handler may write to it at any time from now on.
            (None, Some(fd)) => sys::keep_open(fd),
            (None, None) => 2,
        };
        OUT_FD.store(fd, Ordering::Relaxed);
        ALT_STACK_SIZE.store(self.alt_stack_size, Ordering::Relaxed);
        if REPORT_STACK.load(Ordering::Relaxed) == 0 {
            let top = sys::map_stack(REPORT_STACK_SIZE)?;
            REPORT_STACK.store(top, Ordering::Relaxed);
        }
        if self.all_threads {
            #[cfg(feature = "threads")]
            crate::threads::install()?;
        }
        ALL_THREADS.store(self.all_threads, Ordering::Relaxed);
        install_thread()?;
        // Every crash signal stays open inside the handler (a crash in it is caught), and
        // nothing else can run nested on the small alternate stack.
        let open = self
            .signals
            .iter()
            .filter(|&&sig| (1..=64).contains(&sig))
            .fold(TAKEN.load(Ordering::Relaxed), |m, &sig| m | 1 << (sig - 1));
        for &sig in &self.signals {
            install_signal(sig, open)?;
        }
        if self.panic_hook {
            panic::install_hook();
            PANIC_REPORTS.store(true, Ordering::SeqCst);
            CAUGHT_PANICS.store(self.caught_panics, Ordering::SeqCst);
        }
        if self.symbolizer {
            symbolizer::set_timeout(self.symbolizer_timeout);
            symbolizer::spawn()?;
        }
        Ok(())
    }
}

/// Gives the calling thread an alternate signal stack if it has none, or one smaller than the
/// configured size, so that a stack overflow on this thread can be reported. Threads spawned by
/// std have one already; call this on threads created otherwise (e.g. by C code).
///
/// # Errors
/// [`Error::Sys`] when `sigaltstack` or mapping the stack failed.
pub fn install_thread() -> Result<(), Error> {
    let want = ALT_STACK_SIZE.load(Ordering::Relaxed);
    // SAFETY: querying the current alternate stack into a valid stack_t.
    let mut cur: libc::stack_t = unsafe { core::mem::zeroed() };
    // SAFETY: null new stack: query only.
    if unsafe { libc::sigaltstack(core::ptr::null(), &mut cur) } != 0 {
        return Err(Error::last_os("sigaltstack"));
    }
    if cur.ss_flags & libc::SS_DISABLE == 0 && cur.ss_size >= want.min(16 * 1024) {
        return Ok(());
    }
    let top = sys::map_stack(want)?;
    let ss = libc::stack_t {
        ss_sp: (top - want) as *mut libc::c_void,
        ss_flags: 0,
        ss_size: want,
    };
    // SAFETY: ss describes a fresh mapping that stays mapped for the life of the process.
    if unsafe { libc::sigaltstack(&ss, core::ptr::null_mut()) } != 0 {
        return Err(Error::last_os("sigaltstack"));
    }
    Ok(())
}

/// Prints the current stack in the crash report's format, like the kernel's `dump_stack()`, to
/// the configured fd (stderr by default).
///
/// # Async-signal safety
/// Async-signal-safe; usable anywhere, crash or not.
///
/// # Stack
/// At most [`crate::SIGNAL_STACK_BUDGET`] bytes of the caller's stack: the stack is captured
/// there, then symbolizing and writing move to one of selftrace's private stacks (mapped by
/// [`crate::init`]). When all of them are busy and less than 64 KiB is left (the bounds of the
/// alternate signal stack or of the thread's stack), the trace is written as raw addresses,
/// and its `Call Trace` line says so.
#[inline(never)]
pub fn dump_stack() {
    let fd = OUT_FD.load(Ordering::Relaxed);
    dump_stack_to_raw(fd);
}

/// [`dump_stack`] to a given file descriptor (a [`std::fs::File`], [`std::io::stderr`], or in a
/// signal handler a [`std::os::fd::BorrowedFd`]).
///
/// # Async-signal safety
/// Async-signal-safe; the stack it needs as [`dump_stack`].
#[inline(never)]
pub fn dump_stack_to(fd: impl AsFd) {
    dump_stack_to_raw(fd.as_fd().as_raw_fd());
}

/// The stack is captured here, on the caller's stack (a walk does not cross from a private
/// stack back to it); symbolizing and writing run on one of selftrace's private stacks when one
/// is free, else here if [`REPORT_STACK_NEED`] bytes are left, else the trace is written as raw
/// addresses and says so.
#[inline(never)]
fn dump_stack_to_raw(fd: i32) {
    let out = Out { fd };
    if let Some(mut stack) = sys::stack::claim() {
        let (frames, on) = stack.parts();
        let walk = crate::unwind::Capture::new().walk(frames);
        let frames = &frames[..walk.frames];
        on.run(&mut || write_dump_stack(out, frames, walk, None));
        return;
    }
    let mut frames = [0usize; 64];
    let walk = crate::unwind::Capture::new().walk(&mut frames);
    let short = sys::stack::room().filter(|&r| r < REPORT_STACK_NEED);
    write_dump_stack(out, &frames[..walk.frames], walk, short);
}

/// Bytes of stack that a report's symbolizing and formatting take (at most, measured in a debug
/// build: 16 KiB for `dump_stack`, 37 KiB for `dump_all`, with room to spare), when no private
/// stack is free.
pub(crate) const REPORT_STACK_NEED: usize = 64 * 1024;

/// `dump_stack`'s text; with `short: Some(room)`, raw addresses only (a stack too small for
/// the symbolizer: `room` bytes left).
fn write_dump_stack(out: Out, frames: &[usize], walk: crate::unwind::Walk, short: Option<usize>) {
    let end = walk.end;
    let lock = OutputLock::acquire();
    out.line(|w| w.push_bytes(b"------------[ selftrace: dump_stack ]------------"));
    report::who(out);
    match short {
        None => {
            report::call_trace(out, frames, walk.frame_kinds(), end);
            report::objects(out, frames);
        }
        Some(room) => report::raw_call_trace(out, frames, end, room),
    }
    out.line(|w| w.push_bytes(b"---[ end of dump_stack ]---"));
    drop(lock);
}

// ---- state ----------------------------------------------------------------------------------

/// Where reports go ([`Builder::fd`], [`Builder::path`]; stderr by default).
static OUT_FD: AtomicI32 = AtomicI32::new(2);
/// Crash reports list every other thread too.
static ALL_THREADS: AtomicBool = AtomicBool::new(false);

/// Whether crash reports list every thread ([`Builder::all_threads`]).
pub fn all_threads_enabled() -> bool {
    ALL_THREADS.load(Ordering::Relaxed)
}
static ALT_STACK_SIZE: AtomicUsize = AtomicUsize::new(64 * 1024);
/// High end of the private stack the report runs on.
static REPORT_STACK: AtomicUsize = AtomicUsize::new(0);
const REPORT_STACK_SIZE: usize = 512 * 1024;
