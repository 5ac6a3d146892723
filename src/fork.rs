//! Fork safety: the locks and cells that survive a `fork()`, and the `pthread_atfork` handlers
//! that run each subsystem's [`ForkHook`] (registered where the subsystem lives, in the
//! [`FORK_HOOKS`] slice, so that this mechanism at the bottom imports none of them). A forked child has one thread, the one that called `fork()`; every lock that
//! another thread of the parent held at that moment stays held in the child, by nobody.
//!
//! selftrace handles each of its locks and of the states that threads of the parent own in one
//! of two ways:
//!
//! - **taken over**: a [`ForkMutex`] (the caches' locks, the writers' locks) and the output lock
//!   record their holder's tid; a thread that finds one held by a tid that is not a thread of
//!   this process (`tgkill(tid, 0)` says `ESRCH`), or held before the last fork (the child
//!   handler raises a fork generation that the lock word carries), takes the lock over. The
//!   value it guards may have been half updated: caches start over (the old value is leaked,
//!   never read again nor freed, since `'static` references into it may be out there);
//! - **held across the fork**: the caches whose loss costs a child most (the parsed DWARF, the
//!   resolved frames, the symbol index) are taken by the `pthread_atfork` prepare handler
//!   (the `prepare` of their [`ForkHook`]), before the fork (each wait bounded, else the child
//!   takes them over as above) and released in the parent and in the child, so that a child
//!   forked during a lookup keeps them;
//! - **reset in the child**: the `pthread_atfork` child handler, registered before `main`, runs
//!   the hooks' `child` in [`rank`] order, which frees what the parent's other threads held: reader marks of the published
//!   snapshots, walk slots and reuse records, stack requests in flight, a minidump being
//!   written, the profiler's state (its threads and timers are not inherited), the symbolizer
//!   process's pipes (that process answers the parent: the child's crash reports name
//!   functions without file:line unless it installs the crash handler again).
//!
//! Nothing in a child waits for a thread or process of the parent: the profiler's timer
//! thread, the watchdog's monitor (started again in the child by its next `watch`), the
//! background indexer (a slot it was building is claimed by the child's first user).
//!
//! Limit: a thread that forks while it itself holds one of these locks (possible only from a
//! callback or a signal handler that runs inside selftrace) keeps it in the child, but a second
//! thread that the child starts may take it over from it.
#![allow(unsafe_code)]

use crate::sys;
use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Raised by [`child`] in every forked child (9 bits: it lives in the lock word).
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// What one subsystem does around a `fork()`: an entry of [`FORK_HOOKS`], declared next to the
/// state it resets (`#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]`).
pub(crate) struct ForkHook {
    /// When its `child` runs in the child handler: lower first (see [`rank`]).
    pub(crate) rank: u8,
    /// In the forking thread before the fork: takes what the child should get whole, waiting
    /// until the deadline (`CLOCK_MONOTONIC` ns) at most.
    pub(crate) prepare: Option<fn(u64)>,
    /// In the parent after the fork: releases what `prepare` took.
    pub(crate) parent: Option<fn()>,
    /// In the child (one thread) after the fork: async-signal-safe, as the child handler of a
    /// multithreaded program's `fork()` must be.
    pub(crate) child: Option<fn()>,
}

impl ForkHook {
    /// A hook that only resets state in the child.
    pub(crate) const fn child(rank: u8, child: fn()) -> ForkHook {
        ForkHook {
            rank,
            prepare: None,
            parent: None,
            child: Some(child),
        }
    }
}

/// The order of the child hooks: what a later one relies on is reset by an earlier one.
pub(crate) mod rank {
    /// Locks the prepare handler took are released before anything else runs.
    pub(crate) const RELEASE: u8 = 0;
    /// The report output lock and its waiting table, the crash symbolizer's pipes (the child's
    /// reports name functions without file:line unless it installs the crash handler again).
    pub(crate) const CRASH: u8 = 2;
    /// The module snapshot's reader marks.
    pub(crate) const MODULES: u8 = 3;
    /// The symbol index's reader marks.
    pub(crate) const SYMBOLS: u8 = 4;
    /// Walk slots, reuse records, the unwinder's reader marks. (Only the unwinder's port uses
    /// it: there is none beyond x86-64 and aarch64.)
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) const UNWIND: u8 = 5;
    /// A minidump being written.
    pub(crate) const MINIDUMP: u8 = 6;
    /// Stack requests in flight, the dump signal's installation (used with the `threads`
    /// feature).
    #[cfg_attr(not(feature = "threads"), allow(dead_code))]
    pub(crate) const THREADS: u8 = 7;
    /// The profiler's state.
    pub(crate) const PROFILE: u8 = 8;
    /// The highest rank.
    pub(crate) const LAST: u8 = PROFILE;
}

