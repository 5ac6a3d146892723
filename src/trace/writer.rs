//! The process-wide marker writer: one fd, a cached pid, the tag mask, counters.
//!
//! All state is in atomics. The hot path is: one relaxed load of [`MASK`] (the enabled tags,
//! zero when no marker file is open), then one relaxed load of [`FD`], the cached pid, the
//! line formatted in a stack buffer, and one `write(2)`.
#![allow(unsafe_code)]

use core::ffi::CStr;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};

use super::format::{fmt_i64, format_line, Line, LineBuf, Text};
use super::{Status, TAG_ALL};
use crate::{sys, tracefs, Error};

/// The effective mask: the requested tags while a marker file is attached, else 0. Starts at
/// all-ones so that the first call reaches [`init_slow`].
pub(crate) static MASK: AtomicU64 = AtomicU64::new(u64::MAX);
/// The requested tags (from `SELFTRACE_TAGS` at start, then [`super::set_tags`]).
static TAGS: AtomicU64 = AtomicU64::new(TAG_ALL);
/// The open `trace_marker` fd, or -1. Once set, the number never changes (re-targeting uses
/// `dup3` onto it), so a racing writer never writes into a reused fd.
static FD: AtomicI32 = AtomicI32::new(-1);
/// Who initialises: [`INIT_NONE`] before the first event, [`INIT_DONE`] once the marker file
/// was looked for, else the thread id of the thread that is opening it (or configuring it with
/// [`claim`] before anyone opened it). One atomic word, so a signal handler can tell whether it
/// interrupted the opening thread itself.
static INIT: AtomicI32 = AtomicI32::new(INIT_NONE);
/// [`INIT`]: nobody has started to open the marker file.
const INIT_NONE: i32 = 0;
/// [`INIT`]: the marker file was looked for (opened or not); thread ids are positive.
const INIT_DONE: i32 = -1;
/// How long, in total, the events of a process wait for another thread to finish opening the
/// marker file (an open and an `fstatfs`, normally 40-125 us) before they are dropped (and
/// counted: [`SKIPPED`], [`INIT_TIMEOUTS`]). One deadline for the whole process, set by the
/// first event that waits: an opening thread that never finishes (cancelled inside `open`, or
/// left by a `longjmp` out of a signal handler) costs the process at most this once.
const INIT_WAIT_NS: u64 = 1_000_000_000;
/// The [`sys::monotonic_ns`] at which waiting for the opening thread ends; 0 = nobody waited yet.
static INIT_DEADLINE: AtomicU64 = AtomicU64::new(0);
/// Status code << 32 | errno.
static STATUS: AtomicU64 = AtomicU64::new(0);
/// The process id as decimal text, cached: up to 7 ASCII digits in the low bytes, their count
/// in the top byte (Linux pids have at most 7 digits: `PID_MAX_LIMIT` is 4194304); 0 = unknown
/// (reset in a fork child). One atomic word, so a reader never sees half an update.
static PID_TEXT: AtomicU64 = AtomicU64::new(0);
/// Whether `SELFTRACE_TAGS` was read and the fork handler registered.
static STARTED: AtomicBool = AtomicBool::new(false);
/// Serialises configuration changes (normal context only); a forked child takes it over from
/// a thread of the parent that held it.
static CONFIG: crate::fork::ForkMutex<()> = crate::fork::ForkMutex::new(());

pub(crate) static EBADF: AtomicU64 = AtomicU64::new(0);
pub(crate) static EINVAL: AtomicU64 = AtomicU64::new(0);
pub(crate) static OTHER: AtomicU64 = AtomicU64::new(0);
pub(crate) static LAST_ERRNO: AtomicI32 = AtomicI32::new(0);
pub(crate) static SHORT: AtomicU64 = AtomicU64::new(0);
pub(crate) static TRUNCATED: AtomicU64 = AtomicU64::new(0);
/// Events dropped while the marker file was being opened (see [`init_slow`]).
pub(crate) static SKIPPED: AtomicU64 = AtomicU64::new(0);
/// Events dropped because waiting for another thread's opening reached [`INIT_WAIT_NS`] (also
/// counted in [`SKIPPED`]).
pub(crate) static INIT_TIMEOUTS: AtomicU64 = AtomicU64::new(0);

