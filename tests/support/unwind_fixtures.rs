//! Fixtures shared by tests/unwind_diff.rs and tests/unwind_gdb.rs: real code whose unwind
//! rules need more than rsp/rbp + offset, C built at test time, and the skip rule.
//!
//! - `big_frame`: a Rust function with a 256 KiB frame; LLVM emits an inline stack-probe loop
//!   whose CFA is `r11 + N` while it runs.
//! - the omit-frame-pointer library: C built `-O2 -fomit-frame-pointer` that keeps garbage in
//!   rbp while it works (only CFI walks through it).
//! - the lazy-binding pair: `liblazy_a.so` (`-z lazy`) calls, through its PLT, GNU IFUNCs in
//!   `liblazy_b.so` whose resolvers call a hook: the first call of each runs the resolver from
//!   ld.so's `_dl_fixup` under `_dl_runtime_resolve_xsavec` (CFA based on rbx).

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

/// Whether CI demands every facility (`SELFTRACE_REQUIRE_TRACEFS=1`).
pub fn required() -> bool {
    std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_some_and(|v| v == "1")
}

/// Says why `test` skips, or fails under `SELFTRACE_REQUIRE_TRACEFS=1`.
pub fn skip(test: &str, why: &str) {
    if required() {
        panic!("{test}: {why} (SELFTRACE_REQUIRE_TRACEFS=1, so this fails instead of skipping)");
    }
    eprintln!("{test}: skipped: {why}");
}

/// Size of `big_frame`'s array: 64 pages, so the prologue probes each page in a loop of 64
/// rounds, which outweighs the rest of the call in every build profile (in a debug build the
/// body's `write_volatile`, `black_box` and `read_volatile` are calls of their own).
pub const BIG_FRAME_BYTES: usize = 256 * 1024;

/// A frame larger than a page: the prologue is LLVM's stack-probe loop (CFA = r11 + N inside).
/// The array stays uninitialized so that the probe loop is most of the work.
#[inline(never)]
pub fn big_frame(x: u64) -> u64 {
    let mut a = MaybeUninit::<[u8; BIG_FRAME_BYTES]>::uninit();
    let p = a.as_mut_ptr().cast::<u64>();
    // SAFETY: p points to the start of a live 256 KiB local array, aligned for u64.
    unsafe { p.write_volatile(x) };
    std::hint::black_box(p);
    // SAFETY: as above; the word was written just before.
    unsafe { p.read_volatile() }.wrapping_add(1)
}

/// A C library without frame pointers: `c_outer -> c_middle -> c_work`, and `c_work` loads a
/// garbage value into the frame pointer (rbp, x29) and keeps 13 accumulators live (it is a
/// general register there).
pub const OMIT_FP_C: &str = r#"
__attribute__((noinline)) unsigned long c_work(const unsigned char *p, unsigned long n,
                                               unsigned long seed) {
    unsigned long a = seed, b = seed * 3, c = seed * 5, d = seed * 7, e = seed * 11,
                  f = seed * 13, g = seed * 17, h = seed * 19, i = seed * 23, j = seed * 29,
                  k = seed * 31, l = seed * 37, m = seed * 41;
#if defined(__x86_64__)
    __asm__ volatile("mov %0, %%rbp" :: "r"(seed ^ 0x5a5a5a5a5a5a5a5aUL) : "rbp");
#elif defined(__aarch64__)
    __asm__ volatile("mov x29, %0" :: "r"(seed ^ 0x5a5a5a5a5a5a5a5aUL) : "x29");
#endif
    for (unsigned long x = 0; x < n; x++) {
        unsigned long v = p[x];
        a += v ^ m; b ^= a + v; c += b >> 3; d ^= c * 5; e += d ^ v; f ^= e + 7;
        g += f >> 5; h ^= g * 3; i += h ^ v; j ^= i + 11; k += j >> 7; l ^= k * 9;
        m += l ^ v;
    }
    return a ^ b ^ c ^ d ^ e ^ f ^ g ^ h ^ i ^ j ^ k ^ l ^ m;
}
__attribute__((noinline)) unsigned long c_middle(const unsigned char *p, unsigned long n,
                                                 unsigned long seed) {
    unsigned long r = c_work(p, n, seed);
    __asm__ volatile("" ::: "memory");
    return r + 1;
}
__attribute__((noinline)) unsigned long c_outer(const unsigned char *p, unsigned long n,
                                                unsigned long seed) {
    unsigned long r = c_middle(p, n, seed * 2 + 1);
    __asm__ volatile("" ::: "memory");
    return r ^ 3;
}
"#;