/// Every subsystem's [`ForkHook`] (only those of the subsystems compiled in and linked).
// SAFETY: linkme's slice declaration (`link_section` bounds), read only by the handlers below.
#[allow(unsafe_code)]
#[linkme::distributed_slice]
pub(crate) static FORK_HOOKS: [ForkHook];

static REGISTERED: AtomicBool = AtomicBool::new(false);

/// The longest [`prepare`] delays a fork for the caches' locks, in all: lookups take
/// microseconds to milliseconds; a DWARF parse that takes longer is started over by the child.
pub(crate) const PREPARE_WAIT_NS: u64 = 200_000_000;

// Registers the handlers before main, in normal context (pthread_atfork allocates).
#[used]
#[link_section = ".init_array"]
static STARTUP: extern "C" fn() = startup_ctor;

extern "C" fn startup_ctor() {
    register();
}

/// Registers [`prepare`], [`parent`] and [`child`] with `pthread_atfork`, once. Normal
/// context (glibc allocates); the constructor above does it before `main`, `crate::init`
/// again in case that constructor was not linked in.
pub(crate) fn register() {
    if REGISTERED.swap(true, Ordering::AcqRel) {
        return;
    }
    if sys::atfork(prepare, parent, child).is_err() {
        REGISTERED.store(false, Ordering::Release);
    }
}

/// The `pthread_atfork` prepare handler, in the forking thread: each hook's `prepare`, with
/// one deadline for all.
unsafe extern "C" fn prepare() {
    let deadline = sys::monotonic_ns().saturating_add(PREPARE_WAIT_NS);
    for h in FORK_HOOKS.iter() {
        if let Some(f) = h.prepare {
            f(deadline);
        }
    }
}

/// The `pthread_atfork` parent handler: each hook's `parent`.
unsafe extern "C" fn parent() {
    for h in FORK_HOOKS.iter() {
        if let Some(f) = h.parent {
            f();
        }
    }
}

/// The `pthread_atfork` child handler: runs in the new child, which has one thread. A new fork
/// generation first (every [`ForkMutex`] held before the fork is taken over by its next user),
/// then the signal-action claims (`sys::signal`, which the installers the hooks reset read), then
/// each hook's `child`, by [`rank`].
unsafe extern "C" fn child() {
    next_generation();
    sys::signal::after_fork();
    for r in 0..=rank::LAST {
        for h in FORK_HOOKS.iter() {
            if h.rank == r {
                if let Some(f) = h.child {
                    f();
                }
            }
        }
    }
}

/// Starts a new fork generation: called by the child handler first thing in a forked child, so that every [`ForkMutex`] held before
/// the fork is taken over by its next user. Async-signal-safe (one atomic store).
fn next_generation() {
    GENERATION.store(
        (GENERATION.load(Ordering::Relaxed) + 1) & GEN_MASK,
        Ordering::Release,
    );
}

/// The calling thread's id, from a per-thread cache: a relaxed load and a thread-local read
/// after the first call (`gettid` is a system call). The cache is keyed by the fork generation,
/// so the thread of a forked child asks the kernel again. Async-signal-safe.
pub(crate) fn cached_tid() -> i32 {
    use core::cell::Cell;
    thread_local! {
        /// (fork generation + 1, tid); 0 before the first call.
        static TID: Cell<(u32, i32)> = const { Cell::new((0, 0)) };
    }
    let gen = GENERATION.load(Ordering::Relaxed) + 1;
    TID.try_with(|c| {
        let (g, tid) = c.get();
        if g == gen {
            return tid;
        }
        let tid = sys::gettid();
        c.set((gen, tid));
        tid
    })
    .unwrap_or_else(|_| sys::gettid())
}

/// A value set once and never freed, read lock-free: unlike `OnceLock`, whose initialisation
/// under way in a thread of the parent blocks a forked child for ever, nobody waits (two
/// threads that set it at once both build a value; the first wins).
#[cfg(any(feature = "trace", feature = "tracefs"))]
pub(crate) struct OnceBox<T>(core::sync::atomic::AtomicPtr<T>);

#[cfg(any(feature = "trace", feature = "tracefs"))]
impl<T> OnceBox<T> {
    /// Not set.
    pub(crate) const fn new() -> OnceBox<T> {
        OnceBox(core::sync::atomic::AtomicPtr::new(core::ptr::null_mut()))
    }

