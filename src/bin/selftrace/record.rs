//! `selftrace record`: set up a [`Session`], run the command, read the trace back, clean up,
//! write the text and JSON traces and the summary.
//!
//! Everything created in tracefs belongs to the [`Session`], which removes it on drop. SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT do not kill the recorder: a handler forwards them to the command
//! (unless the terminal sent them to the whole process group; a second one sends SIGKILL), the
//! recorder waits for the command to end, and then cleans up and writes what was recorded.

use crate::analyze;
use crate::chrome;
use crate::pipe::{self, PipeReader};
use crate::RecordOptions;
use selftrace::tracefs::{self, EventKind, Session};
use selftrace::usdt::{read_probes, ProbeNote};
use selftrace::Error;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The command's pid once it runs (0 before).
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The first stop signal received (0: none).
static STOP: AtomicI32 = AtomicI32::new(0);
/// Whether the first stop signal was sent on to the command (by the handler or by `record`).
static FORWARDED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only atomics, a read of `info` and kill(2): async-signal-safe.
    let previous = STOP.swap(sig, Ordering::SeqCst);
    let child = CHILD.load(Ordering::SeqCst);
    if child <= 0 {
        // Not started yet (or already waited for): `record` forwards STOP once it has a child.
        return;
    }
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t (or null, checked).
    let from_terminal = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    // A second signal forces the command down. A signal from the terminal (Ctrl-C) reached
    // the command already, as it is in the same foreground process group; any other one is
    // sent on, once.
    let forward = if previous != 0 {
        libc::SIGKILL
    } else if !from_terminal && !FORWARDED.swap(true, Ordering::SeqCst) {
        sig
    } else {
        return;
    };
    // SAFETY: kill has no memory-safety preconditions; `child` is our child's pid, which stays
    // reserved (a zombie) until we wait for it.
    unsafe {
        libc::kill(child, forward);
    }
}

/// Sends the stop signal received before the command's pid was known on to the command (once).
fn forward_early_stop(child: u32) {
    let sig = STOP.load(Ordering::SeqCst);
    if sig != 0 && !FORWARDED.swap(true, Ordering::SeqCst) {
        // SAFETY: kill has no memory-safety preconditions; `child` is our unwaited child.
        unsafe {
            libc::kill(child as i32, sig);
        }
    }
}

fn install_stop_handlers() -> Result<(), String> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler has
        // the SA_SIGINFO signature, only touches atomics and calls kill(2), which are
        // async-signal-safe.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(format!("sigaction: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn check_stop() -> Result<(), String> {
    match STOP.load(Ordering::SeqCst) {
        0 => Ok(()),
        sig => Err(format!(
            "interrupted by signal {sig} before the command started"
        )),
    }
}

/// A library error explained for a person at a terminal.
pub fn explain(e: Error) -> String {
    match e {
        Error::PermissionDenied => {
            "permission denied: recording needs root (write access to tracefs and uprobe_events)"
                .into()
        }
        Error::NoTracefs => {
            "tracefs is not mounted (try: mount -t tracefs nodev /sys/kernel/tracing)".into()
        }
        Error::Unsupported(w) => format!("this kernel cannot do it: {w}"),
        Error::AlreadyExists(w) => format!("{w} already exists (left by a crashed recorder?)"),
        other => other.to_string(),
    }
}

/// `CMD` as an absolute path: as given when it contains a `/`, else looked up in `PATH`.
fn resolve_command(cmd: &Path) -> Result<PathBuf, String> {
    let found = if cmd.components().count() > 1 || cmd.is_absolute() {
        Some(cmd.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(cmd))
                .find(|p| p.is_file())
        })
    };
    let p = found.ok_or_else(|| format!("command not found: {}", cmd.display()))?;
    std::fs::canonicalize(&p).map_err(|e| format!("{}: {e}", p.display()))
}

