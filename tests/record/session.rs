//! `tracefs::Session` against the real kernel: USDT probes with their semaphores, function
//! entry and return uprobes by symbol, a raw offset, hits parsed with their values, a child
//! process followed; everything removed on drop, also while a panic unwinds; clear errors.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "tracefs")]

use crate::record_support;

use record_support::*;
use selftrace::tracefs::{self, uprobe::UprobeEvent, EventKind, Hit, Session};
use selftrace::usdt::read_probes;
use selftrace::Error;
use std::process::Command;

fn of<'a>(hits: &'a [Hit], label: &str) -> Vec<&'a Hit> {
    hits.iter().filter(|h| h.label == label).collect()
}

#[test]
fn session_records_probes_functions_and_offsets() {
    if !usable("session_records_probes_functions_and_offsets") {
        return;
    }
    let bin = record_target();
    let me = std::process::id();
    let inst_prefix = format!("selftrace-rsess-{me}-");
    let group;
    {
        let mut s = Session::with_markers("selftrace-rsess").unwrap();
        group = s.group().to_string();
        let notes = read_probes(&bin).unwrap();
        for n in notes.iter().filter(|n| n.file_offset.is_some()) {
            let e = s.add_probe(&bin, n).unwrap();
            assert_eq!(e.kind, EventKind::Probe);
        }
        s.add_function(&bin, "record_target_compute", false, "x=%di:u64")
            .unwrap();
        s.add_function(&bin, "record_target_compute", true, "")
            .unwrap();
        let off = tracefs::function_offset(&bin, "record_target_compute").unwrap();
        let raw = s.add_offset(&bin, off, false, "").unwrap().label.clone();
        // Every event is in our private group, and the kernel has exactly those.
        let mut ours: Vec<String> = s.events().iter().map(|e| e.event.clone()).collect();
        ours.sort();
        assert_eq!(group_events(s.group()), ours);
        // This thread spawns the program: follow its forks.
        s.filter_pids(&[gettid()], true).unwrap();
        s.enable().unwrap();

        let out = Command::new(&bin).args(["run", "3"]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let hits = s.read_hits().unwrap();
        let dump = format!("{hits:#?}");

        let step = of(&hits, "rt:step");
        assert_eq!(step.len(), 3, "{dump}");
        for (i, h) in step.iter().enumerate() {
            assert_eq!(h.arg_u64("a0"), Some(i as u64), "{h:?}");
            assert_eq!(h.arg_i64("a1"), Some(i as i64 - 2), "{h:?}");
            assert!(h.address.is_some() && h.pid.is_some(), "{h:?}");
        }
        let result: Vec<_> = of(&hits, "rt:result")
            .iter()
            .map(|h| h.arg_u64("a0"))
            .collect();
        assert_eq!(result, [Some(1), Some(4), Some(7)], "{dump}");
        let entry: Vec<_> = of(&hits, "record_target_compute")
            .iter()
            .map(|h| h.arg_u64("x"))
            .collect();
        assert_eq!(entry, [Some(0), Some(1), Some(2)], "{dump}");
        let ret = of(&hits, "record_target_compute%return");
        assert!(ret.iter().all(|h| h.kind == EventKind::Return));
        let ret: Vec<_> = ret.iter().map(|h| h.arg_u64("ret")).collect();
        assert_eq!(ret, [Some(1), Some(4), Some(7)], "{dump}");
        assert_eq!(of(&hits, &raw).len(), 3, "{dump}");

        // A thread and a child process, both followed.
        let main_pid = step[0].pid.unwrap();
        let thread = of(&hits, "rt:thread");
        assert_eq!(thread.len(), 1, "{dump}");
        assert_eq!(thread[0].arg_u64("a0"), Some(77));
        assert_eq!(thread[0].pid, Some(main_pid));
        assert_ne!(thread[0].tid, main_pid);
        let child = of(&hits, "rt:child");
        assert_eq!(child.len(), 1, "{dump}");
        assert_eq!(child[0].arg_u64("a0"), Some(99));
        assert_ne!(child[0].pid, Some(main_pid));

        // The instance recorded the program's trace markers too.
        let rounds = s
            .instance()
            .read_markers()
            .unwrap()
            .into_iter()
            .filter(|m| m.pid == Some(main_pid) && m.text.ends_with("|round"))
            .count();
        // (Markers of every process are lost while anybody resizes an instance that copies
        // them: a concurrent test run elsewhere on the machine can make this fail.)
        assert_eq!(rounds, 3, "trace markers lost");
    }
    assert_eq!(leftovers(&group, &inst_prefix), Vec::<String>::new());
}

#[test]
fn drop_while_panicking_removes_everything() {
    if !usable("drop_while_panicking_removes_everything") {
        return;
    }
    let bin = record_target();
    let inst_prefix = format!("selftrace-rpanic-{}-", std::process::id());
    let group = std::sync::Mutex::new(String::new());
    let r = std::panic::catch_unwind(|| {
        let mut s = Session::new("selftrace-rpanic").unwrap();
        *group.lock().unwrap() = s.group().to_string();
        s.add_function(&bin, "record_target_compute", false, "")
            .unwrap();
        s.add_function(&bin, "record_target_compute", true, "")
            .unwrap();
        s.enable().unwrap();
        assert_eq!(leftovers(s.group(), &inst_prefix).len(), 3);
        panic!("test panic with an enabled session");
    });
    assert!(r.is_err());
    let group = group.lock().unwrap().clone();
    assert!(group.starts_with("selftrace_"));
    assert_eq!(leftovers(&group, &inst_prefix), Vec::<String>::new());
}

#[test]
fn clear_errors() {
    if !usable("clear_errors") {
        return;
    }
    let bin = record_target();
    let inst_prefix = format!("selftrace-rerr-{}-", std::process::id());
    let group;
    {
        let mut s = Session::new("selftrace-rerr").unwrap();
        group = s.group().to_string();
        let e = s
            .add_function(&bin, "no_such_function_xyz", false, "")
            .unwrap_err();
        assert_eq!(e.kind(), Error::NotFound("symbol"));
        assert_eq!(e.event(), Some("no_such_function_xyz"));
        assert_eq!(
            e.path(),
            Some(std::fs::canonicalize(&bin).unwrap().as_path())
        );
        let e = s
            .add_function("/nonexistent/bin".as_ref(), "main", false, "")
            .unwrap_err();
        assert_eq!(e.kind(), Error::NotFound("elf file"));
        assert_eq!(e.path(), Some(std::path::Path::new("/nonexistent/bin")));
        assert!(
            e.to_string()
                .contains("/nonexistent/bin for symbol main: not found: elf file"),
            "{e}"
        );
        // Somebody else's event in our group: refused instead of silently merged.
        let off = tracefs::function_offset(&bin, "record_target_compute").unwrap();
        let bin = std::fs::canonicalize(&bin).unwrap();
        let foreign =
            UprobeEvent::create(s.group(), "record_target_compute", &bin, off, None, "").unwrap();
        let e = s
            .add_function(&bin, "record_target_compute", false, "")
            .unwrap_err();
        assert_eq!(e.kind(), Error::AlreadyExists("uprobe event"));
        let id = format!("{}/record_target_compute", s.group());
        assert_eq!(e.event(), Some(id.as_str()));
        assert!(s.events().is_empty());
        drop(foreign);
    }
    assert_eq!(leftovers(&group, &inst_prefix), Vec::<String>::new());
}
