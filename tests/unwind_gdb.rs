//! selftrace against gdb's `bt`, at a breakpoint in each class of code whose unwind rules need
//! more than rsp/rbp + offset:
//!
//! - `sha512`: inside OpenSSL's SHA-512 assembly in libcrypto, at a pc where the CFA is a DWARF
//!   expression (or based on another register), per `readelf --debug-dump=frames-interp`;
//! - `probe`: inside LLVM's stack-probe loop of a Rust function with a 256 KiB frame (CFA =
//!   r11 + N), a few iterations in, when rsp has moved;
//! - `lazy`: in ld.so's `_dl_fixup` during the first call through a lazy PLT entry (under
//!   `_dl_runtime_resolve_xsavec`, CFA based on rbx).
//!
//! On aarch64 (built for it and run under qemu-user, gdb-multiarch attached to qemu's gdb stub)
//! the code has no such rules (Debian's arm64 libcrypto describes its assembly by sp and x29 or
//! not at all; the probe loop's CFA is x29 + 32), so the cases there are the ones that are hard
//! on aarch64: a hot pc in libcrypto's SHA-512 assembly, the probe loop, `_dl_fixup` under
//! `_dl_runtime_resolve`, and `pac`: a leaf under frames built with pointer authentication,
//! whose saved return addresses are signed (gdb's are compared without their PAC bits).
//!
//! This test binary is also the program gdb runs: with `SELFTRACE_GDB_ROLE` set, the test
//! `gdb_role` prepares the case, calls `selftrace_test_gdb_hook(pc)` (gdb then sets the real
//! breakpoint at `pc`), and runs the code. At the breakpoint gdb prints its frames, then resumes
//! with `signal SIGUSR2` (gdb's `call` fails on this kernel); the SIGUSR2 handler runs
//! `Capture::walk_ucontext` on its `ucontext_t` and prints the frames. The two lists must be
//! equal, or gdb's a prefix of selftrace's when selftrace ends at `_start`/`clone3`.

#[path = "support/cfa.rs"]
mod cfa;
#[path = "support/unwind_fixtures.rs"]
#[allow(dead_code)]
mod fixtures;
#[path = "support/target.rs"]
mod target;

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const TEST: &str = "unwind_gdb";
const ROLE_ENV: &str = "SELFTRACE_GDB_ROLE";
const LAZY_ENV: &str = "SELFTRACE_GDB_LAZY_LIB";
const PAC_ENV: &str = "SELFTRACE_GDB_PAC_LIB";
/// The register of a function's first argument, in gdb's syntax.
const ARG0: &str = if cfg!(target_arch = "aarch64") {
    "$x0"
} else {
    "$rdi"
};
/// Bits of a user-space code address on aarch64: above them, a return address saved by code
/// built with pointer authentication carries its PAC.
const VA_MASK: usize = (1 << 48) - 1;
/// Each gdb session is killed after this long.
const GDB_TIMEOUT: Duration = Duration::from_secs(50);

// ---- the program gdb runs -------------------------------------------------------------------

/// gdb stops here (`break *selftrace_test_gdb_hook`) and sets its real breakpoint at `pc`
/// (from `$rdi`), or at `_dl_fixup` for the lazy case.
#[no_mangle]
#[inline(never)]
pub extern "C" fn selftrace_test_gdb_hook(pc: usize) {
    black_box(pc);
}

const DEPTH: usize = 128;

struct Frames(UnsafeCell<[usize; DEPTH]>);
// SAFETY: written once by the SIGUSR2 handler before DONE is set, read after DONE.
unsafe impl Sync for Frames {}

static FRAMES: Frames = Frames(UnsafeCell::new([0; DEPTH]));
static FRAMES_N: AtomicUsize = AtomicUsize::new(0);
static DONE: AtomicBool = AtomicBool::new(false);

