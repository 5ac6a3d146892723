//! Objects loaded and unloaded at run time: explicit refresh, automatic refresh by a capture in
//! normal context, and no reads of unloaded objects.

#[path = "support/clib.rs"]
mod clib;
#[path = "support/target.rs"]
mod target;

use selftrace::{capture, Regs, UnwindMode};
use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::sync::Mutex;

/// The tests here change process-wide settings (auto refresh) and load libraries: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A C library without frame pointers whose inner function puts garbage in the frame pointer
/// (rbp, x29) while it calls back, so only DWARF CFI can walk through it.
const LIB_C: &str = r#"
typedef void (*cb_t)(void *);
#if defined(__aarch64__)
/* GCC neither saves nor restores x29 for an asm clobber of it: written by hand, with its CFI. */
void lib_inner(cb_t cb, void *arg);
__asm__(
    ".text\n.globl lib_inner\n.type lib_inner, %function\n.p2align 2\nlib_inner:\n"
    ".cfi_startproc\n"
    "stp x29, x30, [sp, #-16]!\n"
    ".cfi_def_cfa_offset 16\n.cfi_offset 29, -16\n.cfi_offset 30, -8\n"
    "mov x2, x0\nmov x0, x1\nmov x29, #0x1235\nblr x2\n"
    "ldp x29, x30, [sp], #16\n"
    ".cfi_def_cfa_offset 0\n.cfi_restore 29\n.cfi_restore 30\nret\n"
    ".cfi_endproc\n.size lib_inner, .-lib_inner\n");
#else
__attribute__((noinline)) void lib_inner(cb_t cb, void *arg) {
#if defined(__x86_64__)
    __asm__ volatile("mov $0x1235, %%rbp" ::: "rbp");
#endif
    cb(arg);
    __asm__ volatile("" ::: "memory");
}
#endif
__attribute__((noinline)) void lib_outer(cb_t cb, void *arg) {
    lib_inner(cb, arg);
    __asm__ volatile("" ::: "memory");
}
"#;

fn build_lib(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    clib::build_shared(&dir, name, LIB_C, &["-O2", "-fomit-frame-pointer"])
}

struct Lib {
    handle: *mut c_void,
    outer: extern "C" fn(extern "C" fn(*mut c_void), *mut c_void),
}

fn open(path: &std::path::Path) -> Lib {
    let handle = clib::dlopen(path, libc::RTLD_NOW | libc::RTLD_LOCAL);
    // SAFETY: dlsym with a valid C string; the symbol has the declared C signature.
    unsafe {
        let f = libc::dlsym(handle, c"lib_outer".as_ptr());
        assert!(!f.is_null());
        Lib {
            handle,
            outer: std::mem::transmute::<
                *mut c_void,
                extern "C" fn(extern "C" fn(*mut c_void), *mut c_void),
            >(f),
        }
    }
}

/// The exported name at `addr` (dladdr sees .dynsym, which the C library exports).
fn dyn_name(addr: usize) -> String {
    // SAFETY: dladdr only reads loader data; info is valid for writes.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr as *const c_void, &mut info) == 0 || info.dli_sname.is_null() {
            return "?".into();
        }
        CStr::from_ptr(info.dli_sname)
            .to_string_lossy()
            .into_owned()
    }
}

