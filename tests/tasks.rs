//! A two-worker tokio service watched through `tasks::configure` (the runtime's stable hooks,
//! no `tokio_unstable`), in a child process that goes through phases: idle workers and a
//! sleeping `spawn_blocking` thread are never reported; a task that blocks its worker in
//! `std::thread::sleep`, or spins, gets one report with the worker's stack; a worker kept busy
//! by a task that calls `watchdog::pet()` is not reported; a `TaskWatch` (moved into spawned
//! tasks: `Send`) reports a task that waits past its deadline (no thread polls it) and one
//! that blocks (the thread polling it, with its stack). With `tasks::SpanLayer`, the worker's
//! line in the report names the task's spans and tokio's id of the task; a crash inside a
//! span says the same under its thread line.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "tokio", feature = "trace", feature = "tracing"))]

mod child_support;
#[path = "support/frames.rs"]
mod frames;
use frames::frame_names;
#[path = "support/counting.rs"]
mod counting;
#[path = "support/target.rs"]
mod target;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

use selftrace::watchdog::{self, Action};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

// ---- the child's side -----------------------------------------------------------------------

/// Stall reports so far (the callback runs after each report is written).
static REPORTS: AtomicUsize = AtomicUsize::new(0);

/// The monitor's period and the workers' and tasks' timeout.
const PERIOD: Duration = Duration::from_millis(20);
const TIMEOUT: Duration = Duration::from_millis(400);
/// How long each stall lasts.
const STALL: Duration = Duration::from_millis(1500);

/// A handler that blocks its worker (the mistake the watchdog is there to find).
#[inline(never)]
async fn blocking_in_async() {
    std::thread::sleep(STALL);
    black_box(());
}

/// A handler that spins without yielding.
#[inline(never)]
async fn spinning_in_async() {
    let start = Instant::now();
    while start.elapsed() < STALL {
        black_box(());
    }
}

/// A long computation that never yields but says it is alive.
#[inline(never)]
async fn petting_in_async() {
    let start = Instant::now();
    while start.elapsed() < STALL {
        watchdog::pet();
        for _ in 0..1000 {
            black_box(());
        }
    }
}

/// A task of the hog phase: blocks while wrapped in its `TaskWatch::run`.
#[inline(never)]
fn hog_blocks() {
    std::thread::sleep(Duration::from_millis(1200));
    black_box(());
}

/// Waits until `n` reports were written (at most 300 s: under qemu-user the first report
/// parses this binary's DWARF), then a few periods more (a recovery line, no second report).
fn await_reports(n: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while REPORTS.load(Ordering::SeqCst) < n && Instant::now() < deadline {
        std::thread::sleep(PERIOD);
    }
    std::thread::sleep(PERIOD * 10);
}

/// Starts phase `name`: a line the parent splits the output at.
fn phase(name: &str) {
    eprintln!("=== phase {name}");
}

