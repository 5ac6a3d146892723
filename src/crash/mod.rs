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
//! file of a directory, itself, without ptrace or a helper process; [`upload`] sends such files
//! to a crash server on the next start.
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
#![allow(unsafe_code)]

mod names;
mod panic;
mod symbolizer;
pub mod upload;

use crate::report::{self, lock, Out};
use crate::symbolize;
use crate::sys;
use crate::Error;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
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

/// Where crash dumps go.
#[derive(Clone, Debug)]
enum MinidumpTo {
    Dir(PathBuf),
    Fd(Arc<OwnedFd>),
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
        crate::init()?;
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
                .map_err(|e| Error::Sys {
                    call: "open",
                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                })?
                .into_raw_fd(),
            // Never closed: a handler may write to it at any time from now on.
            (None, Some(fd)) => sys::keep_open(fd),
            (None, None) => 2,
        };
        OUT_FD.store(fd, Ordering::Relaxed);
        ALT_STACK_SIZE.store(self.alt_stack_size, Ordering::Relaxed);
        if REPORT_STACK.load(Ordering::Relaxed) == 0 {
            let top = sys::map_stack(REPORT_STACK_SIZE).ok_or(Error::Sys {
                call: "mmap",
                errno: sys::errno(),
            })?;
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
    let top = sys::map_stack(want).ok_or(Error::Sys {
        call: "mmap",
        errno: sys::errno(),
    })?;
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
        let walk = crate::Capture::new().walk(frames);
        let frames = &frames[..walk.frames];
        on.run(&mut || write_dump_stack(out, frames, walk.end, None));
        return;
    }
    let mut frames = [0usize; 64];
    let walk = crate::Capture::new().walk(&mut frames);
    let short = sys::stack::room().filter(|&r| r < REPORT_STACK_NEED);
    write_dump_stack(out, &frames[..walk.frames], walk.end, short);
}

/// Bytes of stack that a report's symbolizing and formatting take (at most, measured in a debug
/// build: 16 KiB for `dump_stack`, 37 KiB for `dump_all`, with room to spare), when no private
/// stack is free.
pub(crate) const REPORT_STACK_NEED: usize = 64 * 1024;

/// `dump_stack`'s text; with `short: Some(room)`, raw addresses only (a stack too small for
/// the symbolizer: `room` bytes left).
fn write_dump_stack(out: Out, frames: &[usize], end: crate::WalkEnd, short: Option<usize>) {
    let lock = ReportLock::acquire();
    out.line(|w| w.push_bytes(b"------------[ selftrace: dump_stack ]------------"));
    report::who(out);
    match short {
        None => {
            report::call_trace(out, frames, false, end);
            report::objects(out, frames);
        }
        Some(room) => report::raw_call_trace(out, frames, end, room),
    }
    out.line(|w| w.push_bytes(b"---[ end of dump_stack ]---"));
    drop(lock);
}

// ---- state ----------------------------------------------------------------------------------

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
/// Frames of the crashing stack (used by one report at a time, under the report lock).
const MAX_CRASH_FRAMES: usize = 16 * 1024;

struct Shared<T>(UnsafeCell<T>);
// SAFETY: access is serialised by the report lock (or, for PREV, by writing before the handler
// is installed and only reading afterwards), so a value is used by one thread at a time; that
// moves it between threads, hence `T: Send`.
unsafe impl<T: Send> Sync for Shared<T> {}

static CRASH_FRAMES: Shared<[usize; MAX_CRASH_FRAMES]> =
    Shared(UnsafeCell::new([0; MAX_CRASH_FRAMES]));

/// The signals whose handler is ours (bit `sig - 1`), for [`uninstall`].
static TAKEN: AtomicU64 = AtomicU64::new(0);
/// Whether the panic hook reports (cleared by [`uninstall`]; the hook itself stays and then
/// only calls the hook installed before it).
static PANIC_REPORTS: AtomicBool = AtomicBool::new(false);
/// Whether panics that a `catch_unwind` below the thread's start catches are reported too
/// ([`Builder::caught_panics`]).
static CAUGHT_PANICS: AtomicBool = AtomicBool::new(true);
/// Signals whose previous handler is std's stack-overflow handler: not chained (it would
/// abort, and the process would die by SIGABRT instead of the original signal; selftrace
/// reports stack overflows itself).
static SKIP_CHAIN: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

/// The report lock: one report at a time, across threads, shared with all-thread dumps (see
/// `lock`).
use lock::OutputLock as ReportLock;

