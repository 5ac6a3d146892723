//! selftrace in one run: a program traces itself.
//!
//! ```sh
//! cargo run --release --example demo
//! ```
//!
//! 1. Stacks: the current stack captured async-signal-safely, printed the kernel's way and
//!    glibc's way, then as an owned `Backtrace` with file:line and inlined frames.
//! 2. A stack captured inside a signal handler, through the signal frame.
//! 3. A crash report: the demo runs itself as a child that dereferences null.
//! 4. Trace markers: sections, async sections and counters, read back from a private ftrace
//!    instance (needs root and tracefs; otherwise it says why).

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

    heading("4. trace markers (Android's Trace API over ftrace)");
    markers();
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
