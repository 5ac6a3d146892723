//! Minidumps, in the format Breakpad, Crashpad, Sentry and rust-minidump read, written by the
//! process itself: no ptrace, no helper process, no `clone`.
//!
//! Every Linux minidump writer but this one stops the crashed process from outside with
//! `ptrace` (Breakpad clones a child for it, Crashpad and `minidump-writer` run in another
//! process), which fails where ptrace is not allowed: Yama's `ptrace_scope`, seccomp filters,
//! containers, sandboxes. selftrace has what a dump needs in-process: each thread's registers
//! and stack through its stack-request signal (see [`crate::threads`]), the loaded objects with
//! their build-ids, and the signal. A dump is written by the crash handler
//! ([`crate::crash::Builder::minidump`]) or on demand ([`crate::threads::write_minidump`]).
//!
//! # What a dump holds
//! * **ThreadList**: every thread of `/proc/self/task` up to [`MAX_THREADS`] (1,024; a dump
//!   that leaves threads out says how many in Crashpad annotations, see [`MAX_THREADS`]),
//!   with its register context (all general
//!   registers, flags, and the x87/SSE or FP/SIMD state) and its stack memory from the stack
//!   pointer (and the red zone below it) up to [`Options::stack_size`] bytes. Each thread
//!   gives its context from its own signal handler and waits there while its stack is copied,
//!   so registers and stack belong together. A thread that does not answer within
//!   [`crate::threads::timeout`] (the signal blocked, stopped, uninterruptible sleep) is still
//!   listed, with no context and no stack.
//! * **Exception** (crash dumps): the signal, its `si_code`, the fault address, and the
//!   crashing thread's context at the fault.
//! * **ModuleList**: every object of the loader's list (`selftrace::init`/`refresh`), with
//!   base, size, path, and a CodeView record (`BpEL` and the GNU build-id), from which
//!   consumers take the code id and debug id.
//! * **MemoryList**: the stacks, and 256 bytes around the crashing instruction.
//! * **SystemInfo** (cpu, `uname`), **MiscInfo** (pid, start time, CPU times),
//!   **ThreadNames**, and the Linux streams Breakpad writes: `/proc/cpuinfo`,
//!   `/proc/self/status`, `/etc/lsb-release` (or `/etc/os-release`), `/proc/self/cmdline`,
//!   `/proc/self/auxv`, `/proc/self/maps`, and `/proc/self/environ` only with
//!   [`Options::environ`].
//!
//! # Async-signal safety
//! Writing a dump is async-signal-safe: no allocation (fixed buffers in the program's data),
//! no lock but selftrace's own output lock, raw system calls (`pwrite`, `open`, `read`,
//! `process_vm_readv`, `tgkill`, `futex`). Memory is copied with checked reads, so a stack
//! another thread unmaps meanwhile ends the copy instead of faulting. A dump is written at
//! offsets from the file's position when it starts (`pwrite`), so the file must be seekable
//! (a regular file, not a pipe) and not opened with `O_APPEND`.
//!
//! Only on x86-64 and aarch64 (elsewhere [`crate::Error::Unsupported`]).
#![allow(unsafe_code)]

#[macro_use]
mod arch;

pub(crate) use arch::{context_from_ucontext, CONTEXT_SIZE};

use crate::symbolize::FixedBuf;
use crate::sys;
use crate::Error;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI32, Ordering};

// ---- stream types --------------------------------------------------------------------------

const THREAD_LIST: u32 = 3;
const MODULE_LIST: u32 = 4;
const MEMORY_LIST: u32 = 5;
const EXCEPTION: u32 = 6;
const SYSTEM_INFO: u32 = 7;
const MISC_INFO: u32 = 15;
const THREAD_NAMES: u32 = 24;
const LINUX_CPU_INFO: u32 = 0x4767_0003;
const LINUX_PROC_STATUS: u32 = 0x4767_0004;
const LINUX_LSB_RELEASE: u32 = 0x4767_0005;
const LINUX_CMD_LINE: u32 = 0x4767_0006;
const LINUX_ENVIRON: u32 = 0x4767_0007;
const LINUX_AUXV: u32 = 0x4767_0008;
const LINUX_MAPS: u32 = 0x4767_0009;
/// Crashpad's info stream (`MinidumpCrashpadInfo`): its simple annotations say what the dump
/// leaves out.
const CRASHPAD_INFO: u32 = 0x4350_0001;

const SIGNATURE: u32 = 0x504d_444d; // "MDMP"
const VERSION: u32 = 0xa793;
const HEADER_SIZE: u32 = 32;
const MAX_STREAMS: usize = 16;
const DIRECTORY_SIZE: u32 = 12 * MAX_STREAMS as u32;
/// `CV_INFO_ELF`'s signature, "BpEL".
const CV_ELF: u32 = 0x4270_454c;
/// `PLATFORM_ID` of Linux in Breakpad's `MINIDUMP_SYSTEM_INFO`.
const PLATFORM_LINUX: u32 = 0x8201;

/// The most threads a dump lists: 1,024. The crashing (or writing) thread is always one of
/// them; the rest are counted in [`Summary::threads_left_out`], in the crash report's
/// `minidump:` line, and in the dump itself (Crashpad simple annotations
/// `selftrace.threads_left_out`, `selftrace.threads_in_process`, `selftrace.max_threads`).
pub const MAX_THREADS: usize = 1024;
/// The most objects a dump lists.
const MAX_MODULES: usize = 4096;
/// Memory regions besides the stacks.
const MAX_EXTRA_REGIONS: usize = 4;
/// Copy buffer (memory and files go through it to the dump).
const CHUNK: usize = 64 * 1024;

// ---- options and summary -------------------------------------------------------------------

/// The default of [`Options::stack_size`]: 128 KiB per thread.
pub const DEFAULT_STACK_SIZE: usize = 128 * 1024;
/// The least [`Options::stack_size`].
const MIN_STACK_SIZE: usize = 4096;
/// The largest [`Options::stack_size`].
const MAX_STACK_SIZE: usize = 64 << 20;

/// What a dump copies besides what it always has. Create with [`Options::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Options {
    stack_size: usize,
    environ: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options::new()
    }
}

impl Options {
    /// [`DEFAULT_STACK_SIZE`] of stack per thread, no environment.
    pub const fn new() -> Options {
        Options {
            stack_size: DEFAULT_STACK_SIZE,
            environ: false,
        }
    }

