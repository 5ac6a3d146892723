//! aarch64: the layout of the kernel's `ucontext_t` (where x0-x30, sp, pc, pstate, the fault
//! address and the `__reserved` records lie: the one table the unwinder's `UC_OFFSETS` and the
//! oops block read, through [`Registers`]), `CONTEXT_ARM64` (912 bytes) from `uc_mcontext` and
//! the FP/SIMD record the kernel puts in its `__reserved` area (v0-v31, fpsr, fpcr); and the one
//! walker of the `__reserved` records.
//!
//! Compiled on every host: the layout, the codec ([`context_from_parts`]) and the record walker
//! ([`find_record`]) are data and work on plain values and bytes, so a `cargo check` on x86-64
//! type-checks them and their unit tests run there. Only the checks against this machine's
//! real `libc::ucontext_t` and the inline assembly of `own_registers!` keep
//! `#[cfg(target_arch = "aarch64")]`.
#![allow(unsafe_code)]

use super::{le32, le64, rd64, read_word};

/// Where `uc_mcontext` starts in `ucontext_t`: after `uc_flags`, `uc_link`, the 24-byte
/// `uc_stack` and the 128 bytes that glibc's `sigset_t` takes (the kernel's `uc_sigmask` and
/// `__unused`), aligned to 16 (the kernel's `struct ucontext`, asm/ucontext.h).
pub(crate) const UC_MCONTEXT: usize = 176;
/// Offsets in `uc_mcontext` (the kernel's `struct sigcontext`, asm/sigcontext.h):
/// `fault_address` first, then `regs[31]`, `sp`, `pc`, `pstate`.
pub(crate) const MC_FAULT_ADDRESS: usize = 0;
/// `uc_mcontext.regs` (x0-x30).
pub(crate) const MC_REGS: usize = 8;
/// `uc_mcontext.sp`.
pub(crate) const MC_SP: usize = MC_REGS + 31 * 8;
/// `uc_mcontext.pc`.
pub(crate) const MC_PC: usize = MC_SP + 8;
/// `uc_mcontext.pstate`.
pub(crate) const MC_PSTATE: usize = MC_PC + 8;

/// Offset in `ucontext_t` of `x<n>` (`uc_mcontext.regs[n]`, `n` < 31).
pub(crate) const fn uc_x(n: usize) -> usize {
    UC_MCONTEXT + MC_REGS + 8 * n
}
/// Offset in `ucontext_t` of `uc_mcontext.sp`.
pub(crate) const UC_SP: usize = UC_MCONTEXT + MC_SP;
/// Offset in `ucontext_t` of `uc_mcontext.pc`.
pub(crate) const UC_PC: usize = UC_MCONTEXT + MC_PC;

/// The layout above is what this machine's libc says.
#[cfg(target_arch = "aarch64")]
const _: () = {
    use core::mem::offset_of;
    assert!(UC_MCONTEXT == offset_of!(libc::ucontext_t, uc_mcontext));
    assert!(MC_FAULT_ADDRESS == offset_of!(libc::mcontext_t, fault_address));
    assert!(MC_REGS == offset_of!(libc::mcontext_t, regs));
    assert!(MC_SP == offset_of!(libc::mcontext_t, sp));
    assert!(MC_PC == offset_of!(libc::mcontext_t, pc));
    assert!(MC_PSTATE == offset_of!(libc::mcontext_t, pstate));
};

/// The registers of an interrupted context, read out of its `ucontext_t`.
#[derive(Clone, Copy)]
pub(crate) struct Registers {
    /// x0-x30.
    pub(crate) x: [u64; 31],
    /// The stack pointer.
    pub(crate) sp: u64,
    /// The pc.
    pub(crate) pc: u64,
    /// The processor state.
    pub(crate) pstate: u64,
    /// The faulting address the kernel saved.
    pub(crate) fault_address: u64,
}

impl Registers {
    /// The registers of `uc`.
    ///
    /// # Safety
    /// `uc` points to a readable aarch64 `ucontext_t` (the kernel's, for the signal being
    /// handled).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) unsafe fn read(uc: *const libc::ucontext_t) -> Registers {
        // SAFETY: every offset below lies inside the ucontext_t the caller vouches for.
        let word = |off: usize| unsafe { read_word(uc, off) };
        let mut x = [0u64; 31];
        for (n, w) in x.iter_mut().enumerate() {
            *w = word(uc_x(n));
        }
        Registers {
            x,
            sp: word(UC_SP),
            pc: word(UC_PC),
            pstate: word(UC_MCONTEXT + MC_PSTATE),
            fault_address: word(UC_MCONTEXT + MC_FAULT_ADDRESS),
        }
    }
}

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
/// `EXTRA_MAGIC` of `<asm/sigcontext.h>`: a record pointing at more records outside the
/// `ucontext_t` (SVE state too large for it); never followed, never returned.
const EXTRA_MAGIC: u32 = 0x4558_5401;
/// Size of `sigcontext.__reserved`.
pub(crate) const RESERVED: usize = 4096;
/// Its offset in `mcontext_t`: after fault_address, x0-x30, sp, pc and pstate (280 bytes),
/// aligned to 16.
pub(crate) const RESERVED_AT: usize = (MC_PSTATE + 8 + 15) & !15;
const _: () = assert!(RESERVED_AT == 288);
#[cfg(target_arch = "aarch64")]
const _: () = assert!(core::mem::size_of::<libc::mcontext_t>() == RESERVED_AT + RESERVED);
#[cfg(target_arch = "aarch64")]
const _: () =
    assert!((core::mem::offset_of!(libc::mcontext_t, pstate) + 8 + 15) & !15 == RESERVED_AT);

