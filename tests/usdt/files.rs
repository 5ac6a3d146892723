//! `read_probes` and `selftrace list` on files that are not what they seem: a FIFO (would block
//! forever), `/dev/zero` (endless), a 3 GB sparse ELF (only its headers and notes are read).
//! The CLI runs under a 512 MiB address-space limit, so reading a whole file would fail.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "tracefs")]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A probe, so that this test binary has notes to find.
#[inline(never)]
fn fire(n: u32) {
    selftrace::probe!(files_test, here, n);
}

fn work_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("selftrace-usdt-files")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `selftrace list PATH` with a 512 MiB address-space limit.
fn list_limited(path: &Path) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_selftrace"));
    c.arg("list").arg(path);
    // SAFETY: only setrlimit(2) between fork and exec.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 512 << 20,
                rlim_max: 512 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a `list` that blocks (a FIFO) is killed after 20 s and the test fails.
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(20)).is_err() {
            // SAFETY: kill of our own child, still unwaited (the waiter holds it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = tx.send(());
    out
}

#[test]
fn fifo_is_refused_without_blocking() {
    let dir = work_dir("fifo");
    let fifo = dir.join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let p = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(selftrace::usdt::read_probes(&p));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("read_probes on a FIFO blocked");
    let e = r.unwrap_err();
    assert_eq!(
        e.kind(),
        selftrace::Error::InvalidInput(
            "not a regular file (a fifo, device or directory is not an elf file)"
        )
    );
    assert_eq!(e.path(), fifo.as_path());
    let o = list_limited(&fifo);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn dev_zero_is_refused() {
    // The CLI first, under its memory limit (a reader of whole files fails there).
    let o = list_limited(Path::new("/dev/zero"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    let e = selftrace::usdt::read_probes("/dev/zero").unwrap_err();
    assert!(matches!(e.kind(), selftrace::Error::InvalidInput(_)), "{e}");
    assert!(
        e.to_string().starts_with("reading probes of /dev/zero: "),
        "{e}"
    );
}

#[test]
fn read_probes_errors_name_the_file() {
    use std::error::Error as _;
    // Missing: kind NotFound, the path in path() and Display, the open's io::Error as source.
    let e = selftrace::usdt::read_probes("/nonexistent/x").unwrap_err();
    assert_eq!(e.kind(), selftrace::Error::NotFound("elf file"));
    assert_eq!(e.path(), Path::new("/nonexistent/x"));
    assert_eq!(
        e.to_string(),
        "reading probes of /nonexistent/x: not found: elf file"
    );
    let io = e
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the io::Error of open is the source");
    assert_eq!(io.raw_os_error(), Some(libc::ENOENT));
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    assert!(io.to_string().contains("/nonexistent/x"), "{io}");

    // Not an ELF file: BadElf, named; no io::Error, so the source is the kind.
    let dir = work_dir("not-elf");
    let text = dir.join("text");
    std::fs::write(&text, "hello, not an elf file\n").unwrap();
    let e = selftrace::usdt::read_probes(&text).unwrap_err();
    assert_eq!(e.kind(), selftrace::Error::BadElf("not an elf file"));
    assert_eq!(
        e.to_string(),
        format!(
            "reading probes of {}: malformed elf file: not an elf file",
            text.display()
        )
    );
    assert_eq!(
        e.source()
            .and_then(|s| s.downcast_ref::<selftrace::Error>())
            .copied(),
        Some(selftrace::Error::BadElf("not an elf file"))
    );
    // A directory in the way: ENOTDIR is NotFound too, the source says which.
    let e = selftrace::usdt::read_probes(text.join("x")).unwrap_err();
    assert_eq!(e.kind(), selftrace::Error::NotFound("elf file"));
    let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
    assert_eq!(io.and_then(|io| io.raw_os_error()), Some(libc::ENOTDIR));
    // The crate's Copy error, for code that must keep it: the kind.
    let copy: selftrace::Error = e.into();
    assert_eq!(copy, selftrace::Error::NotFound("elf file"));
    // `selftrace list` says the same, with the errno when it adds something.
    let o = list_limited(&text.join("x"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(&format!(
            "selftrace: error: reading probes of {}/x: not found: elf file: Not a directory",
            text.display()
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sparse_3gb_elf_reads_only_what_it_needs() {
    fire(std::hint::black_box(1));
    let me = std::env::current_exe().unwrap();
    let dir = work_dir("sparse");
    let big = dir.join("big");
    std::fs::copy(&me, &big).unwrap();
    // 3 GiB, sparse: the ELF is at the start, nothing references the rest.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let want = selftrace::usdt::read_probes(&me).unwrap();
    assert!(want.iter().any(|n| n.provider == "files_test"));
    let t = std::time::Instant::now();
    let got = selftrace::usdt::read_probes(&big).unwrap();
    println!(
        "read_probes on a 3 GiB sparse ELF: {} notes in {:?}",
        got.len(),
        t.elapsed()
    );
    assert_eq!(got, want);
    // The CLI, under a 512 MiB address-space limit.
    let o = list_limited(&big);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(out.contains("files_test:here"), "{out}");
    let _ = std::fs::remove_file(&big);
}
