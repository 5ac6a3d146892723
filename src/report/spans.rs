//! Each thread's current tracing spans, as the thread lines of dumps, crash reports and
//! watchdog reports print them:
//!
//! ```text
//! thread "tokio-rt-worker" tid 4245, state S (sleeping), cpu 0.012s
//!  in span: request > handle_upload > parse (task 17)
//! ```
//!
//! A thread's record is written by the thread itself (the span layer of [`crate::tasks`], at
//! each enter and exit) and read by any thread, signal handlers included: a sequence lock, no
//! lock and no allocation on either side. The names are the spans' `&'static str` names (their
//! callsite's metadata), so a record never points at memory that goes away. A record holds
//! the innermost [`DEPTH`] spans and counts the outer ones it dropped (printed as `…`); a thread
//! that finds every record taken keeps none and is counted ([`threads_without_record`]).
//!
//! # Async-signal safety
//! Reading ([`write_span_names`]) is async-signal-safe; so are [`enter`] and [`exit`] (they may
//! run in a handler that interrupted the same thread's [`enter`]: the reader then sees the
//! record being written and says so).
#![allow(unsafe_code)]
// Written only by `tasks::SpanLayer` (the `tracing` and `threads` features); read always.
#![cfg_attr(not(all(feature = "tracing", feature = "threads")), allow(dead_code))]

