//! File, line, column and inlined frames (addr2line over each object's DWARF), and the owned
//! [`Backtrace`]. Normal context only: everything here allocates.
//!
//! The DWARF of an object is read from the file the symbol index chose for it (the object
//! itself, or its separate debug file under `/usr/lib/debug/.build-id/` or by
//! `.gnu_debuglink`), parsed lazily by addr2line and cached per object for the life of the
//! process: the first lookup in an object pays for parsing its unit ranges, later ones cost
//! a few hundred nanoseconds.
//!
//! Size: over 600 lines (about 860 without tests, 136 of them docs): one idea, file:line and inlined
//! frames from DWARF, with the per-object DWARF cache that every lookup shares.
#![allow(unsafe_code)]

use super::index::ObjectSymbols;
use super::{frame_kind, lookup, Mode, SymbolName};
use crate::fmt::FixedBuf;
use crate::fork::ForkMutex;
use crate::unwind::WalkEnd;
use crate::unwind::{FrameKind, FrameKinds};
use addr2line::gimli;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

type Reader = gimli::EndianSlice<'static, gimli::RunTimeEndian>;
type Context = addr2line::Context<Reader>;

/// Parsed DWARF per object (keyed by the address of its never-freed `ObjectSymbols`), or why
/// there is none. Held while a context is used (addr2line's lazily filled contexts are not
/// `Sync`). A forked child takes it over from a thread of the parent that held it and starts
/// over (the contexts it leaks are never freed, as file names point into them).
static CONTEXTS: ForkMutex<Vec<(usize, ObjectDwarf)>> = ForkMutex::new(Vec::new());

/// An object's parsed DWARF, or why there is none.
type ObjectDwarf = Result<Box<Loaded>, NoLine>;

/// Why a frame has no file:line although its object is known: said by `Display`, crash
/// reports and profiles instead of leaving the line out silently.
///
/// An object whose DWARF was read but has no line for the address (a PLT stub, assembly
/// without line info) is not one of these: its frames simply have no line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoLine {
    /// Neither the object nor a debug file found for it has DWARF (`.debug_info`): it was
    /// built without debug info (for a Rust program: `debug = "line-tables-only"` or more in
    /// the profile, see docs/crash.md), or its debug package (Debian's `-dbg`, Fedora's
    /// `-debuginfo`) is not installed.
    NoDebugInfo,
    /// The file chosen for the object's DWARF when it was indexed could not be opened again,
    /// or is no longer the same file (its build-id or CRC changed: replaced on disk).
    DebugFileChanged,
    /// A debug section is compressed in a format this build cannot decompress.
    UnsupportedCompression {
        /// The section (`.debug_info`, ...).
        section: &'static str,
    },
    /// A debug section could not be read: past the end of the file, or its compressed data
    /// is corrupt (does not decompress to the size its header gives).
    Unreadable {
        /// The section (`.debug_info`, ...).
        section: &'static str,
    },
    /// The DWARF sections were read but could not be parsed.
    BadDwarf,
    /// The object's DWARF is split (`-gsplit-dwarf`, `-Csplit-debuginfo=unpacked`) and a
    /// `.dwo` file it names is missing, or is not the one its skeleton unit names (DWO id).
    /// `.dwp` packages are not read.
    SplitDwarfMissing {
        /// The `.dwo` file's path.
        dwo: &'static str,
    },
}

impl fmt::Display for NoLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoLine::NoDebugInfo => f.write_str("no debug info in this object"),
            NoLine::DebugFileChanged => {
                f.write_str("its debug file was replaced or removed since it was indexed")
            }
            NoLine::UnsupportedCompression { section } => {
                write!(
                    f,
                    "{section} is compressed in a format this build cannot read"
                )
            }
            NoLine::Unreadable { section } => {
                write!(f, "{section} cannot be read (truncated or corrupt)")
            }
            NoLine::BadDwarf => f.write_str("its DWARF cannot be parsed"),
            NoLine::SplitDwarfMissing { dwo } => write!(f, "its split DWARF file {dwo} is missing"),
        }
    }
}

/// Writes `name` demangled (Rust or C++) into `out`. Allocates (C++); normal context only.
pub(crate) fn demangle_any_to(name: &[u8], out: &mut FixedBuf<'_>) {
    match core::str::from_utf8(super::format::without_version(name)) {
        Ok(s) => out.push_str(&addr2line::demangle_auto(Cow::Borrowed(s), None)),
        Err(_) => out.push_bytes(name),
    }
}

