//! x86-64: `CONTEXT_AMD64` (1232 bytes) from `uc_mcontext` (general registers, segment
//! selectors, flags) and its FXSAVE area (x87, MXCSR, XMM0-15).
#![allow(unsafe_code)]

use super::{le16, le32, le64, rd64};

/// Size of `CONTEXT_AMD64`.
pub(crate) const CONTEXT_SIZE: usize = 1232;
/// `PROCESSOR_ARCHITECTURE_AMD64`.
pub(crate) const PROCESSOR_ARCHITECTURE: u16 = 9;
/// Bytes below the stack pointer the ABI lets a leaf function use (the red zone): part of the
/// stack a dump keeps.
pub(crate) const RED_ZONE: usize = 128;

const CONTEXT_AMD64: u32 = 0x0010_0000;
const CONTROL: u32 = 0x1;
const INTEGER: u32 = 0x2;
const SEGMENTS: u32 = 0x4;
const FLOATING_POINT: u32 = 0x8;

/// Offsets in `CONTEXT_AMD64`.
const FLAGS: usize = 48;
const MXCSR: usize = 52;
const SEG_CS: usize = 56;
const SEG_FS: usize = 62;
const SEG_GS: usize = 64;
const SEG_SS: usize = 66;
const EFLAGS: usize = 68;
const RAX: usize = 120;
const RSP: usize = 152;
const RIP: usize = 248;
const FLT_SAVE: usize = 256;

/// Writes the `CONTEXT_AMD64` of `uc` into `out`; returns its size.
///
/// # Safety
/// `uc` is a `ucontext_t` the kernel passed to a signal handler (its `fpregs` null or valid).
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
    let g = |i: i32| m.gregs[i as usize] as u64;
    let mut flags = CONTEXT_AMD64 | CONTROL | INTEGER | SEGMENTS;
    // Rax, Rcx, Rdx, Rbx, Rsp, Rbp, Rsi, Rdi, R8-R15, Rip: the order of CONTEXT_AMD64.
    let order = [
        libc::REG_RAX,
        libc::REG_RCX,
        libc::REG_RDX,
        libc::REG_RBX,
        libc::REG_RSP,
        libc::REG_RBP,
        libc::REG_RSI,
        libc::REG_RDI,
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
    for (k, reg) in order.into_iter().enumerate() {
        le64(out, RAX + 8 * k, g(reg));
    }
    le32(out, EFLAGS, g(libc::REG_EFL) as u32);
    // The kernel's sigcontext: cs, gs, fs and ss in 16 bits each.
    let sel = g(libc::REG_CSGSFS);
    le16(out, SEG_CS, sel as u16);
    le16(out, SEG_GS, (sel >> 16) as u16);
    le16(out, SEG_FS, (sel >> 32) as u16);
    le16(out, SEG_SS, (sel >> 48) as u16);
    if !m.fpregs.is_null() {
        // The kernel's FXSAVE image is XMM_SAVE_AREA32 byte for byte.
        let fx = m.fpregs as *const u8;
        // SAFETY: fpregs points at the 512-byte FXSAVE area of the signal frame.
        let area = unsafe { core::slice::from_raw_parts(fx, 512) };
        out[FLT_SAVE..FLT_SAVE + 512].copy_from_slice(area);
        // MxCsr also has a field of its own (FXSAVE keeps it at byte 24).
        out.copy_within(FLT_SAVE + 24..FLT_SAVE + 28, MXCSR);
        flags |= FLOATING_POINT;
    }
    le32(out, FLAGS, flags);
    CONTEXT_SIZE
}

/// The calling function's own registers, at the point where the macro is expanded: `rsp`,
/// `rbp`, `rbx`, `r12`-`r15` and the address of an instruction there (as `[u64; 8]`). With
/// the unwind information at that address they describe the calling function's frame, which
/// stays as it is (return address, saved registers) for as long as the function runs: the
/// writing thread's own context, consistent with the stack copied while the function runs.
macro_rules! own_registers {
    () => {{
        let mut regs = [0u64; 8];
        // SAFETY: stores registers into `regs` (8 u64s, written at offsets 0-56); no stack
        // use, flags kept.
        unsafe {
            core::arch::asm!(
                "mov [{p}], rsp",
                "mov [{p} + 8], rbp",
                "mov [{p} + 16], rbx",
                "mov [{p} + 24], r12",
                "mov [{p} + 32], r13",
                "mov [{p} + 40], r14",
                "mov [{p} + 48], r15",
                "lea {t}, [rip]",
                "mov [{p} + 56], {t}",
                p = in(reg) regs.as_mut_ptr(),
                t = out(reg) _,
                options(nostack, preserves_flags),
            )
        };
        regs
    }};
}
pub(crate) use own_registers;

/// Writes the `CONTEXT_AMD64` of registers from [`own_registers`] (control and integer
/// registers: those a stack walk needs); returns its size.
pub(crate) fn context_from_own(regs: &[u64; 8], out: &mut [u8; CONTEXT_SIZE]) -> usize {
    out.fill(0);
    le32(out, FLAGS, CONTEXT_AMD64 | CONTROL | INTEGER);
    le64(out, RSP, regs[0]);
    le64(out, RAX + 8 * 5, regs[1]); // Rbp
    le64(out, RAX + 8 * 3, regs[2]); // Rbx
    for k in 0..4 {
        le64(out, RAX + 8 * (12 + k), regs[3 + k]); // R12-R15
    }
    le64(out, RIP, regs[7]);
    CONTEXT_SIZE
}

/// The stack pointer and instruction pointer of a context written by
/// [`context_from_ucontext`].
pub(crate) fn sp_pc(ctx: &[u8]) -> Option<(u64, u64)> {
    Some((rd64(ctx, RSP)?, rd64(ctx, RIP)?))
}

/// `CPU_INFORMATION` for x86: the vendor id (`cpuid` leaf 0), the version and feature words
/// (leaf 1) and the AMD extended features (leaf 0x80000001); and the processor level
/// (family) and revision (model << 8 | stepping) of `MINIDUMP_SYSTEM_INFO`.
pub(crate) fn cpu_information(out: &mut [u8; 24]) -> (u16, u16) {
    // A safe function in recent Rust (1.95), an `unsafe fn` in older ones (1.88 to 1.91 at least).
    #[allow(unused_unsafe)]
    // SAFETY: `cpuid` is unprivileged on every x86-64 CPU and has no memory effects.
    let cpuid = |leaf: u32| unsafe { core::arch::x86_64::__cpuid(leaf) };
    let l0 = cpuid(0);
    le32(out, 0, l0.ebx);
    le32(out, 4, l0.edx);
    le32(out, 8, l0.ecx);
    if l0.eax < 1 {
        return (0, 0);
    }
    let l1 = cpuid(1);
    le32(out, 12, l1.eax);
    le32(out, 16, l1.edx);
    if cpuid(0x8000_0000).eax >= 0x8000_0001 {
        le32(out, 20, cpuid(0x8000_0001).edx);
    }
    let base_family = (l1.eax >> 8) & 0xf;
    let mut family = base_family;
    let mut model = (l1.eax >> 4) & 0xf;
    if base_family == 0xf {
        family += (l1.eax >> 20) & 0xff;
    }
    if base_family == 0x6 || base_family == 0xf {
        model |= ((l1.eax >> 16) & 0xf) << 4;
    }
    let stepping = l1.eax & 0xf;
    (family as u16, ((model << 8) | stepping) as u16)
}
