//! Minidumps, read back by the real consumer: rust-minidump's `minidump` crate parses the dump
//! and `minidump-processor` walks every thread's stack from the dump alone, naming frames with
//! the binary's own DWARF (no Breakpad `.sym` files).
//!
//! Each crash runs in a child process (this test binary again, `MINIDUMP_SCENARIO` set) that
//! starts named threads (one spins, one sleeps, one blocks on a channel), prints their tids,
//! installs a seccomp filter that kills the process on `ptrace` and on any `clone` of a process
//! (so the dump is written with neither), and crashes.

#[path = "child_support/mod.rs"]
mod child_support;
#[path = "support/counting.rs"]
mod counting;
#[path = "support/target.rs"]
#[allow(dead_code)]
mod target;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

use minidump::{
    Minidump, MinidumpException, MinidumpLinuxMaps, MinidumpMemoryList, MinidumpMiscInfo,
    MinidumpModuleList, MinidumpSystemInfo, MinidumpThreadList, MinidumpThreadNames, Module,
};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

// ---- the child ------------------------------------------------------------------------------

#[inline(never)]
fn spin_forever() -> ! {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

#[inline(never)]
fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

#[inline(never)]
fn block_forever(rx: mpsc::Receiver<()>) {
    let _ = std::hint::black_box(rx.recv());
}

#[inline(never)]
fn crash_in_known_function(p: *mut u64) {
    // SAFETY: none: writing through a null pointer is the crash under test.
    unsafe { std::ptr::write_volatile(p, 0x5e1f) };
}

#[inline(never)]
fn middle_frame(p: *mut u64) {
    crash_in_known_function(std::hint::black_box(p));
    std::hint::black_box(());
}

#[inline(never)]
fn outer_frame(p: *mut u64) {
    middle_frame(std::hint::black_box(p));
    std::hint::black_box(());
}

#[inline(never)]
fn recurse_forever(depth: u64) -> u64 {
    let pad = std::hint::black_box([depth; 32]);
    if std::hint::black_box(depth) == u64::MAX {
        return 0;
    }
    recurse_forever(depth + 1) + pad[3]
}

#[inline(never)]
fn second_crash(p: *mut u64) {
    crash_in_known_function(std::hint::black_box(p));
    std::hint::black_box(());
}

extern "C" fn handler_that_crashes(_sig: i32) {
    crash_in_known_function(std::hint::black_box(std::ptr::null_mut()));
}

#[inline(never)]
fn raise_usr1() {
    // SAFETY: raising a signal whose handler is installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    std::hint::black_box(());
}

/// Starts the spinner, sleeper and blocked threads and prints `tid NAME TID` for each thread
/// (main too) so the parent knows which threads ran.
fn start_threads() -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<(String, i32)>();
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        let ready = ready_tx.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let me = selftrace::threads::current_tid();
                ready
                    .send((std::thread::current().name().unwrap().into(), me))
                    .unwrap();
                f();
            })
            .unwrap();
    };
    spawn("md-spinner", Box::new(|| spin_forever()));
    spawn("md-sleeper", Box::new(|| sleep_forever()));
    spawn("md-blocked", Box::new(move || block_forever(rx)));
    let mut sleepers = Vec::new();
    for _ in 0..3 {
        let (name, tid) = ready_rx.recv().unwrap();
        eprintln!("tid {name} {tid}");
        if name != "md-spinner" {
            sleepers.push(tid);
        }
    }
    eprintln!("tid main {}", selftrace::threads::current_tid());
    // The sleeper and the blocked thread in their system calls (state S), the spinner spinning.
    let asleep = |tid: i32| {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('S'))
        })
    };
    let start = std::time::Instant::now();
    while !sleepers.iter().all(|&t| asleep(t)) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    tx
}

/// Starts `md-masked`, a thread with every signal blocked (it cannot answer a request), and
/// prints `masked md-masked TID` once its mask is set.
fn start_masked_thread() {
    let (masked_tx, masked_rx) = mpsc::channel::<i32>();
    std::thread::Builder::new()
        .name("md-masked".into())
        .spawn(move || {
            // SAFETY: blocks every signal for this thread only.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
            masked_tx.send(selftrace::threads::current_tid()).unwrap();
            sleep_forever()
        })
        .unwrap();
    eprintln!("masked md-masked {}", masked_rx.recv().unwrap());
}

