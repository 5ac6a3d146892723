//! An object in the symbol index: its [`Slot`] (what identifies it, and its tables once
//! built), its tables ([`ObjectSymbols`]: sorted arrays of 12-byte entries, [`super::table`],
//! over a store of front-coded names that selftrace owns, [`Names`](super::names::Names)) and
//! where they came from ([`SymbolSource`]). [`super::elf`] builds the tables,
//! [`super::debug_file`] finds separate debug files, [`super::slots`] decides which object gets
//! a slot and when its tables are built.
//!
//! Built in normal context (it opens, reads and parses ELF files and allocates); looked up from
//! anywhere, including signal handlers (binary search over a slice, no allocation).
//!
//! Files are read into memory selftrace owns (through [`FileCache`](super::file::FileCache)),
//! never mapped, and the names of the indexed symbols are front-coded into a store the object's
//! tables share: nothing a lookup touches can fault when a file is truncated or rewritten on
//! disk after `init`.
//!
//! Where the names come from, per object:
//! 1. its own file's `.symtab` (every function, exported or not);
//! 2. for stripped objects, the `.symtab` of a separate debug file found by build-id under
//!    `<debug root>/.build-id/xx/yyyy.debug`, or by `.gnu_debuglink` (next to the object, in its
//!    `.debug/` directory, or under `<debug root>/<object dir>/`);
//! 3. its `.dynsym` (exported symbols only), always kept as a second table: it is what glibc's
//!    `dladdr` sees, used for the glibc-exact naming mode;
//! 4. PLT stubs, named `name@plt` from the PLT relocations (as gdb, perf and objdump do).
//!
//! A symbol never covers addresses outside its own section: each section's end is a boundary
//! that a zero-size symbol does not extend past.
//!
//! A file whose build-id differs from the loaded object's (replaced on disk after load) is not
//! used. A separate debug file is used only when its build-id equals the object's (build-id
//! path), or when its CRC32 is the one `.gnu_debuglink` names (as gdb does). Objects whose file is gone (deleted after load) get no names; the vDSO's names are read
//! from its image in memory.
//!
//! Tables are never freed: a table is built once per distinct object (path, build-id, and the
//! file's device, inode, size and modification time) and
//! leaked, with its file mapping, so that a [`Symbol`](super::Symbol) can hold `'static`
//! references. dlopen/dlclose cycles of the same library reuse its table.
#![allow(unsafe_code)]

use super::debug_file::DwarfFile;
use super::table::Table;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Where an object's full symbol table came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SymbolSource {
    /// The object's own `.symtab`.
    Symtab,
    /// The `.symtab` of a separate debug file (build-id or `.gnu_debuglink`).
    DebugFile,
    /// Only `.dynsym` (stripped object, no debug file): exported functions only.
    Dynsym,
    /// The vDSO image in memory.
    Memory,
    /// No names: the file is missing, unreadable, replaced or not ELF.
    None,
    /// Not known yet: the background indexer has not built this object's table (see
    /// [`set_background_index`](super::set_background_index)); no name is given meanwhile.
    Pending,
    /// The object indexed at the address was unloaded since the index was built (another one
    /// may lie there now), and the lookup could not refresh the index (in a signal handler, or
    /// with [`set_auto_refresh`](crate::set_auto_refresh) off): no path, no name.
    Changed,
    /// Whether the object indexed at the address is still the one loaded there could not be
    /// told without locks (glibc without `_dl_find_object`, before 2.35, and an object without
    /// a build-id), and the lookup could not refresh: no path, no name.
    Unverified,
}

impl SymbolSource {
    /// Whether the symbol says nothing of the object because the object at the address is
    /// not (or may not be) the one indexed.
    pub fn is_stale(self) -> bool {
        matches!(self, SymbolSource::Changed | SymbolSource::Unverified)
    }

    /// Why the object is unknown, for a `?? (why)` mark; `None` unless [`Self::is_stale`].
    pub fn unknown_reason(self) -> Option<&'static str> {
        match self {
            SymbolSource::Changed => Some("object changed since snapshot"),
            SymbolSource::Unverified => Some("object not verifiable since snapshot"),
            _ => None,
        }
    }
}

