//! Reuse of a thread's previous walk (`selftrace::unwind::set_walk_reuse`): a capture that
//! reaches a frame of the previous one takes the frames above it only while the stack still
//! holds the words they were read from. Every capture here is checked against the functions
//! that are really on the stack, and against a walk without reuse.

#[path = "support/oracle.rs"]
mod oracle;

use oracle::{leaf, Oracle};
use selftrace::unwind::{self, set_walk_reuse};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Mutex, OnceLock};

fn oracle() -> &'static Oracle {
    static O: OnceLock<Oracle> = OnceLock::new();
    O.get_or_init(|| {
        selftrace::init().expect("init");
        Oracle::load()
    })
}

/// The tests take turns. The reuse setting and the reuse counter are the process's: a test
/// that counts the frames its captures reused must not run while another turns reuse off for
/// a capture (its walks would then reuse nothing, and the count depended on how the test
/// threads happened to be scheduled), and another's walks could evict its record.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn reused() -> u64 {
    unwind::stats().frames_reused
}

#[inline(never)]
fn capture_vec() -> Vec<usize> {
    let mut buf = [0usize; 256];
    let w = selftrace::Capture::new().walk(&mut buf);
    assert!(w.is_complete(), "{w:?}");
    buf[..w.frames].to_vec()
}

/// The captures of `f`, with reuse on and then off (the walk in full), which must agree. The
/// caller holds [`serial`].
fn both(f: &mut dyn FnMut() -> Vec<usize>) -> Vec<usize> {
    // One call site for both walks, so that they see the same stack.
    let mut walks = Vec::new();
    for i in 0..black_box(3) {
        set_walk_reuse(i != 1);
        walks.push(f());
    }
    assert_eq!(
        walks[0], walks[1],
        "a walk with reuse differs from the full walk"
    );
    assert_eq!(
        walks[1], walks[2],
        "a walk with reuse differs from the full walk"
    );
    walks.swap_remove(0)
}

// ---- the same stack again --------------------------------------------------------------------

#[inline(never)]
fn deep(n: usize, f: &mut dyn FnMut()) {
    if n == 0 {
        f();
    } else {
        deep(n - 1, f);
    }
    black_box(n);
}

#[test]
fn repeated_captures_take_the_outer_frames_from_the_previous_walk() {
    let _s = serial();
    let o = oracle();
    let mut walks = Vec::new();
    let mut counts = Vec::new();
    // A walk that joins a record after stepping frames of its own makes the next walks of the
    // thread stage their frames only one time in 16 (`reuse::Claim::staging`). A new thread can
    // find such a record: glibc hands a finished thread's stack (and `struct pthread`) to the
    // next thread it starts, and the records are kept by stack (seen under qemu-user, where the
    // test threads run one after the other on one cached stack). So the captures go on until
    // one re-recorded the stack: at most 18 of them.
    deep(20, &mut || {
        // One call site for the captures (a loop the compiler may not unroll).
        for _ in 0..black_box(18) {
            let before = reused();
            walks.push(black_box(capture_vec as fn() -> Vec<usize>)());
            counts.push(reused() - before);
        }
    });
    for w in &walks[1..] {
        assert_eq!(&walks[0], w);
    }
    let names = o.names(&walks[0], false);
    let deeps = names.iter().filter(|n| leaf(n) == "deep").count();
    assert_eq!(deeps, 21, "{names:#?}");
    // A capture after a re-recorded one joined it at the first `deep` frame at the latest
    // (below it, rbp is a general register that may hold another value, and a walk cannot join
    // a frame whose rbp differs) and took every frame above it (other tests' walks may add to
    // the process-wide counter, never take from it).
    let above = (walks[0].len() - 1 - deeps_at(&names)) as u64;
    assert!(
        counts.iter().any(|&c| c >= above),
        "reused {counts:?} of {} frames, none {above} or more",
        walks[0].len()
    );
    let mut again = Vec::new();
    deep(20, &mut || again = both(&mut capture_vec));
    let again = o.names(&again, false);
    assert_eq!(again[deeps_at(&again)..], names[deeps_at(&names)..]);
}

/// The index of the first `deep` frame.
fn deeps_at(names: &[String]) -> usize {
    names.iter().position(|n| leaf(n) == "deep").unwrap_or(0)
}

// ---- a changed frame above the join ----------------------------------------------------------

#[inline(never)]
fn inner(sp: &mut usize) -> Vec<usize> {
    let here = 0u8;
    *sp = black_box(&here) as *const u8 as usize;
    let v = capture_vec();
    black_box(&here);
    v
}

