//! A recording session: uprobe events in a private group, enabled in a private instance, and
//! their hits read back as structs. Everything is removed on drop, also while a panic unwinds.
//!
//! ```no_run
//! use selftrace::tracefs::Session;
//! use selftrace::usdt::read_probes;
//! let bin = std::path::Path::new("/usr/local/bin/app");
//! let mut s = Session::with_markers("myrecorder")?;
//! for note in read_probes(bin)? {
//!     s.add_probe(bin, &note)?;
//! }
//! s.add_function(bin, "app::parse", false, "")?;
//! s.add_function(bin, "app::parse", true, "")?;
//! s.enable()?;
//! // ... run the program ...
//! for hit in s.read_hits()? {
//!     println!("{} {} {:?}", hit.timestamp_ns, hit.label, hit.args);
//! }
//! # Ok::<(), selftrace::tracefs::Error>(())
//! ```
//!
//! Size: over 600 lines (about 850 without tests, 217 of them docs): one idea, a recording session
//! (its events, buffers, the reader thread and the teardown that must undo everything).

use super::symbols::{function_offset, offset_in_code};
use super::uprobe::UprobeEvent;
use super::{parse, root, Error, Instance};
use crate::error::Error as Kind;
use crate::usdt::ProbeNote;
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// What a session's event attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// A USDT probe site (its semaphore is the reference counter).
    Probe,
    /// A function's entry.
    Entry,
    /// A function's return (`%return`).
    Return,
    /// A raw file offset.
    Offset,
}

/// One uprobe event of a [`Session`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventInfo {
    /// The event's name in the session's group (what the `trace` file shows).
    pub event: String,
    /// What it stands for: `provider:name` for a probe, the symbol (with `%return` for a return
    /// probe) for a function, `path:0xoffset` for an offset.
    pub label: String,
    /// What it attaches to.
    pub kind: EventKind,
    /// The file (canonical path).
    pub path: PathBuf,
    /// The file offset it attaches to.
    pub offset: u64,
}

/// One hit of a session's event, parsed from the `trace` file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hit {
    /// Timestamp in nanoseconds of the trace clock.
    pub timestamp_ns: u64,
    /// The process (thread group) id, when the kernel knew it.
    pub pid: Option<u32>,
    /// The thread id.
    pub tid: u32,
    /// The CPU.
    pub cpu: u32,
    /// The event's name.
    pub event: String,
    /// The event's [`EventInfo::label`].
    pub label: String,
    /// What the event attaches to.
    pub kind: EventKind,
    /// The address hit (for a return probe: the return address).
    pub address: Option<u64>,
    /// The fetched arguments, in order: (`a0`, `-5`); quoted strings keep their quotes.
    pub args: Vec<(String, String)>,
}

impl Hit {
    /// The value of the argument `name` as printed.
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The argument `name` as a signed integer (decimal or `0x` hex).
    pub fn arg_i64(&self, name: &str) -> Option<i64> {
        let v = self.arg(name)?;
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok().map(|u| u as i64),
            None => v.parse().ok(),
        }
    }

    /// The argument `name` as an unsigned integer (decimal or `0x` hex).
    pub fn arg_u64(&self, name: &str) -> Option<u64> {
        let v = self.arg(name)?;
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => v.parse().ok(),
        }
    }
}

/// Splits a uprobe record's body, `(0x55d0c0a3d123) a0=5 s="x y"` or
/// `(0x5555 <- 0x5556) ret=3`, into the address and the arguments.
///
/// A `&str` / `&[u8]` argument of a probe (a pointer `aN`, a length `aN+1`, and the bytes
/// fetched as `aN_bytes={104,105,...}`, see [`Session::add_probe`]) comes back as
/// `aN="text"` (the bytes up to the length, invalid UTF-8 as U+FFFD, control characters as
/// `\xNN`, a backslash as `\\` and a quote as `\"`, so that every escape reads back one
/// way; text cut at the fetched size ends with `…[+N bytes]`) and `aN+1` = the length.
///
/// When the text cannot be decoded, `aN` stays the pointer and `aN_bytes` says why, as
/// `(no text: ...)`: no length argument `aN+1` (or bytes that [`cut_byte_args`] dropped for
/// that reason), a length that is not a byte count (`-1`, `five`), or bytes that were not
/// fetched (`(fault)`) or do not parse. No argument is dropped silently.
pub fn parse_hit_body(body: &str) -> (Option<u64>, Vec<(String, String)>) {
    let (address, mut args) = split_hit_body(body);
    decode_byte_args(&mut args);
    (address, args)
}

/// A fetched byte array of a hit, `aN_bytes={104,105,...}` (see [`parse_hit_body`]), read with
/// the argument's length.
struct ByteArg {
    /// The pointer argument's name, `aN`.
    ptr: String,
    /// The fetched bytes; `None` when the array does not parse.
    bytes: Option<Vec<u8>>,
    /// The argument's length, the value of `aN+1`: `None` when there is no such argument,
    /// its text when it does not parse as a byte count.
    len: Option<Result<usize, String>>,
}