/// An object's parsed DWARF, with its split DWARF units (`.dwo` files) by id.
struct Loaded {
    ctx: Context,
    dwos: Dwos,
}

impl Loaded {
    /// The frames (inlined ones first) at link-time address `svma`, split units answered from
    /// the `.dwo` files loaded with the object.
    fn find_frames(&self, svma: u64) -> Result<addr2line::FrameIter<'_, Reader>, gimli::Error> {
        use addr2line::LookupContinuation as _;
        let mut lookup = self.ctx.find_frames(svma);
        loop {
            match lookup {
                addr2line::LookupResult::Output(r) => return r,
                addr2line::LookupResult::Load { load, continuation } => {
                    let dwo = self.dwos.iter().find(|(id, _)| *id == load.dwo_id);
                    lookup = continuation.resume(dwo.map(|(_, d)| d.clone()));
                }
            }
        }
    }
}

/// The split units' DWARF (each `.dwo` file joined to its parent), by DWO id.
type Dwos = Vec<(gimli::DwoId, Arc<gimli::Dwarf<Reader>>)>;

/// Reads and parses an object's DWARF, and the `.dwo` files of its split units. Any section
/// that cannot be read (or decompressed) fails the whole object, and so does a `.dwo` that is
/// missing or not the one its skeleton unit names (by DWO id): half its DWARF could give wrong
/// lines (a skeleton unit's line table alone gives an inlined function's line under the name
/// of the function it is inlined into), which is worse than none.
fn load_context(src: &super::debug_file::DwarfFile) -> Result<Loaded, NoLine> {
    let dwarf = load_dwarf(src, false)?;
    let dwos = load_dwos(&dwarf)?;
    let ctx = Context::from_dwarf(dwarf).map_err(|_| NoLine::BadDwarf)?;
    Ok(Loaded { ctx, dwos })
}

/// The `.dwo` file of each split unit of `dwarf` (`DW_AT_dwo_name`, relative to
/// `DW_AT_comp_dir`), checked against the skeleton's DWO id and joined to its parent.
fn load_dwos(dwarf: &gimli::Dwarf<Reader>) -> Result<Dwos, NoLine> {
    let mut dwos = Vec::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(|_| NoLine::BadDwarf)? {
        let unit = dwarf.unit(header).map_err(|_| NoLine::BadDwarf)?;
        let Some(id) = unit.dwo_id else { continue };
        let name = unit
            .dwo_name()
            .ok()
            .flatten()
            .and_then(|n| dwarf.attr_string(&unit, n).ok())
            .and_then(|n| std::str::from_utf8(n.slice()).ok());
        let Some(name) = name else {
            return Err(NoLine::BadDwarf);
        };
        let mut path = std::path::PathBuf::new();
        if let Some(dir) = unit
            .comp_dir
            .and_then(|d| std::str::from_utf8(d.slice()).ok())
        {
            path.push(dir);
        }
        path.push(name);
        let missing = || NoLine::SplitDwarfMissing {
            dwo: Box::leak(path.to_string_lossy().into_owned().into_boxed_str()),
        };
        let Some(src) = path.to_str().map(|p| super::debug_file::DwarfFile {
            path: p.into(),
            build_id: None,
            crc: None,
        }) else {
            return Err(missing());
        };
        let mut dwo = load_dwarf(&src, true).map_err(|e| match e {
            NoLine::DebugFileChanged => missing(),
            e => e,
        })?;
        let first = dwo.units().next().ok().flatten();
        let dwo_unit = first.and_then(|h| dwo.unit(h).ok());
        if dwo_unit.and_then(|u| u.dwo_id) != Some(id) {
            return Err(missing());
        }
        dwo.make_dwo(dwarf);
        dwos.push((id, Arc::new(dwo)));
    }
    Ok(dwos)
}

