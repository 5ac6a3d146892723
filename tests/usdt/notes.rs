//! The notes our probes leave in binaries, checked on debug, release and fat-LTO builds of
//! `examples/usdt_target.rs` and its cdylib; `read_probes` on a C program built with
//! SystemTap's `sys/sdt.h`; and malformed ELF files (mutation fuzzing) giving errors, never
//! panics.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "usdt")]

use crate::target;
use crate::usdt_support;

use object::{Object, ObjectSection};
use selftrace::usdt::{parse_probes, read_probes, ArgSpec, ProbeNote};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use usdt_support::*;

fn section_range(file: &object::File, name: &str) -> (u64, u64) {
    let s = file
        .section_by_name(name)
        .unwrap_or_else(|| panic!("no {name} section"));
    (s.address(), s.address() + s.size())
}

/// The probe site's instruction, as sys/sdt.h emits it.
#[cfg(target_arch = "x86_64")]
const NOP: &[u8] = &[0x90];
/// The probe site's instruction, as sys/sdt.h emits it (`nop`, 0xd503201f).
#[cfg(target_arch = "aarch64")]
const NOP: &[u8] = &[0x1f, 0x20, 0x03, 0xd5];

/// Whether a note argument's location is a register (`%rdi`; `x0`, `w1`) or memory through one
/// (`8(%rax)`; `[x8]`, `[x8, 8]`, `[sp, 16]`), in the syntax of this target.
fn is_register_or_memory(loc: &str) -> bool {
    if cfg!(target_arch = "x86_64") {
        loc.starts_with('%') || loc.contains("(%")
    } else {
        let reg = |r: &str| {
            r == "sp"
                || r.strip_prefix(['x', 'w'])
                    .and_then(|n| n.parse::<u8>().ok())
                    .is_some_and(|n| n <= 30)
        };
        match loc.strip_prefix('[').and_then(|m| m.strip_suffix(']')) {
            Some(mem) => {
                let mut parts = mem.split(", ");
                parts.next().is_some_and(reg)
                    && parts.next().is_none_or(|off| off.parse::<i64>().is_ok())
                    && parts.next().is_none()
            }
            None => reg(loc),
        }
    }
}

/// Checks every note of `path` and returns them by `provider:name`.
fn check_notes(path: &Path) -> HashMap<String, Vec<ProbeNote>> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let (base, _) = section_range(&file, ".stapsdt.base");
    let (probes_start, probes_end) = section_range(&file, ".probes");
    assert_eq!(probes_start % 4096, 0, ".probes is not page-aligned");
    let notes = read_probes(path).unwrap();
    assert!(!notes.is_empty());
    let mut by_name: HashMap<String, Vec<ProbeNote>> = HashMap::new();
    for n in notes {
        let what = format!("{}:{} in {}", n.provider, n.name, path.display());
        assert_ne!(n.pc, 0, "note left by dead code: {what}");
        assert_eq!(n.base, base, "base is not .stapsdt.base: {what}");
        assert_eq!(n.address, n.pc, "{what}");
        assert!(
            n.semaphore >= probes_start && n.semaphore + 2 <= probes_end,
            "semaphore outside .probes: {what}"
        );
        let off = n
            .file_offset
            .unwrap_or_else(|| panic!("no file offset: {what}"));
        assert_eq!(
            data.get(off as usize..off as usize + NOP.len()),
            Some(NOP),
            "no nop at the probe's file offset: {what}"
        );
        let sem_off = n.semaphore_offset.unwrap() as usize;
        assert_eq!(
            &data[sem_off..sem_off + 2],
            &[0, 0],
            "semaphore not zero in the file: {what}"
        );
        assert!(n.arguments.len() <= 12, "{what}");
        by_name
            .entry(format!("{}:{}", n.provider, n.name))
            .or_default()
            .push(n);
    }
    assert!(
        !by_name.contains_key("selftrace:gc_canary"),
        "the note of a function removed by the linker is still there"
    );
    // One semaphore per probe, shared by its sites; different probes, different semaphores.
    let mut sems: HashMap<u64, String> = HashMap::new();
    for (name, sites) in &by_name {
        for s in sites {
            assert_eq!(
                s.semaphore, sites[0].semaphore,
                "{name}: sites with different semaphores"
            );
        }
        if let Some(other) = sems.insert(sites[0].semaphore, name.clone()) {
            panic!("{name} and {other} share a semaphore");
        }
    }
    by_name
}

