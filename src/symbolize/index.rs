//! Per-object symbol tables: sorted arrays of 12-byte entries over a store of front-coded
//! names that selftrace owns ([`Names`]).
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

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, Rela as _, SectionHeader, Sym as _};
use object::read::ReadRef;
use object::{Endianness, Object as _, ObjectSection as _};
use std::fs::File;
use std::io::Read as _;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::names::{Names, SymbolName, MAX_NAME};

/// An ELF file read with `pread` into buffers owned by the cache (never mapped).
pub(crate) type Cache = super::file::FileCache;
/// An ELF file parsed over a [`Cache`] or over memory.
pub(crate) type Elf<'d, R> = ElfFile64<'d, Endianness, R>;

/// One symbol: start (relative to the table's base), size, id of its name in the object's
/// [`Names`]. 12 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Sym {
    start: u32,
    size: u32,
    name: u32,
}

/// A sorted symbol table over the object's names.
///
/// A page directory narrows each binary search to the symbols of one address range:
/// `pages[p].first` is the index of the first symbol at or after `p << shift` (relative to
/// `base`). `shift` is at least 12 (4 KiB) and grows so that the directory has at most one entry
/// per two symbols.
///
/// Each page entry also holds copies of the two symbols that cover most of the page among those
/// a lookup can return from the entry alone (see [`Page`]), so that most cold lookups read the
/// directory and the name, not the symbol array in between: one dependent access to memory
/// fewer (in rustc's driver, 78% of random addresses). 12 bytes per symbol for the entries and
/// at most 16 for the 32-byte page entries: 28 bytes per symbol in all at most.
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// Link-time address that `Sym::start` is relative to.
    base: u64,
    syms: Box<[Sym]>,
    pages: Box<[Page]>,
    shift: u32,
    names: Option<&'static Names>,
}

/// One page of a [`Table`]'s directory: where its symbols start in the table, and copies of
/// symbols (size 0: none) each of which is the answer for every address inside it: it has a
/// size, is the last symbol at its start, and the next symbol starts at or after its end. The
/// binary search finds it for any address inside it too, so a copy is a shortcut, never a
/// different answer.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
struct Page {
    first: u32,
    s: [Sym; SHORTCUTS],
}

/// Shortcut symbols per page: two fill a 32-byte entry.
const SHORTCUTS: usize = 2;

/// A symbol found in a [`Table`]: link-time start, size, raw name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub start: u64,
    pub size: u64,
    pub name: SymbolName,
}

/// `Sym::name` of a section boundary: the end of a section, which no zero-size symbol before it
/// extends past, and which never matches itself.
const BOUNDARY: u32 = u32::MAX;

/// How far a lookup walks back from the nearest lower symbol to find one that contains the
/// address (nested or overlapping symbols, as in hand-written assembly).
const SCAN_BACK: usize = 8;

impl Table {
    /// Number of symbols.
    pub(crate) fn len(&self) -> usize {
        self.syms.len()
    }

    /// Heap bytes used by the entries and the page directory.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.syms.len() * core::mem::size_of::<Sym>()
            + self.pages.len() * core::mem::size_of::<Page>()
    }

    /// Bytes of the names (the object's store, which both of its tables share).
    pub(crate) fn name_bytes(&self) -> usize {
        self.names.map_or(0, Names::heap_bytes)
    }

    /// A table over sorted `syms` whose names are in `names`, with its page directory.
    fn new(base: u64, syms: Vec<Sym>, names: &'static Names) -> Table {
        let span = syms.last().map_or(0, |s| u64::from(s.start)) + 1;
        let mut shift = 12;
        while 2 * ((span >> shift) + 2) > syms.len() as u64 && shift < 32 {
            shift += 1;
        }
        let npages = ((span >> shift) + 2) as usize;
        let mut pages = Vec::with_capacity(npages);
        let mut i = 0usize;
        for p in 0..npages as u64 {
            let at = p << shift;
            while i < syms.len() && u64::from(syms[i].start) < at {
                i += 1;
            }
            let none = Sym {
                start: 0,
                size: 0,
                name: BOUNDARY,
            };
            pages.push(Page {
                first: i as u32,
                s: [none; SHORTCUTS],
            });
        }
        // Each page's shortcut: of the symbols that overlap it (the one before its first, and
        // those starting in it), the one covering most of it that a lookup returns for every
        // address inside it.
        let sole = |j: usize| {
            let s = syms[j];
            let end = u64::from(s.start) + u64::from(s.size);
            s.size > 0
                && s.name != BOUNDARY
                && syms.get(j + 1).is_none_or(|n| u64::from(n.start) >= end)
        };
        for p in 0..npages {
            let (lo, hi) = ((p as u64) << shift, (p as u64 + 1) << shift);
            let first = pages[p].first as usize;
            let last = pages.get(p + 1).map_or(syms.len(), |n| n.first as usize);
            // (bytes covered, symbol), most first.
            let mut best = [(0u64, None); SHORTCUTS];
            let from = first.saturating_sub(1);
            for (j, &s) in syms.iter().enumerate().take(last).skip(from) {
                let (a, b) = (u64::from(s.start), u64::from(s.start) + u64::from(s.size));
                let cover = b.min(hi).saturating_sub(a.max(lo));
                if cover > best[SHORTCUTS - 1].0 && sole(j) {
                    best[SHORTCUTS - 1] = (cover, Some(s));
                    best.sort_by_key(|x| core::cmp::Reverse(x.0));
                }
            }
            for (k, (_, s)) in best.into_iter().enumerate() {
                if let Some(s) = s {
                    pages[p].s[k] = s;
                }
            }
        }
        let (syms, pages) = (syms.into_boxed_slice(), pages.into_boxed_slice());
        // The entries and the directory of a large table in huge pages (see `huge_pages`).
        crate::sys::huge_pages(syms.as_ptr() as usize, core::mem::size_of_val(&*syms));
        crate::sys::huge_pages(pages.as_ptr() as usize, core::mem::size_of_val(&*pages));
        // Owned names: a store built from copies, never a file mapping.
        Table {
            base,
            syms,
            pages,
            shift,
            names: Some(names),
        }
    }

    /// The symbol containing the link-time address `svma`.
    ///
    /// With `strict`, a zero-size symbol matches only its own address (glibc's `dladdr` rule);
    /// otherwise the nearest lower zero-size symbol extends to the next symbol.
    ///
    /// # Async-signal safety
    /// Binary search; no allocation, no panic. The name is not decoded here.
    pub(crate) fn lookup(&self, svma: u64, strict: bool) -> Option<Found> {
        let names = self.names?;
        let rel = svma.checked_sub(self.base)?;
        let rel = u32::try_from(rel).ok()?;
        // The symbols starting in rel's page lie in pages[p].first..pages[p + 1].first; every
        // symbol before pages[p].first starts below rel.
        let p = (rel >> self.shift.min(31)) as usize;
        let (lo, hi) = match self.pages.get(p) {
            Some(page) => {
                for s in page.s {
                    // (Not `wrapping_sub`: a shortcut may start above `rel`, and a size cut to
                    // u32::MAX, from a corrupt file, must not make it cover what lies below.)
                    if rel.checked_sub(s.start).is_some_and(|d| d < s.size) {
                        return Some(self.found(s, names));
                    }
                }
                let hi = self
                    .pages
                    .get(p + 1)
                    .map_or(self.syms.len(), |n| n.first as usize);
                (page.first as usize, hi)
            }
            None => (self.syms.len(), self.syms.len()),
        };
        self.search(rel, strict, lo, hi)
            .map(|s| self.found(s, names))
    }

    /// The symbol containing `rel`, by binary search in `syms[lo..hi]` (the whole table if the
    /// range is not in it) and a bounded scan back.
    fn search(&self, rel: u32, strict: bool, lo: usize, hi: usize) -> Option<Sym> {
        let i = match self.syms.get(lo..hi) {
            Some(window) => lo + window.partition_point(|s| s.start <= rel),
            None => self.syms.partition_point(|s| s.start <= rel),
        };
        let lo = i.saturating_sub(SCAN_BACK);
        for j in (lo..i).rev() {
            let s = *self.syms.get(j)?;
            let hit = if s.name == BOUNDARY {
                false
            } else if s.size == 0 {
                rel == s.start || (!strict && j + 1 == i)
            } else {
                rel - s.start < s.size
            };
            if hit {
                return Some(s);
            }
        }
        None
    }

    fn found(&self, s: Sym, names: &'static Names) -> Found {
        Found {
            start: self.base + u64::from(s.start),
            size: u64::from(s.size),
            name: SymbolName::new(names, s.name),
        }
    }
}

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

