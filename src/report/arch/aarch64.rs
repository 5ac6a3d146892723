//! aarch64: pc, lr, sp, pstate and x0-x29 of `uc_mcontext`, the fault address, and the
//! exception syndrome (ESR) when the kernel saved one, as the arm64 kernel's oops prints them.
#![allow(unsafe_code)]

use crate::report::{pc_frame, push_hex16, Out, FRAME_OPTS};
use crate::symbolize::{self, FixedBuf, FrameKind};

/// Registers of the interrupted context; `innermost` names the function inlined at the pc
/// (innermost), if any, for the pc line.
///
/// # Safety
/// `uc` is the kernel's `ucontext_t` for the signal being handled.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn registers(out: Out, uc: *const libc::ucontext_t, innermost: &[u8]) {
    // SAFETY: uc is the kernel's ucontext for the signal being handled.
    let m = unsafe { &(*uc).uc_mcontext };
    let sym = |w: &mut FixedBuf<'_>, addr: usize, kind: FrameKind| {
        let mut buf = [0u8; 900];
        let n = symbolize::write_kernel_frame(&mut buf, addr, kind, FRAME_OPTS);
        w.push_bytes(buf.get(..n).unwrap_or(&[]));
    };
    out.line(|w| {
        w.push_bytes(b"pc : ");
        pc_frame(w, m.pc as usize, innermost);
    });
    out.line(|w| {
        w.push_bytes(b"lr : ");
        // x30 holds a return address only where the function has not saved and reused it:
        // named as one, and the bits of a pointer authentication code kept as they are.
        sym(w, m.regs[30] as usize, FrameKind::Return);
    });
    out.line(|w| {
        w.push_bytes(b"sp : ");
        push_hex16(w, m.sp as usize);
        w.push_bytes(b" pstate: ");
        push_hex16(w, m.pstate as usize);
    });
    // x29 down to x0, three a line, as the kernel prints them.
    for row in 0..10 {
        out.line(|w| {
            for k in 0..3 {
                let Some(i) = 29usize.checked_sub(row * 3 + k) else {
                    break;
                };
                if k > 0 {
                    w.push_bytes(b" ");
                }
                w.push_bytes(b"x");
                if i < 10 {
                    w.push_bytes(b"0");
                }
                w.push_dec(i as u64);
                w.push_bytes(b": ");
                push_hex16(w, m.regs[i] as usize);
            }
        });
    }
    // SAFETY: as above; the reserved area lies inside the mcontext_t.
    let esr = unsafe { esr(uc) };
    out.line(|w| {
        w.push_bytes(b"far: ");
        push_hex16(w, m.fault_address as usize);
        if let Some(esr) = esr {
            w.push_bytes(b" esr: ");
            push_hex16(w, esr as usize);
            w.push_bytes(b" (");
            w.push_str(exception_class(esr));
            w.push_bytes(b")");
        }
    });
}

/// `ESR_MAGIC` of `<asm/sigcontext.h>`: the record of the exception syndrome register.
const ESR_MAGIC: u32 = 0x4553_5201;
/// `EXTRA_MAGIC`: a record pointing at more records outside the `ucontext_t` (SVE state too
/// large for it); not followed.
const EXTRA_MAGIC: u32 = 0x4558_5401;
/// Bytes of `uc_mcontext.__reserved`.
const RESERVED: usize = 4096;
/// Where `__reserved` starts in `mcontext_t`: after `pstate`, 16-byte aligned.
const RESERVED_AT: usize = (core::mem::offset_of!(libc::mcontext_t, pstate) + 8 + 15) & !15;
const _: () = assert!(core::mem::size_of::<libc::mcontext_t>() == RESERVED_AT + RESERVED);

/// The ESR the kernel saved for a fault, from the records of `__reserved`.
///
/// # Safety
/// `uc` is a readable `ucontext_t`.
///
/// # Async-signal safety
/// Async-signal-safe.
unsafe fn esr(uc: *const libc::ucontext_t) -> Option<u64> {
    let base = uc as usize + core::mem::offset_of!(libc::ucontext_t, uc_mcontext) + RESERVED_AT;
    // SAFETY: the caller vouches for the ucontext_t, which holds the 4096 reserved bytes.
    let area = unsafe { core::slice::from_raw_parts(base as *const u8, RESERVED) };
    find_record(area, ESR_MAGIC).and_then(|r| word(r, 8))
}

/// The record with `magic` among the records of `area` (each `{ u32 magic; u32 size; ... }`,
/// FPSIMD, ESR, SVE, ZA, TPIDR2, ... then a zero header), walked by their headers: a size that
/// is too small, unaligned or runs past the area ends the walk, so garbage never makes it read
/// outside `area`.
fn find_record(area: &[u8], magic: u32) -> Option<&[u8]> {
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

/// The u64 at byte `at` of `rec`.
fn word(rec: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(rec.get(at..at + 8)?.try_into().ok()?))
}

/// The exception class of an ESR (bits 26-31), as the architecture names it.
fn exception_class(esr: u64) -> &'static str {
    match (esr >> 26) & 0x3f {
        0x00 => "unknown",
        0x07 => "FP/SIMD access",
        0x0e => "illegal execution state",
        0x15 => "SVC",
        0x18 => "system register access",
        0x20 => "instruction abort, lower EL",
        0x22 => "PC alignment fault",
        0x24 => "data abort, lower EL",
        0x26 => "SP alignment fault",
        0x2c => "floating-point exception",
        0x30 => "breakpoint, lower EL",
        0x32 => "software step, lower EL",
        0x34 => "watchpoint, lower EL",
        0x3c => "BRK instruction",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(out: &mut Vec<u8>, magic: u32, size: u32, payload: u64) {
        out.extend_from_slice(&magic.to_ne_bytes());
        out.extend_from_slice(&size.to_ne_bytes());
        out.extend_from_slice(&payload.to_ne_bytes());
        out.resize(out.len() + size as usize - 16, 0xee);
    }

    #[test]
    fn records_are_walked_by_their_headers() {
        // FPSIMD (528 bytes), SVE, ZA, ESR, end: as the kernel lays them out.
        let mut a = Vec::new();
        rec(&mut a, 0x4650_8001, 528, 1);
        rec(&mut a, 0x5356_4501, 2208, 2);
        rec(&mut a, 0x5a41_5201, 16, 3);
        rec(&mut a, ESR_MAGIC, 16, 0x9200_0046);
        a.resize(RESERVED, 0);
        assert_eq!(
            find_record(&a, ESR_MAGIC).and_then(|r| word(r, 8)),
            Some(0x9200_0046)
        );
        assert_eq!(exception_class(0x9200_0046), "data abort, lower EL");
        // No ESR record (a raise(), not a fault): none.
        let mut b = Vec::new();
        rec(&mut b, 0x4650_8001, 528, 1);
        b.resize(RESERVED, 0);
        assert_eq!(find_record(&b, ESR_MAGIC), None);
        // Garbage sizes end the walk without reading outside the area.
        for size in [0u32, 4, 12, 4097, u32::MAX] {
            let mut c = Vec::new();
            c.extend_from_slice(&0x4650_8001u32.to_ne_bytes());
            c.extend_from_slice(&size.to_ne_bytes());
            c.resize(RESERVED, 0x45);
            assert_eq!(find_record(&c, ESR_MAGIC), None, "size {size}");
        }
        // A record running past the end.
        let mut d = vec![0u8; RESERVED];
        d[RESERVED - 8..RESERVED - 4].copy_from_slice(&ESR_MAGIC.to_ne_bytes());
        assert_eq!(find_record(&d, ESR_MAGIC), None);
    }
}
