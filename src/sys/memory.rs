//! Reading memory that may vanish, and learning a thread's stack without asking glibc.
#![allow(unsafe_code)]

use super::arch::thread_pointer;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

/// Copies `out.len()` bytes from address `addr` of this process into `out`, the kernel
/// copying: an unmapped or unreadable address ends the copy instead of faulting, also when
/// another thread unmaps the memory meanwhile. Returns how many bytes were copied (0 when
/// `addr` itself is unreadable).
///
/// The copy is `process_vm_readv(2)`. Where that fails for good (`ENOSYS` under qemu-user,
/// `ENOSYS` or `EPERM` from a seccomp filter in a container), it is a `write(2)` of the range
/// into a pipe of selftrace's own (the kernel reads the range, `EFAULT` where it cannot) and a
/// `read(2)` back: see [`pipe_copy`].
///
/// # References
/// process_vm_readv(2), pipe(7)
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn read_memory(addr: usize, out: &mut [u8]) -> usize {
    if out.is_empty() || addr == 0 {
        return 0;
    }
    if !VM_READV_BROKEN.load(Ordering::Relaxed) {
        match vm_readv(addr, out) {
            Ok(n) => return n,
            Err(e) if e == libc::ENOSYS || e == libc::EPERM => {
                VM_READV_BROKEN.store(true, Ordering::Relaxed);
            }
            Err(_) => return 0,
        }
    }
    pipe_copy(addr, out)
}

/// `process_vm_readv(2)` of `out.len()` bytes at `addr` of this process: the count copied, or
/// the `errno` when nothing was.
fn vm_readv(addr: usize, out: &mut [u8]) -> Result<usize, i32> {
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
    if got < 0 {
        Err(super::errno())
    } else {
        Ok(got as usize)
    }
}

/// `process_vm_readv` failed with `ENOSYS` or `EPERM`: every copy goes through a pipe.
static VM_READV_BROKEN: AtomicBool = AtomicBool::new(false);

/// Whether copies go through pipes (`process_vm_readv` is not available), for tests and docs.
pub(crate) fn copies_through_pipes() -> bool {
    VM_READV_BROKEN.load(Ordering::Relaxed)
}

/// Pipes for [`pipe_copy`]: each a read and a write end, both non-blocking and close-on-exec,
/// packed as `read | write << 32` (0: not made yet), made on first use and claimed one walk at
/// a time.
static PIPES: [AtomicU64; PIPES_N] = [const { AtomicU64::new(0) }; PIPES_N];
/// Which of [`PIPES`] is in use (bit i: pipe i).
static PIPES_BUSY: AtomicUsize = AtomicUsize::new(0);
/// The process the pipes were made by: a child after `fork` shares them with its parent, so it
/// makes its own.
static PIPES_PID: AtomicI32 = AtomicI32::new(0);
/// How many concurrent pipe copies there can be; more fail (and the walk says so) instead of
/// waiting.
const PIPES_N: usize = 4;
/// The most one `write(2)` into a pipe moves at once, never across a boundary of this size (a
/// page on every Linux machine): `PIPE_BUF`, which the kernel writes whole, and the default
/// pipe holds 16 times over.
const PIPE_CHUNK: usize = 4096;

/// Copies through a pipe of selftrace's own: `write(2)` the range into it (the kernel reads the
/// range; `EFAULT`, or a short count, where it is unreadable), then `read(2)` back what was
/// written. A pipe is claimed with a compare-and-swap and is used by one copy at a time, so
/// concurrent copies never see each other's bytes; when all are in use the copy fails (returns
/// 0). The pipes are made on first use with `pipe2(2)`, which is async-signal-safe, and made
/// again in a child after `fork`.
///
/// # References
/// pipe(7), write(2)
///
/// # Async-signal safety
/// Async-signal-safe, lock-free.
pub(crate) fn pipe_copy(addr: usize, out: &mut [u8]) -> usize {
    let Some((slot, rfd, wfd)) = claim_pipe() else {
        return 0;
    };
    let mut done = 0;
    while done < out.len() {
        // One page at a time: where a write's range is partly unreadable, the kernel copies
        // up to the fault, but qemu-user fails the whole write with EFAULT.
        let page_left = PIPE_CHUNK - (addr + done) % PIPE_CHUNK;
        let want = (out.len() - done).min(page_left);
        // SAFETY: a write from [addr + done, + want): the kernel reads that memory for us and
        // fails with EFAULT (or a short count) instead of faulting; wfd is our pipe.
        let w = unsafe { libc::write(wfd, (addr + done) as *const libc::c_void, want) };
        if w <= 0 {
            break;
        }
        let w = w as usize;
        let mut got = 0;
        while got < w {
            // SAFETY: out[done + got..done + w] is writable; rfd is our pipe, holding the w
            // bytes just written (nobody else uses it while we hold it).
            let r = unsafe { libc::read(rfd, out[done + got..].as_mut_ptr().cast(), w - got) };
            if r <= 0 {
                // The pipe is out of step (cannot happen; never trust it again).
                PIPES[slot].store(0, Ordering::Relaxed);
                release_pipe(slot);
                return done + got;
            }
            got += r as usize;
        }
        done += w;
        if w < want {
            break;
        }
    }
    release_pipe(slot);
    done
}

