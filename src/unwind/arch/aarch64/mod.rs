//! aarch64: DWARF register numbers ("DWARF for the Arm 64-bit Architecture": x0-x30 are 0-30,
//! sp 31, pc 32, as gimli names them), the `ucontext_t` layout, the kernel's signal trampoline,
//! pointer authentication, and the capture entry. Compiled on every host (see [`super`]); only
//! `strip_ra` and the entry's instructions (inline assembly) exist on aarch64 alone.
#![allow(unsafe_code)]
#![cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]

mod entry;
#[cfg(target_arch = "aarch64")]
pub(crate) use entry::entry_asm;

use gimli::AArch64;

use super::{Arch, BadPcReturn};
use crate::context::aarch64 as uc;

/// aarch64, as the unwinder sees it.
pub(crate) struct ArchAArch64;

/// Register slots: x0-x30, sp and the pc (DWARF 0-32; no CFI has a column for the pc).
const COUNT: usize = 33;
/// `x19`, the first callee-saved register.
pub(crate) const X19: u16 = AArch64::X19.0;
/// `x29`, the frame pointer.
pub(crate) const FP: u16 = AArch64::X29.0;
/// `x30`, the link register: the return-address column.
pub(crate) const RA: u16 = AArch64::X30.0;
/// `sp`.
pub(crate) const SP: u16 = AArch64::SP.0;
/// The slot of the frame's pc.
pub(crate) const PC: u16 = AArch64::PC.0;
/// x19-x28, the callee-saved registers other than the frame pointer.
pub(crate) const X19_X28: [u16; 10] = [
    AArch64::X19.0,
    AArch64::X20.0,
    AArch64::X21.0,
    AArch64::X22.0,
    AArch64::X23.0,
    AArch64::X24.0,
    AArch64::X25.0,
    AArch64::X26.0,
    AArch64::X27.0,
    AArch64::X28.0,
];
/// Offset of each register slot in `ucontext_t`: `uc_mcontext.regs[0..31]`, `.sp`, `.pc`,
/// computed at build time from context's layout (which is checked against this machine's libc
/// there).
const UC_OFFSETS: [usize; COUNT] = {
    let mut out = [0; COUNT];
    let mut i = 0;
    while i < 31 {
        out[i] = uc::uc_x(i);
        i += 1;
    }
    out[SP as usize] = uc::UC_SP;
    out[PC as usize] = uc::UC_PC;
    out
};

/// The size of `siginfo_t` (`SI_MAX_SIZE`, asm-generic/siginfo.h).
const SIGINFO_SIZE: usize = 128;

/// [`SIGINFO_SIZE`] is what this machine's libc says (`libc`'s aarch64 definitions exist only
/// on aarch64; the `ucontext_t` layout is checked in [`crate::context::aarch64`]).
#[cfg(target_arch = "aarch64")]
const _: () = assert!(SIGINFO_SIZE == core::mem::size_of::<libc::siginfo_t>());

impl Arch for ArchAArch64 {
    const COUNT: usize = COUNT;
    const FP: u16 = FP;
    const SP: u16 = SP;
    const RA: u16 = RA;
    const PC: u16 = PC;
    /// The link register.
    const LR: Option<u16> = Some(RA);
    /// AAPCS64: x19-x28, x29, sp. x30 is the return address of the call itself: the caller's
    /// own x30 is not known after it.
    const CALLEE_SAVED_REGS: &'static [u16] = &join::<12>(&X19_X28, &[FP, SP]);
    /// x29 first (the hot loop reads the frame pointer's lane from the first rule word), then
    /// x19-x28: [`Arch::lane_regs`] depends on this order.
    const SAVED: &'static [u16] = &join::<11>(&[FP], &X19_X28);
    const FP_LANE: usize = 0;
    /// A row without a rule for x30 keeps it: a leaf that has not saved the link register
    /// returns through it.
    const RA_UNSPECIFIED_IS_SAME: bool = true;
    /// Instructions are 4 bytes, 4-byte aligned.
    const CODE_ALIGN: usize = 4;
    /// A PLT entry (`adrp x16, page; ldr x17, [x16, #off]; add x16, x16, #off; br x17`): the
    /// linker emits no CFI for it, and code there has neither touched the stack nor the link
    /// register, so a frame 0 inside one returns through x30.
    const LINK_STUB: &'static [(u32, u32)] = &[
        (0x9f00_001f, 0x9000_0010),
        (0xffc0_03ff, 0xf940_0211),
        (0xffc0_03ff, 0x9100_0210),
        (0xffff_ffff, 0xd61f_0220),
    ];
    /// A `blr` through a bad pointer left the return address in x30 and the stack as it was.
    const BAD_PC_RETURN: BadPcReturn = BadPcReturn::LinkRegister;
    /// A frame record (`stp x29, x30`) may sit anywhere in its frame (LLVM puts it at the top,
    /// GCC at the bottom): it does not give the caller's stack pointer.
    const RECORD_GIVES_SP: bool = false;
    /// gimli must read `DW_CFA_AARCH64_negate_ra_state` (the opcode SPARC's `window_save`
    /// shares).
    const VENDOR: gimli::Vendor = gimli::Vendor::AArch64;
    const UC_OFFSETS: &'static [usize] = &UC_OFFSETS;
    /// The kernel's `rt_sigframe` on arm64 is `{ siginfo_t info; ucontext_t uc; }` at the stack
    /// pointer the handler started with, which is the stack pointer when it returns to the
    /// trampoline.
    const UC_FROM_TRAMPOLINE_SP: usize = SIGINFO_SIZE;
    /// The vDSO's `__kernel_rt_sigreturn` (and qemu-user's and musl's trampolines):
    /// `mov x8, #139` (`__NR_rt_sigreturn`) then `svc #0`.
    const TRAMPOLINE: &'static [u8] = &[0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];
    const ENTRY_REGS: &'static [u16] = &entry::ENTRY_REGS;

    /// Lanes 1-10 are x19-x28.
    #[inline(always)]
    fn lane_regs(lanes: u64) -> u64 {
        (lanes >> 1) << X19
    }

    /// x0-x30.
    #[inline]
    fn is_gpr(n: u16) -> bool {
        n <= AArch64::X30.0
    }
}