/// Writes the `CONTEXT_ARM64` of `uc` into `out`; returns its size.
///
/// # Safety
/// `uc` is an aarch64 `ucontext_t` the kernel passed to a signal handler.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn context_from_ucontext(
    uc: *const libc::ucontext_t,
    out: &mut [u8; CONTEXT_SIZE],
) -> usize {
    // SAFETY: uc is the kernel's ucontext (the caller's contract).
    let m = unsafe { Registers::read(uc) };
    // SAFETY: as above.
    let reserved = unsafe { reserved(uc) };
    context_from_parts(&m.x, m.sp, m.pc, m.pstate, reserved, out)
}

/// The `__reserved` area of `uc`'s `mcontext_t` (`RESERVED` bytes of records).
///
/// # Safety
/// `uc` is a readable aarch64 `ucontext_t` (the kernel's, for the signal being handled), which
/// holds the reserved bytes; the slice lives no longer than it.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn reserved<'a>(uc: *const libc::ucontext_t) -> &'a [u8] {
    let base = uc as usize + UC_MCONTEXT + RESERVED_AT;
    // SAFETY: the reserved area lies RESERVED_AT bytes into the kernel's sigcontext (which
    // libc's mcontext_t is, size checked above), RESERVED bytes long, written in full by the
    // kernel; the caller vouches for uc.
    unsafe { core::slice::from_raw_parts(base as *const u8, RESERVED) }
}

/// Writes the `CONTEXT_ARM64` of x0-x30, sp, pc, pstate and the `__reserved` records
/// (`reserved`: the FP/SIMD record, when there is one, gives v0-v31, fpsr and fpcr) into
/// `out`; returns its size.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn context_from_parts(
    regs: &[u64; 31],
    sp: u64,
    pc: u64,
    pstate: u64,
    reserved: &[u8],
    out: &mut [u8; CONTEXT_SIZE],
) -> usize {
    out.fill(0);
    let mut flags = CONTEXT_ARM64 | CONTROL | INTEGER;
    le32(out, CPSR, pstate as u32);
    for (k, &x) in regs.iter().enumerate() {
        le64(out, X0 + 8 * k, x);
    }
    le64(out, SP, sp);
    le64(out, PC, pc);
    if let Some(rec) = find_record(reserved, FPSIMD_MAGIC).filter(|r| r.len() >= FPSIMD_SIZE) {
        out[FPSR..FPSR + 4].copy_from_slice(&rec[8..12]);
        out[FPCR..FPCR + 4].copy_from_slice(&rec[12..16]);
        out[V0..V0 + 512].copy_from_slice(&rec[16..16 + 512]);
        flags |= FLOATING_POINT;
    }
    le32(out, FLAGS, flags);
    CONTEXT_SIZE
}

/// The record with `magic` among the records of `area` (`__reserved`: each
/// `{ u32 magic; u32 size; ... }`, FPSIMD, ESR, SVE, ZA, TPIDR2, ... then a zero header),
/// walked by their headers: a size that is too small, unaligned or runs past the area ends the
/// walk, so garbage never makes it read outside `area`. `EXTRA_MAGIC` records are never
/// returned (what they point at is outside the `ucontext_t`).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn find_record(area: &[u8], magic: u32) -> Option<&[u8]> {
    let mut at = 0usize;
    // Every record is at least 16 bytes: at most this many.
    for _ in 0..area.len() / 16 {
        let head = area.get(at..at.checked_add(8)?)?;
        let m = u32::from_ne_bytes(head[..4].try_into().ok()?);
        let size = u32::from_ne_bytes(head[4..].try_into().ok()?) as usize;
        if m == 0 || size < 8 || !size.is_multiple_of(8) {
            return None;
        }
        let rec = area.get(at..at.checked_add(size)?)?;
        if m == magic && m != EXTRA_MAGIC {
            return Some(rec);
        }
        at += size;
    }
    None
}

