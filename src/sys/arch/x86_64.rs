//! x86-64.
#![allow(unsafe_code)]

/// Calls `f(arg)` with the stack pointer switched to `top` (the high end of a stack the caller
/// owns), and switches back when it returns.
///
/// # Safety
/// `top` must be the 16-byte aligned high end of a writable stack, exclusively owned by this
/// call and large enough for `f`; `f` must not unwind.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn call_on_stack(
    top: usize,
    f: extern "C" fn(*mut libc::c_void),
    arg: *mut libc::c_void,
) {
    // SAFETY: the caller provides an exclusive, aligned stack; r12 (callee-saved, so `f` keeps
    // it) holds our stack pointer across the call; all caller-saved registers are clobbered.
    unsafe {
        core::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {f}",
            "mov rsp, r12",
            top = in(reg) top,
            f = in(reg) f,
            in("rdi") arg,
            out("r12") _,
            clobber_abi("C"),
        );
    }
}

/// The thread pointer (`%fs` base), which glibc points at the thread's `struct pthread` (TLS
/// variant II: the thread control block is the start of `struct pthread`).
#[inline]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: on x86-64 Linux, %fs:0 holds the thread pointer itself (the TCB's `tcb` field,
    // required by the x86-64 TLS ABI); the load has no side effects.
    unsafe {
        core::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    tp
}
