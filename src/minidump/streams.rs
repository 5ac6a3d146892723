//! The streams of a dump, one function each: it writes the stream's records and returns its
//! directory entry ([`Stream`]); a [`Directory`] collects the entries and, last, writes them and
//! the header (a dump cut short has no valid header). Each record is a named struct that
//! encodes its fields in order ([`Le`]), the layout of `minidumpapiset.h` / Breakpad's
//! `minidump_format.h`, instead of literal offsets (minidump-writer's `thread_names_stream.rs`
//! and `dir_section.rs` are the model).

use super::file::{File, Loc};
use super::{Fault, ModuleRec, ThreadRec, HEADER_SIZE, MAX_STREAMS};
use crate::context::le32;
use crate::symbolize::FixedBuf;

// ---- stream types --------------------------------------------------------------------------

pub(super) const THREAD_LIST: u32 = 3;
pub(super) const MODULE_LIST: u32 = 4;
pub(super) const MEMORY_LIST: u32 = 5;
pub(super) const EXCEPTION: u32 = 6;
pub(super) const SYSTEM_INFO: u32 = 7;
pub(super) const MISC_INFO: u32 = 15;
pub(super) const THREAD_NAMES: u32 = 24;
pub(super) const LINUX_CPU_INFO: u32 = 0x4767_0003;
pub(super) const LINUX_PROC_STATUS: u32 = 0x4767_0004;
pub(super) const LINUX_LSB_RELEASE: u32 = 0x4767_0005;
pub(super) const LINUX_CMD_LINE: u32 = 0x4767_0006;
pub(super) const LINUX_ENVIRON: u32 = 0x4767_0007;
pub(super) const LINUX_AUXV: u32 = 0x4767_0008;
pub(super) const LINUX_MAPS: u32 = 0x4767_0009;
/// Crashpad's info stream (`MinidumpCrashpadInfo`): its simple annotations say what the dump
/// leaves out.
pub(super) const CRASHPAD_INFO: u32 = 0x4350_0001;

const SIGNATURE: u32 = 0x504d_444d; // "MDMP"
const VERSION: u32 = 0xa793;
/// `CV_INFO_ELF`'s signature, "BpEL".
const CV_ELF: u32 = 0x4270_454c;

// ---- records -------------------------------------------------------------------------------

/// Little-endian fields written one after another into a zeroed record.
pub(super) struct Le<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl<'a> Le<'a> {
    /// Fields from the start of `buf` (which the caller zeroed).
    pub(super) fn new(buf: &'a mut [u8]) -> Le<'a> {
        Le { buf, at: 0 }
    }

    /// A `u8`.
    pub(super) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf[self.at] = v;
        self.at += 1;
        self
    }

    /// A `u16`.
    pub(super) fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// A `u32`.
    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// A `u64`.
    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// A `MINIDUMP_LOCATION_DESCRIPTOR`: `DataSize`, `Rva`.
    pub(super) fn loc(&mut self, l: Loc) -> &mut Self {
        self.u32(l.size).u32(l.rva)
    }

    /// Bytes as they are.
    pub(super) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
        self
    }

    /// `n` bytes left as they are (zero): fields this writer does not fill.
    pub(super) fn skip(&mut self, n: usize) -> &mut Self {
        self.at += n;
        self
    }
}

impl ThreadRec {
    /// Size of `MINIDUMP_THREAD`.
    pub(super) const SIZE: usize = 48;

    /// `MINIDUMP_THREAD`.
    pub(super) fn encode(&self, out: &mut [u8]) {
        out[..Self::SIZE].fill(0);
        Le::new(out)
            .u32(self.tid)
            .u32(0) // SuspendCount
            .u32(0) // PriorityClass
            .u32(0) // Priority
            .u64(0) // Teb
            .u64(self.stack_start) // Stack.StartOfMemoryRange
            .loc(self.stack) // Stack.Memory
            .loc(self.context); // ThreadContext
    }

    /// Size of `MINIDUMP_THREAD_NAME`.
    const NAME_SIZE: usize = 12;

    /// `MINIDUMP_THREAD_NAME`: the thread id and the RVA (64 bits) of its name.
    fn encode_name(&self, out: &mut [u8]) {
        Le::new(out).u32(self.tid).u64(self.name.rva as u64);
    }
}

