//! selftrace: a Linux program traces itself, in-process.
//!
//! * **Stacks**: [`capture`] (glibc's `backtrace()`) and [`Capture`] (a mode, a register state,
//!   a signal handler's `ucontext_t`) walk the stack with DWARF CFI (every rule gdb and libunwind
//!   follow, compiled rules cached for all threads), falling back to frame pointers only where no
//!   CFI exists; the [`Walk`] a [`Capture`] returns says whether the walk was complete. They
//!   are async-signal-safe: no allocation, no lock, no panic, every memory read checked.
//!   [`symbolize()`] names addresses (in a handler too), [`Backtrace`] adds file:line, and
//!   [`crash::install`] prints kernel-style crash reports.
//! * **Probes**: USDT probe points for bpftrace, perf, gdb and the kernel's `uprobe_events`
//!   ([`usdt`]).
//! * **Markers**: Android's `Trace` API over ftrace's `trace_marker` ([`trace`]).
//! * **Other threads**: any thread's stack, all-thread dumps (on demand, on `SIGQUIT`, in crash
//!   reports) ([`threads`]), and a stall watchdog ([`watchdog`]) that also watches an async
//!   runtime's workers and tasks ([`tasks`]).
//! * **Profiles**: a sampling CPU and wall-clock profiler whose signal handler is the
//!   async-signal-safe unwinder, with pprof, folded-stack and flame-graph outputs ([`profile`]).
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
//! | [`Capture::walk`] | the same in a chosen [`UnwindMode`], with how the walk ended ([`Walk`]) |
//! | [`Capture::walk_ucontext`] | the interrupted stack of a signal handler's `ucontext_t` |
//! | [`Capture::walk_regs`] | a stack from an explicit register state |
//! | [`unwind::stats`] | the unwinder's counters |
//! | [`dump_stack`], [`crash::dump_stack_to`] | the current stack, symbolized, to stderr or an fd |
//! | [`symbolize()`] | object, bias, build-id, symbol name, offset and size of an address |
//! | [`symbolize::symbolize_exported`] | the same, naming only what glibc's `dladdr` names |
//! | [`symbolize::symbolize_frame`] | the name of a captured frame (return address or exact pc) |
//! | [`backtrace_symbols_fd`] | glibc's `backtrace_symbols_fd` lines, also naming local functions |
//! | [`symbolize::write_kernel_frame`] | one `0x... : name+0x1d/0x80 [obj]` line into a buffer |
//! | [`symbolize::demangle_into`] | a Rust name demangled into a buffer |
//! | [`Walk::frame_kind`], [`unwind::FrameKinds`] | exact pc or return address, as the walk recorded it |
//! | [`symbolize::is_signal_trampoline`], [`symbolize::frame_kind`] | the same for addresses without their walk (reads the code before them) |
//! | [`trace::begin_section()`], [`trace::end_section`], [`trace::section()`] (and its guard's drop) | a `B`/`E` marker |
//! | [`trace::begin_async_section()`], [`trace::end_async_section()`], `..._for_track` | `S`/`F`, `G`/`H` markers |
//! | [`trace::instant()`], [`trace::instant_for_track`], [`trace::set_counter`] | `I`, `N`, `C` markers |
//! | [`trace::is_enabled`], [`trace::stats`], [`trace::status`] | marker state, one atomic load each |
//! | [`probe!`], [`probe_lazy!`], [`probe_enabled!`] | a USDT probe site: a `nop`, plus a load for the last two |
//! | [`threads::capture`] | another thread's stack by tid (signal + lock-free handshake, with a timeout) |
//! | [`threads::dump_all`], [`threads::dump_all_with_timeout`] | every thread's name, tid, state, CPU time and stack to an fd |
//! | [`threads::list`], [`threads::info`], [`threads::current_tid`] | thread ids from `/proc/self/task`; one thread's name, state and CPU time |
//! | [`threads::install`] | installs the stack-request handler (`sigaction` only) |
//! | [`watchdog::pet`], [`watchdog::Watch::pet`] | a watched thread checks in: one relaxed load and store |
//! | [`watchdog::TaskWatch::pet`] | a watched task checks in, from any thread: one relaxed load and store |
//!
//! The name lookups among them ([`symbolize()`], [`backtrace_symbols_fd`],
//! [`symbolize::write_kernel_frame`], ...) check that a `dlopen`ed object is still the one the
//! index holds at the address (a library loaded since where an unloaded one was is never named
//! after it). Where it is not, they refresh the index only when they can prove that they run in
//! normal context (no signal frame on the thread's stack below them); in a signal handler they
//! mark the frame `?? (object changed since snapshot)` instead. [`set_auto_refresh`]`(false)`
//! turns that refresh off: then they never allocate, in any context.
//!
//! The signal handlers selftrace installs are held to the same rules: the stack-request
//! handler of [`threads`], the dump handler of [`threads::install_dump_signal`], the crash
//! handler of [`crash::install`], also with [`crash::Builder::all_threads`], and the sampling
//! handler of [`profile`].
//!
//! # Stack budget
//!
//! Every entry point above takes at most [`SIGNAL_STACK_BUDGET`] bytes of the caller's stack
//! below the kernel's signal frame (4 KiB in an optimized build, measured on x86-64 only; 12
//! KiB in a debug build, which aarch64 needs), so they run on the small alternate signal stacks
//! that crash handlers use. The signal frame is
//! the kernel's to size (`getauxval(AT_MINSIGSTKSZ)`): 3,376 bytes on an x86-64 machine with
//! AVX-512, where the alternate stack std gives its threads (`SIGSTKSZ`, 8 KiB) leaves 4.8 KiB;
//! more on aarch64 with SVE, whose `SIGSTKSZ` is 16 KiB. `sysconf(_SC_SIGSTKSZ)` is the size to
//! give an alternate stack of one's own.
//!
//! The large parts run elsewhere: [`dump_stack`] and [`threads::dump_all`] capture the stack
//! on the caller's stack, then symbolize and write on one of four private stacks of 512 KiB
//! that [`init`] maps; demangling a Rust name (rustc-demangle recurses: 146 KiB for a 1 KiB v0
//! name in a debug build) moves there when less than
//! [`symbolize::DEMANGLE_STACK`] is left; the unwinder evaluates CFI on stacks of its own; the
//! crash handler writes its report on its own 512 KiB stack. When every private stack is busy
//! (or before [`init`]) and the room left is known to be too small (the current alternate
//! stack's bounds from `sigaltstack`, a thread's from glibc), the output is shorter and says so:
//! `dump_stack` prints raw addresses (`Call Trace (raw addresses, not symbolized: N bytes of
//! stack left):`), `dump_all` lists no thread (`not listed: N bytes of stack left, ...`), a name
//! stays mangled. The handlers of the stack-request signal and of the dump signal run on the
//! receiving thread's own stack and work on threads spawned with 32 KiB stacks.
//!
//! Measured (tests/dump_stack.rs: each entry point in a real handler on a painted alternate
//! stack of the signal frame plus [`SIGNAL_STACK_BUDGET`]; bytes used, the signal frame
//! included, which the kernel does not always write whole: 3,376 bytes on x86-64 with AVX-512,
//! at most 5,120 under qemu-user for aarch64; the first three columns are x86-64's; the debug
//! column is the latest measurement, after the walk began to carry its frame kinds, the other
//! columns are from when the budget was set):
//!
//! | entry point | debug build | before this budget (debug) | optimized build | aarch64 debug build (qemu-user) |
//! |---|---|---|---|---|
//! | [`capture`] (64 frames) | 8,864 | 8,672 | 4,744 | 12,568 |
//! | [`Capture::walk_ucontext`] | 8,112 | 7,824 | 4,680 | 11,904 |
//! | [`symbolize()`] and a name | 7,352 | 7,272 | 5,080 | 8,904 |
//! | [`symbolize::write_kernel_frame`] | 8,280 | 7,368 | 5,448 | 9,056 |
//! | [`backtrace_symbols_fd`] | 8,680 | 8,352 | 4,986 | 10,520 |
//! | [`symbolize::demangle_into`] (1 KiB v0 name) | 6,996 | 149,560 | 5,416 | 8,920 |
//! | [`crash::dump_stack_to`] | 9,568 | 19,304 | 4,856 | 13,048 |
//! | [`threads::dump_all`] | 9,264 | 40,264 | 5,496 | 12,760 |
//! | [`threads::capture`] (the requester) | 6,472 | 5,448 | 3,968 | 7,408 |
//! | the crash handler, until it moves to its own stack | 4,472 | (code unchanged) | 3,368 | 6,312 |
//!
//! # Signals
//!
//! selftrace takes a signal only when a call that needs it is made; nothing is installed by
//! linking it or by [`init`]. One policy holds for every handler it installs:
//!
//! * **Chained**: the action that was there is kept. A signal that is not selftrace's (no stack
//!   request for the thread, not from the profiler's timers), and a crash signal after its
//!   report, goes on to it when it is a function, as signal-hook does; `SIG_DFL` and `SIG_IGN`
//!   are not emulated (a dump signal does not also dump core).
//! * **Given back**: each has a way out that restores the previous action, except that
//!   `SIG_DFL` comes back as `SIG_IGN` where a late signal of selftrace's (a deleted timer's, an
//!   abandoned request's) would otherwise kill the process.
//! * **One use per signal**: a signal serves one of the rows below at a time. Asking for a
//!   second use (a request or dump signal that is the crash handler's or the running
//!   profiler's, a profiler on the dump or request signal, a crash signal that requests
//!   stacks) is refused with [`Error::InvalidInput`] naming the conflict, and so is a
//!   synchronous fault signal (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`, `SIGTRAP`, `SIGSYS`)
//!   for anything but the crash handler: a request on it would be taken for a crash.
//!
//! | signal | taken by | when | removed by |
//! |---|---|---|---|
//! | `SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`, `SIGABRT`, `SIGTRAP` ([`crash::DEFAULT_SIGNALS`], or [`crash::Builder::signals`]) | [`crash::Builder::install`] | at the call | [`crash::uninstall`] (std's stack-overflow handler is given back too, but not chained to: selftrace reports overflows itself) |
//! | `SIGRTMIN + 4` ([`threads::default_signal`], or [`threads::Builder::signal`]) | [`threads::install`]; also, at their first call, [`threads::capture`], [`threads::dump_all`], [`crash::Builder::all_threads`], [`watchdog::watch`] | at the call | [`threads::uninstall`] (`SIG_DFL` becomes `SIG_IGN`; the next capture installs it again) |
//! | the dump signal you choose (`SIGQUIT` is usual) | [`threads::install_dump_signal`] | at the call | [`threads::uninstall_dump_signal`] |
//! | `SIGPROF` ([`profile::Builder::signal`]) | [`profile::Builder::start`] | at the call | stopping the profiler ([`profile::Profiler::stop`], or dropping it): `SIG_DFL` becomes `SIG_IGN` |
//!
//! Besides signals, three `.init_array` constructors run before `main` in normal context: the
//! unwinder records the objects loaded at start-up (and the page size, and whether glibc has
//! `_dl_find_object`), the trace markers read `SELFTRACE_TAGS` and register a
//! `pthread_atfork` child handler (see [`trace`]), and selftrace registers its own
//! `pthread_atfork` handlers. None installs a signal handler or starts a thread.
//!
//! # Fork
//! A child forked while other threads were inside selftrace is never stuck on what they held:
//! the output lock, the caches' locks, stack requests in flight, a minidump being written and
//! a running profiler are free in the child (taken over from a holder that is not a thread of
//! the process, or reset by the child handler). The prepare handler holds the symbolization
//! caches across the fork (200 ms at most, else the child starts them over), so that a child
//! forked during a lookup keeps them. In the child, `dump_all`, `Backtrace`, crash reports and
//! a profiler of its own work as in any process; a crash report names functions without
//! file:line (the parent's symbolizer process is not used) unless the child installs the crash
//! handler again; a watchdog starts a monitor of its own at the child's next `watch`.
//!
//! Everything that allocates happens in [`init`], in [`refresh`], or lazily in normal context:
//! a capture that meets an object loaded after the last snapshot refreshes it only when it can
//! prove it is not running in a signal handler (see [`unwind`] and [`set_auto_refresh`]).
#![warn(missing_docs)]
// docs.rs (nightly, `--cfg docsrs`): each item says which cargo feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// `unsafe` only in the modules that say `#![allow(unsafe_code)]` (system calls, signal handlers,
// checked memory reads, the unwinder's entry and the lock-free tables), each block with its
// `// SAFETY:` line.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

