//! selftrace's own seeded mutation fuzzer (no nightly toolchain, no extra crate) over every
//! parser of outside bytes: ELF symbols and notes (`usdt::parse_probes` / `read_probes`,
//! `tracefs::function_symbols`, the symbolizer's tables, PLT decoders and DWARF lines), trace
//! text (records, markers, uprobe hit bodies, `cut_byte_args`), USDT argument specs,
//! `/proc/PID/maps` lines and demangling (`demangle_into`, `demangle_to`).
//!
//! Each target mutates the seeds of its corpus (`tests/fixtures/fuzz/<target>/`, real inputs:
//! see the README there) with bit flips, random bytes, interesting integers (0, 1, 0x7f..,
//! u32::MAX, u64::MAX...) at random places and, for ELF files, in the fields of the ELF header,
//! the program headers and the section headers; truncations, splices with other seeds,
//! deletions, duplications and, for text, the grammar's special characters. Every input must
//! parse without a panic (caught, the input saved under `target/tmp/fuzz-crashes/`) and without
//! a hang (a watchdog saves the input and aborts after 60 s), and the results must be in bounds
//! (offsets inside the file, entries inside their section, buffers not overrun, no argument
//! dropped silently).
//!
//! Bounded for CI: each target runs a fixed number of iterations or for a few seconds,
//! whichever ends first. Environment: `SELFTRACE_FUZZ_SEED` (the PRNG seed, printed; else one
//! from the clock), `SELFTRACE_FUZZ_ITERS` (iterations per target; then the time limit is
//! `SELFTRACE_FUZZ_SECS`, default unlimited), `SELFTRACE_FUZZ_SECS` (seconds per target),
//! `SELFTRACE_FUZZ_VERBOSE` (print every panic as it happens). The `dwarf` target runs at most
//! as many inputs as the process may open files (the file:line reader keeps each file open).
//!
//! Release mode: `cargo test --release --all-features --config
//! 'profile.release.package.selftrace.overflow-checks=true' --test fuzz` runs the same checks
//! on optimized code, with overflow checks in selftrace (a silent wrap is a panic there).
//! Every crash found is kept as `tests/fixtures/fuzz/regressions/<target>--<name>` and replayed
//! by `regressions_replay`.
// The parsers reached need these features (`cargo test --all-features` runs it).
#![cfg(all(feature = "tracefs", feature = "usdt"))]

use selftrace::symbolize::{self, FixedBuf};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fuzz");

// ---------------------------------------------------------------------------------------------
// The PRNG and the mutations.

/// xorshift64*: small, fast, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A number in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Values that break arithmetic: zero, one, sign and width edges, page sizes.
const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    7,
    8,
    16,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x1000,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX - 1,
    u64::MAX,
    u64::MAX - 0xfff,
];

/// Pieces of the text grammars (trace lines, marker text, hit bodies, maps lines, argument
/// specs, mangled names).
const TOKENS: &[&str] = &[
    "|",
    " ",
    "  ",
    "[",
    "]",
    "(",
    ")",
    ":",
    ": ",
    "=",
    "{",
    "}",
    ",",
    "\\",
    "\"",
    "-",
    ".",
    "@",
    "%",
    "$",
    "0x",
    "0",
    "1",
    "9",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "4294967296",
    "99999999999999999999",
    "\n",
    "\r",
    "\0",
    "é",
    "\u{fffd}",
    "_bytes=",
    "a0_bytes={",
    "a18446744073709551615",
    "a1=",
    " <- ",
    "tracing_mark_write: ",
    "B|",
    "E|",
    "S|",
    "G|",
    "C|",
    "(fault)",
    "rw-p",
    "r-xp",
    "_ZN",
    "_R",
    "17h0123456789abcdefE",
    "E",
    "I",
    "B",
    "Nv",
    "Cs",
    "$LT$",
    "$u20$",
    ".llvm.",
    "@plt",
    "@@GLIBC_2.2.5",
];

/// Writes the low `width` bytes of `v` little-endian at `at` (as far as the data goes).
fn put(data: &mut [u8], at: usize, width: usize, v: u64) {
    for (i, b) in v.to_le_bytes().iter().take(width).enumerate() {
        if let Some(d) = data.get_mut(at + i) {
            *d = *b;
        }
    }
}

