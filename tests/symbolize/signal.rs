//! Zero allocations: `symbolize`, the kernel-format writer, demangling and
//! `backtrace_symbols_fd` inside a real signal handler, under a counting global allocator.

use selftrace::symbolize::{
    self, frame_kind, write_kernel_frame, FrameKind, KernelOptions, SymbolsOptions,
};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use crate::counting;

static HANDLER_ALLOCS: AtomicUsize = AtomicUsize::new(usize::MAX);

static OUT_FD: AtomicI32 = AtomicI32::new(-1);
static FRAMES: AtomicUsize = AtomicUsize::new(0);
static NAMED: AtomicUsize = AtomicUsize::new(0);
static DEMANGLED_TEST_FN: AtomicUsize = AtomicUsize::new(0);
static EXACT_AFTER_TRAMPOLINE: AtomicUsize = AtomicUsize::new(0);
static BATCH_AGREES: AtomicUsize = AtomicUsize::new(0);
/// `Display` of the `Symbol` of `raise_here`'s frame, and of the walk's end, into a fixed
/// buffer: both as expected.
static DISPLAY_OK: AtomicUsize = AtomicUsize::new(0);

fn write_fd(fd: c_int, b: &[u8]) {
    // SAFETY: writing a valid buffer to a pipe we own.
    unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
}

extern "C" fn handler(_sig: c_int, _info: *mut libc::siginfo_t, uc: *mut c_void) {
    let token = counting::start();
    let fd = OUT_FD.load(Ordering::SeqCst);
    let mut frames = [0usize; 64];
    // SAFETY: uc is the ucontext_t the kernel passed to this SA_SIGINFO handler.
    let n = unsafe {
        selftrace::Capture::new()
            .walk_ucontext(uc.cast(), &mut frames)
            .frames
    };
    let frames = &frames[..n];
    FRAMES.store(n, Ordering::SeqCst);
    let mut line = [0u8; 512];
    let mut name = [0u8; 256];
    for (i, &a) in frames.iter().enumerate() {
        let kind = frame_kind(frames, i, true);
        if let Some(s) = selftrace::symbolize(kind.lookup_address(a)) {
            let mut is_raise_here = false;
            if let Some(d) = s.demangle_into(&mut name) {
                NAMED.fetch_add(1, Ordering::SeqCst);
                if d == "symbolize::signal::raise_here" {
                    DEMANGLED_TEST_FN.fetch_add(1, Ordering::SeqCst);
                    is_raise_here = true;
                }
            }
            if is_raise_here {
                use std::fmt::Write as _;
                let mut text = [0u8; 512];
                let mut w = symbolize::FixedBuf::new(&mut text);
                let _ = write!(w, "{s}");
                let shown = w.as_str();
                if shown.starts_with("symbolize::signal::raise_here+0x")
                    && shown.contains("/0x")
                    && shown.ends_with(']')
                    && shown.contains(" [symbolize-")
                {
                    DISPLAY_OK.fetch_add(1, Ordering::SeqCst);
                }
                write_fd(fd, b"display: ");
                write_fd(fd, shown.as_bytes());
                write_fd(fd, b"\n");
            }
        }
        let opts = KernelOptions {
            demangle: true,
            object_offset: true,
            build_id: true,
        };
        let len = write_kernel_frame(&mut line, a, kind, opts);
        write_fd(fd, &line[..len]);
        write_fd(fd, b"\n");
    }
    // The batched form agrees with the per-call one.
    let same = symbolize::with_symbolizer(|s| {
        frames
            .iter()
            .all(|&a| s.symbolize(a) == selftrace::symbolize(a))
    });
    if same {
        BATCH_AGREES.store(1, Ordering::SeqCst);
    }
    write_fd(fd, b"--\n");
    selftrace::backtrace_symbols_fd(frames, borrowed(fd));
    write_fd(fd, b"--\n");
    symbolize::backtrace_symbols_fd_with(
        frames,
        borrowed(fd),
        SymbolsOptions {
            demangle: true,
            exported_only: false,
        },
    );
    // Through the signal frame: the frame after the trampoline is an exact pc.
    let mut through = [0usize; 64];
    let m = selftrace::capture(&mut through);
    let through = &through[..m];
    for i in 1..through.len() {
        if symbolize::is_signal_trampoline(through[i - 1])
            && frame_kind(through, i, false) == FrameKind::Exact
        {
            EXACT_AFTER_TRAMPOLINE.fetch_add(1, Ordering::SeqCst);
        }
    }
    HANDLER_ALLOCS.store(counting::stop(token), Ordering::SeqCst);
}

#[inline(never)]
fn raise_here() {
    // SAFETY: sends SIGUSR1 to this thread; the handler is installed.
    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR1) };
    std::hint::black_box(());
}

#[test]
fn symbolize_and_backtrace_symbols_fd_do_not_allocate_in_a_signal_handler() {
    selftrace::symbolize::prepare().expect("prepare");
    let mut fds = [0 as c_int; 2];
    // SAFETY: fds is a writable array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    OUT_FD.store(fds[1], Ordering::SeqCst);
    // SAFETY: installing an SA_SIGINFO handler for SIGUSR1 with a zeroed, then filled, action.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    raise_here();
    // SAFETY: closing our own write end, then reading the pipe.
    unsafe { libc::close(fds[1]) };
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into a local buffer from our own read end.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: closing our own read end.
    unsafe { libc::close(fds[0]) };
    let text = String::from_utf8_lossy(&out);
    println!("{text}");
    assert_eq!(
        HANDLER_ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations in the handler"
    );
    assert!(FRAMES.load(Ordering::SeqCst) > 5);
    assert!(NAMED.load(Ordering::SeqCst) > 5);
    assert_eq!(DEMANGLED_TEST_FN.load(Ordering::SeqCst), 1);
    assert!(EXACT_AFTER_TRAMPOLINE.load(Ordering::SeqCst) >= 1);
    assert_eq!(BATCH_AGREES.load(Ordering::SeqCst), 1);
    assert_eq!(DISPLAY_OK.load(Ordering::SeqCst), 1, "{text}");
    let parts: Vec<&str> = text.split("--\n").collect();
    assert_eq!(parts.len(), 3, "{text}");
    // Kernel format, demangled, with object offset and build-id.
    assert!(
        parts[0]
            .lines()
            .any(|l| l.contains(" : symbolize::signal::raise_here+0x") && l.contains("/0x")),
        "{}",
        parts[0]
    );
    // glibc's _fd format (2.36: no space before '['), mangled, then demangled.
    let exe = std::env::args().next().unwrap();
    assert!(
        parts[1].lines().any(|l| l.starts_with(&format!("{exe}(_"))
            && l.contains("raise_here")
            && l.contains(")[0x")),
        "{}",
        parts[1]
    );
    assert!(
        parts[2]
            .lines()
            .any(|l| l.starts_with(&format!("{exe}(symbolize::signal::raise_here+0x"))),
        "{}",
        parts[2]
    );
}

/// A raw fd of this test's (or 1, stdout), borrowed for one call.
fn borrowed(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the tests pass fds they opened and close only after the call returned.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}
