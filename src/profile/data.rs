//! A finished profile: symbolized, owned, independent of the process's current state (an
//! object unloaded after the profile was taken does not change it).

use crate::symbolize::FrameKind;
use crate::unwind::Truncation;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What a profiler samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// CPU time: each thread is sampled when it has used another period of CPU time (a
    /// per-thread `CLOCK_THREAD_CPUTIME_ID` timer). A sleeping thread gives no samples.
    Cpu,
    /// Wall-clock time: every thread is sampled once per period of real time, running or
    /// blocked (a per-thread `CLOCK_MONOTONIC` timer), so a thread waiting in a `futex`, `read`
    /// or `nanosleep` shows that wait (off-CPU time).
    Wall,
}

/// `cpu` or `wall` ([`Mode::as_str`]).
impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Mode {
    /// The pprof name of the time this mode measures: `cpu` or `wall`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Cpu => "cpu",
            Mode::Wall => "wall",
        }
    }
}

/// One source line of a [`Location`]: a function, or a function inlined into the next line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    /// The demangled function name (Rust without the hash), or `??` when unknown.
    pub function: Arc<str>,
    /// The raw (mangled) name, as the symbol table or DWARF has it; empty when unknown.
    pub system_name: Arc<str>,
    /// The source file, when the object has line information.
    pub file: Option<Arc<str>>,
    /// The line in `file`, when known.
    pub line: Option<u32>,
}

/// One distinct code address of the profile's stacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The address: the exact pc for a frame interrupted by the sample (or by a signal), the
    /// return address otherwise (see `kind`).
    pub address: usize,
    /// Whether `address` is an exact pc or a return address (looked up at `address - 1`).
    pub kind: FrameKind,
    /// Index into [`Profile::mappings`] of the object containing it, if known.
    pub mapping: Option<usize>,
    /// Functions at this address, innermost (most deeply inlined) first; the last is the
    /// physical function. Empty when the address is in no known object or has no symbol: the
    /// address is then all that is known, and outputs show it as `0x...` (or `obj+0x...`).
    pub lines: Vec<Line>,
}

impl Location {
    /// The address to look a symbol up at (`address - 1` for a return address).
    pub fn lookup_address(&self) -> usize {
        self.kind.lookup_address(self.address)
    }
}

/// One loaded object (executable, shared library, vDSO) that the profile's addresses are in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address of the object in memory.
    pub start: usize,
    /// One past its last address.
    pub limit: usize,
    /// The file offset that `start` corresponds to.
    pub file_offset: u64,
    /// The file's path (`[vdso]` for the vDSO).
    pub path: Arc<str>,
    /// The GNU build-id, if the object has one.
    pub build_id: Option<Vec<u8>>,
}

/// One distinct stack of one thread, with how often it was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Indices into [`Profile::locations`], innermost frame first.
    pub locations: Vec<usize>,
    /// How many periods this stack stands for: the samples taken, plus the periods a late
    /// timer signal reported as overruns (`si_overrun`); in Wall mode past
    /// [`WALL_SIGNAL_BUDGET`](super::WALL_SIGNAL_BUDGET), each sample counts for its timer's
    /// stride of periods.
    pub count: u64,
    /// The thread's id.
    pub thread_id: i32,
    /// The thread's name (`comm`) when it was first seen in the interval.
    pub thread_name: Arc<str>,
    /// Why the walk stopped before the stack's end, if it did: the stack is then a truncated
    /// one (its outermost frames are missing), never a guessed one.
    pub truncation: Option<Truncation>,
}

/// A sampled profile of one interval: what [`Profiler::take`](super::Profiler::take) and
/// [`Profiler::stop`](super::Profiler::stop) return.
#[derive(Clone, Debug)]
pub struct Profile {
    /// CPU or wall-clock time.
    pub mode: Mode,
    /// Samples per second per thread that the profiler was asked for.
    pub frequency_hz: u32,
    /// The time one sample stands for, in nanoseconds (`1e9 / frequency_hz`).
    pub period_ns: u64,
    /// When the interval began.
    pub start: SystemTime,
    /// How long it lasted.
    pub duration: Duration,
    /// The distinct stacks, with their counts.
    pub samples: Vec<Sample>,
    /// The distinct addresses the samples refer to.
    pub locations: Vec<Location>,
    /// The objects the locations are in.
    pub mappings: Vec<Mapping>,
    /// Periods lost because the sample ring was full (the profiler's thread did not drain it in
    /// time) or the samples waiting to be named were too many (the aggregation could not keep
    /// up): the samples of these periods are missing from `samples`.
    pub dropped: u64,
}

