//! Hostile values through the safe API: every public type that safe code can build, built with
//! values meant to break it (null, unaligned, unmapped, kernel and wrapping addresses, indices
//! out of range, empty and tiny buffers, bad signal numbers and thread ids, garbage text and
//! files), and every safe method called on it. Each case runs in a child process of its own,
//! which must exit normally: a signal (a fault, an abort) or a panic fails the test.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(all(
    feature = "flamegraph",
    feature = "pprof",
    feature = "trace",
    feature = "tracefs"
))]

#[path = "child_support/mod.rs"]
mod child_support;
#[path = "support/target.rs"]
mod target;

use selftrace::profile::{self, Line, Location, Mapping, Mode, Profile, Sample, Threads};
use selftrace::symbolize::{self, FixedBuf, FrameKind, KernelOptions, SymbolsOptions};
use selftrace::unwind::{StopReason, Truncation};
use selftrace::{Regs, UnwindMode};
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Addresses that no walk or lookup may trust: null, tiny, unaligned, the top of the address
/// space, the legacy vsyscall page, a kernel address, and real but wrong places (this stack, the
/// heap, a function's middle, a read-only constant).
fn hostile_addresses() -> Vec<usize> {
    let stack = 0u64;
    let heap = Box::new(0u64);
    let code = hostile_addresses as *const () as usize;
    static CONSTANT: [u8; 64] = [0xcc; 64];
    let mut v = vec![
        0,
        1,
        7,
        8,
        0x1000,
        usize::MAX,
        usize::MAX - 7,
        usize::MAX / 2,
        0xffff_ffff_ff60_0000,
        0xffff_8000_0000_0000,
        0x0000_7fff_ffff_f000,
        &stack as *const u64 as usize,
        &stack as *const u64 as usize + 3,
        &*heap as *const u64 as usize,
        code,
        code + 1,
        code.wrapping_sub(1),
        CONSTANT.as_ptr() as usize + 13,
    ];
    // An address that was mapped and is not any more.
    // SAFETY: a fresh anonymous mapping of one page, unmapped at once; only its address is kept.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::munmap(p, 4096);
        v.push(p as usize);
        v.push(p as usize + 4088);
    }
    v
}

fn unwind_from_hostile_registers() {
    selftrace::init().expect("init");
    let addrs = hostile_addresses();
    let modes = [UnwindMode::Dwarf, UnwindMode::FramePointer];
    let mut buf = [0usize; 64];
    let mut tiny = [0usize; 1];
    let mut none: [usize; 0] = [];
    for &pc in &addrs {
        for &sp in &addrs {
            for &fp in [0, sp, usize::MAX, pc].iter() {
                for &mode in &modes {
                    let mut regs = Regs::new(pc, sp, fp);
                    regs.lr = pc.wrapping_add(sp);
                    let n = selftrace::Capture::new()
                        .mode(mode)
                        .walk_regs(regs, &mut buf)
                        .frames;
                    assert!(n <= buf.len());
                    let w = selftrace::Capture::new()
                        .mode(mode)
                        .walk_regs(regs, &mut buf);
                    assert!(w.frames <= buf.len());
                    let _ = w.end.to_string();
                    let _ = w.truncation();
                    selftrace::Capture::new()
                        .mode(mode)
                        .walk_regs(regs, &mut tiny);
                    assert_eq!(
                        selftrace::Capture::new()
                            .mode(mode)
                            .walk_regs(regs, &mut none)
                            .frames,
                        0
                    );
                }
            }
        }
    }
    // Naming what such walks return, and addresses that are not frames at all.
    for &a in &addrs {
        for kind in [FrameKind::Exact, FrameKind::Return] {
            let _ = kind.lookup_address(a);
        }
    }
}

