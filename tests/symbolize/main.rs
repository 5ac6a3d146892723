//! The symbolizer's integration tests, one binary (as rustix's tests/<subsystem>/main.rs):
//! none of them sets process-wide state that another one reads. Tests that run a copy of this
//! binary as a child select their child test by its full name (`files::child_report`).

#[path = "../support/addr2line.rs"]
mod addr2line;
#[path = "../support/counting.rs"]
mod counting;
#[path = "../support/sysroot.rs"]
mod sysroot;
#[path = "../support/target.rs"]
mod target;

mod files;
mod names;
mod signal;
mod stripped;

// signal.rs counts the allocations of its own thread only (see support/counting.rs).
#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;