/// A seccomp filter that kills the process on `ptrace`, `clone3`, `fork`/`vfork` and a `clone`
/// without `CLONE_THREAD` (new threads are still allowed; none is made after this). Not under
/// qemu-user, which refuses seccomp filters (`EINVAL`: it cannot translate them): said on
/// stderr, and the test that checks the filter expects it.
fn forbid_ptrace_and_processes() {
    if target::under_qemu() {
        eprintln!("seccomp: not under qemu-user");
        return;
    }
    #[cfg(target_arch = "x86_64")]
    const ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let allow = libc::SECCOMP_RET_ALLOW;
    let mut prog = vec![
        stmt(ld, 4), // seccomp_data.arch
        jeq(ARCH, 1, 0),
        stmt(ret, kill),
        stmt(ld, 0), // seccomp_data.nr
    ];
    // aarch64 has neither fork nor vfork (glibc forks with clone).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut killed = vec![libc::SYS_ptrace as u32, libc::SYS_clone3 as u32];
    #[cfg(target_arch = "x86_64")]
    killed.extend([libc::SYS_fork as u32, libc::SYS_vfork as u32]);
    for nr in killed {
        prog.push(jeq(nr, 0, 1));
        prog.push(stmt(ret, kill));
    }
    prog.push(jeq(libc::SYS_clone as u32, 0, 3));
    prog.push(stmt(ld, 16)); // args[0], low half: the clone flags
    prog.push(libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16,
        jt: 1,
        jf: 0,
        k: libc::CLONE_THREAD as u32,
    });
    prog.push(stmt(ret, kill));
    prog.push(stmt(ret, allow));
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: prctl with valid arguments; the filter program outlives the call (the kernel
    // copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &fprog as *const libc::sock_fprog
            ),
            0,
            "seccomp: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// In a child (MINIDUMP_SCENARIO set): run the scenario. In the parent: nothing.
