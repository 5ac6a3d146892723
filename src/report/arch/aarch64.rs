//! aarch64: pc, lr, sp, pstate and x0-x29 of `uc_mcontext`, the fault address, and the
//! exception syndrome (ESR) when the kernel saved one, as the arm64 kernel's oops prints them,
//! read through the `ucontext_t` layout and record walker of [`crate::context::aarch64`].
//! Compiled on every host.
#![allow(unsafe_code)]

use crate::context::aarch64::{find_record, reserved, Registers};
use crate::report::{pc_frame, push_hex16, Out, FRAME_OPTS};
use crate::symbolize::{self, FixedBuf, FrameKind};

/// Registers of the interrupted context; `innermost` names the function inlined at the pc
/// (innermost), if any, for the pc line.
///
/// # Safety
/// `uc` is the kernel's aarch64 `ucontext_t` for the signal being handled.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn registers(out: Out, uc: *const libc::ucontext_t, innermost: &[u8]) {
    // SAFETY: uc is the kernel's ucontext for the signal being handled.
    let m = unsafe { Registers::read(uc) };
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
        sym(w, m.x[30] as usize, FrameKind::Return);
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
                push_hex16(w, m.x[i] as usize);
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
/// The ESR the kernel saved for a fault, from the records of `__reserved`.
///
/// # Safety
/// `uc` is a readable aarch64 `ucontext_t`.
///
/// # Async-signal safety
/// Async-signal-safe.
unsafe fn esr(uc: *const libc::ucontext_t) -> Option<u64> {
    // SAFETY: the caller vouches for the ucontext_t, which holds the reserved area.
    let area = unsafe { reserved(uc) };
    find_record(area, ESR_MAGIC).and_then(|r| word(r, 8))
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

    // The record walk itself is `crate::context::aarch64::find_record`'s, tested there.
    #[test]
    fn exception_classes_are_named() {
        assert_eq!(exception_class(0x9200_0046), "data abort, lower EL");
        assert_eq!(exception_class(0xf200_0000), "BRK instruction");
    }
}
