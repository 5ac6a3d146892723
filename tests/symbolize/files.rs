//! The symbolizer and the files it reads: a debug file truncated on disk after `init` makes
//! nothing fault (in a signal handler or outside one); a forged debug file (no build-id, or a
//! `.gnu_debuglink` target with the wrong CRC) is not used; PLT stubs are named `name@plt` as
//! objdump names them; glibc's signal trampoline is `__restore_rt`; symbol versions are not
//! printed; compressed debug sections (Debian's `libc6-dbg`, `objcopy
//! --compress-debug-sections=zlib|zlib-gnu|zstd`) give the file:line binutils' `addr2line` gives, and a
//! corrupt or unknown compression is said on the frame.

use crate::addr2line;
use crate::sysroot;
use crate::target;
use selftrace::symbolize::{self, FrameKind, KernelOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

const CHILD_ENV: &str = "SELFTRACE_FILES_CHILD";
const TRUNCATE_ENV: &str = "SELFTRACE_FILES_TRUNCATE";

fn kernel_line(addr: usize, kind: FrameKind) -> String {
    let mut buf = [0u8; 512];
    let n = symbolize::write_kernel_frame(&mut buf, addr, kind, KernelOptions::default());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Prints every frame of the current stack in the kernel format and the demangled names.
#[inline(never)]
fn print_stack(tag: &str) {
    let mut frames = [0usize; 64];
    let n = selftrace::capture(&mut frames);
    for (i, &a) in frames[..n].iter().enumerate() {
        let kind = symbolize::frame_kind(&frames[..n], i, false);
        println!("{tag} {}", kernel_line(a, kind));
    }
    std::hint::black_box(&frames);
}

static HANDLER_FRAMES: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    // Async-signal-safe only: capture, lookups, formatting into stack buffers, write(2).
    let mut frames = [0usize; 64];
    let n = selftrace::capture(&mut frames);
    let mut buf = [0u8; 512];
    for (i, &a) in frames[..n].iter().enumerate() {
        let kind = symbolize::frame_kind(&frames[..n], i, false);
        let len = symbolize::write_kernel_frame(&mut buf, a, kind, KernelOptions::default());
        let mut line = [0u8; 600];
        let head = b"handler ";
        line[..head.len()].copy_from_slice(head);
        line[head.len()..head.len() + len].copy_from_slice(&buf[..len]);
        line[head.len() + len] = b'\n';
        // SAFETY: write(2) of a stack buffer to stdout.
        unsafe { libc::write(1, line.as_ptr().cast(), head.len() + len + 1) };
        if let Some(s) = symbolize::symbolize(kind.lookup_address(a)) {
            let mut name = [0u8; 256];
            let _ = s.demangle_into(&mut name);
        }
    }
    symbolize::backtrace_symbols_fd(&frames[..n], borrowed(1));
    HANDLER_FRAMES.store(n, Ordering::SeqCst);
}

#[inline(never)]
fn child_before() {
    print_stack("before");
    println!("before-bt\n{:#}", selftrace::Backtrace::capture());
}

#[inline(never)]
fn child_after() {
    print_stack("after");
    println!("after-bt\n{:#}", selftrace::Backtrace::capture());
    for l in selftrace::backtrace_symbols(&[child_after as *const () as usize + 1]) {
        println!("after-glibc {l}");
    }
    // SAFETY: a handler that only does async-signal-safe work; raise(3) runs it now.
    unsafe {
        libc::signal(
            libc::SIGUSR1,
            on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::raise(libc::SIGUSR1);
    }
    assert!(HANDLER_FRAMES.load(Ordering::SeqCst) > 2);
}

/// The child's body: does nothing unless started by one of the tests below.
#[test]
fn child_report() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    symbolize::prepare().expect("prepare");
    child_before();
    if let Some(path) = std::env::var_os(TRUNCATE_ENV) {
        // Truncate in place (same inode), as an editor or a careless `cp` over the file would.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open the debug file");
        f.set_len(0).expect("truncate");
        drop(f);
        println!("truncated {}", Path::new(&path).display());
    }
    child_after();
    let s = symbolize::symbolize(child_after as *const () as usize).expect("own object");
    println!("source {:?}", s.source);
    println!("== end");
}

fn work_dir(name: &str) -> crate::WorkDir {
    crate::WorkDir::new("selftrace-files", name)
}

fn run(cmd: &str, dir: &Path, args: &[&str]) {
    let st = Command::new(target::binutil(cmd))
        .current_dir(dir)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(st.success(), "{cmd} {args:?}");
}

fn have(tool: &str) -> bool {
    let ok = Command::new(target::binutil(tool))
        .arg("--version")
        .output()
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none(),
            "{tool} (binutils) is required"
        );
        println!("SKIP: {tool} (binutils) not installed");
    }
    ok
}

