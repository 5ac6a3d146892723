//! An object's symbol names, front-coded: sorted (objects of [`SORT_MIN`] names or more; the
//! others in their symbols' order), in blocks of [`BLOCK`] names, each name after a block's
//! first stored as the length of the prefix it shares with the name before it and the rest of
//! its bytes.
//!
//! A large program's names are most of its symbol index: rustc's `librustc_driver` and `libLLVM`
//! have 256,600 function symbols whose names average 130 bytes (Rust v0 and Itanium C++ names
//! repeat their crate and namespace paths), 33 MB as plain copies. Sorted, a name shares 83 bytes
//! with the one before it on average; front-coded in blocks of 4 they take 74 bytes each (in
//! blocks of 8, 63: blocks of 4 make a cold lookup read fewer cache lines).
//!
//! A name is decoded from its block only: at most [`BLOCK`] entries are read, and its bytes are
//! at most [`BLOCK`] pieces of the store ([`Names::pieces`]), in order, without copying. Lookups
//! are async-signal-safe: no allocation, no lock, no panic (every read is checked, so even a
//! store built wrong gives a short or empty name, never a fault).
//!
//! Size: over 600 lines only with its unit tests (about 520 without).

/// Names per block: a decode reads at most this many entries.
pub(crate) const BLOCK: usize = 4;

/// Longest name stored (longer ones are cut): the symbol tables' own limit.
pub(crate) const MAX_NAME: usize = 4096;

/// Bits of a name's id that give its place in its block; the bits above give where the block
/// starts in the store's data, so that a lookup reads nothing but the block.
const PLACE_BITS: u32 = BLOCK.trailing_zeros();

/// Blocks must start below this offset of the data to have an id (512 MiB of front-coded
/// names, some 9 million symbols of one object); names past it have none.
const MAX_DATA: usize = (u32::MAX >> PLACE_BITS) as usize;

/// Objects with fewer names are front-coded in the order of their symbols' addresses, not
/// sorted: sorting costs more than 100 ns a name (more than the rest of their index), and the
/// names of neighbouring functions share much already (107 bytes a name against 74 sorted and
/// 135 as plain copies, for rustc's driver and LLVM).
const SORT_MIN: usize = 30_000;

/// Bytes of the store to load ahead per entry of a block to be read: names take 60 on average.
const LINE_PER_ENTRY: usize = 80;

/// The id of a name whose block would start past [`MAX_DATA`]: no name.
pub(crate) const NO_NAME: u32 = u32::MAX;

/// The names of one object (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Names {
    /// The entries: per name, the shared prefix's length and the rest's length (each a
    /// little-endian base-128 number of one or two bytes, both below 2^14), then the rest.
    data: Box<[u8]>,
}

/// An entry of a block: the shared prefix's length, where the rest starts in the data, the
/// rest's length.
type Entry = (usize, usize, usize);

/// A name's bytes as pieces of the store: `pieces[..n]`, in order.
pub(crate) struct Pieces<'a> {
    pieces: [&'a [u8]; BLOCK],
    n: usize,
}

impl Names {
    /// The store of `names` (any order, repeats allowed, each cut at [`MAX_NAME`]) and each
    /// one's id in it, in the order of `names`: sorted first when there are at least
    /// [`SORT_MIN`] names. Normal context (allocates, sorts).
    pub(crate) fn build(names: &[&[u8]]) -> (Names, Vec<u32>) {
        Names::build_sorted(names, names.len() >= SORT_MIN)
    }

