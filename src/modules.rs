//! The loaded objects of this process: executable, shared libraries, vDSO.
//!
//! [`snapshot`] walks the loader's list (`dl_iterate_phdr`) and records, per object, what the
//! unwinder and the symbolizer need: path, load bias, mapped ranges, executable ranges, the
//! in-memory `.eh_frame_hdr`/`.eh_frame` and the GNU build-id. Nothing is read from files and
//! nothing is copied: the ranges point into memory the loader mapped.
//!
//! The snapshot is immutable. [`with_current`] gives the last one published (by `init()` or a
//! refresh); readers in signal handlers use it without locks.
#![allow(unsafe_code)]

use crate::published::Published;
use crate::sys;
use core::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// One loaded object.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Object {
    /// File path as the loader knows it; the main program's is resolved through
    /// `/proc/self/exe`, the vDSO's is `[vdso]`.
    pub path: String,
    /// Load bias: the difference between run-time addresses and the file's `p_vaddr`s.
    pub bias: usize,
    /// Run-time address range covering all `PT_LOAD` segments.
    pub range: Range<usize>,
    /// Run-time ranges of the executable `PT_LOAD` segments.
    pub exec: Vec<Range<usize>>,
    /// The file offset (`p_offset`) of each range of `exec`, in the same order: where the
    /// bytes at `exec[i].start` are in the file.
    pub exec_file_offsets: Vec<u64>,
    /// The `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`) in memory.
    pub eh_frame_hdr: Option<Range<usize>>,
    /// `.eh_frame` in memory: from the header's `eh_frame_ptr` to the end of its `PT_LOAD`.
    pub eh_frame: Option<Range<usize>>,
    /// The GNU build-id (`NT_GNU_BUILD_ID` note), if the object has one.
    pub build_id: Option<Vec<u8>>,
    /// This is the main program.
    pub is_main: bool,
    /// This is the kernel's vDSO.
    pub is_vdso: bool,
    /// The object can never be unloaded: the main program, the vDSO, or an object the loader
    /// mapped at program start (glibc never unloads those; known when selftrace is linked into
    /// the main program).
    pub permanent: bool,
}

impl Object {
    /// Whether `addr` lies in one of this object's executable segments.
    #[inline]
    pub fn is_code(&self, addr: usize) -> bool {
        self.exec.iter().any(|r| r.contains(&addr))
    }
}

/// An immutable list of loaded objects, sorted by start address.
#[derive(Debug, Default)]
pub struct Snapshot {
    objects: Vec<Object>,
    generation: u64,
    adds: u64,
    subs: u64,
}

impl Snapshot {
    /// The objects, sorted by start address.
    pub fn objects(&self) -> &[Object] {
        &self.objects
    }

    /// A number that grows with every snapshot taken in this process.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The object whose mapped range contains `addr`.
    ///
    /// # Async-signal safety
    /// Binary search, no allocation.
    pub fn find(&self, addr: usize) -> Option<&Object> {
        self.find_index(addr).map(|i| &self.objects[i])
    }

    /// Index into [`Snapshot::objects`] of the object containing `addr`.
    pub fn find_index(&self, addr: usize) -> Option<usize> {
        let i = self.objects.partition_point(|o| o.range.start <= addr);
        let i = i.checked_sub(1)?;
        self.objects[i].range.contains(&addr).then_some(i)
    }

    /// Whether the loader has loaded or unloaded objects since this snapshot was taken.
    ///
    /// Not async-signal-safe (it asks the loader, which takes its lock).
    pub fn is_stale(&self) -> bool {
        let (adds, subs) = sys::dl_load_counters();
        (adds, subs) != (self.adds, self.subs)
    }
}

static CURRENT: Published<Snapshot> = Published::new();

/// In a forked child: the reads of the parent's other threads ended with them.
pub(crate) fn after_fork() {
    CURRENT.after_fork();
}
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Takes a new snapshot of the loaded objects. Allocates; not async-signal-safe.
pub fn snapshot() -> Snapshot {
    let mut objects = Vec::new();
    let (adds, subs) = sys::dl_iterate_phdr(|info| {
        if let Some(o) = object_from_phdrs(info) {
            objects.push(o);
        }
    });
    objects.sort_by_key(|o| o.range.start);
    Snapshot {
        objects,
        generation: GENERATION.fetch_add(1, Ordering::Relaxed) + 1,
        adds,
        subs,
    }
}

