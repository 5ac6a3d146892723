//! The only place for raw libc calls. Every wrapper here is async-signal-safe unless its docs say
//! otherwise.
//!
//! Over 600 lines because each of its many small wrappers is its own unit (a libc call, its
//! `EINTR` loop and its `Error::Sys`); the themed groups live in the submodules.
#![allow(unsafe_code)]
// Some wrappers serve only some features (crash reports, markers).
#![allow(dead_code)]

use crate::error::Error;

mod arch;
mod file;
mod memory;
mod process;
pub(crate) mod signal;
pub(crate) mod stack;
pub(crate) use arch::call_on_stack;
pub(crate) use file::*;
pub(crate) use memory::*;
pub(crate) use process::*;

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Gives up ownership of `fd` without closing it and returns its number: for an fd a signal
/// handler writes to from now on, which must stay open for the rest of the process.
pub(crate) fn keep_open(fd: impl std::os::fd::AsRawFd) -> i32 {
    let raw = fd.as_raw_fd();
    core::mem::forget(fd);
    raw
}

/// `write(2)` of the whole buffer, retrying on `EINTR` and on short writes. Fails with
/// [`Error::Sys`] `write` (`EIO` when `write` returned 0).
///
/// # References
/// write(2)
pub(crate) fn write_all(fd: i32, mut buf: &[u8]) -> Result<(), Error> {
    while !buf.is_empty() {
        // SAFETY: buf is a valid readable slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(Error::Sys {
                call: "write",
                errno: e,
            });
        }
        if n == 0 {
            return Err(Error::Sys {
                call: "write",
                errno: libc::EIO,
            });
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// `gettid(2)`: the calling thread's id.
pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Returns the free memory at the top of the heap and in whole free pages inside it to the
/// system (glibc's `malloc_trim(0)`; nothing elsewhere). Normal context only: it takes the
/// allocator's locks.
pub(crate) fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it is called outside any signal handler.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// This thread's pointer (the TLS ABI's thread pointer: `%fs:0` on x86-64, `tpidr_el0` on
/// aarch64): unique among the live threads of the process; 0 where it is not known.
/// Async-signal-safe: one register or memory read.
#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    arch::thread_pointer()
}

/// `membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)`: lets this process use
/// [`membarrier_private`]. Whether it succeeded (not on kernels before 4.14, nor where a
/// sandbox or an emulator refuses the call).
pub(crate) fn membarrier_register() -> bool {
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
        ) == 0
    }
}

/// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: every running thread of this process executes
/// a full memory barrier before the call returns (a thread not running passes through one
/// when it is scheduled). Whether it succeeded (it needs [`membarrier_register`] first).
pub(crate) fn membarrier_private() -> bool {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    // SAFETY: as in `membarrier_register`.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0 }
}

/// The system page size, read once by the load-time constructor (4096 until then).
pub(crate) fn page_size() -> usize {
    PAGE_SIZE.load(core::sync::atomic::Ordering::Relaxed)
}

static PAGE_SIZE: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(4096);

/// `struct dl_find_object` of glibc 2.35 (`<dlfcn.h>`).
#[repr(C)]
pub(crate) struct DlFindObject {
    pub flags: u64,
    pub map_start: *mut libc::c_void,
    pub map_end: *mut libc::c_void,
    pub link_map: *mut libc::c_void,
    pub eh_frame: *mut libc::c_void,
    reserved: [u64; 7],
}

type DlFindObjectFn = unsafe extern "C" fn(*mut libc::c_void, *mut DlFindObject) -> libc::c_int;

/// `_dl_find_object`, resolved with `dlsym` by the load-time constructor (null if glibc lacks it).
static DL_FIND_OBJECT: core::sync::atomic::AtomicPtr<libc::c_void> =
    core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());

/// What `_dl_find_object` says of an address: the containing object's mapping and unwind data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FoundObject {
    /// Start of the object's mapping.
    pub map_start: usize,
    /// End of the object's mapping.
    pub map_end: usize,
    /// The object's `PT_GNU_EH_FRAME` segment in memory (0 if none).
    pub eh_frame_hdr: usize,
    /// The object's `struct link_map` (`<link.h>`: `l_addr`, then `l_name`); memory of the
    /// loader's that a concurrent `dlclose` frees: read it only with [`read_memory`].
    pub link_map: usize,
}