const ST_UNINIT: u32 = 0;
const ST_ENABLED: u32 = 1;
const ST_NO_TRACEFS: u32 = 2;
const ST_DENIED: u32 = 3;
const ST_NOT_FOUND: u32 = 4;
const ST_SYS: u32 = 5;
const ST_DETACHED: u32 = 6;
const ST_BAD_PATH: u32 = 7;
const ST_NOT_TRACEFS: u32 = 8;

/// What a `trace_marker` that is not on a tracefs mount is refused with.
const NOT_TRACEFS: Error = Error::InvalidInput("trace_marker is not on a tracefs mount");

// Reads SELFTRACE_TAGS and registers the fork handler before main, in normal context, so that
// neither happens first inside a signal handler.
#[used]
#[link_section = ".init_array"]
static STARTUP: extern "C" fn() = startup_ctor;

extern "C" fn startup_ctor() {
    startup();
}

/// Reads `SELFTRACE_TAGS` and registers the fork child handler, once.
pub(crate) fn startup() {
    if STARTED.swap(true, AcqRel) {
        return;
    }
    if let Some(v) = sys::getenv(c"SELFTRACE_TAGS") {
        let (mask, _all_known) = super::parse_tags_lenient(v);
        TAGS.store(mask, SeqCst);
    }
    // Not AS-safe (glibc allocates); normally done by the constructor above.
    let _ = sys::atfork_child(fork_child);
}

/// Runs in the child of `fork()`: the cached pid is the parent's, and an opening of the marker
/// file that was under way belongs to a thread the child does not have (the child's events
/// would wait for it in vain): the child starts over. A marker fd that thread had already
/// installed stays in use; one it had opened but not installed stays open in the child.
unsafe extern "C" fn fork_child() {
    PID_TEXT.store(0, Relaxed);
    if INIT.load(Relaxed) != INIT_DONE {
        INIT.store(INIT_NONE, Relaxed);
        INIT_DEADLINE.store(0, Relaxed);
    }
}

/// The process id in decimal, from the cache (filled by one `getpid` after start or fork).
#[inline]
pub(crate) fn pid_digits(out: &mut [u8; 20]) -> &[u8] {
    let v = PID_TEXT.load(Relaxed);
    if v != 0 {
        let n = (v >> 56) as usize;
        out[..8].copy_from_slice(&v.to_le_bytes());
        return &out[..n];
    }
    pid_digits_slow(out)
}

#[cold]
#[inline(never)]
fn pid_digits_slow(out: &mut [u8; 20]) -> &[u8] {
    let mut tmp = [0u8; 20];
    let digits = fmt_i64(sys::getpid() as i64, &mut tmp);
    let n = digits.len();
    out[..n].copy_from_slice(digits);
    if n <= 7 {
        let mut packed = [0u8; 8];
        packed[..n].copy_from_slice(digits);
        packed[7] = n as u8;
        PID_TEXT.store(u64::from_le_bytes(packed), Relaxed);
    }
    &out[..n]
}

/// MASK = TAGS while attached, else 0; repeated until both inputs are stable, so that a racing
/// [`set_tags`] and attach cannot leave a stale mask.
fn recompute_mask() {
    loop {
        let tags = TAGS.load(SeqCst);
        let st = STATUS.load(SeqCst);
        let attached = (st >> 32) as u32 == ST_ENABLED;
        MASK.store(if attached { tags } else { 0 }, SeqCst);
        if TAGS.load(SeqCst) == tags && STATUS.load(SeqCst) == st {
            return;
        }
    }
}

pub(crate) fn set_tags(mask: u64) {
    TAGS.store(mask, SeqCst);
    recompute_mask();
}

pub(crate) fn update_tags(f: impl Fn(u64) -> u64) {
    let _ = TAGS.fetch_update(SeqCst, SeqCst, |t| Some(f(t)));
    recompute_mask();
}

pub(crate) fn tags() -> u64 {
    TAGS.load(Relaxed)
}

