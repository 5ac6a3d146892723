//! Per-object symbol tables: sorted arrays of 12-byte entries over a pool of names that
//! selftrace owns.
//!
//! Built in normal context (it opens, reads and parses ELF files and allocates); looked up from
//! anywhere, including signal handlers (binary search over a slice, no allocation).
//!
//! Files are read into memory selftrace owns (through [`FileCache`](super::file::FileCache)),
//! never mapped, and the names of the indexed symbols are copied into a pool: nothing a lookup
//! touches can fault when a file is truncated or rewritten on disk after `init`.
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
//! Tables are never freed: a table is built once per distinct object (path + build-id) and
//! leaked, with its file mapping, so that a [`Symbol`](super::Symbol) can hold `'static`
//! references. dlopen/dlclose cycles of the same library reuse its table.
#![allow(unsafe_code)]

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, Rela as _, SectionHeader, Sym as _};
use object::read::ReadRef;
use object::{Endianness, Object as _, ObjectSection as _};
use std::fs::File;
use std::io::Read as _;
use std::sync::Mutex;

use super::file::ReadOwned;

/// An ELF file read with `pread` into buffers owned by the cache (never mapped).
pub(crate) type Cache = super::file::FileCache;
/// An ELF file parsed over a [`Cache`] or over memory.
pub(crate) type Elf<'d, R> = ElfFile64<'d, Endianness, R>;

/// One symbol: start (relative to the table's base), size, offset of its name in the string
/// table. 12 bytes (plus 2 for the name's length, kept in a parallel array).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Sym {
    start: u32,
    size: u32,
    name: u32,
}

/// A sorted symbol table over a string table in mapped memory.
///
/// A page directory narrows each binary search to the symbols of one address range:
/// `pages[p]` is the index of the first symbol at or after `p << shift` (relative to `base`).
/// `shift` is at least 12 (4 KiB) and grows so that the directory has at most one entry per two
/// symbols: at most 2 bytes per symbol on top of the 12-byte entries and 2-byte name lengths,
/// 16 bytes per symbol in all at most.
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// Link-time address that `Sym::start` is relative to.
    base: u64,
    syms: Box<[Sym]>,
    /// Name lengths, parallel to `syms` (`u16::MAX`: measure with `strnlen`).
    lens: Box<[u16]>,
    pages: Box<[u32]>,
    shift: u32,
    strtab: &'static [u8],
}

/// A symbol found in a [`Table`]: link-time start, size, raw name bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub start: u64,
    pub size: u64,
    pub name: &'static [u8],
}

/// `Sym::name` of a section boundary: the end of a section, which no zero-size symbol before it
/// extends past, and which never matches itself.
const BOUNDARY: u32 = u32::MAX;