/// `_dl_find_object(3)`: the loaded object containing `addr`. Lock-free and async-signal-safe.
/// Returns `Err(())` when glibc lacks the function (before 2.35, musl), `Ok(None)` when no
/// object contains `addr`.
///
/// # References
/// _dl_find_object(3)
pub(crate) fn dl_find_object(addr: usize) -> Result<Option<FoundObject>, ()> {
    let f = DL_FIND_OBJECT.load(core::sync::atomic::Ordering::Acquire);
    if f.is_null() {
        return Err(());
    }
    // SAFETY: f was produced by dlsym("_dl_find_object") and has this signature (glibc 2.35).
    let f: DlFindObjectFn = unsafe { core::mem::transmute::<*mut libc::c_void, DlFindObjectFn>(f) };
    // SAFETY: DlFindObject is plain old data; all-zero is a valid value.
    let mut out: DlFindObject = unsafe { core::mem::zeroed() };
    // SAFETY: out is a valid, writable struct of the layout glibc expects.
    let rc = unsafe { f(addr as *mut libc::c_void, &mut out) };
    if rc != 0 {
        return Ok(None);
    }
    Ok(Some(FoundObject {
        map_start: out.map_start as usize,
        map_end: out.map_end as usize,
        eh_frame_hdr: out.eh_frame as usize,
        link_map: out.link_map as usize,
    }))
}

/// Runs once when the object containing selftrace is loaded, before `main`: resolves
/// `_dl_find_object` and the page size, so that capture works (and stays async-signal-safe)
/// even before `selftrace::init()`.
extern "C" fn load_time_init() {
    // SAFETY: sysconf has no preconditions.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if ps > 0 && (ps as usize).is_power_of_two() {
        PAGE_SIZE.store(ps as usize, core::sync::atomic::Ordering::Relaxed);
    }
    // SAFETY: the name is a NUL-terminated C string; RTLD_DEFAULT searches the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
    DL_FIND_OBJECT.store(f, core::sync::atomic::Ordering::Release);
    record_startup_objects();
}

#[used]
#[link_section = ".init_array"]
static LOAD_TIME_INIT: extern "C" fn() = load_time_init;

/// The calling thread's stack bounds `(low, high)` from `pthread_getattr_np(3)`.
///
/// Not async-signal-safe (glibc allocates and locks in it): call in normal context only.
pub(crate) fn current_thread_stack() -> Option<(usize, usize)> {
    // SAFETY: attr is initialised by pthread_getattr_np before use and destroyed after.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 || addr.is_null() {
            return None;
        }
        Some((addr as usize, addr as usize + size))
    }
}

/// An ELF program header of this machine's class.
#[cfg(target_pointer_width = "64")]
pub(crate) type Phdr = libc::Elf64_Phdr;
/// An ELF program header of this machine's class.
#[cfg(target_pointer_width = "32")]
pub(crate) type Phdr = libc::Elf32_Phdr;

/// What `dl_iterate_phdr` reports of one object.
pub(crate) struct PhdrInfo<'a> {
    /// Load bias (`dlpi_addr`).
    pub addr: usize,
    /// Path (`dlpi_name`); empty for the main program.
    pub name: &'a std::ffi::CStr,
    /// Program headers.
    pub phdrs: &'a [Phdr],
    /// The first object reported (the main program).
    pub is_first: bool,
}