#[test]
// Its own frame in a release build too: the dumps' stacks are checked for it.
#[inline(never)]
fn child_entry() {
    let Ok(name) = std::env::var("MINIDUMP_SCENARIO") else {
        return;
    };
    let dir = std::env::var("MINIDUMP_DIR").expect("MINIDUMP_DIR");
    let timeout = Duration::from_secs(if cfg!(target_arch = "x86_64") { 3 } else { 60 });
    if name == "live" {
        selftrace::init().expect("init");
        let _tx = start_threads();
        let path = Path::new(&dir).join("live.dmp");
        let file = std::fs::File::create(&path).unwrap();
        forbid_ptrace_and_processes();
        let options = selftrace::minidump::Options::new().environ(true);
        let summary = selftrace::minidump::write_to(&file, &options).expect("minidump::write_to");
        eprintln!(
            "summary threads={} contexts={} modules={} bytes={}",
            summary.threads(),
            summary.threads_with_context(),
            summary.modules(),
            summary.bytes()
        );
        std::process::exit(0);
    }
    if name == "ptrace-is-killed" {
        forbid_ptrace_and_processes();
        // SAFETY: the filter kills the process here.
        unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
        std::process::exit(4);
    }
    if name == "segv-fd" {
        let file = std::fs::File::create(Path::new(&dir).join("given.dmp")).unwrap();
        selftrace::crash::builder()
            .minidump_fd(file)
            .symbolizer(false)
            .install()
            .expect("install");
        let _tx = start_threads();
        outer_frame(std::hint::black_box(std::ptr::null_mut()));
    }
    if name == "many-threads" {
        // More threads than a dump holds (MAX_THREADS), each with a small stack copied.
        selftrace::crash::builder()
            .minidump(&dir)
            .minidump_options(selftrace::minidump::Options::new().stack_size(4096))
            .symbolizer(false)
            .install()
            .expect("install");
        let extra = selftrace::minidump::MAX_THREADS + 76;
        for _ in 0..extra {
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn(|| sleep_forever())
                .expect("spawn");
        }
        eprintln!("started {extra} threads");
        outer_frame(std::hint::black_box(std::ptr::null_mut()));
    }
    selftrace::crash::builder()
        .minidump(&dir)
        .symbolizer_timeout(timeout)
        .install()
        .expect("install");
    match name.as_str() {
        "segv" => {
            let _tx = start_threads();
            // A thread that cannot answer (every signal blocked): listed all the same.
            start_masked_thread();
            forbid_ptrace_and_processes();
            outer_frame(std::hint::black_box(std::ptr::null_mut()));
        }
        "overflow" => {
            let _tx = start_threads();
            // Started before the filter (which forbids clone3), overflowing after it.
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let t = std::thread::Builder::new()
                .name("md-overflow".into())
                .spawn(move || {
                    eprintln!("tid md-overflow {}", selftrace::threads::current_tid());
                    go_rx.recv().unwrap();
                    recurse_forever(0)
                })
                .unwrap();
            std::thread::sleep(Duration::from_millis(50));
            forbid_ptrace_and_processes();
            go_tx.send(()).unwrap();
            let _ = t.join();
        }
        "in-handler" => {
            let _tx = start_threads();
            // SAFETY: installs a plain handler for SIGUSR1.
            unsafe {
                libc::signal(
                    libc::SIGUSR1,
                    handler_that_crashes as extern "C" fn(i32) as libc::sighandler_t,
                )
            };
            forbid_ptrace_and_processes();
            raise_usr1();
        }
        "two-crashes" => {
            // A thread holds the report lock for seconds (an all-thread dump waiting for a
            // thread with every signal blocked); meanwhile md-second and main crash and wait
            // for it. The one that reports second is in the first one's dump with its own
            // fault's context. Each step waits for the one before (no timing guesses): the
            // masked thread says it blocked its signals, the dump's first line on a pipe says
            // the dumper holds the lock.
            let _tx = start_threads();
            start_masked_thread();
            let (mut dump_out, dump_in) = std::io::pipe().unwrap();
            std::thread::Builder::new()
                .name("md-dumper".into())
                .spawn(move || {
                    selftrace::threads::dump_all_with_timeout(&dump_in, Duration::from_secs(3))
                })
                .unwrap();
            let (locked_tx, locked_rx) = mpsc::channel::<()>();
            std::thread::Builder::new()
                .name("md-drain".into())
                .spawn(move || {
                    use std::io::Read;
                    let mut first = [0u8; 1];
                    dump_out.read_exact(&mut first).unwrap();
                    locked_tx.send(()).unwrap();
                    let _ = std::io::copy(&mut dump_out, &mut std::io::sink());
                })
                .unwrap();
            locked_rx.recv().unwrap();
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let second = std::thread::Builder::new()
                .name("md-second".into())
                .spawn(move || {
                    eprintln!("tid md-second {}", selftrace::threads::current_tid());
                    go_rx.recv().unwrap();
                    second_crash(std::hint::black_box(std::ptr::null_mut()));
                })
                .unwrap();
            forbid_ptrace_and_processes();
            go_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            outer_frame(std::hint::black_box(std::ptr::null_mut()));
            let _ = second.join();
        }
        "asked-while-waiting" => {
            // md-second crashes while a dump holds the report lock (as above); then main asks
            // for md-second's stack while md-second waits in its crash handler, on std's small
            // alternate signal stack. The request must not run there (nested on that stack it
            // overflowed it, and a fault with SIGSEGV blocked killed the process without a
            // report): it times out, and md-second's report and dump follow once the lock is
            // free.
            let x86 = cfg!(target_arch = "x86_64");
            let _tx = start_threads();
            start_masked_thread();
            let (mut dump_out, dump_in) = std::io::pipe().unwrap();
            // The dump holds the report lock while it cannot write: its pipe holds one page
            // and is drained only after the request below (a thread that blocks the request
            // signal no longer holds a dump for its timeout, issue 45).
            {
                use std::os::fd::AsRawFd;
                // SAFETY: F_SETPIPE_SZ on a pipe we own.
                let r = unsafe { libc::fcntl(dump_in.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
                assert!(
                    r >= 4096,
                    "F_SETPIPE_SZ: {}",
                    std::io::Error::last_os_error()
                );
            }
            // Under 10 s: a crashed thread waits that long for the lock, then reports anyway.
            let hold = Duration::from_secs(if x86 { 3 } else { 8 });
            std::thread::Builder::new()
                .name("md-dumper".into())
                .spawn(move || selftrace::threads::dump_all_with_timeout(&dump_in, hold))
                .unwrap();
            {
                use std::io::Read;
                let mut first = [0u8; 1];
                dump_out.read_exact(&mut first).unwrap();
            }
            let (tid_tx, tid_rx) = mpsc::channel::<i32>();
            let (go_tx, go_rx) = mpsc::channel::<()>();
            std::thread::Builder::new()
                .name("md-second".into())
                .spawn(move || {
                    tid_tx.send(selftrace::threads::current_tid()).unwrap();
                    go_rx.recv().unwrap();
                    second_crash(std::hint::black_box(std::ptr::null_mut()));
                })
                .unwrap();
            let second = tid_rx.recv().unwrap();
            eprintln!("tid md-second {second}");
            go_tx.send(()).unwrap();
            // md-second faults within microseconds of the go (under qemu-user, milliseconds)
            // and then waits for the lock for the rest of `hold`.
            std::thread::sleep(Duration::from_millis(if x86 { 300 } else { 3000 }));
            let mut buf = [0usize; 64];
            let wait = Duration::from_millis(if x86 { 500 } else { 3000 });
            let answer = selftrace::threads::capture(second, &mut buf, wait);
            eprintln!("asked md-second: {:?}", answer.map(|w| w.frames));
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut dump_out, &mut std::io::sink());
            });
            sleep_forever()
        }
        other => panic!("unknown scenario {other}"),
    }
    eprintln!("scenario {name} did not crash");
    std::process::exit(3);
}

// ---- the parent -----------------------------------------------------------------------------

struct Run {
    status: std::process::ExitStatus,
    stderr: String,
    /// Thread name -> tid, as the child printed them.
    tids: BTreeMap<String, u32>,
    /// Threads that cannot answer (signals blocked): name -> tid.
    masked: BTreeMap<String, u32>,
    dir: PathBuf,
}

