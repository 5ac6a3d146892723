//! trace (work in progress).