/// aarch64 C built with pointer authentication (`-mbranch-protection=standard`): `pac_outer ->
/// pac_middle -> pac_work`; the two outer functions sign their return address (`paciasp`)
/// before they save it, so the words a walk reads for them carry a PAC in their top bits.
pub const PAC_C: &str = r#"
__attribute__((noinline)) unsigned long pac_work(const unsigned char *p, unsigned long n,
                                                 unsigned long seed) {
    unsigned long a = seed, b = seed * 3;
    for (unsigned long x = 0; x < n; x++) {
        a += p[x] ^ b;
        b ^= a * 5 + x;
    }
    return a ^ b;
}
__attribute__((noinline)) unsigned long pac_middle(const unsigned char *p, unsigned long n,
                                                   unsigned long seed) {
    unsigned long r = pac_work(p, n, seed);
    __asm__ volatile("" ::: "memory");
    return r + 1;
}
__attribute__((noinline)) unsigned long pac_outer(const unsigned char *p, unsigned long n,
                                                  unsigned long seed) {
    unsigned long r = pac_middle(p, n, seed * 2 + 1);
    __asm__ volatile("" ::: "memory");
    return r ^ 3;
}
/* The word pac_middle saved for its return address, as it lies in its frame record. */
__attribute__((noinline)) unsigned long pac_saved_lr(void) {
    unsigned long *fp = __builtin_frame_address(0);
    unsigned long w = fp[1];
    __asm__ volatile("" ::: "memory");
    return w;
}
"#;

/// Builds the pointer-authentication library into `dir` (aarch64 only).
pub fn build_pac(dir: &Path) -> Result<PathBuf, String> {
    build_shared(
        dir,
        "pac.c",
        PAC_C,
        "libst_pac.so",
        &["-O2", "-mbranch-protection=standard"],
    )
}

/// A guard for the peer: libunwind's walk in C under `sigsetjmp`, with a SIGSEGV/SIGBUS handler
/// that jumps back while a walk is in progress on this thread (so the jump crosses only C and
/// libunwind frames). `lu_guard_install` sets the handler; faults elsewhere go to the previous
/// action.
pub const LU_GUARD_C: &str = r#"
#include <setjmp.h>
#include <signal.h>
#include <string.h>
typedef int (*init_fn)(void *, void *, int);
typedef int (*step_fn)(void *);
typedef int (*reg_fn)(void *, int, unsigned long *);
static __thread sigjmp_buf *guard;
static struct sigaction old_segv, old_bus;
static void on_fault(int sig, siginfo_t *si, void *uc) {
    (void)si; (void)uc;
    if (guard) siglongjmp(*guard, 1);
    sigaction(sig, sig == SIGSEGV ? &old_segv : &old_bus, 0);
}
int lu_guard_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, &old_segv) | sigaction(SIGBUS, &sa, &old_bus);
}
int lu_guard_restore(void) {
    return sigaction(SIGSEGV, &old_segv, 0) | sigaction(SIGBUS, &old_bus, 0);
}
/* end: 0 outermost, 1 buffer full, 2 faulted, 3 error (in *err). */
int lu_guard_walk(init_fn init, step_fn step, reg_fn get, int ip_reg, void *uc,
                  unsigned long *out, int n, int *end, int *err) {
    unsigned long cursor[256];
    sigjmp_buf jb;
    volatile int k = 0;
    if (sigsetjmp(jb, 1)) { guard = 0; *end = 2; return k; }
    guard = &jb;
    int rc = init(cursor, uc, 1);
    if (rc < 0) { guard = 0; *end = 3; *err = rc; return 0; }
    for (;;) {
        if (k == n) { *end = 1; break; }
        unsigned long ip = 0;
        rc = get(cursor, ip_reg, &ip);
        if (rc < 0) { *end = 3; *err = rc; break; }
        out[k] = ip;
        k = k + 1;
        rc = step(cursor);
        if (rc == 0) { *end = 0; break; }
        if (rc < 0) { *end = 3; *err = rc; break; }
    }
    guard = 0;
    return k;
}
"#;

