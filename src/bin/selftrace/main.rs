//! `selftrace`: list the USDT probes of a binary, and record a program's probes, function
//! uprobes, trace markers and scheduling into a trace that Perfetto opens.
//!
//! ```text
//! selftrace list BIN
//! selftrace record [-o FILE] [--probe PROVIDER:NAME ...|--all-probes] [--uprobe SPEC ...]
//!                  [--sched] [--buffer-kb N] -- CMD ARGS...
//! selftrace clean
//! ```
//!
//! See `selftrace help` and the README's "Recording a program" section.

#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod analyze;
mod chrome;
mod output;
mod pipe;
mod record;
mod supervise;

use std::ffi::OsString;
use std::path::PathBuf;

const USAGE: &str = "\
usage:
  selftrace list BIN
      the USDT probes of an ELF file, one line per probe site, with their arguments
  selftrace record [OPTIONS] -- CMD [ARGS...]
      runs CMD and records its USDT probes, function uprobes, trace markers and (with --sched)
      sched_switch; prints a summary and writes two files:
        the ftrace text trace (open it in https://ui.perfetto.dev)   -o FILE, default selftrace.trace
        the Chrome JSON trace (chrome://tracing or Perfetto)         --json FILE, default: the -o
                                                                     FILE with its extension
                                                                     replaced by .json
      e.g. -o /tmp/run.trace writes /tmp/run.trace and /tmp/run.json. -o never takes a .json
      name (that is what --json is for). Both files are checked before CMD starts, written to a
      new temporary file in the same directory and renamed into place when CMD ends: a symbolic
      link, a non-regular file or another user's file at FILE is refused, never followed
    -o, --output FILE     the ftrace text trace
    --json FILE           the Chrome JSON trace
    --probe PROV:NAME     record this USDT probe of CMD (repeatable; PROV:* for a provider)
    --all-probes          record every USDT probe of CMD (the default without --probe)
    --no-probes           record no USDT probe
    --lib PATH            also the USDT probes of this shared library (repeatable; --probe
                          selects among the command's and the libraries' probes)
    --uprobe SPEC         a function uprobe (repeatable): [PATH:]SYMBOL[%return] [FETCHARGS]
                          or [PATH:]0xOFFSET[%return]; PATH defaults to CMD; SYMBOL is a
                          symbol name, a demangled Rust path (app::parse) or its last segment;
                          0xOFFSET must lie in an executable segment of PATH
    --sched               also record sched_switch of the recorded tasks
    --buffer-kb N         ring buffer size per CPU in KiB, 4 to 4194304 (default 8192)
    --quiet               no summary
      CMD and every process it starts end with the recorder, also when the recorder is killed
  selftrace clean
      removes the uprobe events and instances that recorders killed with SIGKILL left behind;
      a recording is touched only when it is proven dead (its recorder's lock on its tracefs
      instance is gone), from any PID or mount namespace
  needs root (tracefs, uprobe_events)";

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let code = match run(args) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("selftrace: error: {msg}");
            2
        }
    };
    std::process::exit(code);
}

/// `e`, followed by each error of its [`source`](std::error::Error::source) chain that adds to
/// what is said already (an `io::Error`'s `Not a directory (os error 20)` after
/// `not found: elf file`; not a source whose text is in the message), joined by `: `.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        // `Permission denied (os error 13)` adds nothing to `...: permission denied`.
        let plain = text
            .split(" (os error ")
            .next()
            .unwrap_or(&text)
            .to_lowercase();
        if !msg.to_lowercase().contains(&plain) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

fn run(args: Vec<OsString>) -> Result<i32, String> {
    let mut it = args.into_iter();
    let cmd = it.next().map(|s| s.to_string_lossy().into_owned());
    match cmd.as_deref() {
        Some("list") => {
            let bin = it.next().ok_or(format!("list needs a file\n{USAGE}"))?;
            list(&PathBuf::from(bin))
        }
        Some("record") => record::record(parse_record(it.collect())?),
        // The recorder's helper process (see supervise.rs); not for people.
        Some(supervise::SUBCOMMAND) => supervise::main(it.collect()),
        Some("clean") => {
            let removed = selftrace::tracefs::remove_stale_sessions("selftrace-record")
                .map_err(|e| record::explain(&e))?;
            for r in &removed {
                println!("removed {r}");
            }
            println!("{} left-overs of dead recorders removed", removed.len());
            Ok(0)
        }
        Some("help") | Some("-h") | Some("--help") => {
            println!("{USAGE}");
            Ok(0)
        }
        Some(other) => Err(format!("unknown command {other:?}\n{USAGE}")),
        None => Err(USAGE.to_string()),
    }
}

fn list(bin: &std::path::Path) -> Result<i32, String> {
    let notes = selftrace::usdt::read_probes(bin).map_err(|e| describe(&e))?;
    if notes.is_empty() {
        println!("{}: no USDT probes", bin.display());
        return Ok(0);
    }
    println!("{}: {} probe sites", bin.display(), notes.len());
    for n in &notes {
        let args: Vec<String> = n
            .arguments
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let ty = format!("{}{}", if a.signed { "i" } else { "u" }, a.size as u32 * 8);
                format!("a{i}: {ty} {}", a.location)
            })
            .collect();
        let place = match n.file_offset {
            Some(off) => format!("pc 0x{:x} (file offset 0x{off:x})", n.address),
            None => "removed (dead code)".to_string(),
        };
        let sem = match n.semaphore_offset {
            Some(off) => format!(", semaphore 0x{:x} (file offset 0x{off:x})", n.semaphore),
            None => String::new(),
        };
        println!(
            "  {}:{}  [{}]  {place}{sem}",
            n.provider,
            n.name,
            args.join(", ")
        );
    }
    Ok(0)
}

