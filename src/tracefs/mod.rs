//! tracefs (work in progress).
