//! Parsing the text of a tracefs `trace` file: generic records, and trace-marker events.

/// One event line of a tracefs `trace` file, borrowed from the text.
///
/// The default line format is
/// `TASK-TID (TGID) [CPU] FLAGS TIMESTAMP: EVENT: BODY`, where the `(TGID)` column appears only
/// with `options/record-tgid` and the `FLAGS` column only with `options/irq-info` (on by
/// default). Examples:
///
/// ```text
///            <...>-4878    [000] ...1.   214.802179: tracing_mark_write: B|4878|frame 1
///             demo-4901    [001] d..2.   215.000012: my_probe: (0x55d0c0a3d123) arg1=5
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The task's command name (`comm`), or `<...>` when the kernel did not save it.
    pub task: &'a str,
    /// The thread id (the kernel's "pid") that recorded the event.
    pub tid: u32,
    /// The thread group id (process id), when `options/record-tgid` is on and it was known.
    pub tgid: Option<u32>,
    /// The CPU the event was recorded on.
    pub cpu: u32,
    /// The latency flags column (`d..2.`), when `options/irq-info` is on.
    pub flags: Option<&'a str>,
    /// The timestamp in nanoseconds for the `secs.micros` clocks (`local`, `global`, `mono`,
    /// `boot`...); the raw count for counter clocks (`counter`, `x86-tsc`).
    pub timestamp_ns: u64,
    /// The event name (`tracing_mark_write`, a uprobe's event name, `sched_switch`...).
    pub event: &'a str,
    /// Everything after `EVENT: `.
    pub body: &'a str,
}

/// Parses one line of a `trace` file; `None` for comment, blank or unrecognised lines.
pub fn parse_record(line: &str) -> Option<Record<'_>> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.trim_start().starts_with('#') || line.trim().is_empty() {
        return None;
    }
    // The CPU column: the first " [digits]".
    let bytes = line.as_bytes();
    let mut cpu_at = None;
    let mut i = 0;
    while let Some(off) = line[i..].find(" [") {
        let open = i + off + 1;
        let digits = bytes[open + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits > 0 && bytes.get(open + 1 + digits) == Some(&b']') {
            cpu_at = Some((open, open + 1 + digits));
            break;
        }
        i = open;
    }
    let (open, close) = cpu_at?;
    let cpu: u32 = line[open + 1..close].parse().ok()?;

    let mut head = line[..open].trim();
    let mut tgid = None;
    if head.ends_with(')') {
        let p = head.rfind('(')?;
        tgid = head[p + 1..head.len() - 1].trim().parse().ok();
        head = head[..p].trim_end();
    }
    let (task, tid) = head.rsplit_once('-')?;
    let tid: u32 = tid.parse().ok()?;

    let mut rest = line[close + 1..].trim_start();
    let mut flags = None;
    let (first, after) = rest.split_once(' ')?;
    let timestamp_ns = match parse_timestamp(first) {
        Some(ts) => {
            rest = after;
            ts
        }
        None => {
            flags = Some(first);
            let after = after.trim_start();
            let (ts, after) = after.split_once(' ').unwrap_or((after, ""));
            rest = after;
            parse_timestamp(ts)?
        }
    };
    let rest = rest.trim_start();
    let (event, body) = match rest.split_once(": ") {
        Some((e, b)) => (e, b),
        None => (rest.trim_end_matches(':'), ""),
    };
    Some(Record {
        task: task.trim(),
        tid,
        tgid,
        cpu,
        flags,
        timestamp_ns,
        event,
        body,
    })
}

/// `214.802179:` -> nanoseconds; `123456:` (counter clocks) -> the count.
fn parse_timestamp(s: &str) -> Option<u64> {
    let s = s.strip_suffix(':')?;
    match s.split_once('.') {
        Some((secs, frac)) => {
            if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let secs: u64 = secs.parse().ok()?;
            let mut ns: u64 = frac.parse().ok()?;
            for _ in frac.len()..9 {
                ns *= 10;
            }
            secs.checked_mul(1_000_000_000)?.checked_add(ns)
        }
        None => s.parse().ok(),
    }
}

