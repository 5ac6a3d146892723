//! The profile's outputs checked with the tools that read them: the pprof file with the real
//! `go tool pprof` (and decoded back with prost), the flame graph parsed as XML, the folded text
//! exactly. The profile is built by hand, so every share is known in advance. And the README's
//! demo, run from a checkout without `target/`: its pprof file and flame graph read back.
#![cfg(all(feature = "pprof", feature = "flamegraph"))]

mod example_build;

use selftrace::profile::{Line, Location, Mapping, Mode, Profile, Sample};
use selftrace::symbolize::FrameKind;
use selftrace::{StopReason, Truncation};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// 99 Hz.
const PERIOD_NS: u64 = 1_000_000_000 / 99;
const BUILD_ID: [u8; 20] = [
    0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b,
    0x0c, 0x0d, 0x0e, 0xff,
];
const APP: usize = 0x55_0000_0000;
const LIBC: usize = 0x7f00_0000_0000;

fn line(function: &str, system_name: &str, file: Option<&str>, line: Option<u32>) -> Line {
    Line {
        function: function.into(),
        system_name: system_name.into(),
        file: file.map(Arc::from),
        line,
    }
}

fn loc(address: usize, kind: FrameKind, mapping: Option<usize>, lines: Vec<Line>) -> Location {
    Location {
        address,
        kind,
        mapping,
        lines,
    }
}

fn sample(locations: &[usize], count: u64, tid: i32, name: &str) -> Sample {
    Sample {
        locations: locations.to_vec(),
        count,
        thread_id: tid,
        thread_name: name.into(),
        truncation: None,
    }
}

/// Two threads, `main` (tid 100) and `worker-1` (tid 101), 100 samples in all:
///
/// ```text
/// 80  app::hash_step (inlined into app::hash, inlined into app::work) < app::run < main
///     (50 on main, 30 on worker-1)
/// 15  __memmove_avx_unaligned_erms < <alloc::vec::Vec<u8> as app::Sink>::push < app::run < main
///  4  an address in libc without a symbol < app::copy < app::run < main
///  1  app::deep, truncated (no unwind rule)
/// ```
fn profile() -> Profile {
    let main_rs = Some("/src/app/src/main.rs");
    let hash_rs = Some("/src/app/src/hash.rs");
    let locations = vec![
        // 0
        loc(
            APP + 0x1010,
            FrameKind::Return,
            Some(0),
            vec![line("main", "main", main_rs, Some(5))],
        ),
        // 1
        loc(
            APP + 0x1100,
            FrameKind::Return,
            Some(0),
            vec![line("app::run", "_ZN3app3run17h0123456789abcdefE", main_rs, Some(12))],
        ),
        // 2: two inlined functions in app::work
        loc(
            APP + 0x1234,
            FrameKind::Exact,
            Some(0),
            vec![
                line(
                    "app::hash_step",
                    "_ZN3app9hash_step17h1111111111111111E",
                    hash_rs,
                    Some(10),
                ),
                line("app::hash", "_ZN3app4hash17h2222222222222222E", hash_rs, Some(20)),
                line("app::work", "_ZN3app4work17h3333333333333333E", main_rs, Some(30)),
            ],
        ),
        // 3: libc, a name without file or line
        loc(
            LIBC + 0x1_2345,
            FrameKind::Exact,
            Some(1),
            vec![line(
                "__memmove_avx_unaligned_erms",
                "__memmove_avx_unaligned_erms",
                None,
                None,
            )],
        ),
        // 4
        loc(
            APP + 0x1300,
            FrameKind::Return,
            Some(0),
            vec![line(
                "<alloc::vec::Vec<u8> as app::Sink>::push",
                "_ZN60_$LT$alloc..vec..Vec$LT$u8$GT$$u20$as$u20$app..Sink$GT$4push17h4444444444444444E",
                main_rs,
                Some(40),
            )],
        ),
        // 5: libc, no symbol
        loc(LIBC + 0x9_9999, FrameKind::Exact, Some(1), vec![]),
        // 6
        loc(
            APP + 0x1330,
            FrameKind::Return,
            Some(0),
            vec![line("app::copy", "_ZN3app4copy17h5555555555555555E", main_rs, Some(45))],
        ),
        // 7
        loc(
            APP + 0x1400,
            FrameKind::Exact,
            Some(0),
            vec![line("app::deep", "_ZN3app4deep17h6666666666666666E", main_rs, Some(50))],
        ),
    ];
    let mut truncated = sample(&[7], 1, 101, "worker-1");
    truncated.truncation = Some(Truncation {
        pc: APP + 0x1400,
        reason: StopReason::NoUnwindRule,
    });
    Profile {
        mode: Mode::Cpu,
        frequency_hz: 99,
        period_ns: PERIOD_NS,
        start: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        duration: Duration::from_secs(2),
        samples: vec![
            sample(&[2, 1, 0], 50, 100, "main"),
            sample(&[2, 1, 0], 30, 101, "worker-1"),
            sample(&[3, 4, 1, 0], 15, 101, "worker-1"),
            sample(&[5, 6, 1, 0], 4, 100, "main"),
            truncated,
        ],
        locations,
        mappings: vec![
            Mapping {
                start: APP,
                limit: APP + 0x10_0000,
                file_offset: 0,
                path: "/opt/selftrace-test/app".into(),
                build_id: Some(BUILD_ID.to_vec()),
            },
            Mapping {
                start: LIBC,
                limit: LIBC + 0x20_0000,
                file_offset: 0x2_8000,
                path: "/lib/x86_64-linux-gnu/libc.so.6".into(),
                build_id: None,
            },
        ],
        dropped: 7,
    }
}

