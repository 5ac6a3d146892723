//! The sampling machinery: the signal handler, the per-thread timers, the profiler's thread
//! and the aggregation of samples into a [`Profile`].
#![allow(unsafe_code)]

use super::data::{Line, Location, Mapping, Mode, Profile, Sample};
use super::ring::{Record, Ring};
use super::{Builder, Stats, Threads, MAX_DEPTH};
use crate::symbolize::{BacktraceFrame, FrameKind};
use crate::sys;
use crate::{Error, StopReason, Truncation, WalkEnd};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// What the handler needs, published while a profiler runs.
struct Shared {
    ring: Ring,
    generation: u32,
}

/// The running profiler's shared state, or null.
static SHARED: AtomicPtr<Shared> = AtomicPtr::new(core::ptr::null_mut());
/// Handlers between their first and last look at `SHARED`: the state is freed only when this
/// is zero after `SHARED` was cleared.
static ACTIVE: AtomicU32 = AtomicU32::new(0);
/// Whether a profiler runs (one at a time per process).
static RUNNING: AtomicBool = AtomicBool::new(false);
/// Start count, carried in each timer's `sigev_value` so that a late signal of an old timer is
/// recognized.
static GENERATION: AtomicU32 = AtomicU32::new(0);
/// Set by a handler that found the ring half full; the profiler's thread waits on it.
static DRAIN: AtomicU32 = AtomicU32::new(0);

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

/// Bits of a timer's `sigev_value` that hold the thread id (Linux's `PID_MAX_LIMIT` is 2^22);
/// the next [`STRIDE_BITS`] hold the timer's stride, the high 32 bits the generation.
const TID_BITS: u32 = 22;
const STRIDE_BITS: u32 = 10;
/// The largest stride a timer's value can carry.
const MAX_STRIDE: u32 = (1 << STRIDE_BITS) - 1;

/// A timer's `sigev_value`: generation, stride, thread id.
fn timer_value(generation: u32, stride: u32, tid: i32) -> u64 {
    (u64::from(generation) << 32)
        | (u64::from(stride.min(MAX_STRIDE)) << TID_BITS)
        | u64::from(tid as u32 & ((1 << TID_BITS) - 1))
}

/// The stride of Wall-mode timers when `threads` are sampled at `frequency_hz`: the fewest
/// periods per signal that keep all threads' signals within [`super::WALL_SIGNAL_BUDGET`] a
/// second (1 when they fit).
fn wall_stride(threads: usize, frequency_hz: u32) -> u32 {
    let rate = threads as u64 * u64::from(frequency_hz);
    rate.div_ceil(super::WALL_SIGNAL_BUDGET)
        .clamp(1, u64::from(MAX_STRIDE)) as u32
}

/// The sampling signal's handler.
///
/// # Async-signal safety
/// Async-signal-safe: atomics, one walk into a ring slot, maybe one futex wake; keeps `errno`.
extern "C" fn on_sample(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    let errno = unsafe { *libc::__errno_location() };
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
                    crate::Capture::new()
                        .walk_ucontext(uc as *const libc::ucontext_t, &mut rec.frames)
                };
                rec.len = walk.frames;
                rec.end = walk.end;
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
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
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
fn install(sig: i32) -> Result<(), Error> {
    // Not the stack-request signal, the dump signal (every tick would dump every thread) nor
    // a crash signal.
    sys::signal::check_use(sig, sys::signal::Owner::Profiler)?;
    sys::signal::take(sig, on_sample, libc::SA_RESTART).map_err(|errno| Error::Sys {
        call: "sigaction",
        errno,
    })?;
    sys::signal::set_owner(sig, Some(sys::signal::Owner::Profiler));
    Ok(())
}

/// One thread's timer.
struct Timer {
    id: libc::timer_t,
    /// Periods per signal.
    stride: u32,
}

// SAFETY: a timer_t is a process-wide handle (glibc: the kernel's timer id), usable from any
// thread of the process.
unsafe impl Send for Timer {}