/// The file that holds an object's DWARF, and what identifies it, so that `lines` opens the
/// same file again (and refuses a different one) when it first needs file:line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DwarfFile {
    /// Path to open (`/proc/self/exe` for the main program).
    pub path: Box<str>,
    /// The build-id the file must carry (the object's), if the object has one.
    pub build_id: Option<Box<[u8]>>,
    /// The CRC32 the file must have (a `.gnu_debuglink` file of an object without build-id).
    pub crc: Option<u32>,
}

impl DwarfFile {
    /// Opens and parses the file if it is still the one that was chosen, and returns it with a
    /// second handle on the same open file, to read large sections with
    /// [`read_range`]. Normal context; the cache (headers only) is
    /// leaked so that what was read from it lives as long as the process.
    pub(crate) fn open(&self) -> Option<(Elf<'static, &'static Cache>, File)> {
        let file = open_file(&self.path)?;
        let data = file.try_clone().ok()?;
        let cache: &'static Cache = Box::leak(Box::new(Cache::new(file)?));
        let f = Elf::parse(cache).ok()?;
        if let Some(want) = self.build_id.as_deref() {
            if f.build_id().ok().flatten() != Some(want) {
                return None;
            }
        }
        if let Some(crc) = self.crc {
            if file_crc32(&self.path) != Some(crc) {
                return None;
            }
        }
        Some((f, data))
    }
}

/// `len` bytes at `offset` of `file`, read with `pread` into a zeroed (calloc'd) buffer;
/// `None` past the end of the file.
pub(crate) fn read_range(file: &File, offset: u64, len: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt as _;
    let size = file.metadata().ok()?.len();
    if offset.checked_add(len)? > size {
        return None;
    }
    let mut v = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut v, offset).ok()?;
    Some(v)
}

