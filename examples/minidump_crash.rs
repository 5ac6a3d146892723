//! Crashes on purpose and leaves a minidump: `cargo run --example minidump_crash -- DIR`.
//!
//! Three threads besides main: one spins, one sleeps, one waits on a channel; then main
//! writes through a null pointer in `crash_here`. The crash handler prints its text report
//! to stderr and writes `DIR/<uuid>.dmp`, which `minidump-stackwalk --human` reads.
use std::sync::mpsc;
use std::time::Duration;

#[inline(never)]
fn crash_here(p: *mut u64) {
    // SAFETY: none: this is the crash the example is about.
    #[allow(unsafe_code)]
    unsafe {
        core::ptr::write_volatile(p, 42)
    };
}

#[inline(never)]
fn parse_request(depth: u32, p: *mut u64) {
    if depth == 0 {
        crash_here(p);
    } else {
        parse_request(depth - 1, p);
    }
    std::hint::black_box(depth);
}

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    selftrace::crash::builder()
        .minidump(&dir)
        .install()
        .expect("install the crash handler");
    let (_keep, rx) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("spinner".into())
        .spawn(|| loop {
            std::hint::black_box(0u64.wrapping_add(1));
        })
        .unwrap();
    std::thread::Builder::new()
        .name("sleeper".into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_secs(10));
        })
        .unwrap();
    std::thread::Builder::new()
        .name("waiter".into())
        .spawn(move || {
            let _ = rx.recv();
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    parse_request(3, std::hint::black_box(core::ptr::null_mut()));
}