// Lets `#[usdt::probe]` (which names `::selftrace`) work inside this crate's own tests.
extern crate self as selftrace;

mod context;
pub mod crash;
mod error;
mod fmt;
mod fork;
#[cfg(test)]
mod layering;
// Entry points of the fuzz harness (tests/fuzz.rs) into internal parsers: not a stable API.
#[doc(hidden)]
pub mod fuzz;
pub mod minidump;
pub mod modules;
mod procfs;
#[cfg(feature = "profile")]
#[cfg_attr(docsrs, doc(cfg(feature = "profile")))]
pub mod profile;
mod published;
mod report;
mod setup;
pub mod symbolize;
mod sys;
#[cfg(feature = "threads")]
#[cfg_attr(docsrs, doc(cfg(feature = "threads")))]
pub mod tasks;
#[cfg(feature = "threads")]
#[cfg_attr(docsrs, doc(cfg(feature = "threads")))]
pub mod threads;
#[cfg(feature = "trace")]
#[cfg_attr(docsrs, doc(cfg(feature = "trace")))]
pub mod trace;
#[cfg(feature = "tracefs")]
#[cfg_attr(docsrs, doc(cfg(feature = "tracefs")))]
pub mod tracefs;
// The markers find tracefs with the same discovery, without the rest of the module.
#[cfg(all(feature = "trace", not(feature = "tracefs")))]
mod tracefs;
pub mod unwind;
#[cfg(feature = "usdt")]
#[cfg_attr(docsrs, doc(cfg(feature = "usdt")))]
pub mod usdt;
#[cfg(feature = "threads")]
#[cfg_attr(docsrs, doc(cfg(feature = "threads")))]
pub mod watchdog;

pub use crash::dump_stack;
pub use error::Error;
pub use setup::{init, prepare, refresh};
pub use symbolize::{backtrace_symbols, backtrace_symbols_fd, symbolize, Backtrace, Symbol};
pub use sys::stack::SIGNAL_STACK_BUDGET;
pub use unwind::{
    capture, set_auto_refresh, Capture, Regs, StopReason, Truncation, UnwindMode, UnwindStats,
    Walk, WalkEnd,
};

/// The README's examples, compiled (and run where they are not `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