/// A directory under the system's temporary directory, removed with everything in it on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "selftrace-{what}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `go tool pprof ARGS FILE` with every directory go writes to inside `dir`; returns
/// stdout. Fails with a clear message when `go` is missing (CI installs golang-go).
fn pprof(dir: &Path, args: &[&str], file: &Path) -> String {
    for d in ["home", "tmp", "gocache", "gopath"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", dir.join("home"))
        .env("PPROF_TMPDIR", dir.join("tmp"))
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GOTOOLCHAIN", "local")
        .env("GOTELEMETRY", "off")
        .env("GOFLAGS", "")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `go tool pprof` ({e}): install Go (Debian: apt-get install golang-go); \
                 this test checks the pprof output with the real pprof"
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    eprintln!("go tool pprof {args:?}:\n{stdout}");
    stdout
}

/// The rows of `go tool pprof -top`: name -> (flat, flat%, cum, cum%).
fn top_rows(out: &str) -> Vec<(String, [String; 4])> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for l in out.lines() {
        if l.trim_start().starts_with("flat  flat%") {
            in_table = true;
            continue;
        }
        if !in_table || l.trim().is_empty() {
            continue;
        }
        // flat flat% sum% cum cum% name (the name may contain spaces)
        let mut rest = l.trim_start();
        let mut cols = Vec::new();
        for _ in 0..5 {
            let end = rest.find(' ').expect("a -top row has 6 columns");
            cols.push(rest[..end].to_owned());
            rest = rest[end..].trim_start();
        }
        rows.push((
            rest.to_owned(),
            [
                cols[0].clone(),
                cols[1].clone(),
                cols[3].clone(),
                cols[4].clone(),
            ],
        ));
    }
    rows.sort();
    rows
}

fn expect_rows(rows: &[(&str, [&str; 4])]) -> Vec<(String, [String; 4])> {
    let mut v: Vec<_> = rows
        .iter()
        .map(|(n, c)| (n.to_string(), c.map(str::to_owned)))
        .collect();
    v.sort();
    v
}

