//! Addresses to names.
//!
//! * [`symbolize`]: object, load bias, build-id, symbol name, offset and size of an address.
//!   Async-signal-safe: a binary search over a symbol index built before any signal.
//! * [`backtrace_symbols`] / [`backtrace_symbols_fd`]: glibc's line formats, byte for byte,
//!   naming also functions that are not exported; the `_fd` variant is async-signal-safe.
//! * [`write_kernel_frame`]: the kernel's `dump_stack()` format,
//!   `0x55d0c0a3d1f0 : my_crate::parse+0x1d/0x80 [myprog]`, async-signal-safe.
//! * [`Backtrace`]: an owned, fully symbolized stack with file:line:column and inlined frames
//!   (normal context only).
//!
//! # The index and its lifetime
//! The index is built in normal context by `init()`/`refresh()` (through `rebuild`), or lazily
//! by the normal-context functions of this module ([`backtrace_symbols`], [`Backtrace`]), or
//! explicitly by [`prepare`]. Before that, [`symbolize`] returns `None`.
//!
//! Each object's symbol table (sorted 12-byte entries over the object's names, front-coded
//! out of the ELF file, read with `pread`, never mapped) is built once per distinct object and
//! **never freed**. Objects that map 64 MiB or more are built by a background thread
//! ([`set_background_index`]); until then their addresses have no name
//! ([`SymbolSource::Pending`]), and [`prepare`] waits for them. Only the small list that maps address ranges to tables is republished on refresh.
//! That is why a [`Symbol`] can hold `'static` references and be returned by value from a
//! signal handler: a concurrent refresh cannot free what it points to. The cost is that the
//! tables of `dlclose`d libraries stay (a `dlopen` of the same library again reuses its table).
//!
//! No lookup reads a file mapping: a library or debug file truncated or rewritten on disk after
//! the index was built cannot make it fault (tested: `tests/symbolize/files.rs`).
//!
//! # Libraries unloaded and loaded again
//! After `dlclose` the kernel often maps the next `dlopen`ed library exactly where the last one
//! was. Each indexed object keeps its identity (path, the file's device and inode, build-id,
//! load bias, unwind table address), and every lookup in an object that can be unloaded checks
//! it against what is loaded there now, without locks (`_dl_find_object`, then the build-id's
//! bytes in memory, or the loader's `link_map` path): a frame is never named after an object
//! that is gone. The normal-context functions ([`backtrace_symbols`], [`Backtrace`]) refresh
//! first whenever the loader's load/unload counters moved (about 20 ns to ask); the
//! async-signal-safe ones refresh only in proven normal context, and otherwise mark the frame
//! ([`SymbolSource::Changed`]: `?? (object changed since snapshot)`). Tested:
//! `tests/dlopen.rs`.
//!
//! # In a signal handler (crash reports)
//! Everything below is async-signal-safe (no allocation, no lock, no panic) once the index
//! exists (`init()`, [`prepare`], or any normal-context call of this module):
//!
//! * [`symbolize`] / [`symbolize_exported`]: a [`Symbol`] (object path, bias, build-id, raw
//!   name, start, offset, size) by value; the name is decoded on demand ([`SymbolName`]);
//! * [`Walk::frame_kind`](crate::Walk::frame_kind) / [`FrameKind::lookup_address`]: which
//!   captured addresses are return addresses (look up at `addr - 1`) and which are exact pcs
//!   (frame 0 of a ucontext capture, the frame after a signal trampoline), as the walk
//!   recorded them; [`frame_kind`] tells the same from the addresses alone, reading code;
//! * [`write_kernel_frame`]: one `0x... : name+0x1d/0x80 [obj]` line into a caller's buffer,
//!   Rust names demangled (C++ names stay mangled: demangling them allocates), optionally with
//!   `[obj+0xoffset]` and the build-id;
//! * [`demangle_into`] / [`demangle_to`] and [`FixedBuf`]: Rust demangling into a fixed buffer;
//! * [`backtrace_symbols_fd`] / [`backtrace_symbols_fd_with`].
//!
//! ```
//! selftrace::symbolize::prepare().expect("init");
//! let mut frames = [0usize; 32];
//! let walk = selftrace::Capture::new().walk(&mut frames);
//! let n = walk.frames;
//! let mut line = [0u8; 256];
//! for (i, &pc) in frames[..n].iter().enumerate() {
//!     let kind = walk.frame_kind(&frames[..n], i);
//!     let len = selftrace::symbolize::write_kernel_frame(&mut line, pc, kind, Default::default());
//!     // write(2) &line[..len] to stderr ...
//!     assert!(len > 0);
//! }
//! ```
//!
//! # Where names come from
//! Each object's `.symtab`, else a separate debug file (`/usr/lib/debug/.build-id/xx/yyyy.debug`,
//! or `.gnu_debuglink`; `$SELFTRACE_DEBUG_DIR` is searched first), else `.dynsym`; PLT stubs are
//! named `name@plt` from the PLT relocations, as gdb, perf and objdump do; the vDSO from its image
//! in memory. A symbol never covers addresses outside its own section. A debug file is used only
//! when it is provably the object's: the same build-id (a `.build-id/` file without a build-id
//! note is refused), or, through `.gnu_debuglink`, the CRC32 the link names (as gdb checks).
//! Stripped objects, deleted files, anonymous executable memory, 0 and garbage get placeholders
//! (`path(+0x...)`, `[0x...]`, `<unknown>`, `??`), never a panic. glibc's signal trampoline is
//! named `__restore_rt`; symbol versions (`__libc_start_main@@GLIBC_2.34`) are dropped from
//! printed names (not from the raw [`Symbol::name`], nor from glibc's raw format).
//!
//! An object's names are stored front-coded (sorted for objects of 30,000 names or more, in
//! blocks of 4, each name after a block's first as the length of the prefix it shares with the
//! one before and the rest of its bytes), so [`Symbol::name`] is a [`SymbolName`] decoded on
//! demand; for rustc's `librustc_driver` and `libLLVM` the names take 74 bytes each instead of
//! 135 as plain copies. The index costs 12 bytes per symbol plus a page directory (at most 16
//! bytes per symbol) plus the names; each page entry keeps copies of the two symbols that cover
//! most of its page, so most lookups go from the directory straight to the name.
//!
//! # Where lines come from
//! DWARF is read from the object itself or from its debug file (as above), with sections
//! compressed as distributions ship them: `SHF_COMPRESSED` with zlib (Debian's `-dbg` packages)
//! or zstd, and GNU's older `.zdebug_*`. Split DWARF (`gcc -gsplit-dwarf`, rustc's
//! `-Csplit-debuginfo=unpacked`) is read from each skeleton unit's `.dwo` file (`DW_AT_dwo_name`
//! under `DW_AT_comp_dir`, used only when its DWO id is the skeleton's); an object with a `.dwo`
//! missing gets no file:line at all and says which file is missing (its skeleton line tables
//! alone would give an inlined function's line under its caller's name). Not read: `.dwp`
//! packages, and Fedora's MiniDebugInfo (`.gnu_debugdata`: such objects get `.dynsym` names,
//! [`SymbolSource::Dynsym`]).
//!
//! No missing line is silent: a frame without file:line says why ([`BacktraceFrame::no_line`],
//! printed by [`Backtrace`]'s `Display` and by crash reports as `(no file:line: ...)`): no debug
//! info in the object (with what to set or install), a debug file replaced since it was indexed, a
//! section compressed in a format this build cannot read, a section that is truncated or whose
//! compressed data is corrupt, DWARF that cannot be parsed, or a missing `.dwo`. Any section that
//! cannot be read fails the object's DWARF as a whole: half of it could give wrong lines. DWARF
//! sections are read (and decompressed) into the heap when file:line is first needed.
//!
//! Size: over 600 lines because about 330 of them are the public API's docs (the guide above and each
//! entry point's async-signal-safety contract); the code is the entry points over the files below.

