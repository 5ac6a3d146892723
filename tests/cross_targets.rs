//! The other Linux targets, from the x86-64 test run.
//!
//! - aarch64: the tests in [`AARCH64_TESTS`] and the library's unit tests, built for
//!   `aarch64-unknown-linux-gnu` with Debian's `rustc-web` (`/usr/bin/rustc`, which has the arm64
//!   std) and run under qemu-user (`qemu-aarch64`; binfmt_misc registered for the tests that
//!   run themselves again as a child), as many test binaries at once as the machine has cores,
//!   each one's output printed whole when it ends. Tests that need a kernel facility
//!   qemu-user lacks (tracefs, uprobes, perf, ptrace) are not in the list, or say in their
//!   output which part they leave out there. The examples are checked to build for aarch64
//!   (those the tests run are built and run); the benches run natively only.
//! - armv7, i686, powerpc64le (Debian's std for them, or, where their architecture's packages
//!   are not installed, `-Zbuild-std` from Debian's `rust-web-src`): `cargo check` of the
//!   library and the `selftrace` CLI, with every feature. There is no unwinder port there:
//!   captures return no frames (`StopReason::Unsupported`) and USDT probes compile to nothing.
//!   riscv64gc, which has no Debian std, is not checked (see [`other_targets_build`]).
//!
//! Without the toolchains these tests say why and skip (`.ci/run` installs them); with
//! `SELFTRACE_REQUIRE_TRACEFS=1` they fail instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The integration test binaries (tests/NAME.rs, tests/NAME/main.rs) run for aarch64 under
/// qemu-user, with the library's unit tests ([`LIB`]), heaviest first: the lanes of
/// [`run_in_lanes`] take them in this order, so that the long ones start first and the lanes end
/// together. (Seconds of each alone on the 2-core CI machine, the aarch64 fixture builds the
/// tests start included: crash ~110 with its release build, unwind_diff ~50, minidump ~35,
/// profile_stress ~35, symbolize ~20, threads ~20; the rest under 15 each. Two at once
/// take longer each, and about half the time together.)
const AARCH64_TESTS: &[&str] = &[
    "crash",
    "unwind_diff",
    "threads",
    "minidump",
    "profile_stress",
    "symbolize",
    "unwind",
    LIB,
    "unwind_gdb",
    "watchdog",
    "tasks",
    "unwind_stress",
    "unwind_reuse",
    "dump_stack",
    "dlopen",
    "hostile",
    "symbolize_background",
    "usdt",
    "before_init",
    "unwind_no_vm_readv",
];

/// The library's unit tests in [`AARCH64_TESTS`] (cargo's `--lib`).
const LIB: &str = "lib";

/// The integration test binaries that do not run under qemu-user, and why (printed by the aarch64 run).
const NOT_UNDER_QEMU: &[(&str, &str)] = &[
    (
        "cross_targets",
        "this file: it drives the other targets from x86-64",
    ),
    (
        "fuzz",
        "mutates inputs of the parsers of outside bytes (ELF, DWARF, trace text, maps lines, \
         names), which have no architecture-specific code; both PLT decoders (x86-64 and \
         aarch64) are fuzzed on the x86-64 run",
    ),
    ("markers", MARKERS),
    ("markers_alloc", MARKERS),
    ("markers_dropped", MARKERS),
    ("markers_mountinfo", MARKERS),
    ("markers_not_tracefs", MARKERS),
    ("markers_off", MARKERS),
    ("markers_tracing", MARKERS),
    ("markers_unavailable", MARKERS),
    (
        "minidump_upload",
        "the std-only HTTP upload of a dump file: no architecture-specific code (the dumps \
         themselves are tested under qemu in minidump)",
    ),
    ("profile", PROFILE_SHARES),
    ("profile_http", PROFILE_SHARES),
    (
        "profile_output",
        "checks the pprof encoding with go tool pprof: no architecture-specific code (the \
         profiler itself runs under qemu in profile_stress)",
    ),
    ("record", UPROBES),
    ("usdt_uprobe", UPROBES),
];
const MARKERS: &str = "writes and reads tracefs: under qemu-user these are the x86-64 host \
    kernel's files, through the same syscalls, so the run would repeat the native one";
const PROFILE_SHARES: &str = "asserts shares of CPU-time samples between threads and functions, \
    which emulation distorts (qemu delivers signals at translation-block boundaries and adds its \
    own threads); the profiler's no-crash stress runs under qemu (profile_stress)";
const UPROBES: &str = "attaches uprobes (tracefs, bpftrace, perf): the kernel that would trap \
    the probe's instruction is the x86-64 host's and never runs the emulated aarch64 code";

