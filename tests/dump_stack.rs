//! `dump_stack()`: the kernel-style trace of the current stack, in normal context and inside a
//! real signal handler, where it must not allocate.

use std::io::Read;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

#[path = "support/counting.rs"]
mod counting;
#[path = "support/spinner.rs"]
mod spinner;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

fn pipe() -> (i32, std::fs::File) {
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] is a fresh fd we own.
    (fds[1], unsafe { std::fs::File::from_raw_fd(fds[0]) })
}

fn read_all(w: i32, mut r: std::fs::File) -> String {
    // SAFETY: closing our write end so that the read sees EOF.
    unsafe { libc::close(w) };
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    s
}

#[inline(never)]
fn dumping_function(fd: i32) {
    selftrace::crash::dump_stack_to(borrowed(fd));
    std::hint::black_box(());
}

#[test]
// Its own frame in a release build too: the trace is checked for it.
#[inline(never)]
fn dump_stack_prints_the_current_stack() {
    selftrace::init().unwrap();
    let (w, r) = pipe();
    dumping_function(w);
    let text = read_all(w, r);
    assert!(
        text.starts_with("------------[ selftrace: dump_stack ]------------\n"),
        "{text}"
    );
    let trace: Vec<&str> = text.lines().filter(|l| l.starts_with(" #")).collect();
    let at = trace
        .iter()
        .position(|l| l.contains("dump_stack::dumping_function+0x"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        trace[at + 1].contains("dump_stack::dump_stack_prints_the_current_stack+0x"),
        "{text}"
    );
    assert!(text.contains("---[ end of dump_stack ]---"), "{text}");
}

static FD: AtomicI32 = AtomicI32::new(-1);
static HANDLER_ALLOCS: AtomicUsize = AtomicUsize::new(usize::MAX);

extern "C" fn on_signal(_: i32) {
    let ((), calls) =
        counting::counting(|| selftrace::crash::dump_stack_to(borrowed(FD.load(Ordering::SeqCst))));
    HANDLER_ALLOCS.store(calls, Ordering::SeqCst);
    spinner::STOP.store(true, Ordering::SeqCst);
}

#[test]
fn dump_stack_in_a_signal_handler_allocates_nothing_and_shows_the_interrupted_code() {
    selftrace::init().unwrap();
    let (w, r) = pipe();
    FD.store(w, Ordering::SeqCst);
    // SAFETY: a plain handler for SIGUSR2.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        spinner::spin_until_stopped();
    });
    let thread = rx.recv().unwrap();
    while !spinner::SPINNING.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    // SAFETY: the thread spins until the handler runs.
    assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR2) }, 0);
    t.join().unwrap();
    let text = read_all(w, r);
    assert_eq!(
        HANDLER_ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations in the handler"
    );
    let trace: Vec<&str> = text.lines().filter(|l| l.starts_with(" #")).collect();
    let handler = trace
        .iter()
        .position(|l| l.contains("dump_stack::on_signal+0x"));
    let spinner = trace
        .iter()
        .position(|l| l.contains("spinner::spin_until_stopped+0x"));
    assert!(
        matches!((handler, spinner), (Some(h), Some(s)) if h < s),
        "the handler, then (through the signal frame) the interrupted function:\n{text}"
    );
}