    /// [`Names::build`], sorted or in the order given (then a name repeated elsewhere than
    /// right after itself is stored again, under another id).
    fn build_sorted(names: &[&[u8]], sort: bool) -> (Names, Vec<u32>) {
        let cut = |i: u32| {
            let n = names[i as usize];
            &n[..n.len().min(MAX_NAME)]
        };
        let order = if sort {
            sort_names(names.len(), cut)
        } else {
            (0..names.len() as u32).collect()
        };
        let mut ids = vec![NO_NAME; names.len()];
        let mut data = Vec::new();
        // The current block's start and the number of names in it.
        let (mut block, mut place) = (0usize, BLOCK);
        let mut prev: Option<&[u8]> = None;
        for (k, &i) in order.iter().enumerate() {
            let name = cut(i);
            if prev == Some(name) {
                ids[i as usize] = ids[order[k - 1] as usize];
                continue;
            }
            // A block starting past MAX_DATA would have no id: this name and the rest get none.
            if place == BLOCK && data.len() > MAX_DATA {
                break;
            }
            // Touch a name some way ahead: its cache miss overlaps this one's work (the names
            // lie all over the string table, in the sorted order).
            if let Some(&ahead) = order.get(k + 8) {
                core::hint::black_box(cut(ahead).first().copied());
            }
            let shared = if place == BLOCK {
                (block, place) = (data.len(), 0);
                0
            } else {
                common_prefix(prev.unwrap_or(&[]), name)
            };
            push_len(&mut data, shared);
            push_len(&mut data, name.len() - shared);
            data.extend_from_slice(&name[shared..]);
            ids[i as usize] = (block << PLACE_BITS | place) as u32;
            place += 1;
            prev = Some(name);
        }
        let names = Names {
            data: data.into_boxed_slice(),
        };
        // A large store in huge pages: a cold lookup then waits for fewer page walks (see
        // `huge_pages`).
        crate::sys::huge_pages(names.data.as_ptr() as usize, names.data.len());
        (names, ids)
    }

    /// Bytes of the store.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.data.len()
    }

    /// The entries of name `id`'s block up to its own, and its place `k` in the block: each
    /// entry's (shared prefix, where its rest starts in `data`, the rest's length). `None` for
    /// an id the store does not have, or a block cut short.
    ///
    /// # Async-signal safety
    /// Async-signal-safe: reads at most [`BLOCK`] entries of one block.
    fn entries(&self, id: u32) -> Option<([Entry; BLOCK], usize)> {
        if id == NO_NAME {
            return None;
        }
        let (mut at, k) = ((id >> PLACE_BITS) as usize, id as usize % BLOCK);
        // Load the lines the entries likely take, all at once: read one after the other (where
        // each starts depends on the one before), a cold block cost one cache miss per entry in
        // turn (most of a lookup in a large program).
        for line in (0..(k + 1) * LINE_PER_ENTRY).step_by(64) {
            core::hint::black_box(self.data.get(at + line).copied());
        }
        let mut ent: [Entry; BLOCK] = [(0, 0, 0); BLOCK];
        let mut len = 0;
        for e in ent.iter_mut().take(k + 1) {
            let shared = read_len(&self.data, &mut at)?;
            let rest = read_len(&self.data, &mut at)?;
            // Only in a store built wrong: a prefix longer than the name before, or a rest
            // past the end.
            if shared > len || self.data.len().saturating_sub(at) < rest {
                return None;
            }
            *e = (shared, at, rest);
            at += rest;
            len = shared + rest;
        }
        Some((ent, k))
    }

    /// Length of name `id` (0 for an id the store does not have).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn len(&self, id: u32) -> usize {
        self.entries(id).map_or(0, |(ent, k)| ent[k].0 + ent[k].2)
    }

    /// The bytes of name `id` as pieces of the store; `None` for an id the store does not have.
    ///
    /// # Async-signal safety
    /// Async-signal-safe: reads at most [`BLOCK`] entries of one block.
    pub(crate) fn pieces(&self, id: u32) -> Option<Pieces<'_>> {
        let (ent, k) = self.entries(id)?;
        // Back from the name's own entry: entry j holds bytes [shared_j, shared_j + rest_j) of
        // its name, and its name's first shared_j bytes are those of the name before it.
        let mut pieces: [&[u8]; BLOCK] = [&[]; BLOCK];
        let mut n = 0;
        let mut want = ent[k].0 + ent[k].2;
        for &(shared, from, rest) in ent[..=k].iter().rev() {
            if want > shared {
                let take = (want - shared).min(rest);
                pieces[n] = self.data.get(from..from + take)?;
                n += 1;
            }
            want = want.min(shared);
            if want == 0 {
                break;
            }
        }
        pieces[..n].reverse();
        Some(Pieces { pieces, n })
    }

    /// Copies name `id` into `buf`, cut at its length; returns the name's whole length (0 for an
    /// id the store does not have).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn copy_to(&self, id: u32, buf: &mut [u8]) -> usize {
        let Some((ent, k)) = self.entries(id) else {
            return 0;
        };
        // Forward through the block: each entry's rest goes where its shared prefix ends,
        // over the name before it; after entry k, the buffer holds name k (cut at its size).
        for &(shared, from, rest) in &ent[..=k] {
            let take = rest.min(buf.len().saturating_sub(shared));
            if let (Some(dst), Some(src)) = (
                buf.get_mut(shared..shared + take),
                self.data.get(from..from + take),
            ) {
                dst.copy_from_slice(src);
            }
        }
        ent[k].0 + ent[k].2
    }
}

