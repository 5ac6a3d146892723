//! Reading `.note.stapsdt` from any ELF file, and computing what the kernel needs to attach.

use crate::error::Error;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::read::{ReadCache, ReadRef};
use object::{elf, Endianness, FileKind};
use std::fs::File;
use std::path::{Path, PathBuf};

/// One probe site as its note describes it, with the addresses a tracer needs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeNote {
    /// The provider, e.g. `myapp`.
    pub provider: String,
    /// The probe's name, e.g. `request_start`.
    pub name: String,
    /// The raw argument string, e.g. `-4@%edi 8@%rax`.
    pub args: String,
    /// The arguments, parsed from [`ProbeNote::args`].
    pub arguments: Vec<ArgSpec>,
    /// The probe's address as recorded in the note.
    pub pc: u64,
    /// The `_.stapsdt.base` address as recorded in the note (0 when the file has none).
    pub base: u64,
    /// The semaphore's address as recorded in the note (0: no semaphore).
    pub semaphore: u64,
    /// The probe's address after adjusting `pc` by `sh_addr(.stapsdt.base) - base`.
    pub address: u64,
    /// The probe's offset in the file: what `uprobe_events` and `perf probe` attach to.
    /// `None` when the address lies in no `PT_LOAD` segment (a note left by code the linker
    /// removed has pc 0; a relocatable object has no segments), or the segment says it lies
    /// past the end of the file (a truncated file; a separate debug file, whose segments'
    /// bytes were left out).
    pub file_offset: Option<u64>,
    /// The semaphore's offset in the file, the `ref_ctr_offset` of `uprobe_events`; `None`
    /// without a semaphore (or when it lies in no `PT_LOAD`, or past the end of the file).
    pub semaphore_offset: Option<u64>,
}

/// One argument of a probe: `[-]SIZE@LOCATION`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArgSpec {
    /// Size in bytes: 1, 2, 4 or 8.
    pub size: u8,
    /// Whether the value is signed.
    pub signed: bool,
    /// Where it is: on x86-64 `%rdi`, `8(%rax)`, `$5`, `-20(%rbp)`...; on aarch64 `x0`,
    /// `[sp, 16]`, `[x1]`, `5`...
    pub location: String,
}

impl ArgSpec {
    /// Parses one `[-]N@LOCATION` (a bare location, without size, is read as 8 unsigned bytes,
    /// as old SystemTap notes wrote them).
    ///
    /// # Errors
    /// [`Error::BadElf`] for an empty `s`, a size other than 1, 2, 4 or 8 (with or without
    /// `-`), or an empty location.
    pub fn parse(s: &str) -> Result<ArgSpec, Error> {
        let Some((size, location)) = s.split_once('@') else {
            if s.is_empty() {
                return Err(Error::BadElf("empty probe argument"));
            }
            return Ok(ArgSpec {
                size: 8,
                signed: false,
                location: s.to_string(),
            });
        };
        let (signed, digits) = match size.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, size),
        };
        let size = match digits {
            "1" => 1,
            "2" => 2,
            "4" => 4,
            "8" => 8,
            _ => return Err(Error::BadElf("probe argument size is not 1, 2, 4 or 8")),
        };
        if location.is_empty() {
            return Err(Error::BadElf("probe argument without a location"));
        }
        Ok(ArgSpec {
            size,
            signed,
            location: location.to_string(),
        })
    }
}

/// Reads every stapsdt probe note of the ELF file at `path` (an executable or a shared library,
/// ours or built with SystemTap's `sys/sdt.h`).
///
/// Only the ELF header, the program and section headers, the section names and the
/// `.note.stapsdt` section are read (with `pread`), whatever the file's size.
///
/// # Errors
/// The error is a [`ReadError`]: it names `path` ([`ReadError::path`]), says
/// `reading probes of PATH: ...`, and has the [`std::io::Error`] of a failed `open` or
/// `fstat` as its source. Its [`kind`](ReadError::kind): anything but a regular file (a FIFO,
/// a device such as `/dev/zero`, a directory) is refused with [`Error::InvalidInput`] before a
/// byte is read; a missing file gives [`Error::NotFound`]`("elf file")`, an unreadable one
/// [`Error::PermissionDenied`], another failed `open` or `fstat` [`Error::Sys`] with its errno.
/// Malformed files give [`Error::BadElf`]; this never panics on any input.
pub fn read_probes(path: impl AsRef<Path>) -> Result<Vec<ProbeNote>, ReadError> {
    const OP: &str = "reading probes of";
    let path = path.as_ref();
    let cache = open_elf(path, OP)?;
    probes_in(&cache).map_err(|kind| ReadError::new(kind, OP, path, None))
}