fn set_status(code: u32, errno: i32) {
    STATUS.store(((code as u64) << 32) | errno as u32 as u64, SeqCst);
}

pub(crate) fn status() -> Status {
    let st = STATUS.load(Relaxed);
    let errno = st as u32 as i32;
    match (st >> 32) as u32 {
        ST_UNINIT => Status::Uninitialized,
        ST_ENABLED if TAGS.load(Relaxed) == 0 => Status::TagsOff,
        ST_ENABLED => Status::Enabled,
        ST_NO_TRACEFS => Status::Unavailable(Error::NoTracefs),
        ST_DENIED => Status::Unavailable(Error::PermissionDenied),
        ST_NOT_FOUND => Status::Unavailable(Error::NotFound("trace_marker")),
        ST_DETACHED => Status::Detached,
        ST_BAD_PATH => Status::Unavailable(Error::InvalidInput("marker path")),
        ST_NOT_TRACEFS => Status::Unavailable(NOT_TRACEFS),
        _ => Status::Unavailable(Error::Sys {
            call: "open",
            errno,
        }),
    }
}

fn error_code(e: Error) -> (u32, i32) {
    match e {
        Error::NoTracefs => (ST_NO_TRACEFS, 0),
        Error::PermissionDenied => (ST_DENIED, 0),
        Error::NotFound(_) => (ST_NOT_FOUND, 0),
        Error::Sys { errno, .. } => (ST_SYS, errno),
        e if e == NOT_TRACEFS => (ST_NOT_TRACEFS, 0),
        _ => (ST_BAD_PATH, 0),
    }
}

/// Opens `<dir>/trace_marker` (or `dir` itself when `dir` already names the file), built in a
/// stack buffer. The opened file must be on a tracefs mount (`fstatfs` magic, checked on the
/// fd itself): a regular file or a tmpfs mounted over `/sys/kernel/tracing` is refused.
fn open_in(dir: &[u8], append_name: bool) -> Result<i32, Error> {
    const NAME: &[u8] = b"/trace_marker";
    let mut buf = [0u8; 4200];
    let extra = if append_name { NAME.len() } else { 0 };
    if dir.len() + extra + 1 > buf.len() {
        return Err(Error::InvalidInput("marker path too long"));
    }
    buf[..dir.len()].copy_from_slice(dir);
    if append_name {
        buf[dir.len()..dir.len() + extra].copy_from_slice(NAME);
    }
    let n = dir.len() + extra;
    let path = CStr::from_bytes_with_nul(&buf[..n + 1])
        .map_err(|_| Error::InvalidInput("marker path contains a nul byte"))?;
    let fd = sys::open_cloexec(path, libc::O_WRONLY).map_err(|e| match e.errno() {
        Some(libc::ENOENT | libc::ENOTDIR) => Error::NotFound("trace_marker"),
        Some(libc::EACCES | libc::EPERM) => Error::PermissionDenied,
        _ => e,
    })?;
    match sys::fstatfs_type(fd) {
        Ok(t) if t == tracefs::TRACEFS_MAGIC => Ok(fd),
        Ok(_) => {
            sys::close(fd);
            Err(NOT_TRACEFS)
        }
        Err(e) => {
            sys::close(fd);
            Err(e)
        }
    }
}

/// Finds and opens `trace_marker` as FACTS.md says: an explicit tracefs root if one was set,
/// else `/sys/kernel/tracing`, `/sys/kernel/debug/tracing`, the first tracefs in
/// `/proc/self/mountinfo`. Allocation-free.
fn open_default() -> Result<i32, Error> {
    use std::os::unix::ffi::OsStrExt;
    if let Some(root) = tracefs::ROOT.get() {
        return open_in(root.as_os_str().as_bytes(), true);
    }
    let mut worst = Error::NoTracefs;
    let mut note = |e: Error| match e {
        Error::NotFound(_) => {}
        Error::PermissionDenied => worst = e,
        e if e == NOT_TRACEFS => {
            if worst != Error::PermissionDenied {
                worst = e
            }
        }
        e => {
            if worst == Error::NoTracefs {
                worst = e
            }
        }
    };
    for root in tracefs::DEFAULT_ROOTS {
        match open_in(root.as_bytes(), true) {
            Ok(fd) => return Ok(fd),
            Err(e) => note(e),
        }
    }
    let mut buf = [0u8; 4096];
    if let Some(n) = tracefs::mountinfo::first_tracefs_mount(&mut buf) {
        match open_in(&buf[..n], true) {
            Ok(fd) => return Ok(fd),
            Err(e) => note(e),
        }
    }
    Err(worst)
}