/// The byte array `args[i]` when its name is `aN_bytes`, else `None`.
fn byte_arg(args: &[(String, String)], i: usize) -> Option<ByteArg> {
    let (name, value) = &args[i];
    let ptr = name.strip_suffix("_bytes")?.to_string();
    // `{104,105}`; `{}` (what `cut_hit_body` leaves when it drops every byte) is no byte.
    let bytes: Option<Vec<u8>> = value
        .strip_prefix('{')
        .and_then(|v| v.strip_suffix('}'))
        .and_then(|v| {
            if v.trim().is_empty() {
                return Some(Vec::new());
            }
            v.split(',')
                .map(|b| match b.trim().strip_prefix("0x") {
                    Some(h) => u8::from_str_radix(h, 16).ok(),
                    None => b.trim().parse().ok(),
                })
                .collect()
        });
    let len_name = ptr
        .strip_prefix('a')
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| n.checked_add(1))
        .map(|n| format!("a{n}"));
    let len = len_name
        .and_then(|n| args.iter().find(|(k, _)| *k == n))
        .map(|(_, v)| v.parse::<usize>().map_err(|_| v.clone()));
    Some(ByteArg { ptr, bytes, len })
}

/// Replaces each `aN` / `aN_bytes` pair by `aN="text"` (see [`parse_hit_body`]).
fn decode_byte_args(args: &mut Vec<(String, String)>) {
    let mut i = 0;
    while i < args.len() {
        let Some(ByteArg { ptr, bytes, len }) = byte_arg(args, i) else {
            i += 1;
            continue;
        };
        match (bytes, len) {
            (Some(bytes), Some(Ok(len))) => {
                let shown = &bytes[..len.min(bytes.len())];
                let mut text = String::from("\"");
                for c in String::from_utf8_lossy(shown).chars() {
                    match c {
                        '\\' => text.push_str("\\\\"),
                        '"' => text.push_str("\\\""),
                        c if c.is_control() => text.push_str(&format!("\\x{:02x}", c as u32)),
                        c => text.push(c),
                    }
                }
                if len > bytes.len() {
                    text.push_str(&format!("…[+{} bytes]", len - bytes.len()));
                }
                text.push('"');
                if let Some(p) = args.iter_mut().find(|(k, _)| *k == ptr) {
                    p.1 = text;
                }
                args.remove(i);
            }
            // Not fetched (a fault), or cut away (see `cut_hit_body`): the pointer and length
            // stay as they are, and the byte array's place says why there is no text.
            (bytes, len) => {
                let why = match (bytes, len) {
                    (_, None) => format!("(no text: no length argument for {ptr})"),
                    (_, Some(Err(v))) => format!("(no text: length {v:?} is not a byte count)"),
                    _ => format!("(no text: bytes {:?} not fetched)", args[i].1),
                };
                args[i].1 = why;
                i += 1;
            }
        }
    }
}

/// `body` (a hit's, as [`parse_hit_body`] reads it) with each fetched byte array
/// `aN_bytes={...}` cut to the argument's length `aN+1`: the kernel fetches
/// [`BYTES_FETCHED`](super::uprobe::BYTES_FETCHED) bytes whatever the length, and the bytes
/// after the argument are whatever memory follows it. When the length is missing or the
/// array does not parse, no byte is kept (`aN_bytes={}`). A body without byte arrays comes
/// back as it is.
fn cut_hit_body(body: &str) -> Cow<'_, str> {
    let (head, mut args) = split_hit_args(body);
    let mut cut = false;
    for i in 0..args.len() {
        let Some(ByteArg { bytes, len, .. }) = byte_arg(&args, i) else {
            continue;
        };
        let kept: &[u8] = match (&bytes, len) {
            (Some(bytes), Some(Ok(len))) => &bytes[..len.min(bytes.len())],
            _ => &[],
        };
        let list: Vec<String> = kept.iter().map(u8::to_string).collect();
        args[i].1 = format!("{{{}}}", list.join(","));
        cut = true;
    }
    if !cut {
        return Cow::Borrowed(body);
    }
    let mut out = head.to_string();
    for (i, (k, v)) in args.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    Cow::Owned(out)
}

/// The text of a `trace` file with the hits of the [`Probe`](EventKind::Probe) events of
/// `events` rewritten so that no fetched byte lies past its argument: each `aN_bytes={...}`
/// of a `&str` / `&[u8]` argument (see [`Session::add_probe`]) is cut to the argument's length
/// `aN+1`, and dropped whole (`aN_bytes={}`) when the length is missing or the array does not
/// parse. The kernel fetches [`BYTES_FETCHED`](super::uprobe::BYTES_FETCHED) bytes whatever
/// the length (a fetch argument has no dynamic length), so the bytes after a short argument
/// are whatever memory follows it (another string, a token): cut the text with this before it
/// goes into a file. Every other line (other events, comments, lines that do not parse) is
/// kept as it is; [`parse_hit_body`] reads a cut hit as it reads the uncut one.
pub fn cut_byte_args(trace: &str, events: &[EventInfo]) -> String {
    let mut out = String::with_capacity(trace.len());
    for line in trace.split_inclusive('\n') {
        let probe = parse::parse_record(line).filter(|r| {
            events
                .iter()
                .any(|e| e.kind == EventKind::Probe && e.event == r.event)
        });
        let Some(r) = probe else {
            out.push_str(line);
            continue;
        };
        // The body is the end of the line, before its line break (a record of the line
        // cannot be anything else; a line where it were is left out, not written uncut).
        let content = line.trim_end_matches(['\n', '\r']);
        if let Some(head) = content.strip_suffix(r.body) {
            out.push_str(head);
            out.push_str(&cut_hit_body(r.body));
            out.push_str(&line[content.len()..]);
        }
    }
    out
}

