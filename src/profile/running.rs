//! A running profiler's lifecycle: `start` publishes the handler's state and starts the
//! profiler's thread (which starts the timer thread), `take` ends an interval, `stop` ends
//! the run and gives the signal back. The arrows go one way: this file uses the handler
//! (`handler.rs`), the timers (`timer.rs`) and the aggregation (`aggregate.rs`); none of them
//! knows it.
#![allow(unsafe_code)]

use super::aggregate::{pull, Aggregator, Raw, NAME_REFRESH};
use super::data::{Mode, Profile};
use super::handler::{
    install, on_sample, quiesce, unpublish, Shared, DRAIN, GENERATION, RUNNING, SHARED,
};
use super::ring::Ring;
use super::timer::{timer_thread, Consumer, Counters, Plan};
use super::{Builder, Stats, Threads};
use crate::error::Error;
use crate::sys;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// How many pulled samples the profiler's thread names under one hold of the aggregator's
/// lock: a `take` waits for one such chunk at most.
const CHUNK: usize = 1024;

/// State shared by the [`super::Profiler`] handle and its thread.
struct Inner {
    agg: Mutex<Aggregator>,
    /// Samples pulled out of the ring and not yet aggregated. Every pull from the ring happens
    /// under this lock (the ring has one consumer at a time); taken after `agg` when both are.
    pulled: Mutex<Vec<Raw>>,
    /// Tells the profiler's thread that samples were pulled.
    pulled_cv: std::sync::Condvar,
    /// `take` calls waiting for `agg`: the profiler's thread lets them go first.
    taking: AtomicUsize,
    shared: *const Shared,
    stop: AtomicBool,
    /// What the timer thread counts.
    counters: Counters,
    mode: Mode,
    frequency_hz: u32,
    /// The sampling signal (given back at stop).
    signal: i32,
}

// SAFETY: `shared` points to the published Shared, which is Sync and outlives Inner's use of
// it (freed in Running::stop after the thread ended).
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Inner {
    fn ring(&self) -> &Ring {
        // SAFETY: see the Send impl.
        unsafe { &(*self.shared).ring }
    }

    fn lock(&self) -> MutexGuard<'_, Aggregator> {
        self.agg.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_pulled(&self) -> MutexGuard<'_, Vec<Raw>> {
        self.pulled.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Empties the ring into the pulled samples (fast: copies only); returns how many.
    fn pull(&self) -> usize {
        let mut pulled = self.lock_pulled();
        let before = pulled.len();
        pull(self.ring(), &mut pulled);
        pulled.len() - before
    }

    /// At most `limit` of the pulled samples, with the ring emptied into them first, and
    /// whether some are left.
    fn take_pulled(&self, limit: usize) -> (Vec<Raw>, bool) {
        let mut pulled = self.lock_pulled();
        pull(self.ring(), &mut pulled);
        if pulled.len() <= limit {
            (std::mem::take(&mut *pulled), false)
        } else {
            // Which samples go first does not matter: they are counted, not ordered.
            let at = pulled.len() - limit;
            (pulled.split_off(at), true)
        }
    }

    /// Gives an emptied batch's allocation back for the next pulls.
    fn recycle(&self, batch: Vec<Raw>) {
        let mut pulled = self.lock_pulled();
        if pulled.is_empty() && pulled.capacity() < batch.capacity() {
            *pulled = batch;
        }
    }

    /// Names at most `limit` of the pulled samples (with the ring emptied into them first) into
    /// `agg`, the aggregator this caller locked; returns whether some are left. A drain that
    /// sees objects loaded or unloaded refreshes selftrace's view of them (`crate::refresh`).
    fn drain(&self, agg: &mut Aggregator, defer_refresh: bool, limit: usize) -> bool {
        let (batch, left) = self.take_pulled(limit);
        if batch.is_empty() {
            return left;
        }
        let batch = agg.drain(batch, defer_refresh, crate::setup::refresh);
        self.recycle(batch);
        left
    }
}