/// Takes `sig` for the crash handler, which runs with every signal but those in `open` (bit
/// `n - 1` for signal `n`) blocked from the moment the kernel delivers it.
fn install_signal(sig: i32, open: u64) -> Result<(), Error> {
    let ours = on_fatal_signal as *const () as usize;
    let current = sys::current_handler(sig).map_err(|errno| Error::Sys {
        call: "sigaction",
        errno,
    })?;
    if current != ours {
        let is_std = symbolize::symbolize(current).is_some_and(|s| {
            let mut buf = [0u8; 256];
            s.demangle_into(&mut buf)
                .is_some_and(|n| n.starts_with("std::") && n.contains("stack_overflow"))
        });
        SKIP_CHAIN[sig as usize].store(is_std, Ordering::Relaxed);
    }
    // The action that was there is kept and called after the report (`sys::signal`).
    sys::signal::take_masked(sig, on_fatal_signal, libc::SA_ONSTACK, Some(open)).map_err(
        |errno| Error::Sys {
            call: "sigaction",
            errno,
        },
    )?;
    TAKEN.fetch_or(1 << (sig - 1), Ordering::SeqCst);
    sys::signal::set_owner(sig, Some(sys::signal::Owner::Crash));
    Ok(())
}

/// Removes the crash handler: every signal [`Builder::install`] took gets back the action it
/// had before (std's stack-overflow handler, the program's handler, or the default), and the
/// panic hook of [`Builder::panic_hook`] stops reporting (it stays installed and calls the hook
/// that was there before it: a hook cannot be taken out from under hooks set after it). The
/// alternate signal stacks, the report's fd and the symbolizer process (idle) stay. A signal
/// whose handler someone replaced after ours keeps theirs. Installing again works.
///
/// # Errors
/// [`Error::Sys`] when `sigaction` fails (the other signals are still given back).
pub fn uninstall() -> Result<(), Error> {
    PANIC_REPORTS.store(false, Ordering::SeqCst);
    let taken = TAKEN.swap(0, Ordering::SeqCst);
    let mut result = Ok(());
    for sig in 1..=64 {
        if taken & (1 << (sig - 1)) != 0 {
            match sys::signal::give_back(sig, on_fatal_signal, false) {
                Ok(()) => sys::signal::set_owner(sig, None),
                Err(errno) => {
                    TAKEN.fetch_or(1 << (sig - 1), Ordering::SeqCst);
                    result = Err(Error::Sys {
                        call: "sigaction",
                        errno,
                    });
                }
            }
        }
    }
    result
}

/// Everything the report needs, passed to it on the private stack.
struct Crash {
    sig: i32,
    info: *const libc::siginfo_t,
    uc: *const libc::ucontext_t,
}

extern "C" fn on_fatal_signal(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let errno = sys::errno();
    let tid = sys::gettid();
    if lock::owner() == tid && IN_CRASH.load(Ordering::Relaxed) == tid {
        // A crash inside our own report: give up at once, die by the default action.
        die(sig);
        return;
    }
    // Nothing asynchronous runs on this thread from here on: a stack request or a profiler
    // tick nested on a small alternate stack (std gives its threads 8 KiB; two signal frames
    // take 6.8 KiB of it with AVX-512) could overflow it, and a fault with the crash signal
    // blocked kills the process without any report. The handler's `sa_mask` blocks them as
    // the kernel delivers the crash (a signal pending at that moment would otherwise run
    // first, nested: seen as a crash with no report in the two-crashes minidump test); a crash
    // signal that a later `install` took stays blocked here. Another thread's request
    // for this thread's stack times out instead; a minidump takes the context from
    // `lock::publish_waiting` below. The crash signals stay open.
    sys::signal::block_all_except(TAKEN.load(Ordering::Relaxed));
    // While this thread waits for the report lock, a minidump being written (which holds it)
    // takes this thread's context at its own fault from here (`lock::waiting_fault`).
    let waiting = lock::publish_waiting(tid, uc as *const libc::ucontext_t);
    let lock = ReportLock::acquire();
    lock::unpublish_waiting(waiting);
    IN_CRASH.store(tid, Ordering::Relaxed);
    let crash = Crash {
        sig,
        info,
        uc: uc as *const libc::ucontext_t,
    };
    let top = REPORT_STACK.load(Ordering::Relaxed);
    if top != 0 && lock.release {
        // SAFETY: the report stack is ours while we hold the report lock; `report_entry` does
        // not unwind.
        unsafe {
            sys::call_on_stack(
                top,
                report_entry,
                &crash as *const Crash as *mut libc::c_void,
            )
        };
    } else {
        write_report(&crash);
    }
    chain(sig, info, uc);
    // Keep the lock: other crashing threads wait while this one dies.
    core::mem::forget(lock);
    // SAFETY: restoring errno for the (unlikely) case that the process survives.
    unsafe { *libc::__errno_location() = errno };
    die(sig);
}