/// A raw fd of this test's (or 1, stdout), borrowed for one call.
fn borrowed(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the tests pass fds they opened and close only after the call returned.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

// ---- stack budget: every async-signal-safe entry point on a small alternate signal stack ----
//
// Each case runs in a child process (this binary's `child_entry`), inside a real signal
// handler on an alternate stack of the size the entry point documents: a case that needs more
// faults on the guard page below it, and the child dies of SIGSEGV.

#[path = "support/altstack.rs"]
mod altstack;
#[path = "child_support/mod.rs"]
mod child_support;
#[path = "support/target.rs"]
mod target;

/// Where a case writes (a pipe the child reads after the handler returned).
static CASE_FD: AtomicI32 = AtomicI32::new(-1);
/// Frames captured in normal context, for the cases that format given addresses.
static CASE_FRAMES: [AtomicUsize; 16] = [const { AtomicUsize::new(0) }; 16];
static CASE_FRAME_COUNT: AtomicUsize = AtomicUsize::new(0);
/// What a case found (frames, bytes, a yes as 1), checked after the handler returned.
static CASE_N: AtomicUsize = AtomicUsize::new(0);
static CASE_ALLOCS: AtomicUsize = AtomicUsize::new(usize::MAX);
/// A thread that waits while `threads::capture` asks for its stack.
static CASE_TID: AtomicI32 = AtomicI32::new(0);
static V0_NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A valid v0 name of about 1 KiB whose types nest about as deep as rustc-demangle goes:
/// `a::f::<&&&...&u8, a::S<a::S<...a::S<u8>...>>>`.
fn deep_v0_name() -> String {
    let mut s = String::from("_RINvC1a1f");
    s.push_str(&"R".repeat(440));
    s.push('h');
    let k = 64;
    s.push_str(&"INtC1a1S".repeat(k));
    s.push('h');
    s.push_str(&"E".repeat(k));
    s.push('E');
    s
}

/// A function of this file's for the naming cases.
#[inline(never)]
fn case_target() {
    std::hint::black_box(());
}

fn case_write(b: &[u8]) {
    // SAFETY: our buffer to our pipe.
    let _ = unsafe { libc::write(CASE_FD.load(Ordering::SeqCst), b.as_ptr().cast(), b.len()) };
}

fn case_out() -> std::os::fd::BorrowedFd<'static> {
    borrowed(CASE_FD.load(Ordering::SeqCst))
}

/// Runs `f` in the handler counting allocations; stores its number.
fn in_case(f: impl FnOnce() -> usize) {
    let (n, calls) = counting::counting(f);
    CASE_N.store(n, Ordering::SeqCst);
    CASE_ALLOCS.store(calls, Ordering::SeqCst);
}

