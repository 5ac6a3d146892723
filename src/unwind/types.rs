//! The values the public capture functions take and return: the walk mode, how a walk ended and
//! why, and the unwinder's counters.

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

/// What a [`Capture`](crate::Capture) returns: how many frames it wrote and how the walk
/// ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Walk {
    /// Frames written into the buffer.
    pub frames: usize,
    /// Why the walk stopped.
    pub end: WalkEnd,
}

impl Walk {
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
