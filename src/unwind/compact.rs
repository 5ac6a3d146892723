//! The compact table: the rules of return addresses that have the simplest form, one word each.
//!
//! Most return addresses have the simplest rule: CFA = rsp + 8n (or rbp + 8n in code built with
//! frame pointers, as Rust's std and a distribution's libraries are), the return address at
//! CFA - 8, rbp unchanged or saved just below. Such a rule, with the pc's bits that its index does
//! not give, fits one word ([`Compact`]); those words sit in a table of [`ENTRIES`] (512 KiB)
//! indexed by pc bits 2-17, so the return addresses of 32 bytes of code share a table line (and
//! return addresses 256 KiB apart share a word: the last one stored keeps it, the other is found in
//! the buckets of [`super::cache`]). Two return addresses share a word only if they lie within 4
//! bytes of each other, which takes two calls of 2 or 3 bytes (through a register) in a row:
//! with words of 8 bytes of code, as before, `call a; call b` (5 bytes each: 3 in 8 such pairs)
//! and `call a; jmp` (7 bytes) shared one, and a walk through such sites found one in 8 of its
//! frames in the buckets (the dense-site bench: 2.6 of 22 frames a capture).
//!
//! The fast walk looks here first: a hit is one load of one word, which a writer replaces whole
//! (no sequence number needed); a miss goes on to the buckets. In the 2,048-site bench (160 KiB
//! of code) every stepped frame hits it; against libunwind in the same process the walk went
//! from 0.93-1.0x (buckets alone) to 0.76-0.82x (a table covering half that code, where 12% of
//! the frames missed) to 0.61-0.70x.
//!
//! The form is x86-64's (`ENABLED`); on aarch64 the table holds nothing yet and every frame is
//! found in the buckets.

use super::arch;
use super::rule::{Kind, Rule, SAME, UNDEF};
use core::sync::atomic::{AtomicU64, Ordering};

/// Whether this architecture has a compact form.
const ENABLED: bool = cfg!(target_arch = "x86_64");

/// Entries of the table (a power of two): one word each, 512 KiB; none without a compact form.
const ENTRIES: usize = if ENABLED { 1 << 16 } else { 0 };

/// The lowest pc with a compact rule: [`tag`] needs a pc bit outside the index set, so that an
/// empty word (0) matches no pc.
pub(crate) const LOW: usize = 1 << 18;

/// The end of the pcs with a compact rule: [`tag`] holds pc bits up to 46 (user space can reach
/// above with 5-level page tables).
pub(crate) const HIGH: usize = 1 << 47;

/// Bits of a compact word that must equal [`tag`] of the pc: the pc bits that the entry's index
/// does not give (0-28 and 46-47).
const TAG_MASK: u64 = ((1 << 29) - 1) | (3 << 46);

/// The tag of a return address in its compact word, pc rotated right by 18 (one instruction),
/// of which [`TAG_MASK`] keeps pc bits 18-46 (bits 0-28) and 0-1 (bits 46-47). The entry's
/// index gives pc bits 2-17; with the tag, the whole pc of a pc in [`LOW`]..[`HIGH`] (no compact
/// rule is stored or looked up for any other).
#[inline(always)]
fn tag(pc: usize) -> u64 {
    (pc as u64).rotate_right(18)
}

/// The index of pc's word.
#[inline(always)]
fn index(pc: usize) -> usize {
    (pc >> 2) % ENTRIES.max(1)
}

/// The rule of a return address in one word, for the frame most code has: CFA = rsp (or, in
/// code built with frame pointers, rbp) + a positive multiple of 8, the return address at
/// CFA - 8, rbp unchanged or saved in one of the 63 words below the CFA and within the frame,
/// every other callee-saved register unchanged or saved (the fast walk then forgets it). Bits:
/// 0-28 and 46-47 the tag ([`tag`]); 29 the CFA is rbp-based; 30-35 which of [`arch::SAVED`]
/// the frame saves (as in the packed rule); 36-41 rbp's save slot in words below the CFA (0:
/// unchanged); 49-63 the CFA offset in words (one shift to read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Compact(u64);

impl Compact {
    /// No rule: the neutral element of [`or`](Self::or) (saves no lane).
    pub(crate) const NONE: Compact = Compact(0);

    /// The bitwise union of two words: its [`slots`](Self::slots) are the lanes either saves
    /// (its other fields mean nothing).
    #[inline(always)]
    pub(crate) fn or(self, other: Compact) -> Compact {
        Compact(self.0 | other.0)
    }

