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

/// DWARF register numbers of x86-64 (System V psABI, figure 3.36).
#[cfg(target_arch = "x86_64")]
pub(crate) mod dw {
    /// `rbx`.
    pub(crate) const RBX: u16 = 3;
    /// `rbp`.
    pub(crate) const RBP: u16 = 6;
    /// `rsp`.
    pub(crate) const RSP: u16 = 7;
    /// `r12`.
    pub(crate) const R12: u16 = 12;
    /// The return address column (`rip`).
    pub(crate) const RA: u16 = 16;
    /// How many registers a [`super::RegSet`] holds: `rax`..`r15` and `rip`.
    pub(crate) const COUNT: usize = 17;
    /// The registers a call preserves: `rbx`, `rbp`, `rsp`, `r12`-`r15`. After a call the
    /// others hold whatever the callee left in them.
    pub(crate) const CALLEE_SAVED: u32 =
        1 << RBX | 1 << RBP | 1 << RSP | 1 << 12 | 1 << 13 | 1 << 14 | 1 << 15;
    /// `ucontext_t` `gregs` index of each DWARF register (libc's `REG_*`).
    pub(crate) const GREG: [usize; COUNT] = [
        libc::REG_RAX as usize,
        libc::REG_RDX as usize,
        libc::REG_RCX as usize,
        libc::REG_RBX as usize,
        libc::REG_RSI as usize,
        libc::REG_RDI as usize,
        libc::REG_RBP as usize,
        libc::REG_RSP as usize,
        libc::REG_R8 as usize,
        libc::REG_R9 as usize,
        libc::REG_R10 as usize,
        libc::REG_R11 as usize,
        libc::REG_R12 as usize,
        libc::REG_R13 as usize,
        libc::REG_R14 as usize,
        libc::REG_R15 as usize,
        libc::REG_RIP as usize,
    ];
}

/// A frame's registers by DWARF number, each either known or not. The walk keeps every
/// register it can prove: all of them at a signal frame (from the `ucontext_t`), the
/// callee-saved ones across calls (restored by the CFI or unchanged), so that a later frame whose
/// CFA is based on, say, `rbx` still unwinds.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegSet {
    /// Values by DWARF number.
    pub(crate) v: [usize; dw::COUNT],
    /// Bit `n` set: register `n` is known.
    pub(crate) valid: u32,
}

#[cfg(target_arch = "x86_64")]
impl RegSet {
    /// Only pc, sp and fp known.
    pub(crate) fn from_regs(r: Regs) -> RegSet {
        let mut s = RegSet {
            v: [0; dw::COUNT],
            valid: 0,
        };
        s.set(dw::RA, r.pc);
        s.set(dw::RSP, r.sp);
        s.set(dw::RBP, r.fp);
        s
    }

    /// A copy with only the registers a call preserves and the pc (what a walk from a return
    /// address can know); cheaper than copying the whole set.
    #[inline(always)]
    pub(crate) fn callee_saved(&self) -> RegSet {
        let mut s = RegSet {
            v: [0; dw::COUNT],
            valid: self.valid & (dw::CALLEE_SAVED | 1 << dw::RA),
        };
        for r in [dw::RBX, dw::RBP, dw::RSP, 12, 13, 14, 15, dw::RA] {
            s.v[r as usize] = self.v[r as usize];
        }
        s
    }

    /// The register's value if known.
    #[inline]
    pub(crate) fn get(&self, r: u16) -> Option<usize> {
        let i = r as usize;
        (i < dw::COUNT && self.valid & (1 << i) != 0).then(|| self.v[i])
    }

    /// Sets a register (ignored beyond the tracked ones).
    #[inline]
    pub(crate) fn set(&mut self, r: u16, value: usize) {
        let i = r as usize;
        if i < dw::COUNT {
            self.v[i] = value;
            self.valid |= 1 << i;
        }
    }

    /// Marks a register unknown.
    #[inline]
    pub(crate) fn forget(&mut self, r: u16) {
        if (r as usize) < dw::COUNT {
            self.valid &= !(1 << r);
        }
    }

