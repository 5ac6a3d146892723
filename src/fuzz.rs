//! Entry points for selftrace's own fuzz harness (`tests/fuzz.rs`) into the parsers of outside
//! bytes that the public API reaches only through the running process: the symbol index of an
//! ELF file (`.symtab`, `.dynsym`, PLT stubs, separate debug files), the DWARF line reader, the
//! PLT decoders and the `/proc/PID/maps` line reader of the minidump writer.
//!
//! **Not a stable API**: hidden from the docs, for the harness only; it may change or go in any
//! release. Each function takes the bytes or the file a parser would read and returns what the
//! parser made of them, so that the harness can check the results are in bounds.

use crate::modules::Object;

/// What the symbol index made of an ELF file (see [`symbol_tables`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    /// Symbols in the full table (`.symtab` or `.dynsym`, and PLT stubs).
    pub full: usize,
    /// Symbols in the exported table (defined `.dynsym` symbols).
    pub exported: usize,
    /// `(address looked up, symbol start, symbol size, name length)` of each address that a
    /// symbol of the full table contains.
    pub found: Vec<(u64, u64, u64, usize)>,
    /// Whether the file has DWARF that file:line lookups would read.
    pub dwarf: bool,
}

/// Builds the symbol index of the ELF file at `path` as for a loaded object (without
/// build-id check and without looking for separate debug files in system directories), and
/// looks up each of `addrs` (link-time addresses). Normal context; the tables are never freed
/// (as the index's are): a long run leaks what the files' names take.
pub fn symbol_tables(path: &str, addrs: &[u64]) -> Tables {
    let o = Object {
        path: path.to_string(),
        bias: 0,
        range: 0..usize::MAX,
        exec: Vec::new(),
        exec_file_offsets: Vec::new(),
        eh_frame_hdr: None,
        eh_frame: None,
        build_id: None,
        build_id_addr: 0,
        file: None,
        is_main: false,
        is_vdso: false,
        permanent: false,
    };
    let t = crate::symbolize::elf::build(&o, &[]);
    let found = addrs
        .iter()
        .filter_map(|&a| {
            let f = t.all().lookup(a, false)?;
            Some((a, f.start, f.size, f.name.len()))
        })
        .collect();
    Tables {
        full: t.all().len(),
        exported: t.exported.len(),
        found,
        dwarf: t.dwarf.is_some(),
    }
}

/// Reads the DWARF of the ELF file at `path` as the file:line resolver does and looks up each
/// of `addrs` (link-time addresses): the number of frames (inlined and outer) found, or `None`
/// when the DWARF cannot be read. Normal context; the sections read are never freed and the
/// file stays open (as the resolver's, once per object): one descriptor per call.
pub fn dwarf_lines(path: &str, addrs: &[u64]) -> Option<usize> {
    crate::symbolize::lines::fuzz_lines(path, addrs)
}

/// The PLT entries an x86-64 (`aarch64` false) or aarch64 PLT section of `bytes` at address
/// `addr` (with `sh_entsize` `entsize`) decodes to: `(start, size, GOT slot)`.
pub fn plt_entries(aarch64: bool, bytes: &[u8], addr: u64, entsize: u64) -> Vec<(u64, u64, u64)> {
    if aarch64 {
        crate::symbolize::elf::plt_aarch64(bytes, addr)
    } else {
        crate::symbolize::elf::plt_x86_64(bytes, addr, entsize)
    }
}

/// `(start, end, readable)` of a `/proc/PID/maps` line, as the minidump writer reads it.
pub fn maps_line(line: &[u8]) -> Option<(usize, usize, bool)> {
    crate::procfs::parse_maps_line(line)
}

/// Whether the file offset `offset` of the ELF file at `path` lies in an executable segment,
/// as the tracefs uprobe checks read it; `None` when the file cannot be read.
#[cfg(feature = "tracefs")]
pub fn offset_in_code(path: &str, offset: u64) -> Option<bool> {
    crate::tracefs::symbols::offset_in_code(std::path::Path::new(path), offset).ok()
}
