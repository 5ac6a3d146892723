//! The values the public capture functions take and return: the walk mode, how a walk ended and
//! why, which of its frames are exact pcs, and the unwinder's counters.

/// The most frames one walk produces, whatever the buffer size.
pub const MAX_FRAMES: usize = 1 << 16;
/// The most signal frames one walk crosses.
pub const MAX_SIGNAL_FRAMES: usize = 16;

/// How a capture finds each caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnwindMode {
    /// DWARF CFI with a per-frame frame-pointer fallback (the default).
    #[default]
    Dwarf,
    /// Frame pointers only (for programs built with `-C force-frame-pointers=yes`).
    FramePointer,
}

// The raw form crosses the capture entry, which only ported architectures have.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
impl UnwindMode {
    pub(crate) fn to_raw(self) -> usize {
        match self {
            UnwindMode::Dwarf => 0,
            UnwindMode::FramePointer => 1,
        }
    }

    pub(crate) fn from_raw(raw: usize) -> UnwindMode {
        match raw {
            1 => UnwindMode::FramePointer,
            _ => UnwindMode::Dwarf,
        }
    }
}

/// What a [`Capture`](crate::Capture) returns: how many frames it wrote, how the walk ended,
/// and which of its frames are exact pcs ([`Walk::frame_kinds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Walk {
    /// Frames written into the buffer.
    pub frames: usize,
    /// Why the walk stopped.
    pub end: WalkEnd,
    /// The exact frames the walk knew of.
    pub(crate) kinds: FrameKinds,
}

impl Walk {
    /// A walk of `frames` frames that ended with `end`, none of them exact.
    pub(crate) const fn new(frames: usize, end: WalkEnd) -> Walk {
        Walk {
            frames,
            end,
            kinds: FrameKinds::NONE,
        }
    }

    /// Which frames of this walk are exact pcs, as the walk knew them: frame 0 of a walk from
    /// a register state or a `ucontext_t`, and the frame after each signal frame it crossed.
    /// A small `Copy` value to keep beside the frames.
    pub fn frame_kinds(&self) -> FrameKinds {
        self.kinds
    }

    /// The kind of frame `i` of this walk (`frames` is the buffer the walk filled): see
    /// [`FrameKinds::kind`]. Unlike
    /// [`symbolize::frame_kind`](crate::symbolize::frame_kind), it does not read code.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn frame_kind(&self, frames: &[usize], i: usize) -> FrameKind {
        self.kinds.kind(frames, i)
    }

    /// The walk reached the outermost frame (`_start`, `clone3`, or the end of a
    /// frame-pointer chain).
    pub fn is_complete(&self) -> bool {
        self.end == WalkEnd::Complete
    }

    /// Where and why the walk stopped early, if it did.
    pub fn truncation(&self) -> Option<Truncation> {
        match self.end {
            WalkEnd::Truncated(t) => Some(t),
            _ => None,
        }
    }
}

/// How an address of a captured stack is looked up.
///
/// Defined here, beside the walk that knows it ([`Walk::frame_kinds`]); public also as
/// [`symbolize::FrameKind`](crate::symbolize::FrameKind), where it was first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameKind {
    /// An exact pc: the first frame of a ucontext capture, or the frame after a signal
    /// trampoline. Looked up as is.
    Exact,
    /// A return address: looked up at `addr - 1`, so that a call at the very end of a function
    /// names that function and not the next one.
    Return,
}

impl FrameKind {
    /// The address to look up for a frame at `addr`.
    pub fn lookup_address(self, addr: usize) -> usize {
        match self {
            FrameKind::Exact => addr,
            FrameKind::Return => addr.saturating_sub(1),
        }
    }
}

