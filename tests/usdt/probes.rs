//! In-process behaviour of the probe macros: every argument type compiles and runs, arguments
//! are evaluated when documented, `#[probe]` keeps the function's behaviour, and `probes()`
//! lists what the binary carries. The crate denies unsafe code: the macros must still work.
// Needs the cargo features of what it tests (`cargo test --all-features` runs it).
#![cfg(feature = "usdt")]
#![deny(unsafe_code)]

use selftrace::usdt::{probes, ProbeArg};
use std::cell::Cell;

struct UserId(u32);

impl ProbeArg for UserId {
    const SIZE: i32 = 4;
    fn probe_value(&self) -> u64 {
        self.0 as u64
    }
}

#[test]
fn every_argument_type() {
    let s = String::from("owned");
    let v = vec![1u8, 2, 3];
    let x = 5i32;
    let mut y = 6u64;
    let rx = &x;
    let p: *const i32 = &x;
    let m: *mut u64 = &mut y;
    selftrace::probe!(selftrace_it, none);
    selftrace::probe!(
        selftrace_it,
        ints,
        1i8,
        2i16,
        3i32,
        4i64,
        5isize,
        6u8,
        7u16,
        8u32,
        9u64,
        10usize,
        11i128,
        12u128
    );
    selftrace::probe!(
        selftrace_it,
        misc,
        true,
        'é',
        1.5f32,
        2.5f64,
        p,
        m,
        &x,
        &mut y
    );
    selftrace::probe!(selftrace_it, bytes, "str", &b"bytes"[..], s, v);
    selftrace::probe!(selftrace_it, user, UserId(9));
    // Any expression: casts and operators bind as written.
    selftrace::probe!(
        selftrace_it,
        exprs,
        x as u64,
        x + 1,
        -x,
        *rx,
        if x > 0 { 1u8 } else { 2 }
    );
    selftrace::probe!("selftrace_it", "string_names", x);
    // Expressions are evaluated once and borrowed, not moved.
    let count = Cell::new(0);
    selftrace::probe!(selftrace_it, once, {
        count.set(count.get() + 1);
        count.get()
    });
    assert_eq!(count.get(), 1);
    assert_eq!(s, "owned");
    assert_eq!(v, [1, 2, 3]);
}

#[test]
fn lazy_arguments_only_when_enabled() {
    let evaluated = Cell::new(false);
    // No tracer is attached to this probe in this test.
    assert!(!selftrace::probe_enabled!(selftrace_it, lazy));
    selftrace::probe_lazy!(selftrace_it, lazy, {
        evaluated.set(true);
        1u32
    });
    assert!(!evaluated.get());
}

#[selftrace::usdt::probe(provider = "selftrace_it")]
fn add(a: i32, b: i32) -> i32 {
    a + b
}

#[selftrace::usdt::probe(provider = "selftrace_it", name = "early")]
fn early_return(x: u32) -> Result<u32, String> {
    if x == 0 {
        return Err("zero".into());
    }
    let y: u32 = "7".parse().map_err(|_| "parse".to_string())?;
    Ok(x + y)
}

#[selftrace::usdt::probe]
fn generic<T: ProbeArg + Copy>(x: T) -> T {
    x
}

#[selftrace::usdt::probe]
fn returns_str(s: &str) -> &str {
    &s[1..]
}

struct Account {
    balance: i64,
}

impl Account {
    #[selftrace::usdt::probe(provider = "selftrace_it")]
    fn deposit(&mut self, amount: i64) -> i64 {
        self.balance += amount;
        self.balance
    }

    #[selftrace::usdt::probe(provider = "selftrace_it")]
    fn balance_mut(&mut self) -> &mut i64 {
        &mut self.balance
    }

    #[selftrace::usdt::probe(provider = "selftrace_it")]
    fn into_balance(self) -> i64 {
        self.balance
    }

    #[selftrace::usdt::probe(provider = "selftrace_it")]
    fn new(balance: i64) -> Account {
        Account { balance }
    }
}

