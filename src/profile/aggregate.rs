//! Aggregation: the samples pulled out of the ring ([`Raw`]) counted per distinct stack and
//! named (symbolized, with their objects as mappings) into the interval's [`Profile`]. It knows
//! nothing of the running profiler: it is handed batches of samples and says when selftrace's
//! view of the loaded objects must be refreshed (pprof-rs's report side).

use super::data::{Line, Location, Mapping, Mode, Profile, Sample};
use super::ring::Ring;
use super::MAX_DEPTH;
use crate::symbolize::BacktraceFrame;
use crate::sys;
use crate::unwind::{FrameKind, FrameKinds, StopReason, Truncation, WalkEnd};
use core::sync::atomic::Ordering;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

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

/// How often the profiler's thread reads the names of the threads it has seen again (a thread
/// often names itself after it started): names are read from `/proc` there, once per thread
/// when it is first sampled and then at this interval, never per sample nor in `take`.
pub(super) const NAME_REFRESH: Duration = Duration::from_secs(1);

/// A sample copied out of the ring.
pub(super) struct Raw {
    tid: i32,
    weight: u32,
    end: WalkEnd,
    /// Which frames are exact (the walk's record).
    kinds: FrameKinds,
    frames: Box<[usize]>,
}

/// Copies the ring's published samples into `out`, handing their slots back; beyond
/// [`MAX_BACKLOG`] samples in `out`, a sample is dropped and its periods counted in the ring's
/// `dropped`.
pub(super) fn pull(ring: &Ring, out: &mut Vec<Raw>) {
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
            kinds: rec.kinds.truncated(rec.len.min(MAX_DEPTH)),
            frames: rec.frames[..rec.len.min(MAX_DEPTH)].into(),
        })
    });
}

/// Samples of the current interval, and what resolving them needs.
pub(super) struct Aggregator {
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
    /// the one of the last refresh ([`View::Settled`]). Keyed by the addresses alone: a
    /// sample's frame kinds follow from them (frame 0 exact, and each frame after a signal
    /// trampoline's address).
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
}

impl Aggregator {
    pub(super) fn new() -> Aggregator {
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
        };
        a.counters = sys::dl_load_counters();
        a.objects = current_objects();
        a
    }

    /// Moves a batch of samples pulled out of the ring into the interval's stacks, naming their
    /// addresses.
    ///
    /// Resolving an address of an object for the first time can take long (its DWARF is read,
    /// hundreds of milliseconds for a large program), so the ring is not emptied here but by
    /// the timer thread (through `running.rs`'s `Inner::pull`), which never waits for this: the
    /// ring does not fill up behind a slow symbolization. `take` passes `defer_refresh` false:
    /// the interval's samples are named after a refresh, however recent the last one.
    /// `refresh` refreshes selftrace's view of the loaded objects (the unwinder's and
    /// symbolizer's tables): the running side passes it, aggregation only says when. Gives the
    /// emptied batch back (its allocation is reused for the next pulls).
    pub(super) fn drain(
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
                let kind = rec.kinds.kind(frames, i);
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
    pub(super) fn stale_names(&self) -> Vec<i32> {
        self.names
            .iter()
            .filter(|(_, (_, read))| read.elapsed() >= NAME_REFRESH)
            .map(|(&tid, _)| tid)
            .collect()
    }

    /// Takes the names read again for threads of [`stale_names`](Aggregator::stale_names)
    /// (`None`: the thread is gone and keeps the name it had), read at `now`.
    pub(super) fn renamed(&mut self, fresh: Vec<(i32, Option<Arc<str>>)>, now: Instant) {
        for (tid, name) in fresh {
            if let Some(entry) = self.names.get_mut(&tid) {
                if let Some(name) = name {
                    entry.0 = name;
                }
                entry.1 = now;
            }
        }
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

    /// The mapping of the executable segment containing `addr` of the object `obj`: one
    /// mapping per segment, as `/proc/self/maps` has them, so that
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
    pub(super) fn finish(&mut self, mode: Mode, frequency_hz: u32, dropped_total: u64) -> Profile {
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

pub(super) fn thread_name(tid: i32) -> Arc<str> {
    match crate::threads::info(tid) {
        Some(info) => Arc::from(info.name()),
        None => Arc::from(format!("thread-{tid}")),
    }
}