/// Every event line of a `trace` file's text, in order. Lines in no known layout are left out:
/// [`unparsed`] counts them.
pub fn records(text: &str) -> impl Iterator<Item = Record<'_>> {
    text.lines().filter_map(parse_record)
}

/// The kind of a trace-marker line, named after its first letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MarkerKind {
    /// `B|pid|name`: a section begins on the writing thread.
    Begin,
    /// `E|pid`: the writing thread's innermost section ends.
    End,
    /// `S|pid|name|cookie`: an async section begins.
    AsyncBegin,
    /// `F|pid|name|cookie`: an async section ends.
    AsyncEnd,
    /// `G|pid|track|name|cookie`: an async section begins on a named track.
    TrackBegin,
    /// `H|pid|track|cookie`: an async section on a named track ends.
    TrackEnd,
    /// `I|pid|name`: an instant event on the writing thread.
    Instant,
    /// `N|pid|track|name`: an instant event on a named track.
    TrackInstant,
    /// `C|pid|name|value`: a counter's new value.
    Counter,
}

impl MarkerKind {
    /// The line's first letter.
    pub fn letter(self) -> char {
        match self {
            MarkerKind::Begin => 'B',
            MarkerKind::End => 'E',
            MarkerKind::AsyncBegin => 'S',
            MarkerKind::AsyncEnd => 'F',
            MarkerKind::TrackBegin => 'G',
            MarkerKind::TrackEnd => 'H',
            MarkerKind::Instant => 'I',
            MarkerKind::TrackInstant => 'N',
            MarkerKind::Counter => 'C',
        }
    }

    /// The kind for a line's first letter.
    pub fn from_letter(c: char) -> Option<MarkerKind> {
        Some(match c {
            'B' => MarkerKind::Begin,
            'E' => MarkerKind::End,
            'S' => MarkerKind::AsyncBegin,
            'F' => MarkerKind::AsyncEnd,
            'G' => MarkerKind::TrackBegin,
            'H' => MarkerKind::TrackEnd,
            'I' => MarkerKind::Instant,
            'N' => MarkerKind::TrackInstant,
            'C' => MarkerKind::Counter,
            _ => return None,
        })
    }
}

/// A trace-marker line read back from the kernel, with the record's context.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MarkerEvent {
    /// Timestamp, as in [`Record::timestamp_ns`].
    pub timestamp_ns: u64,
    /// The pid written in the line (the writer's process id), if the line has one.
    pub pid: Option<u32>,
    /// The thread that wrote the marker (from the kernel's record).
    pub tid: u32,
    /// The CPU it was written on.
    pub cpu: u32,
    /// Which line of the grammar it is.
    pub kind: MarkerKind,
    /// The section, counter or instant name; empty for `E` and `H`.
    pub name: String,
    /// The track of `G`, `H` and `N` lines.
    pub track: Option<String>,
    /// The cookie of `S`, `F`, `G`, `H`, or the value of `C`.
    pub value: Option<i64>,
    /// The marker text exactly as written (`B|4878|frame 1`).
    pub text: String,
}

impl MarkerEvent {
    /// A marker event from a record of event `tracing_mark_write`; `None` for other events and
    /// for marker text that is not in the grammar.
    pub fn from_record(r: &Record<'_>) -> Option<MarkerEvent> {
        if r.event != "tracing_mark_write" {
            return None;
        }
        let text = r.body.trim_end_matches(['\n', ' ']);
        let (kind, pid, track, name, value) = parse_marker(text)?;
        Some(MarkerEvent {
            timestamp_ns: r.timestamp_ns,
            pid,
            tid: r.tid,
            cpu: r.cpu,
            kind,
            name: name.to_owned(),
            track: track.map(str::to_owned),
            value,
            text: text.to_owned(),
        })
    }
}

/// The parts of a marker line: kind, pid, track, name, cookie or value.
pub type MarkerParts<'a> = (
    MarkerKind,
    Option<u32>,
    Option<&'a str>,
    &'a str,
    Option<i64>,
);