/// `dl_iterate_phdr(3)`: calls `f` for every loaded object; returns glibc's load and unload
/// counters (`dlpi_adds`, `dlpi_subs`).
///
/// Not async-signal-safe: it takes the loader's lock.
pub(crate) fn dl_iterate_phdr(mut f: impl FnMut(&PhdrInfo<'_>)) -> (u64, u64) {
    struct Ctx<'f> {
        f: &'f mut dyn FnMut(&PhdrInfo<'_>),
        first: bool,
        counters: (u64, u64),
    }
    unsafe extern "C" fn callback(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: data is the &mut Ctx passed below; info is valid for the callback's duration.
        let (ctx, info) = unsafe { (&mut *(data as *mut Ctx<'_>), &*info) };
        let phdrs = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: the loader provides dlpi_phnum headers at dlpi_phdr.
            unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
        };
        let name = if info.dlpi_name.is_null() {
            c""
        } else {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
            unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
        };
        if size >= core::mem::size_of::<libc::dl_phdr_info>() {
            ctx.counters = (info.dlpi_adds, info.dlpi_subs);
        }
        let first = core::mem::replace(&mut ctx.first, false);
        (ctx.f)(&PhdrInfo {
            addr: info.dlpi_addr as usize,
            name,
            phdrs,
            is_first: first,
        });
        0
    }
    let mut ctx = Ctx {
        f: &mut f,
        first: true,
        counters: (0, 0),
    };
    // SAFETY: callback matches the expected signature and only uses ctx during the call.
    unsafe { libc::dl_iterate_phdr(Some(callback), (&mut ctx as *mut Ctx<'_>).cast()) };
    ctx.counters
}

/// glibc's counters of objects loaded and unloaded so far (`dlpi_adds`, `dlpi_subs`): they
/// move whenever the set of loaded objects changes, which is how a normal-context caller tells
/// cheaply that a snapshot is stale.
///
/// Stops at the first object (every object reports the same counters): the cost is the
/// loader's lock and one callback, about 20 ns when nobody else holds the lock.
///
/// Not async-signal-safe: it takes the loader's lock.
pub(crate) fn dl_load_counters() -> (u64, u64) {
    unsafe extern "C" fn callback(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        if size >= core::mem::size_of::<libc::dl_phdr_info>() {
            // SAFETY: data is the &mut (u64, u64) passed below; info is valid for the
            // callback's duration and, by `size`, has the counters.
            unsafe { *(data as *mut (u64, u64)) = ((*info).dlpi_adds, (*info).dlpi_subs) };
        }
        // Non-zero: stop the iteration here.
        1
    }
    let mut counters = (0u64, 0u64);
    // SAFETY: callback matches the expected signature and only uses `counters` during the call.
    unsafe { libc::dl_iterate_phdr(Some(callback), (&mut counters as *mut (u64, u64)).cast()) };
    counters
}

/// Start of the vDSO (`getauxval(AT_SYSINFO_EHDR)`), 0 if there is none.
pub(crate) fn vdso_base() -> usize {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) as usize }
}

/// Maps `size` bytes of stack with a guard page below; returns the high end (16-aligned), or
/// [`Error::Sys`] `mmap`. Not async-signal-safe in spirit (call at init).
pub(crate) fn map_stack(size: usize) -> Result<usize, Error> {
    let ps = page_size();
    let size = (size + ps - 1) & !(ps - 1);
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            size + ps,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::last_os("mmap"));
    }
    // SAFETY: the lowest page of the mapping we just made becomes the guard page.
    unsafe { libc::mprotect(p, ps, libc::PROT_NONE) };
    Ok(p as usize + ps + size)
}

/// The distinct `sa_restorer`s (signal-return trampolines) of the handlers installed now, for
/// signals 1 to 64; returns how many were written into `out`.
///
/// # References
/// sigaction(2)
///
/// # Async-signal safety
/// Async-signal-safe (one `rt_sigaction` query per signal).
pub(crate) fn signal_restorers(out: &mut [usize]) -> usize {
    let mut n = 0;
    for sig in 1..=64 {
        // SAFETY: all-zero is a valid sigaction; we only query (act = NULL).
        let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
        // SAFETY: old is valid for writes; a null new action only reads the current one.
        if unsafe { libc::sigaction(sig, core::ptr::null(), &mut old) } != 0 {
            continue;
        }
        let Some(r) = old.sa_restorer.map(|f| f as usize) else {
            continue;
        };
        if old.sa_sigaction == libc::SIG_DFL || old.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        if !out[..n].contains(&r) && n < out.len() {
            out[n] = r;
            n += 1;
        }
    }
    n
}

/// `gnu_get_libc_version(3)`: glibc's version as `(major, minor)`, `None` if unknown.
pub(crate) fn glibc_version() -> Option<(u32, u32)> {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) };
    let v = v.to_str().ok()?;
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()?;
    Some((major, minor))
}

extern "C" {
    fn gnu_get_libc_version() -> *const libc::c_char;
}

/// `strnlen(3)`: the length of the NUL-terminated string at the start of `bytes` (all of
/// `bytes` if it holds no NUL). glibc's vectorised scan; async-signal-safe (glibc documents
/// `strnlen` as AS-Safe).
///
/// # References
/// strnlen(3)
pub(crate) fn strnlen(bytes: &[u8]) -> usize {
    // SAFETY: strnlen reads at most bytes.len() bytes from a valid slice.
    let n = unsafe { libc::strnlen(bytes.as_ptr().cast(), bytes.len()) };
    n.min(bytes.len())
}

/// `open(2)` of a NUL-terminated path with `O_CLOEXEC` added to `flags`, retrying on `EINTR`.
/// Returns the fd or [`Error::Sys`] `open`.
///
/// # References
/// open(2)
pub(crate) fn open_cloexec(path: &core::ffi::CStr, flags: i32) -> Result<i32, Error> {
    loop {
        // SAFETY: path is a valid NUL-terminated string that outlives the call.
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd >= 0 {
            return Ok(fd);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(Error::Sys {
                call: "open",
                errno: e,
            });
        }
    }
}

/// One `write(2)` call: no retry on short writes (a retry on a `trace_marker` fd would become a
/// second event); retries only on `EINTR`, when nothing was written. Returns the count written
/// or [`Error::Sys`] `write`.
///
/// # References
/// write(2)
#[inline]
pub(crate) fn write_once(fd: i32, buf: &[u8]) -> Result<usize, Error> {
    loop {
        // SAFETY: buf is a valid readable slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(Error::Sys {
                call: "write",
                errno: e,
            });
        }
    }
}

