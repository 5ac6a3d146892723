//! Function symbols of an ELF file and their file offsets: where a function uprobe attaches.
//!
//! `uprobe_events` takes `PATH:0xFILE_OFFSET`. A symbol's value is a virtual address; its file
//! offset is `vaddr - p_vaddr + p_offset` of the `PT_LOAD` segment that contains it.

use super::Error;
use crate::error::Error as Kind;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use std::path::Path;

/// Whether the file offset `offset` of the ELF file at `path` lies in an executable `PT_LOAD`
/// segment (where a uprobe can be placed on an instruction).
pub(crate) fn offset_in_code(path: &Path, offset: u64) -> Result<bool, Error> {
    const OP: &str = "reading the segments of";
    let data = crate::usdt::notes::open_elf(path, OP)?;
    let file = object::File::parse(&data).map_err(|_| {
        Error::new(Kind::BadElf("not a readable elf file"))
            .with_op(OP)
            .with_path(path)
    })?;
    Ok(file.segments().any(|s| {
        let (off, size) = s.file_range();
        let exec = match s.flags() {
            object::SegmentFlags::Elf { p_flags, .. } => p_flags.contains(object::elf::PF_X),
            _ => false,
        };
        exec && offset >= off && offset - off < size
    }))
}

/// A function symbol of an ELF file, with the file offset a uprobe attaches to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FunctionSymbol {
    /// The symbol's name as stored (mangled for Rust and C++).
    pub name: String,
    /// The demangled name without the Rust hash (`app::parse`); equal to `name` for C.
    pub demangled: String,
    /// The symbol's virtual address.
    pub address: u64,
    /// Its offset in the file.
    pub file_offset: u64,
}

/// Every defined function symbol of the ELF file at `path` (`.symtab` and `.dynsym`) that lies
/// in a `PT_LOAD` segment, in the part of it the file holds (not in a separate debug file,
/// whose segments' bytes were left out), deduplicated by address and name.
///
/// # Errors
/// Errors name the file: [`NotFound`](Kind::NotFound)`("elf file")` when it is missing,
/// [`PermissionDenied`](Kind::PermissionDenied) when it cannot be opened for reading,
/// [`Sys`](Kind::Sys) when `open` or `fstat` fails otherwise,
/// [`InvalidInput`](Kind::InvalidInput) when it is not a regular file (before anything is
/// read), [`BadElf`](Kind::BadElf) when it is not a readable ELF file or a segment's file or
/// address range does not fit in 64 bits (its file offsets would wrap).
pub fn function_symbols(path: impl AsRef<Path>) -> Result<Vec<FunctionSymbol>, Error> {
    const OP: &str = "reading the symbols of";
    let path = path.as_ref();
    let bad = |what| Error::new(Kind::BadElf(what)).with_op(OP).with_path(path);
    // Only the headers and the symbol tables are read; a FIFO or device is refused.
    let data = crate::usdt::notes::open_elf(path, OP)?;
    let file = object::File::parse(&data).map_err(|_| bad("not a readable elf file"))?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(bad("not an elf file"));
    }
    // (vaddr, filesz, offset) of each PT_LOAD. A segment whose file range or address range
    // does not fit in 64 bits (a hostile `p_offset` of u64::MAX, say) would give wrapped file
    // offsets: the file is refused, not read with offsets that point elsewhere. The part of a
    // segment past the end of the file (a truncated file; a separate debug file, whose
    // segments' bytes were left out) has no offset to attach to: its symbols are not listed.
    let len = object::ReadRef::len(&data).unwrap_or(0);
    let mut loads: Vec<(u64, u64, u64)> = Vec::new();
    for s in file.segments() {
        let (off, size) = s.file_range();
        if off.checked_add(size).is_none() || s.address().checked_add(size).is_none() {
            return Err(bad("a segment's file or address range overflows"));
        }
        loads.push((s.address(), size.min(len.saturating_sub(off)), off));
    }
    let mut out: Vec<FunctionSymbol> = Vec::new();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || !sym.is_definition() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if name.is_empty() {
            continue;
        }
        let addr = sym.address();
        let Some(file_offset) = loads
            .iter()
            .find(|(v, size, _)| addr >= *v && addr - v < *size)
            // In range: `addr - v < size` and `off + size` does not overflow (checked above).
            .map(|(v, _, off)| addr - v + off)
        else {
            continue;
        };
        out.push(FunctionSymbol {
            name: name.to_string(),
            demangled: format!("{:#}", rustc_demangle::demangle(name)),
            address: addr,
            file_offset,
        });
    }
    out.sort_by(|a, b| (a.address, &a.name).cmp(&(b.address, &b.name)));
    out.dedup_by(|a, b| a.address == b.address && a.name == b.name);
    Ok(out)
}

