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

const CASES: &[(&str, fn())] = &[
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
