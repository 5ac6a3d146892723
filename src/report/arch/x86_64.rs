//! x86-64: the general registers of `uc_mcontext.gregs`, as the kernel's oops prints them,
//! read through the `ucontext_t` layout of [`crate::context::x86_64`]. Compiled on every host.
#![allow(unsafe_code)]

use crate::context::x86_64::{
    gregs, REG_EFL, REG_ERR, REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15, REG_R8, REG_R9,
    REG_RAX, REG_RBP, REG_RBX, REG_RCX, REG_RDI, REG_RDX, REG_RIP, REG_RSI, REG_RSP,
};
use crate::report::{pc_frame, push_hex16, Out};

/// Registers of the interrupted context; `innermost` names the function inlined at the pc
/// (innermost), if any, for the pc line.
///
/// # Safety
/// `uc` is the kernel's x86-64 `ucontext_t` for the signal being handled.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) unsafe fn registers(out: Out, uc: *const libc::ucontext_t, innermost: &[u8]) {
    // SAFETY: uc is the kernel's ucontext for the signal being handled.
    let g = unsafe { gregs(uc) };
    let r = |i: usize| g[i] as usize;
    let rip = r(REG_RIP);
    out.line(|w| {
        w.push_bytes(b"RIP: ");
        pc_frame(w, rip, innermost);
    });
    let rows: [[(&str, usize); 3]; 6] = [
        [("RSP", REG_RSP), ("RBP", REG_RBP), ("EFLAGS", REG_EFL)],
        [("RAX", REG_RAX), ("RBX", REG_RBX), ("RCX", REG_RCX)],
        [("RDX", REG_RDX), ("RSI", REG_RSI), ("RDI", REG_RDI)],
        [("R8", REG_R8), ("R9", REG_R9), ("R10", REG_R10)],
        [("R11", REG_R11), ("R12", REG_R12), ("R13", REG_R13)],
        [("R14", REG_R14), ("R15", REG_R15), ("ERR", REG_ERR)],
    ];
    for row in rows {
        out.line(|w| {
            for (k, (name, idx)) in row.iter().enumerate() {
                if k > 0 {
                    w.push_bytes(b" ");
                }
                w.push_str(name);
                w.push_bytes(b": ");
                push_hex16(w, r(*idx));
            }
        });
    }
}