/// Which frames of one captured stack are exact pcs (an interrupted pc, looked up as is) rather
/// than return addresses: frame 0 of a walk from a register state or a `ucontext_t`, and the
/// frame right after each signal frame the walk crossed. The walk records them as it crosses
/// them ([`Walk::frame_kinds`]), so nothing needs to read code to tell them again; a `Copy`
/// value of 36 bytes, to keep beside the frames.
///
/// It holds up to `MAX_SIGNAL_FRAMES + 1` indices, which is every exact frame a walk can have
/// (a walk stops after [`MAX_SIGNAL_FRAMES`] signal frames). Should a record ever hold more
/// exact frames than fit, it says so ([`FrameKinds::is_partial`]), and [`FrameKinds::kind`]
/// falls back to reading the code before the frames past the last one recorded.
///
/// The record can differ from reading the code before each frame
/// ([`symbolize::frame_kind`](crate::symbolize::frame_kind)), and then it is the right one: on
/// aarch64 a frame-pointer walk that does not know a trampoline (a handler installed after
/// `init`) follows the frame record the kernel leaves in the signal frame to the interrupted
/// code's link register, a return address, although it comes right after the trampoline.
#[derive(Clone, Copy)]
pub struct FrameKinds {
    /// The indices of the exact frames, ascending, in `at[..len]` (the rest is not read).
    at: [u16; MAX_SIGNAL_FRAMES + 1],
    len: u8,
    /// An exact frame after `at[len - 1]` could not be recorded.
    partial: bool,
}

impl FrameKinds {
    /// No exact frame: every frame is a return address (a capture of the current stack in
    /// normal context).
    pub const NONE: FrameKinds = FrameKinds {
        at: [0; MAX_SIGNAL_FRAMES + 1],
        len: 0,
        partial: false,
    };

    /// Forgets every index, in place (no 36-byte temporary on the stack of a debug build).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.partial = false;
    }

    /// Marks frame `i` exact. Indices come in ascending order. One past the capacity (or an
    /// index past [`MAX_FRAMES`]) is not recorded: the record becomes partial.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn push(&mut self, i: usize) {
        let n = self.len as usize;
        match (self.at.get_mut(n), u16::try_from(i)) {
            (Some(slot), Ok(i)) if !self.partial => {
                *slot = i;
                self.len += 1;
            }
            _ => self.partial = true,
        }
    }

    /// The indices of the exact frames recorded, ascending.
    pub fn exact(&self) -> &[u16] {
        &self.at[..self.len as usize]
    }

    /// Whether frame `i` is exact according to the record (see [`FrameKinds::kind`] for a
    /// partial record).
    pub fn is_exact(&self, i: usize) -> bool {
        self.exact().iter().any(|&e| e as usize == i)
    }

    /// Whether the walk had more exact frames than the record holds (never, for a walk of
    /// this crate: see the type's docs); then the frames past the last recorded are told by
    /// reading code ([`FrameKinds::kind`]).
    pub fn is_partial(&self) -> bool {
        self.partial
    }

    /// The kind of frame `i` of `frames` (the frames the walk wrote): [`FrameKind::Exact`] for
    /// a recorded exact frame, else [`FrameKind::Return`]. Only for a partial record, a frame
    /// past the last index recorded is told by reading the code before it, as
    /// [`symbolize::frame_kind`](crate::symbolize::frame_kind) does (exact when the frame
    /// before it is a signal trampoline).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub fn kind(&self, frames: &[usize], i: usize) -> FrameKind {
        if self.is_exact(i) {
            return FrameKind::Exact;
        }
        let last = self.exact().last().map_or(0, |&e| e as usize);
        match frames.get(i.wrapping_sub(1)) {
            Some(&prev) if self.partial && i > last && super::is_signal_trampoline(prev) => {
                FrameKind::Exact
            }
            _ => FrameKind::Return,
        }
    }

    /// The record of the first `n` frames only (for a stack cut to `n` frames).
    pub fn truncated(mut self, n: usize) -> FrameKinds {
        let keep = self.count_before(n);
        if keep < self.len as usize {
            self.len = keep as u8;
            self.partial = false;
        }
        self
    }

    /// How many of the recorded exact frames come before frame `n`.
    fn count_before(&self, n: usize) -> usize {
        self.exact()
            .iter()
            .take_while(|&&e| (e as usize) < n)
            .count()
    }
}

