//! The request/answer handshake between a requesting thread and the thread whose stack it
//! wants. Lock-free: atomics and one futex.
//!
//! A fixed table of [`SLOTS`] slots, each with a 32-bit state word (`generation << 8 | state`),
//! the target tid and a frame buffer owned by the slot (never the requester's memory, so a
//! requester that gives up can return at once while a late handler still writes).
//!
//! ```text
//! requester                         target thread's handler
//! FREE -> CLAIMED (CAS, gen+1)
//! target = tid; -> PENDING
//! tgkill(tid, SIG)  ------------->  for each slot: PENDING and target == me:
//!                                      CAS PENDING -> RUNNING (same generation)
//!                                      Capture::walk_ucontext into the slot
//!                                      CAS RUNNING -> DONE   (or, if ABANDONED, -> FREE)
//! futex_wait(ANSWERS) <------------  ANSWERS += 1; futex_wake(ANSWERS)
//! DONE: copy out, -> FREE
//! deadline passed: CAS PENDING -> FREE (timeout; a late signal finds nothing to do)
//!                  or CAS RUNNING -> ABANDONED (the handler frees the slot)
//! ```
//!
//! The generation in the state word makes every CAS fail if the slot was released and claimed
//! again in between (no ABA): a handler never answers a request it did not see.
//!
//! # Async-signal safety
//! Everything here is async-signal-safe: atomics, `tgkill`, `futex`, `clock_gettime`,
//! `Capture::walk_ucontext`.
#![allow(unsafe_code)]

use crate::sys;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};

/// Requests that can be in flight at once, across all requesters.
pub(crate) const SLOTS: usize = 64;
/// The most frames captured for another thread.
pub(crate) const SLOT_FRAMES: usize = 256;

const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const PENDING: u32 = 2;
const RUNNING: u32 = 3;
const DONE: u32 = 4;
const ABANDONED: u32 = 5;

fn state(w: u32) -> u32 {
    w & 0xff
}

fn with_state(w: u32, s: u32) -> u32 {
    (w & !0xff) | s
}

struct Slot {
    word: AtomicU32,
    target: AtomicI32,
    /// What the request asks for: [`WANT_FRAMES`] or [`WANT_CONTEXT`] (set before PENDING).
    want: AtomicU32,
    /// For a [`WANT_CONTEXT`] request: the PENDING word while the requester wants the thread to
    /// stay in its handler after answering (its stack unchanged while the requester copies it);
    /// 0 once it lets go. A new generation never matches an old handler's word.
    hold: AtomicU32,
    frames: AtomicUsize,
    buf: UnsafeCell<[usize; SLOT_FRAMES]>,
    /// How the handler's walk ended (written and read like `buf`).
    end: UnsafeCell<crate::unwind::WalkEnd>,
    /// Which frames of the handler's walk are exact (written and read like `buf`).
    kinds: UnsafeCell<crate::unwind::FrameKinds>,
    /// The thread's register context in the minidump's `CONTEXT_*` layout (written and read
    /// like `buf`); its length in `frames` for a [`WANT_CONTEXT`] request.
    context: UnsafeCell<[u8; crate::context::CONTEXT_SIZE]>,
}

/// A request for the thread's stack (frames).
pub(crate) const WANT_FRAMES: u32 = 0;
/// A request for the thread's register context, holding it in its handler until released.
pub(crate) const WANT_CONTEXT: u32 = 1;
/// The longest a held thread waits in its handler for the requester to let it go.
const HOLD_MAX_NS: u64 = 2_000_000_000;
/// `hold` of a thread that stopped waiting at [`HOLD_MAX_NS`] (never a PENDING word, whose low
/// byte is PENDING).
const HOLD_EXPIRED: u32 = 1;

// SAFETY: `buf` is written only by the handler that moved the slot to RUNNING and read only by
// the requester after it saw DONE (Acquire), so accesses never overlap.
unsafe impl Sync for Slot {}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        word: AtomicU32::new(0),
        target: AtomicI32::new(0),
        want: AtomicU32::new(WANT_FRAMES),
        hold: AtomicU32::new(0),
        frames: AtomicUsize::new(0),
        buf: UnsafeCell::new([0; SLOT_FRAMES]),
        end: UnsafeCell::new(crate::unwind::WalkEnd::Complete),
        kinds: UnsafeCell::new(crate::unwind::FrameKinds::NONE),
        context: UnsafeCell::new([0; crate::context::CONTEXT_SIZE]),
    }
}; SLOTS];

