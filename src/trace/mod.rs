//! Android's `Trace` API over ftrace's `trace_marker`: sections, async sections, counters and
//! instants that Perfetto and systrace show next to the kernel's own events.
//!
//! ```no_run
//! use selftrace::trace;
//!
//! {
//!     let _frame = trace::section("frame");          // B|pid|frame ... E|pid on drop
//!     trace::set_counter("queue depth", 3);           // C|pid|queue depth|3
//!     let n = 7;
//!     let _inner = trace::section!("decode {n}");    // formatted only when enabled
//! }
//! trace::begin_async_section("load", 42);             // S|pid|load|42
//! trace::end_async_section("load", 42);               // F|pid|load|42
//! trace::instant("vsync");                            // I|pid|vsync
//! println!("{}", trace::status());                    // why markers are (not) written
//! ```
//!
//! # Lines written
//!
//! Each call writes exactly one line with one `write(2)`, in the grammar Perfetto parses
//! (`pid` is the process id; the thread comes from the kernel's record):
//!
//! | call | line |
//! |---|---|
//! | [`begin_section`](fn@begin_section), [`section`](fn@section) | `B\|pid\|name` |
//! | [`end_section`], a [`Section`] dropped | `E\|pid` |
//! | [`begin_async_section`](fn@begin_async_section) / [`end_async_section`](fn@end_async_section) | `S\|pid\|name\|cookie` / `F\|pid\|name\|cookie` |
//! | [`begin_async_section_for_track`] / [`end_async_section_for_track`] | `G\|pid\|track\|name\|cookie` / `H\|pid\|track\|cookie` |
//! | [`instant`](fn@instant) / [`instant_for_track`] | `I\|pid\|name` / `N\|pid\|track\|name` |
//! | [`set_counter`] | `C\|pid\|name\|value` |
//!
//! In names and tracks `|` becomes `!`, and newline, carriage return and NUL become a space. A
//! line is at most [`MAX_EVENT`] (1024) bytes: longer names are cut at a UTF-8 character
//! boundary, and the cookie or counter value is always kept whole.
//!
//! # Cost and when nothing is written
//!
//! Every call first checks its tag against the enabled mask with one relaxed atomic load; a
//! disabled call costs about a nanosecond. The mask is empty (every call a no-op) when no
//! `trace_marker` could be opened — tracefs not mounted, no permission (markers are root-only
//! unless tracefs is mounted with `gid=`/`mode=`) — and [`status`] says why.
//!
//! The marker file is found on first use (or by [`init`]): `<root>/trace_marker` for a tracefs
//! root set with [`crate::tracefs::set_root`], else under `/sys/kernel/tracing`,
//! `/sys/kernel/debug/tracing`, or the first tracefs mount in `/proc/self/mountinfo`.
//! [`set_marker_path`] names the file explicitly (e.g. a private instance's `trace_marker`).
//! It is opened once, with `O_CLOEXEC`. Write errors are counted ([`stats`]), never reported
//! and never fatal: `EBADF` (tracing off, or a full buffer in no-overwrite mode) is transient,
//! the next call tries again.
//!
//! # First use
//!
//! Without [`init`], the first event opens the marker file (an `open` and an `fstatfs`, tens to
//! a hundred microseconds). An event that another thread writes meanwhile waits for that
//! thread to finish (`sched_yield` in a loop, allocation-free, lock-free and
//! async-signal-safe), then is written: no event is lost to the first use, and a section begun
//! meanwhile is written and ended like any other. The wait is bounded: the events of a
//! process wait at most 1 s in all (measured with `CLOCK_MONOTONIC` from the first event that
//! waits); an event still waiting then is dropped, and so is every later one until the file is
//! open, without waiting again. The one event that cannot wait is written by a signal handler
//! that interrupted the opening thread itself (the opening cannot go on until the handler
//! returns): it is dropped at once. Both drops are counted in [`Stats::skipped_during_init`],
//! those at the deadline also in [`Stats::init_wait_timeouts`]. Calling [`init`] at program
//! start, in normal context, avoids both.
//!
//! # Tags
//!
//! Like atrace's tags, every event carries one or more bits of a 64-bit mask; it is written only
//! when one of its bits is enabled. The free functions use [`TAG_APP`]; a [`Tracer`] carries
//! any tag (`Tracer::new(TAG_IO).begin_section("read")`). The mask starts as
//! `SELFTRACE_TAGS` (read once, at program start: comma-separated names from [`TAG_NAMES`],
//! `bitN`, a `0x` hex mask, `all` or `none`) or all tags when unset; [`set_tags`],
//! [`enable_tags`] and [`disable_tags`] change it.
//!
//! # Async-signal safety
//!
//! Every event function, the [`Section`] guard, [`is_enabled`], [`stats`] and [`status`] are
//! async-signal-safe: no allocation, no lock, no panic (the `section!` family too, as long as
//! the `Display` impls of its arguments do not allocate). The first call opens the marker file
//! without allocating either; a call made meanwhile waits without a lock (see
//! [First use](#first-use): in a handler that interrupted the opening thread its event is
//! dropped and counted). Two things are done at program start by an `.init_array`
//! constructor, in normal context: reading `SELFTRACE_TAGS`, and registering the
//! `pthread_atfork` child handler that refreshes the cached pid in a forked child (if the
//! constructor did not run, [`init`] or the first event does it; call [`init`] early if the first
//! event may come from a signal handler). Processes created by a raw `clone`/`vfork` that skip
//! the fork handlers write the parent's pid.
//!
//! [`set_marker_path`], [`detach`], [`init`] and the tag setters are for normal context.
//!
//! # Reading them back, and Perfetto
//!
//! With the feature `tracefs`, `tracefs::Instance::for_markers("name")` creates a private ftrace
//! instance that receives the markers, removed on drop; its `read_markers()` parses them into
//! `MarkerEvent`s, and `tracefs::parse_record` parses any `trace` line (uprobe hits, sched events).
//! `examples/markers.rs` (as root: `cargo run --example markers`) writes sections on two threads,
//! async sections, a named track and counters, reads them back, prints them, and saves the
//! instance's trace as `target/selftrace-markers.trace`. To see it in Perfetto, open
//! <https://ui.perfetto.dev>, choose "Open trace file" and pick that file (the plain ftrace text
//! format, which Perfetto imports; the output of `trace-cmd report` is not accepted). Sections are
//! slices on each thread's track, async sections and named tracks are tracks of the process,
//! counters are counter tracks. To record the markers together with kernel events, enable those
//! events in the instance before the run (e.g. `inst.set_event_enabled("sched", "sched_switch",
//! true)`). With the feature `tracing`, `MarkerLayer` writes `tracing` spans as sections.
//!
//! Size: over 600 lines because about 230 of them are the markers' guide and the public API's docs; the
//! code is one idea (the `Trace` API over `trace_marker`), the writer and parser live in their own files.

