//! Where an object's DWARF is: its own file, or a separate debug file found by build-id or
//! `.gnu_debuglink` (and checked against the object's build-id or the link's CRC32), and
//! reading ranges of it. Normal context.

use super::file::{open_cache, open_file, Cache, Elf};
use object::read::ReadRef;
use object::{Object as _, ObjectSection as _};
use std::fs::File;
use std::io::Read as _;

/// The file that holds an object's DWARF, and what identifies it, so that `lines` opens the
/// same file again (and refuses a different one) when it first needs file:line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DwarfFile {
    /// Path to open (`/proc/self/exe` for the main program).
    pub path: Box<str>,
    /// The build-id the file must carry (the object's), if the object has one.
    pub build_id: Option<Box<[u8]>>,
    /// The CRC32 the file must have (a `.gnu_debuglink` file of an object without build-id).
    pub crc: Option<u32>,
}

impl DwarfFile {
    /// Opens and parses the file if it is still the one that was chosen, and returns it with a
    /// second handle on the same open file, to read large sections with
    /// [`read_range`]. Normal context; the cache (headers only) is
    /// leaked so that what was read from it lives as long as the process.
    pub(crate) fn open(&self) -> Option<(Elf<'static, &'static Cache>, File)> {
        let file = open_file(&self.path)?;
        let data = file.try_clone().ok()?;
        let cache: &'static Cache = Box::leak(Box::new(Cache::new(file)?));
        let f = Elf::parse(cache).ok()?;
        if let Some(want) = self.build_id.as_deref() {
            if f.build_id().ok().flatten() != Some(want) {
                return None;
            }
        }
        if let Some(crc) = self.crc {
            if file_crc32(&self.path) != Some(crc) {
                return None;
            }
        }
        Some((f, data))
    }
}

/// `len` bytes at `offset` of `file`, read with `pread` into a zeroed (calloc'd) buffer;
/// `None` past the end of the file.
pub(crate) fn read_range(file: &File, offset: u64, len: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt as _;
    let size = file.metadata().ok()?.len();
    if offset.checked_add(len)? > size {
        return None;
    }
    let mut v = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut v, offset).ok()?;
    Some(v)
}

pub(crate) fn has_debug_info<'d, R: ReadRef<'d>>(f: &Elf<'d, R>) -> bool {
    f.section_by_name(".debug_info")
        .is_some_and(|s| s.kind() != object::SectionKind::UninitializedData && s.size() > 0)
}

/// The CRC32 (IEEE 802.3, as `.gnu_debuglink` uses) of a whole file, read in chunks, with
/// crc32fast (the CRC of flate2, which `object`'s decompression already links; SIMD or the CPU's
/// CRC instructions where there are, a debug file of hundreds of MB in a fraction of a second).
pub(crate) fn file_crc32(path: &str) -> Option<u32> {
    let mut f = open_cache(path)?.into_inner();
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        crc.update(buf.get(..n)?);
    }
    Some(crc.finalize())
}

/// Finds a separate debug file for `path`, by build-id, then by `.gnu_debuglink`, and returns
/// it with the CRC it was checked against (debuglink only). A build-id file is used only when
/// its build-id equals the object's; a debuglink file only when its CRC32 is the one the link
/// names (and, when both carry build-ids, they are equal).
pub(crate) fn find_debug_file<'d, R: ReadRef<'d>>(
    path: &str,
    build_id: Option<&[u8]>,
    f: &Elf<'d, R>,
    roots: &[String],
) -> Option<(String, Option<u32>, Cache)> {
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        for r in roots {
            let c = format!("{r}/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
            let Some(cache) = open_cache(&c) else {
                continue;
            };
            let same = Elf::parse(&cache)
                .ok()
                .and_then(|d| d.build_id().ok().flatten().map(|h| h == id))
                == Some(true);
            if same {
                return Some((c, None, cache));
            }
        }
    }
    let Ok(Some((name, crc))) = f.gnu_debuglink() else {
        return None;
    };
    let name = core::str::from_utf8(name).ok()?;
    if name.contains('/') {
        return None;
    }
    let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or(".");
    let mut candidates = vec![format!("{dir}/{name}"), format!("{dir}/.debug/{name}")];
    for r in roots {
        candidates.push(format!("{r}{dir}/{name}"));
    }
    for c in candidates {
        if file_crc32(&c) != Some(crc) {
            continue;
        }
        let Some(cache) = open_cache(&c) else {
            continue;
        };
        let ok = match Elf::parse(&cache) {
            Ok(d) => match (build_id, d.build_id()) {
                (Some(want), Ok(Some(have))) => want == have,
                _ => true,
            },
            Err(_) => false,
        };
        if ok {
            return Some((c, Some(crc), cache));
        }
    }
    None
}
