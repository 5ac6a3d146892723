//! Capture before `selftrace::init()`: frame pointers and `_dl_find_object`, no allocation.
//! This test binary never calls `init()`.

#[path = "support/counting.rs"]
mod counting;
#[path = "support/oracle.rs"]
#[allow(dead_code)]
mod oracle;

use selftrace::capture;
use std::sync::atomic::{AtomicUsize, Ordering};

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
static HANDLER_FRAME0: AtomicUsize = AtomicUsize::new(0);
static HANDLER_ALLOCS: AtomicUsize = AtomicUsize::new(usize::MAX);

extern "C" fn on_signal(_: i32, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let ((), calls) = counting::counting(|| {
        let mut buf = [0usize; 64];
        // SAFETY: uc is the kernel's ucontext for this signal.
        let n = unsafe {
            selftrace::Capture::new()
                .walk_ucontext(uc.cast(), &mut buf)
                .frames
        };
        let m = capture(&mut buf[n.min(32)..]);
        IN_HANDLER.store(n + m, Ordering::SeqCst);
        HANDLER_FRAME0.store(buf[0], Ordering::SeqCst);
    });
    HANDLER_ALLOCS.store(calls, Ordering::SeqCst);
}

#[inline(never)]
fn caller_of_capture() -> (usize, usize) {
    let mut buf = [0usize; 64];
    let n = capture(&mut buf);
    (n, buf[0])
}

#[test]
fn capture_before_init_works_and_never_allocates() {
    let ((n, frame0), allocs) = counting::counting(caller_of_capture);
    assert!(n >= 1);
    assert_eq!(allocs, 0, "capture before init allocated");

    // SAFETY: installs a SA_SIGINFO handler for SIGUSR2, then raises it on this thread.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        libc::raise(libc::SIGUSR2);
    }
    assert!(IN_HANDLER.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        HANDLER_ALLOCS.load(Ordering::SeqCst),
        0,
        "capture in a handler allocated"
    );
    assert_ne!(HANDLER_FRAME0.load(Ordering::SeqCst), 0);

    // Still no init: the oracle only reads the symbol table.
    let o = oracle::Oracle::load();
    assert_eq!(
        o.name(frame0 - 1).map(oracle::leaf),
        Some("caller_of_capture")
    );
}