extern "C" fn record(arg: *mut c_void) {
    // SAFETY: the tests pass a pointer to a live Vec<usize>.
    let out = unsafe { &mut *(arg as *mut Vec<usize>) };
    let mut buf = [0usize; 128];
    let n = capture(&mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// Calls into the library, which calls back `record`; returns the frames and whether the
/// caller (`through`) was found above the library's frames.
#[inline(never)]
fn through(lib: &Lib) -> (Vec<usize>, bool) {
    let mut frames: Vec<usize> = Vec::new();
    (lib.outer)(record, &mut frames as *mut Vec<usize> as *mut c_void);
    let names: Vec<String> = frames.iter().map(|&a| dyn_name(a - 1)).collect();
    let inner = names.iter().position(|n| n == "lib_inner");
    let found_caller = match inner {
        Some(i) => {
            // lib_inner, lib_outer, then back in this test binary: `through` itself.
            let here = through as *const () as usize;
            names.get(i + 1).map(String::as_str) == Some("lib_outer")
                && frames
                    .get(i + 2)
                    .is_some_and(|&ra| ra > here && ra < here + 4096)
        }
        None => false,
    };
    std::hint::black_box(&frames);
    (frames, found_caller)
}

#[test]
fn explicit_refresh_picks_up_a_dlopened_object() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    selftrace::init().unwrap();
    selftrace::set_auto_refresh(false);
    let lib = open(&build_lib("libselftrace_explicit.so"));
    let (frames, ok) = through(&lib);
    assert!(
        !ok,
        "without a refresh the walk cannot know the new object: {frames:x?}"
    );
    selftrace::refresh();
    let (frames, ok) = through(&lib);
    assert!(
        ok,
        "after refresh() the walk goes through the library: {frames:x?}"
    );
    selftrace::set_auto_refresh(true);
}

#[test]
fn a_normal_context_capture_refreshes_by_itself() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    selftrace::init().unwrap();
    selftrace::set_auto_refresh(true);
    let lib = open(&build_lib("libselftrace_auto.so"));
    let (frames, ok) = through(&lib);
    assert!(
        ok,
        "the first capture after dlopen walks through the library: {frames:x?}"
    );
}

#[test]
fn unloaded_objects_are_never_read() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    selftrace::init().unwrap();
    let lib = open(&build_lib("libselftrace_closed.so"));
    selftrace::refresh();
    let (frames, ok) = through(&lib);
    assert!(ok);
    let inner_pc = frames[1];
    // Unload it: the published snapshot still lists it, its memory is gone.
    // SAFETY: nothing of the library is used after this.
    assert_eq!(unsafe { libc::dlclose(lib.handle) }, 0);
    selftrace::set_auto_refresh(false);
    let stack = vec![0usize; 64];
    let sp = stack.as_ptr() as usize;
    let mut buf = [0usize; 16];
    for mode in [UnwindMode::Dwarf, UnwindMode::FramePointer] {
        let n = selftrace::Capture::new()
            .mode(mode)
            .walk_regs(Regs::new(inner_pc, sp, 0), &mut buf)
            .frames;
        assert!(n >= 1 && buf[0] == inner_pc);
    }
    // And a normal capture still works.
    let n = capture(&mut buf);
    assert!(n > 1);
    selftrace::set_auto_refresh(true);
    selftrace::refresh();
}

/// A library whose functions are named after `n`: `entry_<n>` (exported) calls `local_<n>`
/// (static), which calls back. For one-digit `n` every such library has the same layout, so the
/// kernel maps the next one where the last one was unloaded.
fn numbered_source(n: usize) -> String {
    format!(
        r#"
typedef void (*cb_t)(void *);
__attribute__((noinline)) static void local_{n}(cb_t cb, void *arg) {{
    cb(arg);
    __asm__ volatile("" ::: "memory");
}}
__attribute__((noinline)) void entry_{n}(cb_t cb, void *arg) {{
    local_{n}(cb, arg);
    __asm__ volatile("" ::: "memory");
}}
"#
    )
}

/// A numbered library, built once, and its functions from its own symbol table.
struct Numbered {
    n: usize,
    path: PathBuf,
    /// (link-time start, size, name) of every function of the file's `.symtab`.
    funcs: Vec<(u64, u64, String)>,
}

impl Numbered {
    fn build(n: usize) -> Numbered {
        use object::{Object as _, ObjectSymbol as _};
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let name = format!("libselftrace_reload_{n}.so");
        let path = clib::build_shared(
            &dir,
            &name,
            &numbered_source(n),
            &["-O1", "-g", "-fno-omit-frame-pointer"],
        );
        let data = std::fs::read(&path).expect("read the library");
        let file = object::File::parse(&*data).expect("parse the library");
        let funcs = file
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
            .collect();
        Numbered { n, path, funcs }
    }

    /// The function of this library at run-time address `addr`, by the file's own symbol table
    /// and the load address `dladdr` gives; `None` if `addr` is not in this library now.
    fn truth(&self, addr: usize) -> Option<&str> {
        // SAFETY: dladdr only reads loader data; info is valid for writes.
        let info = unsafe {
            let mut info: libc::Dl_info = std::mem::zeroed();
            if libc::dladdr(addr as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
                return None;
            }
            info
        };
        // SAFETY: dli_fname is a NUL-terminated string of the loader's.
        let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
        if file != self.path.to_string_lossy() {
            return None;
        }
        let svma = (addr - info.dli_fbase as usize) as u64;
        self.funcs
            .iter()
            .find(|(start, size, _)| *start <= svma && svma < start + size)
            .map(|(_, _, name)| name.as_str())
    }
}