/// A symbol's raw (mangled) name, as [`Symbol::name`](super::Symbol::name) gives it.
///
/// The index keeps names front-coded (sorted, each stored as what it adds to the name before
/// it: a large program's names take less than half the memory of plain copies), so a name is
/// not one slice: it is decoded on demand, into a caller's buffer ([`SymbolName::copy_to`]) or
/// as at most 4 slices of the index ([`SymbolName::pieces`]), or into an owned copy in normal
/// context ([`SymbolName::to_vec`], [`SymbolName::to_string_lossy`]). Comparisons with bytes
/// or text decode nothing into memory. Names longer than 4,096 bytes are cut there.
///
/// # Async-signal safety
/// Everything but `to_vec` and `to_string_lossy` is async-signal-safe: no allocation, no lock,
/// no panic; at most 4 entries of the index are read.
#[derive(Clone, Copy)]
pub struct SymbolName {
    names: &'static Names,
    id: u32,
}

impl SymbolName {
    /// Name `id` of `names`.
    pub(crate) fn new(names: &'static Names, id: u32) -> SymbolName {
        SymbolName { names, id }
    }

    /// A name of its own store (tests of the formats).
    #[cfg(test)]
    pub(crate) fn leaked(bytes: &[u8]) -> SymbolName {
        let (names, ids) = Names::build(&[bytes]);
        SymbolName::new(Box::leak(Box::new(names)), ids[0])
    }

    /// The name's bytes as slices of the index, in order (at most 4).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn pieces(&self) -> impl Iterator<Item = &'static [u8]> {
        let p = self.names.pieces(self.id);
        let (pieces, n) = p.map_or(([&[][..]; BLOCK], 0), |p| (p.pieces, p.n));
        pieces.into_iter().take(n)
    }

    /// Length of the name in bytes.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn len(&self) -> usize {
        self.names.len(self.id)
    }

    /// Whether the name is empty (a symbol whose name could not be read).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the name into `buf` and returns the bytes written: the whole name, or its first
    /// `buf.len()` bytes (compare with [`SymbolName::len`] to tell).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn copy_to<'b>(&self, buf: &'b mut [u8]) -> &'b [u8] {
        let n = self.copy_len(buf).min(buf.len());
        buf.get(..n).unwrap_or(&[])
    }

    /// Copies the name into `buf` (cut at its size) and returns the name's whole length.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn copy_len(&self, buf: &mut [u8]) -> usize {
        self.names.copy_to(self.id, buf)
    }

    /// Whether the name starts with `prefix`.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn starts_with(&self, prefix: &[u8]) -> bool {
        let mut rest = prefix;
        for p in self.pieces() {
            let k = p.len().min(rest.len());
            if p.get(..k) != rest.get(..k) {
                return false;
            }
            rest = rest.get(k..).unwrap_or(&[]);
            if rest.is_empty() {
                return true;
            }
        }
        rest.is_empty()
    }

    /// The name as an owned byte vector. Normal context (allocates).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for p in self.pieces() {
            v.extend_from_slice(p);
        }
        v
    }

    /// The name as text, invalid UTF-8 replaced by U+FFFD. Normal context (allocates).
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.to_vec()).into_owned()
    }
}