    /// The most stack memory copied per thread, from the stack pointer up (default 128 KiB;
    /// at least 4 KiB, at most 64 MiB: [`crate::threads::write_minidump_with`] and
    /// [`crate::crash::Builder::install`] refuse another size with
    /// [`Error::InvalidInput`]). A consumer walks a stack only as far as its memory goes.
    pub const fn stack_size(mut self, bytes: usize) -> Options {
        self.stack_size = bytes;
        self
    }

    /// [`Error::InvalidInput`] for a setting out of range.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn check(&self) -> Result<(), Error> {
        if !(MIN_STACK_SIZE..=MAX_STACK_SIZE).contains(&self.stack_size) {
            return Err(Error::InvalidInput(
                "minidump stack size must be 4 KiB to 64 MiB per thread",
            ));
        }
        Ok(())
    }

    /// Also copy `/proc/self/environ` (default: off; environments hold secrets).
    pub const fn environ(mut self, enabled: bool) -> Options {
        self.environ = enabled;
        self
    }

    /// The stack bytes copied per thread at most.
    pub const fn get_stack_size(&self) -> usize {
        self.stack_size
    }

    /// Whether the environment is copied.
    pub const fn get_environ(&self) -> bool {
        self.environ
    }
}

/// What a written dump holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    threads: usize,
    contexts: usize,
    stacks_left_out: usize,
    left_out: usize,
    modules: usize,
    bytes: u64,
}

impl Summary {
    /// Threads listed.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Threads listed with their registers and stack (the others did not answer in time).
    pub fn threads_with_context(&self) -> usize {
        self.contexts
    }

    /// Threads listed with their registers but without their stack: the thread stopped waiting
    /// (after 2 s) before its stack was copied, so the copy would not match the registers; or
    /// the dump reached its 4 GiB limit.
    pub fn stacks_left_out(&self) -> usize {
        self.stacks_left_out
    }

    /// Threads not listed because the dump holds at most [`MAX_THREADS`].
    pub fn threads_left_out(&self) -> usize {
        self.left_out
    }

    /// Objects in the module list.
    pub fn modules(&self) -> usize {
        self.modules
    }

