//! Uprobe events (`<tracefs>/uprobe_events`): attach the kernel to a USDT probe (with its
//! semaphore as the reference counter) or to any file offset, removed on drop.
//!
//! ```no_run
//! use selftrace::tracefs::{uprobe::UprobeEvent, Instance};
//! use selftrace::usdt::read_probes;
//! let exe = std::env::current_exe().unwrap();
//! let note = read_probes(&exe)?.into_iter().find(|n| n.name == "request").unwrap();
//! let group = format!("myapp_{}", std::process::id());
//! let event = UprobeEvent::for_probe(&group, "request", &exe, &note)?;
//! let inst = Instance::create("myapp")?;
//! inst.set_event_enabled(event.group(), event.event(), true)?;
//! // ... hits appear in inst.read_trace()
//! # Ok::<(), selftrace::tracefs::Error>(())
//! ```
//!
//! `uprobe_events` is global to the machine: use a group name of your own (with the pid), and
//! enable events in a private [`Instance`](super::Instance).
//!
//! When the kernel refuses a command, the [`Error`] names the event and `uprobe_events` and
//! carries the kernel's reason ([`Error::kernel_message`]): the `error_log` entry with the
//! word it points at, or the event already on the same address.

use super::{root, Error};
use crate::error::Error as Kind;
use crate::usdt::{ArgSpec, ProbeNote};
use std::io::Write;
use std::path::Path;

/// A uprobe event `GROUP/EVENT`, registered in `uprobe_events` and removed on drop (also while
/// a panic unwinds). It must be disabled everywhere before removal; dropping the
/// [`Instance`](super::Instance) that enabled it does that, so drop the instance first.
#[must_use = "the event is removed when this is dropped"]
#[derive(Debug)]
pub struct UprobeEvent {
    group: String,
    event: String,
    removed: bool,
}

/// `s` (the `label`: `group`, `event`) as a name the kernel takes, else `what` is wrong.
fn check_name(s: &str, label: &'static str, what: &'static str) -> Result<(), Error> {
    if s.is_empty()
        || s.len() > 64
        || s.starts_with(|c: char| c.is_ascii_digit())
        || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(Error::new(Kind::InvalidInput(what)).with_subject(label, s));
    }
    Ok(())
}

/// Writes the command `line` (for the event `id`, `GROUP/EVENT`) to `uprobe_events`; a refusal
/// carries the kernel's reason (see [`explain_failure`]).
fn write_uprobe_events(line: &str, id: &str) -> Result<(), Error> {
    let path = root()?.join("uprobe_events");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| {
            Error::io("opening", &path, "open", "uprobe_events", e).with_subject("event", id)
        })?;
    // One write per command: the kernel parses each write as one line.
    f.write_all(line.as_bytes()).map_err(|e| {
        Error::io("writing", &path, "write", "uprobe_events", e)
            .with_subject("event", id)
            .with_kernel_message(explain_failure(line.trim_end()))
    })
}

/// Why the kernel refused the `uprobe_events` command `cmd`: its `error_log` entry for that
/// command (message and the word the caret points at), or an existing event on the same
/// `path:0xoffset` (the kernel refuses a second reference counter for one address), in the
/// group of `cmd` (the caller's own) or another (another recorder's).
fn explain_failure(cmd: &str) -> Option<String> {
    let root = root().ok()?;
    if let Ok(log) = std::fs::read_to_string(root.join("error_log")) {
        if let Some(why) = error_log_entry(&log, cmd) {
            return Some(why);
        }
    }
    // p:GROUP/EVENT PATH:0xOFF(0xREF) ...; the list pads offsets with zeros.
    let place = |t: &str| -> Option<(String, u64)> {
        let t = t.split('(').next()?;
        let (path, off) = t.rsplit_once(':')?;
        let off = u64::from_str_radix(off.strip_prefix("0x")?, 16).ok()?;
        Some((path.to_string(), off))
    };
    let at = place(cmd.split_whitespace().nth(1)?)?;
    let list = std::fs::read_to_string(root.join("uprobe_events")).ok()?;
    let other = list.lines().find(|l| {
        l.split_whitespace()
            .nth(1)
            .and_then(place)
            .is_some_and(|p| p == at)
    })?;
    let id = other.split_whitespace().next()?.get(2..)?;
    /// The group of an event id `GROUP/EVENT`.
    fn group_of(id: &str) -> Option<&str> {
        id.split_once('/').map(|(g, _)| g)
    }
    // The command's event id is its first word after `p:`.
    let ours = group_of(id).is_some()
        && group_of(cmd.split_whitespace().next()?.get(2..)?) == group_of(id);
    Some(format!(
        "{}:0x{:x} is already probed by the uprobe event {id} ({}): the kernel allows one \
         reference counter per address; {}",
        at.0,
        at.1,
        other.split_whitespace().nth(1).unwrap_or(""),
        if ours {
            "that event is this session's own (a USDT probe's: its semaphore is the reference \
             counter; a uprobe on the same address has none)"
        } else {
            "another recorder may be using it"
        }
    ))
}

