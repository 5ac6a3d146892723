//! Test fixtures in C: a shared library compiled with the system's `cc` at test time, and
//! `dlopen` of it.

use std::path::{Path, PathBuf};

/// Compiles C `source` (written next to the output) into the shared library `dir/name` with
/// `cc -shared -fPIC` and `flags`; returns its path.
pub fn build_shared(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write the C source");
    let out = dir.join(name);
    let st = std::process::Command::new(super::target::cc())
        .args(flags)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run cc (needed to build a test fixture)");
    assert!(st.success(), "cc failed for {name}");
    out
}

/// `dlopen(path, flags)`; panics with the path when it fails.
pub fn dlopen(path: &Path, flags: i32) -> *mut libc::c_void {
    let c = std::ffi::CString::new(path.to_str().expect("utf-8 path")).expect("no NUL in path");
    // SAFETY: a valid NUL-terminated path.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    assert!(!h.is_null(), "dlopen {path:?}");
    h
}