mod format;
#[cfg(feature = "tracing")]
mod layer;
mod macros;
mod writer;

use core::fmt;
use core::marker::PhantomData;
use std::path::Path;

use format::Text;
pub use format::MAX_EVENT;
#[cfg(feature = "tracing")]
pub use layer::{MarkerLayer, SpanMode};

use crate::error::Error;

/// Tag of ordinary application events (the free functions' tag, like `TRACE_TAG_APP`).
pub const TAG_APP: u64 = 1 << 0;
/// Tag for file and block I/O.
pub const TAG_IO: u64 = 1 << 1;
/// Tag for networking.
pub const TAG_NET: u64 = 1 << 2;
/// Tag for graphics and rendering.
pub const TAG_GFX: u64 = 1 << 3;
/// Tag for database work.
pub const TAG_DB: u64 = 1 << 4;
/// Tag for locks and synchronisation.
pub const TAG_SYNC: u64 = 1 << 5;
/// Tag for memory management.
pub const TAG_MEM: u64 = 1 << 6;
/// Tag for RPCs and IPC.
pub const TAG_RPC: u64 = 1 << 7;
/// Tag for async runtimes and tasks (used by the `tracing` layer by default).
pub const TAG_ASYNC: u64 = 1 << 8;
/// Every tag.
pub const TAG_ALL: u64 = u64::MAX;

