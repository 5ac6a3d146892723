//! The crash handler, one child process per scenario: the report's text and the signal the
//! child dies by are checked.

#[path = "support/addr2line.rs"]
mod addr2line;
#[path = "child_support/mod.rs"]
mod child_support;
mod example_build;
#[path = "support/crash_scenarios.rs"]
#[allow(dead_code)]
mod scenarios;

/// `child_support` finds it here.
use scenarios::target;
use std::os::unix::process::{CommandExt, ExitStatusExt};

#[global_allocator]
static GLOBAL: scenarios::LockingAllocator = scenarios::LockingAllocator;

/// In a child (CRASH_SCENARIO set): install and crash. In the parent: nothing.
#[test]
fn child_entry() {
    let Ok(name) = std::env::var("CRASH_SCENARIO") else {
        return;
    };
    if name == "chained" {
        scenarios::install_user_handler();
    }
    if name == "crash-in-handler" {
        scenarios::install_crashing_user_handler();
    }
    if name == "uninstalled" {
        // Installed, then removed: the program's handler and std's panic message come back,
        // and a crash or panic gets no report.
        scenarios::install_user_handler();
        selftrace::crash::builder()
            .panic_hook(true)
            .install()
            .expect("install");
        selftrace::crash::uninstall().expect("uninstall");
        // SAFETY: queries SIGSEGV's action into a valid struct.
        let now = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut sa);
            sa.sa_sigaction
        };
        eprintln!("given back {}", now == scenarios::user_handler_addr());
        let _ = std::panic::catch_unwind(|| panic!("after uninstall"));
        // SAFETY: the default action, so that the crash below kills the process.
        unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
        scenarios::caller_null();
    }
    if name == "panic" {
        // A hook of the program's own, chained to std's: both must still run.
        let std_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            eprintln!(
                "user panic hook: {}",
                info.payload_as_str().unwrap_or("(not a string)")
            );
            std_hook(info);
        }));
        selftrace::crash::builder()
            .panic_hook(true)
            .install()
            .expect("install");
        scenarios::caller_panic();
    }
    if let Some(kind) = name.strip_prefix("panic-") {
        // Panics that something catches, and one that ends its thread; the program goes on.
        selftrace::crash::builder()
            .panic_hook(true)
            .caught_panics(kind != "caught-quiet")
            .install()
            .expect("install");
        match kind {
            "caught" | "caught-quiet" => {
                assert!(std::panic::catch_unwind(scenarios::caller_panic).is_err());
            }
            "thread" => {
                let t = std::thread::Builder::new()
                    .name("doomed".into())
                    .spawn(scenarios::caller_panic)
                    .unwrap();
                assert!(t.join().is_err());
            }
            "tokio" => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                let r =
                    rt.block_on(async { tokio::spawn(async { scenarios::caller_panic() }).await });
                assert!(r.unwrap_err().is_panic());
            }
            other => panic!("unknown scenario panic-{other}"),
        }
        eprintln!("went on after the panic");
        std::process::exit(0);
    }
    if name == "symbolizer-name" {
        selftrace::crash::install().expect("install");
        // The symbolizer is this process's child: print what ps shows of each child.
        let me = std::process::id().to_string();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let mut named = false;
            for e in std::fs::read_dir("/proc").unwrap().flatten() {
                let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let Some((_, rest)) = stat.rsplit_once(") ") else {
                    continue;
                };
                if rest.split(' ').nth(1) != Some(me.as_str()) {
                    continue;
                }
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let args: Vec<String> = cmdline
                    .split(|&b| b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                eprintln!("child comm={:?} args={args:?}", comm.trim_end());
                named |= comm.trim_end() == "selftrace-sym";
            }
            if named || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::process::exit(0);
    }
    if name == "no-symbolizer" {
        selftrace::crash::builder()
            .symbolizer(false)
            .install()
            .expect("install");
        scenarios::caller_null();
    }
    // Under qemu-user (the aarch64 tests) parsing this binary's DWARF takes far longer than the
    // default 3 s.
    selftrace::crash::builder()
        .symbolizer_timeout(std::time::Duration::from_secs(
            if cfg!(target_arch = "x86_64") { 3 } else { 60 },
        ))
        .install()
        .expect("install");
    scenarios::run(&name, std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    eprintln!("scenario {name} did not crash");
    std::process::exit(3);
}

struct Outcome {
    report: String,
    signal: Option<i32>,
}

fn run(name: &str) -> Outcome {
    let mut cmd = child_support::test_child();
    cmd.env("CRASH_SCENARIO", name).env("RUST_BACKTRACE", "0");
    // SAFETY: setrlimit is async-signal-safe; no core files from the test children.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &r);
            Ok(())
        });
    }
    let child_support::Finished { status, stderr, .. } =
        child_support::run_test_child(&mut cmd, child_support::deadline(120), name);
    Outcome {
        report: stderr,
        signal: status.signal(),
    }
}

