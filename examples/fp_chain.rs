//! A known call chain walked with frame pointers only; built by the test suite with
//! `-C force-frame-pointers=yes`. Prints one line per frame: `frame N 0xADDR name`. Also walks
//! through [`TINY`] assembly functions whose frame records lie 16 bytes apart (the closest they
//! can be), and panics if a walk there is not the chain.

#[path = "../tests/support/oracle.rs"]
#[allow(dead_code)]
mod oracle;

macro_rules! chain {
    ($name:ident -> $next:ident $(-> $rest:ident)*) => {
        #[inline(never)]
        fn $name(out: &mut Vec<usize>) {
            $next(out);
            std::hint::black_box(());
        }
        chain!($next $(-> $rest)*);
    };
    ($last:ident) => {
        #[inline(never)]
        fn $last(out: &mut Vec<usize>) {
            fp_capture(out);
            std::hint::black_box(());
        }
    };
}

chain!(chain_00 -> chain_01 -> chain_02 -> chain_03 -> chain_04 -> chain_05 -> chain_06 -> chain_07
    -> chain_08 -> chain_09 -> chain_10 -> chain_11 -> chain_12 -> chain_13 -> chain_14 -> chain_15
    -> chain_16 -> chain_17 -> chain_18 -> chain_19 -> chain_20 -> chain_21 -> chain_22 -> chain_23);

#[inline(never)]
fn fp_capture(out: &mut Vec<usize>) {
    let mut buf = [0usize; 128];
    // The whole chain, then the same walk (from the same call site) into every shorter buffer:
    // each must be the chain's first frames and say that the buffer was full (frame-pointer
    // mode bounds how far its loop goes by the room left, so small buffers take its other
    // paths).
    let mut whole: Option<(Vec<usize>, selftrace::WalkEnd)> = None;
    for len in (1..=buf.len()).rev() {
        let w = selftrace::Capture::new()
            .mode(selftrace::UnwindMode::FramePointer)
            .walk(&mut buf[..len]);
        let Some((all, end)) = &whole else {
            assert!(w.frames < len, "the chain fills 128 frames");
            whole = Some((buf[..w.frames].to_vec(), w.end));
            continue;
        };
        if len >= all.len() {
            assert_eq!(
                (&buf[..w.frames], &w.end),
                (&all[..], end),
                "a buffer of {len}"
            );
        } else {
            assert_eq!(
                (&buf[..w.frames], &w.end),
                (&all[..len], &selftrace::WalkEnd::BufferFull),
                "a buffer of {len}"
            );
        }
    }
    out.extend_from_slice(&whole.expect("walked").0);
}

/// Functions in the chain of 16-byte frames.
const TINY: usize = 17;

// `fp_tiny_chain` calls the next of TINY - 1 functions that do nothing but save the frame
// pointer, call the next and return; the last calls `tiny_leaf`. No locals: each frame record
// lies 16 bytes above the one before. The arguments: the instructions that save the frame
// record, set the frame pointer, call, and restore the record.
macro_rules! tiny_chain {
    ($save:literal, $frame:literal, $call:literal, $restore:literal) => {
        std::arch::global_asm!(
            ".pushsection .text.fp_tiny_chain,\"ax\",@progbits",
            ".p2align 4",
            ".globl fp_tiny_chain",
            "fp_tiny_chain:",
            ".rept {n}",
            $save,
            $frame,
            concat!($call, " 1f"),
            $restore,
            "ret",
            "1:",
            ".endr",
            $save,
            $frame,
            concat!($call, " {leaf}"),
            $restore,
            "ret",
            ".globl fp_tiny_chain_end",
            "fp_tiny_chain_end:",
            ".popsection",
            n = const TINY - 1,
            leaf = sym tiny_leaf,
        );
    };
}
#[cfg(target_arch = "x86_64")]
tiny_chain!("push rbp", "mov rbp, rsp", "call", "pop rbp");
#[cfg(target_arch = "aarch64")]
tiny_chain!(
    "stp x29, x30, [sp, #-16]!",
    "mov x29, sp",
    "bl",
    "ldp x29, x30, [sp], #16"
);

unsafe extern "C" {
    fn fp_tiny_chain();
    static fp_tiny_chain_end: u8;
}

static TINY_WALK: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

extern "C" fn tiny_leaf() {
    let mut walk = Vec::new();
    fp_capture(&mut walk);
    *TINY_WALK.lock().unwrap() = walk;
}

/// Walks (into buffers of every length) through the chain of 16-byte frames, and checks that
/// the whole walk went through all of them.
fn tiny_chain() {
    // SAFETY: the assembly above keeps the C calling convention and calls only `tiny_leaf`.
    unsafe { fp_tiny_chain() };
    let walk = std::mem::take(&mut *TINY_WALK.lock().unwrap());
    let start = fp_tiny_chain as *const () as usize;
    let end = std::ptr::addr_of!(fp_tiny_chain_end) as usize;
    let tiny: Vec<usize> = walk
        .iter()
        .copied()
        .filter(|&a| (start..end).contains(&a))
        .collect();
    assert_eq!(
        tiny.len(),
        TINY,
        "the walk through the 16-byte frames: {walk:x?} (they are at {start:#x}..{end:#x})"
    );
    // Innermost first: each return address lies below the one of the frame before.
    assert!(tiny.windows(2).all(|w| w[0] > w[1]), "{tiny:x?}");
}

fn main() {
    selftrace::init().expect("init");
    tiny_chain();
    let mut frames = Vec::new();
    chain_00(&mut frames);
    let o = oracle::Oracle::load();
    for (i, name) in o.names(&frames, false).iter().enumerate() {
        println!("frame {i} {:#x} {name}", frames[i]);
    }
}