/// The names `SELFTRACE_TAGS` and [`parse_tags`] understand, with their bits.
pub const TAG_NAMES: [(&str, u64); 9] = [
    ("app", TAG_APP),
    ("io", TAG_IO),
    ("net", TAG_NET),
    ("gfx", TAG_GFX),
    ("db", TAG_DB),
    ("sync", TAG_SYNC),
    ("mem", TAG_MEM),
    ("rpc", TAG_RPC),
    ("async", TAG_ASYNC),
];

/// Parses a tag list: comma- or space-separated names from [`TAG_NAMES`], `bitN` (N in
/// 0..=63), a hex mask `0x...`, `all` or `none`. Empty means no tags.
///
/// # Errors
/// [`Error::InvalidInput`] for a name or number that is not a tag.
pub fn parse_tags(s: &str) -> Result<u64, Error> {
    match parse_tags_lenient(s.as_bytes()) {
        (mask, true) => Ok(mask),
        (_, false) => Err(Error::InvalidInput("unknown tag name")),
    }
}

/// Parses a tag list; unknown words are skipped. Returns the mask and whether all were known.
/// No allocation (used before `main`).
pub(crate) fn parse_tags_lenient(s: &[u8]) -> (u64, bool) {
    let mut mask = 0u64;
    let mut ok = true;
    for word in s.split(|&b| b == b',' || b == b' ' || b == b'\t') {
        if word.is_empty() {
            continue;
        }
        let bit = if word.eq_ignore_ascii_case(b"all") {
            Some(TAG_ALL)
        } else if word.eq_ignore_ascii_case(b"none") {
            Some(0)
        } else if let Some(hex) = word
            .strip_prefix(b"0x")
            .or_else(|| word.strip_prefix(b"0X"))
        {
            parse_radix(hex, 16)
        } else if let Some(n) = word.strip_prefix(b"bit") {
            parse_radix(n, 10).filter(|&n| n < 64).map(|n| 1u64 << n)
        } else {
            TAG_NAMES
                .iter()
                .find(|(name, _)| word.eq_ignore_ascii_case(name.as_bytes()))
                .map(|&(_, bit)| bit)
        };
        match bit {
            Some(b) => mask |= b,
            None => ok = false,
        }
    }
    (mask, ok)
}

fn parse_radix(digits: &[u8], radix: u32) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 + (radix == 10) as usize * 4 {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        let x = (d as char).to_digit(radix)? as u64;
        v = v.checked_mul(radix as u64)?.checked_add(x)?;
    }
    Some(v)
}

/// Replaces the enabled tag mask.
pub fn set_tags(mask: u64) {
    writer::set_tags(mask)
}

/// Enables the tags in `mask` (keeps the others).
pub fn enable_tags(mask: u64) {
    writer::update_tags(|t| t | mask)
}

/// Disables the tags in `mask` (keeps the others).
pub fn disable_tags(mask: u64) {
    writer::update_tags(|t| t & !mask)
}

/// The requested tag mask (what [`set_tags`] or `SELFTRACE_TAGS` asked for).
pub fn tags() -> u64 {
    writer::tags()
}

/// Why markers are, or are not, being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Nothing has been written yet and [`init`] was not called: the marker file will be
    /// looked for on first use.
    Uninitialized,
    /// The marker file is open; events of enabled tags are written.
    Enabled,
    /// The marker file is open but the tag mask is empty (`SELFTRACE_TAGS=none`,
    /// [`set_tags`]`(0)`).
    TagsOff,
    /// No marker file could be opened; every call is a no-op. The error says why:
    /// [`Error::NoTracefs`], [`Error::PermissionDenied`], [`Error::NotFound`] for an explicit
    /// path that does not exist, or the `open` errno.
    Unavailable(Error),
    /// [`detach`] was called.
    Detached,
}