#[inline(never)]
fn middle(sp: &mut usize) -> Vec<usize> {
    let v = inner(sp);
    black_box(());
    v
}

#[inline(never)]
fn via_a(sp: &mut usize) -> Vec<usize> {
    let v = middle(sp);
    black_box(1);
    v
}

#[inline(never)]
fn via_b(sp: &mut usize) -> Vec<usize> {
    let v = middle(sp);
    black_box(2);
    v
}

#[test]
fn a_return_address_that_changed_above_the_join_is_followed() {
    let _s = serial();
    let o = oracle();
    // One call site, so that both paths reach `inner` at the same stack pointer: the second
    // capture joins the first at its first frame, and the word that differs (the return address
    // into via_a or via_b) lies above it.
    let path: [fn(&mut usize) -> Vec<usize>; 6] = [via_a, via_b, via_a, via_b, via_b, via_a];
    // The same variable each time: a register that holds its address must not differ.
    let mut sp = 0usize;
    let mut sps = [0usize; 6];
    let mut walks = Vec::new();
    let mut counts = Vec::new();
    // A loop the compiler may not unroll: one call site.
    for i in 0..black_box(path.len()) {
        let f = black_box(path[i]);
        let before = reused();
        walks.push(f(&mut sp));
        counts.push(reused() - before);
        sps[i] = sp;
    }
    assert!(
        sps.iter().all(|&s| s == sps[0]),
        "the paths do not reach `inner` at the same stack pointer ({sps:x?}): this test does \
         not exercise what it is for"
    );
    for (i, w) in walks.iter().enumerate() {
        let names: Vec<String> = o.names(w, false);
        let leafs: Vec<&str> = names.iter().map(|n| leaf(n)).collect();
        let want = if matches!(i, 0 | 2 | 5) {
            "via_a"
        } else {
            "via_b"
        };
        let other = if want == "via_a" { "via_b" } else { "via_a" };
        assert_eq!(
            &leafs[..4],
            ["capture_vec", "inner", "middle", want],
            "walk {i}: {names:#?}"
        );
        assert!(!leafs.contains(&other), "walk {i}: {names:#?}");
    }
    // (Walks 0 and 1 find the rules of their frames for the first time.) Walks 2 to 5 took
    // at least the frames of `capture_vec`, `inner` and `middle` from the record before
    // stepping past the changed word. (Walk 4 takes every frame only if walk 3 re-recorded the
    // stack, which a thread whose walks keep differing does one walk in 16: not asserted.) The
    // counter is the process's, so other tests' walks can only add to it.
    for i in [2, 3, 4, 5] {
        assert!(counts[i] >= 2, "walk {i}: {counts:?}");
    }
    let again = both(&mut || via_b(&mut sp));
    assert_eq!(o.names(&again, false)[..4], o.names(&walks[1], false)[..4]);
}

// ---- random stacks on several threads --------------------------------------------------------

/// A tiny deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

type Step = fn(&mut Rng, &mut Vec<u8>, usize, &mut dyn FnMut(&[u8]));

/// Calls one of the steps, chosen at random, `depth` times deep; the leaf calls `f` with the
/// choices (outermost first). Three functions with different frame sizes, so that the stack
/// pointers of a walk and of the previous one coincide at some frames and not at others.
fn descend(rng: &mut Rng, path: &mut Vec<u8>, depth: usize, f: &mut dyn FnMut(&[u8])) {
    if depth == 0 {
        f(path);
        return;
    }
    const STEPS: [Step; 3] = [step_small, step_medium, step_large];
    let k = (rng.next() % 3) as usize;
    path.push(k as u8);
    black_box(STEPS[k])(rng, path, depth - 1, f);
    path.pop();
}

#[inline(never)]
fn step_small(rng: &mut Rng, path: &mut Vec<u8>, depth: usize, f: &mut dyn FnMut(&[u8])) {
    descend(rng, path, depth, f);
    black_box(());
}

#[inline(never)]
fn step_medium(rng: &mut Rng, path: &mut Vec<u8>, depth: usize, f: &mut dyn FnMut(&[u8])) {
    let pad = black_box([depth as u64; 8]);
    descend(rng, path, depth, f);
    black_box(pad);
}

#[inline(never)]
fn step_large(rng: &mut Rng, path: &mut Vec<u8>, depth: usize, f: &mut dyn FnMut(&[u8])) {
    let pad = black_box([depth as u64; 40]);
    descend(rng, path, depth, f);
    black_box(pad);
}

