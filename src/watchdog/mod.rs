//! A stall watchdog: threads check in, a monitor thread reports the ones that stop.
//!
//! A thread registers with [`watch`] (`watch("worker")`) and calls [`Watch::pet`] (or the free
//! [`pet`]) in its loop: one relaxed load of the monitor's clock and one relaxed store, about a
//! nanosecond. The monitor thread (named `watchdog`, started by the first [`watch`]) wakes every
//! [`Builder::period`] (default 100 ms) and checks each watched thread's last pet against its
//! timeout. A thread that misses its deadline gets **one** report, not one per tick:
//!
//! ```text
//! ------------[ selftrace: watchdog ]------------
//! watchdog: BUG: soft lockup - thread worker:4243 stuck for 1.200s! (timeout 1.000s)
//! busy: the thread used 1.196s of cpu in the last 1.200s
//! thread "worker" tid 4243, state R (running), cpu 3.012s
//! Call Trace:
//!  #0 [inlined] myapp::crc_step at src/crc.rs:40:9
//!  #0 0x55d0c0a3d1f0 : myapp::checksum+0x1d/0x80 [myapp+0x1d1f0] at src/crc.rs:12:5
//!  ...
//! ---[ end of watchdog report ]---
//! ```
//!
//! * its stack, captured through [`crate::threads`]'s signal, with file:line and inlined
//!   functions (innermost first), resolved on the monitor thread: the first report that meets
//!   an object parses its DWARF, once (a fraction of a second for most programs, during which
//!   the monitor checks no other thread; a helper thread keeps the clock that [`pet`] reads
//!   going, so recoveries are timed right);
//! * whether it was **busy** (its CPU time grew during the stall, by at least a tenth of the
//!   time the monitor watched it, or it is runnable: the kernel's soft lockup,
//!   `BUG: soft lockup - CPU#1 stuck for 22s!`) or **blocked** (neither: the kernel's hung
//!   task, `INFO: task name:pid blocked for more than 120 seconds.`). The tenth and the state
//!   keep a spinning thread "busy" on a loaded machine, where it gets much less than a core;
//! * how long it has not petted;
//! * a trace marker instant ([`crate::trace::instant()`]) so that the stall shows on the
//!   Perfetto timeline.
//!
//! When it pets again: `watchdog: thread worker:4243 recovered after 2.300s` (and another
//! instant). What happens on a stall besides the report is the [`Action`]: nothing more
//! (default), a callback, or abort with an all-thread report (like the kernel's
//! `softlockup_panic`).
//!
//! ```
//! use std::time::Duration;
//! let w = selftrace::watchdog::watch_with_timeout("worker", Duration::from_secs(5))?;
//! for _ in 0..1000 {
//!     w.pet();
//!     // ... one unit of work ...
//! }
//! drop(w); // stops watching this thread
//! # Ok::<(), selftrace::Error>(())
//! ```
//!
//! Size: over 600 lines with about 135 lines of docs: one idea (watches, their monitor thread and the
//! hang report), whose parts share the watch table.
#![allow(unsafe_code)]

use crate::error::Error;
use crate::fork::ForkMutex;
use crate::sys;
use crate::threads;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use core::time::Duration;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

mod task;
pub(crate) use task::{prepare_workers, worker_parked, worker_stopped, worker_unparked};
pub use task::{watch_task, TaskWatch, Watched};

/// What the watchdog does on a stall, after writing its report.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Action {
    /// Only the report (and the trace marker instant).
    #[default]
    Report,
    /// Also call this function (on the monitor thread) with the stall.
    Callback(Arc<dyn Fn(&Stall) + Send + Sync>),
    /// Abort the process with an all-thread report: `abort()` after [`threads::dump_all`], or,
    /// when the crash handler is installed with [`crate::crash::Builder::all_threads`], through
    /// the crash handler's report, which lists every thread. With [`Builder::minidump`], a
    /// minidump of the stalled process (every thread's registers and stack) is written first.
    Abort,
}

impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Report => f.write_str("Report"),
            Action::Callback(_) => f.write_str("Callback(..)"),
            Action::Abort => f.write_str("Abort"),
        }
    }
}

