//! Formats one marker line into a fixed stack buffer: no allocation, no panic.
//!
//! A line is `K|pid[|track][|name][|int]`. The prefix and the trailing integer (cookie or counter
//! value) are always kept whole; the user strings (track, name) are sanitised and, when the line
//! would exceed [`MAX_EVENT`] bytes, truncated at a UTF-8 character boundary.
#![allow(unsafe_code)]

use core::fmt;
use core::mem::MaybeUninit;

/// The largest marker line written, in bytes, prefix included (Android's limit).
pub const MAX_EVENT: usize = 1024;

/// Replaces the bytes that would break the line grammar: `|` (the field separator) becomes `!`,
/// newline, carriage return and NUL (which would end or merge events) become a space. All are
/// ASCII and replaced by ASCII, so UTF-8 stays valid.
#[inline]
fn sanitize(b: u8) -> u8 {
    match b {
        b'|' => b'!',
        b'\n' | b'\r' | 0 => b' ',
        _ => b,
    }
}

/// The largest `n <= max` such that `s[..n]` ends on a character boundary.
#[inline]
pub(crate) fn floor_char_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    let mut n = max;
    while n > 0 && !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// A line under construction in a caller's stack buffer. The buffer is not zeroed first (that
/// would cost a 1 KiB memset per event): only `buf[..len]` is initialised.
pub(crate) struct Line<'b> {
    buf: &'b mut [MaybeUninit<u8>; MAX_EVENT],
    len: usize,
    /// Set when a user string was cut short.
    pub(crate) truncated: bool,
}

/// Uninitialised storage for a [`Line`]; a plain `let` of it compiles to no code.
pub(crate) type LineBuf = MaybeUninit<[u8; MAX_EVENT]>;

impl<'b> Line<'b> {
    #[inline]
    pub(crate) fn new(storage: &'b mut LineBuf) -> Line<'b> {
        // SAFETY: MaybeUninit<[u8; N]> and [MaybeUninit<u8>; N] have the same size and
        // alignment, and every state (including uninitialised) is valid for MaybeUninit<u8>.
        let buf = unsafe { &mut *storage.as_mut_ptr().cast::<[MaybeUninit<u8>; MAX_EVENT]>() };
        Line {
            buf,
            len: 0,
            truncated: false,
        }
    }

    /// The buffer as byte slots, for writing.
    #[inline]
    fn slots(&mut self) -> &mut [MaybeUninit<u8>; MAX_EVENT] {
        self.buf
    }

    /// The bytes formatted so far.
    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        // SAFETY: every push writes buf[len..new_len] before advancing len, so buf[..len] is
        // initialised; MaybeUninit<u8> has the layout of u8.
        unsafe { core::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.len) }
    }

    /// Bytes still free.
    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        MAX_EVENT - self.len
    }

    /// Appends raw bytes that the caller knows to be grammar-safe; drops what does not fit.
    #[inline]
    pub(crate) fn push_raw(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.remaining());
        let len = self.len;
        for (d, &b) in self.slots()[len..len + n].iter_mut().zip(bytes) {
            d.write(b);
        }
        self.len += n;
    }

    /// Appends one raw byte if there is room.
    #[inline]
    pub(crate) fn push_byte(&mut self, b: u8) {
        if self.len < MAX_EVENT {
            let len = self.len;
            self.slots()[len].write(b);
            self.len += 1;
        }
    }

    /// Appends `s` sanitised, at most `max` bytes, cut at a character boundary.
    #[inline]
    pub(crate) fn push_str(&mut self, s: &str, max: usize) {
        let max = max.min(self.remaining());
        let n = floor_char_boundary(s, max);
        if n < s.len() {
            self.truncated = true;
        }
        let len = self.len;
        let dst = &mut self.slots()[len..len + n];
        for (d, &b) in dst.iter_mut().zip(s.as_bytes()) {
            d.write(sanitize(b));
        }
        self.len += n;
    }

    /// Appends formatted text, sanitised, at most `max` bytes, cut at a character boundary.
    /// Formatting stops at the first piece that does not fit. Never allocates (unless a
    /// user's `Display` implementation does).
    pub(crate) fn push_fmt(&mut self, args: fmt::Arguments<'_>, max: usize) {
        let end = self.len + max.min(self.remaining());
        let mut sink = Sink {
            line: self,
            end,
            full: false,
        };
        // An error only means "full" (or a Display impl failed): keep what was written.
        let _ = fmt::write(&mut sink, args);
    }
}

/// `fmt::Write` into a [`Line`] up to `end`.
struct Sink<'a, 'b> {
    line: &'a mut Line<'b>,
    end: usize,
    full: bool,
}

impl fmt::Write for Sink<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.full {
            return Err(fmt::Error);
        }
        let room = self.end - self.line.len;
        let n = floor_char_boundary(s, room);
        let start = self.line.len;
        for (d, &b) in self.line.slots()[start..start + n]
            .iter_mut()
            .zip(s.as_bytes())
        {
            d.write(sanitize(b));
        }
        self.line.len += n;
        if n < s.len() {
            self.full = true;
            self.line.truncated = true;
            return Err(fmt::Error);
        }
        Ok(())
    }
}