#[test]
fn go_pprof_top_shows_the_known_shares() {
    let dir = TempDir::new("pprof-top");
    let file = dir.0.join("cpu.pb.gz");
    std::fs::write(&file, profile().to_pprof()).unwrap();

    let out = pprof(&dir.0, &["-top", "-nodecount=50"], &file);
    // The header: main binary, build-id, our comment, the sample type and the totals.
    for want in [
        "File: app\n",
        "Build ID: deadbeef000102030405060708090a0b0c0d0eff\n",
        "dropped 7 samples: ring full\n",
        "Type: cpu\n",
        "Duration: 2s, Total samples = 1010.10ms (50.51%)\n",
        "Showing nodes accounting for 1010.10ms, 100% of 1010.10ms total\n",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    // Time: 100 samples of 10101010 ns; the symbol-less libc address shows as its object.
    assert_eq!(
        top_rows(&out),
        expect_rows(&[
            (
                "app::hash_step (inline)",
                ["808.08ms", "80.00%", "808.08ms", "80.00%"]
            ),
            (
                "__memmove_avx_unaligned_erms",
                ["151.52ms", "15.00%", "151.52ms", "15.00%"]
            ),
            ("[libc.so.6]", ["40.40ms", "4.00%", "40.40ms", "4.00%"]),
            ("app::deep", ["10.10ms", "1.00%", "10.10ms", "1.00%"]),
            (
                "<alloc::vec::Vec<u8> as app::Sink>::push",
                ["0", "0%", "151.52ms", "15.00%"]
            ),
            (
                "[truncated: no unwind rule]",
                ["0", "0%", "10.10ms", "1.00%"]
            ),
            ("app::copy", ["0", "0%", "40.40ms", "4.00%"]),
            ("app::hash (inline)", ["0", "0%", "808.08ms", "80.00%"]),
            ("app::run", ["0", "0%", "1000ms", "99.00%"]),
            ("app::work", ["0", "0%", "808.08ms", "80.00%"]),
            ("main", ["0", "0%", "1000ms", "99.00%"]),
        ]),
        "{out}"
    );

    // The first value: the counts themselves.
    let out = pprof(&dir.0, &["-top", "-sample_index=samples"], &file);
    assert!(out.contains("Type: samples\n"), "{out}");
    let rows = top_rows(&out);
    let flat = |name: &str| {
        let row = rows.iter().find(|r| r.0 == name);
        row.unwrap_or_else(|| panic!("no {name} in\n{out}"))
            .1
            .clone()
    };
    assert_eq!(
        flat("app::hash_step (inline)"),
        ["80", "80.00%", "80", "80.00%"]
    );
    assert_eq!(
        flat("__memmove_avx_unaligned_erms"),
        ["15", "15.00%", "15", "15.00%"]
    );
    assert_eq!(flat("main"), ["0", "0%", "99", "99.00%"]);
}

#[test]
fn go_pprof_traces_show_threads_inlined_frames_and_truncation() {
    let dir = TempDir::new("pprof-traces");
    let file = dir.0.join("cpu.pb.gz");
    let mut f = std::fs::File::create(&file).unwrap();
    profile().write_pprof(&mut f).unwrap();
    drop(f);

    let out = pprof(&dir.0, &["-traces"], &file);
    // One block per sample: its labels, its value, its frames leaf first.
    let mut blocks: Vec<Vec<String>> = out
        .split("-----------+-------------------------------------------------------\n")
        .skip(1)
        .map(|b| {
            b.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
        })
        .filter(|b| !b.is_empty())
        .collect();
    blocks.sort();
    let mut want: Vec<Vec<String>> = [
        &[
            "thread: main",
            "thread_id: 100",
            "505.05ms app::hash_step (inline)",
            "app::hash (inline)",
            "app::work",
            "app::run",
            "main",
        ][..],
        &[
            "thread: worker-1",
            "thread_id: 101",
            "303.03ms app::hash_step (inline)",
            "app::hash (inline)",
            "app::work",
            "app::run",
            "main",
        ],
        &[
            "thread: worker-1",
            "thread_id: 101",
            "151.52ms __memmove_avx_unaligned_erms",
            "<alloc::vec::Vec<u8> as app::Sink>::push",
            "app::run",
            "main",
        ],
        &[
            "thread: main",
            "thread_id: 100",
            "40.40ms [libc.so.6]",
            "app::copy",
            "app::run",
            "main",
        ],
        // The truncated stack ends in its marker, not in a function that looks outermost.
        &[
            "thread: worker-1",
            "thread_id: 101",
            "10.10ms app::deep",
            "[truncated: no unwind rule]",
        ],
    ]
    .iter()
    .map(|b| b.iter().map(|s| s.to_string()).collect())
    .collect();
    want.sort();
    assert_eq!(blocks, want, "{out}");

    // -raw: file:line of each inlined frame, the mappings marked as symbolized, the period.
    let raw = pprof(&dir.0, &["-raw"], &file);
    for want in [
        "PeriodType: cpu nanoseconds\n",
        "Period: 10101010\n",
        "Duration: 2s\n",
        "Comment: dropped 7 samples: ring full\n",
        "samples/count cpu/nanoseconds\n",
        // pprof's location 1: the exact pc, three functions innermost first.
        ": 0x5500001234 M=1 app::hash_step /src/app/src/hash.rs:10 s=0(_ZN3app9hash_step17h1111111111111111E)\n",
        " app::hash /src/app/src/hash.rs:20 s=0(_ZN3app4hash17h2222222222222222E)\n",
        " app::work /src/app/src/main.rs:30 s=0(_ZN3app4work17h3333333333333333E)\n",
        // A return address is written as the address looked up (inside the call).
        ": 0x55000010ff M=1 app::run /src/app/src/main.rs:12 ",
        ": 0x7f0000099999 M=2 \n",
        "1: 0x5500000000/0x5500100000/0x0 /opt/selftrace-test/app deadbeef000102030405060708090a0b0c0d0eff [FN][FL][LN][IN]\n",
        "2: 0x7f0000000000/0x7f0000200000/0x28000 /lib/x86_64-linux-gnu/libc.so.6  [FN][FL][LN][IN]\n",
    ] {
        assert!(raw.contains(want), "no {want:?} in:\n{raw}");
    }
}

/// The messages of profile.proto that the test reads back, written from the proto again
/// (the library's are private): an independent check of the field numbers.
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

fn decode(gz: &[u8]) -> pb::Profile {
    use prost::Message as _;
    use std::io::Read as _;
    assert_eq!(gz[..2], [0x1f, 0x8b], "not gzip");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .expect("gunzip");
    pb::Profile::decode(&raw[..]).expect("decode profile.proto")
}

#[test]
fn pprof_decodes_back_with_the_profile_contents() {
    let p = profile();
    let gz = p.to_pprof();
    let mut written = Vec::new();
    p.write_pprof(&mut written).unwrap();
    assert_eq!(gz, written);
    let d = decode(&gz);
    let s = |i: i64| d.string_table[usize::try_from(i).unwrap()].as_str();

    // The string table: "" first, each string once.
    assert_eq!(d.string_table[0], "");
    let mut unique = d.string_table.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), d.string_table.len(), "{:?}", d.string_table);

    let types: Vec<_> = d
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let pt = d.period_type.clone().expect("period_type");
    assert_eq!((s(pt.r#type), s(pt.unit)), ("cpu", "nanoseconds"));
    assert_eq!(d.period, 10_101_010);
    assert_eq!(d.time_nanos, 1_700_000_000_000_000_000);
    assert_eq!(d.duration_nanos, 2_000_000_000);
    let comments: Vec<_> = d.comment.iter().map(|&c| s(c)).collect();
    assert_eq!(comments, ["dropped 7 samples: ring full"]);

    // Samples in order: values, labels, location ids leaf first (profile index + 1), the
    // truncated one with its marker last.
    let got: Vec<_> = d
        .sample
        .iter()
        .map(|x| {
            let labels: Vec<_> = x
                .label
                .iter()
                .map(|l| (s(l.key), s(l.str), l.num))
                .collect();
            (x.value.clone(), x.location_id.clone(), labels)
        })
        .collect();
    let th = |name: &'static str, tid: i64| vec![("thread", name, 0), ("thread_id", "", tid)];
    assert_eq!(
        got,
        vec![
            (vec![50, 505_050_500], vec![3, 2, 1], th("main", 100)),
            (vec![30, 303_030_300], vec![3, 2, 1], th("worker-1", 101)),
            (vec![15, 151_515_150], vec![4, 5, 2, 1], th("worker-1", 101)),
            (vec![4, 40_404_040], vec![6, 7, 2, 1], th("main", 100)),
            (vec![1, 10_101_010], vec![8, 9], th("worker-1", 101)),
        ]
    );

    // Locations: lookup addresses, mappings, lines innermost first.
    let func = |id: u64| {
        let f = d.function.iter().find(|f| f.id == id).expect("function");
        (s(f.name), s(f.system_name), s(f.filename), f.start_line)
    };
    let loc = |id: u64| d.location.iter().find(|l| l.id == id).expect("location");
    let l3 = loc(3);
    assert_eq!((l3.address, l3.mapping_id), (APP as u64 + 0x1234, 1));
    let lines: Vec<_> = l3
        .line
        .iter()
        .map(|l| (func(l.function_id).0, l.line))
        .collect();
    assert_eq!(
        lines,
        [("app::hash_step", 10), ("app::hash", 20), ("app::work", 30)]
    );
    assert_eq!(
        func(l3.line[2].function_id),
        (
            "app::work",
            "_ZN3app4work17h3333333333333333E",
            "/src/app/src/main.rs",
            0
        )
    );
    assert_eq!(loc(2).address, APP as u64 + 0x1100 - 1, "a return address");
    let libc_fn = func(loc(4).line[0].function_id);
    assert_eq!(
        libc_fn,
        (
            "__memmove_avx_unaligned_erms",
            "__memmove_avx_unaligned_erms",
            "",
            0
        )
    );
    let l6 = loc(6);
    assert_eq!((l6.address, l6.mapping_id), (LIBC as u64 + 0x9_9999, 2));
    assert!(
        l6.line.is_empty(),
        "an address without a symbol has no lines"
    );
    let l9 = loc(9);
    assert_eq!((l9.address, l9.mapping_id, l9.line.len()), (0, 0, 1));
    assert_eq!(
        func(l9.line[0].function_id).0,
        "[truncated: no unwind rule]"
    );
    assert_eq!(d.location.len(), 9);

    // Functions: each once (app::work appears in two samples, at one location).
    let mut names: Vec<_> = d.function.iter().map(|f| s(f.name)).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "<alloc::vec::Vec<u8> as app::Sink>::push",
            "[truncated: no unwind rule]",
            "__memmove_avx_unaligned_erms",
            "app::copy",
            "app::deep",
            "app::hash",
            "app::hash_step",
            "app::run",
            "app::work",
            "main",
        ]
    );
    let ids: Vec<_> = d.function.iter().map(|f| f.id).collect();
    assert_eq!(ids, (1..=10).collect::<Vec<u64>>());

    // Mappings.
    let m: Vec<_> = d
        .mapping
        .iter()
        .map(|m| {
            (
                m.id,
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                s(m.filename),
                s(m.build_id),
                m.has_functions && m.has_inline_frames,
            )
        })
        .collect();
    assert_eq!(
        m,
        [
            (
                1,
                APP as u64,
                APP as u64 + 0x10_0000,
                0,
                "/opt/selftrace-test/app",
                "deadbeef000102030405060708090a0b0c0d0eff",
                true
            ),
            (
                2,
                LIBC as u64,
                LIBC as u64 + 0x20_0000,
                0x2_8000,
                "/lib/x86_64-linux-gnu/libc.so.6",
                "",
                true
            ),
        ]
    );
}

