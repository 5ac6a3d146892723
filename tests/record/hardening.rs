//! `selftrace record` and `clean` against hostile or careless use: a second user (uid 65534,
//! through `setpriv`) planting symbolic links at the output paths; outputs that cannot be
//! written (found before the command runs); the command's process tree outliving the recorder;
//! `clean` run from another PID namespace while a recording is live; kernel errors with their
//! cause, also between two live recorders of one USDT site; markers the kernel dropped,
//! counted in the summary; an unprivileged user from a checkout they cannot enter; `&str` probe
//! arguments recorded as their text, and no byte of the memory after them in any file. Needs
//! root and tracefs (skips, or fails under `SELFTRACE_REQUIRE_TRACEFS=1`).
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "tracefs")]

use crate::record_support;

use record_support::*;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A directory every user can write to (mode 1777, like /tmp), removed when dropped.
struct SharedDir(PathBuf);

impl SharedDir {
    fn new(name: &str) -> SharedDir {
        let d = std::env::temp_dir().join(format!("selftrace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        SharedDir(d)
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `args` as uid/gid 65534 with no supplementary groups (`setpriv`).
fn as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(args)
        .output()
        .expect("setpriv (util-linux)")
}

fn alive(pid: i32) -> bool {
    // A zombie is dead for this purpose.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits (at most `secs`) until none of `pids` is alive.
fn all_gone(pids: &[i32], secs: u64) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if pids.iter().all(|&p| !alive(p)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Waits until `file` holds `n` lines of pids and returns them.
fn read_pids(file: &Path, n: usize) -> Vec<i32> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let pids: Vec<i32> = std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.len() >= n {
            return pids;
        }
        assert!(
            Instant::now() < end,
            "the command did not start its processes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A live `selftrace record -o FILE ARGS -- BIN wait`: record_target has run one round and
/// printed `ready PID`. Dropped (also while a failed assertion unwinds), it ends the command
/// with SIGTERM and waits for the recorder, which then removes what it made in tracefs.
struct LiveRecorder {
    child: Option<Child>,
    /// The recorder's pid.
    pid: u32,
    /// The recorded command's pid.
    command: i32,
}

impl LiveRecorder {
    fn start(file: &Path, args: &[&str], bin: &Path) -> LiveRecorder {
        let mut child = selftrace()
            .args(["record", "-o", file.to_str().unwrap()])
            .args(args)
            .arg("--")
            .arg(bin)
            .arg("wait")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut rec = LiveRecorder {
            child: Some(child),
            pid,
            command: 0,
        };
        let mut line = String::new();
        while !line.starts_with("ready ") {
            line.clear();
            if stdout.read_line(&mut line).unwrap() == 0 {
                let o = rec.child.take().unwrap().wait_with_output().unwrap();
                panic!("recorder ended early: {}", stderr(&o));
            }
        }
        rec.command = line["ready ".len()..].trim().parse().unwrap();
        rec
    }

    /// Ends the command (SIGTERM) and returns the recorder's output.
    fn finish(mut self) -> Output {
        // SAFETY: kill of the recorded program (our grandchild).
        unsafe { libc::kill(self.command, libc::SIGTERM) };
        self.child.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for LiveRecorder {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.command > 0 {
                // SAFETY: as in `finish`.
                unsafe { libc::kill(self.command, libc::SIGTERM) };
            } else {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

#[test]
fn symlinks_planted_by_another_user_are_not_followed() {
    if !usable("symlinks_planted_by_another_user_are_not_followed") {
        return;
    }
    let shared = SharedDir::new("symlink");
    // Root's precious files, somewhere else.
    let victims = tempdir("victims");
    let victim = victims.join("precious");
    std::fs::write(&victim, "precious\n").unwrap();
    let out = shared.0.join("rt.trace");
    let json = shared.0.join("rt.json");
    let v = victim.to_str().unwrap();
    for (link, name) in [(&out, "text"), (&json, "json")] {
        let o = as_nobody(&["ln", "-s", v, link.to_str().unwrap()]);
        assert!(o.status.success(), "{o:?}");
        let (o, rec) = record(&["-o", out.to_str().unwrap(), "--", "true"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains("is a symbolic link: not writing through it"),
            "{name}: {err}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_clean(rec);
        std::fs::remove_file(link).unwrap();
    }
    // A regular file that belongs to the other user is not replaced either.
    let o = as_nobody(&["touch", out.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let (o, _) = record(&["-o", out.to_str().unwrap(), "--", "true"]);
    assert!(
        stderr(&o).contains("belongs to uid 65534: not replacing it"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(&out).unwrap();
    // Root's own file is replaced (renamed over), and no temporary file stays behind.
    std::fs::write(&out, "old").unwrap();
    let (o, rec) = record(&["-o", out.to_str().unwrap(), "--", "true"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_clean(rec);
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .starts_with("# tracer"));
    assert!(std::fs::read_to_string(&json).unwrap().starts_with('{'));
    let names: Vec<String> = std::fs::read_dir(&shared.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let _ = std::fs::remove_dir_all(&victims);
}

fn tempdir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("record-hardening")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn unwritable_output_is_found_before_the_command_runs() {
    if !usable("unwritable_output_is_found_before_the_command_runs") {
        return;
    }
    let dir = tempdir("unwritable");
    let mark = dir.join("ran");
    let script = format!("touch {}", mark.display());
    for args in [
        vec!["-o", "/nonexistent/dir/x.trace"],
        vec!["--json", "/nonexistent/dir/x.json"],
    ] {
        let mut all = args.clone();
        all.extend(["--", "sh", "-c", &script]);
        let (o, rec) = record(&all);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("cannot write /nonexistent/dir/x."), "{err}");
        assert!(!mark.exists(), "the command ran: {args:?}");
        assert_clean(rec);
    }
    // The naming trap: -o never takes a .json name.
    let (o, _) = record(&["-o", "t.json", "--", "true"]);
    assert!(
        stderr(&o).contains("use --json t.json for the Chrome JSON"),
        "{}",
        stderr(&o)
    );
    // `help` documents the scheme.
    let help = selftrace().arg("help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("-o /tmp/run.trace writes /tmp/run.trace and /tmp/run.json"),
        "{help}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn killed_recorder_takes_the_command_tree_with_it() {
    if !usable("killed_recorder_takes_the_command_tree_with_it") {
        return;
    }
    let dir = tempdir("killtree");
    let pids = dir.join("pids");
    let file = dir.join("out.trace");
    // The command, a child, and a grandchild in a session of its own.
    let script = format!(
        "sleep 1000 & echo $! >> {p}; setsid sh -c 'sleep 1000 & echo $! >> {p}; wait' & echo $$ >> {p}; wait",
        p = pids.display()
    );
    let mut rec = selftrace()
        .args(["record", "--quiet", "-o", file.to_str().unwrap(), "--"])
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = rec.id();
    let tree = read_pids(&pids, 3);
    rec.kill().unwrap();
    rec.wait().unwrap();
    assert!(all_gone(&tree, 10), "survivors of SIGKILL: {tree:?}");
    // What the recorder left in tracefs is proven dead: `clean` removes it.
    std::thread::sleep(Duration::from_millis(2500));
    let o = selftrace().arg("clean").output().unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_clean(pid);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn second_signal_ends_the_whole_tree() {
    if !usable("second_signal_ends_the_whole_tree") {
        return;
    }
    let dir = tempdir("second");
    let pids = dir.join("pids");
    let file = dir.join("out.trace");
    // The command and a child both ignore SIGTERM.
    let script = format!(
        "trap '' TERM; sleep 1000 & echo $! >> {p}; echo $$ >> {p}; wait; wait",
        p = pids.display()
    );
    let rec = selftrace()
        .args(["record", "-o", file.to_str().unwrap(), "--"])
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rec.id() as i32;
    let tree = read_pids(&pids, 2);
    for _ in 0..2 {
        // SAFETY: kill of our child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(300));
    }
    let o = rec.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(128 + libc::SIGKILL), "{}", stderr(&o));
    assert!(
        all_gone(&tree, 10),
        "survivors of the second signal: {tree:?}"
    );
    assert!(file.exists(), "{}", stderr(&o));
    assert_clean(pid as u32);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn clean_from_another_pid_namespace_leaves_a_live_recording_alone() {
    if !usable("clean_from_another_pid_namespace_leaves_a_live_recording_alone") {
        return;
    }
    let dir = tempdir("pidns");
    let file = dir.join("out.trace");
    let bin = record_target();
    let mut rec = selftrace()
        .args(["record", "-o", file.to_str().unwrap(), "--"])
        .arg(&bin)
        .arg("wait")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = rec.id();
    let mut stdout = BufReader::new(rec.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("ready ") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "recorder ended early"
        );
    }
    let command: i32 = line["ready ".len()..].trim().parse().unwrap();
    let mine = leftovers(
        &format!("selftrace_{pid}_"),
        &format!("selftrace-record-{pid}-"),
    );
    let inst = mine
        .iter()
        .find(|l| l.starts_with("instances/"))
        .expect("the live instance")
        .clone();
    // Old enough that only the recorder's lock protects it.
    std::thread::sleep(Duration::from_millis(2500));
    let o = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_selftrace"))
        .arg("clean")
        .output()
        .expect("unshare (util-linux)");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(!out.contains(&format!("selftrace_{pid}_")), "{out}");
    assert!(!out.contains(&format!("selftrace-record-{pid}-")), "{out}");
    assert_eq!(
        leftovers(
            &format!("selftrace_{pid}_"),
            &format!("selftrace-record-{pid}-")
        ),
        mine
    );
    let root = selftrace::tracefs::root().unwrap();
    let copy = std::fs::read_to_string(root.join(&inst).join("options/copy_trace_marker"))
        .unwrap_or_default();
    assert_eq!(copy.trim(), "1", "clean touched the live instance");
    // The recording goes on and ends normally.
    // SAFETY: kill of the recorded program (our grandchild).
    unsafe { libc::kill(command, libc::SIGTERM) };
    let o = rec.wait_with_output().unwrap();
    assert!(file.exists(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("command killed by signal 15"),
        "{}",
        stderr(&o)
    );
    assert_clean(pid);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kernel_errors_name_their_cause() {
    if !usable("kernel_errors_name_their_cause") {
        return;
    }
    // A copy of its own: the other tests record record_target's probes concurrently, and the
    // kernel allows one reference counter per address.
    let dir = tempdir("kernel-errors");
    let bin = dir.join("record_target_copy");
    std::fs::copy(record_target(), &bin).unwrap();
    let b = bin.to_str().unwrap();
    let canon = std::fs::canonicalize(&bin).unwrap();
    let in_canon = format!("attaching to {} for offset 0x0: ", canon.display());
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--buffer-kb", "0", "--", "true"],
            vec!["--buffer-kb 0: expected a number of KiB per CPU from 4 to 4194304"],
        ),
        (
            vec!["--buffer-kb", "999999999", "--", "true"],
            vec!["--buffer-kb 999999999: expected a number of KiB per CPU from 4 to 4194304"],
        ),
        (
            vec![
                "--uprobe",
                "record_target_compute x=%zz",
                "--",
                b,
                "run",
                "1",
            ],
            // The spec, the file written, the event, the errno and the kernel's reason.
            vec![
                "selftrace: error: --uprobe record_target_compute x=%zz: writing /",
                "/uprobe_events for event selftrace_",
                "/record_target_compute: Invalid argument (os error 22): kernel: Invalid \
                 register name at '%zz'",
            ],
        ),
        (
            vec!["--no-probes", "--all-probes", "--", "true"],
            vec!["--probe, --all-probes and --no-probes exclude each other"],
        ),
        (
            vec!["--uprobe", "0x0", "--", b, "run", "1"],
            vec![
                "--uprobe 0x0: ",
                &in_canon,
                "invalid input: offset is not in an executable segment of the file",
            ],
        ),
    ];
    for (args, wants) in cases {
        let (o, rec) = record(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        for want in wants {
            assert!(err.contains(want), "{args:?}: {want:?} not in {err}");
        }
        assert_clean(rec);
    }
    // Another recorder's uprobe on the same USDT site, with another reference counter.
    let note = selftrace::usdt::read_probes(&bin)
        .unwrap()
        .into_iter()
        .find(|n| n.name == "step")
        .unwrap();
    let group = format!("hardening_{}", std::process::id());
    let canon = std::fs::canonicalize(&bin).unwrap();
    let other = selftrace::tracefs::uprobe::UprobeEvent::create(
        &group,
        "other",
        &canon,
        note.file_offset.unwrap(),
        None,
        "",
    )
    .unwrap();
    let (o, rec) = record(&["--probe", "rt:step", "--", b, "run", "1"]);
    drop(other);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "is already probed by the uprobe event {group}/other"
        )),
        "{err}"
    );
    assert_clean(rec);
}

#[test]
fn second_recorder_on_a_live_usdt_site() {
    if !usable("second_recorder_on_a_live_usdt_site") {
        return;
    }
    // A copy of its own, as in kernel_errors_name_their_cause: the probe sites of this inode
    // are used by this test's recorders only.
    let dir = tempdir("second-recorder");
    let bin = dir.join("record_target_copy");
    std::fs::copy(record_target(), &bin).unwrap();
    let b = bin.to_str().unwrap();
    let off = selftrace::usdt::read_probes(&bin)
        .unwrap()
        .into_iter()
        .find(|n| n.name == "step")
        .unwrap()
        .file_offset
        .unwrap();
    let raw = format!("0x{off:x}");
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    // The `rt:step` hits in a recording: (pid, a0).
    let steps = |file: &str| -> Vec<(Option<u32>, Option<String>)> {
        let text = std::fs::read_to_string(file).unwrap();
        selftrace::tracefs::records(&text)
            .filter(|r| r.event == "rt_step")
            .map(|r| {
                let args = selftrace::tracefs::parse_hit_body(r.body).1;
                let a0 = args.into_iter().find(|(k, _)| k == "a0").map(|(_, v)| v);
                (r.tgid, a0)
            })
            .collect()
    };

    // 0. Alone, a recorder that records every probe (the default) and a raw uprobe on a probe's
    // address conflicts with itself: the error says so, and does not blame another recorder.
    let (o, rec) = record(&[
        "-o",
        &out("self.trace"),
        "--uprobe",
        &raw,
        "--",
        b,
        "run",
        "1",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{b}:{raw} is already probed by the uprobe event selftrace_{rec}_"
        )) && err.contains("that event is this session's own")
            && !err.contains("another recorder"),
        "{err}"
    );
    assert_clean(rec);

    // 1. The first recorder has the USDT probe (with its semaphore as reference counter).
    let a_file = out("a.trace");
    let a = LiveRecorder::start(Path::new(&a_file), &["--probe", "rt:step"], &bin);
    let a_events = leftovers(
        &format!("selftrace_{}_", a.pid),
        &format!("selftrace-record-{}-", a.pid),
    );
    assert!(
        a_events.iter().any(|e| e.ends_with("/rt_step")),
        "{a_events:?}"
    );

    // A second recorder of the same probe uses the same reference counter: the kernel shares
    // the site, and each recorder sees the hits of its own command only.
    let b1 = out("b1.trace");
    let (o, rec) = record(&["-o", &b1, "--probe", "rt:step", "--", b, "run", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_clean(rec);
    let hits = steps(&b1);
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert!(
        hits.iter().all(|(pid, _)| *pid != Some(a.command as u32)),
        "{hits:?}"
    );

    // A raw uprobe on the same address has no reference counter: the kernel refuses it, and
    // the error names the first recorder's event. The command does not run. (--no-probes:
    // this recorder's own rt:step would conflict too, as in 0.)
    let b2 = out("b2.trace");
    let (o, rec) = record(&[
        "-o",
        &b2,
        "--no-probes",
        "--uprobe",
        &raw,
        "--",
        b,
        "run",
        "1",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("--uprobe {raw}: ")), "{err}");
    assert!(
        err.contains(&format!(
            "{b}:{raw} is already probed by the uprobe event selftrace_{}_",
            a.pid
        )) && err.contains("/rt_step (")
            && err.contains("another recorder may be using it"),
        "{err}"
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("rt:step enabled"),
        "the command ran"
    );
    assert!(!Path::new(&b2).exists());
    assert_clean(rec);

    // The first recording is intact: still live with all its events, and it ends normally
    // with its hit and its markers.
    assert_eq!(
        leftovers(
            &format!("selftrace_{}_", a.pid),
            &format!("selftrace-record-{}-", a.pid)
        ),
        a_events
    );
    let (a_pid, a_command) = (a.pid, a.command as u32);
    let o = a.finish();
    let err = stderr(&o);
    assert!(err.contains("command killed by signal 15"), "{err}");
    assert_clean(a_pid);
    assert_eq!(
        steps(&a_file),
        [(Some(a_command), Some("0".to_string()))],
        "{err}"
    );
    let text = std::fs::read_to_string(&a_file).unwrap();
    let rounds = selftrace::tracefs::markers(&text)
        .iter()
        .filter(|m| m.pid == Some(a_command) && m.text.ends_with("|round"))
        .count();
    assert_eq!(rounds, 1, "{text}");

    // 2. The other way round: a live recorder with the raw uprobe, then one with the USDT
    // probe (reference counter) on the same address.
    let c_file = out("c.trace");
    let c = LiveRecorder::start(Path::new(&c_file), &["--no-probes", "--uprobe", &raw], &bin);
    let (o, rec) = record(&[
        "-o",
        &out("d.trace"),
        "--probe",
        "rt:step",
        "--",
        b,
        "run",
        "1",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("probe rt:step: "), "{err}");
    assert!(
        err.contains(&format!(
            "{b}:{raw} is already probed by the uprobe event selftrace_{}_",
            c.pid
        )) && err.contains(&format!("/off_{off:x} (")),
        "{err}"
    );
    assert_clean(rec);
    let (c_pid, c_command) = (c.pid, c.command as u32);
    let o = c.finish();
    assert!(
        stderr(&o).contains("command killed by signal 15"),
        "{}",
        stderr(&o)
    );
    assert_clean(c_pid);
    let text = std::fs::read_to_string(&c_file).unwrap();
    let raw_hits: Vec<_> = selftrace::tracefs::records(&text)
        .filter(|r| r.event == format!("off_{off:x}"))
        .map(|r| r.tgid)
        .collect();
    assert_eq!(raw_hits, [Some(c_command)], "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn record_counts_the_markers_the_kernel_dropped() {
    if !usable("record_counts_the_markers_the_kernel_dropped") {
        return;
    }
    let dir = tempdir("dropped");
    let file = dir.join("out.trace");
    let bin = record_target();
    // 100,000 instants (some 40 bytes of ring buffer each) as fast as one thread writes them,
    // into the smallest buffer (4 KiB per CPU): the recorder's trace_pipe reader cannot keep
    // up, and the kernel overwrites most of them.
    const WRITTEN: u64 = 100_000;
    let n = WRITTEN.to_string();
    let (o, rec) = record(&[
        "-o",
        file.to_str().unwrap(),
        "--buffer-kb",
        "4",
        "--",
        bin.to_str().unwrap(),
        "flood",
        &n,
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_clean(rec);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("flood {WRITTEN}")),
        "the command did not write its markers: {o:?}"
    );
    // `...; N events dropped by the kernel` in the summary, and the same N in the warning.
    let dropped: u64 = err
        .split(" events dropped by the kernel")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no dropped count in the summary: {err}"));
    assert!(
        err.contains(&format!(
            "warning: the kernel dropped {dropped} events (raise --buffer-kb)"
        )),
        "{err}"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let kept = selftrace::tracefs::markers(&text)
        .iter()
        .filter(|m| m.text.ends_with("|flood"))
        .count() as u64;
    eprintln!("{WRITTEN} markers written, {kept} kept, {dropped} dropped (--buffer-kb 4)");
    assert!(dropped > 0, "{err}");
    assert!(kept < WRITTEN, "{kept} of {WRITTEN} kept in 4 KiB per CPU");
    // In overwrite mode every event the kernel wrote into the instance is either read from
    // trace_pipe or counted (per-CPU `overrun`, and `[LOST N EVENTS]` in trace_pipe), so
    // kept + dropped >= written. Not `==`: the count covers everything in the instance's
    // buffer, which also holds the markers of every other process (copy_trace_marker) and
    // the sched events of the recorder; on an otherwise idle machine it was exactly equal in
    // every run (e.g. 3,046 kept + 96,954 dropped = 100,000).
    assert!(
        kept + dropped >= WRITTEN,
        "{kept} kept + {dropped} dropped < {WRITTEN} written"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unprivileged_user_from_a_private_checkout_gets_the_privilege_error() {
    if !usable("unprivileged_user_from_a_private_checkout_gets_the_privilege_error") {
        return;
    }
    // A copy of the binary where uid 65534 can run it; the command inside this checkout,
    // which may be a 0700 directory nobody can enter.
    let shared = SharedDir::new("nobody-bin");
    let copy = shared.0.join("selftrace");
    std::fs::copy(env!("CARGO_BIN_EXE_selftrace"), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = tempdir("private");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cmd = private.join("cmd");
    let out = shared.0.join("x.trace");
    let o = as_nobody(&[
        copy.to_str().unwrap(),
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        cmd.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("permission denied: recording needs root"),
        "{err}"
    );
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&private);
}

#[test]
fn str_probe_arguments_are_recorded_as_text() {
    if !usable("str_probe_arguments_are_recorded_as_text") {
        return;
    }
    let dir = tempdir("strargs");
    let file = dir.join("out.trace");
    let bin = record_target();
    let (o, rec) = record(&[
        "-o",
        file.to_str().unwrap(),
        "--probe",
        "rt:text",
        "--",
        bin.to_str().unwrap(),
        "run",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_clean(rec);
    // The summary says how many events the kernel dropped.
    assert!(
        stderr(&o).contains(" events dropped by the kernel"),
        "{}",
        stderr(&o)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let args: Vec<Vec<(String, String)>> = selftrace::tracefs::records(&text)
        .filter(|r| r.event.starts_with("rt_text"))
        .map(|r| selftrace::tracefs::parse_hit_body(r.body).1)
        .collect();
    assert_eq!(args.len(), 2, "{text}");
    let first = &args[0];
    assert_eq!(
        first[0],
        ("a0".into(), r#""héllo \"probe\"""#.into()),
        "{first:?}"
    );
    assert_eq!(first[1], ("a1".into(), "14".into()));
    let long = &args[1];
    assert_eq!(
        long[0].1,
        format!("\"{}…[+36 bytes]\"", "x".repeat(64)),
        "{long:?}"
    );
    // The Chrome JSON carries the text too.
    let json = json_of(&file);
    let texts: Vec<String> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"].as_str().is_some_and(|n| n.contains("rt:text")))
        .filter_map(|e| e["args"]["a0"].as_str().map(str::to_string))
        .collect();
    assert!(texts.contains(&"héllo \"probe\"".to_string()), "{texts:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `&str` probe argument that memory follows with a secret token (`rt:secret`: `hello`, the
/// first 5 bytes of `helloSECRET-TOKEN-...`, see examples/record_target.rs): the uprobe
/// fetches 64 bytes, and only the argument's 5 reach the files `record` writes, as text or as
/// the kernel prints a byte array.
#[test]
fn bytes_past_a_str_argument_reach_no_file() {
    if !usable("bytes_past_a_str_argument_reach_no_file") {
        return;
    }
    let dir = tempdir("secret");
    let file = dir.join("out.trace");
    let bin = record_target();
    let (o, rec) = record(&[
        "-o",
        file.to_str().unwrap(),
        "--probe",
        "rt:secret",
        "--",
        bin.to_str().unwrap(),
        "secret",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_clean(rec);
    assert!(String::from_utf8_lossy(&o.stdout).contains("secret probed"));
    // The secret as text, and as the decimal or hex bytes of a fetched `u8[]` array.
    let secret = b"SECRET-TOKEN";
    let join = |f: &dyn Fn(&u8) -> String| secret.iter().map(f).collect::<Vec<_>>().join(",");
    let forms = [
        String::from_utf8_lossy(secret).into_owned(),
        join(&|b| b.to_string()),
        join(&|b| format!("0x{b:x}")),
    ];
    // Every file `record` left in the directory: the trace, the JSON, nothing else.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["out.json", "out.trace"]);
    for name in &names {
        let content = String::from_utf8_lossy(&std::fs::read(dir.join(name)).unwrap()).into_owned();
        for form in &forms {
            assert!(
                !content.contains(form.as_str()),
                "{name} holds bytes past the argument ({form}):\n{content}"
            );
        }
    }
    // The argument itself is there: its 5 bytes in the trace, its text in both files.
    let text = std::fs::read_to_string(&file).unwrap();
    let hits: Vec<_> = selftrace::tracefs::records(&text)
        .filter(|r| r.event == "rt_secret")
        .collect();
    assert_eq!(hits.len(), 1, "{text}");
    assert!(
        hits[0].body.contains(" a0_bytes={104,101,108,108,111}"),
        "{}",
        hits[0].body
    );
    let args = selftrace::tracefs::parse_hit_body(hits[0].body).1;
    assert_eq!(args[0], ("a0".into(), "\"hello\"".into()), "{args:?}");
    assert_eq!(args[1], ("a1".into(), "5".into()), "{args:?}");
    let json = json_of(&file);
    let a0: Vec<&serde_json::Value> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "rt:secret")
        .map(|e| &e["args"]["a0"])
        .collect();
    assert_eq!(a0, [&serde_json::Value::from("hello")], "{json}");
    let _ = std::fs::remove_dir_all(&dir);
}
