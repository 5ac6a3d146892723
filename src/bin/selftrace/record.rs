//! `selftrace record`: set up a [`Session`], run the command, read the trace back, clean up,
//! write the text and JSON traces and the summary.
//!
//! Everything created in tracefs belongs to the [`Session`], which removes it on drop. SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT do not kill the recorder: a handler forwards them to the helper
//! that runs the command (unless the terminal sent them to the whole process group), which
//! sends the first on to the command and kills the command's whole tree on the second (see
//! supervise.rs); the recorder waits for the command to end, and then cleans up and writes what
//! was recorded. The output files are created before anything is recorded (output.rs). No
//! file gets a byte that the kernel fetched past a `&str` / `&[u8]` probe argument: the trace
//! is cut ([`tracefs::cut_byte_args`]) as soon as it is assembled.
#![allow(unsafe_code)]

use crate::analyze;
use crate::chrome;
use crate::output::Output;
use crate::pipe::{self, PipeReader};
use crate::RecordOptions;
use selftrace::tracefs::{self, EventKind, Session};
use selftrace::usdt::{read_probes, ProbeNote};
use selftrace::Error;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

/// The helper's pid once it runs (0 before).
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The first stop signal received (0: none).
static STOP: AtomicI32 = AtomicI32::new(0);
/// Stop signals received before the helper's pid was known (not from the terminal).
static EARLY: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only atomics, a read of `info` and kill(2): async-signal-safe.
    let _ = STOP.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t (or null, checked).
    let from_terminal = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    // A signal from the terminal reached the helper and the command already, as they are in
    // the same foreground process group.
    if from_terminal {
        return;
    }
    let child = CHILD.load(Ordering::SeqCst);
    if child <= 0 {
        // Not started yet: `record` sends these on once it has the helper.
        EARLY.fetch_add(1, Ordering::SeqCst);
        return;
    }
    // SAFETY: kill has no memory-safety preconditions; `child` is our child's pid, which stays
    // reserved (a zombie) until we wait for it.
    unsafe {
        libc::kill(child, sig);
    }
}

/// Sends the stop signals received before the helper's pid was known on to it.
fn forward_early_stop(child: u32) {
    let sig = STOP.load(Ordering::SeqCst);
    let n = EARLY.swap(0, Ordering::SeqCst).min(2);
    for _ in 0..n {
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

/// A library error explained for a person at a terminal: everything it says (the file, the
/// event, the kernel's reason, an errno that adds to it; see [`crate::describe`]) and, for a
/// few kinds, what to do about it.
pub fn explain(e: &tracefs::Error) -> String {
    let mut msg = crate::describe(e);
    if let Some(hint) = hint(e.kind()) {
        msg.push_str(hint);
    }
    msg
}

/// What to do about an error of kind `kind`, appended to its message.
fn hint(kind: Error) -> Option<&'static str> {
    match kind {
        Error::PermissionDenied => {
            Some(": recording needs root (write access to tracefs and uprobe_events)")
        }
        Error::NoTracefs => Some(" (try: mount -t tracefs nodev /sys/kernel/tracing)"),
        Error::AlreadyExists(_) => Some(" (left by a crashed recorder?)"),
        _ => None,
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
                    "selftrace: warning: recording no USDT probes: {}",
                    crate::describe(&e)
                );
                continue;
            }
            Err(e) => return Err(crate::describe(&e)),
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
    // The error names the file, the symbol or event, and the kernel's reason (and lists the
    // functions a name matches several of).
    r.map_err(|e| match e.kind() {
        Error::NotFound("symbol") => {
            format!(
                "--uprobe {spec}: symbol {what} not found in {}",
                path.display()
            )
        }
        _ => format!("--uprobe {spec}: {}", explain(&e)),
    })
}

