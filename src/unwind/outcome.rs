//! What a walk starts from and what it returns to the entry points.

use super::regs::RegSet;
use super::types::{FrameKinds, Walk, WalkEnd};

/// How a walk ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outcome {
    /// Frames written.
    pub(crate) frames: usize,
    /// Why the walk stopped.
    pub(crate) end: WalkEnd,
    /// The walk crossed a signal trampoline: it ran inside a signal handler.
    pub(crate) signal_frames: usize,
    /// A pc lay in an object the loader knows but the published snapshot does not (loaded
    /// since, or loaded where an object of the snapshot was unloaded).
    pub(crate) unknown_object: bool,
    /// `init()` had published an unwinder when the walk ran.
    pub(crate) initialized: bool,
    /// The exact frames: frame 0 of an exact start, each frame after a signal frame.
    pub(crate) kinds: FrameKinds,
}

impl Outcome {
    /// What the public capture functions return.
    pub(crate) fn walk(&self) -> Walk {
        Walk {
            frames: self.frames,
            end: self.end,
            kinds: self.kinds,
        }
    }
}

impl Default for Outcome {
    fn default() -> Outcome {
        Outcome {
            frames: 0,
            end: WalkEnd::BufferFull,
            signal_frames: 0,
            unknown_object: false,
            initialized: false,
            kinds: FrameKinds::NONE,
        }
    }
}

/// The first frame of a walk.
#[derive(Clone, Copy)]
pub(crate) enum Start {
    /// The pc is exact (an interrupted pc or a caller-supplied state).
    Exact(RegSet),
    /// The pc is a return address (the caller of a capture function).
    Return(RegSet),
}

impl Start {
    pub(crate) fn sp(&self) -> usize {
        match self {
            Start::Exact(r) | Start::Return(r) => r.sp(),
        }
    }
}