fn split_hit_body(body: &str) -> (Option<u64>, Vec<(String, String)>) {
    let (head, args) = split_hit_args(body);
    let address = head.trim().strip_prefix('(').and_then(|inner| {
        let (addr, _) = inner.split_once(')')?;
        let first = addr.split_whitespace().next().unwrap_or("");
        first
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
    });
    (address, args)
}

/// Splits a hit's body into what comes before its arguments (the address, `(0x5555) `, with
/// the blanks after it) and the arguments, `name=value` (quoted strings keep their quotes).
fn split_hit_args(body: &str) -> (&str, Vec<(String, String)>) {
    let body = body.trim_end();
    let mut rest = body.trim_start();
    if let Some((_, after)) = rest.strip_prefix('(').and_then(|i| i.split_once(')')) {
        rest = after.trim_start();
    }
    // `rest` is the end of `body`.
    let head = &body[..body.len() - rest.len()];
    let mut args = Vec::new();
    while let Some((name, after)) = rest.split_once('=') {
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (&after[..end + 2], &q[end + 1..]),
                None => (after, ""),
            }
        } else {
            after.split_once(' ').unwrap_or((after, ""))
        };
        args.push((name.trim().to_string(), value.to_string()));
        rest = next.trim_start();
    }
    (head, args)
}

/// A private uprobe group (`selftrace_<pid>_<seq>_<nanos>`, the id of its instance) and a
/// private [`Instance`] (`<prefix>-<pid>-<seq>-<nanos>`) that enables its events. Dropping it
/// disables and removes every event, then the instance, also while a panic unwinds: the
/// instance's lock (see [`Instance`]) is held until the events are gone, so
/// [`remove_stale_sessions`] can prove a session dead from any namespace.
#[must_use = "the session stops and removes its events when this is dropped"]
#[derive(Debug)]
pub struct Session {
    // Field order is drop order, after `Drop::drop` disabled and removed the events: the
    // instance goes first (an enabled uprobe event cannot be removed), then the events whose
    // removal failed get another try.
    instance: Instance,
    events: Vec<UprobeEvent>,
    infos: Vec<EventInfo>,
    group: String,
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.set_enabled(false);
        self.events.retain_mut(|e| !e.remove_now());
    }
}

impl Session {
    /// Creates a session with an instance named after `prefix` (see [`Instance::create`]).
    /// The group name is `selftrace_<pid>_<seq>_<nanos>`, from the instance's name.
    ///
    /// # Errors
    /// Those of [`tracefs::root`](super::root) ([`NoTracefs`](Kind::NoTracefs) without tracefs);
    /// [`Unsupported`](Kind::Unsupported) for a kernel without uprobe events (no
    /// `uprobe_events`); [`PermissionDenied`](Kind::PermissionDenied) (typically not root) or
    /// [`Sys`](Kind::Sys) when `uprobe_events` cannot be examined or read, naming it; those of
    /// [`Instance::create`] (e.g. [`InvalidInput`](Kind::InvalidInput) for a bad `prefix`);
    /// [`AlreadyExists`](Kind::AlreadyExists)`("uprobe event group")` when `uprobe_events`
    /// already has events in the new group.
    pub fn new(prefix: &str) -> Result<Session, Error> {
        Self::create(prefix, false, None)
    }

    /// Like [`new`](Self::new), and the instance also records the trace markers written to the
    /// top-level `trace_marker` (see [`Instance::for_markers`]).
    ///
    /// # Errors
    /// Those of [`new`](Self::new), with those of [`Instance::for_markers`] for the instance.
    pub fn with_markers(prefix: &str) -> Result<Session, Error> {
        Self::create(prefix, true, None)
    }

    /// A session with a ring buffer of `buffer_kb` KiB per CPU, recording trace markers when
    /// `markers` is true. Use this rather than resizing the instance afterwards: resizing an
    /// instance that copies markers loses every process's markers while it lasts (see
    /// [`Instance::for_markers_with_buffer`]).
    ///
    /// # Errors
    /// Those of [`new`](Self::new), with those of [`Instance::set_buffer_size_kb`] (a size the
    /// kernel refuses) and, when `markers` is true, of [`Instance::for_markers_with_buffer`].
    pub fn with_options(prefix: &str, markers: bool, buffer_kb: u32) -> Result<Session, Error> {
        Self::create(prefix, markers, Some(buffer_kb))
    }

