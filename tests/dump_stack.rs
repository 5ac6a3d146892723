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
