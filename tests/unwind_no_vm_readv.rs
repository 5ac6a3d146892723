//! Walks stay complete where `process_vm_readv(2)` is not available: under qemu-user it returns
//! ENOSYS, and container seccomp profiles can forbid it. Every read of the unwinder off the
//! walking thread's own stack is then a copy through a pipe (`write(2)` of the range, which the
//! kernel reads, then `read(2)` back).
//!
//! A child process (this test binary again) captures the same stack twice from a signal
//! handler that runs on an alternate signal stack (so the walk reads the handler's frames off
//! the thread's stack: kernel copies), once as it is and once after a seccomp filter made
//! `process_vm_readv` fail with ENOSYS; both walks must be complete and equal, name the
//! functions that were on the stack, and the second must have copied memory. A walk from
//! registers that point at unmapped memory still ends without a fault.

#[path = "child_support/mod.rs"]
mod child_support;
#[path = "support/target.rs"]
mod target;

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const CHILD_ENV: &str = "SELFTRACE_NO_VM_READV_CHILD";
const N: usize = 128;

struct Frames(std::cell::UnsafeCell<[usize; N]>);
// SAFETY: written only by the signal handler of the one thread that raises the signal, and
// read by that thread after the handler returned.
unsafe impl Sync for Frames {}
static FRAMES: Frames = Frames(std::cell::UnsafeCell::new([0; N]));
static COUNT: AtomicUsize = AtomicUsize::new(0);
static COMPLETE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_usr1(_: i32) {
    // SAFETY: see `Frames`.
    let buf = unsafe { &mut *FRAMES.0.get() };
    let w = selftrace::Capture::new().walk(buf);
    COUNT.store(w.frames, Ordering::SeqCst);
    COMPLETE.store(w.is_complete() as usize, Ordering::SeqCst);
}

#[inline(never)]
fn nvr_inner() {
    // SAFETY: raise has no preconditions; the handler is installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    black_box(());
}

#[inline(never)]
fn nvr_outer() {
    nvr_inner();
    black_box(());
}

/// Captures through the handler; returns the frames' names and whether the walk was complete.
fn capture_names() -> (Vec<String>, bool) {
    nvr_outer();
    let n = COUNT.load(Ordering::SeqCst);
    // SAFETY: the handler has returned; nothing writes the frames now.
    let frames = unsafe { (&*FRAMES.0.get())[..n].to_vec() };
    let names = frames
        .iter()
        .enumerate()
        .map(|(i, &pc)| {
            let kind = selftrace::symbolize::frame_kind(&frames, i, false);
            selftrace::symbolize(kind.lookup_address(pc))
                .and_then(|s| {
                    s.name_string()
                        .map(|n| format!("{:#}", rustc_demangle::demangle(&n)))
                })
                .unwrap_or_else(|| format!("{pc:#x}"))
        })
        .collect();
    (names, COMPLETE.load(Ordering::SeqCst) == 1)
}

/// `process_vm_readv` of one word of this process: Ok, or the errno.
fn vm_readv_works() -> Result<(), i32> {
    let src = 0x5eed_u64;
    let mut dst = 0u64;
    let local = libc::iovec {
        iov_base: (&mut dst as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: (&src as *const u64).cast_mut().cast(),
        iov_len: 8,
    };
    // SAFETY: both iovecs describe 8 valid bytes of this process.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == 8 && dst == src {
        Ok(())
    } else {
        // SAFETY: errno is thread-local.
        Err(unsafe { *libc::__errno_location() })
    }
}

/// A seccomp filter that fails `process_vm_readv` with ENOSYS and allows everything else.
fn forbid_vm_readv() -> Result<(), String> {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    let f = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let prog = [
        // seccomp_data.arch
        f(LD_W_ABS, 0, 0, 4),
        f(JEQ_K, 0, 3, AUDIT_ARCH),
        // seccomp_data.nr
        f(LD_W_ABS, 0, 0, 0),
        f(JEQ_K, 0, 1, libc::SYS_process_vm_readv as u32),
        f(RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32),
        f(RET_K, 0, 0, RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: prctl with a valid filter program that outlives the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err("PR_SET_NO_NEW_PRIVS failed".into());
        }
        if libc::prctl(libc::PR_SET_SECCOMP, 2, &fprog as *const libc::sock_fprog) != 0 {
            return Err(format!(
                "PR_SET_SECCOMP failed: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

fn child() {
    selftrace::init().expect("init");
    // The handler runs on an alternate stack: the walk reads its frames off the thread's own
    // stack, through the kernel.
    let alt = vec![0u8; 256 << 10].leak();
    // SAFETY: a valid stack_t for a leaked buffer, and a plain handler for SIGUSR1.
    unsafe {
        let ss = libc::stack_t {
            ss_sp: alt.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: alt.len(),
        };
        assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let native = vm_readv_works();
    let (before, complete_before) = capture_names();
    if native.is_ok() {
        forbid_vm_readv().expect("seccomp filter");
        assert_eq!(
            vm_readv_works(),
            Err(libc::ENOSYS),
            "the filter makes process_vm_readv fail"
        );
        println!("filter installed");
    } else {
        println!("process_vm_readv already fails here: {native:?}");
    }
    let copies = selftrace::unwind::stats().copies;
    let (after, complete_after) = capture_names();
    let copied = selftrace::unwind::stats().copies - copies;
    println!("before: {before:?}");
    println!("after: {after:?}");
    println!("copies during the walk: {copied}");
    assert!(complete_before && complete_after, "complete walks");
    assert_eq!(
        before, after,
        "the same stack, with and without process_vm_readv"
    );
    let at = |name: &str| {
        after
            .iter()
            .position(|n| n.ends_with(name))
            .unwrap_or_else(|| panic!("{name} not in {after:#?}"))
    };
    assert!(at("on_usr1") < at("nvr_inner") && at("nvr_inner") < at("nvr_outer"));
    assert!(at("nvr_outer") < at("capture_names"));
    assert!(copied > 0, "the walk read memory through the kernel");
    // Registers that point at unmapped memory: a short walk, no fault.
    let mut buf = [0usize; 16];
    let r = selftrace::Regs::new(nvr_inner as *const () as usize, 0x1000, 0x2000);
    let w = selftrace::Capture::new()
        .mode(selftrace::UnwindMode::Dwarf)
        .walk_regs(r, &mut buf);
    assert!(w.frames <= 2, "{w:?}");
    println!("child ok");
}

#[test]
fn walks_are_complete_without_process_vm_readv() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let child = std::process::Command::new(exe)
        .args([
            "--exact",
            "walks_are_complete_without_process_vm_readv",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let (status, out, err) =
        child_support::wait_with_deadline(child, Duration::from_secs(120), "the child");
    println!("{out}\n{err}");
    assert!(status.success(), "child failed:\n{out}\n{err}");
    assert!(out.contains("child ok"), "{out}\n{err}");
}
