//! Finds the first `tracefs` mount in `/proc/self/mountinfo` without allocating, so that the
//! marker writer can run it lazily, even from a signal handler.

use crate::sys;

/// Size of the line buffer; longer lines are skipped.
const LINE_MAX: usize = 4096;

/// Looks for the first line whose filesystem type is `tracefs` and copies its mount point
/// (with mountinfo's `\ooo` escapes decoded) into `out`. Returns the length, or `None` when
/// there is no tracefs mount, the file cannot be read, or the path does not fit.
///
/// # Signal Safe
/// Only `open`, `read` and `close`; no allocation, no lock.
pub(crate) fn first_tracefs_mount(out: &mut [u8]) -> Option<usize> {
    let fd = sys::open_cloexec(c"/proc/self/mountinfo", libc::O_RDONLY).ok()?;
    let mut buf = [0u8; LINE_MAX];
    let mut len = 0usize; // bytes of the current (partial) line in buf
    let mut skipping = false; // the current line did not fit: skip to its end
    let mut found = None;
    'read: loop {
        let n = match sys::read(fd, &mut buf[len..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        len += n;
        let mut start = 0;
        while let Some(nl) = buf[start..len].iter().position(|&b| b == b'\n') {
            let line = &buf[start..start + nl];
            start += nl + 1;
            if skipping {
                skipping = false;
                continue;
            }
            if let Some(l) = tracefs_mount_point(line, out) {
                found = Some(l);
                break 'read;
            }
        }
        buf.copy_within(start..len, 0);
        len -= start;
        if len == buf.len() {
            // A line longer than the buffer: drop it.
            len = 0;
            skipping = true;
        }
    }
    sys::close(fd);
    found
}

/// If `line` describes a tracefs mount, decodes its mount point into `out`.
///
/// Format (proc(5)): `id parent major:minor root mountpoint options [optional...] - fstype
/// source superoptions`.
pub(crate) fn tracefs_mount_point(line: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut fields = line.split(|&b| b == b' ');
    let mount_point = fields.nth(4)?;
    // Skip to the separator "-", the next field is the filesystem type.
    let mut rest = fields.skip_while(|f| *f != b"-");
    rest.next()?;
    if rest.next()? != b"tracefs" {
        return None;
    }
    unescape(mount_point, out)
}

/// Decodes mountinfo's octal escapes (`\040` for a space, etc.).
fn unescape(s: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut i = 0;
    let mut o = 0;
    while i < s.len() {
        let b = if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (s[i + 1] - b'0') as u32 * 64
                + (s[i + 2] - b'0') as u32 * 8
                + (s[i + 3] - b'0') as u32;
            i += 4;
            v as u8
        } else {
            i += 1;
            s[i - 1]
        };
        *out.get_mut(o)? = b;
        o += 1;
    }
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let mut out = [0u8; 256];
        let l = b"42 23 0:13 / /sys/kernel/tracing rw,relatime - tracefs nodev rw";
        let n = tracefs_mount_point(l, &mut out).unwrap();
        assert_eq!(&out[..n], b"/sys/kernel/tracing");
        let l = b"50 23 0:13 / /mnt/my\\040trace rw shared:5 master:2 - tracefs nodev rw";
        let n = tracefs_mount_point(l, &mut out).unwrap();
        assert_eq!(&out[..n], b"/mnt/my trace");
        let l = b"22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw";
        assert!(tracefs_mount_point(l, &mut out).is_none());
        assert!(tracefs_mount_point(b"garbage", &mut out).is_none());
    }
}