/// `read(2)` once, retrying on `EINTR`. Returns the count read (0 at end of file) or
/// [`Error::Sys`] `read`.
///
/// # References
/// read(2)
pub(crate) fn read(fd: i32, buf: &mut [u8]) -> Result<usize, Error> {
    loop {
        // SAFETY: buf is a valid writable slice for its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(Error::Sys {
                call: "read",
                errno: e,
            });
        }
    }
}

/// `close(2)`; the result is ignored (the fd is gone either way on Linux).
///
/// # References
/// close(2)
pub(crate) fn close(fd: i32) {
    // SAFETY: closing an fd has no memory-safety preconditions; the caller owns fd.
    unsafe { libc::close(fd) };
}

/// `dup3(2)` with `O_CLOEXEC`: atomically makes `newfd` refer to `oldfd`'s file. Fails with
/// [`Error::Sys`] `dup3`.
///
/// # References
/// dup3(2)
pub(crate) fn dup3_cloexec(oldfd: i32, newfd: i32) -> Result<(), Error> {
    loop {
        // SAFETY: dup3 has no memory-safety preconditions.
        let r = unsafe { libc::dup3(oldfd, newfd, libc::O_CLOEXEC) };
        if r >= 0 {
            return Ok(());
        }
        let e = errno();
        if e != libc::EINTR && e != libc::EBUSY {
            return Err(Error::Sys {
                call: "dup3",
                errno: e,
            });
        }
    }
}

/// `getpid(2)`: the process id (thread group id).
pub(crate) fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// `statfs(2)`'s `f_type` for a NUL-terminated path, or [`Error::Sys`] `statfs`.
///
/// # References
/// statfs(2)
pub(crate) fn statfs_type(path: &core::ffi::CStr) -> Result<i64, Error> {
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st is a valid out-pointer.
    let r = unsafe { libc::statfs(path.as_ptr(), &mut st) };
    if r == 0 {
        Ok(st.f_type as i64)
    } else {
        Err(Error::last_os("statfs"))
    }
}

/// `fstatfs(2)`'s `f_type` for an open fd, or [`Error::Sys`] `fstatfs`.
///
/// # References
/// fstatfs(2)
///
/// # Async-signal safety
/// Async-signal-safe (one syscall).
pub(crate) fn fstatfs_type(fd: i32) -> Result<i64, Error> {
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: st is a valid out-pointer; a bad fd gives EBADF.
    let r = unsafe { libc::fstatfs(fd, &mut st) };
    if r == 0 {
        Ok(st.f_type as i64)
    } else {
        Err(Error::last_os("fstatfs"))
    }
}

/// `pthread_atfork(3)`; fails with [`Error::Sys`] `pthread_atfork`.
///
/// Not async-signal-safe (glibc allocates its handler list): call in normal context.
pub(crate) fn atfork(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) -> Result<(), Error> {
    // SAFETY: the handlers are plain extern "C" fns valid for the program's lifetime.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r == 0 {
        Ok(())
    } else {
        Err(Error::Sys {
            call: "pthread_atfork",
            errno: r,
        })
    }
}

/// `pthread_atfork(3)` with only a child handler; fails with [`Error::Sys`] `pthread_atfork`.
///
/// Not async-signal-safe (glibc allocates its handler list): call in normal context.
pub(crate) fn atfork_child(child: unsafe extern "C" fn()) -> Result<(), Error> {
    // SAFETY: the handler is a plain extern "C" fn valid for the program's lifetime.
    let r = unsafe { libc::pthread_atfork(None, None, Some(child)) };
    if r == 0 {
        Ok(())
    } else {
        Err(Error::Sys {
            call: "pthread_atfork",
            errno: r,
        })
    }
}

/// `getenv(3)` as raw bytes, without allocation or lock (unlike `std::env::var_os`).
///
/// Reading the environment races with a concurrent `setenv`; call it when no other thread
/// changes the environment (at start-up).
pub(crate) fn getenv(name: &core::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: name is NUL-terminated; getenv returns NULL or a pointer into the environment,
    // which lives as long as nobody replaces that variable (documented above).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: p is a valid NUL-terminated string from the environment.
        Some(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes())
    }
}

// Threads: tgkill, /proc/self/task, futex, clocks, signal actions.
mod task;
pub(crate) use task::*;

// POSIX timers signalling one thread (the profiler's: compiled with it).
#[cfg(feature = "profile")]
mod timer;
#[cfg(feature = "profile")]
pub(crate) use timer::*;
