//! Symbolization: a known chain with file:line and inlined frames, glibc's `backtrace_symbols`
//! byte for byte, binutils' `addr2line`, and bad input.

use crate::addr2line;
use crate::target;
use selftrace::symbolize::{
    self, write_kernel_frame, Backtrace, BacktraceFrame, FrameKind, KernelOptions, SymbolsOptions,
};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

extern "C" {
    fn backtrace_symbols(buffer: *const *mut c_void, size: c_int) -> *mut *mut c_char;
    fn backtrace_symbols_fd(buffer: *const *mut c_void, size: c_int, fd: c_int);
}

/// Tests that dlopen or refresh run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn prepare() {
    selftrace::symbolize::prepare().expect("prepare");
}

// ---- a known chain, with an inlined function -------------------------------------------------

struct Seen {
    outer_call: u32,
    middle_call: u32,
    inlined_call: u32,
}

// Each call passes `line!()` in its own argument list, so the recorded line is the call's line
// whatever the formatting.

#[inline(never)]
fn sym_outer(seen: &mut Seen) -> Backtrace {
    let bt = sym_middle(seen, line!());
    black_box(());
    bt
}

#[inline(never)]
fn sym_middle(seen: &mut Seen, caller: u32) -> Backtrace {
    seen.outer_call = caller;
    let bt = sym_inlined(seen, line!());
    black_box(());
    bt
}

#[inline(always)]
fn sym_inlined(seen: &mut Seen, caller: u32) -> Backtrace {
    seen.middle_call = caller;
    let (bt, here) = (Backtrace::capture(), line!());
    seen.inlined_call = here;
    black_box(&*seen);
    bt
}

#[test]
fn known_chain_has_names_lines_and_inlined_frames() {
    prepare();
    let mut seen = Seen {
        outer_call: 0,
        middle_call: 0,
        inlined_call: 0,
    };
    let (bt, test_line) = (sym_outer(&mut seen), line!());
    let short = bt.short_frames();
    let text = format!("{bt}");
    println!("{text}\n{bt:#}");
    // Frame 0 of the short form: sym_middle's physical frame, with sym_inlined inlined in it.
    let f0 = &short[0];
    assert_eq!(f0.symbols().len(), 2, "{f0:?}");
    let (inl, phys) = (&f0.symbols()[0], &f0.symbols()[1]);
    assert_eq!(inl.name.as_deref(), Some("symbolize::names::sym_inlined"));
    assert!(inl.inlined);
    assert_eq!(inl.line, Some(seen.inlined_call));
    assert!(inl.file.unwrap().ends_with("tests/symbolize/names.rs"));
    assert!(inl.column.is_some());
    assert_eq!(phys.name.as_deref(), Some("symbolize::names::sym_middle"));
    assert!(!phys.inlined);
    assert_eq!(phys.line, Some(seen.middle_call));
    let f1 = &short[1];
    assert_eq!(f1.name(), Some("symbolize::names::sym_outer"));
    assert_eq!(f1.symbols().last().unwrap().line, Some(seen.outer_call));
    // This test's function: the frame's own function, or (in a release build) inlined into
    // the harness's closure and that into `FnOnce::call_once`.
    let f2 = &short[2];
    let this = f2
        .symbols()
        .iter()
        .find(|s| {
            s.name.as_deref()
                == Some("symbolize::names::known_chain_has_names_lines_and_inlined_frames")
        })
        .unwrap_or_else(|| panic!("frame 2 is this test's: {f2:?}"));
    assert_eq!(this.line, Some(test_line));
    if cfg!(debug_assertions) {
        assert_eq!(
            f2.name(),
            Some("symbolize::names::known_chain_has_names_lines_and_inlined_frames"),
            "its own frame in a debug build"
        );
    }
    // The short form hides Backtrace::capture and the start-up frames; the full one shows all.
    assert!(!text.contains("Backtrace::capture"), "{text}");
    assert!(
        !text.contains("__libc_start") && !text.contains("start_thread"),
        "{text}"
    );
    assert!(
        text.contains("symbolize::names::sym_inlined [inlined]"),
        "{text}"
    );
    assert!(
        text.contains(&format!("tests/symbolize/names.rs:{}:", seen.middle_call)),
        "{text}"
    );
    let full = format!("{bt:#}");
    assert!(full.contains("Backtrace::capture"), "{full}");
    assert!(
        full.contains("start_thread") || full.contains("clone"),
        "{full}"
    );
    assert!(bt.frames().len() > short.len());
    // The AS-safe name lookup agrees with DWARF on the physical functions.
    for f in short.iter().take(3) {
        let s = selftrace::symbolize(f.kind.lookup_address(f.addr)).expect("symbol");
        let mut buf = [0u8; 256];
        assert_eq!(s.demangle_into(&mut buf), f.name());
    }
}

