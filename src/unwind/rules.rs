//! Compiled unwind rules and the cache that every thread shares.
//!
//! Deriving a frame's rule from `.eh_frame` (binary search of `.eh_frame_hdr`, parse the FDE,
//! run its CFI program up to the pc) costs a few hundred nanoseconds; applying a compiled rule
//! is a register lookup, an add and a few checked loads. The cache maps a pc (with whether it is
//! exact or a return address) to the compiled rule of its frame.
//!
//! # The cache
//! A fixed table of [`ENTRIES`] entries in buckets of [`WAYS`] (two cache lines each; a new
//! rule takes the first free way, so a hot bucket's rules sit in its first line). A pc's home
//! bucket is chosen by its 64-byte line of code, so the return addresses of neighbouring code
//! share table lines (a walk through 2,048 functions of a profiler-sized working set touched
//! fewer lines and ran about 10% faster than with a hash of the pc); a pc whose home bucket is
//! full goes to a second bucket chosen by a hash. The table is allocated
//! when the unwinder is built (normal context) and published with it, so that a `dlclose` +
//! `refresh` never leaves a stale rule behind. Readers and writers never block: each entry is a
//! seqlock whose 16-bit sequence number shares a word with the key. A reader takes the entry
//! only if that word (key, even sequence number) was unchanged around the read; a writer claims
//! an entry by a compare-and-swap from even to odd and gives up if another writer holds it (the
//! rule is then simply derived again next time). Async-signal-safe: a handler that interrupts a
//! writer on the same thread sees an odd sequence and treats it as a miss.
//!
//! # The compact table
//! Most return addresses have the simplest rule: CFA = rsp + 8n, the return address at CFA - 8,
//! rbp unchanged or saved just below. Such a rule, with the pc's bits that its index does not
//! give, fits one word ([`Compact`]); those words sit in a second table of [`COMPACT_ENTRIES`]
//! (256 KiB) indexed by pc bits 3-17, so the return addresses of 64 bytes of code share a table
//! line (and return addresses 256 KiB apart share a word: the last one stored keeps it, the
//! other is found in the buckets). The fast walk looks there first: a hit is one load of one
//! word, which a writer replaces whole (no sequence number needed); a miss goes on to the
//! buckets. In the 2,048-site bench (160 KiB of code) every stepped frame hits it; against
//! libunwind in the same process the walk went from 0.93-1.0x (buckets alone) to 0.76-0.82x
//! (a table of half the size, where 12% of the frames missed) to 0.61-0.70x.

use core::sync::atomic::{fence, AtomicU64, Ordering};

/// What kind of frame a pc is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A compiled CFI rule ([`Rule`]'s fields are valid).
    Cfi = 1,
    /// CFI that only the full evaluator handles (expressions, register-to-register rules,
    /// caller-saved registers restored, offsets that do not fit the compiled form).
    Slow = 2,
    /// No FDE covers the pc: the frame-pointer rule, if its result is plausible.
    NoCfi = 3,
    /// The signal-return trampoline: the interrupted registers are in the `ucontext_t` above it.
    Trampoline = 4,
    /// The return address is undefined: the outermost frame (`_start`, `clone3`).
    End = 5,
    /// There is CFI for the pc but it is malformed or uses what the evaluator does not support.
    Bad = 6,
}

impl Kind {
    fn from_u8(k: u8) -> Option<Kind> {
        Some(match k {
            1 => Kind::Cfi,
            2 => Kind::Slow,
            3 => Kind::NoCfi,
            4 => Kind::Trampoline,
            5 => Kind::End,
            6 => Kind::Bad,
            _ => return None,
        })
    }
}

/// A callee-saved register keeps its value (`DW_CFA_same_value`, or no rule).
pub(crate) const SAME: i16 = i16::MIN;
/// A callee-saved register's value is lost (`DW_CFA_undefined`).
pub(crate) const UNDEF: i16 = i16::MIN + 1;