/// Appends `v` in hex to `out` at `at`; returns the new position.
fn put_hex(out: &mut [u8], mut at: usize, v: usize) -> usize {
    for &b in b"0x" {
        out[at] = b;
        at += 1;
    }
    let digits = (usize::BITS as usize - v.leading_zeros() as usize)
        .div_ceil(4)
        .max(1);
    for k in (0..digits).rev() {
        out[at] = b"0123456789abcdef"[(v >> (4 * k)) & 15];
        at += 1;
    }
    at
}

extern "C" fn on_usr2(_sig: i32, _info: *mut libc::siginfo_t, uc: *mut c_void) {
    if DONE.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: the only writer (one signal, sent once by gdb); uc is the kernel's ucontext_t.
    let frames = unsafe { &mut *FRAMES.0.get() };
    // SAFETY: as above.
    let n = unsafe {
        selftrace::Capture::new()
            .walk_ucontext(uc.cast(), frames)
            .frames
    };
    FRAMES_N.store(n, Ordering::Release);
    let mut line = [0u8; 24 * DEPTH];
    let mut at = 0;
    for &b in b"\nSELFTRACE_FRAMES" {
        line[at] = b;
        at += 1;
    }
    for &f in &frames[..n] {
        line[at] = b' ';
        at = put_hex(&mut line, at + 1, f);
    }
    line[at] = b'\n';
    // SAFETY: write(2) of an initialized stack buffer to stdout.
    unsafe { libc::write(1, line.as_ptr().cast(), at + 1) };
    DONE.store(true, Ordering::Release);
}

/// CPU-timer samples of the role itself (to find a hot pc in libcrypto).
static PROF_PCS: Frames = Frames(UnsafeCell::new([0; DEPTH]));
static PROF_N: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_prof(_sig: i32, _info: *mut libc::siginfo_t, uc: *mut c_void) {
    let i = PROF_N.fetch_add(1, Ordering::AcqRel);
    if i < DEPTH {
        // SAFETY: uc is the ucontext_t the kernel passed to this handler.
        let (pc, _) = unsafe { target::interrupted_pc_sp(uc) };
        // SAFETY: slot i was claimed by this call alone.
        unsafe { (*PROF_PCS.0.get())[i] = pc };
    }
}

