//! The crash report's register block, one file per architecture: what each machine's
//! `ucontext_t` holds, printed the way its kernel prints an oops. Both ports read the registers
//! through [`crate::context`]'s layout and compile on every host; the host's is the one used.

// Compiled on every host: they read the `ucontext_t` through context's layout tables.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code, unused_imports))]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::registers;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod other;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) use other::registers;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::registers;
