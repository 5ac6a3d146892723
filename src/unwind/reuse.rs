//! Reuse of a thread's previous walk: the part of the stack that did not change since.
//!
//! Two captures from the same thread usually share their outer frames (`main`, the runtime,
//! the event loop): a profiler's samples, or a program that captures from the same place again.
//! A walk is a pure function of the frame it starts from (pc, sp and rbp, in the hot loop) and of
//! the stack words it reads (each frame's return address, and its saved rbp when the rule
//! restores it), given the rules of the pcs, which depend only on the pcs in objects that are
//! never unloaded. So each thread keeps a record of its last complete walk: per frame, the pc,
//! sp and rbp it started from and the addresses of the words its step read. When a new walk
//! reaches a frame of the record (same pc, sp, rbp and rbp validity), it checks the recorded
//! words against the stack instead of stepping: every return address and saved rbp still there,
//! each read still allowed. Independent loads and compares, without the rule lookups and the
//! dependent chain of a walk. The first word that differs ends the reuse and the walk goes on
//! from that frame (the record's state there is the walk's, proven word by word): the result is
//! always the one a full walk gives, never a guess.
//!
//! Only frames whose rule is based on sp or rbp, and whose pcs lie in objects that are never
//! unloaded, are recorded; records belong to a state generation (a `dlopen` clears them).
//! Records are kept per thread stack (its high end) in a fixed table of static memory, claimed
//! with one compare-and-swap per walk, so nested walks (a signal handler's) and other threads
//! that hash to the same record walk without it. Nothing allocates.
#![allow(unsafe_code)]

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Frames one record holds (a power of two): the outermost ones of a deeper stack.
pub(crate) const CAP: usize = 128;
/// Records in the table (threads whose walks are remembered at the same time).
const RECORDS: usize = 64;
/// The claimed bit of a record's owner word (stack high ends are page-aligned).
const BUSY: usize = 1;
/// The bit of a record's owner word that its owner sets each time it releases the record and
/// another thread that would evict it clears: a record is evicted only when its owner did not
/// walk since another thread last looked (a second chance, as in the clock algorithm).
const RECENT: usize = 2;

/// Bit 0 of [`Frame::reads`]: rbp was known at this frame.
pub(crate) const BP_VALID: usize = 1;
/// Bit 1 of [`Frame::reads`]: the frame's step computed the CFA from rbp.
pub(crate) const BP_BASE: usize = 2;
/// Bit 2 of [`Frame::reads`]: a step from this frame outwards depends on the rbp this frame
/// starts with (it uses rbp as its CFA base before any step restores rbp from the stack), so a
/// walk joins this frame only with the same rbp.
pub(crate) const BP_NEEDED: usize = 4;
/// The flag bits of [`Frame::reads`] (addresses read are 8-byte aligned).
pub(crate) const FLAGS: usize = 7;
/// Bits 3-47 of [`Frame::reads`]: the address of the return address.
const ADDR: usize = ((1 << 48) - 1) & !FLAGS;

/// One frame of a walk: where it started and what its step read (32 bytes).
#[derive(Clone, Copy, Default)]
pub(crate) struct Frame {
    pub(crate) pc: usize,
    pub(crate) sp: usize,
    pub(crate) bp: usize,
    /// The flags ([`BP_VALID`], [`BP_BASE`], [`BP_NEEDED`]), the address the return address
    /// was read from (bits 3-47; 0 for the outermost frame: user-space stacks lie below 2^47),
    /// and the distance in words from there to the saved rbp (bits 48-63, signed; 0: the rule
    /// keeps rbp).
    pub(crate) reads: usize,
}

impl Frame {
    /// Packs `reads`: `rbp_at` is 0 when the step keeps rbp; `None` when the distance does not
    /// fit (never for a compiled rule, whose offsets are 16-bit).
    #[inline(always)]
    pub(crate) fn reads(ra_at: usize, rbp_at: usize, flags: usize) -> Option<usize> {
        let words = if rbp_at == 0 {
            0
        } else {
            let d = (rbp_at.wrapping_sub(ra_at) as isize) >> 3;
            if d == 0 || d != d as i16 as isize {
                return None;
            }
            d as i16 as u16 as usize
        };
        Some(ra_at | flags | words << 48)
    }