    /// Size of the dump in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// The fault a crash dump describes.
pub(crate) struct Fault {
    pub(crate) sig: i32,
    pub(crate) code: i32,
    pub(crate) addr: usize,
    /// The crashing thread.
    pub(crate) tid: i32,
    /// Its context at the fault (never null).
    pub(crate) uc: *const libc::ucontext_t,
}

// ---- little-endian helpers -----------------------------------------------------------------

pub(crate) fn le16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn le32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn le64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn rd64(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

// ---- state ---------------------------------------------------------------------------------

/// A `MINIDUMP_LOCATION_DESCRIPTOR`.
#[derive(Clone, Copy, Default)]
struct Loc {
    size: u32,
    rva: u32,
}

#[derive(Clone, Copy)]
struct ThreadRec {
    tid: u32,
    context: Loc,
    stack_start: u64,
    stack: Loc,
    name: Loc,
}

const NO_THREAD: ThreadRec = ThreadRec {
    tid: 0,
    context: Loc { size: 0, rva: 0 },
    stack_start: 0,
    stack: Loc { size: 0, rva: 0 },
    name: Loc { size: 0, rva: 0 },
};

#[derive(Clone, Copy)]
struct ModuleRec {
    base: u64,
    size: u32,
    name_rva: u32,
    cv: Loc,
}

const NO_MODULE: ModuleRec = ModuleRec {
    base: 0,
    size: 0,
    name_rva: 0,
    cv: Loc { size: 0, rva: 0 },
};

/// The buffers of the dump being written (one at a time: [`BUSY`]).
struct State {
    tids: [i32; MAX_THREADS],
    threads: [ThreadRec; MAX_THREADS],
    modules: [ModuleRec; MAX_MODULES],
    extra: [(u64, Loc); MAX_EXTRA_REGIONS],
    directory: [(u32, Loc); MAX_STREAMS],
    context: [u8; CONTEXT_SIZE],
    chunk: [u8; CHUNK],
    /// The mappings of `/proc/self/maps` when the dump began: (start, end, readable), sorted.
    maps: [(usize, usize, bool); MAX_MAPS],
    map_count: usize,
}

/// The most mappings [`State::maps`] holds (a stack beyond them is copied up to the size
/// limit, as far as it is readable).
const MAX_MAPS: usize = 16 * 1024;

struct Shared(UnsafeCell<State>);
// SAFETY: the state is used only by the thread that holds BUSY (set by compare-and-swap,
// never taken over), so accesses never overlap.
unsafe impl Sync for Shared {}

static STATE: Shared = Shared(UnsafeCell::new(State {
    tids: [0; MAX_THREADS],
    threads: [NO_THREAD; MAX_THREADS],
    modules: [NO_MODULE; MAX_MODULES],
    extra: [(0, Loc { size: 0, rva: 0 }); MAX_EXTRA_REGIONS],
    directory: [(0, Loc { size: 0, rva: 0 }); MAX_STREAMS],
    context: [0; CONTEXT_SIZE],
    chunk: [0; CHUNK],
    maps: [(0, 0, false); MAX_MAPS],
    map_count: 0,
}));

/// The thread writing a dump (0 = none).
static BUSY: AtomicI32 = AtomicI32::new(0);

/// In a forked child (one thread): a dump that a thread of the parent was writing is not
/// being written here.
pub(crate) fn after_fork() {
    BUSY.store(0, Ordering::Release);
}

/// Appends a Crashpad info stream (`MinidumpCrashpadInfo` version 1, no report or client id,
/// no module list) whose simple annotations are `pairs` (at most 4; keys up to 63 bytes),
/// each value in decimal. Returns the stream's location.
///
/// # Async-signal safety
/// Async-signal-safe (stack buffers, `pwrite`).
fn crashpad_annotations(f: &mut File, pairs: &[(&[u8], u64)]) -> Loc {
    /// A `MinidumpUTF8String`: its byte length, the bytes and a NUL.
    fn utf8(f: &mut File, text: &[u8]) -> Loc {
        let mut b = [0u8; 4 + 64];
        let len = text.len().min(63);
        le32(&mut b, 0, len as u32);
        b[4..4 + len].copy_from_slice(&text[..len]);
        f.append(&b[..4 + len + 1])
    }
    let n = pairs.len().min(4);
    let mut dict = [0u8; 4 + 8 * 4];
    le32(&mut dict, 0, n as u32);
    for (k, &(key, value)) in pairs.iter().take(n).enumerate() {
        let key = utf8(f, key);
        let mut digits = [0u8; 24];
        let mut w = FixedBuf::new(&mut digits);
        w.push_dec(value);
        let len = w.len();
        let value = utf8(f, &digits[..len]);
        le32(&mut dict, 4 + 8 * k, key.rva);
        le32(&mut dict, 8 + 8 * k, value.rva);
    }
    let dict = f.append(&dict[..4 + 8 * n]);
    // version, report_id (16 bytes), client_id (16), simple_annotations, module_list.
    let mut info = [0u8; 52];
    le32(&mut info, 0, 1);
    le32(&mut info, 36, dict.size);
    le32(&mut info, 40, dict.rva);
    f.append(&info)
}

// ---- the file ------------------------------------------------------------------------------

/// The dump file: positioned writes relative to where the dump starts. Offsets are computed in
/// `u64` and a write that would end past the 4 GiB the format's 32-bit RVAs reach fails the
/// dump (`EFBIG`) before anything is written there.
struct File {
    fd: i32,
    base: i64,
    /// The end of what was written (the next append goes here, aligned).
    end: u64,
    /// The first error (`errno`); nothing is written after it.
    err: i32,
}

/// The highest offset a dump may reach (RVAs are 32 bits).
const MAX_OFFSET: u64 = u32::MAX as u64;
/// Room kept for what follows the stacks (lists, modules, the Linux streams): a stack is not
/// copied when it would leave less.
const TAIL_RESERVE: u64 = 256 << 20;

impl File {
    fn write_at(&mut self, rva: u64, bytes: &[u8]) {
        let end = rva.saturating_add(bytes.len() as u64);
        if end > MAX_OFFSET {
            self.err = libc::EFBIG;
        }
        let mut done = 0usize;
        while self.err == 0 && done < bytes.len() {
            let rest = &bytes[done..];
            let at = self.base.saturating_add((rva + done as u64) as i64);
            // SAFETY: `rest` is readable for its length; pwrite has no other memory effects.
            let r = unsafe { libc::pwrite64(self.fd, rest.as_ptr().cast(), rest.len(), at) };
            if r < 0 {
                let e = sys::errno();
                if e != libc::EINTR {
                    self.err = e;
                }
            } else if r == 0 {
                self.err = libc::EIO;
            } else {
                done += r as usize;
            }
        }
        if self.err == 0 {
            self.end = self.end.max(end);
        }
    }

    /// Where the next append goes (8-byte aligned).
    fn next(&self) -> u64 {
        (self.end + 7) & !7
    }

    /// A location in the dump (checked against [`MAX_OFFSET`] by the writes that made it).
    fn loc(rva: u64, size: u64) -> Loc {
        Loc {
            size: size.min(MAX_OFFSET) as u32,
            rva: rva.min(MAX_OFFSET) as u32,
        }
    }

    fn append(&mut self, bytes: &[u8]) -> Loc {
        let rva = self.next();
        self.write_at(rva, bytes);
        File::loc(rva, bytes.len() as u64)
    }

    /// Appends a `MINIDUMP_STRING` (UTF-16LE with a byte count and a terminating 0) of
    /// `text`, invalid UTF-8 replaced by U+FFFD; `scratch` holds the encoding.
    fn append_string(&mut self, text: &[u8], scratch: &mut [u8]) -> Loc {
        let mut n = 4;
        for chunk in text.utf8_chunks() {
            let invalid = if chunk.invalid().is_empty() {
                None
            } else {
                Some(0xfffd)
            };
            for unit in chunk.valid().encode_utf16().chain(invalid) {
                if n + 4 > scratch.len() {
                    break;
                }
                le16(scratch, n, unit);
                n += 2;
            }
        }
        le32(scratch, 0, (n - 4) as u32);
        le16(scratch, n, 0);
        self.append(&scratch[..n + 2])
    }

    /// Copies up to `max` bytes of this process's memory from `addr` (from the first readable
    /// page within 64 KiB when `addr` itself is not readable) into the dump; the start
    /// address and where the bytes are, or `None` when nothing was readable.
    fn append_memory(&mut self, addr: usize, max: usize, chunk: &mut [u8]) -> Option<(u64, Loc)> {
        let page = sys::page_size().max(4096);
        let end = addr.saturating_add(max);
        let mut start = addr;
        let mut probe = [0u8; 1];
        let mut tries = 0;
        while sys::read_memory(start, &mut probe) == 0 {
            tries += 1;
            start = (start / page).checked_add(1)?.checked_mul(page)?;
            if tries > 16 || start >= end {
                return None;
            }
        }
        let rva = self.next();
        let mut at = start;
        while at < end && self.err == 0 {
            let want = (end - at).min(chunk.len());
            let got = sys::read_memory(at, &mut chunk[..want]);
            if got == 0 {
                break;
            }
            self.write_at(rva + (at - start) as u64, &chunk[..got]);
            at += got;
            if got < want {
                break;
            }
        }
        if at == start || self.err != 0 {
            return None;
        }
        Some((start as u64, File::loc(rva, (at - start) as u64)))
    }

    /// Appends the contents of a file (a `/proc` file, read to its end), `None` if it cannot
    /// be opened.
    fn append_file(&mut self, path: &core::ffi::CStr, chunk: &mut [u8]) -> Option<Loc> {
        let fd = sys::open_cloexec(path, libc::O_RDONLY).ok()?;
        let rva = self.next();
        let mut size = 0u64;
        while self.err == 0 {
            match sys::read(fd, chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.write_at(rva + size, &chunk[..n]);
                    size += n as u64;
                }
            }
        }
        sys::close(fd);
        Some(File::loc(rva, size))
    }
}

// ---- writing -------------------------------------------------------------------------------

/// Whether dumps can be written on this machine.
pub(crate) const SUPPORTED: bool = CONTEXT_SIZE != 0;

/// Writes a dump to `fd` from its current position: a crash dump with `fault`, a dump of the
/// running process without. Asks every other thread for its context (when the request handler
/// of [`crate::threads`] is installed), waiting up to `timeout_ns` for each.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn write(
    fd: i32,
    fault: Option<&Fault>,
    opts: &Options,
    timeout_ns: u64,
) -> Result<Summary, Error> {
    if !SUPPORTED {
        return Err(Error::Unsupported("minidumps on this architecture"));
    }
    opts.check()?;
    let me = sys::gettid();
    if let Err(holder) = BUSY.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
        // A writer that is not a thread of this process (a forked child's parent's) writes
        // nothing here: its state is taken over.
        if !crate::fork::holder_gone(holder)
            || BUSY
                .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return Err(Error::InvalidInput("another minidump is being written"));
        }
    }
    // SAFETY: BUSY is ours: nobody else uses the state until we clear it.
    let st = unsafe { &mut *STATE.0.get() };
    let result = write_locked(st, fd, fault, opts, timeout_ns, me);
    BUSY.store(0, Ordering::Release);
    result
}