/// Claims a pipe (making it on first use): its index and its read and write ends.
fn claim_pipe() -> Option<(usize, i32, i32)> {
    let pid = super::getpid();
    if PIPES_PID.load(Ordering::Acquire) != pid {
        // A new process (or the first use): forget the inherited pipes (their fds stay open in
        // this process, unused: closing them could close an fd the program reused).
        let old = PIPES_PID.load(Ordering::Acquire);
        if PIPES_PID
            .compare_exchange(old, pid, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            for p in &PIPES {
                p.store(0, Ordering::Release);
            }
            PIPES_BUSY.store(0, Ordering::Release);
        }
    }
    for (i, pipe) in PIPES.iter().enumerate() {
        let bit = 1 << i;
        if PIPES_BUSY.fetch_or(bit, Ordering::Acquire) & bit != 0 {
            continue;
        }
        let mut p = pipe.load(Ordering::Acquire);
        if p == 0 {
            let mut fds = [0i32; 2];
            // SAFETY: fds is valid for two ints.
            let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
            if rc != 0 {
                release_pipe(i);
                return None;
            }
            p = fds[0] as u32 as u64 | (fds[1] as u32 as u64) << 32;
            pipe.store(p, Ordering::Release);
        }
        return Some((i, p as u32 as i32, (p >> 32) as u32 as i32));
    }
    None
}

/// Gives pipe `i` back.
fn release_pipe(i: usize) {
    PIPES_BUSY.fetch_and(!(1 << i), Ordering::Release);
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
/// range is mapped for as long as the thread lives.
///
/// # Async-signal safety
/// Async-signal-safe: reads the thread's own `struct pthread` (through the thread pointer) and no
/// system call.
#[inline]
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

/// Asks the kernel to back the 2 MiB-aligned part of the `len` bytes at `addr` (memory this
/// process allocated and does not unmap while it is used) with transparent huge pages now:
/// `MADV_HUGEPAGE`, then `MADV_COLLAPSE` (Linux 6.1), which copies the pages already there
/// into huge pages before it returns. Returns whether the collapse was done; where either call
/// is refused (an older kernel, THP off, qemu-user) nothing changes. Only huge pages wholly
/// inside the range are touched, so other data sharing the mapping is left as it was. Normal
/// context.
///
/// A lookup in a large symbol index is a few dependent accesses to memory spread over tens of
/// MB: each one that misses the caches also misses the TLB with 4 KiB pages, and the page walk
/// adds to it (a pointer chase over 16 MB on an Intel Xeon VM: 70 ns an access with 4 KiB
/// pages, 41 ns with huge pages).
pub(crate) fn huge_pages(addr: usize, len: usize) -> bool {
    const HUGE: usize = 2 << 20;
    let (Some(lo), Some(end)) = (addr.checked_next_multiple_of(HUGE), addr.checked_add(len)) else {
        return false;
    };
    let hi = end & !(HUGE - 1);
    if hi <= lo {
        return false;
    }
    // SAFETY: advice on whole pages of memory the caller allocated; neither call changes what
    // the memory holds (a collapse copies the pages into huge pages with their data).
    unsafe {
        libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) == 0
            && libc::madvise(lo as *mut libc::c_void, hi - lo, MADV_COLLAPSE) == 0
    }
}

/// `MADV_COLLAPSE` (Linux 6.1; not in every libc crate's list for every target).
const MADV_COLLAPSE: libc::c_int = 25;

#[cfg(test)]
mod tests {
    /// Kilobytes of `AnonHugePages` in the mappings of /proc/self/smaps that overlap
    /// `lo..hi`.
    fn huge_kb(lo: usize, hi: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        let mut kb = 0;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            if let Some((a, b)) = range.filter(|(a, b)| !a.contains(':') && !b.is_empty()) {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a < hi && lo < b;
                    continue;
                }
            }
            if let Some(v) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                kb += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
        kb
    }

    #[test]
    fn huge_pages_keep_the_data_and_are_huge_when_the_kernel_says_so() {
        let mut v: Vec<u64> = (0..(7 << 20) / 8).map(|i| i * 0x9e37_79b9).collect();
        v[12345] = 7;
        let (addr, len) = (v.as_ptr() as usize, v.len() * 8);
        let collapsed = super::huge_pages(addr, len);
        assert_eq!(v[12345], 7);
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &x)| i == 12345 || x == i as u64 * 0x9e37_79b9));
        // qemu-user answers every madvise advice but MADV_DONTNEED with success and does
        // nothing: there only the data are checked.
        let qemu =
            std::fs::read_to_string("/proc/thread-self/maps").is_ok_and(|m| m.contains("/qemu-"));
        if collapsed && !qemu {
            // 7 MiB hold at least two aligned huge pages.
            let kb = huge_kb(addr, addr + len);
            assert!(
                kb >= 4096,
                "MADV_COLLAPSE succeeded, but {kb} kB of huge pages"
            );
        }
        eprintln!("huge pages: collapsed {collapsed}");
        // Too small or empty: nothing to do.
        assert!(!super::huge_pages(addr, 4096));
        assert!(!super::huge_pages(usize::MAX - 10, 100));
    }
}