mod debug_file;
pub(crate) mod elf;
mod file;
mod format;
pub(crate) mod index;
pub(crate) mod lines;
mod names;
mod slots;
mod table;

use crate::error::Error;

// Defined in the crate's `fmt` module (under every report writer); public here.
pub use crate::fmt::FixedBuf;
/// Defined in [`crate::unwind`], beside the walk that knows each frame's kind
/// ([`Walk::frame_kinds`](crate::Walk::frame_kinds)); public here too, where it was first.
pub use crate::unwind::FrameKind;
pub(crate) use format::write_truncation;
pub use format::{
    demangle_into, demangle_to, without_version, write_kernel_frame, KernelOptions, SymbolsOptions,
    DEMANGLE_STACK, RAW_NAME_MAX,
};
pub use index::SymbolSource;
pub use lines::{Backtrace, BacktraceFrame, BacktraceSymbol, NoLine};
pub use names::SymbolName;
pub use slots::set_background_index;

use crate::published::Published;
use core::ops::Range;
use format::GlibcLine;
use index::{ObjectSymbols, Slot};
use std::sync::atomic::{AtomicU8, Ordering};

/// What [`symbolize`] knows of an address.
///
/// All references are `'static`: symbol tables and their file mappings are never freed (see the
/// module docs), so a `Symbol` stays valid after any refresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// The address looked up.
    pub addr: usize,
    /// Path of the containing object as the loader knows it (`[vdso]` for the vDSO).
    pub path: &'static str,
    /// The name glibc's `dladdr` gives the object: `argv[0]` for the main program,
    /// `linux-vdso.so.1` for the vDSO, else the path.
    pub glibc_path: &'static str,
    /// The object's load bias: `addr - bias` is the link-time address (what `addr2line -e`,
    /// `objdump` and `nm` show).
    pub bias: usize,
    /// The object's GNU build-id (empty if it has none).
    pub build_id: &'static [u8],
    /// Raw (mangled) symbol name, decoded on demand (see [`SymbolName`]); `None` when no
    /// symbol covers the address.
    pub name: Option<SymbolName>,
    /// Run-time start of the symbol (0 when `name` is `None`).
    pub start: usize,
    /// Size of the symbol in bytes (0 if unknown).
    pub size: usize,
    /// Where the object's names came from.
    pub source: SymbolSource,
}

