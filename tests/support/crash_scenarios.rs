//! Crash scenarios, shared by `examples/crash.rs` and `tests/crash.rs` (which runs each one in
//! a child process). Each scenario names its crashing function `crash_*` and calls it from a
//! function named `caller_*`, so a report can be checked for both.

#[path = "clib.rs"]
mod clib;
#[path = "target.rs"]
pub(crate) mod target;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};

/// Every scenario by name.
pub const ALL: &[&str] = &[
    "null",
    "overflow",
    "overflow-thread",
    "abort",
    "illegal",
    "divide",
    "in-allocator",
    "dlopen",
    "two-threads",
    "during-dlopen",
    "chained",
    "panic",
    "crash-in-handler",
    "inlined",
];

/// A global allocator with its own lock that crashes, lock held, when asked to.
pub struct LockingAllocator;

static ALLOC_LOCK: AtomicBool = AtomicBool::new(false);
/// Set to make the next allocation crash inside the allocator.
pub static CRASH_IN_ALLOC: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards to the system allocator under a spin lock.
unsafe impl std::alloc::GlobalAlloc for LockingAllocator {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        while ALLOC_LOCK
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        if CRASH_IN_ALLOC.swap(false, Ordering::Relaxed) {
            crash_in_allocator();
        }
        // SAFETY: same contract as the caller's.
        let p = unsafe { std::alloc::System.alloc(l) };
        ALLOC_LOCK.store(false, Ordering::Release);
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        while ALLOC_LOCK
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(p, l) };
        ALLOC_LOCK.store(false, Ordering::Release);
    }
}

#[inline(never)]
fn crash_in_allocator() {
    // SAFETY: deliberately invalid: the scenario is a fault inside the allocator.
    unsafe { std::ptr::write_volatile(black_box(8usize) as *mut u64, 1) };
}

#[inline(never)]
pub fn crash_null() {
    // SAFETY: deliberately invalid.
    let v = unsafe { std::ptr::read_volatile(black_box(0usize) as *const u64) };
    black_box(v);
}

#[inline(never)]
pub fn caller_null() {
    crash_null();
    black_box(());
}

#[inline(never)]
#[allow(unconditional_recursion)]
pub fn crash_recurse(n: u64) -> u64 {
    let pad = black_box([n; 8]);
    crash_recurse(n + 1) + pad[3]
}

#[inline(never)]
pub fn caller_overflow() {
    black_box(crash_recurse(0));
}

#[inline(never)]
pub fn crash_abort() {
    std::process::abort();
}

#[inline(never)]
pub fn caller_abort() {
    crash_abort();
    black_box(());
}

#[inline(never)]
pub fn crash_illegal() {
    // SAFETY: ud2 (udf on aarch64) raises SIGILL on purpose.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("ud2")
    };
    // SAFETY: as above.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("udf #0")
    };
}

#[inline(never)]
pub fn caller_illegal() {
    crash_illegal();
    black_box(());
}

#[inline(never)]
pub fn crash_divide() {
    let zero = black_box(0u64);
    // SAFETY: dividing by zero in asm raises SIGFPE (Rust's `/` would panic instead).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!(
            "xor edx, edx",
            "div {z}",
            z = in(reg) zero,
            inout("rax") 7u64 => _,
            out("rdx") _,
        )
    };
    // aarch64's udiv gives 0 for a zero divisor, it does not trap: the kernel's SIGFPE is
    // raised the way a runtime that checks the divisor raises it.
    #[cfg(target_arch = "aarch64")]
    {
        if zero == 0 {
            // SAFETY: raise has no preconditions.
            unsafe { libc::raise(libc::SIGFPE) };
        }
    }
}

#[inline(never)]
pub fn caller_divide() {
    crash_divide();
    black_box(());
}

#[inline(never)]
pub fn crash_panic() {
    panic!("boom {}", black_box(42));
}

#[inline(never)]
pub fn caller_panic() {
    crash_panic();
    black_box(());
}

#[inline(never)]
pub fn caller_in_allocator() {
    CRASH_IN_ALLOC.store(true, Ordering::Relaxed);
    black_box(Box::new(42u64));
}

/// A C library with an exported function that dereferences null.
pub const CRASH_LIB_C: &str = r#"
__attribute__((noinline)) int crash_in_c(volatile int *p) { return *p + 1; }
__attribute__((noinline)) int caller_in_c(void) { int r = crash_in_c(0); __asm__ volatile(""); return r; }
"#;

/// Builds the C library into `dir`; returns its path.
pub fn build_crash_lib(dir: &std::path::Path) -> std::path::PathBuf {
    let name = format!("libselftrace_crash_{}.so", std::process::id());
    clib::build_shared(dir, &name, CRASH_LIB_C, &["-O1", "-g"])
}

fn dlopen(path: &std::path::Path) -> *mut libc::c_void {
    clib::dlopen(path, libc::RTLD_NOW)
}

#[inline(never)]
pub fn caller_dlopen(dir: &std::path::Path) {
    let lib = build_crash_lib(dir);
    let h = dlopen(&lib);
    selftrace::refresh();
    // SAFETY: the symbol has this C signature.
    let f: extern "C" fn() -> i32 =
        unsafe { std::mem::transmute(libc::dlsym(h, c"caller_in_c".as_ptr())) };
    black_box(f());
}

