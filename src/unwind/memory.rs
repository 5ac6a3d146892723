//! Checked memory reads for the walkers: a read either returns the word or fails, it never
//! faults (see [`CheckedMemory`]).
#![allow(unsafe_code)]

use crate::sys;
use core::cell::Cell;
use core::ops::Range;

thread_local! {
    /// This thread's stack `[low, high)`, or `(0, 0)` while unknown. Const-initialised and
    /// without destructor: reading it neither allocates nor can fail.
    static THREAD_STACK: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// The current thread's cached stack bounds, if known.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn thread_stack() -> Option<Range<usize>> {
    let (lo, hi) = THREAD_STACK.try_with(Cell::get).unwrap_or((0, 0));
    (hi > lo).then_some(lo..hi)
}

/// Learns the current thread's stack bounds. Normal context only (glibc allocates inside
/// `pthread_getattr_np`).
pub(crate) fn learn_thread_stack() {
    if thread_stack().is_none() {
        if let Some(bounds) = sys::current_thread_stack() {
            let _ = THREAD_STACK.try_with(|c| c.set(bounds));
        }
    }
}

/// A reader of stack memory that never faults, also when another thread unmaps the memory
/// in the middle of the walk.
///
/// * Reads from the current thread's own stack, from the walk's stack pointer up to the
///   stack's high end, are direct loads: that memory is mapped for as long as the thread runs.
///   The bounds come from a per-thread cache (threads that called selftrace in normal context)
///   or, for any glibc thread, from its `struct pthread` (see [`sys::own_stack_above`]).
/// * Everything else (another stack, an alternate signal stack, garbage) is never loaded
///   directly: a window around the address is copied with one `process_vm_readv(2)`, which
///   fails instead of faulting, and later reads are served from the copy.
pub(crate) struct CheckedMemory<'w> {
    stack: Range<usize>,
    /// The walk started from registers that came from this thread (its own stack, or a
    /// `ucontext_t` the kernel saved), so a signal frame it reaches was written by the kernel.
    /// False for registers nobody vouches for: then the signal frames it reaches are data
    /// like any other, and the stack pointer in one is no reason to read the stack directly.
    trusted: bool,
    window: &'w mut [usize],
    window_base: usize,
    window_len: usize,
    /// Windows copied (system calls), for tests and statistics.
    pub(crate) copies: u32,
}

