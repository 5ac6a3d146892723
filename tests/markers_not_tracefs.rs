//! The marker writer writes only into tracefs: a regular file named as the marker path, or a
//! tmpfs mounted over `/sys/kernel/tracing` (in a private mount namespace, `unshare -m`) with a
//! `trace_marker` file in it, is refused, `trace::status()` says why, and the file stays empty.
//! The namespace case needs root and `unshare` (util-linux); it skips with a reason otherwise.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "trace", feature = "tracefs"))]

mod markers_util;

use markers_util::*;
use selftrace::{trace, Error};
use std::path::PathBuf;

const CHILD: &str = "SELFTRACE_NOT_TRACEFS_CHILD";
const NOT_TRACEFS: Error = Error::InvalidInput("trace_marker is not on a tracefs mount");

#[test]
fn regular_file_is_not_a_marker_file() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("not-tracefs-{}", pid()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("trace_marker");
    std::fs::write(&f, "").unwrap();
    assert_eq!(trace::set_marker_path(&f), Err(NOT_TRACEFS));
    assert_eq!(trace::status(), trace::Status::Unavailable(NOT_TRACEFS));
    trace::instant("must not be written");
    assert_eq!(std::fs::read(&f).unwrap(), b"");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tmpfs_over_tracing_is_refused() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let test = "tmpfs_over_tracing_is_refused";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip(test, "needs root (mount namespaces)").unwrap_or(());
    }
    let script = r#"umount -l /sys/kernel/tracing 2>/dev/null; umount -l /sys/kernel/debug 2>/dev/null;
        mount -t tmpfs none /sys/kernel/tracing || exit 77
        : > /sys/kernel/tracing/trace_marker || exit 77
        "$0" --exact tmpfs_over_tracing_is_refused --nocapture || exit $?
        test ! -s /sys/kernel/tracing/trace_marker || { echo "markers went into tmpfs"; exit 1; }"#;
    let out = match std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .arg(std::env::current_exe().unwrap())
        .env(CHILD, "1")
        .output()
    {
        Ok(out) => out,
        Err(e) => return skip(test, format_args!("cannot run unshare: {e}")).unwrap_or(()),
    };
    if out.status.code() == Some(77) {
        return skip(test, "cannot mount tmpfs in a new mount namespace").unwrap_or(());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
}

/// In the namespace: a tmpfs with a regular `trace_marker` file at `/sys/kernel/tracing`.
fn child() {
    assert!(selftrace::tracefs::discover().is_err());
    let st = trace::init();
    println!("status: {st}");
    assert_eq!(st, trace::Status::Unavailable(NOT_TRACEFS));
    assert!(!trace::is_enabled());
    trace::instant("must not be written");
    trace::begin_section("nor this");
    trace::end_section();
    assert_eq!(
        std::fs::read("/sys/kernel/tracing/trace_marker").unwrap(),
        b""
    );
}