/// Wrong and unmarked names seen by [`check_names`].
#[derive(Default, Debug)]
struct NameCounts {
    /// Frames in the library checked (per entry point).
    checked: usize,
    /// Named after something else than the library's own symbol table says.
    wrong: usize,
    /// Left unnamed or marked unknown.
    unknown: usize,
    /// The first few wrong names, for the failure message.
    examples: Vec<String>,
}

impl NameCounts {
    fn wrong(&mut self, what: String) {
        self.wrong += 1;
        if self.examples.len() < 8 {
            self.examples.push(what);
        }
    }
}

/// Checks the names `symbolize`, `backtrace_symbols` and `Backtrace` give the frames of `lib`
/// on this thread's stack (called from inside the library, which stays loaded meanwhile).
fn check_names(lib: &Numbered, counts: &mut NameCounts) {
    let mut buf = [0usize; 64];
    let n = capture(&mut buf);
    let frames = &buf[..n];
    let path = lib.path.to_string_lossy().into_owned();
    let others = |text: &str| {
        (1..=9).filter(|&m| m != lib.n).any(|m| {
            ["entry_", "local_", "libselftrace_reload_"]
                .iter()
                .any(|f| text.contains(&format!("{f}{m}")))
        })
    };
    // symbolize, at the return address - 1 (the call).
    for &a in frames.iter().skip(1) {
        let Some(truth) = lib.truth(a - 1) else {
            continue;
        };
        counts.checked += 1;
        match selftrace::symbolize(a - 1) {
            Some(s) if s.name.is_none() => counts.unknown += 1,
            Some(s) if s.name_string().as_deref() == Some(truth) && s.path == path => {}
            s => counts.wrong(format!(
                "symbolize({:#x}) = {:?} in {:?}, not {truth} in {path}",
                a - 1,
                s.and_then(|s| s.name_string()),
                s.map(|s| s.path)
            )),
        }
    }
    // backtrace_symbols, at the addresses as given (as glibc does).
    let lines = selftrace::backtrace_symbols(frames);
    for (&a, line) in frames.iter().zip(&lines) {
        let Some(truth) = lib.truth(a) else { continue };
        counts.checked += 1;
        if line.starts_with(&format!("{path}({truth}+")) {
        } else if line.starts_with("??") || line.starts_with('[') {
            counts.unknown += 1;
        } else {
            counts.wrong(format!(
                "backtrace_symbols: {line:?}, not {truth} in {path}"
            ));
        }
    }
    // Backtrace: names, object and file:line, and its Display.
    let bt = selftrace::Backtrace::capture();
    for f in bt.frames() {
        let Some(truth) = lib.truth(f.kind.lookup_address(f.addr)) else {
            continue;
        };
        counts.checked += 1;
        let file_ok = f
            .symbols()
            .last()
            .and_then(|s| s.file)
            .is_none_or(|file| file.ends_with(&format!("libselftrace_reload_{}.so.c", lib.n)));
        match f.name() {
            None => counts.unknown += 1,
            Some(name) if name == truth && f.object == Some(path.as_str()) && file_ok => {}
            Some(name) => counts.wrong(format!(
                "Backtrace frame {:#x}: {name} in {:?} at {:?}, not {truth} in {path}",
                f.addr,
                f.object,
                f.symbols().last().and_then(|s| s.file)
            )),
        }
    }
    let shown = format!("{bt}");
    if others(&shown) {
        counts.wrong(format!(
            "Backtrace's Display names another library:\n{shown}"
        ));
    }
    if lines.iter().any(|l| others(l)) {
        counts.wrong(format!(
            "backtrace_symbols names another library: {lines:#?}"
        ));
    }
}

/// What `numbered_callback` needs: the library it runs in and where to count.
struct Probe<'a> {
    lib: &'a Numbered,
    counts: &'a mut NameCounts,
}