/// The last `error_log` entry whose `Command:` is `cmd`: `MESSAGE (at 'WORD')`.
pub(crate) fn error_log_entry(log: &str, cmd: &str) -> Option<String> {
    let lines: Vec<&str> = log.lines().collect();
    for i in (1..lines.len()).rev() {
        let Some(c) = lines[i].trim_start().strip_prefix("Command: ") else {
            continue;
        };
        if c.trim_end() != cmd {
            continue;
        }
        let msg = lines[i - 1].split_once("error: ").map(|(_, m)| m.trim())?;
        // The caret line points at the failing word of the command.
        let word = lines.get(i + 1).and_then(|caret| {
            let col = caret.find('^')?;
            let start = lines[i].find("Command: ")? + "Command: ".len();
            let rest = lines[i].get(col.checked_sub(start).map(|_| col)?..)?;
            rest.split_whitespace().next()
        });
        return Some(match word {
            Some(w) => format!("{msg} at '{w}'"),
            None => msg.to_string(),
        });
    }
    None
}

/// The kernel's name for a register as written in a note: x86-64's (`%rdi`, `%edi`, `%r8d`:
/// `%di`, `%r8`) or aarch64's (`x0`, `w3`, `sp`: `%x0`, `%x3`, `%sp`).
fn kernel_register(reg: &str) -> Option<String> {
    let Some(r) = reg.strip_prefix('%') else {
        return aarch64_register(reg);
    };
    let base = match r {
        "rax" | "eax" | "ax" | "al" => "ax",
        "rbx" | "ebx" | "bx" | "bl" => "bx",
        "rcx" | "ecx" | "cx" | "cl" => "cx",
        "rdx" | "edx" | "dx" | "dl" => "dx",
        "rsi" | "esi" | "si" | "sil" => "si",
        "rdi" | "edi" | "di" | "dil" => "di",
        "rbp" | "ebp" | "bp" | "bpl" => "bp",
        "rsp" | "esp" | "sp" | "spl" => "sp",
        "rip" => "ip",
        _ => {
            let n = r.strip_prefix('r')?;
            let n = n.trim_end_matches(['d', 'w', 'b']);
            let v: u8 = n.parse().ok()?;
            if !(8..=15).contains(&v) {
                return None;
            }
            return Some(format!("%r{v}"));
        }
    };
    Some(format!("%{base}"))
}

/// An aarch64 register of a note (`x0`-`x30`, their 32-bit names `w0`-`w30`, `sp`) by the
/// arm64 kernel's name for it (`%x0`, `%sp`).
fn aarch64_register(reg: &str) -> Option<String> {
    if reg == "sp" || reg == "wsp" {
        return Some("%sp".into());
    }
    let n = reg.strip_prefix('x').or_else(|| reg.strip_prefix('w'))?;
    let v: u8 = n.parse().ok()?;
    (v <= 30 && !n.starts_with('0') || n == "0").then(|| format!("%x{v}"))
}

/// A note argument's location: a register, a register plus an offset (memory), or an
/// immediate; in x86-64's AT&T syntax (`%rdi`, `8(%rax)`, `$5`) or aarch64's (`x0`, `[x1, 8]`,
/// `5`).
enum Location {
    /// The kernel's name for the register.
    Register(String),
    /// The memory at the register (kernel name) plus the offset.
    Memory(i64, String),
    /// A constant.
    Immediate(i64),
}

