//! Stack capture (placeholder).