/// Parses marker text (`S|123|load|7`) into its parts; `None` if it is not in the grammar.
pub fn parse_marker(text: &str) -> Option<MarkerParts<'_>> {
    let mut chars = text.chars();
    let kind = MarkerKind::from_letter(chars.next()?)?;
    let rest = chars.as_str();
    if rest.is_empty() {
        return (kind == MarkerKind::End).then_some((kind, None, None, "", None));
    }
    let rest = rest.strip_prefix('|')?;
    let (pid, rest) = match rest.split_once('|') {
        Some((p, r)) => (p, Some(r)),
        None => (rest, None),
    };
    let pid: Option<u32> = Some(pid.parse().ok()?);
    let int = |s: &str| s.parse::<i64>().ok();
    Some(match kind {
        MarkerKind::End => (kind, pid, None, "", None),
        MarkerKind::Begin | MarkerKind::Instant => (kind, pid, None, rest?, None),
        MarkerKind::AsyncBegin | MarkerKind::AsyncEnd | MarkerKind::Counter => {
            let (name, v) = rest?.rsplit_once('|')?;
            (kind, pid, None, name, Some(int(v)?))
        }
        MarkerKind::TrackBegin => {
            let (track, rest) = rest?.split_once('|')?;
            let (name, v) = rest.rsplit_once('|')?;
            (kind, pid, Some(track), name, Some(int(v)?))
        }
        MarkerKind::TrackEnd => {
            let (track, v) = rest?.rsplit_once('|')?;
            (kind, pid, Some(track), "", Some(int(v)?))
        }
        MarkerKind::TrackInstant => {
            let (track, name) = rest?.split_once('|')?;
            (kind, pid, Some(track), name, None)
        }
    })
}

/// What [`records`] and [`markers`] leave out of a `trace` file's text, counted (nothing is left
/// out silently): comments (`#`), blank lines and the kernel's `CPU:N [LOST M EVENTS]` notices
/// (counted by [`Instance::dropped_events`](super::Instance::dropped_events)) are not counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unparsed {
    /// Lines that are not event records in any layout [`parse_record`] knows.
    pub lines: usize,
    /// `tracing_mark_write` records whose text is not in the marker grammar (written by a
    /// program with a wrong format, or cut by the kernel).
    pub markers: usize,
    /// The first line counted, for a message.
    pub first: Option<String>,
}

impl Unparsed {
    /// Whether nothing was left out.
    pub fn is_empty(&self) -> bool {
        self.lines == 0 && self.markers == 0
    }
}

impl std::fmt::Display for Unparsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} lines not in the trace format, {} marker texts not in the marker grammar",
            self.lines, self.markers
        )?;
        if let Some(first) = &self.first {
            write!(f, " (first: {first:?})")?;
        }
        Ok(())
    }
}

/// Whether `line` is the kernel's notice of lost events (`CPU:3 [LOST 120 EVENTS]`).
fn is_lost_notice(line: &str) -> bool {
    line.trim_start()
        .strip_prefix("CPU:")
        .and_then(|r| r.split_once(' '))
        .is_some_and(|(cpu, rest)| {
            cpu.bytes().all(|b| b.is_ascii_digit())
                && rest.starts_with("[LOST ")
                && rest.trim_end().ends_with("EVENTS]")
        })
}

/// Counts what [`records`] and [`markers`] leave out of `text`.
pub fn unparsed(text: &str) -> Unparsed {
    let mut u = Unparsed::default();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || is_lost_notice(line) {
            continue;
        }
        let bad = match parse_record(line) {
            None => {
                u.lines += 1;
                true
            }
            Some(r)
                if r.event == "tracing_mark_write" && MarkerEvent::from_record(&r).is_none() =>
            {
                u.markers += 1;
                true
            }
            Some(_) => false,
        };
        if bad && u.first.is_none() {
            u.first = Some(line.to_owned());
        }
    }
    u
}

