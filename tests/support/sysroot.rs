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