    /// The compact word of the rule of return address `pc`, if the rule has the compact form.
    fn encode(pc: usize, rule: &Rule) -> Option<Compact> {
        if !ENABLED
            || rule.kind != Kind::Cfi
            || (rule.cfa_reg as u16 != arch::SP && rule.cfa_reg as u16 != arch::FP)
            || rule.ra_off != -8
            || rule.cfa_off <= 0
            || rule.cfa_off % 8 != 0
            || rule.cfa_off / 8 > 0x7fff
            || !(LOW..HIGH).contains(&pc)
            || arch::LANES > 6
        {
            return None;
        }
        let fp = match rule.saved[arch::FP_LANE] {
            SAME => 0,
            // Within the frame (at most the CFA offset below the CFA): the fast walks rely on it.
            s if s < 0 && s % 8 == 0 && -s / 8 <= 0x3f && i32::from(-s) <= rule.cfa_off => (-s / 8) as u64,
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
        let rbp_based = u64::from(rule.cfa_reg as u16 == arch::FP);
        Some(Compact(
            tag(pc) & TAG_MASK
                | rbp_based << 29
                | slots << 30
                | fp << 36
                | (rule.cfa_off as u64 / 8) << 49,
        ))
    }

    /// Whether the CFA is rbp plus [`cfa_words`](Self::cfa_words) (the frame of code built with
    /// frame pointers, past its prologue), not rsp plus them.
    #[inline(always)]
    pub(crate) fn rbp_based(self) -> bool {
        self.0 & 1 << 29 != 0
    }

    /// The CFA's offset from rsp (or rbp: [`rbp_based`](Self::rbp_based)), in words (at
    /// least 1).
    #[inline(always)]
    pub(crate) fn cfa_words(self) -> usize {
        (self.0 >> 49) as usize
    }

    /// The frame pointer's save slot in words below the CFA, or 0 if the frame does not save it;
    /// at most [`cfa_words`](Self::cfa_words).
    #[inline(always)]
    pub(crate) fn fp_words(self) -> usize {
        (self.0 >> 36) as usize & 0x3f
    }

    /// Whether the frame saves the frame pointer (then [`fp_words`](Self::fp_words) is its
    /// slot): its lane's bit of [`slots`](Self::slots).
    #[inline(always)]
    pub(crate) fn saves_fp(self) -> bool {
        self.slots() & 1 << arch::FP_LANE != 0
    }

    /// Which lanes the frame saves, one bit per lane, as in the packed rule.
    #[inline(always)]
    pub(crate) fn slots(self) -> u64 {
        (self.0 >> 30) & 0x3f
    }
}

/// The table (see the module docs).
pub(crate) struct CompactTable {
    words: Box<[AtomicU64; ENTRIES]>,
}

impl CompactTable {
    /// An empty table. Allocates: normal context.
    pub(crate) fn new() -> CompactTable {
        let v: Vec<AtomicU64> = (0..ENTRIES).map(|_| AtomicU64::new(0)).collect();
        match v.into_boxed_slice().try_into() {
            Ok(words) => CompactTable { words },
            // The vector has exactly ENTRIES words.
            Err(_) => unreachable!(),
        }
    }

    /// The compact rule of return address `pc`, if the table holds one: one load of one word,
    /// which a writer replaces whole. A pc outside [`LOW`]..[`HIGH`] has no compact rule.
    ///
    /// # Async-signal safety
    /// Async-signal-safe, wait-free.
    #[inline(always)]
    pub(crate) fn get(&self, pc: usize) -> Option<Compact> {
        if !ENABLED || !(LOW..HIGH).contains(&pc) {
            return None;
        }
        self.get_below(pc)
    }

    /// [`get`](Self::get) without the check that `pc` is in [`LOW`]..[`HIGH`]: the caller knows
    /// it is (for another pc, an empty word or that of another pc may match).
    ///
    /// # Async-signal safety
    /// Async-signal-safe, wait-free.
    #[inline(always)]
    pub(crate) fn get_below(&self, pc: usize) -> Option<Compact> {
        if !ENABLED {
            return None;
        }
        let w = self.words[index(pc)].load(Ordering::Relaxed);
        ((w ^ tag(pc)) & TAG_MASK == 0).then_some(Compact(w))
    }