impl Consumer for Inner {
    fn pull(&self) {
        if Inner::pull(self) > 0 {
            self.pulled_cv.notify_one();
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// A running profiler.
pub(crate) struct Running {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
    pid: i32,
}

pub(crate) fn start(b: Builder) -> Result<Running, Error> {
    if RUNNING
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(Error::AlreadyExists("a running profiler"));
    }
    let sig = b.signal;
    match start_locked(b) {
        Ok(r) => Ok(r),
        Err(e) => {
            // A start that failed after taking the signal gives it back.
            if sys::signal::owner(sig) == Some(sys::signal::Owner::Profiler) {
                let _ = sys::signal::give_back(sig, on_sample, true);
                sys::signal::set_owner(sig, None);
            }
            RUNNING.store(false, Ordering::Release);
            Err(e)
        }
    }
}

fn start_locked(b: Builder) -> Result<Running, Error> {
    let _ = crate::setup::init();
    // The threads first: a start refused for them leaves the signal alone.
    if let Threads::Only(tids) = &b.threads {
        if tids.iter().any(|&t| t <= 0) {
            return Err(Error::InvalidInput(
                "thread ids must be positive (tids of this process)",
            ));
        }
        if tids.iter().any(|&t| sys::tgkill(t, 0).is_err()) {
            return Err(Error::ThreadGone);
        }
    }
    install(b.signal)?;
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    let shared = Box::into_raw(Box::new(Shared {
        ring: Ring::new(b.ring_capacity),
        generation,
    }));
    let inner = Arc::new(Inner {
        agg: Mutex::new(Aggregator::new()),
        pulled: Mutex::new(Vec::new()),
        pulled_cv: std::sync::Condvar::new(),
        taking: AtomicUsize::new(0),
        shared,
        stop: AtomicBool::new(false),
        counters: Counters::new(),
        mode: b.mode,
        frequency_hz: b.frequency_hz,
        signal: b.signal,
    });
    SHARED.store(shared, Ordering::SeqCst);
    let plan = Plan {
        mode: b.mode,
        signal: b.signal,
        frequency_hz: b.frequency_hz,
        threads: b.threads,
        rescan: b.rescan,
        generation,
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread_inner = inner.clone();
    let spawned = std::thread::Builder::new()
        .name("selftrace-prof".into())
        .spawn(move || profiler_thread(thread_inner, plan, ready_tx));
    let thread = match spawned {
        Ok(t) => t,
        Err(e) => {
            unpublish(shared);
            return Err(Error::from_io("pthread_create", &e));
        }
    };
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(Running {
            inner,
            thread: Some(thread),
            pid: sys::getpid(),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            unpublish(shared);
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            unpublish(shared);
            Err(Error::Sys {
                call: "profiler thread",
                errno: libc::EIO,
            })
        }
    }
}

/// The profiler's thread: aggregates and names the samples that the second thread,
/// [`timer_thread`], pulls out of the ring. That thread also arms the timers of new threads, so
/// that a slow symbolization here (the first address of a large object reads its DWARF) never
/// delays sampling threads started meanwhile nor lets the ring fill up.
fn profiler_thread(
    inner: Arc<Inner>,
    plan: Plan,
    ready: std::sync::mpsc::Sender<Result<(), Error>>,
) {
    let me = sys::gettid();
    let rescan = plan.rescan;
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let timer_inner = inner.clone();
    let (timer_ready_tx, timer_ready_rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("selftrace-timer".into())
        .spawn(move || timer_thread(&*timer_inner, &plan, me, timer_ready_tx, stop_rx));
    let timers = match spawned {
        Ok(t) => t,
        Err(e) => {
            let _ = ready.send(Err(Error::from_io("pthread_create", &e)));
            return;
        }
    };
    match timer_ready_rx.recv() {
        Ok(Ok(())) => {
            let _ = ready.send(Ok(()));
        }
        Ok(Err(e)) => {
            let _ = timers.join();
            let _ = ready.send(Err(e));
            return;
        }
        Err(_) => {
            let _ = timers.join();
            let _ = ready.send(Err(Error::Sys {
                call: "profiler timer thread",
                errno: libc::EIO,
            }));
            return;
        }
    }
    let mut names_read = Instant::now();
    loop {
        // A `take` goes first: it names what is left itself, and does not wait behind a
        // backlog that this thread would name chunk after chunk.
        while inner.taking.load(Ordering::Acquire) > 0 && !inner.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let left = inner.drain(&mut inner.lock(), true, CHUNK);
        if inner.stop.load(Ordering::Acquire) {
            break;
        }
        if names_read.elapsed() >= NAME_REFRESH {
            refresh_names(&inner);
            names_read = Instant::now();
        }
        if left {
            continue;
        }
        let pulled = inner.lock_pulled();
        if pulled.is_empty() {
            let _ = inner.pulled_cv.wait_timeout(pulled, rescan);
        }
    }
    // The timer thread deletes its timers as it ends, which stops new samples; samples already
    // in the ring are drained by stop.
    drop(stop_tx);
    let _ = timers.join();
}

/// Reads the names of the sampled threads again (those read [`NAME_REFRESH`] ago or more),
/// outside the aggregator's lock: a thread that named itself after its first sample is shown
/// by its new name from then on. A thread that is gone keeps the name it had.
fn refresh_names(inner: &Inner) {
    let stale = inner.lock().stale_names();
    let fresh: Vec<(i32, Option<Arc<str>>)> = stale
        .into_iter()
        .map(|tid| (tid, crate::threads::info(tid).map(|i| Arc::from(i.name()))))
        .collect();
    let now = Instant::now();
    inner.lock().renamed(fresh, now);
}

impl Running {
    pub(crate) fn take(&self) -> Profile {
        if sys::getpid() != self.pid {
            // A forked child's copy of the parent's profiler: it samples nothing here, and its
            // locks may be held by the parent's threads.
            return empty(self.inner.mode, self.inner.frequency_hz);
        }
        self.inner.taking.fetch_add(1, Ordering::AcqRel);
        let mut agg = self.inner.lock();
        self.inner.taking.fetch_sub(1, Ordering::AcqRel);
        self.inner.drain(&mut agg, false, usize::MAX);
        let dropped = self.inner.ring().dropped.load(Ordering::Relaxed);
        agg.finish(self.inner.mode, self.inner.frequency_hz, dropped)
    }

    pub(crate) fn stop(mut self) -> Profile {
        self.inner.stop.store(true, Ordering::Release);
        let thread = self.thread.take();
        if sys::getpid() != self.pid {
            // A forked child: the profiler's thread and timers exist only in the parent (its
            // join handle would wait forever). The child may start a profiler of its own.
            core::mem::forget(thread);
            // Unless the child's fork handler did it already (and the child started a
            // profiler of its own since).
            if SHARED
                .compare_exchange(
                    self.inner.shared as *mut Shared,
                    core::ptr::null_mut(),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            {
                RUNNING.store(false, Ordering::Release);
            }
            return empty(self.inner.mode, self.inner.frequency_hz);
        }
        if DRAIN.swap(1, Ordering::AcqRel) == 0 {
            sys::futex_wake(&DRAIN, 1);
        }
        self.inner.pulled_cv.notify_all();
        if let Some(t) = thread {
            let _ = t.join();
        }
        quiesce();
        let profile = self.take();
        unpublish(self.inner.shared as *mut Shared);
        // The signal's previous action back (`SIG_IGN` for `SIG_DFL`: a late signal of a
        // deleted timer must not kill the process).
        let _ = sys::signal::give_back(self.inner.signal, on_sample, true);
        sys::signal::set_owner(self.inner.signal, None);
        RUNNING.store(false, Ordering::Release);
        profile
    }

    pub(crate) fn stats(&self) -> Stats {
        let ring = self.inner.ring();
        Stats {
            samples: ring.written.load(Ordering::Relaxed),
            dropped: ring.dropped.load(Ordering::Relaxed),
            threads: self.inner.counters.threads.load(Ordering::Relaxed),
            threads_seen: self.inner.counters.threads_seen.load(Ordering::Relaxed),
            stride: self.inner.counters.stride.load(Ordering::Relaxed),
        }
    }
}

fn empty(mode: Mode, frequency_hz: u32) -> Profile {
    Profile {
        mode,
        frequency_hz,
        period_ns: 1_000_000_000 / u64::from(frequency_hz),
        start: SystemTime::now(),
        duration: Duration::ZERO,
        samples: Vec::new(),
        locations: Vec::new(),
        mappings: Vec::new(),
        dropped: 0,
    }
}