fn run_child(exe: &Path, debug_dir: Option<&Path>, truncate: Option<&Path>) -> String {
    let mut c = Command::new(exe);
    c.args([
        "--exact",
        "files::child_report",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, "1");
    match debug_dir {
        Some(d) => c.env("SELFTRACE_DEBUG_DIR", d),
        None => c.env_remove("SELFTRACE_DEBUG_DIR"),
    };
    if let Some(t) = truncate {
        c.env(TRUNCATE_ENV, t);
    }
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("== end"), "{stdout}");
    stdout
}

/// A stripped copy of this test binary and its debug file (`objcopy --only-keep-debug`).
fn stripped_and_debug(dir: &Path) -> (PathBuf, PathBuf) {
    let me = std::env::current_exe().unwrap();
    let me = me.to_str().unwrap();
    run("objcopy", dir, &["--only-keep-debug", me, "full.debug"]);
    run("objcopy", dir, &["--strip-all", me, "stripped-copy"]);
    (dir.join("stripped-copy"), dir.join("full.debug"))
}

/// `<root>/.build-id/xx/yyyy.debug` for this binary's build-id.
fn build_id_path(root: &Path) -> PathBuf {
    let id = selftrace::modules::snapshot()
        .objects()
        .iter()
        .find(|o| o.is_main)
        .and_then(|o| o.build_id.clone())
        .expect("build-id");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let sub = root.join(".build-id").join(&hex[..2]);
    std::fs::create_dir_all(&sub).unwrap();
    sub.join(format!("{}.debug", &hex[2..]))
}

#[test]
fn truncated_debug_file_does_not_fault() {
    if !have("objcopy") {
        return;
    }
    let dir = work_dir("truncate");
    let (exe, full) = stripped_and_debug(&dir);
    let root = dir.join("debug");
    let target = build_id_path(&root);
    std::fs::rename(&full, &target).unwrap();
    let out = run_child(&exe, Some(&root), Some(&target));
    println!("{out}");
    assert!(out.contains("truncated "), "{out}");
    assert_eq!(std::fs::metadata(&target).unwrap().len(), 0);
    // The names were taken from the debug file at init and stay, in every context.
    assert!(out.contains("source DebugFile"), "{out}");
    for tag in ["before", "after", "handler"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(tag) && l.contains(" : symbolize::files::child_")),
            "no named frame from {tag}:\n{out}"
        );
    }
    // file:line read before the truncation stays (the DWARF is read, not mapped).
    let before = &out[out.find("before-bt").unwrap()..out.find("truncated").unwrap()];
    assert!(before.contains("tests/symbolize/files.rs:"), "{before}");
    assert!(out.contains("after-glibc "), "{out}");
}

/// `objcopy` a forged debug file from the real one: every symbol renamed `FORGED_...`,
/// optionally without the build-id note.
fn forge(dir: &Path, real: &Path, out: &str, keep_build_id: bool) -> PathBuf {
    let mut args = vec!["--prefix-symbols=FORGED_"];
    if !keep_build_id {
        args.push("--remove-section=.note.gnu.build-id");
    }
    args.push(real.to_str().unwrap());
    args.push(out);
    run("objcopy", dir, &args);
    dir.join(out)
}

#[test]
fn build_id_debug_file_without_build_id_is_not_used() {
    if !have("objcopy") {
        return;
    }
    let dir = work_dir("forged-build-id");
    let (exe, full) = stripped_and_debug(&dir);
    let forged = forge(&dir, &full, "forged.debug", false);
    let root = dir.join("debug");
    std::fs::rename(&forged, build_id_path(&root)).unwrap();
    let out = run_child(&exe, Some(&root), None);
    assert!(!out.contains("FORGED_"), "a forged name was used:\n{out}");
    assert!(!out.contains("source DebugFile"), "{out}");
    // The genuine file at the same place is used.
    std::fs::rename(&full, build_id_path(&root)).unwrap();
    let out = run_child(&exe, Some(&root), None);
    assert!(out.contains("source DebugFile"), "{out}");
}

