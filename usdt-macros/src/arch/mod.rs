//! What differs between the architectures a probe site is emitted for: the assembler syntax of
//! the semaphore's address and load, of a note's argument locations (what sys/sdt.h writes
//! there), and the section details. The macro runs on the host, so it emits one version per
//! architecture, each under its `cfg(target_arch)`, and an empty one for the others.

mod aarch64;
mod x86_64;

/// One architecture's templates.
pub struct Target {
    /// The `target_arch` value.
    pub arch: &'static str,
    /// `asm!` options beyond the common ones (`att_syntax` on x86-64).
    pub att_syntax: bool,
    /// The section-type prefix the assembler takes (`@progbits`, `%progbits`).
    pub progbits: &'static str,
    /// The alignment that puts `.probes` on a page of its own on any kernel of the
    /// architecture (see `site::definitions`).
    pub page: u32,
    /// Loads the u16 semaphore `sem` into operand 0 (32 bits wide).
    pub load: fn(sem: &str) -> String,
    /// Puts the semaphore's address into operand 0.
    pub lea: fn(sem: &str) -> String,
    /// An argument in a register: `size@location`, with `{z}` the size and `{r}` the operand.
    pub arg_reg: &'static str,
    /// A two-word argument (`&str`, `&[u8]`): the 16 bytes the operand points to.
    pub arg_pair: &'static str,
}

/// The architectures with a USDT note syntax (sys/sdt.h's), as the macro knows them.
pub const TARGETS: [&Target; 2] = [&x86_64::TARGET, &aarch64::TARGET];
