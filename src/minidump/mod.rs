//! Minidumps, in the format Breakpad, Crashpad, Sentry and rust-minidump read, written by the
//! process itself: no ptrace, no helper process, no `clone`.
//!
//! Every Linux minidump writer but this one stops the crashed process from outside with
//! `ptrace` (Breakpad clones a child for it, Crashpad and `minidump-writer` run in another
//! process), which fails where ptrace is not allowed: Yama's `ptrace_scope`, seccomp filters,
//! containers, sandboxes. selftrace has what a dump needs in-process: each thread's registers
//! and stack through its stack-request signal (see [`crate::threads`]), the loaded objects with
//! their build-ids, and the signal. A dump is written by the crash handler
//! ([`crate::crash::Builder::minidump`]) or on demand ([`write_to`]).
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
//!
//! # How it is written
//! * Files: the crash handler (and the watchdog before `Action::Abort`) writes `<uuid>.dmp` (a
//!   random version-4 UUID) in the directory opened at install time: first as `<uuid>.dmp.tmp`,
//!   created with `O_EXCL` and mode 0600, `fsync`ed, then renamed to `<uuid>.dmp` once complete
//!   (removed if the write failed), and named in the text report, which comes first; the process
//!   still dies by its signal. So a dump being written or cut short is never uploaded as a
//!   finished one. Header and directory are written last (a dump cut short has no valid
//!   header). After a dump to a given fd, its position is at the dump's end.
//! * The writing thread's own registers are taken in the writer's own frame (inline assembly), so
//!   they describe a frame that stays live while its stack is copied; only the registers a stack
//!   walk needs (rsp, rbp, rbx, r12-r15, rip; on aarch64 sp, x19-x30, pc) are set, the others are
//!   zero.
//! * A held thread waits at most 2 s for the writer; if the copy of its stack takes longer, the
//!   thread says so and the dump keeps its registers but leaves its stack out
//!   ([`Summary::stacks_left_out`]) rather than pair them with a stack that changed. Threads that
//!   cannot answer (stopped, or blocking the request signal, from `/proc/self/task/TID/status`)
//!   are not asked; all threads together get at most four times one thread's timeout.
//! * A thread that crashes while another reports waits in its crash handler; the dump takes that
//!   thread's registers at its own fault, not in the handler.
//! * One dump is written at a time (a second writer gets [`crate::Error::InvalidInput`]). A dump
//!   stays below the 4 GiB the format's 32-bit offsets reach: stacks are left out before the room
//!   for the streams after them runs out. The buffers are about 700 KB of `.bss`, touched only
//!   while a dump is written.
//!
//! # Not (yet) in a dump
//! * The module list is the one of the last `init()`/`refresh()`; an object `dlopen`ed after it is
//!   missing from the dump (its memory is still in the maps stream), and so is one `dlclose`d
//!   since (checked without locks at the crash: another library may lie at its addresses now).
//! * No `MD_LINUX_DSO_DEBUG` (the loader's `r_debug` list), no thread priorities, no memory beyond
//!   stacks and the crashing instruction (no heap, no memory that registers point to).
//!
//! How the dumps are checked with rust-minidump, and how to read one with `minidump-stackwalk`:
//! the repository's docs/minidump.md.
//! # Files
//! This file: the API ([`Options`], [`Summary`], [`write_to`]), the dump state and the thread
//! loop (`write_locked`). `file.rs`: the positioned writer; `streams.rs`: one function per
//! stream and the directory; `thread.rs`: one thread's context and stack; `system.rs`: the
//! system streams; `dir.rs`: the `<uuid>.dmp` lifecycle. The registers come from
//! `crate::context`, `/proc` from `crate::procfs`.
//!
//! Size: a little over 600 lines because the public API's docs (`Options`, `Summary`,
//! `write_to`) and the one-writer state live next to the thread loop that uses them.
#![allow(unsafe_code)]

mod dir;
mod file;
mod streams;
mod system;
mod thread;
pub mod upload;

pub(crate) use dir::{open_dir, write_in};
use file::{File, Loc};
use streams::{
    Annotations, Directory, LINUX_AUXV, LINUX_CMD_LINE, LINUX_CPU_INFO, LINUX_ENVIRON,
    LINUX_LSB_RELEASE, LINUX_MAPS, LINUX_PROC_STATUS,
};
use system::{misc_info, system_info};
use thread::{cannot_answer, copy_stack, thread_context, Got};