type Check = fn(usize, &str) -> Result<(), String>;
type Case = (&'static str, fn(*const libc::ucontext_t), Check);

/// The entry points: name, what runs in the handler, what must hold afterwards (its number,
/// what it wrote).
const CASES: &[Case] = &[
    (
        "capture",
        |_| {
            in_case(|| {
                let mut frames = [0usize; 64];
                selftrace::capture(&mut frames)
            })
        },
        |n, _| (n >= 3).then_some(()).ok_or(format!("{n} frames")),
    ),
    (
        "walk_ucontext",
        |uc| {
            in_case(|| {
                let mut frames = [0usize; 64];
                // SAFETY: the kernel's ucontext of this handler.
                unsafe { selftrace::Capture::new().walk_ucontext(uc, &mut frames) }.frames
            })
        },
        |n, _| (n >= 2).then_some(()).ok_or(format!("{n} frames")),
    ),
    (
        "symbolize",
        |_| {
            in_case(|| {
                let mut buf = [0u8; 256];
                let s = selftrace::symbolize(case_target as *const () as usize);
                let name = s.as_ref().and_then(|s| s.demangle_into(&mut buf));
                case_write(name.unwrap_or("").as_bytes());
                name.is_some() as usize
            })
        },
        |_, out| {
            out.contains("dump_stack::case_target")
                .then_some(())
                .ok_or(format!("named {out:?}"))
        },
    ),
    (
        "write_kernel_frame",
        |_| {
            in_case(|| {
                let mut buf = [0u8; 512];
                let n = selftrace::symbolize::write_kernel_frame(
                    &mut buf,
                    case_target as *const () as usize,
                    selftrace::symbolize::FrameKind::Exact,
                    selftrace::symbolize::KernelOptions::default(),
                );
                case_write(&buf[..n]);
                n
            })
        },
        |_, out| {
            out.contains("case_target+0x0/")
                .then_some(())
                .ok_or(format!("wrote {out:?}"))
        },
    ),
    (
        "backtrace_symbols_fd",
        |_| {
            in_case(|| {
                let n = CASE_FRAME_COUNT.load(Ordering::SeqCst);
                let frames: [usize; 16] =
                    std::array::from_fn(|i| CASE_FRAMES[i].load(Ordering::SeqCst));
                selftrace::backtrace_symbols_fd(&frames[..n], case_out());
                n
            })
        },
        |n, out| {
            // One glibc line per frame, this program's named (`child_entry` may be inlined
            // in an optimized build).
            let lines = out.lines().count() == n && out.lines().all(|l| l.contains("[0x"));
            (n > 2 && lines && out.contains("/dump_stack-"))
                .then_some(())
                .ok_or(format!("{n} frames:\n{out}"))
        },
    ),
    (
        "demangle_into",
        |_| {
            in_case(|| {
                let name = V0_NAME.get().map_or(&b""[..], |s| s.as_bytes());
                let mut buf = [0u8; 2048];
                let text = selftrace::symbolize::demangle_into(name, &mut buf);
                case_write(text.as_bytes());
                text.len()
            })
        },
        |_, out| {
            let v0 = V0_NAME.get().unwrap();
            let full = out.starts_with("a::f::<&&&&")
                && out.contains("a::S<u8>>>")
                && out.ends_with(">>>");
            // The shorter form: the name as it is, mangled.
            let short = out == v0.as_str();
            (full || short)
                .then_some(())
                .ok_or(format!("demangled {} bytes: {out}", out.len()))
        },
    ),
    (
        "dump_stack_to",
        |_| {
            in_case(|| {
                selftrace::crash::dump_stack_to(case_out());
                0
            })
        },
        |_, out| check_dump(out, "dump_stack", "---[ end of dump_stack ]---"),
    ),
    (
        "dump_all",
        |_| in_case(|| selftrace::threads::dump_all(case_out()).threads),
        |n, out| {
            if n < 2 {
                return Err(format!("{n} threads:\n{out}"));
            }
            check_dump(out, "all threads", "---[ end of all threads ]---")
        },
    ),
    (
        "threads_capture",
        |_| {
            in_case(|| {
                let mut frames = [0usize; 64];
                let tid = CASE_TID.load(Ordering::SeqCst);
                let timeout = std::time::Duration::from_secs(10);
                match selftrace::threads::capture(tid, &mut frames, timeout) {
                    Ok(w) => w.frames,
                    Err(_) => 0,
                }
            })
        },
        |n, _| (n >= 2).then_some(()).ok_or(format!("{n} frames")),
    ),
];

/// A dump's text: its header and end, and the calling thread's stack from the handler through
/// the signal frame to the code it interrupted.
fn check_dump(out: &str, what: &str, end: &str) -> Result<(), String> {
    let header = format!("------------[ selftrace: {what} ]------------");
    // The handler, its signal frame, then the code it interrupted: `syscall` (the tgkill that
    // raised the signal), in this order in the calling thread's trace.
    let handler = out.find("altstack::on_signal+0x").unwrap_or(out.len());
    let rest = &out[handler..];
    let through = rest
        .find(" <signal handler called>\n")
        .and_then(|s| rest[s..].lines().nth(1))
        .is_some_and(|next| next.contains(" : syscall+0x"));
    let ok = out.starts_with(&header) && out.contains(end) && through;
    ok.then_some(()).ok_or(format!("dump:\n{out}"))
}

/// In a child (DUMP_STACK_CASE set): runs the case on an alternate stack of DUMP_STACK_SIZE
/// bytes and checks it. In the parent: nothing.
#[test]
fn child_entry() {
    let Ok(name) = std::env::var("DUMP_STACK_CASE") else {
        return;
    };
    let size: usize = std::env::var("DUMP_STACK_SIZE").unwrap().parse().unwrap();
    selftrace::init().unwrap();
    if name == "dump_signal_small_thread" {
        return dump_signal_on_a_small_thread();
    }
    if name == "crash_handler" {
        return crash_on_a_small_alternate_stack(size);
    }
    let (_, run, check) = *CASES.iter().find(|c| c.0 == name).unwrap();
    selftrace::threads::install().unwrap();
    let _ = V0_NAME.set(deep_v0_name());
    let mut frames = [0usize; 16];
    let n = selftrace::capture(&mut frames);
    for (slot, f) in CASE_FRAMES.iter().zip(&frames[..n]) {
        slot.store(*f, Ordering::SeqCst);
    }
    CASE_FRAME_COUNT.store(n, Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let waiter = std::thread::spawn(move || {
        CASE_TID.store(selftrace::threads::current_tid(), Ordering::SeqCst);
        let _ = rx.recv();
    });
    while CASE_TID.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    let (w, r) = pipe();
    CASE_FD.store(w, Ordering::SeqCst);
    let used = altstack::run(size, run);
    drop(tx);
    waiter.join().unwrap();
    let out = read_all(w, r);
    println!("{out}");
    println!(
        "case {name}: used {used} of {size} bytes (signal frame {})",
        altstack::signal_frame_size()
    );
    assert_eq!(CASE_ALLOCS.load(Ordering::SeqCst), 0, "allocations");
    if let Err(e) = check(CASE_N.load(Ordering::SeqCst), &out) {
        panic!("case {name}: {e}");
    }
}

/// The dump signal sent to a thread spawned with a 32 KiB stack: its handler runs on that
/// stack (no alternate stack), dumps every thread, and the program goes on. (On aarch64 glibc
/// makes it 128 KiB, its `PTHREAD_STACK_MIN`: the case is strict on x86-64.)
fn dump_signal_on_a_small_thread() {
    let (w, mut r) = pipe();
    // SAFETY: `w` is our pipe's write end, handed over (kept open by the dump signal).
    let w = unsafe { std::os::fd::OwnedFd::from_raw_fd(w) };
    selftrace::threads::install_dump_signal_to(libc::SIGQUIT, w).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let small = std::thread::Builder::new()
        .name("small".into())
        .stack_size(32 * 1024)
        .spawn(move || {
            CASE_TID.store(selftrace::threads::current_tid(), Ordering::SeqCst);
            let _ = rx.recv();
        })
        .unwrap();
    while CASE_TID.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    let tid = CASE_TID.load(Ordering::SeqCst);
    // SAFETY: tgkill to a thread of ours, which waits for `tx`.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGQUIT) };
    assert_eq!(sent, 0);
    let end = "---[ end of all threads ]---";
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&text).contains(end) {
        let n = r.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&text));
        text.extend_from_slice(&buf[..n]);
    }
    // The stack-request handler on the same small stack (another thread asks for it).
    let mut frames = [0usize; 64];
    let asked = selftrace::threads::capture(tid, &mut frames, std::time::Duration::from_secs(10));
    drop(tx);
    small.join().unwrap();
    let walk = asked.expect("the small thread's stack, asked for by another thread");
    assert!(walk.frames >= 2, "{walk:?}");
    let text = String::from_utf8_lossy(&text);
    println!("{text}");
    let header = format!("thread \"small\" tid {tid}");
    let section = text
        .split("\n\n")
        .find(|s| s.starts_with(&header))
        .unwrap_or_else(|| panic!("no section for the small thread:\n{text}"));
    // The signal may land before the thread reaches `recv` (it publishes its tid first), so
    // its own code is the closure (`{{closure}}` or `{closure#0}`), in `recv` or not yet.
    assert!(
        section.contains("<signal handler called>")
            && section.contains("dump_signal_on_a_small_thread::{"),
        "the small thread's stack, from the handler to its own code:\n{text}"
    );
    println!("case dump_signal_small_thread: ok");
}

