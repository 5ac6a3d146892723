//! What a recording holds: the recorded process tree, the trace lines that belong to it, the
//! sections (with durations) and the probe hits, and the summary table.

use selftrace::tracefs::{parse_record, EventInfo, EventKind, MarkerEvent, MarkerKind, Record};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The value of `key=` in an event body such as sched_switch's
/// `prev_comm=a b prev_pid=12 ... next_pid=13`.
pub fn field<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("{key}=");
    let mut from = 0;
    while let Some(i) = body[from..].find(&pat) {
        let at = from + i;
        if at == 0 || body.as_bytes()[at - 1] == b' ' {
            let v = &body[at + pat.len()..];
            return Some(v.split(' ').next().unwrap_or(v));
        }
        from = at + pat.len();
    }
    None
}

/// The tasks of the tree rooted at `root`: `root` and every task (process or thread) created
/// by a task of the tree, from the `sched_process_fork` records in trace order.
pub fn process_tree(text: &str, root: u32) -> HashSet<u32> {
    let mut tree = HashSet::from([root]);
    for r in text.lines().filter_map(parse_record) {
        if r.event != "sched_process_fork" {
            continue;
        }
        let parent = field(r.body, "pid").and_then(|p| p.parse().ok());
        let child = field(r.body, "child_pid").and_then(|p| p.parse().ok());
        if let (Some(p), Some(c)) = (parent, child) {
            if tree.contains(&p) || tree.contains(&r.tid) {
                tree.insert(c);
            }
        }
    }
    tree
}

/// Whether the record belongs to the tasks `tree`: recorded by one of them, or a
/// `sched_switch` from or to one of them.
pub fn belongs(r: &Record<'_>, tree: &HashSet<u32>) -> bool {
    if r.event == "sched_switch" {
        let pid = |k| field(r.body, k).and_then(|p| p.parse::<u32>().ok());
        return [pid("prev_pid"), pid("next_pid")]
            .iter()
            .any(|p| p.is_some_and(|p| tree.contains(&p)));
    }
    tree.contains(&r.tid) || r.tgid.is_some_and(|p| tree.contains(&p))
}

