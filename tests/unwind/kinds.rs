//! Which frames a walk reports exact (`Walk::frame_kinds`): frame 0 of a walk from registers or
//! a `ucontext_t`, and the frame right after each signal frame the walk crossed, checked against
//! an independent oracle (the code before each frame: `is_signal_trampoline`). The handlers use
//! signals of their own (`SIGRTMIN + 20`, `+ 21`), raised on the test's thread, one test at a
//! time.

use selftrace::symbolize::{self, is_signal_trampoline, FrameKind};
use selftrace::{Capture, UnwindMode, Walk};
use std::sync::Mutex;

/// One test at a time: the handlers write into the statics below.
static ONE: Mutex<()> = Mutex::new(());

const N: usize = 256;

/// One walk a handler made, by how it was made.
#[derive(Clone, Copy)]
struct Taken {
    walk: Option<Walk>,
    frames: [usize; N],
}

const EMPTY: Taken = Taken {
    walk: None,
    frames: [0; N],
};

/// [current stack DWARF, current stack frame pointers, the ucontext (DWARF)].
static mut OUTER: [Taken; 3] = [EMPTY; 3];
static mut INNER: [Taken; 3] = [EMPTY; 3];

fn outer_sig() -> i32 {
    libc::SIGRTMIN() + 20
}

fn inner_sig() -> i32 {
    libc::SIGRTMIN() + 21
}

/// The three walks into `at`, in the handler (async-signal-safe: no allocation).
///
/// # Safety
/// Only one handler writes `at` at a time; `uc` is the handler's third argument.
#[inline(never)]
unsafe fn take(at: *mut [Taken; 3], uc: *mut libc::c_void) {
    // SAFETY: the caller's exclusivity; every walk is async-signal-safe.
    unsafe {
        let t = &mut *at;
        let w = Capture::new().walk(&mut t[0].frames);
        t[0].walk = Some(w);
        let w = Capture::new()
            .mode(UnwindMode::FramePointer)
            .walk(&mut t[1].frames);
        t[1].walk = Some(w);
        let w = Capture::new().walk_ucontext(uc.cast(), &mut t[2].frames);
        t[2].walk = Some(w);
    }
}

extern "C" fn on_inner(_sig: i32, _info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: the tests raise one signal at a time, under ONE.
    unsafe { take(core::ptr::addr_of_mut!(INNER), uc) };
}

extern "C" fn on_outer(_sig: i32, _info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: as above.
    unsafe { take(core::ptr::addr_of_mut!(OUTER), uc) };
    if NEST.load(std::sync::atomic::Ordering::SeqCst) {
        // SAFETY: raise is async-signal-safe; the inner handler is installed.
        unsafe { libc::raise(inner_sig()) };
    }
}