/// The parsed `record` command line.
#[derive(Debug, Default)]
pub struct RecordOptions {
    /// Output trace file (ftrace text).
    pub output: PathBuf,
    /// Chrome JSON output (default: `output` with the extension `.json`).
    pub json: Option<PathBuf>,
    /// `provider:name` (or `provider:*`) to record; empty = see `all_probes`.
    pub probes: Vec<String>,
    /// Record every probe.
    pub all_probes: bool,
    /// Record no probe.
    pub no_probes: bool,
    /// Shared libraries whose probes are recorded too.
    pub libs: Vec<String>,
    /// `--uprobe` specs.
    pub uprobes: Vec<String>,
    /// Record sched_switch.
    pub sched: bool,
    /// Per-CPU buffer size.
    pub buffer_kb: u32,
    /// No summary.
    pub quiet: bool,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

fn parse_record(args: Vec<OsString>) -> Result<RecordOptions, String> {
    let mut o = RecordOptions {
        output: PathBuf::from("selftrace.trace"),
        buffer_kb: 8192,
        ..Default::default()
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy().into_owned();
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))
                .map(|v| v.to_string_lossy().into_owned())
        };
        match s.as_str() {
            "--" => {
                o.command = it.collect();
                break;
            }
            "-o" | "--output" => o.output = PathBuf::from(value(&s)?),
            "--json" => o.json = Some(PathBuf::from(value(&s)?)),
            "--probe" => o.probes.push(value(&s)?),
            "--all-probes" => o.all_probes = true,
            "--no-probes" => o.no_probes = true,
            "--uprobe" => o.uprobes.push(value(&s)?),
            "--lib" => o.libs.push(value(&s)?),
            "--sched" => o.sched = true,
            "--quiet" => o.quiet = true,
            "--buffer-kb" => {
                let v = value(&s)?;
                o.buffer_kb = v
                    .parse()
                    .ok()
                    .filter(|n| (MIN_BUFFER_KB..=MAX_BUFFER_KB).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "--buffer-kb {v}: expected a number of KiB per CPU from \
                             {MIN_BUFFER_KB} to {MAX_BUFFER_KB}"
                        )
                    })?
            }
            _ if s.starts_with('-') => return Err(format!("unknown option {s}\n{USAGE}")),
            _ => {
                // The command starts here (a `--` is optional when CMD starts without `-`).
                o.command.push(a);
                o.command.extend(it);
                break;
            }
        }
    }
    if o.command.is_empty() {
        return Err(format!("record needs a command to run\n{USAGE}"));
    }
    if [!o.probes.is_empty(), o.all_probes, o.no_probes]
        .iter()
        .filter(|&&b| b)
        .count()
        > 1
    {
        return Err("--probe, --all-probes and --no-probes exclude each other".into());
    }
    if o.output.extension().is_some_and(|e| e == "json") {
        return Err(format!(
            "-o {}: -o names the ftrace text trace; use --json {} for the Chrome JSON",
            o.output.display(),
            o.output.display()
        ));
    }
    let json = o.json.clone().unwrap_or_else(|| json_name(&o.output));
    if json == o.output {
        return Err("--json and -o name the same file".into());
    }
    o.json = Some(json);
    Ok(o)
}

/// Smallest `--buffer-kb` accepted (one page).
pub const MIN_BUFFER_KB: u32 = 4;
/// Largest `--buffer-kb` accepted (4 GiB per CPU); the memory actually available is checked
/// before recording.
pub const MAX_BUFFER_KB: u32 = 4 << 20;

/// The default Chrome JSON name for the trace `FILE`: its extension replaced by `.json`.
pub fn json_name(output: &std::path::Path) -> PathBuf {
    output.with_extension("json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn record_args() {
        let o = parse_record(args(
            "-o /tmp/x --probe rt:step --uprobe compute%return --sched -- ./app -o y",
        ))
        .unwrap();
        assert_eq!(o.output, PathBuf::from("/tmp/x"));
        assert_eq!(o.probes, ["rt:step"]);
        assert_eq!(o.uprobes, ["compute%return"]);
        assert!(o.sched);
        assert_eq!(o.command, args("./app -o y"));
        assert!(parse_record(args("--bogus -- x")).is_err());
        assert!(parse_record(args("--sched")).is_err());
        assert!(parse_record(args("--probe a:b --all-probes x")).is_err());
        assert!(parse_record(args("--no-probes --all-probes x")).is_err());
        assert!(parse_record(args("-o t.json x")).is_err());
        assert!(parse_record(args("--buffer-kb 0 x")).is_err());
        assert!(parse_record(args("--buffer-kb 999999999 x")).is_err());
        assert_eq!(o.json, Some(PathBuf::from("/tmp/x.json")));
        let o = parse_record(args("-o t.trace --json u.json x")).unwrap();
        assert_eq!(o.json, Some(PathBuf::from("u.json")));
        let o = parse_record(args("x")).unwrap();
        assert_eq!(
            (o.output, o.json),
            (
                PathBuf::from("selftrace.trace"),
                Some(PathBuf::from("selftrace.json"))
            )
        );
        assert_eq!(parse_record(args("ls -l")).unwrap().command, args("ls -l"));
    }
}