fn symbolize_hostile_addresses() {
    selftrace::init().expect("init");
    let addrs = hostile_addresses();
    let mut line = [0u8; 256];
    let mut empty: [u8; 0] = [];
    let mut one = [0u8; 1];
    for &a in &addrs {
        if let Some(s) = selftrace::symbolize(a) {
            let _ = (
                s.offset(),
                s.object_offset(),
                s.name_string(),
                s.object_name(),
            );
            let _ = s.demangle_into(&mut line);
            let _ = s.demangle_into(&mut empty);
            let _ = s.to_string();
        }
        let _ = symbolize::symbolize_exported(a);
        for kind in [FrameKind::Exact, FrameKind::Return] {
            let _ = symbolize::symbolize_frame(a, kind);
            for opts in [
                KernelOptions::default(),
                KernelOptions {
                    demangle: true,
                    object_offset: true,
                    build_id: true,
                },
            ] {
                let n = symbolize::write_kernel_frame(&mut line, a, kind, opts);
                assert!(n <= line.len());
                assert_eq!(symbolize::write_kernel_frame(&mut empty, a, kind, opts), 0);
                assert!(symbolize::write_kernel_frame(&mut one, a, kind, opts) <= 1);
            }
            let f = symbolize::BacktraceFrame::resolve(a, kind);
            let _ = (f.symbols().len(), f.name());
        }
        let _ = symbolize::is_signal_trampoline(a);
    }
    // frame_kind with indices past the end, and on an empty stack.
    for i in 0..addrs.len() + 3 {
        let _ = symbolize::frame_kind(&addrs, i, true);
        let _ = symbolize::frame_kind(&addrs, i, false);
        let _ = symbolize::frame_kind(&[], i, true);
    }
    let _ = selftrace::backtrace_symbols(&addrs);
    let devnull = std::fs::File::create("/dev/null").unwrap();
    selftrace::backtrace_symbols_fd(&addrs, &devnull);
    for opts in [
        SymbolsOptions::default(),
        SymbolsOptions {
            demangle: true,
            exported_only: true,
        },
    ] {
        symbolize::backtrace_symbols_fd_with(&addrs, &devnull, opts);
    }
    let bt = selftrace::Backtrace::from_addresses(&addrs, true);
    let _ = (bt.frames().len(), bt.short_frames().len(), bt.to_string());
    let _ = selftrace::Backtrace::from_addresses(&[], false).to_string();
}

fn text_and_buffers() {
    let garbage: &[&[u8]] = &[
        b"",
        b"_R",
        b"_ZN",
        b"_ZN3foo",
        b"_ZN999999999999999999999foo17h0123456789abcdefE",
        b"_RNvCs0_",
        b"_RINvNtC3std3mem8align_ofjE",
        b"\xff\xfe\x00\x01",
        &[b'_'; 4096],
    ];
    for g in garbage {
        for len in [0usize, 1, 2, 7, 64, 5000] {
            let mut buf = vec![0u8; len];
            let s = symbolize::demangle_into(g, &mut buf);
            assert!(s.len() <= len);
            let mut w = FixedBuf::new(&mut buf);
            symbolize::demangle_to(g, &mut w);
            w.push_hex(usize::MAX);
            w.push_0x(0);
            w.push_dec(u64::MAX);
            w.push_bytes(g);
            w.push_str("é");
            let _ = (
                w.len(),
                w.is_empty(),
                w.truncated(),
                w.as_str(),
                w.as_bytes(),
            );
            w.clear();
        }
        let _ = symbolize::without_version(g);
    }
    // USDT argument specs and notes.
    for spec in [
        "",
        "@",
        "-",
        "-@",
        "8@",
        "@%rdi",
        "99@%rax",
        "-0@%rdi",
        "8@-8(%rbp",
        "8@[sp, 16",
        "8@%",
        "18446744073709551616@%rax",
        "-4@$99999999999999999999999",
        "4@\u{0}",
    ] {
        let _ = selftrace::usdt::ArgSpec::parse(spec);
    }
    let mut elf = [0u8; 128];
    elf[..4].copy_from_slice(b"\x7fELF");
    for data in [&b""[..], &b"\x7fELF"[..], &elf[..], &[0xffu8; 4096][..]] {
        let _ = selftrace::usdt::parse_probes(data);
    }
    for path in ["/dev/null", "/proc/self/maps", "/", "/nonexistent"] {
        let _ = selftrace::usdt::read_probes(path);
    }
    // ftrace text.
    let lines = [
        "",
        ":",
        "           <...>-1 [000] ..... 1.0: tracing_mark_write: B|",
        "x-1 [000] 1.0: tracing_mark_write: B|1|",
        "x-1 [000] 1.0: tracing_mark_write: S|1|name|notanumber",
        "x-1 [000] 1.0: tracing_mark_write: G|1|track|name|",
        "x-1 [000] 1.0: tracing_mark_write: C|1|n|99999999999999999999999999",
        "x-99999999999999999999 [000] 1.0: tracing_mark_write: E|1",
        "-1 [] : :",
        "x-1 [000] .... 99999999999999999999.99999999999: e: \u{0}",
    ];
    for l in lines {
        if let Some(r) = selftrace::tracefs::parse_record(l) {
            let _ = selftrace::tracefs::MarkerEvent::from_record(&r);
            let _ = selftrace::tracefs::parse_hit_body(r.body);
        }
        let _ = selftrace::tracefs::parse_marker(l);
        let _ = selftrace::tracefs::markers(l);
        let _ = selftrace::tracefs::records(l).count();
    }
    let _ = selftrace::tracefs::markers(&lines.join("\n"));
}

