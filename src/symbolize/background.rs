//! Building the symbol tables of objects: now, or in a background thread for large ones.
//!
//! A program that loads a very large object (rustc's `librustc_driver` with `libLLVM`: 256,600
//! function symbols, 37 MB of string tables) would spend a tenth of a second in `init` or
//! `refresh` reading and front-coding their names. Objects that map at least
//! [`set_background_index`] bytes (64 MiB by default) are instead queued for one background
//! thread, `selftrace-index`, and the index is published at once with their slots empty:
//! until their tables are in, a lookup there gives the object and offset with no name
//! ([`SymbolSource::Pending`](super::SymbolSource::Pending)), never a wrong name. Normal-context
//! callers that need names ([`super::backtrace_symbols`], [`super::Backtrace`],
//! [`super::prepare`]) wait for the objects they need, or build them themselves if the
//! background thread has not started on them.
//!
//! Every build is a job in one list, claimed by the thread (and process) that builds it; a
//! waiter whose job is claimed by a thread of this process waits for it, and takes over a job
//! that nobody of this process builds (a child forked while the indexer worked has no indexer).

use super::index::{build, Slot};
use crate::modules::Object;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Objects that map at least this many bytes are indexed in the background
/// (`usize::MAX`: none).
static BACKGROUND_MIN: AtomicUsize = AtomicUsize::new(64 << 20);

/// Sets the size from which an object's symbol table is built by a background thread instead
/// of by `init`/`refresh` themselves: objects that map at least `min_bytes` (64 MiB by
/// default), or none with `None`.
///
/// Until the background thread has built an object's table, [`symbolize`](super::symbolize)
/// gives its addresses without a name and with [`SymbolSource::Pending`](super::SymbolSource::Pending)
/// (a crash report then writes `[libfoo.so+0x2e40]`, never a wrong name); the normal-context
/// functions that need names wait for it, and [`prepare`](super::prepare) waits for every
/// object. Affects objects seen after the call.
pub fn set_background_index(min_bytes: Option<usize>) {
    BACKGROUND_MIN.store(min_bytes.unwrap_or(usize::MAX), Ordering::Relaxed);
}

/// The current threshold of [`set_background_index`].
pub(crate) fn background_min() -> usize {
    BACKGROUND_MIN.load(Ordering::Relaxed)
}

/// A table to build.
struct Job {
    slot: &'static Slot,
    object: Object,
    /// The process whose thread builds it (a pid), if any.
    claimed: Option<i32>,
}

/// The jobs not finished, and whether this process has an indexer thread running (its pid).
struct Jobs {
    list: Vec<Job>,
    indexer: Option<i32>,
}

static JOBS: Mutex<Jobs> = Mutex::new(Jobs {
    list: Vec::new(),
    indexer: None,
});

/// Signalled whenever a job finishes.
static FINISHED: Condvar = Condvar::new();

fn jobs() -> MutexGuard<'static, Jobs> {
    JOBS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers the build of `slot`'s tables: queued for the background thread if `later`, else
/// claimed by the caller, who must then call [`build_now`]. Normal context.
pub(crate) fn register(slot: &'static Slot, object: Object, later: bool) {
    let me = crate::sys::getpid();
    let mut j = jobs();
    j.list.push(Job {
        slot,
        object,
        claimed: (!later).then_some(me),
    });
    if later && j.indexer != Some(me) {
        let spawned = std::thread::Builder::new()
            .name("selftrace-index".into())
            .spawn(indexer);
        // Without a thread the jobs wait for the first caller that needs them.
        if spawned.is_ok() {
            j.indexer = Some(me);
        }
    }
}

/// Builds `slot`'s tables from `object` (its job claimed by the caller), sets them and removes
/// the job. If the build panics, the job is given up instead (a waiter takes it over), never
/// left claimed by a thread that is gone.
pub(crate) fn build_now(slot: &'static Slot, object: &Object) {
    /// Unclaims the job unless disarmed (the build did not return).
    struct Unclaim(&'static Slot);
    impl Drop for Unclaim {
        fn drop(&mut self) {
            let mut j = jobs();
            if let Some(job) = j
                .list
                .iter_mut()
                .find(|job| core::ptr::eq(job.slot, self.0))
            {
                job.claimed = None;
            }
            FINISHED.notify_all();
        }
    }
    let guard = Unclaim(slot);
    let tables = build(object);
    core::mem::forget(guard);
    // The files' symbol and string tables were read into the heap and freed; give the memory
    // back instead of keeping it for allocations that may never come. Before the tables are
    // out: the trim's TLB shootdowns would slow the first lookups on other cores.
    crate::sys::release_free_heap();
    slot.set(tables);
    let mut j = jobs();
    j.list.retain(|job| !core::ptr::eq(job.slot, slot));
    drop(j);
    FINISHED.notify_all();
}

/// The background thread: builds queued jobs until there are none, then ends.
fn indexer() {
    // Process-directed signals (a profiler's tick, SIGQUIT for a dump) go to other threads.
    crate::sys::signal::block_all_except(0);
    let me = crate::sys::getpid();
    loop {
        let next = {
            let mut j = jobs();
            match j
                .list
                .iter_mut()
                .find(|job| job.claimed.is_none_or(|p| p != me))
            {
                Some(job) => {
                    job.claimed = Some(me);
                    Some((job.slot, job.object.clone()))
                }
                None => {
                    j.indexer = None;
                    None
                }
            }
        };
        let Some((slot, object)) = next else {
            return;
        };
        build_now(slot, &object);
    }
}

/// Waits until `slot`'s tables are built, building them here if no thread of this process is
/// at it. Normal context.
pub(crate) fn wait(slot: &'static Slot) {
    if slot.get().is_some() {
        return;
    }
    let me = crate::sys::getpid();
    let mut j = jobs();
    loop {
        if slot.get().is_some() {
            return;
        }
        let Some(job) = j.list.iter_mut().find(|job| core::ptr::eq(job.slot, slot)) else {
            // No job and no tables: none will come (cannot happen; never wait for it).
            return;
        };
        if job.claimed == Some(me) {
            // A thread of this process builds it; wake now and then in case it gave up.
            j = FINISHED
                .wait_timeout(j, Duration::from_millis(100))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
            continue;
        }
        job.claimed = Some(me);
        let object = job.object.clone();
        drop(j);
        build_now(slot, &object);
        j = jobs();
    }
}
