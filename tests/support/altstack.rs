//! Runs a function inside a real signal handler on an alternate signal stack of a given size,
//! painted with a pattern beforehand, and measures how much of it the handler used (the
//! deepest byte that no longer holds the pattern). Below the stack lies a guard page: a handler
//! that needs more than the stack faults there, and the kernel, which cannot deliver that
//! SIGSEGV on the exhausted stack, kills the process (so run cases that may overflow in a child
//! process).
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

const PATTERN: u8 = 0xa5;
/// The signal the helper raises on the calling thread (held only while one case runs).
const SIGNAL: i32 = libc::SIGURG;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// The case the handler runs: a `fn(*const ucontext_t)` as an address.
static CASE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: i32, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let case = CASE.load(Ordering::SeqCst);
    if case != 0 {
        // SAFETY: `run` stores a `fn(*const libc::ucontext_t)` there.
        let f: fn(*const libc::ucontext_t) =
            unsafe { std::mem::transmute::<usize, fn(*const libc::ucontext_t)>(case) };
        f(uc as *const libc::ucontext_t);
    }
}

/// The size of the kernel's signal frame on this machine: `AT_MINSIGSTKSZ`, at least
/// `MINSIGSTKSZ` (the kernel or qemu-user may not say; aarch64's `MINSIGSTKSZ`, 5 KiB, covers its
/// frame without SVE).
pub fn signal_frame_size() -> usize {
    // SAFETY: getauxval has no preconditions.
    let aux = unsafe { libc::getauxval(libc::AT_MINSIGSTKSZ) } as usize;
    aux.max(libc::MINSIGSTKSZ)
}

/// Maps `size` bytes (rounded up to pages) read-write with a guard page below: the mapping's
/// base and length.
fn map_guarded(size: usize) -> (*mut libc::c_void, usize) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let mapped = size.div_ceil(page) * page + page;
    // SAFETY: a fresh private anonymous mapping; the caller unmaps it or keeps it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    // SAFETY: the lowest page of our mapping becomes the guard page.
    assert_eq!(unsafe { libc::mprotect(base, page, libc::PROT_NONE) }, 0);
    (base, mapped)
}

/// Runs `f` (given the handler's `ucontext_t`) in a handler on an alternate stack of `size`
/// bytes, and returns how many bytes of that stack were touched (the signal frame included).
pub fn run(size: usize, f: fn(*const libc::ucontext_t)) -> usize {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (base, mapped) = map_guarded(size);
    // The stack is the `size` bytes right below the mapping's end.
    let top = base as usize + mapped;
    let low = top - size;
    // SAFETY: [low, top) is mapped writable and ours.
    unsafe { std::ptr::write_bytes(low as *mut u8, PATTERN, size) };
    CASE.store(f as usize, Ordering::SeqCst);
    // SAFETY: all-zero is a valid stack_t and sigaction; the alternate stack is ours and stays
    // mapped until the previous one is back; the handler is a plain function.
    unsafe {
        let ss = libc::stack_t {
            ss_sp: low as *mut libc::c_void,
            ss_flags: 0,
            ss_size: size,
        };
        let mut old_ss: libc::stack_t = std::mem::zeroed();
        assert_eq!(libc::sigaltstack(&ss, &mut old_ss), 0);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old_sa: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(SIGNAL, &sa, &mut old_sa), 0);
        assert_eq!(
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                libc::syscall(libc::SYS_gettid),
                SIGNAL
            ),
            0
        );
        assert_eq!(libc::sigaction(SIGNAL, &old_sa, std::ptr::null_mut()), 0);
        assert_eq!(libc::sigaltstack(&old_ss, std::ptr::null_mut()), 0);
    }
    CASE.store(0, Ordering::SeqCst);
    // SAFETY: as above; nothing runs on the stack any more.
    let painted = unsafe { std::slice::from_raw_parts(low as *const u8, size) };
    let untouched = painted.iter().take_while(|&&b| b == PATTERN).count();
    // SAFETY: our mapping, no longer in use.
    unsafe { libc::munmap(base, mapped) };
    size - untouched
}

/// Maps a painted alternate stack of `size` bytes (a guard page below) and makes it the calling
/// thread's, for a handler that does not return (a crash); [`used`] measures it from inside a
/// later handler. Returns its low end. The mapping is never unmapped.
pub fn install_painted(size: usize) -> usize {
    let (base, mapped) = map_guarded(size);
    let low = base as usize + mapped - size;
    // SAFETY: [low, low + size) is mapped writable and ours; it stays mapped.
    unsafe {
        std::ptr::write_bytes(low as *mut u8, PATTERN, size);
        let ss = libc::stack_t {
            ss_sp: low as *mut libc::c_void,
            ss_flags: 0,
            ss_size: size,
        };
        assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
    }
    low
}

/// Bytes of the painted stack at `low` (of `size` bytes) touched so far. Async-signal-safe.
pub fn used(low: usize, size: usize) -> usize {
    // SAFETY: the caller's painted stack, still mapped.
    let painted = unsafe { std::slice::from_raw_parts(low as *const u8, size) };
    size - painted.iter().take_while(|&&b| b == PATTERN).count()
}