/// The painted alternate stack of the crash case: low end, size.
static CRASH_STACK: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];

/// The handler the crash handler chains to after its report: measures the alternate stack
/// (the crash handler's frames are still on it) and says how much was used.
extern "C" fn after_crash_report(_: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let (low, size) = (
        CRASH_STACK[0].load(Ordering::SeqCst),
        CRASH_STACK[1].load(Ordering::SeqCst),
    );
    let used = altstack::used(low, size);
    let mut buf = [0u8; 128];
    let mut w = selftrace::symbolize::FixedBuf::new(&mut buf);
    w.push_str("\ncase crash_handler: used ");
    w.push_dec(used as u64);
    w.push_str(" of ");
    w.push_dec(size as u64);
    w.push_str(" bytes\n");
    // SAFETY: our buffer to stdout.
    unsafe { libc::write(1, w.as_bytes().as_ptr().cast(), w.as_bytes().len()) };
}

/// A crash (with a report of every thread) on a thread whose alternate stack is `size` bytes:
/// the crash handler writes its report and chains to `after_crash_report`.
fn crash_on_a_small_alternate_stack(size: usize) {
    // SAFETY: a plain SA_ONSTACK handler for SIGSEGV, installed before the crash handler,
    // which chains to it.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = after_crash_report as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut()), 0);
    }
    selftrace::crash::builder()
        .symbolizer(false)
        .all_threads(true)
        .install()
        .unwrap();
    // After install, which gives this thread a larger one.
    let low = altstack::install_painted(size);
    CRASH_STACK[0].store(low, Ordering::SeqCst);
    CRASH_STACK[1].store(size, Ordering::SeqCst);
    // SAFETY: not safe at all: the crash under test.
    unsafe { std::ptr::null_mut::<u8>().write_volatile(1) };
}

