//! The x86-64 capture entry: saves the caller's return address, stack pointer and callee-saved
//! registers exactly as they are at the call, then calls the walker's inner entry.

use super::{FP, PC, R12, R13, R14, R15, RBX, SP};

/// The register slot of each word the entry saves, in order: the return address (the caller's
/// pc), the caller's stack pointer, rbp, rbx, r12-r15.
pub(crate) const ENTRY_REGS: [u16; 8] = [PC, SP, FP, RBX, R12, R13, R14, R15];

/// The instructions of the naked entry `(buf, len, mode, out)`: it stores [`ENTRY_REGS`] on its
/// own stack and calls `{inner}(buf, len, mode, &words, out)`. Being naked, it is correct with
/// or without frame pointers; its CFI (`.cfi_adjust_cfa_offset`) lets a profiler unwind through
/// it.
#[cfg(target_arch = "x86_64")]
macro_rules! entry_asm {
    () => {
        concat!(
            // Naked functions get no CFI of their own: describe this one (CFA = rsp + 8 at entry).
            ".cfi_startproc\n",
            // r8 (5th argument of inner) = out, our 4th.
            "mov r8, rcx\n",
            // 64 bytes of saved words plus 8 of padding: rsp was 8 mod 16 at entry (the call
            // pushed the return address), so it is 16-byte aligned again for the call below.
            "sub rsp, 72\n",
            ".cfi_adjust_cfa_offset 72\n",
            // ra: the return address the call pushed.
            "mov rax, [rsp + 72]\n",
            "mov [rsp], rax\n",
            // sp: the caller's rsp once that return address is popped.
            "lea rax, [rsp + 80]\n",
            "mov [rsp + 8], rax\n",
            // The callee-saved registers, untouched so far.
            "mov [rsp + 16], rbp\n",
            "mov [rsp + 24], rbx\n",
            "mov [rsp + 32], r12\n",
            "mov [rsp + 40], r13\n",
            "mov [rsp + 48], r14\n",
            "mov [rsp + 56], r15\n",
            // rcx (4th argument) = the saved words; rdi, rsi, rdx still hold buf, len, mode.
            "mov rcx, rsp\n",
            "call {inner}\n",
            "add rsp, 72\n",
            ".cfi_adjust_cfa_offset -72\n",
            "ret\n",
            ".cfi_endproc\n",
        )
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use entry_asm;
