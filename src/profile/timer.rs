//! The per-thread POSIX timers that send the sampling signal, and the timer thread that arms
//! them for each thread of the process and pulls the ring's samples out for the profiler's
//! thread to name (pprof-rs's timer.rs).

use super::data::Mode;
use super::handler::{timer_value, DRAIN, MAX_STRIDE};
use super::Threads;
use crate::error::Error;
use crate::sys;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the timer thread shows of its work ([`super::Stats`]).
pub(super) struct Counters {
    /// The stride of the timers armed at the last rescan.
    pub(super) stride: AtomicU32,
    /// Threads with a timer now.
    pub(super) threads: AtomicUsize,
    /// Threads that got a timer since the start.
    pub(super) threads_seen: AtomicU64,
}

impl Counters {
    /// No thread armed yet, stride 1.
    pub(super) fn new() -> Counters {
        Counters {
            stride: AtomicU32::new(1),
            threads: AtomicUsize::new(0),
            threads_seen: AtomicU64::new(0),
        }
    }
}

/// The profiler side of the timer thread: where the samples it pulls go, and whether to stop.
pub(super) trait Consumer {
    /// Empties the ring into the samples waiting to be named, and wakes the profiler's thread
    /// if it pulled any.
    fn pull(&self);
    /// Whether the profiler is stopping.
    fn stopping(&self) -> bool;
    /// The counters the timer thread keeps.
    fn counters(&self) -> &Counters;
}

/// The stride of Wall-mode timers when `threads` are sampled at `frequency_hz`: the fewest
/// periods per signal that keep all threads' signals within [`super::WALL_SIGNAL_BUDGET`] a
/// second (1 when they fit).
fn wall_stride(threads: usize, frequency_hz: u32) -> u32 {
    let rate = threads as u64 * u64::from(frequency_hz);
    rate.div_ceil(super::WALL_SIGNAL_BUDGET)
        .clamp(1, u64::from(MAX_STRIDE)) as u32
}

/// One thread's timer.
struct Timer {
    /// Deleted when the `Timer` is dropped.
    _timer: sys::ThreadTimer,
    /// Periods per signal.
    stride: u32,
}

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
    ) -> Result<Timer, Error> {
        let stride = stride.clamp(1, MAX_STRIDE);
        let value = timer_value(generation, stride, tid);
        let period_ns = period_ns.saturating_mul(u64::from(stride));
        let clock = match mode {
            Mode::Cpu => sys::thread_cpu_clock(tid),
            Mode::Wall => libc::CLOCK_MONOTONIC,
        };
        let timer = sys::ThreadTimer::create(clock, sig, tid, value)?;
        // Wall mode: spread the threads' first samples over a period, so that they are not all
        // interrupted at the same instant.
        let first = match mode {
            Mode::Cpu => period_ns,
            Mode::Wall => 1 + (tid as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) % period_ns,
        };
        timer.set(first, period_ns)?;
        Ok(Timer {
            _timer: timer,
            stride,
        })
    }
}

/// What the profiler's threads need of the [`Builder`] given to `start`, and the run's
/// generation: the timer thread arms timers with these and nothing else.
pub(super) struct Plan {
    pub(super) mode: Mode,
    pub(super) signal: i32,
    pub(super) frequency_hz: u32,
    pub(super) threads: Threads,
    /// How often `/proc/self/task` is scanned for new threads (and the ring pulled at least).
    pub(super) rescan: Duration,
    /// This run's generation ([`super::handler::GENERATION`]), carried in each timer's signal.
    pub(super) generation: u32,
}

/// Arms a timer for each thread that appears in `/proc/self/task` (every rescan interval), and
/// forgets those of threads that exited; the profiler's two threads (`drainer` and this one)
/// are not sampled. In between, pulls the ring's samples out whenever the handler says the
/// ring is half full, and at least every rescan interval, for the drainer to name. Reports the
/// first scan's outcome on `ready`; ends, deleting its timers, when `stop` is dropped.
pub(super) fn timer_thread(
    profiler: &impl Consumer,
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
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut live = Vec::new();
    let mut new = Vec::new();
    loop {
        live.clear();
        let listed = sys::for_each_task_in(task_dir, |tid| live.push(tid));
        if let Err(e) = listed {
            if first {
                let _ = ready.send(Err(e));
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
                Threads::NamePrefix(p) => {
                    super::aggregate::thread_name(tid).starts_with(p.as_str())
                }
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
        profiler.counters().stride.store(stride, Ordering::Relaxed);
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
                    profiler
                        .counters()
                        .threads_seen
                        .fetch_add(1, Ordering::Relaxed);
                }
                // The thread exited meanwhile.
                Err(e) if matches!(e.errno(), Some(libc::EINVAL | libc::ESRCH)) => {}
                Err(e) => {
                    if first {
                        let _ = ready.send(Err(e));
                        sys::close(task_dir);
                        return;
                    }
                }
            }
        }
        profiler
            .counters()
            .threads
            .store(timers.len(), Ordering::Relaxed);
        if first {
            first = false;
            let _ = ready.send(Ok(()));
        }
        // Until the next rescan: pull whenever the handler asks (the ring is half full).
        let next_scan = Instant::now() + plan.rescan;
        let mut stopped = false;
        loop {
            profiler.pull();
            match stop.try_recv() {
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                _ => stopped = true,
            }
            let Some(left) = next_scan.checked_duration_since(Instant::now()) else {
                break;
            };
            if stopped || profiler.stopping() {
                break;
            }
            sys::futex_wait(&DRAIN, 0, left.as_nanos() as u64);
            DRAIN.store(0, Ordering::Release);
        }
        if stopped || profiler.stopping() {
            break;
        }
    }
    sys::close(task_dir);
    drop(timers);
}
