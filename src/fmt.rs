//! Text for signal handlers: [`FixedBuf`], a `core::fmt::Write` sink over a fixed byte
//! buffer that never fails and never allocates, with its decimal and hex writers
//! ([`FixedBuf::push_dec`], [`FixedBuf::push_0x`]). Under every report writer (symbolize's
//! line formats, crash reports, thread dumps, minidumps).
//!
//! # Async-signal safety
//! Everything in this file is async-signal-safe: no allocation, no lock, no panic. Output that
//! does not fit is truncated (at a UTF-8 boundary), never an error.

use core::fmt;

/// A `core::fmt::Write` sink over a fixed byte buffer that never fails: what does not fit is
/// dropped and [`FixedBuf::truncated`] says so.
pub struct FixedBuf<'a> {
    buf: &'a mut [u8],
    len: usize,
    truncated: bool,
}

impl<'a> FixedBuf<'a> {
    /// An empty writer over `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        FixedBuf {
            buf,
            len: 0,
            truncated: false,
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether some output was dropped for lack of room.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The bytes written so far.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }

    /// The text written so far (only whole UTF-8 sequences are ever written by `write_str`;
    /// raw bytes pushed with [`FixedBuf::push_bytes`] may not be UTF-8, then this is cut at the
    /// first invalid byte).
    pub fn as_str(&self) -> &str {
        let b = self.as_bytes();
        match core::str::from_utf8(b) {
            Ok(s) => s,
            Err(e) => core::str::from_utf8(b.get(..e.valid_up_to()).unwrap_or(&[])).unwrap_or(""),
        }
    }

    /// Forgets what was written.
    pub fn clear(&mut self) {
        self.len = 0;
        self.truncated = false;
    }

    /// Appends raw bytes (truncating if needed).
    pub fn push_bytes(&mut self, b: &[u8]) {
        let room = self.buf.len().saturating_sub(self.len);
        let n = b.len().min(room);
        if let (Some(dst), Some(src)) = (self.buf.get_mut(self.len..self.len + n), b.get(..n)) {
            dst.copy_from_slice(src);
            self.len += n;
        }
        if n < b.len() {
            self.truncated = true;
        }
    }

    /// Appends a string, cut at a UTF-8 boundary if it does not fit.
    pub fn push_str(&mut self, s: &str) {
        let room = self.buf.len().saturating_sub(self.len);
        if s.len() <= room {
            self.push_bytes(s.as_bytes());
        } else {
            let mut cut = room;
            while cut > 0 && !s.is_char_boundary(cut) {
                cut -= 1;
            }
            self.push_bytes(s.as_bytes().get(..cut).unwrap_or(&[]));
            self.truncated = true;
        }
    }

    /// Appends `n` in lower-case hex without prefix (`0` for zero).
    pub fn push_hex(&mut self, mut n: usize) {
        let mut tmp = [0u8; 16];
        let mut i = tmp.len();
        loop {
            i -= 1;
            let d = (n & 0xf) as u8;
            if let Some(t) = tmp.get_mut(i) {
                *t = if d < 10 { b'0' + d } else { b'a' + d - 10 };
            }
            n >>= 4;
            if n == 0 || i == 0 {
                break;
            }
        }
        self.push_bytes(tmp.get(i..).unwrap_or(&[]));
    }

    /// Appends `0x` and `n` in hex.
    pub fn push_0x(&mut self, n: usize) {
        self.push_bytes(b"0x");
        self.push_hex(n);
    }

    /// Appends `n` in decimal.
    pub fn push_dec(&mut self, mut n: u64) {
        let mut tmp = [0u8; 20];
        let mut i = tmp.len();
        loop {
            i -= 1;
            if let Some(t) = tmp.get_mut(i) {
                *t = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 || i == 0 {
                break;
            }
        }
        self.push_bytes(tmp.get(i..).unwrap_or(&[]));
    }
}

impl fmt::Write for FixedBuf<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_buf_truncates_without_failing() {
        let mut b = [0u8; 8];
        let mut w = FixedBuf::new(&mut b);
        w.push_str("abc");
        w.push_0x(0xdead);
        assert_eq!(w.as_str(), "abc0xdea");
        assert!(w.truncated());
        let mut b = [0u8; 4];
        let mut w = FixedBuf::new(&mut b);
        w.push_str("aé€");
        assert_eq!(w.as_str(), "aé");
        let mut b = [0u8; 40];
        let mut w = FixedBuf::new(&mut b);
        w.push_hex(0);
        w.push_bytes(b" ");
        w.push_hex(usize::MAX);
        w.push_bytes(b" ");
        w.push_dec(0);
        w.push_dec(u64::MAX);
        assert_eq!(w.as_str(), "0 ffffffffffffffff 018446744073709551615");
    }
}
