//! Other threads' stacks: one thread's stack by tid, all-thread dumps, and a dump on a signal
//! (the JVM's `kill -3`, Android's ANR traces, Go's SIGQUIT).
//!
//! # How another thread's stack is captured
//! [`capture`] posts a request in a lock-free table and sends the thread a signal with
//! `tgkill` (a real-time signal by default, [`default_signal`]; configurable with
//! [`Builder::signal`]). The thread's handler runs [`crate::Capture::walk_ucontext`] on the
//! interrupted context into the request's slot, marks it done and wakes the requester with a
//! futex. So frame 0 is the thread's exact pc: for a thread blocked in a system call, the libc
//! wrapper of that call (`syscall`, `read`, `clock_nanosleep`, ...).
//!
//! * A thread that has the signal blocked, is stopped (`T`), or sleeps uninterruptibly (`D`)
//!   cannot run the handler: the request ends with [`Error::Timeout`] at its deadline, never a
//!   hang, and a late signal finds nothing to do.
//! * A thread that exits before it answers gives [`Error::ThreadGone`] (checked with
//!   `tgkill(tid, 0)` every 10 ms while waiting).
//! * Requests from several threads at once, and a request for the calling thread itself, work:
//!   each request has its own slot (64 in flight at most; a requester that finds none waits
//!   for one until its deadline).
//! * The handler never allocates, locks or blocks: atomics, one `Capture::walk_ucontext` into a
//!   static buffer, one `futex` wake. It keeps `errno`.
//!
//! # `EINTR` in the interrupted thread
//! The handler is installed with `SA_RESTART`, so the kernel restarts most interrupted system
//! calls and the program does not see the signal: `read`/`write` on pipes, sockets and
//! terminals, `wait`, `open` of a FIFO, `flock`/`fcntl(F_SETLKW)`, and `futex` waits (so
//! `std::sync::Mutex`, `Condvar`, `thread::park`, `JoinHandle::join`). Per signal(7), these
//! return `EINTR` whatever the flags: `nanosleep`/`clock_nanosleep`/`usleep` (std's
//! `thread::sleep` resumes the rest itself), `poll`/`ppoll`/`select`/`pselect`,
//! `epoll_wait`/`epoll_pwait`, `sigtimedwait`/`sigwaitinfo`/`sigsuspend`/`pause`,
//! `io_getevents`, `semop`/`semtimedop`, `msgrcv`/`msgsnd`, `inotify` reads before Linux 3.8,
//! and socket calls with a `SO_RCVTIMEO`/`SO_SNDTIMEO` timeout. Code that calls those directly
//! must retry on `EINTR` (most event loops do) — as it must for any other signal.
//!
//! # All threads
//! [`dump_all`] lists the threads from `/proc/self/task` (read with `getdents64`), and writes
//! each one's name, tid, state and CPU time (from `stat` and the thread's CPU clock) and its
//! symbolized stack in [`crate::dump_stack`]'s frame format. It is async-signal-safe: use it
//! from normal code, from [`install_dump_signal`]'s handler (dump and continue), or from the
//! crash handler ([`crate::crash::Builder::all_threads`]). Dumps, crash reports and
//! `dump_stack` share one lock, so each report is one uninterleaved block.
//!
//! A dump ends in bounded time whatever the threads do: a thread whose `/proc` status says it
//! cannot answer (the request signal blocked or ignored, or stopped) gets 20 ms instead of the
//! timeout and is listed as such (`no stack (request signal blocked)`,
//! [`DumpSummary::could_not_answer`]); the others share one overall deadline of four times the
//! timeout (a thread asked after it gets 20 ms). 1,000 threads that block the signal cost a
//! crash report about 1-2 s.
//!
//! ```
//! selftrace::init().expect("init");
//! let worker = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
//! let summary = selftrace::threads::dump_all(std::io::stderr());
//! assert!(summary.stacks >= 2);
//! worker.join().unwrap();
//! ```
//!
//! # What a dump shows
//!
//! The demo (`cargo run --release --features pprof,flamegraph --example demo`, part 6) holds a `Mutex` in one
//! thread and waits for it in another; both stacks show it (an excerpt):
//!
//! ```text
//! thread "holder" tid 8633, state S (sleeping), cpu 0.001s
//! Call Trace:
//!  #0 0x7f282d7af545 : clock_nanosleep+0x65/0x86 [libc.so.6+0xcf545]
//!  #1 0x55f1402bf8e7 : std::thread::functions::sleep+0x77/0xb6 [demo+0x1d38e7]
//!  #2 0x55f140166842 : demo::hold_the_lock+0x62/0x139 [demo+0x7a842]
//!  ...
//! thread "waiter" tid 8634, state S (sleeping), cpu 0.000s
//! Call Trace:
//!  #0 0x7f282d7e1827 : syscall+0x17/0x33 [libc.so.6+0x101827]
//!  #1 0x55f1402a9096 : <std::sys::sync::mutex::futex::Mutex>::lock_contended+0xb6/0xe7 [demo+0x1bd096]
//!  #2 0x55f140166afc : demo::wait_for_the_lock+0x6c/0xfd [demo+0x7aafc]
//!  ...
//! ```
#![allow(unsafe_code)]

