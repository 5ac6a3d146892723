//! An object's unwind tables (`.eh_frame_hdr` and `.eh_frame`) as a walk reads them: in place
//! for objects that are never unloaded, else a private copy taken when the unwinder was built,
//! so that a rule derived while another thread `dlclose`s the object reads memory selftrace
//! owns.
#![allow(unsafe_code)]

use crate::modules::Object;
use crate::sys;
use core::ops::{Deref, Range};

/// Bytes the loader mapped, borrowed for as long as the object stays loaded (only used for
/// objects that are never unloaded).
#[derive(Clone, Copy)]
pub(crate) struct Mapped {
    ptr: *const u8,
    len: usize,
}

// SAFETY: Mapped is a read-only view of memory mapped by the loader for the life of the
// process; sharing it across threads is as safe as sharing a &[u8] to it.
unsafe impl Send for Mapped {}
// SAFETY: as above; nothing is ever written through it.
unsafe impl Sync for Mapped {}

impl Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a range of a permanent object's mapped segment (checked when
        // the snapshot was taken).
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Mapped {
    fn new(r: &Range<usize>) -> Mapped {
        Mapped {
            ptr: r.start as *const u8,
            len: r.len(),
        }
    }
}

/// Section bytes: the loader's mapping (objects that are never unloaded) or a private copy
/// taken when the unwinder was built (objects that `dlclose` could unmap under a walk).
pub(crate) enum Bytes {
    Mapped(Mapped),
    Owned(Box<[u8]>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(b) => b,
        }
    }
}

/// One object's unwind tables and where they were loaded.
pub(crate) struct UnwindData {
    pub(crate) hdr: Bytes,
    pub(crate) hdr_addr: usize,
    pub(crate) eh_frame: Bytes,
    pub(crate) eh_frame_addr: usize,
    pub(crate) text_addr: usize,
}

impl UnwindData {
    /// The tables of `o`, if it has both sections (and, for an object that can be unloaded,
    /// they could be copied: one that another thread `dlclose`s meanwhile gives none instead of
    /// a fault). Normal context (copies allocate).
    pub(crate) fn of(o: &Object) -> Option<UnwindData> {
        let permanent = o.permanent;
        let bytes = |r: &Range<usize>| {
            if permanent {
                Some(Bytes::Mapped(Mapped::new(r)))
            } else {
                let mut v = vec![0u8; r.len()];
                (sys::read_memory(r.start, &mut v) == r.len())
                    .then(|| Bytes::Owned(v.into_boxed_slice()))
            }
        };
        let (h, f) = (o.eh_frame_hdr.as_ref()?, o.eh_frame.as_ref()?);
        Some(UnwindData {
            hdr: bytes(h)?,
            hdr_addr: h.start,
            eh_frame: bytes(f)?,
            eh_frame_addr: f.start,
            text_addr: o.exec.first().map_or(0, |r| r.start),
        })
    }
}
