//! aarch64: DWARF register numbers ("DWARF for the Arm 64-bit Architecture": x0-x30 are 0-30,
//! sp 31, pc 32, as gimli names them), the `ucontext_t` layout, the kernel's signal trampoline,
//! pointer authentication, and the capture entry.
#![allow(unsafe_code)]

mod entry;
pub(crate) use entry::{entry_asm, ENTRY_REGS};

use gimli::AArch64;

use super::BadPcReturn;

/// Register slots: x0-x30, sp and the pc (DWARF 0-32; no CFI has a column for the pc).
pub(crate) const COUNT: usize = 33;
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
/// The link register.
pub(crate) const LR: Option<u16> = Some(RA);

/// The registers a call preserves (AAPCS64): x19-x28, x29, sp. x30 is the return address of
/// the call itself: the caller's own x30 is not known after it.
pub(crate) const CALLEE_SAVED_REGS: [u16; 12] = join(&X19_X28, &[FP, SP]);
/// [`CALLEE_SAVED_REGS`] as a mask of register slots.
pub(crate) const CALLEE_SAVED: u64 = 0x3ff << X19 | 1 << FP | 1 << SP;

/// The callee-saved registers a compiled rule tracks (its lanes): x29 first (the hot loop
/// reads the frame pointer's lane from the first rule word), then x19-x28.
pub(crate) const SAVED: [u16; LANES] = join(&[FP], &X19_X28);
/// How many.
pub(crate) const LANES: usize = 11;
/// The frame pointer's lane.
pub(crate) const FP_LANE: usize = 0;

/// The registers of the lanes in `lanes` other than the frame pointer's, as a mask of register
/// slots: lanes 1-10 are x19-x28.
#[inline(always)]
pub(crate) const fn lane_regs(lanes: u64) -> u64 {
    (lanes >> 1) << X19
}

/// Whether DWARF register `n` is a general register (x0-x30).
#[inline]
pub(crate) const fn is_gpr(n: u16) -> bool {
    n <= AArch64::X30.0
}

/// A row without a rule for x30 keeps it: a leaf that has not saved the link register returns
/// through it.
pub(crate) const RA_UNSPECIFIED_IS_SAME: bool = true;

/// Instructions are 4 bytes, 4-byte aligned.
pub(crate) const CODE_ALIGN: usize = 4;

/// The return address without its pointer authentication code: code built with
/// `-mbranch-protection=pac-ret` (or `standard`) signs x30 (`paciasp`) before saving it, so the
/// saved word carries a PAC in its top bits. `xpaclri` (`hint #7`) strips it from x30; it is a
/// no-op on a CPU without pointer authentication, where nothing is signed, and on an unsigned
/// pointer.
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

/// A PLT entry (`adrp x16, page; ldr x17, [x16, #off]; add x16, x16, #off; br x17`), as mask
/// and value of each instruction: the linker emits no CFI for it, and code there has neither
/// touched the stack nor the link register, so a frame 0 inside one returns through x30.
pub(crate) const LINK_STUB: &[(u32, u32)] = &[
    (0x9f00_001f, 0x9000_0010),
    (0xffc0_03ff, 0xf940_0211),
    (0xffc0_03ff, 0x9100_0210),
    (0xffff_ffff, 0xd61f_0220),
];

/// A `blr` through a bad pointer left the return address in x30 and the stack as it was.
pub(crate) const BAD_PC_RETURN: BadPcReturn = BadPcReturn::LinkRegister;

/// A frame record (`stp x29, x30`) may sit anywhere in its frame (LLVM puts it at the top, GCC
/// at the bottom): it does not give the caller's stack pointer.
pub(crate) const RECORD_GIVES_SP: bool = false;

/// gimli must read `DW_CFA_AARCH64_negate_ra_state` (the opcode SPARC's `window_save` shares).
pub(crate) const VENDOR: gimli::Vendor = gimli::Vendor::AArch64;

/// Offset of each register slot in `ucontext_t`: `uc_mcontext.regs[0..31]`, `.sp`, `.pc`.
pub(crate) const UC_OFFSETS: [usize; COUNT] = {
    use core::mem::offset_of;
    const MC: usize = offset_of!(libc::ucontext_t, uc_mcontext);
    let mut out = [0; COUNT];
    let mut i = 0;
    while i < 31 {
        out[i] = MC + offset_of!(libc::mcontext_t, regs) + 8 * i;
        i += 1;
    }
    out[SP as usize] = MC + offset_of!(libc::mcontext_t, sp);
    out[PC as usize] = MC + offset_of!(libc::mcontext_t, pc);
    out
};

/// The kernel's `rt_sigframe` on arm64 is `{ siginfo_t info; ucontext_t uc; }` at the stack
/// pointer the handler started with, which is the stack pointer when it returns to the
/// trampoline.
pub(crate) const UC_FROM_TRAMPOLINE_SP: usize = core::mem::size_of::<libc::siginfo_t>();

/// The vDSO's `__kernel_rt_sigreturn` (and qemu-user's and musl's trampolines):
/// `mov x8, #139` (`__NR_rt_sigreturn`) then `svc #0`.
pub(crate) const TRAMPOLINE: &[u8] = &[0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];

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
