//! Trace markers written through `selftrace::trace` and read back from a private tracefs
//! instance (`copy_trace_marker`): exact lines, nesting, threads, fork, sanitising,
//! truncation, many concurrent writers, tags, and no event lost while the first one opens the
//! marker file (fresh child processes, this binary re-run).
//!
//! Needs root and tracefs; skips with a reason otherwise (fails under
//! `SELFTRACE_REQUIRE_TRACEFS=1`). Tests run in parallel in one process: each filters the
//! events by its own thread id and unique names.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "trace", feature = "tracefs"))]

mod markers_util;

use std::sync::RwLock;

use markers_util::*;
use selftrace::trace::{self, Tracer, MAX_EVENT, TAG_IO};
use selftrace::tracefs::MarkerKind;

/// The flood test writes 80,000 markers, and the first-use tests 200 processes' worth, which
/// every instance copying markers records too; they run alone so that other tests' instances
/// do not overflow.
static FLOOD: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    FLOOD.read().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn each_call_writes_the_expected_line() {
    let _g = shared();
    let Some(inst) = setup("each_call_writes_the_expected_line") else {
        return;
    };
    let t = token("calls");
    let p = pid();
    trace::begin_section(&format!("{t} frame 1"));
    trace::end_section();
    trace::begin_async_section(&format!("{t} load"), 7);
    trace::end_async_section(&format!("{t} load"), 7);
    trace::begin_async_section_for_track(&format!("{t} track"), &format!("{t} req"), -9);
    trace::end_async_section_for_track(&format!("{t} track"), -9);
    trace::instant(&format!("{t} vsync"));
    trace::instant_for_track(&format!("{t} track"), &format!("{t} tick"));
    trace::set_counter(&format!("{t} depth"), -42);
    trace::set_counter(&format!("{t} big"), i64::MAX);
    {
        let _s = trace::section(&format!("{t} guarded"));
    }
    let n = 3;
    {
        let _s = trace::section!("{t} formatted {}", n);
    }
    trace::begin_section!("{t} begin {n:03}");
    trace::end_section();
    trace::instant!("{t} inst {}", n + 1);
    trace::begin_async_section!(11, "{t} fmt async {}", n);
    trace::end_async_section!(11, "{t} fmt async {}", n);
    const IO: Tracer = Tracer::new(TAG_IO);
    IO.instant(&format!("{t} io"));
    let _ = trace::section!(IO => "{t} io section");

    let expected = [
        format!("B|{p}|{t} frame 1"),
        format!("E|{p}"),
        format!("S|{p}|{t} load|7"),
        format!("F|{p}|{t} load|7"),
        format!("G|{p}|{t} track|{t} req|-9"),
        format!("H|{p}|{t} track|-9"),
        format!("I|{p}|{t} vsync"),
        format!("N|{p}|{t} track|{t} tick"),
        format!("C|{p}|{t} depth|-42"),
        format!("C|{p}|{t} big|9223372036854775807"),
        format!("B|{p}|{t} guarded"),
        format!("E|{p}"),
        format!("B|{p}|{t} formatted 3"),
        format!("E|{p}"),
        format!("B|{p}|{t} begin 003"),
        format!("E|{p}"),
        format!("I|{p}|{t} inst 4"),
        format!("S|{p}|{t} fmt async 3|11"),
        format!("F|{p}|{t} fmt async 3|11"),
        format!("I|{p}|{t} io"),
        format!("B|{p}|{t} io section"),
        format!("E|{p}"),
    ];
    assert_eq!(texts_of(&inst, tid()), expected);

    // The raw trace text carries the line as the kernel prints it.
    let raw = inst.read_trace().unwrap();
    assert!(
        raw.contains(&format!("tracing_mark_write: B|{p}|{t} frame 1\n")),
        "{raw}"
    );
    // And the structured fields.
    let evs = events_of(&inst, tid());
    let g = &evs[4];
    assert_eq!(g.kind, MarkerKind::TrackBegin);
    assert_eq!(g.pid, Some(p));
    assert_eq!(g.track.as_deref(), Some(&*format!("{t} track")));
    assert_eq!(g.name, format!("{t} req"));
    assert_eq!(g.value, Some(-9));
    assert_eq!(evs[8].kind, MarkerKind::Counter);
    assert_eq!(evs[8].value, Some(-42));
    assert!(evs
        .windows(2)
        .all(|w| w[0].timestamp_ns <= w[1].timestamp_ns));
    assert_eq!(
        trace::marker_path().unwrap().file_name().unwrap(),
        "trace_marker"
    );
}