fn service() {
    selftrace::init().expect("init");
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(selftrace::tasks::SpanLayer::new()),
    )
    .unwrap();
    watchdog::builder()
        .period(PERIOD)
        .action(Action::Callback(Arc::new(|_| {
            REPORTS.fetch_add(1, Ordering::SeqCst);
        })))
        .install()
        .expect("watchdog");
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2).enable_time();
    selftrace::tasks::configure_with_timeout(&mut builder, TIMEOUT).expect("configure");
    let rt = builder.build().expect("runtime");

    // Idle: parked workers, a blocking-pool thread that sleeps past the timeout, and a
    // current-thread runtime's block_on thread (not a worker) that goes on after block_on.
    phase("idle");
    let blocking = rt.spawn_blocking(|| std::thread::sleep(Duration::from_millis(1200)));
    let mut current = tokio::runtime::Builder::new_current_thread();
    current.enable_time();
    selftrace::tasks::configure_with_timeout(&mut current, TIMEOUT).expect("configure");
    let current = current.build().expect("current-thread runtime");
    current.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
    std::thread::sleep(Duration::from_millis(1500));
    rt.block_on(blocking).unwrap();
    await_reports(0);

    // One worker blocked in std::thread::sleep; the other keeps a ticker going.
    phase("blocked");
    rt.block_on(async {
        let ticker = tokio::spawn(async {
            let end = Instant::now() + STALL + Duration::from_millis(300);
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        // In two spans, entered at each poll (as #[instrument] does); the task says its id;
        // traced, so that the report says which task the worker polls.
        selftrace::tasks::spawn(
            async {
                eprintln!("blocking task id {}", tokio::task::id());
                blocking_in_async().await
            }
            .instrument(tracing::info_span!("handler"))
            .instrument(tracing::info_span!("request")),
        )
        .await
        .unwrap();
        ticker.await.unwrap();
    });
    await_reports(1);

    phase("spin");
    rt.block_on(async { tokio::spawn(spinning_in_async()).await.unwrap() });
    await_reports(2);

    phase("petting");
    rt.block_on(async { tokio::spawn(petting_in_async()).await.unwrap() });
    await_reports(2);

    // Task deadlines: `waiter` waits at an .await past its timeout (no thread polls it);
    // `hog` blocks the thread that polls it (that thread's worker is reported too).
    phase("tasks");
    rt.block_on(async {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waiter = watchdog::watch_task("waiter", TIMEOUT).expect("watch_task");
        let w = waiter.clone();
        let waiting = tokio::spawn(waiter.run(async move {
            w.pet();
            rx.await.unwrap();
            w.pet();
        }));
        tokio::time::sleep(Duration::from_millis(1200)).await;
        // Reported by now (under qemu-user the report may still be resolving names).
        let deadline = Instant::now() + Duration::from_secs(300);
        while REPORTS.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
            tokio::time::sleep(PERIOD).await;
        }
        tx.send(()).unwrap();
        waiting.await.unwrap();
        let hog = watchdog::watch_task("hog", TIMEOUT).expect("watch_task");
        tokio::spawn(hog.run(async { hog_blocks() })).await.unwrap();
    });
    // The hog's report and its worker's.
    await_reports(5);
    phase("end");
    drop(rt);
}

/// Crashes (a null dereference) in a task, inside two spans.
fn crash_in_span() {
    selftrace::init().expect("init");
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(selftrace::tasks::SpanLayer::new()),
    )
    .unwrap();
    selftrace::crash::builder()
        .all_threads(true)
        .minidump(std::env::var("TASKS_DUMP_DIR").expect("dump dir"))
        .install()
        .expect("crash handler");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::spawn(
            async {
                eprintln!("crashing task id {}", tokio::task::id());
                let p: *const u8 = black_box(std::ptr::null());
                // SAFETY: not safe at all: the crash this scenario is about.
                black_box(unsafe { p.read_volatile() });
            }
            .instrument(tracing::info_span!("parse"))
            .instrument(tracing::info_span!("upload")),
        )
        .await
        .unwrap();
    });
}

/// In a child (TASKS_SCENARIO set): run the service or the crash. In the parent: nothing.
#[test]
fn child_entry() {
    match std::env::var("TASKS_SCENARIO").as_deref() {
        Ok("service") => service(),
        Ok("crash") => crash_in_span(),
        _ => return,
    }
    std::process::exit(0);
}

// ---- the parent's side ----------------------------------------------------------------------

/// The task id printed after `prefix`.
fn task_id<'a>(text: &'a str, prefix: &str) -> &'a str {
    let at = text.find(prefix).expect(prefix) + prefix.len();
    text[at..].split_whitespace().next().unwrap()
}

/// The child's stderr cut at its `=== phase NAME` lines: (name, text) in order.
fn phases(stderr: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut rest = stderr;
    while let Some(at) = rest.find("=== phase ") {
        let after = &rest[at + 10..];
        let name_end = after.find('\n').unwrap_or(after.len());
        let body = &after[name_end..];
        let end = body.find("=== phase ").unwrap_or(body.len());
        out.push((&after[..name_end], &body[..end]));
        rest = &body[end..];
    }
    out
}