/// Longest name copied into the pool (longer ones are cut).
const MAX_NAME: usize = 4096;

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
        self.syms.len() * (core::mem::size_of::<Sym>() + 2) + self.pages.len() * 4
    }

    /// Bytes of the names (the table's own pool).
    pub(crate) fn name_bytes(&self) -> usize {
        self.strtab.len()
    }

    /// A table over sorted `syms` whose names (of lengths `lens`, measured when they were
    /// copied: `u16::MAX` for none) lie in `strtab`, with its page directory.
    fn new(base: u64, syms: Vec<Sym>, lens: Vec<u16>, strtab: &'static [u8]) -> Table {
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
            pages.push(i as u32);
        }
        let mut lens = lens;
        lens.resize(syms.len(), u16::MAX);
        // Owned names: `strtab` is the table's own pool (or a static), never a file mapping.
        Table {
            base,
            syms: syms.into_boxed_slice(),
            lens: lens.into_boxed_slice(),
            pages: pages.into_boxed_slice(),
            shift,
            strtab,
        }
    }

    /// The symbol containing the link-time address `svma`.
    ///
    /// With `strict`, a zero-size symbol matches only its own address (glibc's `dladdr` rule);
    /// otherwise the nearest lower zero-size symbol extends to the next symbol.
    ///
    /// # Async-signal safety
    /// Binary search; no allocation, no panic.
    pub(crate) fn lookup(&self, svma: u64, strict: bool) -> Option<Found> {
        let rel = svma.checked_sub(self.base)?;
        let rel = u32::try_from(rel).ok()?;
        // The symbols starting in rel's page lie in pages[p]..pages[p + 1]; every symbol
        // before pages[p] starts below rel.
        let p = (rel >> self.shift.min(31)) as usize;
        let lo = self.pages.get(p).map_or(self.syms.len(), |&x| x as usize);
        let hi = self
            .pages
            .get(p + 1)
            .map_or(self.syms.len(), |&x| x as usize);
        let i = match self.syms.get(lo..hi) {
            Some(window) => lo + window.partition_point(|s| s.start <= rel),
            None => self.syms.partition_point(|s| s.start <= rel),
        };
        let lo = i.saturating_sub(SCAN_BACK);
        for j in (lo..i).rev() {
            let s = self.syms.get(j)?;
            let hit = if s.name == BOUNDARY {
                false
            } else if s.size == 0 {
                rel == s.start || (!strict && j + 1 == i)
            } else {
                rel - s.start < s.size
            };
            if hit {
                return Some(Found {
                    start: self.base + u64::from(s.start),
                    size: u64::from(s.size),
                    name: self.name(s.name, self.lens.get(j).copied()),
                });
            }
        }
        None
    }

    /// The NUL-terminated name at `off` in the string table (without the NUL), of length
    /// `len` when it was measured at build time.
    fn name(&self, off: u32, len: Option<u16>) -> &'static [u8] {
        let rest = self.strtab.get(off as usize..).unwrap_or(&[]);
        let end = match len {
            Some(n) if n != u16::MAX => usize::from(n),
            _ => crate::sys::strnlen(rest),
        };
        rest.get(..end).unwrap_or(&[])
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
    /// Path as the loader knows it (`[vdso]` for the vDSO).
    pub path: Box<str>,
    /// The name glibc's `dladdr` reports (`argv[0]` for the main program, `linux-vdso.so.1`).
    pub glibc_path: Box<str>,
    /// GNU build-id of the loaded object (empty if none).
    pub build_id: Box<[u8]>,
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
}

/// Every table ever built, for reuse (normal context only).
static CACHE: Mutex<Vec<(Key, &'static ObjectSymbols)>> = Mutex::new(Vec::new());

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

/// The symbols of a loaded object: from the cache, or built now. Normal context only.
pub(crate) fn for_object(o: &crate::modules::Object) -> &'static ObjectSymbols {
    let glibc_path = glibc_name(o);
    let key = Key {
        path: o.path.as_str().into(),
        build_id: o.build_id.clone().unwrap_or_default().into(),
        glibc_path: glibc_path.as_str().into(),
    };
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, t)) = cache.iter().find(|(k, _)| *k == key) {
        return t;
    }
    let built: &'static ObjectSymbols = Box::leak(Box::new(build(o, glibc_path)));
    cache.push((key, built));
    built
}