fn spec(s: &str) -> Vec<(u8, bool)> {
    s.split_whitespace()
        .map(|a| {
            let a = ArgSpec::parse(a).unwrap();
            (a.size, a.signed)
        })
        .collect()
}

fn check_target(profile: &str) {
    if profile != "dev" && target::under_qemu() {
        // The aarch64 tests run under qemu-user in CI on two cores: a release and a fat-LTO
        // cross build of the fixtures would take most of its time; the debug build's notes
        // (the same templates) are checked.
        eprintln!("usdt_notes: {profile} build not checked under qemu-user (CI time); dev is");
        return;
    }
    let dir = build_fixtures(profile);
    let notes = check_notes(&dir.join("usdt_target"));
    let sizes = |name: &str| -> Vec<(u8, bool)> {
        let sites = notes
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing in {profile}"));
        sites[0]
            .arguments
            .iter()
            .map(|a| (a.size, a.signed))
            .collect()
    };
    assert_eq!(
        notes["selftrace_test:values"].len(),
        2,
        "two sites of values in {profile}"
    );
    assert_eq!(
        sizes("selftrace_test:values"),
        spec("-1@x 2@x -4@x -8@x 8@x 8@x")
    );
    assert_eq!(sizes("selftrace_test:text"), spec("8@x 8@x 8@x"));
    assert_eq!(
        sizes("selftrace_test:twelve"),
        spec("1@x -1@x 2@x -2@x 4@x -4@x 8@x -8@x 1@x 4@x 8@x 8@x")
    );
    assert_eq!(sizes("selftrace_test:add"), spec("-4@x -4@x"));
    assert_eq!(sizes("selftrace_test:add__return"), spec("-4@x"));
    assert_eq!(sizes("selftrace_test:bump"), spec("8@x -8@x"));
    assert_eq!(sizes("selftrace_test:generic"), spec("4@x"));
    // Arguments are registers or, for &str, memory through a register (or the stack).
    for sites in notes.values() {
        for a in &sites[0].arguments {
            assert!(is_register_or_memory(&a.location), "{a:?}");
        }
    }
    let lib = check_notes(&dir.join("libusdt_cdylib.so"));
    assert_eq!(lib["selftrace_cdylib:add"][0].args.split(' ').count(), 2);
    assert!(lib.contains_key("selftrace_cdylib:add__return"));
    assert!(lib.contains_key("selftrace_cdylib:inside"));
}

#[test]
fn notes_debug() {
    check_target("dev");
}

#[test]
fn notes_release() {
    check_target("release");
}

#[test]
fn notes_release_fat_lto() {
    check_target("release-lto");
}

const C_PROGRAM: &str = r#"
#include <sys/sdt.h>
unsigned short cprov_hello_semaphore __attribute__((unused, section(".probes")));
unsigned short cprov_bare_semaphore __attribute__((unused, section(".probes")));
int main(int argc, char **argv) {
    long big = -5000000000L;
    if (cprov_hello_semaphore)
        argc++;
    DTRACE_PROBE3(cprov, hello, argc, big, argv);
    STAP_PROBE(cprov, bare);
    return 0;
}
"#;