pub(crate) mod dump;
pub(crate) mod request;

pub use crate::procfs::{info, ThreadInfo};
pub use dump::DumpSummary;
pub(crate) use request::cannot_answer;

use crate::error::Error;
use crate::sys;
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use core::time::Duration;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// The default time a thread has to answer: 1 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

static TIMEOUT_NS: AtomicU64 = AtomicU64::new(1_000_000_000);
/// 0 = not installed, 1 = being installed, 2 = installed.
static INSTALL: AtomicI32 = AtomicI32::new(0);
static DUMP_FD: AtomicI32 = AtomicI32::new(2);
static DUMP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The signal used to ask a thread for its stack unless configured otherwise: `SIGRTMIN + 4`
/// (glibc keeps the first real-time signals for itself; +4 stays clear of most runtimes).
pub fn default_signal() -> i32 {
    libc::SIGRTMIN() + 4
}

/// Installs the stack-request handler for [`default_signal`] (`SA_SIGINFO | SA_RESTART`).
/// Idempotent. Called by [`capture`] and [`dump_all`] when needed, so calling it is
/// optional; calling it early makes a conflict show up at start-up.
///
/// A handler the program installed for the signal before is kept: it is called for every
/// signal that carries no stack request for the thread (chaining, as signal-hook does).
/// [`uninstall`] removes ours again.
///
/// # Errors
/// [`Error::Sys`] when `sigaction` fails, [`Error::Timeout`] when another installation did not
/// finish within a second.
///
/// # Async-signal safety
/// Async-signal-safe (`sigaction` only).
pub fn install() -> Result<(), Error> {
    if INSTALL.load(Ordering::Acquire) == 2 {
        return Ok(());
    }
    install_with_signal(default_signal())
}

/// Installs the stack-request handler for `sig` ([`Builder::signal`], [`Builder::install`]).
fn install_with_signal(sig: i32) -> Result<(), Error> {
    // Not a fault signal (a request would be taken for a crash), nor the crash handler's, the
    // dump signal or a running profiler's.
    sys::signal::check_use(sig, sys::signal::Owner::Request)?;
    // One installer at a time; others wait for it (it takes two system calls), but not
    // forever: a signal handler that interrupted the installing thread itself would wait for
    // itself.
    let mut waited_ms = 0;
    loop {
        match INSTALL.compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => break,
            Err(2) if request::SIGNAL.load(Ordering::Acquire) == sig => return Ok(()),
            Err(2) => {
                if INSTALL
                    .compare_exchange(2, 1, Ordering::Acquire, Ordering::Acquire)
                    .is_ok()
                {
                    break;
                }
            }
            Err(_) if waited_ms < 1000 => {
                sys::sleep_ns(1_000_000);
                waited_ms += 1;
            }
            Err(_) => return Err(Error::Timeout),
        }
    }
    let result = (|| {
        // A handler that was there is kept and called for the signals that carry no request
        // for the thread (`sys::signal`'s policy).
        sys::signal::take(sig, request::on_capture_signal, libc::SA_RESTART)?;
        request::SIGNAL.store(sig, Ordering::Release);
        sys::signal::set_owner(sig, Some(sys::signal::Owner::Request));
        Ok(())
    })();
    let installed = request::SIGNAL.load(Ordering::Acquire) != 0;
    INSTALL.store(if installed { 2 } else { 0 }, Ordering::Release);
    result
}

