//! The sample ring: fixed slots allocated at start, filled by signal handlers on any thread
//! (many producers, lock-free: one compare-and-swap to take a slot), emptied by the profiler's
//! thread (one consumer at a time, under the aggregator's lock).
//!
//! Each slot has a sequence number (Vyukov's bounded queue): slot `i` is free for the producer
//! of position `p` (`p % capacity == i`) when its sequence is `p`, holds a published sample of
//! position `p` when it is `p + 1`, and is handed back for position `p + capacity` by the
//! consumer. A producer that finds the slot of the next position still unread drops its
//! sample and counts it.
#![allow(unsafe_code)]

use super::MAX_DEPTH;
use crate::unwind::{FrameKinds, WalkEnd};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU64, Ordering};

/// One sample as the handler wrote it.
pub(crate) struct Record {
    pub tid: i32,
    /// Periods this sample stands for (1 + the timer's overrun count).
    pub weight: u32,
    pub len: usize,
    pub end: WalkEnd,
    /// Which frames are exact, as the handler's walk recorded them.
    pub kinds: FrameKinds,
    pub frames: [usize; MAX_DEPTH],
}

struct Slot {
    seq: AtomicU64,
    rec: UnsafeCell<Record>,
}

/// The ring. Shared between the handler (through a raw pointer published by `running.rs`, read
/// in `handler.rs`) and the profiler's thread.
pub(crate) struct Ring {
    slots: Box<[Slot]>,
    head: AtomicU64,
    tail: AtomicU64,
    /// Periods of the samples dropped because the ring was full.
    pub dropped: AtomicU64,
    /// Samples written.
    pub written: AtomicU64,
}

// SAFETY: a slot's record is written only by the producer that won its position and read only
// by the consumer after the producer published it (the sequence number orders both).
unsafe impl Sync for Ring {}

impl Ring {
    /// A ring of `capacity` slots. Normal context only (it allocates).
    pub(crate) fn new(capacity: usize) -> Ring {
        let slots = (0..capacity)
            .map(|i| Slot {
                seq: AtomicU64::new(i as u64),
                rec: UnsafeCell::new(Record {
                    tid: 0,
                    weight: 0,
                    len: 0,
                    end: WalkEnd::Complete,
                    kinds: FrameKinds::NONE,
                    frames: [0; MAX_DEPTH],
                }),
            })
            .collect();
        Ring {
            slots,
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            written: AtomicU64::new(0),
        }
    }

    /// Samples written and not yet read (approximate while producers run).
    pub(crate) fn fill(&self) -> u64 {
        self.head
            .load(Ordering::Relaxed)
            .saturating_sub(self.tail.load(Ordering::Relaxed))
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Takes a free slot, lets `fill` write the record, publishes it. Returns false when the
    /// ring is full, and adds `weight` (the periods the sample stood for) to `dropped`.
    ///
    /// # Async-signal safety
    /// Async-signal-safe: atomics only, no loop that waits for another thread.
    pub(crate) fn push(&self, weight: u32, fill: impl FnOnce(&mut Record)) -> bool {
        let cap = self.slots.len() as u64;
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[(pos % cap) as usize];
            let seq = slot.seq.load(Ordering::Acquire);
            if seq == pos {
                match self.head.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: winning position `pos` makes this producer the slot's only
                        // writer until it publishes `pos + 1`; the consumer reads it only then.
                        let rec = unsafe { &mut *slot.rec.get() };
                        fill(rec);
                        slot.seq.store(pos + 1, Ordering::Release);
                        self.written.fetch_add(1, Ordering::Relaxed);
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if seq < pos {
                // The slot still holds the sample of position `pos - capacity`: full.
                self.dropped.fetch_add(u64::from(weight), Ordering::Relaxed);
                return false;
            } else {
                // Another producer took `pos` meanwhile.
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Reads published samples in order until the first slot that is not published yet (a
    /// producer may be writing it; the next drain gets it). One consumer at a time: the
    /// caller holds the aggregator's lock.
    pub(crate) fn drain(&self, mut each: impl FnMut(&Record)) -> u64 {
        let cap = self.slots.len() as u64;
        let mut n = 0;
        loop {
            let pos = self.tail.load(Ordering::Relaxed);
            let slot = &self.slots[(pos % cap) as usize];
            if slot.seq.load(Ordering::Acquire) != pos + 1 {
                return n;
            }
            // SAFETY: the producer published the record (Acquire above pairs with its
            // Release) and no producer touches the slot again before we hand it back below.
            each(unsafe { &*slot.rec.get() });
            slot.seq.store(pos + cap, Ordering::Release);
            self.tail.store(pos + 1, Ordering::Relaxed);
            n += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ring_drops_and_counts_then_accepts_again() {
        let ring = Ring::new(16);
        for i in 0..16 {
            assert!(ring.push(1, |r| {
                r.tid = i;
                r.len = 1;
                r.frames[0] = 100 + i as usize;
            }));
        }
        assert!(!ring.push(3, |_| unreachable!("a full ring gives no slot")));
        assert!(!ring.push(2, |_| unreachable!("a full ring gives no slot")));
        assert_eq!(ring.dropped.load(Ordering::Relaxed), 5);
        let mut seen = Vec::new();
        assert_eq!(ring.drain(|r| seen.push((r.tid, r.frames[0]))), 16);
        assert_eq!(
            seen,
            (0..16).map(|i| (i, 100 + i as usize)).collect::<Vec<_>>()
        );
        assert!(ring.push(1, |r| r.tid = 99));
        let mut again = Vec::new();
        ring.drain(|r| again.push(r.tid));
        assert_eq!(again, [99]);
        assert_eq!(ring.written.load(Ordering::Relaxed), 17);
    }

    #[test]
    fn concurrent_producers_lose_nothing_that_was_not_counted() {
        let ring = std::sync::Arc::new(Ring::new(64));
        let producers: Vec<_> = (0..4)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        ring.push(1, |r| {
                            r.tid = t;
                            r.len = 1;
                            r.frames[0] = i;
                        });
                    }
                })
            })
            .collect();
        let mut got = 0u64;
        let mut last = [None::<usize>; 4];
        while producers.iter().any(|p| !p.is_finished()) || ring.fill() > 0 {
            got += ring.drain(|r| {
                // Each producer's samples come out in the order it wrote them.
                let t = r.tid as usize;
                assert!(last[t].is_none_or(|l| l < r.frames[0]));
                last[t] = Some(r.frames[0]);
            });
        }
        for p in producers {
            p.join().unwrap();
        }
        got += ring.drain(|_| {});
        assert_eq!(got + ring.dropped.load(Ordering::Relaxed), 80_000);
    }
}