    /// The value, if set.
    pub(crate) fn get(&self) -> Option<&T> {
        let p = self.0.load(Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Box::into_raw` in `set`, was published after
        // the value was written (Release/Acquire) and is never freed.
        unsafe { p.as_ref() }
    }

    /// Sets the value unless it is set: the value in use, and whether it is `value`.
    #[cfg_attr(not(feature = "tracefs"), allow(dead_code))]
    pub(crate) fn set(&self, value: T) -> (&T, bool) {
        let p = Box::into_raw(Box::new(value));
        match self.0.compare_exchange(
            core::ptr::null_mut(),
            p,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: just published; never freed.
            Ok(_) => (unsafe { &*p }, true),
            Err(old) => {
                // SAFETY: p came from Box::into_raw above and was never published.
                drop(unsafe { Box::from_raw(p) });
                // SAFETY: old is a published value, never freed.
                (unsafe { &*old }, false)
            }
        }
    }
}

// SAFETY: shares `&T` between threads and moves `T` in from any thread.
#[cfg(any(feature = "trace", feature = "tracefs"))]
unsafe impl<T: Send + Sync> Sync for OnceBox<T> {}

/// Whether `tid` holds nothing any more: not a thread of this process (a thread of the parent
/// of a forked child, or one that exited).
pub(crate) fn holder_gone(tid: i32) -> bool {
    tid != sys::gettid() && sys::tgkill(tid, 0).err().and_then(|e| e.errno()) == Some(libc::ESRCH)
}

const TID_BITS: u32 = 22;
/// Tids are below 2^22 (`PID_MAX_LIMIT`).
const TID_MASK: u32 = (1 << TID_BITS) - 1;
const WAITERS: u32 = 1 << TID_BITS;
const GEN_SHIFT: u32 = TID_BITS + 1;
const GEN_MASK: u32 = (1 << (32 - GEN_SHIFT)) - 1;

/// A mutex for normal context whose holder may be a thread that does not exist: one of the
/// parent of a forked child, or one that exited. [`ForkMutex::lock`] takes such a lock over
/// (see the module docs). A futex word: `generation << 23 | waiters << 22 | tid`, 0 when free.
/// Not reentrant; no poisoning (a panic under the lock leaves the value as it is, as the
/// `unwrap_or_else(into_inner)` of the std mutexes it replaces did).
pub(crate) struct ForkMutex<T> {
    word: AtomicU32,
    /// The lock word [`ForkMutex::hold_for_fork`] set (0: not held for a fork).
    fork_word: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, held by one thread at a time (the lock
// word); a taken-over lock's holder no longer exists in this process.
unsafe impl<T: Send> Sync for ForkMutex<T> {}
// SAFETY: as for any mutex: moving it moves the value.
unsafe impl<T: Send> Send for ForkMutex<T> {}

/// A held [`ForkMutex`]; released on drop.
pub(crate) struct ForkGuard<'a, T> {
    lock: &'a ForkMutex<T>,
    word: u32,
    taken_over: bool,
}

impl<T> ForkMutex<T> {
    /// A free lock around `value`.
    pub(crate) const fn new(value: T) -> ForkMutex<T> {
        ForkMutex {
            word: AtomicU32::new(0),
            fork_word: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }

    fn guard(&self, word: u32, taken_over: bool) -> ForkGuard<'_, T> {
        ForkGuard {
            lock: self,
            word,
            taken_over,
        }
    }

    /// Takes the lock, waiting for a live holder; taking it over from one that is gone
    /// ([`ForkGuard::taken_over`] then says so: the value may be half updated).
    pub(crate) fn lock(&self) -> ForkGuard<'_, T> {
        loop {
            if let Some(g) = self.lock_until(u64::MAX) {
                return g;
            }
        }
    }

    /// [`ForkMutex::lock`] until `deadline` (monotonic ns): `None` if a live holder kept it.
    fn lock_until(&self, deadline: u64) -> Option<ForkGuard<'_, T>> {
        let tid = sys::gettid() as u32 & TID_MASK;
        let mut mine = GENERATION.load(Ordering::Acquire) << GEN_SHIFT | tid;
        let mut cur = 0;
        loop {
            if cur == 0 {
                match self
                    .word
                    .compare_exchange(0, mine, Ordering::Acquire, Ordering::Relaxed)
                {
                    Ok(_) => return Some(self.guard(mine, false)),
                    Err(now) => cur = now,
                }
                continue;
            }
            let gen = GENERATION.load(Ordering::Acquire);
            if cur >> GEN_SHIFT != gen || holder_gone((cur & TID_MASK) as i32) {
                // Keep the waiters bit: others may sleep on the word.
                let taken = gen << GEN_SHIFT | (cur & WAITERS) | tid;
                match self
                    .word
                    .compare_exchange(cur, taken, Ordering::Acquire, Ordering::Relaxed)
                {
                    Ok(_) => return Some(self.guard(taken, true)),
                    Err(now) => cur = now,
                }
                continue;
            }
            if cur & WAITERS == 0 {
                if let Err(now) = self.word.compare_exchange(
                    cur,
                    cur | WAITERS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    cur = now;
                    continue;
                }
                cur |= WAITERS;
            }
            let now = sys::monotonic_ns();
            if now >= deadline {
                return None;
            }
            // Woken by the release; now and then, check that the holder still exists.
            sys::futex_wait(&self.word, cur, (deadline - now).min(50_000_000));
            // Having slept, take the lock with the waiters bit: others may sleep too.
            mine = GENERATION.load(Ordering::Acquire) << GEN_SHIFT | WAITERS | tid;
            cur = self.word.load(Ordering::Relaxed);
        }
    }

    /// Takes the lock if it is free or its holder is gone (then taken over, as
    /// [`ForkMutex::lock`] does); `None` while a live thread holds it.
    pub(crate) fn try_lock(&self) -> Option<ForkGuard<'_, T>> {
        self.lock_until(0)
    }

    /// [`ForkMutex::lock`], and a value taken over from a holder that is gone is replaced by
    /// `fresh()` (the old one is leaked: it may be half updated, and `'static` references into
    /// it may be out there).
    pub(crate) fn lock_or_reset(&self, fresh: impl FnOnce() -> T) -> ForkGuard<'_, T> {
        let g = self.lock();
        if g.taken_over {
            // SAFETY: we hold the lock; the old value is overwritten without being read or
            // dropped (leaked on purpose).
            unsafe { core::ptr::write(self.value.get(), fresh()) };
        }
        g
    }

    /// For the prepare handler: takes the lock until [`ForkMutex::release_after_fork`],
    /// waiting until `deadline` (monotonic ns) at most. Returns whether it holds it. A value
    /// taken over from a gone holder is replaced by `fresh()`, as [`ForkMutex::lock_or_reset`]
    /// does.
    pub(crate) fn hold_for_fork(&self, deadline: u64, fresh: impl FnOnce() -> T) -> bool {
        let Some(g) = self.lock_until(deadline) else {
            return false;
        };
        if g.taken_over {
            // SAFETY: as in `lock_or_reset`.
            unsafe { core::ptr::write(self.value.get(), fresh()) };
        }
        self.fork_word.store(g.word, Ordering::Relaxed);
        core::mem::forget(g);
        true
    }

    /// Releases what [`ForkMutex::hold_for_fork`] took: in the parent and, as the child's
    /// own (its one thread forked holding it), in the child.
    pub(crate) fn release_after_fork(&self) {
        if self.fork_word.swap(0, Ordering::Relaxed) == 0 {
            return;
        }
        if self.word.swap(0, Ordering::Release) & WAITERS != 0 {
            sys::futex_wake(&self.word, 1);
        }
    }
}

impl<T> ForkGuard<'_, T> {
    /// Whether the lock was taken over from a holder that no longer exists.
    #[cfg(test)]
    pub(crate) fn taken_over(&self) -> bool {
        self.taken_over
    }
}