fn write_locked(
    st: &mut State,
    fd: i32,
    fault: Option<&Fault>,
    opts: &Options,
    timeout_ns: u64,
    me: i32,
) -> Result<Summary, Error> {
    // SAFETY: lseek has no memory effects.
    let base = unsafe { libc::lseek64(fd, 0, libc::SEEK_CUR) };
    if base < 0 {
        let errno = sys::errno();
        return Err(if errno == libc::ESPIPE {
            Error::InvalidInput("a minidump needs a seekable file, not a pipe or socket")
        } else {
            Error::Sys {
                call: "lseek",
                errno,
            }
        });
    }
    if appends(fd) {
        return Err(Error::InvalidInput(
            "a minidump cannot be written to an O_APPEND file (pwrite would append)",
        ));
    }
    let mut f = File {
        fd,
        base,
        end: (HEADER_SIZE + DIRECTORY_SIZE) as u64,
        err: 0,
    };
    let mut streams = 0usize;
    let mut summary = Summary::default();
    let mut add = |st: &mut State, kind: u32, loc: Loc| {
        if streams < MAX_STREAMS {
            st.directory[streams] = (kind, loc);
            streams += 1;
        }
    };

    // Threads: the list first (threads come and go while the dump is written).
    let mut count = 0usize;
    let mut seen = 0usize;
    let crashing = fault.map(|c| c.tid);
    if let Some(tid) = crashing {
        st.tids[0] = tid;
        count = 1;
        seen = 1;
    }
    let _ = sys::for_each_task(|tid| {
        if Some(tid) == crashing {
            return;
        }
        seen += 1;
        if count < MAX_THREADS {
            st.tids[count] = tid;
            count += 1;
        }
    });
    if count == 0 {
        // /proc unreadable: at least the calling thread.
        st.tids[0] = me;
        count = 1;
        seen = 1;
    }
    summary.left_out = seen.saturating_sub(count);
    load_maps(st);
    let mut listed = 0usize;
    let mut fault_pc = None;
    // Every thread together gets at most four times one thread's timeout.
    let deadline = sys::monotonic_ns().saturating_add(timeout_ns.saturating_mul(4));
    for i in 0..count {
        if f.err != 0 {
            break;
        }
        let tid = st.tids[i];
        let mut rec = ThreadRec {
            tid: tid as u32,
            ..NO_THREAD
        };
        let got = match fault {
            Some(c) if c.tid == tid => {
                // SAFETY: the fault's ucontext is the kernel's (Fault's contract).
                unsafe { context_from_ucontext(c.uc, &mut st.context) };
                Got::Here
            }
            // The writing thread itself: its registers here, in this function, whose frame
            // and callers stay as they are while the stack is copied below it.
            _ if tid == me => {
                let regs = own_registers!();
                arch::context_from_own(&regs, &mut st.context);
                Got::Here
            }
            _ => match crate::report::lock::waiting_fault(tid) {
                // A thread that crashed too and waits for the report lock (which this writer
                // holds) in its crash handler: its context at its own fault.
                Some(uc) => {
                    // SAFETY: the crash handler publishes the kernel's ucontext of a thread
                    // while that thread waits for the output lock, held by this writer.
                    unsafe { context_from_ucontext(uc, &mut st.context) };
                    Got::Here
                }
                None => {
                    let left = deadline.saturating_sub(sys::monotonic_ns());
                    if left == 0 || cannot_answer(tid) {
                        Got::Nothing
                    } else {
                        thread_context(tid, timeout_ns.min(left), st, &mut f, &mut rec, opts)
                    }
                }
            },
        };
        match got {
            // Gone before it could answer: not a thread of the process any more.
            Got::Gone => continue,
            Got::Here => {
                rec.context = f.append(&st.context);
                if fault.is_some_and(|c| c.tid == tid) {
                    fault_pc = arch::sp_pc(&st.context).map(|(_, pc)| pc);
                }
                if !copy_stack(st, &mut f, &mut rec, opts) {
                    summary.stacks_left_out += 1;
                }
            }
            Got::Done { stack: false } => summary.stacks_left_out += 1,
            Got::Done { stack: true } | Got::Nothing => {}
        }
        if rec.context.size != 0 {
            summary.contexts += 1;
        }
        let mut name = [0u8; 16];
        let len = thread_name(tid, &mut name);
        rec.name = f.append_string(&name[..len], &mut st.chunk);
        st.threads[listed] = rec;
        listed += 1;
    }
    summary.threads = listed;
    // Threads beyond MAX_THREADS: the dump says so itself, in Crashpad's simple annotations,
    // which minidump readers show (`minidump-stackwalk --dump`, Sentry, Socorro).
    if summary.left_out > 0 {
        let loc = crashpad_annotations(
            &mut f,
            &[
                (b"selftrace.threads_left_out", summary.left_out as u64),
                (b"selftrace.threads_in_process", seen as u64),
                (b"selftrace.max_threads", MAX_THREADS as u64),
            ],
        );
        add(st, CRASHPAD_INFO, loc);
    }

    // ThreadList.
    {
        let buf = &mut st.chunk;
        le32(buf, 0, listed as u32);
        for (k, t) in st.threads[..listed].iter().enumerate() {
            let o = 4 + 48 * k;
            buf[o..o + 48].fill(0);
            le32(buf, o, t.tid);
            le64(buf, o + 16, 0); // Teb
            le64(buf, o + 24, t.stack_start);
            le32(buf, o + 32, t.stack.size);
            le32(buf, o + 36, t.stack.rva);
            le32(buf, o + 40, t.context.size);
            le32(buf, o + 44, t.context.rva);
        }
        let loc = f.append(&buf[..4 + 48 * listed]);
        add(st, THREAD_LIST, loc);
    }

    // ThreadNames.
    {
        let buf = &mut st.chunk;
        le32(buf, 0, listed as u32);
        for (k, t) in st.threads[..listed].iter().enumerate() {
            let o = 4 + 12 * k;
            le32(buf, o, t.tid);
            le64(buf, o + 4, t.name.rva as u64);
        }
        let loc = f.append(&buf[..4 + 12 * listed]);
        add(st, THREAD_NAMES, loc);
    }

    // Exception, and the code around the faulting instruction.
    let mut extra = 0usize;
    if let Some(c) = fault {
        let ctx = st.threads[..listed]
            .iter()
            .find(|t| t.tid == c.tid as u32)
            .map(|t| t.context)
            .unwrap_or_default();
        let mut e = [0u8; 168];
        le32(&mut e, 0, c.tid as u32);
        le32(&mut e, 8, c.sig as u32);
        le32(&mut e, 12, c.code as u32);
        le64(&mut e, 24, c.addr as u64);
        le32(&mut e, 160, ctx.size);
        le32(&mut e, 164, ctx.rva);
        let loc = f.append(&e);
        add(st, EXCEPTION, loc);
        if let Some(pc) = fault_pc {
            let from = (pc as usize).saturating_sub(128);
            if let Some(region) = f.append_memory(from, 256, &mut st.chunk) {
                st.extra[extra] = region;
                extra += 1;
            }
        }
    }

    // MemoryList: the stacks and the extra regions.
    {
        let buf = &mut st.chunk;
        let mut n = 0usize;
        let mut put = |buf: &mut [u8], start: u64, loc: Loc| {
            let o = 4 + 16 * n;
            le64(buf, o, start);
            le32(buf, o + 8, loc.size);
            le32(buf, o + 12, loc.rva);
            n += 1;
        };
        for t in st.threads[..listed].iter().filter(|t| t.stack.size != 0) {
            put(buf, t.stack_start, t.stack);
        }
        for &(start, loc) in &st.extra[..extra] {
            put(buf, start, loc);
        }
        le32(buf, 0, n as u32);
        let loc = f.append(&buf[..4 + 16 * n]);
        add(st, MEMORY_LIST, loc);
    }

    // ModuleList.
    let modules = crate::modules::with_current(|snap| {
        let mut n = 0usize;
        let Some(snap) = snap else { return 0 };
        for o in snap.objects().iter().take(MAX_MODULES) {
            // Unloaded since the snapshot (another library may lie there now): left out, so
            // that no frame is named after it.
            if o.verify(o.range.start) == crate::modules::Verdict::Changed {
                continue;
            }
            let name_rva = f.append_string(o.path.as_bytes(), &mut st.chunk).rva;
            let mut cv = Loc::default();
            if let Some(id) = o.build_id.as_deref() {
                let id = &id[..id.len().min(64)];
                let mut rec = [0u8; 68];
                le32(&mut rec, 0, CV_ELF);
                rec[4..4 + id.len()].copy_from_slice(id);
                cv = f.append(&rec[..4 + id.len()]);
            }
            st.modules[n] = ModuleRec {
                base: o.range.start as u64,
                size: o.range.len().min(u32::MAX as usize) as u32,
                name_rva,
                cv,
            };
            n += 1;
        }
        n
    });
    summary.modules = modules;
    {
        let list = f.next();
        let mut head = [0u8; 4];
        le32(&mut head, 0, modules as u32);
        f.write_at(list, &head);
        let buf = &mut st.chunk;
        let per = buf.len() / 108;
        let mut k = 0;
        while k < modules {
            let batch = (modules - k).min(per);
            for j in 0..batch {
                let m = st.modules[k + j];
                let o = 108 * j;
                buf[o..o + 108].fill(0);
                le64(buf, o, m.base);
                le32(buf, o + 8, m.size);
                le32(buf, o + 20, m.name_rva);
                le32(buf, o + 76, m.cv.size);
                le32(buf, o + 80, m.cv.rva);
            }
            f.write_at(list + 4 + 108 * k as u64, &buf[..108 * batch]);
            k += batch;
        }
        let loc = File::loc(list, 4 + 108 * modules as u64);
        add(st, MODULE_LIST, loc);
    }

    // SystemInfo and MiscInfo.
    let loc = system_info(&mut f, &mut st.chunk);
    add(st, SYSTEM_INFO, loc);
    let loc = misc_info(&mut f);
    add(st, MISC_INFO, loc);

    // The Linux streams.
    let files: [(u32, &core::ffi::CStr, bool); 7] = [
        (LINUX_CPU_INFO, c"/proc/cpuinfo", true),
        (LINUX_PROC_STATUS, c"/proc/self/status", true),
        (LINUX_CMD_LINE, c"/proc/self/cmdline", true),
        (LINUX_ENVIRON, c"/proc/self/environ", opts.environ),
        (LINUX_AUXV, c"/proc/self/auxv", true),
        (LINUX_MAPS, c"/proc/self/maps", true),
        (LINUX_LSB_RELEASE, c"/etc/lsb-release", true),
    ];
    for (kind, path, wanted) in files {
        if !wanted {
            continue;
        }
        let loc = f.append_file(path, &mut st.chunk).or_else(|| {
            (kind == LINUX_LSB_RELEASE)
                .then(|| f.append_file(c"/etc/os-release", &mut st.chunk))
                .flatten()
        });
        if let Some(loc) = loc {
            add(st, kind, loc);
        }
    }

    // Header and directory last: a dump cut short has no valid header.
    let mut dir = [0u8; DIRECTORY_SIZE as usize];
    for (k, (kind, loc)) in st.directory[..streams].iter().enumerate() {
        le32(&mut dir, 12 * k, *kind);
        le32(&mut dir, 12 * k + 4, loc.size);
        le32(&mut dir, 12 * k + 8, loc.rva);
    }
    f.write_at(HEADER_SIZE as u64, &dir[..12 * streams]);
    let mut header = [0u8; HEADER_SIZE as usize];
    le32(&mut header, 0, SIGNATURE);
    le32(&mut header, 4, VERSION);
    le32(&mut header, 8, streams as u32);
    le32(&mut header, 12, HEADER_SIZE);
    le32(&mut header, 20, realtime().0 as u32);
    f.write_at(0, &header);
    if f.err != 0 {
        return Err(Error::Sys {
            call: "pwrite",
            errno: f.err,
        });
    }
    summary.bytes = f.end;
    // Leave the file's position after the dump, as a write would.
    // SAFETY: lseek has no memory effects.
    unsafe { libc::lseek64(fd, base.saturating_add(f.end as i64), libc::SEEK_SET) };
    Ok(summary)
}

