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
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "hang: {what} did not exit within {deadline:?} (killed it); stdout:\n{}\nstderr:\n{}",
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