/// The calling function's own registers where the macro is expanded: sp, x29, x19-x28, x30
/// and the address of an instruction there (`[u64; 14]`); see the x86-64 version.
#[cfg(target_arch = "aarch64")]
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
#[cfg(target_arch = "aarch64")]
pub(crate) use own_registers;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends a record `{ magic, size, payload, filler }` of `size` bytes.
    fn rec(out: &mut Vec<u8>, magic: u32, size: u32, payload: u64) {
        out.extend_from_slice(&magic.to_ne_bytes());
        out.extend_from_slice(&size.to_ne_bytes());
        out.extend_from_slice(&payload.to_ne_bytes());
        out.resize(out.len() + size as usize - 16, 0xee);
    }

    const ESR_MAGIC: u32 = 0x4553_5201;

    #[test]
    fn records_are_walked_by_their_headers() {
        // FPSIMD (528 bytes), SVE, ZA, ESR, end: as the kernel lays them out.
        let mut a = Vec::new();
        rec(&mut a, FPSIMD_MAGIC, 528, 1);
        rec(&mut a, 0x5356_4501, 2208, 2);
        rec(&mut a, 0x5a41_5201, 16, 3);
        rec(&mut a, ESR_MAGIC, 16, 0x9200_0046);
        a.resize(RESERVED, 0);
        let esr =
            find_record(&a, ESR_MAGIC).map(|r| u64::from_ne_bytes(r[8..16].try_into().unwrap()));
        assert_eq!(esr, Some(0x9200_0046));
        // No ESR record (a raise(), not a fault): none.
        let mut b = Vec::new();
        rec(&mut b, FPSIMD_MAGIC, 528, 1);
        b.resize(RESERVED, 0);
        assert_eq!(find_record(&b, ESR_MAGIC), None);
        // EXTRA records are never returned.
        let mut e = Vec::new();
        rec(&mut e, EXTRA_MAGIC, 32, 4);
        e.resize(RESERVED, 0);
        assert_eq!(find_record(&e, EXTRA_MAGIC), None);
        // Garbage sizes end the walk without reading outside the area.
        for size in [0u32, 4, 12, 4097, u32::MAX] {
            let mut c = Vec::new();
            c.extend_from_slice(&FPSIMD_MAGIC.to_ne_bytes());
            c.extend_from_slice(&size.to_ne_bytes());
            c.resize(RESERVED, 0x45);
            assert_eq!(find_record(&c, ESR_MAGIC), None, "size {size}");
        }
        // A record running past the end.
        let mut d = vec![0u8; RESERVED];
        d[RESERVED - 8..RESERVED - 4].copy_from_slice(&ESR_MAGIC.to_ne_bytes());
        assert_eq!(find_record(&d, ESR_MAGIC), None);
    }

    #[test]
    fn context_arm64_from_parts() {
        let mut regs = [0u64; 31];
        for (k, r) in regs.iter_mut().enumerate() {
            *r = 0x1000 + k as u64;
        }
        // An FP/SIMD record: fpsr, fpcr, then v0-v31 (byte k of the vectors is k).
        let mut area = Vec::new();
        area.extend_from_slice(&FPSIMD_MAGIC.to_ne_bytes());
        area.extend_from_slice(&(FPSIMD_SIZE as u32).to_ne_bytes());
        area.extend_from_slice(&0x11u32.to_ne_bytes());
        area.extend_from_slice(&0x22u32.to_ne_bytes());
        area.extend((0..512).map(|k| k as u8));
        area.resize(RESERVED, 0);
        let mut out = [0u8; CONTEXT_SIZE];
        assert_eq!(
            context_from_parts(&regs, 0x7000, 0x4000, 0x6000_0000, &area, &mut out),
            CONTEXT_SIZE
        );
        let word = |at: usize| u32::from_le_bytes(out[at..at + 4].try_into().unwrap());
        assert_eq!(
            word(FLAGS),
            CONTEXT_ARM64 | CONTROL | INTEGER | FLOATING_POINT
        );
        assert_eq!(word(CPSR), 0x6000_0000);
        assert_eq!(rd64(&out, X0 + 8 * 29), Some(0x1000 + 29));
        assert_eq!(sp_pc(&out), Some((0x7000, 0x4000)));
        assert_eq!((word(FPSR), word(FPCR)), (0x11, 0x22));
        assert_eq!(out[V0 + 511], 255);
        // No FP/SIMD record: control and integer registers only.
        let mut out2 = [0u8; CONTEXT_SIZE];
        context_from_parts(&regs, 1, 2, 3, &[0u8; RESERVED], &mut out2);
        assert_eq!(
            u32::from_le_bytes(out2[..4].try_into().unwrap()),
            CONTEXT_ARM64 | CONTROL | INTEGER
        );
        assert!(out2[V0..V0 + 512].iter().all(|&b| b == 0));
    }
}