#[test]
fn nested_sections_on_several_threads() {
    let _g = shared();
    let Some(inst) = setup("nested_sections_on_several_threads") else {
        return;
    };
    let t = token("nested");
    let p = pid();
    let work = |who: String| {
        let _a = trace::section(&format!("{t} {who} outer"));
        {
            let _b = trace::section(&format!("{t} {who} middle"));
            let _c = trace::section!("{t} {who} inner");
        }
        trace::instant(&format!("{t} {who} after"));
        tid()
    };
    let tids: Vec<(String, u32)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let who = format!("thread{i}");
                s.spawn(move || (who.clone(), work(who)))
            })
            .collect();
        let mine = ("main".to_string(), work("main".to_string()));
        let mut v: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        v.push(mine);
        v
    });
    for (who, tid) in tids {
        assert_eq!(
            texts_of(&inst, tid),
            [
                format!("B|{p}|{t} {who} outer"),
                format!("B|{p}|{t} {who} middle"),
                format!("B|{p}|{t} {who} inner"),
                format!("E|{p}"),
                format!("E|{p}"),
                format!("I|{p}|{t} {who} after"),
                format!("E|{p}"),
            ],
            "thread {who}"
        );
    }
}

#[test]
fn section_guard_ends_during_panic_unwinding() {
    let _g = shared();
    let Some(inst) = setup("section_guard_ends_during_panic_unwinding") else {
        return;
    };
    let t = token("panic");
    let p = pid();
    let r = std::panic::catch_unwind(|| {
        let _s = trace::section(&format!("{t} doomed"));
        panic!("boom");
    });
    assert!(r.is_err());
    assert_eq!(
        texts_of(&inst, tid()),
        [format!("B|{p}|{t} doomed"), format!("E|{p}")]
    );
}

#[test]
fn forked_child_writes_its_own_pid() {
    let _g = shared();
    let Some(inst) = setup("forked_child_writes_its_own_pid") else {
        return;
    };
    let t = token("fork");
    let p = pid();
    let parent_name = format!("{t} parent");
    let child_name = format!("{t} child");
    trace::instant(&parent_name); // caches the parent's pid
                                  // SAFETY: the child only calls async-signal-safe functions (the marker API and _exit).
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        trace::instant(&child_name);
        // SAFETY: _exit is async-signal-safe and ends the child without running destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    trace::instant(&parent_name);
    let c = child as u32;
    assert_eq!(
        texts_of(&inst, c),
        [format!("I|{c}|{child_name}")],
        "the child writes its own pid"
    );
    assert_eq!(
        texts_of(&inst, tid()),
        [
            format!("I|{p}|{parent_name}"),
            format!("I|{p}|{parent_name}")
        ],
        "the parent keeps its pid"
    );
}