/// Reads the DWARF sections of `src` (a `.dwo` file's `*.dwo` sections when `dwo`).
fn load_dwarf(
    src: &super::debug_file::DwarfFile,
    dwo: bool,
) -> Result<gimli::Dwarf<Reader>, NoLine> {
    use object::{Object as _, ObjectSection as _};
    // Read with pread into memory that is never freed (not mapped: a file truncated on disk
    // must not make a later lookup fault), and only if it is still the file the index chose.
    let (file, data) = src.open().ok_or(NoLine::DebugFileChanged)?;
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Reader, NoLine> {
        // Sections addr2line never reads (locations, macros, name indexes, type units):
        // skipping them saves decompressing megabytes of a compressed debug file.
        use gimli::SectionId as S;
        if matches!(
            id,
            S::DebugLoc
                | S::DebugLocLists
                | S::DebugMacinfo
                | S::DebugMacro
                | S::DebugPubNames
                | S::DebugPubTypes
                | S::DebugTypes
        ) {
            return Ok(gimli::EndianSlice::new(&[], endian));
        }
        let name = if dwo { id.dwo_name() } else { Some(id.name()) };
        let Some(section) = name else {
            return Ok(gimli::EndianSlice::new(&[], endian));
        };
        let Some(sec) = file.section_by_name(section) else {
            return Ok(gimli::EndianSlice::new(&[], endian));
        };
        // `SHF_COMPRESSED` (zlib, zstd) or GNU `.zdebug_*`: where the bytes are, and how.
        let range = sec.compressed_file_range().map_err(|_| {
            if unknown_compression(&file, &sec) {
                NoLine::UnsupportedCompression { section }
            } else {
                NoLine::Unreadable { section }
            }
        })?;
        if range.compressed_size == 0 || sec.kind() == object::SectionKind::UninitializedData {
            return Ok(gimli::EndianSlice::new(&[], endian));
        }
        // Read with one pread into a calloc'd buffer (not through the header cache, which
        // zero-fills byte by byte), decompressed if need be, kept with the cached context.
        let raw = super::debug_file::read_range(&data, range.offset, range.compressed_size)
            .ok_or(NoLine::Unreadable { section })?;
        let bytes: &'static [u8] = match range.format {
            object::CompressionFormat::None => Box::leak(raw.into_boxed_slice()),
            object::CompressionFormat::Zlib | object::CompressionFormat::Zstandard => {
                let c = object::read::CompressedData {
                    format: range.format,
                    data: &raw,
                    uncompressed_size: range.uncompressed_size,
                };
                match c.decompress() {
                    Ok(v) => Box::leak(v.into_owned().into_boxed_slice()),
                    Err(_) => return Err(NoLine::Unreadable { section }),
                }
            }
            _ => return Err(NoLine::UnsupportedCompression { section }),
        };
        Ok(gimli::EndianSlice::new(bytes, endian))
    };
    gimli::Dwarf::load(load)
}

/// Whether `sec` is `SHF_COMPRESSED` with a compression type other than zlib and zstd.
fn unknown_compression<'d, R: object::ReadRef<'d>>(
    file: &super::file::Elf<'d, R>,
    sec: &object::read::elf::ElfSection64<'d, '_, object::Endianness, R>,
) -> bool {
    use object::elf::{ELFCOMPRESS_ZLIB, ELFCOMPRESS_ZSTD};
    use object::read::elf::{CompressionHeader as _, SectionHeader as _};
    let endian = file.endian();
    match sec.elf_section_header().compression(endian, file.data()) {
        Ok(Some((h, _, _))) => !matches!(h.ch_type(endian), ELFCOMPRESS_ZLIB | ELFCOMPRESS_ZSTD),
        _ => false,
    }
}

/// For the fuzz harness ([`crate::fuzz::dwarf_lines`]): reads the DWARF of the ELF file at
/// `path` as [`load_context`] does for an object and looks up `addrs`; the frames found.
pub(crate) fn fuzz_lines(path: &str, addrs: &[u64]) -> Option<usize> {
    let src = super::debug_file::DwarfFile {
        path: path.into(),
        build_id: None,
        crc: None,
    };
    let loaded = load_context(&src).ok()?;
    let mut frames = 0;
    // As in `resolve_symbols`: the last address has no line.
    for &a in addrs.iter().filter(|&&a| a != u64::MAX) {
        let Ok(mut it) = loaded.find_frames(a) else {
            continue;
        };
        while let Ok(Some(f)) = it.next() {
            frames += 1;
            let _ = f.location.map(|l| (l.file, l.line));
        }
        let _ = loaded.ctx.find_location(a);
    }
    Some(frames)
}