/// The symbols of one object, built once and never freed.
#[derive(Debug)]
pub(crate) struct ObjectSymbols {
    /// Every function symbol (`.symtab`, else `.dynsym`) and the PLT stubs.
    full: Table,
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

/// What identifies an object across snapshots.
#[derive(PartialEq, Eq)]
struct Key {
    path: Box<str>,
    build_id: Box<[u8]>,
    glibc_path: Box<str>,
    /// Another file at the same path (rebuilt, without a build-id or with the same one) is
    /// another object.
    file: Option<crate::modules::FileId>,
}

/// An object's place in the index: what identifies it (known at once) and its tables, built
/// when the object is first seen or by the background indexer ([`super::background`]). Never
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

/// Every object ever seen, for reuse (normal context only). A forked child takes it over from a
/// thread of the parent that held it and starts over (the slots it leaks stay valid).
static CACHE: crate::fork::ForkMutex<Vec<(Key, &'static Slot)>> =
    crate::fork::ForkMutex::new(Vec::new());

/// Before a fork: holds the object cache, waiting until `deadline` at most.
pub(crate) fn before_fork(deadline: u64) {
    CACHE.hold_for_fork(deadline, Vec::new);
}

/// After a fork: releases what [`before_fork`] took.
pub(crate) fn after_fork_release() {
    CACHE.release_after_fork();
}

/// Directories searched for separate debug files, in order: `$SELFTRACE_DEBUG_DIR` (if set),
/// then `/usr/lib/debug`.
fn debug_roots() -> Vec<String> {
    let mut roots = Vec::new();
    if let Some(d) = std::env::var_os("SELFTRACE_DEBUG_DIR") {
        roots.push(d.to_string_lossy().into_owned());
    }
    roots.push("/usr/lib/debug".to_string());
    roots
}

/// The slot of a loaded object: from the cache, or new, its tables built now or, for an
/// object that maps at least `background` bytes, queued for the background indexer. Normal
/// context only.
pub(crate) fn for_object(o: &crate::modules::Object, background: usize) -> &'static Slot {
    let glibc_path = glibc_name(o);
    let key = Key {
        path: o.path.as_str().into(),
        build_id: o.build_id.clone().unwrap_or_default().into(),
        glibc_path: glibc_path.as_str().into(),
        file: o.file,
    };
    let later = !o.is_vdso && o.range.len() >= background;
    let mut cache = CACHE.lock_or_reset(Vec::new);
    if let Some(&(_, slot)) = cache.iter().find(|(k, _)| *k == key) {
        drop(cache);
        // Another thread may be building it now (a concurrent `init`): a table that is not
        // for the background indexer is there when this returns, as if built here.
        if !later {
            super::background::wait(slot);
        }
        return slot;
    }
    // Claimed now by this thread if it builds the tables itself, before any other thread
    // can find the slot in the cache.
    let builder = if later { 0 } else { super::background::me() };
    let slot: &'static Slot = Box::leak(Box::new(Slot {
        path: key.path.clone(),
        glibc_path: key.glibc_path.clone(),
        build_id: key.build_id.clone(),
        object: o.clone(),
        debug_roots: debug_roots().into(),
        builder: AtomicU64::new(builder),
        changed: AtomicU32::new(0),
        next: AtomicPtr::new(core::ptr::null_mut()),
        tables: AtomicPtr::new(core::ptr::null_mut()),
    }));
    cache.push((key, slot));
    drop(cache);
    if later {
        super::background::queue(slot);
    } else {
        super::background::build_now(slot);
    }
    slot
}

/// The name glibc's `dladdr` gives an object.
fn glibc_name(o: &crate::modules::Object) -> String {
    if o.is_vdso {
        "linux-vdso.so.1".to_string()
    } else if o.is_main {
        std::env::args_os()
            .next()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        o.path.clone()
    }
}

/// The tables of `o`. Normal context (reads files, allocates).
pub(crate) fn build(o: &crate::modules::Object, debug_roots: &[String]) -> ObjectSymbols {
    let mut out = ObjectSymbols::empty();
    if o.is_vdso {
        // The image starts at its ELF header (AT_SYSINFO_EHDR); the section headers lie past
        // the end of the PT_LOAD, in the rest of its last page.
        let ps = crate::sys::page_size();
        let start = crate::sys::vdso_base();
        if start == 0 || start > o.range.start {
            return out;
        }
        let len = (o.range.end - start).div_ceil(ps) * ps;
        // SAFETY: the vDSO is one ELF image mapped in whole pages from its ELF header on, so
        // the page-rounded range up to the end of its PT_LOAD is readable; it stays mapped for
        // the life of the process and no file backs it.
        let image: &'static [u8] = unsafe { core::slice::from_raw_parts(start as *const u8, len) };
        if let Ok(f) = Elf::<&'static [u8]>::parse(image) {
            let mut full = table(&f, false, &[]);
            if full.syms.is_empty() {
                full = table(&f, true, &[]);
            }
            let exported = table(&f, true, &[]);
            (out.full, out.exported) = finish(full, exported, &[]);
            out.source = SymbolSource::Memory;
        }
        return out;
    }
    let open_path = if o.is_main {
        // Works even when the program's file was deleted or replaced after exec.
        "/proc/self/exe".to_string()
    } else {
        o.path.clone()
    };
    let Some(cache) = open_cache(&open_path) else {
        return out;
    };
    let Ok(f) = Elf::parse(&cache) else {
        return out;
    };
    let want_id = o.build_id.as_deref();
    let have_id = f.build_id().ok().flatten();
    if let (Some(want), Some(have)) = (want_id, have_id) {
        if want != have {
            // The file on disk is not the object that was loaded.
            return out;
        }
    }
    let id = want_id.or(have_id);
    let plt = plt_symbols(&f);
    if has_debug_info(&f) {
        out.dwarf = Some(DwarfFile {
            path: open_path.as_str().into(),
            build_id: id.map(Into::into),
            crc: None,
        });
    }
    let mut full = Draft::default();
    // Whether the tables came from a debug file (finished while its cache was open).
    let mut done = false;
    if !f.elf_symbol_table().is_empty() {
        full = table(&f, false, &plt);
        out.source = SymbolSource::Symtab;
    }
    if full.syms.is_empty() || out.dwarf.is_none() {
        if let Some((path, crc, dbg_cache)) = find_debug_file(&o.path, id, &f, debug_roots) {
            if let Ok(dbg) = Elf::parse(&dbg_cache) {
                if full.syms.is_empty() && !dbg.elf_symbol_table().is_empty() {
                    // The debug file's names outlive its cache: copied into the store now.
                    let d = table(&dbg, false, &plt);
                    let exported = table(&f, true, &[]);
                    (out.full, out.exported) = finish(d, exported, &plt);
                    out.source = SymbolSource::DebugFile;
                    done = !out.full.syms.is_empty();
                }
                if out.dwarf.is_none() && has_debug_info(&dbg) {
                    out.dwarf = Some(DwarfFile {
                        path: path.as_str().into(),
                        build_id: id.map(Into::into),
                        crc,
                    });
                }
                out.debug_path = Some(path.into());
            }
        }
    }
    if done {
        return out;
    }
    let dynamic_only = full.syms.is_empty();
    if dynamic_only {
        full = table(&f, true, &plt);
        out.source = SymbolSource::None;
    }
    let exported = table(&f, true, &[]);
    if dynamic_only && !exported.syms.is_empty() {
        out.source = SymbolSource::Dynsym;
    }
    (out.full, out.exported) = finish(full, exported, &plt);
    out
}

/// Opens a regular file for reading through a [`Cache`] (`None` for anything else: a FIFO or
/// a device would block or never end).
pub(crate) fn open_cache(path: &str) -> Option<Cache> {
    open_file(path).and_then(Cache::new)
}

