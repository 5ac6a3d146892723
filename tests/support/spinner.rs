//! A function that spins in its own code until told to stop, so that a signal sent to its
//! thread interrupts it exactly there (frame 0 of the interrupted context).

use std::sync::atomic::AtomicBool;

/// Set by the test (or its signal handler) to end [`spin_until`].
pub static STOP: AtomicBool = AtomicBool::new(false);
/// Set once [`spin_until`] runs.
pub static SPINNING: AtomicBool = AtomicBool::new(false);

/// Spins without calls until [`STOP`] is set. [`SPINNING`] is set by the loop's own code, right
/// before it: once another thread sees it, this thread is in the loop, not in a call (in a
/// debug build `AtomicBool::store` is a call of its own, and a signal sent as soon as the flag
/// is seen could land in its epilogue).
#[inline(never)]
pub fn spin_until_stopped() {
    let (spinning, flag) = (SPINNING.as_ptr(), STOP.as_ptr());
    // SAFETY: writes one static byte (an atomic flag's), then reads another in a loop; touches
    // nothing else.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!(
            "xchg byte ptr [{spinning}], {one}",
            "2:",
            "pause",
            "cmp byte ptr [{flag}], 0",
            "je 2b",
            spinning = in(reg) spinning,
            one = inout(reg_byte) 1u8 => _,
            flag = in(reg) flag,
        );
    }
    // SAFETY: as above.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!(
            "mov {t:w}, #1",
            "stlrb {t:w}, [{spinning}]",
            "2:",
            "yield",
            "ldrb {t:w}, [{flag}]",
            "cbz {t:w}, 2b",
            spinning = in(reg) spinning,
            flag = in(reg) flag,
            t = out(reg) _,
        );
    }
}