/// The callee-saved registers a compiled rule tracks, by DWARF number: rbx, rbp, r12-r15.
pub(crate) const SAVED: [u16; 6] = [3, 6, 12, 13, 14, 15];

/// A frame's unwind rule in compiled form: CFA = register + offset, the return address and
/// every callee-saved register either unchanged, lost, or saved at CFA + offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) kind: Kind,
    /// DWARF number of the CFA's base register.
    pub(crate) cfa_reg: u8,
    /// CFA = that register + this.
    pub(crate) cfa_off: i32,
    /// The return address is at CFA + this.
    pub(crate) ra_off: i16,
    /// For each of [`SAVED`]: [`SAME`], [`UNDEF`] or the offset from the CFA of its save slot.
    pub(crate) saved: [i16; 6],
}

impl Rule {
    /// A rule of a kind that has no fields.
    pub(crate) const fn of(kind: Kind) -> Rule {
        Rule {
            kind,
            cfa_reg: 0,
            cfa_off: 0,
            ra_off: 0,
            saved: [SAME; 6],
        }
    }

    /// Whether the rule fits the packed form (else it must be evaluated in full).
    pub(crate) fn packable(&self) -> bool {
        self.cfa_reg < 16 && (-2048..2048).contains(&self.ra_off)
    }

    /// Packs into three words. Word 0: kind (bits 0-3), CFA register (4-7), which of
    /// [`SAVED`] are restored from a save slot (8-13) or undefined (14-19), the return
    /// address's offset from the CFA (20-31, signed), the CFA offset (32-63, signed). Words 1
    /// and 2: the save-slot offsets of [`SAVED`], 16 bits each.
    fn pack(&self) -> [u64; 3] {
        let lane = |i: usize| self.saved[i] as u16 as u64;
        let mut slots = 0u64;
        let mut undef = 0u64;
        for (i, &s) in self.saved.iter().enumerate() {
            match s {
                SAME => {}
                UNDEF => undef |= 1 << i,
                _ => slots |= 1 << i,
            }
        }
        [
            self.kind as u64
                | (self.cfa_reg as u64 & 0xf) << 4
                | slots << 8
                | undef << 14
                | (self.ra_off as u64 & 0xfff) << 20
                | (self.cfa_off as u32 as u64) << 32,
            lane(0) | lane(1) << 16 | lane(2) << 32 | lane(3) << 48,
            lane(4) | lane(5) << 16,
        ]
    }

    /// The inverse of [`Rule::pack`].
    pub(crate) fn unpack(w: [u64; 3]) -> Option<Rule> {
        let lane = |x: u64, i: u32| (x >> (16 * i)) as u16 as i16;
        let lanes = [
            lane(w[1], 0),
            lane(w[1], 1),
            lane(w[1], 2),
            lane(w[1], 3),
            lane(w[2], 0),
            lane(w[2], 1),
        ];
        let slots = (w[0] >> 8) & 0x3f;
        let undef = (w[0] >> 14) & 0x3f;
        Some(Rule {
            kind: Kind::from_u8((w[0] & 0xf) as u8)?,
            cfa_reg: ((w[0] >> 4) & 0xf) as u8,
            ra_off: packed_ra_off(w[0]),
            cfa_off: packed_cfa_off(w[0]),
            saved: core::array::from_fn(|i| {
                if undef & (1 << i) != 0 {
                    UNDEF
                } else if slots & (1 << i) != 0 {
                    lanes[i]
                } else {
                    SAME
                }
            }),
        })
    }
}

/// Word 0 bits that must equal [`Kind::Cfi`] for the fast path: the kind, and no callee-saved
/// register made undefined.
pub(crate) const FAST_MASK: u64 = 0xf | 0x3f << 14;

/// The return address's offset from the CFA in packed word 0.
#[inline(always)]
pub(crate) fn packed_ra_off(w0: u64) -> i16 {
    ((w0 as u32 as i32) >> 20) as i16
}

