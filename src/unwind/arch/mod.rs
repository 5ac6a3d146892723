//! What the unwinder needs to know of the machine it runs on, one folder per architecture;
//! everything else in [`super`] is generic and reads it from here.
//!
//! Each architecture module provides the same items (the compiler checks the ones built here;
//! `.ci/run` builds x86-64 natively and aarch64 with Debian's cross toolchain):
//!
//! * registers: `COUNT` slots of a register set, numbered as DWARF numbers them where DWARF
//!   has a number (`SP`, `FP`, the return-address column `RA`), and `PC`, the slot of the
//!   frame's pc (on x86-64 the return-address column itself); `CALLEE_SAVED` (the valid mask a
//!   call preserves), `SAVED`/`LANES`/`FP_LANE` (the callee-saved registers a compiled rule
//!   tracks, `FP_LANE` in the first four) and `lane_regs` (the registers of a set of lanes other
//!   than the frame pointer's); `is_gpr`; `LR`, the link register if there is one;
//!   `RA_UNSPECIFIED_IS_SAME` (a CFI row without a rule for the return-address column keeps
//!   the link register, as on aarch64, or marks the outermost frame, as on x86-64);
//! * the `ucontext_t` a signal handler gets: `UC_OFFSETS` (where each register slot lies in it)
//!   and the signal frame: `TRAMPOLINE` (the bytes of the signal-return trampoline) and
//!   `UC_FROM_TRAMPOLINE_SP` (where the `ucontext_t` lies relative to the stack pointer when the
//!   trampoline runs);
//! * code: `CODE_ALIGN` (instruction alignment; a pc that breaks it is garbage), `LINK_STUB`
//!   (the instructions of a stub without CFI that returns through the link register: aarch64's
//!   PLT entry), `strip_ra`
//!   (pointer authentication codes off a return address), `BAD_PC_RETURN` (where a call through a
//!   bad function pointer left its return address), `RECORD_GIVES_SP` (whether a frame record
//!   at the frame pointer also gives the caller's stack pointer);
//! * the capture entry: `entry_asm!` (the naked trampoline's instructions) and `ENTRY_REGS`
//!   (the register slot of each word it saves);
//! * `VENDOR`: how gimli reads vendor-specific CFI opcodes.
//!
//! On a target without a port there is no unwinder: `capture*` return no frames and say why
//! ([`super::StopReason::Unsupported`]).

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;

/// Where the return address of a frame 0 outside every object (a call through a bad function
/// pointer) is.
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum BadPcReturn {
    /// On top of the stack: the call pushed it (x86-64).
    TopOfStack,
    /// In the link register: the branch-and-link left it there (aarch64).
    LinkRegister,
}

/// `UC_OFFSETS` entry of a register the `ucontext_t` does not hold.
#[allow(dead_code)]
pub(crate) const NOT_SAVED: usize = usize::MAX;