#[test]
fn debuglink_file_with_wrong_crc_is_not_used() {
    if !have("objcopy") {
        return;
    }
    let dir = work_dir("forged-debuglink");
    let (exe, full) = stripped_and_debug(&dir);
    std::fs::rename(&full, dir.join("stripped-copy.debug")).unwrap();
    run(
        "objcopy",
        &dir,
        &["--add-gnu-debuglink=stripped-copy.debug", "stripped-copy"],
    );
    let real = dir.join("real.debug");
    std::fs::rename(dir.join("stripped-copy.debug"), &real).unwrap();
    // Same build-id, other contents; then also without a build-id.
    for keep_id in [true, false] {
        let forged = forge(&dir, &real, "forged.debug", keep_id);
        std::fs::rename(&forged, dir.join("stripped-copy.debug")).unwrap();
        let out = run_child(&exe, None, None);
        assert!(
            !out.contains("FORGED_"),
            "forged (build-id kept: {keep_id}) used:\n{out}"
        );
        assert!(!out.contains("source DebugFile"), "{out}");
    }
    // The genuine file (its CRC is the one in the link) is used.
    std::fs::copy(&real, dir.join("stripped-copy.debug")).unwrap();
    let out = run_child(&exe, None, None);
    assert!(out.contains("source DebugFile"), "{out}");
    assert!(out.contains("symbolize::files::child_after"), "{out}");
}

/// `objdump -d -j SECTION FILE`'s `<name@plt>` labels: (link-time address, name).
fn objdump_plt(file: &Path) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for sec in [".plt", ".plt.sec", ".plt.got"] {
        let o = Command::new(target::binutil("objdump"))
            .args(["-d", "-j", sec])
            .arg(file)
            .output()
            .expect("objdump");
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            // 0000000000001030 <fputs@plt>:
            let Some((addr, rest)) = l.split_once(" <") else {
                continue;
            };
            let Some(name) = rest.strip_suffix(">:") else {
                continue;
            };
            if let (Ok(a), true) = (u64::from_str_radix(addr.trim(), 16), name.ends_with("@plt")) {
                out.push((a, name.to_string()));
            }
        }
    }
    out
}

fn check_plt(obj_path: &Path, bias: usize) -> usize {
    let want = objdump_plt(obj_path);
    for (addr, name) in &want {
        let pc = bias + *addr as usize + 7;
        if name.starts_with("*ABS*") {
            // An IRELATIVE slot (objdump: `*ABS*+0x31c20@plt`): no symbol names it; left
            // unnamed, never a neighbour's name.
            let s = symbolize::symbolize(pc).expect("inside the object");
            assert_eq!(s.name, None, "{name}");
            continue;
        }
        let s = symbolize::symbolize(pc).expect("inside the object");
        assert_eq!(
            s.name_string().as_deref(),
            Some(name.as_str()),
            "{} at {addr:#x}+7",
            obj_path.display()
        );
        // Every format: kernel (as a return address: looked up at pc - 1), glibc.
        let k = kernel_line(pc + 1, FrameKind::Return);
        assert!(k.contains(&format!(" : {name}+0x8/0x")), "{k}");
        let g = &selftrace::backtrace_symbols(&[pc])[0];
        assert!(g.contains(&format!("({name}+0x7)")), "{g}");
        let b = selftrace::Backtrace::from_addresses(&[pc], true);
        assert_eq!(b.frames()[0].name(), Some(name.as_str()));
    }
    want.len()
}