impl PartialEq<[u8]> for SymbolName {
    fn eq(&self, other: &[u8]) -> bool {
        self.len() == other.len() && self.starts_with(other)
    }
}

impl PartialEq<&[u8]> for SymbolName {
    fn eq(&self, other: &&[u8]) -> bool {
        *self == **other
    }
}

impl PartialEq<str> for SymbolName {
    fn eq(&self, other: &str) -> bool {
        *self == *other.as_bytes()
    }
}

impl PartialEq<&str> for SymbolName {
    fn eq(&self, other: &&str) -> bool {
        *self == *other.as_bytes()
    }
}

/// Two names are equal when their bytes are.
impl PartialEq for SymbolName {
    fn eq(&self, other: &SymbolName) -> bool {
        if core::ptr::eq(self.names, other.names) && self.id == other.id {
            return true;
        }
        let (mut a, mut b) = (self.pieces(), other.pieces());
        let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
        loop {
            if x.is_empty() {
                x = a.next().unwrap_or(&[]);
            }
            if y.is_empty() {
                y = b.next().unwrap_or(&[]);
            }
            if x.is_empty() || y.is_empty() {
                return x.is_empty() && y.is_empty();
            }
            let k = x.len().min(y.len());
            if x.get(..k) != y.get(..k) {
                return false;
            }
            x = x.get(k..).unwrap_or(&[]);
            y = y.get(k..).unwrap_or(&[]);
        }
    }
}

impl Eq for SymbolName {}

/// The name's bytes in quotes, anything but printable ASCII escaped (`"main"`).
///
/// # Async-signal safety
/// Async-signal-safe when the formatter's writer is.
impl core::fmt::Debug for SymbolName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("\"")?;
        for p in self.pieces() {
            write!(f, "{}", p.escape_ascii())?;
        }
        f.write_str("\"")
    }
}

/// The raw name as text; a byte that is not part of valid UTF-8 within its piece of the index
/// is written as U+FFFD (names are ASCII in practice).
///
/// # Async-signal safety
/// Async-signal-safe when the formatter's writer is.
impl core::fmt::Display for SymbolName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for p in self.pieces() {
            for chunk in p.utf8_chunks() {
                f.write_str(chunk.valid())?;
                if !chunk.invalid().is_empty() {
                    f.write_str("\u{FFFD}")?;
                }
            }
        }
        Ok(())
    }
}

/// Words of a name's sort key.
const KEY_WORDS: usize = 3;
/// Bytes of a name's sort key.
const KEY_BYTES: usize = 8 * KEY_WORDS;

/// The indices `0..n` of names in the order of their bytes (`name(i)` is name `i`).
///
/// Names share long prefixes (`_ZN4llvm...`, `_RNvMs..._NtCsgEmfK2I1SDS_4core...`) and lie all
/// over a string table of tens of megabytes, so comparing whole names (memcmp) is slow. This is
/// a radix sort by 24-byte digits, most significant first: sorted by the first 24 bytes (as
/// three big-endian words, compared without reading the names again), then each run of equal
/// digits by the next 24 bytes, and so on while a run's names go on.
fn sort_names<'a>(n: usize, name: impl Fn(u32) -> &'a [u8]) -> Vec<u32> {
    let mut keyed: Vec<([u64; KEY_WORDS], u32)> =
        (0..n as u32).map(|i| (key(name(i), 0), i)).collect();
    keyed.sort_unstable();
    // Runs still to refine: (start, end, offset of the digit they share up to).
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    let push_runs = |keyed: &[([u64; KEY_WORDS], u32)],
                     from: usize,
                     to: usize,
                     depth: usize,
                     runs: &mut Vec<(usize, usize, usize)>| {
        let mut a = from;
        while a < to {
            let mut b = a + 1;
            while b < to && keyed[b].0 == keyed[a].0 {
                b += 1;
            }
            // Equal digits; the names go on past them (else they are equal names).
            if b - a > 1 && keyed[a..b].iter().any(|e| name(e.1).len() > depth) {
                runs.push((a, b, depth));
            }
            a = b;
        }
    };
    push_runs(&keyed, 0, keyed.len(), KEY_BYTES, &mut runs);
    while let Some((a, b, depth)) = runs.pop() {
        for e in &mut keyed[a..b] {
            e.0 = key(name(e.1), depth);
        }
        keyed[a..b].sort_unstable();
        push_runs(&keyed, a, b, depth + KEY_BYTES, &mut runs);
    }
    keyed.into_iter().map(|e| e.1).collect()
}