/// `MINIDUMP_MEMORY_DESCRIPTOR`: where a piece of memory was and where its copy is.
pub(super) struct MemoryDescriptor {
    pub(super) start: u64,
    pub(super) memory: Loc,
}

impl MemoryDescriptor {
    const SIZE: usize = 16;

    fn encode(&self, out: &mut [u8]) {
        Le::new(out).u64(self.start).loc(self.memory);
    }
}

impl ModuleRec {
    /// Size of `MINIDUMP_MODULE`.
    pub(super) const SIZE: usize = 108;

    /// `MINIDUMP_MODULE` (no version info, no misc record).
    pub(super) fn encode(&self, out: &mut [u8]) {
        out[..Self::SIZE].fill(0);
        Le::new(out)
            .u64(self.base) // BaseOfImage
            .u32(self.size) // SizeOfImage
            .u32(0) // CheckSum
            .u32(0) // TimeDateStamp
            .u32(self.name_rva) // ModuleNameRva
            .skip(52) // VersionInfo (VS_FIXEDFILEINFO)
            .loc(self.cv); // CvRecord; MiscRecord and Reserved0/1 stay zero
    }
}

/// `MINIDUMP_EXCEPTION_STREAM`: the crashing thread, its signal as Breakpad writes it
/// (`ExceptionCode` = signal, `ExceptionFlags` = `si_code`, `ExceptionAddress` = fault
/// address) and its context.
pub(super) struct ExceptionStream {
    pub(super) tid: u32,
    pub(super) sig: u32,
    pub(super) code: u32,
    pub(super) addr: u64,
    pub(super) context: Loc,
}

impl ExceptionStream {
    const SIZE: usize = 168;

    pub(super) fn encode(&self) -> [u8; Self::SIZE] {
        let mut e = [0u8; Self::SIZE];
        Le::new(&mut e)
            .u32(self.tid) // ThreadId
            .u32(0) // __alignment
            .u32(self.sig) // ExceptionRecord.ExceptionCode
            .u32(self.code) // .ExceptionFlags
            .u64(0) // .ExceptionRecord
            .u64(self.addr) // .ExceptionAddress
            .u32(0) // .NumberParameters
            .u32(0) // __unusedAlignment
            .skip(8 * 15) // .ExceptionInformation
            .loc(self.context); // ThreadContext
        e
    }
}

/// `MINIDUMP_HEADER`.
pub(super) struct Header {
    pub(super) streams: u32,
    pub(super) time: u32,
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HEADER_SIZE as usize] {
        let mut h = [0u8; HEADER_SIZE as usize];
        Le::new(&mut h)
            .u32(SIGNATURE)
            .u32(VERSION)
            .u32(self.streams) // NumberOfStreams
            .u32(HEADER_SIZE) // StreamDirectoryRva: the directory follows the header
            .u32(0) // CheckSum
            .u32(self.time); // TimeDateStamp; Flags stay zero
        h
    }
}

// ---- the directory -------------------------------------------------------------------------

/// A `MINIDUMP_DIRECTORY` entry: a stream's type and where it is.
#[derive(Clone, Copy, Default)]
pub(super) struct Stream {
    pub(super) kind: u32,
    pub(super) loc: Loc,
}

/// The directory of the dump being written: up to [`MAX_STREAMS`] entries (more are left
/// out), written with the header by [`Directory::finish`].
pub(super) struct Directory {
    entries: [Stream; MAX_STREAMS],
    len: usize,
}

impl Directory {
    const ENTRY_SIZE: usize = 12;

    pub(super) fn new() -> Directory {
        Directory {
            entries: [Stream::default(); MAX_STREAMS],
            len: 0,
        }
    }

    /// Adds a stream's entry.
    pub(super) fn add(&mut self, s: Stream) {
        if let Some(slot) = self.entries.get_mut(self.len) {
            *slot = s;
            self.len += 1;
        }
    }

    /// Writes the directory after the header and then the header (timestamp `time`).
    pub(super) fn finish(&self, f: &mut File, time: u32) {
        let mut dir = [0u8; Directory::ENTRY_SIZE * MAX_STREAMS];
        for (k, s) in self.entries[..self.len].iter().enumerate() {
            Le::new(&mut dir[Directory::ENTRY_SIZE * k..])
                .u32(s.kind)
                .loc(s.loc);
        }
        f.write_at(HEADER_SIZE as u64, &dir[..Directory::ENTRY_SIZE * self.len]);
        let header = Header {
            streams: self.len as u32,
            time,
        };
        f.write_at(0, &header.encode());
    }
}