/// The Call Trace lines of the report.
fn trace(report: &str) -> Vec<&str> {
    report
        .lines()
        .skip_while(|l| *l != "Call Trace:")
        .skip(1)
        .take_while(|l| l.starts_with(" #") || l.starts_with(" frames"))
        .collect()
}

/// The trace's frames: each the lines of the functions inlined into it (` #k [inlined] ...`,
/// innermost first), then its physical line (` #k 0x... : ...`).
fn trace_frames(report: &str) -> Vec<Vec<&str>> {
    let mut frames: Vec<Vec<&str>> = Vec::new();
    let mut open = false;
    for l in trace(report) {
        if !open {
            frames.push(Vec::new());
        }
        frames.last_mut().unwrap().push(l);
        open = l.contains(" [inlined] ");
    }
    frames
}

/// Asserts the report names `crash_fn` in the trace and `caller` in one of the three frames
/// after its own: as the frame's function, or (in a release build) as a function inlined into
/// it.
fn assert_names(o: &Outcome, crash_fn: &str, caller: &str) {
    let frames = trace_frames(&o.report);
    let at = frames
        .iter()
        .position(|f| f.last().unwrap().contains(&format!("{crash_fn}+")))
        .unwrap_or_else(|| panic!("{crash_fn} not in the trace:\n{}", o.report));
    let names_caller = |l: &&str| {
        l.contains(&format!("{caller}+"))
            || (l.contains(" [inlined] ") && l.contains(&format!("::{caller} at ")))
    };
    assert!(
        frames[at + 1..]
            .iter()
            .take(3)
            .any(|f| f.iter().any(names_caller)),
        "{caller} does not follow {crash_fn}:\n{}",
        o.report
    );
    assert!(o.report.contains("---[ end of report ]---"), "{}", o.report);
    assert!(o.report.contains("Objects:"), "{}", o.report);
}

/// A function's last path segment (`a::b::c` -> `c`), generics and closures aside.
fn last_segment(name: &str) -> &str {
    let name = name.split('<').next().unwrap_or(name);
    name.trim_end_matches("::{{closure}}")
        .rsplit("::")
        .next()
        .unwrap_or(name)
}

/// The function named by a report line: after `[inlined] ` up to ` at `, or after ` : ` up to
/// `+0x`.
fn line_function(l: &str) -> &str {
    match l.split_once(" [inlined] ") {
        Some((_, rest)) => rest.split(" at ").next().unwrap(),
        None => {
            let rest = l.split_once(" : ").map_or(l, |(_, r)| r);
            rest.split("+0x").next().unwrap()
        }
    }
}

/// `file:line` at the end of a report line (` at file:line:col`), if any.
fn line_location(l: &str) -> Option<(String, u32)> {
    let loc = l.rsplit_once(" at ")?.1;
    let mut parts = loc.rsplitn(3, ':');
    let _col = parts.next()?;
    let line = parts.next()?.parse().ok()?;
    Some((parts.next()?.to_string(), line))
}

