//! x86-64: AT&T syntax, as sys/sdt.h writes its operands (`-4@%edi`, `8@8(%rax)`).

use super::Target;

/// x86-64's templates.
pub const TARGET: Target = Target {
    arch: "x86_64",
    att_syntax: true,
    progbits: "@progbits",
    page: 4096,
    load: |sem| format!("    // Read the semaphore.\n    movzwl {sem}(%rip), {{0:e}}\n"),
    lea: |sem| format!("    // The semaphore's address.\n    leaq {sem}(%rip), {{0}}\n"),
    arg_reg: "{z}@{r}",
    arg_pair: "8@0({r}) 8@8({r})",
};