/// Runs `f` on the last published snapshot (`None` before `init()`).
///
/// # Async-signal safety
/// Lock-free and allocation-free; the snapshot stays valid until `f` returns.
pub fn with_current<R>(f: impl FnOnce(Option<&Snapshot>) -> R) -> R {
    CURRENT.read(f)
}

/// Takes and publishes a new snapshot if the loader's object list changed since the last one
/// (or if there is none). Returns whether a new one was published. Normal context only.
pub(crate) fn refresh(force: bool) -> bool {
    CURRENT.update(false, |old| match old {
        Some(old) if !force && !old.is_stale() => None,
        _ => Some(snapshot()),
    })
}

/// Like [`refresh`], but gives up at once when another thread is refreshing.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn try_refresh() -> bool {
    CURRENT.update(true, |old| match old {
        Some(old) if !old.is_stale() => None,
        _ => Some(snapshot()),
    })
}

fn object_from_phdrs(info: &sys::PhdrInfo<'_>) -> Option<Object> {
    let bias = info.addr;
    let mut range: Option<Range<usize>> = None;
    let mut exec = Vec::new();
    let mut exec_file_offsets = Vec::new();
    let mut loads = Vec::new();
    let mut eh_frame_hdr = None;
    let mut build_id = None;
    for ph in info.phdrs {
        let start = bias.wrapping_add(ph.p_vaddr as usize);
        let end = start.wrapping_add(ph.p_memsz as usize);
        match ph.p_type {
            libc::PT_LOAD => {
                loads.push(start..end);
                range = Some(match range {
                    None => start..end,
                    Some(r) => r.start.min(start)..r.end.max(end),
                });
                if ph.p_flags & libc::PF_X != 0 {
                    exec.push(start..end);
                    #[allow(clippy::unnecessary_cast)] // u32 on 32-bit targets
                    exec_file_offsets.push(ph.p_offset as u64);
                }
            }
            libc::PT_GNU_EH_FRAME => eh_frame_hdr = Some(start..end),
            libc::PT_NOTE if build_id.is_none() => {
                // SAFETY: PT_NOTE segments of loaded objects are mapped (they lie inside a
                // PT_LOAD) and readable for p_memsz bytes.
                let bytes = unsafe { core::slice::from_raw_parts(start as *const u8, end - start) };
                build_id = find_build_id(bytes).map(<[u8]>::to_vec);
            }
            _ => {}
        }
    }
    let range = range?;
    let eh_frame = eh_frame_hdr.as_ref().and_then(|hdr| {
        // SAFETY: the PT_GNU_EH_FRAME segment lies inside a mapped PT_LOAD.
        let bytes = unsafe { core::slice::from_raw_parts(hdr.start as *const u8, hdr.len()) };
        let start = eh_frame_start(bytes, hdr.start, bias)?;
        let load = loads.iter().find(|l| l.contains(&start))?;
        Some(start..load.end)
    });
    let vdso = sys::vdso_base();
    let is_vdso = vdso != 0 && range.contains(&vdso);
    let name = info.name.to_string_lossy();
    let is_main = info.is_first && !is_vdso;
    let path = if is_vdso {
        "[vdso]".to_string()
    } else if name.is_empty() && is_main {
        std::fs::read_link("/proc/self/exe")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        name.into_owned()
    };
    Some(Object {
        path,
        bias,
        range,
        exec,
        exec_file_offsets,
        eh_frame_hdr,
        eh_frame,
        build_id,
        is_main,
        is_vdso,
        permanent: is_main || is_vdso || sys::is_startup_object(info.phdrs.as_ptr() as usize),
    })
}