/// The error of [`read_probes`]: which file, what was wrong with it (the crate's `Copy`
/// [`Error`] as its [`kind`](Self::kind)), and the [`std::io::Error`] of a failed `open` or
/// `fstat` as its [`source`](std::error::Error::source) (else the kind).
///
/// `Display` is one lowercase line: `reading probes of /usr/bin/app: not found: elf file`,
/// `reading probes of /etc/hostname: malformed elf file: not an elf file`. [`From`] converts
/// it into the crate's [`Error`] (its kind), into a [`std::io::Error`] (the errno's
/// [`ErrorKind`](std::io::ErrorKind), this error as the payload) and, with the `tracefs`
/// feature, into a `tracefs::Error` (path and source kept, so `read_probes(bin)?` works where
/// that is returned).
#[derive(Debug)]
pub struct ReadError {
    kind: Error,
    /// `reading probes of`, `reading the symbols of`: printed before the path.
    op: &'static str,
    path: PathBuf,
    io: Option<std::io::Error>,
}

impl ReadError {
    fn new(kind: Error, op: &'static str, path: &Path, io: Option<std::io::Error>) -> ReadError {
        ReadError {
            kind,
            op,
            path: path.to_path_buf(),
            io,
        }
    }

    /// What was wrong: [`Error::NotFound`]`("elf file")`, [`Error::PermissionDenied`],
    /// [`Error::InvalidInput`] (not a regular file), [`Error::BadElf`] (not an ELF file, or a
    /// malformed one), or [`Error::Sys`] with the errno of another failed `open` or `fstat`.
    pub fn kind(&self) -> Error {
        self.kind
    }

    /// The file that was read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Everything, for the conversion into `tracefs::Error`.
    #[allow(dead_code)]
    pub(crate) fn into_parts(self) -> (Error, &'static str, PathBuf, Option<std::io::Error>) {
        (self.kind, self.op, self.path, self.io)
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ", self.op)?;
        crate::error::write_name(f, &self.path.to_string_lossy())?;
        match (&self.kind, &self.io) {
            // `open failed: ...` would repeat the operation: the OS's message is the cause.
            (Error::Sys { .. }, Some(io)) => write!(f, ": {io}"),
            (kind, _) => write!(f, ": {kind}"),
        }
    }
}

impl std::error::Error for ReadError {
    /// The `io::Error` of the failed `open` or `fstat`, else the [`kind`](ReadError::kind).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.io {
            Some(io) => Some(io),
            None => Some(&self.kind),
        }
    }
}

/// The kind alone ([`ReadError::kind`]), for code that keeps the crate's `Copy` error.
impl From<ReadError> for Error {
    fn from(e: ReadError) -> Error {
        e.kind
    }
}