    /// The address the return address was read from.
    #[inline(always)]
    pub(crate) fn ra_at(&self) -> usize {
        self.reads & ADDR
    }

    /// The address the saved rbp was read from, if the step restored rbp.
    #[inline(always)]
    pub(crate) fn rbp_at(&self) -> Option<usize> {
        let words = (self.reads >> 48) as u16 as i16;
        (words != 0).then(|| self.ra_at().wrapping_add((words as isize * 8) as usize))
    }
}

struct Data {
    generation: u64,
    /// Walks since the record was last replaced (see [`Claim::staging`]).
    since_commit: u32,
    /// The last walk joined the record below frames that differed from it: the next ones
    /// probably will too, and skip staging their own frames.
    varying: bool,
    /// The record frame where that walk joined it (see [`Claim::parts`]).
    joined: usize,
    /// How many walks in a row before it joined the record at the same frame after frames of
    /// their own.
    same: u32,
    /// Frames in `frames`, outermost first: `frames[len - 1]` is the innermost.
    len: usize,
    frames: [Frame; CAP],
    /// The frames of the walk in progress, innermost first, by index modulo [`CAP`].
    stage: [Frame; CAP],
}

/// Aligned to two cache lines (the adjacent-line prefetcher fetches pairs), so that no line
/// holds the end of one record and the start of the next (records of 8,248 bytes put one's
/// last fields, written on every walk, in the line of the next one's owner word).
#[repr(align(128))]
struct Record {
    /// The stack high end of the thread whose walk is recorded (0: none), or-ed with [`BUSY`]
    /// while a walk holds the record and with [`RECENT`] after one released it.
    owner: AtomicUsize,
    /// Frames taken from the record instead of stepped, over the record's life.
    reused: AtomicU64,
    data: UnsafeCell<Data>,
}

// SAFETY: `data` is touched only by the walk that set BUSY in `owner` with a CAS.
unsafe impl Sync for Record {}

const EMPTY: Frame = Frame {
    pc: 0,
    sp: 0,
    bp: 0,
    reads: 0,
};

/// A record no thread owns.
const fn free_record() -> Record {
    Record {
        owner: AtomicUsize::new(0),
        reused: AtomicU64::new(0),
        data: UnsafeCell::new(Data {
            generation: 0,
            since_commit: 0,
            varying: false,
            joined: 0,
            same: 0,
            len: 0,
            frames: [EMPTY; CAP],
            stage: [EMPTY; CAP],
        }),
    }
}

static TABLE: [Record; RECORDS] = [const { free_record() }; RECORDS];

/// In a forked child (one thread): a record held by a walk of another thread of the parent is
/// emptied (that walk ended with its thread; its data may be half written).
pub(crate) fn after_fork() {
    for rec in &TABLE {
        if rec.owner.load(Ordering::Relaxed) & BUSY != 0 {
            rec.owner.store(0, Ordering::Release);
        }
    }
}

static ENABLED: AtomicBool = AtomicBool::new(true);

/// See [`super::set_walk_reuse`].
pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Frames taken from records instead of stepped, since the process started.
pub(crate) fn reused() -> u64 {
    TABLE.iter().map(|r| r.reused.load(Ordering::Relaxed)).sum()
}

/// Walks in a row that joined the record at the same frame before the next ones start
/// comparing there (see [`Claim::parts`]).
const SAME_JOINS: u32 = 4;

/// Record frames above the join frame there must be for a walk to start comparing at it (see
/// [`Claim::parts`]).
const SKIP_MIN: usize = 8;

/// Where walks join the record below frames of their own, one in this many stages its frames
/// (see [`Claim::staging`])...
const STAGE_EVERY: u32 = 64;
/// ...and of the others one in this many compares every frame with the record instead of
/// starting at the frame the last walks joined (see [`Claim::parts`]). Neither walk goes through
/// the fast walk's compact runs, and they cost up to twice a run's time a frame: in 16 and 8,
/// as before, walk reuse on made the dense-site bench's walks slower than stepping every frame
/// (0.45-0.47x libunwind against 0.40-0.43x), and the 2,048-site bench's 0.42-0.43x (0.37-0.38x
/// in 64 and 32). A stack that changes shape is recorded at once all the same (a walk that
/// joins no record frame makes the next one stage), and a join that moves outwards is followed
/// by the walks that start at the old one.
const COMPARE_EVERY: u32 = 32;