/// Debian's compiler and cargo (rustup's proxies come first in PATH and know x86-64 only).
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";

fn required() -> bool {
    std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_some_and(|v| v == "1")
}

fn skip(test: &str, why: &str) {
    if required() {
        panic!("{test}: {why} (SELFTRACE_REQUIRE_TRACEFS=1, so this fails instead of skipping)");
    }
    eprintln!("{test}: skipped: {why}");
}

#[cfg(target_arch = "x86_64")]
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Whether Debian's rustc has the std of `triple`.
fn has_std(triple: &str) -> bool {
    Command::new(DEBIAN_RUSTC)
        .args(["--print", "target-libdir", "--target", triple])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .and_then(|d| std::fs::read_dir(d).ok())
        .is_some_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libstd-")))
        })
}

/// The target directory of the test run itself (that `CARGO_TARGET_TMPDIR` is in).
fn outer_target_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
}

/// A target directory of its own for another toolchain, in the outer build's.
fn target_dir(name: &str) -> PathBuf {
    outer_target_dir().join(name)
}

/// Debian's cargo, with its rustc, in this package's directory, its output going straight to
/// the test run's (so that a CI log shows it as it happens).
fn debian_cargo(target_dir: &Path) -> Command {
    let mut c = Command::new(DEBIAN_CARGO);
    debian_env(&mut c)
        .env("CARGO_TARGET_DIR", target_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    c
}

/// What a command of Debian's toolchain runs with: this package's directory, Debian's rustc,
/// no incremental state, none of the outer build's wrappers or flags.
fn debian_env(c: &mut Command) -> &mut Command {
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUSTC", DEBIAN_RUSTC)
        .env("CARGO_INCREMENTAL", "0")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTFLAGS")
}

#[test]
#[cfg(target_arch = "x86_64")]
fn aarch64_tests_pass_under_qemu_user() {
    const TEST: &str = "aarch64_tests_pass_under_qemu_user";
    const TRIPLE: &str = "aarch64-unknown-linux-gnu";
    if !Path::new(DEBIAN_CARGO).is_file() || !Path::new(DEBIAN_RUSTC).is_file() {
        return skip(TEST, "Debian's rustc-web and cargo-web are not installed");
    }
    if !has_std(TRIPLE) {
        return skip(TEST, "no aarch64 std (install libstd-rust-web-dev:arm64)");
    }
    for tool in ["aarch64-linux-gnu-gcc", "qemu-aarch64", "gdb-multiarch"] {
        if !on_path(tool) {
            return skip(
                TEST,
                &format!(
                    "{tool} not found (install gcc-aarch64-linux-gnu, qemu-user, gdb-multiarch)"
                ),
            );
        }
    }
    if !Path::new("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists() {
        return skip(
            TEST,
            "qemu-aarch64 is not registered with binfmt_misc (tests that run themselves again \
             need it; .ci/run registers it from /usr/lib/binfmt.d/qemu-aarch64.conf)",
        );
    }
    for (t, why) in NOT_UNDER_QEMU {
        eprintln!("{TEST}: test binary {t} is not run under qemu-user: {why}");
    }
    let target_dir = target_dir(DEBIAN_TARGET_DIR);
    // Built once, every test binary, then run in lanes (below) directly: `cargo test` runs
    // them one at a time, and one test binary under qemu keeps about 1.2 of the cores busy.
    let mut c = debian_cargo(&target_dir);
    c.args([
        "test",
        "--no-run",
        "--message-format=json-render-diagnostics",
        "--target",
        TRIPLE,
        "--all-features",
    ]);
    for t in AARCH64_TESTS {
        match *t {
            LIB => c.arg("--lib"),
            t => c.args(["--test", t]),
        };
    }
    cross_env(&mut c);
    eprintln!("{TEST}: {c:?}");
    let out = c
        .stdout(Stdio::piped())
        .output()
        .expect("run Debian's cargo");
    assert!(
        out.status.success(),
        "the aarch64 tests do not build: {}",
        out.status
    );
    let binaries = test_binaries(&out.stdout);
    let jobs: Vec<(&str, PathBuf)> = AARCH64_TESTS
        .iter()
        .map(|t| {
            let exe = binaries
                .iter()
                .find(|(name, _)| name == t)
                .unwrap_or_else(|| panic!("cargo built no test binary {t}: {binaries:?}"));
            (*t, exe.1.clone())
        })
        .collect();
    // The examples build for aarch64 too, with every feature of selftrace (checked only; the
    // ones the tests run are built and run above), while the tests run. Not the benches: they
    // run natively only (their one architecture-specific part, the x86-64 probe peers, is
    // compiled out there) and their peers (criterion, pprof-rs, the usdt crate) would take
    // longer to check than everything else here.
    let mut c = debian_cargo(&target_dir);
    c.args([
        "check",
        "--target",
        TRIPLE,
        "--examples",
        "-p",
        "selftrace-examples",
        "--features",
        "usdt,trace,tracefs,threads,profile,tracing,pprof,flamegraph,http",
    ]);
    eprintln!("{TEST}: {c:?}");
    let mut check = c.spawn().expect("run Debian's cargo");
    let failed = run_in_lanes(&jobs, |exe| {
        let mut c = Command::new("qemu-aarch64");
        // What cargo gives the tests it runs: the fixture programs some of them build
        // (tests/example_build) are built by Debian's cargo, for aarch64.
        debian_env(c.arg(exe)).env("CARGO", DEBIAN_CARGO);
        cross_env(&mut c);
        c
    });
    let status = check.wait().expect("wait for Debian's cargo");
    assert!(
        failed.is_empty(),
        "aarch64 test binaries failed under qemu-user: {failed:?} (their output is above)"
    );
    assert!(
        status.success(),
        "the examples do not build for aarch64: {status}"
    );
}

/// The target directory of every build with Debian's cargo (the aarch64 tests and the other
/// targets' checks): the build scripts and proc-macros they need for the host are built once.
const DEBIAN_TARGET_DIR: &str = "debian";

/// The linker, C compiler and runner for aarch64 (Debian's cross gcc, qemu-user).
#[cfg(target_arch = "x86_64")]
fn cross_env(c: &mut Command) {
    c.env(
        "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
        "aarch64-linux-gnu-gcc",
    )
    .env(
        "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER",
        "qemu-aarch64",
    )
    .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc");
}

/// The test binaries in the JSON messages of `cargo test --no-run --message-format=json`: the
/// name [`AARCH64_TESTS`] gives each ([`LIB`] for the library's unit tests) and its path.
#[cfg(target_arch = "x86_64")]
fn test_binaries(json: &[u8]) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(json).lines() {
        let Ok(m) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), true) = (m["executable"].as_str(), m["profile"]["test"] == true) else {
            continue;
        };
        let name = if m["target"]["kind"][0] == "lib" {
            LIB.to_string()
        } else {
            m["target"]["name"].as_str().unwrap_or_default().to_string()
        };
        found.push((name, PathBuf::from(exe)));
    }
    found
}