/// Runs `f` with the cached DWARF context of `obj` (parsed on first use).
fn with_context<R>(obj: &'static ObjectSymbols, f: impl FnOnce(Result<&Loaded, NoLine>) -> R) -> R {
    let key = obj as *const ObjectSymbols as usize;
    let mut cache = CONTEXTS.lock_or_reset(Vec::new);
    let pos = match cache.iter().position(|(k, _)| *k == key) {
        Some(p) => p,
        None => {
            let ctx = match &obj.dwarf {
                Some(src) => load_context(src).map(Box::new),
                None => Err(NoLine::NoDebugInfo),
            };
            cache.push((key, ctx));
            cache.len() - 1
        }
    };
    match cache.get(pos) {
        Some((_, Ok(c))) => f(Ok(c)),
        Some((_, Err(e))) => f(Err(*e)),
        None => f(Err(NoLine::NoDebugInfo)),
    }
}

/// The DWARF of the code at runtime address `addr` (normal context): `f` gets the unit that
/// holds it and its link-time address; `None` when the address is in no indexed object, or its
/// object has no usable DWARF (the reason is then in `Err`). The object's DWARF context is
/// loaded on first use and kept (as for file:line); its lock is held while `f` runs, so `f`
/// must not symbolize.
#[cfg_attr(not(all(feature = "tokio", feature = "threads")), allow(dead_code))]
pub(crate) fn with_unit_at<R>(
    addr: usize,
    f: impl FnOnce(gimli::UnitRef<'_, Reader>, u64) -> R,
) -> Result<R, NoLine> {
    use addr2line::LookupContinuation as _;
    let sym = super::lookup_frame(addr, FrameKind::Exact, Mode::All).ok_or(NoLine::NoDebugInfo)?;
    let (obj, bias) = super::object_for(addr, &sym).ok_or(NoLine::NoDebugInfo)?;
    let svma = addr.wrapping_sub(bias) as u64;
    with_context(obj, |ctx| {
        let loaded = ctx?;
        let mut lookup = loaded.ctx.find_dwarf_and_unit(svma);
        loop {
            match lookup {
                addr2line::LookupResult::Output(Some(unit)) => return Ok(f(unit, svma)),
                addr2line::LookupResult::Output(None) => return Err(NoLine::NoDebugInfo),
                addr2line::LookupResult::Load { load, continuation } => {
                    let dwo = loaded.dwos.iter().find(|(id, _)| *id == load.dwo_id);
                    lookup = continuation.resume(dwo.map(|(_, d)| d.clone()));
                }
            }
        }
    })
}

/// One function at a frame: the physical function, or one inlined into it.
///
/// Resolved once per address and cached (frames share it through an `Arc`); a DWARF raw name
/// and the file name point into never-freed memory (the cached DWARF context), a symbol table's
/// name is a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BacktraceSymbol {
    /// Demangled name (Rust without hash, C++), if known.
    pub name: Option<String>,
    /// Raw (mangled) name, if known: the DWARF linkage name, or the symbol table's name.
    pub raw_name: Option<Cow<'static, str>>,
    /// Source file, if known.
    pub file: Option<&'static str>,
    /// Line, if known.
    pub line: Option<u32>,
    /// Column, if known.
    pub column: Option<u32>,
    /// This function was inlined into the next symbol of the frame.
    pub inlined: bool,
}

/// Demangles a raw name (Rust or C++).
fn demangle_owned(name: &str) -> String {
    let name =
        core::str::from_utf8(super::format::without_version(name.as_bytes())).unwrap_or(name);
    addr2line::demangle_auto(Cow::Borrowed(name), None).into_owned()
}

/// One frame of a [`Backtrace`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BacktraceFrame {
    /// The captured address (a return address unless `kind` is [`FrameKind::Exact`]).
    pub addr: usize,
    /// How the address was looked up.
    pub kind: FrameKind,
    /// Path of the containing object, if any.
    pub object: Option<&'static str>,
    /// `addr - bias`: the link-time address in the object (0 without an object).
    pub object_offset: usize,
    /// Functions at this frame, innermost (most deeply inlined) first; the last one is the
    /// physical function. Empty when nothing is known. Shared with the per-address cache.
    pub symbols: Arc<[BacktraceSymbol]>,
    /// Why the physical function has no file:line, where its object's DWARF is missing or
    /// could not be used (`None` when it has a line, or the DWARF has none for this address).
    pub no_line: Option<NoLine>,
}

