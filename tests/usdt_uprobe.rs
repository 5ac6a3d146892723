//! The kernel's `uprobe_events`, driven by selftrace's own code: a uprobe with the semaphore
//! as reference counter on each site of `selftrace_test:values` of a freshly built program, enabled
//! in a private instance before the program starts; every hit is recorded with the exact
//! values, and the program sees its semaphore raised.

mod example_build;
mod usdt_support;

use selftrace::tracefs::{self, uprobe::UprobeEvent, Instance};
use selftrace::usdt::read_probes;
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