/// A profile built by hand with indices that point nowhere: every output must cope.
fn hostile_profiles() {
    let line = Line {
        function: "f".into(),
        system_name: "".into(),
        file: Some("".into()),
        line: Some(0),
    };
    let locations = vec![
        Location {
            address: usize::MAX,
            kind: FrameKind::Return,
            mapping: Some(usize::MAX),
            lines: vec![line.clone(), line.clone()],
        },
        Location {
            address: 0,
            kind: FrameKind::Exact,
            mapping: Some(7),
            lines: Vec::new(),
        },
    ];
    let mappings = vec![Mapping {
        start: usize::MAX,
        limit: 0,
        file_offset: u64::MAX,
        path: "".into(),
        build_id: Some(Vec::new()),
    }];
    let samples = vec![
        Sample {
            locations: vec![0, 1, 2, usize::MAX],
            count: u64::MAX,
            thread_id: -1,
            thread_name: "".into(),
            truncation: Some(Truncation {
                pc: usize::MAX,
                reason: StopReason::Busy,
            }),
        },
        Sample {
            locations: Vec::new(),
            count: 0,
            thread_id: i32::MIN,
            thread_name: Arc::from("\u{0};\n<>&\""),
            truncation: None,
        },
        Sample {
            locations: vec![1, 0],
            count: u64::MAX,
            thread_id: 0,
            thread_name: "t".into(),
            truncation: None,
        },
    ];
    for (frequency_hz, period_ns) in [(0, 0), (u32::MAX, u64::MAX), (99, 1)] {
        let p = Profile {
            mode: Mode::Wall,
            frequency_hz,
            period_ns,
            start: SystemTime::UNIX_EPOCH,
            duration: Duration::MAX,
            samples: samples.clone(),
            locations: locations.clone(),
            mappings: mappings.clone(),
            dropped: u64::MAX,
        };
        let _ = p.total();
        for s in &p.samples {
            let _ = p.function_names(s).count();
            let _ = p.folded_frames(s);
        }
        let _ = p.share_of("f");
        let _ = p.share_of("");
        let _ = p.folded();
        #[cfg(feature = "pprof")]
        {
            let _ = p.to_pprof();
            p.write_pprof(std::io::sink()).expect("write to a sink");
        }
        #[cfg(feature = "flamegraph")]
        {
            let _ = p.flamegraph_svg();
            let _ = p.write_flamegraph(std::io::sink());
        }
    }
}

/// Builders and calls with values out of their range: errors, never a signal or a panic.
fn hostile_settings() {
    selftrace::init().expect("init");
    for hz in [0, 1, 1_000_000, u32::MAX] {
        if let Ok(p) = profile::builder().frequency(hz).start() {
            let _ = p.stop();
        }
    }
    for ring in [0, 1, usize::MAX] {
        assert!(profile::builder().ring_capacity(ring).start().is_err());
    }
    for rescan in [Duration::ZERO, Duration::MAX] {
        assert!(profile::builder().rescan_interval(rescan).start().is_err());
    }
    for sig in [0, -1, 65, i32::MAX, libc::SIGKILL, libc::SIGSTOP] {
        assert!(profile::builder().signal(sig).start().is_err(), "{sig}");
        assert!(
            selftrace::crash::builder()
                .signals(&[sig])
                .install()
                .is_err(),
            "{sig}"
        );
        assert!(
            selftrace::threads::install_dump_signal(sig).is_err(),
            "{sig}"
        );
    }
    for tids in [vec![-1], vec![0], vec![i32::MAX], vec![i32::MIN]] {
        assert!(profile::builder()
            .threads(Threads::Only(tids))
            .start()
            .is_err());
    }
    let mut frames = [0usize; 16];
    for tid in [-1, 0, i32::MAX, i32::MIN, 1] {
        let _ = selftrace::threads::capture(tid, &mut frames, Duration::from_millis(50))
            .map(|w| w.frames);
        let _ = selftrace::threads::capture(tid, &mut [], Duration::ZERO).map(|w| w.frames);
        let _ = selftrace::threads::info(tid);
    }
    // A marker with a name longer than a trace_marker write, NULs and separators.
    let long = "x".repeat(1 << 20);
    for name in ["", "|", "\u{0}", "a|b|c\nd", long.as_str()] {
        selftrace::trace::begin_section(name);
        selftrace::trace::end_section();
        selftrace::trace::instant(name);
        selftrace::trace::set_counter(name, i64::MIN);
        selftrace::trace::begin_async_section(name, i64::MIN);
        selftrace::trace::end_async_section(name, i64::MIN);
        let _s = selftrace::trace::section(name);
    }
}

