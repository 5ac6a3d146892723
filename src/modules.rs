//! Loaded objects (placeholder while the snapshot is written).