#[test]
fn names_are_sanitised_and_truncated_at_a_char_boundary() {
    let _g = shared();
    let Some(inst) = setup("names_are_sanitised_and_truncated") else {
        return;
    };
    let t = token("trunc");
    let p = pid();
    let before = trace::stats().truncated;

    trace::instant(&format!("{t} a|b\nc\0d\re"));

    // S|pid|NAME|cookie: choose the name so that a 3-byte character straddles the cut.
    let cookie = 1234567;
    let fixed = format!("S|{p}||{cookie}").len();
    let budget = MAX_EVENT - fixed;
    let mut name = format!("{t} ");
    while name.len() < budget - 1 {
        name.push('x');
    }
    name.truncate(budget - 1);
    name.push('€'); // bytes budget-1 .. budget+2: cut in the middle
    name.push_str(&"y".repeat(4000 - name.len()));
    assert!(name.len() >= 4000);
    trace::begin_async_section(&name, cookie);
    let kept = &name[..budget - 1];

    // A 4000-byte counter name keeps its value.
    let long = format!("{t} {}", "z".repeat(4000));
    trace::set_counter(&long, -1);
    // Multi-byte characters all the way, through the formatting path.
    let wide = "日本".repeat(1000);
    trace::instant!("{t} {wide}");

    let evs = events_of(&inst, tid());
    let texts: Vec<&str> = evs.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(texts.len(), 4, "{texts:?}");
    assert_eq!(texts[0], format!("I|{p}|{t} a!b c d e"));
    assert_eq!(texts[1], format!("S|{p}|{kept}|{cookie}"));
    assert_eq!(texts[1].len(), MAX_EVENT - 1);
    assert_eq!(evs[1].value, Some(cookie));
    let c = format!(
        "C|{p}|{}|-1",
        &long[..MAX_EVENT - format!("C|{p}||-1").len()]
    );
    assert_eq!(texts[2], c);
    assert_eq!(texts[2].len(), MAX_EVENT);
    assert!(texts[3].starts_with(&format!("I|{p}|{t} 日本")));
    assert!(texts[3].len() <= MAX_EVENT && texts[3].len() > MAX_EVENT - 3);
    assert!(texts[3].ends_with('日') || texts[3].ends_with('本'));
    assert!(trace::stats().truncated >= before + 3);
}

