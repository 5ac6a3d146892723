//! Comparing two stacks of the same sample (selftrace's and libunwind's, both from one
//! signal handler's `ucontext_t`): the verdicts of tests/unwind_diff.rs, and the CFA rules at
//! the sampled pcs (readelf) that show which samples hit the hard cases.

use super::cfa;
use super::fixtures::{ends_at_root, name_of};
use super::libunwind::End;
use std::collections::HashMap;

/// One sample: selftrace's frames, libunwind's, and how libunwind's walk ended.
#[derive(Clone)]
pub struct Sample {
    pub st: Vec<usize>,
    pub lu: Vec<usize>,
    pub lu_end: End,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Verdict {
    Identical,
    /// libunwind's stack is a prefix of selftrace's, which ends at a thread root.
    LongerToRoot,
    /// libunwind looks wrong here: it stops early or goes astray where selftrace continues
    /// with plausible frames to a thread root.
    LibunwindAtFault,
    /// selftrace stopped early, or went astray where libunwind continued plausibly.
    SelftraceAtFault,
    /// Both end plausibly, but selftrace's frames are libunwind's with some left out: it
    /// skipped real frames (silently wrong).
    SelftraceSkipped,
    /// Both end plausibly, but libunwind's frames are selftrace's with some left out.
    LibunwindSkipped,
    /// Both continue plausibly but differently.
    Unclear,
    /// selftrace reports a return address outside every loaded object: a silently wrong
    /// frame, whatever libunwind says.
    SelftraceGarbage,
    /// libunwind reports a frame outside every loaded object (wrong CFI in the leaf, e.g.
    /// glibc's `__mpn_addmul_1`), and selftrace agrees up to there and stops before it.
    TruncatedAtBadCfi,
}

/// Every frame from `from` on lies in a loaded object and the walk ends at a thread root.
pub fn plausible(frames: &[usize], from: usize) -> bool {
    frames
        .iter()
        .skip(from)
        .all(|&a| selftrace::symbolize(a.wrapping_sub(1)).is_some())
        && ends_at_root(frames)
}

/// The first frame (after frame 0) whose return address lies outside every loaded object.
pub fn first_garbage(frames: &[usize]) -> Option<usize> {
    frames
        .iter()
        .skip(1)
        .position(|&a| selftrace::symbolize(a.wrapping_sub(1)).is_none())
        .map(|i| i + 1)
}

pub fn classify(s: &Sample) -> Verdict {
    if first_garbage(&s.st).is_some() {
        return Verdict::SelftraceGarbage;
    }
    let k = s.st.iter().zip(&s.lu).take_while(|(a, b)| a == b).count();
    if first_garbage(&s.lu).is_some_and(|g| g == k && k == s.st.len()) {
        return Verdict::TruncatedAtBadCfi;
    }
    if s.st == s.lu {
        return Verdict::Identical;
    }
    if k == s.lu.len() {
        // selftrace longer.
        return if ends_at_root(&s.st) {
            Verdict::LongerToRoot
        } else {
            Verdict::SelftraceAtFault
        };
    }
    if k == s.st.len() {
        // selftrace shorter: it stopped where libunwind went on.
        return if plausible(&s.lu, k) {
            Verdict::SelftraceAtFault
        } else {
            Verdict::Unclear
        };
    }
    match (plausible(&s.st, k), plausible(&s.lu, k)) {
        (true, false) => Verdict::LibunwindAtFault,
        (false, true) => Verdict::SelftraceAtFault,
        _ if is_subsequence(&s.st, &s.lu) => Verdict::SelftraceSkipped,
        _ if is_subsequence(&s.lu, &s.st) => Verdict::LibunwindSkipped,
        _ => Verdict::Unclear,
    }
}

/// Whether `short` is `long` with some frames left out (order kept).
pub fn is_subsequence(short: &[usize], long: &[usize]) -> bool {
    let mut it = long.iter();
    short.iter().all(|a| it.any(|b| b == a))
}

pub fn agrees(v: Verdict) -> bool {
    matches!(
        v,
        Verdict::Identical | Verdict::LongerToRoot | Verdict::TruncatedAtBadCfi
    )
}

pub fn describe(frames: &[usize]) -> String {
    let mut s = String::new();
    for (i, &a) in frames.iter().enumerate() {
        let (n, o) = name_of(if i == 0 { a } else { a.wrapping_sub(1) });
        s += &format!("      #{i:<2} {a:#014x} {n} ({o})\n");
    }
    s
}

pub fn in_object(addr: usize, needle: &str) -> bool {
    selftrace::symbolize(addr).is_some_and(|s| s.path.contains(needle))
}

/// CFA rules per object path, from readelf (for the report: how many samples need a rule
/// beyond rsp/rbp + offset).
#[derive(Default)]
pub struct Rules(HashMap<&'static str, Option<cfa::CfaTable>>);

impl Rules {
    fn hard(&mut self, addr: usize) -> bool {
        let Some(s) = selftrace::symbolize(addr) else {
            return false;
        };
        let exe;
        let path = if s.path.is_empty() {
            exe = std::env::current_exe().unwrap_or_default();
            exe.to_str().unwrap_or("")
        } else if s.path.starts_with('/') {
            s.path
        } else {
            return false; // the vDSO
        };
        let table = self
            .0
            .entry(s.path)
            .or_insert_with(|| cfa::CfaTable::load(std::path::Path::new(path)).ok());
        table
            .as_ref()
            .and_then(|t| t.rule_at(s.object_offset() as u64))
            .is_some_and(cfa::is_hard)
    }

    /// Whether frame 0, or any later frame (at its return address - 1), of libunwind's stack
    /// sits where the CFA rule is hard.
    pub fn hard_frames(&mut self, s: &Sample) -> (bool, bool) {
        let first = s.st.first().is_some_and(|&a| self.hard(a));
        let any = first || s.lu.iter().skip(1).any(|&a| self.hard(a.wrapping_sub(1)));
        (first, any)
    }
}