impl Profile {
    /// The total count of all samples (periods), overruns included.
    /// (Saturating: a hand-built profile's counts may add up past `u64::MAX`.)
    pub fn total(&self) -> u64 {
        self.samples
            .iter()
            .fold(0u64, |total, s| total.saturating_add(s.count))
    }

    /// The function names of a sample's stack, innermost first, inlined functions expanded
    /// (`??` for an unknown frame, and for an index past [`Profile::locations`] in a profile
    /// built by hand).
    pub fn function_names<'a>(&'a self, sample: &'a Sample) -> impl Iterator<Item = &'a str> + 'a {
        sample.locations.iter().flat_map(move |&l| {
            let lines = self.locations.get(l).map_or(&[][..], |loc| &loc.lines[..]);
            let unknown = lines.is_empty().then_some("??");
            lines.iter().map(|line| &*line.function).chain(unknown)
        })
    }

    /// The share of all samples (0.0 to 1.0) whose stack contains a function whose name
    /// contains `needle`; a stack counts once however often it contains it.
    pub fn share_of(&self, needle: &str) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        let hit: u64 = self
            .samples
            .iter()
            .filter(|s| self.function_names(s).any(|f| f.contains(needle)))
            .fold(0u64, |hit, s| hit.saturating_add(s.count));
        hit as f64 / total as f64
    }

    /// The frame names of one sample for the folded and flame-graph outputs, outermost first:
    /// the thread name, `[truncated: reason]` when the walk stopped early, then every function
    /// (inlined ones as frames of their own); an unknown frame shows as `obj+0x...` or
    /// `0x...`. Semicolons in names are replaced by `:` (they separate frames).
    pub fn folded_frames(&self, sample: &Sample) -> Vec<String> {
        let mut out = Vec::with_capacity(sample.locations.len() + 2);
        out.push(clean(&sample.thread_name));
        if let Some(t) = sample.truncation {
            out.push(format!("[truncated: {}]", t.reason.as_str()));
        }
        for &l in sample.locations.iter().rev() {
            // An index past the locations (a profile built by hand): an unknown frame.
            let Some(loc) = self.locations.get(l) else {
                out.push("??".to_owned());
                continue;
            };
            if loc.lines.is_empty() {
                // `obj+0x...` with the address in the file's terms (what addr2line takes).
                let in_file = loc
                    .mapping
                    .and_then(|m| self.mappings.get(m))
                    .and_then(|m| {
                        let off = loc.address.checked_sub(m.start)? as u64;
                        Some((m, off.checked_add(m.file_offset)?))
                    });
                out.push(match in_file {
                    Some((m, off)) => {
                        format!("{}+{off:#x}", crate::modules::short_name(&m.path))
                    }
                    None => format!("{:#x}", loc.address),
                });
                continue;
            }
            for line in loc.lines.iter().rev() {
                out.push(clean(&line.function));
            }
        }
        out
    }

    /// Brendan Gregg's folded-stack format, one line per distinct stack: frames from the
    /// outermost (the thread's name) to the innermost separated by `;`, a space, the count.
    /// What `flamegraph.pl`, inferno and speedscope read.
    pub fn folded(&self) -> String {
        let mut lines: Vec<(String, u64)> = Vec::with_capacity(self.samples.len());
        for s in &self.samples {
            lines.push((self.folded_frames(s).join(";"), s.count));
        }
        lines.sort();
        // Two samples can fold to the same line (same names at different addresses).
        let mut out = String::new();
        let mut i = 0;
        while i < lines.len() {
            let mut count = lines[i].1;
            let mut j = i + 1;
            while j < lines.len() && lines[j].0 == lines[i].0 {
                count = count.saturating_add(lines[j].1);
                j += 1;
            }
            let _ = writeln!(out, "{} {count}", lines[i].0);
            i = j;
        }
        out
    }
}

/// A frame name fit for the folded format: no `;` (the separator) and no line breaks.
fn clean(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}
