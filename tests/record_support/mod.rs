//! Shared helpers of the recording tests: skip-or-fail, the fixture program, leftovers.
#![allow(dead_code)]

// The including test declares `mod example_build;` (tests/example_build/mod.rs).
use crate::example_build;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Whether root and tracefs with uprobe events are here; otherwise prints why and returns false,
/// or fails under `SELFTRACE_REQUIRE_TRACEFS=1`.
pub fn usable(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let why = match selftrace::tracefs::root() {
        Ok(r) if root && r.join("uprobe_events").exists() => return true,
        Ok(_) if root => "kernel without uprobe events".to_string(),
        Ok(_) => "not root".to_string(),
        Err(e) => e.to_string(),
    };
    if std::env::var("SELFTRACE_REQUIRE_TRACEFS").as_deref() == Ok("1") {
        panic!("{test}: {why} (SELFTRACE_REQUIRE_TRACEFS=1, so this fails instead of skipping)");
    }
    eprintln!("SKIP {test}: {why}");
    false
}

/// Builds `examples/record_target.rs` in the fixtures' target directory and returns its path.
pub fn record_target() -> PathBuf {
    example_build::build(example_build::FIXTURES, &["--example", "record_target"])
        .join("debug")
        .join("examples")
        .join("record_target")
}

/// Events (`GROUP/EVENT`) of the uprobe group `group` (a `Session`'s: `selftrace_<pid>_<n>`;
/// or every group of process `pid` when `group` ends with `_`) and entries of `instances/` whose
/// name starts with `instance_prefix` (`<prefix>-<pid>-`).
pub fn leftovers(group: &str, instance_prefix: &str) -> Vec<String> {
    let root = selftrace::tracefs::root().unwrap();
    // The kernel's `events/GROUP/EVENT` directories, not the `uprobe_events` listing: that is
    // a seq_file, and a read that spans an addition or removal by a concurrent test skips lines.
    let mut left = Vec::new();
    for g in std::fs::read_dir(root.join("events")).unwrap() {
        let g = g.unwrap().file_name().to_string_lossy().into_owned();
        let ours = if group.ends_with('_') {
            g.starts_with(group)
        } else {
            g == group
        };
        if ours {
            left.extend(group_events(&g).into_iter().map(|e| format!("{g}/{e}")));
        }
    }
    for e in std::fs::read_dir(root.join("instances")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with(instance_prefix) {
            left.push(format!("instances/{name}"));
        }
    }
    left
}

/// The events the kernel has in the event group `group` (the directories of
/// `events/GROUP/`), sorted; empty when the group does not exist.
pub fn group_events(group: &str) -> Vec<String> {
    let root = selftrace::tracefs::root().unwrap();
    let Ok(dir) = std::fs::read_dir(root.join("events").join(group)) else {
        return Vec::new();
    };
    let mut v: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The `selftrace` binary cargo built for the tests.
pub fn selftrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_selftrace"))
}

/// `target/record-cli-out/<test>-<pid>/out.trace` (the directory created).
pub fn out_file(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("record-cli-out")
        .join(format!("{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("out.trace")
}

/// The Chrome JSON of the trace `FILE` (`FILE` with the extension `.json`, the default of
/// `--json`), parsed (the test fails if it is not valid JSON).
pub fn json_of(trace: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(trace.with_extension("json")).expect("FILE.json written");
    serde_json::from_str(&text).expect("FILE.json is valid JSON")
}

/// Asserts that the recorder `pid` left nothing in tracefs.
pub fn assert_clean(pid: u32) {
    let left = leftovers(
        &format!("selftrace_{pid}_"),
        &format!("selftrace-record-{pid}-"),
    );
    assert_eq!(left, Vec::<String>::new(), "left behind by recorder {pid}");
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `selftrace record ARGS`, returning its output and pid.
pub fn record(args: &[&str]) -> (Output, u32) {
    let child = selftrace()
        .arg("record")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (child.wait_with_output().unwrap(), pid)
}