/// Decodes `eh_frame_ptr` of an `.eh_frame_hdr` mapped at `hdr_addr`: the run-time address of
/// `.eh_frame`. Supports the encodings linkers emit (absolute or pc-relative, 4 or 8 bytes).
pub(crate) fn eh_frame_start(hdr: &[u8], hdr_addr: usize, bias: usize) -> Option<usize> {
    const DW_EH_PE_OMIT: u8 = 0xff;
    if hdr.len() < 8 || hdr[0] != 1 || hdr[1] == DW_EH_PE_OMIT {
        return None;
    }
    let enc = hdr[1];
    let field = &hdr[4..];
    let field_addr = hdr_addr + 4;
    let value: i64 = match enc & 0x0f {
        0x03 => u32::from_le_bytes(field.get(..4)?.try_into().ok()?) as i64,
        0x0b => i32::from_le_bytes(field.get(..4)?.try_into().ok()?) as i64,
        0x00 | 0x04 | 0x0c => i64::from_le_bytes(field.get(..8)?.try_into().ok()?),
        _ => return None,
    };
    match enc & 0x70 {
        // DW_EH_PE_absptr: a link-time address.
        0x00 => Some(bias.wrapping_add(value as usize)),
        // DW_EH_PE_pcrel: relative to the field itself.
        0x10 => Some(field_addr.wrapping_add(value as usize)),
        // DW_EH_PE_datarel: relative to the start of .eh_frame_hdr.
        0x30 => Some(hdr_addr.wrapping_add(value as usize)),
        _ => None,
    }
}

/// Finds the `NT_GNU_BUILD_ID` descriptor in a note segment's bytes.
pub(crate) fn find_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let align4 = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let namesz = u32::from_ne_bytes(notes[0..4].try_into().ok()?) as usize;
        let descsz = u32::from_ne_bytes(notes[4..8].try_into().ok()?) as usize;
        let ty = u32::from_ne_bytes(notes[8..12].try_into().ok()?);
        let name_end = 12usize.checked_add(align4(namesz))?;
        let desc_end = name_end.checked_add(align4(descsz))?;
        if desc_end > notes.len() {
            return None;
        }
        if ty == NT_GNU_BUILD_ID && notes.get(12..12 + namesz)? == b"GNU\0" {
            return notes.get(name_end..name_end + descsz);
        }
        notes = &notes[desc_end..];
    }
    None
}

/// A short human name for an object path: its file name.
pub fn short_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_has_main_libc_and_vdso_with_unwind_info() {
        let s = snapshot();
        let main = s
            .objects()
            .iter()
            .find(|o| o.is_main)
            .expect("main program");
        assert!(main.path.ends_with(
            std::env::current_exe()
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
        ));
        assert!(main.eh_frame_hdr.is_some() && main.eh_frame.is_some());
        assert!(main.build_id.as_ref().is_some_and(|b| !b.is_empty()));
        let here = snapshot_has_main_libc_and_vdso_with_unwind_info as *const () as usize;
        assert!(s.find(here).is_some_and(|o| o.is_main && o.is_code(here)));
        let libc_fn = libc::getpid as *const () as usize;
        let libc = s.find(libc_fn).expect("libc");
        assert!(libc.path.contains("libc.so"), "{}", libc.path);
        // Every Linux kernel maps a vDSO; qemu-user 7.2 does not (AT_SYSINFO_EHDR is 0 there).
        assert_eq!(
            s.objects().iter().any(|o| o.is_vdso),
            crate::sys::vdso_base() != 0
        );
        assert!(s.find(0).is_none());
        assert!(!s.is_stale());
    }

    #[test]
    fn build_id_parser_rejects_truncated_notes() {
        let mut note = Vec::new();
        note.extend_from_slice(&4u32.to_ne_bytes());
        note.extend_from_slice(&4u32.to_ne_bytes());
        note.extend_from_slice(&3u32.to_ne_bytes());
        note.extend_from_slice(b"GNU\0\x01\x02\x03\x04");
        assert_eq!(find_build_id(&note), Some(&[1u8, 2, 3, 4][..]));
        for cut in 0..note.len() {
            assert_eq!(find_build_id(&note[..cut]), None);
        }
    }
}