/// Whether `fd` was opened with `O_APPEND` (where Linux's `pwrite` ignores the offset).
pub(crate) fn appends(fd: i32) -> bool {
    // SAFETY: F_GETFL reads the descriptor's flags; no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_APPEND != 0
}

/// What the writer got for one thread.
#[cfg_attr(not(feature = "threads"), allow(dead_code))]
enum Got {
    /// Its context is in `State::context`; its stack is to be copied now.
    Here,
    /// [`thread_context`] wrote its context and (unless `stack` is false: left out) its stack.
    Done { stack: bool },
    /// It did not answer (or cannot): listed without context.
    Nothing,
    /// It does not exist any more.
    Gone,
}

/// Asks thread `tid` for its context, holding it in its handler while its stack is copied.
fn thread_context(
    tid: i32,
    timeout_ns: u64,
    st: &mut State,
    f: &mut File,
    rec: &mut ThreadRec,
    opts: &Options,
) -> Got {
    #[cfg(feature = "threads")]
    {
        match crate::threads::request_context(tid, timeout_ns, &mut st.context) {
            crate::threads::ContextAnswer::Context(ticket) => {
                rec.context = f.append(&st.context);
                let mut stack = copy_stack(st, f, rec, opts);
                if !crate::threads::release_context(ticket) {
                    // It stopped waiting before the copy ended: the copy is not its stack at
                    // the time of its registers.
                    rec.stack = Loc::default();
                    rec.stack_start = 0;
                    stack = false;
                }
                Got::Done { stack }
            }
            crate::threads::ContextAnswer::Timeout => Got::Nothing,
            crate::threads::ContextAnswer::Gone => Got::Gone,
        }
    }
    #[cfg(not(feature = "threads"))]
    {
        let _ = (tid, timeout_ns, st, f, rec, opts);
        Got::Nothing
    }
}

