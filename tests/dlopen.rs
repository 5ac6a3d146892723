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
