//! The program `selftrace record` records in the tests (tests/record/cli.rs, tests/record.rs)
//! and in the README: USDT probes with known values, trace-marker sections, async sections,
//! counters and instants, a function to put a uprobe on, a thread and a child process.
//!
//! ```sh
//! cargo build --example record_target
//! sudo selftrace record -o /tmp/rt.trace --uprobe compute --uprobe compute%return \
//!     -- target/debug/examples/record_target run 5
//! ```
//!
//! Usage: `record_target run N` (N rounds, then a thread and a child process), `record_target
//! child` (what the child does), `record_target crash` (one round, then SIGSEGV), `record_target
//! wait` (one round, prints `ready PID`, then sleeps until killed), `record_target flood N`
//! (N instants `flood` as fast as it can, to overflow a small ring buffer; prints `flood N`),
//! `record_target secret` (probe `rt:secret` with a 5-byte `&str` that memory follows with
//! [`SECRET_BUF`]'s secret token: only the 5 bytes may reach a recording).

use selftrace::trace;
use std::time::Duration;

/// The function the tests put an entry and a return uprobe on: returns `x * 3 + 1`.
#[inline(never)]
#[no_mangle]
pub extern "C" fn record_target_compute(x: u64) -> u64 {
    std::hint::black_box(x) * 3 + 1
}

/// `rt:secret` gets the first 5 bytes (`hello`) of this text: what follows them in memory is
/// a secret that no recording may hold (the kernel fetches 64 bytes of a `&str` argument).
pub static SECRET_BUF: &str =
    "helloSECRET-TOKEN-do-not-record-0123456789abcdefghijklmnopqrstuvwxyz";

/// One round: section `round` containing section `work`; probe `rt:step(i, i - 2)`; counter
/// `queue = i`; async section `load` with cookie `i`; instant `tick`; `compute(i)`.
fn round(i: u64) {
    let _round = trace::section("round");
    let delta = i as i32 - 2;
    selftrace::probe!(rt, step, i, delta);
    trace::set_counter("queue", i as i64);
    trace::begin_async_section("load", i as i64);
    {
        let _work = trace::section("work");
        let r = record_target_compute(i);
        selftrace::probe!(rt, result, r);
        std::thread::sleep(Duration::from_millis(2));
    }
    trace::instant("tick");
    trace::end_async_section("load", i as i64);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("run");
    match mode {
        "run" => {
            let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
            // Raised by the kernel when a tracer attached to rt:step before this process
            // started (the recorder enables its events first).
            println!("rt:step enabled={}", selftrace::probe_enabled!(rt, step));
            // Evaluated only while rt:lazy is traced.
            selftrace::probe_lazy!(rt, lazy, {
                println!("rt:lazy evaluated");
                n
            });
            for i in 0..n {
                round(i);
            }
            // &str arguments: `record` shows the text (the first 64 bytes, then a marker).
            selftrace::probe!(rt, text, "héllo \"probe\"");
            selftrace::probe!(rt, text, "x".repeat(100).as_str());
            std::thread::spawn(|| {
                let _s = trace::section("thread work");
                selftrace::probe!(rt, thread, 77u32);
            })
            .join()
            .unwrap();
            let exe = std::env::current_exe().unwrap();
            let status = std::process::Command::new(exe)
                .arg("child")
                .status()
                .unwrap();
            assert!(status.success());
            println!("record_target: {n} rounds, status {}", trace::status());
        }
        "child" => {
            let _s = trace::section("child work");
            selftrace::probe!(rt, child, 99u32);
        }
        "crash" => {
            round(0);
            // std's SIGSEGV handler ignores a raised (not faulting) SIGSEGV: restore the
            // default action first, so that the signal kills the process as a crash would.
            // SAFETY: setting the default action and raising a signal have no memory-safety
            // preconditions.
            unsafe {
                libc::signal(libc::SIGSEGV, libc::SIG_DFL);
                libc::raise(libc::SIGSEGV);
            }
            std::process::abort();
        }
        "secret" => {
            let buf = std::hint::black_box(SECRET_BUF);
            selftrace::probe!(rt, secret, &buf[..5]);
            println!("secret probed");
        }
        "flood" => {
            let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
            for _ in 0..n {
                trace::instant("flood");
            }
            println!("flood {n}");
        }
        "wait" => {
            round(0);
            println!("ready {}", std::process::id());
            loop {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        other => {
            eprintln!("record_target: unknown mode {other}");
            std::process::exit(2);
        }
    }
}