// ---- the streams ---------------------------------------------------------------------------

/// `MINIDUMP_THREAD_LIST` of `threads`, encoded in `buf` (room for 4 + 48 bytes a thread).
pub(super) fn thread_list(f: &mut File, threads: &[ThreadRec], buf: &mut [u8]) -> Stream {
    le32(buf, 0, threads.len() as u32);
    for (k, t) in threads.iter().enumerate() {
        t.encode(&mut buf[4 + ThreadRec::SIZE * k..]);
    }
    let loc = f.append(&buf[..4 + ThreadRec::SIZE * threads.len()]);
    Stream {
        kind: THREAD_LIST,
        loc,
    }
}

/// `MINIDUMP_THREAD_NAME_LIST` of `threads`, encoded in `buf` (room for 4 + 12 bytes a thread).
pub(super) fn thread_names(f: &mut File, threads: &[ThreadRec], buf: &mut [u8]) -> Stream {
    le32(buf, 0, threads.len() as u32);
    for (k, t) in threads.iter().enumerate() {
        t.encode_name(&mut buf[4 + ThreadRec::NAME_SIZE * k..]);
    }
    let loc = f.append(&buf[..4 + ThreadRec::NAME_SIZE * threads.len()]);
    Stream {
        kind: THREAD_NAMES,
        loc,
    }
}

/// `MINIDUMP_EXCEPTION_STREAM` of `fault`, with the context of the thread of `threads` that
/// crashed (none when it is not listed).
pub(super) fn exception(f: &mut File, fault: &Fault, threads: &[ThreadRec]) -> Stream {
    let context = threads
        .iter()
        .find(|t| t.tid == fault.tid as u32)
        .map(|t| t.context)
        .unwrap_or_default();
    let (code, addr) = fault.code_addr();
    let e = ExceptionStream {
        tid: fault.tid as u32,
        sig: fault.sig as u32,
        code: code as u32,
        addr: addr as u64,
        context,
    };
    let loc = f.append(&e.encode());
    Stream {
        kind: EXCEPTION,
        loc,
    }
}

/// `MINIDUMP_MEMORY_LIST`: the stacks of `threads` that have one, then `extra`, encoded in
/// `buf` (room for 4 + 16 bytes a region).
pub(super) fn memory_list(
    f: &mut File,
    threads: &[ThreadRec],
    extra: &[(u64, Loc)],
    buf: &mut [u8],
) -> Stream {
    let regions = threads
        .iter()
        .filter(|t| t.stack.size != 0)
        .map(|t| (t.stack_start, t.stack))
        .chain(extra.iter().copied());
    let mut n = 0usize;
    for (start, memory) in regions {
        MemoryDescriptor { start, memory }.encode(&mut buf[4 + MemoryDescriptor::SIZE * n..]);
        n += 1;
    }
    le32(buf, 0, n as u32);
    let loc = f.append(&buf[..4 + MemoryDescriptor::SIZE * n]);
    Stream {
        kind: MEMORY_LIST,
        loc,
    }
}

/// The `CV_INFO_ELF` record of a build id (at most 64 bytes of it).
pub(super) fn codeview(f: &mut File, build_id: &[u8]) -> Loc {
    let id = &build_id[..build_id.len().min(64)];
    let mut rec = [0u8; 68];
    Le::new(&mut rec).u32(CV_ELF).bytes(id);
    f.append(&rec[..4 + id.len()])
}

/// `MINIDUMP_MODULE_LIST` of `modules` (names and CodeView records already written), encoded
/// in batches through `buf`.
pub(super) fn module_list(f: &mut File, modules: &[ModuleRec], buf: &mut [u8]) -> Stream {
    let list = f.next();
    let mut head = [0u8; 4];
    le32(&mut head, 0, modules.len() as u32);
    f.write_at(list, &head);
    let per = buf.len() / ModuleRec::SIZE;
    let mut k = 0;
    while k < modules.len() {
        let batch = (modules.len() - k).min(per);
        for (j, m) in modules[k..k + batch].iter().enumerate() {
            m.encode(&mut buf[ModuleRec::SIZE * j..]);
        }
        f.write_at(
            list + 4 + (ModuleRec::SIZE * k) as u64,
            &buf[..ModuleRec::SIZE * batch],
        );
        k += batch;
    }
    Stream {
        kind: MODULE_LIST,
        loc: File::loc(list, 4 + (ModuleRec::SIZE * modules.len()) as u64),
    }
}