/// Removes the stack-request handler: the action that was there before [`install`] comes back,
/// except that `SIG_DFL` becomes `SIG_IGN` (the default action of a real-time signal kills the
/// process, and the request signal of a capture that timed out may still arrive). Captures
/// in flight end with [`Error::Timeout`]; later captures, dumps and crash reports with every
/// thread install the handler again. Does nothing when it is not installed.
///
/// # Errors
/// [`Error::Sys`] when `sigaction` fails, [`Error::Timeout`] when an installation did not finish
/// within a second.
///
/// # Async-signal safety
/// Async-signal-safe (`sigaction` only).
pub fn uninstall() -> Result<(), Error> {
    let mut waited_ms = 0;
    loop {
        match INSTALL.compare_exchange(2, 1, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => break,
            Err(0) => return Ok(()),
            Err(_) if waited_ms < 1000 => {
                sys::sleep_ns(1_000_000);
                waited_ms += 1;
            }
            Err(_) => return Err(Error::Timeout),
        }
    }
    let sig = request::SIGNAL.load(Ordering::Acquire);
    let result = sys::signal::give_back(sig, request::on_capture_signal, true);
    if result.is_ok() {
        request::SIGNAL.store(0, Ordering::Release);
        sys::signal::set_owner(sig, None);
    }
    INSTALL.store(if result.is_ok() { 0 } else { 2 }, Ordering::Release);
    result
}

/// In a forked child (one thread; see `crate::fork`): stack requests of the parent's threads are
/// gone, and an installation another thread of the parent had under way is settled (as
/// installed if it got as far as publishing the signal), so that the child does not wait for
/// it.
pub(crate) fn after_fork() {
    request::after_fork();
    if INSTALL.load(Ordering::Relaxed) == 1 {
        let installed = request::SIGNAL.load(Ordering::Relaxed) != 0;
        INSTALL.store(if installed { 2 } else { 0 }, Ordering::Release);
    }
}

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::THREADS, after_fork);

/// The signal stacks are requested with, if the handler is installed.
pub fn signal() -> Option<i32> {
    match request::SIGNAL.load(Ordering::Acquire) {
        0 => None,
        s => Some(s),
    }
}

/// Settings of the stack requests; [`builder`] gives the defaults, [`Builder::install`] applies
/// them. Optional: [`install`] (which the capturing functions call) uses the defaults.
#[must_use = "a builder does nothing until `install` is called"]
#[derive(Clone, Debug, Default)]
pub struct Builder {
    signal: Option<i32>,
    timeout: Option<Duration>,
}

/// The defaults: [`default_signal`], [`DEFAULT_TIMEOUT`].
pub fn builder() -> Builder {
    Builder::default()
}

impl Builder {
    /// The signal stacks are requested with (default [`default_signal`]): one the program does
    /// not use otherwise, ideally a real-time one (those queue instead of merging).
    pub fn signal(mut self, sig: i32) -> Builder {
        self.signal = Some(sig);
        self
    }

    /// How long [`dump_all`], the dump signal and the crash report wait for each thread
    /// (default [`DEFAULT_TIMEOUT`]; 1 ms to 10 minutes).
    pub fn timeout(mut self, timeout: Duration) -> Builder {
        self.timeout = Some(timeout);
        self
    }

    /// Applies the timeout and installs the stack-request handler for the signal; later
    /// requests use it.
    ///
    /// A handler the program installed for the signal is kept and chained to (see
    /// [`install`]).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a signal that cannot be caught, a synchronous fault signal
    /// (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`, `SIGTRAP`, `SIGSYS`: a request would be taken
    /// for a crash), or one that selftrace uses for something else (the crash handler's, the
    /// dump signal, a running profiler's; the message names it) or a timeout out of range,
    /// [`Error::Timeout`] when another installation did not finish within a second.
    pub fn install(self) -> Result<(), Error> {
        if let Some(t) = self.timeout {
            if t < Duration::from_millis(1) || t > Duration::from_secs(600) {
                return Err(Error::InvalidInput(
                    "the per-thread timeout must be 1 ms to 10 minutes",
                ));
            }
        }
        if let Some(t) = self.timeout {
            TIMEOUT_NS.store(duration_ns(t), Ordering::Relaxed);
        }
        match self.signal {
            Some(sig) => install_with_signal(sig),
            None => install(),
        }
    }
}