/// Runs each job's command (`command(path)`) to its end, as many at once as the machine has
/// cores (at least two), taking the
/// jobs in their order; prints each one's output, whole, when it ends (as cargo does, the
/// lines of two binaries never mixed). Returns the names of the jobs that failed.
#[cfg(target_arch = "x86_64")]
fn run_in_lanes(
    jobs: &[(&str, PathBuf)],
    command: impl Fn(&Path) -> Command + Sync,
) -> Vec<String> {
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let lanes = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
    let next = AtomicUsize::new(0);
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..lanes {
            s.spawn(|| loop {
                let Some((name, exe)) = jobs.get(next.fetch_add(1, Ordering::SeqCst)) else {
                    return;
                };
                let start = std::time::Instant::now();
                let out = command(exe)
                    .stdin(Stdio::null())
                    .output()
                    .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
                let verdict = if out.status.success() {
                    "ok".to_string()
                } else {
                    failed.lock().unwrap().push(name.to_string());
                    format!("FAILED ({})", out.status)
                };
                // Straight to the file descriptor, past the test harness's capture: a CI log
                // shows each binary as it ends.
                let mut err = std::io::stderr().lock();
                let _ = writeln!(
                    err,
                    "\n     Ran aarch64 {name} under qemu-user ({}): {verdict}, {:.1} s",
                    exe.display(),
                    start.elapsed().as_secs_f64()
                );
                let _ = err.write_all(&out.stdout);
                let _ = err.write_all(&out.stderr);
            });
        }
    });
    failed.into_inner().unwrap()
}