/// Opens a regular file for reading (`None` for anything else).
fn open_file(path: &str) -> Option<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblock()
        .open(path)
        .ok()?;
    file.metadata().ok().filter(|m| m.is_file())?;
    Some(file)
}

/// `O_NONBLOCK | O_CLOEXEC` on open, so that opening a FIFO does not wait for a writer.
trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt as _;
        self.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}

fn has_debug_info<'d, R: ReadRef<'d>>(f: &Elf<'d, R>) -> bool {
    f.section_by_name(".debug_info")
        .is_some_and(|s| s.kind() != object::SectionKind::UninitializedData && s.size() > 0)
}

/// The CRC32 (IEEE 802.3, as `.gnu_debuglink` uses) of a whole file, read in chunks.
pub(crate) fn file_crc32(path: &str) -> Option<u32> {
    let mut f = open_cache(path)?.into_inner();
    let mut table = [0u32; 256];
    for (i, e) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *e = c;
    }
    let mut crc = !0u32;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        for &b in buf.get(..n)? {
            let k = ((crc ^ u32::from(b)) & 0xff) as usize;
            crc = table.get(k).copied().unwrap_or(0) ^ (crc >> 8);
        }
    }
    Some(!crc)
}

/// Finds a separate debug file for `path`, by build-id, then by `.gnu_debuglink`, and returns
/// it with the CRC it was checked against (debuglink only). A build-id file is used only when
/// its build-id equals the object's; a debuglink file only when its CRC32 is the one the link
/// names (and, when both carry build-ids, they are equal).
fn find_debug_file<'d, R: ReadRef<'d>>(
    path: &str,
    build_id: Option<&[u8]>,
    f: &Elf<'d, R>,
    roots: &[String],
) -> Option<(String, Option<u32>, Cache)> {
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        for r in roots {
            let c = format!("{r}/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
            let Some(cache) = open_cache(&c) else {
                continue;
            };
            let same = Elf::parse(&cache)
                .ok()
                .and_then(|d| d.build_id().ok().flatten().map(|h| h == id))
                == Some(true);
            if same {
                return Some((c, None, cache));
            }
        }
    }
    let Ok(Some((name, crc))) = f.gnu_debuglink() else {
        return None;
    };
    let name = core::str::from_utf8(name).ok()?;
    if name.contains('/') {
        return None;
    }
    let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or(".");
    let mut candidates = vec![format!("{dir}/{name}"), format!("{dir}/.debug/{name}")];
    for r in roots {
        candidates.push(format!("{r}{dir}/{name}"));
    }
    for c in candidates {
        if file_crc32(&c) != Some(crc) {
            continue;
        }
        let Some(cache) = open_cache(&c) else {
            continue;
        };
        let ok = match Elf::parse(&cache) {
            Ok(d) => match (build_id, d.build_id()) {
                (Some(want), Ok(Some(have))) => want == have,
                _ => true,
            },
            Err(_) => false,
        };
        if ok {
            return Some((c, Some(crc), cache));
        }
    }
    None
}

/// A synthetic symbol: link-time address, size, name.
type Synthetic = (u64, u64, Vec<u8>);

/// PLT stubs named `name@plt`, as objdump and gdb name them: each entry of `.plt`, `.plt.sec`
/// and `.plt.got` jumps through a GOT slot, and the dynamic relocation of that slot names the
/// function. Entries whose slot has no such relocation (the PLT header) get no name. The
/// instructions are decoded by the file's machine (see [`plt_x86_64`] and [`plt_aarch64`]), so a
/// file of either is named on any host.
fn plt_symbols<'d, R: ReadRef<'d>>(f: &Elf<'d, R>) -> Vec<Synthetic> {
    let mut out = Vec::new();
    let endian = f.endian();
    let machine = f.elf_header().e_machine(endian);
    let (jump_slot, glob_dat) = match machine {
        elf::EM_X86_64 => (elf::R_X86_64_JUMP_SLOT, elf::R_X86_64_GLOB_DAT),
        elf::EM_AARCH64 => (elf::R_AARCH64_JUMP_SLOT, elf::R_AARCH64_GLOB_DAT),
        _ => return out,
    };
    let data = f.data();
    let sections = f.elf_section_table();
    let dynsym = f.elf_dynamic_symbol_table();
    let dynstr = sections
        .section(dynsym.string_section())
        .ok()
        .and_then(|s| s.data(endian, data).ok())
        .unwrap_or(&[]);
    // GOT slot -> name.
    let mut slots: Vec<(u64, &[u8])> = Vec::new();
    for sh in sections.iter() {
        if sh.sh_type(endian) != elf::SHT_RELA {
            continue;
        }
        let Ok(Some((relas, _))) = sh.rela(endian, data) else {
            continue;
        };
        for r in relas {
            let ty = r.r_type(endian, false);
            if ty != jump_slot && ty != glob_dat {
                continue;
            }
            let idx = r.r_sym(endian, false) as usize;
            let Ok(sym) = dynsym.symbol(object::SymbolIndex(idx)) else {
                continue;
            };
            let name = dynstr.get(sym.st_name(endian) as usize..).unwrap_or(&[]);
            let name = name.get(..crate::sys::strnlen(name)).unwrap_or(&[]);
            if !name.is_empty() {
                slots.push((r.r_offset(endian), name));
            }
        }
    }
    slots.sort_unstable_by_key(|s| s.0);
    let slot_name = |slot: u64| {
        let k = slots.binary_search_by_key(&slot, |s| s.0).ok()?;
        slots.get(k).map(|s| s.1)
    };
    for sh in sections.iter() {
        let sname = sections.section_name(endian, sh).unwrap_or(&[]);
        if !matches!(sname, b".plt" | b".plt.sec" | b".plt.got")
            || sh.sh_type(endian) != elf::SHT_PROGBITS
        {
            continue;
        }
        let Ok(bytes) = sh.data(endian, data) else {
            continue;
        };
        let addr = sh.sh_addr(endian);
        let entries = match machine {
            elf::EM_AARCH64 => plt_aarch64(bytes, addr),
            _ => plt_x86_64(bytes, addr, sh.sh_entsize(endian)),
        };
        for (start, size, slot) in entries {
            if let Some(name) = slot_name(slot) {
                let mut n = name.to_vec();
                n.extend_from_slice(b"@plt");
                out.push((start, size, n));
            }
        }
    }
    out
}

