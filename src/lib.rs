//! selftrace: a Linux program traces itself, in-process.
//!
//! * **Stacks**: [`capture`] and [`capture_from_ucontext`] walk the stack with DWARF CFI
//!   (framehop over the in-memory `.eh_frame`) and a per-frame frame-pointer fallback. They are
//!   async-signal-safe: no allocation, no lock, no panic, every memory read checked.
//! * **Probes**: USDT probe points for bpftrace, perf, gdb and the kernel's `uprobe_events`
//!   ([`usdt`]).
//! * **Markers**: Android's `Trace` API over ftrace's `trace_marker` ([`trace`]).
//!
//! ```
//! selftrace::init().expect("init");
//! let mut frames = [0usize; 64];
//! let n = selftrace::capture(&mut frames);
//! assert!(n > 0);
//! ```
//!
//! # Async-signal-safe entry points
//!
//! These may be called from a signal handler (including a SIGSEGV handler). They never allocate,
//! never take a lock, never panic, and only make async-signal-safe system calls.
//!
//! | function | what it does |
//! |---|---|
//! | [`capture`] | return addresses of the current stack, through signal frames |
//! | [`capture_fp`] | the same, frame pointers only |
//! | [`capture_from_ucontext`] | the interrupted stack of a signal handler's `ucontext_t` |
//! | [`capture_from_regs`] | a stack from an explicit register state |
//!
//! Everything that allocates happens in [`init`], in [`refresh`], or lazily in normal context
//! (a capture outside a signal handler that meets an unknown object refreshes the snapshot only
//! when it is not running inside a signal handler of this crate's knowledge; see [`refresh`]).
#![warn(missing_docs)]

// Lets `#[usdt::probe]` (which names `::selftrace`) work inside this crate's own tests.
extern crate self as selftrace;

mod error;
pub mod modules;
mod sys;
pub mod unwind;
pub mod trace;
pub mod tracefs;
pub mod usdt;

pub use error::Error;
#[cfg(any())]
pub use unwind::{
    capture, capture_fp, capture_from_regs, capture_from_ucontext, capture_with, init, refresh,
    Regs, UnwindMode,
};
