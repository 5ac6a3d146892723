//! The minidump's thread context, one file per architecture: the interrupted `ucontext_t`
//! turned into the `CONTEXT_*` record the minidump format defines for the machine.

#[cfg(target_arch = "aarch64")]
#[macro_use]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[macro_use]
mod other;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) use other::*;
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;