/// Everything `record` needs before it reads any file: root (write access to `uprobe_events`),
/// tracefs, uprobe events. Checked first, so that an unprivileged user gets this message and
/// not whatever a file they cannot read would say.
fn preflight() -> Result<(), String> {
    let root = tracefs::root().map_err(|e| explain(&e))?;
    let events = root.join("uprobe_events");
    let c = std::ffi::CString::new(events.as_os_str().as_encoded_bytes())
        .map_err(|_| "tracefs path contains a nul byte".to_string())?;
    // SAFETY: access(2) on a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        let kind = match e.raw_os_error() {
            Some(libc::ENOENT) => {
                Error::Unsupported("kernel without uprobe events (CONFIG_UPROBE_EVENTS)")
            }
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => Error::PermissionDenied,
            _ => return Err(format!("cannot use {}: {e}", events.display())),
        };
        return Err(format!(
            "{}: {kind}{}",
            events.display(),
            hint(kind).unwrap_or("")
        ));
    }
    Ok(())
}

/// `--buffer-kb` against the memory available: the kernel allocates it on every CPU.
fn check_buffer_memory(kib: u32) -> Result<(), String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    // Possible CPUs can be more than the online ones; the kernel allocates for each.
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .rsplit(['-', ','])
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
        .map_or(cpus, |last| last + 1);
    let avail_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
    });
    let need = u64::from(kib) * possible;
    if let Some(avail) = avail_kib {
        if need > avail / 2 {
            return Err(format!(
                "--buffer-kb {kib}: {kib} KiB per CPU x {possible} CPUs = {} MiB, more than half \
                 the memory available ({} MiB)",
                need / 1024,
                avail / 1024
            ));
        }
    }
    Ok(())
}

/// Starts the command through the helper (supervise.rs); returns the helper and the command's
/// pid.
fn spawn_supervised(o: &RecordOptions, bin: &Path) -> Result<(std::process::Child, u32), String> {
    use std::os::unix::process::CommandExt as _;
    let pipe = || -> Result<(i32, i32), String> {
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 with a valid 2-element out-array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(format!("pipe: {}", std::io::Error::last_os_error()));
        }
        Ok((fds[0], fds[1]))
    };
    // The recorder keeps `death_w` until it exits: the helper sees end-of-file when it dies.
    let (death_r, death_w) = pipe()?;
    let (pid_r, pid_w) = pipe()?;
    // Never closed: its end-of-file is the recorder's death.
    let _ = death_w;
    let me = std::env::current_exe().map_err(|e| format!("cannot find selftrace itself: {e}"))?;
    let mut cmd = std::process::Command::new(me);
    cmd.arg(crate::supervise::SUBCOMMAND)
        .arg(death_r.to_string())
        .arg(pid_w.to_string())
        .arg("--")
        .args(&o.command);
    // SAFETY: between fork and exec only fcntl(2) on two fd numbers, async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            for fd in [death_r, pid_w] {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    // SAFETY: closing our copies of the helper's ends.
    unsafe {
        libc::close(death_r);
        libc::close(pid_w);
    }
    let child = spawned.map_err(|e| format!("cannot start the recorder's helper: {e}"))?;
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    forward_early_stop(child.id());
    let mut b = [0u8; 4];
    // SAFETY: read(2) into a 4-byte stack buffer; the helper writes 4 bytes and closes.
    let n = unsafe { libc::read(pid_r, b.as_mut_ptr().cast(), b.len()) };
    // SAFETY: our fd.
    unsafe { libc::close(pid_r) };
    let v = i32::from_le_bytes(b);
    if n != 4 || v <= 0 {
        let why = if n == 4 {
            std::io::Error::from_raw_os_error(-v).to_string()
        } else {
            "the helper did not start it".to_string()
        };
        let mut child = child;
        let _ = child.wait();
        CHILD.store(0, Ordering::SeqCst);
        return Err(format!("cannot run {}: {why}", bin.display()));
    }
    Ok((child, v as u32))
}

