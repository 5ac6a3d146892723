//! The crash report's register block, one file per architecture: what each machine's
//! `ucontext_t` holds, printed the way its kernel prints an oops.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::registers;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod other;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) use other::registers;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::registers;
