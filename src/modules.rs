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
    /// Where the build-id's bytes are in memory (0 without a build-id): a check in a signal
    /// handler compares them with [`Object::build_id`] to tell this object from another one
    /// loaded later at the same address.
    pub build_id_addr: usize,
    /// The object's file as `stat(2)` saw it when the snapshot was taken (`/proc/self/exe` for
    /// the main program); `None` for the vDSO or a file that is gone. Symbol tables and line
    /// tables are kept per file: another file at the same path (a library rebuilt and loaded
    /// again) gets its own.
    pub file: Option<FileId>,
    /// This is the main program.
    pub is_main: bool,
    /// This is the kernel's vDSO.
    pub is_vdso: bool,
    /// The object can never be unloaded: the main program, the vDSO, or an object the loader
    /// mapped at program start (glibc never unloads those; known when selftrace is linked into
    /// the main program).
    pub permanent: bool,
}

/// What tells one file from another: device, inode, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// `st_size`.
    pub size: u64,
    /// `st_mtime` in nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl FileId {
    /// `stat(2)` of `path`. Normal context.
    fn of(path: &str) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

impl Object {
    /// Whether `addr` lies in one of this object's executable segments.
    #[inline]
    pub fn is_code(&self, addr: usize) -> bool {
        self.exec.iter().any(|r| r.contains(&addr))
    }

    /// Whether the object loaded at `addr` now is still this one (see [`Identity::verify`]).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn verify(&self, addr: usize) -> Verdict {
        verify(
            addr,
            self.permanent,
            self.bias,
            self.eh_frame_hdr.as_ref().map_or(0, |r| r.start),
            (self.build_id_addr, self.build_id.as_deref().unwrap_or(&[])),
            &self.path,
        )
    }

    /// What a lock-free check needs to tell, later, whether this object is still the one
    /// loaded at its addresses. Normal context (copies).
    pub(crate) fn identity(&self) -> Identity {
        Identity {
            permanent: self.permanent,
            bias: self.bias,
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map_or(0, |r| r.start),
            build_id_addr: self.build_id_addr,
            build_id: self.build_id.clone().unwrap_or_default().into(),
            path: self.path.as_str().into(),
        }
    }
}

/// Whether the object at an address is still the one a snapshot recorded there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The same object (or one that can never be unloaded).
    Same,
    /// Another object, or none: the recorded one was unloaded since the snapshot.
    Changed,
    /// Cannot be told without locks here: glibc lacks `_dl_find_object` (before 2.35, musl)
    /// and the object has no build-id.
    Unverified,
}

/// An object's identity as a snapshot recorded it, checked against what is loaded now without
/// locks and without allocation ([`Identity::verify`]): in a signal handler no refresh is
/// possible, and a library loaded after the snapshot where an unloaded one was (the kernel
/// reuses the hole) must not be named after the old one.
#[derive(Clone, Debug, Default)]
pub(crate) struct Identity {
    /// Never unloaded: no check needed.
    permanent: bool,
    bias: usize,
    /// The `.eh_frame_hdr` address, as `_dl_find_object` reports it (0 if none).
    eh_frame_hdr: usize,
    /// Where [`Identity::build_id`] is in memory (0 without one).
    build_id_addr: usize,
    build_id: Box<[u8]>,
    /// The path, as the loader's `link_map` has it (`l_name`).
    path: Box<str>,
}

impl Identity {
    /// Whether the object loaded at `addr` now is this one. `_dl_find_object` (lock-free)
    /// tells whether an object with the same unwind table address is there; the build-id's
    /// bytes in memory (or, without a build-id, the `link_map`'s load bias and path), read with
    /// the fault-safe [`sys::read_memory`], tell which. Costs a system call or two for an
    /// object that can be unloaded (about a microsecond), nothing for the others.
    ///
    /// # Async-signal safety
    /// Async-signal-safe: no allocation, no lock; reads that a concurrent `dlclose` unmaps
    /// fail instead of faulting.
    pub(crate) fn verify(&self, addr: usize) -> Verdict {
        verify(
            addr,
            self.permanent,
            self.bias,
            self.eh_frame_hdr,
            (self.build_id_addr, &self.build_id),
            &self.path,
        )
    }
}