/// `captures` captures on this thread, each from a new random path of the step functions, each
/// checked against the path (the step functions on the stack, innermost first). Returns the
/// frames reused by the process meanwhile.
fn random_captures(o: &Oracle, seed: u64, captures: usize) -> u64 {
    let mut rng = Rng(seed);
    let mut names: HashMap<usize, &'static str> = HashMap::new();
    let before = reused();
    for _ in 0..captures {
        let depth = 1 + (rng.next() % 24) as usize;
        let mut path = Vec::new();
        let path_seed = rng.next() | 1;
        descend(&mut Rng(path_seed), &mut path, depth, &mut |want| {
            let frames = capture_vec();
            let got: Vec<u8> = frames
                .iter()
                .filter_map(|&pc| {
                    let n = *names.entry(pc).or_insert_with(|| {
                        o.name(pc - 1).map_or("?", |n| match leaf(n) {
                            "step_small" => "s",
                            "step_medium" => "m",
                            "step_large" => "l",
                            _ => "-",
                        })
                    });
                    match n {
                        "s" => Some(0),
                        "m" => Some(1),
                        "l" => Some(2),
                        _ => None,
                    }
                })
                .collect();
            let mut want = want.to_vec();
            want.reverse();
            assert_eq!(
                got,
                want,
                "path seed {path_seed:#x}: {:#?}",
                o.names(&frames, false)
            );
        });
    }
    reused() - before
}

#[test]
fn random_stacks_on_four_threads_always_give_the_functions_on_the_stack() {
    let _s = serial();
    let o = oracle();
    let results: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                s.spawn(move || {
                    random_captures(
                        o,
                        0x9e37_79b9_7f4a_7c15 ^ ((t + 1) * 0x1234_5678_9abc),
                        3000,
                    )
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (t, reused) in results.iter().enumerate() {
        // Random paths share their outer frames often enough that reuse happened.
        assert!(*reused > 0, "thread {t}: no frame reused");
    }
}

/// More threads at once than the table has records of walks (64), so that threads find both
/// their records held or owned by others and evict or walk without one; in waves, so that new
/// threads start on the stacks of exited ones (the C library keeps thread stacks for reuse) and
/// so at the same stack end as a record of a thread that no longer exists. Every capture still
/// gives the functions on the stack.
#[test]
fn more_threads_than_records_and_new_threads_on_old_stacks_give_the_functions_on_the_stack() {
    let _s = serial();
    let o = oracle();
    const THREADS: usize = 96;
    const CAPTURES: usize = 150;
    let before = reused();
    let mut stacks = std::collections::HashSet::new();
    let mut threads = 0;
    for wave in 0..3u64 {
        // Held for writing until every thread of the wave is spawned, so that all are alive
        // before any captures; `false` if a spawn failed (the others then end at once rather
        // than wait forever).
        let gate = std::sync::RwLock::new(false);
        let mut open = gate.write().unwrap();
        let ends: Vec<usize> = std::thread::scope(|s| {
            let spawned: Vec<_> = (0..THREADS as u64)
                .map(|t| {
                    let gate = &gate;
                    // Small stacks, so that the C library's cache of stacks (40 MiB) keeps
                    // all of them for the next wave.
                    std::thread::Builder::new()
                        .stack_size(384 << 10)
                        .spawn_scoped(s, move || {
                            if !*gate.read().unwrap() {
                                return None;
                            }
                            let seed = (wave << 32 | t).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                            random_captures(o, seed, CAPTURES);
                            // The same address for threads on the same stack.
                            let here = 0u8;
                            Some(black_box(&here) as *const u8 as usize)
                        })
                })
                .collect();
            let all = spawned.iter().all(|w| w.is_ok());
            *open = all;
            drop(open);
            let ends: Vec<_> = spawned
                .into_iter()
                .flatten()
                .map(|w| w.join().unwrap())
                .collect();
            assert!(all, "could not start {THREADS} threads");
            ends.into_iter().flatten().collect()
        });
        threads += ends.len();
        stacks.extend(ends);
    }
    eprintln!(
        "{threads} threads in 3 waves of {THREADS} ran on {} distinct stacks",
        stacks.len()
    );
    // The premises: threads of the later waves ran on the first wave's stacks, and walks reused
    // records at all.
    assert!(
        stacks.len() <= 2 * THREADS,
        "{} distinct stacks: few threads started on an exited thread's stack, the test checks \
         less than it says",
        stacks.len()
    );
    assert!(reused() > before, "no walk reused a record");
}
