//! The file:line text of a trace's frames: [`describe`] writes a frame's text (the physical
//! function's `at file:line:col`, then each function inlined into it), [`Lines`] hands the texts
//! of a trace to the report writers, [`OwnedLines`] resolves them in normal context.
//!
//! # Async-signal safety
//! [`Lines`] is read in signal handlers (no allocation); [`describe`] and [`OwnedLines`]
//! allocate and run in normal context or in the crash handler's symbolizer process.

use crate::symbolize::{self, BacktraceFrame};
use crate::unwind::FrameKinds;

/// file:line texts for the first frames of a trace (from the symbolizer process).
#[derive(Clone, Copy)]
pub(crate) struct Lines<'a> {
    pub(crate) text: &'a [u8],
    /// Frame indices, in the order of `spans`.
    pub(crate) indices: &'a [usize],
    pub(crate) spans: &'a [(u32, u32)],
}

/// [`Lines`] resolved in this process, in normal context (allocates): for the panic report
/// and the watchdog's, which do not run in a signal handler.
pub(crate) struct OwnedLines {
    text: Vec<u8>,
    indices: Vec<usize>,
    spans: Vec<(u32, u32)>,
}

impl OwnedLines {
    /// Resolves every frame of `frames` (file:line, inlined functions), of the kinds the walk
    /// recorded. Normal context only.
    #[cfg_attr(not(feature = "threads"), allow(dead_code))] // Used by thread dumps.
    pub(crate) fn resolve(frames: &[usize], kinds: FrameKinds) -> OwnedLines {
        let resolved: Vec<_> = (0..frames.len())
            .map(|i| symbolize::BacktraceFrame::resolve(frames[i], kinds.kind(frames, i)))
            .collect();
        OwnedLines::new(&resolved)
    }

    /// The texts of frames resolved already, frame `i` of a trace being `resolved[i]`.
    pub(crate) fn new(resolved: &[symbolize::BacktraceFrame]) -> OwnedLines {
        let mut text = Vec::new();
        let mut spans = Vec::new();
        let mut explained = Explained::default();
        for f in resolved {
            let t = describe(f, &mut explained);
            spans.push((text.len() as u32, t.len() as u32));
            text.extend_from_slice(t.as_bytes());
        }
        OwnedLines {
            text,
            indices: (0..resolved.len()).collect(),
            spans,
        }
    }

    /// As [`Lines`] for the report writers.
    pub(crate) fn lines(&self) -> Lines<'_> {
        Lines {
            text: &self.text,
            indices: &self.indices,
            spans: &self.spans,
        }
    }
}

impl<'a> Lines<'a> {
    pub(crate) const NONE: Lines<'static> = Lines {
        text: &[],
        indices: &[],
        spans: &[],
    };

    pub(super) fn get(&self, frame: usize) -> &'a [u8] {
        let Some(j) = self.indices.iter().position(|&i| i == frame) else {
            return &[];
        };
        let Some(&(start, len)) = self.spans.get(j) else {
            return &[];
        };
        self.text
            .get(start as usize..(start + len) as usize)
            .unwrap_or(&[])
    }
}

/// The objects whose missing debug info a report has explained already.
#[derive(Default)]
pub(crate) struct Explained(Vec<&'static str>);

impl Explained {
    /// Whether `object` is explained for the first time now (then it is recorded).
    fn first(&mut self, object: Option<&'static str>) -> bool {
        let key = object.unwrap_or("");
        if self.0.contains(&key) {
            return false;
        }
        self.0.push(key);
        true
    }
}

/// A frame's text, as [`report`](super) reads it: the first line is the physical
/// function's `at file:line:col` (or `(no file:line: why)`, or empty); then one line per
/// function inlined into it, innermost first, as `name` TAB `at file:line:col` (the location
/// left out where unknown). The physical function comes first so that a text cut short loses
/// inlined lines, never the physical one.
///
/// A frame in an object without debug info says so; the first such frame of each object in a
/// report (`explained` keeps which) also says what to do about it.
pub(crate) fn describe(f: &BacktraceFrame, explained: &mut Explained) -> String {
    use std::fmt::Write;
    let loc = |s: &crate::symbolize::BacktraceSymbol| match (&s.file, s.line) {
        (Some(file), Some(line)) => {
            let mut t = format!("{file}:{line}");
            if let Some(c) = s.column {
                let _ = write!(t, ":{c}");
            }
            Some(t)
        }
        _ => None,
    };
    let mut out = String::new();
    if let Some(phys) = f.symbols.last() {
        match (loc(phys), f.no_line) {
            (Some(l), _) => {
                let _ = write!(out, "at {l}");
            }
            (None, Some(why)) => {
                let _ = write!(out, "(no file:line: {why}");
                if why == crate::symbolize::NoLine::NoDebugInfo && explained.first(f.object) {
                    let _ = write!(
                        out,
                        ": build it with debug info (Rust: debug = \"line-tables-only\" in \
                         [profile.release], see docs/crash.md) or install its debug package"
                    );
                }
                out.push(')');
            }
            (None, None) => {}
        }
    }
    for s in f.symbols.iter().filter(|s| s.inlined) {
        // Names and paths never hold a newline or a tab that would split the record.
        let name = s.name.as_deref().unwrap_or("??").replace(['\n', '\t'], " ");
        match loc(s) {
            Some(l) => {
                let _ = write!(out, "\n{name}\tat {}", l.replace(['\n', '\t'], " "));
            }
            None => {
                let _ = write!(out, "\n{name}");
            }
        }
    }
    out
}
