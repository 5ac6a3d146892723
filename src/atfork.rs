//! The `pthread_atfork` handlers: what every subsystem does around a `fork()` (see
//! [`crate::fork`] for the locks and why). This is the top floor: it calls into each subsystem,
//! and nothing but [`crate::init`] calls it; the lock mechanism itself is [`crate::fork`], at the
//! bottom, so that the subsystems' locks never import their own reset.
#![allow(unsafe_code)]

use crate::sys;
use core::sync::atomic::{AtomicBool, Ordering};

static REGISTERED: AtomicBool = AtomicBool::new(false);

/// The longest [`prepare`] delays a fork for the caches' locks, in all: lookups take
/// microseconds to milliseconds; a DWARF parse that takes longer is started over by the child.
pub(crate) const PREPARE_WAIT_NS: u64 = 200_000_000;

// Registers the child handler before main, in normal context (pthread_atfork allocates).
#[used]
#[link_section = ".init_array"]
static STARTUP: extern "C" fn() = startup_ctor;

extern "C" fn startup_ctor() {
    register();
}

/// Registers [`prepare`], [`parent`] and [`child`] with `pthread_atfork`, once. Normal
/// context (glibc allocates); the constructor above does it before `main`.
pub(crate) fn register() {
    if REGISTERED.swap(true, Ordering::AcqRel) {
        return;
    }
    if sys::atfork(prepare, parent, child).is_err() {
        REGISTERED.store(false, Ordering::Release);
    }
}

/// The `pthread_atfork` prepare handler, in the forking thread: takes the caches' locks, so
/// that the child gets them whole (see the module docs).
unsafe extern "C" fn prepare() {
    let deadline = sys::monotonic_ns().saturating_add(PREPARE_WAIT_NS);
    crate::symbolize::before_fork(deadline);
}

/// The `pthread_atfork` parent handler: releases what [`prepare`] took.
unsafe extern "C" fn parent() {
    crate::symbolize::after_fork_release();
}

/// The `pthread_atfork` child handler: runs in the new child, which has one thread.
unsafe extern "C" fn child() {
    crate::fork::next_generation();
    crate::symbolize::after_fork_release();
    sys::signal::after_fork();
    crate::crash::after_fork();
    crate::modules::after_fork();
    crate::symbolize::after_fork();
    crate::unwind::after_fork();
    crate::minidump::after_fork();
    #[cfg(feature = "threads")]
    crate::threads::after_fork();
    #[cfg(feature = "profile")]
    crate::profile::after_fork();
}
