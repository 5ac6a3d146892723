//! x86-64: DWARF register numbers (System V psABI, figure 3.36, as gimli names them), the
//! `ucontext_t` layout, glibc's signal trampoline, and the capture entry. Compiled on every
//! host (see [`super`]); only the entry's instructions (inline assembly) exist on x86-64 alone.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

mod entry;
#[cfg(target_arch = "x86_64")]
pub(crate) use entry::entry_asm;

use gimli::X86_64;

use super::{Arch, BadPcReturn};
use crate::context::x86_64 as uc;

/// x86-64, as the unwinder sees it.
pub(crate) struct ArchX86_64;

/// `rbx`.
pub(crate) const RBX: u16 = X86_64::RBX.0;
/// `rbp`, the frame pointer.
pub(crate) const FP: u16 = X86_64::RBP.0;
/// `rsp`.
pub(crate) const SP: u16 = X86_64::RSP.0;
/// `r12`.
pub(crate) const R12: u16 = X86_64::R12.0;
/// `r13`.
pub(crate) const R13: u16 = X86_64::R13.0;
/// `r14`.
pub(crate) const R14: u16 = X86_64::R14.0;
/// `r15`.
pub(crate) const R15: u16 = X86_64::R15.0;
/// The return-address column (`rip`).
pub(crate) const RA: u16 = X86_64::RA.0;
/// The slot of the frame's pc: the return-address column itself.
pub(crate) const PC: u16 = RA;

/// Register slots: `rax`..`r15` and `rip`, by DWARF number.
const COUNT: usize = 17;

/// The index in `gregs` (glibc's `REG_*`, the order of the kernel's `struct sigcontext`) of
/// each register slot, in DWARF order (rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp, r8-r15, rip),
/// from the `ucontext_t` layout of [`crate::context::x86_64`].
const GREG: [usize; COUNT] = [
    uc::REG_RAX,
    uc::REG_RDX,
    uc::REG_RCX,
    uc::REG_RBX,
    uc::REG_RSI,
    uc::REG_RDI,
    uc::REG_RBP,
    uc::REG_RSP,
    uc::REG_R8,
    uc::REG_R9,
    uc::REG_R10,
    uc::REG_R11,
    uc::REG_R12,
    uc::REG_R13,
    uc::REG_R14,
    uc::REG_R15,
    uc::REG_RIP,
];

/// Offset of each register slot in `ucontext_t` (`uc_mcontext.gregs[REG_*]`), computed at
/// build time from context's layout (which is checked against this machine's libc there).
const UC_OFFSETS: [usize; COUNT] = {
    let mut out = [0; COUNT];
    let mut i = 0;
    while i < COUNT {
        out[i] = uc::uc_greg(GREG[i]);
        i += 1;
    }
    out
};

impl Arch for ArchX86_64 {
    const COUNT: usize = COUNT;
    const FP: u16 = FP;
    const SP: u16 = SP;
    const RA: u16 = RA;
    const PC: u16 = PC;
    /// No link register.
    const LR: Option<u16> = None;
    /// `rbx`, `rbp`, `rsp`, `r12`-`r15`. After a call the others hold whatever the callee left
    /// in them.
    const CALLEE_SAVED_REGS: &'static [u16] = &[RBX, FP, SP, R12, R13, R14, R15];
    /// rbx, rbp, r12-r15: [`Arch::lane_regs`] depends on this order.
    const SAVED: &'static [u16] = &[RBX, FP, R12, R13, R14, R15];
    const FP_LANE: usize = 1;
    /// A row without a rule for `rip` marks the outermost frame (every x86-64 CIE gives one).
    const RA_UNSPECIFIED_IS_SAME: bool = false;
    /// Instructions are byte-aligned: any pc may be one.
    const CODE_ALIGN: usize = 1;
    /// No code without CFI returns through a register (x86-64's PLT entries have CFI).
    const LINK_STUB: &'static [(u32, u32)] = &[];
    /// A `call` through a bad pointer pushed the return address.
    const BAD_PC_RETURN: BadPcReturn = BadPcReturn::TopOfStack;
    /// `push rbp; mov rbp, rsp`: the caller's stack pointer is the frame record's end.
    const RECORD_GIVES_SP: bool = true;
    /// gimli reads x86-64 CFI without vendor extensions.
    const VENDOR: gimli::Vendor = gimli::Vendor::Default;
    const UC_OFFSETS: &'static [usize] = &UC_OFFSETS;
    /// The kernel's `rt_sigframe` starts with the handler's return address (`pretcode`), which
    /// the handler's `ret` popped, so `sp` points straight at `uc`.
    const UC_FROM_TRAMPOLINE_SP: usize = 0;
    /// The trampoline glibc (and musl, and Go) install as `sa_restorer`: `mov $15, %rax`
    /// (`__NR_rt_sigreturn`) then `syscall`.
    const TRAMPOLINE: &'static [u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
    const ENTRY_REGS: &'static [u16] = &entry::ENTRY_REGS;

    /// rbx is lane 0, r12-r15 lanes 2-5.
    #[inline(always)]
    fn lane_regs(lanes: u64) -> u64 {
        (lanes & 1) << RBX | (lanes >> 2) << R12
    }

    /// `rax`..`r15`.
    #[inline]
    fn is_gpr(n: u16) -> bool {
        n <= R15
    }
}

/// x86-64 has no pointer authentication: a return address is used as it is.
#[inline(always)]
pub(crate) fn strip_ra(ra: usize) -> usize {
    ra
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's x86-64 `struct ucontext` up to the registers of its `struct sigcontext`
    /// (asm/ucontext.h, asm/sigcontext.h, asm-generic/signal.h's `stack_t`), as C lays it out.
    #[repr(C)]
    struct Ucontext {
        uc_flags: u64,
        uc_link: u64,
        ss_sp: u64,
        ss_flags: i32,
        ss_size: u64,
        r8_r15: [u64; 8],
        rdi: u64,
        rsi: u64,
        rbp: u64,
        rbx: u64,
        rdx: u64,
        rax: u64,
        rcx: u64,
        rsp: u64,
        rip: u64,
    }

    #[test]
    fn uc_offsets_follow_the_kernels_struct() {
        use core::mem::offset_of;
        let r8 = offset_of!(Ucontext, r8_r15);
        let want = [
            offset_of!(Ucontext, rax),
            offset_of!(Ucontext, rdx),
            offset_of!(Ucontext, rcx),
            offset_of!(Ucontext, rbx),
            offset_of!(Ucontext, rsi),
            offset_of!(Ucontext, rdi),
            offset_of!(Ucontext, rbp),
            offset_of!(Ucontext, rsp),
            r8,
            r8 + 8,
            r8 + 16,
            r8 + 24,
            r8 + 32,
            r8 + 40,
            r8 + 48,
            r8 + 56,
            offset_of!(Ucontext, rip),
        ];
        assert_eq!(<ArchX86_64 as Arch>::UC_OFFSETS, want);
    }
}