#[test]
fn kernel_format_names_offsets_and_objects() {
    prepare();
    let f = sym_outer as fn(&mut Seen) -> Backtrace as usize;
    let s = selftrace::symbolize(f + 4).expect("symbol");
    assert_eq!(s.offset(), 4);
    assert!(s.size > 4);
    let mut buf = [0u8; 512];
    let n = write_kernel_frame(&mut buf, f + 4, FrameKind::Exact, KernelOptions::default());
    let line = std::str::from_utf8(&buf[..n]).unwrap();
    let exe = std::env::current_exe().unwrap();
    let exe_name = exe.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        line,
        format!(
            "{:#x} : symbolize::names::sym_outer+0x4/{:#x} [{exe_name}]",
            f + 4,
            s.size
        )
    );
    let opts = KernelOptions {
        demangle: false,
        object_offset: true,
        build_id: true,
    };
    let n = write_kernel_frame(&mut buf, f + 5, FrameKind::Return, opts);
    let line = std::str::from_utf8(&buf[..n]).unwrap();
    let id: String = s.build_id.iter().map(|b| format!("{b:02x}")).collect();
    assert!(!id.is_empty());
    let raw = s.name_string().unwrap();
    assert!(raw.starts_with("_ZN") || raw.starts_with("_R"), "{raw}");
    assert_eq!(
        line,
        format!(
            "{:#x} : {raw}+0x5/{:#x} [{exe_name}+{:#x} {id}]",
            f + 5,
            s.size,
            f + 5 - s.bias
        )
    );
    // Garbage: no object.
    let n = write_kernel_frame(&mut buf, 0x10, FrameKind::Return, KernelOptions::default());
    assert_eq!(&buf[..n], b"0x10 : ??");
    // A buffer too small is cut, never overrun.
    let mut tiny = [0u8; 7];
    assert_eq!(write_kernel_frame(&mut tiny, f, FrameKind::Exact, opts), 7);
}

// ---- glibc differential ---------------------------------------------------------------------

fn fixture_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("selftrace-fixtures");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Builds tests/fixtures/stfix.c into a shared library named `name`.
fn build_fixture(name: &str) -> PathBuf {
    let out = fixture_dir().join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stfix.c");
    let st = Command::new(target::cc())
        .args(["-shared", "-fPIC", "-O0", "-g", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("gcc (needed to build the test fixture)");
    assert!(st.success(), "gcc failed");
    out
}

fn dlopen(path: &Path) -> *mut c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; the library has no constructors with preconditions.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen {path:?}");
    h
}

fn dlsym(h: *mut c_void, name: &CStr) -> usize {
    // SAFETY: h is a live handle, name NUL-terminated.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    assert!(!p.is_null(), "{name:?}");
    p as usize
}

fn glibc_strings(addrs: &[usize]) -> Vec<String> {
    let ptrs: Vec<*mut c_void> = addrs.iter().map(|&a| a as *mut c_void).collect();
    // SAFETY: ptrs holds addrs.len() pointers; glibc returns one malloc'd block we free.
    unsafe {
        let out = backtrace_symbols(ptrs.as_ptr(), ptrs.len() as c_int);
        assert!(!out.is_null());
        let v = (0..addrs.len())
            .map(|i| CStr::from_ptr(*out.add(i)).to_string_lossy().into_owned())
            .collect();
        libc::free(out.cast());
        v
    }
}

/// Runs `f(fd)` with a pipe's write end and returns what it wrote.
fn capture_fd(f: impl FnOnce(c_int)) -> Vec<u8> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: fds is a writable array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    f(fds[1]);
    // SAFETY: closing our own write end.
    unsafe { libc::close(fds[1]) };
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into a local buffer from our own read end.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: closing our own read end.
    unsafe { libc::close(fds[0]) };
    out
}

fn glibc_fd(addrs: &[usize]) -> Vec<u8> {
    let ptrs: Vec<*mut c_void> = addrs.iter().map(|&a| a as *mut c_void).collect();
    // Few lines: the pipe's buffer holds them all.
    // SAFETY: ptrs holds addrs.len() pointers; fd is a pipe's write end.
    capture_fd(|fd| unsafe { backtrace_symbols_fd(ptrs.as_ptr(), ptrs.len() as c_int, fd) })
}

