//! A function that spins in its own code until told to stop, so that a signal sent to its
//! thread interrupts it exactly there (frame 0 of the interrupted context).

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the test (or its signal handler) to end [`spin_until`].
pub static STOP: AtomicBool = AtomicBool::new(false);
/// Set once [`spin_until`] runs.
pub static SPINNING: AtomicBool = AtomicBool::new(false);

/// Spins without calls until [`STOP`] is set.
#[inline(never)]
pub fn spin_until_stopped() {
    SPINNING.store(true, Ordering::SeqCst);
    // SAFETY: reads a static byte in a loop; touches nothing else.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!(
            "2:",
            "pause",
            "cmp byte ptr [{flag}], 0",
            "je 2b",
            flag = in(reg) STOP.as_ptr(),
        );
    }
    // SAFETY: as above.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!(
            "2:",
            "yield",
            "ldrb {t:w}, [{flag}]",
            "cbz {t:w}, 2b",
            flag = in(reg) STOP.as_ptr(),
            t = out(reg) _,
        );
    }
}
