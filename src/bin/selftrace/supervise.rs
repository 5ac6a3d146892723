//! The recorder's helper process: `selftrace __supervise DEATH_FD PID_FD -- CMD ARGS...`.
//!
//! `record` runs the command through this helper so that the command's whole process tree ends
//! with the recorder, also when the recorder is killed with SIGKILL:
//!
//! * the helper is a child subreaper (`PR_SET_CHILD_SUBREAPER`): every process the command
//!   starts, even one that double-forks or calls `setsid`, becomes the helper's child when its
//!   parent dies, so the helper can always find what is left (`/proc/self/task/*/children`);
//! * the recorder holds the write end of a pipe whose read end the helper polls: when the
//!   recorder dies (for any reason, SIGKILL included) the helper sees end-of-file and kills the
//!   whole tree with SIGKILL;
//! * stop signals the recorder forwards (SIGINT, SIGTERM, SIGHUP, SIGQUIT) go to the command
//!   once; a second one kills the whole tree; when the command ends, what it left running is
//!   killed too;
//! * the helper ends as the command did (same exit code, or the same signal);
//! * should the helper itself be killed, the command gets SIGKILL (`PR_SET_PDEATHSIG`).
//!
//! It writes the command's pid (or `-errno` if it could not be started) as 4 bytes on PID_FD.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

/// The hidden subcommand name.
pub const SUBCOMMAND: &str = "__supervise";

/// The command's pid.
static CMD: AtomicI32 = AtomicI32::new(0);
/// Stop signals received.
static SIGNALS: AtomicU32 = AtomicU32::new(0);
/// Kill the whole tree now.
static KILL: AtomicBool = AtomicBool::new(false);
/// The first stop signal (0: none).
static FIRST: AtomicI32 = AtomicI32::new(0);
/// Whether the first stop signal was sent on to the command (or reached it from the terminal).
static FORWARDED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only atomics and kill(2): async-signal-safe.
    let n = SIGNALS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t (or null, checked).
    let from_terminal = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    if n >= 1 {
        KILL.store(true, Ordering::SeqCst);
        return;
    }
    FIRST.store(sig, Ordering::SeqCst);
    let cmd = CMD.load(Ordering::SeqCst);
    // A signal from the terminal reached the command too (same foreground process group).
    if from_terminal && cmd > 0 {
        FORWARDED.store(true, Ordering::SeqCst);
        return;
    }
    if cmd > 0 && !FORWARDED.swap(true, Ordering::SeqCst) {
        // SAFETY: kill has no memory-safety preconditions; `cmd` is our unwaited child.
        unsafe {
            libc::kill(cmd, sig);
        }
    }
}

fn fd_arg(a: Option<OsString>) -> Result<i32, String> {
    a.and_then(|s| s.to_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| "selftrace __supervise is the recorder's helper, not for use".to_string())
}

fn set_cloexec(fd: i32) {
    // SAFETY: fcntl on an fd number; a bad fd gives EBADF, nothing else.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
}

fn write_i32(fd: i32, v: i32) {
    let b = v.to_le_bytes();
    // SAFETY: write(2) of a 4-byte stack buffer.
    unsafe {
        libc::write(fd, b.as_ptr().cast(), b.len());
        libc::close(fd);
    }
}

/// This process's children (including the orphans it adopted as subreaper).
fn children() -> Vec<i32> {
    let me = std::process::id();
    let mut out = Vec::new();
    let path = format!("/proc/self/task/{me}/children");
    if let Ok(s) = std::fs::read_to_string(path) {
        out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        return out;
    }
    // Without CONFIG_PROC_CHILDREN: every process whose parent is us.
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: the comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(me) {
            out.push(pid);
        }
    }
    out
}

/// Reaps every child that has ended; returns the command's wait status when it is among them.
fn reap(cmd: i32) -> Option<i32> {
    let mut cmd_status = None;
    loop {
        let mut st = 0;
        // SAFETY: waitpid with a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if pid <= 0 {
            return cmd_status;
        }
        if pid == cmd {
            cmd_status = Some(st);
        }
    }
}

/// Kills every descendant with SIGKILL until none is left; returns the command's wait status
/// if it was reaped meanwhile, and how many processes were killed.
fn kill_tree(cmd: i32, mut cmd_status: Option<i32>) -> (Option<i32>, usize) {
    let mut killed = std::collections::HashSet::new();
    for _ in 0..10_000 {
        let kids = children();
        if kids.is_empty() {
            break;
        }
        for pid in kids {
            // SAFETY: kill has no memory-safety preconditions; `pid` is our child (a zombie at
            // worst, whose pid stays reserved until we reap it).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            killed.insert(pid);
        }
        std::thread::sleep(Duration::from_millis(2));
        if let Some(st) = reap(cmd) {
            cmd_status = Some(st);
        }
    }
    (cmd_status, killed.len())
}

/// Ends this process as the command ended.
fn mirror(status: i32) -> Result<i32, String> {
    if libc::WIFEXITED(status) {
        return Ok(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // SAFETY: plain libc calls: default action for `sig`, no core dump of this helper (the
        // command's own core dump was already written), then raise.
        unsafe {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
        return Ok(128 + sig);
    }
    Ok(1)
}

/// The helper's main: see the module docs.
pub fn main(args: Vec<OsString>) -> Result<i32, String> {
    let mut it = args.into_iter();
    let death = fd_arg(it.next())?;
    let report = fd_arg(it.next())?;
    if it.next().as_deref() != Some(std::ffi::OsStr::new("--")) {
        return Err("selftrace __supervise: expected --".into());
    }
    let cmd: Vec<OsString> = it.collect();
    let Some(program) = cmd.first() else {
        return Err("selftrace __supervise: no command".into());
    };
    set_cloexec(death);
    set_cloexec(report);
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler only
        // touches atomics and calls kill(2). exec resets it to the default in the command.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    let mut command = std::process::Command::new(program);
    command.args(&cmd[1..]);
    // Should this helper itself be killed, the command goes too.
    // SAFETY: between fork and exec only prctl(2), async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt as _;
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            Ok(())
        });
    }
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            write_i32(report, -e.raw_os_error().unwrap_or(libc::ENOENT));
            return Ok(127);
        }
    };
    let pid = child.id() as i32;
    CMD.store(pid, Ordering::SeqCst);
    write_i32(report, pid);
    // A signal that came before the pid was known: sent on as is, once.
    let first = FIRST.load(Ordering::SeqCst);
    if first != 0 && !FORWARDED.swap(true, Ordering::SeqCst) {
        // SAFETY: kill has no memory-safety preconditions; `pid` is our unwaited child.
        unsafe {
            libc::kill(pid, first);
        }
    }
    let mut status = None;
    loop {
        if KILL.load(Ordering::SeqCst) {
            let (st, _) = kill_tree(pid, status);
            status = st;
        }
        if let Some(st) = reap(pid) {
            status = Some(st);
        }
        if status.is_some() {
            break;
        }
        let mut pfd = libc::pollfd {
            fd: death,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 50) };
        if r > 0 && pfd.revents != 0 {
            // The recorder is gone (its end of the pipe closed): the tree goes with it.
            kill_tree(pid, status);
            return Ok(128 + libc::SIGKILL);
        }
    }
    // The command ended; what it left running ends with the recording.
    let (_, left) = kill_tree(pid, status);
    if left > 0 {
        eprintln!("selftrace: killed {left} processes the command left running");
    }
    mirror(status.unwrap_or(0))
}