/// What a watch watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// A thread that pets ([`watch`]): stalled when it does not pet within its timeout.
    Thread,
    /// An executor's worker thread ([`crate::tasks`]): busy from unpark to park, idle while
    /// parked; stalled when busy for longer than its timeout without parking (or petting).
    Worker,
    /// A task or any unit of work that moves between threads ([`watch_task`]): stalled when it
    /// does not pet within its timeout, whichever thread polls it, or none.
    Task,
}

/// A stall as the monitor saw it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Stall {
    /// The name given to [`watch`] or [`watch_task`] (a worker's: its thread name).
    pub name: String,
    /// What stalled: a watched thread, an executor's worker or a task.
    pub kind: Kind,
    /// The stalled thread's id; for a [`Kind::Task`], the thread polling the task when the
    /// stall was found (through [`TaskWatch::run`]), or 0 when no thread was polling it (it
    /// waits at an `.await`; there is no stack then).
    pub tid: i32,
    /// How long the thread has not petted when the stall was reported.
    pub stalled_for: Duration,
    /// The thread's timeout.
    pub timeout: Duration,
    /// CPU time the thread used while it did not pet (over the monitor's observation window,
    /// [`Stall::observed`]).
    pub cpu: Duration,
    /// The window over which [`Stall::cpu`] was measured.
    pub observed: Duration,
    /// Whether the thread was busy (runnable when the stall was found, or CPU time grew by at
    /// least a tenth of the window: a soft lockup)
    /// rather than blocked (a hung task).
    pub busy: bool,
    /// The thread's stack (frame 0 exact), or why there is none.
    pub stack: Result<Vec<usize>, Error>,
    /// How the walk of [`Stall::stack`] ended (complete, or truncated and why).
    pub stack_end: Option<crate::unwind::WalkEnd>,
    /// Which frames of [`Stall::stack`] are exact, as the walk recorded them.
    pub(crate) stack_kinds: crate::unwind::FrameKinds,
    /// The thread's name, state and CPU time as `/proc` gave them when the stall was found,
    /// before its stack was captured (the stack request wakes a blocked thread, which then
    /// reads as running for a while); `None` if the thread was gone.
    pub thread: Option<threads::ThreadInfo>,
}

/// One watched thread, worker or task.
struct Slot {
    /// The monitor tick (ms) of the last pet, or of a worker's last park with [`PARKED`] set.
    last: AtomicU64,
    /// The thread; for a task, the thread polling it now (0: none).
    tid: AtomicI32,
    kind: Kind,
    name: String,
    timeout_ms: u64,
    state: ForkMutex<MonitorState>,
}

#[derive(Default)]
struct MonitorState {
    /// The last pet value the monitor saw, when (ms), and the thread's CPU time then.
    seen: u64,
    seen_at: u64,
    cpu_at_seen: u64,
    /// The thread whose CPU time `cpu_at_seen` is (a task moves between threads; 0: none).
    cpu_tid: i32,
    /// Reported as stalled, not yet recovered.
    stalled: bool,
}

/// Set in [`Slot::last`] while a worker is parked: idle, never a stall. The other bits are the
/// tick it parked at.
const PARKED: u64 = 1 << 63;

/// The monitor's clock: milliseconds since the watchdog started, advanced every tick.
static TICK: AtomicU64 = AtomicU64::new(0);
static START_NS: AtomicU64 = AtomicU64::new(0);
static PERIOD_MS: AtomicU64 = AtomicU64::new(100);
static DEFAULT_TIMEOUT_MS: AtomicU64 = AtomicU64::new(2000);
static FD: AtomicI32 = AtomicI32::new(2);
// The locks are `ForkMutex`es: a forked child takes one over from a thread of the parent
// that held it (and starts its value over: the registry empty, the action the default).
static REGISTRY: ForkMutex<Vec<Arc<Slot>>> = ForkMutex::new(Vec::new());
static ACTION: ForkMutex<Option<Action>> = ForkMutex::new(None);
/// The process whose monitor thread runs (its pid), or 0: a forked child starts its own.
static MONITOR: AtomicI32 = AtomicI32::new(0);
/// Says which traced task thread `tid` is polling (set by [`crate::tasks`] when it traces its
/// first task): a worker's report names it.
pub(crate) static TASK_OF_THREAD: std::sync::OnceLock<fn(i32) -> Option<String>> =
    std::sync::OnceLock::new();