/// Checks the report of the `inlined` scenario written by `exe`: the frame of
/// `crash_inlined` lists `inlined_leaf` and `inlined_mid` innermost first, then itself, in the
/// order of the crate's own `Backtrace` printed by the child at the same call site; the frame
/// of the pc lists its functions in the order and with the file:line that binutils'
/// `addr2line -i` gives for its address; and the pc line names the innermost of them.
fn check_inlined_report(report: &str, exe: &std::path::Path) {
    let frames = trace_frames(report);
    let names = |f: &Vec<&str>| -> Vec<String> {
        f.iter()
            .map(|l| last_segment(line_function(l)).to_string())
            .collect()
    };
    // The crate's own Backtrace, innermost first.
    let bt: Vec<String> = report
        .lines()
        .find_map(|l| l.strip_prefix("inlined-backtrace: "))
        .unwrap_or_else(|| panic!("no inlined-backtrace line:\n{report}"))
        .split(" | ")
        .map(|n| last_segment(n).to_string())
        .collect();
    assert_eq!(
        bt,
        ["inlined_leaf", "inlined_mid", "crash_inlined"],
        "{report}"
    );
    let own = frames
        .iter()
        .find(|f| f.last().unwrap().contains("crash_inlined+"))
        .unwrap_or_else(|| panic!("no crash_inlined frame:\n{report}"));
    let own_names = names(own);
    // In a release build, read_volatile is inlined into inlined_leaf too: the report's frame
    // goes one function deeper than the Backtrace's call site.
    assert!(
        own_names.ends_with(&bt),
        "{own_names:?} vs {bt:?}:\n{report}"
    );
    // Frame 0: every function at the pc, as addr2line -i gives them for its address.
    let pc_frame = &frames[0];
    let physical = pc_frame.last().unwrap();
    let offset = physical
        .rsplit_once("+0x")
        .and_then(|(_, r)| r.split(']').next())
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| panic!("no [object+offset] on {physical}"));
    let theirs = &addr2line::run(&target::binutil("addr2line"), exe, &[offset])[0];
    let ours = names(pc_frame);
    let their_names: Vec<String> = theirs
        .iter()
        .map(|t| last_segment(&t.0).to_string())
        .collect();
    assert_eq!(ours, their_names, "frame 0 against addr2line -i:\n{report}");
    for (l, (_, file, line)) in pc_frame.iter().zip(theirs) {
        let ours = line_location(l);
        match line {
            Some(line) => assert!(
                ours.as_ref()
                    .is_some_and(|(f, n)| n == line && addr2line::same_file(f, file)),
                "{l} vs addr2line's {file}:{line}"
            ),
            None => assert!(ours.is_none(), "{l}: addr2line has no line"),
        }
    }
    // The pc line names the innermost function first.
    let pc_line = report
        .lines()
        .find(|l| l.starts_with("RIP: ") || l.starts_with("pc : "))
        .unwrap_or_else(|| panic!("no pc line:\n{report}"));
    // `RIP: 0x... : name` (x86-64), `pc : 0x... : name` (aarch64).
    let after = pc_line
        .strip_prefix("RIP: ")
        .or_else(|| pc_line.strip_prefix("pc : "))
        .unwrap_or(pc_line);
    let innermost = after.split(" : ").nth(1).unwrap_or("");
    assert_eq!(
        last_segment(innermost.split([',', '+']).next().unwrap()),
        their_names[0],
        "{pc_line}"
    );
    if pc_frame.len() > 1 {
        assert!(pc_line.contains(", inlined into "), "{pc_line}");
    }
}

/// A crash inside inlined functions (debug test build: `#[inline(always)]`).
#[test]
fn inlined_frames_are_listed_innermost_first() {
    let o = run("inlined");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    check_inlined_report(&o.report, &std::env::current_exe().unwrap());
}

/// `examples/crash.rs` built with `--release` (in the fixtures' target directory).
fn release_crash_example() -> std::path::PathBuf {
    example_build::build(
        example_build::FIXTURES,
        &[
            "--release",
            "--features",
            example_build::RELEASE_FEATURES,
            "--example",
            "crash",
        ],
    )
    .join("release")
    .join("examples")
    .join("crash")
}

