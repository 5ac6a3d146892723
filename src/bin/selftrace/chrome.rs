//! The Chrome JSON trace format (`{"traceEvents": [...]}`), which chrome://tracing and Perfetto
//! open: `B`/`E` for sections, `b`/`e` for async sections, `i` for instants and probe hits
//! (with their arguments), `C` for counters, `M` for process and thread names.

use selftrace::tracefs::{parse_record, EventInfo, MarkerEvent, MarkerKind};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A probe argument as a JSON value: a number when it is a decimal integer, else a string.
fn json_value(v: &str) -> String {
    let digits = v.strip_prefix('-').unwrap_or(v);
    if !digits.is_empty() && digits.len() <= 20 && digits.bytes().all(|b| b.is_ascii_digit()) {
        // Integers as JSON numbers (a u64 above 2^53 loses precision in JavaScript viewers;
        // the text trace keeps the exact value).
        return v.trim_start_matches('+').to_string();
    }
    let unquoted = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v);
    json_string(unquoted)
}

/// The text of an argument that [`selftrace::tracefs::parse_hit_body`] decoded from fetched
/// bytes (`"a\\b\"c\x0a"`), with its escapes undone: the JSON string escapes it again, its
/// own way. Anything that is not such an escape is kept as it is.
fn unescape_decoded(v: &str) -> String {
    let Some(inner) = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
        return v.to_string();
    };
    let mut out = String::with_capacity(inner.len());
    let mut rest = inner;
    while let Some(p) = rest.find('\\') {
        out.push_str(&rest[..p]);
        let esc = &rest[p..];
        let hex = esc
            .get(2..4)
            .filter(|_| esc.as_bytes().get(1) == Some(&b'x'))
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .and_then(char::from_u32);
        let (c, len) = match (esc.as_bytes().get(1), hex) {
            (Some(b'\\'), _) => ('\\', 2),
            (Some(b'"'), _) => ('"', 2),
            (_, Some(c)) => (c, 4),
            _ => ('\\', 1),
        };
        out.push(c);
        rest = &esc[len..];
    }
    out.push_str(rest);
    out
}

