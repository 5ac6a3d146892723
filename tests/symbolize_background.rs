//! The background indexer: an object that maps at least `set_background_index` bytes is named
//! only once its table is built by the `selftrace-index` thread, and never wrongly meanwhile;
//! `prepare` waits for it; a child forked while the indexer works (it has no indexer) builds
//! the table itself instead of waiting forever.
//!
//! Two objects this project did not build, each `dlopen`ed after `init`: a copy of the
//! system's zlib with the threshold at 0 (every new object goes to the indexer), and, where the
//! toolchain has it (x86-64), rustup's `libLLVM` (200 MB, 150,000 functions) with the default
//! threshold of 64 MiB. The names are checked against the files' own symbol tables, read with
//! `object`. One test in this binary: it forks.

#[path = "support/sysroot.rs"]
mod sysroot;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use selftrace::symbolize::{self, SymbolSource};
use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// Function symbols of `file` (link-time address -> every name there), in executable sections:
/// from `.symtab`, or `.dynsym` for a stripped file (Debian's zlib).
fn functions(file: &Path) -> HashMap<u64, Vec<Vec<u8>>> {
    let data = std::fs::read(file).expect("read the library");
    let obj = object::File::parse(&*data).expect("parse the library");
    let mut out: HashMap<u64, Vec<Vec<u8>>> = HashMap::new();
    let symbols: Vec<_> = if obj.symbols().next().is_some() {
        obj.symbols().collect()
    } else {
        obj.dynamic_symbols().collect()
    };
    for s in symbols {
        let exec = s
            .section_index()
            .and_then(|i| obj.section_by_index(i).ok())
            .is_some_and(|sec| sec.kind() == object::SectionKind::Text);
        if s.kind() == object::SymbolKind::Text && s.size() > 0 && exec && s.is_definition() {
            if let Ok(name) = s.name_bytes() {
                out.entry(s.address()).or_default().push(name.to_vec());
            }
        }
    }
    out
}

/// Loads `path` and returns its load bias (from the module snapshot after a refresh).
fn load(path: &Path) -> usize {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: dlopen of a shared library by path; its constructors need nothing from us.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    selftrace::refresh();
    let snap = selftrace::modules::snapshot();
    let o = snap
        .objects()
        .iter()
        .find(|o| Path::new(&o.path).file_name() == path.file_name())
        .unwrap_or_else(|| panic!("{} in the snapshot", path.display()));
    o.bias
}

/// What one lookup of `pc` gave: `Pending` with no name, or a name that must be one of
/// `names` (the symbol starting at `pc`). Returns whether it was pending.
fn check(pc: usize, names: &[Vec<u8>], what: &str) -> bool {
    let s = symbolize::symbolize(pc).unwrap_or_else(|| panic!("{what}: nothing at {pc:#x}"));
    if s.source == SymbolSource::Pending {
        assert_eq!(s.name, None, "{what}: a pending object has no names yet");
        return true;
    }
    let got = s
        .name
        .unwrap_or_else(|| panic!("{what}: no name at {pc:#x}"));
    assert!(
        names.iter().any(|n| got == n.as_slice()),
        "{what} at {pc:#x}: {got:?}, the file has {:?}",
        names
            .iter()
            .map(|n| String::from_utf8_lossy(n))
            .collect::<Vec<_>>()
    );
    assert_eq!(s.start, pc, "{what}");
    false
}

/// Up to `n` function addresses of `want`, spread over it.
fn sample(want: &HashMap<u64, Vec<Vec<u8>>>, n: usize) -> Vec<(u64, &Vec<Vec<u8>>)> {
    let mut all: Vec<_> = want.iter().map(|(a, v)| (*a, v)).collect();
    all.sort_by_key(|e| e.0);
    let step = (all.len() / n).max(1);
    all.into_iter().step_by(step).collect()
}

/// Loads `path` (its table goes to the indexer) and checks, while the indexer works and
/// after `prepare`, every sampled function's name; forks a child meanwhile, which must name
/// them too after its own `prepare`. Returns how many lookups found the object pending.
fn exercise(path: &Path, what: &str) -> usize {
    let want = functions(path);
    assert!(want.len() > 20, "{what}: {} functions", want.len());
    let bias = load(path);
    let picks = sample(&want, 400);
    // At once, in a child of this moment: its copy of the indexer's job has nobody to build
    // it in the child, whose `prepare` must build it itself.
    // SAFETY: fork in a process whose other threads hold no lock the child takes (this binary
    // runs one test; the indexer takes no lock); the child calls selftrace, writes with
    // write(2) and leaves with _exit, or dies of SIGALRM if it hangs.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: alarm has no preconditions; its default action ends a hung child.
        unsafe { libc::alarm(120) };
        let pending_at_fork = picks
            .iter()
            .filter(|(a, _)| {
                symbolize::symbolize(bias + *a as usize)
                    .is_some_and(|s| s.source == SymbolSource::Pending)
            })
            .count();
        let ok = std::panic::catch_unwind(|| {
            symbolize::prepare().expect("prepare");
            for (a, names) in &picks {
                assert!(
                    !check(bias + *a as usize, names, what),
                    "named after prepare"
                );
            }
        })
        .is_ok();
        let line = format!("child: {pending_at_fork} pending at fork, named: {ok}\n");
        // SAFETY: write(2) of a valid buffer; _exit ends the child without running the
        // parent's atexit handlers or destructors.
        unsafe {
            libc::write(2, line.as_ptr().cast(), line.len());
            libc::_exit(if ok { 0 } else { 1 });
        }
    }
    assert!(child > 0, "fork");
    // Meanwhile, in this process: pending or right, never wrong.
    let mut pending = 0;
    for _ in 0..5 {
        for (a, names) in &picks {
            pending += usize::from(check(bias + *a as usize, names, what));
        }
    }
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid status pointer.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{what}: the forked child did not name the object ({status:#x})"
    );
    symbolize::prepare().expect("prepare");
    for (a, names) in &picks {
        assert!(
            !check(bias + *a as usize, names, what),
            "{what}: named after prepare"
        );
    }
    let s = symbolize::symbolize(bias + picks[0].0 as usize).unwrap();
    assert!(
        matches!(s.source, SymbolSource::Symtab | SymbolSource::Dynsym),
        "{what}: {:?}",
        s.source
    );
    println!(
        "{what}: {} functions sampled; {pending} of {} lookups before prepare found it pending",
        picks.len(),
        5 * picks.len()
    );
    pending
}