#[test]
fn pprof_of_a_wall_profile_without_drops() {
    let mut p = profile();
    p.mode = Mode::Wall;
    p.dropped = 0;
    let d = decode(&p.to_pprof());
    let s = |i: i64| d.string_table[usize::try_from(i).unwrap()].as_str();
    let types: Vec<_> = d
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("wall", "nanoseconds")]);
    let pt = d.period_type.clone().expect("period_type");
    assert_eq!((s(pt.r#type), s(pt.unit)), ("wall", "nanoseconds"));
    assert!(d.comment.is_empty());

    // An empty profile is still a valid file pprof reads.
    p.samples.clear();
    p.locations.clear();
    p.mappings.clear();
    let d = decode(&p.to_pprof());
    assert!(d.sample.is_empty() && d.location.is_empty() && d.function.is_empty());
    let dir = TempDir::new("pprof-empty");
    let file = dir.0.join("wall.pb.gz");
    std::fs::write(&file, p.to_pprof()).unwrap();
    let out = pprof(&dir.0, &["-top"], &file);
    assert!(out.contains("Type: wall\n"), "{out}");
}

fn parse_svg(svg: &[u8]) -> roxmltree::Document<'_> {
    let text = std::str::from_utf8(svg).expect("SVG is UTF-8");
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(text, options).expect("SVG is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert_eq!(
        doc.root_element().tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    doc
}

/// The text of every element named `name`.
fn texts(doc: &roxmltree::Document<'_>, name: &str) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.tag_name().name() == name)
        .map(|n| n.text().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn flame_graph_has_every_frame_with_its_count() {
    let p = profile();
    let svg = p.flamegraph_svg();
    let mut written = Vec::new();
    p.write_flamegraph(&mut written).unwrap();
    assert_eq!(svg, written, "the same profile gives the same SVG");
    let doc = parse_svg(&svg);

    let text = texts(&doc, "text");
    assert!(text.contains(&"CPU profile, 99 Hz".to_owned()), "{text:?}");
    assert!(
        text.contains(&"100 samples; 7 more dropped (ring full)".to_owned()),
        "{text:?}"
    );

    // One frame per (stack prefix, name): thread names at the bottom, then the functions,
    // inlined ones included; names with '<' and '>' come back intact from the XML.
    let mut titles = texts(&doc, "title");
    titles.sort();
    let mut want = vec![
        "all (100 samples, 100%)",
        "main (54 samples, 54.00%)",
        "main (54 samples, 54.00%)",
        "app::run (54 samples, 54.00%)",
        "app::work (50 samples, 50.00%)",
        "app::hash (50 samples, 50.00%)",
        "app::hash_step (50 samples, 50.00%)",
        "app::copy (4 samples, 4.00%)",
        "libc.so.6+0xc1999 (4 samples, 4.00%)",
        "worker-1 (46 samples, 46.00%)",
        "main (45 samples, 45.00%)",
        "app::run (45 samples, 45.00%)",
        "app::work (30 samples, 30.00%)",
        "app::hash (30 samples, 30.00%)",
        "app::hash_step (30 samples, 30.00%)",
        "<alloc::vec::Vec<u8> as app::Sink>::push (15 samples, 15.00%)",
        "__memmove_avx_unaligned_erms (15 samples, 15.00%)",
        "[truncated: no unwind rule] (1 samples, 1.00%)",
        "app::deep (1 samples, 1.00%)",
    ];
    want.sort();
    assert_eq!(titles, want);
}

#[test]
fn flame_graph_without_samples_says_so() {
    let mut p = profile();
    p.mode = Mode::Wall;
    p.frequency_hz = 49;
    p.samples.clear();
    let svg = p.flamegraph_svg();
    let doc = parse_svg(&svg);
    assert_eq!(
        texts(&doc, "text"),
        ["Wall-clock profile, 49 Hz", "no samples"]
    );
    let mut written = Vec::new();
    p.write_flamegraph(&mut written).unwrap();
    assert_eq!(svg, written);
}

#[test]
fn folded_is_exact() {
    let mut p = profile();
    // The unnamed libc frame shows its offset in the file: address - mapping start (0x99999)
    // + the mapping's file offset (0x28000).
    assert_eq!(
        p.folded(),
        "main;main;app::run;app::copy;libc.so.6+0xc1999 4\n\
         main;main;app::run;app::work;app::hash;app::hash_step 50\n\
         worker-1;[truncated: no unwind rule];app::deep 1\n\
         worker-1;main;app::run;<alloc::vec::Vec<u8> as app::Sink>::push;__memmove_avx_unaligned_erms 15\n\
         worker-1;main;app::run;app::work;app::hash;app::hash_step 30\n"
    );

    // The same names at another address fold into the same line; ';' in a name does not
    // split it.
    let mut other = p.locations[2].clone();
    other.address += 8;
    p.locations.push(other);
    p.samples.push(sample(&[8, 1, 0], 5, 100, "main"));
    p.locations[7].lines[0].function = "app::deep;odd".into();
    assert_eq!(
        p.folded(),
        "main;main;app::run;app::copy;libc.so.6+0xc1999 4\n\
         main;main;app::run;app::work;app::hash;app::hash_step 55\n\
         worker-1;[truncated: no unwind rule];app::deep:odd 1\n\
         worker-1;main;app::run;<alloc::vec::Vec<u8> as app::Sink>::push;__memmove_avx_unaligned_erms 15\n\
         worker-1;main;app::run;app::work;app::hash;app::hash_step 30\n"
    );
}

/// Copies the directory `from` into `to` (created), but for every `target` and `.git`: a
/// checkout as a fresh clone has it. The copies are new files (not with the originals'
/// modification times: cargo would take an earlier build of a file copied before it was last
/// changed for fresh).
fn copy_sources(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        let ty = entry.file_type().unwrap();
        if ty.is_dir() {
            copy_sources(&src, &dst);
        } else if ty.is_file() {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// The README's demo command, `cargo run --release --features pprof,flamegraph --example
/// demo`, run from a checkout whose `target/` does not exist because `CARGO_TARGET_DIR` points
/// elsewhere: the demo writes its pprof file and its flame graph where it says it does, and
/// both read back. The checkout is a copy of this one under `target/tmp` (removed afterwards),
/// built in the fixtures' target directory, whose release programs have the same dependencies
/// ([`example_build::RELEASE_FEATURES`]): only the copy's own packages are compiled again. The
/// demo's temporary directory is one of the test's own, removed afterwards.
#[test]
fn demo_writes_its_profile_and_flame_graph_whatever_the_target_dir() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let checkout = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo-checkout");
    let _ = std::fs::remove_dir_all(&checkout);
    copy_sources(root, &checkout);
    let tmp = TempDir::new("demo");
    let (out, _) = example_build::cargo(
        &checkout,
        example_build::FIXTURES,
        "run",
        &[
            "--release",
            "--features",
            "pprof,flamegraph",
            "--example",
            "demo",
        ],
        &[("TMPDIR", tmp.0.as_os_str())],
    );
    let no_target = !checkout.join("target").exists();
    let _ = std::fs::remove_dir_all(&checkout);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "the demo failed ({}):\n{all}",
        out.status
    );
    assert!(no_target, "the demo's run made a target/ in the checkout");
    // `flame graph: PATH` and `pprof: PATH`, each on a line of its own.
    let written = |what: &str| -> PathBuf {
        let path = stdout
            .lines()
            .find_map(|l| l.strip_prefix(what))
            .unwrap_or_else(|| panic!("no `{what}PATH` line:\n{all}"));
        let path = PathBuf::from(path);
        assert!(
            path.is_absolute() && path.starts_with(&tmp.0),
            "{what}{}: not a full path in the temporary directory {}",
            path.display(),
            tmp.0.display()
        );
        path
    };
    let svg = std::fs::read(written("flame graph: ")).expect("the flame graph is there");
    let doc = parse_svg(&svg);
    let titles = texts(&doc, "title");
    for f in [
        "demo::decode_frame",
        "demo::checksum_block",
        "demo::compress_block",
    ] {
        assert!(
            titles.iter().any(|t| t.starts_with(&format!("{f} ("))),
            "no frame {f} in the flame graph: {titles:?}"
        );
    }
    let gz = std::fs::read(written("pprof: ")).expect("the pprof file is there");
    let p = decode(&gz);
    assert!(!p.sample.is_empty(), "no samples in the pprof file");
    for f in [
        "demo::decode_frame",
        "demo::checksum_block",
        "demo::compress_block",
    ] {
        assert!(
            p.string_table.iter().any(|s| s == f),
            "no function {f} in the pprof file"
        );
    }
}
