//! The only place for raw libc calls. Every wrapper here is async-signal-safe unless its docs say
//! otherwise.

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// `write(2)` of the whole buffer, retrying on `EINTR` and on short writes.
///
/// # References
/// write(2)
pub(crate) fn write_all(fd: i32, mut buf: &[u8]) -> Result<(), i32> {
    while !buf.is_empty() {
        // SAFETY: buf is a valid readable slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(libc::EIO);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// `gettid(2)`: the calling thread's id.
pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// `open(2)` of a NUL-terminated path with `O_CLOEXEC` added to `flags`, retrying on `EINTR`.
/// Returns the fd or the `errno`.
///
/// # References
/// open(2)
pub(crate) fn open_cloexec(path: &core::ffi::CStr, flags: i32) -> Result<i32, i32> {
    loop {
        // SAFETY: path is a valid NUL-terminated string that outlives the call.
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd >= 0 {
            return Ok(fd);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// One `write(2)` call: no retry on short writes (a retry on a `trace_marker` fd would become a
/// second event); retries only on `EINTR`, when nothing was written. Returns the count written
/// or the `errno`.
///
/// # References
/// write(2)
#[inline]
pub(crate) fn write_once(fd: i32, buf: &[u8]) -> Result<usize, i32> {
    loop {
        // SAFETY: buf is a valid readable slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// `read(2)` once, retrying on `EINTR`. Returns the count read (0 at end of file) or the `errno`.
///
/// # References
/// read(2)
pub(crate) fn read(fd: i32, buf: &mut [u8]) -> Result<usize, i32> {
    loop {
        // SAFETY: buf is a valid writable slice for its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// `close(2)`; the result is ignored (the fd is gone either way on Linux).
///
/// # References
/// close(2)
pub(crate) fn close(fd: i32) {
    // SAFETY: closing an fd has no memory-safety preconditions; the caller owns fd.
    unsafe { libc::close(fd) };
}

/// `dup3(2)` with `O_CLOEXEC`: atomically makes `newfd` refer to `oldfd`'s file.
///
/// # References
/// dup3(2)
pub(crate) fn dup3_cloexec(oldfd: i32, newfd: i32) -> Result<(), i32> {
    loop {
        // SAFETY: dup3 has no memory-safety preconditions.
        let r = unsafe { libc::dup3(oldfd, newfd, libc::O_CLOEXEC) };
        if r >= 0 {
            return Ok(());
        }
        let e = errno();
        if e != libc::EINTR && e != libc::EBUSY {
            return Err(e);
        }
    }
}

/// `getpid(2)`: the process id (thread group id).
pub(crate) fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// `statfs(2)`'s `f_type` for a NUL-terminated path, or the `errno`.
///
/// # References
/// statfs(2)
pub(crate) fn statfs_type(path: &core::ffi::CStr) -> Result<i64, i32> {
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st is a valid out-pointer.
    let r = unsafe { libc::statfs(path.as_ptr(), &mut st) };
    if r == 0 {
        Ok(st.f_type as i64)
    } else {
        Err(errno())
    }
}

/// `pthread_atfork(3)` with only a child handler.
///
/// Not async-signal-safe (glibc allocates its handler list): call in normal context.
pub(crate) fn atfork_child(child: unsafe extern "C" fn()) -> Result<(), i32> {
    // SAFETY: the handler is a plain extern "C" fn valid for the program's lifetime.
    let r = unsafe { libc::pthread_atfork(None, None, Some(child)) };
    if r == 0 {
        Ok(())
    } else {
        Err(r)
    }
}

/// `getenv(3)` as raw bytes, without allocation or lock (unlike `std::env::var_os`).
///
/// Reading the environment races with a concurrent `setenv`; call it when no other thread
/// changes the environment (at start-up).
pub(crate) fn getenv(name: &core::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: name is NUL-terminated; getenv returns NULL or a pointer into the environment,
    // which lives as long as nobody replaces that variable (documented above).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: p is a valid NUL-terminated string from the environment.
        Some(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes())
    }
}
