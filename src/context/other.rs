//! Machines without a minidump context here: dumps are not written (`Error::Unsupported`).
#![allow(dead_code)]

/// No context.
pub(crate) const CONTEXT_SIZE: usize = 0;
/// `PROCESSOR_ARCHITECTURE_UNKNOWN`.
pub(crate) const PROCESSOR_ARCHITECTURE: u16 = 0xffff;
/// No red zone is assumed.
pub(crate) const RED_ZONE: usize = 0;

/// Never called: writing a dump fails before.
///
/// # Safety
/// None needed; `unsafe` for the signature the other machines share.
pub(crate) unsafe fn context_from_ucontext(
    _uc: *const libc::ucontext_t,
    _out: &mut [u8; CONTEXT_SIZE],
) -> usize {
    0
}

/// No registers.
macro_rules! own_registers {
    () => {
        [0u64; 0]
    };
}
pub(crate) use own_registers;

/// No context.
pub(crate) fn context_from_own(_regs: &[u64; 0], _out: &mut [u8; CONTEXT_SIZE]) -> usize {
    0
}

/// No context, no registers.
pub(crate) fn sp_pc(_ctx: &[u8]) -> Option<(u64, u64)> {
    None
}

/// Nothing known.
pub(crate) fn cpu_information(_out: &mut [u8; 24]) -> (u16, u16) {
    (0, 0)
}