impl Timer {
    /// A timer on `tid`'s CPU clock (or the monotonic clock), sending `sig` to `tid` every
    /// `stride` periods of `period_ns`, with [`timer_value`] in the signal's `si_value`.
    fn arm(
        tid: i32,
        mode: Mode,
        sig: i32,
        period_ns: u64,
        generation: u32,
        stride: u32,
    ) -> Result<Timer, i32> {
        let stride = stride.clamp(1, MAX_STRIDE);
        let value = timer_value(generation, stride, tid);
        let period_ns = period_ns.saturating_mul(u64::from(stride));
        let clock = match mode {
            // MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED), as in sys::thread_cpu_ns.
            Mode::Cpu => ((!(tid as u32)) << 3 | 6) as libc::clockid_t,
            Mode::Wall => libc::CLOCK_MONOTONIC,
        };
        // SAFETY: all-zero is a valid sigevent.
        let mut sev: libc::sigevent = unsafe { core::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = sig;
        sev.sigev_notify_thread_id = tid;
        sev.sigev_value = libc::sigval {
            sival_ptr: value as usize as *mut libc::c_void,
        };
        let mut id: libc::timer_t = core::ptr::null_mut();
        // SAFETY: sev and id are valid; SIGEV_THREAD_ID names a thread of this process.
        if unsafe { libc::timer_create(clock, &mut sev, &mut id) } != 0 {
            return Err(sys::errno());
        }
        let timer = Timer { id, stride };
        // Wall mode: spread the threads' first samples over a period, so that they are not all
        // interrupted at the same instant.
        let first = match mode {
            Mode::Cpu => period_ns,
            Mode::Wall => 1 + (tid as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) % period_ns,
        };
        let spec = libc::itimerspec {
            it_interval: timespec(period_ns),
            it_value: timespec(first),
        };
        // SAFETY: id is the timer just created; spec is valid.
        if unsafe { libc::timer_settime(timer.id, 0, &spec, core::ptr::null_mut()) } != 0 {
            return Err(sys::errno());
        }
        Ok(timer)
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: id is a timer we created and did not delete yet.
        unsafe { libc::timer_delete(self.id) };
    }
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

/// A location while the profiler runs.
struct Loc {
    address: usize,
    kind: FrameKind,
    mapping: Option<usize>,
    lines: Arc<[Line]>,
}

/// A counted stack of the interval: thread, stack id (an index into
/// [`Aggregator::stack_lists`]) and where its walk stopped early.
type StackKey = (i32, u32, Option<Truncation>);

/// The most samples pulled out of the ring and waiting to be named. When the aggregation
/// cannot keep up (thousands of threads sampled in Wall mode: 1,000 threads at 99 Hz are 99,000
/// samples a second), the samples beyond it are dropped and counted like those of a full ring
/// ([`Profile::dropped`]): the backlog, and so the time a `take` needs to name it, stays
/// bounded, instead of growing for as long as the profiler runs.
const MAX_BACKLOG: usize = 1 << 15;

/// How many pulled samples the profiler's thread names under one hold of the aggregator's
/// lock: a `take` waits for one such chunk at most.
const CHUNK: usize = 1024;

/// How often the profiler's thread reads the names of the threads it has seen again (a thread
/// often names itself after it started): names are read from `/proc` there, once per thread
/// when it is first sampled and then at this interval, never per sample nor in `take`.
const NAME_REFRESH: Duration = Duration::from_secs(1);

/// A sample copied out of the ring.
struct Raw {
    tid: i32,
    weight: u32,
    end: WalkEnd,
    frames: Box<[usize]>,
}

/// Copies the ring's published samples into `out`, handing their slots back; beyond
/// [`MAX_BACKLOG`] samples in `out`, a sample is dropped and its periods counted in the ring's
/// `dropped`.
fn pull(ring: &Ring, out: &mut Vec<Raw>) {
    ring.drain(|rec| {
        if out.len() >= MAX_BACKLOG {
            ring.dropped
                .fetch_add(u64::from(rec.weight), Ordering::Relaxed);
            return;
        }
        out.push(Raw {
            tid: rec.tid,
            weight: rec.weight,
            end: rec.end,
            frames: rec.frames[..rec.len.min(MAX_DEPTH)].into(),
        })
    });
}

/// Samples of the current interval, and what resolving them needs.
struct Aggregator {
    stacks: HashMap<StackKey, u64>,
    locs: Vec<Loc>,
    loc_index: HashMap<(usize, bool), u32>,
    mappings: Vec<Mapping>,
    mapping_index: HashMap<(Arc<str>, usize), usize>,
    /// Whether each mapping is the main program's.
    mains: Vec<bool>,
    /// Each sampled thread's name and when it was read.
    names: HashMap<i32, (Arc<str>, Instant)>,
    /// The location ids of each distinct stack ([`StackKey`]'s stack id is an index here).
    stack_lists: Vec<Box<[u32]>>,
    stack_index: HashMap<Box<[u32]>, u32>,
    /// Stacks of raw addresses already named, all of whose frames were named with certainty:
    /// a sample whose addresses were seen before costs one lookup, not one per frame. Valid
    /// while no object was unloaded (cleared then) and used only while the loader's list is
    /// the one of the last refresh ([`View::Settled`]).
    stack_cache: HashMap<Box<[usize]>, u32>,
    /// The loader's (adds, subs) at the last refresh.
    counters: (u64, u64),
    /// The loaded objects at the last refresh.
    objects: Vec<Obj>,
    /// When the profiler last refreshed selftrace's view of the loaded objects.
    last_refresh: Instant,
    interval_start: SystemTime,
    interval_instant: Instant,
    dropped_before: u64,
    scratch: Vec<u32>,
    /// Whether an address is a signal trampoline's (the frame after it is an exact pc): the
    /// check reads code through the kernel, so each address is checked once.
    trampolines: HashMap<usize, bool>,
}

impl Aggregator {
    fn new() -> Aggregator {
        let mut a = Aggregator {
            stacks: HashMap::new(),
            locs: Vec::new(),
            loc_index: HashMap::new(),
            mappings: Vec::new(),
            mapping_index: HashMap::new(),
            mains: Vec::new(),
            names: HashMap::new(),
            stack_lists: Vec::new(),
            stack_index: HashMap::new(),
            stack_cache: HashMap::new(),
            counters: (0, 0),
            objects: Vec::new(),
            last_refresh: Instant::now(),
            interval_start: SystemTime::now(),
            interval_instant: Instant::now(),
            dropped_before: 0,
            scratch: Vec::new(),
            trampolines: HashMap::new(),
        };
        a.counters = sys::dl_load_counters();
        a.objects = current_objects();
        a
    }

    /// Moves the samples pulled out of the ring (and those still in it) into the interval's
    /// stacks, naming their addresses.
    ///
    /// Resolving an address of an object for the first time can take long (its DWARF is read,
    /// hundreds of milliseconds for a large program), so the ring is not emptied here but by
    /// the timer thread ([`Inner::pull`]), which never waits for this: the ring does not fill
    /// up behind a slow symbolization. `take` passes `defer_refresh` false: the interval's samples
    /// are named after a refresh, however recent the last one. `refresh` refreshes selftrace's
    /// view of the loaded objects (the unwinder's and symbolizer's tables): the running side
    /// passes it, aggregation only says when. Gives the emptied batch back (its allocation is
    /// reused for the next pulls).
    fn drain(
        &mut self,
        mut batch: Vec<Raw>,
        defer_refresh: bool,
        refresh: impl FnOnce(),
    ) -> Vec<Raw> {
        if batch.is_empty() {
            return batch;
        }
        // Objects loaded or unloaded since the last refresh: the unwinder and symbolizer learn
        // the new ones, and an address whose object changed cannot be named with certainty.
        // Refreshing costs (tables are rebuilt), so a program that loads and unloads libraries
        // all the time gets a refresh every MIN_REFRESH at most; in between, only addresses
        // in objects that can never be unloaded are named.
        let counters = sys::dl_load_counters();
        let mut view = View::Settled;
        if counters != self.counters {
            // `take` always refreshes: the interval's samples are named as far as possible.
            if !defer_refresh || self.last_refresh.elapsed() >= MIN_REFRESH {
                refresh();
                self.last_refresh = Instant::now();
                let before = std::mem::replace(&mut self.objects, current_objects());
                if counters.1 != self.counters.1 {
                    self.forget_gone(&before);
                    view = View::Unloaded(before);
                }
                self.counters = counters;
            } else {
                view = View::Changing;
            }
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let settled = matches!(view, View::Settled);
        for rec in batch.drain(..) {
            let frames = &rec.frames[..];
            let truncation = match rec.end {
                WalkEnd::Complete => None,
                WalkEnd::Truncated(t) => Some(t),
                WalkEnd::BufferFull => Some(Truncation {
                    pc: frames.last().copied().unwrap_or(0),
                    reason: StopReason::TooDeep,
                }),
            };
            self.names
                .entry(rec.tid)
                .or_insert_with(|| (thread_name(rec.tid), Instant::now()));
            if settled {
                if let Some(&stack) = self.stack_cache.get(frames) {
                    *self.stacks.entry((rec.tid, stack, truncation)).or_insert(0) +=
                        u64::from(rec.weight);
                    continue;
                }
            }
            scratch.clear();
            let mut all_certain = true;
            for i in 0..frames.len() {
                let after_trampoline = i > 0
                    && *self
                        .trampolines
                        .entry(frames[i - 1])
                        .or_insert_with(|| crate::symbolize::is_signal_trampoline(frames[i - 1]));
                let kind = if i == 0 || after_trampoline {
                    FrameKind::Exact
                } else {
                    FrameKind::Return
                };
                let (id, certain) = self.location(frames[i], kind, &view);
                all_certain &= certain;
                scratch.push(id);
            }
            let stack = match self.stack_index.get(scratch.as_slice()) {
                Some(&stack) => stack,
                None => {
                    let stack = self.stack_lists.len() as u32;
                    let list: Box<[u32]> = scratch.as_slice().into();
                    self.stack_lists.push(list.clone());
                    self.stack_index.insert(list, stack);
                    stack
                }
            };
            if all_certain && settled {
                // Bounded: a program with ever new stacks starts the cache over.
                if self.stack_cache.len() >= 1 << 16 {
                    self.stack_cache.clear();
                }
                self.stack_cache.insert(rec.frames, stack);
            }
            *self.stacks.entry((rec.tid, stack, truncation)).or_insert(0) += u64::from(rec.weight);
        }
        self.scratch = scratch;
        batch
    }

    /// The threads whose name was read longer than [`NAME_REFRESH`] ago.
    fn stale_names(&self) -> Vec<i32> {
        self.names
            .iter()
            .filter(|(_, (_, read))| read.elapsed() >= NAME_REFRESH)
            .map(|(&tid, _)| tid)
            .collect()
    }

    /// Forgets what is cached about addresses in objects of `before` that are gone (or moved):
    /// the next sample there is resolved again.
    fn forget_gone(&mut self, before: &[Obj]) {
        let gone: Vec<&Obj> = before
            .iter()
            .filter(|o| !self.objects.contains(o))
            .collect();
        if gone.is_empty() {
            return;
        }
        let in_gone = |a: usize| gone.iter().any(|o| (o.start..o.end).contains(&a));
        self.stack_cache.clear();
        self.loc_index.retain(|&(address, exact), _| {
            !in_gone(if exact {
                address
            } else {
                address.wrapping_sub(1)
            })
        });
        self.trampolines.retain(|&a, _| !in_gone(a));
    }

    /// The location id of a frame, resolving (symbolizing) an address seen for the first time,
    /// and whether it was named with certainty. An address whose object may have changed since
    /// the sample was taken (see [`View`]) is kept unnamed, and not cached: a later sample
    /// there is resolved anew.
    fn location(&mut self, address: usize, kind: FrameKind, view: &View) -> (u32, bool) {
        let key = (address, kind == FrameKind::Exact);
        // Cached locations were named with certainty and stay valid while nothing was
        // unloaded since (an unload forgets those of the objects gone).
        if let View::Settled = view {
            if let Some(&id) = self.loc_index.get(&key) {
                return (id, true);
            }
        }
        let probe = kind.lookup_address(address);
        let now = find(&self.objects, probe);
        let certain = match (view, &now) {
            (_, None) => false,
            (View::Settled, Some(_)) => true,
            (View::Changing, Some(o)) => o.permanent,
            (View::Unloaded(before), Some(o)) => find(before, probe).as_ref() == Some(o),
        };
        if certain {
            if let Some(&id) = self.loc_index.get(&key) {
                return (id, true);
            }
        }
        let loc = match now {
            Some(obj) if certain => {
                let mapping = self.mapping(&obj, probe);
                let frame = BacktraceFrame::resolve(address, kind);
                Loc {
                    address,
                    kind,
                    mapping,
                    lines: frame.symbols().iter().map(line).collect(),
                }
            }
            _ => Loc {
                address,
                kind,
                mapping: None,
                lines: Arc::from(Vec::new()),
            },
        };
        let id = self.locs.len() as u32;
        self.locs.push(loc);
        if certain {
            self.loc_index.insert(key, id);
        }
        (id, certain)
    }

    /// The mapping of the executable segment containing `addr` of the object `obj`: one mapping per segment, as `/proc/self/maps` has them, so that
    /// `address - start + file_offset` is the address's offset in the file in every segment
    /// (linkers may give each segment its own address-to-offset delta).
    fn mapping(&mut self, obj: &Obj, addr: usize) -> Option<usize> {
        let m = crate::modules::with_current(|s| {
            let o = s?.find(obj.start)?;
            let i = o.exec.iter().position(|r| r.contains(&addr))?;
            let seg = &o.exec[i];
            Some((
                Mapping {
                    start: seg.start,
                    limit: seg.end,
                    file_offset: *o.exec_file_offsets.get(i)?,
                    path: Arc::from(o.path.as_str()),
                    build_id: o.build_id.clone(),
                },
                o.is_main,
            ))
        });
        let (m, is_main) = m?;
        let key = (m.path.clone(), m.start);
        if let Some(&id) = self.mapping_index.get(&key) {
            return Some(id);
        }
        let id = self.mappings.len();
        self.mappings.push(m);
        self.mains.push(is_main);
        self.mapping_index.insert(key, id);
        Some(id)
    }

    /// Ends the interval: its profile, and a new empty interval.
    fn finish(&mut self, mode: Mode, frequency_hz: u32, dropped_total: u64) -> Profile {
        let now = Instant::now();
        let stacks = std::mem::take(&mut self.stacks);
        // No name is read here: the profiler's thread reads them ([`NAME_REFRESH`]).
        let mut loc_map: HashMap<u32, usize> = HashMap::new();
        let mut map_map: HashMap<usize, usize> = HashMap::new();
        let mut locations = Vec::new();
        let mut mappings = Vec::new();
        let mut samples = Vec::with_capacity(stacks.len());
        for ((tid, stack, truncation), count) in stacks {
            let locs = &self.stack_lists[stack as usize];
            let mut ids = Vec::with_capacity(locs.len());
            for &l in locs.iter() {
                let id = *loc_map.entry(l).or_insert_with(|| {
                    let loc = &self.locs[l as usize];
                    let mapping = loc.mapping.map(|m| {
                        *map_map.entry(m).or_insert_with(|| {
                            mappings.push(self.mappings[m].clone());
                            mappings.len() - 1
                        })
                    });
                    locations.push(Location {
                        address: loc.address,
                        kind: loc.kind,
                        mapping,
                        lines: loc.lines.to_vec(),
                    });
                    locations.len() - 1
                });
                ids.push(id);
            }
            samples.push(Sample {
                locations: ids,
                count,
                thread_id: tid,
                thread_name: self
                    .names
                    .get(&tid)
                    .map(|(name, _)| name.clone())
                    .unwrap_or_else(|| Arc::from("?")),
                truncation,
            });
        }
        // pprof takes the first mapping for the main program.
        if let Some(main) = map_map
            .iter()
            .find(|(&global, _)| self.mains.get(global) == Some(&true))
            .map(|(_, &local)| local)
        {
            if main != 0 {
                mappings.swap(0, main);
                for l in &mut locations {
                    l.mapping = l.mapping.map(|m| match m {
                        0 => main,
                        m if m == main => 0,
                        m => m,
                    });
                }
            }
        }
        samples.sort_by(|a, b| b.count.cmp(&a.count).then(a.thread_id.cmp(&b.thread_id)));
        let profile = Profile {
            mode,
            frequency_hz,
            period_ns: 1_000_000_000 / u64::from(frequency_hz),
            start: self.interval_start,
            duration: now - self.interval_instant,
            samples,
            locations,
            mappings,
            dropped: dropped_total - self.dropped_before,
        };
        // The next interval begins where this one ended, to the nanosecond (not when this
        // function is done: consecutive profiles have no gap, however long naming took).
        self.interval_start = profile.start + profile.duration;
        self.interval_instant = now;
        self.dropped_before = dropped_total;
        // Keep the per-address cache bounded for long continuous profiling: what the next
        // interval needs is resolved again.
        if self.locs.len() > 1 << 18 || self.stack_lists.len() > 1 << 18 {
            self.locs.clear();
            self.loc_index.clear();
            self.trampolines.clear();
            self.stack_lists.clear();
            self.stack_index.clear();
            self.stack_cache.clear();
        }
        self.names.retain(|tid, _| sys::tgkill(*tid, 0).is_ok());
        profile
    }
}

fn line(s: &crate::symbolize::BacktraceSymbol) -> Line {
    Line {
        function: Arc::from(s.name.as_deref().unwrap_or("??")),
        system_name: Arc::from(s.raw_name.as_deref().unwrap_or("")),
        file: s.file.map(Arc::from),
        line: s.line,
    }
}

/// The least time between two refreshes of selftrace's view of the loaded objects by the
/// profiler's thread.
const MIN_REFRESH: Duration = Duration::from_millis(250);

/// A loaded object, as the profiler tells objects apart.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Obj {
    start: usize,
    end: usize,
    path: Arc<str>,
    /// The file and build-id: another file loaded at the same place under the same path (a
    /// library rebuilt and loaded again) is another object.
    file: Option<crate::modules::FileId>,
    build_id: Option<Arc<[u8]>>,
    /// Never unloaded (see [`crate::modules::Object::permanent`]).
    permanent: bool,
}

/// What a drain knows about the objects the samples' addresses were in.
enum View {
    /// Nothing was loaded or unloaded since the last refresh.
    Settled,
    /// Objects were unloaded before the refresh this drain made; these were loaded at the
    /// refresh before. An address named now must be in the same object in both.
    Unloaded(Vec<Obj>),
    /// The loader changed its list since the last refresh, and the next refresh is not due:
    /// only objects that can never be unloaded are sure.
    Changing,
}

fn current_objects() -> Vec<Obj> {
    crate::modules::with_current(|s| {
        s.map(|s| {
            s.objects()
                .iter()
                .map(|o| Obj {
                    start: o.range.start,
                    end: o.range.end,
                    path: Arc::from(o.path.as_str()),
                    file: o.file,
                    build_id: o.build_id.as_deref().map(Arc::from),
                    permanent: o.permanent,
                })
                .collect()
        })
        .unwrap_or_default()
    })
}

fn find(objects: &[Obj], addr: usize) -> Option<Obj> {
    let i = objects
        .partition_point(|o| o.start <= addr)
        .checked_sub(1)?;
    let o = &objects[i];
    (addr < o.end).then(|| o.clone())
}

fn thread_name(tid: i32) -> Arc<str> {
    match crate::threads::info(tid) {
        Some(info) => Arc::from(info.name()),
        None => Arc::from(format!("thread-{tid}")),
    }
}

/// What the profiler's threads need of the [`Builder`] given to `start`, and the run's
/// generation: the timer thread arms timers with these and nothing else.
struct Plan {
    mode: Mode,
    signal: i32,
    frequency_hz: u32,
    threads: Threads,
    /// How often `/proc/self/task` is scanned for new threads (and the ring pulled at least).
    rescan: Duration,
    /// This run's [`GENERATION`], carried in each timer's signal.
    generation: u32,
}

/// State shared by the [`super::Profiler`] handle and its thread.
struct Inner {
    agg: Mutex<Aggregator>,
    /// Samples pulled out of the ring and not yet aggregated. Every pull from the ring happens
    /// under this lock (the ring has one consumer at a time); taken after `agg` when both are.
    pulled: Mutex<Vec<Raw>>,
    /// Tells the profiler's thread that samples were pulled.
    pulled_cv: std::sync::Condvar,
    /// `take` calls waiting for `agg`: the profiler's thread lets them go first.
    taking: AtomicUsize,
    /// The stride of the timers armed at the last rescan.
    stride: AtomicU32,
    shared: *const Shared,
    stop: AtomicBool,
    threads: AtomicUsize,
    threads_seen: AtomicU64,
    mode: Mode,
    frequency_hz: u32,
    /// The sampling signal (given back at stop).
    signal: i32,
}

// SAFETY: `shared` points to the published Shared, which is Sync and outlives Inner's use of
// it (freed in Running::stop after the thread ended).
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Inner {
    fn ring(&self) -> &Ring {
        // SAFETY: see the Send impl.
        unsafe { &(*self.shared).ring }
    }

    fn lock(&self) -> MutexGuard<'_, Aggregator> {
        self.agg.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_pulled(&self) -> MutexGuard<'_, Vec<Raw>> {
        self.pulled.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Empties the ring into the pulled samples (fast: copies only); returns how many.
    fn pull(&self) -> usize {
        let mut pulled = self.lock_pulled();
        let before = pulled.len();
        pull(self.ring(), &mut pulled);
        pulled.len() - before
    }

    /// At most `limit` of the pulled samples, with the ring emptied into them first, and
    /// whether some are left.
    fn take_pulled(&self, limit: usize) -> (Vec<Raw>, bool) {
        let mut pulled = self.lock_pulled();
        pull(self.ring(), &mut pulled);
        if pulled.len() <= limit {
            (std::mem::take(&mut *pulled), false)
        } else {
            // Which samples go first does not matter: they are counted, not ordered.
            let at = pulled.len() - limit;
            (pulled.split_off(at), true)
        }
    }

    /// Gives an emptied batch's allocation back for the next pulls.
    fn recycle(&self, batch: Vec<Raw>) {
        let mut pulled = self.lock_pulled();
        if pulled.is_empty() && pulled.capacity() < batch.capacity() {
            *pulled = batch;
        }
    }

    /// Names at most `limit` of the pulled samples (with the ring emptied into them first) into
    /// `agg`, the aggregator this caller locked; returns whether some are left. A drain that
    /// sees objects loaded or unloaded refreshes selftrace's view of them (`crate::refresh`).
    fn drain(&self, agg: &mut Aggregator, defer_refresh: bool, limit: usize) -> bool {
        let (batch, left) = self.take_pulled(limit);
        if batch.is_empty() {
            return left;
        }
        let batch = agg.drain(batch, defer_refresh, crate::refresh);
        self.recycle(batch);
        left
    }
}

/// A running profiler.
pub(crate) struct Running {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
    pid: i32,
}

pub(crate) fn start(b: Builder) -> Result<Running, Error> {
    if RUNNING
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(Error::AlreadyExists("a running profiler"));
    }
    let sig = b.signal;
    match start_locked(b) {
        Ok(r) => Ok(r),
        Err(e) => {
            // A start that failed after taking the signal gives it back.
            if sys::signal::owner(sig) == Some(sys::signal::Owner::Profiler) {
                let _ = sys::signal::give_back(sig, on_sample, true);
                sys::signal::set_owner(sig, None);
            }
            RUNNING.store(false, Ordering::Release);
            Err(e)
        }
    }
}

fn start_locked(b: Builder) -> Result<Running, Error> {
    let _ = crate::init();
    // The threads first: a start refused for them leaves the signal alone.
    if let Threads::Only(tids) = &b.threads {
        if tids.iter().any(|&t| t <= 0) {
            return Err(Error::InvalidInput(
                "thread ids must be positive (tids of this process)",
            ));
        }
        if tids.iter().any(|&t| sys::tgkill(t, 0).is_err()) {
            return Err(Error::ThreadGone);
        }
    }
    install(b.signal)?;
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    let shared = Box::into_raw(Box::new(Shared {
        ring: Ring::new(b.ring_capacity),
        generation,
    }));
    let inner = Arc::new(Inner {
        agg: Mutex::new(Aggregator::new()),
        pulled: Mutex::new(Vec::new()),
        pulled_cv: std::sync::Condvar::new(),
        taking: AtomicUsize::new(0),
        stride: AtomicU32::new(1),
        shared,
        stop: AtomicBool::new(false),
        threads: AtomicUsize::new(0),
        threads_seen: AtomicU64::new(0),
        mode: b.mode,
        frequency_hz: b.frequency_hz,
        signal: b.signal,
    });
    SHARED.store(shared, Ordering::SeqCst);
    let plan = Plan {
        mode: b.mode,
        signal: b.signal,
        frequency_hz: b.frequency_hz,
        threads: b.threads,
        rescan: b.rescan,
        generation,
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread_inner = inner.clone();
    let spawned = std::thread::Builder::new()
        .name("selftrace-prof".into())
        .spawn(move || profiler_thread(thread_inner, plan, ready_tx));
    let thread = match spawned {
        Ok(t) => t,
        Err(e) => {
            unpublish(shared);
            return Err(Error::Sys {
                call: "pthread_create",
                errno: e.raw_os_error().unwrap_or(libc::EAGAIN),
            });
        }
    };
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(Running {
            inner,
            thread: Some(thread),
            pid: sys::getpid(),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            unpublish(shared);
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            unpublish(shared);
            Err(Error::Sys {
                call: "profiler thread",
                errno: libc::EIO,
            })
        }
    }
}

/// Clears the published state and waits for handlers still using it: afterwards no handler
/// reaches it (signals queued by deleted timers find nothing and do nothing).
fn quiesce() {
    SHARED.store(core::ptr::null_mut(), Ordering::SeqCst);
    while ACTIVE.load(Ordering::SeqCst) != 0 {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// [`quiesce`], then frees the state.
fn unpublish(shared: *mut Shared) {
    quiesce();
    // SAFETY: created by Box::into_raw in start_locked; no handler can reach it any more.
    drop(unsafe { Box::from_raw(shared) });
}

/// The profiler's thread: aggregates and names the samples that the second thread,
/// [`timer_thread`], pulls out of the ring. That thread also arms the timers of new threads, so
/// that a slow symbolization here (the first address of a large object reads its DWARF) never
/// delays sampling threads started meanwhile nor lets the ring fill up.
fn profiler_thread(
    inner: Arc<Inner>,
    plan: Plan,
    ready: std::sync::mpsc::Sender<Result<(), Error>>,
) {
    let me = sys::gettid();
    let rescan = plan.rescan;
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let timer_inner = inner.clone();
    let (timer_ready_tx, timer_ready_rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("selftrace-timer".into())
        .spawn(move || timer_thread(&timer_inner, &plan, me, timer_ready_tx, stop_rx));
    let timers = match spawned {
        Ok(t) => t,
        Err(e) => {
            let _ = ready.send(Err(Error::Sys {
                call: "pthread_create",
                errno: e.raw_os_error().unwrap_or(libc::EAGAIN),
            }));
            return;
        }
    };
    match timer_ready_rx.recv() {
        Ok(Ok(())) => {
            let _ = ready.send(Ok(()));
        }
        Ok(Err(e)) => {
            let _ = timers.join();
            let _ = ready.send(Err(e));
            return;
        }
        Err(_) => {
            let _ = timers.join();
            let _ = ready.send(Err(Error::Sys {
                call: "profiler timer thread",
                errno: libc::EIO,
            }));
            return;
        }
    }
    let mut names_read = Instant::now();
    loop {
        // A `take` goes first: it names what is left itself, and does not wait behind a
        // backlog that this thread would name chunk after chunk.
        while inner.taking.load(Ordering::Acquire) > 0 && !inner.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let left = inner.drain(&mut inner.lock(), true, CHUNK);
        if inner.stop.load(Ordering::Acquire) {
            break;
        }
        if names_read.elapsed() >= NAME_REFRESH {
            refresh_names(&inner);
            names_read = Instant::now();
        }
        if left {
            continue;
        }
        let pulled = inner.lock_pulled();
        if pulled.is_empty() {
            let _ = inner.pulled_cv.wait_timeout(pulled, rescan);
        }
    }
    // The timer thread deletes its timers as it ends, which stops new samples; samples already
    // in the ring are drained by stop.
    drop(stop_tx);
    let _ = timers.join();
}

/// Reads the names of the sampled threads again (those read [`NAME_REFRESH`] ago or more),
/// outside the aggregator's lock: a thread that named itself after its first sample is shown
/// by its new name from then on. A thread that is gone keeps the name it had.
fn refresh_names(inner: &Inner) {
    let stale = inner.lock().stale_names();
    let fresh: Vec<(i32, Option<Arc<str>>)> = stale
        .into_iter()
        .map(|tid| (tid, crate::threads::info(tid).map(|i| Arc::from(i.name()))))
        .collect();
    let now = Instant::now();
    let mut agg = inner.lock();
    for (tid, name) in fresh {
        if let Some(entry) = agg.names.get_mut(&tid) {
            if let Some(name) = name {
                entry.0 = name;
            }
            entry.1 = now;
        }
    }
}

/// Arms a timer for each thread that appears in `/proc/self/task` (every rescan interval), and
/// forgets those of threads that exited; the profiler's two threads (`drainer` and this one)
/// are not sampled. In between, pulls the ring's samples out whenever the handler says the
/// ring is half full, and at least every rescan interval, for the drainer to name. Reports the
/// first scan's outcome on `ready`; ends, deleting its timers, when `stop` is dropped.
fn timer_thread(
    inner: &Inner,
    plan: &Plan,
    drainer: i32,
    ready: std::sync::mpsc::Sender<Result<(), Error>>,
    stop: std::sync::mpsc::Receiver<()>,
) {
    let me = sys::gettid();
    let period_ns = 1_000_000_000 / u64::from(plan.frequency_hz);
    let generation = plan.generation;
    let mut timers: HashMap<i32, Timer> = HashMap::new();
    // Threads seen and not sampled (filtered out), so that their names are read once.
    let mut skipped: HashMap<i32, ()> = HashMap::new();
    let mut first = true;
    let task_dir = match sys::open_cloexec(c"/proc/self/task", libc::O_RDONLY | libc::O_DIRECTORY) {
        Ok(fd) => fd,
        Err(errno) => {
            let _ = ready.send(Err(Error::Sys {
                call: "open /proc/self/task",
                errno,
            }));
            return;
        }
    };
    let mut live = Vec::new();
    let mut new = Vec::new();
    loop {
        live.clear();
        let listed = sys::for_each_task_in(task_dir, |tid| live.push(tid));
        if let Err(errno) = listed {
            if first {
                let _ = ready.send(Err(Error::Sys {
                    call: "getdents64 /proc/self/task",
                    errno,
                }));
                sys::close(task_dir);
                return;
            }
        }
        if listed.is_ok() {
            timers.retain(|tid, _| live.contains(tid));
            skipped.retain(|tid, _| live.contains(tid));
        }
        new.clear();
        for &tid in &live {
            if tid == me
                || tid == drainer
                || timers.contains_key(&tid)
                || skipped.contains_key(&tid)
            {
                continue;
            }
            let wanted = match &plan.threads {
                Threads::All => true,
                Threads::Only(tids) => tids.contains(&tid),
                Threads::NamePrefix(p) => thread_name(tid).starts_with(p.as_str()),
            };
            if !wanted {
                skipped.insert(tid, ());
                continue;
            }
            new.push(tid);
        }
        // Wall mode: every thread's timer fires whether it runs or not, so the signals grow
        // with the thread count; past the budget each timer fires every `stride` periods and
        // its samples count that many. Timers whose stride is off by more than twice are armed
        // again (a late signal of the old timer carries its own stride).
        let stride = match plan.mode {
            Mode::Cpu => 1,
            Mode::Wall => wall_stride(timers.len() + new.len(), plan.frequency_hz),
        };
        inner.stride.store(stride, Ordering::Relaxed);
        for (&tid, t) in timers.iter_mut() {
            if t.stride > stride * 2 || t.stride * 2 < stride {
                if let Ok(again) =
                    Timer::arm(tid, plan.mode, plan.signal, period_ns, generation, stride)
                {
                    *t = again;
                }
            }
        }
        for &tid in &new {
            match Timer::arm(tid, plan.mode, plan.signal, period_ns, generation, stride) {
                Ok(t) => {
                    timers.insert(tid, t);
                    inner.threads_seen.fetch_add(1, Ordering::Relaxed);
                }
                // The thread exited meanwhile.
                Err(libc::EINVAL) | Err(libc::ESRCH) => {}
                Err(errno) => {
                    if first {
                        let _ = ready.send(Err(Error::Sys {
                            call: "timer_create",
                            errno,
                        }));
                        sys::close(task_dir);
                        return;
                    }
                }
            }
        }
        inner.threads.store(timers.len(), Ordering::Relaxed);
        if first {
            first = false;
            let _ = ready.send(Ok(()));
        }
        // Until the next rescan: pull whenever the handler asks (the ring is half full).
        let next_scan = Instant::now() + plan.rescan;
        let mut stopped = false;
        loop {
            if inner.pull() > 0 {
                inner.pulled_cv.notify_one();
            }
            match stop.try_recv() {
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                _ => stopped = true,
            }
            let Some(left) = next_scan.checked_duration_since(Instant::now()) else {
                break;
            };
            if stopped || inner.stop.load(Ordering::Acquire) {
                break;
            }
            sys::futex_wait(&DRAIN, 0, left.as_nanos() as u64);
            DRAIN.store(0, Ordering::Release);
        }
        if stopped || inner.stop.load(Ordering::Acquire) {
            break;
        }
    }
    sys::close(task_dir);
    drop(timers);
}

impl Running {
    pub(crate) fn take(&self) -> Profile {
        if sys::getpid() != self.pid {
            // A forked child's copy of the parent's profiler: it samples nothing here, and its
            // locks may be held by the parent's threads.
            return empty(self.inner.mode, self.inner.frequency_hz);
        }
        self.inner.taking.fetch_add(1, Ordering::AcqRel);
        let mut agg = self.inner.lock();
        self.inner.taking.fetch_sub(1, Ordering::AcqRel);
        self.inner.drain(&mut agg, false, usize::MAX);
        let dropped = self.inner.ring().dropped.load(Ordering::Relaxed);
        agg.finish(self.inner.mode, self.inner.frequency_hz, dropped)
    }

    pub(crate) fn stop(mut self) -> Profile {
        self.inner.stop.store(true, Ordering::Release);
        let thread = self.thread.take();
        if sys::getpid() != self.pid {
            // A forked child: the profiler's thread and timers exist only in the parent (its
            // join handle would wait forever). The child may start a profiler of its own.
            core::mem::forget(thread);
            // Unless the child's fork handler did it already (and the child started a
            // profiler of its own since).
            if SHARED
                .compare_exchange(
                    self.inner.shared as *mut Shared,
                    core::ptr::null_mut(),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            {
                RUNNING.store(false, Ordering::Release);
            }
            return empty(self.inner.mode, self.inner.frequency_hz);
        }
        if DRAIN.swap(1, Ordering::AcqRel) == 0 {
            sys::futex_wake(&DRAIN, 1);
        }
        self.inner.pulled_cv.notify_all();
        if let Some(t) = thread {
            let _ = t.join();
        }
        quiesce();
        let profile = self.take();
        unpublish(self.inner.shared as *mut Shared);
        // The signal's previous action back (`SIG_IGN` for `SIG_DFL`: a late signal of a
        // deleted timer must not kill the process).
        let _ = sys::signal::give_back(self.inner.signal, on_sample, true);
        sys::signal::set_owner(self.inner.signal, None);
        RUNNING.store(false, Ordering::Release);
        profile
    }

    pub(crate) fn stats(&self) -> Stats {
        let ring = self.inner.ring();
        Stats {
            samples: ring.written.load(Ordering::Relaxed),
            dropped: ring.dropped.load(Ordering::Relaxed),
            threads: self.inner.threads.load(Ordering::Relaxed),
            threads_seen: self.inner.threads_seen.load(Ordering::Relaxed),
            stride: self.inner.stride.load(Ordering::Relaxed),
        }
    }
}

fn empty(mode: Mode, frequency_hz: u32) -> Profile {
    Profile {
        mode,
        frequency_hz,
        period_ns: 1_000_000_000 / u64::from(frequency_hz),
        start: SystemTime::now(),
        duration: Duration::ZERO,
        samples: Vec::new(),
        locations: Vec::new(),
        mappings: Vec::new(),
        dropped: 0,
    }
}
