//! Without a usable `trace_marker` every call is a cheap no-op and `status()` says why:
//! an explicit path that does not exist, and (as root, in a child that drops privileges)
//! no permission. Needs neither root nor tracefs. One test: this binary owns the writer.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "trace")]

use selftrace::trace::{self, Status};
use selftrace::Error;

fn every_call() {
    assert!(!trace::is_enabled());
    trace::begin_section("x");
    trace::end_section();
    let s = trace::section("x");
    assert!(!s.is_active());
    drop(s);
    let s = trace::section!("x {}", 1);
    assert!(!s.is_active());
    trace::begin_async_section("x", 1);
    trace::end_async_section("x", 1);
    trace::begin_async_section_for_track("t", "x", 1);
    trace::end_async_section_for_track("t", 1);
    trace::instant("x");
    trace::instant!("x {}", 2);
    trace::instant_for_track("t", "x");
    trace::set_counter("x", 3);
}

#[test]
fn unavailable_marker_file_is_a_noop_and_status_says_why() {
    // Privileges dropped in a child, before this process opened anything: permission denied.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY: the child calls only async-signal-safe functions (setuid, the marker API,
        // _exit); the fork handlers were registered at start-up.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: plain syscalls, then _exit.
            unsafe {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    libc::_exit(10);
                }
                let code = match trace::init() {
                    Status::Unavailable(Error::PermissionDenied) => 0,
                    Status::Enabled => 2, // tracefs mounted with mode=/gid= for everybody
                    Status::Unavailable(Error::NoTracefs) => 3,
                    _ => 4,
                };
                if trace::is_enabled() != (code == 2) {
                    libc::_exit(5);
                }
                libc::_exit(code);
            }
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut st, 0) }, child);
        assert!(libc::WIFEXITED(st));
        match libc::WEXITSTATUS(st) {
            0 => {}
            2 => eprintln!(
                "note: trace_marker is writable by nobody here; permission case not checked"
            ),
            3 => eprintln!("note: no tracefs here; permission case not checked"),
            c => panic!("unprivileged child: unexpected status code {c}"),
        }
    }

    let before = trace::stats();
    let err = trace::set_marker_path("/nonexistent/selftrace/trace_marker").unwrap_err();
    assert_eq!(err, Error::NotFound("trace_marker"));
    let st = trace::status();
    assert_eq!(st, Status::Unavailable(Error::NotFound("trace_marker")));
    let why = st.to_string();
    assert!(
        why.contains("disabled") && why.contains("not found"),
        "{why}"
    );
    assert_eq!(trace::marker_path(), None);
    every_call();
    // Nothing was attempted, so nothing failed.
    assert_eq!(trace::stats(), before);

    // Permission denied is reported as such (root bypasses file modes, so use a file that
    // cannot be opened for writing by anyone: a directory).
    let err = trace::set_marker_path("/").unwrap_err();
    assert!(
        matches!(
            err,
            Error::Sys {
                call: "open",
                errno: libc::EISDIR
            }
        ),
        "{err:?}"
    );
    assert!(trace::status()
        .to_string()
        .contains("cannot open trace_marker"));
    every_call();
    assert_eq!(trace::stats(), before);
}
