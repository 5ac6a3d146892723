//! The pool of walk slots: scratch space (gimli's unwind context, a window for copied memory)
//! and a private stack for each walk that needs the CFI, claimed with one compare-and-swap.
#![allow(unsafe_code)]

use super::cfi::{self, Ctx};
use crate::sys;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How many walks can run at the same time with a slot; a walk without one uses the rule
/// cache and frame pointers only, and stops at a rule it would have to derive.
pub(crate) const POOL: usize = 32;

/// Words of stack one `process_vm_readv` copies when a walk reads memory off its own stack.
pub(crate) const WINDOW_WORDS: usize = 512;

/// The stack each walk runs on: gimli needs a few KiB (more in debug builds), and a signal
/// handler's alternate stack may be as small as 8 KiB.
const WALK_STACK: usize = 256 * 1024;

/// A slot's scratch space.
pub(crate) struct Scratch {
    pub(crate) ctx: Box<Ctx>,
    pub(crate) window: Box<[usize; WINDOW_WORDS]>,
}

struct Slot {
    busy: AtomicBool,
    ready: AtomicBool,
    scratch: UnsafeCell<Option<Scratch>>,
    stack_top: AtomicUsize,
}

// SAFETY: the scratch inside is only touched by the holder of `busy` (claimed with a CAS).
unsafe impl Sync for Slot {}

static SLOTS: [Slot; POOL] = [const {
    Slot {
        busy: AtomicBool::new(false),
        ready: AtomicBool::new(false),
        scratch: UnsafeCell::new(None),
        stack_top: AtomicUsize::new(0),
    }
}; POOL];

/// Allocates the pool's scratch space and stacks (once). Normal context.
pub(crate) fn fill_pool() {
    for slot in &SLOTS {
        if slot.ready.load(Ordering::Acquire) {
            continue;
        }
        if slot
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            // SAFETY: we hold `busy`, so nobody else touches the cell.
            unsafe {
                *slot.scratch.get() = Some(Scratch {
                    ctx: cfi::new_ctx(),
                    window: Box::new([0; WINDOW_WORDS]),
                })
            };
            if let Ok(top) = sys::map_stack(WALK_STACK) {
                slot.stack_top.store(top, Ordering::Relaxed);
            }
            slot.ready.store(true, Ordering::Release);
            slot.busy.store(false, Ordering::Release);
        }
    }
}

/// A claimed slot, returned to the pool on drop.
pub(crate) struct SlotGuard {
    slot: &'static Slot,
}

impl SlotGuard {
    /// Claims a free slot, starting the search at one picked by `hint`.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn claim(hint: usize) -> Option<SlotGuard> {
        for k in 0..POOL {
            let slot = &SLOTS[(hint + k) % POOL];
            if !slot.ready.load(Ordering::Acquire) {
                continue;
            }
            if slot
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(SlotGuard { slot });
            }
        }
        None
    }

    /// The high end of this slot's private walk stack (0 if it could not be mapped).
    pub(crate) fn stack_top(&self) -> usize {
        self.slot.stack_top.load(Ordering::Relaxed)
    }

    /// The slot's scratch space.
    pub(crate) fn scratch(&mut self) -> &mut Scratch {
        // SAFETY: we hold `busy`, so the cell is ours; `ready` was set (checked in `claim`)
        // after the scratch was stored, and it is never taken out again, so the Option is Some.
        unsafe { (*self.slot.scratch.get()).as_mut().unwrap_unchecked() }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slot.busy.store(false, Ordering::Release);
    }
}

/// In a forked child (one thread): the walks of the parent's other threads ended with them, so
/// their slots are free (a slot's scratch is set up again by each walk that claims it). A slot
/// that a thread of the parent was filling (not ready) stays busy: its scratch may be half
/// written, and filling it again would drop that.
pub(crate) fn after_fork() {
    for slot in &SLOTS {
        if slot.ready.load(Ordering::Acquire) {
            slot.busy.store(false, Ordering::Release);
        }
    }
}
