//! The tools that build test fixtures for the target the tests were built for: on x86-64 the
//! system's `cc`; for aarch64 tests run under qemu-user on an x86-64 machine, Debian's cross
//! compiler (`aarch64-linux-gnu-gcc`, from gcc-aarch64-linux-gnu), unless `SELFTRACE_TEST_CC`
//! names another.

/// The C compiler for this target.
#[allow(dead_code)]
pub fn cc() -> String {
    if let Ok(cc) = std::env::var("SELFTRACE_TEST_CC") {
        return cc;
    }
    let cross = format!("{}-linux-gnu-gcc", std::env::consts::ARCH);
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    if cfg!(not(target_arch = "x86_64")) && on_path(&cross) {
        cross
    } else {
        "cc".into()
    }
}

/// A binutils program (`objcopy`, `objdump`, `addr2line`...) that understands this target's
/// objects: Debian's host binutils know x86-64 only; the cross ones come with the cross
/// compiler (binutils-aarch64-linux-gnu).
#[allow(dead_code)]
pub fn binutil(name: &str) -> String {
    let cross = format!("{}-linux-gnu-{name}", std::env::consts::ARCH);
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(&cross).is_file()));
    if cfg!(not(target_arch = "x86_64")) && on_path {
        cross
    } else {
        name.into()
    }
}

/// Whether this process runs under qemu-user: qemu shows the guest's view in `/proc/self/maps`
/// but its own mappings (the `qemu-<arch>` binary) in `/proc/thread-self/maps`.
#[allow(dead_code)]
pub fn under_qemu() -> bool {
    std::fs::read_to_string("/proc/thread-self/maps").is_ok_and(|m| m.contains("/qemu-"))
}

/// The interrupted pc and stack pointer in the `ucontext_t` the kernel passed to a signal
/// handler.
///
/// # Safety
/// `uc` points to a live `ucontext_t` (a `SA_SIGINFO` handler's third argument).
#[allow(dead_code)]
pub unsafe fn interrupted_pc_sp(uc: *const std::ffi::c_void) -> (usize, usize) {
    // SAFETY: per the contract.
    let uc = unsafe { &*uc.cast::<libc::ucontext_t>() };
    #[cfg(target_arch = "x86_64")]
    return (
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize,
        uc.uc_mcontext.gregs[libc::REG_RSP as usize] as usize,
    );
    #[cfg(target_arch = "aarch64")]
    return (uc.uc_mcontext.pc as usize, uc.uc_mcontext.sp as usize);
}