impl FrameKinds {
    /// The record of the frames from `n` on, renumbered from 0 (for a stack whose first `n`
    /// frames are dropped: `frames[n..]`).
    pub fn after(mut self, n: usize) -> FrameKinds {
        let drop = self.count_before(n);
        let len = self.len as usize;
        self.at.copy_within(drop..len, 0);
        self.len = (len - drop) as u8;
        for e in &mut self.at[..self.len as usize] {
            *e -= n as u16;
        }
        self
    }
}

impl Default for FrameKinds {
    fn default() -> FrameKinds {
        FrameKinds::NONE
    }
}

impl PartialEq for FrameKinds {
    fn eq(&self, other: &FrameKinds) -> bool {
        self.exact() == other.exact() && self.partial == other.partial
    }
}

impl Eq for FrameKinds {}

impl core::hash::Hash for FrameKinds {
    fn hash<H: core::hash::Hasher>(&self, h: &mut H) {
        self.exact().hash(h);
        self.partial.hash(h);
    }
}

impl core::fmt::Debug for FrameKinds {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FrameKinds")
            .field("exact", &self.exact())
            .field("partial", &self.partial)
            .finish()
    }
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WalkEnd {
    /// It reached the outermost frame: every frame of the stack is in the buffer.
    Complete,
    /// The buffer (or [`MAX_FRAMES`]) was full; the stack goes on.
    BufferFull,
    /// It could not find the caller of the last frame written.
    Truncated(Truncation),
}

/// Where a truncated walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Truncation {
    /// The pc of the last frame written (whose caller could not be found).
    pub pc: usize,
    /// Why.
    pub reason: StopReason,
}

/// Why a walk stopped before the outermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The pc has CFI, but it is malformed or uses something the evaluator does not support.
    NoUnwindRule,
    /// The frame's rule needs a register whose value is unknown in this frame (a caller-saved
    /// register after a call, or one the caller's frame did not save).
    RegisterUnknown,
    /// A rule reads memory that is not readable.
    UnreadableMemory,
    /// The caller's stack pointer would not lie above this frame's (a loop, or a corrupt stack).
    NoProgress,
    /// No CFI covers the pc, and the frame pointer does not lead to code of a loaded object.
    NoFramePointer,
    /// The CFI gave a return address outside the code of every loaded object: the CFI does not
    /// describe the code at the pc (hand-written assembly without complete CFI, say).
    BadReturnAddress,
    /// The `ucontext_t` above a signal trampoline is unreadable or empty.
    BadSignalFrame,
    /// More than [`MAX_SIGNAL_FRAMES`] nested signal frames.
    TooManySignalFrames,
    /// Every walk slot was taken by concurrent walks (see [`crate::init`]), and this frame's
    /// rule was not cached yet.
    Busy,
    /// The stack is deeper than the buffer that kept it (a profile's [`MAX_DEPTH`] frames):
    /// its outermost frames are missing. Walks into a caller's buffer end with
    /// [`WalkEnd::BufferFull`] instead.
    ///
    /// [`MAX_DEPTH`]: crate::profile::MAX_DEPTH
    TooDeep,
    /// An interrupted pc without CFI on a machine with a link register, where the link
    /// register and the frame record hold different return addresses and the code around them
    /// does not tell which is this frame's (a leaf without a record returns through the link
    /// register; a function with one, through the record).
    AmbiguousReturn,
    /// selftrace has no unwinder for this architecture (see the README's platform table): no
    /// frame was captured.
    Unsupported,
}

impl StopReason {
    /// A short lowercase description, as printed in `stack truncated: ...` lines.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::NoUnwindRule => "no unwind rule",
            StopReason::RegisterUnknown => "unwind rule needs an unknown register",
            StopReason::UnreadableMemory => "unreadable stack",
            StopReason::NoProgress => "stack pointer did not advance",
            StopReason::NoFramePointer => "no unwind info and no valid frame pointer",
            StopReason::BadReturnAddress => "unwind rule gives a return address outside code",
            StopReason::BadSignalFrame => "unreadable signal frame",
            StopReason::TooManySignalFrames => "too many nested signal frames",
            StopReason::Busy => "all unwinder slots busy",
            StopReason::TooDeep => "stack deeper than the profile keeps",
            StopReason::AmbiguousReturn => "no unwind info; link register and frame record differ",
            StopReason::Unsupported => "no unwinder for this architecture",
        }
    }
}

