//! The program the USDT integration tests trace (`tests/usdt/tools.rs`).
//!
//! `usdt_target values N`: fires `selftrace_test:values` (i8, u16, i32, i64, u64, pointer) and
//! `selftrace_test:text` (&str, i) N times with fixed values, from two sites in two modules, then prints whether `probe_enabled!` saw a tracer and fires `selftrace_test:done`.
//! `usdt_target wait N`: waits (up to 60 s) until a tracer raises the semaphores of `values`,
//! `text`, `lazy` and `done`, then does the same.
//! `usdt_target dlopen LIB N`: loads the cdylib LIB, waits (up to 60 s) until a tracer attaches
//! to its three probes, and calls its probed `selftrace_cdylib_add` N times.
//! `usdt_target fns N`: calls `#[probe]` functions (free, method, generic) N times.

use std::time::{Duration, Instant};

/// The values every tool must print exactly.
pub const I8: i8 = -5;
/// u16 value.
pub const U16: u16 = 65000;
/// i32 value.
pub const I32: i32 = -123456;
/// i64 value.
pub const I64: i64 = -9_000_000_000;
/// u64 value.
pub const U64: u64 = 18_000_000_000_000_000_000;
/// Pointer value.
pub const PTR: usize = 0x1234_5678;
/// String value.
pub const STR: &str = "hello usdt";

mod first {
    #[inline(never)]
    pub fn fire(i: u64) {
        let (a, b, c, d, e) = (
            std::hint::black_box(super::I8),
            std::hint::black_box(super::U16),
            std::hint::black_box(super::I32),
            std::hint::black_box(super::I64),
            std::hint::black_box(super::U64),
        );
        let p = std::hint::black_box(super::PTR) as *const u8;
        let s = std::hint::black_box(super::STR);
        selftrace::probe!(selftrace_test, values, a, b, c, d, e, p);
        selftrace::probe!(selftrace_test, text, s, i);
        // Twelve arguments, the most a note may carry.
        selftrace::probe!(
            selftrace_test,
            twelve,
            1u8,
            -2i8,
            3u16,
            -4i16,
            5u32,
            -6i32,
            7u64,
            -8i64,
            true,
            'x',
            1.5f64,
            i
        );
    }
}

mod second {
    #[inline(never)]
    pub fn fire(i: u64) {
        let s = std::hint::black_box(super::STR);
        let p = std::hint::black_box(super::PTR) as *const u8;
        // A second site of the same probe: it must share the semaphore.
        selftrace::probe!(
            selftrace_test,
            values,
            super::I8,
            super::U16,
            super::I32,
            super::I64,
            super::U64,
            p
        );
        selftrace::probe!(selftrace_test, text, s, i);
    }
}

struct Counter {
    total: i64,
}

impl Counter {
    #[selftrace::usdt::probe(provider = "selftrace_test")]
    fn bump(&mut self, by: i64) -> i64 {
        self.total += by;
        self.total
    }
}

#[selftrace::usdt::probe(provider = "selftrace_test")]
fn add(a: i32, b: i32) -> i32 {
    a.wrapping_add(b)
}

#[selftrace::usdt::probe(provider = "selftrace_test", name = "generic")]
fn twice<T: selftrace::usdt::ProbeArg + Copy + std::ops::Add<Output = T>>(x: T) -> T {
    x + x
}

fn fire_values(n: u64) {
    for i in 0..n {
        if i % 2 == 0 {
            first::fire(i);
        } else {
            second::fire(i);
        }
        // Evaluated only while traced.
        selftrace::probe_lazy!(selftrace_test, lazy, {
            println!("lazy evaluated");
            i
        });
    }
    println!(
        "enabled={}",
        selftrace::probe_enabled!(selftrace_test, values) as u8
    );
    // The same probe from two crates (this one and selftrace): one semaphore.
    selftrace::probe!(selftrace_test, cross_crate, n as u32);
    selftrace::usdt::__private::cross_crate(n as u32);
    // Tells a tracer that the run is over.
    selftrace::probe!(selftrace_test, done, n);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("values");
    let n: u64 = args.last().and_then(|s| s.parse().ok()).unwrap_or(3);
    match mode {
        "values" => fire_values(n),
        "wait" => {
            // Every probe the tests' tracer attaches: a tracer such as bpftrace attaches its
            // probes one after the other, and on a loaded machine the last can come much later
            // than the first (a hit before then is lost, and a missed `done` keeps the tracer
            // running).
            let start = Instant::now();
            while !(selftrace::probe_enabled!(selftrace_test, values)
                && selftrace::probe_enabled!(selftrace_test, text)
                && selftrace::probe_enabled!(selftrace_test, lazy)
                && selftrace::probe_enabled!(selftrace_test, done))
            {
                if start.elapsed() > Duration::from_secs(60) {
                    eprintln!("no tracer attached");
                    std::process::exit(2);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            // The semaphore rises when the uprobe is registered, a little before the tracer
            // attaches its program to it.
            std::thread::sleep(Duration::from_millis(500));
            fire_values(n);
        }
        "fns" => {
            let mut c = Counter { total: 0 };
            let mut sum = 0i64;
            for i in 0..n {
                sum += add(i as i32, -10) as i64;
                sum += c.bump(-(i as i64));
                sum += twice(i as u32) as i64;
            }
            println!("sum={sum}");
        }
        "dlopen" => {
            let lib = std::ffi::CString::new(args[2].as_str()).expect("path");
            // SAFETY: dlopen of a path; the library is ours and has no unsound initializers.
            let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW) };
            assert!(!h.is_null(), "dlopen failed");
            // SAFETY: the symbol name is a valid C string.
            let f = unsafe { libc::dlsym(h, c"selftrace_cdylib_add".as_ptr()) };
            assert!(!f.is_null(), "dlsym failed");
            // SAFETY: the cdylib defines it as extern "C" fn(i32, i32) -> i32.
            let f: extern "C" fn(i32, i32) -> i32 = unsafe { std::mem::transmute(f) };
            // SAFETY: the symbol name is a valid C string.
            let e = unsafe { libc::dlsym(h, c"selftrace_cdylib_enabled".as_ptr()) };
            assert!(!e.is_null(), "dlsym failed");
            // SAFETY: the cdylib defines it as extern "C" fn() -> bool.
            let enabled: extern "C" fn() -> bool = unsafe { std::mem::transmute(e) };
            // Wait (up to 60 s) for a tracer to attach to the library's probes (all of them,
            // as in `wait`).
            let start = Instant::now();
            while !enabled() {
                if start.elapsed() > Duration::from_secs(60) {
                    eprintln!("no tracer attached");
                    std::process::exit(2);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(500));
            let mut sum = 0;
            for i in 0..n as i32 {
                sum += f(i, -100);
            }
            println!("sum={sum}");
        }
        _ => {
            eprintln!("unknown mode {mode}");
            std::process::exit(2);
        }
    }
}