/// Applies 1 to 4 random mutations to `data`. `fields` are (offset, width) of structure fields
/// worth hitting with interesting values; `text` adds the grammar's tokens.
fn mutate(
    rng: &mut Rng,
    data: &mut Vec<u8>,
    corpus: &[Vec<u8>],
    fields: &[(usize, usize)],
    text: bool,
) {
    let n = 1 + rng.below(4);
    for _ in 0..n {
        let len = data.len();
        match rng.below(if text { 11 } else { 9 }) {
            0 if len > 0 => {
                let at = rng.below(len);
                data[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                data[at] = rng.next() as u8;
            }
            2 if len > 0 => {
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let width = [1, 2, 4, 8][rng.below(4)];
                let at = rng.below(len);
                put(data, at, width, v);
            }
            3 | 4 if !fields.is_empty() => {
                let (at, width) = fields[rng.below(fields.len())];
                let v = if rng.chance(3) {
                    rng.next()
                } else {
                    INTERESTING[rng.below(INTERESTING.len())]
                };
                put(data, at, width, v);
            }
            5 => {
                let keep = rng.below(len + 1);
                data.truncate(keep);
            }
            6 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len() + 1);
                let take = rng.below(other.len() - from + 1).min(4096);
                let at = rng.below(len + 1);
                let end = (at + rng.below(64)).min(len);
                data.splice(at..end, other[from..from + take].iter().copied());
            }
            7 if len > 0 => {
                let at = rng.below(len);
                let n = rng.below((len - at).min(256) + 1);
                data.drain(at..at + n);
            }
            8 if len > 0 => {
                let at = rng.below(len);
                let n = rng.below((len - at).min(64) + 1);
                let piece: Vec<u8> = data[at..at + n].to_vec();
                let to = rng.below(len + 1);
                data.splice(to..to, piece);
            }
            9 | 10 => {
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                let at = rng.below(len + 1);
                if rng.chance(2) {
                    data.splice(at..at, t.iter().copied());
                } else {
                    let end = (at + t.len()).min(len);
                    data.splice(at..end, t.iter().copied());
                }
            }
            _ => {
                let at = rng.below(len + 1);
                data.insert(at, rng.next() as u8);
            }
        }
    }
}

/// The (offset, width) of every field of the ELF64 header, program headers and section headers
/// of `data` (nothing if it is not an ELF64 little-endian file).
fn elf_fields(data: &[u8]) -> Vec<(usize, usize)> {
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 || data[5] != 1 {
        return Vec::new();
    }
    let u16_at = |at: usize| u16::from_le_bytes([data[at], data[at + 1]]) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap()) as usize;
    // e_type .. e_shstrndx.
    let mut f = vec![
        (16, 2),
        (18, 2),
        (20, 4),
        (24, 8),
        (32, 8),
        (40, 8),
        (48, 4),
        (52, 2),
        (54, 2),
        (56, 2),
        (58, 2),
        (60, 2),
        (62, 2),
    ];
    let (phoff, phnum) = (u64_at(32), u16_at(56));
    for i in 0..phnum {
        let ph = phoff + i * 56;
        if ph + 56 > data.len() {
            break;
        }
        // p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align.
        for (o, w) in [
            (0, 4),
            (4, 4),
            (8, 8),
            (16, 8),
            (24, 8),
            (32, 8),
            (40, 8),
            (48, 8),
        ] {
            f.push((ph + o, w));
        }
    }
    let (shoff, shnum) = (u64_at(40), u16_at(60));
    for i in 0..shnum {
        let sh = shoff + i * 64;
        if sh + 64 > data.len() {
            break;
        }
        // sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info,
        // sh_addralign, sh_entsize.
        for (o, w) in [
            (0, 4),
            (4, 4),
            (8, 8),
            (16, 8),
            (24, 8),
            (32, 8),
            (40, 4),
            (44, 4),
            (48, 8),
            (56, 8),
        ] {
            f.push((sh + o, w));
        }
    }
    f
}

// ---------------------------------------------------------------------------------------------
// Corpus, budget, crash records.

