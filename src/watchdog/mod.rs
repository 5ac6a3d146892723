//! Stall watchdog (WIP).