/// x86-64 PLT entries (16 bytes, or 8 in `.plt.got`) and the GOT slot each jumps through
/// (`jmp *disp(%rip)`, `ff 25`): (start, size, slot).
pub(crate) fn plt_x86_64(bytes: &[u8], addr: u64, entsize: u64) -> Vec<(u64, u64, u64)> {
    let ent = match entsize {
        8 => 8,
        _ => 16,
    };
    let mut out = Vec::new();
    // A section whose addresses wrap around is not code anybody runs (a hostile file).
    if addr.checked_add(bytes.len() as u64).is_none() {
        return out;
    }
    for (i, entry) in bytes.chunks(ent).enumerate() {
        let start = addr + (i * ent) as u64;
        let slot = entry.windows(6).enumerate().find_map(|(p, w)| {
            if w.first() != Some(&0xff) || w.get(1) != Some(&0x25) {
                return None;
            }
            let disp = i32::from_le_bytes(w.get(2..6)?.try_into().ok()?);
            let next = start + p as u64 + 6;
            Some(next.wrapping_add(disp as i64 as u64))
        });
        if let Some(slot) = slot {
            out.push((start, entry.len() as u64, slot));
        }
    }
    out
}

/// aarch64 PLT entries and the GOT slot each jumps through: `adrp x16, page; ldr x17, [x16,
/// #off]; add x16, x16, #off; br x17` (16 bytes after the 32-byte header; `bti c` first where the
/// linker adds branch protection): (start, size, slot). The size runs to the next entry.
pub(crate) fn plt_aarch64(bytes: &[u8], addr: u64) -> Vec<(u64, u64, u64)> {
    /// `adrp x16, ...` with its immediate masked out.
    const ADRP_X16: (u32, u32) = (0x9f00_001f, 0x9000_0010);
    /// `ldr x17, [x16, #imm12 * 8]` with the immediate masked out.
    const LDR_X17_X16: (u32, u32) = (0xffc0_03ff, 0xf940_0211);
    /// `bti c`.
    const BTI_C: u32 = 0xd503_245f;
    // A section whose addresses wrap around is not code anybody runs (a hostile file).
    let Some(end) = addr.checked_add(bytes.len() as u64) else {
        return Vec::new();
    };
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let mut found: Vec<(u64, u64)> = Vec::new();
    for i in 0..words.len().saturating_sub(1) {
        let (w, w2) = (words[i], words[i + 1]);
        if w & ADRP_X16.0 != ADRP_X16.1 || w2 & LDR_X17_X16.0 != LDR_X17_X16.1 {
            continue;
        }
        let pc = addr + 4 * i as u64;
        // immhi (bits 5-23) : immlo (bits 29-30), a signed count of 4 KiB pages.
        let imm = (((w >> 5) & 0x7ffff) << 2 | (w >> 29) & 3) as u64;
        let pages = ((imm << 43) as i64 >> 43) as u64;
        let page = (pc & !0xfff).wrapping_add(pages << 12);
        let slot = page.wrapping_add(((w2 >> 10) & 0xfff) as u64 * 8);
        let start = if i > 0 && words[i - 1] == BTI_C {
            pc - 4
        } else {
            pc
        };
        found.push((start, slot));
    }
    (0..found.len())
        .map(|k| {
            let (start, slot) = found[k];
            let next = found
                .get(k + 1)
                .map_or(end.min(start.saturating_add(16)), |n| n.0);
            (start, next.saturating_sub(start).max(4), slot)
        })
        .collect()
}

/// A table being built: sorted entries (each non-boundary entry's `name` is the index of its
/// name in `names`, in the order of the entries) and where their names are.
#[derive(Default)]
struct Draft<'d> {
    base: u64,
    syms: Vec<Sym>,
    names: Vec<NameAt>,
    /// The string table the names' offsets refer to.
    strtab: &'d [u8],
}

/// Where an entry's name is.
#[derive(Clone, Copy)]
enum NameAt {
    /// In the string table: offset and length (cut at [`MAX_NAME`]).
    Str(u32, u16),
    /// A synthetic symbol's (see [`table`]'s `synthetic`).
    Synthetic(u32),
}

impl<'d> Draft<'d> {
    /// The bytes of each entry's name, in order.
    fn name_bytes<'a>(&'a self, synthetic: &'a [Synthetic]) -> impl Iterator<Item = &'a [u8]> {
        self.names.iter().map(move |&at| match at {
            NameAt::Str(off, len) => {
                let off = off as usize;
                self.strtab.get(off..off + usize::from(len)).unwrap_or(&[])
            }
            NameAt::Synthetic(j) => synthetic.get(j as usize).map_or(&[][..], |s| &s.2[..]),
        })
    }
}

/// An object's two tables, with one store for the names of both (the exported names are
/// mostly the full table's): `synthetic` is what `full` was built with.
fn finish(full: Draft<'_>, exported: Draft<'_>, synthetic: &[Synthetic]) -> (Table, Table) {
    let mut all: Vec<&[u8]> = full.name_bytes(synthetic).collect();
    let nfull = all.len();
    // Where each exported name is in `all`: the full table's name of the symbol at the same
    // address if it is the same name, else a name of its own, added.
    let starts: Vec<u64> = full
        .syms
        .iter()
        .filter(|s| s.name != BOUNDARY)
        .map(|s| full.base + u64::from(s.start))
        .collect();
    let exported_syms = exported.syms.iter().filter(|s| s.name != BOUNDARY);
    let exported_at: Vec<usize> = exported_syms
        .zip(exported.name_bytes(&[]))
        .map(|(s, name)| {
            let start = exported.base + u64::from(s.start);
            let k = starts.partition_point(|&a| a < start);
            let same = (k..nfull)
                .take_while(|&k| starts[k] == start)
                .find(|&k| all[k] == name);
            same.unwrap_or_else(|| {
                all.push(name);
                all.len() - 1
            })
        })
        .collect();
    let (names, ids) = Names::build(&all);
    drop(all);
    let names: &'static Names = Box::leak(Box::new(names));
    let table = |d: Draft<'_>, ids: &mut dyn Iterator<Item = u32>| {
        let mut syms = d.syms;
        for s in syms.iter_mut().filter(|s| s.name != BOUNDARY) {
            s.name = ids.next().unwrap_or(BOUNDARY);
        }
        if syms.is_empty() {
            Table::default()
        } else {
            Table::new(d.base, syms, names)
        }
    };
    (
        table(full, &mut ids.iter().copied()),
        table(
            exported,
            &mut exported_at
                .iter()
                .map(|&j| ids.get(j).copied().unwrap_or(BOUNDARY)),
        ),
    )
}