fn install(sig: i32, f: extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void)) {
    // SAFETY: a SA_SIGINFO handler that touches only atomics and static buffers.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = f as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

type Sha512 = unsafe extern "C" fn(*const u8, usize, *mut u8) -> *mut u8;

/// Samples SHA-512 under a CPU timer and returns a sampled pc in libcrypto whose CFA rule is
/// hard (an expression preferred), with the rule; on aarch64, where none is hard, the pc most
/// often sampled.
fn hot_hard_pc_in_sha512(sha: Sha512, data: &[u8]) -> (usize, String) {
    let libcrypto = selftrace::symbolize(sha as *const () as usize).expect("libcrypto symbols");
    let table = cfa::CfaTable::load(Path::new(libcrypto.path)).expect("readelf on libcrypto");
    // Warm up first: the samples must come from the steady state (the pc is hit again when gdb
    // waits for it), not from libcrypto's one-time initialisation.
    let mut md = [0u8; 64];
    for _ in 0..32 {
        // SAFETY: data is valid for its length; md has 64 bytes.
        unsafe { sha(data.as_ptr(), data.len(), md.as_mut_ptr()) };
    }
    install(libc::SIGPROF, on_prof);
    // SAFETY: a CLOCK_THREAD_CPUTIME_ID timer for this thread, deleted below.
    let timer = unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = libc::SIGPROF;
        sev.sigev_notify_thread_id = libc::gettid();
        let mut id: libc::timer_t = std::mem::zeroed();
        assert_eq!(
            libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut sev, &mut id),
            0
        );
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        let spec = libc::itimerspec {
            it_interval: ts,
            it_value: ts,
        };
        assert_eq!(libc::timer_settime(id, 0, &spec, std::ptr::null_mut()), 0);
        id
    };
    let start = Instant::now();
    while PROF_N.load(Ordering::Acquire) < DEPTH && start.elapsed() < Duration::from_secs(20) {
        // SAFETY: data is valid for its length; md has 64 bytes.
        unsafe { sha(data.as_ptr(), data.len(), md.as_mut_ptr()) };
        black_box(&md);
    }
    // SAFETY: the timer created above, deleted once.
    unsafe { libc::timer_delete(timer) };
    // SAFETY: the timer is gone; a signal still pending at worst writes an unread slot.
    let pcs = unsafe { *PROF_PCS.0.get() };
    let n = PROF_N.load(Ordering::Acquire).min(DEPTH);
    let mut best: Option<(usize, String)> = None;
    if cfg!(target_arch = "aarch64") {
        let mut seen = std::collections::HashMap::new();
        for &pc in &pcs[..n] {
            if selftrace::symbolize(pc).is_some_and(|s| s.path == libcrypto.path) {
                *seen.entry(pc).or_insert(0) += 1;
            }
        }
        let pc = seen
            .into_iter()
            .max_by_key(|&(pc, k)| (k, pc))
            .map(|(pc, _)| pc)
            .expect("no sampled pc in libcrypto's SHA-512");
        let rule = table
            .rule_at((pc - libcrypto.bias) as u64)
            .unwrap_or("no CFI")
            .to_string();
        return (pc, rule);
    }
    for &pc in &pcs[..n] {
        if !(pc >= libcrypto.bias
            && selftrace::symbolize(pc).is_some_and(|s| s.path == libcrypto.path))
        {
            continue;
        }
        let Some(rule) = table.rule_at((pc - libcrypto.bias) as u64) else {
            continue;
        };
        if cfa::is_hard(rule) && best.as_ref().is_none_or(|b| b.1 != "exp" && rule == "exp") {
            best = Some((pc, rule.to_string()));
        }
    }
    best.expect("no sampled pc in libcrypto's SHA-512 with a CFA expression or non-rsp/rbp CFA")
}

/// A pc in `big_frame`: the start of the stack-probe loop (the first pc whose CFA is
/// r11-based; on aarch64 the loop's second instruction, one after the first x29-based row), or,
/// for the control case, the first pc after it whose CFA is sp-based.
fn big_frame_pc(in_probe_loop: bool) -> (usize, String) {
    let f = fixtures::big_frame as *const () as usize;
    let s = selftrace::symbolize(f).expect("symbolize big_frame");
    let exe = std::env::current_exe().expect("current_exe");
    let table = cfa::CfaTable::load(&exe).expect("readelf on the test");
    let start = (s.start - s.bias) as u64;
    let end = start + s.size.max(1) as u64;
    let (probe_base, sp) = if cfg!(target_arch = "aarch64") {
        ("x29", "sp+")
    } else {
        ("r11", "rsp+")
    };
    let probe = table.rows_where(start, end, |r| r.starts_with(probe_base));
    let (loop_start, loop_end) = *probe
        .first()
        .expect("no probe-loop CFA row in big_frame: no stack-probe loop?");
    let loc = if in_probe_loop {
        loop_start + if cfg!(target_arch = "aarch64") { 4 } else { 0 }
    } else {
        table
            .rows_where(loop_end, end, |r| r.starts_with(sp))
            .first()
            .expect("an sp-based row after the probe loop")
            .0
    };
    let pc = loc as usize + s.bias;
    let rule = table.rule_at(loc).unwrap_or("?").to_string();
    (pc, rule)
}