/// The `trace` text reduced to its header comments and the lines of the tasks `tree`.
pub fn filter_trace(text: &str, tree: &HashSet<u32>) -> String {
    let mut out = String::with_capacity(text.len() / 2);
    for line in text.lines() {
        let keep = match parse_record(line) {
            Some(r) => belongs(&r, tree),
            None => line.starts_with('#'),
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A section: a `B`/`E` pair on one thread, or an async `S`/`F` (`G`/`H`) pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// Its name.
    pub name: String,
    /// Process and thread that began it.
    pub pid: u32,
    /// The thread that began it.
    pub tid: u32,
    /// Begin timestamp.
    pub start_ns: u64,
    /// Duration; `None` when the end was not recorded.
    pub dur_ns: Option<u64>,
    /// Whether it is an async section.
    pub is_async: bool,
}

/// The sections of the marker events (in trace order).
pub fn sections(markers: &[MarkerEvent]) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let mut stacks: HashMap<u32, Vec<usize>> = HashMap::new();
    let mut open_async: HashMap<(u32, Option<String>, String, i64), usize> = HashMap::new();
    let mut track_names: HashMap<(u32, String, i64), usize> = HashMap::new();
    for m in markers {
        let pid = m.pid.unwrap_or(m.tid);
        let begin = |is_async| Section {
            name: m.name.clone(),
            pid,
            tid: m.tid,
            start_ns: m.timestamp_ns,
            dur_ns: None,
            is_async,
        };
        let close = |out: &mut Vec<Section>, i: usize| {
            let s: &mut Section = &mut out[i];
            s.dur_ns = Some(m.timestamp_ns.saturating_sub(s.start_ns));
        };
        match m.kind {
            MarkerKind::Begin => {
                stacks.entry(m.tid).or_default().push(out.len());
                out.push(begin(false));
            }
            MarkerKind::End => {
                if let Some(i) = stacks.get_mut(&m.tid).and_then(Vec::pop) {
                    close(&mut out, i);
                }
            }
            MarkerKind::AsyncBegin => {
                let key = (pid, None, m.name.clone(), m.value.unwrap_or(0));
                open_async.insert(key, out.len());
                out.push(begin(true));
            }
            MarkerKind::AsyncEnd => {
                let key = (pid, None, m.name.clone(), m.value.unwrap_or(0));
                if let Some(i) = open_async.remove(&key) {
                    close(&mut out, i);
                }
            }
            MarkerKind::TrackBegin => {
                let key = (
                    pid,
                    m.track.clone().unwrap_or_default(),
                    m.value.unwrap_or(0),
                );
                track_names.insert(key, out.len());
                out.push(begin(true));
            }
            MarkerKind::TrackEnd => {
                let key = (
                    pid,
                    m.track.clone().unwrap_or_default(),
                    m.value.unwrap_or(0),
                );
                if let Some(i) = track_names.remove(&key) {
                    close(&mut out, i);
                }
            }
            _ => {}
        }
    }
    out
}

/// The functions recorded at entry and at return: entry event name -> return event name.
pub fn function_pairs(events: &[EventInfo]) -> HashMap<String, String> {
    let mut pairs = HashMap::new();
    for entry in events.iter().filter(|e| e.kind == EventKind::Entry) {
        if let Some(ret) = events.iter().find(|r| {
            r.kind == EventKind::Return && r.path == entry.path && r.offset == entry.offset
        }) {
            pairs.insert(entry.event.clone(), ret.event.clone());
        }
    }
    pairs
}

/// The calls of the functions recorded at entry and return (see [`function_pairs`]): per
/// thread, each return closes the innermost open call. Named `label()`.
pub fn function_calls(text: &str, events: &[EventInfo]) -> Vec<Section> {
    let pairs = function_pairs(events);
    let returns: HashMap<&str, &str> = pairs
        .iter()
        .map(|(e, r)| (r.as_str(), e.as_str()))
        .collect();
    let label = |ev: &str| {
        events
            .iter()
            .find(|e| e.event == ev)
            .map(|e| e.label.clone())
    };
    let mut out: Vec<Section> = Vec::new();
    let mut stacks: HashMap<(u32, &str), Vec<usize>> = HashMap::new();
    for r in text.lines().filter_map(parse_record) {
        if let Some(entry) = pairs.get_key_value(r.event).map(|(k, _)| k.as_str()) {
            stacks.entry((r.tid, entry)).or_default().push(out.len());
            out.push(Section {
                name: format!("{}()", label(entry).unwrap_or_default()),
                pid: r.tgid.unwrap_or(r.tid),
                tid: r.tid,
                start_ns: r.timestamp_ns,
                dur_ns: None,
                is_async: false,
            });
        } else if let Some(entry) = returns.get(r.event) {
            if let Some(i) = stacks.get_mut(&(r.tid, *entry)).and_then(Vec::pop) {
                out[i].dur_ns = Some(r.timestamp_ns.saturating_sub(out[i].start_ns));
            }
        }
    }
    out
}

/// Count, total, mean, p50 and p99 of a set of durations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// How many.
    pub count: usize,
    /// Sum.
    pub total: u64,
    /// Mean.
    pub mean: u64,
    /// Median (nearest rank).
    pub p50: u64,
    /// 99th percentile (nearest rank).
    pub p99: u64,
}

