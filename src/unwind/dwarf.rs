//! The DWARF CFI walker: framehop over the in-memory `.eh_frame_hdr`/`.eh_frame` of every
//! loaded object, with framehop's frame-pointer rule as the per-frame fallback (pcs in objects
//! without CFI, or in no known object).
//!
//! The unwinder is built in normal context (it allocates) and published lock-free. Unwinding
//! itself uses `MustNotAllocateDuringUnwind` and a rule cache taken from a fixed pool that is
//! allocated once, so a walk never allocates.

use crate::modules::Snapshot;
use crate::published::Published;
use crate::sys;
use core::cell::UnsafeCell;
use core::ops::{Deref, Range};
use core::sync::atomic::{AtomicBool, Ordering};
use framehop::{MustNotAllocateDuringUnwind, Unwinder};

#[cfg(target_arch = "aarch64")]
pub(crate) use framehop::aarch64::{
    CacheAarch64 as FhCache, UnwindRegsAarch64 as FhRegs, UnwinderAarch64 as FhUnwinder,
};
#[cfg(target_arch = "x86_64")]
pub(crate) use framehop::x86_64::{
    CacheX86_64 as FhCache, UnwindRegsX86_64 as FhRegs, UnwinderX86_64 as FhUnwinder,
};

/// Bytes the loader mapped, borrowed for as long as the object stays loaded. selftrace checks
/// that an object is still loaded before framehop reads its unwind data (see [`DwarfState`]).
#[derive(Clone, Copy)]
pub(crate) struct Mapped {
    ptr: *const u8,
    len: usize,
}

// SAFETY: Mapped is a read-only view of memory mapped by the loader; sharing it across threads
// is as safe as sharing a &[u8] to it.
unsafe impl Send for Mapped {}
// SAFETY: as above; nothing is ever written through it.
unsafe impl Sync for Mapped {}