    /// Stores the rule of return address `pc` if it has the compact form. It replaces the word
    /// of another pc with the same index (one in the same 4 bytes of code or a multiple of
    /// 256 KiB away), which is then found in the buckets.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn put(&self, pc: usize, rule: &Rule) {
        if let Some(c) = Compact::encode(pc, rule) {
            self.words[index(pc)].store(c.0, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn rules_outside_the_compact_form_are_not_compacted() {
        let base = {
            let mut r = Rule::of(Kind::Cfi);
            r.cfa_reg = 7;
            r.cfa_off = 16;
            r.ra_off = -8;
            r
        };
        assert!(Compact::encode(0x40_1000, &base).is_some());
        let variants: [fn(&mut Rule); 10] = [
            |r| r.kind = Kind::Slow,
            |r| r.cfa_reg = 3,
            |r| r.ra_off = -16,
            |r| r.cfa_off = 12,
            |r| r.cfa_off = 8 << 15,
            |r| r.saved[1] = -8 * 64,
            |r| r.saved[1] = 8,
            // rbp's slot below the frame (under the CFA offset of 16).
            |r| r.saved[1] = -24,
            |r| r.saved[1] = UNDEF,
            |r| r.saved[3] = UNDEF,
        ];
        for (i, f) in variants.iter().enumerate() {
            let mut r = base;
            f(&mut r);
            assert_eq!(Compact::encode(0x40_1000, &r), None, "variant {i}");
        }
        assert_eq!(Compact::encode(1 << 47, &base), None, "not a user-space pc");
        assert_eq!(Compact::encode(LOW - 8, &base), None, "below the lowest");
        assert!(Compact::encode(HIGH - 8, &base).is_some());
        let mut at_the_bottom = base;
        at_the_bottom.saved[1] = -16;
        let c = Compact::encode(0x40_1000, &at_the_bottom).expect("rbp at sp");
        assert_eq!((c.fp_words(), c.cfa_words()), (2, 2));
        assert!(!c.rbp_based());
        // A frame-pointer frame past its prologue: CFA = rbp + 16, rbp saved at CFA - 16.
        let mut fp_frame = at_the_bottom;
        fp_frame.cfa_reg = arch::FP as u8;
        let c = Compact::encode(0x40_1000, &fp_frame).expect("rbp-based");
        assert!(c.rbp_based());
        assert_eq!((c.fp_words(), c.cfa_words(), c.slots()), (2, 2, 1 << 1));
        // The largest CFA offset (32,767 words), rsp- or rbp-based.
        let mut big = fp_frame;
        big.cfa_off = 8 * 0x7fff;
        let c = Compact::encode(0x40_1000, &big).expect("largest offset");
        assert!(c.rbp_based());
        assert_eq!(c.cfa_words(), 0x7fff);
        big.cfa_reg = arch::SP as u8;
        let c = Compact::encode(0x40_1000, &big).expect("largest offset");
        assert!(!c.rbp_based());
        assert_eq!(c.cfa_words(), 0x7fff);
    }

    #[test]
    fn the_table_finds_the_stored_pc_and_no_other() {
        let mut r = Rule::of(Kind::Cfi);
        r.cfa_reg = arch::SP as u8;
        r.cfa_off = 24;
        r.ra_off = -8;
        r.saved[arch::FP_LANE] = -16;
        let t = CompactTable::new();
        let pcs = [LOW, 0x40_1234, 0x7f12_3456_789a, HIGH - 1];
        for &pc in &pcs {
            assert_eq!(t.get(pc), None, "{pc:#x} in an empty table");
        }
        for &pc in &pcs {
            t.put(pc, &r);
            let c = t.get(pc).expect("stored");
            assert_eq!((c.cfa_words(), c.fp_words(), c.rbp_based()), (3, 2, false));
            // Every pc sharing its word (a multiple of 256 KiB away, or in the same 4 bytes),
            // one that differs in a single tag bit, and ones outside the range: none.
            let others = (0..47)
                .map(|b| pc ^ 1 << b)
                .chain([pc + (ENTRIES << 2), pc.wrapping_sub(ENTRIES << 2), pc | 1 << 47]);
            for other in others.filter(|&o| o != pc) {
                assert_eq!(t.get(other), None, "{other:#x} beside {pc:#x}");
            }
        }
        // Below LOW an empty word would match without the range check.
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(8), None);
        assert_eq!(t.get(LOW - 8), None);
    }
}
