//! Reading memory that may vanish, and learning a thread's stack without asking glibc.

use super::arch::thread_pointer;
use core::sync::atomic::{AtomicUsize, Ordering};

/// Copies `out.len()` bytes from address `addr` of this process into `out` with
/// `process_vm_readv(2)`: the kernel copies, so an unmapped or unreadable address ends the copy
/// instead of faulting, also when another thread unmaps the memory meanwhile. Returns how many
/// bytes were copied (0 when `addr` itself is unreadable). Async-signal-safe.
///
/// # References
/// process_vm_readv(2)
pub(crate) fn read_memory(addr: usize, out: &mut [u8]) -> usize {
    if out.is_empty() || addr == 0 {
        return 0;
    }
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: out.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: out.len(),
    };
    // SAFETY: `local` describes `out`, which is writable; the kernel only reads the remote
    // range and reports unreadable pages instead of faulting.
    let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if got <= 0 {
        0
    } else {
        got as usize
    }
}

/// Where glibc keeps a thread's stack block in its `struct pthread`: the byte offset, from the
/// thread pointer, of the `stackblock` pointer, followed by `stackblock_size` and `guardsize`
/// (wrapping: on aarch64 `struct pthread` lies below the thread pointer). 0 while unknown (the
/// thread pointer's own word is never the stack block).
static PD_STACKBLOCK: AtomicUsize = AtomicUsize::new(0);

/// The main thread's stack `[low, high)`, learned when `init()` ran on the main thread.
static MAIN_STACK: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Records the main thread's stack bounds. Normal context.
pub(crate) fn set_main_stack(low: usize, high: usize) {
    MAIN_STACK[0].store(low, Ordering::Relaxed);
    MAIN_STACK[1].store(high, Ordering::Release);
}

/// Learns where glibc's `struct pthread` keeps the stack block, by comparing what
/// `pthread_getattr_np` reports in a short-lived thread with the words of its `struct pthread`.
/// Needs three consecutive words to match (block, size, guard), so a coincidence is not taken
/// for the layout. Normal context (spawns and joins a thread). Idempotent.
pub(crate) fn learn_pthread_layout() {
    if PD_STACKBLOCK.load(Ordering::Relaxed) != 0 || thread_pointer() == 0 {
        return;
    }
    let found = std::thread::Builder::new()
        .name("selftrace-probe".into())
        .spawn(|| {
            let (low, high) = super::current_thread_stack()?;
            let tp = thread_pointer();
            // SAFETY: pthread_self has no preconditions.
            let me = unsafe { libc::pthread_self() } as usize;
            // glibc's `struct pthread` is at the thread pointer (x86-64) or just below it
            // (aarch64, after the TCB's layout): anything else is not the glibc this knows.
            let below = tp.wrapping_sub(me);
            if tp == 0 || below > 16 << 10 {
                return None;
            }
            let mut words = [0usize; 512];
            // SAFETY: a [usize; 512] is 4096 writable bytes.
            let bytes =
                unsafe { core::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), 4096) };
            let got = read_memory(me, bytes) / 8;
            (0..got.saturating_sub(2)).find_map(|i| {
                let (block, size, guard) = (words[i], words[i + 1], words[i + 2]);
                (block != 0
                    && block.checked_add(size) == Some(high)
                    && block.checked_add(guard) == Some(low))
                .then_some((i * 8).wrapping_sub(below))
            })
        })
        .ok()
        .and_then(|h| h.join().ok())
        .flatten();
    if let Some(off) = found {
        // Offset 0 would be the thread pointer's own word (x86-64's TCB self pointer,
        // aarch64's dtv): never the stack block.
        if off != 0 {
            PD_STACKBLOCK.store(off, Ordering::Relaxed);
        }
    }
}

/// The current thread's stack from `sp` up to its high end, when `sp` lies on the thread's own
/// stack as glibc allocated it (or on the main thread's stack, once learned). Memory in that
/// range is mapped for as long as the thread lives. Async-signal-safe: reads the thread's own
/// `struct pthread` (through the thread pointer) and no system call.
pub(crate) fn own_stack_above(sp: usize) -> Option<(usize, usize)> {
    let off = PD_STACKBLOCK.load(Ordering::Relaxed);
    if off != 0 {
        let tp = thread_pointer();
        if tp != 0 {
            // SAFETY: `tp` is this thread's pointer into its live `struct pthread` (glibc), and
            // `off` was learned from the same glibc to be the offset from it of the
            // `stackblock`, `stackblock_size`, `guardsize` words.
            let (block, size, guard) = unsafe {
                let p = tp.wrapping_add(off) as *const usize;
                (
                    core::ptr::read_volatile(p),
                    core::ptr::read_volatile(p.add(1)),
                    core::ptr::read_volatile(p.add(2)),
                )
            };
            if block != 0 {
                let low = block.saturating_add(guard);
                let high = block.saturating_add(size);
                return (low <= sp && sp < high).then_some((low, high));
            }
        }
    }
    let high = MAIN_STACK[1].load(Ordering::Acquire);
    let low = MAIN_STACK[0].load(Ordering::Relaxed);
    (low <= sp && sp < high).then_some((low, high))
}

/// The program headers (`dlpi_phdr`) of the objects mapped at program start, recorded before
/// `main` (see [`record_startup_objects`]); 0 marks the end.
static STARTUP: [AtomicUsize; 256] = [const { AtomicUsize::new(0) }; 256];

/// Records the objects loaded at program start. Runs from selftrace's load-time constructor:
/// when selftrace is part of the main program, the loader has mapped every startup object by
/// then, and glibc never unloads those (only objects loaded by `dlopen` are). When selftrace is
/// itself in a `dlopen`ed library, nothing is recorded. Not async-signal-safe (takes the
/// loader lock).
pub(crate) fn record_startup_objects() {
    let me = record_startup_objects as *const () as usize;
    let mut in_main = false;
    let mut n = 0;
    super::dl_iterate_phdr(|info| {
        if info.is_first {
            in_main = info.phdrs.iter().any(|p| {
                let start = info.addr.wrapping_add(p.p_vaddr as usize);
                p.p_type == libc::PT_LOAD && start <= me && me < start + p.p_memsz as usize
            });
        }
        if in_main && n < STARTUP.len() && !info.phdrs.is_empty() {
            STARTUP[n].store(info.phdrs.as_ptr() as usize, Ordering::Relaxed);
            n += 1;
        }
    });
}

/// Whether the object whose program headers are at `phdrs` was mapped at program start.
pub(crate) fn is_startup_object(phdrs: usize) -> bool {
    STARTUP
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .take_while(|&p| p != 0)
        .any(|p| p == phdrs)
}