/// `name+0x1d/0x80 [libfoo.so]` as the kernel writes a frame, the name demangled (Rust legacy
/// and v0; other names as they are); `[libfoo.so+0x2e40]` without a symbol;
/// `?? (object changed since snapshot)` where the object indexed there was unloaded (see
/// [`SymbolSource::Changed`]).
///
/// # Async-signal safety
/// Async-signal-safe when the formatter's writer is: the name is demangled into a 1 KiB stack
/// buffer (a longer name is cut).
impl core::fmt::Display for Symbol {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if let Some(why) = self.source.unknown_reason() {
            return write!(f, "?? ({why})");
        }
        let mut buf = [0u8; 1024];
        match self.demangle_into(&mut buf) {
            Some(name) => {
                f.write_str(name)?;
                write!(f, "+{:#x}", self.offset())?;
                if self.size != 0 {
                    write!(f, "/{:#x}", self.size)?;
                }
                write!(f, " [{}]", self.object_name())
            }
            None => write!(f, "[{}+{:#x}]", self.object_name(), self.object_offset()),
        }
    }
}

impl Symbol {
    /// An address in an object that is no longer the one indexed there (see
    /// [`SymbolSource::Changed`]): no path, no name.
    fn unknown_object(addr: usize, source: SymbolSource) -> Symbol {
        Symbol {
            addr,
            path: "",
            glibc_path: "",
            bias: 0,
            build_id: &[],
            name: None,
            start: 0,
            size: 0,
            source,
        }
    }

    /// `addr - start`: the offset into the symbol (0 when there is no symbol).
    pub fn offset(&self) -> usize {
        if self.name.is_some() {
            self.addr.wrapping_sub(self.start)
        } else {
            0
        }
    }

    /// `addr - bias`: the link-time address inside the object file.
    pub fn object_offset(&self) -> usize {
        self.addr.wrapping_sub(self.bias)
    }

    /// The raw name as an owned string, if it is UTF-8. Normal context (allocates); see
    /// [`SymbolName`] for the async-signal-safe ways to read it.
    pub fn name_string(&self) -> Option<String> {
        self.name.and_then(|n| String::from_utf8(n.to_vec()).ok())
    }

    /// The object's file name (last path component).
    pub fn object_name(&self) -> &'static str {
        crate::modules::short_name(self.path)
    }

    /// The name demangled into `buf` (Rust legacy and v0; other names as they are), or `None`
    /// without a symbol. A raw name longer than [`RAW_NAME_MAX`] bytes is cut there (and then
    /// written as it is, not demangled).
    ///
    /// # Async-signal safety
    /// Async-signal-safe; uses [`RAW_NAME_MAX`] bytes of stack for the raw name.
    pub fn demangle_into<'b>(&self, buf: &'b mut [u8]) -> Option<&'b str> {
        let name = self.name?;
        Some(format::write_str_into(buf, |w| {
            format::demangle_name_to(name, w)
        }))
    }
}

/// Which table a lookup uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every function (`.symtab`, debug file, `.dynsym`).
    All,
    /// Exported symbols only, with glibc's `dladdr` rules.
    Exported,
}

/// One loaded object in the index.
struct Entry {
    range: Range<usize>,
    bias: usize,
    syms: &'static Slot,
    /// What tells this object from another one loaded at its addresses after the snapshot.
    identity: crate::modules::Identity,
}

/// The published index: objects sorted by start address.
struct Index {
    generation: u64,
    /// The loader's load and unload counters when its snapshot was taken.
    counters: (u64, u64),
    entries: Box<[Entry]>,
}

impl Index {
    fn find(&self, addr: usize) -> Option<&Entry> {
        let i = self.entries.partition_point(|e| e.range.start <= addr);
        let e = self.entries.get(i.checked_sub(1)?)?;
        e.range.contains(&addr).then_some(e)
    }
}

static INDEX: Published<Index> = Published::new();

/// In a forked child: the reads of the parent's other threads ended with them.
pub(crate) fn after_fork() {
    INDEX.after_fork();
}

