//! Stack room for the async-signal-safe entry points: how much stack is left below the stack
//! pointer (on the thread's stack, an alternate signal stack or one of ours), and a small pool
//! of private stacks that the large parts of a report (symbolizing, formatting, demangling,
//! listing threads) run on, so that they fit in a caller's small alternate signal stack.
//!
//! # Async-signal safety
//! Everything here but [`fill`] is async-signal-safe: atomics, a compare-and-swap per claim,
//! and at most one `sigaltstack(NULL, &old)` per [`room`].
#![allow(unsafe_code)]

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Bytes of stack that each async-signal-safe entry point takes at most below the kernel's
/// signal frame: 4 KiB in an optimized build, 12 KiB in a debug build (see the crate docs'
/// stack budget). An alternate signal stack of `getauxval(AT_MINSIGSTKSZ)` plus this many
/// bytes is enough for any of them.
pub const SIGNAL_STACK_BUDGET: usize = if cfg!(debug_assertions) {
    12 * 1024
} else {
    4 * 1024
};

/// How many private stacks there are (reports and demangling running at the same time; a
/// caller that finds them all busy checks its own room instead).
const POOL: usize = 4;
/// Bytes of each private stack: a whole report in a debug build, or rustc-demangle at its
/// recursion limit (146 KiB measured in a debug build for a 1 KiB v0 name).
pub(crate) const PRIVATE_STACK: usize = 512 * 1024;
/// Frames a claimed stack holds for its claimer (captured on the caller's stack, before the
/// switch: a walk does not cross from a private stack back to the caller's).
pub(crate) const FRAMES: usize = 256;

struct Private {
    /// 0 while free, else the process id of the holder: a stack held when the process forked
    /// is held by a thread the child does not have, and the child takes it back.
    busy: AtomicI32,
    /// High end of the stack (0 while not mapped).
    top: AtomicUsize,
    frames: UnsafeCell<[usize; FRAMES]>,
}

// SAFETY: `frames` is only touched by the holder of `busy` (claimed with a CAS; in a forked
// child, the parent's holder does not exist).
unsafe impl Sync for Private {}

static STACKS: [Private; POOL] = [const {
    Private {
        busy: AtomicI32::new(0),
        top: AtomicUsize::new(0),
        frames: UnsafeCell::new([0; FRAMES]),
    }
}; POOL];

/// Whether stacks can be switched here (an architecture without a port runs everything on the
/// caller's stack).
const SWITCHES: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// Maps the private stacks that are not mapped yet. Normal context (`init()`).
pub(crate) fn fill() {
    if !SWITCHES {
        return;
    }
    let pid = super::getpid();
    for s in &STACKS {
        if s.top.load(Ordering::Acquire) != 0 {
            continue;
        }
        if s.busy
            .compare_exchange(0, pid, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            if s.top.load(Ordering::Relaxed) == 0 {
                if let Ok(top) = super::map_stack(PRIVATE_STACK) {
                    s.top.store(top, Ordering::Release);
                }
            }
            s.busy.store(0, Ordering::Release);
        }
    }
}

/// The current stack pointer, give or take this function's frame.
#[inline(always)]
fn stack_pointer() -> usize {
    let here = 0u8;
    core::ptr::addr_of!(here) as usize
}

/// Bytes of stack left below the caller's stack pointer: on the thread's own stack, on one of
/// the private stacks, or on the alternate signal stack it runs on. `None` where that is not
/// known (a stack selftrace did not learn the bounds of, such as the crash report's own).
///
/// # Async-signal safety
/// Async-signal-safe: loads, and `sigaltstack(NULL, &old)` when the stack pointer is on
/// neither the thread's stack nor a private one.
#[inline(never)]
pub(crate) fn room() -> Option<usize> {
    let sp = stack_pointer();
    if let Some((low, _)) = super::own_stack_above(sp) {
        return Some(sp - low);
    }
    for s in &STACKS {
        let top = s.top.load(Ordering::Acquire);
        let low = top.wrapping_sub(PRIVATE_STACK);
        if top != 0 && low <= sp && sp < top {
            return Some(sp - low);
        }
    }
    // SAFETY: all-zero is a valid stack_t; sigaltstack only writes the current one into it.
    let mut ss: libc::stack_t = unsafe { core::mem::zeroed() };
    // SAFETY: a null new stack only queries.
    if unsafe { libc::sigaltstack(core::ptr::null(), &mut ss) } != 0 {
        return None;
    }
    let low = ss.ss_sp as usize;
    let on = ss.ss_flags & libc::SS_ONSTACK != 0;
    (on && low <= sp && sp < low.saturating_add(ss.ss_size)).then(|| sp - low)
}

/// A private stack claimed for one report; given back on drop.
pub(crate) struct Claimed {
    i: usize,
}

