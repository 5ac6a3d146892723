//! `selftrace list` and `selftrace record` end to end: a demo program with known probe values,
//! sections, async sections, counters, instants, a thread and a child process is recorded; the
//! text trace and the Chrome JSON hold exactly those; nothing of the recorder's is left in
//! `uprobe_events` or `instances/`, also when it fails with an error. (Crashes, signals and
//! SIGKILL: tests/record/signals.rs.)
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "tracefs")]

use crate::record_support;
// The USDT tests' fixtures: a program that dlopens a cdylib with probes.
use crate::usdt_support;

use record_support::*;
use selftrace::tracefs::{self, MarkerKind};
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::Command;

#[test]
fn list_shows_probes_and_arguments() {
    let bin = record_target();
    let o = selftrace().arg("list").arg(&bin).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("rt:step  [a0: u64 %"), "{s}");
    assert!(s.contains(", a1: i32 %"), "{s}");
    assert!(s.contains("rt:child  [a0: u32"), "{s}");
    assert!(s.contains("semaphore 0x"), "{s}");
}

#[test]
fn record_writes_text_json_and_summary() {
    if !usable("record_writes_text_json_and_summary") {
        return;
    }
    let bin = record_target();
    let file = out_file("full");
    let (o, rec) = record(&[
        "-o",
        file.to_str().unwrap(),
        "--sched",
        "--uprobe",
        "record_target_compute",
        "--uprobe",
        "record_target_compute%return",
        "--",
        bin.to_str().unwrap(),
        "run",
        "4",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_clean(rec);
    // The kernel raised the semaphores of a process started after the events were enabled.
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("rt:step enabled=true"), "{stdout}");
    assert!(stdout.contains("rt:lazy evaluated"), "{stdout}");

    // The text trace: exact probe values, and nothing from other processes.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# tracer: nop"), "{text}");
    let recs: Vec<_> = tracefs::records(&text).collect();
    let body = |ev: &str| -> Vec<String> {
        recs.iter()
            .filter(|r| r.event == ev)
            .map(|r| tracefs::parse_hit_body(r.body).1)
            .map(|a| {
                a.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    assert_eq!(
        body("rt_step"),
        ["a0=0 a1=-2", "a0=1 a1=-1", "a0=2 a1=0", "a0=3 a1=1"]
    );
    assert_eq!(body("rt_result"), ["a0=1", "a0=4", "a0=7", "a0=10"]);
    assert_eq!(
        body("record_target_compute__return"),
        ["ret=1", "ret=4", "ret=7", "ret=10"]
    );
    assert_eq!(body("record_target_compute").len(), 4);
    assert_eq!(body("rt_thread"), ["a0=77"]);
    assert_eq!(body("rt_child"), ["a0=99"]);
    assert_eq!(body("rt_lazy"), ["a0=4"]);
    let main = recs
        .iter()
        .find(|r| r.event == "rt_step")
        .unwrap()
        .tgid
        .unwrap();
    let child = recs
        .iter()
        .find(|r| r.event == "rt_child")
        .unwrap()
        .tgid
        .unwrap();
    assert_ne!(main, child);
    for r in &recs {
        if r.event != "sched_switch" {
            assert!(
                r.tgid == Some(main) || r.tgid == Some(child),
                "foreign line {r:?}"
            );
        }
    }
    assert!(
        recs.iter().any(|r| r.event == "sched_switch"),
        "--sched records sched_switch"
    );

    // Sections with durations: every B has its E, later, on the same thread.
    let markers = tracefs::markers(&text);
    let mut open: BTreeMap<u32, Vec<(String, u64)>> = BTreeMap::new();
    let mut done: Vec<(String, u64)> = Vec::new();
    for m in &markers {
        match m.kind {
            MarkerKind::Begin => open
                .entry(m.tid)
                .or_default()
                .push((m.name.clone(), m.timestamp_ns)),
            MarkerKind::End => {
                let (n, t) = open.get_mut(&m.tid).and_then(Vec::pop).expect("E after B");
                assert!(m.timestamp_ns >= t);
                done.push((n, m.timestamp_ns - t));
            }
            _ => {}
        }
    }
    assert!(open.values().all(Vec::is_empty), "{open:?}");
    let count = |n: &str| done.iter().filter(|(d, _)| d == n).count();
    assert_eq!((count("round"), count("work")), (4, 4));
    assert_eq!((count("thread work"), count("child work")), (1, 1));
    let counters: Vec<i64> = markers
        .iter()
        .filter(|m| m.kind == MarkerKind::Counter && m.name == "queue")
        .map(|m| m.value.unwrap())
        .collect();
    assert_eq!(counters, [0, 1, 2, 3]);

    // The summary table.
    let line = |name: &str| {
        err.lines()
            .find(|l| l.split("  ").next() == Some(name))
            .unwrap_or_else(|| panic!("no summary line for {name}:\n{err}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(line("round").starts_with("round 4 "), "{err}");
    assert!(line("load").starts_with("load 4 "), "{err}");
    assert!(line("child work").starts_with("child work 1 "), "{err}");
    assert!(
        line("record_target_compute()").starts_with("record_target_compute() 4 "),
        "{err}"
    );
    assert_eq!(line("rt:step"), "rt:step 4");
    assert_eq!(
        line("record_target_compute%return"),
        "record_target_compute%return 4"
    );
    assert!(err.contains("section") && err.contains("p99"), "{err}");

    // The Chrome JSON.
    let json = json_of(&file);
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let n = |ph: &str, name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == ph && (name.is_empty() || e["name"] == name))
            .count()
    };
    assert_eq!(n("B", "round"), 4);
    assert_eq!(n("B", ""), n("E", ""));
    // 4 rounds, 4 works, 1 thread work, 1 child work, and 4 calls of the function recorded at
    // entry and return.
    assert_eq!(n("B", ""), 14);
    let calls: Vec<&serde_json::Value> = events.iter().filter(|e| e["cat"] == "function").collect();
    assert_eq!(calls.len(), 8);
    for pair in calls.chunks(2) {
        assert_eq!((&pair[0]["ph"], &pair[1]["ph"]), (&"B".into(), &"E".into()));
        assert_eq!(pair[0]["name"], "record_target_compute");
        assert!(pair[1]["ts"].as_f64() >= pair[0]["ts"].as_f64());
    }
    let rets: Vec<i64> = calls
        .iter()
        .filter_map(|e| e["args"]["ret"].as_i64())
        .collect();
    assert_eq!(rets, [1, 4, 7, 10]);
    assert_eq!((n("b", "load"), n("e", "load")), (4, 4));
    assert_eq!(n("i", "tick"), 4);
    let queue: Vec<i64> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "queue")
        .map(|e| e["args"]["value"].as_i64().unwrap())
        .collect();
    assert_eq!(queue, [0, 1, 2, 3]);
    let steps: Vec<(i64, i64)> = events
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"] == "rt:step")
        .map(|e| {
            (
                e["args"]["a0"].as_i64().unwrap(),
                e["args"]["a1"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(steps, [(0, -2), (1, -1), (2, 0), (3, 1)]);
    let child_hit = events.iter().find(|e| e["name"] == "rt:child").unwrap();
    assert_eq!(child_hit["args"]["a0"], 99);
    assert_eq!(child_hit["pid"], child);
    for e in events {
        assert!(e["pid"].is_u64() && e["ph"].is_string(), "{e}");
        if e["ph"] != "M" {
            assert!(e["ts"].is_f64() || e["ts"].is_u64(), "{e}");
        }
    }
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["name"] == "process_name"));
}

#[test]
fn errors_are_clear_and_leave_nothing() {
    if !usable("errors_are_clear_and_leave_nothing") {
        return;
    }
    let bin = record_target();
    let bin = bin.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--uprobe", "no_such_function_xyz", "--", bin, "run", "1"],
            "symbol no_such_function_xyz not found",
        ),
        (
            &["--probe", "rt:nope", "--", bin, "run", "1"],
            "probe rt:nope not found",
        ),
        (&["--", "/nonexistent/program"], "/nonexistent/program"),
        (
            &["--uprobe", "/nonexistent/lib.so:f", "--", bin],
            "not found: elf file",
        ),
    ];
    for (args, want) in cases {
        let (o, rec) = record(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        assert_clean(rec);
    }

    // Not root: a clear message, nothing created. uid 65534 runs a copy of the binary placed
    // where it can reach it (this checkout may be a 0700 directory), on a command it cannot
    // reach: privileges are checked before any file is read.
    let dir = std::env::temp_dir().join(format!("selftrace-cli-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("selftrace");
    std::fs::copy(env!("CARGO_BIN_EXE_selftrace"), &copy).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&copy)
        .args([
            "record",
            "-o",
            "/nonexistent/x.trace",
            "--",
            bin,
            "run",
            "1",
        ])
        .process_group(0)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("permission denied: recording needs root"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn without_probes_the_semaphores_stay_down() {
    if !usable("without_probes_the_semaphores_stay_down") {
        return;
    }
    // A copy of its own: the kernel raises a semaphore in every process that maps a file
    // while any uprobe with that reference counter is enabled, so the other tests' recordings
    // of record_target would raise this one's too.
    let file = out_file("noprobes");
    let bin = file.with_file_name("record_target_copy");
    std::fs::copy(record_target(), &bin).unwrap();
    let (o, rec) = record(&[
        "-o",
        file.to_str().unwrap(),
        "--no-probes",
        "--",
        bin.to_str().unwrap(),
        "run",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_clean(rec);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("rt:step enabled=false"), "{stdout}");
    assert!(!stdout.contains("rt:lazy evaluated"), "{stdout}");
    // Markers are recorded all the same.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("|round") && !text.contains(" rt_step: ("),
        "{text}"
    );
}

#[test]
fn list_and_usage_errors() {
    let o = selftrace()
        .args(["list", "/etc/hostname"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not an elf file"), "{}", stderr(&o));
    let o = selftrace()
        .args(["record", "--bogus", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown option --bogus"),
        "{}",
        stderr(&o)
    );
    let o = selftrace().args(["record", "--sched"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("needs a command"), "{}", stderr(&o));
    let o = selftrace().arg("help").output().unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("selftrace record [OPTIONS] -- CMD"));
}

/// `--lib`: the probes of a shared library the command loads with dlopen after the recording
/// started; the kernel raises the library's semaphore when it is mapped.
#[test]
fn probes_of_a_dlopened_library() {
    if !usable("probes_of_a_dlopened_library") {
        return;
    }
    let lib = usdt_support::cdylib("dev");
    let target = usdt_support::target_bin("dev");
    let file = out_file("lib");
    let (o, rec) = record(&[
        "-o",
        file.to_str().unwrap(),
        "--lib",
        lib.to_str().unwrap(),
        "--probe",
        "selftrace_cdylib:*",
        "--",
        target.to_str().unwrap(),
        "dlopen",
        lib.to_str().unwrap(),
        "3",
    ]);
    let err = stderr(&o);
    // usdt_target exits with 2 unless the library's semaphores rise within 60 s.
    assert!(o.status.success(), "{err}");
    assert_clean(rec);
    let text = std::fs::read_to_string(&file).unwrap();
    let args = |ev: &str| -> Vec<String> {
        tracefs::records(&text)
            .filter(|r| r.event == ev)
            .map(|r| {
                let (_, a) = tracefs::parse_hit_body(r.body);
                a.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    assert_eq!(
        args("selftrace_cdylib_add"),
        ["a0=0 a1=-100", "a0=1 a1=-100", "a0=2 a1=-100"],
        "{text}"
    );
    assert_eq!(
        args("selftrace_cdylib_add__return"),
        ["a0=-100", "a0=-99", "a0=-98"]
    );
    assert!(err.contains("selftrace_cdylib:inside"), "{err}");
    // Only the selected provider: none of the command's own probes.
    assert!(!text.contains("selftrace_test_"), "{text}");
}

/// Without tracefs (every tracefs mount removed in a private mount namespace): a clear error.
#[test]
fn missing_tracefs_is_a_clear_error() {
    if !usable("missing_tracefs_is_a_clear_error") {
        return;
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("SKIP missing_tracefs_is_a_clear_error: no unshare(1)");
        return;
    }
    let script = format!(
        "for m in $(grep ' - tracefs ' /proc/self/mountinfo | cut -d' ' -f5 | sort -r); do \
         umount -l $m || exit 9; done; exec {} record -- /bin/true",
        env!("CARGO_BIN_EXE_selftrace")
    );
    let o = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("tracefs is not mounted"),
        "{}",
        stderr(&o)
    );
}
