//! Waits for a test's child process with a deadline, reading its output meanwhile.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Waits for `child` (spawned with piped stdout and stderr), reading both pipes on threads so
/// that a full pipe cannot stall it. Returns its status and output; after `deadline` kills it
/// and fails the test with `what`, "hung", and its output so far.
pub fn wait_with_deadline(
    mut child: Child,
    deadline: Duration,
    what: &str,
) -> (ExitStatus, String, String) {
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("piped stdout")));
    let err = reader(Box::new(child.stderr.take().expect("piped stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if start.elapsed() > deadline {
            let state = describe(child.id());
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "hang: {what} did not exit within {deadline:?} (killed it); its state then:\n{state}\n\
                 stdout:\n{}\nstderr:\n{}",
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// What a hung process was doing, for the failure message: its command line as the kernel sees
/// it (under qemu-user, whether it is still the parent's emulator or already the new program),
/// each thread's state, kernel wait channel and system call, and every thread's stack as gdb
/// sees it from outside (the emulator's own frames under qemu-user), where gdb is installed.
fn describe(pid: u32) -> String {
    use std::fmt::Write;
    let proc = format!("/proc/{pid}");
    let read = |p: String| {
        std::fs::read_to_string(&p)
            .map(|s| s.replace('\0', " ").trim().to_string())
            .unwrap_or_else(|e| format!("({p}: {e})"))
    };
    let mut s = String::new();
    let _ = writeln!(s, "pid {pid}: {}", read(format!("{proc}/cmdline")));
    let _ = writeln!(
        s,
        "exe: {}",
        std::fs::read_link(format!("{proc}/exe"))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| e.to_string())
    );
    let mut tasks: Vec<_> = std::fs::read_dir(format!("{proc}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    tasks.sort();
    for t in tasks {
        let task = format!("{proc}/task/{t}");
        let stat = read(format!("{task}/stat"));
        // The state is the field after the parenthesised name.
        let state = stat.rsplit(") ").next().and_then(|r| r.split(' ').next());
        let _ = writeln!(
            s,
            "task {t} {:?} state {} wchan {} syscall {}",
            read(format!("{task}/comm")),
            state.unwrap_or("?"),
            read(format!("{task}/wchan")),
            read(format!("{task}/syscall")),
        );
    }
    match std::process::Command::new("timeout")
        .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "thread apply all bt 40"])
        .output()
    {
        Ok(o) => {
            let _ = writeln!(s, "gdb:\n{}", String::from_utf8_lossy(&o.stdout));
        }
        Err(e) => {
            let _ = writeln!(s, "gdb: {e}");
        }
    }
    s
}
