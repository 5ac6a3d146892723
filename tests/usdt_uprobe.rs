//! The kernel's `uprobe_events`, driven by selftrace's own code: a uprobe with the semaphore
//! as reference counter on each site of `selftrace_test:values` of a freshly built program, enabled
//! in a private instance before the program starts; every hit is recorded with the exact
//! values, and the program sees its semaphore raised.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "tracefs")]

mod example_build;
mod usdt_support;

use selftrace::tracefs::{self, uprobe::UprobeEvent, Instance};
use selftrace::usdt::read_probes;
use std::path::Path;
use std::process::Command;
use usdt_support::*;

fn tracefs_usable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let why = match tracefs::root() {
        Ok(_) if root => return true,
        Ok(_) => "not root".to_string(),
        Err(e) => e.to_string(),
    };
    if std::env::var("SELFTRACE_REQUIRE_TRACEFS").as_deref() == Ok("1") {
        panic!("uprobe_events test: {why} (SELFTRACE_REQUIRE_TRACEFS=1)");
    }
    eprintln!("skipping uprobe_events test: {why}");
    false
}

#[test]
fn uprobe_events_with_ref_ctr_sees_every_hit() {
    if !tracefs_usable() {
        return;
    }
    let bin = target_bin("dev");
    let notes = read_probes(&bin).unwrap();
    let sites: Vec<_> = notes
        .iter()
        .filter(|n| n.provider == "selftrace_test" && n.name == "values")
        .collect();
    assert_eq!(sites.len(), 2);
    let texts: Vec<_> = notes
        .iter()
        .filter(|n| n.provider == "selftrace_test" && n.name == "text")
        .collect();
    assert_eq!(texts.len(), 2);

    let group = format!("selftrace_usdt_{}", std::process::id());
    let mut events = Vec::new();
    for (i, site) in sites.iter().enumerate() {
        events.push(UprobeEvent::for_probe(&group, &format!("values{i}"), &bin, site).unwrap());
    }
    for (i, site) in texts.iter().enumerate() {
        events.push(UprobeEvent::for_probe(&group, &format!("text{i}"), &bin, site).unwrap());
    }
    // Declared after the events: dropped (and so disabled) first.
    let inst = Instance::create("selftrace-usdt").unwrap();
    for e in &events {
        inst.set_event_enabled(e.group(), e.event(), true).unwrap();
    }

    let out = Command::new(&bin).args(["values", "6"]).output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The kernel raised the semaphore in a process started after the event was enabled.
    assert!(stdout.contains("enabled=1"), "{stdout}");
    // Nobody attached to selftrace_test:lazy: its arguments were never evaluated.
    assert_eq!(stdout.matches("lazy evaluated").count(), 0, "{stdout}");

    let trace = inst.read_trace().unwrap();
    let want = "a0=-5 a1=65000 a2=-123456 a3=-9000000000 a4=18000000000000000000 a5=305419896";
    let mut per_site = [0; 2];
    for line in trace.lines() {
        for (i, n) in per_site.iter_mut().enumerate() {
            if line.contains(&format!(" values{i}: (")) {
                assert!(line.ends_with(want), "{line}");
                *n += 1;
            }
        }
    }
    // Even iterations fire the first site, odd ones the second.
    assert_eq!(per_site, [3, 3], "trace:\n{trace}");
    let texts: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains(" text0: (") || l.contains(" text1: ("))
        .collect();
    assert_eq!(texts.len(), 6, "trace:\n{trace}");
    for (i, l) in texts.iter().enumerate() {
        // a1 is the length, a2 the iteration; a0 the pointer, and the bytes it points to,
        // which parse_hit_body decodes into the text.
        assert!(l.contains(&format!(" a1=10 a2={i} a0_bytes={{")), "{l}");
        let r = tracefs::parse_record(l).expect("a trace line");
        let (_, args) = tracefs::parse_hit_body(r.body);
        let args: Vec<String> = args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            args,
            ["a0=\"hello usdt\"", "a1=10", &format!("a2={i}")],
            "{l}"
        );
    }
    drop(inst);
    drop(events);
    let left = std::fs::read_to_string(tracefs::root().unwrap().join("uprobe_events")).unwrap();
    assert!(!left.contains(&group), "events left behind:\n{left}");
}