    /// Keeps only the registers in `mask` known.
    #[inline]
    pub(crate) fn keep_only(&mut self, mask: u32) {
        self.valid &= mask;
    }

    /// The program counter (exact or a return address, as the walk knows).
    #[inline]
    pub(crate) fn pc(&self) -> usize {
        self.v[dw::RA as usize]
    }

    /// The stack pointer.
    #[inline]
    pub(crate) fn sp(&self) -> usize {
        self.v[dw::RSP as usize]
    }

    /// The frame pointer, if known.
    #[inline]
    pub(crate) fn fp(&self) -> Option<usize> {
        self.get(dw::RBP)
    }

    /// Every register read from a `ucontext_t` through `word(offset)`.
    pub(crate) fn from_gregs(mut word: impl FnMut(usize) -> Option<usize>) -> Option<RegSet> {
        const GREGS: usize = core::mem::offset_of!(libc::ucontext_t, uc_mcontext);
        let mut s = RegSet {
            v: [0; dw::COUNT],
            valid: 0,
        };
        for (r, g) in dw::GREG.iter().enumerate() {
            s.set(r as u16, word(GREGS + 8 * g)?);
        }
        Some(s)
    }
}

/// The registers the naked capture entry saves: the caller's return address and stack pointer
/// and the callee-saved registers as they are at the call.
#[cfg(target_arch = "x86_64")]
#[repr(C)]
pub(crate) struct EntryRegs {
    pub(crate) ra: usize,
    pub(crate) sp: usize,
    pub(crate) rbp: usize,
    pub(crate) rbx: usize,
    pub(crate) r12: usize,
    pub(crate) r13: usize,
    pub(crate) r14: usize,
    pub(crate) r15: usize,
}

#[cfg(target_arch = "x86_64")]
impl EntryRegs {
    /// As a register set: pc = the return address, sp, and the callee-saved registers.
    pub(crate) fn to_set(&self) -> RegSet {
        let mut s = RegSet::from_regs(Regs::new(self.ra, self.sp, self.rbp));
        s.set(dw::RBX, self.rbx);
        s.set(dw::R12, self.r12);
        s.set(dw::R12 + 1, self.r13);
        s.set(dw::R12 + 2, self.r14);
        s.set(dw::R12 + 3, self.r15);
        s
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

/// The entry of every `capture*` function: saves the caller's return address, stack pointer
/// and callee-saved registers exactly as they are at the call into an [`EntryRegs`] on its own
/// stack, then calls `inner(buf, len, mode, &regs, out)`. Being naked, it is correct with or without
/// frame pointers; its CFI (`.cfi_adjust_cfa_offset`) lets a profiler unwind through it.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub(crate) extern "C" fn capture_entry(
    buf: *mut usize,
    len: usize,
    mode: usize,
    out: *mut super::Walk,
) -> usize {
    core::arch::naked_asm!(
        // Naked functions get no CFI of their own: describe this one (CFA = rsp + 8 at entry).
        ".cfi_startproc",
        // r8 (5th argument of inner) = out, our 4th.
        "mov r8, rcx",
        // 64 bytes of EntryRegs plus 8 of padding: rsp was 8 mod 16 at entry (the call pushed
        // the return address), so it is 16-byte aligned again for the call below.
        "sub rsp, 72",
        ".cfi_adjust_cfa_offset 72",
        // ra: the return address the call pushed.
        "mov rax, [rsp + 72]",
        "mov [rsp], rax",
        // sp: the caller's rsp once that return address is popped.
        "lea rax, [rsp + 80]",
        "mov [rsp + 8], rax",
        // The callee-saved registers, untouched so far.
        "mov [rsp + 16], rbp",
        "mov [rsp + 24], rbx",
        "mov [rsp + 32], r12",
        "mov [rsp + 40], r13",
        "mov [rsp + 48], r14",
        "mov [rsp + 56], r15",
        // rcx (4th argument) = &EntryRegs; rdi, rsi, rdx still hold buf, len, mode.
        "mov rcx, rsp",
        "call {inner}",
        "add rsp, 72",
        ".cfi_adjust_cfa_offset -72",
        "ret",
        ".cfi_endproc",
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
