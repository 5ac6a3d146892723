//! USDT probes seen by the real consumers: bpftrace (attached before exec and to a running
//! process), gdb, perf, and a probe inside a `dlopen`ed cdylib.
//!
//! Needs root and the tools; each test says why it skips, and fails instead when
//! `SELFTRACE_REQUIRE_TRACEFS=1`.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "usdt")]

use crate::usdt_support;

use std::process::Command;
use std::time::Duration;
use usdt_support::*;

const N: usize = 5;

fn bpftrace_script(bin: &str) -> String {
    format!(
        r#"usdt:{bin}:selftrace_test:values {{ printf("V %d %d %d %ld %lu 0x%lx\n", arg0, arg1, arg2, arg3, arg4, arg5); }}
usdt:{bin}:selftrace_test:text {{ printf("T %s %d\n", str(arg0, arg1), arg2); }}
usdt:{bin}:selftrace_test:lazy {{ printf("L %d\n", arg0); }}"#
    )
}

fn check_bpftrace_output(stdout: &str, stderr: &str) {
    let values: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("V "))
        .collect();
    assert_eq!(values.len(), N, "stdout:\n{stdout}\nstderr:\n{stderr}");
    for v in &values {
        assert_eq!(*v, VALUES_LINE, "stdout:\n{stdout}");
    }
    let mut texts: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("T "))
        .map(String::from)
        .collect();
    texts.sort();
    let want: Vec<String> = (0..N).map(|i| format!("{TEXT} {i}")).collect();
    assert_eq!(texts, want, "stdout:\n{stdout}");
    let lazy = stdout.lines().filter(|l| l.starts_with("L ")).count();
    assert_eq!(lazy, N, "stdout:\n{stdout}");
    // The program saw the semaphore raised, and evaluated the lazy arguments.
    assert!(stdout.contains("enabled=1"), "stdout:\n{stdout}");
    assert_eq!(
        stdout.matches("lazy evaluated").count(),
        N,
        "stdout:\n{stdout}"
    );
}

fn bpftrace_exec(profile: &str) {
    let bin = target_bin(profile);
    let bin = bin.to_str().unwrap();
    let out = run_with_timeout(
        Command::new("bpftrace")
            .arg("-e")
            .arg(bpftrace_script(bin))
            .arg("-c")
            .arg(format!("{bin} values {N}")),
        Duration::from_secs(120),
    );
    let (stdout, stderr) = text(&out);
    check_bpftrace_output(&stdout, &stderr);
}

#[test]
fn bpftrace_before_exec_debug() {
    if can_run("bpftrace_before_exec_debug", "bpftrace") {
        bpftrace_exec("dev");
    }
}

#[test]
fn bpftrace_before_exec_release_lto() {
    if can_run("bpftrace_before_exec_release_lto", "bpftrace") {
        bpftrace_exec("release-lto");
    }
}

