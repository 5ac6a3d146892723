//! Stack capture: known call chains, signal handlers, allocation-freedom, garbage input.

use crate::counting;
use crate::oracle;
use crate::spinner;

use oracle::{leaf, Oracle};
use selftrace::{capture, Regs, UnwindMode};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

fn oracle() -> &'static Oracle {
    static O: OnceLock<Oracle> = OnceLock::new();
    O.get_or_init(|| {
        selftrace::init().expect("init");
        Oracle::load()
    })
}

// ---- a known chain of 24 functions ------------------------------------------------------------

macro_rules! chain {
    ($name:ident -> $next:ident $(-> $rest:ident)*) => {
        #[inline(never)]
        fn $name(f: &mut dyn FnMut()) {
            $next(f);
            std::hint::black_box(());
        }
        chain!($next $(-> $rest)*);
    };
    ($last:ident) => {
        #[inline(never)]
        fn $last(f: &mut dyn FnMut()) {
            f();
            std::hint::black_box(());
        }
    };
}

chain!(chain_00 -> chain_01 -> chain_02 -> chain_03 -> chain_04 -> chain_05 -> chain_06 -> chain_07
    -> chain_08 -> chain_09 -> chain_10 -> chain_11 -> chain_12 -> chain_13 -> chain_14 -> chain_15
    -> chain_16 -> chain_17 -> chain_18 -> chain_19 -> chain_20 -> chain_21 -> chain_22 -> chain_23);

const CHAIN_LEN: usize = 24;

/// Asserts that `names` holds chain_23, chain_22, ..., chain_00 consecutively; returns the
/// index after chain_00.
fn assert_chain(names: &[String]) -> usize {
    let at = names
        .iter()
        .position(|n| leaf(n) == "chain_23")
        .unwrap_or_else(|| panic!("chain_23 missing from {names:#?}"));
    for k in 0..CHAIN_LEN {
        let want = format!("chain_{:02}", CHAIN_LEN - 1 - k);
        assert_eq!(
            names.get(at + k).map(|n| leaf(n)),
            Some(want.as_str()),
            "frame {} in {names:#?}",
            at + k
        );
    }
    at + CHAIN_LEN
}

#[inline(never)]
fn capture_here(mode: UnwindMode) -> Vec<usize> {
    let mut buf = [0usize; 256];
    let n = selftrace::Capture::new().mode(mode).walk(&mut buf).frames;
    buf[..n].to_vec()
}

#[test]
// Its own frame in a release build too (not inlined into the harness's closure): the walk is
// checked for it.
#[inline(never)]
fn dwarf_capture_sees_the_whole_chain_in_order() {
    let o = oracle();
    let mut frames = Vec::new();
    chain_00(&mut || frames = capture_here(UnwindMode::Dwarf));
    let names = o.names(&frames, false);
    // Frame 0 is the caller of capture().
    assert_eq!(leaf(&names[0]), "capture_here", "{names:#?}");
    assert!(leaf(&names[1]).contains("closure"), "{names:#?}");
    let after = assert_chain(&names);
    assert_eq!(
        leaf(&names[after]),
        "dwarf_capture_sees_the_whole_chain_in_order",
        "{names:#?}"
    );
    // And on through std's test harness (no frame pointers) to the thread's root.
    assert!(names.len() > after + 3, "{names:#?}");
}

#[test]
// Its own frame in a release build too: the walk is checked for it.
#[inline(never)]
fn capture_and_capture_fp_put_the_caller_first() {
    let o = oracle();
    let mut buf = [0usize; 64];
    let n = capture(&mut buf);
    assert!(n > 2);
    assert_eq!(
        leaf(o.name(buf[0] - 1).unwrap()),
        "capture_and_capture_fp_put_the_caller_first"
    );
    let n = selftrace::Capture::new()
        .mode(selftrace::UnwindMode::FramePointer)
        .walk(&mut buf)
        .frames;
    assert!(n >= 1);
    assert_eq!(
        leaf(o.name(buf[0] - 1).unwrap()),
        "capture_and_capture_fp_put_the_caller_first"
    );
}

#[test]
fn buffer_bounds_the_walk() {
    oracle();
    let mut frames = Vec::new();
    chain_00(&mut || {
        let mut small = [0usize; 5];
        let n = capture(&mut small);
        assert_eq!(n, 5);
        let mut none: [usize; 0] = [];
        assert_eq!(capture(&mut none), 0);
        frames = small.to_vec();
    });
    assert!(frames.iter().all(|&f| f != 0));
}

