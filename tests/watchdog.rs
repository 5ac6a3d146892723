//! The stall watchdog, one child process per scenario (threads stall on purpose): one report
//! per stall with the stalled function on its stack, busy versus blocked, the recovery line,
//! the trace marker instant, the callback and the abort action.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "threads", feature = "trace", feature = "tracefs"))]

mod child_support;
#[path = "support/frames.rs"]
mod frames;
use frames::frame_names;
#[path = "support/target.rs"]
mod target;

use selftrace::watchdog::{self, Action};
use std::hint::black_box;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---- the child's side -----------------------------------------------------------------------

/// Spins for `d` without petting.
#[inline(never)]
fn busy_stall(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        black_box(());
    }
}

/// Sleeps for `d` without petting.
#[inline(never)]
fn blocked_stall(d: Duration) {
    std::thread::sleep(d);
    black_box(());
}

/// Blocks in `poll` for `d` without petting; when a signal interrupts the wait (`poll` is never
/// restarted: `EINTR`), works for 300 ms before it waits again, as a program that does its
/// housekeeping on `EINTR` would. So the stack request of the watchdog wakes it into a busy
/// spell.
#[inline(never)]
fn blocked_in_poll(d: Duration) {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let end = Instant::now() + d;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        let mut p = libc::pollfd {
            fd: fds[0],
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, left.as_millis() as i32) };
        if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            busy_stall(Duration::from_millis(300));
        } else if r >= 0 {
            break;
        }
    }
    // SAFETY: the two fds opened above.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

/// Pets for `d`.
fn healthy(w: &watchdog::Watch, d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        w.pet();
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn worker(
    name: &'static str,
    stall: fn(Duration),
    stall_for: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let w = watchdog::watch_with_timeout(name, Duration::from_millis(300)).expect("watch");
            healthy(&w, Duration::from_millis(200));
            stall(stall_for);
            healthy(&w, Duration::from_millis(400));
            // The monitor notices the recovery on a tick after its report and callback, which
            // resolve file:line first (seconds under qemu-user): go on petting until then.
            if AWAIT_CALLBACK.load(Ordering::SeqCst) {
                let deadline = Instant::now() + Duration::from_secs(300);
                while !CALLBACK_RAN.load(Ordering::SeqCst) && Instant::now() < deadline {
                    healthy(&w, Duration::from_millis(20));
                }
                healthy(&w, Duration::from_millis(400));
            }
        })
        .unwrap()
}

/// Set by scenarios with a callback: workers pet until [`CALLBACK_RAN`].
static AWAIT_CALLBACK: AtomicBool = AtomicBool::new(false);
/// Set by the callback of the `busy` and `blocked` scenarios.
static CALLBACK_RAN: AtomicBool = AtomicBool::new(false);