impl Location {
    fn parse(loc: &str) -> Option<Location> {
        if loc.starts_with('%') {
            return kernel_register(loc).map(Location::Register);
        }
        if let Some(imm) = loc.strip_prefix('$') {
            return imm.parse().ok().map(Location::Immediate);
        }
        // aarch64: [reg] or [reg, offset] (sys/sdt.h writes the offset in decimal, perhaps
        // after `#`).
        if let Some(inner) = loc.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let (reg, off) = match inner.split_once(',') {
                Some((r, o)) => {
                    let o = o.trim();
                    let o = o.strip_prefix('#').unwrap_or(o);
                    (r.trim(), o.parse().ok()?)
                }
                None => (inner.trim(), 0),
            };
            return aarch64_register(reg).map(|r| Location::Memory(off, r));
        }
        if let Some(r) = aarch64_register(loc) {
            return Some(Location::Register(r));
        }
        if let Ok(v) = loc.strip_prefix('#').unwrap_or(loc).parse() {
            return Some(Location::Immediate(v));
        }
        // x86-64: OFFSET(%reg)
        let (off, rest) = loc.split_once('(')?;
        let reg = rest.strip_suffix(')')?;
        let off: i64 = if off.is_empty() { 0 } else { off.parse().ok()? };
        kernel_register(reg).map(|r| Location::Memory(off, r))
    }
}

/// How many bytes of a `&str` / `&[u8]` probe argument a uprobe fetches (the kernel's limit for
/// an array fetch argument is 64 elements); longer text is cut and marked.
pub const BYTES_FETCHED: usize = 64;

/// The pointer-and-length pairs of `note` (`8@0(%reg) 8@8(%reg)`, on aarch64
/// `8@[reg] 8@[reg, 8]`: what selftrace's probes emit
/// for `&str`, `&[u8]`, `String` and `Vec<u8>`): the pointer's argument index and the kernel's
/// name for the register.
pub fn byte_pairs(note: &ProbeNote) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let a = &note.arguments;
    let mut i = 0;
    while i + 1 < a.len() {
        let (p, l) = (&a[i], &a[i + 1]);
        let sized = p.size == 8 && l.size == 8 && !p.signed && !l.signed;
        match (Location::parse(&p.location), Location::parse(&l.location)) {
            (Some(Location::Memory(0, r)), Some(Location::Memory(8, r2))) if sized && r == r2 => {
                out.push((i, r));
                i += 2;
            }
            _ => i += 1,
        }
    }
    out
}

/// A note argument as the note writes it: `-4@%edi`.
fn arg_spec(arg: &ArgSpec) -> String {
    format!(
        "{}{}@{}",
        if arg.signed { "-" } else { "" },
        arg.size,
        arg.location
    )
}

/// The `uprobe_events` fetch argument for one note argument: `%di:s32`, `+8(%r9):u64`.
///
/// # Errors
/// [`Unsupported`](Kind::Unsupported)`("probe argument location")` for a location the kernel
/// cannot fetch (`%xmm0`), with the argument as the note writes it (`8@%xmm0`) as detail.
pub fn fetch_arg(arg: &ArgSpec) -> Result<String, Error> {
    let ty = format!(
        "{}{}",
        if arg.signed { 's' } else { 'u' },
        arg.size as u32 * 8
    );
    match Location::parse(&arg.location) {
        Some(Location::Register(r)) => Ok(format!("{r}:{ty}")),
        Some(Location::Immediate(v)) => Ok(format!("\\{v}:{ty}")),
        Some(Location::Memory(off, r)) => Ok(format!("{off:+}({r}):{ty}")),
        None => {
            Err(Error::new(Kind::Unsupported("probe argument location")).with_detail(arg_spec(arg)))
        }
    }
}

