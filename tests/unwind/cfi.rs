//! Every CFI rule the unwinder must follow, each in a small assembly function whose CFI says
//! exactly one unusual thing, called between a Rust caller and a Rust callback that captures
//! the stack. The walk must go through each of them to the root of the thread's stack, and a
//! frame whose CFI cannot be evaluated (or that has none and no frame pointer) must end the walk
//! with the reason, never with a guessed frame.
//!
//! The fixtures, each `fn(callback)`, in x86-64 (AT&T syntax) and aarch64 assembly (the
//! aarch64 register in brackets):
//! - `st_cfa_other_reg`: CFA = rbx (x19) + 16 after realigning the stack pointer (like ld.so's
//!   `_dl_runtime_resolve`); rbx (x19) must be restored through the callback's frames, which
//!   save it.
//! - `st_cfa_expr`: CFA = `*(sp + 8) + 8` (+ 16 on aarch64: `DW_CFA_def_cfa_expression` with a
//!   memory read) and the return address by `DW_CFA_val_expression` (`**(sp + 8)`).
//! - `st_ra_in_reg`: the return address is in r12 (x19) (`DW_CFA_register`), that register
//!   saved at CFA-16, r13 (x20) `DW_CFA_same_value`.
//! - `st_fp_outer` -> `st_fp_expr`: the outer frame's CFA is rbp (x29) + 16; the inner one saves
//!   the frame pointer by `DW_CFA_expression` (address = CFA - 16) and then clobbers it.
//! - `st_no_cfi`: no CFI at all, a frame-pointer frame: the frame-pointer rule applies.
//! - `st_no_cfi_garbage`: no CFI and a garbage frame pointer: the walk stops (no frame pointer).
//! - `st_bad_cfi`: a CFA expression with an operation CFI may not use (`DW_OP_call_frame_cfa`):
//!   the walk stops there ("no unwind rule").
//! - `st_clobber_call`: saves every callee-saved register and overwrites it before it calls.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "threads")]

use selftrace::{StopReason, WalkEnd};
use std::hint::black_box;

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    r#"
    .text

    .globl st_cfa_other_reg
    .type st_cfa_other_reg,@function
st_cfa_other_reg:
    .cfi_startproc
    push %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbx, -16
    mov %rsp, %rbx
    .cfi_def_cfa_register %rbx
    and $-64, %rsp
    sub $64, %rsp
    call *%rdi
    mov %rbx, %rsp
    .cfi_def_cfa_register %rsp
    pop %rbx
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbx
    ret
    .cfi_endproc
    .size st_cfa_other_reg, .-st_cfa_other_reg

    .globl st_cfa_expr
    .type st_cfa_expr,@function
st_cfa_expr:
    .cfi_startproc
    mov %rsp, %rax
    sub $136, %rsp
    and $-16, %rsp
    mov %rax, 8(%rsp)
    /* DW_CFA_def_cfa_expression: DW_OP_breg7 8; DW_OP_deref; DW_OP_plus_uconst 8 */
    .cfi_escape 0x0f, 5, 0x77, 8, 0x06, 0x23, 8
    /* DW_CFA_val_expression rip: DW_OP_breg7 8; DW_OP_deref; DW_OP_deref */
    .cfi_escape 0x16, 16, 4, 0x77, 8, 0x06, 0x06
    call *%rdi
    mov 8(%rsp), %rsp
    .cfi_def_cfa %rsp, 8
    .cfi_offset %rip, -8
    ret
    .cfi_endproc
    .size st_cfa_expr, .-st_cfa_expr

    .globl st_ra_in_reg
    .type st_ra_in_reg,@function
st_ra_in_reg:
    .cfi_startproc
    push %r12
    .cfi_adjust_cfa_offset 8
    .cfi_offset %r12, -16
    mov 8(%rsp), %r12
    .cfi_register %rip, %r12
    .cfi_same_value %r13
    call *%rdi
    pop %r12
    .cfi_adjust_cfa_offset -8
    .cfi_restore %r12
    .cfi_offset %rip, -8
    ret
    .cfi_endproc
    .size st_ra_in_reg, .-st_ra_in_reg

    .globl st_fp_outer
    .type st_fp_outer,@function
