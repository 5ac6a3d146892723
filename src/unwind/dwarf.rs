//! The published unwinder state: every loaded object's unwind tables, the shared rule cache,
//! and the pool of walk slots (scratch space and a private stack per concurrent walk).
//!
//! The state is built in normal context (it allocates) and published lock-free; a walk never
//! allocates. Objects that `dlclose` could unmap get a private copy of their `.eh_frame_hdr`
//! and `.eh_frame` when the state is built, so a rule derived while another thread unloads the
//! object reads memory selftrace owns. Objects that are never unloaded (the main program, the
//! vDSO, objects mapped at program start) are read in place.

use super::cfi::{self, Bytes, Ctx, UnwindData};
use super::rules::RuleCache;
use crate::modules::Snapshot;
use crate::published::Published;
use crate::sys;
use core::cell::UnsafeCell;
use core::ops::{Deref, Range};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Bytes the loader mapped, borrowed for as long as the object stays loaded (only used for
/// objects that are never unloaded).
#[derive(Clone, Copy)]
pub(crate) struct Mapped {
    ptr: *const u8,
    len: usize,
}

// SAFETY: Mapped is a read-only view of memory mapped by the loader for the life of the
// process; sharing it across threads is as safe as sharing a &[u8] to it.
unsafe impl Send for Mapped {}
// SAFETY: as above; nothing is ever written through it.
unsafe impl Sync for Mapped {}

impl Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a range of a permanent object's mapped segment (checked when
        // the snapshot was taken).
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Mapped {
    fn new(r: &Range<usize>) -> Mapped {
        Mapped {
            ptr: r.start as *const u8,
            len: r.len(),
        }
    }
}

/// What a walk needs to know about an object.
pub(crate) struct ObjectCheck {
    pub(crate) range: Range<usize>,
    /// The first executable segment (inline: checked for every frame).
    pub(crate) text: Range<usize>,
    /// Further executable segments (rare).
    pub(crate) more_exec: Vec<Range<usize>>,
    /// The address `_dl_find_object` reports as this object's `.eh_frame_hdr`; 0 if none.
    pub(crate) eh_frame_hdr: usize,
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
}

/// The published unwinder: objects, their tables, and the rule cache.
pub(crate) struct DwarfState {
    pub(crate) objects: Vec<ObjectCheck>,
    pub(crate) cache: RuleCache,
    /// The signal-return trampolines (`sa_restorer`) of the handlers installed when the state
    /// was built: the frame-pointer walk recognises signal frames by these.
    pub(crate) restorers: [usize; 8],
    /// The lowest and highest of `restorers` (an empty range if there are none).
    pub(crate) restorer_span: (usize, usize),
    pub(crate) generation: u64,
}

impl DwarfState {
    fn build(snapshot: &Snapshot) -> DwarfState {
        let mut objects = Vec::with_capacity(snapshot.objects().len());
        for o in snapshot.objects() {
            let permanent = o.permanent;
            // Objects that can be unloaded: copied through the kernel, so an object that
            // another thread `dlclose`s while we build gives no tables instead of a fault.
            let bytes = |r: &Range<usize>| {
                if permanent {
                    Some(Bytes::Mapped(Mapped::new(r)))
                } else {
                    let mut v = vec![0u8; r.len()];
                    (sys::read_memory(r.start, &mut v) == r.len())
                        .then(|| Bytes::Owned(v.into_boxed_slice()))
                }
            };
            let unwind = match (&o.eh_frame_hdr, &o.eh_frame) {
                (Some(h), Some(f)) => match (bytes(h), bytes(f)) {
                    (Some(hdr), Some(eh_frame)) => Some(UnwindData {
                        hdr,
                        hdr_addr: h.start,
                        eh_frame,
                        eh_frame_addr: f.start,
                        text_addr: o.exec.first().map_or(0, |r| r.start),
                    }),
                    _ => None,
                },
                _ => None,
            };
            objects.push(ObjectCheck {
                range: o.range.clone(),
                text: o.exec.first().cloned().unwrap_or(0..0),
                more_exec: o.exec.iter().skip(1).cloned().collect(),
                eh_frame_hdr: o.eh_frame_hdr.as_ref().map_or(0, |r| r.start),
                permanent,
                unwind,
            });
        }
        let mut restorers = [0usize; 8];
        let n = sys::signal_restorers(&mut restorers);
        let restorer_span = if n == 0 {
            (1, 0)
        } else {
            let r = &restorers[..n];
            (
                r.iter().copied().min().unwrap_or(1),
                r.iter().copied().max().unwrap_or(0),
            )
        };
        DwarfState {
            objects,
            cache: RuleCache::new(),
            restorers,
            restorer_span,
            generation: snapshot.generation(),
        }
    }

    /// The index of the object containing `pc`, trying `hint` (the previous frame's) first.
    #[inline]
    pub(crate) fn find_near(&self, pc: usize, hint: usize) -> Option<usize> {
        match self.objects.get(hint) {
            Some(o) if o.range.contains(&pc) => Some(hint),
            _ => self.find(pc),
        }
    }

    /// The index of the object containing `pc`.
    #[inline]
    pub(crate) fn find(&self, pc: usize) -> Option<usize> {
        let i = self.objects.partition_point(|o| o.range.start <= pc);
        let i = i.checked_sub(1)?;
        self.objects[i].range.contains(&pc).then_some(i)
    }

    /// Whether object `i` is still the object that was loaded when the state was built.
    /// Uses `_dl_find_object` (lock-free); without it, objects are trusted.
    pub(crate) fn still_loaded(&self, i: usize, pc: usize) -> bool {
        let o = &self.objects[i];
        if o.permanent {
            return true;
        }
        match sys::dl_find_object(pc) {
            Err(()) => true,
            Ok(None) => false,
            Ok(Some(found)) => found.eh_frame_hdr == o.eh_frame_hdr,
        }
    }

    /// Whether `addr` is one of the known signal trampolines.
    #[inline]
    pub(crate) fn is_restorer(&self, addr: usize) -> bool {
        self.restorers.iter().any(|&r| r == addr && r != 0)
    }
}

static STATE: Published<DwarfState> = Published::new();

/// Runs `f` with the published state (`None` before `init()`). Async-signal-safe.
#[inline]
pub(crate) fn with_state<R>(f: impl FnOnce(Option<&DwarfState>) -> R) -> R {
    STATE.read(f)
}

/// Rebuilds the state from the current module snapshot if it is newer. Normal context.
pub(crate) fn rebuild(snapshot: &Snapshot) {
    STATE.update(false, |old| match old {
        Some(old) if old.generation == snapshot.generation() => None,
        _ => Some(DwarfState::build(snapshot)),
    });
    fill_pool();
}

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
fn fill_pool() {
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
            if let Some(top) = sys::map_stack(WALK_STACK) {
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
    /// Claims a free slot, starting the search at one picked by `hint`. Async-signal-safe.
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
