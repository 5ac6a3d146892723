//! Register state: what a walk tracks from frame to frame ([`RegSet`]: every register slot of
//! [`super::arch`], each known or not), built from what it starts from.
#![allow(unsafe_code)]

use super::arch::{self, COUNT, FP, PC, SP};
use super::types::Regs;

/// A frame's registers by slot (DWARF numbers, see [`super::arch`]), each either known or not.
/// The walk keeps every register it can prove: all of them at a signal frame (from the
/// `ucontext_t`), the callee-saved ones across calls (restored by the CFI or unchanged), so that
/// a later frame whose CFA is based on, say, `rbx` still unwinds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegSet {
    /// Values by slot.
    pub(crate) v: [usize; COUNT],
    /// Bit `n` set: register `n` is known.
    pub(crate) valid: u64,
}

impl RegSet {
    /// Nothing known.
    const EMPTY: RegSet = RegSet {
        v: [0; COUNT],
        valid: 0,
    };

    /// Only pc, sp and fp known (and the link register, where there is one and `r.lr` is not 0).
    pub(crate) fn from_regs(r: Regs) -> RegSet {
        let mut s = RegSet::EMPTY;
        s.set(PC, r.pc);
        s.set(SP, r.sp);
        s.set(FP, r.fp);
        if let Some(lr) = arch::LR.filter(|_| r.lr != 0) {
            s.set(lr, r.lr);
        }
        s
    }

    /// The registers the capture entry saved, word by word ([`arch::ENTRY_REGS`]).
    ///
    /// The words are read one at a time: the entry has just stored them one at a time, and a
    /// wider load of two of them (which the compiler would otherwise make) cannot take them
    /// from the store buffer and waits until they reach the cache.
    pub(crate) fn from_entry(words: &[usize; arch::ENTRY_REGS.len()]) -> RegSet {
        let mut s = RegSet::EMPTY;
        for (&r, w) in arch::ENTRY_REGS.iter().zip(words) {
            // SAFETY: `w` is a reference to a live, aligned word.
            s.set(r, unsafe { core::ptr::read_volatile(w) });
        }
        s
    }

    /// Every register a `ucontext_t` holds, read through `word(offset)`.
    pub(crate) fn from_ucontext(mut word: impl FnMut(usize) -> Option<usize>) -> Option<RegSet> {
        let mut s = RegSet::EMPTY;
        for (r, &off) in arch::UC_OFFSETS.iter().enumerate() {
            if off != arch::NOT_SAVED {
                s.set(r as u16, word(off)?);
            }
        }
        Some(s)
    }

    /// A copy with only the registers a call preserves and the pc (what a walk from a return
    /// address can know); cheaper than copying the whole set.
    #[inline(always)]
    pub(crate) fn callee_saved(&self) -> RegSet {
        let mut s = RegSet {
            v: [0; COUNT],
            valid: self.valid & (arch::CALLEE_SAVED | 1 << PC),
        };
        for r in arch::CALLEE_SAVED_REGS {
            s.v[r as usize] = self.v[r as usize];
        }
        s.v[PC as usize] = self.v[PC as usize];
        s
    }

    /// The register's value if known.
    #[inline]
    pub(crate) fn get(&self, r: u16) -> Option<usize> {
        let i = r as usize;
        (i < COUNT && self.valid & (1 << i) != 0).then(|| self.v[i])
    }

    /// Sets a register (ignored beyond the tracked ones).
    #[inline]
    pub(crate) fn set(&mut self, r: u16, value: usize) {
        let i = r as usize;
        if i < COUNT {
            self.v[i] = value;
            self.valid |= 1 << i;
        }
    }

    /// Marks a register unknown.
    #[inline]
    pub(crate) fn forget(&mut self, r: u16) {
        if (r as usize) < COUNT {
            self.valid &= !(1 << r);
        }
    }

    /// Keeps only the registers in `mask` known.
    #[inline]
    pub(crate) fn keep_only(&mut self, mask: u64) {
        self.valid &= mask;
    }

    /// The caller's frame starts at return address `ra`: its pc. The return-address column's
    /// own register (aarch64's link register) is not known to the caller: a call clobbers it.
    #[inline]
    pub(crate) fn set_return(&mut self, ra: usize) {
        self.forget(arch::RA);
        self.set(PC, ra);
    }

    /// The program counter (exact or a return address, as the walk knows).
    #[inline]
    pub(crate) fn pc(&self) -> usize {
        self.v[PC as usize]
    }

    /// The stack pointer.
    #[inline]
    pub(crate) fn sp(&self) -> usize {
        self.v[SP as usize]
    }

    /// The frame pointer, if known.
    #[inline]
    pub(crate) fn fp(&self) -> Option<usize> {
        self.get(FP)
    }
}

/// Reads the registers out of a `ucontext_t` in memory the caller vouches for.
///
/// # Safety
/// `uc` must point to a readable `ucontext_t`.
pub(crate) unsafe fn from_ucontext(uc: *const libc::ucontext_t) -> Regs {
    let base = uc as usize;
    // SAFETY: the caller guarantees a readable ucontext_t; the offsets lie inside it.
    let word = |r: u16| unsafe {
        core::ptr::read_unaligned((base + arch::UC_OFFSETS[r as usize]) as *const usize)
    };
    Regs {
        pc: word(PC),
        sp: word(SP),
        fp: word(FP),
        lr: arch::LR.map_or(0, word),
    }
}