/// Resolved frames by (object, link-time address): a warm `Backtrace` of a stack seen before
/// costs a hash lookup per frame.
struct FrameCache {
    map: HashMap<(usize, u64), Resolved, BuildHasherDefault<AddrHasher>>,
}

/// Entries kept before the frame cache starts over.
const FRAME_CACHE_MAX: usize = 1 << 16;

/// Taken over by a forked child from a thread of the parent that held it, and emptied.
static FRAME_CACHE: ForkMutex<Option<FrameCache>> = ForkMutex::new(None);

/// Before a fork: holds the DWARF contexts and the frame cache (in this order, as a lookup
/// takes them), waiting until `deadline` at most.
pub(crate) fn before_fork(deadline: u64) {
    if CONTEXTS.hold_for_fork(deadline, Vec::new) {
        FRAME_CACHE.hold_for_fork(deadline, || None);
    }
}

/// After a fork: releases what [`before_fork`] took.
pub(crate) fn after_fork_release() {
    FRAME_CACHE.release_after_fork();
    CONTEXTS.release_after_fork();
}

/// A multiplicative hasher for address keys.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// What one link-time address of an object resolves to: its functions (DWARF, and the symbol
/// table's name), and why it has no file:line where its object's DWARF could not be used.
#[derive(Clone)]
struct Resolved {
    symbols: Arc<[BacktraceSymbol]>,
    no_line: Option<NoLine>,
}

/// DWARF (and symbol table) view of one link-time address of an object.
fn resolve_symbols(obj: &'static ObjectSymbols, svma: u64, sym: Option<SymbolName>) -> Resolved {
    let mut out: Vec<BacktraceSymbol> = Vec::new();
    let mut no_line = with_context(obj, |ctx| {
        let loaded = match ctx {
            Ok(c) => c,
            Err(e) => return Some(e),
        };
        // No DWARF range [low, high) holds the last address (and addr2line computes svma + 1).
        if svma == u64::MAX {
            return None;
        }
        // Split units' `.dwo` files were loaded with the object: answered from there.
        let Ok(mut it) = loaded.find_frames(svma) else {
            return Some(NoLine::BadDwarf);
        };
        loop {
            let f = match it.next() {
                Ok(Some(f)) => f,
                Ok(None) => return None,
                // Frames found before the error stay (each is right as far as it goes).
                Err(_) => return Some(NoLine::BadDwarf),
            };
            let raw_name = f
                .function
                .as_ref()
                .and_then(|n| n.name.to_string().ok())
                .map(Cow::Borrowed);
            let (file, line, column) = match f.location {
                Some(l) => (
                    // SAFETY: the string is owned by the DWARF context of `obj`, which is boxed
                    // and never freed or moved (CONTEXTS only grows), so it lives as long as
                    // the process.
                    l.file.map(|f| unsafe { &*(f as *const str) }),
                    l.line,
                    l.column,
                ),
                None => (None, None, None),
            };
            out.push(BacktraceSymbol {
                name: None,
                raw_name,
                file,
                line,
                column,
                inlined: true,
            });
        }
    });
    let sym_name = sym.and_then(|n| String::from_utf8(n.to_vec()).ok().map(Cow::Owned));
    if let Some(last) = out.last_mut() {
        last.inlined = false;
        if last.raw_name.is_none() {
            last.raw_name = sym_name;
        }
    } else if sym_name.is_some() {
        out.push(BacktraceSymbol {
            name: None,
            raw_name: sym_name,
            file: None,
            line: None,
            column: None,
            inlined: false,
        });
    }
    for s in &mut out {
        s.name = s.raw_name.as_deref().map(demangle_owned);
    }
    // A reason is kept only where it explains a missing line.
    if out.last().is_some_and(|s| s.line.is_some()) {
        no_line = None;
    }
    Resolved {
        symbols: out.into(),
        no_line,
    }
}

impl BacktraceFrame {
    /// Resolves one captured address.
    pub fn resolve(addr: usize, kind: FrameKind) -> BacktraceFrame {
        BacktraceFrame::resolve_symbol(addr, kind, super::lookup_frame(addr, kind, Mode::All))
    }