/// Makes `fd` the marker fd (keeping the fd number stable), or records why there is none.
fn install(r: Result<i32, Error>) {
    match r {
        Ok(fd) => {
            let old = FD.load(SeqCst);
            if old < 0 {
                FD.store(fd, SeqCst);
            } else if old != fd {
                if sys::dup3_cloexec(fd, old).is_err() {
                    // Keep the new fd rather than lose markers; the old one stays open.
                    FD.store(fd, SeqCst);
                } else {
                    sys::close(fd);
                }
            }
            set_status(ST_ENABLED, 0);
        }
        Err(e) => {
            park_fd();
            let (code, errno) = error_code(e);
            set_status(code, errno);
        }
    }
    recompute_mask();
}

/// Points an open marker fd at `/dev/null`, so that the old file is released while racing
/// writers still write into a valid fd.
fn park_fd() {
    let old = FD.load(SeqCst);
    if old >= 0 {
        if let Ok(null) = sys::open_cloexec(c"/dev/null", libc::O_WRONLY) {
            let _ = sys::dup3_cloexec(null, old);
            sys::close(null);
        }
    }
}

/// How [`settle_init`] ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// The marker file was looked for (by this call or another thread): [`FD`] and [`MASK`]
    /// say the outcome.
    Done,
    /// This thread itself is opening it: a signal handler interrupted the opening, which cannot
    /// finish before the handler returns.
    OwnOpening,
    /// Another thread is still opening it at the process's wait deadline ([`INIT_WAIT_NS`]).
    TimedOut,
}

/// Makes sure the marker file was looked for: opens it if nobody has started to, else waits
/// for the thread that is opening it (`sched_yield` in a loop, until the process's deadline of
/// [`INIT_WAIT_NS`] read from `CLOCK_MONOTONIC`). Allocation-free, lock-free,
/// async-signal-safe.
fn settle_init() -> Settled {
    let mut me = 0;
    loop {
        let state = INIT.load(Acquire);
        if state == INIT_DONE {
            return Settled::Done;
        }
        if me == 0 {
            me = sys::gettid();
        }
        if state == INIT_NONE {
            if INIT
                .compare_exchange(INIT_NONE, me, AcqRel, Acquire)
                .is_ok()
            {
                startup();
                install(open_default());
                INIT.store(INIT_DONE, Release);
                return Settled::Done;
            }
            continue;
        }
        if state == me {
            return Settled::OwnOpening;
        }
        // Another thread is opening the file: wait for it, up to the process's deadline. A
        // clock that cannot be read (`monotonic_ns` gives 0) ends the wait at once.
        let now = sys::monotonic_ns();
        if now == 0 {
            return Settled::TimedOut;
        }
        let deadline = match INIT_DEADLINE.load(Relaxed) {
            0 => match INIT_DEADLINE.compare_exchange(
                0,
                now.saturating_add(INIT_WAIT_NS),
                Relaxed,
                Relaxed,
            ) {
                Ok(_) => now.saturating_add(INIT_WAIT_NS),
                Err(set) => set,
            },
            set => set,
        };
        if now >= deadline {
            return Settled::TimedOut;
        }
        sys::sched_yield();
    }
}

/// First-use initialisation, for an event (or [`enabled`]) that found no marker fd: opens the
/// marker file, or waits for the thread that is opening it (see [`settle_init`]). Returns
/// whether a marker fd is open. The event is dropped, and counted in [`SKIPPED`], only in a
/// signal handler that interrupted the opening thread itself, or when the wait reached
/// [`INIT_WAIT_NS`] (counted in [`INIT_TIMEOUTS`] too). Allocation-free, lock-free,
/// async-signal-safe.
#[cold]
#[inline(never)]
pub(crate) fn init_slow() -> bool {
    match settle_init() {
        Settled::Done => FD.load(SeqCst) >= 0,
        Settled::OwnOpening => {
            SKIPPED.fetch_add(1, Relaxed);
            false
        }
        Settled::TimedOut => {
            INIT_TIMEOUTS.fetch_add(1, Relaxed);
            SKIPPED.fetch_add(1, Relaxed);
            false
        }
    }
}

