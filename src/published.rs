//! A value published for lock-free readers, including signal handlers.
//!
//! A writer (normal context only) swaps in a new value and frees the old one once no reader
//! that may hold it is left. A reader never sees freed memory, never blocks and never
//! allocates.
//!
//! Readers announce themselves in one of two ways:
//! - in their thread's **slot**: each live thread (told by its thread pointer, which glibc gives
//!   every thread its own) claims a slot of the cell once, with one compare-and-swap, and then
//!   marks a read with plain stores to it (the cell's epoch, which every swap raises, and a
//!   count of nested reads): no atomic read-modify-write, no cache line shared with another
//!   thread. Nothing orders such a store before the reader's load of the pointer on
//!   the reader's side; the writer does it, with `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`
//!   after its swap, which makes every running thread of the process execute a full barrier
//!   (a thread not running passed one when it was switched out): a reader that loaded the old
//!   pointer then has its mark visible to the writer, which waits until the slot shows
//!   anything else (a later read records a later epoch, so it never holds the writer up). A signal handler that
//!   reads on a thread already reading nests on the same slot (it restores the mark before it
//!   returns), so a slot needs no atomic update;
//! - on the cell's shared **counter** (two atomic read-modify-writes), where there is no slot:
//!   before the process could register for `membarrier` (its first publish does), where the
//!   kernel or an emulator refuses it, without a thread pointer, or when the slots a thread may
//!   use are all taken by other threads (slots are never given back: a thread's pthread block,
//!   and with it its thread pointer, is reused by later threads).
#![allow(unsafe_code)]