/// Before a fork (the prepare handler): takes the caches' locks, waiting until `deadline` at
/// most, so that the child gets them whole (see `crate::fork`).
pub(crate) fn before_fork(deadline: u64) {
    slots::before_fork(deadline);
    lines::before_fork(deadline);
}

/// After a fork, in the parent and in the child: releases what [`before_fork`] took.
pub(crate) fn after_fork_release() {
    lines::after_fork_release();
    slots::after_fork_release();
}

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOLD: crate::fork::ForkHook = crate::fork::ForkHook {
    rank: crate::fork::rank::RELEASE,
    prepare: Some(before_fork),
    parent: Some(after_fork_release),
    child: Some(after_fork_release),
};

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::SYMBOLS, after_fork);

/// Builds the symbol index for the current module snapshot, unless it is already up to date.
/// Tables of objects seen before are reused. Normal context only; `init()` and `refresh()`
/// call it.
pub(crate) fn rebuild() {
    learn_glibc();
    let snap = crate::modules::with_current(|s| {
        s.map(|s| (s.generation(), s.counters(), s.objects().to_vec()))
    });
    let Some((generation, counters, objects)) = snap else {
        return;
    };
    let fresh = INDEX.read(|i| i.is_some_and(|i| i.generation == generation));
    if fresh {
        return;
    }
    // Build outside the writer lock of the published cell: file I/O and parsing take time.
    // Objects of at least `background` bytes are built by the background indexer.
    let background = slots::background_min();
    let entries: Box<[Entry]> = objects
        .iter()
        .map(|o| Entry {
            range: o.range.clone(),
            bias: o.bias,
            syms: slots::for_object(o, background),
            identity: o.identity(),
        })
        .collect();
    INDEX.update(false, |old| {
        if old.is_some_and(|i| i.generation >= generation) {
            None
        } else {
            Some(Index {
                generation,
                counters,
                entries,
            })
        }
    });
}

/// Waits for the background indexer's objects: those of `addrs`, or every object. Normal
/// context.
pub(crate) fn wait_indexed(addrs: Option<&[usize]>) {
    let slots: Vec<&'static Slot> = INDEX.read(|i| {
        let Some(i) = i else { return Vec::new() };
        let unbuilt = |e: &Entry| e.syms.get().is_none().then_some(e.syms);
        match addrs {
            Some(addrs) => addrs
                .iter()
                .filter_map(|&a| i.find(a))
                .filter_map(unbuilt)
                .collect(),
            None => i.entries.iter().filter_map(unbuilt).collect(),
        }
    });
    for s in slots {
        slots::wait(s);
    }
}

/// Makes sure the symbol index covers the objects loaded now, with every name: does what
/// [`crate::init`] does (a refresh when objects were loaded or unloaded since), then waits for the
/// objects that the background indexer has not finished
/// ([`set_background_index`]).
///
/// Not async-signal-safe. [`crate::init`] and [`crate::refresh`] do the same without the wait; call one of
/// them (or this) before using [`symbolize()`](crate::symbolize()) in a signal handler, and
/// again after `dlopen`.
///
/// Also at `selftrace::prepare`.
///
/// # Errors
/// [`Error::NoUnwindInfo`] as [`crate::init`].
pub fn prepare() -> Result<(), Error> {
    set_up()?;
    rebuild();
    wait_indexed(None);
    Ok(())
}

/// What `selftrace::init` does (its docs say what and why), from the floor that can do it:
/// registers the fork handlers, snapshots the loaded objects, builds the unwinder and the
/// index. Normal context.
pub(crate) fn set_up() -> Result<(), Error> {
    // (Registered before main by a constructor; again here in case that was not linked in.)
    crate::fork::register();
    crate::modules::refresh(false);
    crate::unwind::prepare();
    rebuild();
    let ok = crate::modules::with_current(|s| {
        s.is_some_and(|s| s.objects().iter().any(|o| o.eh_frame_hdr.is_some()))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::NoUnwindInfo)
    }
}

/// Normal-context catch-up used by the allocating entry points: builds the index if there is
/// none or if the snapshot moved on.
pub(crate) fn ensure() {
    let have = crate::modules::with_current(|s| s.map(|s| s.generation()));
    match have {
        None => {
            // What `selftrace::init` does, from below it: the snapshot and the unwinder.
            crate::modules::refresh(false);
            crate::unwind::prepare();
        }
        Some(g) if INDEX.read(|i| i.map(|i| i.generation)) == Some(g) => return,
        Some(_) => {}
    }
    rebuild();
}