st_fp_outer:
    .cfi_startproc
    push %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbp, -16
    mov %rsp, %rbp
    .cfi_def_cfa_register %rbp
    and $-32, %rsp
    call st_fp_expr
    mov %rbp, %rsp
    .cfi_def_cfa_register %rsp
    pop %rbp
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbp
    ret
    .cfi_endproc
    .size st_fp_outer, .-st_fp_outer

    .type st_fp_expr,@function
st_fp_expr:
    .cfi_startproc
    push %rbp
    .cfi_adjust_cfa_offset 8
    /* DW_CFA_expression rbp: DW_OP_lit16; DW_OP_minus (address = CFA - 16) */
    .cfi_escape 0x10, 6, 2, 0x40, 0x1c
    mov $0x5bad5bad5bad5bad, %rbp
    call *%rdi
    pop %rbp
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbp
    ret
    .cfi_endproc
    .size st_fp_expr, .-st_fp_expr

    .globl st_clobber_call
    .type st_clobber_call,@function
st_clobber_call:
    .cfi_startproc
    push %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbx, -16
    push %r12
    .cfi_adjust_cfa_offset 8
    .cfi_offset %r12, -24
    push %r13
    .cfi_adjust_cfa_offset 8
    .cfi_offset %r13, -32
    push %r14
    .cfi_adjust_cfa_offset 8
    .cfi_offset %r14, -40
    push %r15
    .cfi_adjust_cfa_offset 8
    .cfi_offset %r15, -48
    push %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbp, -56
    sub $8, %rsp
    .cfi_adjust_cfa_offset 8
    mov $1, %rbx
    mov $2, %r12
    mov $3, %r13
    mov $4, %r14
    mov $5, %r15
    mov $6, %rbp
    call *%rdi
    add $8, %rsp
    .cfi_adjust_cfa_offset -8
    pop %rbp
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbp
    pop %r15
    .cfi_adjust_cfa_offset -8
    .cfi_restore %r15
    pop %r14
    .cfi_adjust_cfa_offset -8
    .cfi_restore %r14
    pop %r13
    .cfi_adjust_cfa_offset -8
    .cfi_restore %r13
    pop %r12
    .cfi_adjust_cfa_offset -8
    .cfi_restore %r12
    pop %rbx
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbx
    ret
    .cfi_endproc
    .size st_clobber_call, .-st_clobber_call

    .globl st_bad_cfi
    .type st_bad_cfi,@function
st_bad_cfi:
    .cfi_startproc
    sub $8, %rsp
    .cfi_adjust_cfa_offset 8
    /* DW_CFA_def_cfa_expression: DW_OP_call_frame_cfa (not allowed in CFI) */
    .cfi_escape 0x0f, 1, 0x9c
    call *%rdi
    add $8, %rsp
    .cfi_def_cfa %rsp, 8
    ret
    .cfi_endproc
    .size st_bad_cfi, .-st_bad_cfi
"#,
    options(att_syntax)
);

// Functions without any CFI: a section of their own, outside every .cfi_startproc.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    r#"
    .pushsection .text.st_nocfi,"ax",@progbits
    .globl st_no_cfi
    .type st_no_cfi,@function
st_no_cfi:
    push %rbp
    mov %rsp, %rbp
    call *%rdi
    pop %rbp
    ret
    .size st_no_cfi, .-st_no_cfi

    .globl st_no_cfi_garbage
    .type st_no_cfi_garbage,@function
st_no_cfi_garbage:
    push %rbp
    mov $0x7000, %rbp
    call *%rdi
    pop %rbp
    ret
    .size st_no_cfi_garbage, .-st_no_cfi_garbage
    .popsection
"#,
    options(att_syntax)
);

#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    r#"
    .text

    .globl st_cfa_other_reg
    .type st_cfa_other_reg,%function