/// The symbols of one object, built once and never freed.
#[derive(Debug)]
pub(crate) struct ObjectSymbols {
    /// Every function symbol (`.symtab`, else `.dynsym`) and the PLT stubs.
    pub(crate) full: Table,
    /// Defined `.dynsym` symbols, the ones glibc's `dladdr` considers.
    pub exported: Table,
    /// Where `all` came from.
    pub source: SymbolSource,
    /// The file that holds the DWARF for this object, if any (object or debug file).
    pub dwarf: Option<DwarfFile>,
    /// Path of the separate debug file used, if any.
    pub debug_path: Option<Box<str>>,
}

impl ObjectSymbols {
    /// No tables: no names ([`SymbolSource::None`]).
    pub(crate) fn empty() -> ObjectSymbols {
        ObjectSymbols {
            full: Table::default(),
            exported: Table::default(),
            source: SymbolSource::None,
            dwarf: None,
            debug_path: None,
        }
    }

    /// Every function symbol: `.symtab` (own or debug file), or `.dynsym` when there is none,
    /// and the PLT stubs.
    pub(crate) fn all(&self) -> &Table {
        &self.full
    }

    /// `(symbols indexed, heap bytes of entries and page directories, bytes of names)` of
    /// both tables.
    pub(crate) fn stats(&self) -> (usize, usize, usize) {
        (
            self.full.len() + self.exported.len(),
            self.full.heap_bytes() + self.exported.heap_bytes(),
            // One pool for both tables (empty tables have an empty, static one).
            self.full.name_bytes().max(self.exported.name_bytes()),
        )
    }
}

/// An object's place in the index: what identifies it (known at once) and its tables, built
/// when the object is first seen or by the background indexer ([`super::slots`]). Never
/// freed.
///
/// Nothing here is behind a lock: the tables are published with one compare-exchange, and who
/// builds them is one atomic word. A child forked at any moment (while another thread of the
/// parent builds the tables) finds the slot consistent and can build them itself.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Path as the loader knows it (`[vdso]` for the vDSO).
    pub path: Box<str>,
    /// The name glibc's `dladdr` reports.
    pub glibc_path: Box<str>,
    /// GNU build-id of the loaded object (empty if none).
    pub build_id: Box<[u8]>,
    /// The object the tables are built from.
    pub(crate) object: crate::modules::Object,
    /// The directories searched for its separate debug file, read from the environment when
    /// the slot was made (never by the background thread).
    pub(crate) debug_roots: Box<[String]>,
    /// Who builds the tables: 0 nobody, [`Slot::BUILT`] once they are set, otherwise the
    /// builder's process and thread ids (`pid << 32 | tid`; in a forked child, the parent's).
    pub(crate) builder: AtomicU64,
    /// Bumped after every change of `builder` by a builder (built, or given up): the futex
    /// word its waiters sleep on.
    pub(crate) changed: AtomicU32,
    /// The next slot in the background indexer's queue (a list that only grows).
    pub(crate) next: AtomicPtr<Slot>,
    /// The tables once built (from `Box::into_raw`, set once, never freed).
    tables: AtomicPtr<ObjectSymbols>,
}

impl Slot {
    /// [`Slot::builder`] once the tables are set (no process id is this large).
    pub(crate) const BUILT: u64 = u64::MAX;

    /// A slot with no tables yet, its builder `builder` (0, or the calling thread when it
    /// builds them itself), not queued.
    pub(crate) fn new(
        path: Box<str>,
        glibc_path: Box<str>,
        build_id: Box<[u8]>,
        object: crate::modules::Object,
        debug_roots: Box<[String]>,
        builder: u64,
    ) -> Slot {
        Slot {
            path,
            glibc_path,
            build_id,
            object,
            debug_roots,
            builder: AtomicU64::new(builder),
            changed: AtomicU32::new(0),
            next: AtomicPtr::new(core::ptr::null_mut()),
            tables: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// The object's tables, once built.
    ///
    /// # Async-signal safety
    /// Async-signal-safe: one atomic load.
    pub(crate) fn get(&self) -> Option<&ObjectSymbols> {
        let p = self.tables.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here came from `Box::into_raw` in `set`, was published
        // (Release) after the tables were written, and is never freed or replaced: the tables
        // live as long as the slot.
        unsafe { p.as_ref() }
    }

    /// Sets the tables (the first builder wins; a later set drops its own).
    pub(crate) fn set(&self, tables: ObjectSymbols) {
        let p = Box::into_raw(Box::new(tables));
        let won = self.tables.compare_exchange(
            core::ptr::null_mut(),
            p,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if won.is_err() {
            // SAFETY: p came from Box::into_raw above and was never published.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}
