//! The slot registry and its policy: which slot an object gets (one per distinct object, reused
//! across snapshots and `dlopen`/`dlclose` cycles), and whether its symbol tables are built now
//! or in a background thread for large ones.
//!
//! A program that loads a very large object (rustc's `librustc_driver` with `libLLVM`: 256,600
//! function symbols, 37 MB of string tables) would spend a tenth of a second in `init` or
//! `refresh` reading and front-coding their names. Objects that map at least
//! [`set_background_index`] bytes (64 MiB by default) are instead queued for one background
//! thread, `selftrace-index`, and the index is published at once with their slots empty:
//! until their tables are in, a lookup there gives the object and offset with no name
//! ([`SymbolSource::Pending`](super::SymbolSource::Pending)), never a wrong name. Normal-context
//! callers that need names ([`super::backtrace_symbols`], [`super::Backtrace`],
//! [`super::prepare`]) wait for the objects they need; they build them themselves only where
//! this process has no indexer thread (a child forked while the parent's worked, or a thread
//! that could not be started).
//!
//! A slot's builder is one atomic word (its process and thread ids), claimed with a
//! compare-exchange by the thread that builds its tables; a waiter whose slot a live thread of
//! this process builds sleeps on a futex, and takes over a slot whose builder is no thread of
//! this process. The queue is a list that only grows. The background thread takes no lock of
//! this crate, so a child forked at any moment (while the parent's indexer builds, queues or
//! finishes) has nothing of it half-held: it has no indexer thread, finds the parent's builder
//! gone, and builds what it needs itself.
#![allow(unsafe_code)]

use super::elf::build;
use super::index::{ObjectSymbols, Slot};
use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};

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

/// The slots queued for the background indexer, newest first, linked by [`Slot::next`]. Only
/// ever pushed to (slots are never freed), so it is walked without a lock.
static QUEUE: AtomicPtr<Slot> = AtomicPtr::new(core::ptr::null_mut());

/// The process whose `selftrace-index` thread runs (its pid), or 0.
static INDEXER: AtomicI32 = AtomicI32::new(0);

thread_local! {
    /// Whether this thread is the background indexer.
    static IN_INDEXER: Cell<bool> = const { Cell::new(false) };
}

/// How long a waiter sleeps before it checks again that the builder it waits for is alive.
const RECHECK_NS: u64 = 100_000_000;

/// The calling thread as a builder: `pid << 32 | tid`.
pub(crate) fn me() -> u64 {
    (crate::sys::getpid() as u32 as u64) << 32 | crate::sys::gettid() as u32 as u64
}

/// Whether `builder` (`pid << 32 | tid`) is a live thread of this process: not a thread of
/// the parent of a forked child. When unsure (a seccomp filter that refuses `tgkill`), no: a
/// second build of the same tables is harmless (the first one set wins), a wait for a thread
/// that is gone is not.
fn alive(builder: u64) -> bool {
    let (pid, tid) = ((builder >> 32) as i32, builder as u32 as i32);
    pid == crate::sys::getpid()
        && (tid == crate::sys::gettid() || crate::sys::tgkill(tid, 0) == Ok(()))
}

/// Whether `builder` leaves the slot to be claimed: its tables are not built and no live
/// thread of this process builds them.
fn free(builder: u64) -> bool {
    builder != Slot::BUILT && (builder == 0 || !alive(builder))
}

/// Whether [`claim`] would take `slot` now.
fn claimable(slot: &Slot) -> bool {
    slot.get().is_none() && free(slot.builder.load(Ordering::Acquire))
}

/// Claims `slot` for the calling thread if its tables are not built and no live thread of this
/// process builds them. Returns whether it did.
fn claim(slot: &Slot) -> bool {
    let me = me();
    let mut seen = slot.builder.load(Ordering::Acquire);
    loop {
        if slot.get().is_some() || !free(seen) {
            return false;
        }
        match slot
            .builder
            .compare_exchange(seen, me, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) => seen = now,
        }
    }
}