/// The directory of [`Builder::minidump`] (-1: none).
static MINIDUMP_DIR: AtomicI32 = AtomicI32::new(-1);
static MINIDUMP_PATH: ForkMutex<Option<std::path::PathBuf>> = ForkMutex::new(None);

thread_local! {
    static CURRENT: Cell<*const Slot> = const { Cell::new(core::ptr::null()) };
}

/// A registered thread. Pet it with [`Watch::pet`]; dropping it stops the watch. Not `Send`:
/// it watches the thread that created it.
#[must_use = "the thread is no longer watched when this is dropped"]
pub struct Watch {
    slot: Arc<Slot>,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("name", &self.slot.name)
            .field("tid", &self.slot.tid.load(Ordering::Relaxed))
            .finish()
    }
}

impl Watch {
    /// Checks in: one relaxed load and one relaxed store.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    #[inline(always)]
    pub fn pet(&self) {
        self.slot
            .last
            .store(TICK.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The watched thread's id.
    pub fn tid(&self) -> i32 {
        self.slot.tid.load(Ordering::Relaxed)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let me = Arc::as_ptr(&self.slot);
        let _ = CURRENT.try_with(|c| {
            if c.get() == me {
                c.set(core::ptr::null());
            }
        });
        unregister(&self.slot);
    }
}

/// Stops watching `slot`; if it is reported stalled, says that it recovered (a task that
/// finished, a thread that stopped watching), with how long it had not petted.
fn unregister(slot: &Arc<Slot>) {
    REGISTRY
        .lock_or_reset(Vec::new)
        .retain(|s| !Arc::ptr_eq(s, slot));
    let st = slot.state.lock_or_reset(MonitorState::default);
    if st.stalled {
        let now = TICK.load(Ordering::Relaxed);
        recovered(slot, now.saturating_sub(st.seen & !PARKED));
    }
}

/// Pets the calling thread's most recent [`Watch`] (nothing if it has none): a thread-local
/// read, one relaxed load and one relaxed store.
///
/// # Async-signal safety
/// Async-signal-safe.
#[inline(always)]
pub fn pet() {
    let _ = CURRENT.try_with(|c| {
        // SAFETY: CURRENT points into the Arc owned by this thread's live Watch; Watch::drop
        // clears it before the Arc can go away (the registry may hold the other reference).
        if let Some(slot) = unsafe { c.get().as_ref() } {
            slot.last
                .store(TICK.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    });
}

/// Watches the calling thread as `name` with the default timeout
/// ([`Builder::default_timeout`], 2 s unless changed). Starts the monitor thread on first use, and installs the
/// stack-request handler of [`crate::threads`] (the report shows the stalled thread's stack).
/// Normal context.
///
/// # Errors
/// Those of [`crate::threads::install`]: the stack-request signal has another handler.
pub fn watch(name: &str) -> Result<Watch, Error> {
    watch_with_timeout(
        name,
        Duration::from_millis(DEFAULT_TIMEOUT_MS.load(Ordering::Relaxed)),
    )
}

/// Watches the calling thread as `name`: it must pet at least every `timeout` (1 ms to 24
/// hours). See [`watch`].
///
/// # Errors
/// [`Error::InvalidInput`] for a timeout out of range; those of [`crate::threads::install`].
pub fn watch_with_timeout(name: &str, timeout: Duration) -> Result<Watch, Error> {
    check_timeout(timeout)?;
    threads::install()?;
    start_monitor();
    Ok(watch_thread(name, Kind::Thread, timeout))
}

/// Registers the calling thread (the monitor runs): a [`Kind::Thread`] or [`Kind::Worker`]
/// whose [`pet`] this becomes.
fn watch_thread(name: &str, kind: Kind, timeout: Duration) -> Watch {
    let slot = register(name, kind, sys::gettid(), timeout);
    let _ = CURRENT.try_with(|c| c.set(Arc::as_ptr(&slot)));
    Watch {
        slot,
        _not_send: PhantomData,
    }
}

/// A new slot in the registry, petted now.
fn register(name: &str, kind: Kind, tid: i32, timeout: Duration) -> Arc<Slot> {
    let now = TICK.load(Ordering::Relaxed);
    let slot = Arc::new(Slot {
        last: AtomicU64::new(now),
        tid: AtomicI32::new(tid),
        kind,
        name: name.to_string(),
        timeout_ms: u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
        state: ForkMutex::new(MonitorState {
            seen: now,
            seen_at: now,
            cpu_at_seen: if tid > 0 {
                sys::thread_cpu_ns(tid).unwrap_or(0)
            } else {
                0
            },
            cpu_tid: tid,
            stalled: false,
        }),
    });
    REGISTRY.lock_or_reset(Vec::new).push(slot.clone());
    slot
}

/// Settings of the watchdog; [`builder`] gives the defaults. [`Builder::install`] applies them
/// (the watchdog is one per process: a later `install` replaces the settings).
#[must_use = "a builder does nothing until `install` is called"]
#[derive(Clone)]
pub struct Builder {
    period: Duration,
    default_timeout: Duration,
    action: Action,
    fd: Option<Arc<std::os::fd::OwnedFd>>,
    minidump: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("period", &self.period)
            .field("default_timeout", &self.default_timeout)
            .field("action", &self.action)
            .field("fd", &self.fd)
            .field("minidump", &self.minidump)
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Builder {
        Builder {
            period: Duration::from_millis(100),
            default_timeout: Duration::from_secs(2),
            action: Action::Report,
            fd: None,
            minidump: None,
        }
    }
}

/// A stall timeout must be 1 ms to 24 hours.
fn check_timeout(timeout: Duration) -> Result<(), Error> {
    if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(24 * 3600) {
        return Err(Error::InvalidInput(
            "a watchdog timeout must be 1 ms to 24 hours",
        ));
    }
    Ok(())
}

/// The defaults: a check every 100 ms, a 2 s timeout for [`watch`], [`Action::Report`], reports
/// to stderr.
pub fn builder() -> Builder {
    Builder::default()
}

impl Builder {
    /// How often the monitor checks (default 100 ms; 1 ms to 60 s). Stall durations are
    /// measured in these steps.
    pub fn period(mut self, period: Duration) -> Builder {
        self.period = period;
        self
    }

    /// The timeout of [`watch`] (default 2 s; 1 ms to 24 hours).
    pub fn default_timeout(mut self, timeout: Duration) -> Builder {
        self.default_timeout = timeout;
        self
    }

    /// What to do on a stall besides the report (default [`Action::Report`]).
    pub fn action(mut self, action: Action) -> Builder {
        self.action = action;
        self
    }

    /// Where reports go (default: stderr), for example a [`std::fs::File`]. [`Builder::install`]
    /// keeps it open for the rest of the process (a report may be being written at any time),
    /// also if the watchdog is installed again with another fd.
    pub fn fd(mut self, fd: impl Into<std::os::fd::OwnedFd>) -> Builder {
        self.fd = Some(Arc::new(fd.into()));
        self
    }

    /// Before [`Action::Abort`] aborts, write a minidump of the process (see
    /// [`crate::minidump`]) into directory `dir` as `<uuid>.dmp`, named in the report. The
    /// directory is opened by [`Builder::install`]. When the crash handler writes minidumps
    /// ([`crate::crash::Builder::minidump`]), the abort's crash dump is the one (no second).
    pub fn minidump(mut self, dir: impl Into<std::path::PathBuf>) -> Builder {
        self.minidump = Some(dir.into());
        self
    }

    /// Applies the settings, installs the stack-request handler of [`crate::threads`] (the
    /// reports show the stalled thread's stack) and starts the monitor thread. Calling it is
    /// optional: [`watch`] starts the watchdog with the defaults. Normal context.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a period or timeout out of range; those of
    /// [`crate::threads::install`]; with [`Builder::minidump`], [`Error::Sys`] when the
    /// directory cannot be opened and [`Error::Unsupported`] on a machine without minidumps.
    pub fn install(self) -> Result<(), Error> {
        if self.period < Duration::from_millis(1) || self.period > Duration::from_secs(60) {
            return Err(Error::InvalidInput(
                "the watchdog's period must be 1 ms to 60 s",
            ));
        }
        check_timeout(self.default_timeout)?;
        threads::install()?;
        if let Some(dir) = &self.minidump {
            // Never closed: the monitor may be writing into it.
            MINIDUMP_DIR.store(crate::minidump::open_dir(dir)?, Ordering::Relaxed);
            *MINIDUMP_PATH.lock_or_reset(|| None) = Some(dir.clone());
        }
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        PERIOD_MS.store(ms(self.period), Ordering::Relaxed);
        DEFAULT_TIMEOUT_MS.store(ms(self.default_timeout), Ordering::Relaxed);
        *ACTION.lock_or_reset(|| None) = Some(self.action);
        if let Some(fd) = self.fd {
            // Never closed: see `fd`.
            FD.store(sys::keep_open(fd), Ordering::Relaxed);
        }
        start_monitor();
        Ok(())
    }
}

fn now_ms() -> u64 {
    sys::monotonic_ns().saturating_sub(START_NS.load(Ordering::Relaxed)) / 1_000_000
}

/// Starts the monitor thread, once per process: a forked child, which has none (it was a
/// thread of the parent), starts its own, and stops watching the parent's threads.
fn start_monitor() {
    let me = sys::getpid();
    let running = MONITOR.load(Ordering::Acquire);
    if running == me
        || MONITOR
            .compare_exchange(running, me, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return;
    }
    if running == 0 {
        START_NS.store(sys::monotonic_ns(), Ordering::Relaxed);
        TICK.store(0, Ordering::Relaxed);
    } else {
        // A forked child: the parent's threads are not here (a report of their stall would
        // be about threads this process does not have).
        REGISTRY.lock_or_reset(Vec::new).retain(|s| {
            let tid = s.tid.load(Ordering::Relaxed);
            s.kind == Kind::Task || !crate::fork::holder_gone(tid)
        });
    }
    let _ = crate::setup::init();
    let spawned = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(monitor);
    if spawned.is_err() {
        let _ = sys::write_all(
            FD.load(Ordering::Relaxed),
            b"watchdog: cannot start the monitor thread\n",
        );
    }
}

fn monitor() {
    loop {
        std::thread::sleep(Duration::from_millis(PERIOD_MS.load(Ordering::Relaxed)));
        let now = now_ms();
        TICK.fetch_max(now, Ordering::Relaxed);
        let slots: Vec<Arc<Slot>> = REGISTRY.lock_or_reset(Vec::new).clone();
        for slot in slots {
            check(&slot, now);
        }
    }
}

/// Thread `tid`'s CPU time (ns); `None` for no thread (0) or one gone.
fn cpu_ns(tid: i32) -> Option<u64> {
    if tid > 0 {
        sys::thread_cpu_ns(tid)
    } else {
        None
    }
}

fn check(slot: &Slot, now: u64) {
    let mut st = slot.state.lock_or_reset(MonitorState::default);
    let last = slot.last.load(Ordering::Relaxed);
    let tid = slot.tid.load(Ordering::Relaxed);
    if last != st.seen {
        if st.stalled {
            st.stalled = false;
            recovered(slot, (last & !PARKED).saturating_sub(st.seen & !PARKED));
        }
        st.seen = last;
        st.seen_at = now;
        st.cpu_at_seen = cpu_ns(tid).unwrap_or(0);
        st.cpu_tid = tid;
        return;
    }
    let silent = now.saturating_sub(last);
    // A parked worker is idle, however long.
    if st.stalled || last & PARKED != 0 || silent <= slot.timeout_ms {
        return;
    }
    st.stalled = true;
    // A task polled by another thread than the one measured at its last pet: its CPU time
    // over the window is not known (0; the thread's state still says busy or not).
    let cpu = match cpu_ns(tid) {
        Some(c) if tid == st.cpu_tid => c.saturating_sub(st.cpu_at_seen),
        _ => 0,
    };
    // The window over which CPU time was measured: from the tick that first saw this pet (the
    // registration, for a thread that never petted).
    let observed_ms = now.saturating_sub(st.seen_at).max(1);
    // A blocked thread uses next to no CPU and sleeps (S, D); a spinning one is runnable (R)
    // but may get much less than a core on a loaded machine: so a tenth of the window, or the
    // runnable state, counts as busy.
    // Read before the stack request wakes the thread: the state printed is the one the verdict
    // was made on.
    let thread = if tid > 0 { threads::info(tid) } else { None };
    let running = thread.is_some_and(|i| i.state == b'R');
    let busy = running || cpu.saturating_mul(10) >= observed_ms * 1_000_000;
    drop(st);
    let mut frames = vec![0usize; 256];
    let walk = if tid > 0 {
        threads::capture(tid, &mut frames, Duration::from_secs(1))
    } else {
        // A task no thread polls: it waits; no thread's stack is its.
        Err(Error::NotFound("a thread polling the task"))
    };
    let stack_end = walk.as_ref().ok().map(|w| w.end);
    let stack_kinds = walk
        .as_ref()
        .map_or(Default::default(), |w| w.frame_kinds());
    let stack = walk.map(|w| {
        frames.truncate(w.frames);
        frames
    });
    let stall = Stall {
        name: slot.name.clone(),
        kind: slot.kind,
        tid,
        stalled_for: Duration::from_millis(silent),
        timeout: Duration::from_millis(slot.timeout_ms),
        cpu: Duration::from_nanos(cpu),
        observed: Duration::from_millis(observed_ms),
        busy,
        stack,
        stack_end,
        stack_kinds,
        thread,
    };
    // The report resolves file:line (the first one in an object parses its DWARF) and the
    // action may be the program's own callback: meanwhile a helper keeps the clock that pets
    // read going, so that a pet during the report is timed right (a recovery's duration).
    let reporting = AtomicBool::new(true);
    std::thread::scope(|scope| {
        let _ticker = std::thread::Builder::new()
            .name("watchdog-tick".into())
            .spawn_scoped(scope, || {
                while reporting.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(PERIOD_MS.load(Ordering::Relaxed)));
                    TICK.fetch_max(now_ms(), Ordering::Relaxed);
                }
            });
        report_and_act(&stall);
        reporting.store(false, Ordering::Relaxed);
    });
}

/// Writes the report of `stall`, then takes the configured [`Action`].
fn report_and_act(stall: &Stall) {
    report(stall);
    let action = ACTION.lock_or_reset(|| None).clone().unwrap_or_default();
    match action {
        Action::Report => {}
        Action::Callback(f) => f(stall),
        Action::Abort => {
            let fd = FD.load(Ordering::Relaxed);
            let _ = sys::write_all(fd, b"watchdog: aborting (Action::Abort)\n");
            write_minidump(fd);
            if !crate::crash::all_threads_enabled() {
                threads::dump_all_raw(fd);
            }
            sys::abort();
        }
    }
}

/// The minidump of [`Builder::minidump`] before an abort (normal context: the monitor thread).
fn write_minidump(fd: i32) {
    let dir = MINIDUMP_DIR.load(Ordering::Relaxed);
    if dir < 0 {
        return;
    }
    if crate::crash::minidump_configured() {
        // The abort's crash handler writes one (SIGABRT on this thread, every thread in it);
        // a second dump of the same stall would be a second report of it.
        let _ = sys::write_all(fd, b"watchdog: minidump left to the crash handler\n");
        return;
    }
    let mut name = [0u8; 48];
    let options = crate::minidump::Options::new();
    let timeout = threads::timeout().as_nanos() as u64;
    let line = match crate::minidump::write_in(dir, &mut name, None, &options, timeout) {
        Err(errno) => format!(
            "watchdog: minidump not written: {}\n",
            std::io::Error::from_raw_os_error(errno)
        ),
        Ok((len, result)) => {
            let dir = MINIDUMP_PATH.lock_or_reset(|| None).clone();
            let path = dir
                .unwrap_or_default()
                .join(String::from_utf8_lossy(&name[..len]).as_ref());
            match result {
                Ok(s) if s.threads_left_out() > 0 => format!(
                    "watchdog: minidump {} ({} threads, {} more left out (a dump holds at most \
                     {}), {} bytes)\n",
                    path.display(),
                    s.threads(),
                    s.threads_left_out(),
                    crate::minidump::MAX_THREADS,
                    s.bytes()
                ),
                Ok(s) => format!(
                    "watchdog: minidump {} ({} threads, {} bytes)\n",
                    path.display(),
                    s.threads(),
                    s.bytes()
                ),
                Err(e) => format!("watchdog: minidump {} not written: {e}\n", path.display()),
            }
        }
    };
    let _ = sys::write_all(fd, line.as_bytes());
}

/// The report's first line ([`Stall::headline`]).
impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.headline())
    }
}