/// Builds the libunwind guard into `dir`; returns its path.
pub fn build_lu_guard(dir: &Path) -> Result<PathBuf, String> {
    build_shared(dir, "lu_guard.c", LU_GUARD_C, "libst_lu_guard.so", &["-O1"])
}

/// IFUNCs in liblazy_b.so (one lazy binding each).
pub const LAZY_FUNCS: usize = 256;

fn lazy_b_source() -> String {
    let mut s = String::from(
        "typedef void (*hook_t)(void);\n\
         static hook_t st_hook;\n\
         static int st_resolved;\n\
         void b_set_hook(hook_t h) { st_hook = h; }\n\
         int b_resolved(void) { return st_resolved; }\n",
    );
    for i in 0..LAZY_FUNCS {
        s += &format!(
            "__attribute__((noinline)) static int b_impl_{i}(int x) {{ return x * 3 + {i}; }}\n\
             static void *b_res_{i}(void) {{\n\
             \x20   st_resolved++;\n\
             \x20   if (st_hook) st_hook();\n\
             \x20   __asm__ volatile(\"\" ::: \"memory\");\n\
             \x20   return (void *)b_impl_{i};\n\
             }}\n\
             int b_{i}(int x) __attribute__((ifunc(\"b_res_{i}\")));\n"
        );
    }
    s
}

fn lazy_a_source() -> String {
    let mut s = String::new();
    for i in 0..LAZY_FUNCS {
        s += &format!("int b_{i}(int);\n");
    }
    s += "__attribute__((noinline)) int a_all(int x) {\n";
    for i in 0..LAZY_FUNCS {
        s += &format!("    x = b_{i}(x);\n");
    }
    s += "    __asm__ volatile(\"\" ::: \"memory\");\n    return x ^ 0x55;\n}\n";
    s
}