fn run(scenario: &str) -> Run {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("minidump-{scenario}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = child_support::test_child();
    child
        .env("MINIDUMP_SCENARIO", scenario)
        .env("MINIDUMP_DIR", &dir)
        .env("MINIDUMP_ENV_MARK", "environ-is-in-the-dump");
    let child_support::Finished { status, stderr, .. } =
        child_support::run_test_child(&mut child, child_support::deadline(60), scenario);
    let tids = stderr
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("tid ")?.split(' ');
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect();
    let masked = stderr
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("masked ")?.split(' ');
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect();
    Run {
        status,
        stderr,
        tids,
        masked,
        dir,
    }
}

/// The one `.dmp` file the crash left.
fn the_dump(run: &Run) -> PathBuf {
    let dumps: Vec<PathBuf> = std::fs::read_dir(&run.dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "dmp"))
        .collect();
    assert_eq!(dumps.len(), 1, "one dump expected; stderr:\n{}", run.stderr);
    let leftovers: Vec<_> = std::fs::read_dir(&run.dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tmp"))
        .collect();
    assert!(leftovers.is_empty(), "the .tmp name is gone: {leftovers:?}");
    let name = dumps[0].file_name().unwrap().to_str().unwrap();
    assert!(
        run.stderr
            .contains(&format!("minidump: {}", dumps[0].display())),
        "the report names the dump {name}; stderr:\n{}",
        run.stderr
    );
    dumps[0].clone()
}

// ---- reading a dump -------------------------------------------------------------------------

/// Function names from each module's own ELF symbol table (read with `object`, independent of
/// selftrace's symbolizer); frames are walked by minidump-unwind's framehop-based provider on
/// the modules' CFI.
struct ElfSymbols {
    /// Module base -> sorted (start, end, demangled name), addresses relative to the base.
    by_base: BTreeMap<u64, Vec<(u64, u64, String)>>,
}

impl ElfSymbols {
    fn new(modules: &MinidumpModuleList) -> ElfSymbols {
        use object::{Object, ObjectSymbol};
        let mut by_base = BTreeMap::new();
        for m in modules.iter() {
            let Ok(data) = std::fs::read(m.code_file().as_ref()) else {
                continue;
            };
            let Ok(file) = object::File::parse(&*data) else {
                continue;
            };
            let mut syms: Vec<(u64, u64, String)> = file
                .symbols()
                .chain(file.dynamic_symbols())
                .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
                .filter_map(|s| {
                    let name = s.name().ok()?;
                    Some((
                        s.address(),
                        s.address() + s.size().max(1),
                        format!("{:#}", rustc_demangle::demangle(name)),
                    ))
                })
                .collect();
            syms.sort();
            by_base.insert(m.base_address(), syms);
        }
        ElfSymbols { by_base }
    }
}

#[async_trait::async_trait]
impl minidump_unwind::SymbolProvider for ElfSymbols {
    async fn fill_symbol(
        &self,
        module: &(dyn Module + Sync),
        frame: &mut (dyn minidump_unwind::FrameSymbolizer + Send),
    ) -> Result<(), minidump_unwind::FillSymbolError> {
        let syms = self
            .by_base
            .get(&module.base_address())
            .ok_or(minidump_unwind::FillSymbolError {})?;
        // Position-independent objects: file addresses are offsets from the load base.
        let rel = frame.get_instruction() - module.base_address();
        let i = syms.partition_point(|s| s.0 <= rel);
        if i > 0 && rel < syms[i - 1].1 {
            let (start, _, name) = &syms[i - 1];
            frame.set_function(name, module.base_address() + start, 0);
        }
        Ok(())
    }

    async fn walk_frame(
        &self,
        _module: &(dyn Module + Sync),
        _walker: &mut (dyn minidump_unwind::FrameWalker + Send),
    ) -> Option<()> {
        None
    }

    async fn get_file_path(
        &self,
        module: &(dyn Module + Sync),
        _kind: minidump_unwind::FileKind,
    ) -> Result<PathBuf, minidump_unwind::FileError> {
        Ok(PathBuf::from(module.code_file().as_ref()))
    }
}

/// What the test reads out of a dump.
struct Read {
    /// tid -> name (ThreadNames).
    names: BTreeMap<u32, String>,
    /// tid -> whether the thread has a context and a stack.
    has_context: BTreeMap<u32, bool>,
    /// tid -> the function names of its walked stack, innermost first.
    stacks: BTreeMap<u32, Vec<String>>,
    /// (thread id, reason, address) of the exception stream.
    exception: Option<(u32, String, u64)>,
    /// The crashing thread as minidump-processor picked it.
    crashing: Option<u32>,
    /// (code file, code id) per module.
    modules: Vec<(String, Option<String>)>,
    cpu: String,
    os: String,
    pid: Option<u32>,
    maps: usize,
    stack_regions: usize,
    /// The Linux streams present, by name, with their bytes.
    linux: BTreeMap<&'static str, Vec<u8>>,
}

fn read(path: &Path) -> Read {
    let dump = Minidump::read_path(path).expect("rust-minidump reads the dump");
    let sys = dump.get_stream::<MinidumpSystemInfo>().expect("SystemInfo");
    let misc = dump.get_stream::<MinidumpMiscInfo>().ok();
    let threads = dump.get_stream::<MinidumpThreadList>().expect("ThreadList");
    let names = dump
        .get_stream::<MinidumpThreadNames>()
        .expect("ThreadNames");
    let modules = dump.get_stream::<MinidumpModuleList>().expect("ModuleList");
    let memory = dump.get_stream::<MinidumpMemoryList>().expect("MemoryList");
    let maps = dump.get_stream::<MinidumpLinuxMaps>().expect("Linux maps");
    let exception = dump.get_stream::<MinidumpException>().ok().map(|e| {
        (
            e.get_crashing_thread_id(),
            e.get_crash_reason(sys.os, sys.cpu).to_string(),
            e.get_crash_address(sys.os, sys.cpu),
        )
    });
    let mut has_context = BTreeMap::new();
    let mut thread_names = BTreeMap::new();
    for t in &threads.threads {
        let tid = t.raw.thread_id;
        has_context.insert(
            tid,
            t.context(&sys, misc.as_ref()).is_some() && t.raw.stack.memory.data_size > 0,
        );
        if let Some(n) = names.get_name(tid) {
            thread_names.insert(tid, n.to_string());
        }
    }
    let state = futures_executor::block_on(async {
        let mut provider = minidump_unwind::MultiSymbolProvider::new();
        provider.add(Box::new(
            minidump_unwind::debuginfo::DebugInfoSymbolProvider::new(&sys, &modules).await,
        ));
        provider.add(Box::new(ElfSymbols::new(&modules)));
        minidump_processor::process_minidump(&dump, &provider).await
    })
    .expect("minidump-processor processes the dump");
    let stacks = state
        .threads
        .iter()
        .map(|s| {
            let names = s
                .frames
                .iter()
                .map(|f| f.function_name.clone().unwrap_or_else(|| "??".into()))
                .collect();
            (s.thread_id, names)
        })
        .collect();
    let crashing = state.requesting_thread.map(|i| state.threads[i].thread_id);
    let mut linux = BTreeMap::new();
    for (name, kind) in [
        ("cpuinfo", 0x4767_0003u32),
        ("status", 0x4767_0004),
        ("lsb-release", 0x4767_0005),
        ("cmdline", 0x4767_0006),
        ("environ", 0x4767_0007),
        ("auxv", 0x4767_0008),
        ("maps", 0x4767_0009),
    ] {
        if let Ok(bytes) = dump.get_raw_stream(kind) {
            linux.insert(name, bytes.to_vec());
        }
    }
    Read {
        names: thread_names,
        has_context,
        stacks,
        exception,
        crashing,
        modules: modules
            .iter()
            .map(|m| {
                (
                    m.code_file().to_string(),
                    m.code_identifier().map(|c| c.to_string()),
                )
            })
            .collect(),
        cpu: sys.cpu.to_string(),
        os: sys.os.to_string(),
        pid: misc.and_then(|m| m.raw.process_id().copied()),
        maps: maps.memory_map_count(),
        stack_regions: memory.iter().count(),
        linux,
    }
}

/// The GNU build-id of an ELF file on disk, as lowercase hex (read with `object`).
fn build_id_of(path: &str) -> Option<String> {
    use object::Object;
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let id = file.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `stack` holds the names of `want` in that order (not necessarily adjacent).
fn in_order(stack: &[String], want: &[&str]) -> bool {
    let mut it = stack.iter();
    want.iter()
        .all(|w| it.any(|f| f.ends_with(w) || f.contains(&format!("{w}::"))))
}

fn name_of_tid(run: &Run, tid: u32) -> Option<&str> {
    run.tids
        .iter()
        .find(|(_, &t)| t == tid)
        .map(|(n, _)| n.as_str())
}

/// Checks what every dump of a run with `start_threads` must hold.
fn check_common(run: &Run, d: &Read, pid: Option<u32>) {
    let ctx = format!("stderr:\n{}", run.stderr);
    // Every thread that ran is in the dump with its name, registers and stack.
    for (name, tid) in &run.tids {
        let shown = if name == "main" {
            None
        } else {
            Some(name.as_str())
        };
        if let Some(shown) = shown {
            assert_eq!(
                d.names.get(tid).map(String::as_str),
                Some(shown),
                "thread {name} ({tid}) listed with its name; names {:?}; {ctx}",
                d.names
            );
        }
        assert_eq!(
            d.has_context.get(tid),
            Some(&true),
            "thread {name} ({tid}) has registers and stack; {:?}; {ctx}",
            d.has_context
        );
    }
    // And no thread that did not.
    for tid in d.has_context.keys() {
        assert!(
            name_of_tid(run, *tid).is_some() || d.names.contains_key(tid),
            "thread {tid} of the dump is a thread of the process; {ctx}"
        );
    }
    let tid = |n: &str| run.tids[n];
    let stack = |n: &str| d.stacks.get(&tid(n)).cloned().unwrap_or_default();
    assert!(
        stack("md-spinner")
            .iter()
            .any(|f| f.ends_with("spin_forever")),
        "spinner walked to spin_forever: {:?}",
        stack("md-spinner")
    );
    assert!(
        in_order(&stack("md-sleeper"), &["sleep", "sleep_forever"]),
        "sleeper: {:?}",
        stack("md-sleeper")
    );
    assert!(
        in_order(&stack("md-blocked"), &["recv", "block_forever"]),
        "blocked thread: {:?}",
        stack("md-blocked")
    );
    // Modules: the code id is the file's build-id.
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let exe = exe.to_str().unwrap();
    assert!(
        d.modules.iter().any(|(f, _)| f == exe),
        "the test binary is a module: {:?}",
        d.modules
    );
    let mut checked = 0;
    for (file, code_id) in &d.modules {
        if let Some(want) = build_id_of(file) {
            assert_eq!(code_id.as_deref(), Some(want.as_str()), "code id of {file}");
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "build-ids checked: {checked}; {:?}",
        d.modules
    );
    assert_eq!(d.os, "linux");
    let cpu = if cfg!(target_arch = "x86_64") {
        "amd64"
    } else {
        "arm64"
    };
    assert_eq!(d.cpu, cpu);
    if let Some(pid) = pid {
        assert_eq!(d.pid, Some(pid), "MiscInfo pid");
    }
    assert!(d.maps > 5, "maps stream: {} mappings", d.maps);
    let text = |k: &str| String::from_utf8_lossy(&d.linux[k]).into_owned();
    assert!(
        text("cmdline").contains("child_entry"),
        "cmdline: {:?}",
        text("cmdline")
    );
    assert!(text("status").contains("\nPid:"), "{}", text("status"));
    assert!(text("cpuinfo").contains("processor"), "{}", text("cpuinfo"));
    assert!(
        text("lsb-release").contains("ID="),
        "{}",
        text("lsb-release")
    );
    assert!(text("maps").contains(exe), "maps name the binary");
    // auxv: (key, value) pairs ending with AT_NULL; AT_PAGESZ (6) is there.
    let auxv: Vec<u64> = d.linux["auxv"]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(auxv.chunks(2).any(|kv| kv[0] == 6), "AT_PAGESZ in auxv");
    // Threads that could not answer are listed, with their name and without a context.
    for (name, tid) in &run.masked {
        assert_eq!(d.names.get(tid).map(String::as_str), Some(name.as_str()));
        assert_eq!(
            d.has_context.get(tid),
            Some(&false),
            "{name} has no context"
        );
    }
    assert!(
        d.stack_regions >= run.tids.len(),
        "memory regions for the stacks"
    );
}

#[test]
fn the_seccomp_filter_kills_ptrace() {
    let r = run("ptrace-is-killed");
    if r.stderr.contains("seccomp: not under qemu-user") {
        assert_eq!(r.status.code(), Some(4), "{}", r.stderr);
        return;
    }
    assert_eq!(
        r.status.signal(),
        Some(libc::SIGSYS),
        "ptrace under the test's filter kills the process; stderr:\n{}",
        r.stderr
    );
}

#[test]
fn a_crash_dump_has_every_thread_and_the_crashing_stack() {
    let r = run("segv");
    assert_eq!(r.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr);
    assert!(r.stderr.contains("selftrace: fatal signal"), "{}", r.stderr);
    let d = read(&the_dump(&r));
    check_common(&r, &d, None);
    let main = r.tids["main"];
    assert_eq!(r.masked.len(), 1, "{}", r.stderr);
    assert!(
        !d.linux.contains_key("environ"),
        "the environment only when asked"
    );
    let (tid, reason, addr) = d.exception.clone().expect("Exception stream");
    assert_eq!(tid, main);
    assert_eq!(reason, "SIGSEGV / SEGV_MAPERR");
    assert_eq!(addr, 0);
    assert_eq!(
        d.crashing,
        Some(main),
        "minidump-processor's crashing thread"
    );
    let stack = &d.stacks[&main];
    assert!(
        stack[0].ends_with("crash_in_known_function") || stack[0].contains("write_volatile"),
        "frame 0: {stack:?}"
    );
    assert!(
        in_order(
            stack,
            &[
                "crash_in_known_function",
                "middle_frame",
                "outer_frame",
                "child_entry"
            ]
        ),
        "the crashing stack, walked from the dump: {stack:?}"
    );
}

/// Issue 45: a crash in a process of more threads than a dump holds wrote 1,024 threads while
/// its report line read "(1024 threads, 1024 with registers and stack...)". The line and the
/// dump itself (Crashpad simple annotations, which `minidump-stackwalk --dump` prints) say how
/// many threads were left out.
#[test]
fn a_dump_of_more_threads_than_it_holds_says_how_many_it_left_out() {
    use minidump::MinidumpCrashpadInfo;
    use selftrace::minidump::MAX_THREADS;
    let r = run("many-threads");
    assert_eq!(r.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr);
    let path = the_dump(&r);
    let dump = Minidump::read_path(&path).expect("rust-minidump reads the dump");
    let listed = dump
        .get_stream::<MinidumpThreadList>()
        .expect("ThreadList")
        .threads
        .len();
    assert_eq!(listed, MAX_THREADS);
    let info = dump
        .get_stream::<MinidumpCrashpadInfo>()
        .expect("a Crashpad info stream saying what was left out");
    let annotation = |key: &str| -> usize {
        info.simple_annotations
            .get(key)
            .unwrap_or_else(|| panic!("no {key}: {:?}", info.simple_annotations))
            .parse()
            .unwrap()
    };
    let in_process = annotation("selftrace.threads_in_process");
    let left_out = annotation("selftrace.threads_left_out");
    assert!(in_process > MAX_THREADS + 76, "{in_process} threads");
    assert_eq!(left_out, in_process - MAX_THREADS);
    assert_eq!(annotation("selftrace.max_threads"), MAX_THREADS);
    // What `minidump-stackwalk --dump` (minidump_dump's format) prints of the stream.
    let mut printed = Vec::new();
    info.print(&mut printed).unwrap();
    let printed = String::from_utf8(printed).unwrap();
    let want = format!("simple_annotations[\"selftrace.threads_left_out\"] = {left_out}");
    assert!(printed.contains(&want), "{printed}");
    let line = r
        .stderr
        .lines()
        .find(|l| l.starts_with("minidump: "))
        .unwrap_or_else(|| panic!("no minidump line:\n{}", r.stderr));
    let want = format!(
        "({listed} threads, {left_out} more left out (a dump holds at most {MAX_THREADS}), "
    );
    assert!(line.contains(&want), "{line}");
}

#[test]
fn a_stack_overflow_dump_walks_the_overflowing_thread() {
    let r = run("overflow");
    assert_eq!(r.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr);
    assert!(r.stderr.contains("stack overflow"), "{}", r.stderr);
    let d = read(&the_dump(&r));
    check_common(&r, &d, None);
    let t = r.tids["md-overflow"];
    let (tid, reason, _) = d.exception.clone().expect("Exception stream");
    assert_eq!(tid, t);
    assert!(reason.starts_with("SIGSEGV"), "{reason}");
    let stack = &d.stacks[&t];
    assert!(
        stack.len() >= 10 && stack[..10].iter().all(|f| f.ends_with("recurse_forever")),
        "the overflowing thread, walked from the dump: {:?}",
        &stack[..stack.len().min(12)]
    );
}

#[test]
fn a_crash_in_a_signal_handler_is_dumped() {
    let r = run("in-handler");
    assert_eq!(r.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr);
    let d = read(&the_dump(&r));
    check_common(&r, &d, None);
    let main = r.tids["main"];
    assert_eq!(d.exception.as_ref().map(|e| e.0), Some(main));
    let stack = &d.stacks[&main];
    assert!(
        in_order(stack, &["crash_in_known_function", "handler_that_crashes"]),
        "the handler's frames, walked from the dump: {stack:?}"
    );
}

#[test]
fn a_live_dump_has_every_thread_and_no_exception() {
    let r = run("live");
    assert!(r.status.success(), "{}", r.stderr);
    let path = r.dir.join("live.dmp");
    let d = read(&path);
    assert!(d.exception.is_none(), "a live dump has no exception stream");
    assert!(
        String::from_utf8_lossy(&d.linux["environ"])
            .contains("MINIDUMP_ENV_MARK=environ-is-in-the-dump"),
        "the environment, asked for"
    );
    check_common(&r, &d, None);
    // The calling thread is in it, stopped in minidump::write_to.
    let main = r.tids["main"];
    assert!(
        in_order(&d.stacks[&main], &["minidump::write_to", "child_entry"]),
        "the writing thread: {:?}",
        d.stacks[&main]
    );
    let summary = r
        .stderr
        .lines()
        .find(|l| l.starts_with("summary "))
        .expect("summary line");
    let bytes: u64 = summary
        .split("bytes=")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert_eq!(bytes, std::fs::metadata(&path).unwrap().len(), "{summary}");
}

/// The fd, allocator calls and result of the dump written by [`dump_in_handler`].
static HANDLER_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static HANDLER_CALLS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(usize::MAX);
static HANDLER_THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn dump_in_handler(_sig: i32) {
    use std::sync::atomic::Ordering;
    let fd = HANDLER_FD.load(Ordering::SeqCst);
    // SAFETY: the test keeps the file open until after the signal was handled.
    let file = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let token = counting::start();
    let result = selftrace::minidump::write_to(file, &selftrace::minidump::Options::new());
    let calls = counting::stop(token);
    HANDLER_CALLS.store(calls, Ordering::SeqCst);
    if let Ok(s) = result {
        HANDLER_THREADS.store(s.threads_with_context(), Ordering::SeqCst);
    }
}

#[test]
fn a_dump_written_in_a_signal_handler_does_not_allocate() {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;
    selftrace::init().expect("init");
    selftrace::threads::install().expect("install");
    let (_tx, rx) = mpsc::channel::<()>();
    let other = std::thread::Builder::new()
        .name("md-alloc-other".into())
        .spawn(move || block_forever(rx))
        .unwrap();
    let other_tid = loop {
        // The other thread's tid, from /proc (it names itself on start).
        let found = std::fs::read_dir("/proc/self/task").unwrap().find_map(|e| {
            let tid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
            (comm.trim() == "md-alloc-other").then_some(tid)
        });
        if let Some(t) = found {
            break t;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    std::thread::sleep(Duration::from_millis(100));
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("minidump-handler-{}.dmp", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    HANDLER_FD.store(file.as_raw_fd(), Ordering::SeqCst);
    // SAFETY: installs a handler for SIGUSR2 and raises it on this thread (the handler runs
    // before raise returns).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = dump_in_handler as extern "C" fn(i32) as libc::sighandler_t;
        libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
        libc::raise(libc::SIGUSR2);
    }
    assert_eq!(
        HANDLER_CALLS.load(Ordering::SeqCst),
        0,
        "allocator calls while writing the dump in the handler"
    );
    assert!(HANDLER_THREADS.load(Ordering::SeqCst) >= 2);
    drop(file);
    let d = read(&path);
    assert!(
        d.stacks[&other_tid]
            .iter()
            .any(|f| f.ends_with("block_forever")),
        "the other thread's stack: {:?}",
        d.stacks[&other_tid]
    );
    let me = selftrace::threads::current_tid() as u32;
    assert!(
        in_order(&d.stacks[&me], &["dump_in_handler"]),
        "the handler's own thread: {:?}",
        d.stacks[&me]
    );
    std::fs::remove_file(&path).unwrap();
    drop(other);
}

#[test]
fn a_crash_dump_goes_to_a_given_file_too() {
    let r = run("segv-fd");
    assert_eq!(r.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr);
    assert!(r.stderr.contains("minidump: fd "), "{}", r.stderr);
    let d = read(&r.dir.join("given.dmp"));
    check_common(&r, &d, None);
    assert_eq!(d.exception.as_ref().map(|e| e.0), Some(r.tids["main"]));
}

#[test]
fn files_a_dump_cannot_be_written_to_are_refused() {
    use selftrace::Error;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // A pipe cannot be written at offsets.
    let (_r, w) = std::io::pipe().unwrap();
    assert!(matches!(
        selftrace::crash::builder().minidump_fd(w).install(),
        Err(Error::InvalidInput(why)) if why.contains("seekable")
    ));
    // O_APPEND makes Linux's pwrite append.
    let path = dir.join(format!("append-{}.dmp", std::process::id()));
    let appending = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    assert!(matches!(
        selftrace::minidump::write_to(&appending, &selftrace::minidump::Options::new()),
        Err(Error::InvalidInput(why)) if why.contains("O_APPEND")
    ));
    assert!(matches!(
        selftrace::crash::builder().minidump_fd(appending).install(),
        Err(Error::InvalidInput(why)) if why.contains("O_APPEND")
    ));
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        0,
        "nothing written"
    );
    std::fs::remove_file(&path).unwrap();
    // Issue 45: a stack size out of range was silently clamped; it is refused, saying why.
    let file =
        std::fs::File::create(dir.join(format!("sizes-{}.dmp", std::process::id()))).unwrap();
    for bytes in [0, 4095, (64 << 20) + 1, usize::MAX] {
        let options = selftrace::minidump::Options::new().stack_size(bytes);
        assert!(
            matches!(
                selftrace::minidump::write_to(&file, &options),
                Err(Error::InvalidInput(why)) if why.contains("stack size")
            ),
            "{bytes}"
        );
        assert!(
            matches!(
                selftrace::crash::builder()
                    .minidump(dir)
                    .minidump_options(options)
                    .install(),
                Err(Error::InvalidInput(why)) if why.contains("stack size")
            ),
            "{bytes}"
        );
    }
    assert_eq!(file.metadata().unwrap().len(), 0, "nothing written");
    drop(file);
    std::fs::remove_file(dir.join(format!("sizes-{}.dmp", std::process::id()))).unwrap();
    // A directory that does not exist.
    assert!(matches!(
        selftrace::crash::builder()
            .minidump(dir.join("no-such-directory"))
            .install(),
        Err(Error::Sys {
            call: "open",
            errno: libc::ENOENT
        })
    ));
}

#[test]
fn a_stack_request_to_a_thread_waiting_in_its_crash_handler_does_not_lose_the_report() {
    let r = run("asked-while-waiting");
    assert_eq!(r.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr);
    let second = r.tids["md-second"];
    assert!(
        r.stderr.contains("asked md-second: Err(Timeout)"),
        "the request times out: {}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains(&format!("tid {second}, thread \"md-second\"")),
        "md-second's report: {}",
        r.stderr
    );
    let d = read(&the_dump(&r));
    let (crashed, _, _) = d.exception.clone().expect("Exception stream");
    assert_eq!(crashed, second);
}

#[test]
fn a_thread_that_crashes_while_another_reports_is_dumped_at_its_own_fault() {
    let r = run("two-crashes");
    assert_eq!(r.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr);
    let d = read(&the_dump(&r));
    let (crashed, _, _) = d.exception.clone().expect("Exception stream");
    let (main, second) = (r.tids["main"], r.tids["md-second"]);
    assert!(crashed == main || crashed == second, "{crashed}");
    let stack = |t: u32| d.stacks.get(&t).cloned().unwrap_or_default();
    assert!(
        in_order(
            &stack(main),
            &["crash_in_known_function", "middle_frame", "outer_frame"]
        ),
        "main: {:?}",
        stack(main)
    );
    assert!(
        in_order(&stack(second), &["crash_in_known_function", "second_crash"]),
        "md-second: {:?}",
        stack(second)
    );
}
