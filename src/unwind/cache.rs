//! The rule cache that every thread shares: a pc (with whether it is exact or a return address)
//! to the compiled rule of its frame.
//!
//! A fixed table of [`ENTRIES`] entries in buckets of [`WAYS`] (two cache lines each on x86-64;
//! a new rule takes the first free way, so a hot bucket's rules sit in its first line). A pc's
//! home bucket is chosen by its 64-byte line of code, so the return addresses of neighbouring
//! code share table lines (a walk through 2,048 functions of a profiler-sized working set touched
//! fewer lines and ran about 10% faster than with a hash of the pc); a pc whose home bucket is
//! full goes to a second bucket chosen by a hash. The table is allocated when the unwinder is
//! built (normal context) and published with it, so that a `dlclose` + `refresh` never leaves a
//! stale rule behind. Readers and writers never block: each entry is a seqlock whose 16-bit
//! sequence number shares a word with the key. A reader takes the entry only if that word (key,
//! even sequence number) was unchanged around the read; a writer claims an entry by a
//! compare-and-swap from even to odd and gives up if another writer holds it (the rule is then
//! simply derived again next time). Async-signal-safe: a handler that interrupts a writer on the
//! same thread sees an odd sequence and treats it as a miss.
//!
//! Return addresses whose rule has the simplest form are also kept in the [`CompactTable`], one
//! word each, which the fast walk looks at first.

use super::arch;
use super::compact::{Compact, CompactTable};
use super::rule::{self, Rule, WORDS};
use core::sync::atomic::{fence, AtomicU64, Ordering};

/// Entries in the cache (a power of two): enough for the return addresses of a large program's
/// hot paths, 512 KiB.
pub(crate) const ENTRIES: usize = 1 << 14;
/// Entries per bucket (two 64-byte cache lines): with 2 ways, the return addresses of a
/// profiler-sized working set (4,105 in `benches/unwind.rs`) overflowed enough buckets to
/// derive a rule again every 13 captures; with 4, every 500.
pub(crate) const WAYS: usize = 4;

/// A key shifted right by this is its pc's 64-byte line of code.
const LINE_SHIFT: u32 = 7 - arch::CODE_ALIGN.trailing_zeros();


/// Bits of an entry's first word that hold the key (the key is a user-space pc, under 2^47 on
/// x86-64 and 2^49 on aarch64, divided by the instruction alignment and shifted left by one);
/// the 16 bits above hold the sequence number.
const KEY_BITS: u32 = 48;
const KEY_MASK: u64 = (1 << KEY_BITS) - 1;

/// One cached rule: `head` = sequence number (bits 48-63; odd while a writer fills the entry)
/// and key (bits 0-47, 0 = empty), then the packed rule.
#[derive(Default)]
struct Entry {
    head: AtomicU64,
    rule: [AtomicU64; WORDS],
}

/// [`WAYS`] entries (two cache lines on x86-64).
#[derive(Default)]
#[repr(C, align(128))]
struct Bucket([Entry; WAYS]);

/// The shared rule cache (see the module docs).
pub(crate) struct RuleCache {
    buckets: Box<[Bucket; ENTRIES / WAYS]>,
    /// The rules of return addresses that have the [`Compact`] form.
    compact: CompactTable,
}

impl RuleCache {
    /// An empty cache. Allocates: normal context.
    pub(crate) fn new() -> RuleCache {
        let v: Vec<Bucket> = (0..ENTRIES / WAYS).map(|_| Bucket::default()).collect();
        match v.into_boxed_slice().try_into() {
            Ok(buckets) => RuleCache {
                buckets,
                compact: CompactTable::new(),
            },
            // The vector has exactly ENTRIES / WAYS buckets.
            Err(_) => unreachable!(),
        }
    }

    /// The bucket a key is looked for first: the pc's 64-byte line of code, so that the
    /// return addresses of one function (and of functions next to each other) share a bucket
    /// and a walk through them touches fewer cache lines of the table. Lines of code 256 KiB
    /// apart (other objects, far parts of one) are spread by folding in the higher bits.
    #[inline(always)]
    fn home(&self, key: u64) -> &Bucket {
        let line = key >> LINE_SHIFT;
        let h = (line ^ (line >> 12)) as usize;
        &self.buckets[h % (ENTRIES / WAYS)]
    }

    /// The bucket a key goes to when its home bucket is full (more than [`WAYS`] hot return
    /// addresses in one line of code): a hash of the whole pc.
    #[inline(always)]
    fn spill(&self, key: u64) -> &Bucket {
        let h = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize;
        &self.buckets[h % (ENTRIES / WAYS)]
    }

