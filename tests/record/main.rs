//! The tests of `selftrace record`, `clean` and `tracefs::Session`, one binary (as rustix's
//! tests/<subsystem>/main.rs). They share tracefs with each other as before (every test names
//! its own instance, uprobe group and temporary directory; `clean` removes only what a dead
//! recorder left), and no test sets process-wide state.

#[path = "../example_build/mod.rs"]
mod example_build;
#[path = "../record_support/mod.rs"]
mod record_support;
#[path = "../usdt_support/mod.rs"]
mod usdt_support;

mod cli;
mod hardening;
mod session;
mod signals;
