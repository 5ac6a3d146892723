//! x86-64: the layout of the kernel's `ucontext_t` (where each general register and the
//! FXSAVE pointer lie: the one table the unwinder's `UC_OFFSETS` and the oops block read), and
//! `CONTEXT_AMD64` (1232 bytes) from `uc_mcontext` (general registers, segment selectors, flags)
//! and its FXSAVE area (x87, MXCSR, XMM0-15).
//!
//! Compiled on every host: the layout is data and the codec reads the context through it, so
//! a `cargo check` on aarch64 type-checks them and their unit tests run there. Only the inline
//! assembly (`own_registers!`, `cpuid`) and the checks against this machine's own
//! `libc::ucontext_t` keep `#[cfg(target_arch = "x86_64")]`.
#![allow(unsafe_code)]

use super::{le16, le32, le64, rd64, read_word};

/// Where `uc_mcontext.gregs` starts in `ucontext_t`: after `uc_flags`, `uc_link` and the
/// 24-byte `uc_stack` (the kernel's `struct ucontext`, asm/ucontext.h, whose `uc_mcontext` is
/// `struct sigcontext`, asm/sigcontext.h, starting with the general registers).
pub(crate) const UC_MCONTEXT: usize = 40;

/// Index of `r8` in `gregs` (glibc's `REG_*`: the order of the kernel's `struct sigcontext`).
pub(crate) const REG_R8: usize = 0;
/// Index of `r9` in `gregs`.
pub(crate) const REG_R9: usize = 1;
/// Index of `r10` in `gregs`.
pub(crate) const REG_R10: usize = 2;
/// Index of `r11` in `gregs`.
pub(crate) const REG_R11: usize = 3;
/// Index of `r12` in `gregs`.
pub(crate) const REG_R12: usize = 4;
/// Index of `r13` in `gregs`.
pub(crate) const REG_R13: usize = 5;
/// Index of `r14` in `gregs`.
pub(crate) const REG_R14: usize = 6;
/// Index of `r15` in `gregs`.
pub(crate) const REG_R15: usize = 7;
/// Index of `rdi` in `gregs`.
pub(crate) const REG_RDI: usize = 8;
/// Index of `rsi` in `gregs`.
pub(crate) const REG_RSI: usize = 9;
/// Index of `rbp` in `gregs`.
pub(crate) const REG_RBP: usize = 10;
/// Index of `rbx` in `gregs`.
pub(crate) const REG_RBX: usize = 11;
/// Index of `rdx` in `gregs`.
pub(crate) const REG_RDX: usize = 12;
/// Index of `rax` in `gregs`.
pub(crate) const REG_RAX: usize = 13;
/// Index of `rcx` in `gregs`.
pub(crate) const REG_RCX: usize = 14;
/// Index of `rsp` in `gregs`.
pub(crate) const REG_RSP: usize = 15;
/// Index of `rip` in `gregs`.
pub(crate) const REG_RIP: usize = 16;
/// Index of `eflags` in `gregs`.
pub(crate) const REG_EFL: usize = 17;
/// Index of the segment selectors (`cs`, `gs`, `fs`, `ss`: 16 bits each) in `gregs`.
pub(crate) const REG_CSGSFS: usize = 18;
/// Index of the error code of the fault in `gregs`.
pub(crate) const REG_ERR: usize = 19;
/// How many words `gregs` has (the kernel's `sigcontext` up to `cr2`).
pub(crate) const NGREG: usize = 23;

/// Offset in `ucontext_t` of `gregs[reg]`.
pub(crate) const fn uc_greg(reg: usize) -> usize {
    UC_MCONTEXT + 8 * reg
}

/// Offset in `ucontext_t` of `uc_mcontext.fpregs`, the pointer to the FXSAVE area (null when
/// the kernel saved no FP state): the word after `gregs`.
pub(crate) const UC_FPREGS: usize = uc_greg(NGREG);

/// The layout above is what this machine's libc says.
#[cfg(target_arch = "x86_64")]
const _: () = {
    use core::mem::offset_of;
    let regs = [
        (REG_R8, libc::REG_R8),
        (REG_R9, libc::REG_R9),
        (REG_R10, libc::REG_R10),
        (REG_R11, libc::REG_R11),
        (REG_R12, libc::REG_R12),
        (REG_R13, libc::REG_R13),
        (REG_R14, libc::REG_R14),
        (REG_R15, libc::REG_R15),
        (REG_RDI, libc::REG_RDI),
        (REG_RSI, libc::REG_RSI),
        (REG_RBP, libc::REG_RBP),
        (REG_RBX, libc::REG_RBX),
        (REG_RDX, libc::REG_RDX),
        (REG_RAX, libc::REG_RAX),
        (REG_RCX, libc::REG_RCX),
        (REG_RSP, libc::REG_RSP),
        (REG_RIP, libc::REG_RIP),
        (REG_EFL, libc::REG_EFL),
        (REG_CSGSFS, libc::REG_CSGSFS),
        (REG_ERR, libc::REG_ERR),
    ];
    let mut i = 0;
    while i < regs.len() {
        assert!(regs[i].0 == regs[i].1 as usize);
        i += 1;
    }
    let mc = offset_of!(libc::ucontext_t, uc_mcontext);
    assert!(UC_MCONTEXT == mc + offset_of!(libc::mcontext_t, gregs));
    assert!(UC_FPREGS == mc + offset_of!(libc::mcontext_t, fpregs));
};

