//! The symbol index at scale: a program that loads rustc's `librustc_driver` (and with it
//! `libLLVM`: together some 350 MB of code and 256,600 function symbols, from the rustup
//! toolchain that builds this bench).
//!
//! Each measurement runs in a fresh child process, which `dlopen`s the driver (with
//! `GLIBC_TUNABLES=glibc.rtld.optional_static_tls=67108864`, without which glibc refuses its
//! static TLS) and then:
//! * `selftrace`: `selftrace::init()` before the `dlopen`, then the time of the
//!   `selftrace::refresh()` that indexes the two objects (both map more than 64 MiB, so their
//!   tables are built by the background indexer), the time until `symbolize::prepare()` has
//!   every name in, the CPU time of all threads meanwhile, and the resident memory added;
//! * `selftrace_sync`: the same with `symbolize::set_background_index(None)`: `refresh` builds
//!   every table itself;
//! * `backtrace_crate`: the time of the first `backtrace::resolve` of an address in the
//!   driver, its CPU time, and the resident memory it added.
//!
//! Then both look up 2,000 pseudo-random addresses in the driver's code, each once, and copy
//! the name out (cold: the addresses are spread over 146 MB, so few lookups share a page of
//! the index); then 2,000 other addresses after writing 256 MB, so that none of the index is
//! in a cache (a crash handler's lookup long after start-up).
//!
//! criterion times the index build (`refresh`) and the first resolution; a summary line per
//! tool, from children alternating between the two, gives the rest.

#[path = "../tests/support/sysroot.rs"]
mod sysroot;

use criterion::{criterion_group, Criterion};
use std::ffi::CString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SELFTRACE_SCALE_CHILD";
const TUNABLES: &str = "glibc.rtld.optional_static_tls=67108864";
const LOOKUPS: usize = 2000;

/// The rustup toolchain's `librustc_driver-*.so`, if there is one.
fn driver() -> Option<PathBuf> {
    sysroot::lib_file(|n| n.starts_with("librustc_driver-") && n.ends_with(".so"))
}

/// Resident memory of this process, in bytes (`/proc/self/statm`).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Resident memory of this process by kind, in bytes: (anonymous, file pages), from
/// `/proc/self/status` (`RssAnon`, `RssFile`).
fn resident_kinds() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (kb("RssAnon:") * 1024, kb("RssFile:") * 1024)
}

/// Bytes of `.eh_frame` and `.eh_frame_hdr` of the loaded objects whose file name starts with
/// one of `prefixes`: what selftrace's unwinder copies of objects that can be unloaded.
fn unwind_table_bytes(prefixes: &[&str]) -> u64 {
    let snap = selftrace::modules::snapshot();
    snap.objects()
        .iter()
        .filter(|o| {
            let name = std::path::Path::new(&o.path).file_name();
            let name = name.and_then(|n| n.to_str()).unwrap_or("");
            prefixes.iter().any(|p| name.starts_with(p))
        })
        .map(|o| {
            let len = |r: &Option<std::ops::Range<usize>>| r.as_ref().map_or(0, |r| r.len());
            (len(&o.eh_frame) + len(&o.eh_frame_hdr)) as u64
        })
        .sum()
}

/// Function symbols of the files whose `.symtab` `object` reads (defined, typed as code, in
/// code sections): the "per function symbol".
fn function_symbols(files: &[std::path::PathBuf]) -> usize {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    files
        .iter()
        .map(|f| {
            let data = std::fs::read(f).expect("read");
            let obj = object::File::parse(&*data).expect("parse");
            obj.symbols()
                .filter(|s| {
                    s.kind() == object::SymbolKind::Text
                        && s.is_definition()
                        && s.section_index()
                            .and_then(|i| obj.section_by_index(i).ok())
                            .is_some_and(|sec| sec.kind() == object::SectionKind::Text)
                })
                .count()
        })
        .sum()
}

/// The loaded driver's executable segment: (start, len).
fn driver_code(name: &str) -> (usize, usize) {
    use findshlibs::{Segment, SharedLibrary, TargetSharedLibrary};
    let mut code = None;
    TargetSharedLibrary::each(|lib| {
        if lib.name().to_string_lossy().ends_with(name) {
            for s in lib.segments() {
                if s.is_code() {
                    let start = s.actual_virtual_memory_address(lib).0;
                    code = Some((start, s.len()));
                }
            }
        }
    });
    code.expect("the driver's code segment")
}

/// `LOOKUPS` addresses spread over `code` (a fixed xorshift sequence from `seed`).
fn addresses((start, len): (usize, usize), seed: u64) -> Vec<usize> {
    let mut x: u64 = seed;
    (0..LOOKUPS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            start + (x as usize % len)
        })
        .collect()
}