st_cfa_other_reg:
    .cfi_startproc
    stp x19, x30, [sp, #-16]!
    .cfi_def_cfa_offset 16
    .cfi_offset x19, -16
    .cfi_offset x30, -8
    mov x19, sp
    .cfi_def_cfa_register x19
    mov x9, sp
    and x9, x9, #-64
    sub sp, x9, #64
    blr x0
    mov sp, x19
    .cfi_def_cfa_register sp
    ldp x19, x30, [sp], #16
    .cfi_def_cfa_offset 0
    .cfi_restore x19
    .cfi_restore x30
    ret
    .cfi_endproc
    .size st_cfa_other_reg, .-st_cfa_other_reg

    .globl st_cfa_expr
    .type st_cfa_expr,%function
st_cfa_expr:
    .cfi_startproc
    str x30, [sp, #-16]!
    .cfi_def_cfa_offset 16
    .cfi_offset x30, -16
    mov x9, sp
    sub x10, sp, #144
    and sp, x10, #-16
    str x9, [sp, #8]
    /* DW_CFA_def_cfa_expression: DW_OP_breg31 8; DW_OP_deref; DW_OP_plus_uconst 16 */
    .cfi_escape 0x0f, 5, 0x8f, 8, 0x06, 0x23, 16
    /* DW_CFA_val_expression x30: DW_OP_breg31 8; DW_OP_deref; DW_OP_deref */
    .cfi_escape 0x16, 30, 4, 0x8f, 8, 0x06, 0x06
    blr x0
    ldr x9, [sp, #8]
    mov sp, x9
    .cfi_def_cfa sp, 16
    .cfi_offset x30, -16
    ldr x30, [sp], #16
    .cfi_def_cfa_offset 0
    .cfi_restore x30
    ret
    .cfi_endproc
    .size st_cfa_expr, .-st_cfa_expr

    .globl st_ra_in_reg
    .type st_ra_in_reg,%function
st_ra_in_reg:
    .cfi_startproc
    str x19, [sp, #-16]!
    .cfi_def_cfa_offset 16
    .cfi_offset x19, -16
    mov x19, x30
    .cfi_register x30, x19
    .cfi_same_value x20
    blr x0
    mov x30, x19
    .cfi_restore x30
    ldr x19, [sp], #16
    .cfi_def_cfa_offset 0
    .cfi_restore x19
    ret
    .cfi_endproc
    .size st_ra_in_reg, .-st_ra_in_reg

    .globl st_fp_outer
    .type st_fp_outer,%function
st_fp_outer:
    .cfi_startproc
    stp x29, x30, [sp, #-16]!
    .cfi_def_cfa_offset 16
    .cfi_offset x29, -16
    .cfi_offset x30, -8
    mov x29, sp
    .cfi_def_cfa x29, 16
    mov x9, sp
    and x9, x9, #-32
    sub sp, x9, #32
    bl st_fp_expr
    mov sp, x29
    .cfi_def_cfa sp, 16
    ldp x29, x30, [sp], #16
    .cfi_def_cfa_offset 0
    .cfi_restore x29
    .cfi_restore x30
    ret
    .cfi_endproc
    .size st_fp_outer, .-st_fp_outer

    .type st_fp_expr,%function
st_fp_expr:
    .cfi_startproc
    stp x29, x30, [sp, #-16]!
    .cfi_def_cfa_offset 16
    /* DW_CFA_expression x29: DW_OP_lit16; DW_OP_minus (address = CFA - 16) */
    .cfi_escape 0x10, 29, 2, 0x40, 0x1c
    .cfi_offset x30, -8
    movz x29, #0x5bad, lsl #48
    movk x29, #0x5bad, lsl #16
    blr x0
    ldp x29, x30, [sp], #16
    .cfi_def_cfa_offset 0
    .cfi_restore x29
    .cfi_restore x30
    ret
    .cfi_endproc
    .size st_fp_expr, .-st_fp_expr

    .globl st_clobber_call
    .type st_clobber_call,%function
st_clobber_call:
    .cfi_startproc
    stp x29, x30, [sp, #-96]!
    .cfi_def_cfa_offset 96
    .cfi_offset x29, -96
    .cfi_offset x30, -88
    stp x19, x20, [sp, #16]
    .cfi_offset x19, -80
    .cfi_offset x20, -72
    stp x21, x22, [sp, #32]
    .cfi_offset x21, -64
    .cfi_offset x22, -56
    stp x23, x24, [sp, #48]
    .cfi_offset x23, -48
    .cfi_offset x24, -40
    stp x25, x26, [sp, #64]
    .cfi_offset x25, -32
    .cfi_offset x26, -24
    stp x27, x28, [sp, #80]
    .cfi_offset x27, -16
    .cfi_offset x28, -8
    mov x19, #1
    mov x20, #2
    mov x21, #3
    mov x22, #4
    mov x23, #5
    mov x24, #6
    mov x25, #7
    mov x26, #8
    mov x27, #9
    mov x28, #10
    mov x29, #11
    blr x0
    ldp x27, x28, [sp, #80]
    .cfi_restore x27
    .cfi_restore x28
    ldp x25, x26, [sp, #64]
    .cfi_restore x25
    .cfi_restore x26
    ldp x23, x24, [sp, #48]
    .cfi_restore x23
    .cfi_restore x24
    ldp x21, x22, [sp, #32]
    .cfi_restore x21
    .cfi_restore x22
    ldp x19, x20, [sp, #16]
    .cfi_restore x19
    .cfi_restore x20
    ldp x29, x30, [sp], #96
    .cfi_def_cfa_offset 0
    .cfi_restore x29
    .cfi_restore x30
    ret
    .cfi_endproc
    .size st_clobber_call, .-st_clobber_call

    .globl st_bad_cfi
    .type st_bad_cfi,%function
st_bad_cfi:
    .cfi_startproc
    str x30, [sp, #-16]!
    .cfi_def_cfa_offset 16
    .cfi_offset x30, -16
    /* DW_CFA_def_cfa_expression: DW_OP_call_frame_cfa (not allowed in CFI) */
    .cfi_escape 0x0f, 1, 0x9c
    blr x0
    .cfi_def_cfa sp, 16
    ldr x30, [sp], #16
    .cfi_def_cfa_offset 0
    .cfi_restore x30
    ret
    .cfi_endproc
    .size st_bad_cfi, .-st_bad_cfi
"#
);

// Functions without any CFI: a section of their own, outside every .cfi_startproc.
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    r#"
    .pushsection .text.st_nocfi,"ax",%progbits
    .globl st_no_cfi
    .type st_no_cfi,%function
st_no_cfi:
    stp x29, x30, [sp, #-16]!
    mov x29, sp
    blr x0
    ldp x29, x30, [sp], #16
    ret
    .size st_no_cfi, .-st_no_cfi

    .globl st_no_cfi_garbage
    .type st_no_cfi_garbage,%function
st_no_cfi_garbage:
    stp x29, x30, [sp, #-16]!
    mov x29, #0x7000
    blr x0
    ldp x29, x30, [sp], #16
    ret
    .size st_no_cfi_garbage, .-st_no_cfi_garbage
    .popsection
"#
);

type Fixture = unsafe extern "C" fn(extern "C" fn());

extern "C" {
    fn st_cfa_other_reg(cb: extern "C" fn());
    fn st_cfa_expr(cb: extern "C" fn());
    fn st_ra_in_reg(cb: extern "C" fn());
    fn st_fp_outer(cb: extern "C" fn());
    fn st_no_cfi(cb: extern "C" fn());
    fn st_no_cfi_garbage(cb: extern "C" fn());
    fn st_bad_cfi(cb: extern "C" fn());
    fn st_clobber_call(cb: extern "C" fn());
}

const N: usize = 256;

std::thread_local! {
    static CAPTURED: std::cell::RefCell<(Vec<usize>, Option<selftrace::Walk>)> =
        const { std::cell::RefCell::new((Vec::new(), None)) };
}

/// Captures the stack through `st_clobber_call`, which saves every callee-saved register and
/// overwrites it before it calls the capture: the unwinder has to restore them from that
/// frame's save slots to get the fixtures' registers back.
extern "C" fn callback() {
    // SAFETY: st_clobber_call saves and restores what it clobbers and calls its argument.
    unsafe { st_clobber_call(capture_here) };
    black_box(());
}

extern "C" fn capture_here() {
    let mut buf = [0usize; N];
    let w = selftrace::Capture::new().walk(&mut buf);
    CAPTURED.with(|c| *c.borrow_mut() = (buf[..w.frames].to_vec(), Some(w)));
    black_box(&buf);
}

/// Calls the fixture from a named Rust frame and returns the captured stack as names.
#[inline(never)]
fn run_fixture(f: Fixture) -> (Vec<String>, selftrace::Walk) {
    // SAFETY: each fixture calls its argument once and returns; all follow the C ABI.
    unsafe { f(callback) };
    black_box(());
    let (frames, walk) = CAPTURED.with(|c| c.borrow().clone());
    (names_of(&frames, false), walk.expect("callback ran"))
}

/// The demangled name of each frame of a captured stack (its address where none is known);
/// frame 0 is an exact pc when `first_exact` (a capture from a `ucontext_t`).
fn names_of(frames: &[usize], first_exact: bool) -> Vec<String> {
    (0..frames.len())
        .map(|i| {
            let kind = selftrace::symbolize::frame_kind(frames, i, first_exact);
            selftrace::symbolize(kind.lookup_address(frames[i]))
                .and_then(|s| s.name.map(|n| n.to_string_lossy()))
                .map(|n| format!("{:#}", rustc_demangle::demangle(&n)))
                .unwrap_or_else(|| format!("{:#x}", frames[i]))
        })
        .collect()
}

fn position(names: &[String], what: &str) -> usize {
    names
        .iter()
        .position(|n| n.contains(what))
        .unwrap_or_else(|| panic!("{what} not in the stack:\n{}", names.join("\n")))
}

/// The stack holds capture_here -> st_clobber_call -> callback -> fixture -> run_fixture -> this test, in that order, and the walk
/// went on to the root of the test thread (`clone3` or `start_thread`'s caller).
fn assert_through(f: Fixture, fixture: &str, test: &str) {
    selftrace::init().expect("init");
    let (names, walk) = run_fixture(f);
    let text = names.join("\n");
    let cb = position(&names, "callback");
    assert!(position(&names, "capture_here") < position(&names, "st_clobber_call"));
    assert!(
        position(&names, "st_clobber_call") < cb,
        "{}",
        names.join("\n")
    );
    let fx = position(&names, fixture);
    let rf = position(&names, "run_fixture");
    assert!(cb < fx && fx < rf, "order:\n{text}");
    // The test function itself may be inlined into the harness's closure (release builds).
    if !cfg!(debug_assertions) {
        let _ = test;
    } else {
        assert!(rf < position(&names, test), "order:\n{text}");
    }
    assert!(
        walk.is_complete(),
        "walk through {fixture} ended {:?}:\n{text}",
        walk.end
    );
    let last = names.last().unwrap();
    assert!(
        last.contains("clone") || last.contains("_start"),
        "the walk ends at the thread's root, not at {last}:\n{text}"
    );
}

#[test]
fn cfa_based_on_a_callee_saved_register() {
    assert_through(
        st_cfa_other_reg,
        "st_cfa_other_reg",
        "cfa_based_on_a_callee_saved_register",
    );
}

#[test]
fn cfa_expression_with_memory_read_and_val_expression() {
    assert_through(
        st_cfa_expr,
        "st_cfa_expr",
        "cfa_expression_with_memory_read_and_val_expression",
    );
}

#[test]
fn return_address_in_a_register() {
    assert_through(st_ra_in_reg, "st_ra_in_reg", "return_address_in_a_register");
}

#[test]
fn register_saved_by_expression_then_cfa_based_on_it() {
    let test = "register_saved_by_expression_then_cfa_based_on_it";
    assert_through(st_fp_outer, "st_fp_expr", test);
    let (names, _) = run_fixture(st_fp_outer);
    let inner = position(&names, "st_fp_expr");
    let outer = position(&names, "st_fp_outer");
    assert_eq!(outer, inner + 1, "{}", names.join("\n"));
}

#[test]
fn no_cfi_uses_a_plausible_frame_pointer() {
    assert_through(
        st_no_cfi,
        "st_no_cfi",
        "no_cfi_uses_a_plausible_frame_pointer",
    );
}

#[test]
fn no_cfi_and_garbage_frame_pointer_stops_the_walk() {
    selftrace::init().expect("init");
    let (names, walk) = run_fixture(st_no_cfi_garbage);
    let text = names.join("\n");
    let fx = position(&names, "st_no_cfi_garbage");
    assert_eq!(
        fx,
        names.len() - 1,
        "nothing guessed after the frame:\n{text}"
    );
    let t = walk.truncation().expect("truncated");
    assert_eq!(t.reason, StopReason::NoFramePointer, "{text}");
}

#[test]
fn unevaluable_cfi_stops_the_walk_and_says_so() {
    selftrace::init().expect("init");
    let (names, walk) = run_fixture(st_bad_cfi);
    let text = names.join("\n");
    let fx = position(&names, "st_bad_cfi");
    assert_eq!(
        fx,
        names.len() - 1,
        "nothing guessed after the frame:\n{text}"
    );
    match walk.end {
        WalkEnd::Truncated(t) => {
            assert_eq!(t.reason, StopReason::NoUnwindRule);
            assert!(t.to_string().starts_with("no unwind rule at 0x"), "{t}");
        }
        e => panic!("expected a truncated walk, got {e:?}:\n{text}"),
    }
}

/// `dump_stack()` and the crash report print the truncation (child process: dump_stack_to a
/// pipe from inside the fixture).
#[test]
fn dump_stack_prints_the_truncation() {
    selftrace::init().expect("init");
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    DUMP_FD.store(fds[1], std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the fixture calls dump_callback once.
    unsafe { st_bad_cfi(dump_callback) };
    // SAFETY: closing our write end; reading the pipe into a buffer below.
    unsafe { libc::close(fds[1]) };
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // SAFETY: chunk is writable for its length.
        let n = unsafe { libc::read(fds[0], chunk.as_mut_ptr().cast(), chunk.len()) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n as usize]);
    }
    // SAFETY: fds[0] is ours.
    unsafe { libc::close(fds[0]) };
    let text = String::from_utf8_lossy(&out);
    let line = text
        .lines()
        .find(|l| l.contains("stack truncated:"))
        .unwrap_or_else(|| panic!("no truncation line:\n{text}"));
    assert!(line.contains("no unwind rule at 0x"), "{line}");
    assert!(line.contains("[unwind-"), "object and offset: {line}");
    assert!(text.contains("st_bad_cfi"), "{text}");
}

static DUMP_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn dump_callback() {
    selftrace::crash::dump_stack_to(borrowed(DUMP_FD.load(std::sync::atomic::Ordering::Relaxed)));
    black_box(());
}

static SPIN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
static SPIN_TID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn spin_callback() {
    SPIN_TID.store(
        selftrace::threads::current_tid(),
        std::sync::atomic::Ordering::Release,
    );
    while SPIN.load(std::sync::atomic::Ordering::Relaxed) {
        std::hint::spin_loop();
    }
    black_box(());
}

/// Another thread stuck under a frame whose CFI cannot be evaluated: its captured stack says
/// where and why it stops, and an all-thread dump prints the truncation line.
#[test]
fn another_threads_truncated_stack_is_reported() {
    selftrace::init().expect("init");
    let t = std::thread::spawn(|| {
        // SAFETY: the fixture calls spin_callback once and returns.
        unsafe { st_bad_cfi(spin_callback) };
    });
    while SPIN_TID.load(std::sync::atomic::Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    let tid = SPIN_TID.load(std::sync::atomic::Ordering::Acquire);
    let mut buf = [0usize; 64];
    let walk = selftrace::threads::capture(tid, &mut buf, std::time::Duration::from_secs(5))
        .expect("the thread answers");
    let t_end = walk.truncation().expect("truncated");
    assert_eq!(t_end.reason, StopReason::NoUnwindRule);
    let name = selftrace::symbolize(t_end.pc - 1)
        .and_then(|s| s.name)
        .map(|n| n.to_string_lossy());
    assert_eq!(name.as_deref(), Some("st_bad_cfi"));
    let path = std::env::temp_dir().join(format!("selftrace-cfi-dump-{}", std::process::id()));
    let f = std::fs::File::create(&path).expect("dump file");
    selftrace::threads::dump_all(&f);
    drop(f);
    let text = std::fs::read_to_string(&path).expect("read dump");
    let _ = std::fs::remove_file(&path);
    SPIN.store(false, std::sync::atomic::Ordering::Relaxed);
    t.join().expect("join");
    assert!(
        text.contains("stack truncated: no unwind rule at 0x"),
        "{text}"
    );
}

/// A raw fd of this test's (or 1, stdout), borrowed for one call.
fn borrowed(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the tests pass fds they opened and close only after the call returned.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

// A leaf without CFI right after a function with CFI that calls it through a register, the
// shape of libcrypto's GHASH leaves after CRYPTO_gcm128_finish: interrupted in the leaf, the
// link register holds the return into the caller, the frame record the caller's own return.
// The record's `bl st_calls_leaf` targets a start below the leaf, within 64 KiB; that start has
// CFI and the leaf has none, so it is not the leaf's, and the caller must not be left out.
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    r#"
    .pushsection .text.st_leafcase,"ax",%progbits
    .globl st_calls_leaf
    .type st_calls_leaf,%function
st_calls_leaf:
    .cfi_startproc
    stp x29, x30, [sp, #-16]!
    .cfi_def_cfa_offset 16
    .cfi_offset x29, -16
    .cfi_offset x30, -8
    mov x29, sp
    adr x9, st_spin_leaf
    blr x9
    ldp x29, x30, [sp], #16
    .cfi_restore x29
    .cfi_restore x30
    .cfi_def_cfa_offset 0
    ret
    .cfi_endproc
    .size st_calls_leaf, .-st_calls_leaf

    .globl st_spin_leaf
    .type st_spin_leaf,%function
st_spin_leaf:
1:  ldar w9, [x0]
    cbz w9, 1b
    ret
    .size st_spin_leaf, .-st_spin_leaf
    .popsection
"#
);

#[cfg(target_arch = "aarch64")]
extern "C" {
    /// Spins in `st_spin_leaf` until `*flag != 0`.
    fn st_calls_leaf(flag: *const std::sync::atomic::AtomicU32);
}

#[cfg(target_arch = "aarch64")]
static LEAF_TID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

#[cfg(target_arch = "aarch64")]
#[inline(never)]
fn leaf_thread_body(flag: &std::sync::atomic::AtomicU32) {
    LEAF_TID.store(
        selftrace::threads::current_tid(),
        std::sync::atomic::Ordering::Release,
    );
    // SAFETY: st_calls_leaf only reads the flag, which outlives the call.
    unsafe { st_calls_leaf(flag) };
    black_box(());
}

/// Another thread interrupted in a leaf without CFI that follows its caller (which has CFI):
/// the caller is frame 1, as the link register says, not skipped for the frame record's
/// return address (a skipped frame in 2 of 1000 libcrypto AES-GCM samples under qemu-user).
#[cfg(target_arch = "aarch64")]
#[test]
fn a_leaf_without_cfi_after_its_caller_keeps_the_caller() {
    use std::sync::atomic::{AtomicU32, Ordering};
    selftrace::init().expect("init");
    static FLAG: AtomicU32 = AtomicU32::new(0);
    let t = std::thread::spawn(|| leaf_thread_body(&FLAG));
    while LEAF_TID.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    let tid = LEAF_TID.load(Ordering::Acquire);
    let mut result = None;
    // The thread may be caught before it reached the leaf: retry until frame 0 is in it.
    for _ in 0..200 {
        let mut buf = [0usize; 64];
        let walk = selftrace::threads::capture(tid, &mut buf, std::time::Duration::from_secs(5))
            .expect("the thread answers");
        let names = names_of(&buf[..walk.frames], true);
        if names.first().is_some_and(|n| n == "st_spin_leaf") {
            result = Some(names);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    FLAG.store(1, Ordering::Release);
    t.join().expect("join");
    let names = result.expect("a capture with frame 0 in st_spin_leaf");
    let text = names.join("\n");
    assert_eq!(
        names.get(1).map(String::as_str),
        Some("st_calls_leaf"),
        "{text}"
    );
    assert!(
        names.get(2).is_some_and(|n| n.contains("leaf_thread_body")),
        "{text}"
    );
}