#[test]
fn other_targets_build() {
    const TEST: &str = "other_targets_build";
    if !Path::new(DEBIAN_CARGO).is_file() || !Path::new(DEBIAN_RUSTC).is_file() {
        return skip(TEST, "Debian's rustc-web and cargo-web are not installed");
    }
    let mut failed = Vec::new();
    // The std source (rust-web-src), for the targets whose std package is missing: when their
    // architecture's packages could not be installed (`.ci/run` treats them as optional: a mirror that serves a bad index for one
    // architecture stops `apt-get update` for all of it). `-Zbuild-std` is a nightly-only
    // cargo flag, allowed on this stable compiler by RUSTC_BOOTSTRAP; the std it builds is the
    // same source as the packages'. (Not riscv64gc: Debian 12 has no riscv64 port, so its std
    // would be built from source on every run, a twentieth of the whole test run's CPU, for
    // the code powerpc64le compiles here already: the same `cfg`s, 64-bit, no port.)
    let src = Path::new("/usr/lib/rustlib/src/rust/library/std").is_dir();
    let from_source = |triple: &str| {
        let mut cargo = debian_cargo(&target_dir(DEBIAN_TARGET_DIR));
        cargo.env("RUSTC_BOOTSTRAP", "1");
        check(cargo, &["-Zbuild-std=std,panic_abort"], triple)
    };
    for triple in [
        "armv7-unknown-linux-gnueabihf",
        "i686-unknown-linux-gnu",
        "powerpc64le-unknown-linux-gnu",
    ] {
        let ok = if has_std(triple) {
            check(debian_cargo(&target_dir(DEBIAN_TARGET_DIR)), &[], triple)
        } else if src {
            eprintln!("{TEST}: no std package for {triple}: its std is built from rust-web-src");
            from_source(triple)
        } else {
            skip(
                TEST,
                &format!(
                    "no std for {triple} (install libstd-rust-web-dev for its Debian architecture, \
                     or rust-web-src)"
                ),
            );
            continue;
        };
        if !ok {
            failed.push(triple);
        }
    }
    assert!(failed.is_empty(), "cargo check failed for {failed:?}");
}

/// Each cargo feature builds on its own and with none (the features' dependencies between
/// each other and the `cfg`s that follow them are right): `cargo check` of the library (and
/// the CLI where it is built) with no default features, then with each feature alone.
#[test]
#[cfg(target_arch = "x86_64")]
fn every_feature_builds_alone() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut failed = Vec::new();
    let features = [
        "",
        "usdt",
        "trace",
        "tracefs",
        "threads",
        "profile",
        "pprof",
        "flamegraph",
        "http",
        "tracing",
        "tokio",
    ];
    for f in features {
        let mut c = Command::new(&cargo);
        c.current_dir(env!("CARGO_MANIFEST_DIR"))
            // The test run's own: its build scripts and proc-macros are this toolchain's, and
            // serve these checks too (a cargo that runs tests holds no lock on it).
            .env("CARGO_TARGET_DIR", outer_target_dir())
            .env("CARGO_INCREMENTAL", "0")
            .env_remove("RUSTFLAGS")
            .args([
                "check",
                "--quiet",
                "--lib",
                "--bins",
                "--no-default-features",
            ]);
        if !f.is_empty() {
            c.args(["--features", f]);
        }
        let ok = c
            .stdin(Stdio::null())
            .status()
            .expect("run cargo")
            .success();
        if !ok {
            failed.push(if f.is_empty() { "(none)" } else { f });
        }
    }
    assert!(
        failed.is_empty(),
        "cargo check failed with features {failed:?}"
    );
}

/// `cargo check` (with `extra` flags) of the library and the CLI for `triple`, every feature
/// on; whether it passed.
fn check(mut cargo: Command, extra: &[&str], triple: &str) -> bool {
    cargo
        .arg("check")
        .args(extra)
        .args(["--target", triple, "--all-features", "--lib", "--bins"])
        .status()
        .expect("run Debian's cargo")
        .success()
}

#[test]
fn every_test_file_runs_under_qemu_or_says_why() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    // The test binaries cargo finds: tests/NAME.rs and tests/NAME/main.rs.
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("read tests/")
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            if e.path().join("main.rs").is_file() {
                return Some(name);
            }
            Some(name.strip_suffix(".rs")?.to_string())
        })
        .collect();
    files.sort();
    for f in &files {
        let run = AARCH64_TESTS.contains(&f.as_str());
        let out = NOT_UNDER_QEMU.iter().any(|(t, _)| t == f);
        assert!(
            run != out,
            "test binary {f} must be in exactly one of AARCH64_TESTS and NOT_UNDER_QEMU"
        );
    }
    for t in AARCH64_TESTS
        .iter()
        .filter(|t| **t != LIB)
        .chain(NOT_UNDER_QEMU.iter().map(|(t, _)| t))
    {
        assert!(
            files.contains(&t.to_string()),
            "no tests/{t}.rs or tests/{t}/main.rs"
        );
    }
}