/// Whether thread `tid` cannot answer a context request now: stopped (`T`, `t`), or with the
/// request signal blocked or ignored (the check the text dumps use too,
/// `threads::proc::cannot_answer`), so that asking would only wait for the timeout.
fn cannot_answer(tid: i32) -> bool {
    #[cfg(feature = "threads")]
    {
        crate::threads::cannot_answer(tid).is_some()
    }
    #[cfg(not(feature = "threads"))]
    {
        // Nobody would answer without the stack-request handler.
        let _ = tid;
        true
    }
}

/// Thread `tid`'s name from `/proc/self/task/TID/comm` into `out`; its length (0 if unreadable).
fn thread_name(tid: i32, out: &mut [u8; 16]) -> usize {
    let n = read_task_file(tid, b"comm", out);
    let text = &out[..n];
    text.strip_suffix(b"\n").unwrap_or(text).len()
}

/// Reads `/proc/self/task/TID/FILE` into `out` (one `read`); the bytes read, 0 if unreadable.
fn read_task_file(tid: i32, file: &[u8], out: &mut [u8]) -> usize {
    let mut path = [0u8; 64];
    let mut w = FixedBuf::new(&mut path);
    w.push_bytes(b"/proc/self/task/");
    w.push_dec(tid as u64);
    w.push_bytes(b"/");
    w.push_bytes(file);
    w.push_bytes(b"\0");
    let len = w.len();
    let Ok(path) = core::ffi::CStr::from_bytes_with_nul(&path[..len]) else {
        return 0;
    };
    let Ok(fd) = sys::open_cloexec(path, libc::O_RDONLY) else {
        return 0;
    };
    let n = sys::read(fd, out).unwrap_or(0);
    sys::close(fd);
    n
}

/// Copies the stack of the thread whose context is in `st.context` into the dump: from its
/// stack pointer (less the red zone) up to [`Options::stack_size`] bytes, and no further than
/// the end of the stack's mapping. False when it was left out (the dump's size limit).
fn copy_stack(st: &mut State, f: &mut File, rec: &mut ThreadRec, opts: &Options) -> bool {
    let Some((sp, _)) = arch::sp_pc(&st.context) else {
        return true;
    };
    let sp = sp as usize;
    let mut from = sp.saturating_sub(arch::RED_ZONE);
    let mut limit = opts.stack_size;
    if let Some((start, end)) = stack_mapping(&st.maps[..st.map_count], sp) {
        from = from.max(start);
        limit = end.saturating_sub(from).min(opts.stack_size);
    }
    if f.next() + limit as u64 + TAIL_RESERVE > MAX_OFFSET {
        return false;
    }
    if let Some((start, loc)) = f.append_memory(from, limit, &mut st.chunk) {
        rec.stack_start = start;
        rec.stack = loc;
    }
    true
}

/// The readable mapping that holds the stack at `sp`: the mapping containing `sp`, or, when
/// `sp` lies in a guard page or gap below the stack (an overflow), the readable mapping that
/// begins at most 1 MiB above it. `None` when the table does not say.
fn stack_mapping(maps: &[(usize, usize, bool)], sp: usize) -> Option<(usize, usize)> {
    let i = maps.partition_point(|m| m.1 <= sp);
    let (start, end, readable) = *maps.get(i)?;
    if start <= sp && readable {
        return Some((start, end));
    }
    // In an unreadable mapping or in a gap: the next readable one above.
    maps[i..]
        .iter()
        .find(|m| m.2 && m.0 > sp)
        .filter(|m| m.0 - sp <= 1 << 20)
        .map(|m| (m.0, m.1))
}

