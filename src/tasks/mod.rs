//! Async runtimes: their workers watched without `pet()`, each thread's tracing spans in every
//! report, and a dump of the tasks and where each waits.
//!
//! * **Workers** (`configure`, feature `tokio`): below.
//! * **Spans** (`SpanLayer`, feature `tracing`): each thread's current spans and tokio task
//!   id under its line in thread dumps, crash reports, watchdog reports and minidumps.
//! * **Tasks** (`spawn` with the `tokio` feature, [`traced`], [`dump_to`]): every traced
//!   task, an idle one's chain of `.await`s read from its memory with the coroutine layouts in
//!   the program's DWARF (see `layout.rs`), a running one's worker stack. Normal context (the dump parses DWARF); not
//!   in signal handlers (the dump signal and crash reports list threads, with their spans).
//!
//! # Workers
//!
//! A worker thread of an executor is busy from the moment it unparks until it parks again
//! (it ran out of work), and idle while parked. `configure` sets a `tokio::runtime::Builder`'s
//! stable hooks (`on_thread_park`, `on_thread_unpark`, `on_thread_stop`; no `tokio_unstable`)
//! so that the watchdog knows which: a worker busy for longer than its timeout is reported
//! with its stack (the blocking call: `std::thread::sleep`, a futex, a `read`, or the user
//! code that spins), a parked worker never is, however long it sleeps.
//!
//! ```
//! # #[cfg(feature = "tokio")] {
//! use std::time::Duration;
//! let mut builder = tokio::runtime::Builder::new_multi_thread();
//! builder.worker_threads(2);
//! selftrace::tasks::configure_with_timeout(&mut builder, Duration::from_secs(1))?;
//! let runtime = builder.build().unwrap();
//! runtime.block_on(async { /* the service */ });
//! # }
//! # Ok::<(), selftrace::Error>(())
//! ```
//!
//! ```text
//! ------------[ selftrace: watchdog ]------------
//! watchdog: INFO: worker tokio-rt-worker:4245 blocked for more than 1.000s (1.100s)
//! blocked: the thread used 0.000s of cpu in the last 1.100s
//! the worker has not parked for 1.100s: one task's poll does not return, or the worker never runs out of work
//! thread "tokio-rt-worker" tid 4245, state S (sleeping), cpu 0.012s
//! Call Trace:
//!  #0 0x7f3a1c2e55fa : clock_nanosleep+0x5a/0xc0 [libc.so.6+0xe55fa]
//!  #1 0x7f3a1c2ea9d6 : __nanosleep+0x16/0x30 [libc.so.6+0xea9d6]
//!  #2 0x55d0c0b2c84b : std::thread::sleep+0x5b/0x70 [svc+0x12c84b]
//!  #3 0x55d0c0a3d1f0 : svc::stall::{{closure}}+0x40/0x90 [svc+0x3d1f0] at src/main.rs:31:9
//!  ...
//! ```
//!
//! The verdict: a task whose poll does not return keeps its worker busy (a blocking call in
//! async code, a loop that never yields); a worker that has work without a pause for longer
//! than the timeout is reported too (the kernel's soft lockup of a CPU that never schedules):
//! choose the timeout above the longest busy spell a healthy service has. [`crate::watchdog::pet`]
//! called on a worker (in a long computation that yields rarely) counts as progress.
//!
//! What is not a worker: the blocking pool's threads (`spawn_blocking`) never park through
//! these hooks and are not watched; a current-thread runtime's `block_on` thread is not
//! watched (it goes on with other code when `block_on` returns: watch it with
//! [`crate::watchdog::watch`]). A worker inside `tokio::task::block_in_place` has handed its
//! work to another thread but has not parked: it reads as busy.
//!
//! For a deadline of one task, whichever thread runs it: [`crate::watchdog::watch_task`].
//!
//! Size: about 150 lines, most of them docs: the runtime's hooks; the span layer, the task
//! dump and the layouts it reads are files of their own.

use crate::error::Error;
use core::time::Duration;

mod dump;
mod layout;
#[cfg(feature = "tracing")]
mod spans;
#[cfg(feature = "tokio")]
pub use dump::spawn;
pub use dump::{dump_on_signal, dump_to, traced, TaskSummary, Traced};
#[cfg(feature = "tracing")]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub use spans::SpanLayer;

