//! Shared helpers of the USDT integration tests: building the fixture programs with cargo,
//! deciding whether a test that needs root or a tool runs, and running tools with a timeout.
#![allow(dead_code)]

// The including test declares `mod example_build;` (tests/example_build/mod.rs).
use crate::example_build;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The values `examples/usdt_target.rs` passes (keep in sync).
pub const VALUES_LINE: &str = "-5 65000 -123456 -9000000000 18000000000000000000 0x12345678";
/// The string `usdt_target` passes to `selftrace_test:text`.
pub const TEXT: &str = "hello usdt";

/// Builds `examples/usdt_target.rs` and `examples/usdt_cdylib.rs` with cargo `profile` (`dev`,
/// `release` or `release-lto`) in the fixtures' target directory, and returns the directory
/// holding them. In `release`, with the features of the other release programs
/// ([`example_build::RELEASE_FEATURES`]: one build of selftrace serves them all).
pub fn build_fixtures(profile: &str) -> PathBuf {
    let mut args = vec![
        "--example",
        "usdt_target",
        "--example",
        "usdt_cdylib",
        "--profile",
        profile,
    ];
    if profile == "release" {
        args.extend(["--features", example_build::RELEASE_FEATURES]);
    }
    let target = example_build::build(example_build::FIXTURES, &args);
    let dir = if profile == "dev" { "debug" } else { profile };
    target.join(dir).join("examples")
}

/// Path of the test target program for `profile`.
pub fn target_bin(profile: &str) -> PathBuf {
    build_fixtures(profile).join("usdt_target")
}

/// Path of the cdylib for `profile`.
pub fn cdylib(profile: &str) -> PathBuf {
    build_fixtures(profile).join("libusdt_cdylib.so")
}

fn required() -> bool {
    std::env::var("SELFTRACE_REQUIRE_TRACEFS").as_deref() == Ok("1")
}

/// Whether a test that needs root and `tool` can run. Prints why not; panics instead when
/// `SELFTRACE_REQUIRE_TRACEFS=1`.
pub fn can_run(test: &str, tool: &str) -> bool {
    // Under qemu-user (the aarch64 tests on an x86-64 machine) gdb is gdb-multiarch attached to
    // qemu's stub (see `gdb_batch`); the uprobe-based tools would need an arm64 kernel.
    if under_qemu() && tool != "gdb" {
        eprintln!(
            "skipping {test}: {tool} attaches uprobes, which need an arm64 kernel (this is \
             qemu-user on another architecture)"
        );
        return false;
    }
    let tool = if under_qemu() { "gdb-multiarch" } else { tool };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let why = if !root {
        Some("not root".to_string())
    } else if !found {
        Some(format!("{tool} is not installed"))
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if required() => panic!("{test}: {why} (SELFTRACE_REQUIRE_TRACEFS=1)"),
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// Runs `cmd`, killing it after `limit`; returns its output.
/// Whether this process runs under qemu-user (its own mappings show in
/// `/proc/thread-self/maps`, the guest's in `/proc/self/maps`).
pub fn under_qemu() -> bool {
    std::fs::read_to_string("/proc/thread-self/maps").is_ok_and(|m| m.contains("/qemu-"))
}

/// gdb in batch mode on `bin` run with `args`: the `setup` commands, then the program runs, then
/// the `after` commands. Natively gdb starts it (`run`); under qemu-user the program waits in
/// `qemu-aarch64 -g PORT` and gdb-multiarch attaches (`target remote`, `continue`).
pub fn gdb_batch(bin: &std::path::Path, args: &[&str], setup: &[&str], after: &[&str]) -> Output {
    let limit = Duration::from_secs(120);
    let ex = |cmd: &mut Command, list: &[&str]| {
        for c in list {
            cmd.args(["-ex", c]);
        }
    };
    if !under_qemu() {
        let mut cmd = Command::new("gdb");
        cmd.args(["-nx", "-batch"]);
        ex(&mut cmd, setup);
        ex(&mut cmd, &["run"]);
        ex(&mut cmd, after);
        cmd.arg("--args").arg(bin).args(args);
        return run_with_timeout(&mut cmd, limit);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut program = Command::new("qemu-aarch64")
        .arg("-g")
        .arg(port.to_string())
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn qemu-aarch64");
    let mut cmd = Command::new("gdb-multiarch");
    cmd.args(["-nx", "-batch", "-ex", "set sysroot /"])
        .arg("-ex")
        .arg(format!("file {}", bin.display()))
        .arg("-ex")
        .arg(format!("target remote 127.0.0.1:{port}"));
    ex(&mut cmd, setup);
    ex(&mut cmd, &["continue"]);
    ex(&mut cmd, after);
    let out = run_with_timeout(&mut cmd, limit);
    let _ = program.kill();
    let _ = program.wait();
    out
}

pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// stdout and stderr as text, for assertion messages.
pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
