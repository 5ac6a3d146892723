//! A sampling CPU and wall-clock profiler that cannot crash or deadlock the program it profiles.
//!
//! ```
//! selftrace::init().expect("init");
//! let profiler = selftrace::profile::builder().frequency(199).start().expect("profiler");
//! let mut x = 0u64;
//! for i in 0..20_000_000u64 {
//!     x = x.wrapping_mul(31).wrapping_add(i);
//! }
//! std::hint::black_box(x);
//! let profile = profiler.stop();
//! assert!(profile.total() > 0);
//! print!("{}", profile.folded());
//! ```
//!
//! # How it samples
//! * **CPU mode** ([`Mode::Cpu`], the default): one POSIX timer per thread on that thread's
//!   CPU-time clock (`CLOCK_THREAD_CPUTIME_ID` of the thread, `timer_create` with
//!   `SIGEV_THREAD_ID`), so each thread gets a signal after each period of CPU time it used,
//!   and the signal is delivered to that thread. Unlike one process-wide `setitimer(ITIMER_PROF)`
//!   (what pprof-rs uses), this does not undercount when several threads are busy at once. A
//!   timer that expired again before its signal was handled reports it in `si_overrun`; the
//!   sample then counts for all the periods it stands for.
//! * **Wall mode** ([`Mode::Wall`]): the same with `CLOCK_MONOTONIC` timers, so every thread is
//!   sampled once per period whether it runs or waits: a thread blocked in a `futex` or a
//!   `read` shows the wait's libc wrapper on top. Each signal wakes its thread, so the
//!   signals of all threads together are kept within [`WALL_SIGNAL_BUDGET`] a second: with
//!   more threads than that allows at the frequency, each timer fires every *k*-th period and
//!   its samples count for *k* periods ([`Stats::stride`]).
//! * **Threads**: the profiler's timer thread (`selftrace-timer`) lists `/proc/self/task` at
//!   start and every [`Builder::rescan_interval`] afterwards, arms a timer for each new thread
//!   that [`Threads`] selects and deletes the timers of threads that exited. A thread that lives
//!   shorter than the rescan interval can be missed. The same thread empties the ring (when the
//!   handler finds it half full, and every rescan interval) into a queue, and the profiler's
//!   other thread (`selftrace-prof`) names the queued samples: a slow first symbolization of a
//!   large object (its DWARF is read) neither delays the timers of threads started meanwhile
//!   nor lets the ring fill up. Neither of the two is sampled.
//! * **The handler** runs [`crate::Capture::walk_ucontext`] (async-signal-safe: no
//!   allocation, no lock, every memory read checked) straight into a slot of a fixed ring that
//!   was allocated at start; taking a slot is one compare-and-swap. A full ring drops the sample
//!   and counts the periods it stood for ([`Profile::dropped`]). Nothing in the handler can block on a lock another
//!   thread holds (unlike libgcc's `_Unwind_Backtrace`, which pprof-rs calls from its handler),
//!   so a sample landing in `malloc`, in the loader, or in a panic's unwinding is harmless.
//! * **Aggregation** happens on the profiler's thread, in normal context: it takes the samples
//!   that the timer thread pulled out of the ring (every rescan interval, at once when the ring
//!   is half full), symbolizes each new address
//!   while the object it is in is still loaded, and counts distinct stacks. An address whose
//!   object was unloaded or replaced before it could be resolved is kept as a bare address
//!   rather than named after whatever is loaded there now.
//!
//! # Signals and system calls
//! The profiler uses `SIGPROF` unless told otherwise ([`Builder::signal`]), installed with
//! `SA_RESTART`. A handler the program installed for the signal is kept: signals that do not
//! come from the profiler's timers (`kill`, `setitimer`, the program's own timers) go on to it.
//! When the profiler stops, the signal's previous action is put back, except that `SIG_DFL`
//! becomes `SIG_IGN`: a late signal of a deleted timer must never meet the default action,
//! which would kill the process. As with any
//! signal, the few system calls that return `EINTR` whatever `SA_RESTART` says (`nanosleep`,
//! `poll`, `epoll_wait`, `select`, ...; see [`crate::threads`]) can return `EINTR` in a profiled
//! thread; std's `thread::sleep` retries by itself. The handler runs on the interrupted
//! thread's stack, so, as with any signal, it needs a few KiB of it.
//!
//! # Continuous profiling
//! [`Profiler::take`] returns the profile of the interval since the start or the previous
//! `take`, and the profiler keeps running: consecutive profiles cover time without gaps or
//! overlap. [`Profiler::stop`] (or dropping the [`Profiler`]) stops it.
//!
//! # Outputs
//! [`Profile::folded`] (always available), a gzipped pprof `profile.proto` with the `pprof`
//! feature, an SVG flame graph with the `flamegraph` feature.
//!
//! A stack the unwinder could not finish carries its reason and shows as `[truncated: <reason>]`
//! at its root: a profile never presents a truncated stack as complete. The pprof profile holds
//! samples with `[samples, cpu|wall nanoseconds]`, one location per address with inlined
//! functions as its lines, functions with file and line, one mapping per executable segment with
//! its build-id, labels `thread` and `thread_id`, the period and the duration; `profile::http`
//! serves it as Go's `net/http/pprof` does. The core library depends on none of the output
//! crates (prost, flate2, inferno). One profiler runs at a time (`start` gives
//! `Error::AlreadyExists` while one does).
//!
//! How accurate the profiles are and what the profiler survives (next to pprof-rs), measured:
//! the repository's docs/profiler.md.