/// Stats of `durations` (nearest-rank percentiles); `None` when empty.
pub fn stats(durations: &mut [u64]) -> Option<Stats> {
    if durations.is_empty() {
        return None;
    }
    durations.sort_unstable();
    let n = durations.len();
    let rank = |q: f64| durations[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    let total: u64 = durations.iter().sum();
    Some(Stats {
        count: n,
        total,
        mean: total / n as u64,
        p50: rank(0.50),
        p99: rank(0.99),
    })
}

/// Per section name: the stats of the completed sections, and how many were left open.
pub fn section_stats(sections: &[Section]) -> BTreeMap<String, (Option<Stats>, usize)> {
    let mut by_name: BTreeMap<String, (Vec<u64>, usize)> = BTreeMap::new();
    for s in sections {
        let e = by_name.entry(s.name.clone()).or_default();
        match s.dur_ns {
            Some(d) => e.0.push(d),
            None => e.1 += 1,
        }
    }
    by_name
        .into_iter()
        .map(|(k, (mut d, open))| (k, (stats(&mut d), open)))
        .collect()
}

/// `890 ns`, `56.7 us`, `1.234 ms`, `2.500 s`.
pub fn duration(ns: u64) -> String {
    match ns {
        0..=999 => format!("{ns} ns"),
        1_000..=999_999 => format!("{:.1} us", ns as f64 / 1e3),
        1_000_000..=9_999_999_999 => format!("{:.3} ms", ns as f64 / 1e6),
        _ => format!("{:.3} s", ns as f64 / 1e9),
    }
}

/// The summary table: sections (count, total, mean, p50, p99) and hits per probe.
pub fn summary(sections: &[Section], hits: &BTreeMap<String, usize>) -> String {
    let mut out = String::new();
    let table = section_stats(sections);
    let w = table
        .keys()
        .chain(hits.keys())
        .map(|k| k.chars().count())
        .max()
        .unwrap_or(0);
    let w = w.clamp(7, 48);
    if table.is_empty() {
        out.push_str("no sections recorded\n");
    } else {
        out.push_str(&format!(
            "{:<w$} {:>6} {:>12} {:>12} {:>12} {:>12}\n",
            "section", "count", "total", "mean", "p50", "p99"
        ));
        for (name, (st, open)) in &table {
            let shown: String = name.chars().take(48).collect();
            match st {
                Some(s) => out.push_str(&format!(
                    "{shown:<w$} {:>6} {:>12} {:>12} {:>12} {:>12}",
                    s.count,
                    duration(s.total),
                    duration(s.mean),
                    duration(s.p50),
                    duration(s.p99)
                )),
                None => out.push_str(&format!("{shown:<w$} {:>6}", 0)),
            }
            if *open > 0 {
                out.push_str(&format!("  ({open} not ended)"));
            }
            out.push('\n');
        }
    }
    if hits.is_empty() {
        out.push_str("no probe hits recorded\n");
    } else {
        out.push_str(&format!("{:<w$} {:>6}\n", "probe", "hits"));
        for (name, n) in hits {
            out.push_str(&format!("{name:<w$} {n:>6}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use selftrace::tracefs::markers;

    const TRACE: &str = "\
# tracer: nop
       selftrace-100     (  100) [000] ..... 10.000000: sched_process_fork: comm=selftrace pid=100 child_comm=selftrace child_pid=200
       other-50     (   50) [001] ..... 10.000001: sched_process_fork: comm=other pid=50 child_comm=other child_pid=51
       app-200     (  200) [000] ..... 10.000010: sched_process_fork: comm=app pid=200 child_comm=app child_pid=201
       app-200     (  200) [000] ..... 10.000100: tracing_mark_write: B|200|outer
       app-201     (  200) [001] ..... 10.000150: tracing_mark_write: S|200|load|7
       app-200     (  200) [000] ..... 10.000200: tracing_mark_write: B|200|inner
       other-50     (   50) [001] ..... 10.000250: tracing_mark_write: B|50|foreign
       app-200     (  200) [000] ..... 10.000300: tracing_mark_write: E|200
       app-200     (  200) [000] ..... 10.001100: tracing_mark_write: E|200
       app-201     (  200) [001] ..... 10.002150: tracing_mark_write: F|200|load|7
       <idle>-0     (    0) [000] d..2. 10.003000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=app next_pid=200 next_prio=120
";

    #[test]
    fn tree_filter_sections() {
        let tree = process_tree(TRACE, 200);
        assert_eq!(tree, HashSet::from([200, 201]));
        let kept = filter_trace(TRACE, &tree);
        assert!(kept.starts_with("# tracer: nop\n"));
        assert!(!kept.contains("foreign") && !kept.contains("other-50"));
        assert!(!kept.contains("selftrace-100"));
        assert!(kept.contains("sched_switch"));
        let secs = sections(&markers(&kept));
        let find = |n: &str| secs.iter().find(|s| s.name == n).unwrap().clone();
        assert_eq!(find("outer").dur_ns, Some(1_000_000));
        assert_eq!(find("inner").dur_ns, Some(100_000));
        assert_eq!(find("load").dur_ns, Some(2_000_000));
        assert!(find("load").is_async);
        let hits = BTreeMap::from([("rt:step".to_string(), 3)]);
        let s = summary(&secs, &hits);
        assert!(s.contains("outer"), "{s}");
        assert!(s.contains("rt:step"), "{s}");
    }

    #[test]
    fn percentiles() {
        let mut d: Vec<u64> = (1..=100).collect();
        let s = stats(&mut d).unwrap();
        assert_eq!(
            (s.count, s.total, s.mean, s.p50, s.p99),
            (100, 5050, 50, 50, 99)
        );
        let s = stats(&mut [7]).unwrap();
        assert_eq!((s.p50, s.p99), (7, 7));
        assert!(stats(&mut []).is_none());
        assert_eq!(duration(999), "999 ns");
        assert_eq!(duration(1500), "1.5 us");
        assert_eq!(duration(2_500_000), "2.500 ms");
        assert_eq!(duration(56_700), "56.7 us");
        assert_eq!(duration(25_000_000), "25.000 ms");
    }

    #[test]
    fn fields() {
        let b = "prev_comm=a b prev_pid=12 next_pid=13";
        assert_eq!(field(b, "prev_pid"), Some("12"));
        assert_eq!(field(b, "next_pid"), Some("13"));
        assert_eq!(field("comm=x pid=1 child_pid=2", "pid"), Some("1"));
        assert_eq!(field("comm=x pid=1 child_pid=2", "child_pid"), Some("2"));
    }
}
