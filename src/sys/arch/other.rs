//! Architectures without a port of the unwinder: no stack switching, no thread pointer.

/// Unknown: [`super::super::own_stack_above`] falls back to the main thread's learned bounds.
#[inline]
pub(crate) fn thread_pointer() -> usize {
    0
}