/// The system's zlib, copied to a new path (a new object for the index), named after `n`.
fn zlib_copy(n: usize) -> PathBuf {
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    let src = ["/lib", "/usr/lib"]
        .iter()
        .map(|d| PathBuf::from(d).join(&triple).join("libz.so.1"))
        .find(|p| p.exists())
        .expect("the system's libz.so.1 (zlib1g)");
    let dir = std::env::temp_dir().join(format!("selftrace-bg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dst = dir.join(format!("libz-selftrace-copy{n}.so"));
    std::fs::copy(&src, &dst).unwrap();
    dst
}

/// Loads eight more copies of zlib (eight queued tables) and forks children one after the
/// other while the indexer builds them, so that forks land at every point of its work:
/// claiming a table, building it, publishing it, ending. Each child must name a function of
/// every copy after its own `prepare` (a child that hangs dies of SIGALRM and fails the test).
fn forks_while_the_indexer_works() {
    let copies: Vec<(usize, u64, Vec<Vec<u8>>)> = (1..=8)
        .map(|n| {
            let p = zlib_copy(n);
            let want = functions(&p);
            let (addr, names) = sample(&want, 1)[0];
            let names = names.clone();
            let c = CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: dlopen of a copy of the system's zlib; its constructors need nothing.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            assert!(!h.is_null(), "dlopen {}", p.display());
            (n, addr, names)
        })
        .collect();
    // One refresh queues all eight; the indexer starts on them now.
    selftrace::refresh();
    let snap = selftrace::modules::snapshot();
    let bias_of = |n: usize| {
        let file = format!("libz-selftrace-copy{n}.so");
        snap.objects()
            .iter()
            .find(|o| {
                Path::new(&o.path)
                    .file_name()
                    .is_some_and(|f| f == file.as_str())
            })
            .map(|o| o.bias)
            .expect("the copy in the snapshot")
    };
    let targets: Vec<(usize, Vec<Vec<u8>>)> = copies
        .iter()
        .map(|(n, a, names)| (bias_of(*n) + *a as usize, names.clone()))
        .collect();
    let mut children = Vec::new();
    let mut pending_at_forks = 0;
    let mut forks_during = 0;
    for i in 0..64 {
        let pending = targets
            .iter()
            .filter(|(pc, _)| {
                symbolize::symbolize(*pc).is_some_and(|s| s.source == SymbolSource::Pending)
            })
            .count();
        pending_at_forks += pending;
        if pending == 0 && i >= 16 {
            break;
        }
        // SAFETY: as in `exercise`: the only other thread is the indexer, which takes no lock;
        // the child uses selftrace and leaves with _exit, or dies of SIGALRM if it hangs.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: alarm has no preconditions.
            unsafe { libc::alarm(120) };
            let ok = std::panic::catch_unwind(|| {
                symbolize::prepare().expect("prepare");
                for (pc, names) in &targets {
                    assert!(!check(*pc, names, "zlib copy in a child"));
                }
            })
            .is_ok();
            // SAFETY: _exit ends the child without the parent's atexit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(child > 0, "fork");
        children.push(child);
        forks_during += usize::from(pending > 0);
    }
    let children_n = children.len();
    for child in children {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "a child forked while the indexer worked did not name every copy ({status:#x}; \
             14 is SIGALRM: it hung)"
        );
    }
    symbolize::prepare().expect("prepare");
    for (pc, names) in &targets {
        assert!(!check(*pc, names, "zlib copy"), "named after prepare");
    }
    println!(
        "forks while indexing: {forks_during} of {} forks found a copy pending \
         ({pending_at_forks} pending lookups)",
        children_n
    );
}

#[test]
fn large_objects_are_named_by_the_background_indexer_and_never_wrongly_before() {
    selftrace::init().expect("init");
    // Every object seen from now on goes to the indexer.
    symbolize::set_background_index(Some(0));
    let z = zlib_copy(0);
    exercise(&z, "zlib copy");
    forks_while_the_indexer_works();
    let _ = std::fs::remove_dir_all(z.parent().unwrap());
    // The default: objects of 64 MiB and more.
    symbolize::set_background_index(Some(64 << 20));
    if let Some(p) = sysroot::rustup_llvm_for_test("zlib only") {
        exercise(&p, "libLLVM");
    }
}