impl Status {
    /// Whether events (of enabled tags) are being written.
    pub fn is_enabled(self) -> bool {
        self == Status::Enabled
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Uninitialized => f.write_str("not initialised: trace_marker is opened on first use"),
            Status::Enabled => f.write_str("enabled: writing to trace_marker"),
            Status::TagsOff => f.write_str("disabled: no tag is enabled (SELFTRACE_TAGS or set_tags)"),
            Status::Unavailable(Error::NoTracefs) => f.write_str(
                "disabled: tracefs is not mounted (tried /sys/kernel/tracing, /sys/kernel/debug/tracing, /proc/self/mountinfo)",
            ),
            Status::Unavailable(Error::PermissionDenied) => f.write_str(
                "disabled: permission denied opening trace_marker (root-only unless tracefs is mounted with gid=/mode=)",
            ),
            Status::Unavailable(e) => write!(f, "disabled: cannot open trace_marker: {e}"),
            Status::Detached => f.write_str("disabled: detached from trace_marker"),
        }
    }
}

/// Counters of what went wrong while writing (since the start of the process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Writes that failed with `EBADF` (tracing off, or buffer full in no-overwrite mode).
    pub ebadf: u64,
    /// Writes that failed with `EINVAL` (markers disabled in `options/markers`).
    pub einval: u64,
    /// Writes that failed otherwise.
    pub other_errors: u64,
    /// The errno of the last "other" failure, 0 if none.
    pub last_errno: i32,
    /// Writes the kernel accepted only in part (never retried).
    pub short_writes: u64,
    /// Events whose name or track was cut to fit [`MAX_EVENT`].
    pub truncated: u64,
    /// Events dropped during the first use: written by a signal handler that interrupted the
    /// thread that was opening the marker file, or after waiting 1 s for another thread's
    /// opening ([`init_wait_timeouts`](Self::init_wait_timeouts)). See
    /// [First use](self#first-use).
    pub skipped_during_init: u64,
    /// Of [`skipped_during_init`](Self::skipped_during_init), the events dropped because
    /// another thread was still opening the marker file when the process's 1 s of waiting for
    /// it were over.
    pub init_wait_timeouts: u64,
}

/// The error counters, with the events dropped during the first use
/// ([`Stats::skipped_during_init`]).
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn stats() -> Stats {
    use core::sync::atomic::Ordering::Relaxed;
    Stats {
        ebadf: writer::EBADF.load(Relaxed),
        einval: writer::EINVAL.load(Relaxed),
        other_errors: writer::OTHER.load(Relaxed),
        last_errno: writer::LAST_ERRNO.load(Relaxed),
        short_writes: writer::SHORT.load(Relaxed),
        truncated: writer::TRUNCATED.load(Relaxed),
        skipped_during_init: writer::SKIPPED.load(Relaxed),
        init_wait_timeouts: writer::INIT_TIMEOUTS.load(Relaxed),
    }
}

/// Why markers are or are not written.
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn status() -> Status {
    writer::status()
}

/// Opens the marker file now (it is otherwise opened on first use) and returns the status.
/// Idempotent. If another thread is opening it, waits for that thread, without the 1 s bound
/// that events have (see [First use](self#first-use)). Normal context: call it at program start
/// so that no event ever waits, nor is dropped because a signal handler interrupted the first
/// one.
pub fn init() -> Status {
    writer::init()
}

/// Writes markers to `path` from now on (a `trace_marker` file, e.g. a private instance's
/// [`crate::tracefs::Instance::marker_path`]). The file must be on a tracefs mount (checked by
/// `fstatfs` magic on the opened fd, as for the default location): anything else, a regular
/// file or a tmpfs mounted where tracefs should be, is refused with [`Error::InvalidInput`]. The fd number stays the same: threads writing
/// concurrently write to the old file or the new one, never to a closed fd. On failure every
/// call becomes a no-op and [`status`] says why. Normal context.
///
/// # Errors
/// [`Error::InvalidInput`] for a file that is not on tracefs, [`Error::Sys`] when it cannot be
/// opened.
pub fn set_marker_path(path: impl AsRef<Path>) -> Result<(), Error> {
    writer::set_marker_path(path.as_ref())
}

/// Stops writing markers and releases the marker file (so that its instance can be removed);
/// [`set_marker_path`] attaches again. Normal context.
pub fn detach() {
    writer::detach()
}

