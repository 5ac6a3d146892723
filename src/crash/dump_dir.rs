//! One minidump in a directory, start to end: a new file under a temporary name, the dump
//! written into it (under the output lock), `fsync`, then renamed to its `<uuid>.dmp` name, or
//! removed when the dump failed. The crash handler and the watchdog both write their
//! directory dumps here. (The low-level parts, `create_in` and `finish_in`, are minidump's.)
//!
//! # Async-signal safety
//! [`write_in`] is async-signal-safe, as [`crate::minidump::write`] is.

use crate::error::Error;
use crate::minidump::{Fault, Options, Summary};
use crate::report::lock::OutputLock;
use crate::sys;

/// Writes a minidump into a new file of the directory `dir` (an fd from
/// [`crate::minidump::open_dir`]), its name into `name`. Returns the name's length and how the
/// dump went (a failed rename fails it too), or the `errno` when no file could be created.
pub(crate) fn write_in(
    dir: i32,
    name: &mut [u8; 48],
    fault: Option<&Fault>,
    options: &Options,
    timeout_ns: u64,
) -> Result<(usize, Result<Summary, Error>), i32> {
    let (fd, len) = crate::minidump::create_in(dir, name)?;
    let mut result = {
        // Held already by a crash report (then this takes nothing).
        let _lock = OutputLock::acquire();
        crate::minidump::write(fd, fault, options, timeout_ns)
    };
    // SAFETY: fsync has no memory effects; the dump should survive a power cut.
    unsafe { libc::fsync(fd) };
    sys::close(fd);
    if let Err(errno) = crate::minidump::finish_in(dir, &name[..len], result.is_ok()) {
        if result.is_ok() {
            result = Err(Error::Sys {
                call: "renameat",
                errno,
            });
        }
    }
    Ok((len, result))
}
