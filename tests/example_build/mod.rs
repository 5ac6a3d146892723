//! Builds examples of this package for the tests that run them as child processes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

static BUILD: Mutex<()> = Mutex::new(());

/// Runs `cargo build --quiet ARGS` (for example `--example x --features f`) with the target
/// directory `target/SUBDIR`, so that fixtures built with other flags do not rebuild the
/// test's own target directory; returns that target directory. One build at a time in this
/// process. Fails the test with cargo's output when the build fails.
pub fn build(subdir: &str, args: &[&str]) -> PathBuf {
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = root.join("target").join(subdir);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--quiet"])
        .args(args)
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null())
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo build {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target
}