impl Stall {
    /// The report's first line, in the kernel's words: `BUG: soft lockup - thread
    /// worker:4243 stuck for 1.200s! (timeout 1.000s)` or `INFO: task worker:4243 blocked for
    /// more than 1.000s (1.200s)`.
    ///
    /// A worker reads `worker tokio-rt-worker:4243`; a task `async task ticker` (`async task
    /// ticker on 4243` while a thread polls it).
    pub fn headline(&self) -> String {
        let secs = |d: Duration| format!("{}.{:03}s", d.as_secs(), d.subsec_millis());
        let who = self.who();
        if self.busy {
            format!(
                "watchdog: BUG: soft lockup - {who} stuck for {}! (timeout {})",
                secs(self.stalled_for),
                secs(self.timeout)
            )
        } else {
            format!(
                "watchdog: INFO: {who} blocked for more than {} ({})",
                secs(self.timeout),
                secs(self.stalled_for)
            )
        }
    }

    /// `thread NAME:TID` (`task NAME:TID` when blocked, the kernel's words), `worker
    /// NAME:TID`, `async task NAME` or `async task NAME on TID`.
    fn who(&self) -> String {
        match self.kind {
            Kind::Thread if self.busy => format!("thread {}:{}", self.name, self.tid),
            Kind::Thread => format!("task {}:{}", self.name, self.tid),
            Kind::Worker => format!("worker {}:{}", self.name, self.tid),
            Kind::Task if self.tid > 0 => format!("async task {} on {}", self.name, self.tid),
            Kind::Task => format!("async task {}", self.name),
        }
    }
}