extern "C" fn numbered_callback(arg: *mut c_void) {
    // SAFETY: the callers pass a live Probe.
    let p = unsafe { &mut *(arg as *mut Probe<'_>) };
    check_names(p.lib, p.counts);
}

/// dlopen of `lib`, its `entry_<n>`, and the start of its lowest mapping.
fn open_numbered(
    lib: &Numbered,
) -> (
    *mut c_void,
    extern "C" fn(extern "C" fn(*mut c_void), *mut c_void),
    usize,
) {
    let handle = clib::dlopen(&lib.path, libc::RTLD_NOW | libc::RTLD_LOCAL);
    let sym = std::ffi::CString::new(format!("entry_{}", lib.n)).unwrap();
    // SAFETY: dlsym with a valid C string; the symbol has the declared C signature; dladdr
    // only reads loader data.
    unsafe {
        let f = libc::dlsym(handle, sym.as_ptr());
        assert!(!f.is_null());
        let mut info: libc::Dl_info = std::mem::zeroed();
        assert_ne!(libc::dladdr(f, &mut info), 0);
        let entry = std::mem::transmute::<
            *mut c_void,
            extern "C" fn(extern "C" fn(*mut c_void), *mut c_void),
        >(f);
        (handle, entry, info.dli_fbase as usize)
    }
}

#[test]
fn different_libraries_at_a_reused_address_are_never_named_after_the_old_one() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    selftrace::init().unwrap();
    selftrace::set_auto_refresh(true);
    let libs: Vec<Numbered> = (1..=6).map(Numbered::build).collect();
    // Which library was last loaded at each base address: a load where another one was is a
    // reuse.
    let bases: Mutex<std::collections::HashMap<usize, usize>> = Mutex::new(Default::default());
    let reused = std::sync::atomic::AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Per loader thread (fewer under qemu-user, where each takes ten times as long).
    let iterations: usize = if target::under_qemu() { 30 } else { 100 };
    let start = std::time::Instant::now();
    let totals = std::thread::scope(|s| {
        // Other threads capture and symbolize their own stacks meanwhile (and refresh).
        let busy: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut rounds = 0usize;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let mut buf = [0usize; 64];
                        let n = capture(&mut buf);
                        for &a in &buf[1..n] {
                            std::hint::black_box(selftrace::symbolize(a - 1));
                        }
                        std::hint::black_box(selftrace::backtrace_symbols(&buf[..n]));
                        std::hint::black_box(format!("{}", selftrace::Backtrace::capture()));
                        rounds += 1;
                    }
                    rounds
                })
            })
            .collect();
        // Two threads load, call into, check and unload their own three libraries in turn.
        let loaders: Vec<_> = libs
            .chunks(3)
            .map(|mine| {
                let (bases, reused) = (&bases, &reused);
                s.spawn(move || {
                    let mut counts = NameCounts::default();
                    for i in 0..iterations {
                        let lib = &mine[i % mine.len()];
                        let (handle, entry, base) = open_numbered(lib);
                        let before = bases.lock().unwrap().insert(base, lib.n);
                        if before.is_some_and(|m| m != lib.n) {
                            reused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        let mut probe = Probe {
                            lib,
                            counts: &mut counts,
                        };
                        entry(
                            numbered_callback,
                            &mut probe as *mut Probe<'_> as *mut c_void,
                        );
                        // SAFETY: nothing of the library is used after this.
                        assert_eq!(unsafe { libc::dlclose(handle) }, 0);
                    }
                    counts
                })
            })
            .collect();
        let counts: Vec<NameCounts> = loaders.into_iter().map(|t| t.join().unwrap()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let rounds: usize = busy.into_iter().map(|t| t.join().unwrap()).sum();
        (counts, rounds)
    });
    let (counts, rounds) = totals;
    let checked: usize = counts.iter().map(|c| c.checked).sum();
    let wrong: usize = counts.iter().map(|c| c.wrong).sum();
    let unknown: usize = counts.iter().map(|c| c.unknown).sum();
    let reused = reused.into_inner();
    let examples: Vec<&String> = counts.iter().flat_map(|c| &c.examples).collect();
    println!(
        "{} loads, {reused} at an address another library had; {checked} names checked: \
         {wrong} wrong, {unknown} unknown; {rounds} rounds of the other threads; {:.2?}",
        2 * iterations,
        start.elapsed()
    );
    assert!(
        checked >= 2 * iterations,
        "the library frames were not found"
    );
    assert_eq!(wrong, 0, "named after another library: {examples:#?}");
    // In normal context a changed object is refreshed, never left unknown.
    assert_eq!(unknown, 0);
    if !target::under_qemu() {
        assert!(reused > 0, "no address was reused: the test proves nothing");
    }
}