/// Issue 45 ("checked reads stay in bounds"): a walk from registers nobody vouches for reaches
/// a forged signal frame (a trampoline's bytes and a `ucontext_t` in heap memory) whose stack
/// pointer points into this thread's own stack, at a page made unreadable (as a caller's
/// array stands for under AddressSanitizer, which reported a read one word past it). The walk
/// read the stack from there directly, unchecked, and faulted; every read of such a walk must
/// be a checked copy, which fails cleanly.
#[cfg(target_arch = "x86_64")]
fn forged_signal_frame_into_own_stack() {
    selftrace::init().expect("init");
    let t = std::thread::spawn(|| {
        // Learns this thread's stack in normal context, as any caller of selftrace would.
        let mut frames = [0usize; 8];
        selftrace::capture(&mut frames);
        forged_walk_over_a_hole()
    });
    let frames = t.join().expect("the walk did not panic");
    assert!(frames >= 2, "{frames}");
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn forged_walk_over_a_hole() -> usize {
    const PAGE: usize = 4096;
    // A caller's array on this thread's stack, with one whole page in it made unreadable.
    let mut array = [0u8; 3 * PAGE];
    let hole = (array.as_mut_ptr() as usize).next_multiple_of(PAGE);
    // SAFETY: `hole` is a whole page inside `array`, which lives until the end of this function
    // and is not touched until the page is readable again below.
    assert_eq!(
        unsafe { libc::mprotect(hole as *mut libc::c_void, PAGE, libc::PROT_NONE) },
        0
    );
    // SAFETY: a fresh anonymous page, written only through its own address and unmapped below.
    let fake = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(fake, libc::MAP_FAILED);
    let h = fake as usize;
    // The x86-64 signal trampoline (`mov $15, %rax; syscall`) at h, a frame record at h + 256
    // whose return address is that trampoline, and the `ucontext_t` above it (the trampoline's
    // stack pointer points at it) with rsp = rbp = the unreadable page.
    let trampoline: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
    // SAFETY: (both) every write lies in the fresh page `h`; `ucontext_t` is plain data.
    let mut uc: libc::ucontext_t = unsafe { std::mem::zeroed() };
    uc.uc_mcontext.gregs[libc::REG_RSP as usize] = hole as i64;
    uc.uc_mcontext.gregs[libc::REG_RBP as usize] = hole as i64;
    uc.uc_mcontext.gregs[libc::REG_RIP as usize] =
        forged_walk_over_a_hole as *const () as usize as i64 + 1;
    unsafe {
        std::ptr::copy_nonoverlapping(trampoline.as_ptr(), h as *mut u8, trampoline.len());
        *((h + 256) as *mut usize) = 0;
        *((h + 264) as *mut usize) = h;
        std::ptr::copy_nonoverlapping(
            (&uc as *const libc::ucontext_t).cast::<u8>(),
            (h + 272) as *mut u8,
            std::mem::size_of::<libc::ucontext_t>(),
        );
    }
    let mut most = 0;
    for mode in [UnwindMode::FramePointer, UnwindMode::Dwarf] {
        let regs = Regs::new(
            forged_walk_over_a_hole as *const () as usize + 16,
            h + 256,
            h + 256,
        );
        let mut buf = [0usize; 64];
        let w = selftrace::Capture::new()
            .mode(mode)
            .walk_regs(regs, &mut buf);
        println!(
            "{mode:?}: {} frames {:x?}, {}",
            w.frames,
            &buf[..w.frames],
            w.end
        );
        // Frame-pointer mode follows the forged record through the forged signal frame (the
        // trampoline, then the forged pc, whose caller lies in the unreadable page); the DWARF
        // walk reads frame 0's return address where its CFI says, which is not forged.
        if mode == UnwindMode::FramePointer {
            assert!(
                w.frames >= 2 && buf[1] == h,
                "{mode:?}: {:x?}",
                &buf[..w.frames]
            );
            assert!(
                matches!(w.end, selftrace::WalkEnd::Truncated(_)),
                "{mode:?}: {}",
                w.end
            );
        }
        most = most.max(w.frames);
    }
    // SAFETY: the page of `array` made unreadable above, and the mapping created above.
    unsafe {
        libc::mprotect(
            hole as *mut libc::c_void,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
        );
        libc::munmap(fake, PAGE);
    }
    std::hint::black_box(&mut array);
    most
}

const CASES: &[(&str, fn())] = &[
    #[cfg(target_arch = "x86_64")]
    ("forged_signal_frame", forged_signal_frame_into_own_stack),
    ("registers", unwind_from_hostile_registers),
    ("addresses", symbolize_hostile_addresses),
    ("text", text_and_buffers),
    ("profiles", hostile_profiles),
    ("settings", hostile_settings),
];

/// In a child (`SELFTRACE_HOSTILE` names the case): run it, exit 0. In the parent: nothing.
#[test]
fn child_entry() {
    let Ok(name) = std::env::var("SELFTRACE_HOSTILE") else {
        return;
    };
    let (_, case) = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a known case");
    case();
    println!("case {name} done");
    std::process::exit(0);
}

#[test]
fn hostile_values_never_crash_the_program() {
    let mut failed = Vec::new();
    for (name, _) in CASES {
        let mut cmd = child_support::test_child();
        cmd.env("SELFTRACE_HOSTILE", name);
        let child_support::Finished {
            status,
            stdout,
            stderr,
            ..
        } = child_support::run_test_child(&mut cmd, child_support::deadline(120), name);
        let done = stdout.contains(&format!("case {name} done"));
        if !status.success() || !done {
            failed.push(format!(
                "{name}: {status:?} (signal {:?})\n{stdout}\n{stderr}",
                status.signal(),
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// The ELF seed of the fuzz corpus (tests/fixtures/fuzz/README.md).
fn seed_elf() -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/fuzz/elf/seed-debug.so"
    );
    std::fs::read(path).expect("the seed ELF file")
}

/// `data` (an ELF64 little-endian file) with `p_offset` of each executable `PT_LOAD` set to
/// `offset`.
fn with_code_offset(mut data: Vec<u8>, offset: u64) -> Vec<u8> {
    let u16_at = |d: &[u8], at: usize| u16::from_le_bytes([d[at], d[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(data[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(&data, 0x36), u16_at(&data, 0x38));
    let mut patched = 0;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(data[ph..ph + 4].try_into().unwrap());
        let p_flags = u32::from_le_bytes(data[ph + 4..ph + 8].try_into().unwrap());
        if p_type == 1 && p_flags & 1 != 0 {
            data[ph + 8..ph + 16].copy_from_slice(&offset.to_le_bytes());
            patched += 1;
        }
    }
    assert!(patched > 0, "no executable PT_LOAD in the seed");
    data
}

/// Issue 45: an ELF file whose `PT_LOAD` has `p_offset = u64::MAX` made the tracefs symbol
/// offsets overflow (a panic in debug builds, a wrapped offset in release). Now the file is
/// refused as malformed; an offset near the top that still fits gives offsets in range.
#[test]
fn hostile_segment_offsets_do_not_wrap_symbol_offsets() {
    let dir = std::env::temp_dir().join(format!("selftrace-hostile-elf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hostile.so");
    std::fs::write(&path, with_code_offset(seed_elf(), u64::MAX)).unwrap();
    let r = selftrace::tracefs::function_symbols(&path);
    let _ = std::fs::remove_dir_all(&dir);
    let e = r.expect_err("a segment whose file range wraps is refused");
    assert!(
        matches!(e.kind(), selftrace::Error::BadElf(_)),
        "{e} ({:?})",
        e.kind()
    );
    assert!(e.to_string().contains("overflows"), "{e}");
}