impl<'w> CheckedMemory<'w> {
    /// A reader for a walk starting at `sp`, copying through `window` (its size sets how much
    /// one system call copies).
    pub(crate) fn new(sp: usize, window: &'w mut [usize]) -> CheckedMemory<'w> {
        let mut m = CheckedMemory {
            stack: 0..0,
            trusted: true,
            window,
            window_base: 0,
            window_len: 0,
            copies: 0,
        };
        m.enter_stack(sp);
        m
    }

    /// A reader for a walk from a register state nobody vouches for: no memory is read
    /// directly, also after the walk crossed a signal frame (a forged one can point anywhere,
    /// e.g. at the middle of a caller's array on this thread's stack: a direct read from there
    /// reads what no check looked at, which AddressSanitizer reported); every read is a copy.
    pub(crate) fn untrusted(window: &'w mut [usize]) -> CheckedMemory<'w> {
        CheckedMemory {
            stack: 0..0,
            trusted: false,
            window,
            window_base: 0,
            window_len: 0,
            copies: 0,
        }
    }

    /// The walk moved to `sp` (across a signal frame): in a trusted walk, if no own-stack
    /// range is known yet and `sp` lies on this thread's stack, reads from there up become
    /// direct. In an untrusted walk nothing changes (see [`untrusted`](Self::untrusted)).
    pub(crate) fn enter_stack(&mut self, sp: usize) {
        if !self.trusted || self.stack.contains(&sp) {
            return;
        }
        // glibc's own record first (no thread-local access), then what selftrace learned.
        if let Some((_, high)) = sys::own_stack_above(sp) {
            self.stack = sp..high;
            return;
        }
        if let Some(stack) = thread_stack() {
            if stack.contains(&sp) {
                self.stack = sp..stack.end;
            }
        }
    }

    /// The part of this thread's own stack read directly.
    #[inline]
    pub(crate) fn stack(&self) -> Range<usize> {
        self.stack.clone()
    }

    #[inline]
    fn on_stack(&self, addr: usize, len: usize) -> bool {
        self.stack.start <= addr && addr.checked_add(len).is_some_and(|e| e <= self.stack.end)
    }

    /// Serves `out` from the window, copying a new window around `addr` when needed.
    fn read_via_window(&mut self, addr: usize, out: &mut [u8]) -> bool {
        let Some(end) = addr.checked_add(out.len()) else {
            return false;
        };
        let in_window = |m: &Self| m.window_base <= addr && end <= m.window_base + m.window_len;
        if !in_window(self) {
            let bytes = core::mem::size_of_val(self.window);
            if out.len() > bytes || addr == 0 {
                return false;
            }
            // Start a little below the address (CFI reads go both ways from the CFA) but on
            // the same page, which is readable if the address is.
            let page = addr & !(sys::page_size() - 1);
            let start = (addr.saturating_sub(bytes / 4) & !7).max(page);
            // SAFETY: the window is `bytes` writable bytes of usize storage.
            let buf = unsafe {
                core::slice::from_raw_parts_mut(self.window.as_mut_ptr().cast::<u8>(), bytes)
            };
            self.copies += 1;
            super::stats::bump(&super::stats::COPIES);
            self.window_base = start;
            self.window_len = sys::read_memory(start, buf);
            if !in_window(self) {
                return false;
            }
        }
        let off = addr - self.window_base;
        // SAFETY: [off, off + out.len()) lies in the copied part of the window.
        let src = unsafe { self.window.as_ptr().cast::<u8>().add(off) };
        // SAFETY: src is valid for out.len() bytes (above) and does not overlap `out`.
        unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Reads the aligned machine word at `addr`, or fails.
    #[inline]
    pub(crate) fn read_word(&mut self, addr: usize) -> Option<usize> {
        const W: usize = core::mem::size_of::<usize>();
        if !addr.is_multiple_of(W) {
            return None;
        }
        if self.on_stack(addr, W) {
            // SAFETY: the word is aligned and lies on this thread's own live stack, between the
            // walk's stack pointer and the stack's high end.
            return Some(unsafe { core::ptr::read_volatile(addr as *const usize) });
        }
        let mut b = [0u8; W];
        self.read_via_window(addr, &mut b)
            .then(|| usize::from_ne_bytes(b))
    }

    /// Reads a 1-, 2-, 4- or 8-byte value at any alignment (for DWARF expressions), or fails.
    pub(crate) fn read_sized(&mut self, addr: usize, size: usize) -> Option<usize> {
        if !matches!(size, 1 | 2 | 4 | 8) {
            return None;
        }
        let mut b = [0u8; 8];
        if self.on_stack(addr, size) {
            // SAFETY: [addr, addr + size) lies on this thread's own live stack.
            unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, b.as_mut_ptr(), size) };
        } else if !self.read_via_window(addr, &mut b[..size]) {
            return None;
        }
        Some(usize::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_stack_and_rejects_unmapped_and_guard_pages() {
        let word: usize = 0x1234_5678;
        let mut window = [0usize; 32];
        let here = &word as *const usize as usize;
        let mut m = CheckedMemory::new(here, &mut window);
        assert_eq!(m.read_word(here), Some(0x1234_5678));
        assert_eq!(m.read_word(0), None);
        assert_eq!(m.read_word(8), None);
        assert_eq!(m.read_word(usize::MAX & !7), None);
        assert_eq!(m.read_word(here + 1), None, "unaligned");
        assert_eq!(m.read_sized(here, 4), Some(0x1234_5678));
        // A PROT_NONE page, as a guard page is.
        let ps = sys::page_size();
        // SAFETY: anonymous private mapping of two pages, unmapped below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                2 * ps,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        // SAFETY: p is a fresh writable mapping of two pages.
        unsafe {
            *((p + ps) as *mut usize) = 77;
            libc::mprotect(p as *mut libc::c_void, ps, libc::PROT_NONE);
        }
        assert_eq!(m.read_word(p), None);
        assert_eq!(m.read_word(p + ps), Some(77), "copied through the window");
        // SAFETY: p is the mapping created above.
        unsafe { libc::munmap(p as *mut libc::c_void, 2 * ps) };
        // The window still holds the old copy of p + ps: a read from the copy is harmless;
        // a read of a page not in the window fails.
        assert_eq!(m.read_word(p + 8), None);
    }
}