/// In a forked child (one thread; see `crate::fork`): the report lock is free, no thread of
/// the parent waits for it, and the symbolizer process (which serves the parent, through
/// pipes the child would share with it) is not used: the child's reports name functions
/// without file:line, unless the child installs the crash handler again (a symbolizer of its
/// own).
pub(crate) fn after_fork() {
    lock::after_fork();
    symbolizer::after_fork();
}

/// Whether crash dumps are configured ([`Builder::minidump`], [`Builder::minidump_fd`]).
#[cfg(feature = "threads")]
pub(crate) fn minidump_configured() -> bool {
    MINIDUMP_DIR.load(Ordering::Relaxed) >= 0 || MINIDUMP_FD.load(Ordering::Relaxed) >= 0
}

/// The thread inside a crash report (to detect a crash in the handler itself).
static IN_CRASH: AtomicI32 = AtomicI32::new(0);

extern "C" fn report_entry(crash: *mut libc::c_void) {
    // SAFETY: on_fatal_signal passes a pointer to its live Crash and waits for us.
    let crash = unsafe { &*(crash as *const Crash) };
    write_report(crash);
}

fn write_report(c: &Crash) {
    let out = Out {
        fd: OUT_FD.load(Ordering::Relaxed),
    };
    // SAFETY: info is the kernel's siginfo for this signal (or null).
    let (code, addr) = match unsafe { c.info.as_ref() } {
        // SAFETY: si_addr is meaningful for the fault signals, harmless to read otherwise.
        Some(i) => (i.si_code, unsafe { i.si_addr() } as usize),
        None => (0, 0),
    };
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
        crate::Capture::new().walk(frames)
    } else {
        // SAFETY: uc is the kernel's ucontext for this signal.
        unsafe { crate::Capture::new().walk_ucontext(c.uc, frames) }
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
    let answered = symbolizer::ask(&frames[..n], &indices[..k], !c.uc.is_null(), text, spans);
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
    report::call_trace_with_lines(out, &frames[..n], !c.uc.is_null(), walk.end, lines);
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
        crate::threads::write_other_threads(out.fd, sys::gettid());
    }
    if !c.uc.is_null() {
        let fault = crate::minidump::Fault {
            sig: c.sig,
            code,
            addr,
            tid: sys::gettid(),
            uc: c.uc,
        };
        write_minidump(out, &fault);
    }
    out.line(|w| w.push_bytes(b"---[ end of report ]---"));
}

// ---- minidumps -----------------------------------------------------------------------------

/// The directory crash dumps go to (-1: none).
static MINIDUMP_DIR: AtomicI32 = AtomicI32::new(-1);
/// The file crash dumps go to (-1: none).
static MINIDUMP_FD: AtomicI32 = AtomicI32::new(-1);
static MINIDUMP_STACK: AtomicUsize = AtomicUsize::new(crate::minidump::DEFAULT_STACK_SIZE);
static MINIDUMP_ENVIRON: AtomicBool = AtomicBool::new(false);
/// The directory's path as given, for the report (`MINIDUMP_DIR_LEN` bytes; atomics, since a
/// second install may write it while a crash reads it).
static MINIDUMP_DIR_PATH: [AtomicU8; 512] = [const { AtomicU8::new(0) }; 512];
static MINIDUMP_DIR_LEN: AtomicUsize = AtomicUsize::new(0);

fn install_minidump(to: &MinidumpTo, options: crate::minidump::Options) -> Result<(), Error> {
    if !crate::minidump::SUPPORTED {
        return Err(Error::Unsupported("minidumps on this architecture"));
    }
    options.check()?;
    #[cfg(feature = "threads")]
    crate::threads::install()?;
    MINIDUMP_STACK.store(options.get_stack_size(), Ordering::Relaxed);
    MINIDUMP_ENVIRON.store(options.get_environ(), Ordering::Relaxed);
    match to {
        MinidumpTo::Dir(dir) => {
            let dir_fd = crate::minidump::open_dir(dir)?;
            let path = dir.as_os_str().as_bytes();
            let len = path.len().min(512);
            for (slot, &b) in MINIDUMP_DIR_PATH.iter().zip(&path[..len]) {
                slot.store(b, Ordering::Relaxed);
            }
            MINIDUMP_DIR_LEN.store(len, Ordering::Release);
            // The one before is never closed: a handler may be using it.
            MINIDUMP_DIR.store(dir_fd, Ordering::Release);
            MINIDUMP_FD.store(-1, Ordering::Release);
        }
        MinidumpTo::Fd(fd) => {
            // SAFETY: lseek has no memory effects.
            if unsafe { libc::lseek64(fd.as_raw_fd(), 0, libc::SEEK_CUR) } < 0 {
                return Err(Error::InvalidInput(
                    "a minidump needs a seekable file, not a pipe or socket",
                ));
            }
            if crate::minidump::appends(fd.as_raw_fd()) {
                return Err(Error::InvalidInput(
                    "a minidump cannot be written to an O_APPEND file (pwrite would append)",
                ));
            }
            MINIDUMP_FD.store(sys::keep_open(Arc::clone(fd)), Ordering::Release);
            MINIDUMP_DIR.store(-1, Ordering::Release);
        }
    }
    Ok(())
}

