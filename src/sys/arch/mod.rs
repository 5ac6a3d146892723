//! The machine-specific system pieces: switching to another stack, and the thread pointer.
//! One file per architecture; elsewhere there is neither (the unwinder, which needs them, has
//! no port there either).

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::*;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod other;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) use other::*;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;
