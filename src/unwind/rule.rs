//! A frame's unwind rule in compiled form, and its packing into the words the rule cache holds.
//!
//! Deriving a frame's rule from `.eh_frame` (binary search of `.eh_frame_hdr`, parse the FDE,
//! run its CFI program up to the pc) costs a few hundred nanoseconds; applying a compiled rule is
//! a register lookup, an add and a few checked loads.

use super::arch::{self, LANES};

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

/// A frame's unwind rule in compiled form: CFA = register + offset, the return address and
/// every callee-saved register of [`arch::SAVED`] either unchanged, lost, or saved at
/// CFA + offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) kind: Kind,
    /// DWARF number of the CFA's base register.
    pub(crate) cfa_reg: u8,
    /// CFA = that register + this.
    pub(crate) cfa_off: i32,
    /// The return address is at CFA + this.
    pub(crate) ra_off: i16,
    /// For each of [`arch::SAVED`]: [`SAME`], [`UNDEF`] or the offset from the CFA of its save
    /// slot.
    pub(crate) saved: [i16; LANES],
}

/// Packed words per rule: word 0, then the lanes' save-slot offsets, four per word.
pub(crate) const WORDS: usize = 1 + LANES.div_ceil(4);

/// Word 0 layout: kind (bits 0-3), CFA register (4-8), which lanes are restored from a save
/// slot ([`SLOTS_AT`], one bit per lane) or undefined (the next [`LANES`] bits), the return
/// address's offset from the CFA (12 bits, signed, at [`RA_AT`]) and the CFA offset (signed, the
/// bits from [`CFA_AT`] up).
const REG_AT: u32 = 4;
/// See [`REG_AT`].
pub(crate) const SLOTS_AT: u32 = 9;
/// See [`REG_AT`].
const UNDEF_AT: u32 = SLOTS_AT + LANES as u32;
/// See [`REG_AT`].
const RA_AT: u32 = UNDEF_AT + LANES as u32;
/// See [`REG_AT`].
const CFA_AT: u32 = RA_AT + 12;
/// The mask of one lane bit per lane.
pub(crate) const LANE_MASK: u64 = (1 << LANES) - 1;

impl Rule {
    /// A rule of a kind that has no fields.
    pub(crate) const fn of(kind: Kind) -> Rule {
        Rule {
            kind,
            cfa_reg: 0,
            cfa_off: 0,
            ra_off: 0,
            saved: [SAME; LANES],
        }
    }

    /// Whether the rule fits the packed form (else it must be evaluated in full).
    pub(crate) fn packable(&self) -> bool {
        let cfa_bits = 64 - CFA_AT;
        self.cfa_reg < 32
            && (-2048..2048).contains(&self.ra_off)
            && (self.cfa_off as i64) >> (cfa_bits - 1) == (self.cfa_off as i64) >> 63
    }

    /// Packs into [`WORDS`] words: word 0 as [`REG_AT`] says, then the save-slot offsets of the
    /// lanes, 16 bits each.
    pub(crate) fn pack(&self) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        let mut slots = 0u64;
        let mut undef = 0u64;
        for (i, &s) in self.saved.iter().enumerate() {
            match s {
                SAME => {}
                UNDEF => undef |= 1 << i,
                _ => slots |= 1 << i,
            }
            w[1 + i / 4] |= (s as u16 as u64) << (16 * (i % 4));
        }
        w[0] = self.kind as u64
            | (self.cfa_reg as u64 & 0x1f) << REG_AT
            | slots << SLOTS_AT
            | undef << UNDEF_AT
            | (self.ra_off as u64 & 0xfff) << RA_AT
            | (self.cfa_off as i64 as u64) << CFA_AT;
        w
    }

    /// The inverse of [`Rule::pack`].
    pub(crate) fn unpack(w: [u64; WORDS]) -> Option<Rule> {
        let slots = packed_slots(w[0]);
        let undef = (w[0] >> UNDEF_AT) & LANE_MASK;
        Some(Rule {
            kind: Kind::from_u8((w[0] & 0xf) as u8)?,
            cfa_reg: packed_reg(w[0]) as u8,
            ra_off: packed_ra_off(w[0]),
            cfa_off: packed_cfa_off(w[0]),
            saved: core::array::from_fn(|i| {
                if undef & (1 << i) != 0 {
                    UNDEF
                } else if slots & (1 << i) != 0 {
                    packed_lane(&w, i)
                } else {
                    SAME
                }
            }),
        })
    }
}

