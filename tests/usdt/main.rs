//! The USDT probes' integration tests that run under qemu-user too, one binary (as rustix's
//! tests/<subsystem>/main.rs): reading notes (files, notes), the probe macros (probes) and the
//! tracing tools on the examples (tools). usdt_uprobe.rs (uprobes on this process: the host
//! kernel never runs emulated code) is not run under qemu-user and stays a binary of its own, so
//! that cross_targets.rs can leave it out by name; the macros' compile-fail cases are
//! usdt-macros/tests/ui.rs (trybuild).

#[path = "../example_build/mod.rs"]
mod example_build;
#[path = "../support/target.rs"]
mod target;
#[path = "../usdt_support/mod.rs"]
mod usdt_support;

mod files;
mod notes;
mod probes;
mod tools;