/// Runs `selftrace record`; returns the exit code (the command's, or 128 + its signal).
pub fn record(o: RecordOptions) -> Result<i32, String> {
    install_stop_handlers()?;
    preflight()?;
    check_buffer_memory(o.buffer_kb)?;
    // Both outputs exist (as temporary files) before anything runs.
    let json_path = o
        .json
        .clone()
        .unwrap_or_else(|| crate::json_name(&o.output));
    let text_out = Output::create(&o.output)?;
    let json_out = Output::create(&json_path)?;
    let bin = resolve_command(Path::new(&o.command[0]))?;
    let probes = select_probes(&o, &bin)?;

    let mut session =
        Session::with_options("selftrace-record", true, o.buffer_kb).map_err(|e| {
            match e.kind() {
                Error::Sys {
                    errno: libc::ENOMEM,
                    ..
                } => format!(
                    "--buffer-kb {}: the kernel cannot allocate {} KiB per CPU ({})",
                    o.buffer_kb,
                    o.buffer_kb,
                    explain(&e)
                ),
                _ => explain(&e),
            }
        })?;
    for (file, note) in &probes {
        if let Err(e) = session.add_probe(file, note) {
            let msg = format!("probe {}:{}: {}", note.provider, note.name, explain(&e));
            if o.probes.is_empty() && matches!(e.kind(), Error::Unsupported(_)) {
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
        .map_err(|e| explain(&e))?;
    if o.sched {
        inst.set_event_enabled("sched", "sched_switch", true)
            .map_err(|e| explain(&e))?;
    }
    // Events of this process and of every task it creates from now on: the helper, the command
    // and its children and threads.
    session
        .filter_pids(&[std::process::id()], true)
        .map_err(|e| explain(&e))?;
    // Consumed while the command runs; declared after the session, so dropped (stopped,
    // closed) before it on every path.
    let reader = PipeReader::start(&session.instance().file("trace_pipe"))
        .map_err(|e| format!("cannot read the instance's trace_pipe: {e}"))?;
    session.enable().map_err(|e| explain(&e))?;
    check_stop()?;

    let (mut helper, pid) = spawn_supervised(&o, &bin)?;
    let status = helper
        .wait()
        .map_err(|e| format!("waiting for the command: {e}"))?;
    CHILD.store(0, Ordering::SeqCst);

    // Stop copying markers, read what is left, and clean up tracefs before writing any file.
    let _ = session.disable();
    let _ = session
        .instance()
        .write_file("options/copy_trace_marker", "0");
    let streamed = reader.finish();
    let dropped = session.dropped_events().unwrap_or(0);
    let header = session.instance().read_trace().unwrap_or_default();
    let (raw, lost) = pipe::assemble(&header, &String::from_utf8_lossy(&streamed));
    drop(streamed);
    // The bytes the kernel fetched past each `&str` / `&[u8]` argument (whatever memory
    // follows it: a token, a password) go no further than this.
    let raw = tracefs::cut_byte_args(&raw, session.events());
    let lost = lost.max(dropped);
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
    text_out.commit(text.as_bytes())?;
    json_out.commit(chrome::chrome_json(&text, &events).as_bytes())?;

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
        // Lines no parser could read are said, not skipped silently.
        let unparsed = tracefs::unparsed(&text);
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
            "selftrace record: {how}; {lines} events from {} tasks; {} probe events, {} function uprobes; {lost} events dropped by the kernel",
            tree.len(),
            events.iter().filter(|e| e.kind == EventKind::Probe).count(),
            events.iter().filter(|e| e.kind != EventKind::Probe).count(),
        );
        eprintln!(
            "{}wrote {} (ftrace text: ui.perfetto.dev) and {} (Chrome JSON)\n",
            if unparsed.is_empty() {
                String::new()
            } else {
                format!("selftrace record: left out of the summary and the JSON: {unparsed}\n")
            },
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
