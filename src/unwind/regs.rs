//! Architecture-specific register state: what a walk starts from, how it is captured at a call
//! site, and how it is read out of a signal handler's `ucontext_t`.
//!
//! x86-64 is tested. The aarch64 paths are written behind `cfg(target_arch = "aarch64")` and
//! are not yet tested here (no aarch64 machine).

/// The registers a stack walk needs.
///
/// On x86-64 `fp` is `rbp`; on aarch64 it is `x29` and `lr` is `x30`. `lr` is ignored on x86-64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    /// Program counter of the first frame (exact: not a return address).
    pub pc: usize,
    /// Stack pointer.
    pub sp: usize,
    /// Frame pointer.
    pub fp: usize,
    /// Link register (aarch64 only).
    pub lr: usize,
}

impl Regs {
    /// Registers for a walk that starts at `pc` with stack pointer `sp` and frame pointer `fp`.
    pub const fn new(pc: usize, sp: usize, fp: usize) -> Regs {
        Regs { pc, sp, fp, lr: 0 }
    }
}

/// Offset of a general register's slot inside `ucontext_t`.
#[cfg(target_arch = "x86_64")]
pub(crate) mod uc {
    use core::mem::offset_of;

    const GREGS: usize = offset_of!(libc::ucontext_t, uc_mcontext);

    /// Offset of `uc_mcontext.gregs[REG_RIP]`.
    pub(crate) const PC: usize = GREGS + 8 * libc::REG_RIP as usize;
    /// Offset of `uc_mcontext.gregs[REG_RSP]`.
    pub(crate) const SP: usize = GREGS + 8 * libc::REG_RSP as usize;
    /// Offset of `uc_mcontext.gregs[REG_RBP]`.
    pub(crate) const FP: usize = GREGS + 8 * libc::REG_RBP as usize;
    /// aarch64 only.
    pub(crate) const LR: Option<usize> = None;
    /// Where the `ucontext_t` sits relative to the stack pointer when the signal trampoline
    /// runs: the kernel's `rt_sigframe` starts with the handler's return address (`pretcode`),
    /// which the handler's `ret` popped, so `sp` points straight at `uc`.
    pub(crate) const FROM_TRAMPOLINE_SP: usize = 0;
    /// The trampoline glibc (and musl, and Go) install as `sa_restorer`:
    /// `mov $15, %rax` (`__NR_rt_sigreturn`) then `syscall`.
    pub(crate) const TRAMPOLINE: &[u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
}

/// Offsets inside the aarch64 `ucontext_t` (not yet tested here).
#[cfg(target_arch = "aarch64")]
pub(crate) mod uc {
    use core::mem::offset_of;

    const MC: usize = offset_of!(libc::ucontext_t, uc_mcontext);
    /// Offset of `uc_mcontext.pc`.
    pub(crate) const PC: usize = MC + offset_of!(libc::mcontext_t, pc);
    /// Offset of `uc_mcontext.sp`.
    pub(crate) const SP: usize = MC + offset_of!(libc::mcontext_t, sp);
    /// Offset of `uc_mcontext.regs[29]`.
    pub(crate) const FP: usize = MC + offset_of!(libc::mcontext_t, regs) + 8 * 29;
    /// Offset of `uc_mcontext.regs[30]`.
    pub(crate) const LR: Option<usize> = Some(MC + offset_of!(libc::mcontext_t, regs) + 8 * 30);
    /// The kernel's `rt_sigframe` on arm64 is `{ siginfo_t info; ucontext_t uc; }` at `sp`.
    pub(crate) const FROM_TRAMPOLINE_SP: usize = core::mem::size_of::<libc::siginfo_t>();
    /// The vDSO's `__kernel_rt_sigreturn`: `mov x8, #139` then `svc #0`.
    pub(crate) const TRAMPOLINE: &[u8] = &[0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];
}

/// Reads the registers out of a `ucontext_t` in memory the caller vouches for.
///
/// # Safety
/// `uc` must point to a readable `ucontext_t`.
pub(crate) unsafe fn from_ucontext(uc: *const libc::ucontext_t) -> Regs {
    let base = uc as usize;
    // SAFETY: the caller guarantees a readable ucontext_t; the offsets lie inside it.
    let word = |off: usize| unsafe { core::ptr::read_unaligned((base + off) as *const usize) };
    Regs {
        pc: word(uc::PC),
        sp: word(uc::SP),
        fp: word(uc::FP),
        lr: uc::LR.map_or(0, word),
    }
}

/// The entry of every `capture*` function: records the caller's return address, stack pointer
/// and frame pointer exactly as they are at the call, then tail-jumps into
/// `inner(buf, len, mode, ra, sp, fp)`, which returns straight to the caller. Being naked, it
/// has no frame of its own, so it is correct with or without frame pointers.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub(crate) extern "C" fn capture_entry(buf: *mut usize, len: usize, mode: usize) -> usize {
    core::arch::naked_asm!(
        // rcx (4th argument) = the return address the call pushed.
        "mov rcx, [rsp]",
        // r8 (5th) = the caller's rsp once that return address is popped.
        "lea r8, [rsp + 8]",
        // r9 (6th) = the caller's rbp, untouched so far.
        "mov r9, rbp",
        // Tail call: the inner function returns directly to our caller.
        "jmp {inner}",
        inner = sym super::walk::capture_inner,
    )
}

/// aarch64 variant (not yet tested here).
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
pub(crate) extern "C" fn capture_entry(buf: *mut usize, len: usize, mode: usize) -> usize {
    core::arch::naked_asm!(
        // x3 = the return address (link register).
        "mov x3, x30",
        // x4 = the caller's sp (a `bl` does not move sp).
        "mov x4, sp",
        // x5 = the caller's frame pointer.
        "mov x5, x29",
        // Tail call: the inner function returns directly to our caller through x30.
        "b {inner}",
        inner = sym super::walk::capture_inner,
    )
}