/// The general registers (`gregs`) of `uc`, indexed by the `REG_*` above.
///
/// # Safety
/// `uc` points to a readable x86-64 `ucontext_t` (the kernel's, for the signal being handled).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn gregs(uc: *const libc::ucontext_t) -> [u64; NGREG] {
    let mut g = [0u64; NGREG];
    for (i, w) in g.iter_mut().enumerate() {
        // SAFETY: gregs lie inside the ucontext_t the caller vouches for.
        *w = unsafe { read_word(uc, uc_greg(i)) };
    }
    g
}

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
    // SAFETY: uc is the kernel's ucontext (the caller's contract).
    let g = unsafe { gregs(uc) };
    // SAFETY: as above.
    let fx = unsafe { read_word(uc, UC_FPREGS) } as usize as *const [u8; 512];
    // SAFETY: fpregs is null or points at the 512-byte FXSAVE area of the signal frame.
    context_from_parts(&g, unsafe { fx.as_ref() }, out)
}

/// Writes the `CONTEXT_AMD64` of the general registers `g` (indexed by `REG_*`) and the FXSAVE
/// image `fxsave` (when the kernel saved one) into `out`; returns its size.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn context_from_parts(
    g: &[u64; NGREG],
    fxsave: Option<&[u8; 512]>,
    out: &mut [u8; CONTEXT_SIZE],
) -> usize {
    out.fill(0);
    let mut flags = CONTEXT_AMD64 | CONTROL | INTEGER | SEGMENTS;
    // Rax, Rcx, Rdx, Rbx, Rsp, Rbp, Rsi, Rdi, R8-R15, Rip: the order of CONTEXT_AMD64.
    let order = [
        REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI, REG_R8, REG_R9,
        REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15, REG_RIP,
    ];
    for (k, reg) in order.into_iter().enumerate() {
        le64(out, RAX + 8 * k, g[reg]);
    }
    le32(out, EFLAGS, g[REG_EFL] as u32);
    // The kernel's sigcontext: cs, gs, fs and ss in 16 bits each.
    let sel = g[REG_CSGSFS];
    le16(out, SEG_CS, sel as u16);
    le16(out, SEG_GS, (sel >> 16) as u16);
    le16(out, SEG_FS, (sel >> 32) as u16);
    le16(out, SEG_SS, (sel >> 48) as u16);
    if let Some(area) = fxsave {
        // The kernel's FXSAVE image is XMM_SAVE_AREA32 byte for byte.
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
#[cfg(target_arch = "x86_64")]
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
#[cfg(target_arch = "x86_64")]
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
#[cfg(target_arch = "x86_64")]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_amd64_from_parts() {
        let mut g = [0u64; NGREG];
        for (k, r) in g.iter_mut().enumerate() {
            *r = 0x1000 + k as u64;
        }
        g[REG_CSGSFS] = 0x002b_0000_0000_0033;
        let mut fx = [0u8; 512];
        fx[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
        fx[511] = 0xaa;
        let mut out = [0u8; CONTEXT_SIZE];
        assert_eq!(context_from_parts(&g, Some(&fx), &mut out), CONTEXT_SIZE);
        let word = |at: usize| u32::from_le_bytes(out[at..at + 4].try_into().unwrap());
        let half = |at: usize| u16::from_le_bytes(out[at..at + 2].try_into().unwrap());
        assert_eq!(
            word(FLAGS),
            CONTEXT_AMD64 | CONTROL | INTEGER | SEGMENTS | FLOATING_POINT
        );
        assert_eq!(rd64(&out, RAX), Some(0x1000 + REG_RAX as u64));
        assert_eq!(rd64(&out, RAX + 8 * 5), Some(0x1000 + REG_RBP as u64));
        assert_eq!(
            sp_pc(&out),
            Some((0x1000 + REG_RSP as u64, 0x1000 + REG_RIP as u64))
        );
        assert_eq!(word(EFLAGS), 0x1000 + REG_EFL as u32);
        assert_eq!((half(SEG_CS), half(SEG_SS)), (0x33, 0x2b));
        assert_eq!(word(MXCSR), 0x1f80);
        assert_eq!(out[FLT_SAVE + 511], 0xaa);
        // No FXSAVE area: control, integer and segment registers only.
        let mut out2 = [0u8; CONTEXT_SIZE];
        context_from_parts(&g, None, &mut out2);
        assert_eq!(
            rd64(&out2, FLAGS).map(|w| w as u32),
            Some(CONTEXT_AMD64 | CONTROL | INTEGER | SEGMENTS)
        );
        assert!(out2[FLT_SAVE..FLT_SAVE + 512].iter().all(|&b| b == 0));
    }

    /// The codec reads a `ucontext_t` through the layout table: a buffer laid out by it.
    #[test]
    fn context_from_a_ucontext_laid_out_by_the_table() {
        let mut uc = [0u64; 128];
        uc[uc_greg(REG_RSP) / 8] = 0x7ff0;
        uc[uc_greg(REG_RIP) / 8] = 0x4010;
        let mut out = [0u8; CONTEXT_SIZE];
        // SAFETY: the buffer is larger than the layout's last offset (fpregs: null).
        unsafe { context_from_ucontext(uc.as_ptr().cast(), &mut out) };
        assert_eq!(sp_pc(&out), Some((0x7ff0, 0x4010)));
        assert_eq!(
            out[FLAGS..FLAGS + 4],
            (CONTEXT_AMD64 | CONTROL | INTEGER | SEGMENTS).to_le_bytes()
        );
    }
}
