//! POSIX timers that signal one thread (`timer_create` with `SIGEV_THREAD_ID`): the profiler's
//! sampling clocks. Not used in signal handlers.
#![allow(unsafe_code)]

use crate::error::Error;

/// A POSIX timer that sends a signal to one thread of this process; deleted on drop.
pub(crate) struct ThreadTimer {
    id: libc::timer_t,
}

// SAFETY: a timer_t is a process-wide handle (glibc: the kernel's timer id), usable from any
// thread of the process.
unsafe impl Send for ThreadTimer {}

impl ThreadTimer {
    /// `timer_create(2)`: a timer on `clock` that sends `sig` to thread `tid` with `value` in
    /// the signal's `si_value` (as `sival_ptr`). Not armed yet ([`ThreadTimer::set`]). Fails with
    /// [`Error::Sys`] `timer_create` (`EINVAL`/`ESRCH`: no such thread, or its clock is gone).
    ///
    /// # References
    /// timer_create(2)
    pub(crate) fn create(
        clock: libc::clockid_t,
        sig: i32,
        tid: i32,
        value: u64,
    ) -> Result<ThreadTimer, Error> {
        // SAFETY: all-zero is a valid sigevent.
        let mut sev: libc::sigevent = unsafe { core::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = sig;
        sev.sigev_notify_thread_id = tid;
        sev.sigev_value = libc::sigval {
            sival_ptr: value as usize as *mut libc::c_void,
        };
        let mut id: libc::timer_t = core::ptr::null_mut();
        // SAFETY: sev and id are valid; SIGEV_THREAD_ID names a thread of this process.
        if unsafe { libc::timer_create(clock, &mut sev, &mut id) } != 0 {
            return Err(Error::last_os("timer_create"));
        }
        Ok(ThreadTimer { id })
    }

    /// `timer_settime(2)`, relative: first expiry in `first_ns`, then every `interval_ns`.
    /// Fails with [`Error::Sys`] `timer_settime`.
    ///
    /// # References
    /// timer_settime(2)
    pub(crate) fn set(&self, first_ns: u64, interval_ns: u64) -> Result<(), Error> {
        let spec = libc::itimerspec {
            it_interval: timespec(interval_ns),
            it_value: timespec(first_ns),
        };
        // SAFETY: id is the timer created in `create` and not deleted (Drop does that);
        // spec is valid.
        if unsafe { libc::timer_settime(self.id, 0, &spec, core::ptr::null_mut()) } != 0 {
            return Err(Error::last_os("timer_settime"));
        }
        Ok(())
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        // SAFETY: id is a timer we created and did not delete yet.
        unsafe { libc::timer_delete(self.id) };
    }
}

/// The clock of thread `tid`'s CPU time: `MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`, as in
/// [`super::thread_cpu_ns`].
pub(crate) fn thread_cpu_clock(tid: i32) -> libc::clockid_t {
    ((!(tid as u32)) << 3 | 6) as libc::clockid_t
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}