/// Public `init()`: normal context, so it waits for another thread's opening for as long as
/// that takes (no deadline, nothing counted).
pub(crate) fn init() -> Status {
    startup();
    while settle_init() == Settled::TimedOut {
        std::thread::yield_now();
    }
    status()
}

/// Takes over initialisation for a configuration change (normal context).
fn claim<R>(f: impl FnOnce() -> R) -> R {
    let _guard = CONFIG.lock();
    startup();
    let me = sys::gettid();
    loop {
        match INIT.compare_exchange(INIT_NONE, me, AcqRel, Acquire) {
            Ok(_) | Err(INIT_DONE) => break,
            Err(_) => std::thread::yield_now(),
        }
    }
    let r = f();
    INIT.store(INIT_DONE, Release);
    r
}

/// Public `set_marker_path()`.
pub(crate) fn set_marker_path(path: &std::path::Path) -> Result<(), Error> {
    use std::os::unix::ffi::OsStrExt;
    claim(|| {
        let r = open_in(path.as_os_str().as_bytes(), false);
        install(r);
        r.map(|_| ())
    })
}

/// Public `detach()`.
pub(crate) fn detach() {
    claim(|| {
        park_fd();
        set_status(ST_DETACHED, 0);
        recompute_mask();
    })
}

/// The path of the marker file, from `/proc/self/fd`.
pub(crate) fn marker_path() -> Option<std::path::PathBuf> {
    let fd = FD.load(Relaxed);
    if fd < 0 || (STATUS.load(Relaxed) >> 32) as u32 != ST_ENABLED {
        return None;
    }
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
}

/// Whether an event for `tag` would be written now (initialising on first use).
#[inline]
pub(crate) fn enabled(tag: u64) -> bool {
    MASK.load(Relaxed) & tag != 0 && (FD.load(Relaxed) >= 0 || init_ready(tag))
}

#[cold]
#[inline(never)]
fn init_ready(tag: u64) -> bool {
    init_slow() && MASK.load(Relaxed) & tag != 0
}

/// Formats and writes one event: exactly one `write(2)`; errors are counted, never reported.
/// The caller has checked the tag.
#[inline]
pub(crate) fn emit(kind: u8, track: Option<&str>, name: Option<Text<'_>>, value: Option<i64>) {
    let fd = FD.load(Relaxed);
    if fd < 0 {
        return;
    }
    let mut storage = LineBuf::uninit();
    let mut line = Line::new(&mut storage);
    let mut pid = [0u8; 20];
    format_line(&mut line, kind, pid_digits(&mut pid), track, name, value);
    if line.truncated {
        TRUNCATED.fetch_add(1, Relaxed);
    }
    let bytes = line.as_bytes();
    match sys::write_once(fd, bytes) {
        Ok(n) if n == bytes.len() => {}
        Ok(_) => {
            SHORT.fetch_add(1, Relaxed);
        }
        Err(e) => match e.errno().unwrap_or(0) {
            libc::EBADF => {
                EBADF.fetch_add(1, Relaxed);
            }
            libc::EINVAL => {
                EINVAL.fetch_add(1, Relaxed);
            }
            errno => {
                OTHER.fetch_add(1, Relaxed);
                LAST_ERRNO.store(errno, Relaxed);
            }
        },
    }
}

/// [`emit`] with plain strings, for callers that decided themselves (the `tracing` layer:
/// the end of a span that began must be written even if its tag was switched off since).
#[cfg(feature = "tracing")]
pub(crate) fn emit_always(kind: u8, track: Option<&str>, name: Option<&str>, value: Option<i64>) {
    emit(kind, track, name.map(Text::Str), value)
}