/// Builds the C program with gcc; `None` (after printing why) when gcc or sys/sdt.h is missing.
/// The host's gcc also in the aarch64 run (Debian's sys/sdt.h is in x86-64's multiarch include
/// directory only), so there the parser reads an x86-64 file; arm64 notes are checked on the
/// fixtures ([`check_target`]).
fn c_program() -> Option<Vec<u8>> {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("selftrace-sdt-{}-{seq}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("prog.c");
    std::fs::write(&src, C_PROGRAM).unwrap();
    let bin = dir.join("prog");
    let out = Command::new("gcc")
        .args(["-O1", "-D_SDT_HAS_SEMAPHORES=1", "-o"])
        .arg(&bin)
        .arg(&src)
        .output();
    let data = match out {
        Ok(o) if o.status.success() => std::fs::read(&bin).ok(),
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr).into_owned();
            if std::env::var("SELFTRACE_REQUIRE_TRACEFS").as_deref() == Ok("1") {
                panic!("gcc with sys/sdt.h failed: {why}");
            }
            eprintln!("skipping: gcc with sys/sdt.h failed (install systemtap-sdt-dev): {why}");
            None
        }
        Err(e) => {
            if std::env::var("SELFTRACE_REQUIRE_TRACEFS").as_deref() == Ok("1") {
                panic!("gcc: {e}");
            }
            eprintln!("skipping: no gcc: {e}");
            None
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    data
}

#[test]
fn reads_c_sdt_program() {
    let Some(data) = c_program() else { return };
    let notes = parse_probes(&data).unwrap();
    let hello = notes
        .iter()
        .find(|n| n.name == "hello")
        .expect("cprov:hello");
    assert_eq!(hello.provider, "cprov");
    let sizes: Vec<(u8, bool)> = hello.arguments.iter().map(|a| (a.size, a.signed)).collect();
    assert_eq!(
        sizes,
        vec![(4, true), (8, true), (8, false)],
        "{}",
        hello.args
    );
    assert_ne!(hello.semaphore, 0);
    let off = hello.file_offset.unwrap() as usize;
    assert_eq!(data[off], 0x90);
    assert!(hello.semaphore_offset.is_some());
    let bare = notes.iter().find(|n| n.name == "bare").expect("cprov:bare");
    assert!(bare.arguments.is_empty());
    assert_eq!(data[bare.file_offset.unwrap() as usize], 0x90);
}

/// A tiny xorshift generator: the fuzz test is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn malformed_elf_never_panics() {
    // A real binary with notes: the C program when gcc is there, else the cdylib.
    let data = c_program().unwrap_or_else(|| std::fs::read(cdylib("dev")).unwrap());
    assert!(!parse_probes(&data).unwrap().is_empty());
    // Where the interesting bytes are: headers and the note section.
    let file = object::File::parse(&*data).unwrap();
    let note = file.section_by_name(".note.stapsdt").unwrap();
    let (note_start, note_len) = note.file_range().unwrap();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut errors = 0;
    for round in 0..3000 {
        let mut m = data.clone();
        match round % 4 {
            0 => {
                // Flip bytes in the ELF, program and section headers.
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(64.min(m.len()));
                    m[i] ^= 1 << rng.below(8);
                }
                let shoff = u64::from_le_bytes(m[0x28..0x30].try_into().unwrap()) as usize;
                if shoff < m.len() {
                    let i = shoff + rng.below((m.len() - shoff).max(1));
                    m[i] = rng.next() as u8;
                }
            }
            1 => {
                // Corrupt the notes: sizes, addresses, strings.
                for _ in 0..1 + rng.below(8) {
                    let i = note_start as usize + rng.below(note_len as usize);
                    m[i] = rng.next() as u8;
                }
            }
            2 => {
                // Truncate.
                m.truncate(rng.below(m.len()));
            }
            _ => {
                // Random bytes anywhere, and in the program headers.
                for _ in 0..1 + rng.below(16) {
                    let i = rng.below(m.len());
                    m[i] = rng.next() as u8;
                }
                let i = 64 + rng.below(0x200);
                if i < m.len() {
                    m[i] = rng.next() as u8;
                }
            }
        }
        if parse_probes(&m).is_err() {
            errors += 1;
        }
    }
    // Many mutations must have been detected (and none panicked).
    assert!(errors > 300, "only {errors} mutations gave an error");
}
