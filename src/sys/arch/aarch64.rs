//! aarch64.
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
    // SAFETY: the caller provides an exclusive, aligned stack; x20 (callee-saved, so `f` keeps
    // it) holds our stack pointer across the call; all caller-saved registers (x30 too) are
    // clobbered.
    unsafe {
        core::arch::asm!(
            "mov x20, sp",
            "mov sp, {top}",
            "blr {f}",
            "mov sp, x20",
            top = in(reg) top,
            f = in(reg) f,
            in("x0") arg,
            out("x20") _,
            clobber_abi("C"),
        );
    }
}

/// The thread pointer (`TPIDR_EL0`). glibc uses TLS variant I here: the thread control block
/// sits at the thread pointer and the thread's `struct pthread` just below it.
#[inline]
pub(crate) fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the EL0 thread pointer register; no memory, no side effects.
    unsafe {
        core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags))
    };
    tp
}
