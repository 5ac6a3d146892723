//! The crash handler, one kind of crash per argument:
//!
//! ```sh
//! cargo run --example crash -- null        # SIGSEGV, null dereference
//! cargo run --example crash -- overflow    # stack overflow by recursion
//! cargo run --example crash -- list        # every kind
//! ```
//!
//! The report goes to stderr; the process then dies by the original signal.

#[path = "../tests/support/crash_scenarios.rs"]
mod scenarios;

#[global_allocator]
static GLOBAL: scenarios::LockingAllocator = scenarios::LockingAllocator;

fn main() {
    let kind = std::env::args().nth(1).unwrap_or_else(|| "null".into());
    if kind == "list" || !scenarios::ALL.contains(&kind.as_str()) {
        eprintln!(
            "usage: crash KIND, with KIND one of: {}",
            scenarios::ALL.join(", ")
        );
        std::process::exit(if kind == "list" { 0 } else { 2 });
    }
    if kind == "chained" {
        scenarios::install_user_handler();
    }
    if kind == "crash-in-handler" {
        scenarios::install_crashing_user_handler();
    }
    selftrace::crash::builder()
        .panic_hook(true)
        .install()
        .expect("install the crash handler");
    scenarios::run(&kind, &std::env::temp_dir());
}