    fn create(prefix: &str, markers: bool, buffer_kb: Option<u32>) -> Result<Session, Error> {
        let root = root()?;
        let uprobe_events = root.join("uprobe_events");
        match std::fs::metadata(&uprobe_events) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::new(Kind::Unsupported(
                    "kernel without uprobe events (CONFIG_UPROBE_EVENTS)",
                ))
                .with_path(uprobe_events))
            }
            Err(e) => {
                return Err(Error::io(
                    "examining",
                    uprobe_events,
                    "stat",
                    "uprobe_events",
                    e,
                ))
            }
        }
        let existing = std::fs::read_to_string(&uprobe_events)
            .map_err(|e| Error::io("reading", &uprobe_events, "read", "uprobe_events", e))?;
        let instance = match (markers, buffer_kb) {
            (true, Some(kib)) => Instance::for_markers_with_buffer(prefix, kib)?,
            (true, None) => Instance::for_markers(prefix)?,
            (false, kib) => {
                let inst = Instance::create(prefix)?;
                if let Some(kib) = kib {
                    inst.set_buffer_size_kb(kib)?;
                }
                inst
            }
        };
        // The group carries the instance's id (`<pid>-<seq>-<nanos>`), so that a group is
        // known dead exactly when its instance is (or is gone).
        let id = instance_id(instance.name(), prefix).ok_or_else(|| {
            Error::new(Kind::InvalidInput(
                "instance name without a pid, sequence and time",
            ))
            .with_subject("instance", instance.name())
        })?;
        let group = format!("selftrace_{}_{}_{}", id.0, id.1, id.2);
        if existing.contains(&format!(":{group}/")) {
            return Err(Error::new(Kind::AlreadyExists("uprobe event group"))
                .with_path(uprobe_events)
                .with_subject("group", group));
        }
        // The process id on every line: Perfetto groups threads into processes with it.
        let _ = instance.write_file("options/record-tgid", "1");
        Ok(Session {
            instance,
            events: Vec::new(),
            infos: Vec::new(),
            group,
        })
    }

    /// The uprobe group of this session's events.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The private instance the events are enabled in.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// The events added so far.
    pub fn events(&self) -> &[EventInfo] {
        &self.infos
    }

    fn unique_event_name(&self, base: &str) -> String {
        let mut s: String = base
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
            s.insert(0, '_');
        }
        s.truncate(56);
        let mut name = s.clone();
        let mut n = 1;
        while self.infos.iter().any(|i| i.event == name) {
            name = format!("{s}_{n}");
            n += 1;
        }
        name
    }

    /// [`AlreadyExists`](Kind::AlreadyExists) if somebody else created `name` in this
    /// session's group: the kernel would silently add our probe to theirs.
    fn check_free(&self, name: &str) -> Result<(), Error> {
        let dir = root()?.join("events").join(&self.group).join(name);
        if dir.exists() {
            return Err(Error::new(Kind::AlreadyExists("uprobe event"))
                .with_path(dir)
                .with_subject("event", format!("{}/{name}", self.group)));
        }
        Ok(())
    }

    fn push(
        &mut self,
        event: UprobeEvent,
        label: String,
        kind: EventKind,
        path: PathBuf,
        offset: u64,
    ) -> &EventInfo {
        self.infos.push(EventInfo {
            event: event.event().to_string(),
            label,
            kind,
            path,
            offset,
        });
        self.events.push(event);
        self.infos.last().expect("just pushed")
    }

    /// Adds an event on the USDT probe site `note` of the ELF file `path` (from
    /// [`read_probes`](crate::usdt::read_probes)): one fetch argument `aN` per probe argument
    /// with its size and sign, and the probe's semaphore as reference counter, so that the
    /// kernel raises it in every process that maps the file while the event is enabled.
    /// Several sites of one probe become several events (`provider_name`, `provider_name_1`).
    /// A `&str` / `&[u8]` argument also fetches the first
    /// [`BYTES_FETCHED`](super::uprobe::BYTES_FETCHED) bytes it points to, which
    /// [`parse_hit_body`] decodes into the text.
    ///
    /// # Errors
    /// [`NotFound`](Kind::NotFound)`("elf file")`, [`PermissionDenied`](Kind::PermissionDenied)
    /// or [`Sys`](Kind::Sys) when `path` cannot be resolved (`realpath`);
    /// [`AlreadyExists`](Kind::AlreadyExists)`("uprobe event")` when somebody else created the
    /// event's name in this session's group; and those of [`UprobeEvent::for_probe`] (a note
    /// without a file offset, an argument the kernel cannot fetch, a path with a space or `:`,
    /// a command the kernel refuses, with its reason). An error names the file and the event
    /// (`GROUP/EVENT`), or the probe (`provider:name`) when it failed before the event had a
    /// name.
    pub fn add_probe(&mut self, path: &Path, note: &ProbeNote) -> Result<&EventInfo, Error> {
        let path = canonical(path).map_err(|e| e.with_subject("probe", probe_label(note)))?;
        let name = self.unique_event_name(&format!("{}_{}", note.provider, note.name));
        self.check_free(&name)?;
        let event = UprobeEvent::for_probe(&self.group, &name, &path, note)?;
        let offset = note.file_offset.unwrap_or(0);
        Ok(self.push(event, probe_label(note), EventKind::Probe, path, offset))
    }

    /// Adds an event on the entry (`ret == false`) or the return of the function `symbol` of the
    /// ELF file `path` (matched as [`find_functions`](super::find_functions) says).
    /// `args` are extra fetch arguments (`n=%di:u64`); a return probe without `args` fetches
    /// `ret=$retval:u64`.
    ///
    /// # Errors
    /// [`NotFound`](Kind::NotFound)`("elf file")`, [`PermissionDenied`](Kind::PermissionDenied)
    /// or [`Sys`](Kind::Sys) when `path` cannot be resolved (`realpath`); those of
    /// [`function_offset`](super::function_offset) ([`NotFound`](Kind::NotFound)`("symbol")` if
    /// no function has that name, [`InvalidInput`](Kind::InvalidInput) if several do, and those
    /// of [`function_symbols`](super::function_symbols) for a file that cannot be read as ELF);
    /// [`AlreadyExists`](Kind::AlreadyExists)`("uprobe event")` when somebody else created the
    /// event's name in this session's group; and those of [`UprobeEvent::create`] /
    /// [`UprobeEvent::create_return`] (a path with a space or `:`, `args` with a newline, a
    /// command the kernel refuses, with its reason). The error names the file and the symbol
    /// (or, once it has one, the event).
    pub fn add_function(
        &mut self,
        path: &Path,
        symbol: &str,
        ret: bool,
        args: &str,
    ) -> Result<&EventInfo, Error> {
        let path = canonical(path).map_err(|e| e.with_subject("symbol", symbol))?;
        let offset = function_offset(&path, symbol)?;
        let short = symbol.rsplit("::").next().unwrap_or(symbol);
        let (name, label) = if ret {
            (format!("{short}__return"), format!("{symbol}%return"))
        } else {
            (short.to_string(), symbol.to_string())
        };
        self.add_at(
            path,
            offset,
            ret,
            args,
            &name,
            label,
            if ret {
                EventKind::Return
            } else {
                EventKind::Entry
            },
        )
    }

    /// Adds an event at the raw file offset `offset` of `path` (a return probe when `ret`:
    /// then `offset` must be a function's first instruction).
    ///
    /// # Errors
    /// [`InvalidInput`](Kind::InvalidInput) when the offset lies in no executable segment of
    /// the file (0 is the ELF header, not code); [`NotFound`](Kind::NotFound)`("elf file")`,
    /// [`PermissionDenied`](Kind::PermissionDenied) or [`Sys`](Kind::Sys) when `path` cannot be
    /// resolved or opened, [`InvalidInput`](Kind::InvalidInput) when it is not a regular file,
    /// [`BadElf`](Kind::BadElf) when it is not a readable ELF file (these name the file and the
    /// offset); [`AlreadyExists`](Kind::AlreadyExists)`("uprobe event")` when somebody else
    /// created the event's name in this session's group; and those of [`UprobeEvent::create`]
    /// / [`UprobeEvent::create_return`] (a path with a space or `:`, `args` with a newline, a
    /// command the kernel refuses, with its reason).
    pub fn add_offset(
        &mut self,
        path: &Path,
        offset: u64,
        ret: bool,
        args: &str,
    ) -> Result<&EventInfo, Error> {
        let at = format!("0x{offset:x}");
        let path = canonical(path).map_err(|e| e.with_subject("offset", &at))?;
        if !offset_in_code(&path, offset).map_err(|e| e.with_subject("offset", &at))? {
            return Err(Error::new(Kind::InvalidInput(
                "offset is not in an executable segment of the file",
            ))
            .with_op("attaching to")
            .with_path(path)
            .with_subject("offset", at));
        }
        let label = format!(
            "{}:0x{offset:x}{}",
            path.display(),
            if ret { "%return" } else { "" }
        );
        let name = format!("off_{offset:x}{}", if ret { "__return" } else { "" });
        self.add_at(path, offset, ret, args, &name, label, EventKind::Offset)
    }

    #[allow(clippy::too_many_arguments)]
    fn add_at(
        &mut self,
        path: PathBuf,
        offset: u64,
        ret: bool,
        args: &str,
        name: &str,
        label: String,
        kind: EventKind,
    ) -> Result<&EventInfo, Error> {
        let name = self.unique_event_name(name);
        self.check_free(&name)?;
        let event = if ret {
            let args = if args.trim().is_empty() {
                "ret=$retval:u64"
            } else {
                args
            };
            UprobeEvent::create_return(&self.group, &name, &path, offset, args)?
        } else {
            UprobeEvent::create(&self.group, &name, &path, offset, None, args)?
        };
        Ok(self.push(event, label, kind, path, offset))
    }

    /// Enables every event of the session in its instance.
    ///
    /// # Errors
    /// Those of [`Instance::set_event_enabled`] for the first event that fails; the events
    /// before it stay enabled.
    pub fn enable(&self) -> Result<(), Error> {
        self.set_enabled(true)
    }

    /// Disables every event of the session in its instance.
    ///
    /// # Errors
    /// Those of [`Instance::set_event_enabled`] for the first event that fails; the events
    /// before it stay disabled.
    pub fn disable(&self) -> Result<(), Error> {
        self.set_enabled(false)
    }

    fn set_enabled(&self, on: bool) -> Result<(), Error> {
        for e in &self.infos {
            self.instance.set_event_enabled(&self.group, &e.event, on)?;
        }
        Ok(())
    }

    /// Records events (uprobes and kernel events enabled in the instance) only for the tasks
    /// `pids` (`set_event_pid`), and, with `follow_forks`, for the tasks (processes and threads)
    /// they create from then on (`options/event-fork`). The kernel filters by task, that is by
    /// thread id: to follow the processes a thread spawns, give that thread's id (`gettid`),
    /// not only the process id. Trace markers are not filtered by this.
    ///
    /// # Errors
    /// Those of [`Instance::write_file`] on `options/event-fork` (then `set_event_pid` is left
    /// as it was) or on `set_event_pid`.
    pub fn filter_pids(&self, pids: &[u32], follow_forks: bool) -> Result<(), Error> {
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        self.instance
            .write_file("options/event-fork", if follow_forks { "1" } else { "0" })?;
        self.instance.write_file("set_event_pid", &list.join(" "))
    }

    /// Events the kernel dropped in the session's ring buffer (see
    /// [`Instance::dropped_events`]): hits and markers that [`read_hits`](Self::read_hits) and
    /// the trace miss.
    ///
    /// # Errors
    /// Those of [`Instance::dropped_events`].
    pub fn dropped_events(&self) -> Result<u64, Error> {
        self.instance.dropped_events()
    }

    /// Every hit of the session's events recorded so far (reading does not consume them).
    ///
    /// # Errors
    /// Those of [`Instance::read_trace`].
    pub fn read_hits(&self) -> Result<Vec<Hit>, Error> {
        Ok(self.hits(&self.instance.read_trace()?))
    }

    /// The hits of this session's events in the text of a `trace` file.
    pub fn hits(&self, trace: &str) -> Vec<Hit> {
        parse::records(trace)
            .filter_map(|r| {
                let info = self.infos.iter().find(|i| i.event == r.event)?;
                let (address, args) = parse_hit_body(r.body);
                Some(Hit {
                    timestamp_ns: r.timestamp_ns,
                    pid: r.tgid,
                    tid: r.tid,
                    cpu: r.cpu,
                    event: info.event.clone(),
                    label: info.label.clone(),
                    kind: info.kind,
                    address,
                    args,
                })
            })
            .collect()
    }
}