/// The probe sites that the options select, with their files: the command's, and those of
/// every `--lib`.
fn select_probes(o: &RecordOptions, bin: &Path) -> Result<Vec<(PathBuf, ProbeNote)>, String> {
    if o.no_probes {
        return Ok(Vec::new());
    }
    let mut live: Vec<(PathBuf, ProbeNote)> = Vec::new();
    let libs = o.libs.iter().map(PathBuf::from);
    for (i, file) in std::iter::once(bin.to_path_buf()).chain(libs).enumerate() {
        let notes = match read_probes(&file) {
            Ok(n) => n,
            // A script or another non-ELF command: record its markers (and children) anyway.
            Err(e) if i == 0 && o.probes.is_empty() => {
                eprintln!(
                    "selftrace: no USDT probes read from {}: {e}",
                    file.display()
                );
                continue;
            }
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        let file = std::fs::canonicalize(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        for n in notes.into_iter().filter(|n| n.file_offset.is_some()) {
            live.push((file.clone(), n));
        }
    }
    if o.probes.is_empty() {
        return Ok(live);
    }
    let mut out = Vec::new();
    for want in &o.probes {
        let (prov, name) = want
            .split_once(':')
            .ok_or_else(|| format!("--probe {want}: expected PROVIDER:NAME"))?;
        let before = out.len();
        out.extend(
            live.iter()
                .filter(|(_, n)| n.provider == prov && (name == "*" || n.name == name))
                .cloned(),
        );
        if out.len() == before {
            return Err(format!(
                "probe {want} not found in {}{} (see: selftrace list FILE)",
                bin.display(),
                if o.libs.is_empty() {
                    ""
                } else {
                    " or the --lib files"
                },
            ));
        }
    }
    Ok(out)
}

/// What one `--uprobe` spec names.
#[derive(Debug, PartialEq, Eq)]
pub struct UprobeSpec<'a> {
    /// The ELF file; `None`: the command.
    pub path: Option<PathBuf>,
    /// A symbol, or an offset when `offset` is set.
    pub what: &'a str,
    /// The raw file offset of `0xOFFSET`.
    pub offset: Option<u64>,
    /// `%return`.
    pub ret: bool,
    /// Extra fetch arguments.
    pub args: &'a str,
}

/// Parses `[PATH:]SYMBOL[%return] [FETCHARGS]` or `[PATH:]0xOFFSET[%return] [FETCHARGS]`
/// (PATH starts with `/` or `.`).
pub fn parse_uprobe_spec(spec: &str) -> Result<UprobeSpec<'_>, String> {
    let spec = spec.trim();
    let (target, args) = match spec.split_once(char::is_whitespace) {
        Some((t, a)) => (t, a.trim()),
        None => (spec, ""),
    };
    let (path, what) = if target.starts_with('/') || target.starts_with('.') {
        let (p, w) = target
            .split_once(':')
            .ok_or_else(|| format!("--uprobe {spec}: expected PATH:SYMBOL"))?;
        (Some(PathBuf::from(p)), w)
    } else {
        (None, target)
    };
    let (what, ret) = match what.strip_suffix("%return") {
        Some(w) => (w, true),
        None => (what, false),
    };
    if what.is_empty() {
        return Err(format!("--uprobe {spec}: no symbol"));
    }
    let offset = match what.strip_prefix("0x") {
        Some(hex) => {
            Some(u64::from_str_radix(hex, 16).map_err(|_| format!("--uprobe {spec}: bad offset"))?)
        }
        None => None,
    };
    Ok(UprobeSpec {
        path,
        what,
        offset,
        ret,
        args,
    })
}

