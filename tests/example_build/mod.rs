//! Builds examples of this package for the tests that run them as child processes.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

static BUILD: Mutex<()> = Mutex::new(());

/// The target directory (under `target/`) that the fixture programs are built in.
pub const FIXTURES: &str = "fixtures";

/// Runs `cargo build --quiet ARGS` (for example `--example x --features f`) with the target
/// directory `target/SUBDIR`, so that fixtures built with other flags do not rebuild the
/// test's own target directory; returns that target directory. One build at a time in this
/// process. Fails the test with cargo's output when the build fails. Built for the test's own
/// architecture (the directory returned is then `target/SUBDIR/TRIPLE`).
///
/// An example links every dev-dependency, so each target directory holds a build of all of
/// them: the fixtures share one ([`FIXTURES`]) and are built without incremental state (they
/// are never edited between builds), which keeps a fresh clone's test run within the disk a
/// CI machine has.
pub fn build(subdir: &str, args: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (out, target) = cargo(root, subdir, "build", args, &[]);
    assert!(
        out.status.success(),
        "cargo build {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target
}

/// Runs `cargo COMMAND --quiet ARGS` (`build`, `run`) in `dir` (this package, or a copy of it)
/// as [`build`] does: with the target directory `target/SUBDIR` of this package, for the
/// test's own architecture, without incremental state, one at a time in this process, with
/// the extra environment `envs`. Returns its output and the target directory (with the
/// triple when cross-built).
pub fn cargo(
    dir: &Path,
    subdir: &str,
    command: &str,
    args: &[&str],
    envs: &[(&str, &OsStr)],
) -> (Output, PathBuf) {
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = root.join("target").join(subdir);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // For the architecture of the test itself: aarch64 tests run under qemu-user on an x86-64
    // machine, where cargo builds for the host unless told otherwise (the linker and runner
    // come from the environment the tests were started with).
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let cross = cfg!(not(target_arch = "x86_64"));
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir).args([command, "--quiet"]).args(args);
    if cross {
        cmd.args(["--target", &triple]);
    }
    let out = cmd
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_INCREMENTAL", "0")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run cargo");
    (out, if cross { target.join(triple) } else { target })
}
