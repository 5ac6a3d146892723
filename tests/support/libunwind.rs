//! nongnu libunwind, loaded with `dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL)` so that its
//! `_Unwind_*` symbols do not replace libgcc's for the whole test program, used as the peer
//! that walks a signal handler's `ucontext_t`.

use std::ffi::c_void;

/// `unw_init_local2(cursor, uc, flags)`.
type InitLocal2 = unsafe extern "C" fn(*mut u64, *mut c_void, i32) -> i32;
/// `unw_step(cursor)`: > 0 stepped, 0 end of stack, < 0 error.
type Step = unsafe extern "C" fn(*mut u64) -> i32;
/// `unw_get_reg(cursor, reg, &mut value)`.
type GetReg = unsafe extern "C" fn(*mut u64, i32, *mut u64) -> i32;

/// `UNW_INIT_SIGNAL_FRAME`: the context is a signal frame (its pc is exact).
const UNW_INIT_SIGNAL_FRAME: i32 = 1;
/// `UNW_REG_IP`: `UNW_X86_64_RIP` on x86-64, `UNW_AARCH64_X30` (the cursor's ip) on aarch64.
const UNW_REG_IP: i32 = if cfg!(target_arch = "aarch64") {
    30
} else {
    16
};
/// The local-only API's symbols: `_UL<arch>_<name>`.
const INIT_LOCAL2: &std::ffi::CStr = if cfg!(target_arch = "aarch64") {
    c"_ULaarch64_init_local2"
} else {
    c"_ULx86_64_init_local2"
};
const STEP: &std::ffi::CStr = if cfg!(target_arch = "aarch64") {
    c"_ULaarch64_step"
} else {
    c"_ULx86_64_step"
};
const GET_REG: &std::ffi::CStr = if cfg!(target_arch = "aarch64") {
    c"_ULaarch64_get_reg"
} else {
    c"_ULx86_64_get_reg"
};
/// `unw_cursor_t` is 127 words on x86-64 and 250 on aarch64; room for both.
const CURSOR_WORDS: usize = 256;

/// How libunwind's walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// `unw_step` returned 0: the outermost frame.
    Outermost,
    /// `unw_step` (or init / get_reg) returned this error.
    Error(i32),
    /// The output buffer filled up.
    Full,
    /// libunwind read memory that was not there (SIGSEGV or SIGBUS): the walk was cut off there
    /// by the guard (see [`Libunwind::guard_faults`]).
    Faulted,
}

/// `lu_guard_walk(init, step, get_reg, ip_reg, uc, out, n, &end, &err)` of the guard helper
/// (`unwind_fixtures::LU_GUARD_C`): the walk of [`Libunwind::walk_ucontext`], in C under
/// `sigsetjmp`, so that a fault inside libunwind returns the frames so far.
pub type GuardWalk = unsafe extern "C" fn(
    InitLocal2,
    Step,
    GetReg,
    i32,
    *mut c_void,
    *mut usize,
    i32,
    *mut i32,
    *mut i32,
) -> i32;

/// The three entry points, resolved once.
#[derive(Clone, Copy)]
pub struct Libunwind {
    init_local2: InitLocal2,
    step: Step,
    get_reg: GetReg,
    guard: Option<GuardWalk>,
}

impl Libunwind {
    /// Loads libunwind; `Err` says why it is not available.
    pub fn load() -> Result<Libunwind, String> {
        // SAFETY: dlopen/dlsym with valid C strings; the symbols have the declared C
        // signatures (libunwind's local-only API, `_UL` prefix).
        unsafe {
            let h = libc::dlopen(
                c"libunwind.so.8".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if h.is_null() {
                return Err("libunwind.so.8 not found (install libunwind-dev)".into());
            }
            let init = libc::dlsym(h, INIT_LOCAL2.as_ptr());
            let step = libc::dlsym(h, STEP.as_ptr());
            let get = libc::dlsym(h, GET_REG.as_ptr());
            if init.is_null() || step.is_null() || get.is_null() {
                return Err(format!("libunwind.so.8 lacks {INIT_LOCAL2:?}/step/get_reg"));
            }
            Ok(Libunwind {
                init_local2: std::mem::transmute::<*mut c_void, InitLocal2>(init),
                step: std::mem::transmute::<*mut c_void, Step>(step),
                get_reg: std::mem::transmute::<*mut c_void, GetReg>(get),
                guard: None,
            })
        }
    }

    /// Walks from a signal handler's `ucontext_t` into `out` (frame 0 = the interrupted pc,
    /// later frames return addresses); returns the count and how the walk ended. Allocates
    /// nothing (the cursor lives on this stack).
    ///
    /// # Safety
    /// `uc` is the `ucontext_t` the kernel passed to the running signal handler.
    /// Walks through the guard helper from now on: libunwind's local unwinder reads memory
    /// without checking it (aarch64's does, under qemu-user, and faults), and a fault then
    /// ends its walk ([`End::Faulted`]) instead of the test.
    #[allow(dead_code)] // not by every includer (benches/unwind.rs)
    pub fn guard_faults(&mut self, walk: GuardWalk) {
        self.guard = Some(walk);
    }

    pub unsafe fn walk_ucontext(&self, uc: *mut c_void, out: &mut [usize]) -> (usize, End) {
        if let Some(guarded) = self.guard {
            let (mut end, mut err) = (0i32, 0i32);
            // SAFETY: the helper runs the same walk as below with these entry points, on the
            // caller's ucontext_t, writing at most out.len() frames.
            let n = unsafe {
                guarded(
                    self.init_local2,
                    self.step,
                    self.get_reg,
                    UNW_REG_IP,
                    uc,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    &mut end,
                    &mut err,
                )
            };
            let end = match end {
                0 => End::Outermost,
                1 => End::Full,
                2 => End::Faulted,
                _ => End::Error(err),
            };
            return (n.max(0) as usize, end);
        }
        let mut cursor = [0u64; CURSOR_WORDS];
        // SAFETY: the cursor has room for libunwind's unw_cursor_t; uc is a live ucontext_t
        // (the caller's contract), which is libunwind's unw_context_t on x86-64 and aarch64.
        let rc = unsafe { (self.init_local2)(cursor.as_mut_ptr(), uc, UNW_INIT_SIGNAL_FRAME) };
        if rc < 0 {
            return (0, End::Error(rc));
        }
        let mut n = 0;
        loop {
            if n == out.len() {
                return (n, End::Full);
            }
            let mut ip = 0u64;
            // SAFETY: the cursor was initialized above; ip is valid for a write.
            let rc = unsafe { (self.get_reg)(cursor.as_mut_ptr(), UNW_REG_IP, &mut ip) };
            if rc < 0 {
                return (n, End::Error(rc));
            }
            out[n] = ip as usize;
            n += 1;
            // SAFETY: the cursor was initialized above.
            let rc = unsafe { (self.step)(cursor.as_mut_ptr()) };
            if rc == 0 {
                return (n, End::Outermost);
            }
            if rc < 0 {
                return (n, End::Error(rc));
            }
        }
    }
}
