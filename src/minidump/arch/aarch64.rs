//! aarch64: `CONTEXT_ARM64` (912 bytes) from `uc_mcontext` (x0-x30, sp, pc, pstate) and the
//! FP/SIMD record the kernel puts in its `__reserved` area (v0-v31, fpsr, fpcr).
#![allow(unsafe_code)]

use super::super::{le32, le64, rd64};

/// Size of `CONTEXT_ARM64`.
pub(crate) const CONTEXT_SIZE: usize = 912;
/// `PROCESSOR_ARCHITECTURE_ARM64`.
pub(crate) const PROCESSOR_ARCHITECTURE: u16 = 12;
/// AAPCS64 has no red zone.
pub(crate) const RED_ZONE: usize = 0;

const CONTEXT_ARM64: u32 = 0x0040_0000;
const CONTROL: u32 = 0x1;
const INTEGER: u32 = 0x2;
const FLOATING_POINT: u32 = 0x4;

/// Offsets in `CONTEXT_ARM64`.
const FLAGS: usize = 0;
const CPSR: usize = 4;
const X0: usize = 8;
const SP: usize = 256;
const PC: usize = 264;
const V0: usize = 272;
const FPCR: usize = 784;
const FPSR: usize = 788;

/// The kernel's `fpsimd_context` record: magic, size, fpsr, fpcr, then v0-v31.
const FPSIMD_MAGIC: u32 = 0x4650_8001;
const FPSIMD_SIZE: usize = 528;
/// Size of `sigcontext.__reserved`.
const RESERVED: usize = 4096;
/// Its offset: after fault_address, x0-x30, sp, pc and pstate (280 bytes), aligned to 16.
const RESERVED_AT: usize = 288;
const _: () = assert!(core::mem::size_of::<libc::mcontext_t>() >= RESERVED_AT + RESERVED);

/// Writes the `CONTEXT_ARM64` of `uc` into `out`; returns its size.
///
/// # Safety
/// `uc` is a `ucontext_t` the kernel passed to a signal handler.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn context_from_ucontext(
    uc: *const libc::ucontext_t,
    out: &mut [u8; CONTEXT_SIZE],
) -> usize {
    out.fill(0);
    // SAFETY: uc is the kernel's ucontext (the caller's contract).
    let m = unsafe { &(*uc).uc_mcontext };
    let mut flags = CONTEXT_ARM64 | CONTROL | INTEGER;
    le32(out, CPSR, m.pstate as u32);
    for (k, &x) in m.regs.iter().enumerate() {
        le64(out, X0 + 8 * k, x);
    }
    le64(out, SP, m.sp);
    le64(out, PC, m.pc);
    // `__reserved` ends the mcontext (16-byte aligned, 4096 bytes): records of
    // `{ magic: u32, size: u32, ... }` up to one with magic 0.
    // SAFETY: the reserved area lies RESERVED_AT bytes into the kernel's sigcontext (which
    // libc's mcontext_t is), RESERVED bytes long, written in full by the kernel.
    let reserved = unsafe {
        core::slice::from_raw_parts(
            (m as *const libc::mcontext_t as *const u8).add(RESERVED_AT),
            RESERVED,
        )
    };
    let mut off = 0;
    while off + 8 <= RESERVED {
        let magic = u32::from_le_bytes(reserved[off..off + 4].try_into().unwrap_or([0; 4]));
        let len = u32::from_le_bytes(reserved[off + 4..off + 8].try_into().unwrap_or([0; 4]));
        let len = len as usize;
        if magic == 0 || len < 8 {
            break;
        }
        if magic == FPSIMD_MAGIC && len >= FPSIMD_SIZE && off + FPSIMD_SIZE <= RESERVED {
            out[FPSR..FPSR + 4].copy_from_slice(&reserved[off + 8..off + 12]);
            out[FPCR..FPCR + 4].copy_from_slice(&reserved[off + 12..off + 16]);
            out[V0..V0 + 512].copy_from_slice(&reserved[off + 16..off + 16 + 512]);
            flags |= FLOATING_POINT;
            break;
        }
        off += len;
    }
    le32(out, FLAGS, flags);
    CONTEXT_SIZE
}

/// The calling function's own registers where the macro is expanded: sp, x29, x19-x28, x30
/// and the address of an instruction there (`[u64; 14]`); see the x86-64 version.
macro_rules! own_registers {
    () => {{
        let mut regs = [0u64; 14];
        // SAFETY: stores registers into `regs` (14 u64s, written at offsets 0-104); no stack
        // use, flags kept.
        unsafe {
            core::arch::asm!(
                "mov {t}, sp",
                "str {t}, [{p}]",
                "str x29, [{p}, #8]",
                "stp x19, x20, [{p}, #16]",
                "stp x21, x22, [{p}, #32]",
                "stp x23, x24, [{p}, #48]",
                "stp x25, x26, [{p}, #64]",
                "stp x27, x28, [{p}, #80]",
                "str x30, [{p}, #96]",
                "adr {t}, .",
                "str {t}, [{p}, #104]",
                p = in(reg) regs.as_mut_ptr(),
                t = out(reg) _,
                options(nostack, preserves_flags),
            )
        };
        regs
    }};
}

/// Writes the `CONTEXT_ARM64` of registers from [`own_registers`]; returns its size.
pub(crate) fn context_from_own(regs: &[u64; 14], out: &mut [u8; CONTEXT_SIZE]) -> usize {
    out.fill(0);
    le32(out, FLAGS, CONTEXT_ARM64 | CONTROL | INTEGER);
    le64(out, SP, regs[0]);
    le64(out, X0 + 8 * 29, regs[1]);
    for k in 0..10 {
        le64(out, X0 + 8 * (19 + k), regs[2 + k]);
    }
    le64(out, X0 + 8 * 30, regs[12]);
    le64(out, PC, regs[13]);
    CONTEXT_SIZE
}

/// The stack pointer and pc of a context written by [`context_from_ucontext`].
pub(crate) fn sp_pc(ctx: &[u8]) -> Option<(u64, u64)> {
    Some((rd64(ctx, SP)?, rd64(ctx, PC)?))
}

/// `CPU_INFORMATION` for arm64 stays zero (the processor features words of other machines);
/// level and revision too.
pub(crate) fn cpu_information(_out: &mut [u8; 24]) -> (u16, u16) {
    (0, 0)
}