impl UprobeEvent {
    /// Registers `p:GROUP/EVENT PATH:0xOFFSET[(0xREF_CTR)] ARGS` in `uprobe_events`. `args`
    /// are fetch arguments (`name=%di:s32 ...`), possibly empty.
    ///
    /// # Errors
    /// [`InvalidInput`](Kind::InvalidInput), before anything is written, for a `group` or
    /// `event` that is not 1-64 ASCII letters, digits or `_` not starting with a digit (naming
    /// it), for a `path` that is not absolute UTF-8 without spaces, tabs, newlines or `:`, and
    /// for `args` with a newline (naming `path` and the event); those of
    /// [`tracefs::root`](super::root); and, naming `uprobe_events` and the event
    /// (`GROUP/EVENT`), when opening or writing `uprobe_events` fails, by errno:
    /// [`NotFound`](Kind::NotFound)`("uprobe_events")` (`ENOENT`, `ENOTDIR`),
    /// [`PermissionDenied`](Kind::PermissionDenied) (`EACCES`, `EPERM`: typically not root),
    /// [`AlreadyExists`](Kind::AlreadyExists)`("uprobe_events")` (`EEXIST`), else
    /// [`Sys`](Kind::Sys) with the call (`open`, or `write` for a command the kernel refuses).
    /// A failed write carries the kernel's reason in
    /// [`kernel_message`](Error::kernel_message) when one is found: its `error_log` entry, or
    /// the event already on the same address.
    pub fn create(
        group: &str,
        event: &str,
        path: &Path,
        offset: u64,
        ref_ctr_offset: Option<u64>,
        args: &str,
    ) -> Result<UprobeEvent, Error> {
        Self::register('p', group, event, path, offset, ref_ctr_offset, args)
    }

    /// Registers a return probe `r:GROUP/EVENT PATH:0xOFFSET ARGS`: it fires when the function
    /// that starts at `offset` returns (`args` may fetch `$retval`).
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub fn create_return(
        group: &str,
        event: &str,
        path: &Path,
        offset: u64,
        args: &str,
    ) -> Result<UprobeEvent, Error> {
        Self::register('r', group, event, path, offset, None, args)
    }

    fn register(
        kind: char,
        group: &str,
        event: &str,
        path: &Path,
        offset: u64,
        ref_ctr_offset: Option<u64>,
        args: &str,
    ) -> Result<UprobeEvent, Error> {
        check_name(
            group,
            "group",
            "uprobe group must be 1-64 ascii letters, digits or '_'",
        )?;
        check_name(
            event,
            "event",
            "uprobe event must be 1-64 ascii letters, digits or '_'",
        )?;
        let id = format!("{group}/{event}");
        let refuse = |what| {
            Error::new(Kind::InvalidInput(what))
                .with_op("attaching to")
                .with_path(path)
                .with_subject("event", &id)
        };
        let path = path
            .to_str()
            .filter(|p| p.starts_with('/') && !p.contains([' ', '\n', ':', '\t']))
            .ok_or_else(|| refuse("uprobe path must be absolute utf-8 without spaces or ':'"))?;
        if args.contains('\n') {
            return Err(refuse("uprobe arguments contain a newline"));
        }
        let refctr = ref_ctr_offset
            .map(|r| format!("(0x{r:x})"))
            .unwrap_or_default();
        write_uprobe_events(
            &format!("{kind}:{id} {path}:0x{offset:x}{refctr} {args}\n"),
            &id,
        )?;
        Ok(UprobeEvent {
            group: group.to_string(),
            event: event.to_string(),
            removed: false,
        })
    }

    /// Registers a uprobe on the USDT probe site `note` of the file `path` (from
    /// [`read_probes`](crate::usdt::read_probes)), with the probe's semaphore as reference
    /// counter and one fetch argument `aN` per probe argument, with its size and sign.
    ///
    /// # Errors
    /// [`BadElf`](Kind::BadElf)`("probe address outside every PT_LOAD")` when `note` has no
    /// [`file_offset`](ProbeNote::file_offset), [`Unsupported`](Kind::Unsupported) for an
    /// argument the kernel cannot fetch (see [`fetch_arg`]; the detail names the argument
    /// `aN`), both naming `path` and the event; else those of [`create`](Self::create).
    pub fn for_probe(
        group: &str,
        event: &str,
        path: &Path,
        note: &ProbeNote,
    ) -> Result<UprobeEvent, Error> {
        let fail = |e: Error| {
            e.with_op("attaching to")
                .with_path(path)
                .with_subject("event", format!("{group}/{event}"))
        };
        let offset = note.file_offset.ok_or_else(|| {
            fail(Error::new(Kind::BadElf(
                "probe address outside every PT_LOAD",
            )))
        })?;
        let mut args = String::new();
        for (i, a) in note.arguments.iter().enumerate() {
            if i > 0 {
                args.push(' ');
            }
            let fetch = fetch_arg(a)
                .map_err(|e| fail(e).with_detail(format!("{} (argument a{i})", arg_spec(a))))?;
            args.push_str(&format!("a{i}={fetch}"));
        }
        // A `&str` / `&[u8]` argument of a selftrace probe is a pointer and a length in the 16
        // bytes one register points to (`8@0(%reg) 8@8(%reg)`): also fetch the first
        // BYTES_FETCHED bytes it points to, decoded up to the length by `parse_hit_body`.
        for (i, r) in byte_pairs(note) {
            args.push_str(&format!(" a{i}_bytes=+0(+0({r})):u8[{BYTES_FETCHED}]"));
        }
        Self::create(group, event, path, offset, note.semaphore_offset, &args)
    }