mod aggregate;
mod data;
#[cfg(feature = "flamegraph")]
mod flame;
mod handler;
#[cfg(feature = "pprof")]
pub mod http;
#[cfg(feature = "pprof")]
mod pprof;
mod ring;
mod running;
mod timer;

pub use data::{Line, Location, Mapping, Mode, Profile, Sample};

use crate::error::Error;
use std::time::Duration;

/// Which threads a profiler samples.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Threads {
    /// Every thread of the process, including threads created after the start (except the
    /// profiler's own).
    All,
    /// Only these thread ids (see [`crate::threads::current_tid`]).
    Only(Vec<i32>),
    /// Threads whose name (`comm`, 15 bytes at most) starts with this prefix, when they are
    /// first seen.
    NamePrefix(String),
}

/// The default sampling frequency: 99 Hz (not 100, so that sampling does not run in lockstep
/// with work that a 10 ms timer drives).
pub const DEFAULT_FREQUENCY_HZ: u32 = 99;

/// The highest frequency a profiler accepts: 10 kHz.
pub const MAX_FREQUENCY_HZ: u32 = 10_000;

/// The most timer signals a second a Wall-mode profiler sends to all its threads together:
/// 20,000. Every thread's timer fires whether the thread runs or sleeps, and each signal wakes
/// its thread, so 1,000 threads at 99 Hz would be 99,000 wake-ups a second, more than a small
/// machine handles: the sampled program would crawl and most samples be dropped. Past the
/// budget each thread's timer fires every *k*-th period and each of its samples counts for *k*
/// periods ([`Stats::stride`]): the profile keeps its counts in periods, with fewer samples
/// behind them.
pub const WALL_SIGNAL_BUDGET: u64 = 20_000;

/// The most frames a sample keeps; a deeper stack keeps its innermost frames and is marked
/// truncated ([`crate::StopReason::TooDeep`]).
pub const MAX_DEPTH: usize = 256;

/// Settings of a profiler; [`builder`] gives the defaults.
#[must_use = "a builder does nothing until `start` is called"]
#[derive(Clone, Debug)]
pub struct Builder {
    pub(crate) frequency_hz: u32,
    pub(crate) mode: Mode,
    pub(crate) threads: Threads,
    pub(crate) signal: i32,
    pub(crate) ring_capacity: usize,
    pub(crate) rescan: Duration,
}

/// A profiler's settings, with the defaults: [`DEFAULT_FREQUENCY_HZ`], [`Mode::Cpu`],
/// [`Threads::All`], `SIGPROF`, a ring of 1024 samples, a rescan every 50 ms.
pub fn builder() -> Builder {
    Builder {
        frequency_hz: DEFAULT_FREQUENCY_HZ,
        mode: Mode::Cpu,
        threads: Threads::All,
        signal: libc::SIGPROF,
        ring_capacity: 1024,
        rescan: Duration::from_millis(50),
    }
}

/// Starts a CPU profiler of every thread at `frequency_hz` (`builder().frequency(hz).start()`).
///
/// # Errors
/// As [`Builder::start`].
pub fn start(frequency_hz: u32) -> Result<Profiler, Error> {
    builder().frequency(frequency_hz).start()
}

impl Builder {
    /// Samples per second per thread (of CPU time in [`Mode::Cpu`], of real time in
    /// [`Mode::Wall`]); 1 to [`MAX_FREQUENCY_HZ`].
    pub fn frequency(mut self, hz: u32) -> Self {
        self.frequency_hz = hz;
        self
    }

    /// CPU or wall-clock time.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Which threads to sample.
    pub fn threads(mut self, threads: Threads) -> Self {
        self.threads = threads;
        self
    }

