//! The watches that are not one thread's: a task's ([`watch_task`], [`TaskWatch`], [`Watched`]),
//! which any thread may pet and poll, and an executor worker's, busy from unpark to park (the
//! hooks of [`crate::tasks`] call [`worker_parked`] and [`worker_unparked`]).

use super::{register, start_monitor, watch_thread, Kind, Slot, Watch, PARKED, TICK};
use crate::error::Error;
use crate::{sys, threads};
use core::future::Future;
use core::pin::Pin;
use core::sync::atomic::{AtomicU64, Ordering};
use core::task::{Context, Poll};
use core::time::Duration;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

/// A watch of a task, or of any unit of work that moves between threads: `Send`, `Sync` and
/// `Clone` (the clones share the watch, which ends when the last one is dropped). Pet it with
/// [`TaskWatch::pet`] from wherever the work runs; wrap the task's future in
/// [`TaskWatch::run`] so that a report names the thread polling it and shows that thread's
/// stack (without it, or while the task waits at an `.await`, the report says no thread polls
/// it).
///
/// A deadline for a whole future is a watch that is never petted:
///
/// ```
/// # use std::time::Duration;
/// let deadline = selftrace::watchdog::watch_task("handshake", Duration::from_secs(5))?;
/// let handshake = deadline.run(async { /* ... */ 42 });
/// // spawn or await `handshake`: a report if it has not finished 5 s after `watch_task`
/// # let _ = handshake;
/// # Ok::<(), selftrace::Error>(())
/// ```
#[derive(Clone)]
#[must_use = "the task is no longer watched when this is dropped"]
pub struct TaskWatch {
    inner: Arc<TaskInner>,
}

/// The one registration the clones of a [`TaskWatch`] share.
struct TaskInner {
    slot: Arc<Slot>,
}

impl Drop for TaskInner {
    fn drop(&mut self) {
        super::unregister(&self.slot);
    }
}

impl fmt::Debug for TaskWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskWatch")
            .field("name", &self.inner.slot.name)
            .field("polled_by", &self.inner.slot.tid.load(Ordering::Relaxed))
            .finish()
    }
}

/// Watches a task as `name`: it must [pet](TaskWatch::pet) at least every `timeout` (1 ms to
/// 24 hours), from any thread. Starts the monitor thread on first use and installs the
/// stack-request handler of [`crate::threads`] (for the stack of the thread polling the task).
/// Normal context.
///
/// ```no_run
/// # async fn tick() {}
/// # fn spawn(_: impl std::future::Future<Output = ()> + Send + 'static) {}
/// use std::time::Duration;
/// let w = selftrace::watchdog::watch_task("ticker", Duration::from_secs(2))?;
/// spawn(w.clone().run(async move {
///     loop {
///         w.pet();
///         tick().await;
///     }
/// }));
/// # Ok::<(), selftrace::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidInput`] for a timeout out of range; those of [`crate::threads::install`].
pub fn watch_task(name: &str, timeout: Duration) -> Result<TaskWatch, Error> {
    super::check_timeout(timeout)?;
    threads::install()?;
    start_monitor();
    Ok(TaskWatch {
        inner: Arc::new(TaskInner {
            slot: register(name, Kind::Task, 0, timeout),
        }),
    })
}

impl TaskWatch {
    /// Checks in: one relaxed load and one relaxed store, from any thread.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    #[inline(always)]
    pub fn pet(&self) {
        self.inner
            .slot
            .last
            .store(TICK.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// `future`, marked while it is polled: a stall report of this watch names the thread
    /// polling it and shows that thread's stack (the blocking call, the spinning loop). Costs
    /// two relaxed stores and a thread-local read per poll; polling does not pet. The watch
    /// ends with the future (when no clone is left), so a task's watch ends with the task.
    pub fn run<F: Future>(self, future: F) -> Watched<F> {
        Watched {
            watch: self,
            future,
        }
    }

    /// The thread polling the watched future now (through [`TaskWatch::run`]), if one is.
    pub fn polled_by(&self) -> Option<i32> {
        Some(self.inner.slot.tid.load(Ordering::Relaxed)).filter(|&t| t > 0)
    }
}

/// A future wrapped by [`TaskWatch::run`]: while it is polled, its watch knows the thread.
#[must_use = "futures do nothing unless polled"]
pub struct Watched<F> {
    watch: TaskWatch,
    future: F,
}

impl<F> fmt::Debug for Watched<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("watch", &self.watch)
            .finish_non_exhaustive()
    }
}

