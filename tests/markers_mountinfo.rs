//! Marker-file discovery through `/proc/self/mountinfo`: in a private mount namespace
//! (`unshare -m`) tracefs is unmounted from its usual places and mounted in a temporary
//! directory; this test binary, re-run there, must find it, write markers and read them back.
//! Needs root and `unshare` (util-linux); skips with a reason otherwise.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "trace", feature = "tracefs"))]

mod markers_util;

use std::path::PathBuf;

use markers_util::*;
use selftrace::trace;
use selftrace::tracefs::{self, Instance};

const CHILD: &str = "SELFTRACE_MOUNTINFO_CHILD";

#[test]
fn tracefs_found_through_mountinfo() {
    if let Some(dir) = std::env::var_os(CHILD) {
        return child(PathBuf::from(dir));
    }
    let test = "tracefs_found_through_mountinfo";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip(test, "needs root (mount namespaces)").unwrap_or(());
    }
    if tracefs::root().is_err() {
        return skip(test, "no tracefs").unwrap_or(());
    }
    let dir = std::env::temp_dir().join(format!("selftrace-tracefs-{}", pid()));
    std::fs::create_dir_all(&dir).unwrap();
    struct RmDir(PathBuf);
    impl Drop for RmDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _rm = RmDir(dir.clone());
    let script = r#"umount /sys/kernel/tracing 2>/dev/null; umount -l /sys/kernel/debug 2>/dev/null;
        mount -t tracefs nodev "$SELFTRACE_MOUNTINFO_CHILD" || exit 77
        exec "$0" --exact tracefs_found_through_mountinfo --nocapture"#;
    let out = match std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .arg(std::env::current_exe().unwrap())
        .env(CHILD, &dir)
        .output()
    {
        Ok(out) => out,
        Err(e) => return skip(test, format_args!("cannot run unshare: {e}")).unwrap_or(()),
    };
    if out.status.code() == Some(77) {
        return skip(test, "cannot mount tracefs in a new mount namespace").unwrap_or(());
    }
    assert!(
        out.status.success(),
        "child failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The child really ran the test (a filter matching nothing would also succeed).
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// In the namespace: tracefs is only at `dir`.
fn child(dir: PathBuf) {
    assert!(!std::path::Path::new("/sys/kernel/tracing/trace_marker").exists());
    assert_eq!(tracefs::discover().unwrap(), dir);
    assert_eq!(trace::init(), trace::Status::Enabled);
    assert_eq!(trace::marker_path().unwrap(), dir.join("trace_marker"));
    let inst = Instance::for_markers("selftrace-markers-mountinfo").unwrap();
    assert!(inst.path().starts_with(&dir));
    let t = token("mountinfo");
    trace::instant(&t);
    assert_eq!(texts_of(&inst, tid()), [format!("I|{}|{t}", pid())]);
}