/// Normal context: if the loader loaded or unloaded objects since the snapshot (its
/// `dlpi_adds`/`dlpi_subs` counters moved: about 20 ns to ask), refresh and rebuild, so that no
/// address is named after an object that was unloaded, even where another one now lies at its
/// address. Then waits for the objects of `addrs` that the background indexer has not
/// finished.
pub(crate) fn ensure_covers(addrs: &[usize]) {
    ensure();
    if crate::modules::with_current(|s| s.is_some_and(|s| s.is_stale())) {
        refresh_all();
    }
    // The objects of these addresses that the background indexer has not finished.
    wait_indexed(Some(addrs));
}

/// Normal context, proven by the caller: refreshes the snapshot if the loader's objects
/// changed, and the unwinder and the index with it.
fn refresh_now() {
    refresh_all();
    ensure();
}

/// What `selftrace::refresh` does, from below it: a new module snapshot if the loader's objects
/// changed, then the unwinder and the index over it. Normal context.
fn refresh_all() {
    crate::modules::refresh(false);
    crate::unwind::rebuild();
    rebuild();
}

/// Looks up `addr` in the index: `None` outside every loaded object (or before the index is
/// built); otherwise a [`Symbol`] whose `name` is `None` when no symbol covers the address.
///
/// The address is looked up as given: for a return address of a captured stack, pass
/// `addr - 1` (see [`FrameKind`]).
///
/// # Objects unloaded since the index was built
/// An object that can be unloaded (`dlopen`ed after program start) is checked to be still the
/// one indexed at `addr`: a library loaded since where an unloaded one was (the kernel reuses
/// the hole) is never named after the old one. Where the check fails, a caller in proven
/// normal context (no signal handler below it on its thread's stack, automatic refresh on:
/// [`crate::set_auto_refresh`]) refreshes the index and looks again; anywhere else the symbol
/// comes back with no path and no name, its [`Symbol::source`] saying why
/// ([`SymbolSource::Changed`], [`SymbolSource::Unverified`]). So does an address in an object
/// loaded after the index was built: refreshed in normal context, `None` elsewhere.
///
/// # Async-signal safety
/// Async-signal-safe: a lock-free read of the published index and two binary searches; no
/// allocation, no lock, no panic. About 40 ns in objects that are never unloaded; in a
/// `dlopen`ed object the check above adds `_dl_find_object` and one `process_vm_readv` (about
/// a microsecond). Only the refresh in proven normal context allocates and locks. At most
/// [`crate::SIGNAL_STACK_BUDGET`] bytes of stack (see the crate docs' stack budget).
pub fn symbolize(addr: usize) -> Option<Symbol> {
    lookup(addr, Mode::All)
}

/// Like [`symbolize`], but names only exported (`.dynsym`) symbols, by glibc's `dladdr` rules:
/// what glibc's `backtrace_symbols` would name.
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn symbolize_exported(addr: usize) -> Option<Symbol> {
    lookup(addr, Mode::Exported)
}

/// Looks `addr` up; where the object there is not the one indexed (or an object the index does
/// not know lies there) and the caller is in proven normal context, refreshes and looks again
/// (the second lookup trusts an object that cannot be verified without locks: the refresh just
/// saw the loader's list).
pub(crate) fn lookup(addr: usize, mode: Mode) -> Option<Symbol> {
    let (indexed, sym) = INDEX.read(|i| match i {
        Some(i) => (true, lookup_in(i, addr, mode, Check::Verify)),
        None => (false, None),
    });
    let stale = match sym {
        Some(s) => s.source.is_stale(),
        None => indexed && matches!(crate::sys::dl_find_object(addr), Ok(Some(_))),
    };
    if !stale {
        return sym;
    }
    let mut again = None;
    crate::unwind::in_normal_context(|| {
        refresh_now();
        again = Some(INDEX.read(|i| lookup_in(i?, addr, mode, Check::TrustUnverified)));
    });
    again.unwrap_or(sym)
}

/// The symbol of a captured frame: looked up at [`FrameKind::lookup_address`]; for a return
/// address that no symbol covers, a zero-size symbol that starts exactly at the address (glibc's
/// signal trampoline `__restore_rt`, whose address the kernel pushes as the handler's return
/// address) names it. [`Symbol::addr`] is the address the symbol was found for.
///
/// # Async-signal safety
/// Async-signal-safe, like [`symbolize`].
pub fn symbolize_frame(addr: usize, kind: FrameKind) -> Option<Symbol> {
    lookup_frame(addr, kind, Mode::All)
}

pub(crate) fn lookup_frame(addr: usize, kind: FrameKind, mode: Mode) -> Option<Symbol> {
    frame_with(addr, kind, |a| lookup(a, mode))
}

