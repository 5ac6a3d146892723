//! Files of the toolchain that builds this crate (rustup's, through the `rustc` on `PATH`).

use std::path::PathBuf;

/// The first file in `rustc --print sysroot`'s `lib/` whose name passes `wanted` (rustup's
/// `librustc_driver-*.so`, `libLLVM.so.*`), if there is one.
pub fn lib_file(wanted: impl Fn(&str) -> bool) -> Option<PathBuf> {
    let out = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let lib = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("lib");
    std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&wanted))
}

/// rustup's `libLLVM.so.*` (C++, 150,000 text symbols, built with lld), for a test that checks
/// a large object this project did not build: on x86-64, where rustup ships it, a missing one
/// fails the test under `SELFTRACE_REQUIRE_TRACEFS` (CI) and is reported as skipped (`what`)
/// otherwise; on other architectures `None`.
#[allow(dead_code)]
pub fn rustup_llvm_for_test(what: &str) -> Option<PathBuf> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let llvm = lib_file(|n| n.starts_with("libLLVM.so."));
    if llvm.is_none() {
        assert!(
            std::env::var_os("SELFTRACE_REQUIRE_TRACEFS").is_none(),
            "rustup's libLLVM is required (rustc --print sysroot)"
        );
        println!("SKIP: no libLLVM in rustc's sysroot; {what}");
    }
    llvm
}