/// The seeds of `target`: each file of its directory, or each line of each file for line
/// targets.
fn corpus(dir: &str, lines: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(Path::new(FIXTURES).join(dir))
        .unwrap_or_else(|e| panic!("corpus {dir}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    for p in paths {
        let data = std::fs::read(&p).unwrap();
        if lines {
            out.extend(data.split(|&b| b == b'\n').map(<[u8]>::to_vec));
        } else {
            out.push(data);
        }
    }
    assert!(!out.is_empty(), "empty corpus {dir}");
    out
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The run's seed, printed once.
fn run_seed() -> u64 {
    static SEED: AtomicU64 = AtomicU64::new(0);
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let s = env_u64("SELFTRACE_FUZZ_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
        eprintln!("fuzz: SELFTRACE_FUZZ_SEED={s}");
        SEED.store(s, Ordering::Relaxed);
    });
    SEED.load(Ordering::Relaxed)
}

/// Iterations and time for one target: `default` iterations within 4 s, unless the
/// environment says otherwise.
fn budget(default: u64, cap: u64) -> (u64, Duration) {
    let (n, t) = budget_asked(default);
    (n.min(cap), t)
}

fn budget_asked(default: u64) -> (u64, Duration) {
    match env_u64("SELFTRACE_FUZZ_ITERS") {
        Some(n) => (
            n,
            Duration::from_secs(env_u64("SELFTRACE_FUZZ_SECS").unwrap_or(u64::MAX / 4)),
        ),
        None => (
            default,
            Duration::from_secs(env_u64("SELFTRACE_FUZZ_SECS").unwrap_or(4)),
        ),
    }
}

/// Where crashing inputs are saved.
fn crash_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-crashes");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The message of the last panic on this thread (the hook keeps it instead of printing).
fn panic_message() -> String {
    LAST_PANIC
        .with(|p| p.borrow_mut().take())
        .unwrap_or_default()
}

thread_local! {
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let msg = format!("{info}");
            if std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("fuzz-"))
            {
                if std::env::var_os("SELFTRACE_FUZZ_VERBOSE").is_some() {
                    eprintln!("{msg}");
                }
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(msg));
            } else {
                eprintln!("{msg}");
            }
        }));
    });
}

