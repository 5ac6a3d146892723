//! x86-64: the general registers of `uc_mcontext.gregs`, as the kernel's oops prints them.
#![allow(unsafe_code)]

use crate::report::{pc_frame, push_hex16, Out};

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
    let g = unsafe { (*uc).uc_mcontext.gregs };
    let r = |i: i32| g[i as usize] as usize;
    let rip = r(libc::REG_RIP);
    out.line(|w| {
        w.push_bytes(b"RIP: ");
        pc_frame(w, rip, innermost);
    });
    let rows: [[(&str, i32); 3]; 6] = [
        [
            ("RSP", libc::REG_RSP),
            ("RBP", libc::REG_RBP),
            ("EFLAGS", libc::REG_EFL),
        ],
        [
            ("RAX", libc::REG_RAX),
            ("RBX", libc::REG_RBX),
            ("RCX", libc::REG_RCX),
        ],
        [
            ("RDX", libc::REG_RDX),
            ("RSI", libc::REG_RSI),
            ("RDI", libc::REG_RDI),
        ],
        [
            ("R8", libc::REG_R8),
            ("R9", libc::REG_R9),
            ("R10", libc::REG_R10),
        ],
        [
            ("R11", libc::REG_R11),
            ("R12", libc::REG_R12),
            ("R13", libc::REG_R13),
        ],
        [
            ("R14", libc::REG_R14),
            ("R15", libc::REG_R15),
            ("ERR", libc::REG_ERR),
        ],
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
