//! Bad uses of the probe macros (`selftrace::probe!`, `#[selftrace::usdt::probe]`) are compile
//! errors pointing at the offending tokens, never macro panics (trybuild; regenerate the
//! expected output with `TRYBUILD=overwrite`). In this package, not selftrace's: trybuild's
//! project links the tested package's dev-dependencies, and this package has two (selftrace and
//! trybuild) where selftrace has two hundred.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}

/// Errors that depend on the argument types (a `ProbeArg::SIZE` that is not 1, 2, 4 or 8; more
/// than 12 probe arguments once `&str` counts as two) come from constant evaluation at
/// monomorphization, which `cargo check` (and so trybuild) does not reach: build them.
#[test]
fn type_dependent_errors() {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // The workspace's root (selftrace), whose target/ and Cargo.lock the build uses.
    let root = here
        .parent()
        .expect("usdt-macros is in the workspace's root");
    let dir = root.join("target").join("usdt-ui-build");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let cases = [
        (
            "bad_size",
            "ProbeArg::SIZE must be one of 1, 2, 4, 8, -1, -2, -4, -8",
        ),
        (
            "too_many_words",
            "a USDT probe has at most 12 arguments (&str and &[u8] count as 2)",
        ),
    ];
    let mut manifest = format!(
        "[package]\nname = \"usdt-ui-build\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nselftrace = {{ path = {:?} }}\n\n[workspace]\n",
        root.display().to_string()
    );
    for (name, _) in cases {
        manifest.push_str(&format!(
            "\n[[bin]]\nname = \"{name}\"\npath = {:?}\n",
            here.join("tests/ui-build")
                .join(format!("{name}.rs"))
                .display()
                .to_string()
        ));
    }
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for (name, message) in cases {
        let out = std::process::Command::new(&cargo)
            .current_dir(&dir)
            .args(["build", "--quiet", "--bin", name])
            .env("CARGO_TARGET_DIR", root.join("target").join("fixtures"))
            .env("CARGO_INCREMENTAL", "0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} compiled");
        assert!(stderr.contains(message), "{name}:\n{stderr}");
        assert!(
            stderr.contains(&format!("tests/ui-build/{name}.rs")),
            "{name}: no span in the file:\n{stderr}"
        );
    }
}
