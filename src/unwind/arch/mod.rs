//! What the unwinder needs to know of a machine, one folder per architecture; everything else
//! in [`super`] is generic and reads it from here.
//!
//! Each architecture is a zero-sized type that implements [`Arch`] (framehop's shape): its
//! registers, its `ucontext_t` layout and signal frame, its code, written as data. Both
//! architectures compile on every host, so a `cargo check` on x86-64 type-checks aarch64's
//! tables and evaluates [`check`] on them, and the reverse. Only the inline assembly (the
//! capture entry's `entry_asm!`, aarch64's `strip_ra`) and the checks against the machine's own
//! `libc::ucontext_t` are built for their own target alone.
//!
//! The generic code reads the host's architecture through the plain items below ([`COUNT`],
//! [`SAVED`], [`UC_OFFSETS`], ...), constants of [`Host`]: the walk loops fold them exactly as
//! they folded the per-architecture constants these items replace.
//!
//! On a target without a port there is no unwinder: `capture*` return no frames and say why
//! ([`super::StopReason::Unsupported`]).

mod aarch64;
mod x86_64;

pub(crate) use aarch64::ArchAArch64;
pub(crate) use x86_64::ArchX86_64;

#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::{entry_asm, strip_ra};
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::{entry_asm, strip_ra};

/// The architecture this build runs on.
#[cfg(target_arch = "x86_64")]
pub(crate) type Host = ArchX86_64;
/// The architecture this build runs on.
#[cfg(target_arch = "aarch64")]
pub(crate) type Host = ArchAArch64;

/// What the generic unwinder reads of an architecture. Register numbers are DWARF's where DWARF
/// has one (gimli's constants); a register set has [`Arch::COUNT`] slots, one per number.
pub(crate) trait Arch {
    /// Slots of a register set.
    const COUNT: usize;
    /// The frame pointer.
    const FP: u16;
    /// The stack pointer.
    const SP: u16;
    /// The return-address column of the CFI.
    const RA: u16;
    /// The slot of the frame's pc (on x86-64 the return-address column itself).
    const PC: u16;
    /// The link register, if there is one.
    const LR: Option<u16>;
    /// The registers a call preserves.
    const CALLEE_SAVED_REGS: &'static [u16];
    /// The callee-saved registers a compiled rule tracks (its lanes), the frame pointer among
    /// the first four.
    const SAVED: &'static [u16];
    /// The frame pointer's lane (its index in [`Arch::SAVED`]).
    const FP_LANE: usize;
    /// A CFI row without a rule for the return-address column keeps the link register (as on
    /// aarch64), rather than marking the outermost frame (as on x86-64).
    const RA_UNSPECIFIED_IS_SAME: bool;
    /// Instruction alignment: a pc that breaks it is garbage.
    const CODE_ALIGN: usize;
    /// The instructions of a stub without CFI that returns through the link register, as mask
    /// and value of each instruction (aarch64's PLT entry).
    const LINK_STUB: &'static [(u32, u32)];
    /// Where a call through a bad function pointer left its return address.
    const BAD_PC_RETURN: BadPcReturn;
    /// Whether a frame record at the frame pointer also gives the caller's stack pointer.
    const RECORD_GIVES_SP: bool;
    /// How gimli reads vendor-specific CFI opcodes.
    const VENDOR: gimli::Vendor;
    /// Where each register slot lies in the `ucontext_t` a signal handler gets ([`NOT_SAVED`]
    /// where it holds none): [`Arch::COUNT`] entries.
    const UC_OFFSETS: &'static [usize];
    /// Where the `ucontext_t` lies relative to the stack pointer when the signal trampoline runs.
    const UC_FROM_TRAMPOLINE_SP: usize;
    /// The bytes of the signal-return trampoline.
    const TRAMPOLINE: &'static [u8];
    /// The register slot of each word the capture entry (`entry_asm!`) saves, in order.
    const ENTRY_REGS: &'static [u16];

    /// The registers of the lanes in `lanes` other than the frame pointer's, as a mask of
    /// register slots.
    fn lane_regs(lanes: u64) -> u64;
    /// Whether DWARF register `n` is a general register.
    fn is_gpr(n: u16) -> bool;
}

/// Checks an architecture's tables against each other at build time; evaluated for every
/// architecture on every host.
// (Rust 1.88 calls it unused: it only runs in the `const` below.)
#[allow(dead_code)]
const fn check<A: Arch>() {
    assert!(A::COUNT <= 64, "a register set is a 64-bit mask");
    assert!(A::UC_OFFSETS.len() == A::COUNT);
    assert!((A::FP as usize) < A::COUNT && (A::SP as usize) < A::COUNT);
    assert!((A::RA as usize) < A::COUNT && (A::PC as usize) < A::COUNT);
    assert!(A::FP_LANE < 4 && A::FP_LANE < A::SAVED.len());
    assert!(A::SAVED[A::FP_LANE] == A::FP);
    assert!(A::CODE_ALIGN.is_power_of_two());
    assert!(A::TRAMPOLINE.len().is_multiple_of(A::CODE_ALIGN));
    let mut i = 0;
    while i < A::CALLEE_SAVED_REGS.len() {
        assert!((A::CALLEE_SAVED_REGS[i] as usize) < A::COUNT);
        i += 1;
    }
    let mut i = 0;
    while i < A::ENTRY_REGS.len() {
        assert!((A::ENTRY_REGS[i] as usize) < A::COUNT);
        i += 1;
    }
}

const _: () = {
    check::<ArchX86_64>();
    check::<ArchAArch64>();
};