/// Writes the crash's minidump, if configured, and says so in the report.
fn write_minidump(out: Out, fault: &crate::minidump::Fault) {
    let dir = MINIDUMP_DIR.load(Ordering::Acquire);
    let file = MINIDUMP_FD.load(Ordering::Acquire);
    if dir < 0 && file < 0 {
        return;
    }
    let mut name = [0u8; 48];
    let (fd, name_len) = if dir >= 0 {
        match crate::minidump::create_in(dir, &mut name) {
            Ok(created) => created,
            Err(errno) => {
                out.line(|w| {
                    w.push_bytes(b"minidump: not written: cannot create a file: errno ");
                    w.push_dec(errno as u64);
                });
                return;
            }
        }
    } else {
        (file, 0)
    };
    let options = crate::minidump::Options::new()
        .stack_size(MINIDUMP_STACK.load(Ordering::Relaxed))
        .environ(MINIDUMP_ENVIRON.load(Ordering::Relaxed));
    #[cfg(feature = "threads")]
    let timeout = crate::threads::timeout().as_nanos() as u64;
    #[cfg(not(feature = "threads"))]
    let timeout = 0;
    let mut result = crate::minidump::write(fd, Some(fault), &options, timeout);
    if dir >= 0 {
        // SAFETY: fsync has no memory effects; the dump should survive a power cut.
        unsafe { libc::fsync(fd) };
        sys::close(fd);
        if let Err(errno) = crate::minidump::finish_in(dir, &name[..name_len], result.is_ok()) {
            if result.is_ok() {
                result = Err(Error::Sys {
                    call: "renameat",
                    errno,
                });
            }
        }
    }
    out.line(|w| {
        match result {
            Ok(s) => {
                w.push_bytes(b"minidump: ");
                if dir >= 0 {
                    let len = MINIDUMP_DIR_LEN.load(Ordering::Acquire);
                    for b in &MINIDUMP_DIR_PATH[..len] {
                        w.push_bytes(&[b.load(Ordering::Relaxed)]);
                    }
                    w.push_bytes(b"/");
                    w.push_bytes(&name[..name_len]);
                } else {
                    w.push_bytes(b"fd ");
                    w.push_dec(fd as u64);
                }
                w.push_bytes(b" (");
                w.push_dec(s.threads() as u64);
                w.push_bytes(b" threads, ");
                if s.threads_left_out() > 0 {
                    w.push_dec(s.threads_left_out() as u64);
                    w.push_bytes(b" more left out (a dump holds at most ");
                    w.push_dec(crate::minidump::MAX_THREADS as u64);
                    w.push_bytes(b"), ");
                }
                w.push_dec(s.threads_with_context() as u64);
                w.push_bytes(b" with registers and stack, ");
                w.push_dec(s.modules() as u64);
                w.push_bytes(b" modules, ");
                w.push_dec(s.bytes());
                w.push_bytes(b" bytes)");
            }
            Err(e) => {
                w.push_bytes(b"minidump: not written: ");
                push_error(w, e);
            }
        };
    });
}

/// An [`Error`] in a report line, without `fmt` (async-signal-safe).
fn push_error(w: &mut crate::symbolize::FixedBuf<'_>, e: Error) {
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

/// Calls the action that was installed before ours (a function; not `SIG_DFL` or `SIG_IGN`).
fn chain(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    if SKIP_CHAIN[sig as usize].load(Ordering::Relaxed) {
        return;
    }
    sys::signal::call_previous(sig, info, uc);
}

/// Restores the default action and re-raises `sig` at this thread. The signal stays pending
/// (blocked while the handler runs) and kills the process when the handler returns.
fn die(sig: i32) {
    // SAFETY: all-zero is a valid sigaction; SIG_DFL is 0.
    let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_DFL;
    // SAFETY: sa is valid; sigaction and tgkill are async-signal-safe.
    unsafe {
        libc::sigaction(sig, &sa, core::ptr::null_mut());
        libc::syscall(libc::SYS_tgkill, libc::getpid(), sys::gettid(), sig);
    }
}