/// A Linux stream: the contents of `path` (for `/etc/lsb-release`, `/etc/os-release` when it
/// is missing); `None` when neither can be opened.
pub(super) fn linux_file(
    f: &mut File,
    kind: u32,
    path: &core::ffi::CStr,
    chunk: &mut [u8],
) -> Option<Stream> {
    let loc = f.append_file(path, chunk).or_else(|| {
        (kind == LINUX_LSB_RELEASE)
            .then(|| f.append_file(c"/etc/os-release", chunk))
            .flatten()
    })?;
    Some(Stream { kind, loc })
}

/// The most Crashpad simple annotations a dump carries.
pub(super) const MAX_ANNOTATIONS: usize = 64;

/// Crashpad simple annotations (key and value strings), appended to the file as they are added;
/// [`Annotations::stream`] writes their dictionary and the `MinidumpCrashpadInfo` stream
/// (version 1, no report or client id, no module list). minidump readers show them
/// (`minidump-stackwalk --dump`, Sentry, Socorro).
///
/// # Async-signal safety
/// Async-signal-safe (stack buffers, `pwrite`).
pub(super) struct Annotations {
    /// RVAs of each entry's key and value (`MinidumpUTF8String`s).
    entries: [(u32, u32); MAX_ANNOTATIONS],
    n: usize,
    /// Annotations that found the dictionary full.
    pub(super) left_out: usize,
}

impl Annotations {
    /// None yet.
    pub(super) const fn new() -> Annotations {
        Annotations {
            entries: [(0, 0); MAX_ANNOTATIONS],
            n: 0,
            left_out: 0,
        }
    }

    /// Room for `n` more.
    pub(super) fn has_room(&self, n: usize) -> bool {
        self.n + n <= MAX_ANNOTATIONS
    }

    /// `key` = `value` (each cut at 255 bytes, on a UTF-8 boundary); counted in `left_out`
    /// when the dictionary is full.
    pub(super) fn add(&mut self, f: &mut File, key: &[u8], value: &[u8]) {
        /// A `MinidumpUTF8String`: its byte length, the bytes and a NUL.
        fn utf8(f: &mut File, text: &[u8]) -> Loc {
            let mut b = [0u8; 4 + 256];
            let mut len = text.len().min(255);
            // Not inside a UTF-8 sequence: back to the start of the character cut.
            while len < text.len() && len > 0 && text[len] & 0xc0 == 0x80 {
                len -= 1;
            }
            Le::new(&mut b).u32(len as u32).bytes(&text[..len]);
            f.append(&b[..4 + len + 1])
        }
        if self.n == MAX_ANNOTATIONS {
            self.left_out += 1;
            return;
        }
        let key = utf8(f, key);
        let value = utf8(f, value);
        self.entries[self.n] = (key.rva, value.rva);
        self.n += 1;
    }

    /// `key` = `value` in decimal.
    pub(super) fn add_dec(&mut self, f: &mut File, key: &[u8], value: u64) {
        let mut digits = [0u8; 24];
        let mut w = FixedBuf::new(&mut digits);
        w.push_dec(value);
        let len = w.len();
        self.add(f, key, &digits[..len]);
    }