/// The CFA offset in packed word 0.
#[inline(always)]
pub(crate) fn packed_cfa_off(w0: u64) -> i32 {
    (w0 >> 32) as u32 as i32
}

/// The cache key of a pc: exact pcs and return addresses are looked up differently (a return
/// address at `pc - 1`), and only a return address can be the trampoline's.
#[inline]
pub(crate) fn key(pc: usize, exact: bool) -> u64 {
    (pc as u64) << 1 | exact as u64
}

/// Entries in the cache (a power of two): enough for the return addresses of a large program's
/// hot paths, 512 KiB.
pub(crate) const ENTRIES: usize = 1 << 14;
/// Entries per bucket (two 64-byte cache lines): with 2 ways, the return addresses of a
/// profiler-sized working set (4,105 in `benches/unwind.rs`) overflowed enough buckets to
/// derive a rule again every 13 captures; with 4, every 500.
pub(crate) const WAYS: usize = 4;

/// Entries of the compact table (a power of two): one word each, 256 KiB.
const COMPACT_ENTRIES: usize = 1 << 15;

/// Bits of a compact word that must equal [`compact_tag`] of the pc: present (bit 0) and the pc
/// bits that the entry's index does not give (29-63).
const COMPACT_TAG_MASK: u64 = 1 | !0 << 29;

/// The tag of a return address in its compact word: present, pc bits 0-2 (bits 29-31), pc bits
/// 17-46 (bits 32-61). The entry's index gives pc bits 3-17; with the tag, the whole pc of a pc
/// under 2^47 (no compact rule is stored or looked up for any other).
#[inline(always)]
fn compact_tag(pc: usize) -> u64 {
    let pc = pc as u64;
    1 | (pc & 7) << 29 | (pc >> 17) << 32
}

/// The rule of a return address in one word, for the frame most code has: CFA = rsp + a
/// positive multiple of 8, the return address at CFA - 8, rbp unchanged or saved in one of the
/// 63 words below the CFA, every other callee-saved register unchanged or saved (the fast walk
/// then forgets it). Bits: 0 present; 1-6 which of [`SAVED`] the frame saves (as in the packed
/// rule); 7-12 rbp's save slot in words below the CFA (0: unchanged); 13-28 the CFA offset in
/// words; 29-63 the tag ([`compact_tag`]; bits 62-63 are zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Compact(u64);

impl Compact {
    /// The compact word of the rule of return address `pc`, if the rule has the compact form.
    fn encode(pc: usize, rule: &Rule) -> Option<Compact> {
        const RSP: u8 = 7;
        if rule.kind != Kind::Cfi
            || rule.cfa_reg != RSP
            || rule.ra_off != -8
            || rule.cfa_off <= 0
            || rule.cfa_off % 8 != 0
            || rule.cfa_off / 8 > 0xffff
            || pc as u64 >= 1 << 47
        {
            return None;
        }
        let rbp = match rule.saved[1] {
            SAME => 0,
            s if s < 0 && s % 8 == 0 && -s / 8 <= 0x3f => (-s / 8) as u64,
            _ => return None,
        };
        let mut slots = 0u64;
        for (lane, &s) in rule.saved.iter().enumerate() {
            match s {
                SAME => {}
                UNDEF => return None,
                _ => slots |= 1 << lane,
            }
        }
        Some(Compact(
            compact_tag(pc) | slots << 1 | rbp << 7 | (rule.cfa_off as u64 / 8) << 13,
        ))
    }

    /// The CFA's offset from rsp, in words (at least 1).
    #[inline(always)]
    pub(crate) fn cfa_words(self) -> usize {
        (self.0 >> 13) as usize & 0xffff
    }

    /// rbp's save slot in words below the CFA, or 0 if the frame does not save rbp.
    #[inline(always)]
    pub(crate) fn rbp_words(self) -> usize {
        (self.0 >> 7) as usize & 0x3f
    }