#[test]
fn backtrace_symbols_matches_glibc_byte_for_byte() {
    let _g = SERIAL.lock().unwrap();
    prepare();
    let lib = build_fixture("libstfix-glibc.so");
    let h = dlopen(&lib);
    // The new object is picked up by a refresh (backtrace_symbols would also notice it).
    selftrace::refresh();
    prepare();
    let alpha = dlsym(h, c"st_alpha");
    let beta = dlsym(h, c"st_beta");
    let data = dlsym(h, c"st_data");
    let mut exported = Vec::new();
    for f in [alpha, beta] {
        for off in [0usize, 1, 2, 7, 8, 15, 16] {
            exported.push(f + off);
        }
    }
    // Exported symbols: our default (which also names local functions) equals glibc.
    let ours = selftrace::backtrace_symbols(&exported);
    let theirs = glibc_strings(&exported);
    assert_eq!(ours, theirs);
    assert!(
        theirs[0].starts_with(&format!("{}(st_alpha+0) [0x", lib.display())),
        "{}",
        theirs[0]
    );
    assert!(theirs[1].contains("(st_alpha+0x1) ["), "{}", theirs[1]);
    let ours_fd = capture_fd(|fd| selftrace::backtrace_symbols_fd(&exported, borrowed(fd)));
    assert_eq!(
        String::from_utf8_lossy(&ours_fd),
        String::from_utf8_lossy(&glibc_fd(&exported))
    );

    // Everything else too, in glibc's naming mode: a static function, data, the main program
    // (argv[0]), libc (aliases), the vDSO, no object, zero.
    // SAFETY: st_hidden_addr takes no arguments and returns a code address.
    let hidden = unsafe {
        let f: extern "C" fn() -> usize = std::mem::transmute(dlsym(h, c"st_hidden_addr"));
        f()
    };
    let main_fn = backtrace_symbols_matches_glibc_byte_for_byte as fn() as usize;
    let vdso = selftrace::modules::snapshot()
        .objects()
        .iter()
        .find(|o| o.is_vdso)
        .map(|o| o.exec[0].start + 0x10);
    let mut all = vec![hidden, hidden + 3, data, data + 2, main_fn, main_fn + 5];
    for f in [
        libc::getpid as *const () as usize,
        libc::malloc as *const () as usize,
        libc::write as *const () as usize,
        libc::memcpy as *const () as usize,
    ] {
        all.extend([f, f + 1, f + 9]);
    }
    all.extend(vdso);
    all.extend([0, 0x10, usize::MAX - 5]);
    let glibc = SymbolsOptions {
        demangle: false,
        exported_only: true,
    };
    let ours = selftrace::symbolize::backtrace_symbols_with(&all, glibc);
    let theirs = glibc_strings(&all);
    for (i, (o, t)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(o, t, "address {i}: {:#x}", all[i]);
    }
    assert_eq!(ours.len(), theirs.len());
    assert!(theirs.iter().any(|l| l == "[(nil)]"));
    assert!(theirs[0].contains("(+0x"), "{}", theirs[0]);
    let ours_fd = capture_fd(|fd| symbolize::backtrace_symbols_fd_with(&all, borrowed(fd), glibc));
    assert_eq!(
        String::from_utf8_lossy(&ours_fd),
        String::from_utf8_lossy(&glibc_fd(&all))
    );

    // The default mode names the static function that glibc cannot.
    let named = selftrace::backtrace_symbols(&[hidden + 3]);
    assert_eq!(
        named[0],
        format!("{}(st_hidden+0x3) [{:#x}]", lib.display(), hidden + 3)
    );
    // And demangles on request.
    let demangled = symbolize::backtrace_symbols_with(
        &[main_fn],
        SymbolsOptions {
            demangle: true,
            exported_only: false,
        },
    );
    assert!(
        demangled[0]
            .contains("(symbolize::names::backtrace_symbols_matches_glibc_byte_for_byte+0)"),
        "{}",
        demangled[0]
    );
}

// ---- binutils differential ------------------------------------------------------------------