/// Puts back the thread the slot had before this poll (0, or an outer poll of the same
/// watch), also when the poll panics.
struct Polling<'a> {
    slot: &'a Slot,
    outer: i32,
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.slot.tid.store(self.outer, Ordering::Relaxed);
    }
}

impl<F: Future> Future for Watched<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: a pin projection: `future` is never moved out of `self` (no method hands it
        // out unpinned, `Watched` has no `Drop` and is `Unpin` only when `F` is).
        let this = unsafe { self.get_unchecked_mut() };
        let slot = &this.watch.inner.slot;
        let _polling = Polling {
            slot,
            outer: slot.tid.swap(crate::fork::cached_tid(), Ordering::Relaxed),
        };
        // SAFETY: `this.future` stays where it is while `self` is pinned (above).
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        future.poll(cx)
    }
}

thread_local! {
    /// The calling worker thread's watch, made at its first park.
    static WORKER: RefCell<WorkerState> = const { RefCell::new(WorkerState::Unknown) };
}

/// The timeout of the workers' watches (ms; 0: the watchdog's default).
pub(crate) static WORKER_TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);

/// Starts what the workers' watches need: the stack-request handler and the monitor; sets
/// their timeout. Normal context.
pub(crate) fn prepare_workers(timeout: Option<Duration>) -> Result<(), Error> {
    if let Some(t) = timeout {
        super::check_timeout(t)?;
        WORKER_TIMEOUT_MS.store(
            u64::try_from(t.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
    threads::install()?;
    start_monitor();
    Ok(())
}

/// The calling thread, an executor's worker, runs out of work and parks: idle until
/// [`worker_unparked`]. Its first park asks `is_worker` (once per thread) and registers it as
/// a [`Kind::Worker`] named after the thread (allocates, once per thread: a hook's normal
/// context).
pub(crate) fn worker_parked(is_worker: impl FnOnce() -> bool) {
    let _ = WORKER.try_with(|w| {
        let Ok(mut w) = w.try_borrow_mut() else {
            return;
        };
        let watch = match &mut *w {
            WorkerState::NotWorker => return,
            WorkerState::Unknown if !is_worker() => {
                *w = WorkerState::NotWorker;
                return;
            }
            WorkerState::Worker(watch) => watch,
            WorkerState::Unknown => {
                *w = WorkerState::Worker(new_worker());
                match &*w {
                    WorkerState::Worker(watch) => watch,
                    _ => return,
                }
            }
        };
        watch
            .slot
            .last
            .store(TICK.load(Ordering::Relaxed) | PARKED, Ordering::Relaxed);
    });
}

/// The calling thread's watch as a worker, named after the thread.
fn new_worker() -> Watch {
    let tid = sys::gettid();
    let name = threads::info(tid).map_or_else(|| "worker".to_string(), |i| i.name().to_string());
    let ms = WORKER_TIMEOUT_MS.load(Ordering::Relaxed);
    let timeout = if ms == 0 {
        Duration::from_millis(super::DEFAULT_TIMEOUT_MS.load(Ordering::Relaxed))
    } else {
        Duration::from_millis(ms)
    };
    watch_thread(&name, Kind::Worker, timeout)
}

/// Whether the calling thread is a watched worker.
enum WorkerState {
    /// Not parked yet.
    Unknown,
    /// Parked, but not a worker the hooks watch (a current-thread runtime's `block_on`).
    NotWorker,
    /// A watched worker.
    Worker(Watch),
}

/// The calling worker wakes up to poll tasks: busy from now until it parks again (or pets).
/// Nothing for a thread that never parked (not a worker, or not yet).
pub(crate) fn worker_unparked() {
    let _ = WORKER.try_with(|w| {
        if let Ok(w) = w.try_borrow() {
            if let WorkerState::Worker(w) = &*w {
                w.pet();
            }
        }
    });
}

/// The calling worker stops: no longer watched.
pub(crate) fn worker_stopped() {
    let _ = WORKER.try_with(|w| {
        if let Ok(mut w) = w.try_borrow_mut() {
            *w = WorkerState::Unknown;
        }
    });
}