#[inline(never)]
pub fn caller_two_threads() {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let b = barrier.clone();
    let t = std::thread::Builder::new()
        .name("crasher-2".into())
        .spawn(move || {
            b.wait();
            caller_null();
        })
        .unwrap();
    barrier.wait();
    caller_null();
    let _ = t.join();
}

#[inline(never)]
pub fn caller_during_dlopen(dir: &std::path::Path) {
    let lib = build_crash_lib(dir);
    let started = std::sync::Arc::new(AtomicBool::new(false));
    let s = started.clone();
    std::thread::spawn(move || loop {
        let h = dlopen(&lib);
        s.store(true, Ordering::Relaxed);
        // SAFETY: h is a handle from dlopen.
        unsafe { libc::dlclose(h) };
    });
    while !started.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    caller_null();
}

extern "C" fn user_handler(_sig: i32) {
    let msg = b"user handler called\n";
    // SAFETY: write(2) of a static buffer.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

extern "C" fn crashing_user_handler(_sig: i32) {
    let msg = b"crashing user handler\n";
    // SAFETY: write(2) of a static buffer, then a deliberate fault inside the handler.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        std::ptr::write_volatile(black_box(16usize) as *mut u64, 1);
    }
}

/// Installs a SIGSEGV handler that itself crashes (called by selftrace's, chained).
pub fn install_crashing_user_handler() {
    // SAFETY: installs a plain handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = crashing_user_handler as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
    }
}

extern "C" fn usr1_handler(_: i32) {
    let msg = b"usr1 handler ran\n";
    // SAFETY: write(2) of a static buffer to stderr; async-signal-safe.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// A crash with another signal pending and unblocked at the moment the kernel delivers it: both
/// SIGUSR1 (a handler that prints a line) and SIGSEGV are sent while blocked, then unblocked
/// with one call. The kernel delivers SIGSEGV first (synchronous signals go first) and then,
/// unless the crash handler's own mask blocks it, SIGUSR1, whose handler would run nested on
/// top, before the crash handler's first instruction (on a small alternate stack, the case
/// that can kill the process without a report).
#[inline(never)]
pub fn caller_signal_pending_at_crash() {
    // SAFETY: installs a handler, then blocks, sends and unblocks signals of this thread;
    // every struct passed is valid.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = usr1_handler as *const () as usize;
        sa.sa_flags = libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::sigaddset(&mut set, libc::SIGSEGV);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let (pid, tid) = (libc::getpid(), libc::gettid());
        libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR1);
        libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGSEGV);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Installs a plain SIGSEGV handler of the "user" before selftrace's.
pub fn install_user_handler() {
    // SAFETY: installs a plain handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = user_handler as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
    }
}

/// The address of the handler [`install_user_handler`] installs.
#[allow(dead_code)] // tests/crash.rs only, not the crash example
pub fn user_handler_addr() -> usize {
    user_handler as *const () as usize
}

/// Runs scenario `name` (after `selftrace::crash::install()`), with scratch files in `dir`.
pub fn run(name: &str, dir: &std::path::Path) {
    match name {
        "null" | "chained" | "crash-in-handler" => caller_null(),
        "panic" => caller_panic(),
        "overflow" => caller_overflow(),
        "overflow-thread" => {
            let t = std::thread::Builder::new()
                .name("deep".into())
                .spawn(caller_overflow)
                .unwrap();
            let _ = t.join();
        }
        "abort" => caller_abort(),
        "illegal" => caller_illegal(),
        "divide" => caller_divide(),
        "in-allocator" => caller_in_allocator(),
        "dlopen" => caller_dlopen(dir),
        "two-threads" => caller_two_threads(),
        "pending-at-crash" => caller_signal_pending_at_crash(),
        "during-dlopen" => caller_during_dlopen(dir),
        "inlined" => caller_inlined(),
        other => panic!("unknown scenario {other}"),
    }
}

/// The fault inside `inlined_leaf`, inlined into `inlined_mid`, inlined into `crash_inlined`
/// (`#[inline(always)]`: inlined in debug builds too). Just before the fault, the crate's own
/// `Backtrace` of the same call site prints its functions innermost first, on one line:
/// `inlined-backtrace: f | g | h`.
#[inline(always)]
fn inlined_leaf(p: usize) -> u64 {
    let bt = selftrace::Backtrace::capture();
    if let Some(f) = bt.frames().iter().find(|f| {
        f.symbols().iter().any(|s| {
            s.name
                .as_deref()
                .is_some_and(|n| n.ends_with("crash_inlined"))
        })
    }) {
        let names: Vec<&str> = f
            .symbols()
            .iter()
            .map(|s| s.name.as_deref().unwrap_or("??"))
            .collect();
        eprintln!("inlined-backtrace: {}", names.join(" | "));
    }
    // SAFETY: deliberately invalid.
    unsafe { std::ptr::read_volatile(black_box(p) as *const u64) }
}

#[inline(always)]
fn inlined_mid(p: usize) -> u64 {
    inlined_leaf(p).wrapping_add(1)
}

#[inline(never)]
pub fn crash_inlined() {
    black_box(inlined_mid(black_box(0)));
}

#[inline(never)]
pub fn caller_inlined() {
    crash_inlined();
    black_box(());
}
