//! The marker writer writes only into tracefs: a regular file named as the marker path, or a
//! tmpfs mounted over `/sys/kernel/tracing` (in a private mount namespace, `unshare -m`) with a
//! `trace_marker` file in it, is refused, `trace::status()` says why, and the file stays empty.
//! The namespace case needs root and `unshare` (util-linux); it skips with a reason otherwise.
//!
//! A FIFO named as the marker path is refused too, and its `open` blocks until a reader comes:
//! that holds the first opening of the marker file open for as long as the test wants, to show
//! what events written meanwhile do (a signal handler on the opening thread drops its event at
//! once; another thread waits 1 s, then drops; both counted).
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(feature = "trace", feature = "tracefs"))]

mod markers_util;

use markers_util::*;
use selftrace::{trace, Error};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

const CHILD: &str = "SELFTRACE_NOT_TRACEFS_CHILD";
const FIFO_CHILD: &str = "SELFTRACE_FIFO_MARKER_CHILD";
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

#[test]
fn events_while_the_marker_file_opens_wait_at_most_a_second_and_are_counted() {
    const TEST: &str = "events_while_the_marker_file_opens_wait_at_most_a_second_and_are_counted";
    if std::env::var_os(FIFO_CHILD).is_some() {
        return fifo_child();
    }
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    // A fresh process: the marker file is opened once per process.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(FIFO_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

static HANDLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr1(_sig: i32) {
    trace::instant("from a handler on the opening thread");
    HANDLED.store(true, SeqCst);
}

/// Polls `done` every millisecond for up to 10 s.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether thread `tid` sleeps in the kernel's FIFO open (its wait channel), or at least in
/// `openat` (its system call; under qemu-user that file shows the host's numbers).
fn blocked_in_fifo_open(tid: u32) -> bool {
    let task = format!("/proc/self/task/{tid}");
    let wchan = std::fs::read_to_string(format!("{task}/wchan")).unwrap_or_default();
    let syscall = std::fs::read_to_string(format!("{task}/syscall")).unwrap_or_default();
    matches!(wchan.trim(), "wait_for_partner" | "fifo_open")
        || syscall.split(' ').next() == Some(&libc::SYS_openat.to_string())
}

/// In the child: this thread's first use of the writer is `set_marker_path(fifo)`, blocked in
/// `open` until the helper opens the FIFO for reading. Meanwhile the helper makes a signal
/// handler write an event on this thread, then a third thread writes two.
fn fifo_child() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fifo-marker-{}", pid()));
    std::fs::create_dir_all(&dir).unwrap();
    struct RmDir(PathBuf);
    impl Drop for RmDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = RmDir(dir.clone());
    let fifo = dir.join("trace_marker");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: c is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // SAFETY: installs a handler that calls only async-signal-safe code (the marker API and an
    // atomic store).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    assert_eq!(trace::status(), trace::Status::Uninitialized);
    let opener = tid();
    let reader_path = fifo.clone();
    let helper = std::thread::spawn(move || {
        /// Opens the FIFO for reading when dropped (also when this thread panics), which lets
        /// the opener's `open` return.
        struct Unblock(PathBuf);
        impl Drop for Unblock {
            fn drop(&mut self) {
                use std::os::unix::fs::OpenOptionsExt as _;
                let _ = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&self.0);
            }
        }
        let _unblock = Unblock(reader_path);
        wait_for("the opener never blocked opening the FIFO", || {
            blocked_in_fifo_open(opener)
        });
        // SAFETY: tgkill to a thread of this process that has a SIGUSR1 handler.
        let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), opener, libc::SIGUSR1) };
        assert_eq!(r, 0);
        wait_for("the handler never ran", || HANDLED.load(SeqCst));
        let after_handler = trace::stats();
        // Another thread: its first event waits for the opener until the process's deadline,
        // its second finds the deadline passed and does not wait again.
        std::thread::spawn(|| {
            trace::instant("waits, then gives up");
            trace::instant("gives up at once");
        })
        .join()
        .unwrap();
        (after_handler, trace::stats())
    });
    let r = trace::set_marker_path(&fifo);
    let (after_handler, after_waiter) = helper.join().unwrap();
    println!("after the handler: {after_handler:?}\nafter the waiter: {after_waiter:?}");
    assert_eq!(r, Err(NOT_TRACEFS));
    // The handler's event was dropped at once, not after a wait (that would be a timeout).
    assert_eq!(after_handler.skipped_during_init, 1);
    assert_eq!(after_handler.init_wait_timeouts, 0);
    // The waiter's two events: dropped at the deadline, counted.
    assert_eq!(after_waiter.skipped_during_init, 3);
    assert_eq!(after_waiter.init_wait_timeouts, 2);
    assert_eq!(trace::status(), trace::Status::Unavailable(NOT_TRACEFS));
    trace::instant("nowhere to write: a no-op, not a drop");
    assert_eq!(trace::stats(), after_waiter);
}