/// [`lookup_frame`] over any lookup.
fn frame_with(
    addr: usize,
    kind: FrameKind,
    lookup: impl Fn(usize) -> Option<Symbol>,
) -> Option<Symbol> {
    let sym = lookup(kind.lookup_address(addr));
    if kind == FrameKind::Return && sym.is_some_and(|s| s.name.is_none()) {
        let exact = lookup(addr).filter(|e| e.name.is_some() && e.start == addr && e.size == 0);
        if exact.is_some() {
            return exact;
        }
    }
    sym
}

/// How a lookup makes sure the object it finds is still the one loaded at the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// [`crate::modules::Identity::verify`]; an object that cannot be verified is marked.
    Verify,
    /// The same, but an object that cannot be verified is trusted: the caller saw the
    /// loader's list unchanged since the index's snapshot just before.
    TrustUnverified,
    /// No check: the caller saw the loader's counters equal to the index's snapshot's before
    /// and after all its lookups (see [`settled`]), so no object was loaded or unloaded.
    Settled,
}

/// The lookup in one index. The object found there is checked to be still the one loaded
/// ([`crate::modules::Identity::verify`]); if not, the symbol says so
/// ([`SymbolSource::Changed`], [`SymbolSource::Unverified`] unless `trust_unverified`) and
/// names nothing.
fn lookup_in(i: &Index, addr: usize, mode: Mode, check: Check) -> Option<Symbol> {
    use crate::modules::Verdict;
    let e = i.find(addr)?;
    let verdict = match check {
        Check::Settled => Verdict::Same,
        _ => e.identity.verify(addr),
    };
    match verdict {
        Verdict::Same => {}
        Verdict::Unverified if check == Check::TrustUnverified => {}
        Verdict::Unverified => return Some(Symbol::unknown_object(addr, SymbolSource::Unverified)),
        Verdict::Changed => return Some(Symbol::unknown_object(addr, SymbolSource::Changed)),
    }
    let svma = addr.wrapping_sub(e.bias) as u64;
    let tables = e.syms.get();
    let found = tables.and_then(|o| match mode {
        Mode::All => o.all().lookup(svma, false),
        Mode::Exported => o.exported.lookup(svma, true),
    });
    Some(Symbol {
        addr,
        path: &e.syms.path,
        glibc_path: &e.syms.glibc_path,
        bias: e.bias,
        build_id: &e.syms.build_id,
        name: found.map(|f| f.name),
        start: found.map_or(0, |f| (f.start as usize).wrapping_add(e.bias)),
        size: found.map_or(0, |f| f.size as usize),
        source: tables.map_or(SymbolSource::Pending, |o| o.source),
    })
}

/// A held view of the symbol index for many lookups: [`symbolize`] pins the index with two
/// atomic read-modify-writes per call; a `Symbolizer` pins it once for all the frames of a
/// stack, and every lookup sees the same index. Obtained from [`with_symbolizer`].
#[must_use]
pub struct Symbolizer<'a> {
    index: Option<&'a Index>,
    check: Check,
}

impl Symbolizer<'_> {
    /// Like [`symbolize`].
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn symbolize(&self, addr: usize) -> Option<Symbol> {
        lookup_in(self.index?, addr, Mode::All, self.check)
    }

    /// Like [`symbolize_exported`].
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn symbolize_exported(&self, addr: usize) -> Option<Symbol> {
        lookup_in(self.index?, addr, Mode::Exported, self.check)
    }

    pub(crate) fn lookup(&self, addr: usize, mode: Mode) -> Option<Symbol> {
        lookup_in(self.index?, addr, mode, self.check)
    }

    /// Like [`symbolize_frame`], in this index.
    pub(crate) fn frame(&self, addr: usize, kind: FrameKind, mode: Mode) -> Option<Symbol> {
        frame_with(addr, kind, |a| self.lookup(a, mode))
    }
}

