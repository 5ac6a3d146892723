//! Stack capture, selftrace against its peers, same process, same stack (a 20-function chain
//! on top of the bench harness), in the same run:
//! - selftrace `capture` (DWARF CFI with frame-pointer fallback) and `capture_fp`
//! - glibc `backtrace()` (libgcc's unwinder)
//! - the `backtrace` crate's `trace_unsynchronized` (libgcc's `_Unwind_Backtrace`)
//! - libunwind's `unw_backtrace` (nongnu libunwind, `libunwind.so.8`, loaded with `dlopen`
//!   so that its `_Unwind_*` symbols do not replace Rust's)
//!
//! Each benchmark reports the time for one whole capture; the frame counts are printed once
//! at start so that per-frame costs can be compared.

use criterion::{criterion_group, criterion_main, Criterion};
use std::ffi::c_void;
use std::hint::black_box;

type UnwBacktrace = unsafe extern "C" fn(*mut *mut c_void, libc::c_int) -> libc::c_int;

fn libunwind() -> Option<UnwBacktrace> {
    // SAFETY: dlopen/dlsym with valid C strings; unw_backtrace has this C signature.
    unsafe {
        let h = libc::dlopen(
            c"libunwind.so.8".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if h.is_null() {
            return None;
        }
        let f = libc::dlsym(h, c"unw_backtrace".as_ptr());
        (!f.is_null()).then(|| std::mem::transmute::<*mut c_void, UnwBacktrace>(f))
    }
}

macro_rules! chain {
    ($name:ident -> $next:ident $(-> $rest:ident)*) => {
        #[inline(never)]
        fn $name(f: &mut dyn FnMut()) {
            $next(f);
            black_box(());
        }
        chain!($next $(-> $rest)*);
    };
    ($last:ident) => {
        #[inline(never)]
        fn $last(f: &mut dyn FnMut()) {
            f();
            black_box(());
        }
    };
}

chain!(c00 -> c01 -> c02 -> c03 -> c04 -> c05 -> c06 -> c07 -> c08 -> c09 -> c10 -> c11 -> c12
    -> c13 -> c14 -> c15 -> c16 -> c17 -> c18 -> c19);

fn count_frames(unw: Option<UnwBacktrace>) {
    let mut buf = [0usize; 256];
    let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
    c00(&mut || {
        let a = selftrace::capture(&mut buf);
        let b = selftrace::capture_fp(&mut buf);
        // SAFETY: ptrs is valid for 256 entries.
        let c = unsafe { libc::backtrace(ptrs.as_mut_ptr(), 256) };
        let mut d = 0;
        // SAFETY: the closure only counts frames.
        unsafe {
            backtrace::trace_unsynchronized(|_| {
                d += 1;
                true
            })
        };
        // SAFETY: ptrs is valid for 256 entries.
        let e = unw.map_or(0, |f| unsafe { f(ptrs.as_mut_ptr(), 256) });
        eprintln!(
            "frames per capture: selftrace dwarf {a}, selftrace fp {b} (no frame pointers in \
             std and this bench), glibc backtrace {c}, backtrace crate {d}, libunwind {e}"
        );
    });
}

fn bench(c: &mut Criterion) {
    selftrace::init().expect("init");
    let unw = libunwind();
    count_frames(unw);
    let mut g = c.benchmark_group("capture_20_deep");
    g.bench_function("selftrace_capture_dwarf", |b| {
        let mut buf = [0usize; 256];
        c00(&mut || b.iter(|| black_box(selftrace::capture(&mut buf))));
    });
    g.bench_function("selftrace_capture_fp", |b| {
        let mut buf = [0usize; 256];
        c00(&mut || b.iter(|| black_box(selftrace::capture_fp(&mut buf))));
    });
    g.bench_function("glibc_backtrace", |b| {
        let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
        // SAFETY: ptrs is valid for 256 entries.
        c00(&mut || b.iter(|| black_box(unsafe { libc::backtrace(ptrs.as_mut_ptr(), 256) })));
    });
    g.bench_function("backtrace_crate_trace", |b| {
        let mut buf = [0usize; 256];
        c00(&mut || {
            b.iter(|| {
                let mut n = 0;
                // SAFETY: single-threaded use; the closure only stores ips.
                unsafe {
                    backtrace::trace_unsynchronized(|f| {
                        buf[n] = f.ip() as usize;
                        n += 1;
                        n < buf.len()
                    })
                };
                black_box(n)
            })
        });
    });
    if let Some(f) = unw {
        g.bench_function("libunwind_unw_backtrace", |b| {
            let mut ptrs = [std::ptr::null_mut::<c_void>(); 256];
            // SAFETY: ptrs is valid for 256 entries.
            c00(&mut || b.iter(|| black_box(unsafe { f(ptrs.as_mut_ptr(), 256) })));
        });
    } else {
        eprintln!("libunwind.so.8 not found: install libunwind-dev (or libunwind8) to compare");
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