/// Builds a draft table from `.symtab` (`dynamic == false`) or `.dynsym`, plus `synthetic`
/// symbols (PLT stubs). Unless `dynamic` (glibc's `dladdr` rules), the end of every section
/// that holds a symbol is a boundary: no symbol covers an address outside its own section. The
/// names stay in the string table, read through `f`'s reader (memory selftrace owns), until
/// [`finish`] front-codes them.
fn table<'d, R: ReadRef<'d>>(f: &Elf<'d, R>, dynamic: bool, synthetic: &[Synthetic]) -> Draft<'d> {
    let endian = f.endian();
    let data = f.data();
    let sections = f.elf_section_table();
    let symtab = if dynamic {
        f.elf_dynamic_symbol_table()
    } else {
        f.elf_symbol_table()
    };
    if symtab.is_empty() && synthetic.is_empty() {
        return Draft::default();
    }
    let symbols = symtab.symbols();
    let strtab: &'d [u8] = sections
        .section(symtab.string_section())
        .ok()
        .and_then(|s| s.data(endian, data).ok())
        .filter(|b| u32::try_from(b.len()).is_ok())
        .unwrap_or(&[]);
    let nsyms = symbols.len() as u64;
    // (start, rank << 56 | index): lower rank wins at equal start, then the lower index; index
    // `i < nsyms` is `symbols[i]`, `nsyms + j` is `synthetic[j]`; rank `u8::MAX` is a section
    // end.
    let mut raw: Vec<(u64, u64)> = Vec::with_capacity(symbols.len() + 2 * synthetic.len() + 16);
    let mut ends: Vec<u64> = Vec::new();
    // The section of the symbol before, whose end is in `ends` already.
    let mut last_section = None;
    for (i, s) in symbols.iter().enumerate() {
        let shndx = s.st_shndx(endian);
        let ty = s.st_type();
        if shndx == elf::SHN_UNDEF || shndx == elf::SHN_ABS || s.st_name(endian) == 0 {
            continue;
        }
        // A name that is empty or outside the string table (a corrupt file): no name is
        // given there, and a boundary keeps the symbol before from extending over it.
        if strtab
            .get(s.st_name(endian) as usize)
            .is_none_or(|&b| b == 0)
        {
            raw.push((s.st_value(endian), u64::from(u8::MAX) << 56));
            continue;
        }
        let section = sections
            .section(object::SectionIndex(usize::from(shndx.0)))
            .ok();
        let exec = || section.is_some_and(|sh| sh.sh_flags(endian).contains(elf::SHF_EXECINSTR));
        let rank = if dynamic {
            // glibc's dladdr: every defined symbol but TLS, first in table order wins.
            match ty {
                elf::STT_TLS | elf::STT_SECTION | elf::STT_FILE => continue,
                _ => 0,
            }
        } else {
            let kind = match ty {
                elf::STT_FUNC | elf::STT_GNU_IFUNC => 0,
                elf::STT_NOTYPE if exec() => 2,
                _ => continue,
            };
            let bind = match s.st_bind() {
                elf::STB_GLOBAL => 0,
                elf::STB_WEAK => 1,
                _ => 2,
            };
            let unsized_ = u8::from(s.st_size(endian) == 0);
            unsized_ * 8 + kind + bind
        };
        if !dynamic && last_section != Some(shndx) {
            last_section = Some(shndx);
            if let Some(sh) = section {
                let end = sh.sh_addr(endian).saturating_add(sh.sh_size(endian));
                if !ends.contains(&end) {
                    ends.push(end);
                }
            }
        }
        raw.push((s.st_value(endian), u64::from(rank) << 56 | i as u64));
    }
    for (j, (start, size, _)) in synthetic.iter().enumerate() {
        raw.push((*start, 1 << 56 | (nsyms + j as u64)));
        if !dynamic {
            ends.push(start.saturating_add(*size));
        }
    }
    for end in ends {
        raw.push((end, u64::from(u8::MAX) << 56));
    }
    if raw.is_empty() {
        return Draft::default();
    }
    raw.sort_unstable();
    raw.dedup_by_key(|e| e.0);
    let base = raw.first().map_or(0, |e| e.0);
    let mut syms = Vec::with_capacity(raw.len());
    let mut names = Vec::with_capacity(raw.len());
    for &(start, key) in &raw {
        let Ok(rel) = u32::try_from(start - base) else {
            continue;
        };
        let i = key & ((1 << 56) - 1);
        let (size, name) = if key >> 56 == u64::from(u8::MAX) {
            (0, None)
        } else if let Some(s) = symbols.get(i as usize).filter(|_| i < nsyms) {
            let at = s.st_name(endian);
            let rest = strtab.get(at as usize..).unwrap_or(&[]);
            let len = crate::sys::strnlen(rest).min(MAX_NAME);
            (s.st_size(endian), Some(NameAt::Str(at, len as u16)))
        } else {
            let j = (i - nsyms) as u32;
            let size = synthetic.get(j as usize).map_or(0, |s| s.1);
            (size, Some(NameAt::Synthetic(j)))
        };
        let id = match name {
            Some(n) => {
                names.push(n);
                names.len() as u32 - 1
            }
            None => BOUNDARY,
        };
        syms.push(Sym {
            start: rel,
            size: u32::try_from(size).unwrap_or(u32::MAX),
            name: id,
        });
    }
    Draft {
        base,
        syms,
        names,
        strtab,
    }
}

#[cfg(test)]
mod tests {

    /// `adrp x16, page` at `pc` and `ldr x17, [x16, #off]`: the two words of an aarch64 PLT
    /// entry that name its GOT slot.
    fn adrp_ldr(pc: u64, slot: u64) -> [u32; 2] {
        let pages = ((slot & !0xfff) as i64 - (pc & !0xfff) as i64) >> 12;
        let imm = pages as u32 & 0x1f_ffff;
        let adrp = 0x9000_0010 | (imm & 3) << 29 | (imm >> 2) << 5;
        let ldr = 0xf940_0211 | ((slot & 0xfff) as u32 / 8) << 10;
        [adrp, ldr]
    }

    #[test]
    fn aarch64_plt_entries_give_their_got_slots() {
        let base = 0x40_0000u64;
        let mut words = vec![
            // The header: stp x16, x30, [sp, #-16]!; adrp; ldr; add; br x17; nop; nop; nop.
            0xa9bf_7bf0,
        ];
        words.extend(adrp_ldr(base + 4, 0x41_0010));
        words.extend([
            0x9100_4210,
            0xd61f_0220,
            0xd503_201f,
            0xd503_201f,
            0xd503_201f,
        ]);
        // Two entries, the second one's GOT slot in an earlier page (a negative offset), then
        // one behind `bti c`.
        for (k, slot) in [0x41_0018u64, 0x3f_f020].iter().enumerate() {
            let pc = base + 32 + 16 * k as u64;
            words.extend(adrp_ldr(pc, *slot));
            words.extend([0x9100_0210, 0xd61f_0220]);
        }
        words.push(0xd503_245f);
        words.extend(adrp_ldr(base + 68, 0x41_0ff8));
        words.extend([0x9100_0210, 0xd61f_0220]);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let got = plt_aarch64(&bytes, base);
        assert_eq!(
            got,
            vec![
                (base + 4, 28, 0x41_0010),
                (base + 32, 16, 0x41_0018),
                (base + 48, 16, 0x3f_f020),
                (base + 64, 16, 0x41_0ff8),
            ]
        );
        // Garbage of any length decodes to something in range or nothing, never a panic.
        for n in 0..40 {
            let junk: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            for (start, size, _) in plt_aarch64(&junk, base) {
                assert!(start >= base && start + size <= base + n as u64 + 16);
            }
        }
    }
    use super::*;

    /// The store of `list` (leaked, as the index's are) and each name's id.
    fn store(list: &[&[u8]]) -> (&'static Names, Vec<u32>) {
        let (n, ids) = Names::build(list);
        (Box::leak(Box::new(n)), ids)
    }

    /// The name of the symbol `tab` finds for `svma`.
    fn named(tab: &Table, svma: u64, strict: bool) -> Option<Vec<u8>> {
        tab.lookup(svma, strict).map(|f| f.name.to_vec())
    }

    /// A table of symbols named `a`, `b`, `c`... in order (then `s26`, `s27`...).
    fn t(syms: &[(u32, u32)]) -> Table {
        let letters: Vec<Vec<u8>> = (0..syms.len())
            .map(|i| match u8::try_from(i) {
                Ok(i) if i < 26 => vec![b'a' + i],
                _ => format!("s{i}").into_bytes(),
            })
            .collect();
        let list: Vec<&[u8]> = letters.iter().map(Vec::as_slice).collect();
        let (names, ids) = store(&list);
        let syms = syms
            .iter()
            .zip(ids)
            .map(|(&(start, size), name)| Sym { start, size, name })
            .collect();
        Table::new(0x1000, syms, names)
    }

    #[test]
    fn lookup_respects_sizes_nesting_and_strictness() {
        let tab = t(&[(0, 0x10), (0x20, 0), (0x40, 0x40), (0x50, 0x8)]);
        assert_eq!(named(&tab, 0x1000, false).as_deref(), Some(&b"a"[..]));
        assert_eq!(named(&tab, 0x100f, false).as_deref(), Some(&b"a"[..]));
        assert!(tab.lookup(0x1010, false).is_none());
        assert_eq!(named(&tab, 0x1030, false).as_deref(), Some(&b"b"[..]));
        assert!(tab.lookup(0x1030, true).is_none());
        assert_eq!(named(&tab, 0x1020, true).as_deref(), Some(&b"b"[..]));
        assert_eq!(named(&tab, 0x1052, false).as_deref(), Some(&b"d"[..]));
        // Past the nested symbol, inside the outer one.
        assert_eq!(tab.lookup(0x1060, false).map(|f| f.start), Some(0x1040));
        assert!(tab.lookup(0x1080, false).is_none());
        assert!(tab.lookup(0, false).is_none());
        assert!(tab.lookup(u64::MAX, false).is_none());
        assert!(Table::default().lookup(0x1000, false).is_none());
    }

    #[test]
    fn page_directory_agrees_with_a_plain_binary_search() {
        // Symbols spread over many pages, some pages empty, some crowded; up to LONGEST bytes
        // long, so some overlap the next.
        const LONGEST: u32 = 40;
        let mut v = Vec::new();
        let mut at = 0u32;
        for i in 0..3000u32 {
            v.push((at, 1 + i % LONGEST));
            at += match i % 7 {
                0 => 5000,
                1 => 1,
                _ => 48,
            };
        }
        let tab = t(&v);
        assert!(tab.pages.len() <= tab.syms.len());
        for probe in (0..at as u64 + 9000).step_by(7) {
            let rel = probe as u32;
            // The symbols are sorted by start; only those starting less than LONGEST bytes
            // below the probe can contain it: the last of them that does.
            let want = v[..v.partition_point(|&(s, _)| s <= rel)]
                .iter()
                .rev()
                .take_while(|&&(s, _)| rel - s < LONGEST)
                .find(|&&(s, size)| rel - s < size)
                .map(|&(s, _)| u64::from(s) + 0x1000);
            let got = tab.lookup(0x1000 + probe, true).map(|f| f.start);
            // The plain search finds any containing symbol; ours scans back a bounded window,
            // which covers these non-nested symbols.
            assert_eq!(got, want, "{probe:#x}");
        }
    }

    #[test]
    fn page_shortcuts_give_the_binary_search_answer() {
        // Aliases, nested and overlapping symbols, zero sizes and section boundaries, spread
        // so that some pages are inside one large symbol and others crowded.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(n)) as u32
        };
        for round in 0..8 {
            let mut v: Vec<(u32, u32)> = Vec::new();
            let mut at = 0u32;
            for _ in 0..400 {
                let size = match next(6) {
                    0 => 0,
                    1 => 20_000 + next(40_000),
                    _ => 1 + next(300),
                };
                v.push((at, size));
                at += match next(5) {
                    0 => 0,
                    1 => size / 2,
                    _ => size + next(64),
                };
            }
            let mut tab = t(&v);
            let mut syms = tab.syms.to_vec();
            if round % 2 == 1 {
                for k in (0..syms.len()).step_by(37) {
                    syms[k].name = BOUNDARY;
                }
                tab = Table::new(0x1000, syms, tab.names.unwrap());
            }
            let shortcuts = tab.pages.iter().filter(|p| p.s[0].size > 0).count();
            assert!(
                shortcuts * 2 > tab.pages.len(),
                "{shortcuts} of {}",
                tab.pages.len()
            );
            // Around every symbol's start, middle and end and every page boundary (where a
            // shortcut begins or ends), and at random: few enough lookups for a debug build
            // under qemu.
            let mut probes: Vec<u32> = Vec::new();
            for s in tab.syms.iter() {
                let end = s.start.saturating_add(s.size);
                for a in [s.start, end, s.start + s.size / 2] {
                    probes.extend([a.saturating_sub(1), a, a.saturating_add(1)]);
                }
            }
            for p in 0..tab.pages.len() as u32 {
                let a = p << tab.shift;
                probes.extend([a.saturating_sub(1), a, a + 1]);
            }
            probes.extend((0..2000).map(|_| next(at + 70_000)));
            for rel in probes {
                for strict in [false, true] {
                    let want = tab.search(rel, strict, 0, tab.syms.len());
                    let got = tab.lookup(0x1000 + u64::from(rel), strict);
                    assert_eq!(
                        got.map(|f| (f.start, f.size, f.name.to_vec())),
                        want.map(|s| {
                            let n = SymbolName::new(tab.names.unwrap(), s.name);
                            (0x1000 + u64::from(s.start), u64::from(s.size), n.to_vec())
                        }),
                        "round {round} rel {rel:#x} strict {strict}"
                    );
                }
            }
        }
    }

    #[test]
    fn zero_size_symbols_stop_at_a_section_boundary() {
        let (names, ids) = store(&[b"a", b"b"]);
        let mut syms: Vec<Sym> = [(0u32, 0u32), (0x20, 0x10)]
            .iter()
            .zip(ids)
            .map(|(&(start, size), name)| Sym { start, size, name })
            .collect();
        // The first symbol's section ends at 0x8.
        syms.insert(
            1,
            Sym {
                start: 0x8,
                size: 0,
                name: BOUNDARY,
            },
        );
        let tab = Table::new(0x1000, syms, names);
        assert_eq!(named(&tab, 0x1004, false).as_deref(), Some(&b"a"[..]));
        assert!(tab.lookup(0x1008, false).is_none());
        assert!(tab.lookup(0x101f, false).is_none());
        assert_eq!(named(&tab, 0x1021, false).as_deref(), Some(&b"b"[..]));
    }

    #[test]
    fn both_tables_name_their_symbols_from_one_store() {
        let strtab: &[u8] = b"\0foo\0barbaz\0";
        let draft = |names: Vec<NameAt>, starts: &[u32]| {
            let mut k = 0;
            let syms = starts
                .iter()
                .map(|&start| {
                    let name = if start == 8 {
                        BOUNDARY
                    } else {
                        k += 1;
                        k - 1
                    };
                    Sym {
                        start,
                        size: 4,
                        name,
                    }
                })
                .collect();
            Draft {
                base: 0x1000,
                syms,
                names,
                strtab,
            }
        };
        let synthetic: Vec<Synthetic> = vec![(0x1010, 4, b"qux@plt".to_vec())];
        // The full table: foo, a boundary, barbaz, a PLT stub, a name past the table's end.
        let full = draft(
            vec![
                NameAt::Str(1, 3),
                NameAt::Str(5, 6),
                NameAt::Synthetic(0),
                NameAt::Str(999, 5),
            ],
            &[0, 8, 16, 20, 24],
        );
        // The exported table: barbaz again, and "baz" (a merged suffix of it).
        let exported = draft(vec![NameAt::Str(5, 6), NameAt::Str(8, 3)], &[16, 32]);
        let (full, exported) = finish(full, exported, &synthetic);
        let name = |t: &Table, a: u64| t.lookup(a, false).map(|f| f.name.to_vec());
        assert_eq!(name(&full, 0x1001), Some(b"foo".to_vec()));
        assert_eq!(name(&full, 0x1008), None, "a boundary");
        assert_eq!(name(&full, 0x1011), Some(b"barbaz".to_vec()));
        assert_eq!(name(&full, 0x1015), Some(b"qux@plt".to_vec()));
        assert_eq!(
            name(&full, 0x1019),
            Some(Vec::new()),
            "past the string table"
        );
        assert_eq!(name(&exported, 0x1011), Some(b"barbaz".to_vec()));
        assert_eq!(name(&exported, 0x1021), Some(b"baz".to_vec()));
        // One store: the same name has the same id in both tables.
        let (a, b) = (
            full.lookup(0x1011, false).map(|f| f.name),
            exported.lookup(0x1011, false).map(|f| f.name),
        );
        assert!(a.is_some() && a == b);
        assert_eq!(full.name_bytes(), exported.name_bytes());
    }
}