/// Runs `exe scenario` (a crash example, not this test binary) to its end: status, stderr.
fn run_program(
    exe: &std::path::Path,
    scenario: &str,
    what: &str,
) -> (std::process::ExitStatus, String) {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(scenario)
        .env("RUST_BACKTRACE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child_support::Finished { status, stderr, .. } =
        child_support::run_test_child(&mut cmd, child_support::deadline(120), what);
    (status, stderr)
}

/// The same crash in a release build of `examples/crash.rs` (debuginfo on, as the crate's
/// release profile has it): `read_volatile` is inlined as well, and the pc line names it.
#[test]
fn release_build_crash_lists_inlined_frames_innermost_first() {
    let exe = release_crash_example();
    let (status, stderr) = run_program(&exe, "inlined", "release inlined");
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{stderr}");
    check_inlined_report(&stderr, &exe);
    let rip = stderr
        .lines()
        .find(|l| l.starts_with("RIP: ") || l.starts_with("pc : "))
        .unwrap();
    assert!(rip.contains(" : core::ptr::read_volatile"), "{stderr}");
    // A panic in main that nothing catches: the process exits, and the report says so.
    let (status, stderr) = run_program(&exe, "panic", "release panic");
    assert_eq!(status.code(), Some(101), "{stderr}");
    assert!(stderr.contains("not caught: the process exits"), "{stderr}");
}

#[test]
fn null_dereference() {
    let o = run("null");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert!(
        o.report
            .contains("SIGSEGV (SEGV_MAPERR: address not mapped to object) at address 0x0"),
        "{}",
        o.report
    );
    assert!(o.report.contains("thread \"child_entry\""), "{}", o.report);
    // The register block names the pc as the kernel's oops does on each architecture.
    let pc = if cfg!(target_arch = "aarch64") {
        "pc : 0x"
    } else {
        "RIP: 0x"
    };
    assert!(o.report.contains(pc), "{}", o.report);
    assert_names(&o, "crash_null", "caller_null");
    // [object+offset] and the object's build-id, for addr2line.
    let exe = std::env::current_exe().unwrap();
    let exe_name = exe.file_name().unwrap().to_str().unwrap();
    assert!(
        o.report.contains(&format!("[{exe_name}+0x")),
        "{}",
        o.report
    );
    assert!(o.report.contains(" build-id "), "{}", o.report);
}

/// The line of `needle` in the scenarios' source.
fn source_line(needle: &str) -> usize {
    let src = include_str!("support/crash_scenarios.rs");
    src.lines()
        .position(|l| l.contains(needle))
        .expect("needle in source")
        + 1
}

#[test]
fn the_report_gives_file_and_line_from_the_symbolizer_process() {
    let o = run("null");
    let line = source_line("read_volatile(black_box(0usize)");
    let want = format!("crash_scenarios.rs:{line}:");
    let t = trace(&o.report);
    let frame = t
        .iter()
        .find(|l| l.contains("crash_null+"))
        .expect("crash_null frame");
    assert!(frame.contains(&want), "{want} missing:\n{}", o.report);
    let caller = t
        .iter()
        .find(|l| l.contains("caller_null+"))
        .expect("caller frame");
    let line = source_line("    crash_null();");
    assert!(
        caller.contains(&format!("crash_scenarios.rs:{line}:")),
        "{}",
        o.report
    );
}

/// The symbolizer process names itself: `ps` tells it from the program (a fork has the
/// program's name and command line).
#[test]
fn the_symbolizer_process_names_itself() {
    let o = run("symbolizer-name");
    let line = o
        .report
        .lines()
        .rfind(|l| l.starts_with("child comm="))
        .unwrap_or_else(|| panic!("no child found:\n{}", o.report));
    // Under qemu-user the emulator answers /proc/self/stat with arg_start and arg_end 0 (and
    // the kernel shows the emulator's command line): only the name can be checked there.
    let want = if target::under_qemu() {
        "child comm=\"selftrace-sym\""
    } else {
        "child comm=\"selftrace-sym\" args=[\"selftrace-symbolizer\"]"
    };
    assert!(line.starts_with(want), "{}", o.report);
}

/// A release build without debug info (the crash example with its DWARF stripped): the
/// report's frames say why they have no file:line, the first one also what to set.
#[test]
fn a_report_without_debug_info_says_why_there_is_no_line() {
    let exe = release_crash_example();
    let stripped = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("crash-nodebug");
    let st = std::process::Command::new(target::binutil("objcopy"))
        .arg("--strip-debug")
        .arg(&exe)
        .arg(&stripped)
        .status()
        .expect("objcopy");
    assert!(st.success());
    let (status, stderr) = run_program(&stripped, "null", "no debug info");
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{stderr}");
    let frames = trace(&stderr);
    let ours: Vec<&&str> = frames
        .iter()
        .filter(|l| l.contains("[crash-nodebug+0x"))
        .collect();
    assert!(ours.len() >= 3, "{stderr}");
    let hint = "(no file:line: no debug info in this object: build it with debug info \
                (Rust: debug = \"line-tables-only\" in [profile.release], see docs/crash.md) \
                or install its debug package)";
    assert!(ours[0].ends_with(hint), "{stderr}");
    for l in &ours[1..] {
        assert!(
            l.ends_with(" (no file:line: no debug info in this object)"),
            "{l}\n{stderr}"
        );
    }
}

/// Panics that are caught are reported as not fatal (or not at all, by choice); one that ends
/// only its thread says so.
#[test]
fn a_caught_panic_is_reported_as_not_fatal() {
    for (scenario, want) in [
        (
            "panic-caught",
            "caught: by catch_unwind in crash::child_entry: not fatal, the program goes on",
        ),
        (
            "panic-tokio",
            "caught: by catch_unwind in tokio::runtime::task::harness::poll_future",
        ),
        (
            "panic-thread",
            "not caught: the thread ends with it (its JoinHandle gets the panic); the process goes on",
        ),
    ] {
        let o = run(scenario);
        assert_eq!(o.signal, None, "{}", o.report);
        assert!(o.report.contains("went on after the panic"), "{}", o.report);
        assert!(
            o.report.contains("------------[ selftrace: panic ]------------"),
            "{}",
            o.report
        );
        assert!(o.report.contains(want), "{scenario}: {want:?} missing:\n{}", o.report);
        assert!(o.report.contains("crash_panic"), "{}", o.report);
    }
    // caught_panics(false): no report, std's message still.
    let o = run("panic-caught-quiet");
    assert!(o.report.contains("went on after the panic"), "{}", o.report);
    assert!(!o.report.contains("selftrace: panic"), "{}", o.report);
    assert!(o.report.contains("panicked at"), "{}", o.report);
}

#[test]
fn without_the_symbolizer_the_report_keeps_names_and_offsets() {
    let o = run("no-symbolizer");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert_names(&o, "crash_null", "caller_null");
    assert!(!o.report.contains("crash_scenarios.rs:"), "{}", o.report);
}

#[test]
fn the_panic_hook_prints_panics_in_the_same_format() {
    let o = run("panic");
    assert!(
        o.report
            .contains("------------[ selftrace: panic ]------------"),
        "{}",
        o.report
    );
    let line = source_line("panic!(\"boom");
    assert!(
        o.report.contains(&format!(
            "panic: boom 42 at tests/support/crash_scenarios.rs:{line}:"
        )),
        "{}",
        o.report
    );
    assert!(o.report.contains("crash_panic"), "{}", o.report);
    assert!(o.report.contains("caller_panic"), "{}", o.report);
    // The hooks installed before still ran: the program's own, and std's default message.
    assert!(
        o.report.contains("user panic hook: boom 42"),
        "{}",
        o.report
    );
    assert!(
        o.report.contains(&format!(
            "panicked at tests/support/crash_scenarios.rs:{line}:"
        )),
        "{}",
        o.report
    );
}

#[test]
fn stack_overflow_in_main() {
    let o = run("overflow");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert!(o.report.contains("stack overflow"), "{}", o.report);
    assert!(o.report.contains(" repeat: "), "{}", o.report);
    assert!(o.report.contains("crash_recurse+"), "{}", o.report);
    let lines = o.report.lines().count();
    assert!(
        lines < 400,
        "recursion must be compressed, got {lines} lines"
    );
}

#[test]
fn stack_overflow_in_a_spawned_thread() {
    let o = run("overflow-thread");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert!(o.report.contains("stack overflow"), "{}", o.report);
    assert!(o.report.contains("thread \"deep\""), "{}", o.report);
    assert!(o.report.contains(" repeat: "), "{}", o.report);
}

#[test]
fn abort() {
    let o = run("abort");
    assert_eq!(o.signal, Some(libc::SIGABRT), "{}", o.report);
    assert!(o.report.contains("SIGABRT (SI_TKILL"), "{}", o.report);
    assert_names(&o, "crash_abort", "caller_abort");
}

#[test]
fn illegal_instruction() {
    let o = run("illegal");
    assert_eq!(o.signal, Some(libc::SIGILL), "{}", o.report);
    assert!(o.report.contains("SIGILL (ILL_ILLOPN"), "{}", o.report);
    assert_names(&o, "crash_illegal", "caller_illegal");
}

#[test]
fn integer_divide_by_zero() {
    let o = run("divide");
    assert_eq!(o.signal, Some(libc::SIGFPE), "{}", o.report);
    // aarch64's division does not trap: the scenario raises SIGFPE itself there.
    let code = if cfg!(target_arch = "aarch64") {
        "SIGFPE (SI_TKILL"
    } else {
        "SIGFPE (FPE_INTDIV: integer divide by zero)"
    };
    assert!(o.report.contains(code), "{}", o.report);
    assert_names(&o, "crash_divide", "caller_divide");
}

#[test]
fn fault_inside_the_allocator_with_its_lock_held() {
    let o = run("in-allocator");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert_names(&o, "crash_in_allocator", "alloc");
}

#[test]
fn crash_in_a_dlopened_library() {
    let o = run("dlopen");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert_names(&o, "crash_in_c", "caller_in_c");
    assert!(o.report.contains("[libselftrace_crash_"), "{}", o.report);
}

#[test]
fn two_threads_crashing_at_once_give_one_complete_report() {
    let o = run("two-threads");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    let starts = o.report.matches("[ selftrace: fatal signal ]").count();
    let ends = o.report.matches("---[ end of report ]---").count();
    assert!(starts >= 1 && starts == ends, "{}", o.report);
    // Reports never interleave: every start is followed by its end before the next start.
    let mut open = false;
    for l in o.report.lines() {
        if l.contains("[ selftrace: fatal signal ]") {
            assert!(!open, "interleaved reports:\n{}", o.report);
            open = true;
        }
        if l.contains("---[ end of report ]---") {
            open = false;
        }
    }
    assert_names(&o, "crash_null", "caller_null");
}

#[test]
fn crash_while_another_thread_is_inside_dlopen() {
    let o = run("during-dlopen");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert_names(&o, "crash_null", "caller_null");
}

#[test]
fn a_handler_installed_before_is_still_called() {
    let o = run("chained");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert!(o.report.contains("user handler called"), "{}", o.report);
    assert_names(&o, "crash_null", "caller_null");
    let report_end = o.report.find("---[ end of report ]---").unwrap();
    let user = o.report.find("user handler called").unwrap();
    assert!(
        user > report_end,
        "the report comes first, then the chained handler"
    );
}

/// Issue 45: settings that cannot work are refused, saying why, before anything is installed
/// (a symbolizer timeout of zero or past 10 minutes was silently taken or clamped).
#[test]
fn settings_out_of_range_are_refused() {
    use selftrace::Error;
    use std::time::Duration;
    fn segv_handler() -> usize {
        // SAFETY: queries SIGSEGV's action.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut sa);
            sa.sa_sigaction
        }
    }
    let before = segv_handler();
    for timeout in [Duration::ZERO, Duration::from_secs(601), Duration::MAX] {
        let r = selftrace::crash::builder()
            .symbolizer(false)
            .symbolizer_timeout(timeout)
            .install();
        assert!(
            matches!(r, Err(Error::InvalidInput(why)) if why.contains("symbolizer timeout")),
            "{timeout:?}: {r:?}"
        );
    }
    for sig in [0, 65, -1, libc::SIGKILL, libc::SIGSTOP] {
        let r = selftrace::crash::builder()
            .symbolizer(false)
            .signals(&[sig])
            .install();
        assert!(
            matches!(r, Err(Error::InvalidInput("signal cannot be handled"))),
            "{sig}: {r:?}"
        );
    }
    // Nothing was installed.
    assert_eq!(segv_handler(), before);
}