#[test]
fn plt_stubs_are_named_like_objdump() {
    if !have("objdump") {
        return;
    }
    symbolize::prepare().unwrap();
    // libm: a GNU ld object, its PLT right after `_init` (gdb: `fputs@plt + 7`).
    // SAFETY: dlopen of a system library by name.
    let h = unsafe { libc::dlopen(c"libm.so.6".as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null());
    selftrace::refresh();
    symbolize::prepare().unwrap();
    let snap = selftrace::modules::snapshot();
    let mut checked = 0;
    for o in snap.objects() {
        let name = selftrace::modules::short_name(&o.path);
        if o.is_main || name.starts_with("libm.so") {
            let path = if o.is_main {
                std::env::current_exe().unwrap()
            } else {
                PathBuf::from(&o.path)
            };
            let n = check_plt(&path, o.bias);
            println!("{}: {n} PLT entries agree with objdump", path.display());
            assert!(n > 0, "no PLT entries in {}", path.display());
            checked += 1;
        }
    }
    assert_eq!(checked, 2);
}

#[test]
fn signal_trampoline_is_restore_rt_and_versions_are_dropped() {
    symbolize::prepare().unwrap();
    // __restore_rt is a local symbol: only libc's .symtab (its debug file) has it.
    let libc_syms = {
        // SAFETY: dlsym of a libc function by name.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__libc_start_main".as_ptr()) };
        symbolize::symbolize(p as usize).expect("libc is indexed")
    };
    if libc_syms.source != symbolize::SymbolSource::DebugFile
        && libc_syms.source != symbolize::SymbolSource::Symtab
    {
        assert!(
            std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none(),
            "libc's debug file (libc6-dbg) is required"
        );
        println!("SKIP: libc has no .symtab here (install libc6-dbg)");
        return;
    }
    // Versions: the raw name keeps them (what .symtab says), printed names do not.
    let raw = libc_syms.name_string().unwrap();
    println!("raw name: {raw}");
    assert!(raw.starts_with("__libc_start_main"), "{raw}");
    let mut buf = [0u8; 128];
    assert_eq!(libc_syms.demangle_into(&mut buf), Some("__libc_start_main"));
    let k = kernel_line(libc_syms.addr, FrameKind::Exact);
    assert!(k.contains(" : __libc_start_main+0x0/0x"), "{k}");
    assert!(!k.contains('@'), "{k}");
    // (file:line names it after its DWARF name, __libc_start_main_impl)
    let b = selftrace::Backtrace::from_addresses(&[libc_syms.addr], true);
    let name = b.frames()[0].name().unwrap();
    assert!(
        name.starts_with("__libc_start_main") && !name.contains('@'),
        "{name}"
    );

    // The trampoline: capture() inside a handler crosses it.
    static FRAMES: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
    static N: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn h(_: libc::c_int) {
        let mut f = [0usize; 64];
        let n = selftrace::capture(&mut f);
        for (slot, &a) in FRAMES.iter().zip(&f[..n]) {
            slot.store(a, Ordering::SeqCst);
        }
        N.store(n, Ordering::SeqCst);
    }
    // SAFETY: an async-signal-safe handler; raise(3) runs it on this thread now.
    unsafe {
        libc::signal(
            libc::SIGUSR2,
            h as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::raise(libc::SIGUSR2);
    }
    let frames: Vec<usize> = FRAMES[..N.load(Ordering::SeqCst)]
        .iter()
        .map(|a| a.load(Ordering::SeqCst))
        .collect();
    let i = frames
        .iter()
        .position(|&a| symbolize::is_signal_trampoline(a))
        .expect("the walk crossed the trampoline");
    let kind = symbolize::frame_kind(&frames, i, false);
    let k = kernel_line(frames[i], kind);
    println!("{k}");
    // The frame after the trampoline is the interrupted pc: exact.
    assert_eq!(
        symbolize::frame_kind(&frames, i + 1, false),
        symbolize::FrameKind::Exact
    );
    if cfg!(target_arch = "aarch64") {
        // The kernel's trampoline is the vDSO's; qemu-user puts its own on an anonymous page
        // (no vDSO there), which has no name.
        // SAFETY: getauxval has no preconditions.
        if unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } != 0 {
            assert!(k.contains(" : __kernel_rt_sigreturn+0x0/"), "{k}");
        } else {
            assert!(symbolize::symbolize_frame(frames[i], kind).is_none(), "{k}");
        }
        return;
    }
    assert!(k.contains(" : __restore_rt+0x0/0x0 [libc.so.6]"), "{k}");
    let s = symbolize::symbolize_frame(frames[i], kind).unwrap();
    assert_eq!(s.name_string().as_deref(), Some("__restore_rt"));
    let b = selftrace::Backtrace::from_addresses(&frames, false);
    assert_eq!(b.frames()[i].name(), Some("__restore_rt"), "{b:#}");
}

/// A raw fd of this test's (or 1, stdout), borrowed for one call.
fn borrowed(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the tests pass fds they opened and close only after the call returned.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// The (value, name) of every symbol `readelf -sW FILE` shows outside the file's executable
/// sections (`readelf -SW`: flag `X`): absolute markers such as BOLT's `__hot_end` and weak
/// untyped symbols in data such as a USDT semaphore, which `nm` lists as weak (`W`) whatever
/// their section.
fn outside_code(file: &Path) -> std::collections::HashSet<(u64, Vec<u8>)> {
    let readelf = |arg: &str| {
        let o = Command::new(target::binutil("readelf"))
            .arg(arg)
            .arg(file)
            .output()
            .expect("readelf");
        assert!(o.status.success(), "readelf {arg} {}", file.display());
        o.stdout
    };
    let words = |line: &[u8]| -> Vec<Vec<u8>> {
        line.split(|&b| b == b' ')
            .filter(|w| !w.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    // "  [13] .text PROGBITS addr off size es flags ...": the indices of sections with X.
    let mut code = std::collections::HashSet::new();
    for line in readelf("-SW").split(|&b| b == b'\n') {
        let Some(open) = line.iter().position(|&b| b == b'[') else {
            continue;
        };
        let Some(close) = line.iter().position(|&b| b == b']') else {
            continue;
        };
        let Ok(index) = std::str::from_utf8(&line[open + 1..close])
            .unwrap()
            .trim()
            .parse::<u32>()
        else {
            continue;
        };
        let f = words(&line[close + 1..]);
        if f.len() >= 7 && f[6].contains(&b'X') {
            code.insert(index.to_string().into_bytes());
        }
    }
    // "num: value size type bind vis ndx name".
    readelf("-sW")
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let f = words(line);
            if f.len() < 8 || code.contains(&f[6]) {
                return None;
            }
            let value = u64::from_str_radix(std::str::from_utf8(&f[1]).ok()?, 16).ok()?;
            Some((value, f[7].clone()))
        })
        .collect()
}

/// `nm --defined-only FILE`'s text symbols (types `T t W w i`) that lie in code: link-time
/// address -> names.
fn nm_text(file: &Path) -> std::collections::HashMap<u64, Vec<Vec<u8>>> {
    let outside = outside_code(file);
    let o = Command::new(target::binutil("nm"))
        .args(["--defined-only", "--without-symbol-versions"])
        .arg(file)
        .output()
        .expect("nm");
    assert!(o.status.success(), "nm {}", file.display());
    let mut out: std::collections::HashMap<u64, Vec<Vec<u8>>> = Default::default();
    for line in o.stdout.split(|&b| b == b'\n') {
        let mut f = line.splitn(3, |&b| b == b' ');
        let (Some(a), Some(t), Some(name)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if !matches!(t, b"T" | b"t" | b"W" | b"w" | b"i") {
            continue;
        }
        let a = u64::from_str_radix(std::str::from_utf8(a).unwrap(), 16).unwrap();
        if outside.contains(&(a, name.to_vec())) {
            continue;
        }
        out.entry(a).or_default().push(name.to_vec());
    }
    out
}

/// Every text symbol nm lists in `file` (loaded at `bias`): selftrace names its address with one
/// of the names nm gives that address (cut at 4,096 bytes, as selftrace cuts), and the symbol
/// starts there. Returns how many addresses were checked.
fn check_nm(file: &Path, bias: usize) -> usize {
    let want = nm_text(file);
    for (addr, names) in &want {
        let pc = bias + *addr as usize;
        let s = symbolize::symbolize(pc)
            .unwrap_or_else(|| panic!("{}: nothing at {addr:#x}", file.display()));
        let got = s
            .name
            .unwrap_or_else(|| panic!("{}: no name at {addr:#x}", file.display()))
            .to_vec();
        // `nm --without-symbol-versions` cuts a name at its first `@` even when the `@` is
        // part of the name itself (ld's erratum veneers on aarch64: `e843419@000f_00000687_180`).
        let cut = got.split(|&b| b == b'@').next().unwrap_or(&[]);
        assert!(
            names
                .iter()
                .any(|n| n[..n.len().min(4096)] == got || (n.len() < got.len() && n[..] == *cut)),
            "{} at {addr:#x}: selftrace {:?}, nm {:?}",
            file.display(),
            String::from_utf8_lossy(&got),
            names
                .iter()
                .map(|n| String::from_utf8_lossy(n))
                .collect::<Vec<_>>()
        );
        assert_eq!(s.start, pc, "{} at {addr:#x}", file.display());
    }
    want.len()
}

#[test]
fn every_text_symbol_is_named_as_nm_names_it() {
    if !have("nm") {
        return;
    }
    // A large C++ object this project did not build: the string table of lld's output shares
    // the tails of names, and every name of its 150,000 functions is checked.
    let llvm = sysroot::rustup_llvm_for_test("this program only");
    if let Some(p) = &llvm {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: dlopen of rustup's LLVM library by path; its constructors register LLVM's
        // own options and need nothing from this program.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", p.display());
    }
    symbolize::prepare().unwrap();
    let snap = selftrace::modules::snapshot();
    let mut checked = Vec::new();
    for o in snap.objects() {
        let is_llvm = llvm
            .as_ref()
            .is_some_and(|p| Path::new(&o.path).file_name() == p.file_name());
        if o.is_main || is_llvm {
            let path = if o.is_main {
                std::env::current_exe().unwrap()
            } else {
                PathBuf::from(&o.path)
            };
            let n = check_nm(&path, o.bias);
            println!("{}: {n} addresses named as nm names them", path.display());
            checked.push(n);
        }
    }
    assert_eq!(checked.len(), 1 + usize::from(llvm.is_some()));
    assert!(checked.iter().all(|&n| n > 1000), "{checked:?}");
}

// ---- compressed debug sections ---------------------------------------------------------------

/// The `SHF_COMPRESSED` `.debug_*` sections of an ELF file, by name.
fn compressed_debug_sections(file: &Path) -> Vec<String> {
    use object::{Object as _, ObjectSection as _, SectionFlags};
    let data = std::fs::read(file).unwrap();
    let f = object::File::parse(&*data).unwrap();
    f.sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
        .filter(|s| {
            matches!(s.flags(), SectionFlags::Elf { sh_flags, .. }
                if sh_flags.0 & object::elf::SHF_COMPRESSED.0 != 0)
        })
        .map(|s| s.name().unwrap().to_string())
        .collect()
}

/// Link-time addresses of `file`'s functions: `per_function` spread over each function of
/// 16 bytes or more (every byte when `per_function` is 0), at most `max` in all, spread over
/// the whole table.
fn function_addresses(file: &Path, per_function: usize, max: usize) -> Vec<u64> {
    use object::{Object as _, ObjectSymbol as _, SymbolKind};
    let data = std::fs::read(file).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let mut funcs: Vec<(u64, u64)> = f
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() >= 16 && s.address() != 0)
        .map(|s| (s.address(), s.size()))
        .collect();
    funcs.sort();
    funcs.dedup_by_key(|e| e.0);
    let mut out = Vec::new();
    for (start, size) in funcs {
        if per_function == 0 {
            out.extend(start..start + size);
        } else {
            let step = (size / per_function as u64).max(1);
            out.extend(
                (0..per_function as u64)
                    .map(|k| start + k * step)
                    .filter(|a| *a < start + size),
            );
        }
    }
    if out.len() > max {
        let step = out.len().div_ceil(max);
        out = out.into_iter().step_by(step).collect();
    }
    out
}

/// Resolves `svmas` of the loaded object `obj` with selftrace and compares every function's
/// file:line with `tool` (an addr2line) run on `oracle` (the same code, its DWARF uncompressed or read
/// by binutils). Returns (addresses whose functions all match, addresses binutils gives a line
/// for, addresses we give a line for) and prints the first mismatches.
fn compare_lines(
    obj: &selftrace::modules::Object,
    tool: &str,
    oracle: &Path,
    svmas: &[u64],
) -> (usize, usize, usize) {
    let theirs = addr2line::run(tool, oracle, svmas);
    let (mut same, mut they_line, mut we_line) = (0, 0, 0);
    let mut shown = 0;
    for (&svma, t) in svmas.iter().zip(&theirs) {
        let ours = selftrace::symbolize::BacktraceFrame::resolve(
            obj.bias + svma as usize,
            FrameKind::Exact,
        );
        let o = ours.symbols();
        they_line += usize::from(t.first().is_some_and(|f| f.2.is_some()));
        we_line += usize::from(o.first().is_some_and(|s| s.line.is_some()));
        let ok = o.len() == t.len()
            && o.iter().zip(t).all(|(o, (_, tfile, tline))| match tline {
                None => o.line.is_none(),
                Some(_) => {
                    o.line == *tline && o.file.is_some_and(|f| addr2line::same_file(f, tfile))
                }
            });
        if ok {
            same += 1;
        } else if shown < 10 {
            shown += 1;
            println!(
                "{svma:#x}: ours {o:?} no_line {:?}\n  binutils {t:?}",
                ours.no_line
            );
        }
    }
    (same, they_line, we_line)
}

/// Debian ships `libc6-dbg`'s debug files (`/usr/lib/debug/.build-id/xx/yyyy.debug`) with
/// their `.debug_*` sections compressed (`SHF_COMPRESSED`, zlib): libc's, libm's and ld.so's
/// file:line must be the ones elfutils' `eu-addr2line` reads from the same files. (Not
/// binutils' here: binutils 2.40 names the CU's primary file for lines of an included file
/// of glibc's DWARF 5, e.g. `bsearch.c:22` where gdb and elfutils say
/// `bits/stdlib-bsearch.h:22`.)
#[test]
fn debian_compressed_debug_files_give_the_lines_elfutils_gives() {
    let eu = Command::new("eu-addr2line")
        .arg("--version")
        .output()
        .is_ok();
    if !eu {
        assert!(
            std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none(),
            "eu-addr2line (elfutils) is required"
        );
        println!("SKIP: eu-addr2line (elfutils) not installed");
        return;
    }
    // libm is not linked into every program: load it, and let the symbolizer see it.
    // SAFETY: a NUL-terminated name; libm has no constructor with preconditions.
    let h = unsafe { libc::dlopen(c"libm.so.6".as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen libm.so.6");
    selftrace::refresh();
    symbolize::prepare().expect("prepare");
    let snap = selftrace::modules::snapshot();
    let mut checked = 0;
    for prefix in ["libc.so", "libm.so", "ld-linux"] {
        let obj = snap
            .objects()
            .iter()
            .find(|o| selftrace::modules::short_name(&o.path).starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix} is loaded"));
        let id = obj
            .build_id
            .as_ref()
            .expect("Debian's libraries carry a build-id");
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let debug = PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        ));
        if !debug.exists() {
            assert!(
                std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none(),
                "{debug:?} ({}'s debug file) is missing: install libc6-dbg",
                obj.path
            );
            println!("SKIP: no debug file for {} (install libc6-dbg)", obj.path);
            continue;
        }
        let compressed = compressed_debug_sections(&debug);
        assert!(
            compressed.iter().any(|s| s == ".debug_info")
                && compressed.iter().any(|s| s == ".debug_line"),
            "{debug:?} no longer has compressed .debug_info and .debug_line ({compressed:?}): \
             this test would not test compression"
        );
        let svmas = function_addresses(&debug, 3, 1500);
        assert!(svmas.len() >= 500, "{prefix}: {} addresses", svmas.len());
        let (same, they, we) = compare_lines(obj, "eu-addr2line", &debug, &svmas);
        println!(
            "{prefix}: {same} of {} addresses match elfutils; lines: elfutils {they}, selftrace {we}",
            svmas.len()
        );
        assert!(
            same * 1000 >= svmas.len() * 995,
            "{prefix}: {same} of {} addresses match elfutils' file:line",
            svmas.len()
        );
        assert!(
            we * 100 >= they * 99,
            "{prefix}: lines {we} vs binutils' {they}"
        );
        checked += 1;
    }
    if std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_some() {
        assert_eq!(checked, 3);
    }
}

/// Builds tests/fixtures/stfix.c as `dir/name`, optimized (st_hidden is inlined), with DWARF
/// (and `extra` flags), in `dir` (where `-gsplit-dwarf` writes the `.dwo`).
fn build_stfix_with(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stfix.c");
    let st = Command::new(target::cc())
        .current_dir(dir)
        .args(["-shared", "-fPIC", "-O2", "-g"])
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("gcc (needed to build the test fixture)");
    assert!(st.success(), "gcc failed");
    out
}

fn build_stfix(dir: &Path, name: &str) -> PathBuf {
    build_stfix_with(dir, name, &[])
}

/// Loads `path` and returns its object as the symbolizer sees it.
fn load(path: &Path) -> selftrace::modules::Object {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; the fixture has no constructors. Never closed.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen {path:?}");
    selftrace::refresh();
    let canon = std::fs::canonicalize(path).unwrap();
    selftrace::modules::snapshot()
        .objects()
        .iter()
        .find(|o| Path::new(&o.path) == canon || Path::new(&o.path) == path)
        .cloned()
        .unwrap_or_else(|| panic!("{path:?} in the snapshot"))
}

/// Overwrites `bytes.len()` bytes of `file` at `offset`.
fn patch(file: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt as _;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// (file offset of the section header's data, compressed data's offset) of `section`.
fn section_offsets(file: &Path, section: &str) -> (u64, u64) {
    use object::{Object as _, ObjectSection as _};
    let data = std::fs::read(file).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let s = f.section_by_name(section).unwrap();
    let (start, _) = s.file_range().unwrap();
    (start, s.compressed_file_range().unwrap().offset)
}

/// `objcopy --compress-debug-sections=zlib` and `=zstd` of a library: every file:line is the
/// one binutils reads from the uncompressed original. A copy whose `.debug_line` data is
/// corrupt, and one whose compression type is unknown, give no line and say why on the frame.
#[test]
fn objcopy_compressed_sections_are_read_and_bad_ones_are_said() {
    if !have("objcopy") || !have("addr2line") {
        return;
    }
    let dir = work_dir("compressed");
    let plain = build_stfix(&dir, "libstplain.so");
    let svmas = function_addresses(&plain, 0, 4000);
    assert!(svmas.len() >= 100, "{} addresses", svmas.len());
    let zstd_ok = Command::new(target::binutil("objcopy"))
        .args(["--compress-debug-sections=zstd", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    // zlib-gnu: GNU's older `.zdebug_*` sections (a "ZLIB" header, no SHF_COMPRESSED).
    let mut formats = vec!["zlib", "zlib-gnu"];
    if zstd_ok {
        formats.push("zstd");
    } else {
        println!("this objcopy cannot write zstd sections: zlib only");
    }
    for format in formats {
        let name = format!("libst{format}.so");
        run(
            "objcopy",
            &dir,
            &[
                &format!("--compress-debug-sections={format}"),
                "libstplain.so",
                &name,
            ],
        );
        let lib = dir.join(&name);
        if format == "zlib-gnu" {
            use object::{Object as _, ObjectSection as _};
            let data = std::fs::read(&lib).unwrap();
            let f = object::File::parse(&*data).unwrap();
            let zdebug = f.sections().any(|s| s.name() == Ok(".zdebug_line"));
            assert!(zdebug, "{format}: no .zdebug_line");
        } else {
            let compressed = compressed_debug_sections(&lib);
            assert!(
                compressed.iter().any(|s| s == ".debug_line"),
                "{format}: {compressed:?}"
            );
        }
        let obj = load(&lib);
        let (same, they, we) = compare_lines(&obj, &target::binutil("addr2line"), &plain, &svmas);
        println!(
            "{format}: {same} of {} match; lines binutils {they}, ours {we}",
            svmas.len()
        );
        assert_eq!(
            same,
            svmas.len(),
            "{format}: every address as binutils gives it"
        );
        assert!(they > svmas.len() / 2, "the fixture has lines");
    }

    // Corrupt compressed data: the frame has no line and says which section.
    run(
        "objcopy",
        &dir,
        &[
            "--compress-debug-sections=zlib",
            "libstplain.so",
            "libstcorrupt.so",
        ],
    );
    let corrupt = dir.join("libstcorrupt.so");
    let (_, data) = section_offsets(&corrupt, ".debug_line");
    patch(&corrupt, data + 2, &[0xff; 24]);
    // An unknown compression type (ELF gABI types are 1 zlib, 2 zstd).
    run(
        "objcopy",
        &dir,
        &[
            "--compress-debug-sections=zlib",
            "libstplain.so",
            "libstunknown.so",
        ],
    );
    let unknown = dir.join("libstunknown.so");
    let (header, _) = section_offsets(&unknown, ".debug_info");
    patch(&unknown, header, &0x7ff0u32.to_le_bytes());
    for (lib, want) in [
        (
            &corrupt,
            symbolize::NoLine::Unreadable {
                section: ".debug_line",
            },
        ),
        (
            &unknown,
            symbolize::NoLine::UnsupportedCompression {
                section: ".debug_info",
            },
        ),
    ] {
        let obj = load(lib);
        let frame = symbolize::BacktraceFrame::resolve(
            obj.bias + svmas[svmas.len() / 2] as usize,
            FrameKind::Exact,
        );
        assert!(
            frame.symbols().iter().all(|s| s.line.is_none()),
            "{lib:?}: {frame:?}"
        );
        assert!(
            frame.name().is_some_and(|n| n.starts_with("st_")),
            "{lib:?}: {frame:?}"
        );
        assert_eq!(frame.no_line, Some(want), "{lib:?}");
        let shown = format!(
            "{:#}",
            selftrace::Backtrace::from_addresses(&[frame.addr], true)
        );
        assert!(
            shown.contains(&format!("(no file:line: {want})")),
            "{shown}"
        );
    }
}

/// Split DWARF (`gcc -gsplit-dwarf`: the object keeps skeleton units, the rest is in a `.dwo`
/// file beside it): file:line and inlined functions as binutils reads them from the same code
/// built without splitting. Without its `.dwo`, the skeleton's line table alone would give
/// `st_hidden`'s line under `st_alpha`'s name (binutils and elfutils print that): the frame
/// has no line and says the `.dwo` is missing.
#[test]
fn split_dwarf_is_read_from_its_dwo_and_a_missing_one_is_said() {
    if !have("addr2line") {
        return;
    }
    let dir = work_dir("split");
    let plain = build_stfix(&dir, "libstplain.so");
    let split = build_stfix_with(&dir, "libstsplit.so", &["-gsplit-dwarf"]);
    let dwo = dir.join("libstsplit.so-stfix.dwo");
    assert!(dwo.exists(), "gcc wrote no {dwo:?}");
    let svmas = function_addresses(&plain, 0, 4000);
    let obj = load(&split);
    let (same, they, we) = compare_lines(&obj, &target::binutil("addr2line"), &plain, &svmas);
    println!(
        "split: {same} of {} match; lines binutils {they}, ours {we}",
        svmas.len()
    );
    assert_eq!(
        same,
        svmas.len(),
        "every address as binutils gives it for the plain build"
    );
    // An inlined function is there: the .dwo was read.
    let inlined = svmas.iter().any(|&a| {
        symbolize::BacktraceFrame::resolve(obj.bias + a as usize, FrameKind::Exact)
            .symbols()
            .iter()
            .any(|s| s.inlined)
    });
    assert!(inlined, "no inlined function found: the .dwo was not read");

    // The same library whose .dwo is gone.
    let gone = build_stfix_with(&dir, "libstgone.so", &["-gsplit-dwarf"]);
    std::fs::remove_file(dir.join("libstgone.so-stfix.dwo")).unwrap();
    let obj = load(&gone);
    let frame = symbolize::BacktraceFrame::resolve(obj.bias + svmas[0] as usize, FrameKind::Exact);
    assert!(
        frame.symbols().iter().all(|s| s.line.is_none()),
        "{frame:?}"
    );
    match frame.no_line {
        Some(symbolize::NoLine::SplitDwarfMissing { dwo }) => {
            assert!(dwo.ends_with("/libstgone.so-stfix.dwo"), "{dwo}")
        }
        other => panic!("{other:?}: {frame:?}"),
    }
}
