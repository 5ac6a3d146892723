//! x86-64: DWARF register numbers (System V psABI, figure 3.36, as gimli names them), the `ucontext_t` layout, glibc's
//! signal trampoline, and the capture entry.

mod entry;
pub(crate) use entry::{entry_asm, ENTRY_REGS};

use gimli::X86_64;

use super::BadPcReturn;

/// Register slots: `rax`..`r15` and `rip`, by DWARF number.
pub(crate) const COUNT: usize = 17;
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
/// No link register.
pub(crate) const LR: Option<u16> = None;

/// The registers a call preserves: `rbx`, `rbp`, `rsp`, `r12`-`r15`. After a call the others
/// hold whatever the callee left in them.
pub(crate) const CALLEE_SAVED_REGS: [u16; 7] = [RBX, FP, SP, R12, R13, R14, R15];
/// [`CALLEE_SAVED_REGS`] as a mask of register slots.
pub(crate) const CALLEE_SAVED: u64 = mask(&CALLEE_SAVED_REGS);

/// The callee-saved registers a compiled rule tracks (its lanes): rbx, rbp, r12-r15.
pub(crate) const SAVED: [u16; LANES] = [RBX, FP, R12, R13, R14, R15];
/// How many.
pub(crate) const LANES: usize = 6;
/// The frame pointer's lane.
pub(crate) const FP_LANE: usize = 1;

/// The registers of the lanes in `lanes` other than the frame pointer's, as a mask of register
/// slots: rbx is lane 0, r12-r15 lanes 2-5.
#[inline(always)]
pub(crate) const fn lane_regs(lanes: u64) -> u64 {
    (lanes & 1) << RBX | (lanes >> 2) << R12
}

/// Whether DWARF register `n` is a general register (`rax`..`r15`).
#[inline]
pub(crate) const fn is_gpr(n: u16) -> bool {
    n <= R15
}

/// A row without a rule for `rip` marks the outermost frame (every x86-64 CIE gives one).
pub(crate) const RA_UNSPECIFIED_IS_SAME: bool = false;

/// Instructions are byte-aligned: any pc may be one.
pub(crate) const CODE_ALIGN: usize = 1;

/// x86-64 has no pointer authentication: a return address is used as it is.
#[inline(always)]
pub(crate) fn strip_ra(ra: usize) -> usize {
    ra
}

/// No code without CFI returns through a register (x86-64's PLT entries have CFI).
pub(crate) const LINK_STUB: &[(u32, u32)] = &[];

/// A `call` through a bad pointer pushed the return address.
pub(crate) const BAD_PC_RETURN: BadPcReturn = BadPcReturn::TopOfStack;

/// `push rbp; mov rbp, rsp`: the caller's stack pointer is the frame record's end.
pub(crate) const RECORD_GIVES_SP: bool = true;

/// gimli reads x86-64 CFI without vendor extensions.
pub(crate) const VENDOR: gimli::Vendor = gimli::Vendor::Default;

/// Offset of each register slot in `ucontext_t` (`uc_mcontext.gregs[REG_*]`).
pub(crate) const UC_OFFSETS: [usize; COUNT] = {
    const GREGS: usize = core::mem::offset_of!(libc::ucontext_t, uc_mcontext);
    let greg = [
        libc::REG_RAX,
        libc::REG_RDX,
        libc::REG_RCX,
        libc::REG_RBX,
        libc::REG_RSI,
        libc::REG_RDI,
        libc::REG_RBP,
        libc::REG_RSP,
        libc::REG_R8,
        libc::REG_R9,
        libc::REG_R10,
        libc::REG_R11,
        libc::REG_R12,
        libc::REG_R13,
        libc::REG_R14,
        libc::REG_R15,
        libc::REG_RIP,
    ];
    let mut out = [0; COUNT];
    let mut i = 0;
    while i < COUNT {
        out[i] = GREGS + 8 * greg[i] as usize;
        i += 1;
    }
    out
};

/// Where the `ucontext_t` sits relative to the stack pointer when the signal trampoline runs:
/// the kernel's `rt_sigframe` starts with the handler's return address (`pretcode`), which the
/// handler's `ret` popped, so `sp` points straight at `uc`.
pub(crate) const UC_FROM_TRAMPOLINE_SP: usize = 0;

/// The trampoline glibc (and musl, and Go) install as `sa_restorer`: `mov $15, %rax`
/// (`__NR_rt_sigreturn`) then `syscall`.
pub(crate) const TRAMPOLINE: &[u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

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