#[test]
fn frame_pointer_mode_in_a_frame_pointer_build() {
    // Build the fp_chain example with frame pointers everywhere we compile, in a target
    // directory of its own (other RUSTFLAGS), for this test's architecture, and run it. On
    // aarch64 rustc keeps a frame record in every function that calls (the target's
    // frame-pointer is non-leaf), and every frame of fp_chain's chain calls on: there the
    // fixtures' own build is one.
    let bin = if cfg!(target_arch = "aarch64") {
        crate::example_build::build(crate::example_build::FIXTURES, &["--example", "fp_chain"])
    } else {
        crate::example_build::build_with(
            "fp-build",
            &["--example", "fp_chain"],
            &[("RUSTFLAGS", "-C force-frame-pointers=yes".as_ref())],
        )
    }
    .join("debug")
    .join("examples")
    .join("fp_chain");
    let out = std::process::Command::new(bin)
        .output()
        .expect("run fp_chain");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fp_chain failed:\n{stdout}\n{stderr}");
    let names: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("frame "))
        .map(|l| l.split_whitespace().nth(2).unwrap_or("?").to_string())
        .collect();
    assert_eq!(leaf(&names[0]), "fp_capture", "{stdout}");
    let after = assert_chain(&names);
    assert_eq!(leaf(&names[after]), "main", "{stdout}");
}

// ---- signal handlers ------------------------------------------------------------------------

static HANDLER_DONE: AtomicBool = AtomicBool::new(false);
static UC_N: AtomicUsize = AtomicUsize::new(0);
static CAP_N: AtomicUsize = AtomicUsize::new(0);
static FP_N: AtomicUsize = AtomicUsize::new(0);
static HANDLER_ALLOCS: AtomicUsize = AtomicUsize::new(usize::MAX);
static mut UC_BUF: [usize; 256] = [0; 256];
static mut CAP_BUF: [usize; 256] = [0; 256];
static mut FP_BUF: [usize; 256] = [0; 256];

#[inline(never)]
extern "C" fn on_signal(_sig: i32, _info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let token = counting::start();
    // SAFETY: the handler runs once at a time (the test sends one signal and waits).
    unsafe {
        let uc_buf = &mut *core::ptr::addr_of_mut!(UC_BUF);
        UC_N.store(
            selftrace::Capture::new()
                .walk_ucontext(uc.cast(), uc_buf)
                .frames,
            Ordering::SeqCst,
        );
        let cap_buf = &mut *core::ptr::addr_of_mut!(CAP_BUF);
        CAP_N.store(capture(cap_buf), Ordering::SeqCst);
        let fp_buf = &mut *core::ptr::addr_of_mut!(FP_BUF);
        FP_N.store(
            selftrace::Capture::new()
                .mode(selftrace::UnwindMode::FramePointer)
                .walk(fp_buf)
                .frames,
            Ordering::SeqCst,
        );
    }
    HANDLER_ALLOCS.store(counting::stop(token), Ordering::SeqCst);
    spinner::STOP.store(true, Ordering::SeqCst);
    HANDLER_DONE.store(true, Ordering::SeqCst);
}

#[test]
fn in_a_signal_handler_frames_are_exact_complete_and_allocation_free() {
    let o = oracle();
    // SAFETY: installs a SA_SIGINFO handler for SIGUSR1 on the alternate stack.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    // A thread that never called init() or captured before: its stack bounds are unknown. Its
    // alternate stack is the size the entry points are documented to need (the signal frame
    // plus SIGNAL_STACK_BUDGET; std's own, 8 KiB, is too small for a debug build's capture).
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        crate::altstack::install_painted(
            crate::altstack::signal_frame_size() + selftrace::SIGNAL_STACK_BUDGET,
        );
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        chain_00(&mut spinner::spin_until_stopped);
    });
    let thread = rx.recv().unwrap();
    while !spinner::SPINNING.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    // SAFETY: the thread is alive (it spins until the handler sets STOP).
    assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
    t.join().unwrap();
    assert!(HANDLER_DONE.load(Ordering::SeqCst));
    assert_eq!(
        HANDLER_ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations in the handler"
    );

    // SAFETY: the handler has finished writing the buffers.
    let (uc, cap, fp) = unsafe {
        (
            (&*core::ptr::addr_of!(UC_BUF))[..UC_N.load(Ordering::SeqCst)].to_vec(),
            (&*core::ptr::addr_of!(CAP_BUF))[..CAP_N.load(Ordering::SeqCst)].to_vec(),
            (&*core::ptr::addr_of!(FP_BUF))[..FP_N.load(Ordering::SeqCst)].to_vec(),
        )
    };
    // Capture::walk_ucontext: frame 0 is the interrupted pc, exact.
    let names = o.names(&uc, true);
    assert_eq!(leaf(&names[0]), "spin_until_stopped", "{names:#?}");
    assert_chain(&names);

    // capture() inside the handler: the handler, the trampoline, then the interrupted frames.
    let names = o.names(&cap, false);
    assert_eq!(leaf(&names[0]), "on_signal", "{names:#?}");
    let at = cap
        .iter()
        .position(|&a| a == uc[0])
        .unwrap_or_else(|| panic!("interrupted pc {:#x} not in capture(): {names:#?}", uc[0]));
    assert!(
        at >= 2,
        "trampoline frame expected before the interrupted pc"
    );
    assert_eq!(
        &cap[at..],
        &uc[..],
        "the interrupted frames, as Capture::walk_ucontext saw them"
    );
    let exact: Vec<String> = o.names(&cap[at..], true);
    assert_eq!(leaf(&exact[0]), "spin_until_stopped");
    assert_chain(&exact);
    // A frame-pointer capture in the handler: at least the handler itself (std has no frame pointers).
    assert!(!fp.is_empty());
    assert_eq!(leaf(&o.names(&fp, false)[0]), "on_signal");
}