#[selftrace::usdt::probe(provider = "selftrace_it")]
#[must_use]
pub(crate) fn mutates(mut x: u32, s: String) -> usize {
    x += 1;
    x as usize + s.len()
}

#[selftrace::usdt::probe(provider = "selftrace_it")]
extern "C" fn c_abi(x: i16) -> i16 {
    -x
}

#[selftrace::usdt::probe(provider = "selftrace_it")]
fn iter(n: u8) -> impl Iterator<Item = u8> {
    0..n
}

#[selftrace::usdt::probe(provider = "selftrace_it")]
fn recursive(n: u32) -> u32 {
    if n == 0 {
        0
    } else {
        n + recursive(n - 1)
    }
}

#[selftrace::usdt::probe(provider = "selftrace_it")]
async fn async_double(x: u64) -> u64 {
    x * 2
}

/// Polls a future that never waits to completion.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

#[test]
fn attribute_keeps_behaviour() {
    assert_eq!(add(2, -5), -3);
    assert_eq!(early_return(0), Err("zero".to_string()));
    assert_eq!(early_return(1), Ok(8));
    assert_eq!(generic(3u8), 3);
    assert_eq!(generic(-3i64), -3);
    assert_eq!(returns_str("xyz"), "yz");
    let mut a = Account::new(10);
    assert_eq!(a.deposit(5), 15);
    *a.balance_mut() += 1;
    assert_eq!(a.deposit(-1), 15);
    assert_eq!(a.into_balance(), 15);
    assert_eq!(block_on(async_double(21)), 42);
    assert_eq!(mutates(1, "ab".into()), 4);
    assert_eq!(c_abi(5), -5);
    assert_eq!(iter(3).sum::<u8>(), 3);
    assert_eq!(recursive(4), 10);
}

#[test]
fn registry_lists_probes() {
    // Make sure the functions are linked in.
    attribute_keeps_behaviour();
    every_argument_type();
    let all = probes();
    let find = |p: &str, n: &str| {
        all.iter()
            .find(|x| x.provider() == p && x.name() == n)
            .unwrap_or_else(|| panic!("{p}:{n} not listed: {all:#?}"))
    };
    let ints = find("selftrace_it", "ints");
    assert!(!ints.was_enabled());
    assert!(!ints.is_enabled());
    assert_ne!(ints.semaphore(), 0);
    assert_eq!(ints.arguments().len(), 12);
    let signs: Vec<(u8, bool)> = ints
        .arguments()
        .iter()
        .map(|a| (a.size, a.signed))
        .collect();
    assert_eq!(
        signs,
        [
            (1, true),
            (2, true),
            (4, true),
            (8, true),
            (8, true),
            (1, false),
            (2, false),
            (4, false),
            (8, false),
            (8, false),
            (8, true),
            (8, false)
        ]
    );
    assert_eq!(find("selftrace_it", "bytes").arguments().len(), 8);
    assert_eq!(find("selftrace_it", "none").arguments().len(), 0);
    for n in [
        "add",
        "add__return",
        "deposit",
        "deposit__return",
        "early",
        "early__return",
    ] {
        find("selftrace_it", n);
    }
    // The default provider is the crate's name (this binary's: tests/usdt/main.rs).
    find("usdt", "generic");
    find("usdt", "returns_str__return");
    // probe_lazy! and probe_enabled! of one probe share its semaphore: one entry, two sites.
    assert_eq!(find("selftrace_it", "lazy").sites(), 2);
    assert!(all.iter().all(|p| p.semaphore() % 2 == 0));
}

#[test]
fn registry_leaves_out_probes_removed_with_dead_code() {
    // selftrace's own `gc_canary` is in a public function this test never calls: the linker
    // removed it and its note; its registry entry must not be listed.
    assert!(!probes().iter().any(|p| p.name() == "gc_canary"));
    // A probe only ever asked about is listed.
    let _ = selftrace::probe_enabled!(selftrace_it, asked_only);
    assert!(probes()
        .iter()
        .any(|p| p.name() == "asked_only" && p.arguments().is_empty()));
}