    /// Which of [`SAVED`] the frame saves, one bit per lane (bit 1: rbp), as in the packed rule.
    #[inline(always)]
    pub(crate) fn slots(self) -> u64 {
        (self.0 >> 1) & 0x3f
    }
}

/// Bits of an entry's first word that hold the key (the key is a user-space pc, under 2^47,
/// shifted left by one); the 16 bits above hold the sequence number.
const KEY_BITS: u32 = 48;
const KEY_MASK: u64 = (1 << KEY_BITS) - 1;

/// One cached rule: `head` = sequence number (bits 48-63; odd while a writer fills the entry)
/// and key (bits 0-47, 0 = empty), then the packed rule.
#[derive(Default)]
struct Entry {
    head: AtomicU64,
    rule: [AtomicU64; 3],
}

/// [`WAYS`] entries in two cache lines.
#[derive(Default)]
#[repr(C, align(128))]
struct Bucket([Entry; WAYS]);

/// The shared rule cache (see the module docs).
pub(crate) struct RuleCache {
    buckets: Box<[Bucket; ENTRIES / WAYS]>,
    /// The compact table: the rules of return addresses that have the [`Compact`] form, one
    /// word each, indexed by pc bits 3-17 (neighbouring code, neighbouring words).
    compact: Box<[AtomicU64; COMPACT_ENTRIES]>,
}

impl RuleCache {
    /// An empty cache. Allocates: normal context.
    pub(crate) fn new() -> RuleCache {
        let v: Vec<Bucket> = (0..ENTRIES / WAYS).map(|_| Bucket::default()).collect();
        let compact: Vec<AtomicU64> = (0..COMPACT_ENTRIES).map(|_| AtomicU64::new(0)).collect();
        match (
            v.into_boxed_slice().try_into(),
            compact.into_boxed_slice().try_into(),
        ) {
            (Ok(buckets), Ok(compact)) => RuleCache { buckets, compact },
            // The vectors have exactly ENTRIES / WAYS buckets and COMPACT_ENTRIES words.
            _ => unreachable!(),
        }
    }

    /// The bucket a key is looked for first: the pc's 64-byte line of code, so that the
    /// return addresses of one function (and of functions next to each other) share a bucket
    /// and a walk through them touches fewer cache lines of the table. Lines of code 256 KiB
    /// apart (other objects, far parts of one) are spread by folding in the higher bits.
    #[inline(always)]
    fn home(&self, key: u64) -> &Bucket {
        let h = ((key >> 7) ^ (key >> 19)) as usize;
        &self.buckets[h % (ENTRIES / WAYS)]
    }

    /// The bucket a key goes to when its home bucket is full (more than [`WAYS`] hot return
    /// addresses in one line of code): a hash of the whole pc.
    #[inline(always)]
    fn spill(&self, key: u64) -> &Bucket {
        let h = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize;
        &self.buckets[h % (ENTRIES / WAYS)]
    }

    /// The compact rule of return address `pc`, if the cache holds one: one load of one word,
    /// which a writer replaces whole. A pc at or above 2^47 (user space can reach there with
    /// 5-level page tables) has no compact rule: the tag holds bits up to 46 only.
    /// Async-signal-safe, wait-free.
    #[inline(always)]
    pub(crate) fn compact(&self, pc: usize) -> Option<Compact> {
        if pc as u64 >= 1 << 47 {
            return None;
        }
        let w = self.compact[(pc >> 3) % COMPACT_ENTRIES].load(Ordering::Relaxed);
        ((w ^ compact_tag(pc)) & COMPACT_TAG_MASK == 0).then_some(Compact(w))
    }

    /// The cached rule of `key`. Async-signal-safe, wait-free.
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
    pub(crate) fn get_raw(&self, key: u64) -> Option<[u64; 3]> {
        self.get_words(key)
    }