    /// The compact rule of return address `pc`, if the cache holds one (see
    /// [`CompactTable::get`]).
    ///
    /// # Async-signal safety
    /// Async-signal-safe, wait-free.
    #[inline(always)]
    pub(crate) fn compact(&self, pc: usize) -> Option<Compact> {
        self.compact.get(pc)
    }

    /// [`compact`](Self::compact) of a pc the caller knows to be in
    /// [`compact::LOW`](super::compact::LOW)..[`compact::HIGH`](super::compact::HIGH) (for any
    /// other, possibly another pc's rule).
    ///
    /// # Async-signal safety
    /// Async-signal-safe, wait-free.
    #[inline(always)]
    pub(crate) fn compact_below(&self, pc: usize) -> Option<Compact> {
        self.compact.get_below(pc)
    }

    /// The cached rule of `key`.
    ///
    /// # Async-signal safety
    /// Async-signal-safe, wait-free.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<Rule> {
        self.get_raw(key).and_then(Rule::unpack)
    }

    /// The first two packed words of the cached rule of `key`: all the hot loop needs (the
    /// kind, CFA, return address, and the save slots of rbx, rbp, r12 and r13).
    #[inline(always)]
    pub(crate) fn get_head(&self, key: u64) -> Option<[u64; 2]> {
        self.get_words(key)
    }

    /// The packed words of the cached rule of `key` (see [`Rule`]'s packing).
    #[inline(always)]
    pub(crate) fn get_raw(&self, key: u64) -> Option<[u64; WORDS]> {
        self.get_words(key)
    }

    /// The first `N` packed words of the cached rule of `key`.
    ///
    /// # Async-signal safety
    /// Async-signal-safe, wait-free.
    #[inline(always)]
    fn get_words<const N: usize>(&self, key: u64) -> Option<[u64; N]> {
        debug_assert!(N <= WORDS);
        // A pc at or above 2^47 has no entry (`put` refuses it); its key would otherwise reach
        // into the sequence number's low bit.
        if key > KEY_MASK {
            return None;
        }
        match Self::find(self.home(key), key) {
            Some(w) => Some(w),
            None => Self::find(self.spill(key), key),
        }
    }

    /// The first `N` packed words of the rule of `key` in `bucket`.
    #[inline(always)]
    fn find<const N: usize>(bucket: &Bucket, key: u64) -> Option<[u64; N]> {
        for e in &bucket.0 {
            let h1 = e.head.load(Ordering::Acquire);
            // The key matches and the sequence number is even.
            if h1 & (KEY_MASK | 1 << KEY_BITS) != key {
                continue;
            }
            let w: [u64; N] = core::array::from_fn(|i| e.rule[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            // An unchanged head: no writer touched the entry meanwhile.
            if e.head.load(Ordering::Relaxed) != h1 {
                continue;
            }
            return Some(w);
        }
        None
    }

    /// Stores the rule of `key`: in an empty entry of its home bucket, else of its spill
    /// bucket, else in place of an entry of its home bucket chosen by the key. Gives up if
    /// another writer holds that entry.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn put(&self, key: u64, rule: &Rule) {
        if key > KEY_MASK {
            return;
        }
        // A return address whose rule has the compact form also goes to the compact table.
        if key & 1 == 0 {
            self.compact.put(rule::key_pc(key), rule);
        }
        let empty = |b: &'_ Bucket| {
            b.0.iter()
                .position(|e| e.head.load(Ordering::Relaxed) & KEY_MASK == 0)
        };
        let (home, spill) = (self.home(key), self.spill(key));
        let e = match (empty(home), empty(spill)) {
            (Some(i), _) => &home.0[i],
            (None, Some(i)) => &spill.0[i],
            // The pc's low bits: keys of one line of code replace different entries.
            (None, None) => &home.0[(key >> 1) as usize % WAYS],
        };
        let h = e.head.load(Ordering::Relaxed);
        let seq = h >> KEY_BITS;
        if seq & 1 != 0 {
            return;
        }
        // Odd sequence number: readers skip the entry while we write it.
        let busy = ((seq + 1) & 0xffff) << KEY_BITS | (h & KEY_MASK);
        if e.head
            .compare_exchange(h, busy, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        fence(Ordering::Release);
        for (slot, w) in e.rule.iter().zip(rule.pack()) {
            slot.store(w, Ordering::Relaxed);
        }
        e.head
            .store(((seq + 2) & 0xffff) << KEY_BITS | key, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::rule::{self, Kind};
    #[cfg(target_arch = "x86_64")]
    use crate::unwind::rule::SAME;

    fn key(pc: usize, exact: bool) -> u64 {
        rule::key(pc, exact).expect("an aligned pc")
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn compact_rules_round_trip_and_never_match_another_pc() {
        let c = RuleCache::new();
        let mut r = Rule::of(Kind::Cfi);
        r.cfa_reg = 7;
        r.cfa_off = 56;
        r.ra_off = -8;
        r.saved = [-24, -16, SAME, SAME, -48, SAME];
        let pc = 0x5555_1234_5679usize;
        c.put(key(pc, false), &r);
        let got = c.compact(pc).expect("compact hit");
        assert_eq!(got.cfa_words(), 7);
        assert_eq!(got.fp_words(), 2);
        assert_eq!(got.slots(), 0b01_0011, "rbx, rbp and r14");
        // The full rule is kept too.
        assert_eq!(c.get(key(pc, false)), Some(r));
        // Another pc (other bits 0-1, 17-46, or any bit above; most of them in the same slot):
        // no hit.
        for other in [
            pc | 1 << 47,
            pc | 1 << 49,
            pc | 1 << 55,
            pc | 1 << 63,
            pc ^ 1,
            pc ^ 4,
            pc ^ 1 << 17,
            pc ^ 1 << 46,
            pc + (1 << 18),
        ] {
            assert_eq!(c.compact(other), None, "{other:#x}");
        }
        // Exact pcs (not return addresses) never go to the compact table.
        let exact = 0x5555_0000_1000usize;
        c.put(key(exact, true), &r);
        assert_eq!(c.compact(exact), None);
        // A second return address in the same 4 bytes of code replaces the word; the first is
        // then only in the buckets; one 4 bytes on has a word of its own.
        let mut r2 = r;
        r2.cfa_off = 8;
        r2.saved = [SAME; arch::LANES];
        c.put(key(pc + 1, false), &r2);
        assert_eq!(c.compact(pc), None);
        let got = c
            .compact(pc + 1)
            .map(|x| (x.cfa_words(), x.fp_words(), x.slots()));
        assert_eq!(got, Some((1, 0, 0)));
        assert_eq!(c.get(key(pc, false)), Some(r));
        c.put(key(pc + 4, false), &r);
        assert_eq!(c.compact(pc + 4).map(|x| x.cfa_words()), Some(7));
        assert_eq!(c.compact(pc + 1).map(|x| x.cfa_words()), Some(1));
    }

    #[test]
    fn cache_keeps_distinct_keys_and_replaces() {
        let c = RuleCache::new();
        let mut r = Rule::of(Kind::Cfi);
        for pc in 1..3000usize {
            r.cfa_off = pc as i32;
            c.put(key(pc * 16, false), &r);
        }
        let mut hits = 0;
        for pc in 1..3000usize {
            if let Some(got) = c.get(key(pc * 16, false)) {
                assert_eq!(got.cfa_off, pc as i32, "a hit is always the right rule");
                hits += 1;
            }
        }
        // 3000 keys in 16384 entries: nearly all stay.
        assert!(hits > 2800, "{hits}");
        assert_eq!(c.get(key(16, true)), None, "exactness is part of the key");
        // A pc whose key is a cached one's with the sequence number's low bit set (2^47 above
        // it on x86-64), while a writer holds that entry (odd sequence number): no hit.
        let e = &c.home(key(16, false)).0[0];
        let h = e.head.load(Ordering::Relaxed);
        assert_eq!(
            h & KEY_MASK,
            key(16, false),
            "pc 16 sits in way 0 of its home bucket"
        );
        e.head.store(h | 1 << KEY_BITS, Ordering::Relaxed);
        let far = rule::key_pc(key(16, false) | 1 << KEY_BITS);
        assert_eq!(rule::key(far, false), Some(key(16, false) | 1 << KEY_BITS));
        assert_eq!(c.get(key(far, false)), None);
        assert_eq!(c.get(key(16, false)), None, "a busy entry is a miss");
    }

    #[test]
    fn a_full_line_of_code_spills_to_a_second_bucket() {
        let c = RuleCache::new();
        let mut r = Rule::of(Kind::Cfi);
        // 8 return addresses in one 64-byte line of code: 4 in the home bucket, 4 spilled.
        let base = 0x5555_5555_1000usize;
        for i in 0..8 {
            r.cfa_off = i as i32 + 1;
            c.put(key(base + 8 * i, false), &r);
        }
        for i in 0..8 {
            let got = c.get(key(base + 8 * i, false)).map(|r| r.cfa_off);
            assert_eq!(got, Some(i as i32 + 1), "pc {i} of the line");
        }
    }
}