/// Reads `/proc/self/maps` into `st.maps` (start, end, readable), at most [`MAX_MAPS`].
fn load_maps(st: &mut State) {
    st.map_count = 0;
    let Ok(fd) = sys::open_cloexec(c"/proc/self/maps", libc::O_RDONLY) else {
        return;
    };
    let mut have = 0usize;
    loop {
        let n = match sys::read(fd, &mut st.chunk[have..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        have += n;
        let mut used = 0;
        while let Some(nl) = st.chunk[used..have].iter().position(|&b| b == b'\n') {
            if let Some(m) = parse_maps_line(&st.chunk[used..used + nl]) {
                if st.map_count < MAX_MAPS {
                    st.maps[st.map_count] = m;
                    st.map_count += 1;
                }
            }
            used += nl + 1;
        }
        st.chunk.copy_within(used..have, 0);
        have -= used;
        if have == st.chunk.len() {
            // A line longer than the buffer: skip it.
            have = 0;
        }
    }
    sys::close(fd);
}

/// `(start, end, readable)` of a `/proc/PID/maps` line (`start-end perms ...`).
pub(crate) fn parse_maps_line(line: &[u8]) -> Option<(usize, usize, bool)> {
    let hex = |s: &[u8]| -> Option<usize> {
        if s.is_empty() || s.len() > 16 {
            return None;
        }
        s.iter().try_fold(0usize, |acc, &b| {
            let d = (b as char).to_digit(16)? as usize;
            Some((acc << 4) | d)
        })
    };
    let dash = line.iter().position(|&b| b == b'-')?;
    let space = line.iter().position(|&b| b == b' ')?;
    if space < dash {
        return None;
    }
    let start = hex(&line[..dash])?;
    let end = hex(&line[dash + 1..space])?;
    let readable = line.get(space + 1) == Some(&b'r');
    (start < end).then_some((start, end, readable))
}

/// `CLOCK_REALTIME` as (seconds, nanoseconds).
fn realtime() -> (u64, u64) {
    clock(libc::CLOCK_REALTIME)
}

fn clock(id: libc::clockid_t) -> (u64, u64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64, ts.tv_nsec as u64)
}

/// `MINIDUMP_SYSTEM_INFO` and its CSD version string (`uname`: system, release, version,
/// machine, as Breakpad writes it).
fn system_info(f: &mut File, chunk: &mut [u8]) -> Loc {
    // SAFETY: all-zero is a valid utsname; uname fills it.
    let mut uts: libc::utsname = unsafe { core::mem::zeroed() };
    // SAFETY: uts is valid for writing.
    unsafe { libc::uname(&mut uts) };
    let field = |a: &[libc::c_char]| {
        // SAFETY: c_char and u8 have the same size and alignment.
        let b = unsafe { core::slice::from_raw_parts(a.as_ptr().cast::<u8>(), a.len()) };
        &b[..sys::strnlen(b)]
    };
    let mut csd = [0u8; 4 * 65 + 4];
    let mut w = FixedBuf::new(&mut csd);
    w.push_bytes(field(&uts.sysname));
    w.push_bytes(b" ");
    w.push_bytes(field(&uts.release));
    w.push_bytes(b" ");
    w.push_bytes(field(&uts.version));
    w.push_bytes(b" ");
    w.push_bytes(field(&uts.machine));
    let n = w.len();
    let csd_rva = f.append_string(&csd[..n], chunk).rva;
    // "6.1.0-27-amd64": major, minor, build.
    let mut version = [0u32; 3];
    let mut k = 0;
    for &b in field(&uts.release) {
        match b {
            b'0'..=b'9' => {
                version[k] = version[k]
                    .saturating_mul(10)
                    .saturating_add((b - b'0') as u32)
            }
            b'.' if k < 2 => k += 1,
            _ => break,
        }
    }
    let mut cpu = [0u8; 24];
    let (level, revision) = arch::cpu_information(&mut cpu);
    let mut s = [0u8; 56];
    le16(&mut s, 0, arch::PROCESSOR_ARCHITECTURE);
    le16(&mut s, 2, level);
    le16(&mut s, 4, revision);
    s[6] = online_cpus().min(255) as u8;
    le32(&mut s, 8, version[0]);
    le32(&mut s, 12, version[1]);
    le32(&mut s, 16, version[2]);
    le32(&mut s, 20, PLATFORM_LINUX);
    le32(&mut s, 24, csd_rva);
    s[32..56].copy_from_slice(&cpu);
    f.append(&s)
}

/// The number of online CPUs, from `/sys/devices/system/cpu/online` ("0-3,8-11").
fn online_cpus() -> u32 {
    let Ok(fd) = sys::open_cloexec(c"/sys/devices/system/cpu/online", libc::O_RDONLY) else {
        return 0;
    };
    let mut buf = [0u8; 256];
    let n = sys::read(fd, &mut buf).unwrap_or(0);
    sys::close(fd);
    count_cpu_list(&buf[..n])
}

/// Counts the CPUs of a kernel CPU list ("0-3,8,10-11").
fn count_cpu_list(list: &[u8]) -> u32 {
    let mut total = 0u32;
    for part in list.split(|&b| b == b',') {
        let part = part.trim_ascii();
        let num = |s: &[u8]| sys::parse_decimal(s).map(|v| v as u32);
        match part.iter().position(|&b| b == b'-') {
            Some(dash) => {
                if let (Some(a), Some(b)) = (num(&part[..dash]), num(&part[dash + 1..])) {
                    total += b.saturating_sub(a) + 1;
                }
            }
            None => {
                if num(part).is_some() {
                    total += 1;
                }
            }
        }
    }
    total
}

/// `MINIDUMP_MISC_INFO`: pid, the process's start time (Unix seconds) and its user and system
/// CPU seconds.
fn misc_info(f: &mut File) -> Loc {
    let mut m = [0u8; 24];
    le32(&mut m, 0, 24);
    let mut flags = 1u32; // MINIDUMP_MISC1_PROCESS_ID
    le32(&mut m, 8, sys::getpid() as u32);
    // SAFETY: all-zero is a valid rusage; getrusage fills it.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: ru is valid for writing.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
        if let Some(start) = start_time() {
            flags |= 2; // MINIDUMP_MISC1_PROCESS_TIMES
            le32(&mut m, 12, start as u32);
            le32(&mut m, 16, ru.ru_utime.tv_sec as u32);
            le32(&mut m, 20, ru.ru_stime.tv_sec as u32);
        }
    }
    le32(&mut m, 4, flags);
    f.append(&m)
}

/// The process's start time in Unix seconds: `starttime` of `/proc/self/stat` (clock ticks
/// since boot) against `CLOCK_BOOTTIME` and `CLOCK_REALTIME` now.
fn start_time() -> Option<u64> {
    let fd = sys::open_cloexec(c"/proc/self/stat", libc::O_RDONLY).ok()?;
    let mut buf = [0u8; 1024];
    let n = sys::read(fd, &mut buf);
    sys::close(fd);
    let stat = &buf[..n.ok()?];
    let close = stat.iter().rposition(|&b| b == b')')?;
    // Field 3 (state) follows ") "; starttime is field 22.
    let field = stat.get(close + 2..)?.split(|&b| b == b' ').nth(19)?;
    let ticks = field.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit()
            .then(|| acc.saturating_mul(10).saturating_add((b - b'0') as u64))
    })?;
    // SAFETY: getauxval reads the auxiliary vector the kernel gave the process.
    let hz = (unsafe { libc::getauxval(libc::AT_CLKTCK) } as u64).max(1);
    let up = clock(libc::CLOCK_BOOTTIME).0;
    let now = realtime().0;
    Some(now.saturating_sub(up.saturating_sub(ticks / hz)))
}