/// Formats `v` in decimal into the end of `tmp`; returns the digits.
#[inline]
pub(crate) fn fmt_i64(v: i64, tmp: &mut [u8; 20]) -> &[u8] {
    let neg = v < 0;
    let mut u = v.unsigned_abs();
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if neg {
        // u64::MAX has 20 digits but i64's magnitude has at most 19, so there is room.
        i -= 1;
        tmp[i] = b'-';
    }
    &tmp[i..]
}

/// The text of a marker name: a plain string or deferred formatting arguments.
#[derive(Clone, Copy)]
pub(crate) enum Text<'a> {
    Str(&'a str),
    Fmt(fmt::Arguments<'a>),
}

impl Text<'_> {
    /// Length if known in advance.
    fn known_len(&self) -> Option<usize> {
        match self {
            Text::Str(s) => Some(s.len()),
            Text::Fmt(_) => None,
        }
    }

    #[inline]
    fn push(&self, line: &mut Line<'_>, max: usize) {
        match *self {
            Text::Str(s) => line.push_str(s, max),
            Text::Fmt(a) => line.push_fmt(a, max),
        }
    }
}

/// Formats a whole line: `kind|pid[|track][|name][|value]`.
///
/// Budget: the prefix and `|value` are reserved first; the track gets at most half of what
/// remains when a name follows (more if the name is short), the name gets the rest.
#[inline]
pub(crate) fn format_line(
    line: &mut Line,
    kind: u8,
    pid: &[u8],
    track: Option<&str>,
    name: Option<Text<'_>>,
    value: Option<i64>,
) {
    line.push_byte(kind);
    line.push_byte(b'|');
    line.push_raw(pid);
    let mut tail = [0u8; 20];
    let tail_digits: &[u8] = match value {
        Some(v) => fmt_i64(v, &mut tail),
        None => &[],
    };
    let tail_len = if value.is_some() {
        1 + tail_digits.len()
    } else {
        0
    };
    // Room for user strings and their separators.
    let mut room = line.remaining() - tail_len;
    if let Some(t) = track {
        let seps = if name.is_some() { 2 } else { 1 };
        let strings = room.saturating_sub(seps);
        let cap = match name {
            None => strings,
            Some(n) => {
                let half = strings / 2;
                match n.known_len() {
                    Some(l) => half.max(strings.saturating_sub(l)),
                    None => half,
                }
            }
        };
        line.push_byte(b'|');
        line.push_str(t, cap);
        room = line.remaining() - tail_len;
    }
    if let Some(n) = name {
        line.push_byte(b'|');
        let cap = room.saturating_sub(1);
        n.push(line, cap);
    }
    if value.is_some() {
        line.push_byte(b'|');
        line.push_raw(tail_digits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(
        kind: u8,
        track: Option<&str>,
        name: Option<Text<'_>>,
        value: Option<i64>,
    ) -> (String, bool) {
        let mut storage = LineBuf::uninit();
        let mut l = Line::new(&mut storage);
        format_line(&mut l, kind, b"42", track, name, value);
        (
            String::from_utf8(l.as_bytes().to_vec()).unwrap(),
            l.truncated,
        )
    }

    #[test]
    fn grammar() {
        assert_eq!(line(b'B', None, Some(Text::Str("a b")), None).0, "B|42|a b");
        assert_eq!(line(b'E', None, None, None).0, "E|42");
        assert_eq!(
            line(b'S', None, Some(Text::Str("x")), Some(-7)).0,
            "S|42|x|-7"
        );
        assert_eq!(
            line(b'G', Some("t"), Some(Text::Str("n")), Some(i64::MIN)).0,
            "G|42|t|n|-9223372036854775808"
        );
        assert_eq!(line(b'H', Some("t"), None, Some(3)).0, "H|42|t|3");
        assert_eq!(
            line(b'N', Some("t"), Some(Text::Str("n")), None).0,
            "N|42|t|n"
        );
        assert_eq!(
            line(
                b'C',
                None,
                Some(Text::Fmt(format_args!("c{}", 1))),
                Some(i64::MAX)
            )
            .0,
            "C|42|c1|9223372036854775807"
        );
    }

    #[test]
    fn sanitise_and_truncate() {
        assert_eq!(
            line(b'I', None, Some(Text::Str("a|b\nc\0d\re")), None).0,
            "I|42|a!b c d e"
        );
        let long = "é".repeat(1000); // 2000 bytes
        let (s, t) = line(b'S', None, Some(Text::Str(&long)), Some(123));
        assert!(t);
        assert!(s.len() <= MAX_EVENT);
        assert!(s.ends_with("é|123"), "{s}");
        let (s, _) = line(b'C', None, Some(Text::Fmt(format_args!("{long}"))), Some(5));
        assert!(s.len() <= MAX_EVENT && s.ends_with("é|5"));
        let (s, _) = line(b'G', Some(&long), Some(Text::Str("name")), Some(1));
        assert!(s.len() <= MAX_EVENT && s.ends_with("é|name|1"), "{s}");
        let (s, _) = line(b'G', Some(&long), Some(Text::Str(&long)), Some(1));
        assert!(s.len() <= MAX_EVENT && s.ends_with("é|1"));
        assert_eq!(s.matches('|').count(), 4);
    }
}