/// The marker file in use, when markers are enabled (read from `/proc/self/fd`). Normal context.
pub fn marker_path() -> Option<std::path::PathBuf> {
    writer::marker_path()
}

/// Events of one tag (category). `Copy` and free to create; the free functions of this module
/// are [`APP`]'s methods.
///
/// ```no_run
/// use selftrace::trace::{Tracer, TAG_IO};
/// const IO: Tracer = Tracer::new(TAG_IO);
/// let _s = IO.section("read config");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracer {
    tag: u64,
}

/// The tracer of the free functions: [`TAG_APP`].
pub const APP: Tracer = Tracer::new(TAG_APP);

/// # Async-signal safety
/// All of them. Before the marker file is open, the first call opens it and calls on other
/// threads wait for that (at most 1 s per process); a call from a signal handler that
/// interrupted the opening is dropped and counted. See [First use](self#first-use).
impl Tracer {
    /// A tracer for events tagged `tag` (one or more bits).
    pub const fn new(tag: u64) -> Tracer {
        Tracer { tag }
    }

    /// The tag.
    pub const fn tag(self) -> u64 {
        self.tag
    }

    /// Whether this tracer's events are written now. One relaxed atomic load when disabled.
    /// Before the marker file is open it opens it, or waits for the thread that is opening it
    /// (see [First use](self#first-use)).
    #[inline]
    pub fn is_enabled(self) -> bool {
        writer::enabled(self.tag)
    }

    /// Begins a section on this thread: `B|pid|name`. End it on the same thread.
    #[inline]
    pub fn begin_section(self, name: &str) {
        if self.is_enabled() {
            writer::emit(b'B', None, Some(Text::Str(name)), None);
        }
    }

    /// Ends this thread's innermost section: `E|pid`.
    #[inline]
    pub fn end_section(self) {
        if self.is_enabled() {
            writer::emit(b'E', None, None, None);
        }
    }

    /// Begins a section and returns a guard that ends it when dropped (also during a panic's
    /// unwinding). If the section was written, its end is written even if the tag has been
    /// disabled since, so sections stay balanced. A section begun while another thread opens
    /// the marker file waits for it and is written (see [First use](self#first-use)); one
    /// dropped there returns an inactive guard, which writes no end.
    #[inline]
    pub fn section(self, name: &str) -> Section {
        if self.is_enabled() {
            writer::emit(b'B', None, Some(Text::Str(name)), None);
            Section::active()
        } else {
            Section::inactive()
        }
    }

    /// Begins an async section (may end on another thread): `S|pid|name|cookie`.
    #[inline]
    pub fn begin_async_section(self, name: &str, cookie: i64) {
        if self.is_enabled() {
            writer::emit(b'S', None, Some(Text::Str(name)), Some(cookie));
        }
    }

    /// Ends an async section: `F|pid|name|cookie` (same name and cookie as its begin).
    #[inline]
    pub fn end_async_section(self, name: &str, cookie: i64) {
        if self.is_enabled() {
            writer::emit(b'F', None, Some(Text::Str(name)), Some(cookie));
        }
    }

    /// Begins an async section on a named track: `G|pid|track|name|cookie`.
    #[inline]
    pub fn begin_async_section_for_track(self, track: &str, name: &str, cookie: i64) {
        if self.is_enabled() {
            writer::emit(b'G', Some(track), Some(Text::Str(name)), Some(cookie));
        }
    }

    /// Ends an async section on a named track: `H|pid|track|cookie`.
    #[inline]
    pub fn end_async_section_for_track(self, track: &str, cookie: i64) {
        if self.is_enabled() {
            writer::emit(b'H', Some(track), None, Some(cookie));
        }
    }

    /// An instant event on this thread: `I|pid|name`.
    #[inline]
    pub fn instant(self, name: &str) {
        if self.is_enabled() {
            writer::emit(b'I', None, Some(Text::Str(name)), None);
        }
    }