#[inline(never)]
fn role_sha512() {
    let (_h, syms) = fixtures::open(
        "libcrypto.so.3",
        libc::RTLD_NOW | libc::RTLD_LOCAL,
        &["SHA512"],
    )
    .expect("libcrypto");
    selftrace::refresh();
    // SAFETY: SHA512 has this C signature.
    let sha = unsafe { std::mem::transmute::<usize, Sha512>(syms[0]) };
    let data = vec![0x5au8; 16 << 10];
    let (pc, rule) = hot_hard_pc_in_sha512(sha, &data);
    println!("ROLE_TARGET {pc:#x} cfa={rule}");
    selftrace_test_gdb_hook(pc);
    let mut md = [0u8; 64];
    let start = Instant::now();
    while !DONE.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(30) {
        // SAFETY: as in hot_hard_pc_in_sha512.
        unsafe { sha(data.as_ptr(), data.len(), md.as_mut_ptr()) };
        black_box(&md);
    }
}

#[inline(never)]
fn role_probe(in_probe_loop: bool) {
    let (pc, rule) = big_frame_pc(in_probe_loop);
    println!("ROLE_TARGET {pc:#x} cfa={rule}");
    selftrace_test_gdb_hook(pc);
    let start = Instant::now();
    let mut i = 0u64;
    while !DONE.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(30) {
        black_box(fixtures::big_frame(black_box(i)));
        i += 1;
    }
}

#[inline(never)]
fn role_lazy() {
    let path = std::env::var(LAZY_ENV).expect("lazy fixture path");
    let (_h, syms) = fixtures::open(&path, libc::RTLD_LAZY | libc::RTLD_LOCAL, &["a_all"])
        .expect("the lazy-binding fixture");
    selftrace::refresh();
    // SAFETY: a_all has this C signature.
    let a_all = unsafe { std::mem::transmute::<usize, extern "C" fn(i32) -> i32>(syms[0]) };
    println!("ROLE_TARGET _dl_fixup");
    selftrace_test_gdb_hook(0);
    black_box(a_all(black_box(1)));
}

/// A leaf under two frames that saved signed return addresses (aarch64).
#[inline(never)]
fn role_pac() {
    let path = std::env::var(PAC_ENV).expect("pac fixture path");
    let (_h, syms) = fixtures::open(
        &path,
        libc::RTLD_NOW | libc::RTLD_LOCAL,
        &["pac_outer", "pac_work"],
    )
    .expect("the pointer-authentication fixture");
    selftrace::refresh();
    type Outer = unsafe extern "C" fn(*const u8, libc::c_ulong, libc::c_ulong) -> libc::c_ulong;
    // SAFETY: pac_outer has this C signature.
    let outer = unsafe { std::mem::transmute::<usize, Outer>(syms[0]) };
    // Inside pac_work's loop: its third instruction (a leaf: it sets up no frame).
    let pc = syms[1] + 8;
    println!("ROLE_TARGET {pc:#x} pac_work+8");
    selftrace_test_gdb_hook(pc);
    let data = vec![0x5au8; 4096];
    let start = Instant::now();
    while !DONE.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(30) {
        // SAFETY: data is valid for its length.
        black_box(unsafe { outer(data.as_ptr(), data.len() as _, 5) });
    }
}

/// Entered only when gdb runs this binary with `SELFTRACE_GDB_ROLE` set.
#[test]
fn gdb_role() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    selftrace::init().expect("init");
    install(libc::SIGUSR2, on_usr2);
    match role.as_str() {
        "sha512" => role_sha512(),
        "probe" => role_probe(true),
        "control" => role_probe(false),
        "lazy" => role_lazy(),
        "pac" => role_pac(),
        _ => panic!("unknown role {role}"),
    }
    assert!(
        DONE.load(Ordering::Acquire),
        "the SIGUSR2 handler never ran"
    );
    // Names, in normal context, for the report (the driver cannot symbolize our addresses).
    // SAFETY: the handler has finished (DONE).
    let frames = unsafe { &*FRAMES.0.get() };
    let n = FRAMES_N.load(Ordering::Acquire);
    let mut line = String::from("SELFTRACE_NAMES");
    for (i, &a) in frames[..n].iter().enumerate() {
        let (name, obj) = fixtures::name_of(if i == 0 { a } else { a.wrapping_sub(1) });
        line += &format!(" | {name} ({obj})");
    }
    println!("{line}");
    println!(
        "SELFTRACE_ROOT {}",
        fixtures::ends_at_root(&frames[..n]) as u8
    );
    std::io::stdout().flush().unwrap();
}