/// Bumped (and futex-woken) whenever a handler finishes an answer.
static ANSWERS: AtomicU32 = AtomicU32::new(0);

/// The signal the handler is installed for (0 = not installed).
pub(crate) static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// A posted request: a slot and the generation it was claimed with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    slot: usize,
    word: u32,
    pub(crate) tid: i32,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The handler ran: this many frames are in the slot, how the walk ended, and which
    /// frames are exact (the handler's walk from its `ucontext_t`: frame 0, and any frame
    /// after a signal frame the walk crossed).
    Frames(usize, crate::unwind::WalkEnd, crate::unwind::FrameKinds),
    /// The thread no longer exists.
    Gone,
    /// No answer by the deadline.
    Timeout,
    /// No answer from a thread whose status said it cannot take the request signal now
    /// (blocked or ignored, or the thread stopped), after a short grace (dumps only).
    Cannot(crate::procfs::NoAnswer),
}

/// Claims a slot for `tid`, publishes the request and signals the thread. `Err(Answer::Gone)`
/// when `tgkill` says the thread does not exist; `Ok(None)` when every slot is busy.
pub(crate) fn post(tid: i32) -> Result<Option<Ticket>, Answer> {
    post_for(tid, WANT_FRAMES, false)
}

/// [`post`] for what `want` says ([`WANT_FRAMES`], [`WANT_CONTEXT`]); with `hold` (only for
/// [`WANT_CONTEXT`], never for the calling thread itself, whose handler runs inside `tgkill`)
/// the thread stays in its handler after answering until [`let_go`] or [`release`].
pub(crate) fn post_for(tid: i32, want: u32, hold: bool) -> Result<Option<Ticket>, Answer> {
    let sig = SIGNAL.load(Ordering::Acquire);
    if sig == 0 {
        // No handler (it could not be installed): nobody would answer.
        return Err(Answer::Timeout);
    }
    for (i, slot) in TABLE.iter().enumerate() {
        let w = slot.word.load(Ordering::Relaxed);
        if state(w) != FREE {
            continue;
        }
        let claimed = w.wrapping_add(1 << 8) & !0xff | CLAIMED;
        if slot
            .word
            .compare_exchange(w, claimed, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        slot.target.store(tid, Ordering::Relaxed);
        slot.want.store(want, Ordering::Relaxed);
        let pending = with_state(claimed, PENDING);
        let hold = if want == WANT_CONTEXT && hold {
            pending
        } else {
            0
        };
        slot.hold.store(hold, Ordering::Relaxed);
        slot.word.store(pending, Ordering::Release);
        if let Err(e) = sys::tgkill(tid, sig) {
            // Nobody got the signal; a handler of another thread ignores this target.
            slot.word
                .store(with_state(claimed, FREE), Ordering::Release);
            return Err(if e.errno() == Some(libc::ESRCH) {
                Answer::Gone
            } else {
                Answer::Timeout
            });
        }
        return Ok(Some(Ticket {
            slot: i,
            word: pending,
            tid,
        }));
    }
    Ok(None)
}

/// The answer if there is one now: `Some(Frames(n))` once the handler finished.
pub(crate) fn poll(t: &Ticket) -> Option<Answer> {
    let slot = &TABLE[t.slot];
    let w = slot.word.load(Ordering::Acquire);
    if w == with_state(t.word, DONE) {
        // SAFETY: DONE for this generation: the handler finished writing `end` and `kinds`
        // (Release/Acquire on the word) and nobody writes them until the slot is released.
        let (end, kinds) = unsafe { (*slot.end.get(), *slot.kinds.get()) };
        return Some(Answer::Frames(
            slot.frames.load(Ordering::Relaxed),
            end,
            kinds,
        ));
    }
    None
}

/// The frames of a finished request (valid until [`release`]).
pub(crate) fn frames(t: &Ticket, n: usize) -> &[usize] {
    // SAFETY: the slot is DONE for this generation (the caller saw `Frames`), so the handler
    // finished writing (Release/Acquire on the word) and nobody writes until we release it.
    let buf = unsafe { &*TABLE[t.slot].buf.get() };
    &buf[..n.min(SLOT_FRAMES)]
}

/// The register context of a finished [`WANT_CONTEXT`] request (valid until [`release`]):
/// empty if the handler could not read it.
pub(crate) fn context(t: &Ticket, n: usize) -> &[u8] {
    // SAFETY: as for `frames`: DONE for this generation, nobody writes until released.
    let ctx = unsafe { &*TABLE[t.slot].context.get() };
    &ctx[..n.min(ctx.len())]
}

/// Lets a held thread (a [`WANT_CONTEXT`] request) leave its handler. [`release`] does it too.
/// Returns false when the thread had stopped waiting already ([`HOLD_MAX_NS`] passed): it ran
/// on while the requester copied its stack.
pub(crate) fn let_go(t: &Ticket) -> bool {
    let slot = &TABLE[t.slot];
    match slot
        .hold
        .compare_exchange(t.word, 0, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => {
            sys::futex_wake(&slot.hold, i32::MAX);
            true
        }
        Err(now) => now != HOLD_EXPIRED,
    }
}

/// Releases a slot whose request is finished (after [`poll`] gave an answer).
pub(crate) fn release(t: &Ticket) {
    let _ = let_go(t);
    let slot = &TABLE[t.slot];
    let _ = slot.word.compare_exchange(
        with_state(t.word, DONE),
        with_state(t.word, FREE),
        Ordering::Release,
        Ordering::Relaxed,
    );
}

/// Gives up on a request. Returns an answer if it finished meanwhile (then the caller still
/// owns the slot and must [`release`] it), else `None` (the slot is freed now, or by the
/// handler that is writing it).
pub(crate) fn cancel(t: &Ticket) -> Option<Answer> {
    let slot = &TABLE[t.slot];
    let pending = with_state(t.word, PENDING);
    let free = with_state(t.word, FREE);
    if slot
        .word
        .compare_exchange(pending, free, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        return None;
    }
    let running = with_state(t.word, RUNNING);
    let abandoned = with_state(t.word, ABANDONED);
    if slot
        .word
        .compare_exchange(running, abandoned, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        return None;
    }
    poll(t)
}

/// In a forked child (one thread): the requests in flight were the parent's (their requesters
/// and targets are threads the child does not have), so every slot is free again, in a new
/// generation (a late answer finds nothing to do).
pub(crate) fn after_fork() {
    for slot in &TABLE {
        let w = slot.word.load(Ordering::Relaxed);
        if state(w) != FREE {
            slot.word
                .store(with_state(w.wrapping_add(1 << 8), FREE), Ordering::Release);
        }
        slot.hold.store(0, Ordering::Release);
    }
}

/// The current value of the answer counter (read before checking, then [`wait`] on it).
pub(crate) fn answers() -> u32 {
    ANSWERS.load(Ordering::Acquire)
}

/// Sleeps until some handler answers after `seen` was read, or `timeout_ns` passes, or a
/// signal interrupts.
pub(crate) fn wait(seen: u32, timeout_ns: u64) {
    sys::futex_wait(&ANSWERS, seen, timeout_ns);
}

/// Waits for one request until `deadline` (monotonic ns). Checks every 10 ms that the thread
/// still exists, so an exit after the signal was queued gives [`Answer::Gone`] at once. The
/// slot is released (or left to the handler) when this returns.
pub(crate) fn wait_one(t: &Ticket, deadline: u64, out: &mut [usize]) -> Answer {
    match wait_answer(t, deadline) {
        a @ Answer::Frames(..) => finish(t, a, out),
        other => other,
    }
}

/// Waits for one request until `deadline` like [`wait_one`], but keeps the slot: after
/// `Frames` the caller reads it ([`frames`], [`context`]) and must [`release`] it; after
/// `Timeout` or `Gone` the slot is released (or left to the handler).
pub(crate) fn wait_answer(t: &Ticket, deadline: u64) -> Answer {
    wait_until(t, deadline).unwrap_or_else(|| cancel(t).unwrap_or(Answer::Timeout))
}

/// Waits for one request until `deadline` without giving it up: `None` when the deadline
/// passed with no answer (the request stays posted: wait again, or [`cancel`] it).
fn wait_until(t: &Ticket, deadline: u64) -> Option<Answer> {
    loop {
        let seen = answers();
        if let Some(a) = poll(t) {
            return Some(a);
        }
        let now = sys::monotonic_ns();
        if now >= deadline {
            return None;
        }
        if sys::tgkill(t.tid, 0).err().and_then(|e| e.errno()) == Some(libc::ESRCH) {
            return Some(cancel(t).unwrap_or(Answer::Gone));
        }
        wait(seen, (deadline - now).min(10_000_000));
    }
}

/// [`wait_one`] for a thread whose status said it could not answer (the request signal
/// blocked): it has until `grace`; then, if `can_answer_now()` says that changed (the signal
/// was blocked for a moment: glibc blocks every signal while it creates a thread, and so does
/// qemu-user at times), or if the thread is answering another request (whose handler runs with
/// the signal blocked), until `deadline`. The answer, and whether it was waited for past the
/// grace (a timeout then is not the blocked signal's).
pub(crate) fn wait_one_with_grace(
    t: &Ticket,
    grace: u64,
    deadline: u64,
    can_answer_now: &mut dyn FnMut() -> bool,
    out: &mut [usize],
) -> (Answer, bool) {
    let (a, extended) = match wait_until(t, grace.min(deadline)) {
        Some(a) => (a, false),
        None if grace < deadline && (answering_another(t) || can_answer_now()) => {
            (wait_answer(t, deadline), true)
        }
        None => (cancel(t).unwrap_or(Answer::Timeout), false),
    };
    let a = match a {
        Answer::Frames(..) => finish(t, a, out),
        other => other,
    };
    (a, extended)
}

/// Whether `t`'s thread is in its handler for another request now.
fn answering_another(t: &Ticket) -> bool {
    TABLE.iter().enumerate().any(|(i, slot)| {
        i != t.slot
            && slot.target.load(Ordering::Acquire) == t.tid
            && state(slot.word.load(Ordering::Acquire)) == RUNNING
    })
}

fn finish(t: &Ticket, a: Answer, out: &mut [usize]) -> Answer {
    let a = match a {
        Answer::Frames(n, end, kinds) => {
            let f = frames(t, n);
            let k = f.len().min(out.len());
            out[..k].copy_from_slice(&f[..k]);
            let end = if k < f.len() {
                crate::unwind::WalkEnd::BufferFull
            } else {
                end
            };
            Answer::Frames(k, end, kinds.truncated(k))
        }
        other => other,
    };
    release(t);
    a
}

/// The signal handler: answers every request addressed to this thread.
pub(crate) extern "C" fn on_capture_signal(
    sig: i32,
    info: *mut libc::siginfo_t,
    uc: *mut libc::c_void,
) {
    let _errno = sys::signal::ErrnoGuard::new();
    let me = sys::gettid();
    let mut served = false;
    for slot in TABLE.iter() {
        let w = slot.word.load(Ordering::Acquire);
        if state(w) != PENDING || slot.target.load(Ordering::Relaxed) != me {
            continue;
        }
        // The CAS fails if the slot moved on (another generation): the target read above then
        // belonged to another request.
        if slot
            .word
            .compare_exchange(
                w,
                with_state(w, RUNNING),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            continue;
        }
        if slot.want.load(Ordering::Relaxed) == WANT_CONTEXT {
            // SAFETY: RUNNING for this generation makes the context buffer ours until DONE.
            let n = unsafe { write_context(slot, uc as *const libc::ucontext_t) };
            slot.frames.store(n, Ordering::Relaxed);
        } else {
            // SAFETY: RUNNING for this generation makes the buffer ours until DONE/FREE.
            let buf = unsafe { &mut *slot.buf.get() };
            // SAFETY: uc is the ucontext_t the kernel passed to this SA_SIGINFO handler.
            let walk = unsafe {
                crate::unwind::Capture::new().walk_ucontext(uc as *const libc::ucontext_t, buf)
            };
            // SAFETY: RUNNING makes `end` and `kinds` ours too, like the buffer.
            unsafe {
                *slot.end.get() = walk.end;
                *slot.kinds.get() = walk.frame_kinds();
            }
            slot.frames.store(walk.frames, Ordering::Relaxed);
        }
        if slot
            .word
            .compare_exchange(
                with_state(w, RUNNING),
                with_state(w, DONE),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_err()
        {
            // The requester gave up (ABANDONED): the slot is ours to free.
            slot.word.store(with_state(w, FREE), Ordering::Release);
        } else if slot.hold.load(Ordering::Acquire) == w {
            // Held: stay here (the stack unchanged) until the requester copied it.
            ANSWERS.fetch_add(1, Ordering::Release);
            sys::futex_wake(&ANSWERS, i32::MAX);
            let deadline = sys::monotonic_ns().saturating_add(HOLD_MAX_NS);
            loop {
                let now = sys::monotonic_ns();
                if slot.hold.load(Ordering::Acquire) != w {
                    break;
                }
                if now >= deadline {
                    // Say so: the requester's copy of this stack is no longer consistent.
                    let _ = slot.hold.compare_exchange(
                        w,
                        HOLD_EXPIRED,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                    break;
                }
                sys::futex_wait(&slot.hold, w, deadline - now);
            }
        }
        served = true;
    }
    if served {
        ANSWERS.fetch_add(1, Ordering::Release);
        sys::futex_wake(&ANSWERS, i32::MAX);
    } else {
        // Not a request (or a late one): the program's own handler of the signal, if any.
        sys::signal::call_previous(sig, info, uc);
    }
}

/// Why thread `tid` cannot answer a stack or context request now (the request signal blocked
/// or ignored in it, the thread stopped, or no handler installed), so that asking would only
/// wait for the timeout; `None` when it can. Used by dumps and the minidump writer alike.
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn cannot_answer(tid: i32) -> Option<crate::procfs::NoAnswer> {
    match SIGNAL.load(Ordering::Acquire) {
        0 => Some(crate::procfs::NoAnswer::NoHandler),
        sig => crate::procfs::cannot_answer(tid, sig),
    }
}

// ---- register contexts for the minidump writer ----------------------------------------

/// How a request for a thread's register context ended.
pub(crate) enum ContextAnswer {
    /// The context is in the caller's buffer; the thread waits in its handler (if it was asked
    /// to) until [`release_context`].
    Context(Ticket),
    /// No answer in time (or no handler).
    Timeout,
    /// The thread does not exist (any more).
    Gone,
}

/// Asks thread `tid` for its register context (see [`crate::minidump`]); the thread stays in
/// its handler, its stack unchanged, until [`release_context`] (not the calling thread, whose
/// handler runs inside its own `tgkill`).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn request_context(
    tid: i32,
    timeout_ns: u64,
    out: &mut [u8; crate::context::CONTEXT_SIZE],
) -> ContextAnswer {
    if super::install().is_err() {
        return ContextAnswer::Timeout;
    }
    if tid == sys::gettid() && sys::is_blocked(SIGNAL.load(Ordering::Relaxed)) {
        return ContextAnswer::Timeout;
    }
    let hold = tid != sys::gettid();
    let deadline = sys::monotonic_ns().saturating_add(timeout_ns);
    loop {
        match post_for(tid, WANT_CONTEXT, hold) {
            Ok(Some(t)) => {
                return match wait_answer(&t, deadline) {
                    Answer::Frames(n, ..) => {
                        let ctx = context(&t, n);
                        if ctx.len() == out.len() && !ctx.is_empty() {
                            out.copy_from_slice(ctx);
                            ContextAnswer::Context(t)
                        } else {
                            release(&t);
                            ContextAnswer::Timeout
                        }
                    }
                    Answer::Timeout | Answer::Cannot(_) => ContextAnswer::Timeout,
                    Answer::Gone => ContextAnswer::Gone,
                };
            }
            Err(Answer::Gone) => return ContextAnswer::Gone,
            Err(_) => return ContextAnswer::Timeout,
            Ok(None) if sys::monotonic_ns() < deadline => sys::sleep_ns(1_000_000),
            Ok(None) => return ContextAnswer::Timeout,
        }
    }
}

/// Lets the thread of a [`ContextAnswer::Context`] go and frees its request. False when the
/// thread had stopped waiting before (its stack changed while it was copied).
pub(crate) fn release_context(ticket: Ticket) -> bool {
    let held = let_go(&ticket);
    release(&ticket);
    held
}

/// Writes the interrupted context into the slot's context buffer; returns its length (0 where
/// minidumps are not supported).
///
/// # Safety
/// The slot is RUNNING for this handler's generation; `uc` is the kernel's ucontext.
unsafe fn write_context(slot: &Slot, uc: *const libc::ucontext_t) -> usize {
    // SAFETY: RUNNING makes the buffer ours (the caller's contract).
    let ctx = unsafe { &mut *slot.context.get() };
    // SAFETY: uc is the kernel's ucontext (the caller's contract).
    unsafe { crate::context::context_from_ucontext(uc, ctx) }
}