/// Runs `f` with a [`Symbolizer`] that holds the current index until `f` returns (a refresh
/// meanwhile publishes a new index and waits for `f` before freeing the old object list).
///
/// ```
/// selftrace::symbolize::prepare().expect("init");
/// let mut frames = [0usize; 32];
/// let n = selftrace::capture(&mut frames);
/// let named = selftrace::symbolize::with_symbolizer(|s| {
///     frames[..n].iter().filter(|&&a| s.symbolize(a - 1).is_some_and(|s| s.name.is_some())).count()
/// });
/// assert!(named > 0);
/// ```
///
/// Unlike [`symbolize`], its lookups never refresh (a refresh would wait for `f`): an object
/// unloaded since the index was built comes back marked ([`SymbolSource::Changed`]).
///
/// # Async-signal safety
/// Async-signal-safe; keep `f` short (a refresh in another thread waits for it).
pub fn with_symbolizer<R>(f: impl FnOnce(&Symbolizer<'_>) -> R) -> R {
    INDEX.read(|i| {
        f(&Symbolizer {
            index: i,
            check: Check::Verify,
        })
    })
}

/// Runs `f` (a batch of lookups; short: it holds the index) with a [`Symbolizer`] over an index
/// that is up to date, for normal-context callers: refreshes if the loader's load and unload
/// counters moved since the index's snapshot, and runs `f` without checking each object
/// ([`Check::Settled`]) when the counters are the index's before and after `f` (about 20 ns each
/// time: cheaper than a check per object, a system call). If objects keep being loaded and
/// unloaded meanwhile, the last try checks every lookup. Normal context only.
pub(crate) fn settled<R>(f: impl Fn(&Symbolizer<'_>) -> R) -> R {
    for _ in 0..3 {
        let before = crate::sys::dl_load_counters();
        let r = INDEX.read(|i| {
            let i = i.filter(|i| i.counters == before)?;
            Some(f(&Symbolizer {
                index: Some(i),
                check: Check::Settled,
            }))
        });
        if let Some(r) = r {
            if crate::sys::dl_load_counters() == before {
                return r;
            }
        }
        ensure_covers(&[]);
    }
    INDEX.read(|i| {
        f(&Symbolizer {
            index: i,
            check: Check::TrustUnverified,
        })
    })
}

/// Whether `addr` is the start of a signal return trampoline (glibc's `__restore_rt` on
/// x86-64, the vDSO's `__kernel_rt_sigreturn` on aarch64, or the same instructions elsewhere:
/// qemu-user's page, a JIT's): the frame after it in a captured stack is an exact pc, not a
/// return address. The bytes are copied by the kernel, so an address that is unmapped (or
/// being unmapped by another thread) gives `false`, never a fault. Always `false` on an
/// architecture without an unwinder port.
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn is_signal_trampoline(addr: usize) -> bool {
    crate::unwind::is_signal_trampoline(addr)
}

/// The kind of frame `i` of a captured stack: exact for frame 0 when `first_exact` (a capture
/// from a `ucontext_t` or registers) and for a frame right after a signal trampoline (read from
/// the code before it), else a return address.
///
/// For callers that hold only the addresses. A capture's [`Walk`](crate::Walk) knows better:
/// [`Walk::frame_kind`](crate::Walk::frame_kind) (or the [`FrameKinds`](crate::unwind::FrameKinds)
/// it returns) gives the kinds the walk recorded as it crossed each signal frame, without reading
/// code.
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn frame_kind(frames: &[usize], i: usize, first_exact: bool) -> FrameKind {
    if i == 0 {
        return if first_exact {
            FrameKind::Exact
        } else {
            FrameKind::Return
        };
    }
    match frames.get(i - 1) {
        Some(&prev) if is_signal_trampoline(prev) => FrameKind::Exact,
        _ => FrameKind::Return,
    }
}

/// 0 = not yet decided, 1 = no space before `[` (glibc < 2.40), 2 = a space.
static FD_SPACE: AtomicU8 = AtomicU8::new(0);

/// Whether this process's glibc puts a space before `[` in `backtrace_symbols_fd` (2.40+).
fn fd_space() -> bool {
    match FD_SPACE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        // Not decided: only in a handler before any normal-context call; assume the older
        // format (FACTS: before 2.40, no space).
        _ => false,
    }
}

/// Decides the `_fd` spacing from the running glibc (normal context).
fn learn_glibc() {
    if FD_SPACE.load(Ordering::Relaxed) == 0 {
        let space = crate::sys::glibc_version().is_some_and(|v| v >= (2, 40));
        FD_SPACE.store(if space { 2 } else { 1 }, Ordering::Relaxed);
    }
}

/// glibc's `backtrace_symbols`: one line per address, in glibc's exact format:
///
/// ```text
/// ./prog(main+0x1d) [0x55d0c0a3d1f0]
/// /lib/x86_64-linux-gnu/libc.so.6(+0x271ca) [0x7f0e2a8461ca]
/// ./prog() [0x401136]                       (non-PIE, no symbol)
/// [0x7f0e2a000000]                          (no object)
/// ```
///
/// Unlike glibc, functions that are not exported are named too (from `.symtab` or a debug
/// file); names stay mangled, as in glibc. See [`backtrace_symbols_with`] for demangling or
/// glibc's exact naming. Addresses are looked up as given (as glibc does).
///
/// Not async-signal-safe (it allocates); builds or refreshes the index as needed.
pub fn backtrace_symbols(addrs: &[usize]) -> Vec<String> {
    backtrace_symbols_with(addrs, SymbolsOptions::default())
}

/// [`backtrace_symbols`] with options: demangled names (Rust and C++), or only the names glibc
/// gives (`exported_only`: byte-for-byte glibc output for every address).
pub fn backtrace_symbols_with(addrs: &[usize], opts: SymbolsOptions) -> Vec<String> {
    ensure_covers(addrs);
    let mode = if opts.exported_only {
        Mode::Exported
    } else {
        Mode::All
    };
    let mut buf = vec![0u8; 4096];
    let mut raw = vec![0u8; names::MAX_NAME];
    let syms: Vec<Option<Symbol>> = settled(|s| addrs.iter().map(|&a| s.lookup(a, mode)).collect());
    addrs
        .iter()
        .zip(syms)
        .map(|(&a, sym)| {
            let mut out = FixedBuf::new(&mut buf);
            format::glibc_line_for(
                &mut out,
                a,
                sym.as_ref(),
                GlibcLine::Strings,
                opts.demangle,
                &mut |out, name| lines::demangle_any_to(name.copy_to(&mut raw), out),
            );
            String::from_utf8_lossy(out.as_bytes()).into_owned()
        })
        .collect()
}

/// glibc's `backtrace_symbols_fd`: writes one line per address to `fd`, in the format of the
/// glibc this process runs with (before 2.40: `./prog(main+0x1d)[0x55d0c0a3d1f0]`, no space
/// before `[`; from 2.40 on, a space), naming functions that are not exported too.
///
/// # Async-signal safety
/// Async-signal-safe: formats each line into a 1 KiB stack buffer and writes it with one
/// `write(2)` (a longer line is cut, and still ends with a newline); no allocation, no lock, no
/// panic. Write errors are ignored, as in glibc. At most [`crate::SIGNAL_STACK_BUDGET`] bytes
/// of stack (see the crate docs' stack budget).
///
/// In a signal handler, where the fd is an `int`, pass
/// `unsafe { BorrowedFd::borrow_raw(fd) }` ([`std::os::fd::BorrowedFd`]).
pub fn backtrace_symbols_fd(addrs: &[usize], fd: impl std::os::fd::AsFd) {
    backtrace_symbols_fd_with(addrs, fd, SymbolsOptions::default())
}

/// [`backtrace_symbols_fd`] with options (demangling Rust names, or glibc's exact naming).
///
/// # Async-signal safety
/// Async-signal-safe (C++ names stay mangled).
pub fn backtrace_symbols_fd_with(
    addrs: &[usize],
    fd: impl std::os::fd::AsFd,
    opts: SymbolsOptions,
) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd());
    let line = GlibcLine::Fd { space: fd_space() };
    let mut buf = [0u8; 1024];
    for &a in addrs {
        let mut out = FixedBuf::new(&mut buf);
        // One lookup per line, outside the index pin: writes can block.
        format::glibc_line(&mut out, a, line, opts);
        if out.truncated() {
            let _ = crate::sys::write_all(fd, out.as_bytes());
            let _ = crate::sys::write_all(fd, b"\n");
        } else {
            let _ = crate::sys::write_all(fd, out.as_bytes());
        }
    }
}