static NEST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn install(sig: i32, f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void), alt: bool) {
    // SAFETY: a SA_SIGINFO handler for a signal only these tests use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = f as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | if alt { libc::SA_ONSTACK } else { 0 };
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

/// The exact frames by reading code: frame 0 when `first_exact`, and each frame whose
/// predecessor is a signal trampoline.
fn oracle(frames: &[usize], first_exact: bool) -> Vec<u16> {
    let mut v: Vec<u16> = Vec::new();
    if first_exact && !frames.is_empty() {
        v.push(0);
    }
    for i in 1..frames.len() {
        if is_signal_trampoline(frames[i - 1]) {
            v.push(i as u16);
        }
    }
    v
}

/// Checks a frame-pointer walk: every frame it recorded exact follows a signal trampoline.
/// Not the converse: on aarch64 the kernel (and qemu-user) leaves a frame record in the signal
/// frame, and a frame-pointer chain that does not know the trampoline (a handler installed
/// after `init`) follows it through the signal frame to the interrupted code's link register,
/// a return address, skipping the interrupted pc. The walk's record says so (a return
/// address); reading the code before the frame would call it exact.
fn check_fp(what: &str, t: &Taken) {
    let walk = t
        .walk
        .unwrap_or_else(|| panic!("{what}: the handler did not run"));
    let frames = &t.frames[..walk.frames];
    let kinds = walk.frame_kinds();
    let oracle = oracle(frames, false);
    assert!(
        kinds.exact().iter().all(|e| oracle.contains(e)),
        "{what}: {kinds:?} against {oracle:?} in {frames:#x?}"
    );
    if cfg!(target_arch = "x86_64") {
        // No frame record in an x86-64 signal frame: the chain ends at the trampoline, and
        // the general step crosses it through the ucontext_t.
        assert_eq!(kinds.exact(), &oracle[..], "{what}: {frames:#x?}");
    }
}

/// Checks one walk against the oracle; returns the signal frames it crossed.
fn check(what: &str, t: &Taken, first_exact: bool) -> usize {
    let walk = t
        .walk
        .unwrap_or_else(|| panic!("{what}: the handler did not run"));
    let frames = &t.frames[..walk.frames];
    let kinds = walk.frame_kinds();
    assert!(!kinds.is_partial(), "{what}: {kinds:?}");
    assert_eq!(
        kinds.exact(),
        &oracle(frames, first_exact)[..],
        "{what}: the walk's exact frames against the code before them: {frames:#x?} ({:?})",
        walk.end
    );
    for i in 0..frames.len() {
        let want = symbolize::frame_kind(frames, i, first_exact);
        assert_eq!(walk.frame_kind(frames, i), want, "{what}: frame {i}");
        assert_eq!(kinds.kind(frames, i), want, "{what}: frame {i}");
    }
    assert_eq!(
        kinds.is_exact(0),
        first_exact && !frames.is_empty(),
        "{what}: frame 0"
    );
    kinds.exact().len() - usize::from(first_exact && !frames.is_empty())
}

fn reset() {
    // SAFETY: no handler runs now (signals are raised under ONE, synchronously).
    unsafe {
        OUTER = [EMPTY; 3];
        INNER = [EMPTY; 3];
    }
}

/// The walks the handlers took.
fn taken() -> ([Taken; 3], [Taken; 3]) {
    // SAFETY: the handlers have returned (raise returns after the handler ran).
    unsafe { (*core::ptr::addr_of!(OUTER), *core::ptr::addr_of!(INNER)) }
}

#[test]
fn a_walk_in_a_signal_handler_marks_the_interrupted_frame_exact() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    selftrace::init().expect("init");
    install(outer_sig(), on_outer, false);
    reset();
    NEST.store(false, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the handler is installed; raise runs it on this thread before returning.
    assert_eq!(unsafe { libc::raise(outer_sig()) }, 0);
    let (outer, _) = taken();
    assert_eq!(check("capture in a handler", &outer[0], false), 1);
    check_fp("frame-pointer capture in a handler", &outer[1]);
    assert_eq!(check("walk_ucontext in a handler", &outer[2], true), 0);
}

#[test]
fn a_walk_in_a_nested_handler_marks_both_interrupted_frames_exact() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    selftrace::init().expect("init");
    install(outer_sig(), on_outer, false);
    // The inner handler on an alternate stack: the walk also changes stacks. One of 64 KiB,
    // not std's 8 KiB: an unoptimized walk after the kernel's signal frame does not fit in
    // 8 KiB (the crate's stack budget holds for optimized builds).
    install(inner_sig(), on_inner, true);
    let mut alt = vec![0u8; 64 << 10];
    // SAFETY: `alt` outlives its use as this thread's alternate stack (restored below);
    // zeroed stack_t values are valid.
    let mut old: libc::stack_t = unsafe { std::mem::zeroed() };
    let new = libc::stack_t {
        ss_sp: alt.as_mut_ptr().cast(),
        ss_flags: 0,
        ss_size: alt.len(),
    };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sigaltstack(&new, &mut old) }, 0);
    reset();
    NEST.store(true, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: both handlers are installed; raise runs them on this thread before returning.
    assert_eq!(unsafe { libc::raise(outer_sig()) }, 0);
    NEST.store(false, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: `old` is what sigaltstack returned; no handler runs on `alt` now.
    assert_eq!(unsafe { libc::sigaltstack(&old, std::ptr::null_mut()) }, 0);
    drop(alt);
    let (outer, inner) = taken();
    assert_eq!(check("capture in the outer handler", &outer[0], false), 1);
    assert_eq!(check("capture in the inner handler", &inner[0], false), 2);
    check_fp("frame-pointer capture in the inner handler", &inner[1]);
    assert_eq!(
        check("walk_ucontext in the inner handler", &inner[2], true),
        1
    );
}

#[test]
fn a_walk_from_registers_has_frame_0_exact_and_a_plain_capture_none() {
    selftrace::init().expect("init");
    let mut frames = [0usize; 64];
    let walk = Capture::new().walk(&mut frames);
    assert!(walk.frames > 1);
    assert_eq!(walk.frame_kinds().exact(), &[] as &[u16]);
    assert_eq!(walk.frame_kind(&frames, 0), FrameKind::Return);
    // The same stack from registers: its frame 0 (exact), then return addresses.
    let regs = selftrace::Regs::new(frames[0], frames.as_ptr() as usize, 0);
    let walk = Capture::new().walk_regs(regs, &mut frames);
    assert!(walk.frames >= 1);
    assert_eq!(walk.frame_kinds().exact(), &[0u16]);
    assert_eq!(walk.frame_kind(&frames, 0), FrameKind::Exact);
    assert_eq!(walk.frame_kind(&frames, 1), FrameKind::Return);
}

#[test]
fn another_threads_capture_carries_the_kinds_of_its_walk() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static STOP: AtomicBool = AtomicBool::new(false);
    selftrace::init().expect("init");
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        tx.send(selftrace::threads::current_tid()).unwrap();
        while !STOP.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    });
    let tid = rx.recv().unwrap();
    let mut frames = [0usize; N];
    let walk = selftrace::threads::capture(tid, &mut frames, std::time::Duration::from_secs(5));
    STOP.store(true, Ordering::Relaxed);
    t.join().unwrap();
    let walk = walk.expect("capture");
    let frames = &frames[..walk.frames];
    // The thread's own walk from its handler's ucontext_t: frame 0 exact, no signal frame.
    assert_eq!(walk.frame_kinds().exact(), &oracle(frames, true)[..]);
    assert_eq!(walk.frame_kinds().exact(), &[0u16]);
    assert_eq!(walk.frame_kind(frames, 0), FrameKind::Exact);
}