/// The per-thread timeout of dumps (see [`Builder::timeout`]).
pub fn timeout() -> Duration {
    Duration::from_nanos(TIMEOUT_NS.load(Ordering::Relaxed))
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// The calling thread's id (`gettid(2)`).
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn current_tid() -> i32 {
    sys::gettid()
}

/// Captures the stack of thread `tid` of this process into `buf` (at most 256 frames) and says
/// how the thread's walk ended (complete, buffer full, or truncated and why). Frame 0 is the
/// thread's exact pc (see the module docs); for the calling thread itself with the request
/// signal blocked, frame 0 is in this function. The [`Walk`](crate::Walk) carries the record
/// of exact frames of the walk the thread did ([`Walk::frame_kinds`](crate::Walk::frame_kinds)).
///
/// # Errors
/// [`Error::InvalidInput`] for a `tid` that is not positive (no thread has one),
/// [`Error::Timeout`] when the thread does not answer within `timeout` (signal blocked,
/// stopped, uninterruptible sleep), [`Error::ThreadGone`] when it does not exist or exits
/// meanwhile, and the errors of [`install`].
///
/// # Async-signal safety
/// Async-signal-safe. The requester takes at most [`crate::SIGNAL_STACK_BUDGET`] bytes of its
/// stack; the stack-request handler, on the thread asked (on its own stack: it is installed
/// without `SA_ONSTACK`), takes as much as [`crate::Capture::walk_ucontext`] below its signal
/// frame.
#[inline(never)]
pub fn capture(
    tid: i32,
    buf: &mut [usize],
    timeout: Duration,
) -> Result<crate::unwind::Walk, Error> {
    if tid <= 0 {
        return Err(Error::InvalidInput(
            "thread id must be positive (a tid of this process)",
        ));
    }
    install()?;
    let deadline = sys::monotonic_ns().saturating_add(duration_ns(timeout));
    if tid == sys::gettid() && sys::is_blocked(request::SIGNAL.load(Ordering::Relaxed)) {
        return Ok(crate::unwind::Capture::new().walk(buf));
    }
    loop {
        match request::post(tid) {
            Ok(Some(t)) => {
                return match request::wait_one(&t, deadline, buf) {
                    request::Answer::Frames(frames, end, kinds) => {
                        let mut walk = crate::unwind::Walk::new(frames, end);
                        walk.kinds = kinds;
                        Ok(walk)
                    }
                    request::Answer::Timeout | request::Answer::Cannot(_) => Err(Error::Timeout),
                    request::Answer::Gone => Err(Error::ThreadGone),
                };
            }
            Err(request::Answer::Gone) => return Err(Error::ThreadGone),
            Err(_) => return Err(Error::Timeout),
            // Every slot is busy: wait for one until the deadline.
            Ok(None) if sys::monotonic_ns() < deadline => sys::sleep_ns(1_000_000),
            Ok(None) => return Err(Error::Timeout),
        }
    }
}

/// Writes the ids of this process's threads (from `/proc/self/task`) into `buf`; returns how
/// many there are (which may exceed `buf.len()`: only the first fit).
///
/// # Errors
/// [`Error::Sys`] when `/proc/self/task` cannot be read.
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn list(buf: &mut [i32]) -> Result<usize, Error> {
    let mut n = 0;
    sys::for_each_task(|tid| {
        if let Some(slot) = buf.get_mut(n) {
            *slot = tid;
        }
        n += 1;
    })?;
    Ok(n)
}

/// Writes every thread's name, tid, state, CPU time and stack to `fd` (see the module docs),
/// waiting up to [`timeout`] for each thread. Returns what the dump saw.
///
/// # Async-signal safety
/// Async-signal-safe.
///
/// # Stack
/// At most [`crate::SIGNAL_STACK_BUDGET`] bytes of the caller's stack: the calling thread's
/// own stack is captured there, then the dump moves to one of selftrace's private stacks
/// (mapped by [`crate::init`]). When all of them are busy and less than 64 KiB is left (the
/// bounds of the alternate signal stack or of the thread's stack), the dump lists no thread
/// and says so (`not listed: N bytes of stack left, and no private stack free`). Each other
/// thread answers on its own stack (see [`capture`]).
pub fn dump_all(fd: impl AsFd) -> DumpSummary {
    dump_all_with_timeout(fd, timeout())
}

/// [`dump_all`] with an explicit per-thread timeout.
///
/// # Async-signal safety
/// Async-signal-safe; the stack it needs as [`dump_all`].
pub fn dump_all_with_timeout(fd: impl AsFd, timeout: Duration) -> DumpSummary {
    if install().is_err() {
        // Without the handler every thread would time out; still list them.
    }
    dump::dump_all(fd.as_fd().as_raw_fd(), duration_ns(timeout))
}

/// [`dump_all`] into any writer (a `String`'s bytes, an HTTP response body, a log): the dump
/// is written into an anonymous in-memory file (`memfd_create`), then copied to `out`. Normal
/// context (it allocates a buffer for the copy).
///
/// ```
/// let mut text = Vec::new();
/// let summary = selftrace::threads::dump_all_to(&mut text)?;
/// assert!(String::from_utf8_lossy(&text).contains("---[ end of all threads ]---"));
/// assert!(summary.threads >= 1);
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
/// Those of `memfd_create` (no anonymous file: a kernel before 3.17, a seccomp filter), of
/// reading it back, and of `out`.
pub fn dump_all_to(mut out: impl std::io::Write) -> std::io::Result<DumpSummary> {
    let (summary, text) = through_anonymous_file(dump_all_raw)?;
    out.write_all(&text)?;
    Ok(summary)
}

/// What `write` writes to an fd, as bytes: the report writers write to fds; this gives them
/// an anonymous in-memory file (`memfd_create`) and reads it back. Normal context.
pub(crate) fn through_anonymous_file<R>(
    write: impl FnOnce(i32) -> R,
) -> std::io::Result<(R, Vec<u8>)> {
    use std::io::{Read, Seek};
    let fd = sys::memfd_create(c"selftrace-report")
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno().unwrap_or(libc::EIO)))?;
    let r = write(fd.as_raw_fd());
    let mut file = std::fs::File::from(fd);
    file.rewind()?;
    let mut text = Vec::new();
    file.read_to_end(&mut text)?;
    Ok((r, text))
}

