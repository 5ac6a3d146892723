//! Architectures without a port of the unwinder: no stack switching, no thread pointer.
#![allow(unsafe_code)]

/// Calls `f(arg)` on the current stack: there is no stack switch without a port (the crash
/// report then runs on the signal's stack, as it does when the report stack is missing).
///
/// # Safety
/// As on the ported architectures (`top` is not used).
pub(crate) unsafe fn call_on_stack(
    _top: usize,
    f: extern "C" fn(*mut libc::c_void),
    arg: *mut libc::c_void,
) {
    f(arg)
}

/// Unknown: [`super::super::own_stack_above`] falls back to the main thread's learned bounds.
#[inline]
pub(crate) fn thread_pointer() -> usize {
    0
}