    /// The signal the timers send (default `SIGPROF`). It must have no other handler.
    pub fn signal(mut self, sig: i32) -> Self {
        self.signal = sig;
        self
    }

    /// How many samples the ring holds between two drains (16 to 1,048,576; each takes about
    /// 2 KiB). The profiler's timer thread empties it every rescan interval and when it is half
    /// full, whatever the symbolizer is doing.
    pub fn ring_capacity(mut self, samples: usize) -> Self {
        self.ring_capacity = samples;
        self
    }

    /// How often the profiler's thread looks for new threads and drains the ring (1 ms to
    /// 10 s; default 50 ms). Each rescan costs a wake-up and a listing of `/proc/self/task`:
    /// measured on a 2-core VM, the profiler's thread used 0.18% of a CPU at 50 ms and 0.79% at
    /// 10 ms. A thread that lives shorter than the interval can be missed.
    pub fn rescan_interval(mut self, interval: Duration) -> Self {
        self.rescan = interval;
        self
    }

    /// Starts the profiler: installs the signal handler, arms a timer for each selected thread
    /// and starts the profiler's thread. Calls [`crate::init`] if needed.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a setting out of range, a thread id that is not positive, or
    /// a signal that cannot be used (a fault signal, or one that selftrace uses for something
    /// else: the stack-request or dump signal of [`crate::threads`], a crash signal; the
    /// message names it),
    /// [`Error::AlreadyExists`] when another profiler is running, [`Error::ThreadGone`] for a
    /// selected thread that does not exist, [`Error::Sys`] when a system call failed
    /// (`timer_create`, `sigaction`, the thread's creation).
    pub fn start(self) -> Result<Profiler, Error> {
        if !(1..=MAX_FREQUENCY_HZ).contains(&self.frequency_hz) {
            return Err(Error::InvalidInput("frequency must be 1 to 10000 Hz"));
        }
        if !(16..=1 << 20).contains(&self.ring_capacity) {
            return Err(Error::InvalidInput(
                "ring capacity must be 16 to 1048576 samples",
            ));
        }
        if self.rescan < Duration::from_millis(1) || self.rescan > Duration::from_secs(10) {
            return Err(Error::InvalidInput("rescan interval must be 1 ms to 10 s"));
        }
        if !(1..=64).contains(&self.signal)
            || [
                libc::SIGKILL,
                libc::SIGSTOP,
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGILL,
                libc::SIGFPE,
                libc::SIGABRT,
                libc::SIGTRAP,
                libc::SIGSYS,
            ]
            .contains(&self.signal)
        {
            return Err(Error::InvalidInput("signal cannot be used for sampling"));
        }
        running::start(self).map(|inner| Profiler { inner: Some(inner) })
    }
}

/// Counters of a running profiler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Signals handled that produced a sample.
    pub samples: u64,
    /// Periods lost to a full ring, or to an aggregation that could not keep up (each dropped
    /// sample with its overrun count and stride).
    pub dropped: u64,
    /// Threads that have a timer now.
    pub threads: usize,
    /// Timers armed since the start (threads seen).
    pub threads_seen: u64,
    /// Periods each timer signal stands for (1, except in Wall mode when threads x frequency
    /// exceeds [`WALL_SIGNAL_BUDGET`]), as set at the last rescan.
    pub stride: u32,
}

/// A running profiler. Dropping it stops it (and discards what it sampled since the last
/// [`take`](Profiler::take)).
#[must_use = "the profiler stops when this is dropped"]
pub struct Profiler {
    inner: Option<running::Running>,
}

impl Profiler {
    /// The profile of the interval since the start or the previous `take`. The profiler keeps
    /// running: the next `take` begins where this one ended.
    pub fn take(&self) -> Profile {
        match &self.inner {
            Some(r) => r.take(),
            None => unreachable!("a Profiler is only without its state while it stops"),
        }
    }

    /// Stops the profiler (deletes the timers, ends its thread) and returns the profile of the
    /// interval since the start or the previous [`take`](Profiler::take).
    pub fn stop(mut self) -> Profile {
        match self.inner.take() {
            Some(r) => r.stop(),
            None => unreachable!("a Profiler is only without its state while it stops"),
        }
    }

    /// The profiler's counters so far.
    pub fn stats(&self) -> Stats {
        self.inner.as_ref().map(|r| r.stats()).unwrap_or_default()
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if let Some(r) = self.inner.take() {
            drop(r.stop());
        }
    }
}

impl std::fmt::Debug for Profiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profiler")
            .field("stats", &self.stats())
            .finish()
    }
}
