//! selftrace in one run: a program traces itself.
//!
//! ```sh
//! cargo run --release --features pprof,flamegraph --example demo
//! ```
//!
//! 1. Stacks: the current stack captured async-signal-safely, printed the kernel's way and
//!    glibc's way, then as an owned `Backtrace` with file:line and inlined frames.
//! 2. A stack captured inside a signal handler, through the signal frame.
//! 3. A crash report: the demo runs itself as a child that dereferences null.
//! 4. USDT probes: the probes compiled in, then a uprobe the program puts on its own probe
//!    through tracefs: the semaphore rises and every hit is read back with its values.
//! 5. Trace markers: sections, async sections and counters, read back from a private ftrace
//!    instance.
//! 6. Other threads: an all-thread dump (a thread blocked on a `Mutex` held by another), and
//!    the stall watchdog catching a thread that stops checking in, then its recovery.
//! 7. A CPU profile of two threads that split their work 1:2:3 over three functions, written as
//!    a pprof file and a flame graph into a new directory `selftrace-demo-<pid>` in the
//!    temporary directory (`$TMPDIR`, else /tmp), whatever the target directory; the demo
//!    prints their full paths.
//!
//! Parts 4 and 5 need root and tracefs; without them the demo says why and goes on. When the
//! profile's files cannot be written, the demo says where and why and exits with status 1.

use selftrace::symbolize::{self, KernelOptions};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

fn heading(s: &str) {
    println!("\n=== {s} ===");
}

/// Prints frames the way the crash handler does (async-signal-safe formatting).
fn print_kernel_style(frames: &[usize], first_exact: bool) {
    for i in 0..frames.len() {
        let kind = symbolize::frame_kind(frames, i, first_exact);
        let mut line = [0u8; 512];
        let opts = KernelOptions {
            object_offset: true,
            ..KernelOptions::default()
        };
        let n = symbolize::write_kernel_frame(&mut line, frames[i], kind, opts);
        let note = if symbolize::is_signal_trampoline(frames[i]) {
            " <signal handler called>"
        } else {
            ""
        };
        println!(" #{i:<2} {}{note}", String::from_utf8_lossy(&line[..n]));
    }
}

#[inline(never)]
fn parse_config(depth: u32) -> Vec<usize> {
    if depth > 0 {
        let v = parse_config(depth - 1);
        return black_box(v);
    }
    read_section()
}

#[inline(never)]
fn read_section() -> Vec<usize> {
    let mut frames = [0usize; 64];
    let n = selftrace::capture(&mut frames);
    frames[..n].to_vec()
}

#[inline(never)]
fn render() -> selftrace::Backtrace {
    let bt = selftrace::Backtrace::capture();
    black_box(bt)
}

static HANDLER_FRAMES: [AtomicUsize; 32] = [const { AtomicUsize::new(0) }; 32];
static HANDLER_N: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigusr1(_: i32) {
    let mut frames = [0usize; 32];
    let n = selftrace::capture(&mut frames);
    for (slot, f) in HANDLER_FRAMES.iter().zip(&frames[..n]) {
        slot.store(*f, Ordering::Relaxed);
    }
    HANDLER_N.store(n, Ordering::Relaxed);
}

#[inline(never)]
fn busy_with_work() {
    // SAFETY: raise(3) delivers SIGUSR1 to this thread before it returns.
    unsafe { libc::raise(libc::SIGUSR1) };
    black_box(());
}

fn crash_child() -> ! {
    selftrace::crash::install().expect("install the crash handler");
    #[inline(never)]
    fn load_user_record(p: *const u64) -> u64 {
        // SAFETY: deliberately invalid: the demo shows a crash report.
        unsafe { std::ptr::read_volatile(p) }
    }
    black_box(load_user_record(black_box(std::ptr::null())));
    unreachable!("the null dereference above kills the process");
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--crash-child") {
        crash_child();
    }
    selftrace::init().expect("selftrace::init");

    heading("1. the current stack (capture: async-signal-safe)");
    let frames = parse_config(2);
    print_kernel_style(&frames[..frames.len().min(8)], false);
    println!("\nthe same frames in glibc's backtrace_symbols format (local names too):");
    for line in selftrace::backtrace_symbols(&frames[..frames.len().min(4)]) {
        println!("  {line}");
    }
    println!("\nan owned Backtrace with file:line and inlined frames (short form):");
    print!("{}", render());

    heading("2. inside a signal handler: through the signal frame");
    // SAFETY: installs a plain handler for SIGUSR1.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr1 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    busy_with_work();
    let n = HANDLER_N.load(Ordering::Relaxed);
    let hf: Vec<usize> = HANDLER_FRAMES[..n]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    print_kernel_style(&hf[..n.min(9)], false);

    heading("3. a crash report (a child process dereferences null)");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--crash-child")
        .output()
        .expect("run the child");
    let report = String::from_utf8_lossy(&out.stderr);
    for line in report.lines().take(24) {
        println!("  {line}");
    }
    use std::os::unix::process::ExitStatusExt;
    println!("  ... the child died by signal {:?}", out.status.signal());

    heading("4. USDT probes (a uprobe on the program's own probe)");
    probes();

    heading("5. trace markers (Android's Trace API over ftrace)");
    markers();

    heading("6. other threads: an all-thread dump and the stall watchdog");
    other_threads();

    heading("7. a CPU profile (sampling profiler, per-thread CPU-time timers)");
    profile_demo();
}

