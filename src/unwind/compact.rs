//! The compact table: the rules of return addresses that have the simplest form, one word each.
//!
//! Most return addresses have the simplest rule: CFA = rsp + 8n (or rbp + 8n in code built with
//! frame pointers, as Rust's std and a distribution's libraries are), the return address at
//! CFA - 8, rbp unchanged or saved just below. Such a rule, with the pc's bits that its index does
//! not give, fits one word ([`Compact`]); those words sit in a table of [`ENTRIES`] (256 KiB)
//! indexed by pc bits 3-17, so the return addresses of 64 bytes of code share a table line (and
//! return addresses 256 KiB apart share a word: the last one stored keeps it, the other is found in
//! the buckets of [`super::cache`]). The fast walk looks here first: a hit is one load of one word,
//! which a writer replaces whole (no sequence number needed); a miss goes on to the buckets. In the
//! 2,048-site bench (160 KiB of code) every stepped frame hits it; against libunwind in the same
//! process the walk went from 0.93-1.0x (buckets alone) to 0.76-0.82x (a table of half the size,
//! where 12% of the frames missed) to 0.61-0.70x.
//!
//! The form is x86-64's (`ENABLED`); on aarch64 the table holds nothing yet and every frame is
//! found in the buckets.

use super::arch;
use super::rule::{Kind, Rule, SAME, UNDEF};
use core::sync::atomic::{AtomicU64, Ordering};

/// Whether this architecture has a compact form.
const ENABLED: bool = cfg!(target_arch = "x86_64");

/// Entries of the table (a power of two): one word each, 256 KiB; none without a compact form.
const ENTRIES: usize = if ENABLED { 1 << 15 } else { 0 };

/// Bits of a compact word that must equal [`tag`] of the pc: present (bit 0) and the pc bits
/// that the entry's index does not give (29-63).
const TAG_MASK: u64 = 1 | !0 << 29;

/// The tag of a return address in its compact word: present, pc bits 0-2 (bits 29-31), pc bits
/// 17-46 (bits 32-61). The entry's index gives pc bits 3-17; with the tag, the whole pc of a pc
/// under 2^47 (no compact rule is stored or looked up for any other).
#[inline(always)]
fn tag(pc: usize) -> u64 {
    let pc = pc as u64;
    1 | (pc & 7) << 29 | (pc >> 17) << 32
}

/// The index of pc's word.
#[inline(always)]
fn index(pc: usize) -> usize {
    (pc >> 3) % ENTRIES.max(1)
}

/// The rule of a return address in one word, for the frame most code has: CFA = rsp (or, in
/// code built with frame pointers, rbp) + a positive multiple of 8, the return address at
/// CFA - 8, rbp unchanged or saved in one of the 63 words below the CFA and within the frame,
/// every other callee-saved register unchanged or saved (the fast walk then forgets it). Bits:
/// 0 present; 1-6 which of [`arch::SAVED`] the frame saves (as in the packed rule); 7-12 rbp's
/// save slot in words below the CFA (0: unchanged); 13-27 the CFA offset in words; 28 the CFA
/// is rbp-based; 29-63 the tag ([`tag`]; bits 62-63 are zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Compact(u64);

impl Compact {
    /// The compact word of the rule of return address `pc`, if the rule has the compact form.
    fn encode(pc: usize, rule: &Rule) -> Option<Compact> {
        if !ENABLED
            || rule.kind != Kind::Cfi
            || (rule.cfa_reg as u16 != arch::SP && rule.cfa_reg as u16 != arch::FP)
            || rule.ra_off != -8
            || rule.cfa_off <= 0
            || rule.cfa_off % 8 != 0
            || rule.cfa_off / 8 > 0x7fff
            || pc as u64 >= 1 << 47
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
            tag(pc) | slots << 1 | fp << 7 | (rule.cfa_off as u64 / 8) << 13 | rbp_based << 28,
        ))
    }

    /// Whether the CFA is rbp plus [`cfa_words`](Self::cfa_words) (the frame of code built with
    /// frame pointers, past its prologue), not rsp plus them.
    #[inline(always)]
    pub(crate) fn rbp_based(self) -> bool {
        self.0 & 1 << 28 != 0
    }

    /// The CFA's offset from rsp (or rbp: [`rbp_based`](Self::rbp_based)), in words (at
    /// least 1).
    #[inline(always)]
    pub(crate) fn cfa_words(self) -> usize {
        (self.0 >> 13) as usize & 0x7fff
    }

    /// The frame pointer's save slot in words below the CFA, or 0 if the frame does not save it;
    /// at most [`cfa_words`](Self::cfa_words).
    #[inline(always)]
    pub(crate) fn fp_words(self) -> usize {
        (self.0 >> 7) as usize & 0x3f
    }

    /// Which lanes the frame saves, one bit per lane, as in the packed rule.
    #[inline(always)]
    pub(crate) fn slots(self) -> u64 {
        (self.0 >> 1) & 0x3f
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
    /// which a writer replaces whole. A pc at or above 2^47 (user space can reach there with
    /// 5-level page tables) has no compact rule: the tag holds bits up to 46 only.
    ///
    /// # Async-signal safety
    /// Async-signal-safe, wait-free.
    #[inline(always)]
    pub(crate) fn get(&self, pc: usize) -> Option<Compact> {
        if !ENABLED || pc as u64 >= 1 << 47 {
            return None;
        }
        self.get_below(pc)
    }

    /// [`get`](Self::get) without the check that `pc` is below 2^47: the caller knows it is
    /// (for a pc above, the word of another pc may match).
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
    /// of another pc with the same index (one in the same 8 bytes of code or a multiple of
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
        assert!(Compact::encode(0x1000, &base).is_some());
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
            assert_eq!(Compact::encode(0x1000, &r), None, "variant {i}");
        }
        assert_eq!(Compact::encode(1 << 47, &base), None, "not a user-space pc");
        let mut at_the_bottom = base;
        at_the_bottom.saved[1] = -16;
        let c = Compact::encode(0x1000, &at_the_bottom).expect("rbp at sp");
        assert_eq!((c.fp_words(), c.cfa_words()), (2, 2));
        assert!(!c.rbp_based());
        // A frame-pointer frame past its prologue: CFA = rbp + 16, rbp saved at CFA - 16.
        let mut fp_frame = at_the_bottom;
        fp_frame.cfa_reg = arch::FP as u8;
        let c = Compact::encode(0x1000, &fp_frame).expect("rbp-based");
        assert!(c.rbp_based());
        assert_eq!((c.fp_words(), c.cfa_words(), c.slots()), (2, 2, 1 << 1));
        // The largest CFA offset (32,767 words), rsp- or rbp-based.
        let mut big = fp_frame;
        big.cfa_off = 8 * 0x7fff;
        let c = Compact::encode(0x1000, &big).expect("largest offset");
        assert!(c.rbp_based());
        assert_eq!(c.cfa_words(), 0x7fff);
        big.cfa_reg = arch::SP as u8;
        let c = Compact::encode(0x1000, &big).expect("largest offset");
        assert!(!c.rbp_based());
        assert_eq!(c.cfa_words(), 0x7fff);
    }
}