/// The return address without its pointer authentication code: code built with
/// `-mbranch-protection=pac-ret` (or `standard`) signs x30 (`paciasp`) before saving it, so the
/// saved word carries a PAC in its top bits. `xpaclri` (`hint #7`) strips it from x30; it is a
/// no-op on a CPU without pointer authentication, where nothing is signed, and on an unsigned
/// pointer.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn strip_ra(ra: usize) -> usize {
    let out: usize;
    // SAFETY: moves a value through x30 (declared clobbered) and strips its PAC bits; no memory,
    // no stack, no flags.
    unsafe {
        core::arch::asm!(
            "mov x30, {v}",
            "hint #7",
            "mov {v}, x30",
            v = inout(reg) ra => out,
            out("x30") _,
            options(nomem, nostack, preserves_flags),
        );
    }
    out
}

/// `head` then `tail` as one array (a build error if they are not `N` registers in all).
pub(crate) const fn join<const N: usize>(head: &[u16], tail: &[u16]) -> [u16; N] {
    assert!(head.len() + tail.len() == N);
    let mut out = [0; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < head.len() {
            head[i]
        } else {
            tail[i - head.len()]
        };
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's arm64 `struct ucontext` up to the registers of its `struct sigcontext`
    /// (asm/ucontext.h, asm/sigcontext.h, asm-generic/signal.h's `stack_t` and 8-byte
    /// `sigset_t`), as C lays it out: `uc_mcontext` is 16-byte aligned (its `__reserved` is).
    #[repr(C)]
    struct Ucontext {
        uc_flags: u64,
        uc_link: u64,
        ss_sp: u64,
        ss_flags: i32,
        ss_size: u64,
        uc_sigmask: u64,
        unused: [u8; 1024 / 8 - 8],
        uc_mcontext: Sigcontext,
    }

    #[repr(C, align(16))]
    struct Sigcontext {
        fault_address: u64,
        regs: [u64; 31],
        sp: u64,
        pc: u64,
        pstate: u64,
    }

    #[test]
    fn uc_offsets_follow_the_kernels_struct() {
        use core::mem::offset_of;
        let mc = offset_of!(Ucontext, uc_mcontext);
        let mut want = [0; COUNT];
        for (i, w) in want.iter_mut().take(31).enumerate() {
            *w = mc + offset_of!(Sigcontext, regs) + 8 * i;
        }
        want[SP as usize] = mc + offset_of!(Sigcontext, sp);
        want[PC as usize] = mc + offset_of!(Sigcontext, pc);
        assert_eq!(<ArchAArch64 as Arch>::UC_OFFSETS, want);
    }

    #[test]
    fn callee_saved_as_before() {
        let m = <ArchAArch64 as Arch>::CALLEE_SAVED_REGS
            .iter()
            .fold(0u64, |m, &r| m | 1 << r);
        assert_eq!(m, 0x3ff << 19 | 1 << 29 | 1 << 31);
        assert_eq!(
            <ArchAArch64 as Arch>::ENTRY_REGS,
            [32, 31, 29, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28]
        );
    }
}