/// Adds the event of one `--uprobe` spec (see [`parse_uprobe_spec`]).
fn add_uprobe(s: &mut Session, spec: &str, bin: &Path) -> Result<(), String> {
    let UprobeSpec {
        path,
        what,
        offset,
        ret,
        args,
    } = parse_uprobe_spec(spec)?;
    let path = path.unwrap_or_else(|| bin.to_path_buf());
    let r = match offset {
        Some(off) => s.add_offset(&path, off, ret, args).map(|_| ()),
        None => s.add_function(&path, what, ret, args).map(|_| ()),
    };
    r.map_err(|e| match e {
        Error::NotFound("symbol") => {
            format!(
                "--uprobe {spec}: symbol {what} not found in {}",
                path.display()
            )
        }
        Error::InvalidInput(w) if w.starts_with("symbol name matches several") => {
            let names = tracefs::find_functions(&path, what)
                .map(|v| {
                    v.into_iter()
                        .map(|f| f.demangled)
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            format!("--uprobe {spec}: {what} matches several functions: {names}")
        }
        other => format!("--uprobe {spec}: {}", explain(other)),
    })
}

/// Runs `selftrace record`; returns the exit code (the command's, or 128 + its signal).
pub fn record(o: RecordOptions) -> Result<i32, String> {
    install_stop_handlers()?;
    let bin = resolve_command(Path::new(&o.command[0]))?;
    let probes = select_probes(&o, &bin)?;

    let mut session =
        Session::with_options("selftrace-record", true, o.buffer_kb).map_err(explain)?;
    for (file, note) in &probes {
        if let Err(e) = session.add_probe(file, note) {
            let msg = format!("probe {}:{}: {}", note.provider, note.name, explain(e));
            if o.probes.is_empty() && matches!(e, Error::Unsupported(_)) {
                // Recording every probe: one the kernel cannot fetch is skipped, not fatal.
                eprintln!("selftrace: skipping {msg}");
            } else {
                return Err(msg);
            }
        }
    }
    for spec in &o.uprobes {
        add_uprobe(&mut session, spec, &bin)?;
    }
    let inst = session.instance();
    if !inst.copies_markers() {
        eprintln!("selftrace: this kernel cannot copy trace markers into an instance (6.17+); markers are not recorded");
    }
    inst.set_event_enabled("sched", "sched_process_fork", true)
        .map_err(explain)?;
    if o.sched {
        inst.set_event_enabled("sched", "sched_switch", true)
            .map_err(explain)?;
    }
    // Events of this process and of every task it creates from now on: the command and its
    // children and threads.
    session
        .filter_pids(&[std::process::id()], true)
        .map_err(explain)?;
    // Consumed while the command runs; declared after the session, so dropped (stopped,
    // closed) before it on every path.
    let reader = PipeReader::start(&session.instance().file("trace_pipe"))
        .map_err(|e| format!("cannot read the instance's trace_pipe: {e}"))?;
    session.enable().map_err(explain)?;
    check_stop()?;

    let mut child = std::process::Command::new(&o.command[0])
        .args(&o.command[1..])
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let pid = child.id();
    CHILD.store(pid as i32, Ordering::SeqCst);
    // A signal that came while spawning (the handler did not know the pid yet).
    forward_early_stop(pid);
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the command: {e}"))?;
    CHILD.store(0, Ordering::SeqCst);

    // Stop copying markers, read what is left, and clean up tracefs before writing any file.
    let _ = session.disable();
    let _ = session
        .instance()
        .write_file("options/copy_trace_marker", "0");
    let streamed = reader.finish();
    let header = session.instance().read_trace().unwrap_or_default();
    let (raw, lost) = pipe::assemble(&header, &String::from_utf8_lossy(&streamed));
    if lost > 0 {
        eprintln!("selftrace: warning: the kernel dropped {lost} events (raise --buffer-kb)");
    }
    let events = session.events().to_vec();
    let group = session.group().to_string();
    drop(session);
    if let Ok(root) = tracefs::root() {
        let left = std::fs::read_to_string(root.join("uprobe_events")).unwrap_or_default();
        if left.contains(&format!(":{group}/")) {
            eprintln!("selftrace: warning: could not remove every uprobe event of {group}");
        }
    }

    let tree = analyze::process_tree(&raw, pid);
    let text = analyze::filter_trace(&raw, &tree);
    std::fs::write(&o.output, &text)
        .map_err(|e| format!("cannot write {}: {e}", o.output.display()))?;
    let mut json_path = o.output.clone().into_os_string();
    json_path.push(".json");
    let json_path = PathBuf::from(json_path);
    std::fs::write(&json_path, chrome::chrome_json(&text, &events))
        .map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;

    let code = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    };
    if !o.quiet {
        let markers = tracefs::markers(&text);
        let mut sections = analyze::sections(&markers);
        sections.extend(analyze::function_calls(&text, &events));
        let mut hits: BTreeMap<String, usize> = BTreeMap::new();
        for e in &events {
            hits.entry(e.label.clone()).or_insert(0);
        }
        for r in tracefs::records(&text) {
            if let Some(e) = events.iter().find(|e| e.event == r.event) {
                *hits.entry(e.label.clone()).or_insert(0) += 1;
            }
        }
        let lines = tracefs::records(&text).count();
        let ended = match (status.code(), ExitStatusExt::signal(&status)) {
            (Some(c), _) => format!("command exited with status {c}"),
            (None, Some(sig)) => format!("command killed by signal {sig}"),
            _ => format!("command ended: {status}"),
        };
        let how = match STOP.load(Ordering::SeqCst) {
            0 => ended,
            s => format!("recorder interrupted by signal {s}; {ended}"),
        };
        eprintln!(
            "selftrace record: {how}; {lines} events from {} tasks; {} probe events, {} function uprobes",
            tree.len(),
            events.iter().filter(|e| e.kind == EventKind::Probe).count(),
            events.iter().filter(|e| e.kind != EventKind::Probe).count(),
        );
        eprintln!(
            "wrote {} (ftrace text: ui.perfetto.dev) and {} (Chrome JSON)\n",
            o.output.display(),
            json_path.display()
        );
        eprint!("{}", analyze::summary(&sections, &hits));
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uprobe_specs() {
        let s = parse_uprobe_spec("compute").unwrap();
        assert_eq!(
            (s.path, s.what, s.offset, s.ret, s.args),
            (None, "compute", None, false, "")
        );
        let s = parse_uprobe_spec("app::parse%return").unwrap();
        assert_eq!((s.what, s.ret), ("app::parse", true));
        let s = parse_uprobe_spec("/lib/libc.so.6:free p=%di:x64 q=%si:u64").unwrap();
        assert_eq!(s.path, Some(PathBuf::from("/lib/libc.so.6")));
        assert_eq!((s.what, s.args), ("free", "p=%di:x64 q=%si:u64"));
        let s = parse_uprobe_spec("./app:0x1f40%return").unwrap();
        assert_eq!((s.what, s.offset, s.ret), ("0x1f40", Some(0x1f40), true));
        assert!(parse_uprobe_spec("/lib/libc.so.6").is_err());
        assert!(parse_uprobe_spec("0xzz").is_err());
        assert!(parse_uprobe_spec("%return").is_err());
    }
}
