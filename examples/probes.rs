//! Demo: fires USDT probes in a loop so that a tracer can watch them.
//!
//! ```sh
//! cargo build --release --example probes
//! sudo bpftrace -e 'usdt:./target/release/examples/probes:demo:tick { printf("tick %d %s\n", arg0, str(arg1, arg2)); }' \
//!     -c './target/release/examples/probes 5'
//! ```
//!
//! Usage: `probes [SECONDS]` (default 10): one `demo:tick` per 100 ms, and a `#[probe]` function.

use std::time::{Duration, Instant};

/// Fires `demo:handle` with its arguments and `demo:handle__return` with the result.
#[selftrace::usdt::probe(provider = "demo")]
fn handle(id: u64, path: &str) -> u32 {
    path.len() as u32 + id as u32 % 7
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    println!("pid {}; probes compiled in:", std::process::id());
    for p in selftrace::usdt::probes() {
        let args: Vec<String> = p
            .arguments()
            .iter()
            .map(|a| format!("{}{}", if a.signed { "i" } else { "u" }, a.size * 8))
            .collect();
        println!(
            "  {}:{} ({}) enabled={}",
            p.provider(),
            p.name(),
            args.join(", "),
            p.was_enabled()
        );
    }
    let start = Instant::now();
    let mut i: u64 = 0;
    while start.elapsed() < Duration::from_secs(seconds) {
        let label = if i.is_multiple_of(2) { "even" } else { "odd" };
        selftrace::probe!(demo, tick, i, label);
        // The formatting runs only while a tracer is attached to demo:detail.
        selftrace::probe_lazy!(demo, detail, format!("tick {i} at {:?}", start.elapsed()));
        let r = handle(i, "/index.html");
        if selftrace::probe_enabled!(demo, tick) && i.is_multiple_of(10) {
            println!("traced: tick {i} handle={r}");
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("fired {i} ticks");
}