/// [`dump_all`] to a raw fd (the watchdog's and the crash handler's configured fds).
pub(crate) fn dump_all_raw(fd: i32) -> DumpSummary {
    let _ = install();
    dump::dump_all(fd, duration_ns(timeout()))
}

/// Installs a handler for `sig` (typically `SIGQUIT`) that writes [`dump_all`] to stderr and
/// lets the program continue, like the JVM's `kill -3`. See [`install_dump_signal_to`].
///
/// The handler runs on the stack of the thread the signal is delivered to (installed without
/// `SA_ONSTACK`) and takes as much of it as [`dump_all`] does (its signal frame, then at most
/// [`crate::SIGNAL_STACK_BUDGET`] bytes): it works on threads spawned with 32 KiB stacks.
///
/// # Errors
/// As [`install_dump_signal_to`].
pub fn install_dump_signal(sig: i32) -> Result<(), Error> {
    install_dump_signal_fd(sig, 2)
}

/// Like [`install_dump_signal`], writing the dump to `fd` (a [`std::fs::File`], a pipe's write
/// end), which is kept open for the rest of the process (the signal may come at any time), also
/// if the signal is installed again with another fd. The handler is installed with
/// `SA_RESTART`. A handler the program installed for the signal is kept and called after each
/// dump; its default action (for `SIGQUIT`: a core dump) is not. [`uninstall_dump_signal`]
/// puts the previous action back; installing another signal gives the first one back.
///
/// # Errors
/// [`Error::InvalidInput`] for a signal that cannot be caught, a synchronous fault signal, or
/// one that selftrace uses for something else (the stack-request signal, the crash handler's,
/// a running profiler's: every tick would dump every thread; the message names it), the
/// errors of [`install`] and of [`crate::init`], [`Error::Sys`] when `sigaction` fails.
pub fn install_dump_signal_to(sig: i32, fd: impl Into<OwnedFd>) -> Result<(), Error> {
    let fd: OwnedFd = fd.into();
    install_dump_signal_fd(sig, fd.as_raw_fd())?;
    // Never closed: the handler writes to it from now on (closed instead if that failed).
    sys::keep_open(fd);
    Ok(())
}