/// Word 0 bits that must equal [`Kind::Cfi`] for the fast path: the kind, and no callee-saved
/// register made undefined.
pub(crate) const FAST_MASK: u64 = 0xf | LANE_MASK << UNDEF_AT;

/// The CFA's base register in packed word 0.
#[inline(always)]
pub(crate) fn packed_reg(w0: u64) -> usize {
    ((w0 >> REG_AT) & 0x1f) as usize
}

/// Which lanes the rule restores from a save slot, in packed word 0.
#[inline(always)]
pub(crate) fn packed_slots(w0: u64) -> u64 {
    (w0 >> SLOTS_AT) & LANE_MASK
}

/// The return address's offset from the CFA in packed word 0.
#[inline(always)]
pub(crate) fn packed_ra_off(w0: u64) -> i16 {
    (((w0 << (64 - RA_AT - 12)) as i64) >> 52) as i16
}

/// The CFA offset in packed word 0.
#[inline(always)]
pub(crate) fn packed_cfa_off(w0: u64) -> i32 {
    ((w0 as i64) >> CFA_AT) as i32
}

/// The save-slot offset of lane `i` in packed words `w` (at least `2 + i / 4` of them).
#[inline(always)]
pub(crate) fn packed_lane(w: &[u64], i: usize) -> i16 {
    (w[1 + i / 4] >> (16 * (i % 4))) as u16 as i16
}

/// The cache key of a pc: exact pcs and return addresses are looked up differently (a return
/// address at `pc - 1`), and only a return address can be the trampoline's. `None` for a pc
/// that breaks the instruction alignment ([`arch::CODE_ALIGN`]): no code is there.
#[inline(always)]
pub(crate) fn key(pc: usize, exact: bool) -> Option<u64> {
    if !pc.is_multiple_of(arch::CODE_ALIGN) {
        return None;
    }
    Some(((pc >> arch::CODE_ALIGN.trailing_zeros()) as u64) << 1 | exact as u64)
}

/// The pc of a key (see [`key`]).
#[inline(always)]
pub(crate) fn key_pc(key: u64) -> usize {
    ((key >> 1) as usize) << arch::CODE_ALIGN.trailing_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_unpacks_every_field() {
        let mut saved = [SAME; LANES];
        let values = [-16, UNDEF, -24, 32_000, -32_000, SAME, -8, 8, -2048, 2040, 16];
        for (s, v) in saved.iter_mut().zip(values) {
            *s = v;
        }
        for (cfa_reg, cfa_off) in [(11, -40_968), (7, 8), (29, 1 << 19), (31, -(1 << 19))] {
            let r = Rule {
                kind: Kind::Cfi,
                cfa_reg,
                cfa_off,
                ra_off: -8,
                saved,
            };
            assert!(r.packable());
            assert_eq!(Rule::unpack(r.pack()), Some(r));
        }
        assert_eq!(Rule::unpack([0; WORDS]), None);
        let mut r = Rule::of(Kind::Cfi);
        r.cfa_off = i32::MAX;
        assert!(!r.packable() || Rule::unpack(r.pack()) == Some(r));
        r.cfa_off = -1 << (64 - CFA_AT - 1);
        assert!(r.packable());
        assert_eq!(Rule::unpack(r.pack()), Some(r));
        r.cfa_off -= 1;
        assert!(!r.packable(), "one below the smallest CFA offset the word holds");
    }
}