/// The errno's [`ErrorKind`](std::io::ErrorKind) (or the kind's: `NotFound`,
/// `PermissionDenied`, `InvalidInput`, `InvalidData` for a malformed file), with the
/// [`ReadError`] as its payload.
impl From<ReadError> for std::io::Error {
    fn from(e: ReadError) -> std::io::Error {
        use std::io::ErrorKind as K;
        let kind = match (&e.io, e.kind) {
            (Some(io), _) => io.kind(),
            (None, Error::NotFound(_)) => K::NotFound,
            (None, Error::PermissionDenied) => K::PermissionDenied,
            (None, Error::InvalidInput(_)) => K::InvalidInput,
            (None, Error::BadElf(_)) => K::InvalidData,
            (None, Error::Sys { errno, .. }) => std::io::Error::from_raw_os_error(errno).kind(),
            (None, _) => K::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// Opens `path` for reading its parts on demand: only a regular file, opened with `O_NONBLOCK`
/// (so that a FIFO does not block the open) and checked with `fstat` before any read. Errors
/// say `{op} PATH: ...`.
pub(crate) fn open_elf(path: &Path, op: &'static str) -> Result<ReadCache<File>, ReadError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |e: std::io::Error, call: &'static str| {
        let kind = match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => Error::NotFound("elf file"),
            Some(libc::EACCES) | Some(libc::EPERM) => Error::PermissionDenied,
            errno => Error::Sys {
                call,
                errno: errno.unwrap_or(libc::EIO),
            },
        };
        ReadError::new(kind, op, path, Some(e))
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io(e, "open"))?;
    let meta = file.metadata().map_err(|e| io(e, "fstat"))?;
    if !meta.is_file() {
        return Err(ReadError::new(
            Error::InvalidInput(
                "not a regular file (a fifo, device or directory is not an elf file)",
            ),
            op,
            path,
            None,
        ));
    }
    Ok(ReadCache::new(file))
}

/// [`read_probes`] on the bytes of an ELF file; its error is the crate's `Copy` one (there is
/// no file to name).
///
/// # Errors
/// [`Error::BadElf`] when `data` is not an ELF file or is malformed: its headers, its
/// `.note.stapsdt` notes, or their argument strings (see [`ArgSpec::parse`]).
pub fn parse_probes(data: &[u8]) -> Result<Vec<ProbeNote>, Error> {
    probes_in(data)
}

fn probes_in<'d, R: ReadRef<'d>>(data: R) -> Result<Vec<ProbeNote>, Error> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => parse::<elf::FileHeader64<Endianness>, R>(data),
        Ok(FileKind::Elf32) => parse::<elf::FileHeader32<Endianness>, R>(data),
        _ => Err(Error::BadElf("not an elf file")),
    }
}

/// A `PT_LOAD` segment: where a range of addresses sits in the file.
struct Load {
    vaddr: u64,
    offset: u64,
    filesz: u64,
}

fn to_file_offset(loads: &[Load], addr: u64) -> Option<u64> {
    loads
        .iter()
        .find(|l| addr >= l.vaddr && addr - l.vaddr < l.filesz)
        .and_then(|l| (addr - l.vaddr).checked_add(l.offset))
}

fn parse<'d, Elf: FileHeader<Endian = Endianness>, R: ReadRef<'d>>(
    data: R,
) -> Result<Vec<ProbeNote>, Error> {
    let header = Elf::parse(data).map_err(|_| Error::BadElf("bad elf header"))?;
    let endian = header
        .endian()
        .map_err(|_| Error::BadElf("bad elf endianness"))?;
    let word = if header.is_type_64() { 8 } else { 4 };

    // A segment's bytes are where the file has them: the part of a segment past the end of the
    // file (a truncated file; a separate debug file, whose segments' bytes were left out) has
    // no file offset to attach to.
    let len = data.len().unwrap_or(0);
    let mut loads = Vec::new();
    for ph in header
        .program_headers(endian, data)
        .map_err(|_| Error::BadElf("bad program headers"))?
    {
        if ph.p_type(endian) == elf::PT_LOAD {
            let offset: u64 = ph.p_offset(endian).into();
            let filesz: u64 = ph.p_filesz(endian).into();
            loads.push(Load {
                vaddr: ph.p_vaddr(endian).into(),
                offset,
                filesz: filesz.min(len.saturating_sub(offset)),
            });
        }
    }

    let sections = header
        .sections(endian, data)
        .map_err(|_| Error::BadElf("bad section headers"))?;
    let mut base_addr = None;
    for section in sections.iter() {
        if sections.section_name(endian, section).ok() == Some(b".stapsdt.base".as_slice()) {
            base_addr = Some(section.sh_addr(endian).into());
        }
    }

    let mut probes = Vec::new();
    for section in sections.iter() {
        if section.sh_type(endian) != elf::SHT_NOTE
            || sections.section_name(endian, section).ok() != Some(b".note.stapsdt".as_slice())
        {
            continue;
        }
        let Some(mut notes) = section
            .notes(endian, data)
            .map_err(|_| Error::BadElf("bad .note.stapsdt section"))?
        else {
            continue;
        };
        while let Some(note) = notes
            .next()
            .map_err(|_| Error::BadElf("bad note in .note.stapsdt"))?
        {
            if note.name() != b"stapsdt" || note.n_type(endian) != object::elf::NoteType(3) {
                continue;
            }
            let little = endian == Endianness::Little;
            probes.push(parse_note(note.desc(), word, little, base_addr, &loads)?);
        }
    }
    Ok(probes)
}