#[test]
fn eight_threads_ten_thousand_events_each_all_intact() {
    let _g = FLOOD.write().unwrap_or_else(|p| p.into_inner());
    // ~80,000 events of ~60 bytes on 2 CPUs: make room (before markers are copied).
    let Some(inst) = setup_with_buffer("eight_threads_ten_thousand_events_each", Some(16 * 1024))
    else {
        return;
    };
    let t = token("flood");
    let p = pid();
    const THREADS: usize = 8;
    const EVENTS: usize = 10_000;
    let tids: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|i| {
                let t = &t;
                s.spawn(move || {
                    for n in 0..EVENTS {
                        trace::instant!("{t} w{i} e{n}");
                    }
                    tid()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all = inst.read_markers().unwrap();
    for (i, tid) in tids.into_iter().enumerate() {
        let mine: Vec<&str> = all
            .iter()
            .filter(|e| e.tid == tid)
            .map(|e| e.text.as_str())
            .collect();
        assert_eq!(mine.len(), EVENTS, "thread {i}");
        for (n, text) in mine.iter().enumerate() {
            assert_eq!(
                *text,
                format!("I|{p}|{t} w{i} e{n}"),
                "thread {i} event {n}"
            );
        }
    }
}

#[test]
fn disabled_tags_write_nothing() {
    let _g = shared();
    let Some(inst) = setup("disabled_tags_write_nothing") else {
        return;
    };
    let t = token("tags");
    let p = pid();
    // A bit nobody else uses, so that parallel tests are not disturbed.
    const MINE: Tracer = Tracer::new(1 << 40);
    trace::disable_tags(1 << 40);
    assert!(!MINE.is_enabled());
    MINE.instant(&format!("{t} hidden"));
    // The formatting forms do not even evaluate their arguments when disabled.
    let evaluated = std::cell::Cell::new(0);
    let count = || {
        evaluated.set(evaluated.get() + 1);
        1
    };
    let _ = trace::section!(MINE => "{t} hidden {}", count());
    trace::instant!(MINE => "{t} hidden {}", count());
    trace::begin_async_section!(MINE => 1, "{t} hidden {}", count());
    assert_eq!(evaluated.get(), 0);
    trace::enable_tags(1 << 40);
    assert!(MINE.is_enabled());
    MINE.instant(&format!("{t} shown"));
    trace::instant!(MINE => "{t} shown {}", count());
    assert_eq!(evaluated.get(), 1);
    assert_eq!(
        texts_of(&inst, tid()),
        [format!("I|{p}|{t} shown"), format!("I|{p}|{t} shown 1")]
    );
}

#[test]
fn tags_come_from_the_environment_at_start() {
    let _g = shared();
    // The child: this same test, re-run in a process started with SELFTRACE_TAGS.
    if std::env::var_os("SELFTRACE_MARKERS_TEST_CHILD").is_some() {
        assert_eq!(trace::tags(), TAG_IO | (1 << 41));
        let t = std::env::var("SELFTRACE_MARKERS_TEST_CHILD").unwrap();
        trace::instant(&format!("{t} app"));
        Tracer::new(TAG_IO).instant(&format!("{t} io"));
        Tracer::new(1 << 41).instant(&format!("{t} bit41"));
        return;
    }
    assert_eq!(trace::parse_tags("app, io,bit41").unwrap(), 0b11 | 1 << 41);
    assert_eq!(trace::parse_tags("0x30").unwrap(), 0x30);
    assert_eq!(trace::parse_tags("all").unwrap(), u64::MAX);
    assert_eq!(trace::parse_tags("none").unwrap(), 0);
    assert!(trace::parse_tags("nonsense").is_err());
    let Some(inst) = setup("tags_come_from_the_environment_at_start") else {
        return;
    };
    let t = token("env");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tags_come_from_the_environment_at_start",
            "--nocapture",
        ])
        .env("SELFTRACE_TAGS", "io,bit41")
        .env("SELFTRACE_MARKERS_TEST_CHILD", &t)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let child: Vec<_> = inst
        .read_markers()
        .unwrap()
        .into_iter()
        .filter(|e| e.name.starts_with(&t))
        .collect();
    let cpid = child
        .first()
        .and_then(|e| e.pid)
        .expect("child wrote markers");
    assert_ne!(cpid, pid());
    let texts: Vec<_> = child.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(
        texts,
        [format!("I|{cpid}|{t} io"), format!("I|{cpid}|{t} bit41")]
    );
}

#[test]
fn marker_fd_is_close_on_exec() {
    let _g = shared();
    if setup("marker_fd_is_close_on_exec").is_none() {
        return;
    }
    let marker = trace::marker_path().expect("marker path");
    let mut found = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if std::fs::read_link(entry.path()).ok().as_deref() != Some(marker.as_path()) {
            continue;
        }
        let fd = entry.file_name().into_string().unwrap();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        assert_ne!(flags & libc::O_CLOEXEC as u32, 0, "fd {fd} lacks O_CLOEXEC");
        assert_eq!(flags & libc::O_ACCMODE as u32, libc::O_WRONLY as u32);
        found += 1;
    }
    assert!(found >= 1, "the writer's fd to {marker:?} was not found");
}