    /// [`BacktraceFrame::resolve`] with the symbol already looked up.
    fn resolve_symbol(addr: usize, kind: FrameKind, sym: Option<super::Symbol>) -> BacktraceFrame {
        // An object that is not (or may not be) the one indexed there: nothing known.
        let sym = sym.filter(|s| !s.source.is_stale());
        let probe = sym.map_or(kind.lookup_address(addr), |s| s.addr);
        let mut frame = BacktraceFrame {
            addr,
            kind,
            object: sym.map(|s| s.path),
            object_offset: sym.map_or(0, |s| addr.wrapping_sub(s.bias)),
            symbols: Arc::from(Vec::new()),
            no_line: None,
        };
        let Some(sym) = sym else { return frame };
        let Some((obj, bias)) = super::object_for(probe, &sym) else {
            return frame;
        };
        let svma = probe.wrapping_sub(bias) as u64;
        let key = (obj as *const ObjectSymbols as usize, svma);
        // The cache is locked only to look and to insert, never while this thread waits for
        // the background indexer or reads DWARF: a second thread resolving the same address
        // meanwhile does the same work.
        let cache = || FRAME_CACHE.lock_or_reset(|| None);
        let hit = cache().as_ref().and_then(|c| c.map.get(&key).cloned());
        if let Some(hit) = hit {
            frame.symbols = hit.symbols;
            frame.no_line = hit.no_line;
            return frame;
        }
        let resolved = resolve_symbols(obj, svma, sym.name);
        let mut cache = cache();
        let cache = cache.get_or_insert_with(|| FrameCache {
            map: HashMap::default(),
        });
        if cache.map.len() >= FRAME_CACHE_MAX {
            cache.map.clear();
        }
        cache.map.insert(key, resolved.clone());
        frame.symbols = resolved.symbols;
        frame.no_line = resolved.no_line;
        frame
    }

    /// Functions at this frame, innermost (most deeply inlined) first; the last one is the
    /// physical function. Empty when nothing is known.
    pub fn symbols(&self) -> &[BacktraceSymbol] {
        &self.symbols
    }

    /// The physical function's demangled name, if known.
    pub fn name(&self) -> Option<&str> {
        self.symbols.last().and_then(|s| s.name.as_deref())
    }

    fn raw_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.symbols.iter().filter_map(|s| s.raw_name.as_deref())
    }
}

/// An owned stack, symbolized on first use: names, file:line:column, inlined frames.
///
/// [`Backtrace::capture`] walks and resolves at once; [`Backtrace::new_unresolved`] only walks
/// (cheap: no symbol or DWARF lookup), and the frames are resolved when they are first asked
/// for ([`Backtrace::frames`], `Display`) or by [`Backtrace::resolve`], as the `backtrace`
/// crate's `Backtrace::new_unresolved` does. The whole stack is kept, up to
/// [`crate::unwind::MAX_FRAMES`] frames; a walk that stopped early is said at the end of the
/// `Display` output ([`Backtrace::walk_end`]).
///
/// `Display` prints the short form (selftrace's own frames and the runtime's start-up frames
/// hidden, as Rust's panic backtraces do); the alternate form `{:#}` prints every frame with
/// its address and object.
///
/// Not async-signal-safe: capture and resolution allocate and read files. In a signal handler,
/// use [`crate::capture`] and [`crate::symbolize::write_kernel_frame`] instead.
#[derive(Clone, Debug)]
pub struct Backtrace {
    addrs: Vec<usize>,
    /// Which frames are exact pcs.
    kinds: Kinds,
    /// How the walk ended (`None` for addresses given by the caller).
    end: Option<WalkEnd>,
    /// Leading frames that belong to selftrace (hidden in the short form).
    own: usize,
    frames: std::sync::OnceLock<Vec<BacktraceFrame>>,
}

/// Where a [`Backtrace`]'s frame kinds come from.
#[derive(Clone, Copy, Debug)]
enum Kinds {
    /// The walk's record.
    Walk(FrameKinds),
    /// Addresses without a walk: frame 0 exact when `first_exact`, the others by reading the
    /// code before them ([`frame_kind`]).
    Guessed { first_exact: bool },
}

impl Kinds {
    fn get(&self, addrs: &[usize], i: usize) -> FrameKind {
        match *self {
            Kinds::Walk(k) => k.kind(addrs, i),
            Kinds::Guessed { first_exact } => frame_kind(addrs, i, first_exact),
        }
    }
}

impl Backtrace {
    /// Captures and symbolizes the current stack. Frame 0 of [`Backtrace::frames`] is inside
    /// selftrace (hidden in the short form); then the caller.
    #[inline(never)]
    pub fn capture() -> Backtrace {
        let bt = Backtrace::walk_here();
        bt.resolve_now();
        bt
    }