use crate::fmt::FixedBuf;
use core::sync::atomic::{
    fence, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// Records: one per thread that entered a span, given back when it exits.
const THREADS: usize = 1024;
/// Spans a record names (the innermost ones).
pub(crate) const DEPTH: usize = 8;
/// The name of an outer span a record dropped and an exit uncovered.
const UNKNOWN: &str = "?";

#[repr(align(64))] // A record on cache lines of its own (each entry on one line).
struct Record {
    /// The owner thread, 0 when free.
    tid: AtomicI32,
    /// Odd while the owner writes.
    seq: AtomicU32,
    /// Spans entered and not exited (may exceed [`DEPTH`]: the entries are a ring of the
    /// innermost).
    depth: AtomicUsize,
    /// The spans, a ring of the innermost.
    entries: [Entry; DEPTH],
}

/// One span of a record (one cache line for the four fields an enter writes).
#[repr(align(32))]
struct Entry {
    name: AtomicPtr<u8>,
    len: AtomicUsize,
    id: AtomicU64,
    /// The async task the span was entered in (its id + 1), 0: none or unknown.
    task: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // Only as the array's initializer.
const FREE: Record = Record {
    tid: AtomicI32::new(0),
    seq: AtomicU32::new(0),
    depth: AtomicUsize::new(0),
    entries: [const {
        Entry {
            name: AtomicPtr::new(core::ptr::null_mut()),
            len: AtomicUsize::new(0),
            id: AtomicU64::new(0),
            task: AtomicU64::new(0),
        }
    }; DEPTH],
};

static RECORDS: [Record; THREADS] = [FREE; THREADS];
/// Threads that found no free record (their spans are not in reports).
static WITHOUT_RECORD: AtomicUsize = AtomicUsize::new(0);

/// Gives the calling thread's record back when the thread exits (set up when it claims one).
struct GiveBack;

impl Drop for GiveBack {
    fn drop(&mut self) {
        let r = MINE.get();
        if !r.is_null() && r != FULL {
            MINE.set(core::ptr::null());
            // SAFETY: a non-null MINE other than FULL points into RECORDS (a static).
            let r = unsafe { &*r };
            r.depth.store(0, Ordering::Relaxed);
            r.tid.store(0, Ordering::Release);
        }
    }
}

/// MINE of a thread that found no record free.
const FULL: *const Record = core::ptr::dangling();

thread_local! {
    /// The calling thread's record: null before its first span, [`FULL`] when none was free.
    /// No destructor, so the enter and exit paths read it with a plain thread-local access.
    static MINE: core::cell::Cell<*const Record> =
        const { core::cell::Cell::new(core::ptr::null()) };
    static GIVE_BACK: GiveBack = const { GiveBack };
}

/// The calling thread's record, claimed at its first call.
#[inline]
fn mine() -> Option<&'static Record> {
    let r = MINE.get();
    if r.is_null() {
        return claim();
    }
    if r == FULL {
        return None;
    }
    // SAFETY: a non-null MINE other than FULL points into RECORDS (a static).
    Some(unsafe { &*r })
}

#[cold]
fn claim() -> Option<&'static Record> {
    // The record is given back at thread exit; a thread already past its thread-local
    // destructors claims none.
    GIVE_BACK.try_with(|_| ()).ok()?;
    let tid = crate::fork::cached_tid();
    let claimed = RECORDS.iter().find(|r| {
        r.tid
            .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    match claimed {
        Some(r) => {
            MINE.set(r);
            Some(r)
        }
        None => {
            MINE.set(FULL);
            WITHOUT_RECORD.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Threads whose spans are not recorded because every record was taken.
pub(crate) fn threads_without_record() -> usize {
    WITHOUT_RECORD.load(Ordering::Relaxed)
}

/// Runs `write` between the two bumps of the record's sequence.
fn writing(r: &Record, write: impl FnOnce()) {
    let s = r.seq.load(Ordering::Relaxed);
    r.seq.store(s.wrapping_add(1), Ordering::Relaxed);
    fence(Ordering::Release);
    write();
    r.seq.store(s.wrapping_add(2), Ordering::Release);
}

/// The calling thread entered span `id` named `name`, in async task `task` (its id) if known.
pub(crate) fn enter(id: u64, name: &'static str, task: Option<u64>) {
    let Some(r) = mine() else { return };
    writing(r, || {
        let depth = r.depth.load(Ordering::Relaxed);
        let at = depth % DEPTH;
        r.entries[at]
            .name
            .store(name.as_ptr().cast_mut(), Ordering::Relaxed);
        r.entries[at].len.store(name.len(), Ordering::Relaxed);
        r.entries[at].id.store(id, Ordering::Relaxed);
        r.entries[at]
            .task
            .store(task.map_or(0, |t| t.wrapping_add(1)), Ordering::Relaxed);
        r.depth.store(depth + 1, Ordering::Relaxed);
    });
}

/// The calling thread exited span `id`: the innermost, or (exits out of order) the one below
/// it with that id, whose inner entries move down. A span not in the record (entered before
/// it existed, or among the outer ones dropped) leaves the named ones as they are.
pub(crate) fn exit(id: u64) {
    let Some(r) = mine() else { return };
    writing(r, || {
        let depth = r.depth.load(Ordering::Relaxed);
        let kept = depth.min(DEPTH);
        // k = 0: the innermost.
        let found = (0..kept).find(|&k| {
            r.entries[(depth - 1 - k) % DEPTH]
                .id
                .load(Ordering::Relaxed)
                == id
        });
        match found {
            Some(k) => {
                // Move the k entries inside it down by one.
                for j in (0..k).rev() {
                    let from = (depth - 1 - j) % DEPTH;
                    let to = (depth - 2 - j) % DEPTH;
                    r.entries[to].name.store(
                        r.entries[from].name.load(Ordering::Relaxed),
                        Ordering::Relaxed,
                    );
                    r.entries[to].len.store(
                        r.entries[from].len.load(Ordering::Relaxed),
                        Ordering::Relaxed,
                    );
                    r.entries[to].id.store(
                        r.entries[from].id.load(Ordering::Relaxed),
                        Ordering::Relaxed,
                    );
                    r.entries[to].task.store(
                        r.entries[from].task.load(Ordering::Relaxed),
                        Ordering::Relaxed,
                    );
                }
                r.depth.store(depth - 1, Ordering::Relaxed);
            }
            None if depth > DEPTH => r.depth.store(depth - 1, Ordering::Relaxed),
            None => {}
        }
        // Once more spans were entered than a record names, an exit uncovers an outer one it
        // dropped: named `?`, not the stale entry the ring holds there.
        let now = r.depth.load(Ordering::Relaxed);
        if now >= DEPTH && now < depth {
            let at = now % DEPTH;
            r.entries[at]
                .name
                .store(UNKNOWN.as_ptr().cast_mut(), Ordering::Relaxed);
            r.entries[at].len.store(UNKNOWN.len(), Ordering::Relaxed);
            r.entries[at].id.store(0, Ordering::Relaxed);
            r.entries[at].task.store(0, Ordering::Relaxed);
        }
    });
}

/// Live spans' names by id (for the span layer), so that an enter finds its span's name without the registry's
/// lookup (which takes and drops a reference: most of an enter's cost). A slot holds one span
/// at a time (`id % NAMES`); an enter whose span is not in its slot (two live spans share it)
/// asks the registry.
const NAMES: usize = 1024;

struct NameSlot {
    /// The span's id, 0 while the slot is empty or being written.
    id: AtomicU64,
    ptr: AtomicPtr<u8>,
    len: AtomicUsize,
}

static BY_ID: [NameSlot; NAMES] = [const {
    NameSlot {
        id: AtomicU64::new(0),
        ptr: AtomicPtr::new(core::ptr::null_mut()),
        len: AtomicUsize::new(0),
    }
}; NAMES];

fn name_slot(id: u64) -> &'static NameSlot {
    &BY_ID[(id as usize) % NAMES]
}

/// Span `id` is named `name` (its slot taken over, whoever had it).
pub(crate) fn publish_name(id: u64, name: &'static str) {
    let s = name_slot(id);
    s.id.store(0, Ordering::Relaxed);
    fence(Ordering::Release);
    s.ptr.store(name.as_ptr().cast_mut(), Ordering::Relaxed);
    s.len.store(name.len(), Ordering::Relaxed);
    s.id.store(id, Ordering::Release);
}

/// Span `id` closed: its slot, if it still holds it, is empty.
pub(crate) fn retract_name(id: u64) {
    let _ = name_slot(id)
        .id
        .compare_exchange(id, 0, Ordering::Relaxed, Ordering::Relaxed);
}

/// Span `id`'s name, if its slot holds it. (Ids of live spans are unique: the slot cannot hold
/// another span with the same id, so a slot that reads `id` before and after holds its name.)
pub(crate) fn published_name(id: u64) -> Option<&'static str> {
    let s = name_slot(id);
    if s.id.load(Ordering::Acquire) != id {
        return None;
    }
    let (ptr, len) = (s.ptr.load(Ordering::Relaxed), s.len.load(Ordering::Relaxed));
    fence(Ordering::Acquire);
    if s.id.load(Ordering::Relaxed) != id {
        return None;
    }
    // SAFETY: a pointer and length published together from one `&'static str`, read while the
    // slot held this span before and after.
    Some(unsafe { core::str::from_utf8_unchecked(core::slice::from_raw_parts(ptr, len)) })
}

/// A consistent copy of a record.
struct Snapshot {
    depth: usize,
    names: [(usize, usize); DEPTH],
    task: u64,
}

/// Reads thread `tid`'s record: `None` if it has none; `Some(None)` if it was being written
/// at each of a few tries (the thread was interrupted inside an enter or exit).
fn snapshot(tid: i32) -> Option<Option<Snapshot>> {
    let r = record_of(tid)?;
    for _ in 0..4 {
        let s1 = r.seq.load(Ordering::Acquire);
        let depth = r.depth.load(Ordering::Relaxed);
        let mut names = [(0usize, 0usize); DEPTH];
        for (i, n) in names.iter_mut().enumerate() {
            *n = (
                r.entries[i].name.load(Ordering::Relaxed) as usize,
                r.entries[i].len.load(Ordering::Relaxed),
            );
        }
        // The innermost span's task.
        let task = match depth {
            0 => 0,
            d => r.entries[(d - 1) % DEPTH].task.load(Ordering::Relaxed),
        };
        fence(Ordering::Acquire);
        let s2 = r.seq.load(Ordering::Relaxed);
        if s1 == s2 && s1 % 2 == 0 && r.tid.load(Ordering::Relaxed) == tid {
            return Some(Some(Snapshot { depth, names, task }));
        }
        core::hint::spin_loop();
    }
    Some(None)
}

/// Whether thread `tid` has a record and is in a span (or is changing it). Async-signal-safe.
pub(crate) fn in_span(tid: i32) -> bool {
    record_of(tid).is_some_and(|r| {
        r.depth.load(Ordering::Relaxed) > 0 || r.seq.load(Ordering::Relaxed) % 2 == 1
    })
}

/// Thread `tid`'s record, if it has one.
fn record_of(tid: i32) -> Option<&'static Record> {
    if tid <= 0 {
        return None;
    }
    RECORDS
        .iter()
        .find(|r| r.tid.load(Ordering::Acquire) == tid)
}

/// Appends `outer > inner (task 17)` for thread `tid` (`(being entered or exited)` when its
/// record is being written), nothing if it is in no span. Async-signal-safe.
pub(crate) fn write_span_names(w: &mut FixedBuf<'_>, tid: i32) {
    let Some(snap) = snapshot(tid) else { return };
    let Some(s) = snap else {
        w.push_bytes(b"(being entered or exited)");
        return;
    };
    if s.depth == 0 {
        return;
    }
    let kept = s.depth.min(DEPTH);
    if s.depth > DEPTH {
        w.push_bytes("… > ".as_bytes());
    }
    for k in (0..kept).rev() {
        let (ptr, len) = s.names[(s.depth - 1 - k) % DEPTH];
        // SAFETY: a consistent snapshot (sequence even and unchanged) of a pointer and length
        // stored together from one `&'static str`: valid for the whole process.
        let name = unsafe { core::slice::from_raw_parts(ptr as *const u8, len) };
        w.push_bytes(name);
        if k > 0 {
            w.push_bytes(b" > ");
        }
    }
    if s.task > 0 {
        w.push_bytes(b" (task ");
        w.push_dec(s.task - 1);
        w.push_bytes(b")");
    }
}

/// In a forked child: the forking thread keeps its record (under its new id), every other
/// thread's is freed (they are not in the child). Async-signal-safe.
fn after_fork() {
    let mine = MINE.get();
    for r in RECORDS.iter() {
        if core::ptr::eq(r, mine) {
            r.tid.store(crate::sys::gettid(), Ordering::Release);
        } else {
            r.depth.store(0, Ordering::Relaxed);
            r.tid.store(0, Ordering::Release);
        }
    }
}

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::CRASH, after_fork);

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 10] = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"];

    /// What a thread line says of the calling thread's spans (`report::spans_line`).
    fn printed() -> String {
        let mut buf = [0u8; 512];
        let mut w = FixedBuf::new(&mut buf);
        let tid = crate::sys::gettid();
        if in_span(tid) {
            w.push_bytes(b" in span: ");
            write_span_names(&mut w, tid);
        }
        String::from_utf8(w.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn nested_spans_in_order_with_the_task() {
        std::thread::spawn(|| {
            assert_eq!(printed(), "");
            enter(1, NAMES[0], None);
            enter(2, NAMES[1], Some(17));
            assert_eq!(printed(), " in span: s0 > s1 (task 17)");
            exit(2);
            assert_eq!(printed(), " in span: s0");
            exit(1);
            assert_eq!(printed(), "");
            // An exit of a span never entered here changes nothing.
            enter(1, NAMES[0], None);
            exit(99);
            assert_eq!(printed(), " in span: s0");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_exit_out_of_order_removes_that_span() {
        std::thread::spawn(|| {
            for (i, n) in NAMES[..4].iter().enumerate() {
                enter(i as u64 + 1, n, None);
            }
            exit(2);
            assert_eq!(printed(), " in span: s0 > s2 > s3");
            exit(4);
            assert_eq!(printed(), " in span: s0 > s2");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn deeper_than_a_record_names_the_innermost_and_marks_the_rest() {
        std::thread::spawn(|| {
            for (i, n) in NAMES.iter().enumerate() {
                enter(i as u64 + 1, n, None);
            }
            assert_eq!(
                printed(),
                " in span: … > s2 > s3 > s4 > s5 > s6 > s7 > s8 > s9"
            );
            // The exit uncovers s1, which the record dropped: `?`, never a stale name.
            exit(10);
            assert_eq!(
                printed(),
                " in span: … > ? > s2 > s3 > s4 > s5 > s6 > s7 > s8"
            );
            exit(9);
            exit(8);
            assert_eq!(printed(), " in span: ? > ? > s2 > s3 > s4 > s5 > s6");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_gives_its_record_back_when_it_exits() {
        let tid = std::thread::spawn(|| {
            enter(1, NAMES[0], None);
            crate::sys::gettid()
        })
        .join()
        .unwrap();
        assert!(!in_span(tid));
        assert!(RECORDS.iter().all(|r| r.tid.load(Ordering::Relaxed) != tid));
    }
}
