//! A private tracing instance: `instances/NAME` under the tracefs root, removed on drop.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{parse, root, Error};
use crate::error::Error as Kind;

/// A private ftrace instance (`<tracefs>/instances/<name>`), with its own ring buffer, event
/// enables and `trace_marker`. Removed (with everything recorded in it) when dropped, also
/// while a panic unwinds.
///
/// tracefs is global to the machine: an instance keeps a program's (or a test's) events apart
/// from everybody else's. Names are unique per process and per call.
///
/// Removal fails with `EBUSY` while any file of the instance is open, for example while the
/// marker writer holds its `trace_marker` open ([`crate::trace::set_marker_path`]); point the
/// writer elsewhere ([`crate::trace::detach`]) before the instance is dropped.
///
/// The creating process holds an exclusive `flock` on the instance's directory for as long as
/// the `Instance` lives: tracefs is one filesystem for every mount and PID namespace, so any
/// process can tell a live instance from one whose owner died.
#[must_use = "the instance is removed when this is dropped"]
#[derive(Debug)]
pub struct Instance {
    name: String,
    dir: PathBuf,
    copies_markers: bool,
    /// Made for markers ([`Instance::for_markers`]) on a kernel without
    /// `options/copy_trace_marker`: [`Instance::read_markers`] reads the top-level buffer too.
    reads_top_level: bool,
    // Dropped after `Drop::drop` removed the directory: the lock outlives the instance.
    _lock: Option<std::fs::File>,
}

/// An open directory with an exclusive `flock` on it (`None` if it cannot be locked now).
fn lock_dir(dir: &Path, wait: bool) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .ok()?;
    let how = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock on an fd we own.
    (unsafe { libc::flock(f.as_raw_fd(), how) } == 0).then_some(f)
}