/// Microseconds with nanosecond precision, as Chrome's `ts` wants.
fn ts(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// Builds the JSON document from the (already filtered) `trace` text: markers become sections,
/// async sections, instants and counters; hits of `events` become instants with their
/// arguments (category `probe` or `uprobe`).
pub fn chrome_json(text: &str, events: &[EventInfo]) -> String {
    let by_event: HashMap<&str, &EventInfo> =
        events.iter().map(|e| (e.event.as_str(), e)).collect();
    // Functions recorded at entry and return become slices (B at entry, E at return).
    let pairs = crate::analyze::function_pairs(events);
    let paired_returns: std::collections::HashSet<&str> =
        pairs.values().map(String::as_str).collect();
    let mut out = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    let mut first = true;
    let mut push = |out: &mut String, ev: String| {
        if !first {
            out.push_str(",\n");
        }
        first = false;
        out.push_str(&ev);
    };
    // (pid, tid) -> thread name; pid -> process name (the name of its main thread).
    let mut threads: BTreeMap<(u32, u32), String> = BTreeMap::new();
    let mut track_names: HashMap<(u32, String, i64), String> = HashMap::new();
    for r in text.lines().filter_map(parse_record) {
        let pid = r.tgid.unwrap_or(r.tid);
        let head = |ph: &str, name: &str| {
            format!(
                "{{\"ph\":\"{ph}\",\"name\":{},\"pid\":{pid},\"tid\":{},\"ts\":{}",
                json_string(name),
                r.tid,
                ts(r.timestamp_ns)
            )
        };
        if r.task != "<...>" && r.event != "sched_switch" {
            threads
                .entry((pid, r.tid))
                .or_insert_with(|| r.task.to_string());
        }
        if let Some(m) = MarkerEvent::from_record(&r) {
            let ev = match m.kind {
                MarkerKind::Begin => format!("{}}}", head("B", &m.name)),
                MarkerKind::End => format!("{}}}", head("E", "")),
                MarkerKind::AsyncBegin | MarkerKind::AsyncEnd => {
                    let ph = if m.kind == MarkerKind::AsyncBegin {
                        "b"
                    } else {
                        "e"
                    };
                    format!(
                        "{},\"cat\":\"async\",\"id\":\"{}\"}}",
                        head(ph, &m.name),
                        m.value.unwrap_or(0)
                    )
                }
                MarkerKind::TrackBegin | MarkerKind::TrackEnd => {
                    let track = m.track.clone().unwrap_or_default();
                    let key = (pid, track.clone(), m.value.unwrap_or(0));
                    let name = if m.kind == MarkerKind::TrackBegin {
                        track_names.insert(key, m.name.clone());
                        m.name.clone()
                    } else {
                        track_names.remove(&key).unwrap_or_default()
                    };
                    let ph = if m.kind == MarkerKind::TrackBegin {
                        "b"
                    } else {
                        "e"
                    };
                    format!(
                        "{},\"cat\":{},\"id\":\"{}\"}}",
                        head(ph, &name),
                        json_string(&track),
                        m.value.unwrap_or(0)
                    )
                }
                MarkerKind::Instant => format!("{},\"s\":\"t\"}}", head("i", &m.name)),
                MarkerKind::TrackInstant => format!(
                    "{},\"s\":\"p\",\"args\":{{\"track\":{}}}}}",
                    head("i", &m.name),
                    json_string(m.track.as_deref().unwrap_or(""))
                ),
                MarkerKind::Counter => format!(
                    "{},\"args\":{{\"value\":{}}}}}",
                    head("C", &m.name),
                    m.value.unwrap_or(0)
                ),
                // A kind added after this converter was written: left out of the JSON.
                _ => continue,
            };
            push(&mut out, ev);
        } else if let Some(info) = by_event.get(r.event) {
            let (_, args) = selftrace::tracefs::parse_hit_body(r.body);
            let cat = match info.kind {
                selftrace::tracefs::EventKind::Probe => "probe",
                _ => "uprobe",
            };
            let mut a = String::new();
            for (i, (k, v)) in args.iter().enumerate() {
                if i > 0 {
                    a.push(',');
                }
                // Text decoded from fetched bytes (its `aN_bytes` is in the body): escaped by
                // parse_hit_body, unescaped here for the JSON string.
                let value = if r.body.contains(&format!(" {k}_bytes=")) {
                    json_string(&unescape_decoded(v))
                } else {
                    json_value(v)
                };
                let _ = write!(a, "{}:{value}", json_string(k));
            }
            let ev = if pairs.contains_key(r.event) {
                format!(
                    "{},\"cat\":\"function\",\"args\":{{{a}}}}}",
                    head("B", &info.label)
                )
            } else if paired_returns.contains(r.event) {
                format!("{},\"cat\":\"function\",\"args\":{{{a}}}}}", head("E", ""))
            } else {
                format!(
                    "{},\"cat\":\"{cat}\",\"s\":\"t\",\"args\":{{{a}}}}}",
                    head("i", &info.label)
                )
            };
            push(&mut out, ev);
        }
    }
    let mut named_processes = std::collections::HashSet::new();
    for ((pid, tid), name) in &threads {
        push(
            &mut out,
            format!(
                "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                json_string(name)
            ),
        );
        if pid == tid && named_processes.insert(*pid) {
            push(
                &mut out,
                format!(
                    "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                    json_string(name)
                ),
            );
        }
    }
    out.push_str("\n]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoded_text_is_unescaped_once() {
        assert_eq!(unescape_decoded(r#""a\\x0a\"b\x0a""#), "a\\x0a\"b\n");
        assert_eq!(unescape_decoded(r#""\q\x""#), "\\q\\x");
        assert_eq!(unescape_decoded("0x7f"), "0x7f");
    }

    #[test]
    fn strings_and_values() {
        assert_eq!(json_string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
        assert_eq!(json_value("-5"), "-5");
        assert_eq!(json_value("18000000000000000000"), "18000000000000000000");
        assert_eq!(json_value("0x1f"), "\"0x1f\"");
        assert_eq!(json_value("\"hi\""), "\"hi\"");
        assert_eq!(ts(1_234_567), "1234.567");
        assert_eq!(ts(5), "0.005");
    }

    #[test]
    fn events() {
        let text = "\
 app-7 (    7) [000] ..... 1.000000: tracing_mark_write: B|7|a \"q\"
 app-7 (    7) [000] ..... 1.000001: rt_step: (0x1234) a0=3 a1=-1
 app-7 (    7) [000] ..... 1.000002: tracing_mark_write: C|7|queue|4
 app-7 (    7) [000] ..... 1.000003: tracing_mark_write: E|7
";
        let info = EventInfo {
            event: "rt_step".into(),
            label: "rt:step".into(),
            kind: selftrace::tracefs::EventKind::Probe,
            path: "/x".into(),
            offset: 0,
        };
        let j = chrome_json(text, &[info]);
        assert!(
            j.contains(
                "{\"ph\":\"B\",\"name\":\"a \\\"q\\\"\",\"pid\":7,\"tid\":7,\"ts\":1000000.000}"
            ),
            "{j}"
        );
        assert!(j.contains("\"name\":\"rt:step\""), "{j}");
        assert!(j.contains("\"args\":{\"a0\":3,\"a1\":-1}"), "{j}");
        assert!(j.contains("\"ph\":\"C\",\"name\":\"queue\""), "{j}");
        assert!(j.contains("\"args\":{\"value\":4}"), "{j}");
        assert!(j.contains("process_name"), "{j}");
    }
}