/// Every trace-marker event in a `trace` file's text, in order. Marker lines whose text is not
/// in the grammar are left out: [`unparsed`] counts them.
pub fn markers(text: &str) -> Vec<MarkerEvent> {
    records(text)
        .filter_map(|r| MarkerEvent::from_record(&r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_in_all_layouts() {
        let r = parse_record(
            "           <...>-4878    [000] ...1.   214.802179: tracing_mark_write: B|123|hello world",
        )
        .unwrap();
        assert_eq!(r.task, "<...>");
        assert_eq!((r.tid, r.tgid, r.cpu), (4878, None, 0));
        assert_eq!(r.flags, Some("...1."));
        assert_eq!(r.timestamp_ns, 214_802_179_000);
        assert_eq!(
            (r.event, r.body),
            ("tracing_mark_write", "B|123|hello world")
        );

        let r = parse_record(
            "  my-task name-12 (    10) [001] d..2. 5.000000001: probe_x: (0x55d0c0a3d123) arg1=5",
        )
        .unwrap();
        assert_eq!(
            (r.task, r.tid, r.tgid, r.cpu),
            ("my-task name", 12, Some(10), 1)
        );
        assert_eq!(r.timestamp_ns, 5_000_000_001);
        assert_eq!((r.event, r.body), ("probe_x", "(0x55d0c0a3d123) arg1=5"));

        let r = parse_record("  bash-7 (-------) [003] 17: sched_waking: comm=x pid=1").unwrap();
        assert_eq!((r.tid, r.tgid, r.cpu, r.flags), (7, None, 3, None));
        assert_eq!(r.timestamp_ns, 17);
        assert_eq!(r.event, "sched_waking");

        assert!(parse_record("# tracer: nop").is_none());
        assert!(parse_record("").is_none());
        assert!(parse_record("garbage line").is_none());
    }

    #[test]
    fn what_is_left_out_is_counted() {
        let text = "# tracer: nop\n\
            #\n\
            \n\
            CPU:1 [LOST 120 EVENTS]\n\
            \x20 a-1 [000] ...1. 1.000001: tracing_mark_write: B|1|ok\n\
            \x20 a-1 [000] ...1. 1.000002: tracing_mark_write: Q|1|not a marker\n\
            \x20 a-1 [000] ...1. 1.000003: sched_waking: comm=x pid=1\n\
            garbage line\n\
            \x20 a-1 [000] ...1. 1.000004: tracing_mark_write: C|1|n|not a number\n";
        assert_eq!(markers(text).len(), 1);
        assert_eq!(records(text).count(), 4);
        let u = unparsed(text);
        assert_eq!((u.lines, u.markers), (1, 2));
        assert_eq!(
            u.first.as_deref(),
            Some("  a-1 [000] ...1. 1.000002: tracing_mark_write: Q|1|not a marker")
        );
        assert!(!u.is_empty());
        assert!(unparsed("# only\nCPU:0 [LOST 3 EVENTS]\n").is_empty());
    }

    #[test]
    fn marker_grammar() {
        use MarkerKind::*;
        assert_eq!(
            parse_marker("B|1|a|b"),
            Some((Begin, Some(1), None, "a|b", None))
        );
        assert_eq!(parse_marker("E|1"), Some((End, Some(1), None, "", None)));
        assert_eq!(parse_marker("E"), Some((End, None, None, "", None)));
        assert_eq!(
            parse_marker("S|1|n|-5"),
            Some((AsyncBegin, Some(1), None, "n", Some(-5)))
        );
        assert_eq!(
            parse_marker("F|1|n|5"),
            Some((AsyncEnd, Some(1), None, "n", Some(5)))
        );
        assert_eq!(
            parse_marker("G|1|t|n|5"),
            Some((TrackBegin, Some(1), Some("t"), "n", Some(5)))
        );
        assert_eq!(
            parse_marker("H|1|t|5"),
            Some((TrackEnd, Some(1), Some("t"), "", Some(5)))
        );
        assert_eq!(
            parse_marker("I|1|n"),
            Some((Instant, Some(1), None, "n", None))
        );
        assert_eq!(
            parse_marker("N|1|t|n"),
            Some((TrackInstant, Some(1), Some("t"), "n", None))
        );
        assert_eq!(
            parse_marker("C|1|c|99"),
            Some((Counter, Some(1), None, "c", Some(99)))
        );
        assert_eq!(parse_marker("C|1|c|1.5"), None);
        assert_eq!(parse_marker("X|1|c"), None);
        assert_eq!(parse_marker("B|x|c"), None);
    }
}