/// Where the return address of a frame 0 outside every object (a call through a bad function
/// pointer) is.
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum BadPcReturn {
    /// On top of the stack: the call pushed it (x86-64).
    TopOfStack,
    /// In the link register: the branch-and-link left it there (aarch64).
    LinkRegister,
}

/// `UC_OFFSETS` entry of a register the `ucontext_t` does not hold.
#[allow(dead_code)]
pub(crate) const NOT_SAVED: usize = usize::MAX;

/// [`Arch::COUNT`] of the host.
pub(crate) const COUNT: usize = <Host as Arch>::COUNT;
/// [`Arch::FP`] of the host.
pub(crate) const FP: u16 = <Host as Arch>::FP;
/// [`Arch::SP`] of the host.
pub(crate) const SP: u16 = <Host as Arch>::SP;
/// [`Arch::RA`] of the host.
pub(crate) const RA: u16 = <Host as Arch>::RA;
/// [`Arch::PC`] of the host.
pub(crate) const PC: u16 = <Host as Arch>::PC;
/// [`Arch::LR`] of the host.
pub(crate) const LR: Option<u16> = <Host as Arch>::LR;
/// [`Arch::CALLEE_SAVED_REGS`] of the host.
pub(crate) const CALLEE_SAVED_REGS: [u16; <Host as Arch>::CALLEE_SAVED_REGS.len()] =
    array(<Host as Arch>::CALLEE_SAVED_REGS);
/// [`CALLEE_SAVED_REGS`] as a mask of register slots.
pub(crate) const CALLEE_SAVED: u64 = mask(&CALLEE_SAVED_REGS);
/// How many lanes a compiled rule has: [`SAVED`]'s length.
pub(crate) const LANES: usize = <Host as Arch>::SAVED.len();
/// [`Arch::SAVED`] of the host.
pub(crate) const SAVED: [u16; LANES] = array(<Host as Arch>::SAVED);
/// [`Arch::FP_LANE`] of the host.
pub(crate) const FP_LANE: usize = <Host as Arch>::FP_LANE;
/// [`Arch::RA_UNSPECIFIED_IS_SAME`] of the host.
pub(crate) const RA_UNSPECIFIED_IS_SAME: bool = <Host as Arch>::RA_UNSPECIFIED_IS_SAME;
/// [`Arch::CODE_ALIGN`] of the host.
pub(crate) const CODE_ALIGN: usize = <Host as Arch>::CODE_ALIGN;
/// [`Arch::LINK_STUB`] of the host.
pub(crate) const LINK_STUB: &[(u32, u32)] = <Host as Arch>::LINK_STUB;
/// [`Arch::BAD_PC_RETURN`] of the host.
pub(crate) const BAD_PC_RETURN: BadPcReturn = <Host as Arch>::BAD_PC_RETURN;
/// [`Arch::RECORD_GIVES_SP`] of the host.
pub(crate) const RECORD_GIVES_SP: bool = <Host as Arch>::RECORD_GIVES_SP;
/// [`Arch::VENDOR`] of the host.
pub(crate) const VENDOR: gimli::Vendor = <Host as Arch>::VENDOR;
/// [`Arch::UC_OFFSETS`] of the host.
pub(crate) const UC_OFFSETS: [usize; COUNT] = array(<Host as Arch>::UC_OFFSETS);
/// [`Arch::UC_FROM_TRAMPOLINE_SP`] of the host.
pub(crate) const UC_FROM_TRAMPOLINE_SP: usize = <Host as Arch>::UC_FROM_TRAMPOLINE_SP;
/// [`Arch::TRAMPOLINE`] of the host.
pub(crate) const TRAMPOLINE: &[u8] = <Host as Arch>::TRAMPOLINE;
/// [`Arch::ENTRY_REGS`] of the host.
pub(crate) const ENTRY_REGS: [u16; <Host as Arch>::ENTRY_REGS.len()] =
    array(<Host as Arch>::ENTRY_REGS);

/// [`Arch::lane_regs`] of the host.
#[inline(always)]
pub(crate) fn lane_regs(lanes: u64) -> u64 {
    <Host as Arch>::lane_regs(lanes)
}

/// [`Arch::is_gpr`] of the host.
#[inline(always)]
pub(crate) fn is_gpr(n: u16) -> bool {
    <Host as Arch>::is_gpr(n)
}

/// `s` as an array of its own length (a build error if `N` is not that length).
const fn array<T: Copy, const N: usize>(s: &[T]) -> [T; N] {
    assert!(s.len() == N && N > 0);
    let mut out = [s[0]; N];
    let mut i = 0;
    while i < N {
        out[i] = s[i];
        i += 1;
    }
    out
}

/// A mask with the bits of `regs` set.
const fn mask(regs: &[u16]) -> u64 {
    let mut m = 0;
    let mut i = 0;
    while i < regs.len() {
        m |= 1 << regs[i];
        i += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each lane's register as [`Arch::lane_regs`] gives it is the one [`Arch::SAVED`] names,
    /// and the frame pointer's lane gives none.
    fn lanes_agree<A: Arch>() {
        for (i, &r) in A::SAVED.iter().enumerate() {
            let want = if i == A::FP_LANE { 0 } else { 1 << r };
            assert_eq!(A::lane_regs(1 << i), want, "lane {i}");
        }
    }

    #[test]
    fn lanes_agree_on_every_architecture() {
        lanes_agree::<ArchX86_64>();
        lanes_agree::<ArchAArch64>();
    }
}