use crate::context::{self as arch, context_from_ucontext, CONTEXT_SIZE};
use crate::error::Error;
use crate::fmt::FixedBuf;
use crate::sys;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI32, Ordering};

// ---- stream types --------------------------------------------------------------------------

const HEADER_SIZE: u32 = 32;
const MAX_STREAMS: usize = 16;
const DIRECTORY_SIZE: u32 = 12 * MAX_STREAMS as u32;
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
    /// at least 4 KiB, at most 64 MiB: [`write_to`] and
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

pub(crate) use crate::context::Fault;

// ---- state ---------------------------------------------------------------------------------

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
    context: [u8; CONTEXT_SIZE],
    chunk: [u8; CHUNK],
    /// The dump's Crashpad simple annotations.
    annotations: Annotations,
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
    context: [0; CONTEXT_SIZE],
    chunk: [0; CHUNK],
    annotations: Annotations::new(),
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

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::MINIDUMP, after_fork);

// ---- writing ----------------------------------------------------------------------------

/// Writes a minidump of the running process to `fd` (a regular file, from its current
/// position): every thread's registers and stack, the loaded objects, the system (see the
/// [module docs](self)), for hang reports and "dump without crashing". The calling thread is
/// in it too, stopped in this function. Waits up to [`crate::threads::timeout`] for each
/// thread. (Formerly `threads::write_minidump{,_with}`.)
///
/// ```no_run
/// selftrace::init()?;
/// let file = std::fs::File::create("live.dmp").expect("create");
/// let summary = selftrace::minidump::write_to(&file, &selftrace::minidump::Options::new())?;
/// println!("{} threads", summary.threads());
/// # Ok::<(), selftrace::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidInput`] when `fd` is not seekable, appends (`O_APPEND`), or another dump
/// is being written,
/// [`Error::NotFound`] before [`crate::init`] (no module list yet), [`Error::Sys`] when a write
/// fails (`ENOSPC`, ...), [`Error::Unsupported`] on a machine
/// without minidump support (not x86-64 or aarch64).
///
/// # Async-signal safety
/// Async-signal-safe.
#[cfg(feature = "threads")]
#[cfg_attr(docsrs, doc(cfg(feature = "threads")))]
#[inline(never)]
pub fn write_to(fd: impl std::os::fd::AsFd, options: &Options) -> Result<Summary, Error> {
    use std::os::fd::AsRawFd;
    if !crate::modules::with_current(|s| s.is_some()) {
        return Err(Error::NotFound(
            "the module list: call selftrace::init() before writing a minidump",
        ));
    }
    let _ = crate::threads::install();
    let _lock = crate::report::lock::OutputLock::acquire();
    let timeout_ns = crate::threads::timeout().as_nanos().min(u64::MAX as u128) as u64;
    let result = write(fd.as_fd().as_raw_fd(), None, options, timeout_ns);
    // Not a tail call: this frame stays on the writing thread's stack in the dump.
    core::hint::black_box(&result);
    result
}

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

