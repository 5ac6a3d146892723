//! usdt (work in progress).