    /// Captures the current stack's addresses only; names and lines are looked up on first
    /// use.
    #[inline(never)]
    pub fn new_unresolved() -> Backtrace {
        Backtrace::walk_here()
    }

    /// Looks up every frame's names and lines now (a no-op once done).
    pub fn resolve(&mut self) {
        self.resolve_now();
    }

    fn resolve_now(&self) -> &[BacktraceFrame] {
        self.frames.get_or_init(|| {
            super::ensure_covers(&self.addrs);
            let kinds: Vec<FrameKind> = (0..self.addrs.len())
                .map(|i| self.kinds.get(&self.addrs, i))
                .collect();
            // The names first, all against one index the loader did not change under (see
            // `settled`), then the lines, outside the index.
            let syms: Vec<Option<super::Symbol>> = super::settled(|s| {
                self.addrs
                    .iter()
                    .zip(&kinds)
                    .map(|(&a, &k)| s.frame(a, k, Mode::All))
                    .collect()
            });
            self.addrs
                .iter()
                .zip(kinds)
                .zip(syms)
                .map(|((&a, k), sym)| BacktraceFrame::resolve_symbol(a, k, sym))
                .collect()
        })
    }

    /// Walks the stack into a buffer that grows until the walk ends (or reaches
    /// [`crate::unwind::MAX_FRAMES`]).
    #[inline(never)]
    fn walk_here() -> Backtrace {
        let mut addrs = vec![0usize; 256];
        let walk = loop {
            let walk = crate::unwind::Capture::new().walk(&mut addrs);
            if walk.end != WalkEnd::BufferFull || addrs.len() >= crate::unwind::MAX_FRAMES {
                break walk;
            }
            let grown = (addrs.len() * 4).min(crate::unwind::MAX_FRAMES);
            addrs = vec![0usize; grown];
        };
        addrs.truncate(walk.frames);
        let mine = [
            Backtrace::walk_here as fn() -> Backtrace as usize,
            Backtrace::capture as fn() -> Backtrace as usize,
            Backtrace::new_unresolved as fn() -> Backtrace as usize,
        ];
        let own = (0..addrs.len())
            .take_while(|&i| {
                let kind = walk.frame_kind(&addrs, i);
                lookup(kind.lookup_address(addrs[i]), Mode::All)
                    .is_some_and(|s| mine.contains(&s.start))
            })
            .count();
        Backtrace {
            addrs,
            kinds: Kinds::Walk(walk.frame_kinds()),
            end: Some(walk.end),
            own,
            frames: std::sync::OnceLock::new(),
        }
    }

    /// Symbolizes captured addresses: `first_exact` when frame 0 is an exact pc (a capture
    /// from a `ucontext_t`); frames after a signal trampoline are recognized as exact by
    /// reading the code before them ([`frame_kind`]). For addresses without their walk: with
    /// the [`Walk`](crate::Walk) of the capture, [`Backtrace::from_walk`] knows each frame's
    /// kind without reading code.
    pub fn from_addresses(addrs: &[usize], first_exact: bool) -> Backtrace {
        let bt = Backtrace {
            addrs: addrs.to_vec(),
            kinds: Kinds::Guessed { first_exact },
            end: None,
            own: 0,
            frames: std::sync::OnceLock::new(),
        };
        bt.resolve_now();
        bt
    }

    /// Symbolizes the frames of a capture, `addrs` being the buffer that `walk` filled (its
    /// first `walk.frames` entries are used): each frame's kind is the one the walk recorded
    /// ([`Walk::frame_kinds`](crate::Walk::frame_kinds)), and [`Backtrace::walk_end`] says how
    /// the walk ended.
    pub fn from_walk(addrs: &[usize], walk: &crate::unwind::Walk) -> Backtrace {
        let addrs = addrs.get(..walk.frames).unwrap_or(addrs);
        let bt = Backtrace {
            addrs: addrs.to_vec(),
            kinds: Kinds::Walk(walk.frame_kinds().truncated(addrs.len())),
            end: Some(walk.end),
            own: 0,
            frames: std::sync::OnceLock::new(),
        };
        bt.resolve_now();
        bt
    }

    /// The captured addresses, innermost first (return addresses, frame 0 and the frames after
    /// a signal trampoline exact).
    pub fn addresses(&self) -> &[usize] {
        &self.addrs
    }