/// Claims a free private stack (`None` when all are busy, or before `init()` mapped them). A
/// stack that a thread of the parent process held when this one forked is free here.
///
/// # Async-signal safety
/// Async-signal-safe: `getpid`, a compare-and-swap per stack.
pub(crate) fn claim() -> Option<Claimed> {
    if !SWITCHES {
        return None;
    }
    let pid = super::getpid();
    let sp = stack_pointer();
    STACKS.iter().enumerate().find_map(|(i, s)| {
        let top = s.top.load(Ordering::Acquire);
        // Not the stack this code already runs on (a report nested in a signal handler that
        // interrupted a report would otherwise switch onto its own frames).
        if top == 0 || (top - PRIVATE_STACK <= sp && sp < top) {
            return None;
        }
        // Free (0), or held by a thread of the process this one was forked from.
        let holder = s.busy.load(Ordering::Relaxed);
        if holder == pid {
            return None;
        }
        s.busy
            .compare_exchange(holder, pid, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            // Built only for a won claim: a dropped `Claimed` gives its stack back.
            .then(|| Claimed { i })
    })
}

impl Claimed {
    /// The stack's frame buffer, and the way onto the stack.
    pub(crate) fn parts(&mut self) -> (&mut [usize; FRAMES], OnStack<'_>) {
        let s = &STACKS[self.i];
        // SAFETY: we hold `busy`, so the buffer is ours until drop; `&mut self` keeps it
        // borrowed once.
        let frames = unsafe { &mut *s.frames.get() };
        let top = s.top.load(Ordering::Acquire);
        (
            frames,
            OnStack {
                top,
                _claim: core::marker::PhantomData,
            },
        )
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        STACKS[self.i].busy.store(0, Ordering::Release);
    }
}

/// The way onto a claimed private stack.
pub(crate) struct OnStack<'c> {
    top: usize,
    _claim: core::marker::PhantomData<&'c mut Claimed>,
}

impl OnStack<'_> {
    /// Runs `f` on the private stack and comes back. `f` must not panic (the entry points'
    /// rule): a panic cannot unwind across the switch, and aborts.
    pub(crate) fn run(self, f: &mut dyn FnMut()) {
        extern "C" fn trampoline(arg: *mut libc::c_void) {
            // SAFETY: `run` passes a pointer to its live `&mut dyn FnMut()` and waits for us.
            let f = unsafe { &mut *(arg as *mut &mut dyn FnMut()) };
            f();
        }
        let mut f = f;
        // SAFETY: `top` is the 16-byte aligned high end of a mapped private stack that we hold
        // (the claim outlives `self`); `trampoline` does not unwind (an `extern "C"` function
        // aborts on a panic instead).
        unsafe {
            super::call_on_stack(
                self.top,
                trampoline,
                (&mut f as *mut &mut dyn FnMut()).cast(),
            )
        };
    }
}