#[test]
fn capture_in_normal_context_allocates_nothing_once_warm() {
    oracle();
    selftrace::set_auto_refresh(true);
    let mut buf = [0usize; 128];
    capture(&mut buf); // learns this thread's stack bounds
    let (total, allocs) = counting::counting(|| {
        (0..100)
            .map(|_| {
                capture(&mut buf)
                    + selftrace::Capture::new()
                        .mode(selftrace::UnwindMode::FramePointer)
                        .walk(&mut buf)
                        .frames
            })
            .sum::<usize>()
    });
    assert!(total > 0);
    assert_eq!(allocs, 0);
}

// ---- garbage in, no crash -------------------------------------------------------------------

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_registers_and_stacks_never_crash_and_always_terminate() {
    oracle();
    let code: Vec<usize> = vec![
        chain_00 as *const () as usize,
        chain_12 as *const () as usize,
        spinner::spin_until_stopped as *const () as usize,
        libc::getpid as *const () as usize,
        libc::malloc as *const () as usize,
        libc::qsort as *const () as usize,
        capture_here as *const () as usize,
    ];
    let mut rng = XorShift(0x5eed_1234_abcd_0001);
    let mut stack = vec![0usize; 2048];
    let mut buf = [0usize; 300];
    let base = stack.as_ptr() as usize;
    let mut total_frames = 0usize;
    for iter in 0..6000 {
        for w in stack.iter_mut() {
            *w = match rng.next() % 6 {
                0 => rng.next() as usize,
                1 => base + (rng.next() as usize % (2048 * 8)),
                2 => (base + (rng.next() as usize % (2048 * 8))) & !7,
                3 => code[rng.next() as usize % code.len()] + (rng.next() as usize % 512),
                4 => 0,
                _ => rng.next() as usize & 0x0000_7fff_ffff_fff8,
            };
        }
        let pick = |rng: &mut XorShift| -> usize {
            match rng.next() % 4 {
                0 => rng.next() as usize,
                1 => base + (rng.next() as usize % (2048 * 8)),
                2 => (base + (rng.next() as usize % (2048 * 8))) & !7,
                _ => 0,
            }
        };
        let pc = if iter % 3 == 0 {
            rng.next() as usize
        } else {
            code[rng.next() as usize % code.len()] + (rng.next() as usize % 4096)
        };
        let regs = Regs::new(pc, pick(&mut rng), pick(&mut rng));
        let mode = if iter % 2 == 0 {
            UnwindMode::Dwarf
        } else {
            UnwindMode::FramePointer
        };
        let n = selftrace::Capture::new()
            .mode(mode)
            .walk_regs(regs, &mut buf)
            .frames;
        assert!(n <= buf.len());
        assert!(n >= 1);
        assert_eq!(buf[0], pc);
        total_frames += n;
    }
    // A frame-pointer cycle: A -> B -> A, on an otherwise zeroed stack.
    stack.iter_mut().for_each(|w| *w = 0);
    let a = base + 64 * 8;
    let b = base + 32 * 8;
    stack[64] = b;
    stack[65] = chain_00 as *const () as usize + 8;
    stack[32] = a;
    stack[33] = chain_01 as *const () as usize + 8;
    for mode in [UnwindMode::FramePointer, UnwindMode::Dwarf] {
        let n = selftrace::Capture::new()
            .mode(mode)
            .walk_regs(
                Regs::new(chain_02 as *const () as usize + 4, base, a),
                &mut buf,
            )
            .frames;
        assert!(n <= 4, "a cycle must end the walk, got {n} frames");
    }
    assert!(total_frames >= 6000);
    std::hint::black_box(&stack);
}

#[test]
fn walk_ends_display_as_the_reports_print_them() {
    use selftrace::unwind::{StopReason, Truncation, WalkEnd};
    assert_eq!(WalkEnd::Complete.to_string(), "complete");
    assert_eq!(WalkEnd::BufferFull.to_string(), "buffer full");
    let t = Truncation {
        pc: 0x1234,
        reason: StopReason::NoUnwindRule,
    };
    assert_eq!(
        WalkEnd::Truncated(t).to_string(),
        "truncated: no unwind rule at 0x1234"
    );
    #[cfg(feature = "profile")]
    assert_eq!(selftrace::profile::Mode::Wall.to_string(), "wall");
}