#[test]
fn workers_busy_past_their_timeout_are_reported_idle_ones_never_and_tasks_by_deadline() {
    let mut cmd = child_support::test_child();
    cmd.env("TASKS_SCENARIO", "service")
        .env("RUST_BACKTRACE", "0");
    let done =
        child_support::run_test_child(&mut cmd, child_support::deadline(120), "the tokio service");
    let e = &done.stderr;
    assert!(done.status.success(), "{}\n{e}", done.stdout);
    let phases = phases(e);
    let names: Vec<&str> = phases.iter().map(|p| p.0).collect();
    assert_eq!(
        names,
        ["idle", "blocked", "spin", "petting", "tasks", "end"],
        "{e}"
    );
    let text = |name: &str| phases.iter().find(|p| p.0 == name).unwrap().1;
    let reports = |t: &str| t.matches("------------[ selftrace: watchdog ]").count();

    // Parked workers, a sleeping blocking-pool thread, a finished block_on: nothing.
    assert_eq!(reports(text("idle")), 0, "{e}");
    assert!(!text("idle").contains("watchdog:"), "{e}");

    // The blocked worker: once, a hung task, its stack down to the handler.
    let blocked = text("blocked");
    assert_eq!(reports(blocked), 1, "{e}");
    assert_eq!(
        blocked
            .matches("watchdog: INFO: worker tokio-rt-worker:")
            .count(),
        1,
        "{e}"
    );
    assert!(blocked.contains("the worker has not parked for "), "{e}");
    let frames = frame_names(blocked);
    assert!(frames[0].contains("nanosleep"), "{e}");
    // std::thread::sleep (std::thread::functions::sleep in newer std).
    assert!(
        frames
            .iter()
            .any(|f| f.starts_with("std::thread::") && f.ends_with("::sleep")),
        "{e}"
    );
    assert!(
        frames
            .iter()
            .any(|f| f.starts_with("tasks::blocking_in_async")),
        "{e}"
    );
    assert_eq!(blocked.matches(" recovered after ").count(), 1, "{e}");
    // Under the worker's line: the task's spans, outer first, and its id as tokio prints it.
    let id = task_id(blocked, "blocking task id ");
    let thread_line = blocked
        .lines()
        .position(|l| l.starts_with("thread \"tokio-rt-worker\""))
        .unwrap_or_else(|| panic!("no thread line:\n{e}"));
    assert_eq!(
        blocked.lines().nth(thread_line + 1),
        Some(format!(" in span: request > handler (task {id})").as_str()),
        "{e}"
    );
    assert!(
        blocked.contains(&format!("\npolling task {id} spawned at {}:", file!())),
        "{e}"
    );

    // The spinning worker: a soft lockup, its stack in the spinning handler.
    let spin = text("spin");
    assert_eq!(reports(spin), 1, "{e}");
    assert_eq!(
        spin.matches("watchdog: BUG: soft lockup - worker tokio-rt-worker:")
            .count(),
        1,
        "{e}"
    );
    assert!(
        frame_names(spin)
            .iter()
            .any(|f| f.starts_with("tasks::spinning_in_async")),
        "{e}"
    );

    // Busy for as long, but petting: no report.
    assert_eq!(reports(text("petting")), 0, "{e}");

    // The deadlines.
    let tasks = text("tasks");
    assert_eq!(
        tasks
            .matches("watchdog: INFO: async task waiter blocked for more than 0.400s")
            .count(),
        1,
        "{e}"
    );
    assert!(
        tasks.contains("waiting: no thread is polling the task: it waits at an .await"),
        "{e}"
    );
    assert!(
        tasks.contains("watchdog: async task waiter recovered after "),
        "{e}"
    );
    let hog = tasks
        .split("------------[ selftrace: watchdog ]")
        .find(|r| r.contains("async task hog on "))
        .unwrap_or_else(|| panic!("no report of the hog task:\n{e}"));
    assert!(
        frame_names(hog)
            .iter()
            .any(|f| f.starts_with("tasks::hog_blocks")),
        "{e}"
    );
    // Its worker, blocked by the same poll, is reported too.
    assert!(
        tasks.contains("watchdog: INFO: worker tokio-rt-worker:"),
        "{e}"
    );
}