#[test]
fn bpftrace_running_process() {
    if !can_run("bpftrace_running_process", "bpftrace") {
        return;
    }
    let bin = target_bin("dev");
    let bin = bin.to_str().unwrap();
    let target = Command::new(bin)
        .args(["wait", &N.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn target");
    let pid = target.id();
    let script = format!(
        "{}\nusdt:{bin}:selftrace_test:done {{ exit(); }}",
        bpftrace_script(bin)
    );
    let out = run_with_timeout(
        Command::new("bpftrace")
            .arg("-p")
            .arg(pid.to_string())
            .arg("-e")
            .arg(script),
        Duration::from_secs(120),
    );
    let target_out = target.wait_with_output().expect("target");
    let (mut stdout, stderr) = text(&out);
    stdout.push_str(&String::from_utf8_lossy(&target_out.stdout));
    assert!(
        target_out.status.success(),
        "target failed; bpftrace:\n{stdout}\n{stderr}"
    );
    check_bpftrace_output(&stdout, &stderr);
}

#[test]
fn bpftrace_cdylib() {
    if !can_run("bpftrace_cdylib", "bpftrace") {
        return;
    }
    let bin = target_bin("dev");
    let lib = cdylib("dev");
    let lib = lib.to_str().unwrap();
    // The program dlopens the library, then waits for the tracer to raise the library's
    // semaphore: bpftrace finds the probe in the running process's mappings.
    let target = Command::new(&bin)
        .args(["dlopen", lib, "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn target");
    // Until the library is mapped in the target (a fixed sleep raced with a slow start on a
    // loaded machine); the target then waits for bpftrace.
    let maps = format!("/proc/{}/maps", target.id());
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains(lib)) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the target did not load {lib}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let script = format!(
        r#"usdt:{lib}:selftrace_cdylib:add {{ printf("A %d %d\n", arg0, arg1); }}
usdt:{lib}:selftrace_cdylib:inside {{ printf("I %d %d\n", arg0, arg1); }}
usdt:{lib}:selftrace_cdylib:add__return {{ printf("R %d\n", arg0); if (arg0 == -98) {{ exit(); }} }}"#
    );
    let out = run_with_timeout(
        Command::new("bpftrace")
            .arg("-p")
            .arg(target.id().to_string())
            .arg("-e")
            .arg(script),
        Duration::from_secs(120),
    );
    let target_out = target.wait_with_output().expect("target");
    let (stdout, stderr) = text(&out);
    let target_stdout = String::from_utf8_lossy(&target_out.stdout);
    for i in 0..3 {
        assert!(
            stdout.contains(&format!("A {i} -100\n")),
            "stdout:\n{stdout}\nstderr:\n{stderr}"
        );
        assert!(
            stdout.contains(&format!("I {i} -100\n")),
            "stdout:\n{stdout}"
        );
        assert!(
            stdout.contains(&format!("R {}\n", i - 100)),
            "stdout:\n{stdout}"
        );
    }
    assert!(
        target_stdout.contains("sum=-297"),
        "target:\n{target_stdout}"
    );
}

#[test]
fn gdb_probes() {
    if !can_run("gdb_probes", "gdb") {
        return;
    }
    let bin = target_bin("dev");
    let gdb = if under_qemu() { "gdb-multiarch" } else { "gdb" };
    let out = run_with_timeout(
        Command::new(gdb)
            .args(["-nx", "-batch", "-ex", "info probes"])
            .arg(&bin),
        Duration::from_secs(120),
    );
    let (stdout, stderr) = text(&out);
    for name in [
        "values",
        "text",
        "twelve",
        "lazy",
        "done",
        "add",
        "add__return",
        "bump",
        "bump__return",
        "generic",
        "generic__return",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.split_whitespace().take(3).collect::<Vec<_>>()
                    == ["stap", "selftrace_test", name]),
            "gdb does not list selftrace_test:{name}:\n{stdout}\n{stderr}"
        );
    }

    let prints: Vec<String> = (0..6)
        .map(|i| format!("printf \"ARG{i} %ld\\n\", $_probe_arg{i}"))
        .chain([
            "printf \"ARGC %d\\n\", $_probe_argc".to_string(),
            "kill".into(),
        ])
        .collect();
    let prints: Vec<&str> = prints.iter().map(String::as_str).collect();
    let out = gdb_batch(
        &bin,
        &["values", "1"],
        &["break -probe-stap selftrace_test:values"],
        &prints,
    );
    let (stdout, stderr) = text(&out);
    let want = [
        "ARG0 -5",
        "ARG1 65000",
        "ARG2 -123456",
        "ARG3 -9000000000",
        // gdb prints the u64 through %ld.
        "ARG4 -446744073709551616",
        "ARG5 305419896",
        "ARGC 6",
    ];
    for w in want {
        assert!(
            stdout.lines().any(|l| l == w),
            "missing {w:?}:\n{stdout}\n{stderr}"
        );
    }

    // The &str probe: pointer and length read through memory operands.
    let out = gdb_batch(
        &bin,
        &["values", "1"],
        &["break -probe-stap selftrace_test:text"],
        &[
            "printf \"L %ld I %ld\\n\", $_probe_arg1, $_probe_arg2",
            "x/s $_probe_arg0",
            "kill",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.lines().any(|l| l == format!("L {} I 0", TEXT.len())),
        "{stdout}\n{stderr}"
    );
    // The string is not NUL-terminated: x/s shows it and what follows.
    assert!(
        stdout.contains(&format!(":\t\"{TEXT}")),
        "{stdout}\n{stderr}"
    );
}

/// Deletes perf's probe events on drop, also when the test fails.
struct PerfProbe(&'static str);

impl Drop for PerfProbe {
    fn drop(&mut self) {
        let _ = Command::new("perf")
            .args(["probe", "-q", "-d", self.0])
            .output();
    }
}

#[test]
fn perf_counts_hits() {
    if !can_run("perf_counts_hits", "perf") {
        return;
    }
    let bin = target_bin("dev");
    let dir = std::env::temp_dir().join(format!("selftrace-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _ = Command::new("perf")
        .args(["probe", "-q", "-d", "sdt_selftrace_test:*"])
        .output();
    let out = Command::new("perf")
        .args(["buildid-cache", "--add"])
        .arg(&bin)
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let out = Command::new("perf")
        .args(["probe", "-x"])
        .arg(&bin)
        .arg("sdt_selftrace_test:values")
        .output()
        .unwrap();
    let _guard = PerfProbe("sdt_selftrace_test:values");
    assert!(out.status.success(), "perf probe: {:?}", text(&out));
    let data = dir.join("perf.data");
    let out = run_with_timeout(
        Command::new("perf")
            .args(["record", "-q", "-e", "sdt_selftrace_test:values", "-o"])
            .arg(&data)
            .arg("--")
            .arg(&bin)
            .args(["values", "7"]),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "perf record: {:?}", text(&out));
    let out = Command::new("perf")
        .args(["script", "-i"])
        .arg(&data)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    let hits = stdout
        .lines()
        .filter(|l| l.contains("sdt_selftrace_test:values"))
        .count();
    assert_eq!(hits, 7, "perf script:\n{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