    /// The first `N` packed words of the cached rule of `key`. Async-signal-safe, wait-free.
    #[inline(always)]
    fn get_words<const N: usize>(&self, key: u64) -> Option<[u64; N]> {
        debug_assert!(N <= 3);
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
    /// another writer holds that entry. Async-signal-safe.
    pub(crate) fn put(&self, key: u64, rule: &Rule) {
        if key > KEY_MASK {
            return;
        }
        // A return address whose rule has the compact form also goes to the compact table
        // (it replaces the word of another pc with the same index, one in the same 8 bytes of
        // code or a multiple of 256 KiB away: that one is then found in the buckets).
        let pc = (key >> 1) as usize;
        if key & 1 == 0 {
            if let Some(c) = Compact::encode(pc, rule) {
                self.compact[(pc >> 3) % COMPACT_ENTRIES].store(c.0, Ordering::Relaxed);
            }
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

    #[test]
    fn packs_and_unpacks_every_field() {
        let r = Rule {
            kind: Kind::Cfi,
            cfa_reg: 11,
            cfa_off: -40_968,
            ra_off: -8,
            saved: [SAME, -16, UNDEF, -24, 32_000, -32_000],
        };
        assert_eq!(Rule::unpack(r.pack()), Some(r));
        assert_eq!(Rule::unpack([0, 0, 0]), None);
    }

    #[test]
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
        assert_eq!(got.rbp_words(), 2);
        assert_eq!(got.slots(), 0b01_0011, "rbx, rbp and r14");
        // The full rule is kept too.
        assert_eq!(c.get(key(pc, false)), Some(r));
        // Another pc (other bits 0-2, 17-46, or any bit above; most of them in the same slot):
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
            pc + (COMPACT_ENTRIES << 3),
        ] {
            assert_eq!(c.compact(other), None, "{other:#x}");
        }
        // Exact pcs (not return addresses) never go to the compact table.
        let exact = 0x5555_0000_1000usize;
        c.put(key(exact, true), &r);
        assert_eq!(c.compact(exact), None);
        // A second return address in the same 8 bytes of code replaces the word; the first is
        // then only in the buckets.
        let mut r2 = r;
        r2.cfa_off = 8;
        r2.saved = [SAME; 6];
        c.put(key(pc + 1, false), &r2);
        assert_eq!(c.compact(pc), None);
        let got = c
            .compact(pc + 1)
            .map(|x| (x.cfa_words(), x.rbp_words(), x.slots()));
        assert_eq!(got, Some((1, 0, 0)));
        assert_eq!(c.get(key(pc, false)), Some(r));
    }

    #[test]
    fn rules_outside_the_compact_form_are_not_compacted() {
        let base = {
            let mut r = Rule::of(Kind::Cfi);
            r.cfa_reg = 7;
            r.cfa_off = 16;
            r.ra_off = -8;
            r
        };
        assert!(Compact::encode(0x1000, &base).is_some());
        let variants: [fn(&mut Rule); 9] = [
            |r| r.kind = Kind::Slow,
            |r| r.cfa_reg = 6,
            |r| r.ra_off = -16,
            |r| r.cfa_off = 12,
            |r| r.cfa_off = 8 << 16,
            |r| r.saved[1] = -8 * 64,
            |r| r.saved[1] = 8,
            |r| r.saved[1] = UNDEF,
            |r| r.saved[3] = UNDEF,
        ];
        for (i, f) in variants.iter().enumerate() {
            let mut r = base;
            f(&mut r);
            assert_eq!(Compact::encode(0x1000, &r), None, "variant {i}");
        }
        assert_eq!(Compact::encode(1 << 47, &base), None, "not a user-space pc");
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
        // A pc 2^47 above a cached one, while a writer holds that entry (odd sequence number):
        // no hit.
        let e = &c.home(key(16, false)).0[0];
        let h = e.head.load(Ordering::Relaxed);
        assert_eq!(
            h & KEY_MASK,
            key(16, false),
            "pc 16 sits in way 0 of its home bucket"
        );
        e.head.store(h | 1 << KEY_BITS, Ordering::Relaxed);
        assert_eq!(c.get(key(16 | 1 << 47, false)), None);
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
