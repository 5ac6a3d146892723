//! The aarch64 capture entry: saves the caller's return address (x30), stack pointer, frame
//! pointer and callee-saved registers exactly as they are at the call, then calls the walker's
//! inner entry.

use super::{join, FP, PC, SP, X19_X28};

/// The register slot of each word the entry saves, in order: the return address (the caller's
/// pc), the caller's stack pointer, x29, x19-x28.
pub(crate) const ENTRY_REGS: [u16; 13] = join(&[PC, SP, FP], &X19_X28);

/// The instructions of the naked entry `(buf, len, mode, out)`: it pushes a frame record and
/// [`ENTRY_REGS`] (128 bytes) and calls `{inner}(buf, len, mode, &words, out)`. Its CFI lets a
/// profiler unwind through it.
#[cfg(target_arch = "aarch64")]
macro_rules! entry_asm {
    () => {
        concat!(
            // Naked functions get no CFI of their own: describe this one (CFA = sp at entry).
            ".cfi_startproc\n",
            // A frame record (x29, x30) at the bottom of 128 bytes: the bl below clobbers x30.
            "stp x29, x30, [sp, #-128]!\n",
            ".cfi_def_cfa_offset 128\n",
            ".cfi_offset w29, -128\n",
            ".cfi_offset w30, -120\n",
            // x4 (5th argument of inner) = out, our 4th.
            "mov x4, x3\n",
            // pc: the return address the bl left in x30 (never signed: signing is done by a
            // callee's own prologue, and this function has none).
            "str x30, [sp, #16]\n",
            // sp: the caller's, before our push.
            "add x9, sp, #128\n",
            "str x9, [sp, #24]\n",
            // The frame pointer and the callee-saved registers, untouched so far.
            "str x29, [sp, #32]\n",
            "stp x19, x20, [sp, #40]\n",
            "stp x21, x22, [sp, #56]\n",
            "stp x23, x24, [sp, #72]\n",
            "stp x25, x26, [sp, #88]\n",
            "stp x27, x28, [sp, #104]\n",
            // x3 (4th argument) = the saved words; x0, x1, x2 still hold buf, len, mode.
            "add x3, sp, #16\n",
            "bl {inner}\n",
            "ldp x29, x30, [sp], #128\n",
            ".cfi_def_cfa_offset 0\n",
            ".cfi_restore w29\n",
            ".cfi_restore w30\n",
            "ret\n",
            ".cfi_endproc\n",
        )
    };
}
#[cfg(target_arch = "aarch64")]
pub(crate) use entry_asm;
