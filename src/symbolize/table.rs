//! One symbol table: sorted 12-byte entries with a page directory over them, and the lookup
//! of an address in it. Built by [`super::elf`]; looked up from anywhere, signal handlers
//! included (binary searches over slices: no allocation, no lock, no panic).

use super::names::{Names, SymbolName};

/// One symbol: start (relative to the table's base), size, id of its name in the object's
/// [`Names`]. 12 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Sym {
    pub(crate) start: u32,
    pub(crate) size: u32,
    pub(crate) name: u32,
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
pub(crate) const BOUNDARY: u32 = u32::MAX;

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
    pub(crate) fn new(base: u64, syms: Vec<Sym>, names: &'static Names) -> Table {
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

#[cfg(test)]
mod tests {
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
}