/// A record held by one walk; released on drop.
pub(crate) struct Claim {
    rec: &'static Record,
    high: usize,
    /// Frames of the record this walk may use: 0 unless the record is this thread's and of
    /// the current generation.
    len: usize,
    /// This walk stages its frames (see [`Claim::staging`]).
    staging: bool,
    /// The record frame to start comparing at (see [`Claim::parts`]).
    hint: Option<usize>,
}

impl Claim {
    /// Claims the record of the thread whose stack ends at `high`, for a walk with the state of
    /// `generation`: this thread's own record if it has one, else a free one it may fill.
    /// `None` when reuse is off or every candidate is held.
    ///
    /// # Async-signal safety
    /// Async-signal-safe, lock-free.
    #[inline]
    pub(crate) fn take(high: usize, generation: u64) -> Option<Claim> {
        if !ENABLED.load(Ordering::Relaxed) {
            return None;
        }
        Claim::take_in(&TABLE, high, generation)
    }

    /// [`take`](Self::take) in `table` (a power of two records).
    #[inline(always)]
    fn take_in(table: &'static [Record], high: usize, generation: u64) -> Option<Claim> {
        if high == 0 || high & (BUSY | RECENT) != 0 || table.is_empty() {
            return None;
        }
        let h = (high >> 12).wrapping_mul(0x9e37_79b9_7f4a_7c15_u64 as usize) >> 58;
        let first = &table[h % table.len()];
        let second = &table[(h + 1) % table.len()];
        // This thread's record first. The second record's owner word is read only if the first
        // is not this thread's: it may be another thread's record, whose owner word that
        // thread writes on every walk.
        let a = first.owner.load(Ordering::Relaxed);
        if a & !RECENT == high {
            return Claim::hold(first, a, high, generation);
        }
        let b = second.owner.load(Ordering::Relaxed);
        if b & !RECENT == high {
            return Claim::hold(second, b, high, generation);
        }
        Claim::take_other([(first, a), (second, b)], high, generation)
    }

    /// Takes `rec`, whose owner word was `expect`, for the thread whose stack ends at `high`.
    #[inline(always)]
    fn hold(
        rec: &'static Record,
        expect: usize,
        high: usize,
        generation: u64,
    ) -> Option<Claim> {
        rec.owner
            .compare_exchange(expect, high | BUSY, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Claim::new(rec, high, expect & !RECENT == high, generation))
    }