/// Runs one case in a child process; its stdout, or why it failed.
fn run_case(name: &str, size: usize) -> Result<String, String> {
    let mut cmd = child_support::test_child();
    cmd.env("DUMP_STACK_CASE", name)
        .env("DUMP_STACK_SIZE", size.to_string());
    let done = child_support::run_test_child(&mut cmd, child_support::deadline(120), name);
    if done.status.success() && done.stdout.contains(&format!("case {name}:")) {
        return Ok(done.stdout);
    }
    Err(format!(
        "case {name} on an alternate stack of {size} bytes: {:?}\n{}\n{}",
        done.status, done.stdout, done.stderr
    ))
}

/// The alternate stack each entry point is documented to run on: the signal frame plus its
/// budget.
fn documented_size(name: &str) -> usize {
    if let Ok(s) = std::env::var("SELFTRACE_TEST_ALT_STACK") {
        return s.parse().unwrap();
    }
    let _ = name;
    altstack::signal_frame_size() + selftrace::SIGNAL_STACK_BUDGET
}

#[test]
fn every_async_signal_safe_entry_point_runs_on_an_alternate_stack_of_its_documented_size() {
    let mut failed = Vec::new();
    for &(name, _, _) in CASES {
        match run_case(name, documented_size(name)) {
            Ok(out) => {
                let used = out
                    .lines()
                    .find(|l| l.starts_with(&format!("case {name}:")));
                eprintln!("{}", used.unwrap_or(name));
            }
            Err(e) => {
                eprintln!("{}", e.lines().next().unwrap_or(name));
                failed.push(e);
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
fn the_crash_handler_reports_on_an_alternate_stack_of_its_documented_size() {
    use std::os::unix::process::ExitStatusExt;
    let size = documented_size("crash_handler");
    let mut cmd = child_support::test_child();
    cmd.env("DUMP_STACK_CASE", "crash_handler")
        .env("DUMP_STACK_SIZE", size.to_string());
    let done = child_support::run_test_child(&mut cmd, child_support::deadline(120), "crash");
    let used = done
        .stdout
        .lines()
        .find(|l| l.starts_with("case crash_handler: used"));
    assert!(
        done.status.signal() == Some(libc::SIGSEGV)
            && used.is_some()
            && done
                .stderr
                .contains("------------[ selftrace: fatal signal ]------------")
            && done.stderr.contains("Other threads:")
            && done.stderr.contains("---[ end of report ]---"),
        "{:?}\n{}\n{}",
        done.status,
        done.stdout,
        done.stderr
    );
    eprintln!("{}", used.unwrap_or_default());
}

#[test]
fn the_dump_signal_works_on_a_thread_with_a_32_kib_stack() {
    let out = run_case("dump_signal_small_thread", 0).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("case dump_signal_small_thread: ok"), "{out}");
}