/// Sets `builder`'s `on_thread_park`, `on_thread_unpark` and `on_thread_stop` hooks (replacing
/// any set before: a program with hooks of its own calls [`on_thread_park`],
/// [`on_thread_unpark`] and [`on_thread_stop`] from them instead) so that the watchdog watches
/// the runtime's workers with its default timeout ([`crate::watchdog::Builder::default_timeout`],
/// 2 s unless changed). Installs the stack-request handler of [`crate::threads`] and starts the
/// watchdog. Normal context.
///
/// # Errors
/// Those of [`crate::threads::install`]: the stack-request signal has another handler.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub fn configure(
    builder: &mut tokio::runtime::Builder,
) -> Result<&mut tokio::runtime::Builder, Error> {
    crate::watchdog::prepare_workers(None)?;
    Ok(set_hooks(builder))
}

/// `configure`, with `timeout` (1 ms to 24 hours) for the workers' watches.
///
/// # Errors
/// [`Error::InvalidInput`] for a timeout out of range; those of `configure`.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub fn configure_with_timeout(
    builder: &mut tokio::runtime::Builder,
    timeout: Duration,
) -> Result<&mut tokio::runtime::Builder, Error> {
    crate::watchdog::prepare_workers(Some(timeout))?;
    Ok(set_hooks(builder))
}

#[cfg(feature = "tokio")]
fn set_hooks(builder: &mut tokio::runtime::Builder) -> &mut tokio::runtime::Builder {
    builder
        .on_thread_park(|| crate::watchdog::worker_parked(is_multi_thread_worker))
        .on_thread_unpark(crate::watchdog::worker_unparked)
        .on_thread_stop(crate::watchdog::worker_stopped)
}

/// Whether the calling thread, at its first park, runs a multi-thread runtime's tasks (asked
/// once per thread).
#[cfg(feature = "tokio")]
fn is_multi_thread_worker() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Prepares the watches of workers whose hooks call [`on_thread_park`] and
/// [`on_thread_unpark`]: installs the stack-request handler of [`crate::threads`], starts the
/// watchdog and sets the workers' timeout (`None`: the watchdog's default). `configure` does
/// this itself. Normal context.
///
/// # Errors
/// [`Error::InvalidInput`] for a timeout out of range (1 ms to 24 hours); those of
/// [`crate::threads::install`].
pub fn prepare(timeout: Option<Duration>) -> Result<(), Error> {
    crate::watchdog::prepare_workers(timeout)
}

/// For an executor's park hook (tokio's `on_thread_park`): the calling worker has run out of
/// work and parks, idle until [`on_thread_unpark`]. Its first call registers the thread as a
/// worker of the watchdog (allocates once per thread). Call [`prepare`] first.
pub fn on_thread_park() {
    crate::watchdog::worker_parked(|| true);
}

/// For an executor's unpark hook (tokio's `on_thread_unpark`): the calling worker is busy from
/// now until it parks. Nothing on a thread that never parked.
pub fn on_thread_unpark() {
    crate::watchdog::worker_unparked();
}

/// For an executor's thread-stop hook (tokio's `on_thread_stop`): the calling worker is no
/// longer watched.
pub fn on_thread_stop() {
    crate::watchdog::worker_stopped();
}

/// tokio's task id as the number its `Display` prints: `Id` hashes as that one `u64` (a
/// `NonZeroU64` inside); anything else hashed is not trusted (`None`).
#[cfg(feature = "tokio")]
pub(crate) fn task_id_u64(id: &tokio::task::Id) -> Option<u64> {
    use core::hash::{Hash, Hasher};
    /// Keeps the one `u64` hashed; any other write spoils it.
    struct One(Option<u64>, bool);
    impl Hasher for One {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, _: &[u8]) {
            self.1 = true;
        }
        fn write_u64(&mut self, v: u64) {
            if self.0.replace(v).is_some() {
                self.1 = true;
            }
        }
    }
    let mut h = One(None, false);
    id.hash(&mut h);
    if h.1 {
        None
    } else {
        h.0
    }
}