    /// How the walk of a captured backtrace ended; `None` for [`Backtrace::from_addresses`].
    pub fn walk_end(&self) -> Option<WalkEnd> {
        self.end
    }

    /// Every frame, innermost first (resolved now if they were not).
    pub fn frames(&self) -> &[BacktraceFrame] {
        self.resolve_now()
    }

    /// The frames of the short form: without selftrace's leading frames, and ending before the
    /// runtime's start-up code (`__rust_begin_short_backtrace`, `std::rt::lang_start`, libc's
    /// `__libc_start_main`, `_start`, thread start routines).
    pub fn short_frames(&self) -> &[BacktraceFrame] {
        let rest = self.resolve_now().get(self.own..).unwrap_or(&[]);
        let mut end = rest.len();
        for (i, f) in rest.iter().enumerate() {
            // Raw names: plain C names, or Rust ones that contain these words when mangled.
            let runtime = f.raw_names().any(|n| {
                n.contains("__rust_begin_short_backtrace")
                    || n.contains("3std2rt10lang_start")
                    || n.starts_with("std::rt::lang_start")
            });
            let startup = f.raw_names().last().is_some_and(|n| {
                matches!(
                    n,
                    "__libc_start_call_main"
                        | "__libc_start_main"
                        | "__libc_start_main_impl"
                        | "_start"
                        | "start_thread"
                        | "clone"
                        | "clone3"
                        | "__clone"
                        | "__clone3"
                )
            });
            if runtime || startup {
                end = i;
                break;
            }
            if f.raw_names().last() == Some("main") {
                end = i + 1;
                break;
            }
        }
        rest.get(..end).unwrap_or(&[])
    }
}

impl fmt::Display for Backtrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = f.alternate();
        let frames = if full {
            self.frames()
        } else {
            self.short_frames()
        };
        for (i, fr) in frames.iter().enumerate() {
            write!(f, "{i:4}: ")?;
            if full {
                write!(f, "{:#018x} - ", fr.addr)?;
            }
            if fr.symbols.is_empty() {
                f.write_str("<unknown>")?;
                match fr.object {
                    Some(o) => writeln!(f, " [{}+{:#x}]", o, fr.object_offset)?,
                    None => writeln!(f)?,
                }
                continue;
            }
            for (j, s) in fr.symbols.iter().enumerate() {
                if j > 0 {
                    f.write_str(if full {
                        "                         "
                    } else {
                        "      "
                    })?;
                }
                f.write_str(s.name.as_deref().unwrap_or("<unknown>"))?;
                if s.inlined {
                    f.write_str(" [inlined]")?;
                }
                if full && j + 1 == fr.symbols.len() {
                    if let Some(o) = fr.object {
                        write!(
                            f,
                            " [{}+{:#x}]",
                            crate::modules::short_name(o),
                            fr.object_offset
                        )?;
                    }
                }
                writeln!(f)?;
                if let Some(file) = s.file {
                    write!(f, "             at {file}")?;
                    if let Some(l) = s.line {
                        write!(f, ":{l}")?;
                        if let Some(c) = s.column {
                            write!(f, ":{c}")?;
                        }
                    }
                    writeln!(f)?;
                } else if let (Some(why), true) = (fr.no_line, j + 1 == fr.symbols.len()) {
                    writeln!(f, "             (no file:line: {why})")?;
                }
            }
        }
        match self.end {
            Some(WalkEnd::Truncated(t)) => writeln!(f, "      (stack truncated: {t})")?,
            Some(WalkEnd::BufferFull) => writeln!(
                f,
                "      (stack truncated: deeper than {} frames)",
                crate::unwind::MAX_FRAMES
            )?,
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_cpp_and_rust_outside_signal_context() {
        let mut b = [0u8; 128];
        let mut w = FixedBuf::new(&mut b);
        demangle_any_to(b"_ZN3foo3barEv", &mut w);
        assert_eq!(w.as_str(), "foo::bar()");
        w.clear();
        demangle_any_to(b"_ZN4core3fmt5write17h0123456789abcdefE", &mut w);
        assert_eq!(w.as_str(), "core::fmt::write");
        w.clear();
        demangle_any_to(b"memcpy", &mut w);
        assert_eq!(w.as_str(), "memcpy");
        assert_eq!(
            demangle_owned("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
    }
}