fn install_dump_signal_fd(sig: i32, fd: i32) -> Result<(), Error> {
    if !(1..=64).contains(&sig) || sig == libc::SIGKILL || sig == libc::SIGSTOP {
        return Err(Error::InvalidInput("signal cannot be handled"));
    }
    install()?;
    // Not a fault signal, nor the stack-request signal, the crash handler's or a running
    // profiler's (every tick would dump every thread).
    sys::signal::check_use(sig, sys::signal::Owner::Dump)?;
    // The index, without waiting for the background indexer: a dump meanwhile names the
    // frames of an object it has not finished by object and offset.
    crate::setup::init()?;
    crate::symbolize::rebuild();
    DUMP_FD.store(fd, Ordering::Relaxed);
    let before = DUMP_SIGNAL.load(Ordering::Relaxed);
    if before != 0 && before != sig {
        sys::signal::give_back(before, on_dump_signal, false)?;
        sys::signal::set_owner(before, None);
    }
    sys::signal::take(sig, on_dump_signal, libc::SA_RESTART)?;
    DUMP_SIGNAL.store(sig, Ordering::Relaxed);
    sys::signal::set_owner(sig, Some(sys::signal::Owner::Dump));
    Ok(())
}

/// Removes the dump handler of [`install_dump_signal`]: the signal's previous action comes back
/// (for `SIGQUIT` usually the default, a core dump). Does nothing when none is installed. The
/// dump's fd stays open.
///
/// # Errors
/// [`Error::Sys`] when `sigaction` fails.
pub fn uninstall_dump_signal() -> Result<(), Error> {
    let sig = DUMP_SIGNAL.load(Ordering::Relaxed);
    if sig == 0 {
        return Ok(());
    }
    sys::signal::give_back(sig, on_dump_signal, false)?;
    DUMP_SIGNAL.store(0, Ordering::Relaxed);
    sys::signal::set_owner(sig, None);
    Ok(())
}

extern "C" fn on_dump_signal(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let _errno = sys::signal::ErrnoGuard::new();
    dump::dump_all(
        DUMP_FD.load(Ordering::Relaxed),
        TIMEOUT_NS.load(Ordering::Relaxed),
    );
    // What must be written in normal context (the task dump): a thread waits for this byte.
    let notify = AFTER_DUMP.load(Ordering::Relaxed);
    if notify >= 0 {
        let _ = sys::write_all(notify, &[1]);
    }
    sys::signal::call_previous(sig, info, uc);
}

/// The write end of a pipe that the dump signal's handler writes a byte into after each
/// dump (-1: none): the task dump's thread ([`crate::tasks::dump_on_signal`]) waits on it.
pub(crate) static AFTER_DUMP: AtomicI32 = AtomicI32::new(-1);

/// The fd the dump signal writes to (stderr unless [`install_dump_signal_to`] gave another).
pub(crate) fn dump_signal_fd() -> i32 {
    DUMP_FD.load(Ordering::Relaxed)
}

/// For the crash report: every thread but `skip` (the crashing one), with the shared objects
/// list written by the caller.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn write_other_threads(fd: i32, skip: i32) {
    let out = crate::report::Out { fd };
    if install().is_err() {
        out.line(|w| w.push_bytes(b"(stack-request handler not installed)"));
    }
    out.line(|w| w.push_bytes(b"Other threads:"));
    let mut objects = crate::report::Objects::new();
    dump::threads_section(
        out,
        skip,
        TIMEOUT_NS.load(Ordering::Relaxed),
        &mut objects,
        None,
    );
    objects.write(out);
}

/// Writes one thread's header and stack (or why there is none), with file:line and inlined
/// functions, for the watchdog's reports. Normal context only: resolving allocates.
pub(crate) fn write_thread(
    fd: i32,
    tid: i32,
    info: Option<&ThreadInfo>,
    stack: Result<(&[usize], crate::unwind::WalkEnd, crate::unwind::FrameKinds), Error>,
) {
    let out = crate::report::Out { fd };
    dump::thread_header(out, tid, info);
    let mut objects = crate::report::Objects::new();
    let none = crate::report::Lines::NONE;
    match stack {
        Ok((frames, end, kinds)) => {
            // Normal context: file:line and inlined functions, resolved here.
            let lines = crate::report::OwnedLines::resolve(frames, kinds);
            dump::thread_body(
                out,
                request::Answer::Frames(frames.len(), end, kinds),
                frames,
                &mut objects,
                lines.lines(),
            )
        }
        Err(Error::ThreadGone) => {
            dump::thread_body(out, request::Answer::Gone, &[], &mut objects, none)
        }
        Err(_) => dump::thread_body(out, request::Answer::Timeout, &[], &mut objects, none),
    }
    objects.write(out);
}