#[test]
fn names_and_lines_match_binutils_addr2line() {
    if Command::new(target::binutil("addr2line"))
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none(),
            "addr2line (binutils) is required"
        );
        println!("skipped: addr2line (binutils) not installed");
        return;
    }
    prepare();
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let main = selftrace::modules::snapshot()
        .objects()
        .iter()
        .find(|o| o.is_main)
        .cloned()
        .unwrap();
    // Functions of the test binary: this file's, the crate's, std's. Pick 150 spread out.
    let oracle = oracle_syms();
    let step = (oracle.len() / 150).max(1);
    let addrs: Vec<usize> = oracle
        .iter()
        .step_by(step)
        .take(160)
        .map(|&(start, size)| start + size / 2)
        .filter(|&a| main.is_code(a))
        .collect();
    assert!(addrs.len() >= 100, "{}", addrs.len());
    let svmas: Vec<u64> = addrs.iter().map(|a| (a - main.bias) as u64).collect();
    let theirs = addr2line::run(&target::binutil("addr2line"), &exe, &svmas);
    let (mut name_ok, mut line_ok, mut frames) = (0, 0, 0);
    let mut mismatches = Vec::new();
    for (a, t) in addrs.iter().zip(&theirs) {
        let ours = BacktraceFrame::resolve(*a, FrameKind::Exact);
        assert_eq!(ours.symbols().len(), t.len(), "{a:#x}: {ours:?} vs {t:?}");
        for (o, (tf, tfile, tline)) in ours.symbols().iter().zip(t) {
            frames += 1;
            let same_line = match tline {
                // binutils prints `??:0` or the unit's name without a line: no line info.
                None => o.line.is_none(),
                Some(_) => {
                    o.line == *tline && o.file.is_some_and(|f| addr2line::same_file(f, tfile))
                }
            };
            if same_line {
                line_ok += 1;
            } else {
                mismatches.push(format!("{a:#x} line: {o:?} vs {tfile}:{tline:?}"));
            }
            if o.name.as_deref() == Some(tf.as_str())
                || same_name(o.name.as_deref().unwrap_or("??"), tf)
            {
                name_ok += 1;
            } else {
                mismatches.push(format!("{a:#x} name: {:?} vs {tf}", o.name));
            }
        }
    }
    println!(
        "{frames} frames of {} addresses; mismatches:\n{}",
        addrs.len(),
        mismatches.join("\n")
    );
    assert_eq!(line_ok, frames, "{mismatches:#?}");
    assert_eq!(name_ok, frames, "{mismatches:#?}");
}

/// libiberty and rustc-demangle spell a few things differently; compare modulo those.
fn same_name(ours: &str, theirs: &str) -> bool {
    let norm = |s: &str| s.replace(' ', "").replace("{{closure}}", "{closure}");
    norm(ours) == norm(theirs)
}

/// (run-time start, size) of the test binary's function symbols with a size of 16 or more.
fn oracle_syms() -> Vec<(usize, usize)> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let data = std::fs::read("/proc/self/exe").unwrap();
    let file = object::File::parse(&*data).unwrap();
    let bias = selftrace::modules::snapshot()
        .objects()
        .iter()
        .find(|o| o.is_main)
        .unwrap()
        .bias;
    let mut v: Vec<(usize, usize)> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() >= 16)
        .map(|s| (s.address() as usize + bias, s.size() as usize))
        .collect();
    v.sort();
    v.dedup_by_key(|e| e.0);
    v
}

// ---- bad input ------------------------------------------------------------------------------