/// Memory used by the symbol index: `(entries, heap bytes of the tables)`. An entry is one
/// symbol of one table: an object's full table (`.symtab` and PLT stubs) and its exported table
/// (`.dynsym`, for glibc's naming) each count. The names, front-coded out of the files into a
/// store per object, are counted by [`index_name_bytes`]. Objects the background indexer has
/// not finished are not counted. Normal context.
pub fn index_stats() -> (usize, usize) {
    let (n, bytes, _) = index_totals();
    (n, bytes)
}

/// Bytes of the symbol names the index holds (front-coded copies out of the ELF files, so that
/// no lookup reads a file mapping that a change on disk could make fault). Normal context.
pub fn index_name_bytes() -> usize {
    index_totals().2
}

fn index_totals() -> (usize, usize, usize) {
    ensure();
    INDEX.read(|i| {
        let Some(i) = i else { return (0, 0, 0) };
        let mut seen: Vec<*const Slot> = Vec::new();
        let (mut n, mut bytes, mut names) = (0, 0, 0);
        for e in i.entries.iter() {
            let p: *const Slot = e.syms;
            if seen.contains(&p) {
                continue;
            }
            seen.push(p);
            let Some(o) = e.syms.get() else { continue };
            let (syms, heap, name) = o.stats();
            n += syms;
            bytes += heap;
            names += name;
        }
        (n, bytes, names)
    })
}

/// The DWARF-bearing file and symbol table for `addr`'s object (normal context, for `lines`),
/// if it is the object `sym` was found in (a refresh in between may have changed the index).
/// Waits for the background indexer where needed.
pub(crate) fn object_for(addr: usize, sym: &Symbol) -> Option<(&'static ObjectSymbols, usize)> {
    let (slot, bias) = INDEX.read(|i| {
        let e = i?.find(addr)?;
        (e.bias == sym.bias && core::ptr::eq(&*e.syms.path, sym.path)).then_some((e.syms, e.bias))
    })?;
    slots::wait(slot);
    Some((slot.get()?, bias))
}