    /// The event's group (its `events/` subdirectory).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The event's name.
    pub fn event(&self) -> &str {
        &self.event
    }
}

impl UprobeEvent {
    /// Removes the event now (it must be disabled everywhere); `false` if the kernel refused
    /// (then dropping it tries again).
    pub fn remove_now(&mut self) -> bool {
        if !self.removed {
            let id = format!("{}/{}", self.group, self.event);
            self.removed = write_uprobe_events(&format!("-:{id}\n"), &id).is_ok();
        }
        self.removed
    }
}

impl Drop for UprobeEvent {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        // Disabled at the top level too, in case someone enabled it there; instances that
        // enabled it must be gone already.
        if let Ok(r) = root() {
            let enable = r
                .join("events")
                .join(&self.group)
                .join(&self.event)
                .join("enable");
            let _ = std::fs::write(enable, "0");
        }
        let id = format!("{}/{}", self.group, self.event);
        let _ = write_uprobe_events(&format!("-:{id}\n"), &id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(s: &str) -> String {
        fetch_arg(&ArgSpec::parse(s).unwrap()).unwrap()
    }

    #[test]
    fn fetch_args() {
        assert_eq!(arg("-4@%edi"), "%di:s32");
        assert_eq!(arg("8@%rax"), "%ax:u64");
        assert_eq!(arg("-1@%r9"), "%r9:s8");
        assert_eq!(arg("2@%r10d"), "%r10:u16");
        assert_eq!(arg("8@8(%r9)"), "+8(%r9):u64");
        assert_eq!(arg("-4@-20(%rbp)"), "-20(%bp):s32");
        assert_eq!(arg("-4@$5"), "\\5:s32");
        assert!(fetch_arg(&ArgSpec::parse("8@%xmm0").unwrap()).is_err());
        // aarch64, as sys/sdt.h and selftrace's probes write it there.
        assert_eq!(arg("8@x0"), "%x0:u64");
        assert_eq!(arg("-4@w3"), "%x3:s32");
        assert_eq!(arg("-4@[sp, 16]"), "+16(%sp):s32");
        assert_eq!(arg("8@[x19]"), "+0(%x19):u64");
        assert_eq!(arg("8@[x29, -8]"), "-8(%x29):u64");
        assert_eq!(arg("-8@-5"), "\\-5:s64");
        assert!(fetch_arg(&ArgSpec::parse("8@x31").unwrap()).is_err());
        assert!(fetch_arg(&ArgSpec::parse("8@x01").unwrap()).is_err());
        assert!(fetch_arg(&ArgSpec::parse("8@[q0]").unwrap()).is_err());
    }

    #[test]
    fn error_log_entries() {
        let cmd_line = "  Command: p:g/x /bin/true:0x1000 x=%zz";
        let caret = format!("{}^", " ".repeat(cmd_line.find("%zz").unwrap()));
        let log = format!(
            "[ 1066.037570] trace_uprobe: error: Invalid register name\n{cmd_line}\n{caret}\n"
        );
        let log = log.as_str();
        assert_eq!(
            error_log_entry(log, "p:g/x /bin/true:0x1000 x=%zz").as_deref(),
            Some("Invalid register name at '%zz'")
        );
        assert_eq!(error_log_entry(log, "p:g/y /bin/true:0x1000"), None);
    }

    #[test]
    fn bad_names() {
        let p = Path::new("/bin/true");
        assert!(UprobeEvent::create("a b", "e", p, 0, None, "").is_err());
        assert!(UprobeEvent::create("g", "e\n", p, 0, None, "").is_err());
        assert!(UprobeEvent::create("g", "e", Path::new("rel"), 0, None, "").is_err());
    }
}
