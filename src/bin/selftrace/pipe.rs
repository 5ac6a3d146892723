//! Streaming the instance's `trace_pipe` while the command runs, so that a long recording does
//! not overwrite its beginning in the ring buffer.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A thread that consumes `trace_pipe` (non-blocking reads, short sleeps when empty) until
/// told to stop and the pipe is empty. Dropping it stops and joins the thread, which closes
/// the pipe: an open file of an instance keeps the instance from being removed.
pub struct PipeReader {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<u8>>>,
}

impl PipeReader {
    /// Opens `trace_pipe` at `path` and starts reading it.
    pub fn start(path: &Path) -> std::io::Result<PipeReader> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("trace_pipe".into())
            .spawn(move || drain(&mut file, &flag))?;
        Ok(PipeReader {
            stop,
            thread: Some(thread),
        })
    }

    /// Reads what is left, stops, and returns everything read.
    pub fn finish(mut self) -> Vec<u8> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

fn drain(file: &mut File, stop: &AtomicBool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // Read the flag before reading: once it is set, one empty read means everything the
        // (finished) command recorded has been read.
        let stopping = stop.load(Ordering::SeqCst);
        match file.read(&mut buf) {
            Ok(n) if n > 0 => out.extend_from_slice(&buf[..n]),
            Ok(_) => {
                if stopping {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if stopping {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => break,
        }
    }
    out
}

impl Drop for PipeReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The streamed text as a `trace` file: `header` (the comment lines of the instance's `trace`,
/// without its entry counts), then the event lines in timestamp order (stable: lines with equal
/// timestamps keep their order). `[LOST N EVENTS]` lines are left out and counted.
pub fn assemble(header: &str, streamed: &str) -> (String, u64) {
    let mut out = String::new();
    for line in header.lines().filter(|l| l.starts_with('#')) {
        if !line.contains("entries-in-buffer") {
            out.push_str(line);
            out.push('\n');
        }
    }
    let mut lost = 0;
    let mut lines: Vec<(u64, &str)> = Vec::new();
    for line in streamed.lines() {
        if let Some(i) = line.find("[LOST ") {
            lost += line[i + 6..]
                .split(' ')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            continue;
        }
        if let Some(r) = selftrace::tracefs::parse_record(line) {
            lines.push((r.timestamp_ns, line));
        }
    }
    lines.sort_by_key(|(t, _)| *t);
    for (_, l) in lines {
        out.push_str(l);
        out.push('\n');
    }
    (out, lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assemble_sorts_and_counts_lost() {
        let header = "# tracer: nop\n#\n# entries-in-buffer/entries-written: 0/5   #P:2\n#  TASK\n";
        let streamed = [
            " a-1 (1) [001] ..... 2.000002: x: b",
            " a-1 (1) [000] ..... 2.000001: x: a",
            "CPU:1 [LOST 7 EVENTS]",
            " a-1 (1) [001] ..... 2.000002: x: c",
        ]
        .join("\n");
        let streamed = streamed.as_str();
        let (text, lost) = assemble(header, streamed);
        assert_eq!(lost, 7);
        let want = [
            "# tracer: nop",
            "#",
            "#  TASK",
            " a-1 (1) [000] ..... 2.000001: x: a",
            " a-1 (1) [001] ..... 2.000002: x: b",
            " a-1 (1) [001] ..... 2.000002: x: c",
        ];
        assert_eq!(text.lines().collect::<Vec<_>>(), want);
    }
}
