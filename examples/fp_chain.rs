//! A known call chain walked with frame pointers only; built by the test suite with
//! `-C force-frame-pointers=yes`. Prints one line per frame: `frame N 0xADDR name`.

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
    let n = selftrace::Capture::new()
        .mode(selftrace::UnwindMode::FramePointer)
        .walk(&mut buf)
        .frames;
    out.extend_from_slice(&buf[..n]);
}

fn main() {
    selftrace::init().expect("init");
    let mut frames = Vec::new();
    chain_00(&mut frames);
    let o = oracle::Oracle::load();
    for (i, name) in o.names(&frames, false).iter().enumerate() {
        println!("frame {i} {:#x} {name}", frames[i]);
    }
}
