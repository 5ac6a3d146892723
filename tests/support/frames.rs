//! The function names of a report's frame lines (` #3 0x… : name+0x1d/0x40 [obj+0x…] at …`),
//! in order: what tests compare of thread dumps and watchdog reports.

/// The function names of `block`'s frame lines, in order (an `[inlined]` line gives "").
pub fn frame_names(block: &str) -> Vec<&str> {
    block
        .lines()
        .filter(|l| l.starts_with(" #"))
        .map(|l| {
            let name = l.split(" : ").nth(1).unwrap_or("");
            name.split('+').next().unwrap_or("")
        })
        .collect()
}