/// The body of [`Identity::verify`] and [`Object::verify`].
///
/// # Async-signal safety
/// Async-signal-safe.
fn verify(
    addr: usize,
    permanent: bool,
    bias: usize,
    eh_frame_hdr: usize,
    (build_id_addr, build_id): (usize, &[u8]),
    path: &str,
) -> Verdict {
    if permanent {
        return Verdict::Same;
    }
    let link_map = match sys::dl_find_object(addr) {
        Ok(None) => return Verdict::Changed,
        Ok(Some(f)) if f.eh_frame_hdr != eh_frame_hdr => return Verdict::Changed,
        Ok(Some(f)) => f.link_map,
        Err(()) => 0,
    };
    if build_id_addr != 0 && !build_id.is_empty() {
        return if memory_is(build_id_addr, build_id) {
            Verdict::Same
        } else {
            Verdict::Changed
        };
    }
    if link_map == 0 {
        return Verdict::Unverified;
    }
    // `struct link_map` (<link.h>, public ABI): `l_addr`, then `l_name`.
    const W: usize = core::mem::size_of::<usize>();
    let mut head = [0u8; 2 * W];
    if sys::read_memory(link_map, &mut head) != head.len() {
        // Freed under us: the object is being unloaded.
        return Verdict::Changed;
    }
    let word = |i: usize| {
        let mut w = [0u8; W];
        w.copy_from_slice(&head[i * W..(i + 1) * W]);
        usize::from_ne_bytes(w)
    };
    let (l_addr, l_name) = (word(0), word(1));
    if l_addr != bias || l_name == 0 {
        return Verdict::Changed;
    }
    // The name and its NUL.
    if memory_is(l_name, path.as_bytes()) && memory_is(l_name + path.len(), &[0]) {
        Verdict::Same
    } else {
        Verdict::Changed
    }
}

/// Whether the memory at `addr` holds `want`, read in pieces with the fault-safe
/// [`sys::read_memory`] (an unreadable byte is a difference).
///
/// # Async-signal safety
/// Async-signal-safe; 256 bytes of stack.
fn memory_is(addr: usize, want: &[u8]) -> bool {
    let mut buf = [0u8; 256];
    let mut at = 0;
    while at < want.len() {
        let n = (want.len() - at).min(buf.len());
        let Some(a) = addr.checked_add(at) else {
            return false;
        };
        if sys::read_memory(a, &mut buf[..n]) != n || buf[..n] != want[at..at + n] {
            return false;
        }
        at += n;
    }
    true
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

    /// The loader's load and unload counters (`dlpi_adds`, `dlpi_subs`) when the snapshot was
    /// taken.
    pub(crate) fn counters(&self) -> (u64, u64) {
        (self.adds, self.subs)
    }

    /// Whether the loader has loaded or unloaded objects since this snapshot was taken (its
    /// `dlpi_adds`/`dlpi_subs` counters moved): about 20 ns.
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

// SAFETY: a `link_section` entry of linkme's slice, which only this crate reads.
#[allow(unsafe_code)]
#[linkme::distributed_slice(crate::fork::FORK_HOOKS)]
static FORK_HOOK: crate::fork::ForkHook =
    crate::fork::ForkHook::child(crate::fork::rank::MODULES, after_fork);
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
                build_id = find_build_id(bytes).map(|id| (id.as_ptr() as usize, id.to_vec()));
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
    let file = if is_vdso {
        None
    } else if is_main {
        FileId::of("/proc/self/exe")
    } else {
        FileId::of(&path)
    };
    let (build_id_addr, build_id) = match build_id {
        Some((addr, id)) => (addr, Some(id)),
        None => (0, None),
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
        build_id_addr,
        file,
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
    fn identity_is_checked_by_build_id_or_by_the_link_map_path() {
        if crate::sys::dl_find_object(0).is_err() {
            // glibc before 2.35: only the build-id is checked (below, with no link map).
            return;
        }
        let s = snapshot();
        let libc_fn = libc::getpid as *const () as usize;
        let o = s.find(libc_fn).expect("libc");
        // As if libc could be unloaded: the checks run.
        let mut id = o.identity();
        id.permanent = false;
        if !id.build_id.is_empty() {
            assert_eq!(id.verify(libc_fn), Verdict::Same);
            let mut other = id.clone();
            other.build_id[0] ^= 1;
            assert_eq!(other.verify(libc_fn), Verdict::Changed);
        }
        // Without a build-id: the link map's load bias and path.
        let mut by_path = id.clone();
        by_path.build_id = Box::new([]);
        by_path.build_id_addr = 0;
        assert_eq!(by_path.verify(libc_fn), Verdict::Same);
        let mut other = by_path.clone();
        other.path = format!("{}x", by_path.path).into();
        assert_eq!(other.verify(libc_fn), Verdict::Changed);
        let mut other = by_path.clone();
        other.bias += 4096;
        assert_eq!(other.verify(libc_fn), Verdict::Changed);
        // Another unwind table address: another object.
        let mut other = id.clone();
        other.eh_frame_hdr += 8;
        assert_eq!(other.verify(libc_fn), Verdict::Changed);
        // Nothing loaded there.
        assert_eq!(id.verify(8), Verdict::Changed);
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