    /// Neither candidate is this thread's: an empty one; else one that is not held and whose
    /// owner did not walk since a thread last looked here. A record whose owner walked
    /// meanwhile is only marked: two threads whose stacks share a first record (and whose
    /// second holds a thread's that exited) once evicted each other's on every walk, and their
    /// walks, each starting a record again, took longer than with reuse off. Out of the
    /// walk's entry (inlined, the eviction rule made walks with reuse off slower, though they
    /// never run it).
    #[cold]
    #[inline(never)]
    fn take_other(
        candidates: [(&'static Record, usize); 2],
        high: usize,
        generation: u64,
    ) -> Option<Claim> {
        if let Some(&(rec, w)) = candidates.iter().find(|&&(_, w)| w == 0) {
            return Claim::hold(rec, w, high, generation);
        }
        for (rec, w) in candidates {
            if w & BUSY != 0 {
                continue;
            }
            if w & RECENT == 0 {
                return Claim::hold(rec, w, high, generation);
            }
            // Failing is harmless: the owner walked (and set the bit again) or another thread
            // cleared it.
            let _ = rec.owner.compare_exchange(
                w,
                w & !RECENT,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        None
    }

    fn new(rec: &'static Record, high: usize, mine: bool, generation: u64) -> Claim {
        let mut c = Claim {
            rec,
            high,
            len: 0,
            staging: false,
            hint: None,
        };
        let d = c.data();
        let valid = mine && d.generation == generation && d.len <= CAP;
        if !valid {
            d.len = 0;
            d.generation = generation;
            d.varying = false;
            d.same = 0;
        }
        c.staging = c.staging();
        let staging = c.staging;
        let d = c.data();
        let len = if valid { d.len.min(CAP) } else { 0 };
        // One walk in COMPARE_EVERY compares every frame all the same: the walks that start at
        // the frame always join there, so only the others tell whether the join moved.
        let stable = !staging
            && d.varying
            && d.same >= SAME_JOINS
            && !d.since_commit.is_multiple_of(COMPARE_EVERY);
        // Only above many record frames: comparing a few costs less than the joins that
        // starting at the frame can miss (a recursion a level deeper or shallower).
        let above = len.saturating_sub(d.joined + 1);
        c.hint = (stable && d.joined < len && above >= SKIP_MIN).then_some(d.joined);
        c.len = len;
        c
    }

    #[inline(always)]
    fn data(&mut self) -> &mut Data {
        // SAFETY: we set BUSY in the record's owner with a CAS and clear it only on drop, so no
        // other walk touches `data` while this claim lives.
        unsafe { &mut *self.rec.data.get() }
    }

    /// The recorded frames (outermost first) and the stage: the frames of the walk in
    /// progress, innermost first, by index modulo [`CAP`]; no stage when this walk should not
    /// stage its frames (see [`Claim::staging`]). Then, for a walk that does not stage, the
    /// record frame where the last walks all joined the record below frames of their own
    /// ([`SAME_JOINS`] in a row): the frames of the record above it are those that keep
    /// differing, so this walk need not compare its own frames with them (a frame not compared
    /// is stepped: the same frame, at a step's cost). Not where the walks join at different
    /// frames (a recursion of varying depth: comparing finds the innermost frame to join).
    #[inline(always)]
    pub(crate) fn parts(&mut self) -> (&[Frame], Option<&mut [Frame; CAP]>, Option<usize>) {
        let (len, staging, hint) = (self.len, self.staging, self.hint);
        let d = self.data();
        (&d.frames[..len], staging.then_some(&mut d.stage), hint)
    }

    /// Whether this walk compares no record frame before the one [`parts`](Self::parts) gives
    /// and stages nothing: its runs of compact frames may go through the fast walk's compact
    /// run.
    #[inline(always)]
    pub(crate) fn runs(&self) -> bool {
        !self.staging && (self.len == 0 || self.hint.is_some())
    }

    /// The stage (see [`Claim::parts`]).
    #[inline(always)]
    pub(crate) fn stage(&mut self) -> &mut [Frame; CAP] {
        &mut self.data().stage
    }

    /// Whether this walk stages its frames for a new record. Staging costs a few stores a
    /// frame; where consecutive walks differ below a common part (a profiler's samples of one
    /// loop, different leaves each time) the record's common part serves them all, and
    /// re-recording the varying frames each time costs more than it saves. So a walk that
    /// joined the record below frames that differed makes the next walks skip staging, except
    /// one in [`STAGE_EVERY`], which records the current shape of the stack.
    #[inline(always)]
    fn staging(&mut self) -> bool {
        let d = self.data();
        d.since_commit = d.since_commit.wrapping_add(1);
        !d.varying || d.since_commit.is_multiple_of(STAGE_EVERY)
    }

    /// Notes how a complete walk went: it joined the record at record frame `joined` after
    /// stepping frames of its own (`varying`), or not; `hinted`: it started comparing at the
    /// frame [`parts`](Self::parts) gave (so it could not join elsewhere, and does not count).
    pub(crate) fn complete(&mut self, varying: bool, joined: usize, hinted: bool) {
        let d = self.data();
        if !hinted {
            d.same = match varying && d.varying && joined == d.joined {
                true => d.same.saturating_add(1),
                false => 0,
            };
        }
        d.varying = varying;
        d.joined = joined;
    }

    /// Replaces the record with a complete walk: the recorded frames `keep` (the outermost
    /// ones of the old record, whose words the walk just checked) below the staged frames
    /// `from..to` (innermost first) of this walk. Frames beyond [`CAP`] are left out
    /// innermost first.
    pub(crate) fn commit(&mut self, keep: usize, from: usize, to: usize) {
        let d = self.data();
        let keep = keep.min(d.len).min(CAP);
        let room = CAP - keep;
        let from = from
            .max(to.saturating_sub(room))
            .max(to.saturating_sub(CAP));
        let mut at = keep;
        // Whether the frame outside the next one depends on its rbp.
        let mut needed = keep
            .checked_sub(1)
            .is_some_and(|i| d.frames[i].reads & BP_NEEDED != 0);
        for f in (from..to).rev() {
            let mut e = d.stage[f & (CAP - 1)];
            needed = e.reads & BP_BASE != 0 || (e.rbp_at().is_none() && needed);
            e.reads = (e.reads & !BP_NEEDED) | (needed as usize * BP_NEEDED);
            d.frames[at] = e;
            at += 1;
        }
        d.len = at;
        d.since_commit = 0;
    }

    /// Counts `n` frames taken from the record.
    pub(crate) fn count(&mut self, n: usize) {
        // Only the holder of the claim writes the counter: a plain add is exact.
        let r = &self.rec.reused;
        r.store(r.load(Ordering::Relaxed) + n as u64, Ordering::Relaxed);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.rec.owner.store(self.high | RECENT, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page-aligned stack high end (none a real thread has) whose home in a table of
    /// `len` records is `home`, the `skip`-th such one.
    fn high_with_home(home: usize, len: usize, skip: usize) -> usize {
        (1usize..)
            .map(|k| 0x4000_0000 + k * 4096)
            .filter(|&hi| ((hi >> 12).wrapping_mul(0x9e37_79b9_7f4a_7c15_u64 as usize) >> 58) % len == home)
            .nth(skip)
            .expect("a high end")
    }

    fn owner(r: &Record) -> usize {
        r.owner.load(Ordering::Relaxed) & !RECENT
    }

    #[test]
    fn two_threads_sharing_a_home_keep_a_record_each() {
        static T: [Record; 4] = [const { free_record() }; 4];
        let (a, b) = (high_with_home(1, 4, 0), high_with_home(1, 4, 1));
        // A thread that walked once and exited, in the second record of that home.
        let gone = high_with_home(2, 4, 0);
        drop(Claim::take_in(&T, gone, 1).expect("empty record"));
        assert_eq!(owner(&T[2]), gone);
        drop(Claim::take_in(&T, a, 1).expect("empty record"));
        assert_eq!(owner(&T[1]), a);
        // b, then a, walk in turns: b must not take a's record (the first of both) while a
        // keeps walking; it takes the exited thread's once that one was passed over once.
        let mut b_took = Vec::new();
        for _ in 0..6 {
            if let Some(c) = Claim::take_in(&T, b, 1) {
                b_took.push(c.rec as *const Record as usize);
            }
            let c = Claim::take_in(&T, a, 1).expect("a's own record");
            assert!(core::ptr::eq(c.rec, &T[1]), "a lost its record");
            drop(c);
            assert_eq!(owner(&T[1]), a);
        }
        assert_eq!(owner(&T[2]), b, "b has the exited thread's record");
        assert!(b_took.len() >= 5, "b walked with a record {} times of 6", b_took.len());
        assert!(b_took.iter().all(|&r| r == &T[2] as *const Record as usize));
        // A record held by a walk is never taken, and a third thread of that home, while a and
        // b keep walking, finds both records in use: it walks without one and evicts neither.
        let c = high_with_home(1, 4, 2);
        let held = Claim::take_in(&T, a, 1).expect("a's own record");
        assert!(Claim::take_in(&T, c, 1).is_none());
        drop(held);
        for _ in 0..4 {
            drop(Claim::take_in(&T, b, 1).expect("b's own record"));
            drop(Claim::take_in(&T, a, 1).expect("a's own record"));
            assert!(Claim::take_in(&T, c, 1).is_none());
        }
        assert_eq!((owner(&T[1]), owner(&T[2])), (a, b));
        // Once b stops walking, c takes b's record (a's stays a's).
        drop(Claim::take_in(&T, a, 1).expect("a's own record"));
        let took = Claim::take_in(&T, c, 1).map(|x| x.rec as *const Record as usize);
        assert_eq!(took, Some(&T[2] as *const Record as usize));
        assert_eq!((owner(&T[1]), owner(&T[2])), (a, c));
    }
}
