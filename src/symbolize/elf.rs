//! Building an object's symbol tables from its ELF file (or the vDSO's image in memory):
//! `.symtab` (own or a debug file's), `.dynsym`, and PLT stubs named `name@plt` from the PLT's
//! instructions (decoded for x86-64 and aarch64 on any host). Normal context (reads files,
//! allocates).
//!
//! Over 600 lines only with its unit tests (about 500 without): the PLT decoders' and the
//! name store's tests sit beside the code they check.
#![allow(unsafe_code)]

use super::debug_file::{find_debug_file, has_debug_info, DwarfFile};
use super::file::{open_cache, Elf};
use super::index::{ObjectSymbols, SymbolSource};
use super::names::{Names, MAX_NAME};
use super::table::{Sym, Table, BOUNDARY};
use object::elf;
use object::read::elf::{FileHeader, Rela as _, SectionHeader, Sym as _};
use object::read::ReadRef;
use object::Object as _;

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
                    done = out.full.len() != 0;
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
