//! An ELF file read on demand into memory selftrace owns, for `object`'s parsers, and how
//! such a file is opened ([`open_cache`]: regular files only, never waiting on a FIFO).
//!
//! Like `object`'s `ReadCache` (each range read once with `pread`-like reads and kept until the
//! cache is dropped, never mapped), but a range is read straight into new memory instead of
//! memory zeroed first: a large program's symbol and string tables are tens of megabytes, and
//! zeroing them before reading them cost a fifth of the index build.
#![allow(unsafe_code)]

use core::cell::RefCell;
use core::ops::Range;
use object::read::elf::ElfFile64;
use object::Endianness;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};

/// Longest string [`read_bytes_at_until`](object::ReadRef::read_bytes_at_until) looks for a
/// delimiter in (as `object`'s cache: names and paths, not data).
const MAX_STRING: u64 = 4096;

/// Bytes read, by what identifies the read.
type Kept<K> = RefCell<HashMap<K, Box<[u8]>>>;

/// A file and the ranges read from it so far.
#[derive(Debug)]
pub(crate) struct FileCache {
    file: File,
    size: u64,
    /// Ranges read, by (offset, size). Entries are never removed or changed while the cache
    /// lives, and each is its own heap block, so the slices handed out stay valid.
    ranges: Kept<(u64, u64)>,
    /// Strings read, by (offset, delimiter), without the delimiter.
    strings: Kept<(u64, u8)>,
}

impl FileCache {
    /// A cache over `file` (its size as it is now).
    pub(crate) fn new(file: File) -> Option<FileCache> {
        let size = file.metadata().ok()?.len();
        Some(FileCache {
            file,
            size,
            ranges: RefCell::default(),
            strings: RefCell::default(),
        })
    }

    /// The file, for reading it another way.
    pub(crate) fn into_inner(self) -> File {
        self.file
    }

    /// `size` bytes at `offset`, read into new, unzeroed memory; `None` past the end.
    fn read_new(&self, offset: u64, size: u64) -> Option<Box<[u8]>> {
        self.read_vec(offset, size).map(Vec::into_boxed_slice)
    }

    /// `size` bytes at `offset` in a new vector; `None` past the end.
    fn read_vec(&self, offset: u64, size: u64) -> Option<Vec<u8>> {
        let len = usize::try_from(size).ok()?;
        if offset.checked_add(size)? > self.size {
            return None;
        }
        let mut v = Vec::new();
        v.try_reserve_exact(len).ok()?;
        let mut f = &self.file;
        f.seek(SeekFrom::Start(offset)).ok()?;
        f.take(size).read_to_end(&mut v).ok()?;
        (v.len() == len).then_some(v)
    }

    /// Hands out a slice of a box that the cache keeps for as long as it lives.
    fn keep<'a, K: Eq + core::hash::Hash>(map: &Kept<K>, key: K, bytes: Box<[u8]>) -> &'a [u8] {
        let mut map = map.borrow_mut();
        let kept: *const [u8] = &**map.entry(key).or_insert(bytes);
        // SAFETY: the box's heap block is owned by the map, which never removes or changes an
        // entry while the cache lives (moving the box when the map grows does not move the
        // block); the caller's lifetime 'a is that of `&'a FileCache` (see the ReadRef impl).
        unsafe { &*kept }
    }
}

impl<'a> object::ReadRef<'a> for &'a FileCache {
    fn len(self) -> Result<u64, ()> {
        Ok(self.size)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        if offset.checked_add(size).ok_or(())? > self.size {
            return Err(());
        }
        if let Some(b) = self.ranges.borrow().get(&(offset, size)) {
            let kept: *const [u8] = &**b;
            // SAFETY: as in `keep`: entries live and stay unchanged as long as the cache.
            return Ok(unsafe { &*kept });
        }
        let bytes = self.read_new(offset, size).ok_or(())?;
        Ok(FileCache::keep(&self.ranges, (offset, size), bytes))
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        if range.start >= range.end || range.end > self.size {
            return Err(());
        }
        if let Some(b) = self.strings.borrow().get(&(range.start, delimiter)) {
            // Read before for a wider range: its delimiter must lie in this one too.
            if b.len() as u64 >= (range.end - range.start).min(MAX_STRING) {
                return Err(());
            }
            let kept: *const [u8] = &**b;
            // SAFETY: as in `keep`: entries live and stay unchanged as long as the cache.
            return Ok(unsafe { &*kept });
        }
        let max = (range.end - range.start).min(MAX_STRING);
        let mut v: Vec<u8> = Vec::new();
        let mut at = range.start;
        let found = loop {
            let chunk = 256.min(range.start + max - at);
            if chunk == 0 {
                return Err(());
            }
            let part = self.read_new(at, chunk).ok_or(())?;
            if let Some(i) = part.iter().position(|&b| b == delimiter) {
                v.extend_from_slice(part.get(..i).ok_or(())?);
                break v;
            }
            v.extend_from_slice(&part);
            at += chunk;
        };
        Ok(FileCache::keep(
            &self.strings,
            (range.start, delimiter),
            found.into_boxed_slice(),
        ))
    }
}

/// An ELF file read with `pread` into buffers owned by the cache (never mapped).
pub(crate) type Cache = FileCache;
/// An ELF file parsed over a [`Cache`] or over memory.
pub(crate) type Elf<'d, R> = ElfFile64<'d, Endianness, R>;

/// Opens a regular file for reading through a [`Cache`] (`None` for anything else: a FIFO or
/// a device would block or never end).
pub(crate) fn open_cache(path: &str) -> Option<Cache> {
    open_file(path).and_then(Cache::new)
}

/// Opens a regular file for reading (`None` for anything else).
pub(crate) fn open_file(path: &str) -> Option<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblock()
        .open(path)
        .ok()?;
    file.metadata().ok().filter(|m| m.is_file())?;
    Some(file)
}

/// `O_NONBLOCK | O_CLOEXEC` on open, so that opening a FIFO does not wait for a writer.
trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt as _;
        self.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::ReadRef as _;
    use std::io::Write as _;

    #[test]
    fn reads_ranges_and_strings_as_the_file_holds_them() {
        let path = std::env::temp_dir().join(format!("selftrace-filecache-{}", std::process::id()));
        let mut data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8 + 1).collect();
        data[700] = 0;
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&data))
            .expect("write");
        let cache = FileCache::new(File::open(&path).expect("open")).expect("cache");
        let _ = std::fs::remove_file(&path);
        let c = &cache;
        assert_eq!(c.len(), Ok(3000));
        assert_eq!(c.read_bytes_at(10, 500), Ok(&data[10..510]));
        // Again: the same bytes, from the cache.
        assert_eq!(c.read_bytes_at(10, 500), Ok(&data[10..510]));
        assert_eq!(c.read_bytes_at(2999, 1), Ok(&data[2999..]));
        assert_eq!(c.read_bytes_at(0, 0), Ok(&[][..]));
        assert!(c.read_bytes_at(2999, 2).is_err());
        assert!(c.read_bytes_at(u64::MAX, 2).is_err());
        // A string across several 256-byte chunks, up to its NUL.
        assert_eq!(c.read_bytes_at_until(100..3000, 0), Ok(&data[100..700]));
        // No delimiter within the range or the longest string: an error.
        assert!(c.read_bytes_at_until(701..3000, 0).is_err());
        assert!(c.read_bytes_at_until(100..600, 0).is_err());
        assert!(c.read_bytes_at_until(10..3001, 0).is_err());
        assert_eq!(c.read_bytes_at_until(5..3000, data[9]), Ok(&data[5..9]));
    }
}