/// The address the signal handler of the test below names, and what it wrote.
static HANDLER_ADDR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static HANDLER_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
/// Whether `symbolize` in the handler named the address (0 not run, 1 unnamed, 2 named).
static HANDLER_NAMED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

extern "C" fn reload_handler(_sig: i32) {
    use std::sync::atomic::Ordering::SeqCst;
    let addr = HANDLER_ADDR.load(SeqCst);
    // SAFETY: the fd is the write end of the test's pipe, open while the signal is raised.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(HANDLER_FD.load(SeqCst)) };
    let named = selftrace::symbolize(addr).is_some_and(|s| s.name.is_some());
    HANDLER_NAMED.store(if named { 2 } else { 1 }, SeqCst);
    selftrace::backtrace_symbols_fd(&[addr], fd);
    let mut line = [0u8; 256];
    let n = selftrace::symbolize::write_kernel_frame(
        &mut line,
        addr,
        selftrace::symbolize::FrameKind::Exact,
        Default::default(),
    );
    line[n.min(255)] = b'\n';
    // SAFETY: writes n + 1 initialised bytes of `line` to the pipe.
    unsafe { libc::write(HANDLER_FD.load(SeqCst), line.as_ptr().cast(), n + 1) };
}

#[test]
fn a_handler_never_names_a_reloaded_address_after_the_old_library() {
    use std::io::Read as _;
    use std::sync::atomic::Ordering::SeqCst;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    selftrace::init().unwrap();
    let (old, new) = (Numbered::build(7), Numbered::build(8));
    // Load the old library, make the snapshot know it, unload it and load the new one where it
    // was (the kernel reuses the hole; tried a few times, as another test's thread may map).
    let mut found = None;
    for _ in 0..20 {
        let (h_old, _, base_old) = open_numbered(&old);
        selftrace::refresh();
        // SAFETY: nothing of the library is used after this.
        assert_eq!(unsafe { libc::dlclose(h_old) }, 0);
        let (h_new, entry, base_new) = open_numbered(&new);
        if base_new == base_old {
            found = Some((h_new, entry));
            break;
        }
        // SAFETY: as above.
        assert_eq!(unsafe { libc::dlclose(h_new) }, 0);
    }
    let Some((h_new, entry)) = found else {
        eprintln!("skipped: the new library never came at the old one's address");
        return;
    };
    // Inside entry_8, where entry_7 was.
    let addr = entry as usize + 1;
    assert_eq!(new.truth(addr), Some("entry_8"));
    let mut fds = [0i32; 2];
    // SAFETY: fds is valid for two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    HANDLER_ADDR.store(addr, SeqCst);
    HANDLER_FD.store(fds[1], SeqCst);
    // SAFETY: installing a plain handler for SIGUSR2 and raising it on this thread; the
    // previous action is put back.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = reload_handler as *const () as usize;
        let mut prev: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, &mut prev), 0);
        assert_eq!(libc::raise(libc::SIGUSR2), 0);
        assert_eq!(
            libc::sigaction(libc::SIGUSR2, &prev, std::ptr::null_mut()),
            0
        );
        libc::close(fds[1]);
    }
    let mut out = String::new();
    // SAFETY: fds[0] is the pipe's read end, owned here from now on.
    let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    reader.read_to_string(&mut out).unwrap();
    println!("in the handler:\n{out}");
    assert!(
        !out.contains("entry_7") && !out.contains("libselftrace_reload_7"),
        "named after the unloaded library:\n{out}"
    );
    assert_eq!(HANDLER_NAMED.load(SeqCst), 1, "symbolize named it:\n{out}");
    assert!(
        out.contains("object changed since snapshot"),
        "not marked:\n{out}"
    );
    // Back in normal context, the lookups refresh and name the new library.
    let s = selftrace::symbolize(addr).expect("an object");
    assert_eq!(s.name_string().as_deref(), Some("entry_8"), "{s:?}");
    let line = &selftrace::backtrace_symbols(&[addr])[0];
    assert!(line.contains("entry_8+0x1"), "{line}");
    // SAFETY: nothing of the library is used after this.
    assert_eq!(unsafe { libc::dlclose(h_new) }, 0);
}