    /// The info stream, or `None` when there is no annotation; `scratch` (at least 516 bytes)
    /// holds the dictionary.
    pub(super) fn stream(&self, f: &mut File, scratch: &mut [u8]) -> Option<Stream> {
        let size = 4 + 8 * self.n;
        if self.n == 0 || scratch.len() < size {
            return None;
        }
        // The dictionary: its count, then MinidumpSimpleStringDictionaryEntry (key, value).
        let dict = &mut scratch[..size];
        le32(dict, 0, self.n as u32);
        for (k, &(key, value)) in self.entries[..self.n].iter().enumerate() {
            Le::new(&mut dict[4 + 8 * k..]).u32(key).u32(value);
        }
        let dict = f.append(dict);
        let mut info = [0u8; 52];
        Le::new(&mut info)
            .u32(1) // version
            .skip(16) // report_id
            .skip(16) // client_id
            .loc(dict); // simple_annotations; module_list stays empty
        Some(Stream {
            kind: CRASHPAD_INFO,
            loc: f.append(&info),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::le64;

    fn loc(size: u32, rva: u32) -> Loc {
        Loc { size, rva }
    }

    // The literal-offset encoders the records replaced (write_locked before the split), kept
    // as the guard that the bytes written stay the same.

    #[test]
    fn records_match_the_literal_offsets() {
        let t = ThreadRec {
            tid: 0x1234_5678,
            context: loc(1232, 0x9abc),
            stack_start: 0x7fff_0000_1234_5678,
            stack: loc(0x2_0000, 0xdef0),
            name: loc(12, 0x4321_8765),
        };
        let mut old = [0xaau8; 48];
        {
            let (buf, o) = (&mut old[..], 0);
            buf[o..o + 48].fill(0);
            le32(buf, o, t.tid);
            le64(buf, o + 16, 0); // Teb
            le64(buf, o + 24, t.stack_start);
            le32(buf, o + 32, t.stack.size);
            le32(buf, o + 36, t.stack.rva);
            le32(buf, o + 40, t.context.size);
            le32(buf, o + 44, t.context.rva);
        }
        let mut new = [0x55u8; 48];
        t.encode(&mut new);
        assert_eq!(old, new, "MINIDUMP_THREAD");

        let mut old = [0u8; 12];
        le32(&mut old, 0, t.tid);
        le64(&mut old, 4, t.name.rva as u64);
        let mut new = [0u8; 12];
        t.encode_name(&mut new);
        assert_eq!(old, new, "MINIDUMP_THREAD_NAME");

        let mut old = [0u8; 16];
        le64(&mut old, 0, t.stack_start);
        le32(&mut old, 8, t.stack.size);
        le32(&mut old, 12, t.stack.rva);
        let mut new = [0u8; 16];
        MemoryDescriptor {
            start: t.stack_start,
            memory: t.stack,
        }
        .encode(&mut new);
        assert_eq!(old, new, "MINIDUMP_MEMORY_DESCRIPTOR");

        let m = ModuleRec {
            base: 0x5555_0000_1000,
            size: 0x12_3456,
            name_rva: 0x777,
            cv: loc(24, 0x888),
        };
        let mut old = [0xaau8; 108];
        {
            let (buf, o) = (&mut old[..], 0);
            buf[o..o + 108].fill(0);
            le64(buf, o, m.base);
            le32(buf, o + 8, m.size);
            le32(buf, o + 20, m.name_rva);
            le32(buf, o + 76, m.cv.size);
            le32(buf, o + 80, m.cv.rva);
        }
        let mut new = [0x55u8; 108];
        m.encode(&mut new);
        assert_eq!(old, new, "MINIDUMP_MODULE");

        let e = ExceptionStream {
            tid: 99,
            sig: 11,
            code: 1,
            addr: 0xdead_beef_0000,
            context: loc(1232, 0x1000),
        };
        let mut old = [0u8; 168];
        le32(&mut old, 0, e.tid);
        le32(&mut old, 8, e.sig);
        le32(&mut old, 12, e.code);
        le64(&mut old, 24, e.addr);
        le32(&mut old, 160, e.context.size);
        le32(&mut old, 164, e.context.rva);
        assert_eq!(old, e.encode(), "MINIDUMP_EXCEPTION_STREAM");

        let h = Header {
            streams: 13,
            time: 0x6000_0001,
        };
        let mut old = [0u8; 32];
        le32(&mut old, 0, SIGNATURE);
        le32(&mut old, 4, VERSION);
        le32(&mut old, 8, h.streams);
        le32(&mut old, 12, HEADER_SIZE);
        le32(&mut old, 20, h.time);
        assert_eq!(old, h.encode(), "MINIDUMP_HEADER");

        let dict = loc(36, 0x4444);
        let mut old = [0u8; 52];
        le32(&mut old, 0, 1);
        le32(&mut old, 36, dict.size);
        le32(&mut old, 40, dict.rva);
        let mut new = [0u8; 52];
        Le::new(&mut new).u32(1).skip(16).skip(16).loc(dict);
        assert_eq!(old, new, "MinidumpCrashpadInfo");

        let mut old = [0u8; 12];
        le32(&mut old, 0, THREAD_LIST);
        le32(&mut old, 4, t.stack.size);
        le32(&mut old, 8, t.stack.rva);
        let mut new = [0u8; 12];
        Le::new(&mut new).u32(THREAD_LIST).loc(t.stack);
        assert_eq!(old, new, "MINIDUMP_DIRECTORY");
    }
}