/// Two threads split their CPU time 1:2:3 over three functions; the profile says so.
fn profile_demo() {
    use selftrace::profile;
    let p = profile::builder()
        .frequency(999)
        .start()
        .expect("start the profiler");
    let workers: Vec<_> = (0..2)
        .map(|i| {
            std::thread::Builder::new()
                .name(format!("demo-worker-{i}"))
                .spawn(|| {
                    let end = std::time::Instant::now() + std::time::Duration::from_millis(1500);
                    let mut x = 0u64;
                    while std::time::Instant::now() < end {
                        x ^= decode_frame(x);
                        x ^= checksum_block(x);
                        x ^= compress_block(x);
                    }
                    black_box(x);
                    thread_cpu_s()
                })
                .expect("spawn a worker")
        })
        .collect();
    let cpu: f64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let profile = p.stop();
    println!(
        "{} samples ({} Hz, {:.1} s, {} dropped) for {cpu:.2} s of the workers' CPU time \
         ({:.0} periods); share of the samples per function:",
        profile.total(),
        profile.frequency_hz,
        profile.duration.as_secs_f64(),
        profile.dropped,
        cpu * f64::from(profile.frequency_hz)
    );
    for f in ["decode_frame", "checksum_block", "compress_block"] {
        println!("  {:5.1}%  demo::{f}", 100.0 * profile.share_of(f));
    }
    println!("the hottest stack, folded (what flamegraph.pl reads):");
    if let Some(line) = profile
        .folded()
        .lines()
        .max_by_key(|l| l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()))
    {
        println!("  {line}");
    }
    // Not into the package's `target/`: with CARGO_TARGET_DIR elsewhere (or the binary run
    // from another place) it does not exist.
    let dir = match output_dir() {
        Ok(d) => d,
        Err((dir, e)) => {
            eprintln!(
                "demo: cannot create {} for the pprof file and the flame graph: {e}",
                dir.display()
            );
            std::process::exit(1);
        }
    };
    let pprof = dir.join("selftrace-profile.pb.gz");
    let svg = dir.join("selftrace-profile.svg");
    let mut failed = false;
    for (what, path, bytes) in [
        ("pprof", &pprof, profile.to_pprof()),
        ("flame graph", &svg, profile.flamegraph_svg()),
    ] {
        match write_new(path, &bytes) {
            Ok(()) => println!("{what}: {}", path.display()),
            Err(e) => {
                eprintln!("demo: cannot write the {what} to {}: {e}", path.display());
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
    println!(
        "  read them with: go tool pprof -top {}; a browser opens {}",
        pprof.display(),
        svg.display()
    );
}

/// A new directory for the demo's files, `selftrace-demo-<pid>[-<n>]` in the temporary
/// directory (`$TMPDIR`, else /tmp): new, so that nothing planted at a known name there is
/// followed or overwritten. On failure, the directory it could not create and why.
fn output_dir() -> Result<std::path::PathBuf, (std::path::PathBuf, std::io::Error)> {
    use std::os::unix::fs::DirBuilderExt;
    let base = format!("selftrace-demo-{}", std::process::id());
    let mut n = 0;
    loop {
        let name = match n {
            0 => base.clone(),
            _ => format!("{base}-{n}"),
        };
        let dir = std::env::temp_dir().join(name);
        match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
            Err(e) => return Err((dir, e)),
        }
    }
}

/// Writes `bytes` to the new file `path` (never an existing one).
fn write_new(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create_new(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// The calling thread's CPU time in seconds.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[inline(never)]
fn decode_frame(seed: u64) -> u64 {
    spin_for(seed, 100_000)
}

#[inline(never)]
fn checksum_block(seed: u64) -> u64 {
    spin_for(seed, 200_000)
}

#[inline(never)]
fn compress_block(seed: u64) -> u64 {
    spin_for(seed, 300_000)
}

fn spin_for(mut x: u64, n: u64) -> u64 {
    for i in 0..n {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

/// Holds `lock` until `release` is set.
#[inline(never)]
fn hold_the_lock(lock: &std::sync::Mutex<u32>, release: &std::sync::atomic::AtomicBool) {
    let _g = lock.lock().unwrap();
    while !release.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Blocks on `lock`.
#[inline(never)]
fn wait_for_the_lock(lock: &std::sync::Mutex<u32>) {
    let g = lock.lock().unwrap();
    black_box(*g);
}

/// A loop that forgets to check in for a while: the watchdog's soft lockup.
#[inline(never)]
fn rebuild_index(d: std::time::Duration) -> u64 {
    let start = std::time::Instant::now();
    let mut x = 0u64;
    while start.elapsed() < d {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    x
}

fn other_threads() {
    use selftrace::{threads, watchdog};
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    // Two threads: one holds a lock, the other waits for it. The dump shows both stacks.
    let lock = Arc::new(Mutex::new(0u32));
    let release = Arc::new(AtomicBool::new(false));
    let (l1, r1) = (lock.clone(), release.clone());
    let holder = std::thread::Builder::new()
        .name("holder".into())
        .spawn(move || hold_the_lock(&l1, &r1))
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let l2 = lock.clone();
    let waiter = std::thread::Builder::new()
        .name("waiter".into())
        .spawn(move || wait_for_the_lock(&l2))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let summary = threads::dump_all(std::io::stdout());
    println!("({summary:?})");
    release.store(true, Ordering::SeqCst);
    holder.join().unwrap();
    waiter.join().unwrap();

    // A worker that checks in every few milliseconds, then gets stuck for 0.8 s.
    println!("\nthe watchdog (timeout 300 ms, checks every 50 ms):");
    let _ = std::io::stdout().flush();
    watchdog::builder()
        .period(Duration::from_millis(50))
        .fd(std::os::fd::AsFd::as_fd(&std::io::stdout())
            .try_clone_to_owned()
            .expect("dup stdout"))
        .install()
        .expect("the watchdog");
    let worker = std::thread::Builder::new()
        .name("indexer".into())
        .spawn(|| {
            let w = watchdog::watch_with_timeout("indexer", Duration::from_millis(300))
                .expect("watch the indexer");
            for round in 0..60 {
                w.pet();
                if round == 20 {
                    black_box(rebuild_index(Duration::from_millis(800)));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
        .unwrap();
    worker.join().unwrap();
    // One more tick, for the recovery line.
    std::thread::sleep(Duration::from_millis(100));
}

/// A request handler with a probe: `demo:request` fires with the id, the status and the path.
#[inline(never)]
fn handle_request(id: u64, status: i32, path: &str) {
    selftrace::probe!(demo, request, id, status, path);
    black_box(());
}

fn probes() {
    for p in selftrace::usdt::probes() {
        let args: Vec<String> = p
            .arguments()
            .iter()
            .map(|a| format!("{}{}", if a.signed { "i" } else { "u" }, a.size * 8))
            .collect();
        println!(
            "  compiled in: {}:{}({})",
            p.provider(),
            p.name(),
            args.join(", ")
        );
    }
    let exe = std::env::current_exe().expect("current_exe");
    let note = match selftrace::usdt::read_probes(&exe) {
        Ok(notes) => notes
            .into_iter()
            .find(|n| n.provider == "demo" && n.name == "request"),
        Err(e) => {
            println!("cannot read this program's probes: {e}");
            return;
        }
    };
    let Some(note) = note else {
        println!("demo:request not found in {}", exe.display());
        return;
    };
    let mut session = match selftrace::tracefs::Session::new("selftrace-demo") {
        Ok(s) => s,
        Err(e) => {
            println!("  no uprobes here: {e}");
            return;
        }
    };
    println!(
        "  enabled before attaching: {}",
        selftrace::probe_enabled!(demo, request)
    );
    let attached = match session.add_probe(&exe, &note) {
        Ok(_) => session.enable(),
        Err(e) => Err(e),
    };
    if let Err(e) = attached {
        println!("  cannot attach: {e}");
        return;
    }
    println!(
        "  enabled after attaching:  {}",
        selftrace::probe_enabled!(demo, request)
    );
    handle_request(1, 200, "/index.html");
    handle_request(2, -1, "/missing");
    match session.read_hits() {
        Ok(hits) => {
            for h in &hits {
                let args: Vec<String> = h.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!("  hit {} tid {} {}", h.event, h.tid, args.join(" "));
            }
        }
        Err(e) => println!("  cannot read the hits: {e}"),
    }
    // Dropping the session removes the uprobe event and the private instance.
}

fn markers() {
    use selftrace::trace;
    let status = trace::init();
    if status != trace::Status::Enabled {
        println!("markers are off here: {status}");
        println!("(run as root on a machine with tracefs to see them read back)");
        return;
    }
    let inst = match selftrace::tracefs::Instance::for_markers("selftrace-demo") {
        Ok(i) => i,
        Err(e) => {
            println!("cannot create a private tracefs instance: {e}");
            return;
        }
    };
    {
        let _frame = trace::section("frame 1");
        trace::begin_async_section("load config", 7);
        {
            let _decode = trace::section!("decode {} bytes", 4096);
            trace::set_counter("queue depth", 3);
        }
        trace::end_async_section("load config", 7);
        trace::instant("vsync");
    }
    let pid = std::process::id();
    match inst.read_markers() {
        Ok(events) => {
            for e in events.iter().filter(|e| e.pid == Some(pid)) {
                println!(
                    "  {:>16} ns  tid {:<7} {:<14} {}",
                    e.timestamp_ns,
                    e.tid,
                    format!("{:?}", e.kind),
                    e.text
                );
            }
        }
        Err(e) => println!("cannot read the instance back: {e}"),
    }
}