impl<T> Deref for ForkGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for ForkGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the only access.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for ForkGuard<'_, T> {
    fn drop(&mut self) {
        // Release only our own hold (a thread that took the lock over from us in a forked
        // child owns it now), with or without the waiters bit set meanwhile.
        let mut cur = self.lock.word.load(Ordering::Relaxed);
        loop {
            if cur & !WAITERS != self.word & !WAITERS {
                return;
            }
            match self
                .lock
                .word
                .compare_exchange(cur, 0, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        if cur & WAITERS != 0 {
            sys::futex_wake(&self.lock.word, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_and_wakes() {
        let m = Arc::new(ForkMutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = m.lock();
                        let v = *g;
                        std::hint::black_box(&mut *g);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 80_000);
    }

    #[test]
    fn a_lock_held_by_a_thread_that_exited_is_taken_over_and_reset() {
        static M: ForkMutex<Vec<u32>> = ForkMutex::new(Vec::new());
        M.lock().push(1);
        std::thread::spawn(|| {
            let mut g = M.lock();
            g.push(2);
            core::mem::forget(g);
        })
        .join()
        .unwrap();
        let g = M.lock_or_reset(|| vec![7]);
        assert!(g.taken_over());
        assert_eq!(*g, [7]);
        drop(g);
        let g = M.lock();
        assert!(!g.taken_over());
    }

    #[test]
    fn a_lock_held_before_a_fork_is_free_in_the_child() {
        static M: ForkMutex<u32> = ForkMutex::new(5);
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let g = M.lock();
            tx.send(()).unwrap();
            let _ = done_rx.recv();
            drop(g);
        });
        rx.recv().unwrap();
        // SAFETY: the child only takes the lock (no allocation) and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = {
                let g = M.lock();
                g.taken_over() && *g == 5
            };
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: reaps our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
