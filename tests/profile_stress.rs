//! The profiler under stress (examples/profile_stress.rs) in a child process: 4 s at 1 kHz
//! while other threads panic and catch the panic, `dlopen`/`dlclose` zlib, churn the
//! allocator, spawn threads and fork + exec children. The child must neither crash nor hang,
//! every stress loop must make progress, and the profile must show the CPU-bound function.
//! (pprof-rs, which the example can also run, is not run here: it may crash or hang, which is
//! what the comparison measures, not what this suite checks.)
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "profile")]

mod example_build;

mod child_support;
#[path = "support/target.rs"]
mod target;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long the child may take (4 s of stress, the profile's symbolization, a loaded machine)
/// before it counts as hung.
const DEADLINE: Duration = Duration::from_secs(120);

/// Builds `examples/profile_stress.rs` and returns its path. Same target directory as
/// tests/record_support's `record_target()`: both build examples of this package in the dev
/// profile, so the dependencies are compiled once for both.
fn profile_stress() -> PathBuf {
    example_build::build(example_build::FIXTURES, &["--example", "profile_stress"])
        .join("debug")
        .join("examples")
        .join("profile_stress")
}

/// Runs the example with `args`; returns its exit status and standard output, or fails with
/// "hang" after [`DEADLINE`] (killing it first).
fn run(exe: &Path, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start profile_stress");
    child_support::wait_with_deadline(child, DEADLINE, &format!("profile_stress {args:?}"))
}

/// The `key=value` fields of the `RESULT` line.
fn result_fields(stdout: &str) -> HashMap<String, String> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line in:\n{stdout}"));
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(fields: &HashMap<String, String>, key: &str) -> u64 {
    fields
        .get(key)
        .unwrap_or_else(|| panic!("RESULT has no {key}: {fields:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("RESULT {key} is not a number: {fields:?}"))
}

#[test]
fn selftrace_survives_panics_dlopen_fork_and_thread_churn() {
    let exe = profile_stress();
    let args = ["--profiler", "selftrace", "--hz", "1000", "--secs", "4"];
    let (status, stdout, stderr) = run(&exe, &args);
    assert!(
        status.success(),
        "profile_stress {args:?} failed: {status:?} (a signal means a crash)\n\
         stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let f = result_fields(&stdout);
    eprintln!("{}", stdout.trim_end());
    assert_eq!(f["profiler"], "selftrace");

    // Every stress loop ran for the whole time, not just once.
    for key in [
        "panics",
        "dlopens",
        "allocs",
        "spawns",
        "execs",
        "forks",
        "cpu_rounds",
    ] {
        assert!(num(&f, key) >= 5, "stress loop {key} barely ran: {f:?}");
    }
    // zlib really was unloaded by each dlclose (otherwise the loop tests nothing).
    assert_eq!(num(&f, "dl_still_loaded"), 0, "{f:?}");

    // A non-empty profile in which the CPU-bound thread shows up by name.
    let samples = num(&f, "samples");
    let periods = num(&f, "periods");
    let cpu_fn = num(&f, "cpu_fn");
    assert!(samples > 0 && periods >= samples, "{f:?}");
    assert!(cpu_fn > 0, "cpu_bound_work not in the profile: {f:?}");
    assert!(cpu_fn <= periods, "{f:?}");
    // The lost and truncated samples are reported (their values depend on the machine's
    // load, so they are only shown, not bounded).
    let dropped = num(&f, "dropped");
    let truncated = num(&f, "truncated");
    assert!(truncated <= periods, "{f:?}");
    assert!(f.contains_key("truncated_reasons"), "{f:?}");
    eprintln!("dropped={dropped} truncated={truncated} of periods={periods}");
}