// ---- the driver -----------------------------------------------------------------------------

/// What one gdb session saw.
struct Session {
    gdb: Vec<usize>,
    selftrace: Vec<usize>,
    selftrace_names: String,
    selftrace_at_root: bool,
    target: String,
    log: String,
}

fn hex_list(line: &str) -> Vec<usize> {
    line.split_whitespace()
        .filter_map(|w| usize::from_str_radix(w.strip_prefix("0x")?, 16).ok())
        .collect()
}

const PY_FRAMES: &str = "python
f = gdb.newest_frame()
pcs = []
while f is not None:
    if f.type() != gdb.INLINE_FRAME:
        pcs.append('%#x' % f.pc())
    f = f.older()
print('GDB_FRAMES ' + ' '.join(pcs))
end
";

fn run_gdb(role: &str, at_hook: &str, env: &[(&str, &str)], dir: &Path) -> Result<Session, String> {
    // Natively gdb starts the program; under qemu-user the program waits in qemu's gdb stub
    // (`qemu-aarch64 -g PORT`) and gdb-multiarch attaches to it.
    let qemu = target::under_qemu();
    let start = if qemu { "continue" } else { "run" };
    let script = format!(
        "set pagination off\n\
         set confirm off\n\
         set width 0\n\
         set breakpoint pending on\n\
         set print thread-events off\n\
         set language c\n\
         handle SIGUSR2 nostop noprint pass\n\
         handle SIGPROF nostop noprint pass\n\
         break *selftrace_test_gdb_hook\n\
         {start}\n\
         {at_hook}\n\
         continue\n\
         bt\n\
         {PY_FRAMES}\
         delete\n\
         signal SIGUSR2\n"
    );
    let cmd_file = dir.join(format!("{role}.gdb"));
    std::fs::write(&cmd_file, script).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let role_args = ["--exact", "gdb_role", "--nocapture", "--test-threads=1"];
    let (mut cmd, program) = if qemu {
        // A free port for qemu's stub: bound, then released for qemu to take.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let mut prog = Command::new("qemu-aarch64");
        prog.arg("-g")
            .arg(port.to_string())
            .arg(&exe)
            .args(role_args)
            .env(ROLE_ENV, role)
            .env_remove("LD_BIND_NOW")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            prog.env(k, v);
        }
        let program = prog.spawn().map_err(|e| format!("qemu-aarch64: {e}"))?;
        let mut gdb = Command::new("gdb-multiarch");
        gdb.args(["-nx", "-batch", "-ex", "set sysroot /", "-ex"])
            .arg(format!("file {}", exe.display()))
            .arg("-ex")
            .arg(format!("target remote 127.0.0.1:{port}"))
            .arg("-x")
            .arg(&cmd_file);
        (gdb, Some(program))
    } else {
        let mut gdb = Command::new("gdb");
        gdb.args(["-nx", "-batch", "-x"])
            .arg(&cmd_file)
            .arg("--args")
            .arg(&exe)
            .args(role_args)
            .env(ROLE_ENV, role)
            .env_remove("LD_BIND_NOW");
        for (k, v) in env {
            gdb.env(k, v);
        }
        (gdb, None)
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().map_err(|e| format!("gdb: {e}"))?;
    let out = wait_with_timeout(child, GDB_TIMEOUT);
    // The program's own output (under qemu it is not gdb's).
    let prog_out = match program {
        Some(p) => match wait_with_timeout(p, Duration::from_secs(20)) {
            Ok(o) => format!(
                "{}\n--- program stderr ---\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => e,
        },
        None => String::new(),
    };
    let out = out?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned() + &prog_out;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let log = format!("--- gdb stdout ---\n{stdout}\n--- gdb stderr ---\n{stderr}");
    // A marker may follow other output on its line (libtest's `test gdb_role ... `).
    let line = |p: &str| {
        stdout
            .lines()
            .find_map(|l| l.find(p).map(|i| l[i + p.len()..].trim().to_string()))
    };
    let (Some(g), Some(s)) = (line("GDB_FRAMES"), line("SELFTRACE_FRAMES")) else {
        return Err(format!(
            "gdb session '{role}' did not produce both stacks\n{log}"
        ));
    };
    Ok(Session {
        // gdb-multiarch may show a saved return address with its PAC (qemu's stub describes
        // no pointer-authentication mask): compared without it.
        gdb: hex_list(&g)
            .into_iter()
            .map(|a| {
                if cfg!(target_arch = "aarch64") {
                    a & VA_MASK
                } else {
                    a
                }
            })
            .collect(),
        selftrace: hex_list(&s),
        selftrace_names: line("SELFTRACE_NAMES").unwrap_or_default(),
        selftrace_at_root: line("SELFTRACE_ROOT").is_some_and(|r| r.trim() == "1"),
        target: line("ROLE_TARGET").unwrap_or_default(),
        log,
    })
}

fn wait_with_timeout(
    mut child: std::process::Child,
    limit: Duration,
) -> Result<std::process::Output, String> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().map_err(|e| e.to_string()),
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let out = child.wait_with_output().map_err(|e| e.to_string())?;
                return Err(format!(
                    "gdb timed out after {limit:?}\n{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn tool_present(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A gdb session: role, what it shows, gdb commands at the hook, extra environment.
type Case<'a> = (&'a str, &'a str, &'a str, Vec<(&'a str, &'a str)>);

#[test]
fn selftrace_agrees_with_gdb_bt_where_cfi_needs_more_than_rsp_and_rbp() {
    if std::env::var_os(ROLE_ENV).is_some() {
        return; // this process is the one gdb runs
    }
    let cc = target::cc();
    let tools: &[&str] = if target::under_qemu() {
        &["gdb-multiarch", "qemu-aarch64", "readelf", &cc]
    } else {
        &["gdb", "readelf", &cc]
    };
    for &tool in tools {
        if !tool_present(tool) {
            return fixtures::skip(
                TEST,
                &format!(
                    "{tool} not found (install gdb or gdb-multiarch, qemu-user, binutils, gcc)"
                ),
            );
        }
    }
    if let Err(why) = fixtures::open("libcrypto.so.3", libc::RTLD_NOW | libc::RTLD_LOCAL, &[]) {
        return fixtures::skip(TEST, &format!("{why} (install libssl-dev)"));
    }
    selftrace::init().expect("init");
    let lazy_ok = fixtures::ldso_has_local_names();
    if !lazy_ok {
        fixtures::skip(
            TEST,
            "ld.so has no local symbols (install libc6-dbg): gdb cannot break in _dl_fixup; \
             the lazy-binding case is left out",
        );
    }
    let dir = fixtures::FixtureDir::new("unwind_gdb");
    let lazy = match fixtures::build_lazy(&dir.0, 1) {
        Ok(p) => p[0].to_str().unwrap().to_string(),
        Err(why) => return fixtures::skip(TEST, &why),
    };

    let at_arg0 = format!("break *{ARG0}");
    let at_arg0_4th = format!("break *{ARG0}\nignore $bpnum 3");
    let pac = if cfg!(target_arch = "aarch64") {
        match fixtures::build_pac(&dir.0) {
            Ok(p) => Some(p.to_str().unwrap().to_string()),
            Err(why) => return fixtures::skip(TEST, &why),
        }
    } else {
        None
    };
    let mut cases: Vec<Case> = if cfg!(target_arch = "aarch64") {
        vec![
            (
                "control",
                "control: big_frame's epilogue after the probe loop (CFA = sp + N)",
                &at_arg0,
                vec![],
            ),
            (
                "sha512",
                "OpenSSL SHA-512 assembly, the hottest sampled pc (described by sp/x29, or no CFI)",
                &at_arg0,
                vec![],
            ),
            (
                "probe",
                "LLVM stack-probe loop, 4th iteration (sp moving, CFA = x29 + N)",
                &at_arg0_4th,
                vec![],
            ),
            (
                "lazy",
                "_dl_fixup in a first lazy PLT call (under _dl_runtime_resolve)",
                "break _dl_fixup",
                vec![(LAZY_ENV, lazy.as_str())],
            ),
        ]
    } else {
        vec![
            (
                "control",
                "control: big_frame's body after the probe loop (CFA = rsp + N; agrees today)",
                &at_arg0,
                vec![],
            ),
            (
                "sha512",
                "OpenSSL SHA-512 assembly (CFA expression / other register)",
                &at_arg0,
                vec![],
            ),
            (
                "probe",
                "LLVM stack-probe loop, 4th iteration (CFA = r11 + N)",
                &at_arg0_4th,
                vec![],
            ),
            (
                "lazy",
                "_dl_fixup in a first lazy PLT call (under _dl_runtime_resolve_xsavec, CFA rbx-based)",
                "break _dl_fixup",
                vec![(LAZY_ENV, lazy.as_str())],
            ),
        ]
    };
    if let Some(pac) = pac.as_deref() {
        cases.push((
            "pac",
            "a leaf under frames that saved signed return addresses (-mbranch-protection=standard)",
            &at_arg0,
            vec![(PAC_ENV, pac)],
        ));
    }
    let mut failures = Vec::new();
    for (role, what, at_hook, env) in &cases {
        if *role == "lazy" && !lazy_ok {
            continue;
        }
        let s = match run_gdb(role, at_hook, env, &dir.0) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{role}: {e}"));
                continue;
            }
        };
        let same = s
            .gdb
            .iter()
            .zip(&s.selftrace)
            .take_while(|(a, b)| a == b)
            .count();
        // gdb went astray where it differs: a frame 0 or the same frame twice in a row (seen
        // with gdb-multiarch 13 at the entry of OpenSSL's CFI-less arm64 assembly, where its
        // prologue analysis leaves out the caller). selftrace must then have gone on to the
        // thread's root from the same frame 0.
        let gdb_astray =
            same >= 1 && (same..s.gdb.len()).any(|k| s.gdb[k] == 0 || s.gdb[k] == s.gdb[k - 1]);
        let agree = s.gdb == s.selftrace
            || (s.selftrace.len() > s.gdb.len()
                && s.selftrace.starts_with(&s.gdb)
                && s.selftrace_at_root)
            || (gdb_astray && s.selftrace_at_root);
        eprintln!(
            "{role}: {what}\n  target {}\n  gdb {} frames, selftrace {} frames, equal prefix {same}: {}",
            s.target,
            s.gdb.len(),
            s.selftrace.len(),
            match (agree, gdb_astray) {
                (true, true) => "AGREE (gdb went astray after the equal prefix)",
                (true, false) => "AGREE",
                _ => "DIFFER",
            }
        );
        if !agree {
            let bt: Vec<&str> = s.log.lines().filter(|l| l.starts_with('#')).collect();
            let names: Vec<&str> = s
                .selftrace_names
                .trim_start_matches('|')
                .split(" | ")
                .map(str::trim)
                .collect();
            let mut msg =
                format!("{role} ({what}): selftrace differs from gdb at frame {same}\n  gdb bt:\n");
            for l in &bt {
                msg += &format!("    {l}\n");
            }
            msg += "  selftrace:\n";
            for (i, a) in s.selftrace.iter().enumerate() {
                msg += &format!("    #{i:<2} {a:#x} {}\n", names.get(i).unwrap_or(&"?"));
            }
            eprintln!("{msg}");
            failures.push(msg);
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