#[test]
fn a_crash_in_a_task_names_its_spans_and_task() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tasks-dumps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = child_support::test_child();
    cmd.env("TASKS_SCENARIO", "crash")
        .env("TASKS_DUMP_DIR", &dir)
        .env("RUST_BACKTRACE", "0");
    let done =
        child_support::run_test_child(&mut cmd, child_support::deadline(120), "the crashing task");
    let e = &done.stderr;
    assert!(!done.status.success(), "{}\n{e}", done.stdout);
    let id = task_id(e, "crashing task id ");
    // The faulting thread's line, then its spans.
    let who = e
        .lines()
        .position(|l| l.starts_with("pid ") && l.contains(", thread \"tokio-rt-worker\""))
        .unwrap_or_else(|| panic!("no faulting thread line:\n{e}"));
    assert_eq!(
        e.lines().nth(who + 1),
        Some(format!(" in span: upload > parse (task {id})").as_str()),
        "{e}"
    );
    // The other worker, idle, is in no span: no such line under it.
    assert_eq!(e.matches(" in span: ").count(), 1, "{e}");

    // The minidump: the same, as a Crashpad simple annotation keyed by the thread's id.
    let dumps: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "dmp"))
        .collect();
    assert_eq!(dumps.len(), 1, "{e}");
    let dump = minidump::Minidump::read_path(&dumps[0]).expect("rust-minidump reads the dump");
    let info = dump
        .get_stream::<minidump::MinidumpCrashpadInfo>()
        .expect("a Crashpad info stream");
    let tid: &str = e.lines().nth(who).unwrap().split(", tid ").nth(1).unwrap();
    let tid = tid.split(',').next().unwrap();
    let want = format!("upload > parse (task {id})");
    assert_eq!(
        info.simple_annotations
            .get(&format!("selftrace.span.{tid}")),
        Some(&want),
        "{:?}",
        info.simple_annotations
    );
    assert_eq!(
        info.simple_annotations.len(),
        1,
        "{:?}",
        info.simple_annotations
    );
    // What `minidump-stackwalk --dump` prints of the stream.
    let mut printed = Vec::new();
    info.print(&mut printed).unwrap();
    let printed = String::from_utf8(printed).unwrap();
    assert!(
        printed.contains(&format!(
            "simple_annotations[\"selftrace.span.{tid}\"] = {want}"
        )),
        "{printed}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The dump fd and the allocations of the dump in [`dump_in_handler`].
static DUMP_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static HANDLER_ALLOCS: AtomicUsize = AtomicUsize::new(usize::MAX);

extern "C" fn dump_in_handler(_: i32) {
    use std::os::fd::BorrowedFd;
    let fd = DUMP_FD.load(Ordering::SeqCst);
    // SAFETY: the test keeps the file open until the handler has run.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let (_, calls) = counting::counting(|| selftrace::threads::dump_all(fd));
    HANDLER_ALLOCS.store(calls, Ordering::SeqCst);
}

/// An all-thread dump inside a real signal handler reads another thread's spans without
/// allocating; `dump_all_to` writes the same into a `Vec`.
#[test]
fn a_dump_in_a_signal_handler_reads_the_spans_without_allocating() {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;
    use tracing_subscriber::layer::SubscriberExt;
    selftrace::init().unwrap();
    selftrace::threads::install().unwrap();
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let spanning = std::thread::Builder::new()
        .name("spanning".into())
        .spawn(move || {
            let subscriber =
                tracing_subscriber::registry().with(selftrace::tasks::SpanLayer::new());
            tracing::subscriber::with_default(subscriber, || {
                let _outer = tracing::info_span!("connection").entered();
                let _inner = tracing::info_span!("query").entered();
                entered_tx.send(selftrace::threads::current_tid()).unwrap();
                let _ = done_rx.recv();
            });
        })
        .unwrap();
    let tid = entered_rx.recv().unwrap();
    let mut out = tempfile_in_target("tasks-dump-in-handler");
    DUMP_FD.store(out.as_raw_fd(), Ordering::SeqCst);
    // SAFETY: a handler that only does AS-safe work; SIGUSR2 is not used otherwise here.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = dump_in_handler as extern "C" fn(i32) as usize;
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        assert_eq!(libc::raise(libc::SIGUSR2), 0);
    }
    // The same in normal context, into any writer.
    let mut written = Vec::new();
    let summary = selftrace::threads::dump_all_to(&mut written).unwrap();
    drop(done_tx);
    spanning.join().unwrap();
    assert_eq!(
        HANDLER_ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations in the handler"
    );
    let written = String::from_utf8(written).unwrap();
    assert!(summary.threads >= 2, "{summary:?}");
    assert!(
        written.contains(&format!(
            "thread \"spanning\" tid {tid}, state S (sleeping), cpu "
        )) && written.contains("\n in span: connection > query\nCall Trace:\n"),
        "{written}"
    );
    let mut text = String::new();
    out.rewind().unwrap();
    out.read_to_string(&mut text).unwrap();
    let line = text
        .lines()
        .position(|l| l.starts_with(&format!("thread \"spanning\" tid {tid},")))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        text.lines().nth(line + 1),
        Some(" in span: connection > query"),
        "{text}"
    );
}

