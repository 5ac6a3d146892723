//! Stripped objects: a stripped copy of this test binary, run as a child, names what `.dynsym`
//! has and prints `path(+0x...)` for the rest, without panicking; with its debug info split
//! into a separate file (found by build-id or by `.gnu_debuglink`), names and lines come back.

use crate::target;
use std::path::Path;
use std::process::Command;

const CHILD_ENV: &str = "SELFTRACE_STRIPPED_CHILD";

#[inline(never)]
fn child_leaf() {
    let mut frames = [0usize; 64];
    let n = selftrace::capture(&mut frames);
    let frames = &frames[..n];
    println!("== glibc");
    for l in selftrace::backtrace_symbols(frames) {
        println!("{l}");
    }
    println!("== kernel");
    let mut buf = [0u8; 512];
    for (i, &a) in frames.iter().enumerate() {
        let kind = selftrace::symbolize::frame_kind(frames, i, false);
        let len = selftrace::symbolize::write_kernel_frame(&mut buf, a, kind, Default::default());
        println!("{}", String::from_utf8_lossy(&buf[..len]));
    }
    println!("== backtrace");
    print!("{:#}", selftrace::Backtrace::capture());
    let s = selftrace::symbolize(frames[0].wrapping_sub(1)).expect("own object");
    println!("== source\n{:?}", s.source);
    println!("== end");
}

/// The child's body: does nothing unless started by one of the tests below.
#[test]
fn child_report() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    selftrace::symbolize::prepare().expect("prepare");
    child_leaf();
}

fn work_dir(name: &str) -> crate::WorkDir {
    crate::WorkDir::new("selftrace-stripped", name)
}

fn run(cmd: &str, args: &[&std::ffi::OsStr]) {
    let st = Command::new(target::binutil(cmd))
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(st.success(), "{cmd} {args:?}");
}

fn run_child(exe: &Path, debug_dir: Option<&Path>) -> String {
    let mut c = Command::new(exe);
    c.args([
        "--exact",
        "stripped::child_report",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, "1");
    match debug_dir {
        Some(d) => c.env("SELFTRACE_DEBUG_DIR", d),
        None => c.env_remove("SELFTRACE_DEBUG_DIR"),
    };
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        !stdout.contains("panicked") && !stderr.contains("panicked"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("== end"), "{stdout}");
    stdout
}

fn section<'a>(out: &'a str, name: &str) -> &'a str {
    let start = out.find(&format!("== {name}\n")).expect(name) + name.len() + 4;
    let rest = &out[start..];
    &rest[..rest.find("\n== ").unwrap_or(rest.len())]
}

fn have_binutils() -> bool {
    let ok = Command::new(target::binutil("objcopy"))
        .arg("--version")
        .output()
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none(),
            "objcopy (binutils) is required"
        );
        println!("skipped: objcopy (binutils) not installed");
    }
    ok
}

#[test]
fn stripped_copy_prints_offsets_without_panicking() {
    if !have_binutils() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let dir = work_dir("plain");
    let exe = dir.join("stripped-copy");
    run(
        "objcopy",
        &["--strip-all".as_ref(), me.as_os_str(), exe.as_os_str()],
    );
    let out = run_child(&exe, None);
    println!("{out}");
    assert!(section(&out, "source").contains("Dynsym") || section(&out, "source").contains("None"));
    let glibc = section(&out, "glibc");
    // Our own frames: no names in .dynsym of an executable, so object + offset.
    let own: Vec<&str> = glibc
        .lines()
        .filter(|l| l.contains("stripped-copy"))
        .collect();
    assert!(own.len() >= 3, "{glibc}");
    assert!(
        own.iter()
            .all(|l| l.contains("stripped-copy(+0x") || l.contains("stripped-copy(")),
        "{glibc}"
    );
    assert!(!glibc.contains("child_leaf"), "{glibc}");
    let kernel = section(&out, "kernel");
    assert!(
        kernel
            .lines()
            .any(|l| l.contains(" : +0x") && l.ends_with("[stripped-copy]")),
        "{kernel}"
    );
    let bt = section(&out, "backtrace");
    assert!(
        bt.contains("<unknown> [") && bt.contains("stripped-copy+0x"),
        "{bt}"
    );
}

#[test]
fn stripped_copy_finds_debug_file_by_build_id() {
    if !have_binutils() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let dir = work_dir("build-id");
    let exe = dir.join("stripped-copy");
    let full = dir.join("full.debug");
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            me.as_os_str(),
            full.as_os_str(),
        ],
    );
    run(
        "objcopy",
        &["--strip-all".as_ref(), me.as_os_str(), exe.as_os_str()],
    );
    // <root>/.build-id/xx/yyyy.debug
    let id = selftrace::modules::snapshot()
        .objects()
        .iter()
        .find(|o| o.is_main)
        .and_then(|o| o.build_id.clone())
        .expect("build-id");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let root = dir.join("debug");
    let sub = root.join(".build-id").join(&hex[..2]);
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::rename(&full, sub.join(format!("{}.debug", &hex[2..]))).unwrap();
    let out = run_child(&exe, Some(&root));
    check_names_and_lines(&out);
}

#[test]
fn stripped_copy_finds_debug_file_by_debuglink() {
    if !have_binutils() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let dir = work_dir("debuglink");
    let exe = dir.join("stripped-copy");
    let dbg = dir.join("stripped-copy.debug");
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            me.as_os_str(),
            dbg.as_os_str(),
        ],
    );
    run(
        "objcopy",
        &["--strip-all".as_ref(), me.as_os_str(), exe.as_os_str()],
    );
    let link = format!("--add-gnu-debuglink={}", dbg.display());
    // objcopy must run in the directory of the debug file for the link to name it alone.
    let st = Command::new(target::binutil("objcopy"))
        .current_dir(&dir)
        .args([link.as_str(), "stripped-copy"])
        .status()
        .unwrap();
    assert!(st.success());
    let out = run_child(&exe, None);
    check_names_and_lines(&out);
}

fn check_names_and_lines(out: &str) {
    println!("{out}");
    assert!(section(out, "source").contains("DebugFile"), "{out}");
    let glibc = section(out, "glibc");
    assert!(
        glibc
            .lines()
            .any(|l| l.contains("stripped-copy(_") && l.contains("child_leaf")),
        "{glibc}"
    );
    let kernel = section(out, "kernel");
    assert!(
        kernel
            .lines()
            .any(|l| l.contains(" : symbolize::stripped::child_leaf+0x")),
        "{kernel}"
    );
    let bt = section(out, "backtrace");
    assert!(bt.contains("symbolize::stripped::child_leaf"), "{bt}");
    assert!(bt.contains("tests/symbolize/stripped.rs:"), "{bt}");
}
