//! Checked memory reads for the walkers: a read either returns the word or fails, it never
//! faults.
//!
//! A read is done directly when it falls in a range known to be readable: the current thread's
//! stack (cached per thread from `pthread_getattr_np`, learned in normal context) or a run of
//! pages validated earlier in the same walk. Anything else is first validated with one
//! `process_vm_readv(2)` on the own process that probes up to 16 consecutive pages, so a walk
//! over an unknown stack costs one system call per 64 KiB it touches.

use crate::sys;
use core::cell::Cell;
use core::ops::Range;

thread_local! {
    /// This thread's stack `[low, high)`, or `(0, 0)` while unknown. Const-initialised and
    /// without destructor: reading it neither allocates nor can fail.
    static THREAD_STACK: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// The current thread's cached stack bounds, if known. Async-signal-safe.
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

/// How many validated ranges one walk remembers.
const SLOTS: usize = 8;
/// How many pages one validation probes.
const PROBE_PAGES: usize = 16;

/// A reader of machine words that never faults.
pub(crate) struct CheckedMemory {
    /// The part of this thread's stack known readable (checked first: most reads land here).
    stack: Range<usize>,
    known: [Range<usize>; SLOTS],
    next: usize,
    /// Validations done (system calls), for tests and statistics.
    pub(crate) probes: u32,
}

impl CheckedMemory {
    /// A reader that trusts the part of the current thread's stack from `sp` up.
    pub(crate) fn new(sp: usize) -> CheckedMemory {
        let mut m = CheckedMemory {
            stack: 0..0,
            known: core::array::from_fn(|_| 0..0),
            next: 0,
            probes: 0,
        };
        if let Some(stack) = thread_stack() {
            if stack.contains(&sp) {
                m.stack = sp..stack.end;
            }
        }
        m
    }

    fn remember(&mut self, r: Range<usize>) {
        self.known[self.next % SLOTS] = r;
        self.next += 1;
    }

    #[inline]
    fn is_known(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        (self.stack.start <= addr && end <= self.stack.end)
            || self.known.iter().any(|r| r.start <= addr && end <= r.end)
    }

    /// Whether `len` bytes at `addr` can be read, validating with the kernel if needed.
    pub(crate) fn check(&mut self, addr: usize, len: usize) -> bool {
        if addr == 0 {
            return false;
        }
        if self.is_known(addr, len) {
            return true;
        }
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.probes += 1;
        let ok_until = sys::readable_until(addr, PROBE_PAGES);
        if ok_until <= addr {
            return false;
        }
        let page = addr & !(sys::page_size() - 1);
        self.remember(page..ok_until);
        end <= ok_until || self.check_tail(ok_until, end)
    }

    fn check_tail(&mut self, from: usize, end: usize) -> bool {
        self.probes += 1;
        let ok_until = sys::readable_until(from, PROBE_PAGES);
        if ok_until <= from {
            return false;
        }
        self.remember(from..ok_until);
        end <= ok_until
    }

    /// Reads the aligned machine word at `addr`, or fails.
    #[inline]
    pub(crate) fn read_word(&mut self, addr: usize) -> Option<usize> {
        const W: usize = core::mem::size_of::<usize>();
        if !addr.is_multiple_of(W) || !self.check(addr, W) {
            return None;
        }
        // SAFETY: the word is aligned and lies in a range validated as readable.
        Some(unsafe { core::ptr::read_volatile(addr as *const usize) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_stack_and_rejects_unmapped_and_guard_pages() {
        let word: usize = 0x1234_5678;
        let mut m = CheckedMemory::new(&word as *const usize as usize);
        assert_eq!(
            m.read_word(&word as *const usize as usize),
            Some(0x1234_5678)
        );
        assert_eq!(m.read_word(0), None);
        assert_eq!(m.read_word(8), None);
        assert_eq!(m.read_word(usize::MAX & !7), None);
        assert_eq!(
            m.read_word((&word as *const usize as usize) + 1),
            None,
            "unaligned"
        );
        // A PROT_NONE page, as a guard page is.
        let ps = sys::page_size();
        // SAFETY: anonymous private mapping of one page, unmapped below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                ps,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(m.read_word(p as usize), None);
        // SAFETY: p is the mapping created above.
        unsafe { libc::munmap(p, ps) };
        assert_eq!(m.read_word(p as usize), None);
    }
}
