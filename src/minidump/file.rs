//! The dump file: positioned writes (`pwrite`) relative to where the dump starts, appends at
//! 8-byte aligned offsets, `MINIDUMP_STRING`s, copies of memory and of files; and
//! `MINIDUMP_LOCATION_DESCRIPTOR` ([`Loc`]), where a written piece lies.

use crate::context::{le16, le32};
use crate::sys;

/// A `MINIDUMP_LOCATION_DESCRIPTOR`.
#[derive(Clone, Copy, Default)]
pub(super) struct Loc {
    /// `DataSize`.
    pub(super) size: u32,
    /// `Rva`: the offset from the start of the dump.
    pub(super) rva: u32,
}

/// The dump file: positioned writes relative to where the dump starts. Offsets are computed in
/// `u64` and a write that would end past the 4 GiB the format's 32-bit RVAs reach fails the
/// dump (`EFBIG`) before anything is written there.
pub(super) struct File {
    pub(super) fd: i32,
    pub(super) base: i64,
    /// The end of what was written (the next append goes here, aligned).
    pub(super) end: u64,
    /// The first error (`errno`); nothing is written after it.
    pub(super) err: i32,
}

/// The highest offset a dump may reach (RVAs are 32 bits).
pub(super) const MAX_OFFSET: u64 = u32::MAX as u64;
/// Room kept for what follows the stacks (lists, modules, the Linux streams): a stack is not
/// copied when it would leave less.
pub(super) const TAIL_RESERVE: u64 = 256 << 20;

impl File {
    pub(super) fn write_at(&mut self, rva: u64, bytes: &[u8]) {
        let end = rva.saturating_add(bytes.len() as u64);
        if end > MAX_OFFSET {
            self.err = libc::EFBIG;
        }
        let mut done = 0usize;
        while self.err == 0 && done < bytes.len() {
            let rest = &bytes[done..];
            let at = self.base.saturating_add((rva + done as u64) as i64);
            match sys::pwrite(self.fd, rest, at) {
                Ok(0) => self.err = libc::EIO,
                Ok(n) => done += n,
                Err(e) => {
                    if e.errno() != Some(libc::EINTR) {
                        self.err = e.errno().unwrap_or(libc::EIO);
                    }
                }
            }
        }
        if self.err == 0 {
            self.end = self.end.max(end);
        }
    }

    /// Where the next append goes (8-byte aligned).
    pub(super) fn next(&self) -> u64 {
        (self.end + 7) & !7
    }

    /// A location in the dump (checked against [`MAX_OFFSET`] by the writes that made it).
    pub(super) fn loc(rva: u64, size: u64) -> Loc {
        Loc {
            size: size.min(MAX_OFFSET) as u32,
            rva: rva.min(MAX_OFFSET) as u32,
        }
    }

    pub(super) fn append(&mut self, bytes: &[u8]) -> Loc {
        let rva = self.next();
        self.write_at(rva, bytes);
        File::loc(rva, bytes.len() as u64)
    }

    /// Appends a `MINIDUMP_STRING` (UTF-16LE with a byte count and a terminating 0) of
    /// `text`, invalid UTF-8 replaced by U+FFFD; `scratch` holds the encoding.
    pub(super) fn append_string(&mut self, text: &[u8], scratch: &mut [u8]) -> Loc {
        let mut n = 4;
        for chunk in text.utf8_chunks() {
            let invalid = if chunk.invalid().is_empty() {
                None
            } else {
                Some(0xfffd)
            };
            for unit in chunk.valid().encode_utf16().chain(invalid) {
                if n + 4 > scratch.len() {
                    break;
                }
                le16(scratch, n, unit);
                n += 2;
            }
        }
        le32(scratch, 0, (n - 4) as u32);
        le16(scratch, n, 0);
        self.append(&scratch[..n + 2])
    }

    /// Copies up to `max` bytes of this process's memory from `addr` (from the first readable
    /// page within 64 KiB when `addr` itself is not readable) into the dump; the start
    /// address and where the bytes are, or `None` when nothing was readable.
    pub(super) fn append_memory(
        &mut self,
        addr: usize,
        max: usize,
        chunk: &mut [u8],
    ) -> Option<(u64, Loc)> {
        let page = sys::page_size().max(4096);
        let end = addr.saturating_add(max);
        let mut start = addr;
        let mut probe = [0u8; 1];
        let mut tries = 0;
        while sys::read_memory(start, &mut probe) == 0 {
            tries += 1;
            start = (start / page).checked_add(1)?.checked_mul(page)?;
            if tries > 16 || start >= end {
                return None;
            }
        }
        let rva = self.next();
        let mut at = start;
        while at < end && self.err == 0 {
            let want = (end - at).min(chunk.len());
            let got = sys::read_memory(at, &mut chunk[..want]);
            if got == 0 {
                break;
            }
            self.write_at(rva + (at - start) as u64, &chunk[..got]);
            at += got;
            if got < want {
                break;
            }
        }
        if at == start || self.err != 0 {
            return None;
        }
        Some((start as u64, File::loc(rva, (at - start) as u64)))
    }

    /// Appends the contents of a file (a `/proc` file, read to its end), `None` if it cannot
    /// be opened.
    pub(super) fn append_file(&mut self, path: &core::ffi::CStr, chunk: &mut [u8]) -> Option<Loc> {
        let fd = sys::open_cloexec(path, libc::O_RDONLY).ok()?;
        let rva = self.next();
        let mut size = 0u64;
        while self.err == 0 {
            match sys::read(fd, chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.write_at(rva + size, &chunk[..n]);
                    size += n as u64;
                }
            }
        }
        sys::close(fd);
        Some(File::loc(rva, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_utf16_with_a_byte_count() {
        let mut scratch = [0u8; 64];
        let path = std::env::temp_dir().join(format!("selftrace-md-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        use std::os::fd::AsRawFd;
        let mut f = File {
            fd: file.as_raw_fd(),
            base: 0,
            end: 0,
            err: 0,
        };
        let loc = f.append_string("añ\u{1F600}".as_bytes(), &mut scratch);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let body = &bytes[loc.rva as usize..(loc.rva + loc.size) as usize];
        let units: Vec<u16> = "añ\u{1F600}".encode_utf16().collect();
        assert_eq!(
            u32::from_le_bytes(body[..4].try_into().unwrap()) as usize,
            units.len() * 2
        );
        let got: Vec<u16> = body[4..4 + units.len() * 2]
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, units);
        assert_eq!(&body[4 + units.len() * 2..], &[0, 0]);
    }
}
