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