/// A new, empty file under the test target's tmp dir (removed when the test ends).
fn tempfile_in_target(name: &str) -> std::fs::File {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}

// ---- the task dump ---------------------------------------------------------------------------

/// The line of each kind's `.await` (the ground truth the dump must match), set as the tasks
/// reach it: the `line!()` is on the same line as the `.await`.
static LINE_A: AtomicUsize = AtomicUsize::new(0);
static LINE_B: AtomicUsize = AtomicUsize::new(0);
static LINE_C: AtomicUsize = AtomicUsize::new(0);
static LINE_RECV: AtomicUsize = AtomicUsize::new(0);
static LINE_JOIN: AtomicUsize = AtomicUsize::new(0);
static LINE_SELECT: AtomicUsize = AtomicUsize::new(0);
static LINE_X: AtomicUsize = AtomicUsize::new(0);
/// Held by the tests that trace tasks in this process (the dump lists every traced task).
static TRACING_TASKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Set to let the blocking tasks end.
static RELEASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[rustfmt::skip]
async fn chain_a() {
    { LINE_A.store(line!() as usize, Ordering::SeqCst); chain_b().await }
}

#[rustfmt::skip]
async fn chain_b() {
    { LINE_B.store(line!() as usize, Ordering::SeqCst); chain_c().await }
}

#[rustfmt::skip]
async fn chain_c() {
    { LINE_C.store(line!() as usize, Ordering::SeqCst); tokio::time::sleep(Duration::from_secs(600)).await }
}

#[rustfmt::skip]
async fn receiver(mut rx: tokio::sync::mpsc::Receiver<u32>) {
    { LINE_RECV.store(line!() as usize, Ordering::SeqCst); black_box(rx.recv().await); }
}

#[rustfmt::skip]
async fn branch_x() {
    { LINE_X.store(line!() as usize, Ordering::SeqCst); tokio::time::sleep(Duration::from_secs(600)).await }
}

#[rustfmt::skip]
async fn joiner() {
    { LINE_JOIN.store(line!() as usize, Ordering::SeqCst); tokio::join!(branch_x(), chain_c()); }
}

