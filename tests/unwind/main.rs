//! The unwinder's integration tests that need no process of their own, one binary (as rustix's
//! tests/<subsystem>/main.rs): they set no process-wide switch, and only walk.rs installs a
//! signal handler (SIGUSR1). Binaries of their own: the differential tests (unwind_diff.rs,
//! unwind_gdb.rs: SIGPROF handlers, a process-wide walk-reuse switch), the stress test
//! (unwind_stress.rs: run in this binary, cfi.rs's `threads::dump_all` tests failed while
//! its threads ran), and the tests that flip process-wide state (unwind_reuse.rs,
//! unwind_no_vm_readv.rs).

#[path = "../support/altstack.rs"]
mod altstack;
#[path = "../support/counting.rs"]
mod counting;
#[path = "../example_build/mod.rs"]
mod example_build;
#[path = "../support/oracle.rs"]
mod oracle;
#[path = "../support/spinner.rs"]
mod spinner;
#[path = "../support/target.rs"]
mod target;

mod cfi;
mod kinds;
mod walk;

// walk.rs counts the allocations of its own threads only (support/counting.rs).
#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;