/// How many tables have been built so far (normal context).
pub(crate) fn tables_built() -> usize {
    CACHE.lock().unwrap_or_else(|p| p.into_inner()).len()
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

fn build(o: &crate::modules::Object, glibc_path: String) -> ObjectSymbols {
    let mut out = ObjectSymbols {
        path: o.path.as_str().into(),
        glibc_path: glibc_path.into(),
        build_id: o.build_id.clone().unwrap_or_default().into(),
        full: Table::default(),
        exported: Table::default(),
        source: SymbolSource::None,
        dwarf: None,
        debug_path: None,
    };
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
            let mut pool = Vec::new();
            let mut full = table(&f, false, &[], &mut pool, None, 0);
            if full.syms.is_empty() {
                full = table(&f, true, &[], &mut pool, None, 0);
            }
            let exported = table(&f, true, &[], &mut pool, Some(&full), 0);
            let pool = leak(pool);
            out.full = full.finish(pool);
            out.exported = exported.finish(pool);
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
    // One pool of names for both tables, the full one first: most exported names are the
    // full table's names of the same symbols, and are not copied again.
    let mut pool = Vec::new();
    // The exported names that are not the full table's (at most all of `.dynstr`).
    let room = f
        .section_by_name(".dynstr")
        .map_or(0, |s| s.size() as usize);
    let mut full = Draft::default();
    if !f.elf_symbol_table().is_empty() {
        full = table(&f, false, &plt, &mut pool, None, room);
        out.source = SymbolSource::Symtab;
    }
    if full.syms.is_empty() || out.dwarf.is_none() {
        if let Some((path, crc, dbg_cache)) = find_debug_file(&o.path, id, &f) {
            if let Ok(dbg) = Elf::parse(&dbg_cache) {
                if full.syms.is_empty() && !dbg.elf_symbol_table().is_empty() {
                    full = table(&dbg, false, &plt, &mut pool, None, room);
                    out.source = SymbolSource::DebugFile;
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
    let dynamic_only = full.syms.is_empty();
    if dynamic_only {
        full = table(&f, true, &plt, &mut pool, None, room);
        out.source = SymbolSource::None;
    }
    let exported = table(&f, true, &[], &mut pool, Some(&full), 0);
    if dynamic_only && !exported.syms.is_empty() {
        out.source = SymbolSource::Dynsym;
    }
    let pool = leak(pool);
    out.full = full.finish(pool);
    out.exported = exported.finish(pool);
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
) -> Option<(String, Option<u32>, Cache)> {
    let roots = debug_roots();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        for r in &roots {
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
    for r in &roots {
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
fn plt_x86_64(bytes: &[u8], addr: u64, entsize: u64) -> Vec<(u64, u64, u64)> {
    let ent = match entsize {
        8 => 8,
        _ => 16,
    };
    let mut out = Vec::new();
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
fn plt_aarch64(bytes: &[u8], addr: u64) -> Vec<(u64, u64, u64)> {
    /// `adrp x16, ...` with its immediate masked out.
    const ADRP_X16: (u32, u32) = (0x9f00_001f, 0x9000_0010);
    /// `ldr x17, [x16, #imm12 * 8]` with the immediate masked out.
    const LDR_X17_X16: (u32, u32) = (0xffc0_03ff, 0xf940_0211);
    /// `bti c`.
    const BTI_C: u32 = 0xd503_245f;
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
    let end = addr + bytes.len() as u64;
    (0..found.len())
        .map(|k| {
            let (start, slot) = found[k];
            let next = found.get(k + 1).map_or(end.min(start + 16), |n| n.0);
            (start, next.saturating_sub(start).max(4), slot)
        })
        .collect()
}

/// A table being built: sorted entries whose names are offsets into the object's pool (still
/// growing, so not yet `'static`) and their lengths.
#[derive(Default)]
struct Draft {
    base: u64,
    syms: Vec<Sym>,
    lens: Vec<u16>,
}

impl Draft {
    /// The pool offset of the name `name` of the symbol that starts at link-time `start`, if
    /// this table has that symbol with that very name.
    fn same_name(&self, pool: &[u8], start: u64, name: &[u8]) -> Option<u32> {
        let rel = u32::try_from(start.checked_sub(self.base)?).ok()?;
        let i = self.syms.partition_point(|s| s.start < rel);
        let s = self
            .syms
            .get(i)
            .filter(|s| s.start == rel && s.name != BOUNDARY)?;
        let len = usize::from(*self.lens.get(i)?);
        let at = s.name as usize;
        (pool.get(at..at + len)? == name).then_some(s.name)
    }

    fn finish(self, pool: &'static [u8]) -> Table {
        if self.syms.is_empty() {
            return Table::default();
        }
        Table::new(self.base, self.syms, self.lens, pool)
    }
}

/// Builds a table from `.symtab` (`dynamic == false`) or `.dynsym`, plus `synthetic` symbols
/// (PLT stubs). Names go into `pool`, the object's, which both of its tables share: a name
/// that `share` (the object's full table, built first) already holds for the same address is
/// not stored twice; `room` more bytes are reserved in the pool for the names of a table built
/// after this one. Unless `dynamic` (glibc's `dladdr` rules), the end of every section that
/// holds a symbol is a boundary: no symbol covers an address outside its own section.
///
/// The first table of an object (an empty `pool`, nothing to share) reads its string table
/// into memory it owns and makes the pool of it in place ([`compact_names`]): a large
/// program's names are tens of megabytes, and copying each one into a new pool, from all over
/// the string table into memory touched for the first time, cost a fifth of the build.
fn table<'d, R: ReadRef<'d> + ReadOwned>(
    f: &Elf<'d, R>,
    dynamic: bool,
    synthetic: &[Synthetic],
    pool: &mut Vec<u8>,
    share: Option<&Draft>,
    room: usize,
) -> Draft {
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
    let str_section = sections.section(symtab.string_section()).ok();
    let synthetic_bytes: usize = synthetic.iter().map(|s| s.2.len() + 1).sum();
    // The string table as the pool to be, when this is the object's first table.
    let owned = if pool.is_empty() && share.is_none() {
        str_section
            .and_then(|s| s.file_range(endian))
            .and_then(|(off, size)| data.read_owned(off, size, room + synthetic_bytes))
            .filter(|b| u32::try_from(b.len()).is_ok())
    } else {
        None
    };
    let strtab: &[u8] = if owned.is_some() {
        &[]
    } else {
        str_section
            .and_then(|s| s.data(endian, data).ok())
            .unwrap_or(&[])
    };
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
            ends.push(start + size);
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
    /// Where a kept entry's name is.
    #[derive(Clone, Copy)]
    enum Name<'n> {
        /// A section end: no name.
        Boundary,
        /// Bytes to store in the pool (or found there already, in `share`).
        Bytes(&'n [u8]),
        /// The string table's name at this offset (the in-place pool).
        Offset(u32),
    }
    let kept: Vec<(u64, u64, Name<'_>)> = raw
        .iter()
        .filter(|&&(start, _)| u32::try_from(start - base).is_ok())
        .map(|&(start, key)| {
            let i = key & ((1 << 56) - 1);
            if key >> 56 == u64::from(u8::MAX) {
                (start, 0, Name::Boundary)
            } else if let Some(s) = symbols.get(i as usize).filter(|_| i < nsyms) {
                let at = s.st_name(endian);
                let name = if owned.is_some() {
                    Name::Offset(at)
                } else {
                    let rest = strtab.get(at as usize..).unwrap_or(&[]);
                    let len = crate::sys::strnlen(rest).min(MAX_NAME);
                    Name::Bytes(rest.get(..len).unwrap_or(&[]))
                };
                (start, s.st_size(endian), name)
            } else {
                let (_, size, name) = &synthetic[(i - nsyms) as usize];
                (start, *size, Name::Bytes(&name[..name.len().min(MAX_NAME)]))
            }
        })
        .collect();
    // The in-place pool: the names of the string table at their offsets, first.
    let mut placed: Vec<(u32, u16)> = Vec::new();
    if let Some(mut buf) = owned {
        let offsets: Vec<u32> = kept
            .iter()
            .filter_map(|e| match e.2 {
                Name::Offset(at) => Some(at),
                _ => None,
            })
            .collect();
        placed = compact_names(&mut buf, &offsets);
        *pool = buf;
    }
    let mut placed = placed.into_iter();
    // The names `share` holds already, then room for the others at once (growing a pool of
    // many megabytes by doubling would copy it).
    let shared: Vec<Option<u32>> = match share {
        Some(d) => kept
            .iter()
            .map(|&(start, _, name)| match name {
                Name::Bytes(b) => d.same_name(pool, start, b),
                _ => None,
            })
            .collect(),
        None => Vec::new(),
    };
    pool.reserve(
        kept.iter()
            .enumerate()
            .filter_map(|(k, e)| match e.2 {
                Name::Bytes(b) if shared.get(k).copied().flatten().is_none() => Some(b.len() + 1),
                _ => None,
            })
            .sum::<usize>()
            + room,
    );
    let mut lens = Vec::with_capacity(kept.len());
    let mut syms = Vec::with_capacity(kept.len());
    for (k, &(start, size, name)) in kept.iter().enumerate() {
        let (at, len) = match name {
            Name::Boundary => (BOUNDARY, 0),
            Name::Offset(_) => placed.next().unwrap_or((0, 0)),
            Name::Bytes(b) => {
                let at = match shared.get(k).copied().flatten() {
                    Some(at) => at,
                    None => {
                        let Ok(at) = u32::try_from(pool.len()) else {
                            continue;
                        };
                        pool.extend_from_slice(b);
                        pool.push(0);
                        at
                    }
                };
                // Names are cut at MAX_NAME, below u16::MAX.
                (at, u16::try_from(b.len()).unwrap_or(u16::MAX))
            }
        };
        lens.push(len);
        syms.push(Sym {
            start: (start - base) as u32,
            size: u32::try_from(size).unwrap_or(u32::MAX),
            name: at,
        });
    }
    Draft { base, syms, lens }
}

/// Makes `buf`, a string table, the pool of the names that start at `offsets` in it, in place:
/// each distinct string moves down to the end of the ones before it (in the order of their
/// offsets, so that a string never overwrites one not yet moved), a string that starts inside
/// another one (the same string, or a suffix that the linker merged into it) keeps its place in
/// that one, and the rest of the table is cut off. Returns each offset's (place in the pool,
/// length cut at [`MAX_NAME`]), in the order of `offsets`; an offset past the end is an empty
/// name. `buf` must be shorter than 4 GiB.
fn compact_names(buf: &mut Vec<u8>, offsets: &[u32]) -> Vec<(u32, u16)> {
    let mut order: Vec<u64> = offsets
        .iter()
        .enumerate()
        .map(|(k, &at)| u64::from(at) << 32 | k as u64)
        .collect();
    order.sort_unstable();
    let mut out = vec![(0u32, 0u16); offsets.len()];
    let mut dest = 0usize;
    // The last string moved: where it started, where it ended (past its NUL), where it is now,
    // its length.
    let mut last: Option<(usize, usize, usize, usize)> = None;
    for key in order {
        let (src, k) = ((key >> 32) as usize, (key & 0xffff_ffff) as usize);
        let (at, len) = match last {
            Some((from, end, to, len)) if src < end => (to + (src - from), len - (src - from)),
            _ if src >= buf.len() => (0, 0),
            _ => {
                // Every string moved so far ended at or before `src`, and `dest` is the sum of
                // their lengths: the move only writes below `src + len + 1`, where no string
                // still to move starts.
                let len = crate::sys::strnlen(&buf[src..]);
                let end = (src + len + 1).min(buf.len());
                buf.copy_within(src..end, dest);
                let to = dest;
                dest += end - src;
                last = Some((src, end, to, len));
                (to, len)
            }
        };
        out[k] = (at as u32, len.min(MAX_NAME) as u16);
    }
    buf.truncate(dest);
    out
}

/// Leaks an object's pool of names: its tables refer to it for the rest of the process.
fn leak(pool: Vec<u8>) -> &'static [u8] {
    Box::leak(pool.into_boxed_slice())
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

    fn t(syms: &[(u32, u32)]) -> Table {
        static STR: &[u8] = b"\0a\0b\0c\0d\0";
        let syms = syms
            .iter()
            .enumerate()
            .map(|(i, &(start, size))| Sym {
                start,
                size,
                name: 1 + 2 * i as u32,
            })
            .collect();
        Table::new(0x1000, syms, Vec::new(), STR)
    }

    #[test]
    fn lookup_respects_sizes_nesting_and_strictness() {
        let tab = t(&[(0, 0x10), (0x20, 0), (0x40, 0x40), (0x50, 0x8)]);
        assert_eq!(tab.lookup(0x1000, false).map(|f| f.name), Some(&b"a"[..]));
        assert_eq!(tab.lookup(0x100f, false).map(|f| f.name), Some(&b"a"[..]));
        assert!(tab.lookup(0x1010, false).is_none());
        assert_eq!(tab.lookup(0x1030, false).map(|f| f.name), Some(&b"b"[..]));
        assert!(tab.lookup(0x1030, true).is_none());
        assert_eq!(tab.lookup(0x1020, true).map(|f| f.name), Some(&b"b"[..]));
        assert_eq!(tab.lookup(0x1052, false).map(|f| f.name), Some(&b"d"[..]));
        // Past the nested symbol, inside the outer one.
        assert_eq!(tab.lookup(0x1060, false).map(|f| f.start), Some(0x1040));
        assert!(tab.lookup(0x1080, false).is_none());
        assert!(tab.lookup(0, false).is_none());
        assert!(tab.lookup(u64::MAX, false).is_none());
        assert!(Table::default().lookup(0x1000, false).is_none());
    }

    #[test]
    fn page_directory_agrees_with_a_plain_binary_search() {
        // Symbols spread over many pages, some pages empty, some crowded.
        let mut v = Vec::new();
        let mut at = 0u32;
        for i in 0..3000u32 {
            v.push((at, 1 + i % 40));
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
            let want = v
                .iter()
                .rev()
                .take_while(|_| true)
                .find(|&&(s, size)| s <= rel && rel - s < size)
                .map(|&(s, _)| u64::from(s) + 0x1000);
            let got = tab.lookup(0x1000 + probe, true).map(|f| f.start);
            // The plain search finds any containing symbol; ours scans back a bounded window,
            // which covers these non-nested symbols.
            assert_eq!(got, want, "{probe:#x}");
        }
    }

    #[test]
    fn zero_size_symbols_stop_at_a_section_boundary() {
        let mut syms: Vec<Sym> = [(0u32, 0u32), (0x20, 0x10)]
            .iter()
            .enumerate()
            .map(|(i, &(start, size))| Sym {
                start,
                size,
                name: 1 + 2 * i as u32,
            })
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
        let tab = Table::new(0x1000, syms, Vec::new(), b"\0a\0b\0");
        assert_eq!(tab.lookup(0x1004, false).map(|f| f.name), Some(&b"a"[..]));
        assert!(tab.lookup(0x1008, false).is_none());
        assert!(tab.lookup(0x101f, false).is_none());
        assert_eq!(tab.lookup(0x1021, false).map(|f| f.name), Some(&b"b"[..]));
    }

    #[test]
    fn a_name_is_shared_only_for_the_same_symbol_with_the_same_name() {
        let pool = b"foo\0barbaz\0".to_vec();
        let full = Draft {
            base: 0x1000,
            syms: vec![
                Sym {
                    start: 0,
                    size: 4,
                    name: 0,
                },
                Sym {
                    start: 8,
                    size: 0,
                    name: BOUNDARY,
                },
                Sym {
                    start: 16,
                    size: 4,
                    name: 4,
                },
            ],
            lens: vec![3, 0, 6],
        };
        assert_eq!(full.same_name(&pool, 0x1000, b"foo"), Some(0));
        assert_eq!(full.same_name(&pool, 0x1010, b"barbaz"), Some(4));
        // Another name at the same address, a prefix of the name, another address, a
        // boundary, an address below the base: copied, not shared.
        assert_eq!(full.same_name(&pool, 0x1000, b"fooo"), None);
        assert_eq!(full.same_name(&pool, 0x1010, b"bar"), None);
        assert_eq!(full.same_name(&pool, 0x1004, b"foo"), None);
        assert_eq!(full.same_name(&pool, 0x1008, b""), None);
        assert_eq!(full.same_name(&pool, 0x10, b"foo"), None);
        let pool: &'static [u8] = leak(pool);
        let tab = full.finish(pool);
        assert_eq!(
            tab.lookup(0x1011, false).map(|f| f.name),
            Some(&b"barbaz"[..])
        );
    }

    /// The name at `at` in `strtab` as a plain copy gives it: up to the NUL (or the end), cut
    /// at `MAX_NAME`; empty past the end.
    fn name_at(strtab: &[u8], at: u32) -> &[u8] {
        let rest = strtab.get(at as usize..).unwrap_or(&[]);
        let n = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..n.min(MAX_NAME)]
    }

    #[test]
    fn names_compacted_in_place_are_the_names_at_their_offsets() {
        // xorshift: string tables of short and long (past MAX_NAME) strings, with and without
        // a final NUL, and offsets anywhere in them (string starts, suffixes, repeats, NULs,
        // past the end), in any order.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..300 {
            let mut strtab = vec![0u8];
            let mut starts = vec![];
            for _ in 0..next(40) {
                starts.push(strtab.len() as u32);
                let len = if next(10) == 0 {
                    4000 + next(300)
                } else {
                    next(30)
                };
                strtab.extend((0..len).map(|i| b'a' + ((i + round) % 26) as u8));
                strtab.push(0);
            }
            if round % 3 == 0 {
                strtab.extend_from_slice(b"unterminated");
            }
            let n = strtab.len() as u64;
            let offsets: Vec<u32> = (0..next(60))
                .map(|_| match next(4) {
                    0 if !starts.is_empty() => starts[next(starts.len() as u64) as usize],
                    1 => (n + next(5)) as u32,
                    _ => next(n) as u32,
                })
                .collect();
            let mut pool = strtab.clone();
            let placed = compact_names(&mut pool, &offsets);
            assert_eq!(placed.len(), offsets.len());
            assert!(pool.len() <= strtab.len());
            for (&at, &(to, len)) in offsets.iter().zip(&placed) {
                let want = name_at(&strtab, at);
                let got = &pool[to as usize..to as usize + usize::from(len)];
                assert_eq!(got, want, "round {round}, offset {at}");
            }
        }
    }

    #[test]
    fn bad_name_offsets_give_empty_names() {
        let sym = Sym {
            start: 0,
            size: 4,
            name: 999,
        };
        let tab = Table::new(0, vec![sym], Vec::new(), b"\0x");
        assert_eq!(tab.lookup(1, true).map(|f| f.name), Some(&b""[..]));
    }
}