fn scenario(name: &str) {
    println!();
    selftrace::init().expect("init");
    let settings = watchdog::builder().period(Duration::from_millis(20));
    settings.clone().install().expect("watchdog");
    if let Ok(path) = std::env::var("MARKER_FILE") {
        selftrace::trace::set_marker_path(path).expect("the instance's trace_marker");
    }
    match name {
        "busy" | "blocked" => {
            let seen: Arc<Mutex<Vec<String>>> = Arc::default();
            let s2 = seen.clone();
            let callback = Action::Callback(Arc::new(move |s| {
                let names: Vec<String> = s
                    .stack
                    .as_ref()
                    .map(|f| {
                        f.iter()
                            .enumerate()
                            .filter_map(|(i, &a)| {
                                let k = selftrace::symbolize::frame_kind(f, i, true);
                                selftrace::symbolize(k.lookup_address(a))?.name_string()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                CALLBACK_RAN.store(true, Ordering::SeqCst);
                s2.lock().unwrap().push(format!(
                    "callback {} busy={} stall_fn={}",
                    s.name,
                    s.busy,
                    names.iter().any(|n| n.contains("_stall"))
                ));
            }));
            settings
                .clone()
                .action(callback)
                .install()
                .expect("watchdog");
            AWAIT_CALLBACK.store(true, Ordering::SeqCst);
            let w = if name == "busy" {
                worker("cruncher", busy_stall, Duration::from_millis(1500))
            } else {
                worker("sleepy", blocked_stall, Duration::from_millis(1500))
            };
            w.join().unwrap();
            // The callback runs after the report is written, which resolves file:line first
            // (the DWARF of this binary: seconds under qemu-user): wait for it.
            let deadline = Instant::now() + Duration::from_secs(300);
            while seen.lock().unwrap().is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            // A few more ticks: a single report, whatever happens next.
            std::thread::sleep(Duration::from_millis(200));
            for l in seen.lock().unwrap().iter() {
                println!("{l}");
            }
        }
        "blocked-eintr" => {
            worker("sleepy", blocked_in_poll, Duration::from_millis(1500))
                .join()
                .unwrap();
        }
        "abort" => {
            selftrace::crash::builder()
                .all_threads(true)
                .install()
                .expect("install");
            selftrace::threads::builder()
                .timeout(Duration::from_secs(3))
                .install()
                .expect("threads");
            settings
                .clone()
                .action(Action::Abort)
                .minidump(std::env::var("WATCHDOG_MINIDUMP_DIR").expect("dump dir"))
                .install()
                .expect("watchdog");
            // Stuck for longer than the abort takes (the crash report waits for the symbolizer
            // and for each thread): the crash report must still see it stuck.
            let w = worker("stuck", blocked_stall, Duration::from_secs(100));
            w.join().unwrap();
            println!("not aborted");
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// In a child (WATCHDOG_SCENARIO set): run the scenario. In the parent: nothing.
#[test]
fn child_entry() {
    let Ok(name) = std::env::var("WATCHDOG_SCENARIO") else {
        return;
    };
    scenario(&name);
    std::process::exit(0);
}

// ---- the parent's side ----------------------------------------------------------------------

struct Outcome {
    stdout: String,
    stderr: String,
    /// The child's trace markers as written (`I|pid|...`), one a line, read back from a private
    /// ftrace instance; `None` when tracefs is not available (skipped, said why).
    markers: Option<String>,
    code: Option<i32>,
    signal: Option<i32>,
}

/// A private ftrace instance the child writes its markers into (through the instance's own
/// `trace_marker`); `None`, with the reason printed, when tracefs is not there (a failure
/// under `SELFTRACE_REQUIRE_TRACEFS=1`).
fn marker_instance() -> Option<selftrace::tracefs::Instance> {
    match selftrace::tracefs::Instance::create("selftrace_watchdog_test") {
        Ok(i) => Some(i),
        Err(e) => {
            assert!(
                std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none(),
                "tracefs instance (SELFTRACE_REQUIRE_TRACEFS=1): {e}"
            );
            eprintln!("skipping the marker checks: no tracefs instance ({e})");
            None
        }
    }
}

/// Runs scenario `name` in a child writing markers into a private instance; kills it after
/// 120 s.
fn run(name: &str) -> Outcome {
    let instance = marker_instance();
    let mut cmd = child_support::test_child();
    cmd.env("WATCHDOG_SCENARIO", name)
        .env("RUST_BACKTRACE", "0");
    if let Some(i) = &instance {
        cmd.env("MARKER_FILE", i.marker_path());
    }
    let dumps = dump_dir(name);
    let _ = std::fs::remove_dir_all(&dumps);
    std::fs::create_dir_all(&dumps).unwrap();
    cmd.env("WATCHDOG_MINIDUMP_DIR", &dumps);
    let child_support::Finished {
        pid,
        status,
        stdout,
        stderr,
    } = child_support::run_test_child(
        &mut cmd,
        Duration::from_secs(120),
        &format!("scenario {name}"),
    );
    let markers = instance.map(|i| {
        i.read_markers()
            .expect("read the instance's markers")
            .into_iter()
            .filter(|m| m.pid == Some(pid))
            .map(|m| m.text + "\n")
            .collect::<String>()
    });
    Outcome {
        stdout,
        stderr,
        markers,
        code: status.code(),
        signal: status.signal(),
    }
}

/// Where scenario `name` writes minidumps.
fn dump_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("watchdog-dumps-{name}-{}", std::process::id()))
}

/// The seconds of the `recovered after N.NNNs` line (the thread did not pet for 1.5 s).
fn recovered_after(stderr: &str) -> f64 {
    let at = stderr.find(" recovered after ").expect("recovery line") + 17;
    let rest = &stderr[at..];
    rest[..rest.find('s').unwrap()].parse().unwrap()
}

/// The frames' function names of the watchdog report.
fn report_frames(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .skip_while(|l| !l.starts_with("------------[ selftrace: watchdog ]"))
        .take_while(|l| !l.starts_with("---[ end of watchdog report ]---"))
        .flat_map(frame_names)
        .collect()
}

/// Issue 45: a period or timeout of zero (silently taken as 1 ms) or an absurd one is refused,
/// saying which; nothing is started.
#[test]
fn settings_out_of_range_are_refused() {
    use selftrace::Error;
    for period in [Duration::ZERO, Duration::from_secs(61), Duration::MAX] {
        let r = watchdog::builder().period(period).install();
        assert!(
            matches!(r, Err(Error::InvalidInput(why)) if why.contains("period")),
            "{period:?}: {r:?}"
        );
    }
    for timeout in [Duration::ZERO, Duration::from_micros(500), Duration::MAX] {
        let r = watchdog::builder().default_timeout(timeout).install();
        assert!(
            matches!(r, Err(Error::InvalidInput(why)) if why.contains("timeout")),
            "{timeout:?}: {r:?}"
        );
        let r = watchdog::watch_with_timeout("refused", timeout).map(drop);
        assert!(
            matches!(r, Err(Error::InvalidInput(why)) if why.contains("timeout")),
            "{timeout:?}: {r:?}"
        );
    }
}

#[test]
fn a_busy_thread_is_a_soft_lockup_reported_once_then_recovers() {
    let o = run("busy");
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let e = &o.stderr;
    assert_eq!(
        e.matches("------------[ selftrace: watchdog ]").count(),
        1,
        "{e}"
    );
    assert_eq!(
        e.matches("watchdog: BUG: soft lockup - thread cruncher:")
            .count(),
        1,
        "{e}"
    );
    assert!(e.contains("busy: the thread used "), "{e}");
    assert!(e.contains("thread \"cruncher\" tid "), "{e}");
    let frames = report_frames(e);
    assert!(frames.contains(&"watchdog::busy_stall"), "{e}");
    // Resolved in normal context: file:line (and inlined functions) as a crash report has them.
    let stalled = e
        .lines()
        .find(|l| l.contains(" : watchdog::busy_stall+"))
        .unwrap();
    assert!(
        stalled.contains(" at ") && stalled.contains("tests/watchdog.rs:"),
        "{e}"
    );
    assert_eq!(e.matches("watchdog: thread cruncher:").count(), 1, "{e}");
    assert!(recovered_after(e) >= 1.0, "{e}");
    // The callback ran once, with the stack.
    assert_eq!(
        o.stdout
            .matches("callback cruncher busy=true stall_fn=true")
            .count(),
        1,
        "{}",
        o.stdout
    );
    // The marker instants, in the trace_marker grammar, as the kernel recorded them.
    if let Some(m) = &o.markers {
        assert!(m.contains("|watchdog: busy cruncher:"), "{m}");
        assert!(m.contains("recovered"), "{m}");
        assert!(m.lines().all(|l| l.starts_with("I|")), "{m}");
    }
}

#[test]
fn a_blocked_thread_is_a_hung_task_reported_once_then_recovers() {
    let o = run("blocked");
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let e = &o.stderr;
    assert_eq!(
        e.matches("------------[ selftrace: watchdog ]").count(),
        1,
        "{e}"
    );
    assert_eq!(e.matches("watchdog: INFO: task sleepy:").count(), 1, "{e}");
    assert!(e.contains(" blocked for more than 0.300s ("), "{e}");
    assert!(e.contains("blocked: the thread used 0.0"), "{e}");
    let frames = report_frames(e);
    assert!(frames[0].contains("nanosleep"), "{e}");
    assert!(frames.contains(&"watchdog::blocked_stall"), "{e}");
    assert_eq!(e.matches("watchdog: thread sleepy:").count(), 1, "{e}");
    assert!(recovered_after(e) >= 1.0, "{e}");
    assert_eq!(
        o.stdout
            .matches("callback sleepy busy=false stall_fn=true")
            .count(),
        1,
        "{}",
        o.stdout
    );
    if let Some(m) = &o.markers {
        assert!(m.contains("|watchdog: blocked sleepy:"), "{m}");
    }
}

#[test]
fn a_blocked_thread_is_reported_in_the_state_it_was_found_in() {
    let o = run("blocked-eintr");
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let e = &o.stderr;
    assert_eq!(e.matches("watchdog: INFO: task sleepy:").count(), 1, "{e}");
    // The thread line of the report: the state read when the stall was found (sleeping in
    // poll), not after the stack request woke the thread into its busy spell.
    let line = e
        .lines()
        .find(|l| l.starts_with("thread \"sleepy\""))
        .unwrap_or_else(|| panic!("no thread line:\n{e}"));
    assert!(line.contains("state S (sleeping)"), "{line}\n{e}");
}

#[test]
fn the_abort_action_dies_with_an_all_thread_report() {
    let o = run("abort");
    assert_eq!(o.signal, Some(libc::SIGABRT), "{}\n{}", o.stdout, o.stderr);
    assert!(!o.stdout.contains("not aborted"), "{}", o.stdout);
    let e = &o.stderr;
    assert!(e.contains("watchdog: INFO: task stuck:"), "{e}");
    assert!(e.contains("watchdog: aborting"), "{e}");
    // The crash report, from the watchdog thread, with every other thread.
    assert!(e.contains("SIGABRT"), "{e}");
    assert!(e.contains("thread \"watchdog\""), "{e}");
    let others = &e[e.find("Other threads:").expect("other threads")..];
    let stuck = &others[others.find("thread \"stuck\" tid ").expect("stuck thread")..];
    assert!(stuck.contains("watchdog::blocked_stall+"), "{stuck}");
    assert!(
        without_qemu_line(e).ends_with("---[ end of report ]---"),
        "{e}"
    );
    // The minidump of Builder::minidump, written before the abort: read back by rust-minidump,
    // the stuck thread in it with its registers and stack.
    let line = e
        .lines()
        .find(|l| l.starts_with("watchdog: minidump "))
        .unwrap_or_else(|| panic!("minidump line: {e}"));
    let path = line["watchdog: minidump ".len()..]
        .split(" (")
        .next()
        .unwrap();
    assert!(
        path.starts_with(dump_dir("abort").to_str().unwrap()),
        "{line}"
    );
    let dump = minidump::Minidump::read_path(path).expect("read the dump");
    let names = dump
        .get_stream::<minidump::MinidumpThreadNames>()
        .expect("thread names");
    let threads = dump
        .get_stream::<minidump::MinidumpThreadList>()
        .expect("thread list");
    let stuck = threads
        .threads
        .iter()
        .find(|t| names.get_name(t.raw.thread_id).as_deref() == Some("stuck"))
        .expect("the stuck thread is in the dump");
    assert!(stuck.raw.stack.memory.data_size > 0, "its stack was copied");
    assert!(stuck.raw.thread_context.data_size > 0, "its registers too");
    assert!(
        dump.get_stream::<minidump::MinidumpException>().is_err(),
        "the watchdog's dump is not a crash"
    );
}

/// `text` without trailing white space and without the line qemu-user adds when the program it
/// runs dies by a signal (`qemu: uncaught target signal 6 (Aborted) - core dumped`).
fn without_qemu_line(text: &str) -> &str {
    let t = text.trim_end();
    match t.rsplit_once('\n') {
        Some((before, last)) if last.starts_with("qemu: ") => before.trim_end(),
        _ => t,
    }
}
