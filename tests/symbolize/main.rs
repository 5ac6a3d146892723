//! The symbolizer's integration tests, one binary (as rustix's tests/<subsystem>/main.rs):
//! none of them sets process-wide state that another one reads. Tests that run a copy of this
//! binary as a child select their child test by its full name (`files::child_report`).

#[path = "../support/addr2line.rs"]
mod addr2line;
#[path = "../support/counting.rs"]
mod counting;
#[path = "../support/sysroot.rs"]
mod sysroot;
#[path = "../support/target.rs"]
mod target;

mod files;
mod names;
mod signal;
mod stripped;

/// A test's own directory, `CARGO_TARGET_TMPDIR/GROUP/NAME`, empty when made; removed when
/// dropped unless the test is failing (then kept, to look at: copies of this binary and debug
/// files, tens of MB each).
pub struct WorkDir(std::path::PathBuf);

impl WorkDir {
    pub fn new(group: &str, name: &str) -> WorkDir {
        let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(group)
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        WorkDir(d)
    }
}

impl std::ops::Deref for WorkDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for WorkDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

// signal.rs counts the allocations of its own thread only (see support/counting.rs).
#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;