/// Opens the directory dumps go to (normal context: at install time); the fd is never closed
/// (a handler may write into it at any time).
///
/// # Errors
/// [`Error::Unsupported`] where dumps are not written, [`Error::Sys`] when it cannot be opened.
pub(crate) fn open_dir(dir: &std::path::Path) -> Result<i32, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    if !SUPPORTED {
        return Err(Error::Unsupported("minidumps on this architecture"));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| Error::Sys {
            call: "open",
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })?;
    Ok(sys::keep_open(std::os::fd::OwnedFd::from(file)))
}

/// A new file for a dump in `dir_fd`, to be named `<uuid>.dmp` by [`finish_in`]: created
/// exclusively, mode 0600, as `<uuid>.dmp.tmp` (so that a dump being written, or cut short, is
/// never taken for a finished one, by `crash::upload::send_pending` for one). Returns the fd and
/// writes the final name (NUL-free) into `name`, returning its length too.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn create_in(dir_fd: i32, name: &mut [u8; 48]) -> Result<(i32, usize), i32> {
    for _ in 0..8 {
        let mut id = [0u8; 16];
        random(&mut id);
        // A version 4 UUID, as Breakpad names its dumps.
        id[6] = (id[6] & 0x0f) | 0x40;
        id[8] = (id[8] & 0x3f) | 0x80;
        let mut w = FixedBuf::new(&mut name[..]);
        for (k, b) in id.iter().enumerate() {
            if matches!(k, 4 | 6 | 8 | 10) {
                w.push_bytes(b"-");
            }
            let hex = b"0123456789abcdef";
            w.push_bytes(&[hex[(b >> 4) as usize], hex[(b & 15) as usize]]);
        }
        w.push_bytes(b".dmp");
        let len = w.len();
        let tmp = temporary_name(&name[..len]);
        // SAFETY: tmp is NUL-terminated.
        let fd = unsafe {
            libc::openat(
                dir_fd,
                tmp.as_ptr().cast(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd >= 0 {
            return Ok((fd, len));
        }
        let e = sys::errno();
        if e != libc::EEXIST {
            return Err(e);
        }
    }
    Err(libc::EEXIST)
}

/// `NAME.tmp` and a NUL, for a name from [`create_in`].
fn temporary_name(name: &[u8]) -> [u8; 56] {
    let mut tmp = [0u8; 56];
    let n = name.len().min(48);
    tmp[..n].copy_from_slice(&name[..n]);
    tmp[n..n + 4].copy_from_slice(b".tmp");
    tmp
}

/// Ends a dump made with [`create_in`]: renames `NAME.tmp` to `NAME` when it was written
/// (`ok`), removes it otherwise.
///
/// # Errors
/// The `errno` of `renameat` or `unlinkat`.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn finish_in(dir_fd: i32, name: &[u8], ok: bool) -> Result<(), i32> {
    let tmp = temporary_name(name);
    let mut done = [0u8; 49];
    let n = name.len().min(48);
    done[..n].copy_from_slice(&name[..n]);
    // SAFETY: both names are NUL-terminated; the calls have no other memory effects.
    let r = unsafe {
        if ok {
            libc::renameat(dir_fd, tmp.as_ptr().cast(), dir_fd, done.as_ptr().cast())
        } else {
            libc::unlinkat(dir_fd, tmp.as_ptr().cast(), 0)
        }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(sys::errno())
    }
}

/// Random bytes from `getrandom` (not blocking), or, should that fail, from the clock, pid
/// and tid.
fn random(out: &mut [u8; 16]) {
    // SAFETY: out is writable for its length; GRND_NONBLOCK never waits.
    let got = unsafe {
        libc::syscall(
            libc::SYS_getrandom,
            out.as_mut_ptr(),
            out.len(),
            libc::GRND_NONBLOCK,
        )
    };
    if got == out.len() as libc::c_long {
        return;
    }
    let (s, ns) = realtime();
    let mix = s.wrapping_mul(1_000_000_007) ^ ns ^ ((sys::getpid() as u64) << 32);
    out[..8].copy_from_slice(&mix.to_le_bytes());
    out[8..].copy_from_slice(&(sys::gettid() as u64 ^ ns.rotate_left(17)).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_mappings() {
        let maps = [
            (0x1000, 0x2000, true),
            (0x2000, 0x3000, false), // a guard page
            (0x3000, 0x9000, true),  // a stack
            (0x9000, 0xa000, true),  // what follows it
        ];
        assert_eq!(stack_mapping(&maps, 0x4000), Some((0x3000, 0x9000)));
        assert_eq!(
            stack_mapping(&maps, 0x2800),
            Some((0x3000, 0x9000)),
            "overflow into the guard"
        );
        assert_eq!(stack_mapping(&maps, 0x9fff), Some((0x9000, 0xa000)));
        assert_eq!(stack_mapping(&maps, 0xa000), None);
        assert_eq!(
            parse_maps_line(b"7ffc2405c000-7ffc2407d000 rw-p 00000000 00:00 0  [stack]"),
            Some((0x7ffc2405c000, 0x7ffc2407d000, true))
        );
        assert_eq!(
            parse_maps_line(b"7f735df7b000-7f735df7c000 ---p 00000000 00:00 0"),
            Some((0x7f735df7b000, 0x7f735df7c000, false))
        );
        assert_eq!(parse_maps_line(b"garbage"), None);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list(b"0-3,8-11\n"), 8);
        assert_eq!(count_cpu_list(b"0\n"), 1);
        assert_eq!(count_cpu_list(b"0-1,3"), 3);
        assert_eq!(count_cpu_list(b""), 0);
    }

    #[test]
    fn strings_are_utf16_with_a_byte_count() {
        let mut scratch = [0u8; 64];
        let path = std::env::temp_dir().join(format!("selftrace-md-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        use std::os::fd::AsRawFd;
        let mut f = File {
            fd: file.as_raw_fd(),
            base: 0,
            end: 0,
            err: 0,
        };
        let loc = f.append_string("añ\u{1F600}".as_bytes(), &mut scratch);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let body = &bytes[loc.rva as usize..(loc.rva + loc.size) as usize];
        let units: Vec<u16> = "añ\u{1F600}".encode_utf16().collect();
        assert_eq!(
            u32::from_le_bytes(body[..4].try_into().unwrap()) as usize,
            units.len() * 2
        );
        let got: Vec<u16> = body[4..4 + units.len() * 2]
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, units);
        assert_eq!(&body[4 + units.len() * 2..], &[0, 0]);
    }
}