    /// An instant event on a named track: `N|pid|track|name`.
    #[inline]
    pub fn instant_for_track(self, track: &str, name: &str) {
        if self.is_enabled() {
            writer::emit(b'N', Some(track), Some(Text::Str(name)), None);
        }
    }

    /// A counter's new value: `C|pid|name|value`.
    #[inline]
    pub fn set_counter(self, name: &str, value: i64) {
        if self.is_enabled() {
            writer::emit(b'C', None, Some(Text::Str(name)), Some(value));
        }
    }

    /// For the macros: a section with a formatted name. Call only when enabled.
    #[doc(hidden)]
    #[inline]
    pub fn __section_fmt(self, name: fmt::Arguments<'_>) -> Section {
        writer::emit(b'B', None, Some(Text::Fmt(name)), None);
        Section::active()
    }

    /// For the macros: an event with a formatted name. Call only when enabled.
    #[doc(hidden)]
    #[inline]
    pub fn __emit_fmt(self, kind: u8, name: fmt::Arguments<'_>, value: Option<i64>) {
        writer::emit(kind, None, Some(Text::Fmt(name)), value);
    }
}

/// A section that ends (`E|pid`) when dropped, also while a panic unwinds. Returned by
/// [`section`](fn@section) and [`section!`]. Not `Send`: a section must end on the thread that began it.
#[must_use = "the section ends when this guard is dropped"]
#[derive(Debug)]
pub struct Section {
    active: bool,
    _same_thread: PhantomData<*const ()>,
}

impl Section {
    fn active() -> Section {
        Section {
            active: true,
            _same_thread: PhantomData,
        }
    }

    /// A guard that writes nothing.
    pub fn inactive() -> Section {
        Section {
            active: false,
            _same_thread: PhantomData,
        }
    }

    /// Whether the section's begin was written (so its end will be).
    pub fn is_active(&self) -> bool {
        self.active
    }
}

impl Drop for Section {
    #[inline]
    fn drop(&mut self) {
        if self.active {
            writer::emit(b'E', None, None, None);
        }
    }
}

/// Whether [`TAG_APP`] events are written now. One relaxed atomic load when disabled; see
/// [`Tracer::is_enabled`] for the first use.
#[inline]
pub fn is_enabled() -> bool {
    APP.is_enabled()
}

/// Begins a section on this thread: `B|pid|name`.
#[inline]
pub fn begin_section(name: &str) {
    APP.begin_section(name)
}

/// Ends this thread's innermost section: `E|pid`.
#[inline]
pub fn end_section() {
    APP.end_section()
}

/// Begins a section and returns a guard that ends it on drop; see [`Tracer::section`].
#[inline]
pub fn section(name: &str) -> Section {
    APP.section(name)
}

/// Begins an async section: `S|pid|name|cookie`.
#[inline]
pub fn begin_async_section(name: &str, cookie: i64) {
    APP.begin_async_section(name, cookie)
}

/// Ends an async section: `F|pid|name|cookie`.
#[inline]
pub fn end_async_section(name: &str, cookie: i64) {
    APP.end_async_section(name, cookie)
}

/// Begins an async section on a named track: `G|pid|track|name|cookie`.
#[inline]
pub fn begin_async_section_for_track(track: &str, name: &str, cookie: i64) {
    APP.begin_async_section_for_track(track, name, cookie)
}

/// Ends an async section on a named track: `H|pid|track|cookie`.
#[inline]
pub fn end_async_section_for_track(track: &str, cookie: i64) {
    APP.end_async_section_for_track(track, cookie)
}

/// An instant event on this thread: `I|pid|name`.
#[inline]
pub fn instant(name: &str) {
    APP.instant(name)
}

/// An instant event on a named track: `N|pid|track|name`.
#[inline]
pub fn instant_for_track(track: &str, name: &str) {
    APP.instant_for_track(track, name)
}

/// A counter's new value: `C|pid|name|value`.
#[inline]
pub fn set_counter(name: &str, value: i64) {
    APP.set_counter(name, value)
}

pub use crate::{
    __trace_begin_async_section as begin_async_section, __trace_begin_section as begin_section,
    __trace_end_async_section as end_async_section, __trace_instant as instant,
    __trace_section as section,
};