#[inline(never)]
fn ping(i: u32) {
    selftrace::probe!(selftrace_self, ping, i);
}

#[test]
fn own_uprobe_raises_own_semaphore() {
    if !tracefs_usable() {
        return;
    }
    ping(100);
    let exe = std::env::current_exe().unwrap();
    let note = read_probes(&exe)
        .unwrap()
        .into_iter()
        .find(|n| n.provider == "selftrace_self" && n.name == "ping")
        .unwrap();
    assert!(!selftrace::probe_enabled!(selftrace_self, ping));
    let group = format!("selftrace_self_{}", std::process::id());
    let event = UprobeEvent::for_probe(&group, "ping", &exe, &note).unwrap();
    let inst = Instance::create("selftrace-self").unwrap();
    inst.set_event_enabled(event.group(), event.event(), true)
        .unwrap();
    // The kernel raised the semaphore of this running process.
    assert!(selftrace::probe_enabled!(selftrace_self, ping));
    let listed = selftrace::usdt::probes()
        .into_iter()
        .find(|p| p.provider() == "selftrace_self" && p.name() == "ping")
        .unwrap();
    assert!(listed.was_enabled());
    for i in 0..4 {
        ping(i);
    }
    let trace = inst.read_trace().unwrap();
    let hits: Vec<&str> = trace.lines().filter(|l| l.contains(" ping: (")).collect();
    assert_eq!(hits.len(), 4, "{trace}");
    for (i, h) in hits.iter().enumerate() {
        assert!(h.ends_with(&format!(" a0={i}")), "{h}");
    }
    drop(inst);
    assert!(!selftrace::probe_enabled!(selftrace_self, ping));
    drop(event);
}

/// The function the bad-argument test attaches to: no other test probes it.
#[inline(never)]
fn error_target(x: u64) -> u64 {
    std::hint::black_box(x) + 1
}

/// The probe the conflict test attaches to (with its semaphore): no other test probes it.
#[inline(never)]
fn conflict_site(i: u32) {
    selftrace::probe!(selftrace_err, conflict, i);
}

