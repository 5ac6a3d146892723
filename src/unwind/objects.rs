//! The published unwinder state: every loaded object's range, code segments and unwind tables,
//! the shared rule cache, and the signal trampolines; and the per-walk record of which objects
//! were checked to be still loaded.
//!
//! The state is built in normal context (it allocates) and published lock-free; a walk never
//! allocates.

use super::tables::UnwindData;
use super::cache::RuleCache;
use crate::modules::{Identity, Snapshot, Verdict};
use crate::published::Published;
use crate::sys;
use core::ops::Range;

/// What a walk needs to know about an object.
pub(crate) struct ObjectCheck {
    pub(crate) range: Range<usize>,
    /// The first executable segment (inline: checked for every frame).
    pub(crate) text: Range<usize>,
    /// Further executable segments (rare).
    pub(crate) more_exec: Vec<Range<usize>>,
    /// What tells this object from another one loaded later at its addresses.
    pub(crate) identity: Identity,
    /// Never unloaded (the main program, the vDSO, objects mapped at start): no check needed,
    /// and the unwind tables are read in place.
    pub(crate) permanent: bool,
    /// The object's unwind tables, if it has any.
    pub(crate) unwind: Option<UnwindData>,
}

impl ObjectCheck {
    /// Whether `len` bytes of code at `pc` lie in one executable segment.
    #[inline]
    pub(crate) fn is_code(&self, pc: usize, len: usize) -> bool {
        let end = pc.saturating_add(len);
        (self.text.start <= pc && end <= self.text.end)
            || self.more_exec.iter().any(|r| r.start <= pc && end <= r.end)
    }

    /// The code range that frame-pointer mode checks `ra - 1` against in one comparison, as
    /// (start, length): the part of the object's first executable segment around `at` that
    /// holds no return address into a signal trampoline (`restorers`, the lowest and highest;
    /// empty when lowest > highest). `(0, 0)` when `at` is not in it.
    pub(crate) fn fp_text(&self, (lo, hi): (usize, usize), at: usize) -> (usize, usize) {
        let (mut start, mut end) = (self.text.start, self.text.end);
        // Return addresses lo..=hi are `at` values lo - 1..=hi - 1.
        if lo <= hi && lo <= end && hi > start {
            if at.wrapping_add(1) < lo {
                end = end.min(lo - 1);
            } else if at >= hi {
                start = start.max(hi);
            } else {
                return (0, 0);
            }
        }
        if at < start || at >= end {
            return (0, 0);
        }
        (start, end - start)
    }
}

/// The published unwinder: objects, their tables, and the rule cache.
pub(crate) struct State {
    pub(crate) objects: Vec<ObjectCheck>,
    pub(crate) cache: RuleCache,
    /// The signal-return trampolines (`sa_restorer`) of the handlers installed when the state
    /// was built: the frame-pointer walk recognises signal frames by these.
    pub(crate) restorers: [usize; 8],
    /// The lowest and highest of `restorers` (an empty range if there are none).
    pub(crate) restorer_span: (usize, usize),
    /// The index of the object holding the C library's thread and program start routines,
    /// where the outermost frames of almost every stack are: looked at before any search
    /// ([`State::find_near`]). `usize::MAX` if not known.
    pub(crate) outer: usize,
    /// That object's code as frame-pointer mode checks it ([`ObjectCheck::fp_text`]): the pieces
    /// below and above the signal trampolines, as (start, length); `(0, 0)` for none. Only
    /// when the object is permanent (so that no frame in it needs a check).
    pub(crate) fp_outer: [(usize, usize); 2],
    pub(crate) generation: u64,
}

impl State {
    fn build(snapshot: &Snapshot) -> State {
        let mut objects = Vec::with_capacity(snapshot.objects().len());
        for o in snapshot.objects() {
            let unwind = UnwindData::of(o);
            objects.push(ObjectCheck {
                range: o.range.clone(),
                text: o.exec.first().cloned().unwrap_or(0..0),
                more_exec: o.exec.iter().skip(1).cloned().collect(),
                identity: o.identity(),
                permanent: o.permanent,
                unwind,
            });
        }
        let mut restorers = [0usize; 8];
        let mut n = sys::signal_restorers(&mut restorers);
        // The kernel's own trampoline, where it is in the vDSO (aarch64's
        // `__kernel_rt_sigreturn`: glibc installs no `sa_restorer` there).
        for o in snapshot.objects().iter().filter(|o| o.is_vdso) {
            for r in &o.exec {
                n = vdso_trampolines(r, &mut restorers, n);
            }
        }
        let restorer_span = if n == 0 {
            (1, 0)
        } else {
            let r = &restorers[..n];
            (
                r.iter().copied().min().unwrap_or(1),
                r.iter().copied().max().unwrap_or(0),
            )
        };
        // `pthread_create` is where `start_thread` is (and `__libc_start_main`): resolved
        // through the GOT, its address lies in the C library (or in the program, when static).
        let start_routine = libc::pthread_create as *const () as usize;
        let outer = find_in(&objects, start_routine).unwrap_or(usize::MAX);
        let fp_outer = match objects.get(outer) {
            Some(o) if o.permanent && !o.text.is_empty() => [
                o.fp_text(restorer_span, o.text.start),
                o.fp_text(restorer_span, restorer_span.1.max(o.text.start)),
            ],
            _ => [(0, 0); 2],
        };
        State {
            objects,
            cache: RuleCache::new(),
            restorers,
            restorer_span,
            outer,
            fp_outer,
            generation: snapshot.generation(),
        }
    }