impl Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a range of a loaded object's mapped segment (checked when the
        // snapshot was taken); it is read only while the object is known to be loaded.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Default for Mapped {
    fn default() -> Mapped {
        Mapped {
            ptr: core::ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
        }
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

pub(crate) type FhUnwinderT = FhUnwinder<Mapped, MustNotAllocateDuringUnwind>;
pub(crate) type FhCacheT = FhCache<MustNotAllocateDuringUnwind>;

/// What a walk needs to know about an object to decide whether framehop may read its data.
pub(crate) struct ObjectCheck {
    pub(crate) range: Range<usize>,
    /// The first executable segment (inline: checked for every frame).
    pub(crate) text: Range<usize>,
    /// Further executable segments (rare).
    pub(crate) more_exec: Vec<Range<usize>>,
    /// The address `_dl_find_object` reports as this object's `.eh_frame_hdr`; 0 if none.
    pub(crate) eh_frame_hdr: usize,
    /// The main program and the vDSO are never unloaded: no check needed.
    pub(crate) permanent: bool,
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

/// The published DWARF unwinder and its object list.
pub(crate) struct DwarfState {
    pub(crate) unwinder: FhUnwinderT,
    pub(crate) objects: Vec<ObjectCheck>,
    pub(crate) generation: u64,
}

impl DwarfState {
    fn build(snapshot: &Snapshot) -> DwarfState {
        let mut unwinder = FhUnwinderT::new();
        let mut objects = Vec::with_capacity(snapshot.objects().len());
        for o in snapshot.objects() {
            let svma = |r: &Range<usize>| (r.start - o.bias) as u64..(r.end - o.bias) as u64;
            let text = o.exec.first().map(svma);
            let info = framehop::ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: text,
                eh_frame_hdr_svma: o.eh_frame_hdr.as_ref().map(svma),
                eh_frame_hdr: o.eh_frame_hdr.as_ref().map(Mapped::new),
                eh_frame_svma: o.eh_frame.as_ref().map(svma),
                eh_frame: o.eh_frame.as_ref().map(Mapped::new),
                ..Default::default()
            };
            let module = framehop::Module::new(
                o.path.clone(),
                o.range.start as u64..o.range.end as u64,
                o.bias as u64,
                info,
            );
            unwinder.add_module(module);
            objects.push(ObjectCheck {
                range: o.range.clone(),
                text: o.exec.first().cloned().unwrap_or(0..0),
                more_exec: o.exec.iter().skip(1).cloned().collect(),
                eh_frame_hdr: o.eh_frame_hdr.as_ref().map_or(0, |r| r.start),
                permanent: o.is_main || o.is_vdso,
            });
        }
        DwarfState {
            unwinder,
            objects,
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
}

static STATE: Published<DwarfState> = Published::new();

/// Runs `f` with the published DWARF state (`None` before `init()`). Async-signal-safe.
#[inline]
pub(crate) fn with_state<R>(f: impl FnOnce(Option<&DwarfState>) -> R) -> R {
    STATE.read(f)
}

/// Rebuilds the DWARF state from the current module snapshot if it is newer. Normal context.
pub(crate) fn rebuild(snapshot: &Snapshot) {
    STATE.update(false, |old| match old {
        Some(old) if old.generation == snapshot.generation() => None,
        _ => Some(DwarfState::build(snapshot)),
    });
    fill_cache_pool();
}

/// How many walks can hold a rule cache at the same time; more concurrent walks fall back to
/// frame pointers.
const POOL: usize = 8;

/// framehop's rule cache is direct-mapped (509 entries keyed by `address % 509`): two hot return
/// addresses in one entry evict each other and are derived again from the CFI (~0.4 us) on every
/// walk. Each slot therefore holds several caches and an address picks one by a hash that is
/// independent of `address % 509`, so a collision repeats in the chosen cache only one time in
/// `WAYS`.
const WAYS: usize = 4;

/// Which of a slot's caches serves `address`.
#[inline]
fn way(address: usize) -> usize {
    ((address / 509) ^ (address >> 17)) % WAYS
}

/// The stack each walk runs on (see [`CacheGuard::stack_top`]): framehop and gimli need a few
/// KiB, more in debug builds, and a signal handler's alternate stack may be as small as 8 KiB.
const WALK_STACK: usize = 256 * 1024;

struct CacheSlot {
    busy: AtomicBool,
    ready: AtomicBool,
    cache: UnsafeCell<Option<[FhCacheT; WAYS]>>,
    stack_top: core::sync::atomic::AtomicUsize,
}

// SAFETY: the cache inside is only touched by the holder of `busy` (claimed with a CAS).
unsafe impl Sync for CacheSlot {}

static CACHES: [CacheSlot; POOL] = [const {
    CacheSlot {
        busy: AtomicBool::new(false),
        ready: AtomicBool::new(false),
        cache: UnsafeCell::new(None),
        stack_top: core::sync::atomic::AtomicUsize::new(0),
    }
}; POOL];

/// Allocates the pool's caches (once). Normal context.
fn fill_cache_pool() {
    for slot in &CACHES {
        if slot.ready.load(Ordering::Acquire) {
            continue;
        }
        if slot
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            // SAFETY: we hold `busy`, so nobody else touches the cell.
            unsafe { *slot.cache.get() = Some(core::array::from_fn(|_| FhCacheT::new_in())) };
            if let Some(top) = sys::map_stack(WALK_STACK) {
                slot.stack_top.store(top, Ordering::Relaxed);
            }
            slot.ready.store(true, Ordering::Release);
            slot.busy.store(false, Ordering::Release);
        }
    }
}

/// A claimed rule cache, returned to the pool on drop.
pub(crate) struct CacheGuard {
    slot: &'static CacheSlot,
}

impl CacheGuard {
    /// Claims a free cache, starting the search at a slot picked by `hint`. Async-signal-safe.
    pub(crate) fn claim(hint: usize) -> Option<CacheGuard> {
        for k in 0..POOL {
            let slot = &CACHES[(hint + k) % POOL];
            if !slot.ready.load(Ordering::Acquire) {
                continue;
            }
            if slot
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(CacheGuard { slot });
            }
        }
        None
    }

    /// The high end of this slot's private walk stack (0 if it could not be mapped).
    pub(crate) fn stack_top(&self) -> usize {
        self.slot.stack_top.load(Ordering::Relaxed)
    }

    /// The cache that serves `address` (a lookup address).
    pub(crate) fn get(&mut self, address: usize) -> &mut FhCacheT {
        // SAFETY: we hold `busy`, so the cell is ours; `ready` was set (checked in `claim`) after
        // the caches were stored, and they are never taken out again, so the Option is Some.
        let caches = unsafe { (*self.slot.cache.get()).as_mut().unwrap_unchecked() };
        &mut caches[way(address)]
    }
}

impl Drop for CacheGuard {
    fn drop(&mut self) {
        self.slot.busy.store(false, Ordering::Release);
    }
}
