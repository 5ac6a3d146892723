use std::hint::black_box;
type UnwBacktrace = unsafe extern "C" fn(*mut *mut libc::c_void, libc::c_int) -> libc::c_int;
#[inline(never)]
fn deep(n: usize, f: &mut dyn FnMut()) { if n == 0 { f() } else { deep(n - 1, f) } black_box(()); }
fn cpu() -> f64 { let mut ts: libc::timespec = unsafe { std::mem::zeroed() }; unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) }; ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64 }
fn main() {
    selftrace::init().unwrap();
    let unw: UnwBacktrace = unsafe { let h = libc::dlopen(c"libunwind.so.8".as_ptr(), libc::RTLD_NOW|libc::RTLD_LOCAL); std::mem::transmute(libc::dlsym(h, c"unw_backtrace".as_ptr())) };
    let mut buf = [0usize; 256];
    let mut ptrs = [std::ptr::null_mut::<libc::c_void>(); 256];
    for d in [0usize, 40] { deep(d, &mut || {
        let w = selftrace::capture_walk(&mut buf);
        println!("{:?}", w);
        for _ in 0..3 {
        let t = cpu();
        for _ in 0..20_000 { black_box(selftrace::capture(&mut buf)); }
        let a = (cpu() - t) / 20_000.0;
        let t = cpu();
        for _ in 0..20_000 { black_box(unsafe { unw(ptrs.as_mut_ptr(), 256) }); }
        let b = (cpu() - t) / 20_000.0;
        println!("depth {d}: selftrace {a:.0} ns, libunwind {b:.0} ns, ratio {:.2}", a / b);
        }
    }); }
}