/// Whether the process that created the instance directory `dir` still holds its lock (it is
/// alive, in whatever PID namespace), as far as this process can tell: `Some(false)` only when
/// the lock was free, and then the caller holds it in the returned file until it drops it.
pub(crate) fn is_owner_alive(dir: &Path) -> (bool, Option<std::fs::File>) {
    match lock_dir(dir, false) {
        Some(f) => (false, Some(f)),
        None => (true, None),
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl Instance {
    /// Creates an instance named `<prefix>-<pid>-<sequence>-<nanos>`. `prefix` may hold ASCII
    /// letters, digits, `_` and `-`.
    ///
    /// # Errors
    /// [`InvalidInput`](Kind::InvalidInput) for a `prefix` that is not 1-64 such characters
    /// (before tracefs is looked at); those of [`tracefs::root`](super::root); and, naming the
    /// directory and the instance, those of its `mkdir` by errno:
    /// [`PermissionDenied`](Kind::PermissionDenied) (`EACCES`, `EPERM`: typically not root),
    /// [`NotFound`](Kind::NotFound)`("tracefs instances")` (`ENOENT`, `ENOTDIR`),
    /// [`AlreadyExists`](Kind::AlreadyExists) (`EEXIST`), else [`Sys`](Kind::Sys) (`mkdir`).
    pub fn create(prefix: &str) -> Result<Instance, Error> {
        if prefix.is_empty()
            || prefix.len() > 64
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(Error::new(Kind::InvalidInput(
                "instance prefix must be 1-64 ascii letters, digits, '_' or '-'",
            ))
            .with_subject("instance prefix", prefix));
        }
        let root = root()?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = root.join("instances").join(&name);
        std::fs::create_dir(&dir).map_err(|e| {
            Error::io("creating", &dir, "mkdir", "tracefs instances", e)
                .with_subject("instance", &name)
        })?;
        let lock = lock_dir(&dir, true);
        Ok(Instance {
            name,
            dir,
            copies_markers: false,
            reads_top_level: false,
            _lock: lock,
        })
    }

    /// Creates an instance for reading trace markers back: it sets the instance's
    /// `options/copy_trace_marker` (Linux 6.17+) so that every write to the top-level
    /// `trace_marker` is also recorded here. On older kernels the option is missing,
    /// [`copies_markers`](Self::copies_markers) is false and [`read_markers`](Self::read_markers)
    /// reads the top-level buffer instead (without consuming it).
    ///
    /// # Errors
    /// Those of [`create`](Self::create), and those of writing `options/copy_trace_marker` (as
    /// for [`write_file`](Self::write_file)); then the new instance is removed again.
    pub fn for_markers(prefix: &str) -> Result<Instance, Error> {
        let mut inst = Instance::create(prefix)?;
        inst.copy_markers()?;
        Ok(inst)
    }

    /// Like [`for_markers`](Self::for_markers), with a ring buffer of `kib` KiB per CPU, sized
    /// *before* markers are copied: on Linux 6.18, resizing an instance that copies markers
    /// makes every write to the top-level `trace_marker`, by any process, fail while the resize
    /// lasts (those markers are lost).
    ///
    /// # Errors
    /// Those of [`create`](Self::create), of [`set_buffer_size_kb`](Self::set_buffer_size_kb)
    /// and of writing `options/copy_trace_marker` (as for [`write_file`](Self::write_file));
    /// after `create` succeeded, the new instance is removed again.
    pub fn for_markers_with_buffer(prefix: &str, kib: u32) -> Result<Instance, Error> {
        let mut inst = Instance::create(prefix)?;
        inst.set_buffer_size_kb(kib)?;
        inst.copy_markers()?;
        Ok(inst)
    }

    /// Sets `options/copy_trace_marker` when the kernel has it (6.17+); else the instance's
    /// [`read_markers`](Self::read_markers) reads the top-level buffer too.
    fn copy_markers(&mut self) -> Result<(), Error> {
        let opt = self.dir.join("options/copy_trace_marker");
        if opt.exists() {
            std::fs::write(&opt, "1")
                .map_err(|e| Error::io("writing", &opt, "write", "copy_trace_marker", e))?;
            self.copies_markers = true;
        } else {
            self.reads_top_level = true;
        }
        Ok(())
    }

    /// An instance for markers as [`for_markers`](Self::for_markers) makes it on a kernel
    /// without `options/copy_trace_marker` (before 6.17), whatever this kernel has: it does
    /// not copy markers, and [`read_markers`](Self::read_markers) reads the top-level buffer
    /// too. For tests of that path on newer kernels; not a stable API.
    ///
    /// # Errors
    /// Those of [`create`](Self::create).
    #[doc(hidden)]
    pub fn for_markers_without_copy(prefix: &str) -> Result<Instance, Error> {
        let mut inst = Instance::create(prefix)?;
        inst.reads_top_level = true;
        Ok(inst)
    }

    /// The instance's name (its directory name under `instances/`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The instance's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The path of a file of the instance, e.g. `file("events/uprobes/enable")`.
    pub fn file(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// The instance's own `trace_marker`: writes to it are recorded only in this instance.
    pub fn marker_path(&self) -> PathBuf {
        self.dir.join("trace_marker")
    }

    /// Whether top-level `trace_marker` writes are copied into this instance.
    pub fn copies_markers(&self) -> bool {
        self.copies_markers
    }

    /// Writes `contents` to one of the instance's files (one `write`).
    ///
    /// # Errors
    /// When opening or writing the file fails, by errno: [`NotFound`](Kind::NotFound)`("instance
    /// file")` (`ENOENT`, `ENOTDIR`), [`PermissionDenied`](Kind::PermissionDenied) (`EACCES`,
    /// `EPERM`), [`AlreadyExists`](Kind::AlreadyExists) (`EEXIST`), else [`Sys`](Kind::Sys)
    /// `{ call: "write", .. }`, e.g. for a value the kernel refuses. The error names the file and
    /// has the [`std::io::Error`] as its source.
    pub fn write_file(&self, relative: &str, contents: &str) -> Result<(), Error> {
        let path = self.dir.join(relative);
        std::fs::write(&path, contents)
            .map_err(|e| Error::io("writing", path, "write", "instance file", e))
    }

    /// Reads one of the instance's files.
    ///
    /// # Errors
    /// As [`write_file`](Self::write_file), with [`Sys`](Kind::Sys) `{ call: "read", .. }`;
    /// and [`InvalidInput`](Kind::InvalidInput)`("instance file")` when the contents are not
    /// UTF-8. The error names the file.
    pub fn read_file(&self, relative: &str) -> Result<String, Error> {
        let path = self.dir.join(relative);
        std::fs::read_to_string(&path)
            .map_err(|e| Error::io("reading", path, "read", "instance file", e))
    }

    /// Turns recording in this instance on or off (`tracing_on`).
    ///
    /// Refuses to turn off an instance that copies markers: on Linux 6.18 a paused instance with
    /// `copy_trace_marker` set makes *every* write to the top-level `trace_marker` fail with
    /// `EBADF`, for every process.
    ///
    /// # Errors
    /// [`InvalidInput`](Kind::InvalidInput) (naming the instance) for `on == false` when the
    /// instance [copies markers](Self::copies_markers), before anything is written; else those
    /// of [`write_file`](Self::write_file) on `tracing_on`.
    pub fn set_tracing_on(&self, on: bool) -> Result<(), Error> {
        if !on && self.copies_markers {
            return Err(Error::new(Kind::InvalidInput(
                "pausing an instance that copies trace_marker breaks every marker writer",
            ))
            .with_subject("instance", &self.name));
        }
        self.write_file("tracing_on", if on { "1" } else { "0" })
    }

    /// Sets the per-CPU ring buffer size in KiB (`buffer_size_kb`).
    ///
    /// On an instance that [copies markers](Self::copies_markers), every write to the top-level
    /// `trace_marker` (by any process) fails while the resize lasts; size the buffer first with
    /// [`for_markers_with_buffer`](Self::for_markers_with_buffer).
    ///
    /// # Errors
    /// Those of [`write_file`](Self::write_file) on `buffer_size_kb`: a size the kernel refuses
    /// is [`Sys`](Kind::Sys) with the errno of the `write`.
    pub fn set_buffer_size_kb(&self, kib: u32) -> Result<(), Error> {
        self.write_file("buffer_size_kb", &kib.to_string())
    }

    /// Enables (`true`) or disables an event in this instance: `events/<system>/<event>/enable`
    /// (e.g. `("uprobes", "my_probe")`). `event` may be empty to switch the whole system.
    ///
    /// # Errors
    /// As [`write_file`](Self::write_file) on the `enable` file, with
    /// [`NotFound`](Kind::NotFound)`("event enable file")` for `ENOENT` (no such system or event
    /// in this instance). The error names the file and the event (`system/event`, or `system`).
    pub fn set_event_enabled(&self, system: &str, event: &str, on: bool) -> Result<(), Error> {
        let rel = if event.is_empty() {
            format!("events/{system}/enable")
        } else {
            format!("events/{system}/{event}/enable")
        };
        let path = self.dir.join(rel);
        std::fs::write(&path, if on { "1" } else { "0" }).map_err(|e| {
            let id = if event.is_empty() {
                system.to_string()
            } else {
                format!("{system}/{event}")
            };
            Error::io("writing", path, "write", "event enable file", e).with_subject("event", id)
        })
    }

    /// Empties the instance's ring buffer.
    ///
    /// # Errors
    /// Those of [`write_file`](Self::write_file) on `trace`.
    pub fn clear(&self) -> Result<(), Error> {
        self.write_file("trace", "")
    }

    /// The instance's `trace` text (reading does not consume it). Invalid UTF-8 (another
    /// process may write any bytes into `trace_marker`) is replaced by U+FFFD.
    ///
    /// # Errors
    /// When reading `trace` fails, by errno: [`NotFound`](Kind::NotFound)`("trace")` (`ENOENT`,
    /// `ENOTDIR`), [`PermissionDenied`](Kind::PermissionDenied) (`EACCES`, `EPERM`), else
    /// [`Sys`](Kind::Sys) `{ call: "read", .. }`; the error names the file.
    pub fn read_trace(&self) -> Result<String, Error> {
        read_lossy(&self.dir.join("trace"))
    }

    /// Events the kernel lost in this instance's ring buffer, summed over the CPUs
    /// (`per_cpu/cpuN/stats`): `overrun` (overwritten before they were read: the buffer was
    /// too small) plus `dropped events` (not written: the buffer was full in no-overwrite
    /// mode). What [`read_markers`](Self::read_markers) and [`read_trace`](Self::read_trace)
    /// return misses exactly these; check it after reading.
    ///
    /// # Errors
    /// When the `per_cpu` directory cannot be listed, by errno:
    /// [`NotFound`](Kind::NotFound)`("per_cpu")` (`ENOENT`, `ENOTDIR`),
    /// [`PermissionDenied`](Kind::PermissionDenied) (`EACCES`, `EPERM`), else
    /// [`Sys`](Kind::Sys) (`readdir`); the error names the directory. A CPU whose `stats`
    /// cannot be read counts 0.
    pub fn dropped_events(&self) -> Result<u64, Error> {
        let dir = self.dir.join("per_cpu");
        let mut total = 0u64;
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| Error::io("listing", &dir, "readdir", "per_cpu", e))?;
        for e in entries {
            let Ok(e) = e else { continue };
            let Ok(stats) = std::fs::read_to_string(e.path().join("stats")) else {
                continue;
            };
            for line in stats.lines() {
                let n = line
                    .strip_prefix("overrun:")
                    .or_else(|| line.strip_prefix("dropped events:"))
                    .and_then(|v| v.trim().parse::<u64>().ok());
                total += n.unwrap_or(0);
            }
        }
        Ok(total)
    }

    /// Every trace-marker event recorded in this instance's buffer: the markers it
    /// [copies](Self::copies_markers) from the top-level `trace_marker` and those written
    /// through its own [`marker_path`](Self::marker_path). An instance made by
    /// [`for_markers`](Self::for_markers) on a kernel that cannot copy markers (before 6.17)
    /// reads the top-level buffer too, without consuming it; any other instance reads only its
    /// own buffer (never the events of other programs in the top-level one). Markers the
    /// kernel had to drop (a buffer too small for the rate they were written at) are missing:
    /// [`dropped_events`](Self::dropped_events) counts them; marker lines not in the grammar
    /// are left out too: [`read_markers_counted`](Self::read_markers_counted) returns the
    /// events with both counts.
    ///
    /// # Errors
    /// Those of [`read_trace`](Self::read_trace); when the instance reads the top-level buffer
    /// too, also those of [`tracefs::root`](super::root) and of reading the top-level `trace`
    /// (as `read_trace`).
    pub fn read_markers(&self) -> Result<Vec<parse::MarkerEvent>, Error> {
        Ok(self.markers_and_unparsed()?.0)
    }

    fn markers_and_unparsed(&self) -> Result<(Vec<parse::MarkerEvent>, parse::Unparsed), Error> {
        let own = self.read_trace()?;
        let mut events = parse::markers(&own);
        let mut unparsed = parse::unparsed(&own);
        if self.reads_top_level {
            let top = read_lossy(&root()?.join("trace"))?;
            events.extend(parse::markers(&top));
            events.sort_by_key(|e| e.timestamp_ns);
            let more = parse::unparsed(&top);
            unparsed.lines += more.lines;
            unparsed.markers += more.markers;
            unparsed.first = unparsed.first.or(more.first);
        }
        Ok((events, unparsed))
    }

    /// [`read_markers`](Self::read_markers) with what is missing from it: the number of events
    /// the kernel dropped ([`dropped_events`](Self::dropped_events), read right after) and the
    /// lines that could not be parsed ([`parse::unparsed`](super::unparsed)). Nothing is
    /// missing when [`MarkersRead::is_complete`] says so.
    ///
    /// # Errors
    /// Those of [`read_markers`](Self::read_markers), then those of
    /// [`dropped_events`](Self::dropped_events).
    pub fn read_markers_counted(&self) -> Result<MarkersRead, Error> {
        let (events, unparsed) = self.markers_and_unparsed()?;
        Ok(MarkersRead {
            events,
            dropped: self.dropped_events()?,
            unparsed,
        })
    }

    /// Every record of the instance's `trace` (markers, uprobe hits, other events), owned.
    ///
    /// # Errors
    /// Those of [`read_trace`](Self::read_trace).
    pub fn read_records(&self) -> Result<Vec<OwnedRecord>, Error> {
        let text = self.read_trace()?;
        Ok(parse::records(&text).map(OwnedRecord::from).collect())
    }
}

/// The trace-marker events of an instance and what is missing from them
/// ([`Instance::read_markers_counted`]).
#[derive(Clone, Debug)]
pub struct MarkersRead {
    /// The events read, in time order.
    pub events: Vec<parse::MarkerEvent>,
    /// Events the kernel dropped (`overrun` + `dropped events` of the per-CPU `stats`).
    pub dropped: u64,
    /// Lines of the trace text that could not be parsed (not records, or marker text not in the
    /// grammar).
    pub unparsed: parse::Unparsed,
}

impl MarkersRead {
    /// Whether every event is here: none dropped, none unparsed.
    pub fn is_complete(&self) -> bool {
        self.dropped == 0 && self.unparsed.is_empty()
    }
}

fn read_lossy(path: &Path) -> Result<String, Error> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, "read", "trace", e))?;
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// An owned copy of a [`parse::Record`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnedRecord {
    /// See [`parse::Record::task`].
    pub task: String,
    /// See [`parse::Record::tid`].
    pub tid: u32,
    /// See [`parse::Record::tgid`].
    pub tgid: Option<u32>,
    /// See [`parse::Record::cpu`].
    pub cpu: u32,
    /// See [`parse::Record::timestamp_ns`].
    pub timestamp_ns: u64,
    /// See [`parse::Record::event`].
    pub event: String,
    /// See [`parse::Record::body`].
    pub body: String,
}

impl From<parse::Record<'_>> for OwnedRecord {
    fn from(r: parse::Record<'_>) -> OwnedRecord {
        OwnedRecord {
            task: r.task.to_owned(),
            tid: r.tid,
            tgid: r.tgid,
            cpu: r.cpu,
            timestamp_ns: r.timestamp_ns,
            event: r.event.to_owned(),
            body: r.body.to_owned(),
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.copies_markers {
            let _ = std::fs::write(self.dir.join("options/copy_trace_marker"), "0");
        }
        // EBUSY while a file of the instance is still open somewhere: retry for a short while.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(_) => return,
            }
        }
    }
}