/// Writes the dump: the thread loop, then one call per stream, then the header.
///
/// Length (about 240 lines): the loop must stay in this function. The writing thread's own
/// registers are taken here (`own_registers!`) and describe this frame, which has to stay as
/// it is while its stack is copied below it; a helper that returned before the copy would leave
/// registers of a frame that no longer exists.
fn write_locked(
    st: &mut State,
    fd: i32,
    fault: Option<&Fault>,
    opts: &Options,
    timeout_ns: u64,
    me: i32,
) -> Result<Summary, Error> {
    let base = match sys::lseek(fd, 0, libc::SEEK_CUR) {
        Ok(base) => base,
        Err(e) if e.errno() == Some(libc::ESPIPE) => {
            return Err(Error::InvalidInput(
                "a minidump needs a seekable file, not a pipe or socket",
            ))
        }
        Err(e) => return Err(e),
    };
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
    let mut dir = Directory::new();
    let mut summary = Summary::default();
    st.annotations = Annotations::new();

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
    st.map_count = crate::procfs::load_maps(&mut st.maps, &mut st.chunk);
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
                let regs = arch::own_registers!();
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
        let len = crate::procfs::thread_name(tid, &mut name);
        rec.name = f.append_string(&name[..len], &mut st.chunk);
        st.threads[listed] = rec;
        listed += 1;
        // The tracing spans it is in: `selftrace.span.TID` = `request > handler (task 17)`
        // (three entries stay for the counts below).
        if crate::report::spans::in_span(tid) {
            let mut key = [0u8; 32];
            let mut k = FixedBuf::new(&mut key);
            k.push_bytes(b"selftrace.span.");
            k.push_dec(tid as u64);
            let klen = k.len();
            let mut value = [0u8; 256];
            let mut v = FixedBuf::new(&mut value);
            crate::report::spans::write_span_names(&mut v, tid);
            let vlen = v.len();
            if st.annotations.has_room(4) {
                st.annotations.add(&mut f, &key[..klen], &value[..vlen]);
            } else {
                st.annotations.left_out += 1;
            }
        }
    }
    summary.threads = listed;
    // Threads beyond MAX_THREADS: the dump says so itself, in Crashpad's simple annotations,
    // which minidump readers show (`minidump-stackwalk --dump`, Sentry, Socorro).
    if summary.left_out > 0 {
        st.annotations.add_dec(
            &mut f,
            b"selftrace.threads_left_out",
            summary.left_out as u64,
        );
        st.annotations
            .add_dec(&mut f, b"selftrace.threads_in_process", seen as u64);
        st.annotations
            .add_dec(&mut f, b"selftrace.max_threads", MAX_THREADS as u64);
    }
    if st.annotations.left_out > 0 {
        // Threads in spans past the dictionary's room: counted, not named.
        let spans_left_out = st.annotations.left_out as u64;
        st.annotations.left_out = 0;
        st.annotations
            .add_dec(&mut f, b"selftrace.spans_left_out", spans_left_out);
    }
    if let Some(stream) = st.annotations.stream(&mut f, &mut st.chunk) {
        dir.add(stream);
    }

    let threads = &st.threads[..listed];
    dir.add(streams::thread_list(&mut f, threads, &mut st.chunk));
    dir.add(streams::thread_names(&mut f, threads, &mut st.chunk));

    // Exception, and the code around the faulting instruction.
    let mut extra = 0usize;
    if let Some(c) = fault {
        dir.add(streams::exception(&mut f, c, &st.threads[..listed]));
        if let Some(pc) = fault_pc {
            let from = (pc as usize).saturating_sub(128);
            if let Some(region) = f.append_memory(from, 256, &mut st.chunk) {
                st.extra[extra] = region;
                extra += 1;
            }
        }
    }

    // MemoryList: the stacks and the extra regions.
    dir.add(streams::memory_list(
        &mut f,
        &st.threads[..listed],
        &st.extra[..extra],
        &mut st.chunk,
    ));

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
            let cv = o
                .build_id
                .as_deref()
                .map(|id| streams::codeview(&mut f, id))
                .unwrap_or_default();
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
    dir.add(streams::module_list(
        &mut f,
        &st.modules[..modules],
        &mut st.chunk,
    ));

    // SystemInfo and MiscInfo.
    dir.add(system_info(&mut f, &mut st.chunk));
    dir.add(misc_info(&mut f));

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
        if let Some(s) = streams::linux_file(&mut f, kind, path, &mut st.chunk) {
            dir.add(s);
        }
    }

    // Header and directory last: a dump cut short has no valid header.
    dir.finish(&mut f, sys::realtime().0 as u32);
    if f.err != 0 {
        return Err(Error::Sys {
            call: "pwrite",
            errno: f.err,
        });
    }
    summary.bytes = f.end;
    // Leave the file's position after the dump, as a write would (the dump is written either
    // way).
    let _ = sys::lseek(fd, base.saturating_add(f.end as i64), libc::SEEK_SET);
    Ok(summary)
}

/// Whether `fd` was opened with `O_APPEND` (where Linux's `pwrite` ignores the offset).
pub(crate) fn appends(fd: i32) -> bool {
    sys::status_flags(fd).is_ok_and(|flags| flags & libc::O_APPEND != 0)
}