#[test]
fn uninstall_gives_the_signals_and_the_panic_hook_back() {
    let o = run("uninstalled");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert!(o.report.contains("given back true"), "{}", o.report);
    // std's hook still prints the panic; selftrace's report does not come, for the panic nor
    // the crash.
    assert!(o.report.contains("after uninstall"), "{}", o.report);
    assert!(!o.report.contains("selftrace: "), "{}", o.report);
    assert!(!o.report.contains("end of report"), "{}", o.report);
}

#[test]
fn a_signal_pending_at_the_crash_does_not_run_before_the_report() {
    let o = run("pending-at-crash");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert!(
        o.report.contains("[ selftrace: fatal signal ]"),
        "{}",
        o.report
    );
    assert!(o.report.contains("---[ end of report ]---"), "{}", o.report);
    assert!(
        !o.report.contains("usr1 handler ran"),
        "a signal ran nested inside the crash handler:\n{}",
        o.report
    );
}

#[test]
fn a_crash_inside_the_handler_does_not_loop() {
    let o = run("crash-in-handler");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{}", o.report);
    assert_eq!(
        o.report.matches("[ selftrace: fatal signal ]").count(),
        1,
        "{}",
        o.report
    );
    assert_eq!(
        o.report.matches("crashing user handler").count(),
        1,
        "{}",
        o.report
    );
}

#[test]
fn threads_spawned_by_std_have_an_alternate_signal_stack() {
    let (enabled, size) = std::thread::spawn(|| {
        // SAFETY: querying the current alternate stack.
        let mut ss: libc::stack_t = unsafe { std::mem::zeroed() };
        // SAFETY: null new stack: query only.
        assert_eq!(unsafe { libc::sigaltstack(std::ptr::null(), &mut ss) }, 0);
        (ss.ss_flags & libc::SS_DISABLE == 0, ss.ss_size)
    })
    .join()
    .unwrap();
    assert!(
        enabled,
        "std gives spawned threads an alternate signal stack"
    );
    assert!(size >= libc::MINSIGSTKSZ, "{size}");
}