/// The function symbols of `path` that `name` designates: the symbols whose stored name is
/// `name` exactly, else those whose demangled name (without hash) is `name`, else those whose
/// demangled name ends with `::name`. Symbols at one address count once (aliases).
///
/// # Errors
/// Those of [`function_symbols`], also naming the symbol. No match is no error: the vector is
/// empty.
pub fn find_functions(path: impl AsRef<Path>, name: &str) -> Result<Vec<FunctionSymbol>, Error> {
    let all = function_symbols(path).map_err(|e| e.with_subject("symbol", name))?;
    let suffix = format!("::{name}");
    let tiers: [&dyn Fn(&FunctionSymbol) -> bool; 3] =
        [&|s| s.name == name, &|s| s.demangled == name, &|s| {
            s.demangled.ends_with(&suffix)
        }];
    for matches in tiers {
        let mut found: Vec<FunctionSymbol> = all.iter().filter(|s| matches(s)).cloned().collect();
        found.dedup_by_key(|s| s.address);
        if !found.is_empty() {
            return Ok(found);
        }
    }
    Ok(Vec::new())
}

/// The file offset of the function `name` in the ELF file at `path` (see [`find_functions`]
/// for how names match).
///
/// # Errors
/// Those of [`find_functions`]; [`NotFound`](Kind::NotFound)`("symbol")` when no function has
/// that name, [`InvalidInput`](Kind::InvalidInput) when several different functions match
/// (the error lists them). The error names the file and the symbol.
pub fn function_offset(path: impl AsRef<Path>, name: &str) -> Result<u64, Error> {
    let path = path.as_ref();
    let found = find_functions(path, name)?;
    let fail = |kind| {
        Error::new(kind)
            .with_op("looking up")
            .with_path(path)
            .with_subject("symbol", name)
    };
    match found.as_slice() {
        [] => Err(fail(Kind::NotFound("symbol"))),
        [one] => Ok(one.file_offset),
        several => {
            let names: Vec<&str> = several.iter().map(|f| f.demangled.as_str()).collect();
            Err(fail(Kind::InvalidInput(
                "symbol name matches several functions; give the full path or mangled name",
            ))
            .with_detail(names.join(", ")))
        }
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    #[inline(never)]
    pub fn selftrace_symbols_test_target(x: u64) -> u64 {
        std::hint::black_box(x) * 3
    }

    #[test]
    fn finds_own_function() {
        assert_eq!(selftrace_symbols_test_target(2), 6);
        let exe = std::env::current_exe().unwrap();
        let found = find_functions(&exe, "selftrace_symbols_test_target").unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        let f = &found[0];
        assert!(f
            .demangled
            .ends_with("tests::selftrace_symbols_test_target"));
        // The bytes at the file offset are the function's first bytes in memory.
        let data = std::fs::read(&exe).unwrap();
        let in_file = &data[f.file_offset as usize..f.file_offset as usize + 8];
        let code = selftrace_symbols_test_target as *const u8;
        // SAFETY: the function's code is mapped and readable, and longer than 8 bytes.
        let in_mem = unsafe { std::slice::from_raw_parts(code, 8) };
        assert_eq!(in_file, in_mem);
        let e = function_offset(&exe, "no_such_function_anywhere_xyz").unwrap_err();
        assert_eq!(e.kind(), Kind::NotFound("symbol"));
        assert_eq!(e.event(), Some("no_such_function_anywhere_xyz"));
        assert_eq!(e.path(), Some(exe.as_path()));
        let e = function_symbols("/nonexistent/elf").unwrap_err();
        assert_eq!(e.kind(), Kind::NotFound("elf file"));
        assert_eq!(
            e.to_string(),
            "reading the symbols of /nonexistent/elf: not found: elf file"
        );
    }
}