/// Runs `cc` with `args`; `Err` with its stderr when it fails or is missing.
/// Writes `source` to `dir/c_name` and compiles it with `flags` into the shared library
/// `dir/so_name`; returns its path.
fn build_shared(
    dir: &Path,
    c_name: &str,
    source: &str,
    so_name: &str,
    flags: &[&str],
) -> Result<PathBuf, String> {
    let src = dir.join(c_name);
    std::fs::write(&src, source).map_err(|e| e.to_string())?;
    let out = dir.join(so_name);
    let mut args = flags.to_vec();
    args.extend([
        "-shared",
        "-fPIC",
        "-o",
        out.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    cc(&args)?;
    Ok(out)
}

fn cc(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(super::target::cc())
        .args(args)
        .output()
        .map_err(|e| format!("cc: {e} (a C compiler is needed for the fixtures)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cc {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A private directory for built fixtures, removed on drop.
pub struct FixtureDir(pub PathBuf);

impl FixtureDir {
    /// Creates `$CARGO_TARGET_TMPDIR/<tag>-<pid>`.
    pub fn new(tag: &str) -> FixtureDir {
        let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create fixture dir");
        FixtureDir(d)
    }
}

impl Drop for FixtureDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the omit-frame-pointer library into `dir`.
pub fn build_omit_fp(dir: &Path) -> Result<PathBuf, String> {
    build_shared(
        dir,
        "omitfp.c",
        OMIT_FP_C,
        "libst_omitfp.so",
        &["-O2", "-fomit-frame-pointer"],
    )
}

/// Builds liblazy_b.so and `copies` distinct copies of liblazy_a.so (`-z lazy`, needing B by
/// soname, found through its rpath); returns the A paths. Distinct files load as distinct
/// objects, each with its own not-yet-bound PLT.
pub fn build_lazy(dir: &Path, copies: usize) -> Result<Vec<PathBuf>, String> {
    let d = dir.to_str().unwrap();
    let b_src = dir.join("lazy_b.c");
    std::fs::write(&b_src, lazy_b_source()).map_err(|e| e.to_string())?;
    let b = dir.join("libst_lazy_b.so");
    cc(&[
        "-O2",
        "-shared",
        "-fPIC",
        "-Wl,-soname,libst_lazy_b.so",
        "-o",
        b.to_str().unwrap(),
        b_src.to_str().unwrap(),
    ])?;
    let a_src = dir.join("lazy_a.c");
    std::fs::write(&a_src, lazy_a_source()).map_err(|e| e.to_string())?;
    let a = dir.join("libst_lazy_a0.so");
    let rpath = format!("-Wl,-rpath,{d}");
    cc(&[
        "-O2",
        "-shared",
        "-fPIC",
        "-fplt",
        "-Wl,-z,lazy",
        "-o",
        a.to_str().unwrap(),
        a_src.to_str().unwrap(),
        "-L",
        d,
        "-l:libst_lazy_b.so",
        &rpath,
    ])?;
    let mut all = vec![a.clone()];
    for k in 1..copies {
        let p = dir.join(format!("libst_lazy_a{k}.so"));
        std::fs::copy(&a, &p).map_err(|e| e.to_string())?;
        all.push(p);
    }
    Ok(all)
}

/// `dlopen(path, flags)`, then `dlsym` of each name; `Err` says what is missing.
pub fn open(path: &str, flags: i32, names: &[&str]) -> Result<(*mut c_void, Vec<usize>), String> {
    let c = std::ffi::CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: a valid NUL-terminated path.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if h.is_null() {
        return Err(format!("dlopen {path} failed (not installed?)"));
    }
    let mut syms = Vec::new();
    for n in names {
        let cn = std::ffi::CString::new(*n).map_err(|e| e.to_string())?;
        // SAFETY: h is a live handle; cn is NUL-terminated.
        let f = unsafe { libc::dlsym(h, cn.as_ptr()) };
        if f.is_null() {
            return Err(format!("{path} lacks {n}"));
        }
        syms.push(f as usize);
    }
    Ok((h, syms))
}

/// The demangled name selftrace gives `addr` (`?` without one), and the object's file name.
pub fn name_of(addr: usize) -> (String, String) {
    match selftrace::symbolize(addr) {
        Some(s) => {
            let name = s
                .name_string()
                .map(|n| format!("{:#}", rustc_demangle::demangle(&n)))
                .unwrap_or_else(|| "?".into());
            (name, s.object_name().to_string())
        }
        None => ("?".into(), "?".into()),
    }
}

/// Whether the outermost frame of a walk is a thread's root (`_start`, `clone3`, `clone`, and
/// glibc's aarch64 `thread_start`).
pub fn ends_at_root(frames: &[usize]) -> bool {
    frames.last().is_some_and(|&ra| {
        let (n, _) = name_of(ra.wrapping_sub(1));
        n == "_start" || n.contains("clone") || n == "thread_start"
    })
}

/// Whether selftrace has ld.so's local names (`_dl_fixup`, ...): ld.so's `.symtab` comes
/// from a separate debug file (Debian: libc6-dbg). Call after `selftrace::init()`.
pub fn ldso_has_local_names() -> bool {
    // SAFETY: dlsym with a valid C string; __tls_get_addr is defined by ld.so.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__tls_get_addr".as_ptr()) } as usize;
    f != 0
        && selftrace::symbolize(f).is_some_and(|s| {
            s.path.contains("ld-linux")
                && matches!(
                    s.source,
                    selftrace::symbolize::SymbolSource::Symtab
                        | selftrace::symbolize::SymbolSource::DebugFile
                )
        })
}
