//! Builds the examples the tests run as child processes (the `selftrace-examples` package,
//! examples/Cargo.toml, which links only selftrace and what the examples use).
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

static BUILD: Mutex<()> = Mutex::new(());

/// The target directory (under `target/`) that the fixture programs are built in.
pub const FIXTURES: &str = "fixtures";

/// The features of every release build of the examples (the crash, probe and pprof-server
/// programs): one build of selftrace and its dependencies in release serves them all, and the
/// demo's (`pprof,flamegraph`: the same dependencies). On aarch64, where only the crash
/// program is built in release, selftrace's defaults.
pub const RELEASE_FEATURES: &str = if cfg!(target_arch = "x86_64") {
    "http,flamegraph"
} else {
    "default"
};

/// The package of the examples (examples/Cargo.toml).
pub const EXAMPLES: &str = "selftrace-examples";

/// Runs `cargo build --quiet -p selftrace-examples ARGS` (for example `--example x --features
/// http`) with the target directory `target/SUBDIR`, so that programs built with other flags
/// do not rebuild the test's own target directory; returns that target directory. One build at
/// a time in this process. Fails the test with cargo's output when the build fails. Built for
/// the test's own architecture (the directory returned is then `target/SUBDIR/TRIPLE`).
///
/// The programs share one target directory ([`FIXTURES`]) and are built without incremental
/// state (they are never edited between builds). The examples are a package of their own, so
/// they link only selftrace and what they use: as examples of the selftrace package, each
/// profile they were built in (dev, release, release-lto, a frame-pointer build, aarch64)
/// compiled every dev-dependency.
pub fn build(subdir: &str, args: &[&str]) -> PathBuf {
    build_with(subdir, args, &[])
}

/// [`build`] with the extra environment `envs` (`RUSTFLAGS` for a frame-pointer build).
pub fn build_with(subdir: &str, args: &[&str], envs: &[(&str, &OsStr)]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let args: Vec<&str> = ["-p", EXAMPLES]
        .iter()
        .copied()
        .chain(args.iter().copied())
        .collect();
    let (out, target) = cargo(root, subdir, "build", &args, envs);
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