fn parse_note(
    desc: &[u8],
    word: usize,
    little: bool,
    base_addr: Option<u64>,
    loads: &[Load],
) -> Result<ProbeNote, Error> {
    let addr = |i: usize| -> Result<u64, Error> {
        let b = desc
            .get(i * word..(i + 1) * word)
            .ok_or(Error::BadElf("stapsdt note too short"))?;
        // Notes are written in the file's byte order.
        Ok(b.iter().enumerate().fold(0u64, |acc, (i, &x)| {
            let shift = if little { 8 * i } else { 8 * (word - 1 - i) };
            acc | (x as u64) << shift
        }))
    };
    let pc = addr(0)?;
    let base = addr(1)?;
    let semaphore = addr(2)?;
    let mut strings = desc.get(3 * word..).unwrap_or_default().split(|&b| b == 0);
    let mut next = |what: &'static str| -> Result<String, Error> {
        let s = strings.next().ok_or(Error::BadElf(what))?;
        String::from_utf8(s.to_vec()).map_err(|_| Error::BadElf("stapsdt note string is not utf-8"))
    };
    let provider = next("stapsdt note without provider")?;
    let name = next("stapsdt note without name")?;
    let args = next("stapsdt note without argument string").unwrap_or_default();
    if provider.is_empty() || name.is_empty() {
        return Err(Error::BadElf("stapsdt note with an empty provider or name"));
    }
    let arguments = split_args(&args)
        .map(ArgSpec::parse)
        .collect::<Result<Vec<_>, _>>()?;
    // A file prelinked or otherwise moved after the note was written has `.stapsdt.base` at a
    // different address than the note recorded; the pc moved by the same amount.
    let address = match base_addr {
        Some(b) if base != 0 => pc.wrapping_add(b.wrapping_sub(base)),
        _ => pc,
    };
    let file_offset = to_file_offset(loads, address);
    let semaphore_offset = if semaphore == 0 {
        None
    } else {
        to_file_offset(loads, semaphore)
    };
    Ok(ProbeNote {
        provider,
        name,
        args,
        arguments,
        pc,
        base,
        semaphore,
        address,
        file_offset,
        semaphore_offset,
    })
}

