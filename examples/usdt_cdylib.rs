//! A cdylib with USDT probes, loaded with `dlopen` by `usdt_target dlopen` in the tests.

/// Adds two numbers; fires `selftrace_cdylib:add` and `selftrace_cdylib:add__return`.
#[selftrace::usdt::probe(provider = "selftrace_cdylib", name = "add")]
#[no_mangle]
pub extern "C" fn selftrace_cdylib_add(a: i32, b: i32) -> i32 {
    selftrace::probe!(selftrace_cdylib, inside, a, b);
    a.wrapping_add(b)
}

/// Whether a tracer is attached to all three probes of this library (`add`, `inside`,
/// `add__return`).
#[no_mangle]
pub extern "C" fn selftrace_cdylib_enabled() -> bool {
    selftrace::probe_enabled!(selftrace_cdylib, add)
        && selftrace::probe_enabled!(selftrace_cdylib, inside)
        && selftrace::probe_enabled!(selftrace_cdylib, add__return)
}