/// In a child: `build_ns complete_ns cpu_ns resident_delta anon_delta file_delta
/// unwind_table_bytes lookup_ns_per_address named_addresses symbols index_bytes name_bytes`:
/// the time `refresh` (or the first resolution) took, the time until every name was in
/// (selftrace's background indexer done), the CPU time of all threads meanwhile, then (after
/// that) the resident memory added (all, anonymous, file pages), the bytes of the two objects'
/// unwind tables (which selftrace copies: they can be unloaded), the cold lookups, selftrace's
/// whole symbol index, all objects (zero for the backtrace crate), and `flushed_lookup_ns`: the
/// lookups of other addresses after 256 MB were written.
fn child(which: &str, path: &str) -> String {
    if which == "selftrace" {
        let t = Instant::now();
        selftrace::init().expect("init");
        if std::env::var_os("SCALE_INIT_TIME").is_some() {
            eprintln!("init {:?}", t.elapsed());
        }
    }
    if which == "selftrace_init_only" {
        selftrace::init().expect("init");
        std::process::exit(0);
    }
    if which == "selftrace_sync" {
        selftrace::symbolize::set_background_index(None);
        selftrace::init().expect("init");
    }
    let which = if which == "selftrace_sync" {
        "selftrace"
    } else {
        which
    };
    let c = CString::new(path).unwrap();
    // SAFETY: loads a library by path; its constructors run (rustc's driver has none that
    // need more than a loaded libstd).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {path} failed");
    let name = std::path::Path::new(path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let addrs = addresses(driver_code(name), 0x9e37_79b9_7f4a_7c15);
    let before = resident();
    let (anon_before, file_before) = resident_kinds();
    let cpu_before = cpu_time();
    let t = Instant::now();
    let mut named = 0;
    if which == "selftrace" {
        selftrace::refresh();
    } else {
        backtrace::resolve(addrs[0] as *mut _, |s| {
            std::hint::black_box(s.name());
        });
    }
    let build = t.elapsed();
    if which == "selftrace" {
        // Until the background indexer has named the two objects too.
        selftrace::symbolize::prepare().expect("prepare");
    }
    let complete = t.elapsed();
    let cpu = cpu_time() - cpu_before;
    let grown = resident().saturating_sub(before);
    let (anon, file) = resident_kinds();
    let (anon, file) = (
        anon.saturating_sub(anon_before),
        file.saturating_sub(file_before),
    );
    let unwind = if which == "selftrace" {
        unwind_table_bytes(&["librustc_driver", "libLLVM"])
    } else {
        0
    };
    let lookups = |addrs: &[usize]| {
        let mut named = 0;
        let t = Instant::now();
        for &a in addrs {
            if which == "selftrace" {
                // The name decoded into a buffer, as a crash report or a profile needs it.
                let mut buf = [0u8; 1024];
                let name = selftrace::symbolize(a).and_then(|s| s.name);
                named += usize::from(name.is_some_and(|n| !n.copy_to(&mut buf).is_empty()));
            } else {
                let mut any = false;
                backtrace::resolve(a as *mut _, |s| any |= s.name().is_some());
                named += usize::from(any);
            }
        }
        (t.elapsed().as_nanos() / addrs.len() as u128, named)
    };
    let (lookup, n) = lookups(&addrs);
    named += n;
    // Then other addresses after 256 MB were written, so that the index is out of every cache
    // (a crash handler's lookup long after start-up).
    let mut flush = vec![0u8; 256 << 20];
    for (i, b) in flush.iter_mut().enumerate().step_by(64) {
        *b = i as u8;
    }
    std::hint::black_box(&flush);
    drop(flush);
    let (flushed, _) = lookups(&addresses(driver_code(name), 0x2545_f491_4f6c_dd1d));
    let (syms, bytes, names) = if which == "selftrace" {
        let (n, b) = selftrace::symbolize::index_stats();
        (n, b, selftrace::symbolize::index_name_bytes())
    } else {
        (0, 0, 0)
    };
    format!(
        "{} {} {} {} {anon} {file} {unwind} {} {} {syms} {bytes} {names} {flushed}",
        build.as_nanos(),
        complete.as_nanos(),
        cpu.as_nanos(),
        grown,
        lookup,
        named
    )
}

/// CPU time of this process so far, every thread (`getrusage(RUSAGE_SELF)`, user + system).
fn cpu_time() -> Duration {
    // SAFETY: a zeroed rusage is valid storage for getrusage to fill.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is valid for writes.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// What a child measured (see [`child`]).
struct Row {
    build: Duration,
    complete: Duration,
    cpu: Duration,
    grown: u64,
    anon: u64,
    file: u64,
    unwind: u64,
    lookup: u128,
    flushed: u128,
    named: usize,
    syms: usize,
    bytes: usize,
    names: usize,
}

fn run_child(which: &str, driver: &std::path::Path) -> Row {
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new(me)
        .env(CHILD_ENV, which)
        .env("GLIBC_TUNABLES", TUNABLES)
        .arg(driver)
        .output()
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.split_whitespace().collect();
    assert!(
        out.status.success() && f.len() == 13,
        "child {which}: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    Row {
        build: Duration::from_nanos(f[0].parse().unwrap()),
        complete: Duration::from_nanos(f[1].parse().unwrap()),
        cpu: Duration::from_nanos(f[2].parse().unwrap()),
        grown: f[3].parse().unwrap(),
        anon: f[4].parse().unwrap(),
        file: f[5].parse().unwrap(),
        unwind: f[6].parse().unwrap(),
        lookup: f[7].parse().unwrap(),
        flushed: f[12].parse().unwrap(),
        named: f[8].parse().unwrap(),
        syms: f[9].parse().unwrap(),
        bytes: f[10].parse().unwrap(),
        names: f[11].parse().unwrap(),
    }
}

fn median<T: Copy + Ord>(v: &mut [T]) -> T {
    v.sort();
    v[v.len() / 2]
}

fn scale(c: &mut Criterion) {
    let Some(driver) = driver() else {
        eprintln!("scale: no librustc_driver-*.so in `rustc --print sysroot`/lib: skipped");
        return;
    };
    // Interleaved children for the memory and lookup figures.
    let mut rows: Vec<(&str, Vec<Row>)> = vec![
        ("selftrace", vec![]),
        ("selftrace_sync", vec![]),
        ("backtrace_crate", vec![]),
    ];
    let functions = function_symbols(&[
        driver.clone(),
        sysroot::lib_file(|n| n.starts_with("libLLVM.so.")).expect("libLLVM beside the driver"),
    ]);
    for _ in 0..5 {
        for (which, v) in rows.iter_mut() {
            v.push(run_child(which, &driver));
        }
    }
    eprintln!(
        "scale: {} ({} lookups of addresses in its code per child, 5 children each, alternating; medians)",
        driver.display(),
        LOOKUPS
    );
    for (which, v) in &rows {
        let mut build: Vec<Duration> = v.iter().map(|r| r.build).collect();
        let mut complete: Vec<Duration> = v.iter().map(|r| r.complete).collect();
        let mut cpu: Vec<Duration> = v.iter().map(|r| r.cpu).collect();
        let mut rss: Vec<u64> = v.iter().map(|r| r.grown).collect();
        let mut look: Vec<u128> = v.iter().map(|r| r.lookup).collect();
        let mut flushed: Vec<u128> = v.iter().map(|r| r.flushed).collect();
        let r = &v[0];
        eprintln!(
            "scale: {which:16} first index/resolve {:7.1} ms (every name in: {:.1} ms, CPU time of all threads {:.1} ms), +{:5.1} MB resident, {:4} ns per cold lookup ({} ns with the caches flushed first), {} of {LOOKUPS} addresses named",
            median(&mut build).as_secs_f64() * 1e3,
            median(&mut complete).as_secs_f64() * 1e3,
            median(&mut cpu).as_secs_f64() * 1e3,
            median(&mut rss) as f64 / 1e6,
            median(&mut look),
            median(&mut flushed),
            r.named,
        );
        if r.syms > 0 {
            let mut anon: Vec<u64> = v.iter().map(|r| r.anon).collect();
            let mut file: Vec<u64> = v.iter().map(|r| r.file).collect();
            let anon = median(&mut anon);
            eprintln!(
                "scale: {which:16} resident growth: {:.1} MB anonymous, of which {:.1} MB are the copies of the two objects' unwind tables, + {:.1} MB of file pages (those tables' pages, which the copy read); beyond the unwind tables: {:.1} MB, {:.0} bytes per function symbol ({functions} in the two objects); per function symbol, {:.2} us of the refresh",
                anon as f64 / 1e6,
                r.unwind as f64 / 1e6,
                median(&mut file) as f64 / 1e6,
                anon.saturating_sub(r.unwind) as f64 / 1e6,
                anon.saturating_sub(r.unwind) as f64 / functions as f64,
                median(&mut build).as_secs_f64() * 1e6 / functions as f64,
            );
            eprintln!(
                "scale: {which:16} index of every loaded object (.symtab and .dynsym tables): {} entries, {:.1} MB of entries and page directories + {:.1} MB of names: {:.0} bytes per entry; per entry: {:.2} us of the refresh, {:.0} bytes of its resident growth",
                r.syms,
                r.bytes as f64 / 1e6,
                r.names as f64 / 1e6,
                (r.bytes + r.names) as f64 / r.syms as f64,
                median(&mut build).as_secs_f64() * 1e6 / r.syms as f64,
                median(&mut rss) as f64 / r.syms as f64,
            );
        }
    }
    let mut g = c.benchmark_group("scale_first_index");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_millis(1));
    for which in ["selftrace", "backtrace_crate"] {
        g.bench_function(which, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| run_child(which, &driver).build).sum())
        });
    }
    g.finish();
}

criterion_group!(benches, scale);

fn main() {
    if let Ok(which) = std::env::var(CHILD_ENV) {
        let path = std::env::args().nth(1).expect("the driver's path");
        println!("{}", child(&which, &path));
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