#[rustfmt::skip]
async fn selecter(mut rx: tokio::sync::mpsc::Receiver<u32>) {
    { LINE_SELECT.store(line!() as usize, Ordering::SeqCst); tokio::select! { _ = tokio::time::sleep(Duration::from_secs(600)) => {}, _ = rx.recv() => {} } }
}

/// Blocks its worker until released (without yielding).
async fn blocking_until_released() {
    while !RELEASE.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Spins on its worker until released (without yielding).
async fn spinning_until_released() {
    while !RELEASE.load(Ordering::SeqCst) {
        black_box(());
    }
}

/// 200 tasks in known states, traced through `tasks::spawn`: 50 a→b→c chains asleep, 50 in
/// `mpsc::recv`, 49 in `join!`, 49 in `select!`, one blocking its worker in
/// `std::thread::sleep` and one spinning on the other: both workers stuck. The dump lists all
/// of them, each idle one's chain with the lines of its `.await`s, the two stuck ones as
/// running with their worker's stack, which equals gdb's (`thread apply all bt`, attached
/// meanwhile) from the task's function outward.
#[test]
fn the_task_dump_lists_every_task_and_where_each_waits() {
    let _alone = TRACING_TASKS.lock().unwrap_or_else(|e| e.into_inner());
    selftrace::init().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let mut senders = Vec::new();
    let mut handles = Vec::new();
    rt.block_on(async {
        for _ in 0..50 {
            handles.push(selftrace::tasks::spawn(chain_a()));
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            senders.push(tx);
            handles.push(selftrace::tasks::spawn(receiver(rx)));
        }
        for _ in 0..49 {
            handles.push(selftrace::tasks::spawn(joiner()));
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            senders.push(tx);
            handles.push(selftrace::tasks::spawn(selecter(rx)));
        }
        // Every idle task has reached its await.
        tokio::time::sleep(Duration::from_millis(300)).await;
    });
    handles.push(rt.spawn(selftrace::tasks::traced(blocking_until_released())));
    handles.push(rt.spawn(selftrace::tasks::traced(spinning_until_released())));
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut text = Vec::new();
    let summary = selftrace::tasks::dump_to(&mut text).unwrap();
    let took = started.elapsed();
    // Again, with the DWARF parsed and the layouts cached (what a second SIGQUIT costs).
    let started = Instant::now();
    let again = selftrace::tasks::dump_to(std::io::sink()).unwrap();
    let took_again = started.elapsed();
    // gdb's view of the same stuck workers (attached to this process meanwhile).
    let gdb = gdb_backtraces();
    RELEASE.store(true, Ordering::SeqCst);
    let text = String::from_utf8(text).unwrap();
    println!(
        "{text}\ndump of {} tasks in {took:?} (first), {took_again:?} (again: {again:?})",
        summary.tasks
    );
    assert_eq!(summary.tasks, 200, "{text}");
    assert_eq!(summary.running, 2, "{text}");
    assert_eq!(summary.idle, 198, "{text}");
    let tasks: Vec<&str> = text.split("\ntask ").skip(1).collect();
    assert_eq!(tasks.len(), 200);
    let here = file!();
    let line = |l: &AtomicUsize| format!("{here}:{}", l.load(Ordering::SeqCst));
    let chain = [
        format!(" #0 tasks::chain_a Suspend0 at {}", line(&LINE_A)),
        format!(" #1 tasks::chain_b Suspend0 at {}", line(&LINE_B)),
        format!(" #2 tasks::chain_c Suspend0 at {}", line(&LINE_C)),
        " #3 tokio::time::sleep::Sleep".to_string(),
    ];
    let count = |pred: &dyn Fn(&str) -> bool| tasks.iter().filter(|t| pred(t)).count();
    assert_eq!(
        count(&|t| chain
            .iter()
            .all(|l| t.lines().any(|x| x.ends_with(l.as_str()) || x == l))),
        50,
        "{text}"
    );
    assert_eq!(
        count(&|t| t.contains(&format!(
            " #0 tasks::receiver Suspend0 at {}",
            line(&LINE_RECV)
        )) && t.contains("recv")),
        50,
        "{text}"
    );
    // join!: its `.await` is the macro's (its line is tokio's), in the async fn whose line
    // (the one before the `join!`) is given; both branches, each to its leaf.
    let fn_line = |l: &AtomicUsize| format!("{here}:{}", l.load(Ordering::SeqCst) - 1);
    let in_fn = |l: &AtomicUsize| format!("(a macro's .await, in the async fn at {})", fn_line(l));
    assert_eq!(
        count(&|t| t.contains(" #0 tasks::joiner Suspend0 at ")
            && t.contains("/src/macros/join.rs:")
            && t.contains(&in_fn(&LINE_JOIN))
            && t.contains(&format!("tasks::branch_x Suspend0 at {}", line(&LINE_X)))
            && t.contains(&format!("tasks::chain_c Suspend0 at {}", line(&LINE_C)))),
        49,
        "{text}"
    );
    assert_eq!(
        count(&|t| t.contains(" #0 tasks::selecter Suspend0 at ")
            && t.contains(&in_fn(&LINE_SELECT))
            && t.contains(" #1 tokio::time::sleep::Sleep")
            && t.contains(" #1 tokio::sync::mpsc::bounded::{impl#0}::recv Suspend0")),
        49,
        "{text}"
    );
    // The two that hold their workers: running, with the worker's stack.
    let running: Vec<&&str> = tasks
        .iter()
        .filter(|t| t.contains(", running on thread"))
        .collect();
    assert_eq!(running.len(), 2, "{text}");
    assert!(
        running
            .iter()
            .any(|t| t.contains("tasks::blocking_until_released")),
        "{text}"
    );
    assert!(
        running
            .iter()
            .any(|t| t.contains("tasks::spinning_until_released")),
        "{text}"
    );
    // Each worker's stack as gdb's `thread apply all bt` has it: the return addresses of the
    // callers of the task's own function (the frames from there in move: one of them spins).
    match gdb {
        Err(why) => {
            assert!(
                std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none()
                    || !cfg!(target_arch = "x86_64"),
                "gdb: {why}"
            );
            println!("not compared with gdb: {why}");
        }
        Ok(gdb) => {
            for f in ["blocking_until_released", "spinning_until_released"] {
                let t = running.iter().find(|t| t.contains(f)).unwrap();
                let tid: i32 = t
                    .split("running on thread tid ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|r| r.parse().ok())
                    .unwrap();
                let ours: Vec<usize> = t
                    .lines()
                    .skip_while(|l| !l.contains(f))
                    .skip(1)
                    .filter_map(|l| l.split(" : ").next()?.split(" 0x").nth(1))
                    .map(|a| usize::from_str_radix(a, 16).unwrap())
                    .collect();
                let theirs = gdb
                    .get(&tid)
                    .unwrap_or_else(|| panic!("no thread {tid} in gdb's output"));
                let from = theirs
                    .iter()
                    .position(|(_, n)| n.contains(f))
                    .unwrap_or_else(|| panic!("{f} not in gdb's bt of {tid}: {theirs:?}"));
                let theirs: Vec<usize> = theirs[from + 1..].iter().map(|(a, _)| *a).collect();
                let n = ours.len().min(theirs.len());
                assert!(n >= 8, "ours {ours:x?}\ngdb's {theirs:x?}");
                assert_eq!(ours[..n], theirs[..n], "{f}: ours against gdb's\n{t}");
                println!("{f}: {n} frames equal to gdb's");
            }
        }
    }
    drop(senders);
    rt.shutdown_timeout(Duration::from_secs(5));
}

/// `gdb -batch -p PID -ex 'thread apply all bt'` on this process: each thread's physical
/// frames (pc, 0 for frame 0; the function names, with those of the frames gdb shows inlined
/// into it), by thread id.
fn gdb_backtraces() -> Result<std::collections::HashMap<i32, Vec<(usize, String)>>, String> {
    if !cfg!(target_arch = "x86_64") {
        return Err("under qemu-user, gdb cannot attach to the emulated process".into());
    }
    // Its output into a file, not a pipe: gdb stops every thread of this process, the one
    // that would read a pipe too, and a full pipe would stop gdb.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tasks-gdb-{}.txt", std::process::id()));
    let file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let out = std::process::Command::new("gdb")
        .args(["-nx", "-batch", "-p"])
        .arg(std::process::id().to_string())
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt"])
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .output()
        .map_err(|e| format!("gdb (Debian package gdb): {e}"))?;
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    let mut threads = std::collections::HashMap::new();
    let mut current: Option<(i32, Vec<(usize, String)>)> = None;
    let mut inlined = String::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("Thread ") {
            if let Some((tid, frames)) = current.take() {
                threads.insert(tid, frames);
            }
            inlined.clear();
            let tid = rest.split("(LWP ").nth(1).and_then(|r| r.split(')').next());
            if let Some(tid) = tid.and_then(|t| t.parse().ok()) {
                current = Some((tid, Vec::new()));
            }
        } else if let (Some(rest), Some((_, frames))) = (l.strip_prefix('#'), current.as_mut()) {
            // `#3  0x000055d0c0a3d1f0 in name (...) at file:line`; without `0x… in` for frame
            // 0 and for a frame inlined into the next physical one.
            let (number, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let rest = rest.trim_start();
            if let Some(a) = rest.strip_prefix("0x") {
                let (addr, name) = a.split_once(" in ").unwrap_or((a, ""));
                if let Ok(addr) = usize::from_str_radix(addr.trim(), 16) {
                    frames.push((addr, format!("{inlined}{name}")));
                    inlined.clear();
                }
            } else if number == "0" && inlined.is_empty() && frames.is_empty() {
                frames.push((0, rest.to_string()));
            } else {
                inlined.push_str(rest.split(" (").next().unwrap_or(""));
                inlined.push(' ');
            }
        }
    }
    if let Some((tid, frames)) = current {
        threads.insert(tid, frames);
    }
    if threads.is_empty() {
        return Err(format!("gdb listed no thread ({}):\n{text}", out.status));
    }
    Ok(threads)
}

/// The dump signal, with `tasks::dump_on_signal`: the all-thread dump, then the task dump,
/// written to the dump signal's fd (here a pipe).
#[test]
fn the_dump_signal_also_dumps_the_tasks() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let _alone = TRACING_TASKS.lock().unwrap_or_else(|e| e.into_inner());
    selftrace::init().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let task = {
        let _in = rt.enter();
        selftrace::tasks::spawn(chain_a())
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut fds = [0i32; 2];
    // SAFETY: room for the two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both fds were just made and are owned here.
    let (mut read, write) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            OwnedFd::from_raw_fd(fds[1]),
        )
    };
    selftrace::threads::install_dump_signal_to(libc::SIGQUIT, write).unwrap();
    selftrace::tasks::dump_on_signal().unwrap();
    // SAFETY: a signal to this process, whose handler was just installed.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGQUIT) }, 0);
    let mut text = Vec::new();
    let mut buf = [0u8; 65536];
    while !String::from_utf8_lossy(&text).contains("---[ end of tasks ]---") {
        let n = read.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&text));
        text.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(text).unwrap();
    let threads = text
        .find("---[ end of all threads ]---")
        .expect("the thread dump");
    let tasks = text
        .find("------------[ selftrace: tasks ]")
        .expect("the task dump");
    assert!(threads < tasks, "{text}");
    assert!(
        text.contains(&format!(
            " #0 tasks::chain_a Suspend0 at {}:{}",
            file!(),
            LINE_A.load(Ordering::SeqCst)
        )),
        "{text}"
    );
    task.abort();
    rt.shutdown_timeout(Duration::from_secs(5));
}