/// The arguments of a note's argument string: separated by spaces, except inside brackets
/// (aarch64's memory operands, `-4@[sp, 16]`, as sys/sdt.h writes them).
fn split_args(args: &str) -> impl Iterator<Item = &str> {
    let mut rest = args;
    std::iter::from_fn(move || {
        rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
        if rest.is_empty() {
            return None;
        }
        let mut depth = 0usize;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '[' => depth += 1,
                    ']' => depth = depth.saturating_sub(1),
                    _ => {}
                }
                depth == 0 && c.is_ascii_whitespace()
            })
            .map_or(rest.len(), |(i, _)| i);
        let (arg, tail) = rest.split_at(end);
        rest = tail;
        Some(arg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aarch64_arguments_keep_their_brackets() {
        let a: Vec<&str> = split_args("8@x0 -4@[sp, 16]  8@[x1] 8@[x1, 8] -8@-5").collect();
        assert_eq!(a, ["8@x0", "-4@[sp, 16]", "8@[x1]", "8@[x1, 8]", "-8@-5"]);
        assert_eq!(ArgSpec::parse(a[1]).unwrap().location, "[sp, 16]");
        // An unclosed bracket runs to the end, never past it.
        assert_eq!(split_args("8@[x0, 8").collect::<Vec<_>>(), ["8@[x0, 8"]);
        assert_eq!(split_args("  ").count(), 0);
    }

    #[test]
    fn arg_specs() {
        assert_eq!(
            ArgSpec::parse("-4@%edi").unwrap(),
            ArgSpec {
                size: 4,
                signed: true,
                location: "%edi".into()
            }
        );
        assert_eq!(ArgSpec::parse("8@8(%rax)").unwrap().location, "8(%rax)");
        assert!(ArgSpec::parse("3@%rax").is_err());
        assert!(ArgSpec::parse("4@").is_err());
    }

    fn desc(words: [u64; 3], big: bool, strings: &[u8]) -> Vec<u8> {
        let mut d = Vec::new();
        for w in words {
            d.extend_from_slice(&if big {
                w.to_be_bytes()
            } else {
                w.to_le_bytes()
            });
        }
        d.extend_from_slice(strings);
        d
    }

    #[test]
    fn notes_and_offsets() {
        let loads = [
            Load {
                vaddr: 0x1000,
                offset: 0x800,
                filesz: 0x1000,
            },
            Load {
                vaddr: 0x5000,
                offset: 0x2000,
                filesz: 0x100,
            },
        ];
        for big in [false, true] {
            let d = desc(
                [0x1234, 0x1000, 0x5010],
                big,
                b"prov\0name\0-4@%edi 8@8(%rax)\0",
            );
            // .stapsdt.base moved by 0x10 since the note was written: so did the probe.
            let n = parse_note(&d, 8, !big, Some(0x1010), &loads).unwrap();
            assert_eq!((n.provider.as_str(), n.name.as_str()), ("prov", "name"));
            assert_eq!(n.address, 0x1244);
            assert_eq!(n.file_offset, Some(0xa44));
            assert_eq!(n.semaphore_offset, Some(0x2010));
            assert_eq!(n.arguments.len(), 2);
        }
        // pc 0: a note left by removed code has no file offset.
        let d = desc([0, 0x1000, 0], false, b"p\0n\0\0");
        let n = parse_note(&d, 8, true, Some(0x1000), &loads).unwrap();
        assert_eq!((n.file_offset, n.semaphore_offset), (None, None));
        assert!(parse_note(&d[..20], 8, true, None, &loads).is_err());
        let d = desc([1, 2, 3], false, b"\0n\0\0");
        assert!(parse_note(&d, 8, true, None, &loads).is_err());
    }

    #[test]
    fn read_errors_name_the_file() {
        use std::error::Error as _;
        let e = read_probes("/nonexistent/dir/x").unwrap_err();
        assert_eq!(e.kind(), Error::NotFound("elf file"));
        assert_eq!(e.path(), Path::new("/nonexistent/dir/x"));
        assert_eq!(
            e.to_string(),
            "reading probes of /nonexistent/dir/x: not found: elf file"
        );
        let io = e.source().unwrap().downcast_ref::<std::io::Error>();
        assert_eq!(io.unwrap().raw_os_error(), Some(libc::ENOENT));
        let e = read_probes("/").unwrap_err();
        assert!(matches!(e.kind(), Error::InvalidInput(_)));
        assert_eq!(e.source().unwrap().downcast_ref::<Error>(), Some(&e.kind()));
        let io = std::io::Error::from(e);
        assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
        assert!(io.to_string().starts_with("reading probes of /: "), "{io}");
        let e = ReadError::new(
            Error::BadElf("bad elf header"),
            "reading probes of",
            Path::new("/a b"),
            None,
        );
        assert_eq!(
            e.to_string(),
            "reading probes of \"/a b\": malformed elf file: bad elf header"
        );
    }

    #[test]
    fn not_elf() {
        assert_eq!(
            parse_probes(b"hello"),
            Err(Error::BadElf("not an elf file"))
        );
        assert!(parse_probes(&[]).is_err());
    }
}
