//! Waits for a test's child process with a deadline, reading its output meanwhile. The test
//! crate has `support/target.rs` as its module `target` too.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Waits for `child` (spawned with piped stdout and stderr), reading both pipes on threads so
/// that a full pipe cannot stall it. Returns its status and output; after `deadline` kills it
/// and fails the test with `what`, "hang:", its state then (see [`describe`]) and its output so
/// far.
pub fn wait_with_deadline(
    child: Child,
    deadline: Duration,
    what: &str,
) -> (ExitStatus, String, String) {
    match wait(child, deadline, None, what) {
        Ok(done) => done,
        Err(_) => unreachable!("no start-up deadline"),
    }
}

/// A child that ran to its end.
pub struct Finished {
    /// Its process id (of the run that finished, if it ran twice).
    pub pid: u32,
    /// How it ended.
    pub status: ExitStatus,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

/// This test binary running its test `child_entry` alone in a child process (`--exact
/// child_entry --nocapture --test-threads=1`), stdin empty, stdout and stderr piped, for
/// [`run_test_child`]; the caller adds the environment that tells the child what to do.
pub fn test_child() -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("this test binary"));
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A child's deadline: `native` seconds on x86-64, 600 s elsewhere (under qemu-user, where the
/// tests of other architectures run, a child runs tens of times slower).
pub fn deadline(native: u64) -> Duration {
    Duration::from_secs(if cfg!(target_arch = "x86_64") {
        native
    } else {
        600
    })
}

/// Runs `cmd` (made by [`test_child`]: libtest prints "running 1 test" before the test's code
/// runs) and waits for it as [`wait_with_deadline`] does.
///
/// Under qemu-user only, one case is run again: a child that has written nothing at all after
/// half the deadline (at most 120 s; such children start in 1-3 s) **and** whose command line
/// is not yet its own (the parent's, so it has not reached `execve`): stuck in qemu's emulation
/// of the parent's `posix_spawn` (qemu turns the vfork into a real fork of the emulator), before
/// any code of the new program, this crate's constructors included, ran in it. A child that
/// hung once in CI with empty output is why. Its state is written to this process's stderr (not
/// captured by libtest, so the log keeps it), it is killed and run once more with the whole
/// deadline again; a second hang fails the test. A child stuck after its `execve` (the
/// emulator's start-up, the loader, the crate's constructors, the runtime) is not run again: it
/// fails at the deadline with its state.
pub fn run_test_child(cmd: &mut Command, deadline: Duration, what: &str) -> Finished {
    let own_args = cmd
        .get_args()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let start_up = crate::target::under_qemu().then(|| {
        (
            (deadline / 2).min(Duration::from_secs(120)),
            own_args.as_str(),
        )
    });
    // The second run has no start-up check: it ends or fails.
    for start_up in [start_up, None] {
        let child = cmd.spawn().expect("run the child");
        let pid = child.id();
        match wait(child, deadline, start_up, what) {
            Ok((status, stdout, stderr)) => {
                return Finished {
                    pid,
                    status,
                    stdout,
                    stderr,
                }
            }
            Err(state) => {
                let _ = std::io::stderr().write_all(
                    format!(
                        "{what}: the child wrote nothing in {:?} under qemu-user and has not \
                         reached execve (still the parent's command line); killed it and \
                         running it again. Its state:\n{state}\n",
                        start_up.map(|s| s.0).unwrap_or_default()
                    )
                    .as_bytes(),
                );
            }
        }
    }
    unreachable!("a run without a start-up check ends or fails")
}

/// Waits for `child`; `Err` with its state (then it is killed) if `start_up` is given, the child
/// wrote nothing in its time and its command line does not contain its arguments.
fn wait(
    mut child: Child,
    deadline: Duration,
    mut start_up: Option<(Duration, &str)>,
    what: &str,
) -> Result<(ExitStatus, String, String), String> {
    let out = Reader::start(Box::new(child.stdout.take().expect("piped stdout")));
    let err = Reader::start(Box::new(child.stderr.take().expect("piped stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if let Some((after, own_args)) = start_up {
            if start.elapsed() > after {
                // Looked at once.
                start_up = None;
                let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id()))
                    .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                    .unwrap_or_default();
                if out.is_empty() && err.is_empty() && !cmdline.contains(own_args) {
                    let state = describe(child.id());
                    let _ = child.kill();
                    let _ = child.wait();
                    // The readers are left to end on their own.
                    return Err(state);
                }
            }
        }
        if start.elapsed() > deadline {
            let state = describe(child.id());
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "hang: {what} did not exit within {deadline:?} (killed it); its state then:\n{state}\n\
                 stdout:\n{}\nstderr:\n{}",
                out.finish_within(Duration::from_secs(10)),
                err.finish_within(Duration::from_secs(10))
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A process that inherited the pipes (the child's own child) may hold them after the child
    // ended: up to what is left of the deadline, and at least 10 s.
    let left = deadline
        .saturating_sub(start.elapsed())
        .max(Duration::from_secs(10));
    Ok((status, out.finish_within(left), err.finish_within(left)))
}

/// A thread reading one of a child's pipes to its end, so that a full pipe cannot stall the
/// child; what it read so far can be looked at any time.
struct Reader {
    thread: std::thread::JoinHandle<()>,
    read: Arc<Mutex<Vec<u8>>>,
}

impl Reader {
    fn start(mut pipe: Box<dyn Read + Send>) -> Reader {
        let read = Arc::new(Mutex::new(Vec::new()));
        let to = read.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => to.lock().unwrap().extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });
        Reader { thread, read }
    }

    fn is_empty(&self) -> bool {
        self.read.lock().unwrap().is_empty()
    }

    /// What was read so far.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.read.lock().unwrap()).into_owned()
    }

    /// Everything read once the pipe is at its end; after `limit`, what was read until then
    /// (the pipe stays open as long as a process that inherited it lives: a child's own child).
    fn finish_within(self, limit: Duration) -> String {
        let start = Instant::now();
        while !self.thread.is_finished() {
            if start.elapsed() > limit {
                return self.text()
                    + "\n(not read to its end: another process holds the pipe open)";
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.text()
    }
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
            let _ = writeln!(
                s,
                "gdb:\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Err(e) => {
            let _ = writeln!(s, "gdb: {e}");
        }
    }
    s
}
