//! Procedural macros for selftrace's USDT probes.
//!
//! Use them through `selftrace`, which re-exports them; this crate is an implementation detail.