/// `(pid, seq, nanos)` of an instance named `<prefix>-<pid>-<seq>-<nanos>`.
fn instance_id<'a>(name: &'a str, prefix: &str) -> Option<(&'a str, &'a str, &'a str)> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let mut parts = rest.split('-');
    let id = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (parts.next().is_none() && digits(id.0) && digits(id.1) && digits(id.2)).then_some(id)
}

/// `(prefix, pid, seq, nanos)` of an instance named `<prefix>-<pid>-<seq>-<nanos>`.
fn split_instance_name(name: &str) -> Option<(&str, &str, &str, &str)> {
    let mut it = name.rsplitn(4, '-');
    let (nanos, seq, pid, prefix) = (it.next()?, it.next()?, it.next()?, it.next()?);
    let (p2, s2, n2) = instance_id(name, prefix)?;
    (p2 == pid && s2 == seq && n2 == nanos).then_some((prefix, pid, seq, nanos))
}

/// Removes what sessions whose process died left behind (a process killed with SIGKILL cannot
/// clean up), and nothing else: an instance `<instance_prefix>-<pid>-<seq>-<nanos>` only when
/// the lock its creator held on it is free (the creator is dead, in whatever PID namespace:
/// tracefs and its locks are the same for every namespace) and it is older than two seconds
/// (a brand-new instance may not be locked yet); a uprobe group `selftrace_<pid>_<seq>_<nanos>`
/// only when its instance was removed now or is gone (a live session removes its events before
/// its instance). Process ids are never used to judge liveness. Returns what was removed
/// (`instances/NAME`, `GROUP/EVENT`).
///
/// # Errors
/// Those of [`tracefs::root`](super::root); and, naming the file, by errno
/// ([`NotFound`](Kind::NotFound) for `ENOENT`, [`PermissionDenied`](Kind::PermissionDenied)
/// for `EACCES`/`EPERM`, else [`Sys`](Kind::Sys)), when `instances` cannot be listed (nothing
/// is removed) or `uprobe_events` cannot be read (the instances removed before are not
/// reported). An instance or event that cannot be removed is no error: it is left out of the
/// list.
pub fn remove_stale_sessions(instance_prefix: &str) -> Result<Vec<String>, Error> {
    let root = root()?;
    let mut removed = Vec::new();
    let instances = root.join("instances");
    let mut live_ids: Vec<String> = Vec::new();
    let entries = std::fs::read_dir(&instances)
        .map_err(|e| Error::io("listing", &instances, "readdir", "instances", e))?;
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        // Any session's instance, whatever its prefix, keeps its group alive.
        let Some((prefix, pid, seq, nanos)) = split_instance_name(&name) else {
            continue;
        };
        let id = format!("{pid}_{seq}_{nanos}");
        if prefix != instance_prefix {
            live_ids.push(id);
            continue;
        }
        let dir = instances.join(&name);
        let young = std::fs::metadata(&dir)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < std::time::Duration::from_secs(2));
        let (alive, lock) = super::instance::is_owner_alive(&dir);
        if alive || young {
            live_ids.push(id);
            continue;
        }
        let _ = std::fs::write(dir.join("options/copy_trace_marker"), "0");
        if std::fs::remove_dir(&dir).is_ok() {
            removed.push(format!("instances/{name}"));
        } else {
            live_ids.push(id);
        }
        drop(lock);
    }
    let list = std::fs::read_to_string(root.join("uprobe_events")).map_err(|e| {
        Error::io(
            "reading",
            root.join("uprobe_events"),
            "read",
            "uprobe_events",
            e,
        )
    })?;
    for line in list.lines() {
        // p:GROUP/EVENT PATH:OFFSET ...
        let Some(id) = line.split_whitespace().next().and_then(|h| h.get(2..)) else {
            continue;
        };
        let Some((group, event)) = id.split_once('/') else {
            continue;
        };
        let Some(rest) = group.strip_prefix("selftrace_") else {
            continue;
        };
        let parts: Vec<&str> = rest.split('_').collect();
        if parts.len() != 3
            || !parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            || live_ids.iter().any(|l| l == rest)
        {
            continue;
        }
        let _ = std::fs::write(
            root.join("events").join(group).join(event).join("enable"),
            "0",
        );
        use std::io::Write;
        let ok = std::fs::OpenOptions::new()
            .append(true)
            .open(root.join("uprobe_events"))
            .and_then(|mut f| f.write_all(format!("-:{group}/{event}\n").as_bytes()));
        if ok.is_ok() {
            removed.push(format!("{group}/{event}"));
        }
    }
    Ok(removed)
}

