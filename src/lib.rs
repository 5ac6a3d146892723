//! selftrace: a Linux program traces itself, in-process.
//!
//! * **Stacks**: [`capture`] and [`capture_from_ucontext`] walk the stack with DWARF CFI
//!   (framehop over the in-memory `.eh_frame`) and a per-frame frame-pointer fallback. They are
//!   async-signal-safe: no allocation, no lock, no panic, every memory read checked.
//! * **Names**: [`symbolize()`] (async-signal-safe name lookup), glibc-compatible
//!   [`backtrace_symbols`] / [`backtrace_symbols_fd`], the kernel's `dump_stack()` line format
//!   and [`Backtrace`] with file:line:column and inlined frames ([`symbolize`](mod@symbolize) module).
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
//! | [`symbolize()`] | object, bias, build-id, symbol name, offset and size of an address |
//! | [`symbolize::symbolize_exported`] | the same, naming only what glibc's `dladdr` names |
//! | [`backtrace_symbols_fd`] | glibc's `backtrace_symbols_fd` lines, also naming local functions |
//! | [`symbolize::write_kernel_frame`] | one `0x... : name+0x1d/0x80 [obj]` line into a buffer |
//! | [`symbolize::demangle_into`] | a Rust name demangled into a buffer |
//! | [`symbolize::is_signal_trampoline`], [`symbolize::frame_kind`] | exact pc or return address |
//!
//! Everything that allocates happens in [`init`], in [`refresh`], or lazily in normal context
//! (a capture outside a signal handler that meets an unknown object refreshes the snapshot only
//! when it is not running inside a signal handler of this crate's knowledge; see [`refresh`]).
#![warn(missing_docs)]

mod error;
pub mod modules;
mod published;
pub mod symbolize;
mod sys;
pub mod trace;
pub mod tracefs;
pub mod unwind;
pub mod usdt;

pub use error::Error;
pub use symbolize::{backtrace_symbols, backtrace_symbols_fd, symbolize, Backtrace, Symbol};
pub use unwind::{
    capture, capture_fp, capture_from_regs, capture_from_ucontext, capture_with, init, refresh,
    set_auto_refresh, Regs, UnwindMode,
};