    /// The index of the object containing `pc`, trying `hint` (the previous frame's) first,
    /// then the object of the outermost frames.
    #[inline]
    pub(crate) fn find_near(&self, pc: usize, hint: usize) -> Option<usize> {
        match self.objects.get(hint) {
            Some(o) if o.range.contains(&pc) => Some(hint),
            _ => match self.objects.get(self.outer) {
                Some(o) if o.range.contains(&pc) => Some(self.outer),
                _ => self.find(pc),
            },
        }
    }

    /// The index of the object containing `pc`, trying the walk's last two objects first
    /// (a stack goes back and forth: the program, the C library, the program's `_start`).
    #[inline]
    pub(crate) fn find_for(&self, pc: usize, loaded: &LoadedCheck) -> Option<usize> {
        match self.objects.get(loaded.prev) {
            Some(o) if o.range.contains(&pc) => Some(loaded.prev),
            _ => self.find_near(pc, loaded.last),
        }
    }

    /// The index of the object containing `pc`.
    #[inline]
    pub(crate) fn find(&self, pc: usize) -> Option<usize> {
        find_in(&self.objects, pc)
    }

    /// Whether object `i` is still the object that was loaded when the state was built, and
    /// not another one loaded since at the same address (whose code the tables of the old one
    /// must not unwind; see [`Identity::verify`]). An object that cannot be verified
    /// (no `_dl_find_object` and no build-id) is trusted: the walk's reads are checked anyway.
    pub(crate) fn still_loaded(&self, i: usize, pc: usize) -> bool {
        let o = &self.objects[i];
        o.permanent || o.identity.verify(pc) != Verdict::Changed
    }

    /// Whether `addr` is one of the known signal trampolines.
    #[inline]
    pub(crate) fn is_restorer(&self, addr: usize) -> bool {
        self.restorers.iter().any(|&r| r == addr && r != 0)
    }
}

/// The index of the object in `objects` (sorted by address) containing `pc`.
#[inline]
fn find_in(objects: &[ObjectCheck], pc: usize) -> Option<usize> {
    let i = objects.partition_point(|o| o.range.start <= pc);
    let i = i.checked_sub(1)?;
    objects[i].range.contains(&pc).then_some(i)
}

static STATE: Published<State> = Published::new();

/// In a forked child: the reads of the parent's other threads ended with them.
pub(crate) fn after_fork() {
    STATE.after_fork();
}

/// Runs `f` with the published state (`None` before `init()`).
///
/// # Async-signal safety
/// Async-signal-safe.
#[inline]
pub(crate) fn with_state<R>(f: impl FnOnce(Option<&State>) -> R) -> R {
    STATE.read(f)
}

/// Rebuilds the state from the current module snapshot if it is newer. Normal context.
pub(crate) fn rebuild(snapshot: &Snapshot) {
    STATE.update(false, |old| match old {
        Some(old) if old.generation == snapshot.generation() => None,
        _ => Some(State::build(snapshot)),
    });
    super::slots::fill_pool();
    crate::sys::stack::fill();
}

/// Which objects of the snapshot this walk already checked with `_dl_find_object`.
#[derive(Default)]
pub(crate) struct LoadedCheck {
    checked: u64,
    failed: u64,
    /// The object of the previous frame (most frames are in the same object as their callee).
    pub(crate) last: usize,
    /// The object before `last` (where the walk may return to).
    pub(crate) prev: usize,
}

impl LoadedCheck {
    /// Records that the walk is in object `i` now.
    #[inline]
    pub(crate) fn enter(&mut self, i: usize) {
        if i != self.last {
            self.prev = self.last;
            self.last = i;
        }
    }

    /// Whether this walk already found object `i` still loaded.
    #[inline]
    pub(crate) fn verified(&self, i: usize) -> bool {
        i < 64 && (self.checked & !self.failed) & (1 << i) != 0
    }

    pub(crate) fn still_loaded(&mut self, state: &State, i: usize, pc: usize) -> bool {
        if i >= 64 {
            return state.still_loaded(i, pc);
        }
        let bit = 1u64 << i;
        if self.checked & bit == 0 {
            self.checked |= bit;
            if !state.still_loaded(i, pc) {
                self.failed |= bit;
            }
        }
        self.failed & bit == 0
    }
}

/// Adds the addresses in `code` (part of the vDSO) where the signal trampoline's bytes start to
/// `out[n..]`; returns the new count. Normal context (the vDSO is a few pages).
fn vdso_trampolines(code: &Range<usize>, out: &mut [usize; 8], mut n: usize) -> usize {
    let t = super::arch::TRAMPOLINE;
    let mut bytes = vec![0u8; code.len()];
    let got = sys::read_memory(code.start, &mut bytes);
    let bytes = &bytes[..got];
    let mut at = 0;
    while at + t.len() <= bytes.len() && n < out.len() {
        if &bytes[at..at + t.len()] == t && !out[..n].contains(&(code.start + at)) {
            out[n] = code.start + at;
            n += 1;
        }
        at += super::arch::CODE_ALIGN;
    }
    n
}
