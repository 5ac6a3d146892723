//! The recorder cleans up tracefs whatever happens: the recorded command crashes, the recorder
//! gets SIGINT or SIGTERM (sent to it alone, or Ctrl-C in a terminal, which reaches the whole
//! process group), or it is killed with SIGKILL (then `selftrace clean` removes the rest).
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "tracefs")]

use crate::record_support;

use record_support::*;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn crashing_command_is_recorded_and_cleaned_up() {
    if !usable("crashing_command_is_recorded_and_cleaned_up") {
        return;
    }
    let bin = record_target();
    let file = out_file("crash");
    let (o, rec) = record(&[
        "-o",
        file.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        "crash",
    ]);
    assert_eq!(o.status.code(), Some(128 + libc::SIGSEGV), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("command killed by signal 11"),
        "{}",
        stderr(&o)
    );
    assert_clean(rec);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains(" rt_step: (") && text.contains("a0=0 a1=-2"),
        "{text}"
    );
    assert!(text.contains("|round"), "{text}");
    json_of(&file);
}

fn interrupt(sig: i32, test: &str) {
    let bin = record_target();
    let file = out_file(test);
    let mut rec = selftrace()
        .args(["record", "-o", file.to_str().unwrap(), "--"])
        .arg(&bin)
        .arg("wait")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rec.id();
    // The command prints "ready" once it has done one round and sleeps until killed.
    let mut stdout = BufReader::new(rec.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("ready ") {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            let o = rec.wait_with_output().unwrap();
            panic!(
                "recorder ended before the command was ready: {}",
                stderr(&o)
            );
        }
    }
    // SAFETY: kill has no memory-safety preconditions; `pid` is our child, not yet waited for.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = rec.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = rec.kill();
            panic!("recorder did not end after signal {sig}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let o = rec.wait_with_output().unwrap();
    let err = stderr(&o);
    // The command got the forwarded signal; the recorder wrote what it had and cleaned up.
    assert_eq!(status.code(), Some(128 + sig), "{err}");
    assert!(
        err.contains(&format!("recorder interrupted by signal {sig}")),
        "{err}"
    );
    assert_clean(pid);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("a0=0 a1=-2") && text.contains("|round"),
        "{text}"
    );
    json_of(&file);
}

#[test]
fn sigint_to_the_recorder_cleans_up() {
    if usable("sigint_to_the_recorder_cleans_up") {
        interrupt(libc::SIGINT, "sigint");
    }
}

#[test]
fn sigterm_to_the_recorder_cleans_up() {
    if usable("sigterm_to_the_recorder_cleans_up") {
        interrupt(libc::SIGTERM, "sigterm");
    }
}

#[test]
fn clean_removes_what_a_killed_recorder_left() {
    if !usable("clean_removes_what_a_killed_recorder_left") {
        return;
    }
    let bin = record_target();
    let file = out_file("killed");
    let mut rec = selftrace()
        .args(["record", "-o", file.to_str().unwrap(), "--"])
        .arg(&bin)
        .arg("wait")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = rec.id();
    let mut stdout = BufReader::new(rec.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("ready ") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "recorder ended early"
        );
    }
    let command: i32 = line["ready ".len()..].trim().parse().unwrap();
    // SIGKILL: the recorder cannot clean up.
    rec.kill().unwrap();
    rec.wait().unwrap();
    // SAFETY: kill has no memory-safety preconditions; `command` is the orphaned program.
    unsafe {
        libc::kill(command, libc::SIGKILL);
    }
    let left = leftovers(
        &format!("selftrace_{pid}_"),
        &format!("selftrace-record-{pid}-"),
    );
    assert!(left.len() >= 2, "{left:?}");
    // `clean` leaves instances younger than two seconds alone (one may not be locked yet).
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let o = selftrace().arg("clean").output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        out.contains(&format!("removed instances/selftrace-record-{pid}-")),
        "{out}"
    );
    assert!(out.contains(&format!("removed selftrace_{pid}_")), "{out}");
    assert_clean(pid);
}

/// Ctrl-C in a terminal reaches the whole foreground process group (the recorder and the
/// command, `si_code` SI_KERNEL): the command is not signalled twice, the recorder cleans up.
#[test]
fn ctrl_c_in_a_terminal_cleans_up() {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    if !usable("ctrl_c_in_a_terminal_cleans_up") {
        return;
    }
    let bin = record_target();
    let file = out_file("ctrlc");
    // SAFETY: plain libc calls on a new pseudo-terminal; the name buffer is large enough and
    // ptsname_r nul-terminates it.
    let (master, slave) = unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0);
        assert_eq!(libc::fcntl(m, libc::F_SETFD, libc::FD_CLOEXEC), 0);
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        (m, std::ffi::CStr::from_ptr(name.as_ptr()).to_owned())
    };
    let mut cmd = selftrace();
    cmd.args(["record", "-o", file.to_str().unwrap(), "--"])
        .arg(&bin)
        .arg("wait");
    // SAFETY: between fork and exec the closure only makes async-signal-safe calls (setsid,
    // open, ioctl, dup2) on memory it owns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::open(slave.as_ptr(), libc::O_RDWR);
            if fd < 0 || libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for target in 0..3 {
                libc::dup2(fd, target);
            }
            Ok(())
        });
    }
    let mut rec = cmd.spawn().unwrap();
    let pid = rec.id();
    // SAFETY: `master` is an open descriptor owned by nobody else from here on.
    let mut term = unsafe { std::fs::File::from_raw_fd(master) };
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("ready ") {
        match term.read(&mut buf) {
            Ok(0) | Err(_) => panic!("terminal closed: {}", String::from_utf8_lossy(&seen)),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    term.write_all(b"\x03").unwrap();
    // Until the recorder and the command close the terminal (EIO on the master).
    while let Ok(n) = term.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let status = rec.wait().unwrap();
    let out = String::from_utf8_lossy(&seen);
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{out}");
    assert!(
        out.contains("recorder interrupted by signal 2; command killed by signal 2"),
        "{out}"
    );
    assert_clean(pid);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("a0=0 a1=-2") && text.contains("|round"),
        "{text}"
    );
}