impl core::fmt::Display for StopReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `complete`, `buffer full`, or `truncated: no unwind rule at 0x7f3a2c1d2e40`.
///
/// # Async-signal safety
/// Async-signal-safe when the formatter's writer is (no allocation here).
impl core::fmt::Display for WalkEnd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WalkEnd::Complete => f.write_str("complete"),
            WalkEnd::BufferFull => f.write_str("buffer full"),
            WalkEnd::Truncated(t) => write!(f, "truncated: {t}"),
        }
    }
}

impl core::fmt::Display for Truncation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} at {:#x}", self.reason, self.pc)
    }
}

/// Counters of the unwinder since the process started, for tests and tuning. Each is a relaxed
/// atomic; `frames_reused` is bumped by walks that reuse frames, the others only on the slow
/// paths (never by a walk that the rule cache serves).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnwindStats {
    /// Windows of memory copied with `process_vm_readv` (reads off the walking thread's own
    /// stack): each is one system call.
    pub copies: u64,
    /// Rules derived from the CFI (misses of the shared rule cache).
    pub rules_derived: u64,
    /// Walks repeated precisely because a frame needed a register the fast path had dropped.
    pub precise_walks: u64,
    /// Frames taken from the thread's previous walk, their stack words checked unchanged,
    /// instead of stepped (see [`set_walk_reuse`](crate::unwind::set_walk_reuse)).
    pub frames_reused: u64,
}

/// The registers a stack walk needs.
///
/// On x86-64 `fp` is `rbp`; on aarch64 it is `x29` and `lr` is `x30`. `lr` is ignored on x86-64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    /// Program counter of the first frame (exact: not a return address).
    pub pc: usize,
    /// Stack pointer.
    pub sp: usize,
    /// Frame pointer.
    pub fp: usize,
    /// Link register (aarch64 only).
    pub lr: usize,
}

impl Regs {
    /// Registers for a walk that starts at `pc` with stack pointer `sp` and frame pointer `fp`.
    pub const fn new(pc: usize, sp: usize, fp: usize) -> Regs {
        Regs { pc, sp, fp, lr: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_kinds_record_past_their_capacity_as_partial() {
        assert_eq!(core::mem::size_of::<FrameKinds>(), 36, "as the docs say");
        let mut k = FrameKinds::NONE;
        for i in 0..=MAX_SIGNAL_FRAMES {
            k.push(i * 3);
        }
        assert!(!k.is_partial());
        assert_eq!(k.exact().len(), MAX_SIGNAL_FRAMES + 1);
        k.push(1000);
        assert!(k.is_partial(), "a crossing past the capacity is marked");
        assert_eq!(k.exact().len(), MAX_SIGNAL_FRAMES + 1);
        let frames = [0usize; 2000];
        assert_eq!(k.kind(&frames, 3), FrameKind::Exact);
        assert_eq!(k.kind(&frames, 4), FrameKind::Return);
        // Cut before the last recorded frame: nothing unrecorded remains.
        let t = k.truncated(10);
        assert_eq!(t.exact(), &[0, 3, 6, 9]);
        assert!(!t.is_partial());
        assert_eq!(t, {
            let mut e = FrameKinds::NONE;
            [0, 3, 6, 9].iter().for_each(|&i| e.push(i));
            e
        });
        // Dropping the first frames renumbers the rest.
        let a = t.after(4);
        assert_eq!(a.exact(), &[2, 5]);
        assert_eq!(t.after(0), t);
        assert_eq!(t.after(10).exact(), &[] as &[u16]);
        // An index past MAX_FRAMES cannot be recorded either.
        let mut big = FrameKinds::NONE;
        big.push(MAX_FRAMES);
        assert!(big.is_partial() && big.exact().is_empty());
    }
}