use crate::sys;
use core::sync::atomic::{compiler_fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Reader slots per cell.
const SLOTS: usize = 128;
/// Slots a thread may claim (from the one its thread pointer hashes to).
const PROBES: usize = 4;

/// Whether this process registered for private expedited `membarrier`, so that readers may
/// announce themselves in slots. Set once, by the first writer that registers.
static SLOTS_ON: AtomicBool = AtomicBool::new(false);

/// One thread's reader slot, alone in its cache line.
#[repr(align(64))]
struct Slot {
    /// The thread pointer of the thread that claimed it; 0 while free.
    owner: AtomicUsize,
    /// `epoch << DEPTH_BITS | depth`: the reads the owner has in progress (more than one only
    /// when a signal handler reads while the thread it interrupted was reading), and the cell's
    /// epoch when the outermost of them began.
    state: AtomicUsize,
}

/// Low bits of [`Slot::state`] that count nested reads.
const DEPTH_BITS: u32 = 8;
/// The most reads a slot nests (a deeper one goes to the counter).
const DEPTH_MAX: usize = (1 << DEPTH_BITS) - 1;

/// A lock-free published `T`.
pub(crate) struct Published<T> {
    ptr: AtomicPtr<T>,
    /// How many values were swapped out; raised after each swap.
    epoch: AtomicUsize,
    /// Readers without a slot.
    readers: AtomicUsize,
    slots: [Slot; SLOTS],
    /// Serialises writers; taken over from a writer that is gone (a thread of the parent of a
    /// forked child).
    writer: crate::fork::ForkMutex<()>,
}

/// How long a writer waits for readers of the old value before it gives up and leaks it.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

impl<T> Published<T> {
    /// An empty cell.
    pub(crate) const fn new() -> Self {
        Published {
            ptr: AtomicPtr::new(core::ptr::null_mut()),
            epoch: AtomicUsize::new(0),
            readers: AtomicUsize::new(0),
            slots: [const {
                Slot {
                    owner: AtomicUsize::new(0),
                    state: AtomicUsize::new(0),
                }
            }; SLOTS],
            writer: crate::fork::ForkMutex::new(()),
        }
    }

    /// Runs `f` on the current value (`None` before the first publish).
    ///
    /// # Async-signal safety
    /// Async-signal-safe: no lock, no allocation; plain loads and stores to this thread's slot
    /// (a compare-and-swap the first time), or two atomic increments on the shared counter.
    #[inline]
    pub(crate) fn read<R>(&self, f: impl FnOnce(Option<&T>) -> R) -> R {
        let slot = self
            .slot()
            .map(|s| (s, s.state.load(Ordering::Relaxed)))
            .filter(|&(_, st)| st & DEPTH_MAX != DEPTH_MAX);
        let Some((slot, st)) = slot else {
            self.readers.fetch_add(1, Ordering::SeqCst);
            let p = self.ptr.load(Ordering::SeqCst);
            // SAFETY: p is null or a Box-allocated T published by `update`; it is not freed
            // while `readers` is non-zero, and we hold one count until `f` returns.
            let r = f(unsafe { p.as_ref() });
            self.readers.fetch_sub(1, Ordering::Release);
            return r;
        };
        // Only this thread (and signal handlers on it, which run to completion in between and
        // put back what they found) writes this slot's state: a load and a store are an update.
        // An outermost read records the epoch; its acquire load orders the pointer load after
        // it, so a read that records an epoch after a swap loads the swapped-in pointer.
        let mark = if st & DEPTH_MAX == 0 {
            self.epoch.load(Ordering::Acquire) << DEPTH_BITS | 1
        } else {
            st + 1
        };
        slot.state.store(mark, Ordering::Relaxed);
        // The mark before the load: the compiler keeps the order; the writer's membarrier
        // makes the mark visible to it wherever this thread's load got the old pointer.
        compiler_fence(Ordering::SeqCst);
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: p is null or a Box-allocated T published by `update`; a writer that swapped
        // it out frees it only after it saw this slot idle or in a later epoch (the membarrier
        // makes the mark above visible to it before it looks), and we put the state back only
        // after `f` returns.
        let r = f(unsafe { p.as_ref() });
        slot.state.store(st, Ordering::Release);
        r
    }

    /// This thread's slot, claimed now if it has none; `None` when readers may not use slots
    /// (see the module docs) or the slots this thread may claim are taken.
    #[inline]
    fn slot(&self) -> Option<&Slot> {
        if !SLOTS_ON.load(Ordering::Relaxed) {
            return None;
        }
        let tp = sys::thread_pointer();
        if tp == 0 {
            return None;
        }
        let h = (tp >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15_u64 as usize)
            >> (usize::BITS - SLOTS.trailing_zeros());
        for i in 0..PROBES {
            let s = &self.slots[(h + i) % SLOTS];
            match s.owner.load(Ordering::Relaxed) {
                o if o == tp => return Some(s),
                // Slots are never freed, so a thread's own slot comes before any free one.
                0 => match s
                    .owner
                    .compare_exchange(0, tp, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return Some(s),
                    // A signal handler on this thread claimed it in between.
                    Err(o) if o == tp => return Some(s),
                    Err(_) => {}
                },
                _ => {}
            }
        }
        None
    }

    /// Builds and publishes a new value under the writer lock; `build` sees the old value.
    /// Returns `false` without building when `try_only` is set and another writer is busy.
    ///
    /// Not async-signal-safe: call in normal context only.
    pub(crate) fn update(
        &self,
        try_only: bool,
        build: impl FnOnce(Option<&T>) -> Option<T>,
    ) -> bool {
        let _guard = if try_only {
            match self.writer.try_lock() {
                Some(g) => g,
                None => return false,
            }
        } else {
            self.writer.lock()
        };
        let old = self.ptr.load(Ordering::Acquire);
        // SAFETY: only writers (serialised by the lock we hold) free values, so `old` is live.
        let Some(new) = build(unsafe { old.as_ref() }) else {
            return false;
        };
        let new = Box::into_raw(Box::new(new));
        let old = self.ptr.swap(new, Ordering::SeqCst);
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let slots_seen = slot_marks_visible();
        if !old.is_null() {
            if !slots_seen {
                // A reader in a slot may hold `old` unseen: leak it rather than free memory
                // that someone may still read.
                return true;
            }
            let start = Instant::now();
            // Readers never drained (a handler stuck mid-walk?): leak rather than free memory
            // that someone may still read.
            let drained = |busy: &dyn Fn() -> bool| {
                while busy() {
                    if start.elapsed() > DRAIN_LIMIT {
                        return false;
                    }
                    std::thread::yield_now();
                }
                true
            };
            // After the membarrier, a slot that may hold `old` shows the mark of the read that
            // loaded it: busy, in an epoch before this swap's (a read that records this epoch
            // or a later one loads the new pointer). Once it shows anything else, that read is
            // over. Readers that read back to back thus never hold the writer up.
            for s in &self.slots {
                let busy = || {
                    let st = s.state.load(Ordering::Acquire);
                    st & DEPTH_MAX != 0 && st >> DEPTH_BITS < epoch
                };
                if !drained(&busy) {
                    return true;
                }
            }
            if !drained(&|| self.readers.load(Ordering::SeqCst) != 0) {
                return true;
            }
            // SAFETY: `old` came from Box::into_raw, is no longer reachable through `ptr`, and
            // every reader that could have loaded it has finished: those on the counter, and
            // those in slots, whose marks the membarrier made visible before we looked.
            drop(unsafe { Box::from_raw(old) });
        }
        true
    }
}

impl<T> Published<T> {
    /// In a forked child, which has one thread (the `pthread_atfork` child handler): the reads
    /// that the parent's other threads had in progress ended with them. Their slots are free
    /// and the shared counter is zero, or a writer would wait for them (2 s) and leak.
    pub(crate) fn after_fork(&self) {
        let tp = sys::thread_pointer();
        for s in &self.slots {
            if tp == 0 || s.owner.load(Ordering::Relaxed) != tp {
                s.state.store(0, Ordering::Relaxed);
                s.owner.store(0, Ordering::Relaxed);
            }
        }
        self.readers.store(0, Ordering::SeqCst);
    }
}

/// After a writer's swap: makes every slot mark set before a reader's load of the pointer
/// visible to this thread (`membarrier`), registering the process first if it is not yet (then
/// readers start using slots). `false` when readers may be in slots and the barrier failed.
fn slot_marks_visible() -> bool {
    if !SLOTS_ON.load(Ordering::SeqCst) {
        if !sys::membarrier_register() {
            // Never registered, so no reader uses a slot (registration, once it worked in this
            // process, works again).
            return true;
        }
        SLOTS_ON.store(true, Ordering::SeqCst);
    }
    // (A forked child may have to register again.)
    sys::membarrier_private() || (sys::membarrier_register() && sys::membarrier_private())
}

#[cfg(test)]
mod tests {
    use super::Published;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A value that knows whether it was dropped: a reader that sees `alive` false read freed
    /// (here: retired) memory.
    struct Val {
        n: usize,
        alive: AtomicBool,
        drops: Arc<AtomicUsize>,
    }

    impl Drop for Val {
        fn drop(&mut self) {
            self.alive.store(false, Ordering::SeqCst);
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn readers_in_slots_and_on_the_counter_never_see_a_dropped_value() {
        static CELL: Published<Val> = Published::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let updates = 400;
        let readers: Vec<_> = (0..6)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let (mut reads, mut last) = (0u64, 0);
                    while !stop.load(Ordering::Relaxed) {
                        CELL.read(|v| {
                            if let Some(v) = v {
                                assert!(v.alive.load(Ordering::SeqCst), "read a dropped value");
                                // Values only move forward for one reader.
                                assert!(v.n >= last);
                                last = v.n;
                                // Hold it a little, as a walk does.
                                for _ in 0..50 {
                                    std::hint::spin_loop();
                                }
                                assert!(v.alive.load(Ordering::SeqCst), "dropped under a reader");
                            }
                        });
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        for n in 1..=updates {
            let d = drops.clone();
            assert!(CELL.update(false, |_| Some(Val {
                n,
                alive: AtomicBool::new(true),
                drops: d,
            })));
        }
        stop.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(reads > 0);
        // Every value but the current one was freed (none leaked), none while read.
        assert_eq!(drops.load(Ordering::SeqCst), updates - 1);
        // The readers used their slots (membarrier works on this kernel).
        if super::SLOTS_ON.load(Ordering::SeqCst) {
            let owned = CELL
                .slots
                .iter()
                .filter(|s| s.owner.load(Ordering::SeqCst) != 0)
                .count();
            assert!(owned >= 6, "{owned} slots claimed");
        }
        CELL.read(|v| assert_eq!(v.map(|v| v.n), Some(updates)));
    }
}