/// The events the kernel has in `group` (its `events/GROUP/` directories).
fn group_events(group: &str) -> Vec<String> {
    let dir = tracefs::root().unwrap().join("events").join(group);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn refused_uprobe_says_why_and_where() {
    use std::error::Error as _;
    if !tracefs_usable() {
        return;
    }
    assert_eq!(error_target(1), 2);
    let exe = std::env::current_exe().unwrap();
    let off = tracefs::function_offset(&exe, "error_target").unwrap();
    let root = tracefs::root().unwrap();
    let group = format!("selftrace_errtest_{}", std::process::id());
    // An `Ok` would be a registered event: `unwrap_err` drops (removes) it while panicking.
    let e = UprobeEvent::create(&group, "bad_arg", &exe, off, None, "x=%zz").unwrap_err();
    let msg = e.to_string();
    assert_eq!(
        e.kind(),
        selftrace::Error::Sys {
            call: "write",
            errno: libc::EINVAL
        },
        "{msg}"
    );
    let uprobe_events = root.join("uprobe_events");
    assert_eq!(e.path(), Some(uprobe_events.as_path()), "{msg}");
    let id = format!("{group}/bad_arg");
    assert_eq!(e.event(), Some(id.as_str()), "{msg}");
    // The kernel's error_log entry for this very command, and the word its caret points at.
    let why = e.kernel_message().expect("the kernel's reason").to_string();
    let why = why.as_str();
    assert!(why.starts_with("Invalid register name at '"), "{why}");
    assert!(why.contains("%zz"), "{why}");
    let log = std::fs::read_to_string(root.join("error_log")).unwrap();
    let (text, _) = why.split_once(" at '").unwrap();
    assert!(
        log.contains(&format!("error: {text}")),
        "{why} not in:\n{log}"
    );
    // One line: what was written, for which event, the errno, the kernel's reason.
    assert_eq!(
        msg,
        format!(
            "writing {} for event {id}: Invalid argument (os error 22): kernel: {why}",
            uprobe_events.display()
        )
    );
    assert!(!msg.contains('\n'));
    let io = e
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the write's io::Error is the source");
    assert_eq!(io.raw_os_error(), Some(libc::EINVAL));
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
    assert!(io.to_string().contains(why), "{io}");
    assert_eq!(group_events(&group), Vec::<String>::new());
}

#[test]
fn conflicting_uprobe_names_the_event_in_the_way() {
    if !tracefs_usable() {
        return;
    }
    conflict_site(1);
    let exe = std::env::current_exe().unwrap();
    let note = read_probes(&exe)
        .unwrap()
        .into_iter()
        .find(|n| n.provider == "selftrace_err" && n.name == "conflict")
        .unwrap();
    let group = format!("selftrace_errconf_{}", std::process::id());
    // Removed on drop, also when an assertion below fails.
    let first = UprobeEvent::for_probe(&group, "first", &exe, &note).unwrap();
    // The same address without the semaphore as reference counter: the kernel refuses it (and
    // writes nothing to error_log); the error names the event in the way.
    let e = UprobeEvent::create(&group, "second", &exe, note.file_offset.unwrap(), None, "")
        .unwrap_err();
    let why = e.kernel_message().expect("the event in the way");
    assert!(
        why.contains(&format!(
            "is already probed by the uprobe event {group}/first ("
        )),
        "{why}"
    );
    assert!(why.contains("that event is this session's own"), "{why}");
    let second = format!("{group}/second");
    assert_eq!(e.event(), Some(second.as_str()));
    assert!(e.to_string().contains(&format!(": kernel: {why}")), "{e}");
    drop(first);
    assert_eq!(group_events(&group), Vec::<String>::new());
}

#[test]
fn instance_errors_name_the_file_and_event() {
    use std::error::Error as _;
    if !tracefs_usable() {
        return;
    }
    let inst = Instance::create("selftrace-errtest").unwrap();
    let group = format!("selftrace_errnone_{}", std::process::id());
    let e = inst.set_event_enabled(&group, "missing", true).unwrap_err();
    assert_eq!(e.kind(), selftrace::Error::NotFound("event enable file"));
    let enable = inst.file(&format!("events/{group}/missing/enable"));
    assert_eq!(e.path(), Some(enable.as_path()));
    let id = format!("{group}/missing");
    assert_eq!(e.event(), Some(id.as_str()));
    assert_eq!(
        e.to_string(),
        format!(
            "writing {} for event {id}: not found: event enable file",
            enable.display()
        )
    );
    assert_eq!(e.kernel_message(), None);
    let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
    assert_eq!(io.map(|io| io.kind()), Some(std::io::ErrorKind::NotFound));
    let e = inst.read_file("no_such_file").unwrap_err();
    assert_eq!(e.path(), Some(inst.file("no_such_file").as_path()));
    assert!(e.to_string().starts_with("reading /"), "{e}");
    // Bad names are refused before anything is written, and say which name.
    let e = UprobeEvent::create("bad group", "e", Path::new("/bin/true"), 0, None, "").unwrap_err();
    assert!(matches!(e.kind(), selftrace::Error::InvalidInput(_)));
    assert_eq!((e.event(), e.path()), (Some("bad group"), None));
    assert!(
        e.to_string()
            .starts_with("group \"bad group\": invalid input: "),
        "{e}"
    );
}