#[test]
fn tracefs_root_is_found_and_real_kernel_lines_parse() {
    let _g = shared();
    let Some(inst) = setup("tracefs_root_is_found_and_real_kernel_lines_parse") else {
        return;
    };
    let root = selftrace::tracefs::root().unwrap();
    assert!(root.join("trace_marker").exists());
    assert_eq!(selftrace::tracefs::discover().unwrap(), root);
    // Kernel events of another kind next to the markers: every line parses.
    inst.set_event_enabled("sched", "sched_switch", true)
        .unwrap();
    let t = token("records");
    for i in 0..20 {
        trace::instant(&format!("{t} {i}"));
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    inst.set_event_enabled("sched", "sched_switch", false)
        .unwrap();
    let text = inst.read_trace().unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let records: Vec<_> = lines
        .iter()
        .map(|l| selftrace::tracefs::parse_record(l).unwrap_or_else(|| panic!("unparsed: {l}")))
        .collect();
    assert!(records
        .iter()
        .any(|r| r.event == "sched_switch" && r.body.contains("prev_comm=") && r.timestamp_ns > 0));
    let mine: Vec<_> = records
        .iter()
        .filter(|r| r.event == "tracing_mark_write" && r.body.contains(&t))
        .collect();
    assert_eq!(mine.len(), 20);
    assert!(mine.iter().all(|r| r.tid == tid() && r.flags.is_some()));
}

#[test]
fn without_copy_trace_marker_the_top_level_buffer_is_read_without_consuming_it() {
    let _g = shared();
    if setup("without_copy_trace_marker_the_top_level_buffer_is_read").is_none() {
        return;
    }
    // An instance for markers that does not copy them: what older kernels give.
    let inst =
        selftrace::tracefs::Instance::for_markers_without_copy("selftrace-markers-nocopy").unwrap();
    assert!(!inst.copies_markers());
    let t = token("nocopy");
    trace::instant(&format!("{t} top"));
    let expected = [format!("I|{}|{t} top", pid())];
    for _ in 0..2 {
        let texts: Vec<String> = inst
            .read_markers()
            .unwrap()
            .into_iter()
            .filter(|e| e.tid == tid() && e.name.starts_with(&t))
            .map(|e| e.text)
            .collect();
        assert_eq!(texts, expected);
    }
}

/// Issue 45: an instance written to through its own `trace_marker` returned the markers of the
/// whole machine's top-level buffer too (79,488 events in the report), contrary to its doc: an
/// instance reads its own buffer.
#[test]
fn an_instance_reads_only_its_own_markers() {
    let _g = shared();
    if setup("an_instance_reads_only_its_own_markers").is_none() {
        return;
    }
    let inst = selftrace::tracefs::Instance::create("selftrace-markers-own").unwrap();
    let t = token("own");
    // One marker through the global writer (the top-level `trace_marker`), one written
    // straight into the instance's own.
    trace::instant(&format!("{t} top"));
    let own = format!("I|{}|{t} own", pid());
    std::fs::write(inst.marker_path(), &own).unwrap();
    let texts: Vec<String> = inst
        .read_markers()
        .unwrap()
        .into_iter()
        .filter(|e| e.name.starts_with(&t))
        .map(|e| e.text)
        .collect();
    assert_eq!(texts, [own]);
}

/// Set in the children of the first-use tests, to the run's token.
const FIRST_USE_CHILD: &str = "SELFTRACE_MARKERS_FIRST_USE_CHILD";
/// Fresh processes per first-use test (the marker file is opened once per process).
const FIRST_USE_RUNS: usize = 200;

/// What each thread of a first-use child writes, `n` times.
#[derive(Clone, Copy)]
enum FirstUse {
    /// A section guard: `B|pid|name`, then `E|pid`.
    Sections,
    /// The counter values `0..n`: `C|pid|name|value`.
    Counters,
}

#[test]
fn first_use_by_eight_threads_loses_no_section() {
    first_use(
        "first_use_by_eight_threads_loses_no_section",
        FirstUse::Sections,
        8,
        100,
    );
}

#[test]
fn first_use_by_four_threads_loses_no_counter() {
    first_use(
        "first_use_by_four_threads_loses_no_counter",
        FirstUse::Counters,
        4,
        250,
    );
}

/// Runs [`first_use_child`] in `FIRST_USE_RUNS` fresh processes, one after the other, and
/// checks in a private instance that every event of every run arrived, in order, per thread
/// (so `B`/`E` balance). A run during which the kernel dropped events proves nothing and is
/// run again (another process may flood `trace_marker`; its markers are copied here too).
fn first_use(test: &str, what: FirstUse, threads: usize, n: usize) {
    if let Ok(t) = std::env::var(FIRST_USE_CHILD) {
        return first_use_child(what, threads, n, &t);
    }
    // Alone: 200 children's markers would fill the other tests' instances.
    let _g = FLOOD.write().unwrap_or_else(|p| p.into_inner());
    let Some(inst) = setup(test) else {
        return;
    };
    if !inst.copies_markers() {
        // The top-level buffer, read instead, is everybody's and is never cleared.
        return skip(test, "no copy_trace_marker (Linux 6.17+)").unwrap_or(());
    }
    let t = token("first-use");
    let (mut lossy, mut lost, mut skipped, mut repeated) = (Vec::new(), 0, 0, 0);
    let started = std::time::Instant::now();
    let mut run = 0;
    while run < FIRST_USE_RUNS {
        let rt = format!("{t}-r{run}");
        inst.clear().unwrap();
        let dropped = inst.dropped_events().unwrap();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(FIRST_USE_CHILD, &rt)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let cpid = child.id();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "run {run}: child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let events = inst.read_markers().unwrap();
        if inst.dropped_events().unwrap() != dropped {
            repeated += 1;
            assert!(
                repeated <= 20,
                "the kernel dropped events in {repeated} runs"
            );
            continue;
        }
        skipped += stdout
            .split("skipped_during_init: ")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|s| s.parse::<u64>().ok())
            .expect("the child prints its stats");
        // Each thread's events, found by the name of its first event.
        let mut by_tid = std::collections::BTreeMap::<u32, Vec<_>>::new();
        for e in events.into_iter().filter(|e| e.pid == Some(cpid)) {
            by_tid.entry(e.tid).or_default().push(e);
        }
        assert!(by_tid.len() <= threads, "run {run}: {by_tid:#?}");
        let mut missing = 0;
        for i in 0..threads {
            let name = format!("{rt} w{i}");
            let expected: Vec<String> = match what {
                FirstUse::Sections => (0..n)
                    .flat_map(|_| [format!("B|{cpid}|{name}"), format!("E|{cpid}")])
                    .collect(),
                FirstUse::Counters => (0..n).map(|v| format!("C|{cpid}|{name}|{v}")).collect(),
            };
            let got: Vec<String> = by_tid
                .values()
                .find(|evs| evs[0].name == name)
                .map(|evs| evs.iter().map(|e| e.text.clone()).collect())
                .unwrap_or_default();
            assert!(got.len() <= expected.len(), "run {run} thread {i}: {got:?}");
            if got.len() < expected.len() {
                missing += expected.len() - got.len();
                continue;
            }
            assert_eq!(got, expected, "run {run} thread {i}");
        }
        if missing > 0 {
            lossy.push(run);
            lost += missing;
        }
        run += 1;
    }
    println!(
        "{test}: {FIRST_USE_RUNS} processes, {threads} threads x {n} iterations from the start: \
         {} runs lost {lost} events (first runs: {:?}); skipped_during_init summed {skipped}; \
         {repeated} runs repeated after kernel drops; {:.1} s",
        lossy.len(),
        &lossy[..lossy.len().min(10)],
        started.elapsed().as_secs_f64()
    );
    assert!(lossy.is_empty(), "{} runs lost {lost} events", lossy.len());
}

/// One run: `threads` threads, released together by a barrier, write from their first
/// instruction, with no `trace::init()` before: one of them opens the marker file while the
/// others write.
fn first_use_child(what: FirstUse, threads: usize, n: usize, t: &str) {
    assert_eq!(trace::status(), trace::Status::Uninitialized);
    let names: Vec<String> = (0..threads).map(|i| format!("{t} w{i}")).collect();
    let start = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        for name in &names {
            let start = &start;
            s.spawn(move || {
                start.wait();
                for v in 0..n as i64 {
                    match what {
                        FirstUse::Sections => drop(trace::section(name)),
                        FirstUse::Counters => trace::set_counter(name, v),
                    }
                }
            });
        }
    });
    println!("stats: {:?}", trace::stats());
    assert_eq!(trace::status(), trace::Status::Enabled);
}