/// Queues `slot` for the background indexer and starts the indexer thread if this process has
/// none. Normal context; once per slot (`for_object`, for a slot it made).
pub(crate) fn queue(slot: &'static Slot) {
    let ptr = core::ptr::from_ref(slot).cast_mut();
    let mut head = QUEUE.load(Ordering::Relaxed);
    loop {
        slot.next.store(head, Ordering::Relaxed);
        match QUEUE.compare_exchange(head, ptr, Ordering::SeqCst, Ordering::Relaxed) {
            Ok(_) => break,
            Err(now) => head = now,
        }
    }
    // After the push (SeqCst): an indexer that announced its end before this load looks at
    // the queue once more and finds the slot; one that did so after it was seen running.
    let me = crate::sys::getpid();
    let running = INDEXER.load(Ordering::SeqCst);
    if running == me
        || INDEXER
            .compare_exchange(running, me, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
    {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("selftrace-index".into())
        .spawn(indexer);
    if spawned.is_err() {
        // Without a thread the slots wait for the first caller that needs them.
        let _ = INDEXER.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// The oldest queued slot the caller could claim (claimed), if any: the objects are built in
/// the order they were queued, as a refresh found them.
fn claim_queued() -> Option<&'static Slot> {
    loop {
        let mut oldest = None;
        let mut p = QUEUE.load(Ordering::SeqCst);
        // SAFETY: every pointer in the queue is a leaked `&'static Slot` (`queue`), published
        // with its `next` written before it (the compare-exchange orders it).
        while let Some(slot) = unsafe { p.as_ref() } {
            if claimable(slot) {
                oldest = Some(slot);
            }
            p = slot.next.load(Ordering::Acquire);
        }
        let slot = oldest?;
        if claim(slot) {
            return Some(slot);
        }
        // Claimed by another thread meanwhile: look again.
    }
}

/// Builds `slot`'s tables (claimed by the caller), sets them and wakes the waiters. A build
/// that panics (a bug, on a file it cannot handle) sets empty tables instead: the object has
/// no names, and nobody builds it again or waits for a thread that gave up.
pub(crate) fn build_now(slot: &'static Slot) {
    let built =
        std::panic::catch_unwind(AssertUnwindSafe(|| build(&slot.object, &slot.debug_roots)));
    // The files' symbol and string tables were read into the heap and freed; give the memory
    // back instead of keeping it for allocations that may never come. Before the tables are
    // out: the trim's TLB shootdowns would slow the first lookups on other cores.
    crate::sys::release_free_heap();
    slot.set(built.unwrap_or_else(|_| ObjectSymbols::empty()));
    slot.builder.store(Slot::BUILT, Ordering::Release);
    slot.changed.fetch_add(1, Ordering::Release);
    crate::sys::futex_wake(&slot.changed, i32::MAX);
}

/// The background thread: builds queued slots until there are none, then ends.
fn indexer() {
    // Process-directed signals (a profiler's tick, SIGQUIT for a dump) go to other threads.
    crate::sys::signal::block_all_except(0);
    IN_INDEXER.with(|c| c.set(true));
    let me = crate::sys::getpid();
    loop {
        while let Some(slot) = claim_queued() {
            build_now(slot);
        }
        // Announce the end, then look once more: a slot queued meanwhile may have seen this
        // thread running and started none.
        let _ = INDEXER.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
        let Some(slot) = claim_queued() else {
            return;
        };
        build_now(slot);
        if INDEXER
            .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            // Another indexer started meanwhile; it builds the rest.
            return;
        }
    }
}

/// Waits until `slot`'s tables are built, building them here if no live thread of this
/// process is at it. Returns at once, without tables, when the calling thread is the one
/// building them (a panic hook that symbolizes during the build). Normal context.
pub(crate) fn wait(slot: &'static Slot) {
    loop {
        // Read before the checks: a change after them makes the futex wait return at once.
        let changed = slot.changed.load(Ordering::Acquire);
        if slot.get().is_some() {
            return;
        }
        // A queued slot nobody builds yet, while this process's indexer runs: it gets to it.
        // Waiting instead of building it here keeps the builds in one thread, one after the
        // other: two at once, in two threads, each in its own malloc arena, left about 5 MB
        // more resident for rustc's driver and LLVM. Not on the indexer itself (a panic hook
        // there that symbolizes).
        let indexing =
            INDEXER.load(Ordering::SeqCst) == crate::sys::getpid() && !IN_INDEXER.with(Cell::get);
        if indexing && slot.builder.load(Ordering::Acquire) == 0 {
            crate::sys::futex_wait(&slot.changed, changed, RECHECK_NS);
            continue;
        }
        if claim(slot) {
            build_now(slot);
            continue;
        }
        let builder = slot.builder.load(Ordering::Acquire);
        if builder == me() {
            return;
        }
        if builder != Slot::BUILT && builder != 0 {
            // Woken when it is built; now and then, check that the builder is alive.
            crate::sys::futex_wait(&slot.changed, changed, RECHECK_NS);
        }
    }
}

/// What identifies an object across snapshots.
#[derive(PartialEq, Eq)]
struct Key {
    path: Box<str>,
    build_id: Box<[u8]>,
    glibc_path: Box<str>,
    /// Another file at the same path (rebuilt, without a build-id or with the same one) is
    /// another object.
    file: Option<crate::modules::FileId>,
}

/// Every object ever seen, for reuse (normal context only). A forked child takes it over from a
/// thread of the parent that held it and starts over (the slots it leaks stay valid).
static CACHE: crate::fork::ForkMutex<Vec<(Key, &'static Slot)>> =
    crate::fork::ForkMutex::new(Vec::new());

/// Before a fork: holds the object cache, waiting until `deadline` at most.
pub(crate) fn before_fork(deadline: u64) {
    CACHE.hold_for_fork(deadline, Vec::new);
}

/// After a fork: releases what [`before_fork`] took.
pub(crate) fn after_fork_release() {
    CACHE.release_after_fork();
}

/// Directories searched for separate debug files, in order: `$SELFTRACE_DEBUG_DIR` (if set),
/// then `/usr/lib/debug`.
fn debug_roots() -> Vec<String> {
    let mut roots = Vec::new();
    if let Some(d) = std::env::var_os("SELFTRACE_DEBUG_DIR") {
        roots.push(d.to_string_lossy().into_owned());
    }
    roots.push("/usr/lib/debug".to_string());
    roots
}

/// The slot of a loaded object: from the cache, or new, its tables built now or, for an
/// object that maps at least `background` bytes, queued for the background indexer. Normal
/// context only.
pub(crate) fn for_object(o: &crate::modules::Object, background: usize) -> &'static Slot {
    let glibc_path = glibc_name(o);
    let key = Key {
        path: o.path.as_str().into(),
        build_id: o.build_id.clone().unwrap_or_default().into(),
        glibc_path: glibc_path.as_str().into(),
        file: o.file,
    };
    let later = !o.is_vdso && o.range.len() >= background;
    let mut cache = CACHE.lock_or_reset(Vec::new);
    if let Some(&(_, slot)) = cache.iter().find(|(k, _)| *k == key) {
        drop(cache);
        // Another thread may be building it now (a concurrent `init`): a table that is not
        // for the background indexer is there when this returns, as if built here.
        if !later {
            wait(slot);
        }
        return slot;
    }
    // Claimed now by this thread if it builds the tables itself, before any other thread
    // can find the slot in the cache.
    let builder = if later { 0 } else { me() };
    let slot: &'static Slot = Box::leak(Box::new(Slot::new(
        key.path.clone(),
        key.glibc_path.clone(),
        key.build_id.clone(),
        o.clone(),
        debug_roots().into(),
        builder,
    )));
    cache.push((key, slot));
    drop(cache);
    if later {
        queue(slot);
    } else {
        build_now(slot);
    }
    slot
}

/// The name glibc's `dladdr` gives an object.
fn glibc_name(o: &crate::modules::Object) -> String {
    if o.is_vdso {
        "linux-vdso.so.1".to_string()
    } else if o.is_main {
        std::env::args_os()
            .next()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        o.path.clone()
    }
}
