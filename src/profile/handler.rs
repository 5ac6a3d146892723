//! The sampling signal's handler and the state it may touch: the published [`Shared`] ring,
//! the counters that tell a handler whether a profiler runs and which timers are its own, and
//! the encoding of a timer's `sigev_value` that the handler reads back (pprof-rs's
//! collector side; the timers are in `timer.rs`, the lifecycle in `running.rs`).
#![allow(unsafe_code)]

use super::ring::{Record, Ring};
use crate::error::Error;
use crate::sys;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::time::Duration;

/// What the handler needs, published while a profiler runs.
pub(super) struct Shared {
    /// Where the handler writes its samples.
    pub(super) ring: Ring,
    /// The run's [`GENERATION`].
    pub(super) generation: u32,
}

/// The running profiler's shared state, or null.
pub(super) static SHARED: AtomicPtr<Shared> = AtomicPtr::new(core::ptr::null_mut());
/// Handlers between their first and last look at `SHARED`: the state is freed only when this
/// is zero after `SHARED` was cleared.
static ACTIVE: AtomicU32 = AtomicU32::new(0);
/// Whether a profiler runs (one at a time per process).
pub(super) static RUNNING: AtomicBool = AtomicBool::new(false);
/// Start count, carried in each timer's `sigev_value` so that a late signal of an old timer is
/// recognized.
pub(super) static GENERATION: AtomicU32 = AtomicU32::new(0);
/// Set by a handler that found the ring half full; the profiler's thread waits on it.
pub(super) static DRAIN: AtomicU32 = AtomicU32::new(0);

/// `si_code` of a POSIX timer's signal.
const SI_TIMER: i32 = -2;

/// In a forked child (one thread; see `crate::fork`): a profiler of the parent does not run
/// here (its threads and timers are not inherited), and handlers that the parent's other
/// threads were in ended with them: the child may start a profiler of its own, whose stop
/// waits for nobody. The parent's state stays allocated (its `Profiler`, if the child has it,
/// gives an empty profile).
pub(crate) fn after_fork() {
    SHARED.store(core::ptr::null_mut(), Ordering::SeqCst);
    ACTIVE.store(0, Ordering::SeqCst);
    DRAIN.store(0, Ordering::SeqCst);
    RUNNING.store(false, Ordering::SeqCst);
}

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::PROFILE, after_fork);

/// Bits of a timer's `sigev_value` that hold the thread id (Linux's `PID_MAX_LIMIT` is 2^22);
/// the next [`STRIDE_BITS`] hold the timer's stride, the high 32 bits the generation.
const TID_BITS: u32 = 22;
const STRIDE_BITS: u32 = 10;
/// The largest stride a timer's value can carry.
pub(super) const MAX_STRIDE: u32 = (1 << STRIDE_BITS) - 1;

/// A timer's `sigev_value`: generation, stride, thread id.
pub(super) fn timer_value(generation: u32, stride: u32, tid: i32) -> u64 {
    (u64::from(generation) << 32)
        | (u64::from(stride.min(MAX_STRIDE)) << TID_BITS)
        | u64::from(tid as u32 & ((1 << TID_BITS) - 1))
}

/// The sampling signal's handler.
///
/// # Async-signal safety
/// Async-signal-safe: atomics, one walk into a ring slot, maybe one futex wake; keeps `errno`.
pub(super) extern "C" fn on_sample(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let _errno = sys::signal::ErrnoGuard::new();
    let fields = signal_fields(info);
    ACTIVE.fetch_add(1, Ordering::SeqCst);
    let shared = SHARED.load(Ordering::SeqCst);
    if let (false, Some((code, overrun, value))) = (shared.is_null(), fields) {
        // SAFETY: SHARED is freed only after it was cleared and ACTIVE dropped to zero; we
        // raised ACTIVE before loading it.
        let shared = unsafe { &*shared };
        if code == SI_TIMER && (value >> 32) as u32 == shared.generation {
            let tid = (value as u32 & ((1 << TID_BITS) - 1)) as i32;
            // Each signal of a timer with stride k stands for k periods (and k per overrun).
            let stride = ((value >> TID_BITS) as u32 & MAX_STRIDE).max(1);
            let weight = stride.saturating_mul(1u32.saturating_add(overrun.max(0) as u32));
            shared.ring.push(weight, |rec: &mut Record| {
                rec.tid = tid;
                rec.weight = weight;
                // SAFETY: the kernel's ucontext_t of this signal.
                let walk = unsafe {
                    crate::unwind::Capture::new()
                        .walk_ucontext(uc as *const libc::ucontext_t, &mut rec.frames)
                };
                rec.len = walk.frames;
                rec.end = walk.end;
                rec.kinds = walk.frame_kinds();
            });
            if shared.ring.fill() * 2 >= shared.ring.capacity()
                && DRAIN.swap(1, Ordering::AcqRel) == 0
            {
                sys::futex_wake(&DRAIN, 1);
            }
        }
    }
    ACTIVE.fetch_sub(1, Ordering::SeqCst);
    if let Some((code, _, value)) = fields {
        // A signal of one of the profiler's timers, this run's or an earlier one's, is ours
        // (late ones are dropped). Anything else (`kill`, `setitimer`, another timer) goes to
        // the handler that was installed before ours, if any.
        let generation = (value >> 32) as u32;
        let ours =
            code == SI_TIMER && generation != 0 && generation <= GENERATION.load(Ordering::Relaxed);
        if !ours {
            sys::signal::call_previous(sig, info, uc);
        }
    }
}

/// `si_code`, and for `SI_TIMER` the overrun count and the sigval, of a signal's `siginfo_t`
/// (`None` for a null pointer).
fn signal_fields(info: *const libc::siginfo_t) -> Option<(i32, i32, u64)> {
    if info.is_null() {
        return None;
    }
    // SAFETY: the kernel passes a valid siginfo_t; for SI_TIMER its union holds the timer id
    // (offset 16), the overrun count (20) and the sigval (24).
    Some(unsafe {
        let base = info as *const u8;
        (
            (*info).si_code,
            core::ptr::read_unaligned(base.add(20) as *const i32),
            core::ptr::read_unaligned(base.add(24) as *const u64),
        )
    })
}

/// Installs the handler for `sig` unless it is installed, keeping the handler that was there
/// (signals that are not from our timers go on to it; see `sys::signal`). Asks the kernel each
/// time rather than remembering: other code may have replaced our handler since the last
/// profiler (pprof-rs, stopping, sets `SIGPROF` to `SIG_IGN`), and a profiler whose signals are
/// ignored or go to someone else's handler would return empty or partial profiles.
pub(super) fn install(sig: i32) -> Result<(), Error> {
    // Not the stack-request signal, the dump signal (every tick would dump every thread) nor
    // a crash signal.
    sys::signal::check_use(sig, sys::signal::Owner::Profiler)?;
    sys::signal::take(sig, on_sample, libc::SA_RESTART)?;
    sys::signal::set_owner(sig, Some(sys::signal::Owner::Profiler));
    Ok(())
}

/// Clears the published state and waits for handlers still using it: afterwards no handler
/// reaches it (signals queued by deleted timers find nothing and do nothing).
pub(super) fn quiesce() {
    SHARED.store(core::ptr::null_mut(), Ordering::SeqCst);
    while ACTIVE.load(Ordering::SeqCst) != 0 {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// [`quiesce`], then frees the state.
pub(super) fn unpublish(shared: *mut Shared) {
    quiesce();
    // SAFETY: created by Box::into_raw in running.rs's start_locked; no handler can reach it
    // any more.
    drop(unsafe { Box::from_raw(shared) });
}