/// Runs `f` where at least `need` bytes of stack are left: here, or on a claimed private
/// stack. Returns `false`, without running it, when the room here is known to be too small and
/// no private stack is free. Where the room is not known (a stack whose bounds selftrace did
/// not learn) and no private stack is free, `f` runs here.
///
/// # Async-signal safety
/// Async-signal-safe when `f` is.
pub(crate) fn with_room(need: usize, f: &mut dyn FnMut()) -> bool {
    let room = room();
    if room.is_some_and(|r| r >= need) {
        f();
        return true;
    }
    if let Some(mut c) = claim() {
        let (_, on) = c.parts();
        on.run(f);
        return true;
    }
    if room.is_none() {
        f();
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The function a [`without_private_stacks`] handler runs, and its fd.
    static CASE: AtomicUsize = AtomicUsize::new(0);
    static CASE_FD: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(-1);

    extern "C" fn on_case_signal(_: i32) {
        let f = CASE.load(Ordering::SeqCst);
        if f != 0 {
            // SAFETY: `without_private_stacks` stores a `fn(i32)` there.
            let f: fn(i32) = unsafe { core::mem::transmute::<usize, fn(i32)>(f) };
            f(CASE_FD.load(Ordering::SeqCst));
        }
    }

    /// Runs `f` in a signal handler on a 48 KiB alternate stack (std's threads are larger than
    /// the room a report wants: glibc's minimum on aarch64 is 128 KiB) of a new thread, while
    /// every private stack is claimed; returns what it wrote to the pipe it is given.
    fn without_private_stacks(f: fn(i32)) -> String {
        // One test at a time takes them all (two taking half each would wait for each other),
        // and the signal's action is the process's.
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        crate::setup::init().unwrap();
        let mut held = Vec::new();
        while held.len() < POOL {
            match claim() {
                Some(c) => held.push(c),
                None => std::thread::yield_now(),
            }
        }
        let mut fds = [0i32; 2];
        // SAFETY: pipe writes two fds.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [r, w] = fds;
        CASE.store(f as usize, Ordering::SeqCst);
        CASE_FD.store(w, Ordering::SeqCst);
        std::thread::spawn(|| {
            const SIZE: usize = 48 * 1024;
            let top = super::super::map_stack(SIZE).unwrap();
            // SAFETY: a fresh stack of ours (not unmapped: 52 KiB of a test); the handler is a
            // plain function; SIGURG is raised on this thread only, and its action restored.
            unsafe {
                let ss = libc::stack_t {
                    ss_sp: (top - SIZE) as *mut libc::c_void,
                    ss_flags: 0,
                    ss_size: SIZE,
                };
                assert_eq!(libc::sigaltstack(&ss, core::ptr::null_mut()), 0);
                let mut sa: libc::sigaction = core::mem::zeroed();
                sa.sa_sigaction = on_case_signal as *const () as usize;
                sa.sa_flags = libc::SA_ONSTACK;
                libc::sigemptyset(&mut sa.sa_mask);
                let mut old: libc::sigaction = core::mem::zeroed();
                assert_eq!(libc::sigaction(libc::SIGURG, &sa, &mut old), 0);
                let tid = libc::syscall(libc::SYS_gettid);
                libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGURG);
                assert_eq!(
                    libc::sigaction(libc::SIGURG, &old, core::ptr::null_mut()),
                    0
                );
                let off = libc::stack_t {
                    ss_sp: core::ptr::null_mut(),
                    ss_flags: libc::SS_DISABLE,
                    ss_size: 0,
                };
                assert_eq!(libc::sigaltstack(&off, core::ptr::null_mut()), 0);
            }
        })
        .join()
        .unwrap();
        CASE.store(0, Ordering::SeqCst);
        drop(held);
        // SAFETY: our write end, closed so that reading sees EOF.
        unsafe { libc::close(w) };
        use std::io::Read;
        use std::os::fd::FromRawFd;
        let mut text = String::new();
        // SAFETY: our read end, owned by the File from here.
        let mut file = unsafe { std::fs::File::from_raw_fd(r) };
        file.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn room_is_what_is_left_of_the_thread_stack() {
        crate::setup::init().unwrap();
        let small = std::thread::Builder::new()
            .stack_size(48 * 1024)
            .spawn(room)
            .unwrap()
            .join()
            .unwrap();
        // glibc gives a thread at least PTHREAD_STACK_MIN (128 KiB on aarch64).
        let size = (48 * 1024).max(libc::PTHREAD_STACK_MIN);
        assert!(small.is_some_and(|r| r < size), "{small:?}");
        let room = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(room)
            .unwrap()
            .join()
            .unwrap();
        let room = room.expect("a std thread's stack bounds are known");
        assert!(room > 128 * 1024 && room < 256 * 1024, "{room}");
        // On the alternate stack: what is left of it.
        let text = without_private_stacks(|fd| {
            let room = super::room().unwrap_or(usize::MAX);
            let ok: &[u8] = if room < 48 * 1024 { b"ok" } else { b"no" };
            // SAFETY: our buffer to our pipe.
            unsafe { libc::write(fd, ok.as_ptr().cast(), ok.len()) };
        });
        assert_eq!(text, "ok");
    }

    #[test]
    fn dump_stack_without_room_writes_raw_addresses_and_says_so() {
        let text = without_private_stacks(|fd| {
            // SAFETY: the pipe's write end, open during the call.
            crate::crash::dump_stack_to(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        });
        assert!(
            text.contains("Call Trace (raw addresses, not symbolized: ")
                && text.contains(" bytes of stack left):\n #0 0x")
                && text.ends_with("---[ end of dump_stack ]---\n"),
            "{text}"
        );
    }

    #[cfg(feature = "threads")]
    #[test]
    fn dump_all_without_room_says_it_lists_nothing() {
        let text = without_private_stacks(|fd| {
            // SAFETY: the pipe's write end, open during the call.
            let out = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let summary = crate::threads::dump_all(out);
            let none: &[u8] = if summary.threads == 0 {
                b""
            } else {
                b"listed threads!"
            };
            // SAFETY: our buffer to our pipe.
            unsafe { libc::write(fd, none.as_ptr().cast(), none.len()) };
        });
        assert!(
            text.contains("\nnot listed: ")
                && text.ends_with(" bytes of stack left, and no private stack free\n---[ end of all threads ]---\n"),
            "{text}"
        );
    }

    #[test]
    fn a_child_takes_back_the_stacks_its_parent_held_at_the_fork() {
        crate::setup::init().unwrap();
        let held = loop {
            // Another test may hold them all for a moment.
            match claim() {
                Some(c) => break c,
                None => std::thread::yield_now(),
            }
        };
        // SAFETY: the child only claims (atomics, getpid) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut all = [None, None, None, None];
            let mut n = 0;
            for slot in all.iter_mut() {
                *slot = claim();
                n += slot.is_some() as i32;
            }
            // SAFETY: leaving the child without running the parent's exit handlers.
            unsafe { libc::_exit(n) };
        }
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        drop(held);
        assert!(libc::WIFEXITED(status), "{status:#x}");
        // Every stack was free there: the one held here, and any another test held.
        assert_eq!(libc::WEXITSTATUS(status), POOL as i32);
    }

    #[test]
    fn demangling_without_room_keeps_the_mangled_name() {
        let text = without_private_stacks(|fd| {
            let name = b"_RNvCs1234_7mycrate4main";
            let mut buf = [0u8; 256];
            let out = crate::symbolize::demangle_into(name, &mut buf);
            // SAFETY: our buffer to our pipe.
            unsafe { libc::write(fd, out.as_ptr().cast(), out.len()) };
        });
        assert_eq!(text, "_RNvCs1234_7mycrate4main");
    }
}
