//! aarch64: the operand syntax sys/sdt.h writes there (`8@x0`, `-4@[sp, 16]`) and libbpf,
//! bpftrace, perf and gdb parse; page-relative addressing of the semaphore.

use super::Target;

/// aarch64's templates.
pub const TARGET: Target = Target {
    arch: "aarch64",
    att_syntax: false,
    // `@` is fine for the AArch64 assembler, but `%` is what every ELF assembler takes.
    progbits: "%progbits",
    // arm64 kernels run with 4 KiB, 16 KiB or 64 KiB pages.
    page: 65536,
    load: |sem| {
        format!(
            "    // Read the semaphore: its page, then the halfword in it.\n    adrp {{0}}, {sem}\n    ldrh {{0:w}}, [{{0}}, :lo12:{sem}]\n"
        )
    },
    lea: |sem| {
        format!(
            "    // The semaphore's address: its page plus the offset in it.\n    adrp {{0}}, {sem}\n    add {{0}}, {{0}}, :lo12:{sem}\n"
        )
    },
    // A 64-bit register operand prints as `xN`, the name the tools expect (libbpf parses
    // `x0`-`x30` and `sp`); the size before `@` says how many of its bits are the argument.
    arg_reg: "{z}@{r}",
    arg_pair: "8@[{r}] 8@[{r}, 8]",
};