/// The sort digit of `name` at byte `at`: bytes `at..at + KEY_BYTES` as big-endian words,
/// zero-padded (a name holds no NUL, so a shorter name sorts first, as in byte order).
fn key(name: &[u8], at: usize) -> [u64; KEY_WORDS] {
    let rest = name.get(at..).unwrap_or(&[]);
    let word = |i: usize| match rest.get(8 * i..8 * i + 8) {
        Some(w) => u64::from_be_bytes(w.try_into().unwrap_or([0; 8])),
        None => {
            let mut b = [0u8; 8];
            for (d, s) in b.iter_mut().zip(rest.get(8 * i..).unwrap_or(&[])) {
                *d = *s;
            }
            u64::from_be_bytes(b)
        }
    };
    core::array::from_fn(word)
}

/// Length of the common prefix of `a` and `b`, a word at a time.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().unwrap_or([0; 8]));
        let y = u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        if x != y {
            return i + ((x ^ y).trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Appends `n` (below 2^14) as one or two bytes: seven bits each, low first, the high bit set
/// on the first of two.
fn push_len(data: &mut Vec<u8>, n: usize) {
    debug_assert!(n < 1 << 14);
    if n < 0x80 {
        data.push(n as u8);
    } else {
        data.push(0x80 | (n & 0x7f) as u8);
        data.push((n >> 7) as u8);
    }
}

/// Reads a length written by [`push_len`] at `*at`, moving past it.
fn read_len(data: &[u8], at: &mut usize) -> Option<usize> {
    let b0 = *data.get(*at)?;
    if b0 < 0x80 {
        *at += 1;
        return Some(usize::from(b0));
    }
    let b1 = *data.get(*at + 1)?;
    *at += 2;
    Some(usize::from(b0 & 0x7f) | usize::from(b1) << 7)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `'static` view of a store that lives as long as the test (leaked: tests only).
    fn leak(s: &Names) -> &'static Names {
        Box::leak(Box::new(Names {
            data: s.data.clone(),
        }))
    }

    fn decode(s: &Names, id: u32) -> Vec<u8> {
        let p = s.pieces(id).expect("an id of the store");
        let v: Vec<u8> = p.pieces[..p.n].iter().copied().flatten().copied().collect();
        assert_eq!(v.len(), s.len(id));
        v
    }

    #[test]
    fn every_name_decodes_to_itself_cut_at_max_name() {
        // xorshift: names from a small alphabet (long shared prefixes, repeats, prefixes of
        // each other, empty names) and some past MAX_NAME, in blocks that end anywhere.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..200 {
            let count = next(3 * BLOCK as u64 + 2) as usize;
            let mut names: Vec<Vec<u8>> = Vec::new();
            for _ in 0..count {
                let n = match next(8) {
                    0 if !names.is_empty() => {
                        // A repeat, or a prefix or extension of an earlier name.
                        let mut n = names[next(names.len() as u64) as usize].clone();
                        match next(3) {
                            0 => {}
                            1 => n.truncate(next(n.len() as u64 + 1) as usize),
                            _ => n.extend((0..next(20)).map(|_| b'a' + next(3) as u8)),
                        }
                        n
                    }
                    1 => (0..MAX_NAME as u64 + next(300) - 100)
                        .map(|i| b'a' + (i % 7) as u8)
                        .collect(),
                    _ => (0..next(200)).map(|_| b'a' + next(3) as u8).collect(),
                };
                names.push(n);
            }
            let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
            let sort = round % 2 == 0;
            let (s, ids) = Names::build_sorted(&refs, sort);
            let mut distinct = names.clone();
            for n in &mut distinct {
                n.truncate(MAX_NAME);
            }
            distinct.sort();
            distinct.dedup();
            // One id per distinct name.
            let mut by_id = std::collections::HashMap::new();
            for (n, &id) in names.iter().zip(&ids) {
                let want = &n[..n.len().min(MAX_NAME)];
                assert_eq!(decode(&s, id), want, "round {round}");
                // Different names have different ids (and sorted, equal names share one).
                assert_eq!(by_id.entry(id).or_insert_with(|| want.to_vec()), want);
                let other = ids[names.iter().position(|m| m == n).unwrap()];
                assert_eq!(
                    SymbolName::new(leak(&s), id),
                    SymbolName::new(leak(&s), other)
                );
                let mut small = [0u8; 5];
                let len = s.copy_to(id, &mut small);
                assert_eq!(len, want.len());
                let k = len.min(5);
                assert_eq!(&small[..k], &want[..k]);
            }
            if sort {
                assert_eq!(by_id.len(), distinct.len(), "round {round}");
            }
            assert!(s.pieces(NO_NAME).is_none());
            assert_eq!(s.copy_to(u32::MAX, &mut [0u8; 4]), 0);
        }
    }

    #[test]
    fn names_print_and_compare_as_their_bytes() {
        let a = SymbolName::leaked(b"_ZN3foo3barE");
        let b = SymbolName::leaked(b"a\"b\x01");
        assert_eq!(format!("{a}"), "_ZN3foo3barE");
        assert_eq!(format!("{a:?}"), "\"_ZN3foo3barE\"");
        assert_eq!(format!("{b:?}"), "\"a\\\"b\\x01\"");
        assert!(a == "_ZN3foo3barE" && a == b"_ZN3foo3barE"[..] && a != "_ZN3foo3ba");
        assert!(a.starts_with(b"_ZN3") && !a.starts_with(b"_ZN3foo3barEx"));
        assert_eq!(a, SymbolName::leaked(b"_ZN3foo3barE"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 12);
    }

    #[test]
    fn sorted_names_take_their_suffixes_only() {
        let names: Vec<String> = (0..64)
            .map(|i| format!("_ZN4llvm12DenseMapBase{:03}EEE", i))
            .collect();
        let refs: Vec<&[u8]> = names.iter().map(String::as_bytes).collect();
        let (s, ids) = Names::build(&refs);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "ids follow the sorted order"
        );
        // 64 / BLOCK blocks: a whole name each, then names of 2 lengths and the 4 or 5 bytes
        // after the digits they share ("1EEE", or "10EEE" where the tens change).
        let most = 64 / BLOCK * (2 + names[0].len() + (BLOCK - 1) * 7);
        assert!(s.data.len() <= most, "{} > {most}", s.data.len());
        for (n, &id) in names.iter().zip(&ids) {
            assert_eq!(decode(&s, id), n.as_bytes());
        }
    }

    #[test]
    fn a_corrupt_store_gives_no_name_or_a_short_one_never_a_panic() {
        let names: Vec<Vec<u8>> = (0..40u8).map(|i| vec![b'x'; 130 + i as usize]).collect();
        let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
        let (s, ids) = Names::build(&refs);
        for cut in 0..s.data.len() {
            let bad = Names {
                data: s.data[..cut].into(),
            };
            for id in ids.iter().copied().chain([NO_NAME, u32::MAX - 1, 1 << 31]) {
                if let Some(p) = bad.pieces(id) {
                    let len: usize = p.pieces[..p.n].iter().map(|x| x.len()).sum();
                    assert!(len <= MAX_NAME && len == bad.len(id));
                }
                bad.copy_to(id, &mut [0u8; 64]);
            }
        }
    }
}