/// A private directory for the file targets' inputs, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(target: &str) -> Scratch {
        let d =
            std::env::temp_dir().join(format!("selftrace-fuzz-{}-{target}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The watchdog of one target: the input being run and since when.
struct Current {
    target: &'static str,
    input: Mutex<Vec<u8>>,
    since_ms: AtomicU64,
    done: std::sync::atomic::AtomicBool,
}

fn now_ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64 + 1
}

/// Runs `check` on each input (the seeds as they are, then mutations), in a thread named after
/// the target; returns the failures (panics), each saved to a file.
fn fuzz(
    target: &'static str,
    seeds: Vec<Vec<u8>>,
    fields: impl Fn(&[u8]) -> Vec<(usize, usize)>,
    text: bool,
    default_iters: u64,
    cap: u64,
    check: impl Fn(&[u8]) + Send + Sync + 'static,
) {
    quiet_panics();
    let seed = run_seed() ^ fnv(target.as_bytes());
    let (iters, time) = budget(default_iters, cap);
    let field_sets: Vec<Vec<(usize, usize)>> = seeds.iter().map(|s| fields(s)).collect();
    let start = Instant::now();
    let cur = Arc::new(Current {
        target,
        input: Mutex::new(Vec::new()),
        since_ms: AtomicU64::new(0),
        done: Default::default(),
    });
    // The watchdog: an input that runs for a minute is a hang.
    let dog = {
        let cur = cur.clone();
        std::thread::spawn(move || {
            while !cur.done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let since = cur.since_ms.load(Ordering::Relaxed);
                if since != 0 && now_ms(start).saturating_sub(since) > 60_000 {
                    let input = cur.input.lock().unwrap().clone();
                    let p = crash_dir().join(format!("{}--hang-{:016x}", cur.target, fnv(&input)));
                    let _ = std::fs::write(&p, &input);
                    eprintln!(
                        "fuzz {}: an input ran for a minute (hang): {}",
                        cur.target,
                        p.display()
                    );
                    std::process::abort();
                }
            }
        })
    };
    let worker = {
        let cur = cur.clone();
        std::thread::Builder::new()
            .name(format!("fuzz-{target}"))
            .stack_size(16 << 20)
            .spawn(move || {
                let mut rng = Rng::new(seed);
                let mut failures: Vec<String> = Vec::new();
                let run = |input: &[u8], failures: &mut Vec<String>| {
                    *cur.input.lock().unwrap() = input.to_vec();
                    cur.since_ms.store(now_ms(start), Ordering::Relaxed);
                    let r = catch_unwind(AssertUnwindSafe(|| check(input)));
                    cur.since_ms.store(0, Ordering::Relaxed);
                    if r.is_err() {
                        let msg = panic_message();
                        let p = crash_dir().join(format!("{target}--{:016x}", fnv(input)));
                        std::fs::write(&p, input).unwrap();
                        failures.push(format!("{}: {msg}", p.display()));
                    }
                };
                for s in &seeds {
                    run(s, &mut failures);
                }
                let mut n = 0;
                while n < iters && start.elapsed() < time && failures.len() < 20 {
                    let k = rng.below(seeds.len());
                    let mut input = seeds[k].clone();
                    mutate(&mut rng, &mut input, &seeds, &field_sets[k], text);
                    run(&input, &mut failures);
                    n += 1;
                }
                (n, failures)
            })
            .unwrap()
    };
    let (n, failures) = worker.join().expect("the fuzz worker");
    cur.done.store(true, Ordering::Relaxed);
    dog.join().unwrap();
    eprintln!(
        "fuzz {target}: {n} inputs in {:.1} s (seed {seed}), {} failures",
        start.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "fuzz {target}:\n{}",
        failures.join("\n")
    );
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------------------------
// The checks of each target: one input, no panic, results in bounds.

/// Writes `data` to a file of its own in the scratch directory of the current thread's target.
fn as_file(data: &[u8]) -> PathBuf {
    thread_local! {
        static N: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    let n = N.with(|c| {
        c.set(c.get() + 1);
        c.get()
    });
    let name = std::thread::current().name().unwrap_or("fuzz").to_string();
    let dir = std::env::temp_dir().join(format!("selftrace-fuzz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Two names in turn: a file the previous input's parse still reads is not rewritten.
    let p = dir.join(format!("input-{}.elf", n % 2));
    std::fs::write(&p, data).unwrap();
    p
}

fn check_usdt(data: &[u8]) {
    if let Ok(probes) = selftrace::usdt::parse_probes(data) {
        for p in &probes {
            assert!(!p.provider.is_empty() && !p.name.is_empty(), "{p:?}");
            if let Some(off) = p.file_offset {
                assert!(
                    off < data.len() as u64,
                    "probe offset {off:#x} past the file: {p:?}"
                );
            }
            if let Some(off) = p.semaphore_offset {
                assert!(
                    off < data.len() as u64,
                    "semaphore offset {off:#x} past the file: {p:?}"
                );
            }
        }
    }
    let path = as_file(data);
    let from_file = selftrace::usdt::read_probes(&path);
    let from_bytes = selftrace::usdt::parse_probes(data);
    assert_eq!(
        from_file.as_ref().map(Vec::len).ok(),
        from_bytes.as_ref().map(Vec::len).ok(),
        "read_probes and parse_probes disagree"
    );
}

fn check_tracefs_symbols(data: &[u8]) {
    let path = as_file(data);
    if let Ok(syms) = selftrace::tracefs::function_symbols(&path) {
        for s in &syms {
            assert!(
                s.file_offset < data.len() as u64,
                "{} at file offset {:#x}, past the file ({} bytes)",
                s.name,
                s.file_offset,
                data.len()
            );
        }
        if let Some(s) = syms.first() {
            let _ = selftrace::tracefs::function_offset(&path, &s.name);
            let _ = selftrace::fuzz::offset_in_code(path.to_str().unwrap(), s.file_offset);
        }
    }
    for off in [0, u64::MAX, data.len() as u64] {
        let _ = selftrace::fuzz::offset_in_code(path.to_str().unwrap(), off);
    }
}

/// Link-time addresses the symbol and line lookups try (the seeds' code lies below 0x2000;
/// the rest are edges).
const ADDRS: &[u64] = &[
    0,
    0x1000,
    0x1040,
    0x1080,
    0x10c0,
    0x1100,
    0x1139,
    0x113a,
    0x1160,
    0x11a0,
    0x1200,
    0x1f00,
    0x500,
    0x590,
    0x5c0,
    0x600,
    0x700,
    0x740,
    0x7fff_ffff,
    0xffff_ffff,
    u64::MAX,
];

fn check_symbol_tables(data: &[u8]) {
    let path = as_file(data);
    let t = selftrace::fuzz::symbol_tables(path.to_str().unwrap(), ADDRS);
    for &(a, start, size, name_len) in &t.found {
        assert!(
            start <= a,
            "{a:#x} found in a symbol starting at {start:#x}"
        );
        assert!(
            size == 0 || a - start < size,
            "{a:#x} not in {start:#x}+{size:#x}"
        );
        assert!(name_len > 0, "{a:#x}: an empty name");
    }
}

fn check_dwarf(data: &[u8]) {
    let path = as_file(data);
    let _ = selftrace::fuzz::dwarf_lines(path.to_str().unwrap(), ADDRS);
}

fn check_plt(data: &[u8]) {
    // The input: 1 byte machine, 8 bytes address, 1 byte entsize, then the section's bytes.
    if data.len() < 10 {
        return;
    }
    let aarch64 = data[0] & 1 == 1;
    let addr = u64::from_le_bytes(data[1..9].try_into().unwrap());
    let entsize = data[9] as u64;
    let bytes = &data[10..];
    for (start, size, _slot) in selftrace::fuzz::plt_entries(aarch64, bytes, addr, entsize) {
        let rel = start.checked_sub(addr).expect("an entry below its section");
        assert!(rel < bytes.len() as u64, "an entry past its section");
        assert!(
            size <= bytes.len() as u64 - rel,
            "an entry runs past its section"
        );
    }
}

fn check_trace(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for line in text.lines().chain(std::iter::once(text.as_ref())) {
        if let Some(r) = selftrace::tracefs::parse_record(line) {
            // (An empty part may be any empty string.)
            for part in [r.task, r.event, r.body]
                .into_iter()
                .filter(|p| !p.is_empty())
            {
                let (a, b) = (part.as_ptr() as usize, line.as_ptr() as usize);
                assert!(
                    a >= b && a + part.len() <= b + line.len(),
                    "{part:?} not in {line:?}"
                );
            }
            if let Some(m) = selftrace::tracefs::MarkerEvent::from_record(&r) {
                assert!(r.body.contains(m.text.as_str()), "{m:?} from {:?}", r.body);
            }
            check_hit_body(r.body);
        }
        let _ = selftrace::tracefs::parse_marker(line);
        check_hit_body(line);
    }
    let _ = selftrace::tracefs::markers(&text);
    let events = [selftrace::tracefs::EventInfo {
        event: "rt_text".into(),
        label: "rt:text".into(),
        kind: selftrace::tracefs::EventKind::Probe,
        path: PathBuf::from("/x"),
        offset: 0,
    }];
    let cut = selftrace::tracefs::cut_byte_args(&text, &events);
    // Cutting twice cuts nothing more.
    assert_eq!(selftrace::tracefs::cut_byte_args(&cut, &events), cut);
}

/// A hit body: every fetched byte array is decoded into its pointer's text or says why not.
fn check_hit_body(body: &str) {
    let (_, args) = selftrace::tracefs::parse_hit_body(body);
    for (k, v) in &args {
        if let Some(ptr) = k.strip_suffix("_bytes") {
            assert!(
                v.starts_with("(no text: "),
                "{k}={v} left undecoded in {body:?}"
            );
            let _ = ptr;
        }
    }
}

fn check_argspec(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for spec in text.split(' ') {
        if let Ok(a) = selftrace::usdt::ArgSpec::parse(spec) {
            assert!(matches!(a.size, 1 | 2 | 4 | 8), "{a:?}");
            assert!(!a.location.is_empty(), "{a:?}");
        }
    }
}

fn check_maps(data: &[u8]) {
    if let Some((start, end, _)) = selftrace::fuzz::maps_line(data) {
        assert!(start < end, "{start:#x}-{end:#x}");
    }
}

fn check_demangle(data: &[u8]) {
    for len in [0usize, 1, 3, 16, 64, 256, 4096] {
        let mut buf = vec![0u8; len];
        let s = symbolize::demangle_into(data, &mut buf);
        assert!(s.len() <= len, "{} bytes written into {len}", s.len());
        let mut w = FixedBuf::new(&mut buf);
        symbolize::demangle_to(data, &mut w);
        assert!(w.len() <= len);
        let _ = w.as_str();
    }
    let v = symbolize::without_version(data);
    assert!(v.len() <= data.len());
}

// ---------------------------------------------------------------------------------------------
// The targets.

type Check = fn(&[u8]);

/// Every target: name, corpus directory, whether its seeds are lines, whether the grammar's
/// tokens apply, default iterations, check.
const TARGETS: &[(&str, &str, bool, bool, u64, Check)] = &[
    ("usdt", "elf", false, false, 600, check_usdt),
    (
        "tracefs-symbols",
        "elf",
        false,
        false,
        600,
        check_tracefs_symbols,
    ),
    (
        "symbol-tables",
        "elf",
        false,
        false,
        400,
        check_symbol_tables,
    ),
    ("dwarf", "elf", false, false, 400, check_dwarf),
    ("plt", "plt", false, false, 20_000, check_plt),
    ("trace", "trace", true, true, 20_000, check_trace),
    ("argspec", "argspec", true, true, 20_000, check_argspec),
    ("maps", "maps", true, true, 20_000, check_maps),
    ("demangle", "demangle", true, true, 5_000, check_demangle),
];

/// How many more files this process may keep open: the soft limit raised to the hard one,
/// less a margin for everything else (the other targets run at the same time).
fn fd_budget() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    // (rlim_t is u64 on 64-bit Linux, not everywhere.)
    #[allow(clippy::unnecessary_cast)]
    let cur = lim.rlim_cur as u64;
    cur.saturating_sub(200)
}

fn run_target(name: &str) {
    let &(target, dir, lines, text, iters, check) =
        TARGETS.iter().find(|t| t.0 == name).expect("a target");
    // The file:line reader keeps the file of each object open for the life of the process (its
    // sections are read on demand): one descriptor per input of `dwarf`.
    let cap = if target == "dwarf" {
        let cap = fd_budget();
        eprintln!("fuzz dwarf: {cap} inputs at most (one open file each)");
        cap
    } else {
        u64::MAX
    };
    let _scratch = Scratch::new(&format!("fuzz-{target}"));
    let seeds = corpus(dir, lines);
    let elf = dir == "elf";
    fuzz(
        target,
        seeds,
        move |d: &[u8]| if elf { elf_fields(d) } else { Vec::new() },
        text,
        iters,
        cap,
        check,
    );
}

#[test]
fn fuzz_usdt_notes() {
    run_target("usdt");
}

#[test]
fn fuzz_tracefs_symbol_offsets() {
    run_target("tracefs-symbols");
}

#[test]
fn fuzz_symbol_tables() {
    run_target("symbol-tables");
}

#[test]
fn fuzz_dwarf_lines() {
    run_target("dwarf");
}

#[test]
fn fuzz_plt_decoders() {
    run_target("plt");
}

#[test]
fn fuzz_trace_text() {
    run_target("trace");
}

#[test]
fn fuzz_usdt_argument_specs() {
    run_target("argspec");
}

#[test]
fn fuzz_maps_lines() {
    run_target("maps");
}

#[test]
fn fuzz_demangling() {
    run_target("demangle");
}

/// Every crash the fuzzer found, kept as `regressions/<target>--<name>`: each must pass its
/// target's check now.
#[test]
fn regressions_replay() {
    quiet_panics();
    let dir = Path::new(FIXTURES).join("regressions");
    let mut failed = Vec::new();
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let file = p.file_name().unwrap().to_string_lossy().into_owned();
        let Some((target, _)) = file.split_once("--") else {
            continue;
        };
        let check = TARGETS
            .iter()
            .find(|t| t.0 == target)
            .unwrap_or_else(|| panic!("{file}: no target {target}"))
            .5;
        let data = std::fs::read(&p).unwrap();
        let _scratch = Scratch::new("fuzz-regressions");
        let r = std::thread::Builder::new()
            .name("fuzz-regressions".into())
            .spawn(move || {
                catch_unwind(AssertUnwindSafe(|| check(&data))).map_err(|_| panic_message())
            })
            .unwrap()
            .join()
            .unwrap();
        if let Err(msg) = r {
            failed.push(format!("{file}: {msg}"));
        }
        n += 1;
    }
    eprintln!("fuzz: {n} regression inputs replayed");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