fn canonical(path: &Path) -> Result<PathBuf, Error> {
    std::fs::canonicalize(path).map_err(|e| Error::io("resolving", path, "realpath", "elf file", e))
}

/// `provider:name` of a probe note: its [`EventInfo::label`].
fn probe_label(note: &ProbeNote) -> String {
    format!("{}:{}", note.provider, note.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_bodies() {
        let (a, args) = parse_hit_body("(0x55d0c0a3d123) a0=-5 a1=18000000000000000000");
        assert_eq!(a, Some(0x55d0c0a3d123));
        assert_eq!(
            args,
            vec![
                ("a0".to_string(), "-5".to_string()),
                ("a1".to_string(), "18000000000000000000".to_string())
            ]
        );
        let (a, args) = parse_hit_body("(0x5555 <- 0x5556) ret=0x12");
        assert_eq!(a, Some(0x5555));
        assert_eq!(args, vec![("ret".to_string(), "0x12".to_string())]);
        let (_, args) = parse_hit_body("(0x1) s=\"a b\" n=3");
        assert_eq!(args[0].1, "\"a b\"");
        assert_eq!(args[1], ("n".to_string(), "3".to_string()));
        assert_eq!(parse_hit_body("(0x1)"), (Some(1), vec![]));
        let (_, args) = parse_hit_body("(0x1) a0=0x7f00 a1=2 a2=7 a0_bytes={0x68,0x69,0x21,0x0}");
        assert_eq!(
            args,
            vec![
                ("a0".to_string(), "\"hi\"".to_string()),
                ("a1".to_string(), "2".to_string()),
                ("a2".to_string(), "7".to_string())
            ]
        );
        let (_, args) = parse_hit_body("(0x1) a0=0x7f00 a1=5 a0_bytes={97,10}");
        assert_eq!(args[0].1, "\"a\\x0a…[+3 bytes]\"");
    }

    /// Issue 45: a recorded `\x0a` (four characters) and a newline read back the same, and a
    /// quote ended the quoted text early; now every escape reads back one way.
    #[test]
    fn decoded_text_escapes_backslash_and_quote() {
        // `\x0a` as text: 92,120,48,97; a newline: 10; `a"b`: 97,34,98.
        let (_, args) = parse_hit_body("(0x1) a0=1 a1=4 a0_bytes={92,120,48,97}");
        assert_eq!(args[0].1, r#""\\x0a""#);
        let (_, args) = parse_hit_body("(0x1) a0=1 a1=1 a0_bytes={10}");
        assert_eq!(args[0].1, r#""\x0a""#);
        let (_, args) = parse_hit_body("(0x1) a0=1 a1=3 a0_bytes={97,34,98}");
        assert_eq!(args[0].1, r#""a\"b""#);
    }

    /// Issue 45: a length argument of u64::MAX (or an argument index whose `aN+1` overflows)
    /// panicked in debug builds and left the argument without text, silently, in release.
    #[test]
    fn undecodable_byte_args_say_why() {
        let max = u64::MAX;
        // A length of u64::MAX: all the bytes fetched, and how many more the length claims.
        let (_, args) = parse_hit_body(&format!("(0x1) a0=7 a1={max} a0_bytes={{104,105}}"));
        assert_eq!(args[0].1, format!("\"hi…[+{} bytes]\"", max - 2));
        // An index whose length argument would be a{u64::MAX + 1}.
        let (_, args) = parse_hit_body(&format!("(0x1) a{max}=7 a{max}_bytes={{104,105}}"));
        assert_eq!(args[0], (format!("a{max}"), "7".to_string()));
        assert_eq!(
            args[1],
            (
                format!("a{max}_bytes"),
                format!("(no text: no length argument for a{max})")
            ),
            "{args:?}"
        );
        for (body, why) in [
            (
                "(0x1) a0=7 a0_bytes={104,105}",
                "(no text: no length argument for a0)",
            ),
            (
                "(0x1) a0=7 a1=-1 a0_bytes={104,105}",
                "(no text: length \"-1\" is not a byte count)",
            ),
            (
                "(0x1) a0=7 a1=2 a0_bytes=(fault)",
                "(no text: bytes \"(fault)\" not fetched)",
            ),
        ] {
            let (_, args) = parse_hit_body(body);
            assert_eq!(args[0], ("a0".to_string(), "7".to_string()), "{body}");
            assert_eq!(
                args.iter()
                    .find(|a| a.0 == "a0_bytes")
                    .map(|a| a.1.as_str()),
                Some(why),
                "{body}: {args:?}"
            );
        }
    }

    #[test]
    fn fetched_bytes_are_cut_to_the_length() {
        let secret: Vec<String> = (0..59).map(|i| (65 + i % 26).to_string()).collect();
        let body = format!(
            "(0x5570) a0=93941928718841 a1=5 a0_bytes={{104,101,108,108,111,{}}}",
            secret.join(",")
        );
        let cut = cut_hit_body(&body);
        assert_eq!(
            cut,
            "(0x5570) a0=93941928718841 a1=5 a0_bytes={104,101,108,108,111}"
        );
        // Read back as the uncut body is.
        assert_eq!(parse_hit_body(&cut), parse_hit_body(&body));
        assert_eq!(parse_hit_body(&cut).1[0].1, "\"hello\"");
        // Hex bytes (an `x8` array) come out decimal; a length beyond the bytes fetched keeps
        // them all; a second pair is cut on its own; other arguments stay.
        assert_eq!(
            cut_hit_body("(0x1) a0=1 a1=2 a2=-3 a3=1 a0_bytes={0x68,0x69,0x21} a2_bytes={1,2}"),
            "(0x1) a0=1 a1=2 a2=-3 a3=1 a0_bytes={104,105} a2_bytes={1}"
        );
        assert_eq!(
            cut_hit_body("(0x1) a0=1 a1=100 a0_bytes={1,2,3}"),
            "(0x1) a0=1 a1=100 a0_bytes={1,2,3}"
        );
        // An empty argument.
        let empty = cut_hit_body("(0x1) a0=1 a1=0 a0_bytes={1,2,3}");
        assert_eq!(empty, "(0x1) a0=1 a1=0 a0_bytes={}");
        assert_eq!(parse_hit_body(&empty).1[0].1, "\"\"");
        // No length, or one that does not parse, or bytes that do not parse: no byte is kept.
        // Read back: without a length the pointer stays as it is; with one, no text and the
        // bytes not shown.
        for (body, read) in [
            ("(0x1) a0=7 a0_bytes={104,105}", Some("7")),
            ("(0x1) a0=7 a1=five a0_bytes={104,105}", Some("7")),
            ("(0x1) a0=7 a1=-1 a0_bytes={104,105}", Some("7")),
            ("(0x1) a0=7 a1=2 a0_bytes={104,x}", Some("\"…[+2 bytes]\"")),
            ("(0x1) a0=7 a1=2 a0_bytes=(fault)", Some("\"…[+2 bytes]\"")),
            (
                "(0x1) x_bytes={104,105}",
                Some("(no text: no length argument for x)"),
            ),
        ] {
            let cut = cut_hit_body(body);
            assert!(cut.ends_with("_bytes={}"), "{body} -> {cut}");
            assert!(!cut.contains("104"), "{body} -> {cut}");
            let args = parse_hit_body(&cut).1;
            assert_eq!(args.first().map(|a| a.1.as_str()), read, "{body}");
        }
        // Without byte arrays: as it is.
        let plain = "(0x5555 <- 0x5556)  ret=3 s=\"a b\"";
        assert!(matches!(cut_hit_body(plain), Cow::Borrowed(p) if p == plain));
    }

    #[test]
    fn traces_are_cut_in_probe_hits_only() {
        let info = |event: &str, kind| EventInfo {
            event: event.into(),
            label: event.into(),
            kind,
            path: "/x".into(),
            offset: 0,
        };
        let events = [
            info("rt_text", EventKind::Probe),
            info("f", EventKind::Entry),
        ];
        let trace = "\
# tracer: nop
 app-7 (    7) [000] ..... 1.000001: rt_text: (0x1234) a0=99 a1=2 a0_bytes={104,105,83,69}
 app-7 (    7) [000] ..... 1.000002: f: (0x1240) buf_bytes={104,105,83,69}
 app-7 (    7) [000] ..... 1.000003: tracing_mark_write: B|7|a0_bytes={1,2}
not a record a0=1 a1=0 a0_bytes={83}\r
 app-7 (    7) [000] ..... 1.000004: rt_text: (0x1234) a0=99 a1=1 a0_bytes={104,105,83,69}";
        let want = "\
# tracer: nop
 app-7 (    7) [000] ..... 1.000001: rt_text: (0x1234) a0=99 a1=2 a0_bytes={104,105}
 app-7 (    7) [000] ..... 1.000002: f: (0x1240) buf_bytes={104,105,83,69}
 app-7 (    7) [000] ..... 1.000003: tracing_mark_write: B|7|a0_bytes={1,2}
not a record a0=1 a1=0 a0_bytes={83}\r
 app-7 (    7) [000] ..... 1.000004: rt_text: (0x1234) a0=99 a1=1 a0_bytes={104}";
        assert_eq!(cut_byte_args(trace, &events), want);
        let crlf = " a-7 (7) [000] ..... 1.000001: rt_text: (0x1) a0=9 a1=1 a0_bytes={1,2}\r\n";
        assert_eq!(
            cut_byte_args(crlf, &events),
            " a-7 (7) [000] ..... 1.000001: rt_text: (0x1) a0=9 a1=1 a0_bytes={1}\r\n"
        );
        assert_eq!(cut_byte_args("", &events), "");
    }
}