fn report(s: &Stall) {
    let fd = FD.load(Ordering::Relaxed);
    let secs = |d: Duration| format!("{}.{:03}s", d.as_secs(), d.subsec_millis());
    #[cfg(feature = "trace")]
    crate::trace::instant(&format!(
        "watchdog: {} {} stalled {}",
        if s.busy { "busy" } else { "blocked" },
        match s.kind {
            Kind::Thread => format!("{}:{}", s.name, s.tid),
            _ => s.who(),
        },
        secs(s.stalled_for)
    ));
    let mut text = String::new();
    text.push_str("------------[ selftrace: watchdog ]------------\n");
    text.push_str(&s.headline());
    text.push('\n');
    match s.kind {
        Kind::Task if s.tid == 0 => text.push_str(
            "waiting: no thread is polling the task: it waits at an .await (or its \
             future is not wrapped in TaskWatch::run)\n",
        ),
        kind => {
            text.push_str(&format!(
                "{}: the thread used {} of cpu in the last {}\n",
                if s.busy { "busy" } else { "blocked" },
                secs(s.cpu),
                secs(s.observed)
            ));
            if kind == Kind::Worker {
                text.push_str(&format!(
                    "the worker has not parked for {}: one task's poll does not return, or \
                     the worker never runs out of work\n",
                    secs(s.stalled_for)
                ));
            }
            if let Some(task) = TASK_OF_THREAD.get().and_then(|f| f(s.tid)) {
                text.push_str(&format!("polling {task}\n"));
            }
        }
    }
    let _lock = crate::report::lock::OutputLock::acquire();
    let _ = sys::write_all(fd, text.as_bytes());
    if s.kind == Kind::Task && s.tid == 0 {
        let _ = sys::write_all(fd, b"---[ end of watchdog report ]---\n");
        return;
    }
    let stack = match &s.stack {
        Ok(f) => Ok((
            &f[..],
            s.stack_end.unwrap_or(crate::unwind::WalkEnd::Complete),
            s.stack_kinds,
        )),
        Err(e) => Err(*e),
    };
    threads::write_thread(fd, s.tid, s.thread.as_ref(), stack);
    let _ = sys::write_all(fd, b"---[ end of watchdog report ]---\n");
}

fn recovered(slot: &Slot, after_ms: u64) {
    let who = match slot.kind {
        Kind::Thread => format!("thread {}:{}", slot.name, slot.tid.load(Ordering::Relaxed)),
        Kind::Worker => format!("worker {}:{}", slot.name, slot.tid.load(Ordering::Relaxed)),
        Kind::Task => format!("async task {}", slot.name),
    };
    let line = format!(
        "watchdog: {who} recovered after {}.{:03}s\n",
        after_ms / 1000,
        after_ms % 1000
    );
    #[cfg(feature = "trace")]
    crate::trace::instant(&format!(
        "watchdog: {} recovered",
        who.strip_prefix("thread ").unwrap_or(&who)
    ));
    let _lock = crate::report::lock::OutputLock::acquire();
    let _ = sys::write_all(FD.load(Ordering::Relaxed), line.as_bytes());
}