#[test]
fn bad_input_gets_placeholders() {
    let _g = SERIAL.lock().unwrap();
    prepare();
    // Zero and garbage.
    for a in [0usize, 1, 0x10, 0xdead_beef, usize::MAX, usize::MAX - 1] {
        assert!(selftrace::symbolize(a).is_none(), "{a:#x}");
        assert_eq!(
            selftrace::backtrace_symbols(&[a])[0],
            if a == 0 {
                "[(nil)]".into()
            } else {
                format!("[{a:#x}]")
            }
        );
    }
    let bt = Backtrace::from_addresses(&[0, 1, usize::MAX, 0x10], false);
    let text = format!("{bt:#}");
    assert_eq!(text.matches("<unknown>").count(), 4, "{text}");
    // Anonymous executable memory.
    // SAFETY: a fresh anonymous mapping that nothing else uses.
    let anon = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(anon, libc::MAP_FAILED);
    let a = anon as usize + 0x40;
    assert!(selftrace::symbolize(a).is_none());
    assert!(!symbolize::is_signal_trampoline(a));
    assert_eq!(selftrace::backtrace_symbols(&[a])[0], format!("[{a:#x}]"));
    let bt = Backtrace::from_addresses(&[a], true);
    assert_eq!(bt.frames()[0].symbols().len(), 0);
    // The vDSO: an object without a file, named from its image in memory. (qemu-user 7.2 maps
    // none: AT_SYSINFO_EHDR is 0 there.)
    // SAFETY: getauxval has no preconditions.
    if unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } == 0 {
        eprintln!("bad_input_gets_placeholders: no vDSO in this process (qemu-user): not checked");
        return;
    }
    let vdso = selftrace::modules::snapshot()
        .objects()
        .iter()
        .find(|o| o.is_vdso)
        .cloned()
        .expect("vdso");
    let named = (vdso.exec[0].start..vdso.exec[0].end)
        .step_by(16)
        .filter_map(selftrace::symbolize)
        .filter(|s| s.name.is_some())
        .inspect(|s| assert_eq!(s.path, "[vdso]"))
        .count();
    assert!(named > 0);
    let mut buf = [0u8; 256];
    let n = write_kernel_frame(
        &mut buf,
        vdso.exec[0].start + 4,
        FrameKind::Exact,
        KernelOptions::default(),
    );
    assert!(std::str::from_utf8(&buf[..n])
        .unwrap()
        .ends_with("[[vdso]]"));
    let _ = Backtrace::from_addresses(&[vdso.exec[0].start + 4], true).to_string();
    // An object deleted from disk after it was loaded.
    let lib = build_fixture("libstfix-deleted.so");
    let h = dlopen(&lib);
    std::fs::remove_file(&lib).unwrap();
    selftrace::refresh();
    prepare();
    let alpha = dlsym(h, c"st_alpha");
    let s = selftrace::symbolize(alpha).expect("object still indexed");
    assert_eq!(s.name, None);
    assert_eq!(s.source, symbolize::SymbolSource::None);
    assert_eq!(
        selftrace::backtrace_symbols(&[alpha + 1])[0],
        format!(
            "{}(+{:#x}) [{:#x}]",
            lib.display(),
            alpha + 1 - s.bias,
            alpha + 1
        )
    );
    let text = Backtrace::from_addresses(&[alpha + 1], false).to_string();
    assert!(
        text.contains("<unknown> [") && text.contains("libstfix-deleted.so+0x"),
        "{text}"
    );
}

#[test]
fn index_uses_at_most_28_bytes_per_symbol() {
    prepare();
    let (n, bytes) = symbolize::index_stats();
    let names = symbolize::index_name_bytes();
    println!(
        "symbol index: {n} symbol entries, {bytes} bytes, {:.1} bytes/symbol; names {names} bytes ({:.1}/symbol)",
        bytes as f64 / n as f64,
        names as f64 / n as f64
    );
    assert!(n > 1000);
    // 12-byte entries, and 32-byte page entries at most one per two symbols.
    assert!(bytes <= 28 * n);
}

#[test]
fn second_backtrace_reuses_parsed_dwarf() {
    prepare();
    let a = Backtrace::capture();
    let b = Backtrace::capture();
    assert_eq!(a.frames().len(), b.frames().len());
    // Same stack below this function: the same names, lines included.
    let names = |bt: &Backtrace| {
        // selftrace's own frames, then this function (at two different lines).
        bt.frames()
            .iter()
            .skip_while(|f| f.name().is_some_and(|n| n.starts_with("selftrace::")))
            .skip(1)
            .map(|f| f.symbols().to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&a), names(&b));
}

/// A raw fd of this test's (or 1, stdout), borrowed for one call.
fn borrowed(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the tests pass fds they opened and close only after the call returned.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

#[inline(never)]
fn deep_recursion(n: usize) -> selftrace::Backtrace {
    if n == 0 {
        return selftrace::Backtrace::new_unresolved();
    }
    let bt = deep_recursion(n - 1);
    std::hint::black_box(&bt);
    bt
}

#[test]
fn an_unresolved_backtrace_keeps_a_deep_stack_whole_and_resolves_on_display() {
    prepare();
    // 600 frames of recursion: more than the 256 a backtrace used to keep.
    let handle = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| deep_recursion(600))
        .unwrap();
    let bt = handle.join().unwrap();
    assert!(bt.addresses().len() > 600, "{}", bt.addresses().len());
    // Not cut for lack of room; a walk that stopped early (on any machine) says so at the end.
    let end = bt
        .walk_end()
        .expect("a captured backtrace knows how its walk ended");
    assert_ne!(end, selftrace::WalkEnd::BufferFull);
    let text = format!("{bt:#}");
    assert_eq!(
        text.matches("symbolize::names::deep_recursion").count(),
        601,
        "{text}"
    );
    assert_eq!(
        text.contains("(stack truncated: "),
        matches!(end, selftrace::WalkEnd::Truncated(_)),
        "{text}"
    );
}
